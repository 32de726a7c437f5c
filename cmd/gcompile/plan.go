package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"strings"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/planner"
	"gcompile/runtime"
	"gcompile/runtime/cuda"
)

// planAxes are the flags the planner searches; one the user gives stays
// fixed.
var planAxes = []string{"tp", "pp", "dp", "ep", "cp", "cp-impl", "cp-layout", "vpp", "microbatches", "micro-batch-size", "zero", "sequence-parallel", "recompute", "offload", "schedule"}

// meshAxes are the axes that split the devices: a command line that gives
// one of them has chosen its plan's shape.
var meshAxes = []string{"tp", "pp", "dp", "ep", "cp"}

// planning says whether the planner chooses the plan: --plan, or more than
// one device with none of --tp, --pp, --dp, --ep, --cp given (`gcompile
// model.go --devices 8`), the options the user gave staying fixed. A
// command line that gives an axis gets exactly its plan, the axes not
// given taking their defaults (tp, pp, ep 1 and dp the devices left), as
// before. Asynchronous data parallelism has no other plan, and gcompile
// eval evaluates under the plan it is given.
func (c *config) planning() bool {
	if c.planned || c.evalOnly {
		return false
	}
	if c.plan {
		return true
	}
	if c.Devices <= 1 || c.DPSync == "async" {
		return false
	}
	for _, a := range meshAxes {
		if c.explicit[a] {
			return false
		}
	}
	return true
}

// hardwareSpec is the description the cost model prices plans on:
// --hardware; else, on the CUDA backend, the preset of the GPU this
// machine has (GPU 0, by the name its driver gives); else the cpu preset
// as it is (not calibrated, so that every process of a job and every run
// chooses the same plan).
func (c *config) hardwareSpec() (string, error) {
	if c.hardware != "" {
		return c.hardware, nil
	}
	if c.backend != "cuda" {
		return "cpu", nil
	}
	// --plan prices on the same GPU the run would: a table priced on the
	// cpu preset would pick another plan than the run without --plan.
	why, or := fmt.Sprintf("--devices %d with no --tp/--pp/--dp", c.Devices), " or the plan's axes"
	if c.plan {
		why, or = "--plan with --backend cuda", "" // --plan prices even a plan given whole
	}
	name, err := cuda.GPUName(cuda.Config{}, 0)
	if err != nil {
		return "", fmt.Errorf("%s: the planner prices plans on the GPU it finds, and found none (%w): give --hardware (%s or a JSON file)%s", why, err, strings.Join(cost.Presets(), ", "), or)
	}
	spec := cost.PresetForGPU(name)
	if spec == "" {
		return "", fmt.Errorf("%s: the planner has no description of this GPU (%s): give --hardware (%s or a JSON file)%s", why, name, strings.Join(cost.Presets(), ", "), or)
	}
	return spec, nil
}

// attentionNote says how the table priced the model's attention core
// when it is the fused op: as one kernel that keeps no [batch, heads,
// seq, seq] scores, which prices a run of another framework as if it had
// flash attention. The core is the model's choice, not an axis, so the
// note says how to price the other one ("" for a model without it).
func attentionNote(m *ir.Module) string {
	for _, v := range m.Values {
		if v.Op == "attention" {
			return "attention: the model's fused core is priced as one kernel that keeps no [batch, heads, seq, seq] scores (flash attention); " +
				"to price a framework that materializes them, build the model with primitive ops (examples/gpt and examples/llama: --set attention=unfused)"
		}
	}
	return ""
}

// zeroNote says how a sharded optimizer is priced when a plan in the
// table shards one over dp: as gcompile runs it, the gradients'
// reduce-scatter beside the last microbatch's backward (without a
// pipeline) and the weights' gather after the update. A framework that
// also overlaps the gather with the next forward runs the same plan
// faster, and a user pricing such a run from this table should know it.
// The CPU backend's table (hw "cpu") is gcompile's own alone and needs no
// note.
func zeroNote(hw *cost.Hardware, ranked []*planner.Candidate) string {
	if hw == nil || hw.Name == "cpu" {
		return ""
	}
	for _, c := range ranked {
		if (c.Config.Zero == 1 || c.Config.Zero == 2) && c.Config.DP > 1 {
			return "zero: the sharded optimizer's gather is priced after the update, as gcompile runs it (its reduce-scatter beside the last backward only without a pipeline); " +
				"a framework whose distributed optimizer overlaps both with the backward and the next forward " +
				"(Megatron-Core's --overlap-grad-reduce --overlap-param-gather) runs such a plan faster"
		}
	}
	return ""
}

// givenAndChosen says which of the plan's axes the command line gave
// (fixed) and which the planner chose.
func givenAndChosen(explicit map[string]bool) string {
	var given, chosen []string
	for _, a := range planAxes {
		switch {
		case explicit[a]:
			given = append(given, "--"+a)
		case a == "micro-batch-size":
			// The count and the size are one choice.
		case a == "cp-impl" || a == "cp-layout":
			// cp's strategy and layout: the planner tries ring and
			// all2all wherever cp > 1 may be chosen or was given.
			chosen = append(chosen, a)
		case a == "microbatches" && explicit["micro-batch-size"]:
		case a == "cp" && (explicit["cp-impl"] || explicit["cp-layout"]):
			// Given at its default value too: cp's strategy asks for cp.
			chosen = append(chosen, "cp (> 1: --cp-impl or --cp-layout asks for context parallelism)")
		default:
			chosen = append(chosen, a)
		}
	}
	g, ch := "none", "none"
	if len(given) > 0 {
		g = strings.Join(given, " ")
	}
	if len(chosen) > 0 {
		ch = strings.Join(chosen, ", ")
	}
	return fmt.Sprintf("axes given: %s; chosen by the planner: %s", g, ch)
}

// pinFlags are the flags that give exactly plan c: the command line that
// trains it again without the planner.
func pinFlags(c compile.Config) string {
	f := []string{fmt.Sprintf("--tp %d --pp %d --dp %d", max(c.TP, 1), max(c.PP, 1), max(c.DP, 1))}
	if c.EP > 1 {
		f = append(f, fmt.Sprintf("--ep %d", c.EP))
	}
	if c.CP > 1 {
		f = append(f, fmt.Sprintf("--cp %d --cp-impl %s --cp-layout %s", c.CP, c.CPImpl, c.CPLayout))
	}
	if c.VPP > 1 {
		f = append(f, fmt.Sprintf("--vpp %d", c.VPP))
	}
	f = append(f, fmt.Sprintf("--microbatches %d --zero %d", max(c.Microbatches, 1), c.Zero))
	f = append(f, fmt.Sprintf("--sequence-parallel=%t", c.SequenceParallel))
	rc := c.Recompute
	if rc == "" {
		rc = "none"
	}
	f = append(f, "--recompute "+rc)
	// Every searched option is written, none included: a flag left out
	// is searched again when the line is pasted into --plan.
	off := c.Offload
	if off == "" {
		off = "none"
	}
	f = append(f, "--offload "+off)
	if c.Schedule != "" && c.PP > 1 {
		f = append(f, "--schedule "+c.Schedule)
	}
	if c.SerialGradReduce {
		f = append(f, "--overlap-grad-reduce=false")
	}
	if c.GradReduceDType != "" && c.GradReduceDType != "fp32" {
		f = append(f, "--grad-reduce-dtype "+c.GradReduceDType)
	}
	return strings.Join(f, " ")
}

// validateForPlanner checks every flag that is not a searched axis, by
// validating the configuration on one device with the searched axes at
// their defaults; the fixed axes are checked with each candidate, and a
// search that ends with none names their reasons.
func (c *config) validateForPlanner() []error {
	var errs []error
	if c.Devices < 1 || c.Devices > compile.MaxDevices {
		errs = append(errs, fmt.Errorf("--devices must be in 1..%d, got %d", compile.MaxDevices, c.Devices))
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"tp", c.TP}, {"pp", c.PP}, {"dp", c.DP}, {"cp", c.CP}, {"vpp", c.VPP}} {
		if d.v < 0 || d.v > compile.MaxDevices {
			errs = append(errs, fmt.Errorf("--%s must be in 0..%d, got %d", d.name, compile.MaxDevices, d.v))
		}
	}
	if c.DPSync == "async" {
		errs = append(errs, errors.New("--plan searches synchronous plans; it does not combine with --dp-sync async"))
	}
	if c.EP < 0 || c.EP > compile.MaxDevices {
		errs = append(errs, fmt.Errorf("--ep must be in 0..%d, got %d", compile.MaxDevices, c.EP))
	}
	probe := c.Config
	probe.Explicit = map[string]bool{}
	for k, v := range c.explicit {
		probe.Explicit[k] = v
	}
	for _, a := range planAxes {
		delete(probe.Explicit, a)
	}
	probe.Devices, probe.TP, probe.PP, probe.DP, probe.VPP, probe.EP, probe.CP = 1, 1, 1, 1, 0, 0, 0
	if c.explicit["dp"] && c.DP > 1 && c.DP <= compile.MaxDevices {
		// The batch's rules (micro-batch-size) are said with the dp given.
		probe.Devices, probe.DP = c.DP, c.DP
	}
	if probe.DPSync == "async" {
		probe.DPSync = "sync" // refused above; its rules need a dp the probe does not have
	}
	probe.Microbatches, probe.Zero, probe.SequenceParallel, probe.Schedule = 1, 0, false, ""
	if c.Recompute == "selective" {
		probe.Recompute = "none" // whether the model tags anything is known once it is built
	}
	if c.explicit["microbatches"] && c.Microbatches < 1 {
		errs = append(errs, fmt.Errorf("--microbatches must be ≥ 1, got %d", c.Microbatches))
	}
	if c.explicit["microbatches"] && c.Microbatches > compile.MaxMicrobatches {
		errs = append(errs, fmt.Errorf("--microbatches %d: past the %d a compiled program holds; give fewer, larger microbatches (--micro-batch-size)", c.Microbatches, compile.MaxMicrobatches))
	}
	if c.explicit["schedule"] {
		if err := compile.CheckSchedule(c.Schedule); err != nil {
			errs = append(errs, err)
		}
	}
	if c.explicit["zero"] && (c.Zero < 0 || c.Zero > 3) {
		errs = append(errs, fmt.Errorf("--zero %d: want 0, 1, 2 or 3", c.Zero))
	}
	if err := probe.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// runPlanner builds the model, searches, prints the table (stdout) and,
// with --metrics, writes it as JSON. With --run it then adopts the best
// plan and says so; the caller goes on to compile and train it.
func runPlanner(c *config) error {
	// The outputs are checked before the search, by the process that
	// writes them, as checkPaths checks them before a run: the search can
	// take minutes, and a table that cannot be written is lost.
	w, werr := worldOf(c)
	lead := werr != nil || w.Rank == 0
	if lead {
		if err := checkOutputs(c); err != nil {
			return err
		}
	}
	calibrateCPU(c)
	interrupt, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	base := c.Config
	base.Interrupt = interrupt
	m, err := compile.LoadModule(&base)
	// Past the model's build (whose work folder a signal must remove) a
	// signal ends the search at once, as it ends any program (a
	// scheduler's SIGTERM must not be swallowed), once the copies of the
	// module the search compiles from are removed.
	stop()
	base.Interrupt = nil
	stopWatch := cleanUpOnSignal("plan", func() string {
		if n := compile.RemoveTempModules(); n != 1 {
			return fmt.Sprintf("removed the search's %d copies of the module", n)
		}
		return "removed the search's copy of the module"
	})
	defer stopWatch()
	if err != nil {
		return err
	}
	if v := m.Source("tokens"); c.run && c.corpus != nil && v != nil && v.Type.Rank() == 2 {
		// Text too short for one window, or with bytes past the model's
		// vocabulary, is said before the search, not after it.
		if _, err := loadCorpus(c, m, v.Type.Shape[1]); err != nil {
			return err
		}
	}
	base.Explicit = map[string]bool{}
	for _, a := range planAxes {
		if c.explicit[a] {
			base.Explicit[a] = true
		}
	}
	for _, f := range []string{"offload-prefetch", "loss-scale"} {
		if c.explicit[f] {
			base.Explicit[f] = true
		}
	}
	// What the fixed axes break by themselves is said before a
	// calibration's compiles, not after them.
	if err := planner.CheckFixed(base, m); err != nil {
		return err
	}
	if c.refineTrace != "" || c.calibrate != "" {
		if err := planner.CheckCandidates(base, m, c.hw); err != nil {
			return err
		}
	}
	if c.refineTrace != "" {
		if err := refineHardware(c, m, os.Stderr); err != nil {
			return err
		}
	}
	if c.calibrate != "" {
		if err := calibrateHardware(c, m, base, os.Stderr); err != nil {
			return err
		}
	}
	if hwBytes := c.hw.MemoryBytes(); c.MemLimit > hwBytes {
		// Allowed (a device the description does not know of), but a
		// plan ranked on memory the device has not is said to be so.
		fmt.Fprintf(os.Stderr, "note: --device-memory %s is more than %s's %s: the plans are held to --device-memory\n", lower.HumanBytes(c.MemLimit), c.hw.Name, lower.HumanBytes(hwBytes))
	}
	affordable := compileAffordable(m, c.Batch)
	if c.planTrace != "" && !c.run && !affordable {
		return fmt.Errorf("--plan-trace draws the compiled plan's instructions, and %s at batch %d is too large to compile quickly (%d values); give its plan with --tp/--pp/--dp and compile it without --plan", m.Name, c.Batch, len(m.Values))
	}
	res, err := planner.Plan(planner.Request{Base: base, Hardware: c.hw, Module: m, TopK: c.planTop, MemoryBytes: c.MemLimit,
		NoCompile: !affordable})
	if err != nil {
		// A search that found no plan still writes its table: no rows,
		// the reason and the plans it dropped.
		if errors.Is(err, planner.ErrNoPlan) && res != nil && c.plan && c.metrics != "" && lead {
			if werr := writeOutput("metrics", c.metrics, func(p string) error { return planner.WriteJSON(p, res, c.hw, err) }); werr != nil {
				return errors.Join(err, werr)
			}
		}
		return err
	}
	// The refined preset is written once the planner has planned with it:
	// a run that fails before leaves the file the user had.
	if c.saveHardware != "" && lead {
		if err := writeOutput("save-hardware", c.saveHardware, c.hw.Save); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote the hardware description %s to %s (--hardware %s prices plans on it)\n", c.hw.Name, c.saveHardware, c.saveHardware)
	}
	if c.plan {
		if err := planner.WriteTable(os.Stdout, res, c.hw); err != nil {
			return err
		}
		fmt.Println(givenAndChosen(c.explicit))
		for _, note := range []string{attentionNote(m), zeroNote(c.hw, res.Ranked)} {
			if note != "" {
				fmt.Println(note)
			}
		}
		switch {
		case c.metrics != "" && c.run:
			// The run's metrics take the file: the table goes inside
			// them (newMetrics), rather than be written over.
			c.plannerMetrics = &runtime.PlannerMetrics{Hardware: c.hw.Name, Candidates: res.Considered, Plans: planner.Rows(res, c.hw)}
		case c.metrics != "":
			if err := writeOutput("metrics", c.metrics, func(p string) error { return planner.WriteJSON(p, res, c.hw, nil) }); err != nil {
				return err
			}
		}
		if !c.run {
			if c.planTrace != "" {
				return tracePlan(c, m, res.Ranked[0].Config)
			}
			return nil
		}
	}
	top := res.Ranked[0]
	best := top.Config
	best.Built = ir.Print(m) // the model is built once
	best.Model, best.Set, best.Interrupt = c.Model, c.Set, nil
	best.Explicit = c.explicit
	best.MemLimit = c.MemLimit
	best.Progress = c.Progress
	c.Config = best
	c.planned = true
	verb := "compiling"
	if c.run {
		verb = "training"
	}
	mem := "compiled peak"
	switch {
	case top.OverMemory:
		mem = fmt.Sprintf("estimated, over the device's %s: no plan fits by the estimate", lower.HumanBytes(res.MemoryBytes))
	case !top.Compiled:
		mem = "estimated"
	}
	// Every process of a job plans alike; one says so.
	if werr == nil && w.Rank == 0 {
		fmt.Fprintf(os.Stderr, "planner: %s the best plan of %d devices on %s: %s, predicted %.3g ms a step, %s a device (%s)\n", verb, c.Devices, c.hw.Name, planner.Describe(best), top.StepSeconds()*1e3, lower.HumanBytes(top.MemoryBytes()), mem)
		if !c.plan {
			fmt.Fprintf(os.Stderr, "planner: %s; pin it with %s (--plan lists the alternatives)\n", givenAndChosen(c.explicit), pinFlags(best)+c.pinVocab(best.TP))
		}
	}
	return c.validate()
}

// refineHardware compiles the plan the flags fix (the one --trace
// recorded: the axes not given take their defaults, as a run without
// --plan would) from the built module, refines --hardware from the
// trace (cost.Hardware.Refine), prints each parameter before and after
// on log and plans with the refined preset (runPlanner writes
// --save-hardware).
func refineHardware(c *config, m *ir.Module, log io.Writer) error {
	gir, remove, err := compile.TempModuleFile(m)
	if err != nil {
		return err
	}
	defer remove()
	cfg := c.Config
	cfg.Model, cfg.Set, cfg.Interrupt, cfg.MemLimit = gir, "", nil, 0
	// The module is built: its sizes are no flags of the compile any more.
	cfg.Explicit = maps.Clone(c.explicit)
	delete(cfg.Explicit, "set")
	delete(cfg.Explicit, "batch")
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--refine-trace: the traced plan: %w", err)
	}
	res, err := compile.Compile(&cfg, passes.Hooks{})
	if err != nil {
		return fmt.Errorf("--refine-trace: compiling %s: %w", planner.Describe(cfg), err)
	}
	hw, rep, err := c.hw.Refine(res.Programs, c.traced)
	if err != nil {
		return fmt.Errorf("--refine-trace %s against %s: %w", c.refineTrace, planner.Describe(cfg), err)
	}
	fmt.Fprintf(log, "refine: %s from %d instructions of %s, steps %v: %d parameters fitted\n", c.hw.Name, rep.Instructions, c.refineTrace, rep.Steps, rep.Fitted)
	for _, p := range rep.Params {
		switch {
		case p.Kept:
			fmt.Fprintf(log, "refine: %-24s %.4g kept (%s)\n", p.Key, p.Before, p.Why)
		case p.Why != "":
			fmt.Fprintf(log, "refine: %-24s %.4g → %.4g (%d samples; %s)\n", p.Key, p.Before, p.After, p.Samples, p.Why)
		default:
			fmt.Fprintf(log, "refine: %-24s %.4g → %.4g (%d samples)\n", p.Key, p.Before, p.After, p.Samples)
		}
	}
	fmt.Fprintf(log, "refine: median |log(predicted/measured)| per instruction %.3f → %.3f\n", rep.LogErrorBefore, rep.LogErrorAfter)
	c.hw = hw
	return nil
}

// maxCalibratedError is the largest mean miss a calibration may leave,
// counted alike either way (cost.StepCalibration.MissAfter: 1 is steps
// twice their prices, or half): a fit further off is refused.
const maxCalibratedError = 1.0

// calibrateHardware fits --hardware to the measured plans of
// --calibrate (planner.CalibrateSteps), prints each parameter and the
// errors before, after and left out on log, and plans with the result
// (runPlanner writes --save-hardware).
func calibrateHardware(c *config, m *ir.Module, base compile.Config, log io.Writer) error {
	shape, err := planner.ShapeOf(m)
	if err != nil {
		return fmt.Errorf("--calibrate: %w", err)
	}
	params := compile.ParamCount(m)
	for i, p := range c.measured {
		if err := p.Run.Check(params, c.Precision, c.Set); err != nil {
			return fmt.Errorf("--calibrate %s: %w", c.calibrate, err)
		}
		// A plan the model cannot have (tp not dividing its heads) is
		// named by its rule, not by the compile error it would meet.
		cfg := p.Config(base)
		cfg.Explicit = map[string]bool{"tp": true, "pp": true, "dp": true, "ep": p.EP > 0, "cp": p.CP > 0, "vpp": p.VPP > 0}
		if why := planner.FixedConflicts(cfg, shape); len(why) > 0 {
			return fmt.Errorf("--calibrate %s: calibration point %d (%s) cannot be this model's plan: %s", c.calibrate, i+1, planner.Describe(cfg),
				strings.ReplaceAll(strings.Join(why, "; "), " as given", ""))
		}
	}
	// Price the measured plans as the table will: compiled and predicted
	// for a model small enough to compile, estimated otherwise.
	var hw *cost.Hardware
	var rep *cost.StepCalibration
	if n := len(c.measured); n >= 20 {
		// Each plan left out in turn is a fit of its own: said, as the
		// wait grows with the square of the plans.
		fmt.Fprintf(log, "calibrate: fitting %s to %d measured plans, then %d times with one left out…\n", c.hw.Name, n, n)
	}
	if compileAffordable(m, c.Batch) {
		girFor, remove := modulesByBatch(c, m)
		defer remove()
		hw, rep, err = planner.CalibrateCompiled(c.hw, girFor, base, c.measured)
	} else {
		hw, rep, err = planner.CalibrateSteps(c.hw, shape, base, c.measured)
	}
	if err != nil {
		return fmt.Errorf("--calibrate %s: %w", c.calibrate, err)
	}
	fmt.Fprintf(log, "calibrate: %s %s\n", c.hw.Name, rep.Headline(c.calibrate))
	if c.hardware == "" && c.hw.Name == "cpu" {
		// The fit moves figures within bounds of the preset's; the
		// preset's rates are guesses a fast machine is far past.
		fmt.Fprintln(log, "calibrate: the cpu preset's rates are rough defaults, not this machine's: --hardware cpu measures them before the fit")
	}
	for _, p := range rep.Params {
		switch {
		case p.Kept:
			fmt.Fprintf(log, "calibrate: %-24s %.4g not fitted: %s\n", p.Key, p.Before, p.Why)
		case p.Why != "":
			fmt.Fprintf(log, "calibrate: %-24s %.4g → %.4g, %s\n", p.Key, p.Before, p.After, p.Why)
		default:
			fmt.Fprintf(log, "calibrate: %-24s %.4g → %.4g\n", p.Key, p.Before, p.After)
		}
	}
	for _, pt := range rep.Points {
		loo := ""
		if rep.HasLOO {
			loo = fmt.Sprintf(", left out %.4g ms (%+.1f %%)", pt.LeftOut*1e3, 100*(pt.LeftOut/pt.Measured-1))
		}
		fmt.Fprintf(log, "calibrate: %-40s measured %.4g ms, predicted %.4g → %.4g ms%s\n", pt.Name, pt.Measured*1e3, pt.Before*1e3, pt.After*1e3, loo)
	}
	loo := "no leave-one-out error with a single plan"
	if rep.HasLOO {
		loo = fmt.Sprintf("leave-one-out %.1f %%", 100*rep.LeaveOneOut)
	}
	fmt.Fprintf(log, "calibrate: mean |predicted/measured − 1| %.1f %% → %.1f %%, %s\n", 100*rep.ErrorBefore, 100*rep.ErrorAfter, loo)
	if rep.MissAfter > maxCalibratedError {
		// Figures within their bounds that still miss by this much are
		// not the cluster's; planning (or --save-hardware) with them
		// would pass their miss on.
		return fmt.Errorf("--calibrate %s: fitted, the measured plans are still %.3g× from their prices on average (slower or faster alike): no figures within their bounds explain the times; are they of this model, precision and batch, in milliseconds, of one step each? Nothing was planned or saved with them", c.calibrate, 1+rep.MissAfter)
	}
	if len(rep.Unfitted) > 0 {
		// One plan's time cannot tell a slow network from slow GEMMs: the
		// fit moves the first figure, and a plan whose share of
		// communication differs is then mispriced.
		fmt.Fprintf(log, "calibrate: too few plans to fit %s: they keep %s's figures; where the cluster's differ (its network, its framework's host time a kernel), set them (--hardware %s:%s=…) or measure more plans\n",
			strings.Join(rep.Unfitted, ", "), c.hw.Name, c.hw.Name, rep.Unfitted[0])
	}
	c.hw = hw
	return nil
}

// modulesByBatch gives the module file of the model built at a batch: m
// at the command line's, the model file built again at another (a
// measured plan ran its own batch, and a module's shapes are its batch's),
// each once. remove deletes the files.
func modulesByBatch(c *config, m *ir.Module) (girFor func(batch int) (string, error), remove func()) {
	girs := map[int]string{}
	var removes []func()
	girFor = func(batch int) (string, error) {
		if gir, ok := girs[batch]; ok {
			return gir, nil
		}
		mb := m
		if batch != c.Batch {
			if strings.HasSuffix(c.Model, ".gir") {
				return "", fmt.Errorf("it ran batch %d, and %s is a module built at batch %d: give the model's .go file, which builds at any batch, or measured plans of batch %d", batch, c.Model, c.Batch, c.Batch)
			}
			cfg := c.Config
			cfg.Batch, cfg.Built, cfg.Interrupt = batch, "", nil
			var err error
			if mb, err = compile.LoadModule(&cfg); err != nil {
				return "", fmt.Errorf("building the model at batch %d: %w", batch, err)
			}
		}
		gir, rm, err := compile.TempModuleFile(mb)
		if err != nil {
			return "", err
		}
		girs[batch] = gir
		removes = append(removes, rm)
		return gir, nil
	}
	return girFor, func() {
		for _, rm := range removes {
			rm()
		}
	}
}

// compileAffordable says whether compiling the top plans is quick enough
// to do on every --plan: the step's program grows with the module's
// values times the microbatches. Above the limit (GPT-3-sized models) the
// table reports the estimate, memory marked as estimated.
func compileAffordable(m *ir.Module, batch int) bool {
	return len(m.Values)*min(batch, 256) <= 200_000
}

// tracePlan compiles the planner's best plan from the built module and
// writes its predicted step (--plan --plan-trace without --run; with
// --run the plan is compiled to be trained, and compileAndRun writes it).
func tracePlan(c *config, m *ir.Module, best compile.Config) error {
	gir, remove, err := compile.TempModuleFile(m)
	if err != nil {
		return err
	}
	defer remove()
	best.Model, best.Set, best.Interrupt = gir, "", nil
	best.Explicit, best.MemLimit = map[string]bool{}, 0
	res, err := compile.Compile(&best, passes.Hooks{})
	if err != nil {
		return fmt.Errorf("--plan-trace: compiling %s: %w", planner.Describe(best), err)
	}
	return writeOutput("plan-trace", c.planTrace, func(p string) error { return writePlanTrace(c, res, p, os.Stderr) })
}

// writePlanTrace prices the compiled plan on --hardware and writes the
// predicted step as Chrome trace events (cost.WriteTrace: the runtime's
// --trace format, processes 2 and 3 so the two files' traceEvents can be
// concatenated), and says so on log.
func writePlanTrace(c *config, res *compile.Result, path string, log io.Writer) error {
	calibrateCPU(c)
	pred, err := c.hw.Predict(res.Programs, res.Schedule)
	if err != nil {
		return err
	}
	if err := cost.WriteTrace(path, res.Programs, pred); err != nil {
		return err
	}
	end := 0.0
	if tl := pred.Timeline; tl != nil {
		for _, rank := range tl.Instrs {
			for _, sl := range rank {
				end = max(end, sl.Start+sl.Seconds)
			}
		}
	}
	note := ""
	if pred.StepSeconds > end*(1+1e-6) && c.hw.HostCores > 0 {
		// The trace draws each device's own time; virtual devices that
		// share the host's cores take longer together than any one.
		cores := fmt.Sprintf("%d host cores", c.hw.HostCores)
		if c.hw.HostCores == 1 {
			cores = "one host core"
		}
		note = fmt.Sprintf(" (the trace ends at %.4g ms: its devices share %s, which the step counts and the timeline does not)", end*1e3, cores)
	}
	fmt.Fprintf(log, "plan-trace: predicted step %.4g ms on %s written to %s%s\n", pred.StepSeconds*1e3, c.hw.Name, path, note)
	return nil
}

// calibrateCPU replaces the cpu preset by this machine's measured figures
// (cost.Calibrate, a few hundred milliseconds, nothing cached) the first
// time the cost model is used, when --hardware cpu was given (cpu:key=value,…
// sets those figures on the measured ones). Left at its
// default (--plan alone) the preset stays, so such plans do not vary from
// run to run; in a job of several processes too, since each process plans
// on its own and all must choose the same plan. A failed calibration
// keeps the preset and says why.
func calibrateCPU(c *config) {
	base, sets, _ := strings.Cut(c.hardware, ":")
	if c.calibrated || base != "cpu" {
		return
	}
	c.calibrated = true
	if w, err := worldOf(c); err != nil || w.Size > 1 {
		fmt.Fprintln(os.Stderr, "hardware: cpu preset as is (processes of a job must plan alike, so none calibrates)")
		return
	}
	hw, err := cost.Calibrate()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hardware: calibrating the cpu preset failed, keeping its defaults: %v\n", err)
		return
	}
	if sets != "" {
		// Load checked the figures on the preset; on the measured ones
		// they are the same keys and values.
		if hw, err = hw.With(sets); err != nil {
			fmt.Fprintf(os.Stderr, "hardware: %s on the measured cpu figures: %v; keeping the preset with them\n", sets, err)
			return
		}
	}
	c.hw = hw
	fmt.Fprintf(os.Stderr, "hardware: %s\n", hw.Source)
}
