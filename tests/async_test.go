package tests

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/comm"
	"gcompile/runtime/cpu"
)

// asyncPlan is an asynchronous data-parallel run of the equivalence model
// and data.
type asyncPlan struct {
	dp, staleness int
	model         string              // the family (familyOf): "" is the GPT
	precision     string              // "" (fp32), "fp16" or "bf16"
	scaler        *runtime.LossScaler // mixed precision only
	steps         int                 // 0: eqSteps
}

type asyncResult struct {
	steps  []runtime.StepMetrics
	evals  []runtime.EvalMetrics
	losses []float64
	params map[string][]float64
	a      *cpu.Async
	update *lower.Program
}

// asyncProgs compiles the single-replica module and splits it into the
// gradient and update programs.
func asyncProgs(t *testing.T, p asyncPlan) (grad, update *lower.Program, boundary []string) {
	t.Helper()
	f := familyOf(p.model, 0)
	m, err := frontend.Build(f.fn, frontend.Config{Name: f.name, Batch: eqBatch / p.dp, Set: f.set})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Verify = true
	opts.Precision = p.precision
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	gm, um, boundary, err := lower.SplitAtOptimizer(m)
	require.NoError(t, err)
	grad, err = lower.Lower(gm)
	require.NoError(t, err)
	update, err = lower.Lower(um)
	require.NoError(t, err)
	return grad, update, boundary
}

// asyncConfig is the training config of the asynchronous runs: eqBatch
// sequences a step over the replicas together.
func asyncConfig(steps int, scaler *runtime.LossScaler) runtime.TrainConfig {
	if steps == 0 {
		steps = eqSteps
	}
	return runtime.TrainConfig{Steps: steps, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: 1, LossScale: scaler,
		Schedule: runtime.Schedule{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: eqSteps, Decay: "cosine"}}
}

// asyncRun trains p.
func asyncRun(t *testing.T, p asyncPlan) asyncResult {
	t.Helper()
	gp, up, boundary := asyncProgs(t, p)
	a, err := cpu.NewAsync(gp, up, boundary, p.dp, p.staleness)
	require.NoError(t, err)
	require.NoError(t, a.InitParams(1))
	cfg := asyncConfig(p.steps, p.scaler)
	_, cfg.RandomKey = gp.Sources[ir.InputRandomKey]
	ms, evals, err := a.Train(corpus(), cfg, nil)
	require.NoError(t, err)
	require.Len(t, evals, 1)
	res := asyncResult{steps: ms, evals: evals, params: serverBuffers(t, a, up, lower.Param), a: a, update: up}
	for _, s := range ms {
		res.losses = append(res.losses, s.Loss)
	}
	return res
}

// serverBuffers reads the update program's buffers of one kind (the master
// weights or the optimizer state) from the parameter server.
func serverBuffers(t *testing.T, a *cpu.Async, up *lower.Program, kind lower.BufferKind) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	for _, b := range up.Buffers {
		if b.Kind == kind {
			x, err := a.Server.Float64s(b.Name)
			require.NoError(t, err)
			out[b.Name] = x
		}
	}
	return out
}

// With staleness 0 every replica waits for the previous update: the same
// training as synchronous data parallelism and as one device.
func TestAsyncStalenessZeroIsSynchronous(t *testing.T) {
	ref := train(t, plan{dp: 1})
	for _, dp := range []int{2, 4} {
		t.Run(fmt.Sprintf("dp%d", dp), func(t *testing.T) {
			got := asyncRun(t, asyncPlan{dp: dp})
			assert.Equal(t, 0, got.a.MaxStaleness())
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			worstParam := paramError(t, ref.params, got.params, isKeyBias) // as TestDataParallelMatchesOneDevice
			assert.LessOrEqual(t, worstParam, 1e-4)
			// The held-out loss is one device's too: replica 0 reads the
			// same rows, dp batches of a dp-th each per batch of eqBatch.
			assert.InEpsilon(t, ref.eval, got.evals[0].Loss, 1e-5, "held-out loss")
			t.Logf("dp%d K=0: worst loss rel err %.2g, worst param err %.2g, held-out %.6f against %.6f", dp, worst, worstParam, got.evals[0].Loss, ref.eval)
		})
	}
}

// A model that draws random numbers (the noisy top-k router's noise, the
// router's jitter, dropout inside the experts) trains asynchronously too:
// each replica is fed the global batch's keys of its rows, so with
// staleness 0 every token draws what it draws on one device.
func TestAsyncRandomModelStalenessZeroIsSynchronous(t *testing.T) {
	ref := train(t, plan{model: "moe-noisy-topk"})
	got := asyncRun(t, asyncPlan{dp: 2, model: "moe-noisy-topk"})
	assert.Equal(t, 0, got.a.MaxStaleness())
	worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
	worstParam := paramError(t, ref.params, got.params, isKeyBias)
	assert.LessOrEqual(t, worstParam, 1e-4)
	assert.InEpsilon(t, ref.eval, got.evals[0].Loss, 1e-5, "held-out loss")
	t.Logf("moe-noisy-topk dp2 K=0: worst loss rel err %.2g, worst param err %.2g", worst, worstParam)
}

// With staleness 2 replicas run ahead on weights up to two updates old;
// training still converges and no replica ever exceeds the bound (the
// runtime fails the run if one would).
func TestAsyncBoundedStalenessConverges(t *testing.T) {
	got := asyncRun(t, asyncPlan{dp: 4, staleness: 2})
	losses, a := got.losses, got.a
	assert.LessOrEqual(t, a.MaxStaleness(), 2)
	first, last := losses[0], 0.0
	for _, l := range losses[len(losses)-5:] {
		last += l / 5
	}
	assert.Less(t, last, first-1.0, "loss falls from %.3f to %.3f", first, last)
	t.Logf("K=2: loss %.3f → %.3f (mean of last 5), max staleness %d", first, last, a.MaxStaleness())
}

// Staleness 0 under mixed precision trains like synchronous data
// parallelism in the same precision: each step's scale reaches both the
// replicas' backward seed and the server's unscaling. The losses differ in
// the last float32 place (the server averages the replicas' losses in
// float64). The fp16 weights differ because synchronous dp's replica loss
// is its share of the global-batch mean, so its fp16 gradients are 1/dp of
// an async replica's and round differently near fp16's underflow; with the
// synchronous scale dp× larger the two runs see the same fp16 values and
// the master weights come out bit-identical, which pins the scale plumbing
// exactly. bf16 has fp32's range, so it is bit-identical at the same scale.
// Measured: loss rel err 5.8e-8 (bf16, fp16 at dp× scale), 8.2e-6 (fp16 at
// the same scale); weights at the same fp16 scale, key biases aside (their
// gradient is rounding noise, see isKeyBias), 1.2e-3 of a tensor's
// largest entry. The tolerances are about 4-6× those; the t.Logf lines
// print the errors.
func TestAsyncMixedPrecisionStalenessZeroIsSynchronous(t *testing.T) {
	for _, tc := range []struct {
		precision        string
		scale, syncScale float64
		lossTol, parmTol float64 // parmTol 0: bit-identical master weights
	}{
		{"bf16", 1, 1, 1e-6, 0},
		{"fp16", 1024, 2048, 1e-6, 0},
		{"fp16", 1024, 1024, 5e-5, 5e-3},
	} {
		t.Run(fmt.Sprintf("%s_scale%g_sync%g", tc.precision, tc.scale, tc.syncScale), func(t *testing.T) {
			ref := trainMP(t, plan{precision: tc.precision, dp: 2}, runtime.NewLossScaler(tc.syncScale), eqSteps)
			var refLosses []float64
			for _, s := range ref.steps {
				refLosses = append(refLosses, s.Loss)
			}
			got := asyncRun(t, asyncPlan{dp: 2, precision: tc.precision, scaler: runtime.NewLossScaler(tc.scale)})
			assert.Equal(t, 0, got.a.MaxStaleness())
			require.Len(t, got.steps, eqSteps)
			for i, s := range got.steps {
				assert.Equal(t, tc.scale, s.LossScale, "step %d runs with the static scale", i+1)
				assert.False(t, s.Skipped, "step %d skipped", i+1)
			}
			worst := assertLossesClose(t, refLosses, got.losses, tc.lossTol)
			requireFinite(t, got.params)
			if tc.parmTol == 0 {
				requireBitIdentical(t, ref.params, got.params, "async K=0 vs sync dp2: master weight")
				t.Logf("%s async K=0 (scale %g) vs sync dp2 (scale %g): worst loss rel err %.2g, master weights bit-identical",
					tc.precision, tc.scale, tc.syncScale, worst)
				return
			}
			worstParam := paramError(t, ref.params, got.params, isKeyBias)
			assert.LessOrEqual(t, worstParam, tc.parmTol)
			t.Logf("%s async K=0 (scale %g) vs sync dp2 (scale %g): worst loss rel err %.2g, worst param err %.2g (of max |w|, key biases aside)",
				tc.precision, tc.scale, tc.syncScale, worst, worstParam)
		})
	}
}

// With staleness 2 and fp16's dynamic scaler the replicas run ahead and
// training still converges with finite master weights.
func TestAsyncFP16DynamicScaleConverges(t *testing.T) {
	scaler := runtime.NewLossScaler(0)
	require.True(t, scaler.Dynamic)
	got := asyncRun(t, asyncPlan{dp: 4, staleness: 2, precision: "fp16", scaler: scaler})
	assert.LessOrEqual(t, got.a.MaxStaleness(), 2)
	skipped := 0
	for _, s := range got.steps {
		assert.Positive(t, s.LossScale, "step %d records its loss scale", s.Step)
		if s.Skipped {
			skipped++
		}
	}
	first, last := got.losses[0], 0.0
	for _, l := range got.losses[len(got.losses)-5:] {
		last += l / 5
	}
	assert.Less(t, last, first-1.0, "loss falls from %.3f to %.3f", first, last)
	requireFinite(t, got.params)
	requireFinite(t, serverBuffers(t, got.a, got.update, lower.State))
	t.Logf("fp16 K=2: loss %.3f → %.3f (mean of last 5), %d of %d steps skipped, scale %g, max staleness %d",
		first, last, skipped, len(got.steps), scaler.Scale, got.a.MaxStaleness())
}

// An overflow injected at the start (scale 1e30 makes the fp16 gradients
// inf) is skipped on the server: the master weights and optimizer state
// are bit-identical to those before the step, and so is every later
// skipped step's. The scaler halves for the steps not yet started: step t
// starts only once step t−1−K is applied, so its scale is at most
// 1e30·0.5^(steps skipped among 1..t−1−K); steps in flight keep theirs.
// The scale then falls until the gradients fit and training resumes.
func TestAsyncOverflowSkipsAndRecovers(t *testing.T) {
	for _, k := range []int{0, 2} {
		t.Run(fmt.Sprintf("K%d", k), func(t *testing.T) {
			p := asyncPlan{dp: 2, staleness: k, precision: "fp16", steps: 120}
			gp, up, boundary := asyncProgs(t, p)
			a, err := cpu.NewAsync(gp, up, boundary, p.dp, p.staleness)
			require.NoError(t, err)
			require.NoError(t, a.InitParams(1))
			prevParams := serverBuffers(t, a, up, lower.Param)
			prevState := serverBuffers(t, a, up, lower.State)
			require.NotEmpty(t, prevState)
			scaler := runtime.NewLossScaler(0)
			scaler.Scale = 1e30
			var steps []runtime.StepMetrics
			cfg := runtime.TrainConfig{Steps: p.steps, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: 1, LossScale: scaler,
				Schedule: runtime.Schedule{LR: 3e-3}}
			_, _, err = a.Train(corpus(), cfg, func(s runtime.StepMetrics, _ *runtime.EvalMetrics) {
				params, state := serverBuffers(t, a, up, lower.Param), serverBuffers(t, a, up, lower.State)
				if s.Skipped {
					requireBitIdentical(t, prevParams, params, "step %d skipped: master weight", s.Step)
					requireBitIdentical(t, prevState, state, "step %d skipped: optimizer state", s.Step)
				}
				prevParams, prevState = params, state
				steps = append(steps, s)
			})
			require.NoError(t, err)
			require.Len(t, steps, p.steps)
			require.True(t, steps[0].Skipped, "the overflowed step is skipped")
			assert.Equal(t, 1e30, steps[0].LossScale)
			if k == 0 {
				assert.Equal(t, 5e29, steps[1].LossScale, "with K = 0 the next step starts after the halving")
			}
			skipped := 0
			for i, s := range steps {
				appliedSkips := 0
				for _, prev := range steps[:max(i-k, 0)] {
					if prev.Skipped {
						appliedSkips++
					}
				}
				assert.LessOrEqual(t, s.LossScale, 1e30*math.Pow(0.5, float64(appliedSkips)),
					"step %d: the halvings of steps 1..%d reach it", s.Step, i-k)
				if s.Skipped {
					skipped++
				}
			}
			assert.Less(t, skipped, len(steps), "training resumes once the scale fits")
			// Once the scale fits, steps train. A later overflow (a
			// gradient spike) still skips its step, and under staleness up
			// to K more computed at the old scale, so the last step may be
			// a skip (at K = 2 a loaded machine's interleaving made it
			// one), but most of the last steps train.
			tail, trained := steps[len(steps)-20:], 0
			for _, s := range tail {
				if !s.Skipped {
					trained++
				}
			}
			assert.Greater(t, trained, len(tail)/2, "most of the last %d steps train", len(tail))
			assert.Less(t, scaler.Scale, 65536.0*2)
			requireFinite(t, serverBuffers(t, a, up, lower.Param))
			t.Logf("K=%d: %d of %d steps skipped while backing off from 1e30; scale now %g; max staleness %d",
				k, skipped, len(steps), scaler.Scale, a.MaxStaleness())
		})
	}
}

// requireBitIdentical stops the test at the first entry of got that
// differs in any bit from want's, or at a tensor missing from either.
func requireBitIdentical(t *testing.T, want, got map[string][]float64, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for name, x := range want {
		require.Len(t, got[name], len(x), name)
		for i := range x {
			if math.Float64bits(x[i]) != math.Float64bits(got[name][i]) {
				require.Failf(t, "changed", "%s %s[%d]: %v → %v", fmt.Sprintf(msg, args...), name, i, x[i], got[name][i])
			}
		}
	}
}

// asyncJob is an asynchronous job whose processes are goroutines of this
// test sharing one comm.Local: each builds its share with NewAsyncJob
// (its replicas; the server in process 0) and trains, exchanging the
// messages gcompile's processes exchange over TCP.
type asyncJob struct {
	procs []*cpu.Async
	comm  *comm.Local
}

// newAsyncJob loads p as a job of procs processes.
func newAsyncJob(t *testing.T, p asyncPlan, procs int) asyncJob {
	t.Helper()
	gp, up, boundary := asyncProgs(t, p)
	j := asyncJob{comm: comm.NewLocal(p.dp)}
	for proc := range procs {
		a, err := cpu.NewAsyncJob(gp, up, boundary, p.staleness, &runtime.Job{
			Layout: runtime.Layout{Devices: p.dp, Procs: procs, Proc: proc}, Comm: j.comm})
		require.NoError(t, err)
		require.NoError(t, a.InitParams(1))
		j.procs = append(j.procs, a)
	}
	return j
}

// asyncOutcome is what one process's Train returned.
type asyncOutcome struct {
	steps []runtime.StepMetrics
	evals []runtime.EvalMetrics
	err   error
}

// train runs Train on the processes listed (every one if none is), each
// with the config cfg gives it, and returns their outcomes by process
// once all have returned.
func (j asyncJob) train(cfg func(proc int) runtime.TrainConfig, only ...int) []asyncOutcome {
	if len(only) == 0 {
		for p := range j.procs {
			only = append(only, p)
		}
	}
	out := make([]asyncOutcome, len(j.procs))
	var wg sync.WaitGroup
	for _, p := range only {
		wg.Go(func() {
			o := &out[p]
			o.steps, o.evals, o.err = j.procs[p].Train(corpus(), cfg(p), nil)
		})
	}
	wg.Wait()
	return out
}

// An asynchronous job spread over processes runs the same protocol as one
// process, so with staleness 0 it trains bit for bit as one: every step's
// loss, gradient norm, loss scale and skip, the held-out loss, the master
// weights and optimizer state, and every replica's and the server's peak.
// The fp16 case starts its dynamic scale at 2^22, so the first steps
// overflow and are skipped, and the scale each replica receives halves
// with every skip until training resumes.
func TestAsyncJobMatchesOneProcess(t *testing.T) {
	for _, tc := range []struct {
		dp, procs, steps int
		precision        string
	}{
		{2, 2, eqSteps, "fp32"},
		{4, 2, eqSteps, "fp32"},
		{4, 4, eqSteps, "fp32"},
		{2, 2, 30, "fp16"},
	} {
		t.Run(fmt.Sprintf("dp%d_procs%d_%s", tc.dp, tc.procs, tc.precision), func(t *testing.T) {
			p := asyncPlan{dp: tc.dp, steps: tc.steps}
			if tc.precision != "fp32" {
				p.precision = tc.precision
			}
			scaler := func() *runtime.LossScaler {
				if p.precision == "" {
					return nil
				}
				s := runtime.NewLossScaler(0)
				s.Scale = 1 << 22
				return s
			}
			p.scaler = scaler()
			ref := asyncRun(t, p)
			j := newAsyncJob(t, p, tc.procs)
			start := time.Now()
			outs := j.train(func(int) runtime.TrainConfig { return asyncConfig(tc.steps, scaler()) })
			elapsed := time.Since(start)
			for proc, o := range outs {
				require.NoError(t, o.err, "process %d", proc)
				if proc > 0 {
					assert.Nil(t, o.steps, "process %d reports no steps: the server's does", proc)
					assert.Nil(t, j.procs[proc].Peaks(), "process %d", proc)
				}
			}
			got := outs[0]
			require.Len(t, got.steps, len(ref.steps))
			skipped := 0
			for i, s := range got.steps {
				want := ref.steps[i]
				assert.Equal(t, math.Float64bits(want.Loss), math.Float64bits(s.Loss), "step %d loss %v vs %v", s.Step, want.Loss, s.Loss)
				assert.Equal(t, math.Float64bits(want.GradNorm), math.Float64bits(s.GradNorm), "step %d grad norm", s.Step)
				assert.Equal(t, want.LossScale, s.LossScale, "step %d loss scale", s.Step)
				assert.Equal(t, want.Skipped, s.Skipped, "step %d skipped", s.Step)
				if s.Skipped {
					skipped++
				}
			}
			require.Len(t, got.evals, 1)
			assert.Equal(t, math.Float64bits(ref.evals[0].Loss), math.Float64bits(got.evals[0].Loss), "held-out loss")
			server := j.procs[0]
			requireBitIdentical(t, ref.params, serverBuffers(t, server, ref.update, lower.Param), "master weight")
			requireBitIdentical(t, serverBuffers(t, ref.a, ref.update, lower.State), serverBuffers(t, server, ref.update, lower.State), "optimizer state")
			assert.Equal(t, ref.a.Peaks(), server.Peaks(), "peaks: replicas, then the server")
			assert.Len(t, server.Peaks(), tc.dp+1)
			assert.Equal(t, 0, server.MaxStaleness())
			assert.Zero(t, j.comm.Pending(), "every message was taken")
			if tc.precision == "fp16" {
				assert.Positive(t, skipped, "the overflows at scale 2^22 are skipped")
				assert.Less(t, skipped, len(got.steps), "training resumes")
			}
			t.Logf("dp%d over %d processes, %s: %d steps (%d skipped) bit-identical to one process, held-out loss %.6f, %v",
				tc.dp, tc.procs, tc.precision, len(got.steps), skipped, got.evals[0].Loss, elapsed.Round(time.Millisecond))
		})
	}
}

// With staleness 2 the replicas of other processes run ahead too, within
// the bound, and training converges.
func TestAsyncJobBoundedStalenessConverges(t *testing.T) {
	p := asyncPlan{dp: 4, staleness: 2, steps: 40}
	j := newAsyncJob(t, p, 2)
	outs := j.train(func(int) runtime.TrainConfig { return asyncConfig(p.steps, nil) })
	for proc, o := range outs {
		require.NoError(t, o.err, "process %d", proc)
	}
	steps := outs[0].steps
	require.Len(t, steps, p.steps)
	for proc, a := range j.procs {
		assert.LessOrEqual(t, a.MaxStaleness(), 2, "process %d", proc)
	}
	first, last := steps[0].Loss, 0.0
	for _, s := range steps[len(steps)-5:] {
		last += s.Loss / 5
	}
	assert.Less(t, last, first-1.0, "loss falls from %.3f to %.3f", first, last)
	t.Logf("dp4 over 2 processes, K=2: loss %.3f → %.3f (mean of last 5), max staleness %d", first, last, j.procs[0].MaxStaleness())
}

// A process that is gone, or a replica that fails, ends every process's
// Train: no wait of the protocol outlives the comm's timeout, and a
// failure anywhere aborts the comm at once instead of leaving the others
// to time out.
func TestAsyncJobFailuresEndEveryProcess(t *testing.T) {
	p := asyncPlan{dp: 4, steps: 1000}
	cfg := func(int) runtime.TrainConfig { return asyncConfig(p.steps, nil) }
	t.Run("a replica's process never trains", func(t *testing.T) {
		j := newAsyncJob(t, p, 2)
		j.comm.SetTimeout(500 * time.Millisecond)
		start := time.Now()
		outs := j.train(cfg, 0)
		require.ErrorIs(t, outs[0].err, runtime.ErrTimeout)
		assert.Regexp(t, `replica [23] \(rank [23], process 1\): waiting for its request for step 1's weights: .*timed out after 500ms waiting for rank [23]`, outs[0].err.Error())
		assert.Less(t, time.Since(start), 10*time.Second)
		t.Logf("%v: %v", time.Since(start).Round(time.Millisecond), outs[0].err)
	})
	t.Run("the server's process never trains", func(t *testing.T) {
		j := newAsyncJob(t, p, 2)
		j.comm.SetTimeout(500 * time.Millisecond)
		start := time.Now()
		outs := j.train(cfg, 1)
		require.ErrorIs(t, outs[1].err, runtime.ErrTimeout)
		assert.Contains(t, outs[1].err.Error(), "waiting for weights from the parameter server (rank 0)")
		assert.Less(t, time.Since(start), 10*time.Second)
		t.Logf("%v: %v", time.Since(start).Round(time.Millisecond), outs[1].err)
	})
	t.Run("a replica fails", func(t *testing.T) {
		// The comm's timeout stays at its default (minutes): only the
		// abort can end the server's waits this soon.
		j := newAsyncJob(t, p, 2)
		start := time.Now()
		outs := j.train(func(proc int) runtime.TrainConfig {
			c := cfg(proc)
			if proc == 1 {
				c.Batch *= 2 // its replicas' inputs no longer fit their programs
			}
			return c
		})
		require.Error(t, outs[1].err)
		assert.Contains(t, outs[1].err.Error(), `input "tokens"`)
		require.ErrorIs(t, outs[0].err, runtime.ErrAborted)
		assert.Contains(t, outs[0].err.Error(), `input "tokens"`, "the server's process learns the cause")
		assert.Less(t, time.Since(start), 20*time.Second)
		t.Logf("%v: %v", time.Since(start).Round(time.Millisecond), outs[0].err)
	})
}
