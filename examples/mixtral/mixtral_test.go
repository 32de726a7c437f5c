package mixtral_test

import (
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/mixtral"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// shape is one Mixtral size, the --set keys of the model.
type shape struct{ layers, hidden, heads, kvHeads, ffn, experts, vocab, seq int }

// mixtral8x7B is Mistral AI's Mixtral-8x7B-v0.1 configuration.
var mixtral8x7B = shape{layers: 32, hidden: 4096, heads: 32, kvHeads: 8, ffn: 14336, experts: 8, vocab: 32000, seq: 4096}

func (s shape) set() map[string]string {
	return map[string]string{"layers": strconv.Itoa(s.layers), "hidden": strconv.Itoa(s.hidden), "heads": strconv.Itoa(s.heads),
		"kv_heads": strconv.Itoa(s.kvHeads), "ffn": strconv.Itoa(s.ffn), "experts": strconv.Itoa(s.experts),
		"vocab": strconv.Itoa(s.vocab), "seq": strconv.Itoa(s.seq)}
}

// count is the parameter count of the model built at s, from the shapes
// alone.
func count(t *testing.T, s shape) int64 {
	t.Helper()
	m, err := frontend.Build(mixtral.Model, frontend.Config{Batch: 1, Set: s.set()})
	require.NoError(t, err)
	var n int64
	for _, p := range m.Params() {
		n += p.Type.Shape.NumElements()
	}
	return n
}

// Parameters of the Mixtral: 2·V·h (embedding and untied head) + h (final
// norm) + l·(2·h·H·d + 2·h·K·d + E·h + 3·E·h·f + 2h), head size d = h/H,
// K k/v heads, E experts of SwiGLU width f and the router's E·h. Mixtral
// 8x7B has the 46.7 B its model card states: 46,702,792,704.
func TestParamCountMatchesMixtral8x7B(t *testing.T) {
	for _, s := range []shape{{2, 64, 4, 2, 128, 4, 256, 64}, {3, 96, 6, 3, 80, 5, 300, 16}, mixtral8x7B} {
		l, h, v, heads, k, f, e := int64(s.layers), int64(s.hidden), int64(s.vocab), int64(s.heads), int64(s.kvHeads), int64(s.ffn), int64(s.experts)
		d := h / heads
		assert.Equal(t, 2*v*h+h+l*(2*h*heads*d+2*h*k*d+e*h+3*e*h*f+2*h), count(t, s), "shape %+v", s)
	}
	n := count(t, mixtral8x7B)
	assert.Equal(t, int64(46_702_792_704), n)
	assert.Equal(t, 46.7, math.Round(float64(n)/1e8)/10, "46.7 B, as the model card says")
}

// Mixtral 8x7B compiles through every pass and the memory plan from
// shapes alone, its experts split over ep=8 and each expert over tp=2,
// without allocating a weight: under 1 GiB allocated in all, where one
// device's share of the fp32 weights is 11.7 GB.
func TestMixtral8x7BPlansWithoutWeights(t *testing.T) {
	start := time.Now()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	m, err := frontend.Build(mixtral.Model, frontend.Config{Name: "mixtral-8x7b", Batch: 8, Set: mixtral8x7B.set()})
	require.NoError(t, err)
	o := passes.DefaultOptions()
	o.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 8}, {Name: "tp", Size: 2}}}
	_, err = passes.Run(m, o, passes.Hooks{})
	require.NoError(t, err)
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	for _, b := range prog.Buffers {
		if b.Kind == lower.Param && b.Name == "model.layers.0.block_sparse_moe.experts.w1" {
			assert.Equal(t, []int{8, 4096, 14336}, []int(b.Global.Shape), "the experts stacked")
			assert.Equal(t, []int{1, 4096, 7168}, []int(b.Type.Shape), "one expert per ep rank, its columns split over tp")
		}
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	// A device's share of the weights alone is 46.7e9·4/16 bytes.
	assert.Less(t, allocated, uint64(1<<30), "compiling allocates no weights: %d bytes in all", allocated)
	assert.Greater(t, prog.PeakBytes, int64(46_702_792_704*4/16), "the plan holds a device's share of the weights")
	t.Logf("Mixtral 8x7B on ep8·tp2: peak %.1f GiB/device, planned in %v with %.0f MiB allocated", float64(prog.PeakBytes)/(1<<30), time.Since(start), float64(allocated)/(1<<20))
}

// Bad settings are refused by name, with the model's line, before
// anything is compiled, one error each: what the refused value would
// have broken further on (a layer's poisoned output, the same check in
// every layer, the export configuration) says nothing more.
func TestBadConfigsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"k": "5"}, "--set k=5: each token goes to k of the 4 experts; want k ≤ experts"},
		{map[string]string{"experts": "0"}, "--set experts=0: want a positive integer"},
		{map[string]string{"k": "0"}, "--set k=0: want a positive integer"},
		{map[string]string{"aux": "-1"}, "--set aux=-1: want a finite weight ≥ 0"},
		{map[string]string{"rope_theta": "1"}, "--set rope_theta=1: want a base > 1"},
		{map[string]string{"group": "48"}, "group size 48 must divide the 2×64 tokens of a batch and divide or be a multiple of seq=64 (and 1 more like it: model.layers.1)"},
		{map[string]string{"kv_heads": "3"}, "4 heads are not a multiple of 3 k/v heads"},
		{map[string]string{"hidden": "30"}, "hidden size 30 is not divisible by 4 heads"},
		{map[string]string{"aux": "Inf"}, "--set aux=+Inf: want a finite weight ≥ 0"},
		{map[string]string{"aux": "NaN"}, "--set aux=NaN: want a number"},
		{map[string]string{"rope_theta": "-1"}, "--set rope_theta=-1: want a base > 1"},
		{map[string]string{"rms_norm_eps": "Inf"}, "rmsnorm: eps must be a finite number ≥ 0, got +Inf"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := frontend.Build(mixtral.Model, frontend.Config{Batch: 2, Set: tc.set})
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.want)
			assert.Contains(t, err.Error(), "model.go:", "the error names the model's line")
			assert.Equal(t, 1, strings.Count(err.Error(), "model.go:"), "one error: %v", err)
		})
	}
}
