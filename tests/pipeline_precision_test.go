package tests

import (
	"maps"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// compilePipelineMP compiles the equivalence GPT for pp=2 with mixed
// precision and a 1F1B schedule over micro microbatches.
func compilePipelineMP(t *testing.T, precision string, micro int) (*ir.Module, []*lower.Program) {
	return compileScheduleMP(t, "1f1b", precision, micro)
}

// compileScheduleMP is compilePipelineMP under the named schedule.
func compileScheduleMP(t *testing.T, schedule, precision string, micro int) (*ir.Module, []*lower.Program) {
	t.Helper()
	pl := pipePlan{pp: 2, micro: micro, name: schedule, order: scheduleOrder(schedule)}
	m, progs, _ := compilePipeline(t, pl, 2, pipeSetup{edit: func(o *passes.Options) { o.Precision = precision }})
	return m, progs
}

// trainPipelineMP trains pipeline programs under a loss scaler for
// eqSteps steps, as trainMP trains one device's (no step may be
// skipped), and returns the losses and the final params.
func trainPipelineMP(t *testing.T, m *ir.Module, progs []*lower.Program, scaler *runtime.LossScaler) ([]float64, map[string][]float64) {
	t.Helper()
	cl, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	steps, _, err := runtime.Train(cl, corpus(), mpConfig(scaler, eqSteps), nil)
	require.NoError(t, err)
	var losses []float64
	for i := range steps {
		require.False(t, steps[i].Skipped, "step %d skipped", i+1)
		losses = append(losses, steps[i].Loss)
	}
	params := map[string][]float64{}
	for _, p := range m.Params() {
		params[p.Name()], err = cl.Global(p.Name())
		require.NoError(t, err)
	}
	requireFinite(t, params)
	for r, d := range cl.Devices {
		assert.Equal(t, d.Program().PeakBytes, d.PeakBytes(), "device %d: measured peak equals predicted", r)
	}
	return losses, params
}

// Mixed precision on a two-stage pipeline trains like mixed precision on
// one device with the same microbatches: the loss scale reaches every
// stage, each stage counts its own non-finite gradients, and the skip
// decision is global. The stages add their partial gradient norms in a
// different order than one device, so the clip coefficient can differ in
// its last bit, and bf16's 8-bit mantissa can turn that into a different
// rounding of a weight copy. The tied embedding's gradient is summed on
// each stage over the microbatches and the two sums added once (one
// device adds the two parts for each microbatch, in fp32 too), a
// last-bit difference that a 16-bit weight copy can round apart and Adam
// turn into up-to-lr steps where a gradient is near zero. Measured: worst
// loss rel err bf16 2.7e-5, fp16 6e-6; worst weight element (of its
// tensor's largest) fp16 3.0e-4 (c_proj), bf16 under 1e-3; asserted 1e-4
// and 1e-5 on the losses, 1e-3 on the weights.
func TestPipelineMixedPrecisionMatchesOneDevice(t *testing.T) {
	for _, tc := range []struct {
		precision string
		scale     float64
		tol       float64
		parmTol   float64
	}{{"bf16", 1, 1e-4, 1e-3}, {"fp16", 1024, 1e-5, 1e-3}} {
		t.Run(tc.precision, func(t *testing.T) {
			ref := trainMP(t, plan{precision: tc.precision, micro: 4}, runtime.NewLossScaler(tc.scale), eqSteps)
			m, progs := compilePipelineMP(t, tc.precision, 4)
			got, params := trainPipelineMP(t, m, progs, runtime.NewLossScaler(tc.scale))
			worst := assertLossesClose(t, lossesOf(ref), got, tc.tol)
			worstParam := paramError(t, ref.params, params, isKeyBias)
			assert.LessOrEqual(t, worstParam, tc.parmTol)
			t.Logf("pp2 %s: worst loss rel err %.2g, worst param err %.2g", tc.precision, worst, worstParam)
		})
	}
}

func lossesOf(r mpRun) []float64 {
	var out []float64
	for _, s := range r.steps {
		out = append(out, s.Loss)
	}
	return out
}

// Under mixed precision PipeDream-2BW keeps its previous weights in the
// 16-bit dtype the forward and backward read them in, 2 bytes a param: an
// fp32 version kept 4 and the forward cast it down to 2 more every step.
// Each step the optimizer casts the param down right before its update
// and the state takes the copy in place, so at the peak the first rank
// holds exactly its fp32 master weights and one 16-bit version (4 + 2
// bytes a param), on one device as on the pipeline; and the pipeline
// still trains like one device running 2BW's rule in the same precision.
func TestTwoBWKeepsPreviousWeightsInComputePrecision(t *testing.T) {
	for _, tc := range []struct {
		precision string
		low       ir.DType
		scale     float64
	}{{"bf16", ir.BF16, 1}, {"fp16", ir.F16, 1024}} {
		t.Run(tc.precision, func(t *testing.T) {
			ref := trainMP(t, plan{precision: tc.precision, micro: 4, twoBW: true, layers: 2}, runtime.NewLossScaler(tc.scale), eqSteps)
			m, progs := compileScheduleMP(t, "2bw", tc.precision, 4)
			for _, prog := range append([]*lower.Program{ref.prog}, progs...) {
				var versions int
				for _, b := range prog.Buffers {
					if b.Kind == lower.State && strings.HasPrefix(b.Name, ir.PrevPrefix) {
						versions++
						assert.Equal(t, tc.low, b.Type.DType, "%s: %s", prog.Name, b.Name)
					}
				}
				assert.Positive(t, versions, prog.Name)
				for _, in := range prog.Instrs {
					if in.Op == "copy" && in.Out >= 0 && strings.HasPrefix(prog.Buffers[in.Out].Name, ir.PrevPrefix) {
						t.Errorf("%s: %s takes its new value by a copy at the end of the step, not in place", prog.Name, prog.Buffers[in.Out].Name)
					}
				}
			}
			for _, prog := range []*lower.Program{ref.prog, progs[0]} {
				var master int64
				for _, b := range prog.Buffers {
					if b.Kind == lower.Param {
						master += b.Bytes
					}
				}
				assert.Equal(t, master+master/2, prog.Peak.Params, "%s: params at the peak are the fp32 master weights and one 16-bit version", prog.Name)
			}
			got, params := trainPipelineMP(t, m, progs, runtime.NewLossScaler(tc.scale))
			worst := assertLossesClose(t, lossesOf(ref), got, 1e-4)
			worstParam := paramError(t, ref.params, params, isKeyBias)
			assert.LessOrEqual(t, worstParam, 1e-3)
			t.Logf("2bw pp2 %s: worst loss rel err %.2g, worst param err %.2g", tc.precision, worst, worstParam)
		})
	}
}

// An overflow on a pipeline skips the step on every stage: no master
// weight or optimizer state changes anywhere, and the scale is halved.
func TestPipelineOverflowSkipsEveryStage(t *testing.T) {
	m, progs := compilePipelineMP(t, "fp16", 2)
	cl, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	snapshot := func() map[string][]float64 {
		out := map[string][]float64{}
		for _, prog := range progs {
			maps.Copy(out, globals(t, cl, prog, lower.Param, lower.State))
		}
		return out
	}
	before := snapshot()
	require.NotEmpty(t, before)
	scaler := runtime.NewLossScaler(0)
	scaler.Scale = 1e30
	cfg := runtime.TrainConfig{Steps: 1, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: -1, LossScale: scaler, Schedule: runtime.Schedule{LR: 3e-3}}
	ms, _, err := runtime.Train(cl, corpus(), cfg, nil)
	require.NoError(t, err)
	require.True(t, ms[0].Skipped)
	assert.Equal(t, 5e29, scaler.Scale)
	requireBitIdentical(t, before, snapshot(), "a skipped step changed")
	stages := map[int]bool{}
	for _, p := range m.Params() {
		stages[p.Meta.Stage] = true
	}
	assert.Len(t, stages, 2, "params on both stages")
}

// The global gradient norm and the overflow count are summed from
// per-stage partials: in the optimizer phase only scalars cross stages,
// never a gradient.
func TestPipelineOptimizerSendsOnlyScalars(t *testing.T) {
	for _, precision := range []string{"fp32", "fp16"} {
		_, progs := compilePipelineMP(t, precision, 2)
		scalars := 0
		for r, prog := range progs {
			for _, in := range prog.Instrs {
				if in.Op != "send" || in.Value.Meta.Phase != ir.PhaseOpt {
					continue
				}
				require.Equal(t, 0, in.Value.Type.Rank(), "%s: rank %d sends %s %v in the optimizer phase", precision, r, in.Value.Where(), in.Value.Type)
				scalars++
			}
		}
		assert.Positive(t, scalars, "%s: the partial sums travel between stages", precision)
	}
}
