package main

import (
	"errors"
	"fmt"

	"gcompile/compile"
	"gcompile/data"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// runAsync runs asynchronous data parallelism: one gradient program per
// replica and the update program of the parameter server. In a job of
// several processes replica r runs in the process holding device rank r
// and the server in process 0, which writes the outputs.
func runAsync(c *config, j *job, res *compile.Result) error {
	gp, up, boundary := res.Async.Grad, res.Async.Update, res.Async.Boundary
	if c.DP != j.layout.Devices {
		return fmt.Errorf("--dp-sync async runs one replica per device: --dp %d must equal --devices %d", c.DP, j.layout.Devices)
	}
	compileMs := float64(res.Elapsed.Microseconds()) / 1000
	if j.lead() {
		where := ""
		if j.multi() {
			where = fmt.Sprintf(" in %d processes (%d each, the parameter server in process 0)", j.world.Size, j.layout.PerProc())
		}
		fmt.Fprintf(j.log, "compiled %s in %.0f ms for %d asynchronous replicas%s (staleness ≤ %d): replica %s; update %s\n",
			res.Module.Name, compileMs, c.DP, where, c.Staleness, gp.Describe(), up.Describe())
	}
	met := newMetrics(c, j, res, compileMs)
	for r := range c.DP {
		met.Devices = append(met.Devices, deviceMetrics(gp, r))
	}
	met.Devices = append(met.Devices, deviceMetrics(up, c.DP))
	var runErr error
	if c.run {
		runErr = trainAsync(c, j, gp, up, boundary, res.Module.IgnoreOnLoad, met)
	}
	if c.metrics != "" && j.lead() {
		if err := met.WriteFile(c.metrics); err != nil {
			return errors.Join(runErr, err)
		}
	}
	return runErr
}

func trainAsync(c *config, j *job, gp, up *lower.Program, boundary, ignoreOnLoad []string, met *runtime.Metrics) error {
	if c.trace != "" {
		return errors.New("--trace is not supported with --dp-sync async yet")
	}
	batch, seq, err := inputShape([]*lower.Program{gp})
	if err != nil {
		return err
	}
	corpus, err := data.Load(data.Options{Path: c.data, MaxBytes: int64(c.maxDataMB) << 20})
	if err != nil {
		return err
	}
	met.Data = &runtime.DataMetrics{Source: corpus.Source, TrainBytes: len(corpus.Train), EvalBytes: len(corpus.Eval)}
	var a *cpu.Async
	if j.multi() {
		net, err := j.connect()
		if err != nil {
			return err
		}
		a, err = cpu.NewAsyncJob(gp, up, boundary, c.Staleness, &runtime.Job{Layout: j.layout, Comm: net})
		if err != nil {
			return err
		}
	} else if a, err = cpu.NewAsync(gp, up, boundary, c.DP, c.Staleness); err != nil {
		return err
	}
	if err := a.InitParams(uint64(c.seed)); err != nil {
		return err
	}
	// The master weights are the server's: process 0 loads them, and every
	// replica takes them from there.
	server := serverWeights{a.Server}
	if c.load != "" && a.Server != nil {
		if err := loadWeights(server, []*lower.Program{gp}, c.load, ignoreOnLoad); err != nil {
			return err
		}
	}
	// The same scaler as synchronous training; Async fixes each step's
	// scale when its first replica starts and feeds both programs that one.
	// The global batch is the replicas' together: --batch for a model.go,
	// whose replicas are built at its share; a .gir dump's own batch per
	// replica.
	cfg := runtime.TrainConfig{Steps: c.steps, Batch: batch * c.DP, Seq: seq, Seed: c.seed, EvalBatches: c.evalBatches,
		Schedule:  runtime.Schedule{LR: c.lr, MinLR: c.minLR, Warmup: c.warmup, Steps: c.steps, Decay: c.decay},
		LossScale: lossScaler(c)}
	if !j.lead() {
		// This process's replicas; the server reports every step.
		_, _, err := a.Train(corpus, cfg, nil)
		return err
	}
	p := newProgress(j.log, c.steps)
	steps, evals, trainErr := a.Train(corpus, cfg, p.step)
	p.done()
	met.Steps, met.Eval = steps, evals
	met.Async = &runtime.AsyncMetrics{Staleness: c.Staleness, MaxStalenessSeen: a.MaxStaleness()}
	for r, peak := range a.Peaks() {
		met.Devices[r].PeakBytesMeasured = peak
	}
	fmt.Fprintf(j.log, "largest staleness seen: %d (bound %d)\n", a.MaxStaleness(), c.Staleness)
	if trainErr != nil {
		return trainErr
	}
	if c.save != "" {
		if err := saveWeights(server, []*lower.Program{gp}, c.save, c.steps, true); err != nil {
			return err
		}
		fmt.Fprintf(j.log, "saved weights to %s\n", c.save)
	}
	return nil
}

// serverWeights reaches the master weights on the parameter server, for
// --save and --load: whole tensors, as the server holds them.
type serverWeights struct{ d *cpu.Device }

func (s serverWeights) Global(name string) ([]float64, error) { return s.d.Float64s(name) }

func (s serverWeights) SetGlobal(name string, x []float64) error { return s.d.SetFloat64s(name, x) }
