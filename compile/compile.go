// Package compile is the compile driver: a validated Config (the model
// and its parallel plan) in, the compiled module, every pipeline rank's
// program, the evaluation programs and the checked pipeline schedule out.
// The command line, the launcher of multi-process jobs and every process
// of such a job call it, so all of them build the same programs from the
// same flags; Result.Fingerprint lets the processes check that they did.
package compile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"gcompile/frontend"
	"gcompile/frontend/loader"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/passes/schedule"
)

// Result is what Compile builds.
type Result struct {
	Module *ir.Module
	// Passes are the pass table's results, in order.
	Passes []passes.Result
	// Programs are the training programs, one per pipeline rank (one
	// without pipeline parallelism); EvalPrograms the forward-only
	// programs a pipeline evaluates with (nil otherwise: the training
	// programs' forward prefix serves).
	Programs, EvalPrograms []*lower.Program
	// Schedule is the pipeline schedule and Simulated its check with unit
	// costs; nil without pipeline parallelism.
	Schedule  *schedule.Schedule
	Simulated *schedule.Result
	// Async holds the programs of asynchronous data parallelism instead
	// of Programs (--dp-sync async).
	Async *Async
	// Elapsed is the time from the first pass to the last program.
	Elapsed time.Duration
	// ModelFingerprint identifies the model before any pass
	// (ir.Module.Fingerprint): the same under every plan.
	ModelFingerprint string
}

// Async is asynchronous data parallelism's pair of programs: the
// gradient program each replica runs, the update program the parameter
// server runs, and the gradients between them.
type Async struct {
	Grad, Update *lower.Program
	Boundary     []string
}

// Mesh is the programs' mesh (nil for one device).
func (r *Result) Mesh() *ir.Mesh {
	if len(r.Programs) == 0 {
		return nil
	}
	return r.Programs[0].Mesh
}

// Devices is the number of devices the programs span.
func (r *Result) Devices() int {
	if m := r.Mesh(); m != nil {
		return m.Devices()
	}
	return 1
}

// Fingerprint identifies the compiled plan: every program's instructions,
// buffers and layout (see lower.Fingerprint). Processes of one job compare
// it before they train.
func (r *Result) Fingerprint() string {
	progs := append(append([]*lower.Program(nil), r.Programs...), r.EvalPrograms...)
	if r.Async != nil {
		progs = append(progs, r.Async.Grad, r.Async.Update)
	}
	return lower.Fingerprint(progs...)
}

// Schedule builds and checks the plan's pipeline schedule: the simulator
// runs every rank's action list together and fails on a deadlock or an
// unmatched send/receive before any program is built. The schedule
// depends only on p, v and m, so callers may run it before loading the
// model.
func Schedule(c *Config) (*schedule.Schedule, *schedule.Result, error) {
	s, err := schedule.New(c.Schedule, c.PP, c.VPP, c.Microbatches)
	if err != nil {
		if c.Microbatches < c.PP && c.Schedule != "gpipe" {
			// Fewer microbatches than stages is a count the user can
			// change (or left out), whichever schedule: named as such.
			what, fill := fmt.Sprintf("--schedule %s over --pp %d", c.Schedule, c.PP), ""
			if !c.Explicit["schedule"] {
				what, fill = fmt.Sprintf("--pp %d", c.PP), " to fill its stages"
			}
			if !c.Explicit["microbatches"] && c.MicroBatchSize == 0 {
				// fillPipeline found no count that divides the batch.
				replicas := max(c.DP, 1) * max(c.EP, 1)
				share := c.Batch / replicas
				count := fmt.Sprintf("at least %d", c.PP)
				if c.Schedule == "interleaved" {
					count = fmt.Sprintf("a multiple of %d", c.PP)
				}
				fix := fmt.Sprintf("raise --batch to a multiple of %d", c.PP*replicas)
				if strings.HasSuffix(c.Model, ".gir") {
					fix = fmt.Sprintf("a .gir dump's batch is fixed: dump the model at a batch that is a multiple of %d", c.PP*replicas)
				}
				if c.Schedule != "interleaved" {
					fix += ", or use --schedule gpipe"
				}
				return nil, nil, fmt.Errorf("%s needs %s microbatches%s, and none divides each data-parallel replica's share of the batch of %d, %d sequence%s: %s: %w", what, count, fill, c.Batch, share, map[bool]string{true: "", false: "s"}[share == 1], fix, err)
			}
			return nil, nil, fmt.Errorf("%s needs at least %d microbatches%s (--microbatches %d; the batch is split into them): %w", what, c.PP, fill, c.Microbatches, err)
		}
		what := "--schedule " + c.Schedule
		if !c.Explicit["schedule"] {
			what = fmt.Sprintf("the %s schedule (--pp %d --vpp %d)", c.Schedule, c.PP, c.VPP)
		}
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	res, err := schedule.Simulate(s, UnitCost(s))
	if err != nil {
		return nil, nil, fmt.Errorf("schedule %s failed its deadlock check: %w", s.Name, err)
	}
	return s, res, nil
}

// UnitCost is the cost model a schedule is simulated with before anything
// was measured: one unit per action (zero-bubble splits the backward).
func UnitCost(s *schedule.Schedule) schedule.Cost {
	if s.Name == "zb" {
		return schedule.UnitCostZB
	}
	return schedule.UnitCost
}

// Blocks turns a schedule into the compute order the lowering follows.
func Blocks(s *schedule.Schedule) [][]lower.Block {
	out := make([][]lower.Block, len(s.Actions))
	for r, acts := range s.Actions {
		for _, a := range acts {
			switch a.Kind {
			case schedule.F:
				out[r] = append(out[r], lower.Block{Kind: 'F', Chunk: a.Chunk, Micro: a.Micro})
			case schedule.B:
				out[r] = append(out[r], lower.Block{Kind: 'B', Chunk: a.Chunk, Micro: a.Micro})
			case schedule.W:
				out[r] = append(out[r], lower.Block{Kind: 'W', Chunk: a.Chunk, Micro: a.Micro})
			}
		}
	}
	return out
}

// LoadModule builds the model's module: a model.go through the loader (at
// the plan's batch, each asynchronous replica's share of it), or a .gir
// dump parsed as it is.
func LoadModule(c *Config) (*ir.Module, error) { return loadModule(c, false) }

// loadModule builds the training module, or with eval the module
// evaluation runs (frontend.Config.Eval).
func loadModule(c *Config, eval bool) (*ir.Module, error) {
	if c.Built != "" && !eval {
		return ir.Parse(c.Model, c.Built)
	}
	if strings.HasSuffix(c.Model, ".gir") {
		text, err := os.ReadFile(c.Model)
		if err != nil {
			return nil, err
		}
		m, err := ir.Parse(c.Model, string(text))
		if err == nil && isTempModule(c.Model) {
			// Errors name the user's lines alone: the copy's lines are
			// in a file the user never wrote, removed after the compile.
			for _, v := range m.Values {
				v.Read = ir.Pos{}
			}
		}
		return m, err
	}
	set, err := frontend.ParseSet(c.Set)
	if err != nil {
		return nil, err
	}
	name := c.ModelName()
	batch := c.Batch
	if c.DPSync == "async" {
		batch /= c.DP // each replica's program sees its share of the batch
	}
	// Progress on stderr: a cold build of the model takes long enough to
	// look like a hang.
	progress := c.Progress
	if progress == nil {
		progress = os.Stderr
	}
	l := &loader.Loader{Timeout: c.ModelTimeout, Progress: progress, Context: c.Interrupt}
	return l.Load(c.Model, frontend.Config{Name: name, Batch: batch, Set: set, Eval: eval, Classes: c.Classes})
}

// ModelName is the name a model.go's module takes: its folder's (a
// checkpoint records it with the model's fingerprint).
func (c *Config) ModelName() string {
	return strings.TrimSuffix(filepath.Base(filepath.Dir(absOr(c.Model))), "/")
}

func absOr(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// Compile runs the pass table on the model and lowers the result for the
// plan of c, which Validate must have accepted. hooks see the module
// around every pass (dumps). A pass that fails returns its error with the
// Result so far (the module as that pass left it).
func Compile(c *Config, hooks passes.Hooks) (*Result, error) {
	res := &Result{}
	if c.PP > 1 {
		var err error
		if res.Schedule, res.Simulated, err = Schedule(c); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	m, err := LoadModule(c)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(c.Model, ".gir") {
		if err := checkGir(m); err != nil {
			return nil, fmt.Errorf("%s: %w", c.Model, err)
		}
		if err := checkResumed(c, m); err != nil {
			return nil, err
		}
	}
	res.Module = m
	res.ModelFingerprint = m.Fingerprint()
	if c.EP > 1 && !hasExperts(m) {
		// It would run as a second data-parallel axis, which --dp is.
		return res, fmt.Errorf("--ep %d: the model has no experts (no moe_ op), and expert parallelism splits a mixture of experts; split the batch with --dp", c.EP)
	}
	res.Passes, err = passes.Run(m, c.PassOptions(), hooks)
	if err != nil {
		return res, err
	}
	// A signal during the passes (c.Interrupt, which the caller cancels on
	// SIGINT or SIGTERM) stops the compile here, before the lowering: a
	// run stopped before training must not train.
	if err := c.interrupted("the compile passes"); err != nil {
		return res, err
	}
	if c.DPSync == "async" {
		gm, um, boundary, err := lower.SplitAtOptimizer(m)
		if err != nil {
			return res, err
		}
		a := &Async{Boundary: boundary}
		if a.Grad, err = lower.Lower(gm); err != nil {
			return res, err
		}
		if a.Update, err = lower.Lower(um); err != nil {
			return res, err
		}
		res.Async = a
		res.Elapsed = time.Since(start)
		return res, nil
	}
	lo, err := c.LowerOptions()
	if err != nil {
		return res, err
	}

	if res.Schedule != nil {
		if res.Programs, err = lower.LowerPipelineWith(m, Blocks(res.Schedule), lo); err != nil {
			return res, err
		}
		if res.EvalPrograms, err = lower.LowerPipelineForwardWith(m, c.PP, max(c.VPP, 1), c.Microbatches, lo); err != nil {
			return res, err
		}
		// The schedule was proven deadlock-free as actions; the lowering
		// makes its own sends and receives, so the programs are checked
		// too, as the runtime matches them (by tag, sends buffered).
		for _, progs := range [][]*lower.Program{res.Programs, res.EvalPrograms} {
			if err := lower.CheckTransfersByTag(progs); err != nil {
				return res, fmt.Errorf("the lowered pipeline programs: %w", err)
			}
		}
	} else {
		prog, err := lower.LowerWith(m, lo)
		if err != nil {
			return res, err
		}
		res.Programs = []*lower.Program{prog}
	}
	if m.EvalDiffers && !strings.HasSuffix(c.Model, ".gir") {
		if res.EvalPrograms, err = compileEval(c, m, res.Schedule != nil, lo); err != nil {
			return res, fmt.Errorf("the evaluation module: %w", err)
		}
	}
	if c.MemLimit > 0 {
		for r := range res.Devices() {
			if err := lower.ProgramOf(res.Programs, r).CheckFits(fmt.Sprintf("device %d", r), c.MemLimit); err != nil {
				return res, err
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res, c.interrupted("the lowering")
}

// hasExperts says whether m routes tokens to experts.
func hasExperts(m *ir.Module) bool {
	for _, v := range m.Values {
		if strings.HasPrefix(v.Op, "moe_") {
			return true
		}
	}
	return false
}

// interrupted is an error naming stage when c.Interrupt was cancelled (a
// signal the caller caught), nil otherwise.
func (c *Config) interrupted(stage string) error {
	if c.Interrupt == nil || c.Interrupt.Err() == nil {
		return nil
	}
	return fmt.Errorf("stopped during %s by %w", stage, context.Cause(c.Interrupt))
}

// compileEval builds the model for evaluation (its shapes differ from
// training's: b.Evaluating), runs the same passes and lowers its forward:
// forward-only programs under pipeline parallelism, otherwise the whole
// program, whose forward prefix evaluation runs. The runtime copies the
// training run's params into them before each evaluation. A module loaded
// from a .gir dump has no model to rebuild and evaluates with its
// training shapes.
func compileEval(c *Config, trained *ir.Module, pipeline bool, lo lower.Options) ([]*lower.Program, error) {
	m, err := loadModule(c, true)
	if err != nil {
		return nil, err
	}
	// Evaluation runs on the trained weights, found by name: a param the
	// training module lacks was evaluated at zero, and one of another
	// shape failed after the first training step.
	params := map[string]*ir.Value{}
	for _, v := range trained.Values {
		if v.Op == "param" {
			params[v.Name()] = v
		}
	}
	for _, v := range m.Values {
		if v.Op != "param" {
			continue
		}
		switch t, ok := params[v.Name()]; {
		case !ok:
			return nil, fmt.Errorf("%s: param %q is declared only when evaluating (b.Evaluating()): evaluation reads the trained weights, and it has none; declare it in training too", v.Where(), v.Name())
		case !t.Type.Shape.Equal(v.Type.Shape):
			// Shapes only: the passes may store a trained param in
			// another dtype (16-bit plans).
			return nil, fmt.Errorf("%s: param %q is %v when evaluating and %v in training (%s): evaluation reads the trained weights, so it keeps one shape", v.Where(), v.Name(), v.Type.Shape, t.Type.Shape, t.Where())
		}
	}
	if _, err := passes.Run(m, c.PassOptions(), passes.Hooks{}); err != nil {
		return nil, err
	}
	if !pipeline {
		keepLoss(m)
		prog, err := lower.LowerWith(m, lo)
		if err != nil {
			return nil, err
		}
		return []*lower.Program{prog}, nil
	}
	progs, err := lower.LowerPipelineForwardWith(m, c.PP, max(c.VPP, 1), c.Microbatches, lo)
	if err != nil {
		return nil, err
	}
	return progs, lower.CheckTransfersByTag(progs)
}

// TempModuleFile writes a built module to a .gir file in a new temporary
// folder, for compiling it (several times, under several plans) with
// Config.Model: the passes change the module they run on, so every
// compile parses its own copy. remove deletes the folder.
func TempModuleFile(m *ir.Module) (path string, remove func(), err error) {
	tempMu.Lock()
	if tempClosed {
		tempMu.Unlock()
		return "", nil, errors.New("stopping: no more copies of the module")
	}
	dir, err := os.MkdirTemp("", "gcompile-module-")
	if err != nil {
		tempMu.Unlock()
		return "", nil, err
	}
	path = filepath.Join(dir, "model.gir")
	// Registered before it is written, so that RemoveTempModules, run
	// from a signal's goroutine, finds every folder made.
	tempModules[path] = true
	tempMu.Unlock()
	remove = func() {
		tempMu.Lock()
		delete(tempModules, path)
		tempMu.Unlock()
		os.RemoveAll(dir)
	}
	if err := os.WriteFile(path, []byte(ir.Print(m)), 0o644); err != nil {
		remove()
		return "", nil, err
	}
	return path, remove, nil
}

// tempModules holds the paths TempModuleFile made and has not removed;
// tempClosed is set once RemoveTempModules ran, after which none is
// made.
var (
	tempMu      sync.Mutex
	tempModules = map[string]bool{}
	tempClosed  bool
)

// RemoveTempModules removes every file TempModuleFile made and has not
// removed, with its folder, makes no more, and says how many it removed:
// what a process stopped by a signal, whose deferred removals will not
// run, calls.
func RemoveTempModules() int {
	tempMu.Lock()
	defer tempMu.Unlock()
	tempClosed = true
	for path := range tempModules {
		os.RemoveAll(filepath.Dir(path))
	}
	n := len(tempModules)
	clear(tempModules)
	return n
}

func isTempModule(path string) bool {
	tempMu.Lock()
	defer tempMu.Unlock()
	return tempModules[path]
}

// keepLoss cuts m down to what its loss needs: no backward, optimizer,
// updates or other outputs, so the evaluation program's memory plan holds
// only the forward's buffers. A model's language-model loss (the MoE's
// lm_loss, without its balancing term) stays: evaluation reports it
// (runtime.EvalOutput).
func keepLoss(m *ir.Module) {
	keep := []ir.Output{{Name: ir.OutputLoss, Value: m.Output(ir.OutputLoss)}}
	if lm := m.Output(ir.AuxPrefix + ir.OutputLMLoss); lm != nil {
		keep = append(keep, ir.Output{Name: ir.AuxPrefix + ir.OutputLMLoss, Value: lm})
	}
	m.Outputs = keep
	m.Updates = nil
	m.DropDead()
}

// ProgramOf is the program device rank runs.
func (r *Result) ProgramOf(rank int) *lower.Program { return lower.ProgramOf(r.Programs, rank) }

// ParamCount is the number of trainable parameters of the module.
func ParamCount(m *ir.Module) int64 {
	var n int64
	for _, p := range m.Params() {
		n += p.Type.Shape.NumElements()
	}
	return n
}
