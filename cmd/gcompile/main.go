// Command gcompile compiles a model written in gcompile's Go DSL (or a
// dumped .gir module) into per-device training programs, and with --run
// trains it on the CPU backend or, with --backend cuda, on an NVIDIA GPU.
//
//	gcompile examples/gpt/model.go --run --steps 200 --metrics m.json --dump d/
//
// Every pass can be inspected: --dump writes the module after each pass
// that changed it plus an index.html that shows the passes side by side.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"gcompile/data"
	"gcompile/frontend"
	"gcompile/frontend/loader"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/passes/schedule"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda"
)

func main() {
	if err := mainErr(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gcompile:", strings.ReplaceAll(err.Error(), "\n", "\ngcompile: "))
		os.Exit(1)
	}
}

func mainErr(args []string) (err error) {
	c, err := parseArgs(args)
	if err != nil {
		return err
	}
	opts := passOptions(c)
	if err := opts.Validate(); err != nil {
		return err
	}
	if c.helpModel {
		return helpModel(c)
	}
	var sched *schedule.Schedule
	var simulated *schedule.Result
	if c.pp > 1 {
		// The schedule depends only on p, v and m: check it before any work.
		if sched, simulated, err = pipelineSchedule(c); err != nil {
			return err
		}
	}
	var gpu *cuda.Runtime
	if c.run && c.backend == "cuda" {
		// Find the GPU before any work: on a machine without the CUDA
		// libraries this is the error, naming every place searched.
		if gpu, err = cuda.Open(cuda.Config{}); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, gpu.Close()) }()
	}
	start := time.Now()
	m, err := loadModule(c)
	if err != nil {
		return err
	}
	dumper := newDumper(c.dump)
	results, passErr := passes.Run(m, opts, dumper.hooks())
	if err := dumper.finish(m, passErr); err != nil {
		return err
	}
	if passErr != nil {
		return passErr
	}
	if c.dpSync == "async" {
		return runAsync(c, m, start, results)
	}
	var progs, evalProgs []*lower.Program
	lo, err := lowerOptions(c)
	if err != nil {
		return err
	}
	if sched != nil {
		if progs, err = lower.LowerPipelineWith(m, blocks(sched), lo); err == nil {
			evalProgs, err = lower.LowerPipelineForwardWith(m, c.pp, max(c.vpp, 1), c.microbatches, lo)
		}
	} else {
		var prog *lower.Program
		prog, err = lower.LowerWith(m, lo)
		progs = []*lower.Program{prog}
	}
	if err != nil {
		return err
	}
	prog := progs[0]
	if c.memLimit > 0 {
		devices := 1
		if prog.Mesh != nil {
			devices = prog.Mesh.Devices()
		}
		for r := range devices {
			if err := programOf(progs, prog.Mesh, r).CheckFits(fmt.Sprintf("device %d", r), c.memLimit); err != nil {
				return err
			}
		}
	}
	compileMs := float64(time.Since(start).Microseconds()) / 1000
	fmt.Fprintf(os.Stderr, "compiled %s in %.0f ms: %d params\n", m.Name, compileMs, paramCount(m))
	for r, p := range progs {
		fmt.Fprintf(os.Stderr, "  program %d: %s\n", r, p.Describe())
	}
	if sched != nil {
		fmt.Fprintf(os.Stderr, "schedule %s (p=%d v=%d m=%d): bubble %.4f in theory, %.4f simulated; activations stashed per rank %v\n%s",
			sched.Name, sched.Ranks, sched.Chunks, sched.Micro, bubbleTheory(c), simulated.Bubble, simulated.StashPeak, sched)
	}
	if c.dump != "" {
		fmt.Fprintf(os.Stderr, "dumps: %s\n", filepath.Join(c.dump, "index.html"))
	}
	met := &runtime.Metrics{
		Config:    c.metricsConfig(),
		CompileMs: compileMs,
		Schedule:  runtime.ScheduleMetrics{Name: "none"},
		Model:     runtime.ModelMetrics{Params: paramCount(m)},
		Steps:     []runtime.StepMetrics{},
		Eval:      []runtime.EvalMetrics{},
	}
	for _, r := range results {
		met.Passes = append(met.Passes, runtime.PassMetrics{Name: r.Name, Ms: r.Ms, Changed: r.Changed, Skipped: r.Skipped})
	}
	if sched != nil && c.dump != "" {
		// The schedule is IR too: dumped beside the passes, one line per rank.
		if err := os.WriteFile(filepath.Join(c.dump, "schedule.txt"), []byte(sched.String()), 0o644); err != nil {
			return err
		}
	}
	if sched != nil {
		met.Schedule = scheduleMetrics(c, simulated)
		if c.timeline != "" {
			cost := schedule.UnitCost
			if sched.Name == "zb" {
				cost = schedule.UnitCostZB
			}
			if err := writeTimeline(c.timeline, sched, simulated, cost); err != nil {
				return err
			}
		}
	}
	devices := 1
	if prog.Mesh != nil {
		devices = prog.Mesh.Devices()
	}
	for r := range devices {
		met.Devices = append(met.Devices, deviceMetrics(programOf(progs, prog.Mesh, r), r))
	}
	var runErr error
	if c.run {
		runErr = train(c, gpu, progs, evalProgs, met, sched)
	}
	if c.metrics != "" {
		if err := met.WriteFile(c.metrics); err != nil {
			return err
		}
	}
	return runErr
}

// deviceMetrics is the compile-time memory of one device: the plan's peak
// and its persistent parts. Gradient bytes are the reduced gradients the
// global-norm computation reads, as each device holds them (whole, or a
// shard under ZeRO-2/3).
func deviceMetrics(prog *lower.Program, rank int) runtime.DeviceMetrics {
	peak := prog.Peak
	dm := runtime.DeviceMetrics{Rank: rank, PeakBytesPredicted: prog.PeakBytes, ArenaBytes: prog.ArenaBytes, HostBytes: prog.HostBytes, PeakBreakdown: &peak}
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

// lowerOptions are the lowering's options from the command line; every
// pipeline rank's program gets the same.
func lowerOptions(c *config) (lower.Options, error) {
	if _, _, err := lower.ParseOffload(c.offload); err != nil {
		return lower.Options{}, fmt.Errorf("--offload %q: %w", c.offload, err)
	}
	prefetch := c.offloadPrefetch
	if prefetch == 0 {
		prefetch = -1 // right before use; Options reads 0 as the default
	}
	return lower.Options{Offload: c.offload, PrefetchLayers: prefetch}, nil
}

// lossScaler is the loss scaler for --precision: none for fp32; for fp16
// the static --loss-scale, or PyTorch's dynamic scaler when it is 0; for
// bf16, which has fp32's range, no scaling (a static 1) unless asked.
func lossScaler(c *config) *runtime.LossScaler {
	switch c.precision {
	case "fp16":
		return runtime.NewLossScaler(c.lossScale)
	case "bf16":
		return runtime.NewLossScaler(max(c.lossScale, 1))
	}
	return nil
}

func passOptions(c *config) *passes.Options {
	o := passes.DefaultOptions()
	o.Verify = c.verify
	o.Optimizer = c.optimizer
	o.Beta1, o.Beta2 = c.beta1, c.beta2
	o.WeightDecay = c.weightDecay
	o.ClipNorm = c.clip
	o.Zero = c.zero
	o.Microbatches = c.microbatches
	o.SequenceParallel = c.seqParallel
	o.VPP = c.vpp
	o.TwoBW = c.schedule == "2bw"
	o.Recompute = c.recompute
	o.Compress = c.compress
	o.Fuse = c.fuse
	o.BucketMB = c.bucketMB
	o.Precision, o.LossScale = c.precision, c.lossScale
	o.Mesh = meshOf(c)
	if c.dpSync == "async" {
		o.Mesh = nil // replicas are whole single-device programs
	}
	return o
}

// meshOf lays the devices out as Megatron-LM does: tensor-parallel ranks
// adjacent (tp is the last, fastest axis), then data parallel, pipeline
// stages outermost. Axes of size 1 are left out.
func meshOf(c *config) *ir.Mesh {
	m := &ir.Mesh{}
	for _, a := range []ir.MeshAxis{{Name: "pp", Size: c.pp}, {Name: "dp", Size: c.dp}, {Name: "tp", Size: c.tp}} {
		if a.Size > 1 {
			m.Axes = append(m.Axes, a)
		}
	}
	if len(m.Axes) == 0 {
		return nil
	}
	return m
}

func (c *config) metricsConfig() map[string]any {
	return map[string]any{
		"model": c.model, "devices": c.devices, "tp": c.tp, "pp": c.pp, "dp": c.dp, "ep": c.ep, "vpp": c.vpp,
		"microbatches": c.microbatches, "sequence_parallel": c.seqParallel, "offload": c.offload, "schedule": c.schedule, "zero": c.zero, "recompute": c.recompute,
		"precision": c.precision, "optimizer": c.optimizer, "backend": c.backend, "batch": c.batch,
		"steps": c.steps, "seed": c.seed, "lr": c.lr, "min_lr": c.minLR, "warmup": c.warmup, "set": c.set,
	}
}

func loadModule(c *config) (*ir.Module, error) {
	if strings.HasSuffix(c.model, ".gir") {
		text, err := os.ReadFile(c.model)
		if err != nil {
			return nil, err
		}
		return ir.Parse(c.model, string(text))
	}
	set, err := frontend.ParseSet(c.set)
	if err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(filepath.Base(filepath.Dir(absOr(c.model))), "/")
	batch := c.batch
	if c.dpSync == "async" {
		batch /= c.dp // each replica's program sees its share of the batch
	}
	return loader.LoadModel(c.model, frontend.Config{Name: name, Batch: batch, Set: set})
}

func absOr(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func helpModel(c *config) error {
	docs, err := loader.DescribeModel(c.model, frontend.Config{Batch: c.batch})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%s reads (set with --set key=value,…):\n", c.model)
	for _, d := range docs {
		fmt.Fprintf(w, "  %s\t%s\tdefault %s\t%s\n", d.Key, d.Kind, d.Default, d.Doc)
	}
	return w.Flush()
}

func paramCount(m *ir.Module) int64 {
	var n int64
	for _, p := range m.Params() {
		n += p.Type.Shape.NumElements()
	}
	return n
}

// inputShape returns batch and sequence length from the "tokens" input
// (held by the first pipeline rank).
func inputShape(progs []*lower.Program) (batch, seq int, err error) {
	var t ir.Type
	found := false
	for _, prog := range progs {
		if id, ok := prog.Sources["tokens"]; ok {
			t, found = prog.Buffers[id].Global, true
			break
		}
	}
	if !found {
		return 0, 0, errors.New(`--run trains a language model: the module needs an i32 input "tokens" [batch,seq] and "targets"`)
	}
	if t.Rank() != 2 || t.DType != ir.I32 {
		return 0, 0, fmt.Errorf(`input "tokens" must be i32[batch,seq], got %v`, t)
	}
	return t.Shape[0], t.Shape[1], nil
}

// programOf is the program device rank runs: its pipeline rank's.
func programOf(progs []*lower.Program, mesh *ir.Mesh, rank int) *lower.Program {
	if mesh == nil || mesh.Axis("pp") < 0 {
		return progs[0]
	}
	return progs[cpu.Coords(mesh, rank)[mesh.Axis("pp")]]
}

// firstOnPipelineRank reports whether device rank has coordinate 0 on every
// axis but pp: one representative per pipeline rank.
func firstOnPipelineRank(mesh *ir.Mesh, rank int) bool {
	if mesh == nil {
		return true
	}
	for i, c := range cpu.Coords(mesh, rank) {
		if mesh.Axes[i].Name != "pp" && c != 0 {
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
	InitParams(seed uint64) error
	SetEvalPrograms(progs []*lower.Program) error
}

// deviceView is one device of a cluster, for the trace, the schedule
// profile and the memory metrics.
type deviceView struct {
	prog *lower.Program
	peak func() int64
	// onInstr installs the hook told each instruction's start and duration.
	onInstr func(func(int, time.Time, time.Duration))
}

// newCluster loads the programs on the chosen backend: one virtual CPU
// device per mesh device, or one virtual device per mesh device on the
// GPU. The function returned releases what the backend holds.
func newCluster(c *config, gpu *cuda.Runtime, progs []*lower.Program) (cluster, []deviceView, func() error, error) {
	var devs []deviceView
	if c.backend == "cuda" {
		g, err := cuda.NewPipelineCluster(gpu, progs, cuda.Options{})
		if err != nil {
			return nil, nil, nil, err
		}
		for _, d := range g.Devices {
			devs = append(devs, deviceView{prog: d.Program(), peak: d.PeakBytes, onInstr: func(f func(int, time.Time, time.Duration)) { d.OnInstr = f }})
		}
		return g, devs, g.Close, nil
	}
	h, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	for _, d := range h.Devices {
		devs = append(devs, deviceView{prog: d.Program(), peak: d.PeakBytes, onInstr: func(f func(int, time.Time, time.Duration)) { d.OnInstr = f }})
	}
	return h, devs, func() error { return nil }, nil
}

func train(c *config, gpu *cuda.Runtime, progs, evalProgs []*lower.Program, met *runtime.Metrics, sched *schedule.Schedule) (err error) {
	prog := progs[0]
	batch, seq, err := inputShape(progs)
	if err != nil {
		return err
	}
	corpus, err := data.Load(data.Options{Path: c.data, MaxBytes: int64(c.maxDataMB) << 20})
	if err != nil {
		return err
	}
	if err := corpus.Check(seq); err != nil {
		return err
	}
	met.Data = &runtime.DataMetrics{Source: corpus.Source, TrainBytes: len(corpus.Train), EvalBytes: len(corpus.Eval)}
	dev, devs, closeDev, err := newCluster(c, gpu, progs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDev()) }()
	if gpu != nil {
		met.Config["device"] = gpu.Name()
		fmt.Fprintf(os.Stderr, "cuda backend: %s (%s), %d virtual device(s) on GPU %d\n", gpu.Name(), gpu.Props().Arch(), len(devs), gpu.Ordinal())
	}
	if err := dev.InitParams(uint64(c.seed)); err != nil {
		return err
	}
	if c.load != "" {
		if err := loadWeights(dev, prog, c.load); err != nil {
			return err
		}
	}
	var tracer *runtime.Tracer
	tracing := c.trace != ""
	if tracing {
		progs := make([]*lower.Program, len(devs))
		for i, d := range devs {
			progs[i] = d.prog
		}
		tracer = runtime.NewTracer(progs)
	}
	// Under pipeline parallelism one device per pipeline rank times its
	// schedule actions, to simulate the schedule with measured costs.
	var prof *blockProfile
	if sched != nil {
		prof = newBlockProfile()
	}
	for i, d := range devs {
		var trace, timing func(int, time.Time, time.Duration)
		if tracing {
			trace = tracer.Hook(i)
		}
		if prof != nil && firstOnPipelineRank(prog.Mesh, i) {
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
	if prog.Mesh != nil {
		fmt.Fprintf(os.Stderr, "%d virtual devices, mesh %v, ZeRO-%d\n", prog.Mesh.Devices(), prog.Mesh, c.zero)
	}
	fmt.Fprintf(os.Stderr, "training on %s (%d train / %d held-out bytes), batch %d × seq %d\n", corpus.Source, len(corpus.Train), len(corpus.Eval), batch, seq)
	cfg := runtime.TrainConfig{
		Steps: c.steps, Batch: batch, Seq: seq, Seed: c.seed,
		Schedule:  runtime.Schedule{LR: c.lr, MinLR: c.minLR, Warmup: c.warmup, Steps: c.steps, Decay: c.decay},
		EvalEvery: c.evalEvery, EvalBatches: c.evalBatches,
		LossScale: lossScaler(c),
	}
	if evalProgs != nil {
		if err := dev.SetEvalPrograms(evalProgs); err != nil {
			return err
		}
	}
	prog2 := newProgress(os.Stderr, c.steps)
	steps, evals, trainErr := runtime.Train(dev, corpus, cfg, func(s runtime.StepMetrics, e *runtime.EvalMetrics) {
		if tracer != nil && s.Step >= runtime.TraceSteps {
			tracing = false
		}
		if tracer != nil {
			tracer.EndStep()
		}
		if prof != nil {
			if s.Step == 1 && c.steps > 1 {
				prof.reset() // the first step warms caches up
			}
			prof.endStep()
		}
		prog2.step(s, e)
	})
	prog2.done()
	met.Steps, met.Eval = steps, evals
	for r, d := range devs {
		met.Devices[r].PeakBytesMeasured = d.peak()
	}
	if trainErr != nil {
		return trainErr
	}
	if tracer != nil {
		if err := tracer.WriteFile(c.trace); err != nil {
			return err
		}
	}
	if prof != nil {
		res, err := schedule.Simulate(sched, prof.cost)
		if err != nil {
			return err
		}
		met.Schedule.BubbleProfiled = &res.Bubble
		fmt.Fprintf(os.Stderr, "schedule %s with the measured F/B/W times: simulated bubble %.4f (unit costs: %.4f)\n", sched.Name, res.Bubble, met.Schedule.BubbleSimulated)
	}
	if c.save != "" {
		if err := saveWeights(dev, prog, c.save, c.steps); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "saved weights to %s\n", c.save)
	}
	return nil
}
