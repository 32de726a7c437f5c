package tests

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// asyncRun trains with dp asynchronous replicas and the given staleness
// bound on the equivalence model and data.
func asyncRun(t *testing.T, dp, staleness int) ([]float64, map[string][]float64, *cpu.Async) {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: eqBatch / dp, Set: eqModel})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Verify = true
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	gm, um, boundary, err := lower.SplitAtOptimizer(m)
	require.NoError(t, err)
	gp, err := lower.Lower(gm)
	require.NoError(t, err)
	up, err := lower.Lower(um)
	require.NoError(t, err)
	a, err := cpu.NewAsync(gp, up, boundary, dp, staleness)
	require.NoError(t, err)
	require.NoError(t, a.InitParams(1))
	cfg := runtime.TrainConfig{Steps: eqSteps, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: 1,
		Schedule: runtime.Schedule{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: eqSteps, Decay: "cosine"}}
	steps, evals, err := a.Train(corpus(), cfg, nil)
	require.NoError(t, err)
	require.Len(t, evals, 1)
	var losses []float64
	for _, s := range steps {
		losses = append(losses, s.Loss)
	}
	params := map[string][]float64{}
	for _, b := range up.Buffers {
		if b.Kind == lower.Param {
			params[b.Name], err = a.Server.Float64s(b.Name)
			require.NoError(t, err)
		}
	}
	return losses, params, a
}

// With staleness 0 every replica waits for the previous update: the same
// training as synchronous data parallelism and as one device.
func TestAsyncStalenessZeroIsSynchronous(t *testing.T) {
	ref := train(t, plan{dp: 1})
	for _, dp := range []int{2, 4} {
		t.Run(fmt.Sprintf("dp%d", dp), func(t *testing.T) {
			losses, params, a := asyncRun(t, dp, 0)
			assert.Equal(t, 0, a.MaxStaleness())
			worst := assertLossesClose(t, ref.losses, losses, 1e-5)
			worstParam := paramError(t, ref.params, params, nil)
			assert.LessOrEqual(t, worstParam, 1e-4)
			t.Logf("dp%d K=0: worst loss rel err %.2g, worst param err %.2g", dp, worst, worstParam)
		})
	}
}

// With staleness 2 replicas run ahead on weights up to two updates old;
// training still converges and no replica ever exceeds the bound (the
// runtime fails the run if one would).
func TestAsyncBoundedStalenessConverges(t *testing.T) {
	losses, _, a := asyncRun(t, 4, 2)
	assert.LessOrEqual(t, a.MaxStaleness(), 2)
	first, last := losses[0], 0.0
	for _, l := range losses[len(losses)-5:] {
		last += l / 5
	}
	assert.Less(t, last, first-1.0, "loss falls from %.3f to %.3f", first, last)
	t.Logf("K=2: loss %.3f → %.3f (mean of last 5), max staleness %d", first, last, a.MaxStaleness())
}
