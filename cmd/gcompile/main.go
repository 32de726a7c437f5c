// Command gcompile compiles a model written in gcompile's Go DSL (or a
// dumped .gir module) into per-device training programs, and with --run
// trains it on the CPU backend or, with --backend cuda, on NVIDIA GPUs —
// in one process, or in a job of several processes started by torchrun,
// srun, mpirun or `gcompile launch`.
//
//	gcompile examples/gpt/model.go --run --steps 200 --metrics m.json --dump d/
//	gcompile launch --nproc 4 -- examples/gpt/model.go --devices 4 --tp 2 --run
//
// Every pass can be inspected: --dump writes the module after each pass
// that changed it plus an index.html that shows the passes side by side.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"gcompile/compile"
	"gcompile/data"
	"gcompile/frontend"
	"gcompile/frontend/loader"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes/schedule"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda"
	"gcompile/runtime/dist"
)

func main() {
	if err := mainErr(os.Args[1:]); err != nil {
		var printed *printedError
		if !errors.As(err, &printed) {
			printError(err)
		}
		os.Exit(exitCode(err))
	}
}

// printError prints err on stderr, a "gcompile: " line for each of its
// lines; its trailing line ends (a tool's output it quotes) print no
// empty "gcompile: " line.
func printError(err error) {
	fmt.Fprintln(os.Stderr, "gcompile:", strings.ReplaceAll(strings.TrimRight(err.Error(), "\n"), "\n", "\ngcompile: "))
}

// printedError is an error printed already, which main does not print
// again.
type printedError struct{ error }

func (e *printedError) Unwrap() error { return e.error }

func mainErr(args []string) (err error) {
	// -h asked for the usage, which is printed: that is success.
	defer func() {
		if errors.Is(err, flag.ErrHelp) {
			err = nil
		}
	}()
	if len(args) > 0 {
		for _, sc := range subcommandTable() {
			if args[0] == sc.name {
				return sc.main(args[1:])
			}
		}
	}
	c, err := parseArgs(args)
	if err != nil {
		return labelFromLauncher(c, err)
	}
	if c.helpModel {
		return helpModel(c)
	}
	if w, err := worldOf(c); err == nil && w.Rank > 0 {
		c.Progress = io.Discard // rank 0 says it for the job
	} else {
		for _, note := range c.inertFlags(err != nil || w.Size <= 1) {
			fmt.Fprintln(os.Stderr, note)
		}
	}
	if c.planning() {
		// The planner compiles the model: with a token dataset, at the
		// vocabulary the data needs.
		if err := c.openTokenData(); err != nil {
			return labelFromLauncher(c, err)
		}
		if c.run {
			// A run that cannot start (no data, a checkpoint folder of
			// another run, an output that cannot be written) is refused
			// before the search, which takes a while, not after it.
			w, werr := worldOf(c)
			if _, err := checkCheckpointPaths(c); err != nil {
				return labelFromLauncher(c, err)
			}
			if err := checkPaths(c, werr != nil || w.Rank == 0); err != nil {
				return labelFromLauncher(c, err)
			}
		}
		// --plan without --run prints the table and stops; a plan chosen
		// for --devices alone is compiled (and with --run trained).
		if err := runPlanner(c); err != nil || c.plan && !c.run {
			return labelFromLauncher(c, err)
		}
	}
	j, err := startJob(c)
	if err != nil {
		return labelFromLauncher(c, err)
	}
	defer func() {
		var stopped *exitStatus
		if err != nil && !errors.As(err, &stopped) {
			if j.multi() {
				err = labelled(j.world.Rank, j.explainTimeout(headline(j.world.Rank, err)))
			}
			j.fail(err)
			// Another process's failure that stopped this one is the
			// error to report: this one's is its echo.
			err = j.stoppedBy(err)
		} else if err != nil && j.multi() && j.world.Rank > 0 {
			// A stopped run's reason, said by every process: which one
			// says it.
			err = labelled(j.world.Rank, err)
		}
		err = errors.Join(err, j.close())
	}()
	return compileAndRun(c, j)
}

// subcommand is a command of gcompile other than compiling a model: its
// name is the first argument. -h lists them all (config.go's usage).
type subcommand struct {
	name, args, doc string
	main            func(args []string) error
}

// subcommandTable is the commands mainErr dispatches, in the order -h
// lists them. A function, not a variable: launchMain reaches the usage
// that lists them through parseArgs, a cycle no variable may start.
func subcommandTable() []subcommand {
	return []subcommand{
		{"launch", "--nproc N [launch flags] -- MODEL.go|MODEL.gir [flags]", "start N processes of one job on this machine and watch them (see gcompile launch -h)", launchMain},
		{"inspect", "CHECKPOINT", "print a checkpoint's training state, the plan that saved it and the bytes each rank wrote", inspectMain},
		{"data", "prepare --tokenizer T --output-prefix PREFIX INPUT… | merge --output-prefix PREFIX INPUT…", "tokenize text, folders or JSON Lines into a token dataset (Megatron-LM's .bin/.idx, PREFIX.bin and PREFIX.idx) that --data PREFIX trains on, or merge datasets into one", dataMain},
		{"generate", "MODEL.go (--load W | --resume CKPT) (--prompt TEXT | --prompt-file F) [flags]", "continue prompts with a trained model: a prefill and a decode program with key/value caches, compiled for --tp/--dp (see gcompile generate -h)", generateMain},
		{"eval", "MODEL.go|MODEL.gir (--load W | --resume CKPT) [--data …] [flags]", "the held-out loss and perplexity of trained weights, under any plan (see gcompile eval -h)", evalMain},
		{"export", "CHECKPOINT --out FILE.safetensors", "write a checkpoint's params as one safetensors file (or Hugging Face shards) under the model's names", exportMain},
	}
}

// labelFromLauncher is an error found before this process joined its job:
// in a job of several processes, each printing it, it starts with the rank
// the launcher (or --rank) gave this one. c is nil when the command line
// did not parse.
func labelFromLauncher(c *config, err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	var w dist.World
	var werr error
	if c != nil {
		w, werr = worldOf(c)
	} else {
		w, werr = dist.FromEnv(os.Getenv)
	}
	if werr != nil || w.Size <= 1 {
		return err
	}
	err = labelled(w.Rank, err)
	var joined *rendezvousError
	if !errors.As(err, &joined) {
		// Said before the job is told, which takes rank 0 up to
		// tellJobWait (it waits for the others to hear it), in which a
		// launcher that saw another rank fail stops this one.
		printError(err)
		tellJob(c, w, err)
		return &printedError{err}
	}
	return err
}

// compileAndRun compiles the plan and, with --run, trains it. In a job of
// several processes every process compiles the same plan and runs its
// share of the devices; process 0 writes the outputs.
func compileAndRun(c *config, j *job) (err error) {
	c.started = time.Now() // the closing summary's wall time counts compile and training
	var gpus []*cuda.Runtime
	if c.run && c.backend == "cuda" {
		// Find the GPUs before any work: on a machine without the CUDA
		// libraries this is the error, naming every place searched.
		if gpus, err = openGPUs(c, j); err != nil {
			return err
		}
		defer func() {
			for _, g := range gpus {
				err = errors.Join(err, g.Close())
			}
		}()
	}
	resumeDir, err := checkCheckpointPaths(c)
	if err != nil {
		return err
	}
	if err := checkPaths(c, j.lead()); err != nil {
		return err
	}
	if c.tokens != nil {
		defer c.tokens.close()
	}
	if c.run && c.ckptDir != "" && j.lead() {
		unlock, err := lockCheckpointDir(c.ckptDir)
		if err != nil {
			return err
		}
		defer unlock()
	}
	// An output that fails to be written is reported at the end with the
	// run's own error (outputs.go): it neither stops the run nor keeps
	// another output from being written.
	var outErrs []error
	var dumper *dumper
	if j.lead() {
		dumper = newDumper(c.dump)
	}
	// A signal while the model is built stops the build and removes its
	// work folder (the default would end gcompile with both left behind).
	interrupt, interrupted, stopInterrupt := signalContext()
	c.Interrupt = interrupt
	if !j.lead() {
		c.Progress = io.Discard // rank 0 says it for the job
	}
	res, passErr := compile.Compile(&c.Config, dumper.hooks())
	stopInterrupt()
	if sig := interrupted(); sig != nil {
		if passErr == nil {
			// Caught as the compile returned: it stops the run all the same.
			passErr = fmt.Errorf("stopped after the compile by %s", signalName(sig))
		}
		passErr = &exitStatus{err: passErr, code: signalStatus(sig)}
	}
	var dumpErr error
	if res != nil && res.Module != nil {
		dumpErr = dumper.finish(res.Module, passErr)
		outErrs = append(outErrs, dumpErr)
	}
	// An output that failed before training is said now, not only when
	// the run ends (a full disk found by the dump after an hour's
	// training would be news too late to act on).
	sayEarly := func() {
		if err := errors.Join(outErrs...); err != nil && c.run && j.lead() {
			fmt.Fprintf(j.log, "warning: %v (the run goes on, writes its other outputs and then exits 1)\n", err)
		}
	}
	if passErr != nil {
		if c.report != "" && j.lead() {
			outErrs = append(outErrs, reportCompileFailure(c, j, res, passErr))
		}
		return errors.Join(append([]error{passErr}, outErrs...)...)
	}
	if err := j.checkPlan(res.Fingerprint(), c.dataIdentity(), processSources(c, resumeDir)); err != nil {
		return err
	}
	if c.run {
		if err := j.checkSharedDir(c.ckptDir); err != nil {
			return err
		}
	}
	if c.run {
		if err := checkFedInputs(res.Module); err != nil {
			return errors.New(loader.InFolder(err.Error(), filepath.Dir(c.Model)))
		}
	}
	if res.Async != nil {
		return runAsync(c, j, res, resumeDir)
	}
	m, progs, sched := res.Module, res.Programs, res.Schedule
	compileMs := float64(res.Elapsed.Microseconds()) / 1000
	if j.lead() {
		fmt.Fprintf(j.log, "compiled %s in %.0f ms: %d params\n", m.Name, compileMs, compile.ParamCount(m))
		for r, p := range progs {
			fmt.Fprintf(j.log, "  program %d: %s\n", r, p.Describe())
		}
		for _, r := range res.Passes {
			if r.Note != "" {
				fmt.Fprintf(j.log, "note: pass %s: %s\n", r.Name, r.Note)
			}
		}
		if note := prefetchNote(c, progs); note != "" {
			fmt.Fprintln(j.log, note)
		}
		if sched != nil && !c.evalOnly {
			// eval runs the forward-only programs, not this schedule.
			fmt.Fprintf(j.log, "schedule %s (p=%d v=%d m=%d): bubble %.4f in theory, %.4f simulated; activations stashed per rank %v\n%s",
				sched.Name, sched.Ranks, sched.Chunks, sched.Micro, c.BubbleTheory(), res.Simulated.Bubble, res.Simulated.StashPeak, sched)
		}
		if c.dump != "" && dumpErr == nil {
			fmt.Fprintf(j.log, "dumps: %s\n", filepath.Join(c.dump, "index.html"))
		}
	}
	if c.planTrace != "" && j.lead() {
		outErrs = append(outErrs, writeOutput("plan-trace", c.planTrace, func(p string) error { return writePlanTrace(c, res, p, j.log) }))
	}
	met := newMetrics(c, j, res, compileMs)
	if sched != nil && j.lead() {
		if c.dump != "" {
			// The schedule is IR too: dumped beside the passes, one line per rank.
			outErrs = append(outErrs, writeOutput("dump", filepath.Join(c.dump, "schedule.txt"), func(p string) error {
				return os.WriteFile(p, []byte(sched.String()), 0o644)
			}))
		}
		if c.timeline != "" {
			outErrs = append(outErrs, writeOutput("timeline", c.timeline, func(p string) error {
				return writeTimeline(p, sched, res.Simulated, compile.UnitCost(sched))
			}))
		}
	}
	for r := range res.Devices() {
		met.Devices = append(met.Devices, deviceMetrics(res.ProgramOf(r), r))
	}
	sayEarly()
	var runErr error
	switch {
	case c.evalOnly:
		return errors.Join(evaluateOnly(c, j, gpus, res, resumeDir), errors.Join(outErrs...))
	case c.run:
		runErr = train(c, j, gpus, res, met, resumeDir)
	}
	return writeRunOutputs(c, j, res, met, runErr, errors.Join(outErrs...))
}

// writeRunOutputs ends a run, synchronous or asynchronous: the metrics
// (with the error that ended the run early, if one did), the report and
// the closing summary (summary.go), each on its own and every failure
// reported with outErr's; then the exit status of a run a signal stopped
// before its last step. A refused run writes nothing: the outputs that
// record a run keep what a previous run left there.
func writeRunOutputs(c *config, j *job, res *compile.Result, met *runtime.Metrics, runErr, outErr error) error {
	if refused(runErr) {
		return errors.Join(runErr, outErr)
	}
	if runErr != nil {
		met.Failed = runErr.Error()
	}
	if c.metrics != "" && j.lead() {
		outErr = errors.Join(outErr, writeOutput("metrics", c.metrics, met.WriteFile))
	}
	reportFolder(c)
	if err := errors.Join(finishRun(c, j, res, met, runErr), outErr); err != nil || c.stopStatus == 0 {
		return err
	}
	return &exitStatus{code: c.stopStatus, err: fmt.Errorf("the run stopped at a step boundary before its last step (%s; exit status %d, so that a scheduler does not take it for finished)", met.Stopped, c.stopStatus)}
}

// newMetrics starts the metrics of a compiled plan, or of as much of it
// as a failed compile got to (res nil: the model did not load).
func newMetrics(c *config, j *job, res *compile.Result, compileMs float64) *runtime.Metrics {
	met := &runtime.Metrics{
		Config:    c.metricsConfig(j.world.Size),
		CompileMs: compileMs,
		Schedule:  runtime.ScheduleMetrics{Name: "none"},
		Planner:   c.plannerMetrics,
	}
	if res == nil {
		return met
	}
	if res.Module != nil {
		met.Model.Params = compile.ParamCount(res.Module)
	}
	if res.Schedule != nil && res.Simulated != nil {
		met.Schedule = runtime.ScheduleMetrics{Name: c.Schedule, BubbleTheory: c.BubbleTheory(), BubbleSimulated: res.Simulated.Bubble, StashPeak: res.Simulated.StashPeak}
	}
	for _, r := range res.Passes {
		met.Passes = append(met.Passes, runtime.PassMetrics{Name: r.Name, Ms: r.Ms, Changed: r.Changed, Skipped: r.Skipped, Note: r.Note})
	}
	return met
}

// deviceMetrics is the compile-time memory of one device: the plan's peak
// and its persistent parts. Gradient bytes are the reduced gradients the
// global-norm computation reads, as each device holds them (whole, or a
// shard under ZeRO: ZeRO-1 reduce-scatters them too).
func deviceMetrics(prog *lower.Program, rank int) runtime.DeviceMetrics {
	peak := prog.Peak
	dm := runtime.DeviceMetrics{Rank: rank, PeakBytesPredicted: prog.PeakBytes, ArenaBytes: prog.ArenaBytes, HostBytes: prog.HostBytes, PeakBreakdown: &peak,
		CollectiveBytes: prog.CollectiveBytes(), CollectiveSendBytes: prog.CollectiveSendBytes()}
	for _, b := range prog.Buffers {
		switch b.Kind {
		case lower.Param:
			dm.ParamBytes += b.Bytes
		case lower.State:
			dm.OptimizerBytes += b.Bytes
		}
	}
	for _, in := range prog.Instrs {
		if in.Op == "sum_squares" {
			for _, t := range in.ArgTypes {
				dm.GradBytes += t.Bytes()
			}
		}
	}
	return dm
}

// lossScaler is the loss scaler for --precision: none for fp32; for fp16
// the static --loss-scale, or PyTorch's dynamic scaler when it is 0; for
// bf16, which has fp32's range, no scaling (a static 1) unless asked.
func lossScaler(c *config) *runtime.LossScaler {
	switch c.Precision {
	case "fp16":
		s := runtime.NewLossScaler(c.LossScale)
		if s.Dynamic {
			s.Scale, s.Interval, s.Hysteresis, s.MinScale = c.initialLossScale, c.lossScaleWindow, c.hysteresis, c.minLossScale
		}
		return s
	case "bf16":
		return runtime.NewLossScaler(max(c.LossScale, 1))
	}
	return nil
}

// gradReduceRan is the format the run reduces its gradients in: fp32
// where it has no data axis to reduce them over, whatever
// --grad-reduce-dtype says (a later run over dp then compares with what
// ran).
func (c *config) gradReduceRan() string {
	if c.GradReduceDType == "" || c.DP*max(c.EP, 1)*max(c.CP, 1) <= 1 || c.DPSync == "async" {
		return "fp32"
	}
	return c.GradReduceDType
}

func (c *config) metricsConfig(procs int) map[string]any {
	return map[string]any{"processes": procs,
		"model": c.Model, "devices": c.Devices, "tp": c.TP, "pp": c.PP, "dp": c.DP, "ep": c.EP, "cp": c.CP, "vpp": c.VPP,
		"microbatches": c.Microbatches, "sequence_parallel": c.SequenceParallel, "offload": c.Offload, "schedule": c.Schedule, "zero": c.Zero, "recompute": c.Recompute,
		"precision": c.Precision, "optimizer": c.Optimizer, "backend": c.backend, "batch": c.Batch,
		"steps": c.steps, "seed": c.seed, "lr": c.lr, "min_lr": c.minLR, "warmup": c.warmup, "set": c.Set,
		"overlap_grad_reduce": !c.SerialGradReduce, "beta1": c.Beta1, "beta2": c.Beta2, "adam_eps": c.AdamEps, "weight_decay": c.WeightDecay, "clip": c.Clip, "lr_decay": c.decay,
		"lr_decay_steps": c.decaySteps, "lr_wsd_decay_steps": c.wsdDecaySteps, "lr_wsd_decay_style": c.wsdStyle,
		"cp_impl": c.CPImpl, "cp_layout": c.CPLayout, "dp_sync": c.DPSync, "staleness": c.Staleness, "loss_scale": c.LossScale,
		"initial_loss_scale": c.initialLossScale, "loss_scale_window": c.lossScaleWindow, "hysteresis": c.hysteresis, "min_loss_scale": c.minLossScale, "compress_activations": c.Compress, "fuse": c.Fuse, "bucket_mb": c.BucketMB, "grad_reduce_dtype": c.gradReduceRan(),
		"offload_prefetch": c.OffloadPrefetch, "split": c.split,
	}
}

func helpModel(c *config) error {
	interrupt, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	// Under --set as given: the keys its values make the model read are
	// listed, and a key it reads under none of them is named.
	set, err := frontend.ParseSet(c.Set)
	if err != nil {
		return fmt.Errorf("--set: %w", err)
	}
	docs, err := (&loader.Loader{Timeout: c.ModelTimeout, Progress: os.Stderr, Context: interrupt}).Describe(c.Model, frontend.Config{Batch: c.Batch, Set: set})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%s reads (set with --set key=value,…):\n", c.Model)
	for _, d := range docs {
		doc := d.Doc
		if d.Implementation {
			doc += "; how the model computes, not what: a checkpoint resumes under any choice"
		}
		fmt.Fprintf(w, "  %s\t%s\tdefault %s\t%s\n", d.Key, d.Kind, d.Default, doc)
	}
	return w.Flush()
}

// inputShape returns batch and sequence length from the "tokens" input
// (held by the first pipeline rank).
func inputShape(progs []*lower.Program) (batch, seq int, err error) {
	for _, prog := range progs {
		if id, ok := prog.Sources[ir.InputTokens]; ok {
			t := prog.Buffers[id].Global
			if t.Rank() != 2 || t.DType.String() != "i32" {
				return 0, 0, fmt.Errorf("input %q must be i32[batch,seq], got %v", ir.InputTokens, t)
			}
			return t.Shape[0], t.Shape[1], nil
		}
	}
	return 0, 0, fmt.Errorf("--run trains a language model: the module needs an i32 input %q [batch,seq] and %q", ir.InputTokens, ir.InputTargets)
}

// firstOnPipelineRank reports whether device rank has coordinate 0 on every
// axis but pp: one representative per pipeline rank.
func firstOnPipelineRank(prog *lower.Program, rank int) bool {
	mesh := prog.Mesh
	if mesh == nil {
		return true
	}
	for i, c := range mesh.Coords(rank) {
		if i != mesh.PipelineAxis() && c != 0 {
			return false
		}
	}
	return true
}

// cluster is what training needs from a backend's devices; cpu.Cluster
// and cuda.Cluster both provide it.
type cluster interface {
	runtime.Device
	weightStore
	checkpoint.Cluster
	InitParams(seed uint64) error
	SetEvalPrograms(progs []*lower.Program) error
	Peaks() ([]int64, error)
}

// deviceView is one device of a cluster, for the trace, the schedule
// profile and the memory metrics.
type deviceView struct {
	rank int
	prog *lower.Program
	// onInstr installs the hook told each instruction's start and duration.
	onInstr func(func(int, time.Time, time.Duration))
}

// newCluster loads this process's devices on the chosen backend, connected
// to the job's other devices where there are any. The function returned
// releases what the backend holds.
func newCluster(c *config, j *job, gpus []*cuda.Runtime, progs []*lower.Program) (cluster, []deviceView, func() error, error) {
	var devs []deviceView
	if c.backend == "cuda" {
		g, err := newCUDACluster(c, j, gpus, progs)
		if err != nil {
			return nil, nil, nil, err
		}
		for i, d := range g.Devices {
			devs = append(devs, deviceView{rank: g.Ranks[i], prog: d.Program(), onInstr: func(f func(int, time.Time, time.Duration)) { d.OnInstr = f }})
		}
		return g, devs, g.Close, nil
	}
	var h *cpu.Cluster
	var err error
	if j.multi() {
		net, cerr := j.connect()
		if cerr != nil {
			return nil, nil, nil, cerr
		}
		h, err = cpu.NewJobCluster(progs, cpu.Options{MemoryCap: c.MemLimit}, &runtime.Job{Layout: j.layout, Comm: net})
	} else {
		h, err = cpu.NewPipelineCluster(progs, cpu.Options{MemoryCap: c.MemLimit})
	}
	if err != nil {
		return nil, nil, nil, err
	}
	for i, d := range h.Devices {
		devs = append(devs, deviceView{rank: h.Ranks[i], prog: d.Program(), onInstr: func(f func(int, time.Time, time.Duration)) { d.OnInstr = f }})
	}
	return h, devs, func() error { return nil }, nil
}

// outputNames are m's outputs by name.
func outputNames(m *ir.Module) []string {
	var names []string
	for _, o := range m.Outputs {
		names = append(names, o.Name)
	}
	return names
}

// finishedRun is what a run resumed at its last step still measures: the
// held-out loss of its final weights (none with --eval-batches -1).
func finishedRun(dev runtime.Device, src data.Source, cfg runtime.TrainConfig) ([]runtime.EvalMetrics, error) {
	if cfg.EvalBatches < 0 {
		return nil, nil
	}
	l, err := runtime.Evaluate(dev, src, cfg)
	if err != nil {
		return nil, err
	}
	return []runtime.EvalMetrics{{Step: cfg.Start.Step, Loss: l}}, nil
}

func train(c *config, j *job, gpus []*cuda.Runtime, res *compile.Result, met *runtime.Metrics, resumeDir string) (err error) {
	// Until the first step a failure refuses the run (refusedError).
	started := false
	defer func() {
		if err != nil && !started {
			err = refusedError{err}
		}
	}()
	progs, sched := res.Programs, res.Schedule
	batch, seq, err := inputShape(progs)
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
	dev, devs, closeDev, err := newCluster(c, j, gpus, progs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDev()) }()
	if len(gpus) > 0 {
		met.Config["device"] = gpus[0].Name()
		ords := make([]int, len(gpus))
		for i, g := range gpus {
			ords[i] = g.Ordinal()
		}
		fmt.Fprintf(j.log, "cuda backend: %s (%s), %d device(s) on GPU(s) %v\n", gpus[0].Name(), gpus[0].Props().Arch(), len(devs), ords)
	}
	if err := dev.InitParams(uint64(c.seed)); err != nil {
		return err
	}
	if c.load != "" {
		// Weights of another --set (or model file) of this model: said,
		// as eval and generate say it; loaded where their shapes fit (a
		// fine-tuning's longer context), refused where they do not.
		note := ""
		if j.lead() {
			// Only a note: a model that does not build at the weights'
			// batch with this --set (a MoE group for another batch)
			// trains from them all the same.
			note, _ = savedModel(c.Config, c.load)
		}
		if err := loadWeights(dev, progs, c.load, c.ignoredOnLoad(res.Module.IgnoreOnLoad), c.Classes); err != nil {
			if note != "" {
				err = fmt.Errorf("%w\n  %s", err, strings.TrimSuffix(strings.TrimPrefix(note, "note: "), loadsIfTheyFit))
			}
			return err
		}
		if note != "" {
			fmt.Fprintln(j.log, note)
		}
	}
	plan := checkpointPlan(c, progs, batch, seq, j.world.Size)
	var start runtime.State
	if resumeDir != "" {
		if start, err = resumeState(c, dev, progs, goModelName(c, res), res.ModelFingerprint, resumeDir, plan); err != nil {
			return err
		}
		if j.lead() {
			fmt.Fprintf(j.log, "resumed from %s at step %d (optimizer step %d)\n", resumeDir, start.Step, start.OptStep)
		}
		met.ResumedFrom = &runtime.ResumeMetrics{Checkpoint: resumeDir, Step: start.Step}
	}
	var earlier *runtime.Metrics
	if resumeDir != "" && c.metrics != "" && j.lead() {
		if earlier = earlierParts(c.metrics, resumeDir, start.Step); earlier != nil {
			fmt.Fprintf(j.log, "--metrics %s records the run up to %s: its %d steps are kept, and this part's follow them\n", c.metrics, resumeDir, len(earlier.Steps))
		} else if n := recordedSteps(c.metrics); n > 0 {
			// Replaced, as documented, but not without a word: steps of
			// the same run's earlier parts may be among them.
			fmt.Fprintf(j.log, "note: --metrics %s holds %d steps but does not list the checkpoint resumed (%s): it is another run's record, or one written before that checkpoint; this part's record replaces it\n", c.metrics, n, resumeDir)
		}
	}
	// In a job of several processes the trace shows process 0's devices.
	var tracer *runtime.Tracer
	tracing := c.trace != "" && j.lead()
	if tracing {
		views := make([]*lower.Program, len(devs))
		for i, d := range devs {
			views[i] = d.prog
		}
		tracer = runtime.NewTracer(views)
	}
	// Under pipeline parallelism one device per pipeline rank times its
	// schedule actions, to simulate the schedule with measured costs; in
	// a job of several processes no one process holds them all.
	var prof *blockProfile
	if sched != nil && !j.multi() {
		prof = newBlockProfile()
	}
	for i, d := range devs {
		var trace, timing func(int, time.Time, time.Duration)
		if tracing {
			trace = tracer.Hook(i)
		}
		if prof != nil && firstOnPipelineRank(d.prog, d.rank) {
			timing = prof.hook(d.prog)
		}
		if trace != nil || timing != nil {
			d.onInstr(func(in int, start time.Time, dur time.Duration) {
				if trace != nil && tracing {
					trace(in, start, dur)
				}
				if timing != nil {
					timing(in, start, dur)
				}
			})
		}
	}
	if mesh := progs[0].Mesh; mesh != nil && j.lead() {
		where := "virtual devices"
		if j.multi() {
			where = fmt.Sprintf("devices in %d processes (%d each)", j.world.Size, j.layout.PerProc())
		}
		fmt.Fprintf(j.log, "%d %s, mesh %v, ZeRO-%d\n", mesh.Devices(), where, mesh, c.Zero)
	}
	if j.lead() {
		fmt.Fprintf(j.log, "training on %s, batch %d × seq %d\n", describeSource(corpus), batch, seq)
	}
	cfg := runtime.TrainConfig{
		Steps: c.steps, Batch: batch, Seq: seq, Seed: c.seed,
		Schedule:  c.schedule(),
		EvalEvery: c.evalEvery, EvalBatches: c.evalBatches,
		LossScale: lossScaler(c),
		Start:     start,
	}
	if start.Step > 0 {
		cfg.Seed = start.Seed
	}
	ck := &checkpointer{c: c, j: j, dev: dev, progs: progs, stop: watchSignals(j.log),
		opts: checkpoint.SaveOptions{Root: c.ckptDir, Model: res.Module.Name, ModelFingerprint: res.ModelFingerprint,
			PlanHash: res.Fingerprint(), Plan: plan, KeepLast: c.keepLast}}
	defer ck.stop.release()
	j.log = ck.stop.watchLog(j.log)
	ck.stop.last.Store(resumeDir)
	cfg.Boundary = ck.boundary
	cfg.Interrupted = func() (bool, error) { return ck.dev.AnyOf(ck.stop.requested()) }
	outs := outputNames(res.Module)
	cfg.Outputs, cfg.EvalOutput = runtime.AuxOutputs(outs), runtime.EvalOutput(outs)
	cfg.RandomKey = res.Module.Source(ir.InputRandomKey) != nil
	if res.EvalPrograms != nil {
		if err := dev.SetEvalPrograms(res.EvalPrograms); err != nil {
			return err
		}
	}
	var bar *progress
	if j.lead() {
		bar = newProgress(j.log, c.steps, c.logEvery)
	}
	started = true
	j.setPhase("training")
	j.preemptible.Store(true)
	var steps []runtime.StepMetrics
	var evals []runtime.EvalMetrics
	var trainErr error
	// The record so far, written at each checkpoint: a part killed later
	// leaves its steps up to the checkpoint the next part resumes, which
	// carries them (earlierParts).
	var soFar []runtime.StepMetrics
	var evalsSoFar []runtime.EvalMetrics
	if c.metrics != "" && j.lead() {
		ck.record = func() error {
			snap := *met
			snap.Steps, snap.Eval = slices.Clone(soFar), slices.Clone(evalsSoFar)
			snap.Checkpoint, snap.Checkpoints = ck.saved, slices.Clone(ck.saves)
			snap.InProgress = true
			carry(&snap, earlier)
			return snap.WriteFile(c.metrics)
		}
	}
	if start.Step == c.steps {
		// A run killed after its last checkpoint and before its outputs:
		// rerunning the same command finishes it instead of failing, so a
		// requeue loop ends with the weights and metrics it was owed.
		if j.lead() {
			fmt.Fprintf(j.log, "the checkpoint is at step %d of %d: the run is finished; writing the outputs it owes\n", start.Step, c.steps)
		}
		evals, trainErr = finishedRun(dev, corpus, cfg)
		ck.saved = resumeDir
		if j.lead() && c.ckptDir != "" {
			// Killed after its last commit and before pruning, the run
			// left one checkpoint more than --keep-last.
			if err := checkpoint.Prune(c.ckptDir, c.keepLast); err != nil && trainErr == nil {
				trainErr = fmt.Errorf("--keep-last %d: %w", c.keepLast, err)
			}
		}
	} else {
		steps, evals, trainErr = runtime.Train(dev, corpus, cfg, func(s runtime.StepMetrics, e *runtime.EvalMetrics) {
			if ck.record != nil {
				soFar = append(soFar, s)
				if e != nil {
					evalsSoFar = append(evalsSoFar, *e)
				}
			}
			if tracer != nil && s.Step >= runtime.TraceSteps {
				tracing = false
			}
			if tracer != nil {
				tracer.EndStep()
			}
			if prof != nil {
				if s.Step == start.Step+1 && c.steps > s.Step {
					prof.reset() // the first step warms caches up
				}
				prof.endStep()
			}
			if bar != nil {
				bar.step(s, e)
			}
		})
	}
	j.finishing.Store(true)
	j.preemptible.Store(false)
	if bar != nil {
		bar.done()
	}
	met.Steps, met.Eval = steps, evals
	met.Stopped = ck.stoppedBy
	c.stopStatus = ck.stopStatus
	met.Checkpoint, met.Checkpoints = ck.saved, ck.saves
	carry(met, earlier)
	// What the run did is written out whatever else fails: each output on
	// its own, every failure reported. The trace of a failed run is what
	// one wants to look at; its weights, perhaps half updated by the step
	// that failed, are not saved (the metrics are, by compileAndRun).
	errs := []error{trainErr}
	if tracer != nil {
		errs = append(errs, writeOutput("trace", c.trace, tracer.WriteFile))
	}
	// The peaks the steps that ran reached, a failed run's too (its
	// metrics read 0, "not measured", though steps had run).
	if peaks, err := dev.Peaks(); err != nil {
		if trainErr == nil {
			errs = append(errs, err)
		}
	} else {
		for r, p := range peaks {
			met.Devices[r].PeakBytesMeasured = p
		}
	}
	if trainErr != nil {
		return errors.Join(errs...)
	}
	if prof != nil {
		if sim, err := schedule.SimulateReady(sched, prof.cost, prof.ready); err != nil {
			errs = append(errs, err)
		} else {
			met.Schedule.BubbleProfiled = &sim.Bubble
			// The bubble is counted against the busiest rank; a stage
			// with less work (one without the head) idles beyond it.
			busy := make([]string, len(sim.Busy))
			for r, b := range sim.Busy {
				busy[r] = fmt.Sprintf("%.0f %%", 100*b/max(sim.StepTime, 1e-300))
			}
			fmt.Fprintf(j.log, "schedule %s with the measured F/B/W times: simulated bubble %.4f (unit costs: %.4f); each rank busy %s of the step\n", sched.Name, sim.Bubble, met.Schedule.BubbleSimulated, strings.Join(busy, ", "))
		}
	}
	if c.save != "" {
		// Every process takes part (the weights are gathered); process 0 writes.
		if err := saveWeights(dev, progs, c.save, c.steps, j.lead(), c.vocabTables, savedAbout(c, res)); err != nil {
			errs = append(errs, err)
		} else if j.lead() {
			fmt.Fprintf(j.log, "saved weights to %s\n", c.save)
		}
	}
	errs = append(errs, ck.finalErr)
	return errors.Join(errs...)
}

// fedInputs are the inputs training and evaluation feed: the batch, the
// random keys, and what the passes add (the learning rate, the step, the
// loss scale).
// processStart is when the process started, which --stop-after-time
// counts from.
var processStart = time.Now()

var fedInputs = []string{ir.InputTokens, ir.InputTargets, ir.InputRandomKey, ir.InputLR, ir.InputStep, ir.InputLossScale}

// checkFedInputs refuses a model input the runtime would never feed: it
// would stay zero every step, and the model would train on nothing.
func checkFedInputs(m *ir.Module) error {
	var errs []error
	for _, v := range m.Values {
		name := v.Attrs.Str("name")
		switch {
		case v.Op != "input":
		case !slices.Contains(fedInputs, name):
			errs = append(errs, fmt.Errorf("%s: input %q is never fed: training feeds %q and %q each step (and %q to a model that draws random numbers); read the batch from those", v.Pos, name, ir.InputTokens, ir.InputTargets, ir.InputRandomKey))
		case (name == ir.InputTokens || name == ir.InputTargets || name == ir.InputRandomKey) && (v.Type.DType != ir.I32 || v.Type.Rank() != 2):
			// Fed as i32 [batch, seq]: another type fails only when the
			// first batch is set, without the model's line.
			errs = append(errs, fmt.Errorf("%s: input %q is %v: training feeds it i32 [batch, seq]", v.Pos, name, v.Type))
		}
	}
	// The fed inputs are one batch's rows, cut alike: a targets of another
	// shape than tokens failed only when the first batch was set, without
	// the model's line.
	var first *ir.Value
	for _, v := range m.Values {
		if v.Op != "input" || !slices.Contains(fedInputs, v.Attrs.Str("name")) || v.Type.DType != ir.I32 || v.Type.Rank() != 2 {
			continue
		}
		if first == nil {
			first = v
		} else if !v.Type.Shape.Equal(first.Type.Shape) {
			errs = append(errs, fmt.Errorf("%s: input %q is %v, and input %q (%s) is %v: training feeds them the same [batch, seq] rows, so they take one shape", v.Pos, v.Attrs.Str("name"), v.Type, first.Attrs.Str("name"), first.Pos, first.Type))
		}
	}
	return errors.Join(errs...)
}

// prefetchNote says when --offload-prefetch reaches past every layer block
// of the programs: every copy of an offloaded buffer is then issued at the
// step's start and they are on the device together, which the memory plan
// shows but a user asking for a long prefetch may not expect.
func prefetchNote(c *config, progs []*lower.Program) string {
	if !c.explicit["offload-prefetch"] || c.Offload == "" || c.Offload == "none" {
		return ""
	}
	most := 0
	for _, p := range progs {
		most = max(most, lower.LayerBlocks(p))
	}
	if most == 0 || c.OffloadPrefetch < most-1 {
		return ""
	}
	return fmt.Sprintf("note: --offload-prefetch %d reaches past the %d layer blocks of a step (runs of one layer and one phase): every copy of an offloaded buffer is issued at the step's start, so the copies are on the device together and the offload saves less device memory (the predicted peak counts them)", c.OffloadPrefetch, most)
}
