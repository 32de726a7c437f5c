package main

import (
	"errors"
	"fmt"
	"os"

	"gcompile/compile"
	"gcompile/data"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// runAsync runs asynchronous data parallelism: one gradient program per
// replica and the update program of the parameter server.
func runAsync(c *config, j *job, res *compile.Result) error {
	if j.multi() {
		return fmt.Errorf("--dp-sync async across processes: %w (the parameter server and its replicas run in one process)", errNotYet)
	}
	gp, up, boundary := res.Async.Grad, res.Async.Update, res.Async.Boundary
	compileMs := float64(res.Elapsed.Microseconds()) / 1000
	fmt.Fprintf(j.log, "compiled %s in %.0f ms for %d asynchronous replicas (staleness ≤ %d): replica %s; update %s\n",
		res.Module.Name, compileMs, c.DP, c.Staleness, gp.Describe(), up.Describe())
	met := newMetrics(c, res, compileMs)
	for r := range c.DP {
		met.Devices = append(met.Devices, deviceMetrics(gp, r))
	}
	met.Devices = append(met.Devices, deviceMetrics(up, c.DP))
	var runErr error
	if c.run {
		runErr = trainAsync(c, gp, up, boundary, met)
	}
	if c.metrics != "" {
		if err := met.WriteFile(c.metrics); err != nil {
			return errors.Join(runErr, err)
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
	a, err := cpu.NewAsync(gp, up, boundary, c.DP, c.Staleness)
	if err != nil {
		return err
	}
	if err := a.InitParams(uint64(c.seed)); err != nil {
		return err
	}
	// The same scaler as synchronous training; Async fixes each step's
	// scale when its first replica starts and feeds both programs that one.
	cfg := runtime.TrainConfig{Steps: c.steps, Batch: c.Batch, Seq: seq, Seed: c.seed, EvalBatches: c.evalBatches,
		Schedule:  runtime.Schedule{LR: c.lr, MinLR: c.minLR, Warmup: c.warmup, Steps: c.steps, Decay: c.decay},
		LossScale: lossScaler(c)}
	p := newProgress(os.Stderr, c.steps)
	steps, evals, trainErr := a.Train(corpus, cfg, p.step)
	p.done()
	met.Steps, met.Eval = steps, evals
	met.Async = &runtime.AsyncMetrics{Staleness: c.Staleness, MaxStalenessSeen: a.MaxStaleness()}
	for r, w := range a.Workers {
		met.Devices[r].PeakBytesMeasured = w.PeakBytes()
	}
	met.Devices[len(a.Workers)].PeakBytesMeasured = a.Server.PeakBytes()
	fmt.Fprintf(os.Stderr, "largest staleness seen: %d (bound %d)\n", a.MaxStaleness(), c.Staleness)
	return trainErr
}
