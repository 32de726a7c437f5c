package main

import (
	"fmt"
	"os"
	"time"

	"gcompile/data"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// runAsync compiles and runs asynchronous data parallelism: the module is
// split into a gradient program (one per replica) and an update program.
func runAsync(c *config, m *ir.Module, start time.Time, results []passes.Result) error {
	gm, um, boundary, err := lower.SplitAtOptimizer(m)
	if err != nil {
		return err
	}
	gp, err := lower.Lower(gm)
	if err != nil {
		return err
	}
	up, err := lower.Lower(um)
	if err != nil {
		return err
	}
	compileMs := float64(time.Since(start).Microseconds()) / 1000
	fmt.Fprintf(os.Stderr, "compiled %s in %.0f ms for %d asynchronous replicas (staleness ≤ %d): replica %s; update %s\n",
		m.Name, compileMs, c.dp, c.staleness, gp.Describe(), up.Describe())
	met := &runtime.Metrics{Config: c.metricsConfig(), CompileMs: compileMs, Schedule: runtime.ScheduleMetrics{Name: "none"},
		Model: runtime.ModelMetrics{Params: paramCount(m)}, Steps: []runtime.StepMetrics{}, Eval: []runtime.EvalMetrics{}}
	for _, r := range results {
		met.Passes = append(met.Passes, runtime.PassMetrics{Name: r.Name, Ms: r.Ms, Changed: r.Changed, Skipped: r.Skipped})
	}
	for r := range c.dp {
		met.Devices = append(met.Devices, deviceMetrics(gp, r))
	}
	server := deviceMetrics(up, c.dp)
	met.Devices = append(met.Devices, server)
	var runErr error
	if c.run {
		runErr = trainAsync(c, gp, up, boundary, met)
	}
	if c.metrics != "" {
		if err := met.WriteFile(c.metrics); err != nil {
			return err
		}
	}
	return runErr
}

func trainAsync(c *config, gp, up *lower.Program, boundary []string, met *runtime.Metrics) error {
	if c.trace != "" || c.save != "" || c.load != "" {
		return fmt.Errorf("--trace, --save and --load are not supported with --dp-sync async yet")
	}
	_, seq, err := inputShape([]*lower.Program{gp})
	if err != nil {
		return err
	}
	corpus, err := data.Load(data.Options{Path: c.data, MaxBytes: int64(c.maxDataMB) << 20})
	if err != nil {
		return err
	}
	met.Data = &runtime.DataMetrics{Source: corpus.Source, TrainBytes: len(corpus.Train), EvalBytes: len(corpus.Eval)}
	a, err := cpu.NewAsync(gp, up, boundary, c.dp, c.staleness)
	if err != nil {
		return err
	}
	if err := a.InitParams(uint64(c.seed)); err != nil {
		return err
	}
	// The same scaler as synchronous training; Async fixes each step's
	// scale when its first replica starts and feeds both programs that one.
	cfg := runtime.TrainConfig{Steps: c.steps, Batch: c.batch, Seq: seq, Seed: c.seed, EvalBatches: c.evalBatches,
		Schedule:  runtime.Schedule{LR: c.lr, MinLR: c.minLR, Warmup: c.warmup, Steps: c.steps, Decay: c.decay},
		LossScale: lossScaler(c)}
	p := newProgress(os.Stderr, c.steps)
	steps, evals, trainErr := a.Train(corpus, cfg, p.step)
	p.done()
	met.Steps, met.Eval = steps, evals
	met.Async = &runtime.AsyncMetrics{Staleness: c.staleness, MaxStalenessSeen: a.MaxStaleness()}
	for r, w := range a.Workers {
		met.Devices[r].PeakBytesMeasured = w.PeakBytes()
	}
	met.Devices[len(a.Workers)].PeakBytesMeasured = a.Server.PeakBytes()
	fmt.Fprintf(os.Stderr, "largest staleness seen: %d (bound %d)\n", a.MaxStaleness(), c.staleness)
	return trainErr
}
