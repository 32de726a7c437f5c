package main

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

const moeModel = "../../examples/moe/model.go"

// TestMoEEvaluationModule: a model with an evaluation capacity of its
// own is built a second time for evaluation, and without pipelines that
// module is lowered forward-only: only the loss and the language-model
// loss evaluation reports, no backward, optimizer state or updates, so
// its memory plan is the forward's. Trained with it, the run evaluates
// (it once stopped at the first evaluation: the program had dropped
// lm_loss, and the run's --save was lost).
func TestMoEEvaluationModule(t *testing.T) {
	c, err := parseArgs([]string{moeModel, "--set", "layers=2,hidden=32,heads=4,seq=16,experts=4,capacity=1,eval_capacity=4", "--batch", "4", "--devices", "2", "--ep", "2"})
	require.NoError(t, err)
	res, err := compile.Compile(&c.Config, passes.Hooks{})
	require.NoError(t, err)
	require.True(t, res.Module.EvalDiffers)
	require.Len(t, res.EvalPrograms, 1)
	train, eval := res.Programs[0], res.EvalPrograms[0]
	for _, in := range eval.Instrs {
		if in.Value != nil {
			assert.Equal(t, ir.PhaseFwd, in.Value.Meta.Phase, "%s %s in the evaluation program", in.Op, in.Value.Ref())
		}
	}
	for _, b := range eval.Buffers {
		assert.NotEqual(t, lower.State, b.Kind, "optimizer state %s in the evaluation program", b.Name)
	}
	assert.ElementsMatch(t, []string{ir.OutputLoss, ir.AuxPrefix + ir.OutputLMLoss}, keys(eval.Outputs))
	assert.Equal(t, len(eval.Instrs), eval.ForwardEnd)
	assert.Less(t, eval.PeakBytes, train.PeakBytes)
	// Capacity factor 4 against 1: 16 slots per expert and group of 16
	// tokens against 4.
	assert.Equal(t, 4, routeCapacity(t, train))
	assert.Equal(t, 16, routeCapacity(t, eval))

	w := filepath.Join(t.TempDir(), "w.safetensors")
	require.NoError(t, mainErr([]string{moeModel, "--set", "layers=2,hidden=32,heads=4,seq=16,experts=4,capacity=1,eval_capacity=4", "--batch", "4",
		"--max-data-mb", "1", "--run", "--steps", "2", "--eval-batches", "1", "--save", w}))
	assert.FileExists(t, w)
}

func routeCapacity(t *testing.T, p *lower.Program) int {
	t.Helper()
	for _, in := range p.Instrs {
		if in.Op == "moe_route" {
			return in.OutType.Shape[2]
		}
	}
	t.Fatal("no moe_route")
	return 0
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A model that draws random numbers (here the router's jitter) trains
// with asynchronous replicas, and at staleness 0 as synchronous data
// parallelism does: each replica draws its rows' keys of the global batch.
func TestAsyncTrainsARandomModel(t *testing.T) {
	losses := func(sync string) []float64 {
		path := filepath.Join(t.TempDir(), "m.json")
		require.NoError(t, mainErr([]string{moeModel, "--set", "layers=2,hidden=32,heads=2,seq=16,experts=2,jitter=0.01", "--batch", "4",
			"--devices", "2", "--dp", "2", "--dp-sync", sync, "--run", "--steps", "3", "--eval-batches", "-1", "--metrics", path}))
		var out []float64
		for _, s := range readMetrics(t, path).Steps {
			out = append(out, s.Loss)
		}
		return out
	}
	want, got := losses("sync"), losses("async")
	require.Len(t, got, 3)
	for i := range want {
		assert.InEpsilon(t, want[i], got[i], 1e-5, "step %d", i+1)
	}
}

// A MoE's held-out loss is its lm_loss, whose mean over microbatches the
// evaluation must run: with 2 microbatches it ran only up to the loss's
// mean, came after it, and reported a buffer never written (0.0000 for
// a loss of 5.2).
func TestMoEHeldOutLossWithMicrobatches(t *testing.T) {
	heldOut := func(micro string) float64 {
		m := runMetrics(t, moeModel, "--set", "layers=2,hidden=32,heads=4,seq=16,experts=4", "--batch", "8", "--max-data-mb", "1",
			"--microbatches", micro, "--run", "--steps", "2", "--eval-batches", "2")
		require.NotEmpty(t, m.Eval)
		return m.Eval[len(m.Eval)-1].Loss
	}
	one := heldOut("1")
	assert.Greater(t, one, 1.0)
	assert.InEpsilon(t, one, heldOut("2"), 1e-5)
}

// A MoE whose expert layers sit on both pipeline stages trains like one
// device under 1F1B: the balancing losses are summed across the stages
// once a step, and a block that read that sum before the other stage's
// part was in made the rank receive it from itself (the programs did not
// pair up, so no non-interleaved schedule compiled).
func TestMoEExpertLayersOnEveryStage(t *testing.T) {
	args := []string{moeModel, "--set", "layers=4,hidden=32,heads=4,seq=16,experts=4", "--batch", "8", "--max-data-mb", "1", "--run", "--steps", "2", "--eval-batches", "1"}
	one := runMetrics(t, args...)
	for _, schedule := range []string{"1f1b", "gpipe", "zb"} {
		got := runMetrics(t, append(slices.Clone(args), "--devices", "2", "--pp", "2", "--microbatches", "2", "--schedule", schedule)...)
		require.Len(t, got.Steps, 2, schedule)
		for i := range one.Steps {
			assert.InEpsilon(t, one.Steps[i].Loss, got.Steps[i].Loss, 1e-5, "%s step %d", schedule, i+1)
		}
	}
}
