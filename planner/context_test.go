package planner

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/examples/llama"
	"gcompile/frontend"
	"gcompile/ir"
)

// longLlama is the test Llama (4 heads, 2 k/v heads) at a long context.
func longLlama(t testing.TB, seq string) *ir.Module { return longLlamaKV(t, seq, "2") }

// longLlamaKV is longLlama with kv k/v heads.
func longLlamaKV(t testing.TB, seq, kv string) *ir.Module {
	t.Helper()
	m, err := frontend.Build(llama.Model, frontend.Config{Name: "llama", Batch: 8,
		Set: map[string]string{"layers": "2", "hidden": "64", "heads": "4", "kv_heads": kv, "ffn": "128", "seq": seq}})
	require.NoError(t, err)
	return m
}

// The planner searches context parallelism for long sequences: every cp
// that divides the devices and leaves each rank a chunk of 1024 tokens
// or more, by the ring, and by Ulysses where cp divides the heads and the
// k/v heads; at a short context it does not, unless --cp-impl asks for
// context parallelism. The estimate prices what
// the compiled plan moves on cp: the ring's chunks (ten a step, and two
// gradients home, per layer), Ulysses' all_to_alls, the gradients'
// reduction over cp, and under sequence parallelism sp's collectives over
// tp: on a cp rank's tokens for the ring (cp the coarser split of the
// sequence), and for Ulysses (tp the coarser) on the whole sequence, with
// an all_gather over cp joining cp's split before each (cp2·tp2·sp: ring
// within 0.1 % on cp, 0.04 % on tp; Ulysses on the Llama with 4 k/v
// heads, 0.1 % and 0.02 %: the ring moves half Ulysses' bytes over tp);
// and the compiled plan's flops count every chunk the
// ring computes, the same as without cp (within 0.1 %: a causal chunk on
// the diagonal is priced as the average chunk).
func TestPlannerSearchesContextParallelism(t *testing.T) {
	hw := cpuHardware(t)
	long := longLlama(t, "8192")
	shape, err := ShapeOf(long)
	require.NoError(t, err)
	type choice struct {
		cp   int
		impl string
	}
	seen := map[choice]bool{}
	for _, c := range enumerate(baseConfig(8, 8), shape, hw, false) {
		if c.CP > 1 {
			seen[choice{c.CP, c.CPImpl}] = true
		} else {
			seen[choice{1, ""}] = true
		}
	}
	want := []choice{{1, ""}, {2, "ring"}, {2, "all2all"}, {4, "ring"}, {8, "ring"}}
	got := slices.Collect(func(yield func(choice) bool) {
		for c := range seen {
			if !yield(c) {
				return
			}
		}
	})
	assert.ElementsMatch(t, want, got, "cp and its strategy searched at seq 8192 (4 heads, 2 k/v heads)")

	short, err := ShapeOf(longLlama(t, "1024"))
	require.NoError(t, err)
	for _, c := range enumerate(baseConfig(8, 8), short, hw, false) {
		require.LessOrEqual(t, c.CP, 1, "no cp at a 1024-token context")
	}
	// Unless asked for: --cp-impl without --cp searches every cp > 1.
	asked := baseConfig(8, 8)
	asked.CPImpl, asked.Explicit["cp-impl"] = "ring", true
	cps := map[int]bool{}
	for _, c := range enumerate(asked, short, hw, false) {
		require.Equal(t, "ring", c.CPImpl)
		cps[c.CP] = true
	}
	assert.Equal(t, map[int]bool{2: true, 4: true, 8: true}, cps, "--cp-impl ring at 1024 tokens: cp 2, 4 and 8")

	gir := writeGir(t, long)
	// Ulysses under tp needs cp to divide each tp rank's k/v heads: the
	// same Llama with 4 of them.
	wide := longLlamaKV(t, "8192", "4")
	wideShape, err := ShapeOf(wide)
	require.NoError(t, err)
	wideGir := writeGir(t, wide)
	var flops []float64
	for _, pl := range []struct {
		cp, dp, tp int
		impl       string
		wide       bool
	}{{1, 4, 1, "", false}, {2, 2, 1, "ring", false}, {4, 1, 1, "ring", false}, {2, 2, 1, "all2all", false}, {2, 1, 2, "ring", false}, {2, 1, 2, "all2all", true}} {
		cfg := baseConfig(4, 8)
		cfg.Model, cfg.CP, cfg.DP, cfg.CPImpl = gir, pl.cp, pl.dp, pl.impl
		shape := shape
		if pl.wide {
			cfg.Model, shape = wideGir, wideShape
		}
		if pl.tp > 1 {
			cfg.TP, cfg.SequenceParallel = pl.tp, true
		}
		e, pred := estimateAndCompile(t, hw, shape, cfg)
		flops = append(flops, pred.ModelFLOPs)
		if pl.cp > 1 {
			got, want := e.CommBytes["cp"], pred.CommBytes["cp"]
			assert.InDelta(t, want, got, 0.02*want, "%s: bytes on cp, estimated and compiled", Describe(cfg))
			assert.Positive(t, want)
		}
		if pl.tp > 1 {
			got, want := e.CommBytes["tp"], pred.CommBytes["tp"]
			assert.InDelta(t, want, got, 0.02*want, "%s: bytes on tp, estimated and compiled", Describe(cfg))
		}
		t.Logf("%s: step %.1f ms estimated, %.1f ms from the compiled plan; cp %.0f B estimated, %.0f B compiled; tp %.0f B estimated, %.0f B compiled", Describe(cfg),
			e.StepSeconds*1e3, pred.StepSeconds*1e3, e.CommBytes["cp"], pred.CommBytes["cp"], e.CommBytes["tp"], pred.CommBytes["tp"])
	}
	for _, f := range flops[1 : len(flops)-1] {
		assert.InDelta(t, flops[0], f, 1e-3*flops[0], "model flops do not depend on cp")
	}
	assert.False(t, math.IsNaN(flops[0]))
}

// The estimate moves over tp what the compiled plan moves, with and
// without sequence parallelism: the blocks' collectives, the
// vocab-parallel embedding's and the head's outside them, and the
// cross-entropy's row statistics inside its instruction.
func TestEstimatedTensorParallelBytesAreCompiled(t *testing.T) {
	hw := cpuHardware(t)
	m := longLlama(t, "2048")
	shape, err := ShapeOf(m)
	require.NoError(t, err)
	gir := writeGir(t, m)
	for _, sp := range []bool{false, true} {
		cfg := baseConfig(2, 8)
		cfg.Model, cfg.TP, cfg.DP, cfg.SequenceParallel = gir, 2, 1, sp
		e, pred := estimateAndCompile(t, hw, shape, cfg)
		want := pred.CommBytes["tp"]
		require.Positive(t, want)
		assert.InEpsilon(t, want, e.CommBytes["tp"], 1e-3, "%s: bytes on tp, estimated and compiled", Describe(cfg))
	}
}

// estimateAndCompile prices cfg's plan both ways: the analytic estimate
// of shape, and the compiled programs' prediction.
func estimateAndCompile(t *testing.T, hw *cost.Hardware, shape cost.Transformer, cfg compile.Config) (*cost.Estimate, *cost.Prediction) {
	t.Helper()
	require.NoError(t, cfg.Validate())
	e, err := hw.EstimateFast(shape, planOf(cfg))
	require.NoError(t, err)
	r, err := compile.Compile(&cfg, passesHooks())
	require.NoError(t, err)
	pred, err := hw.Predict(r.Programs, r.Schedule)
	require.NoError(t, err)
	return e, pred
}

// The search tries Megatron-LM's block recompute on half of each
// pipeline chunk's layers beside none and full, and not where the user
// pinned the recompute or a chunk has one layer.
func TestPlannerSearchesBlockRecompute(t *testing.T) {
	hw := cpuHardware(t)
	shape, err := ShapeOf(longLlama(t, "1024"))
	require.NoError(t, err)
	blocks := map[string]bool{}
	for _, c := range enumerate(baseConfig(8, 8), shape, hw, false) {
		if n, ok := strings.CutPrefix(c.Recompute, "block="); ok {
			per := shape.Layers / (c.PP * max(c.VPP, 1))
			assert.Equal(t, fmt.Sprint(per/2), n, "%+v", c)
			blocks[c.Recompute] = true
		}
	}
	assert.NotEmpty(t, blocks)
	pinned := baseConfig(8, 8)
	pinned.Recompute, pinned.Explicit["recompute"] = "full", true
	for _, c := range enumerate(pinned, shape, hw, false) {
		require.Equal(t, "full", c.Recompute)
	}
}
