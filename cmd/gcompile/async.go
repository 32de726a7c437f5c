package main

import (
	"fmt"
	"slices"

	"gcompile/compile"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
)

// runAsync runs asynchronous data parallelism: one gradient program per
// replica and the update program of the parameter server. In a job of
// several processes replica r runs in the process holding device rank r
// and the server in process 0, which writes the outputs.
func runAsync(c *config, j *job, res *compile.Result, resumeDir string) error {
	gp, up := res.Async.Grad, res.Async.Update
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
	server := deviceMetrics(up, c.DP)
	server.Role = "update"
	met.Devices = append(met.Devices, server)
	var runErr error
	if c.run {
		runErr = trainAsync(c, j, res, met, resumeDir)
	}
	return writeRunOutputs(c, j, res, met, runErr, nil)
}

func trainAsync(c *config, j *job, res *compile.Result, met *runtime.Metrics, resumeDir string) (err error) {
	// Until the first step a failure refuses the run (refusedError).
	started := false
	defer func() {
		if err != nil && !started {
			err = refusedError{err}
		}
	}()
	gp, up, boundary, ignoreOnLoad := res.Async.Grad, res.Async.Update, res.Async.Boundary, res.Module.IgnoreOnLoad
	batch, seq, err := inputShape([]*lower.Program{gp})
	if err != nil {
		return err
	}
	if err := checkCheckpointRoom(c, j, res.Module, resumeDir); err != nil {
		return err
	}
	corpus, err := loadSource(c, j, res.Module, seq)
	if err != nil {
		return err
	}
	met.Data = dataMetrics(c, corpus)
	c.vocabTables = vocabTables(res.Module, c.Classes)
	c.exportConfig = res.Module.ExportConfig
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
	if c.load != "" && a.Server != nil {
		if err := loadWeights(serverWeights{a.Server}, []*lower.Program{gp}, c.load, c.ignoredOnLoad(ignoreOnLoad), c.Classes); err != nil {
			return err
		}
	}
	// The same scaler as synchronous training; Async fixes each step's
	// scale when its first replica starts and feeds both programs that one.
	// The global batch is the replicas' together: --batch for a model.go,
	// whose replicas are built at its share; a .gir dump's own batch per
	// replica.
	cfg := runtime.TrainConfig{Steps: c.steps, Batch: batch * c.DP, Seq: seq, Seed: c.seed, EvalBatches: c.evalBatches, EvalOutput: runtime.EvalOutput(outputNames(res.Module)),
		Schedule:  c.schedule(),
		LossScale: lossScaler(c), RandomKey: res.Module.Source(ir.InputRandomKey) != nil}
	// The checkpointed state is the server's: the master weights and the
	// optimizer state, which process 0 saves and loads; every process
	// reads where the run resumes from the manifest.
	server := serverCluster{a.Server}
	updates := []*lower.Program{up}
	plan := checkpointPlan(c, updates, cfg.Batch, seq, j.world.Size)
	if resumeDir != "" {
		if a.Server != nil {
			if cfg.Start, err = resumeState(c, server, updates, goModelName(c, res), res.ModelFingerprint, resumeDir, plan); err != nil {
				return err
			}
			if cfg.Start.Step == c.steps {
				return fmt.Errorf("--resume %s: the checkpoint is at step %d; --steps %d leaves nothing to run (--dp-sync async does not write a finished run's outputs from its checkpoint yet)", resumeDir, cfg.Start.Step, c.steps)
			}
			fmt.Fprintf(j.log, "resumed from %s at step %d (optimizer step %d)\n", resumeDir, cfg.Start.Step, cfg.Start.OptStep)
			met.ResumedFrom = &runtime.ResumeMetrics{Checkpoint: resumeDir, Step: cfg.Start.Step}
		} else {
			m, err := checkpoint.ReadManifest(resumeDir)
			if err != nil {
				return fmt.Errorf("--resume: %w", err)
			}
			cfg.Start = m.State
		}
		cfg.Seed = cfg.Start.Seed
	}
	if !j.lead() {
		// This process's replicas; the server reports every step, and
		// decides when the run stops: a signal here waits for its word
		// (the launcher and SLURM signal every process).
		w := watchSignals(j.log)
		defer w.release()
		j.log = w.watchLog(j.log)
		j.setPhase("training")
		j.preemptible.Store(true)
		started = true
		_, _, err := a.Train(corpus, cfg, nil)
		j.finishing.Store(true)
		j.preemptible.Store(false)
		return err
	}
	ck := &checkpointer{c: c, j: j, dev: server, progs: updates, stop: watchSignals(j.log),
		opts: checkpoint.SaveOptions{Root: c.ckptDir, Model: res.Module.Name, ModelFingerprint: res.ModelFingerprint,
			PlanHash: lower.Fingerprint(gp, up), Plan: plan, KeepLast: c.keepLast}}
	defer ck.stop.release()
	j.log = ck.stop.watchLog(j.log)
	j.setPhase("training")
	ck.stop.last.Store(resumeDir)
	cfg.Boundary = ck.boundary
	var earlier *runtime.Metrics
	if resumeDir != "" && c.metrics != "" {
		earlier = earlierParts(c.metrics, resumeDir, cfg.Start.Step)
	}
	// The record so far, written at each checkpoint as a synchronous run
	// writes it (compileAndRun): a part killed later keeps its steps.
	var soFar []runtime.StepMetrics
	var evalsSoFar []runtime.EvalMetrics
	if c.metrics != "" {
		ck.record = func() error {
			snap := *met
			snap.Steps, snap.Eval = slices.Clone(soFar), slices.Clone(evalsSoFar)
			snap.Checkpoint, snap.Checkpoints = ck.saved, slices.Clone(ck.saves)
			snap.InProgress = true
			snap.Async = &runtime.AsyncMetrics{Staleness: c.Staleness, MaxStalenessSeen: a.MaxStaleness()}
			carry(&snap, earlier)
			return snap.WriteFile(c.metrics)
		}
	}
	p := newProgress(j.log, c.steps, c.logEvery)
	j.preemptible.Store(true)
	started = true
	steps, evals, trainErr := a.Train(corpus, cfg, func(s runtime.StepMetrics, e *runtime.EvalMetrics) {
		if ck.record != nil {
			soFar = append(soFar, s)
			if e != nil {
				evalsSoFar = append(evalsSoFar, *e)
			}
		}
		p.step(s, e)
	})
	j.finishing.Store(true)
	j.preemptible.Store(false)
	p.done()
	met.Steps, met.Eval = steps, evals
	met.Stopped = ck.stoppedBy
	c.stopStatus = ck.stopStatus
	met.Checkpoint, met.Checkpoints = ck.saved, ck.saves
	carry(met, earlier)
	met.Async = &runtime.AsyncMetrics{Staleness: c.Staleness, MaxStalenessSeen: a.MaxStaleness()}
	for r, peak := range a.Peaks() {
		met.Devices[r].PeakBytesMeasured = peak
	}
	fmt.Fprintf(j.log, "largest staleness seen: %d (bound %d)\n", a.MaxStaleness(), c.Staleness)
	if trainErr != nil {
		return trainErr
	}
	if c.save != "" {
		// A replica's model is built at its share of the batch: no
		// fingerprint of the whole model to check against.
		if err := saveWeights(serverWeights{a.Server}, []*lower.Program{gp}, c.save, c.steps, true, c.vocabTables, map[string]string{"model": res.Module.Name, "set": c.Set}); err != nil {
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

// serverCluster is the parameter server as a checkpoint sees it: the one
// device whose params and optimizer state are the run's; the replicas
// hold copies of its weights, taken afresh each step.
type serverCluster struct{ d *cpu.Device }

func (s serverCluster) Local() ([]int, []runtime.BlockDevice) {
	return []int{0}, []runtime.BlockDevice{s.d}
}

func (serverCluster) Process() (proc, procs int) { return 0, 1 }

func (serverCluster) AnyOf(flag bool) (bool, error) { return flag, nil }
