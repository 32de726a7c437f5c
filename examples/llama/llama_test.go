package llama_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/llama"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// shape is one Llama size, the --set keys of the model.
type shape struct{ layers, hidden, heads, kvHeads, ffn, vocab, seq int }

// llama3_8B is Meta Llama 3 8B's configuration.
var llama3_8B = shape{layers: 32, hidden: 4096, heads: 32, kvHeads: 8, ffn: 14336, vocab: 128256, seq: 8192}

func (s shape) set() map[string]string {
	return map[string]string{"layers": strconv.Itoa(s.layers), "hidden": strconv.Itoa(s.hidden), "heads": strconv.Itoa(s.heads),
		"kv_heads": strconv.Itoa(s.kvHeads), "ffn": strconv.Itoa(s.ffn), "vocab": strconv.Itoa(s.vocab), "seq": strconv.Itoa(s.seq)}
}

// Parameters of the untied Llama: 2·V·h (embedding and head) + h (final
// norm) + l·(2·h·H·d + 2·h·K·d + 3·h·f + 2h) with head size d = h/H and K
// k/v heads. Llama 3 8B has the 8,030,261,248 its model card states, and
// Llama 3.2 1B (tied) 1,235,814,400 once its head, which ties to the
// embedding, is not counted twice.
func TestParamCountMatchesFormula(t *testing.T) {
	count := func(s shape) int64 {
		m, err := frontend.Build(llama.Model, frontend.Config{Batch: 1, Set: s.set()})
		require.NoError(t, err)
		var n int64
		for _, p := range m.Params() {
			n += p.Type.Shape.NumElements()
		}
		return n
	}
	for _, s := range []shape{{2, 128, 4, 2, 352, 256, 64}, {3, 96, 6, 6, 200, 300, 16}, llama3_8B} {
		l, h, v, heads, k, f := int64(s.layers), int64(s.hidden), int64(s.vocab), int64(s.heads), int64(s.kvHeads), int64(s.ffn)
		d := h / heads
		assert.Equal(t, 2*v*h+h+l*(2*h*heads*d+2*h*k*d+3*h*f+2*h), count(s), "shape %+v", s)
	}
	assert.Equal(t, int64(8_030_261_248), count(llama3_8B), "Llama 3 8B")
	llama32_1B := shape{layers: 16, hidden: 2048, heads: 32, kvHeads: 8, ffn: 8192, vocab: 128256, seq: 2048}
	assert.Equal(t, int64(1_235_814_400), count(llama32_1B)-128256*2048, "Llama 3.2 1B with its tied head counted once")
}

// Bad sizes are refused with the rule they break and the model's line.
func TestBadSizesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"heads": "3"}, "hidden size 128 is not divisible by 3 heads"},
		{map[string]string{"kv_heads": "3"}, "4 heads are not a multiple of 3 k/v heads"},
		{map[string]string{"hidden": "36", "heads": "4", "kv_heads": "4"}, "rotary embeddings need an even head size, got 9"},
	} {
		_, err := frontend.Build(llama.Model, frontend.Config{Batch: 1, Set: tc.set})
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, err.Error(), "model.go:")
	}
}

// Compiling Llama 3 8B shapes through every pass and the memory plan
// allocates no tensor data: the plan is computed from shapes alone.
func BenchmarkCompileLlama3_8B(b *testing.B) {
	b.ReportAllocs()
	var prog *lower.Program
	for b.Loop() {
		m, err := frontend.Build(llama.Model, frontend.Config{Name: "llama3-8b", Batch: 1, Set: llama3_8B.set()})
		if err != nil {
			b.Fatal(err)
		}
		o := passes.DefaultOptions()
		o.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: 8}}}
		if _, err := passes.Run(m, o, passes.Hooks{}); err != nil {
			b.Fatal(err)
		}
		if prog, err = lower.Lower(m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(prog.PeakBytes)/(1<<30), "peak-GiB/device")
}
