package moe_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/moe"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// gshard is a GShard-class shape: 32 blocks (16 of them MoE) of width
// 8192 with 64 experts of 32768 hidden units, top-2: about 590 billion
// parameters, 1T-class.
var gshard = map[string]string{"layers": "32", "hidden": "8192", "heads": "64", "vocab": "32000", "seq": "1024",
	"experts": "64", "ffn": "32768", "router": "gshard", "capacity": "1.25"}

// Parameters: per block the attention (4h² + 4h) and two LayerNorms (4h);
// a dense block's MLP 8h² + 5h; an MoE block's router h·E (and noise
// h·E for noisy top-k) and experts 2·E·h·f; the embeddings and ln_f.
func TestParamCount(t *testing.T) {
	m, err := frontend.Build(moe.Model, frontend.Config{Batch: 8, Set: gshard})
	require.NoError(t, err)
	var n int64
	for _, p := range m.Params() {
		n += p.Type.Shape.NumElements()
	}
	l, h, e, f, v, s := int64(32), int64(8192), int64(64), int64(32768), int64(32000), int64(1024)
	dense := l / 2 * (8*h*h + 5*h)
	experts := l / 2 * (h*e + 2*e*h*f)
	want := l*(4*h*h+4*h+4*h) + dense + experts + (v+s)*h + 2*h
	assert.Equal(t, want, n)
	assert.Greater(t, n, int64(5e11))
}

// BenchmarkCompileGShard compiles the GShard-class model with tp=8
// inside each expert and its 64 experts split over ep, for 64, 2048 and
// 16384 devices: the program is SPMD, so compile time and memory do not
// grow with the device count (ep=64 with dp=4 and dp=32 make the same
// program).
func BenchmarkCompileGShard(b *testing.B) {
	for _, c := range []struct{ dp, ep int }{{1, 8}, {4, 64}, {32, 64}} {
		devices := c.dp * c.ep * 8
		b.Run(fmt.Sprintf("devices%d_dp%d_ep%d_tp8", devices, c.dp, c.ep), func(b *testing.B) {
			b.ReportAllocs()
			mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: c.ep}, {Name: "tp", Size: 8}}}
			if c.dp > 1 {
				mesh.Axes = append([]ir.MeshAxis{{Name: "dp", Size: c.dp}}, mesh.Axes...)
			}
			var prog *lower.Program
			for b.Loop() {
				m, err := frontend.Build(moe.Model, frontend.Config{Name: "gshard", Batch: 2048, Set: gshard})
				if err != nil {
					b.Fatal(err)
				}
				opts := passes.DefaultOptions()
				opts.Mesh = mesh
				opts.Zero = 1
				if _, err := passes.Run(m, opts, passes.Hooks{}); err != nil {
					b.Fatal(err)
				}
				if prog, err = lower.Lower(m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(prog.Instrs)), "instrs")
			b.ReportMetric(float64(prog.PeakBytes)/(1<<30), "peak-GiB/device")
			b.ReportMetric(float64(prog.CollectiveBytes()["all_to_all/ep"])/(1<<30), "all_to_all-GiB/device")
		})
	}
}

// k is read by the routers that take a count; the others fix their own,
// and a k given to them is refused rather than ignored.
func TestKOnlyWhereTheRouterTakesIt(t *testing.T) {
	for _, router := range []string{"noisy-topk", "softmax-topk"} {
		_, err := frontend.Build(moe.Model, frontend.Config{Batch: 2, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "2", "seq": "16", "router": router, "k": "3"}})
		assert.NoError(t, err, router)
	}
	for _, router := range []string{"switch", "gshard", "expert-choice"} {
		_, err := frontend.Build(moe.Model, frontend.Config{Batch: 2, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "2", "seq": "16", "router": router, "k": "3"}})
		require.Error(t, err, router)
		assert.Contains(t, err.Error(), fmt.Sprintf("--set k=3: the %s router does not take k", router))
	}
}

// One block has no MoE block (block 1 is the first): refused, rather than
// accepting the router's settings unread (capacity=-1 built).
func TestOneBlockHasNoExperts(t *testing.T) {
	_, err := frontend.Build(moe.Model, frontend.Config{Batch: 2, Set: map[string]string{"layers": "1", "hidden": "32", "heads": "2", "seq": "16", "capacity": "-1"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--set layers=1: the MoE GPT's odd blocks are its MoE blocks, so it needs layers ≥ 2")
}

// random_second is a switch, 1 or 0; any other value is refused rather
// than read as 1.
func TestRandomSecondIsZeroOrOne(t *testing.T) {
	build := func(v string) error {
		_, err := frontend.Build(moe.Model, frontend.Config{Batch: 2, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "2", "seq": "16", "router": "gshard", "random_second": v}})
		return err
	}
	assert.NoError(t, build("0"))
	assert.NoError(t, build("1"))
	err := build("5")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--set random_second=5: want 1")
}

// The balancing loss's default weight is each router's paper's: Switch's
// 1e-2, noisy top-k's 0.1 (Shazeer et al.'s w_importance and w_load; it
// took Switch's), and GShard's scaled by E² for its E² times smaller loss.
// The default builds the module the explicit weight does.
func TestDefaultBalancingWeights(t *testing.T) {
	for router, weight := range map[string]string{"switch": "0.01", "noisy-topk": "0.1", "gshard": "0.16"} {
		build := func(aux string) string {
			set := map[string]string{"layers": "2", "hidden": "32", "heads": "2", "seq": "16", "experts": "4", "router": router}
			if aux != "" {
				set["aux"] = aux
			}
			m, err := frontend.Build(moe.Model, frontend.Config{Batch: 2, Set: set})
			require.NoError(t, err, router)
			return m.Fingerprint()
		}
		assert.Equal(t, build(weight), build(""), "%s: the default weight is %s", router, weight)
	}
}
