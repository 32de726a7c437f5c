package passes

import (
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"gcompile/ir"
)

// Pass is one entry of the pipeline.
type Pass struct {
	Name string
	Fn   func(*ir.Module, *Options) error
	// Required passes cannot be disabled: later passes or the runtime depend
	// on what they produce.
	Required bool
	Doc      string
}

// passes is the compiler, in order. The design's schedule and
// memory-plan passes are made in lowering (lower/), where the final
// instruction order is known.
var passes = [...]Pass{
	{Name: "verify-input", Fn: verifyInput, Required: true, Doc: "check the module the frontend or a .gir file produced"},
	{Name: "pipeline-split", Fn: pipelineSplit, Required: true, Doc: "tag every value with its pipeline chunk (pp ranks × vpp chunks)"},
	{Name: "autodiff", Fn: autodiff, Required: true, Doc: "reverse-mode gradients of the loss for every param"},
	{Name: "microbatch", Fn: microbatch, Required: true, Doc: "gradient accumulation: one forward and backward per microbatch, each microbatch's share of the gradients summed"},
	{Name: "optimizer", Fn: optimizer, Required: true, Doc: "global-norm clipping and the AdamW, SGD, Adafactor or SM3 update of every param"},
	{Name: "mixed-precision", Fn: mixedPrecision, Required: true, Doc: "fp16/bf16 forward and backward on 16-bit weight copies, loss scaling, fp32 master weights (--precision)"},
	{Name: "recompute", Fn: recompute, Required: true, Doc: "activation recompute: replay forward values in the backward (full, selective, every=K)"},
	{Name: "compress", Fn: compress, Required: true, Doc: "stash activations for the backward as 1-bit ReLU masks (lossless) or in bf16 (Gist's delayed precision reduction)"},
	{Name: "shard", Fn: shardNamingHeads, Required: true, Doc: "place every value on the mesh (data parallel, ZeRO) and mark where placements must change"},
	{Name: "redistribute", Fn: redistribute, Required: true, Doc: "turn placement changes into collectives"},
	{Name: "fuse", Fn: fuse, Required: true, Doc: "merge groups of f32 elementwise ops into fused ops, one kernel each; does nothing without --fuse"},
	{Name: "data-parallel", Fn: dataParallel, Doc: "bucket the gradient reductions over dp, ep and cp (in 16 bits with --grad-reduce-dtype bf16|fp16)"},
}

// trainingOnly are the passes a generation step skips: it has no loss to
// differentiate, no weights to update, and nothing kept for a backward.
var trainingOnly = map[string]bool{"autodiff": true, "microbatch": true, "optimizer": true, "mixed-precision": true,
	"recompute": true, "compress": true, "data-parallel": true}

type constraint struct {
	before, after, why string
}

// passOrder lists ordering rules, each with its reason; init checks them.
var passOrder = [...]constraint{
	{"verify-input", "autodiff", "autodiff assumes a well-typed forward graph"},
	{"pipeline-split", "autodiff", "backward values take the chunk of the forward value they differentiate"},
	{"autodiff", "microbatch", "microbatch copies the backward graph autodiff builds"},
	{"microbatch", "optimizer", "the optimizer consumes the accumulated gradients"},
	{"optimizer", "shard", "optimizer state and updates are placed too (ZeRO shards them)"},
	{"optimizer", "mixed-precision", "the optimizer's fp32 updates are the boundary where 16-bit gradients become fp32"},
	{"mixed-precision", "recompute", "replayed forward values must already have their 16-bit types"},
	{"autodiff", "recompute", "recompute replays forward values for the backward autodiff built"},
	{"microbatch", "recompute", "each microbatch replays its own forward"},
	{"recompute", "shard", "replayed values are placed like any other"},
	{"recompute", "compress", "what is replayed is not stashed, so not compressed"},
	{"compress", "shard", "the compressed copies are placed like any other"},
	{"shard", "redistribute", "redistribute expands the placement changes shard marks"},
	{"redistribute", "data-parallel", "buckets group the gradient collectives redistribute creates"},
	{"redistribute", "fuse", "groups must not span a placement change, so placements are final first"},
	{"recompute", "fuse", "replayed values fuse with their own phase, not with the originals"},
	{"fuse", "data-parallel", "data-parallel is optional and last, so a run without it still records a prefix of the table"},
}

func init() {
	if err := checkOrder(passes[:], passOrder[:]); err != nil {
		panic(err)
	}
}

func checkOrder(table []Pass, rules []constraint) error {
	index := map[string]int{}
	for i, p := range table {
		if _, dup := index[p.Name]; dup {
			return fmt.Errorf("passes: %q appears twice in the pass table", p.Name)
		}
		index[p.Name] = i
	}
	for _, c := range rules {
		i, ok1 := index[c.before]
		j, ok2 := index[c.after]
		if !ok1 || !ok2 {
			return fmt.Errorf("passes: ordering rule %q before %q names a pass not in the table", c.before, c.after)
		}
		if i >= j {
			return fmt.Errorf("passes: %q must run before %q (%s)", c.before, c.after, c.why)
		}
	}
	return nil
}

// Table returns the pass table in order.
func Table() []Pass { return slices.Clone(passes[:]) }

// Result describes one pass of a Run.
type Result struct {
	Name    string
	Ms      float64
	Changed bool
	Skipped string // why the pass did not run: "already applied" or "disabled"
	// Note is what the pass found worth telling the user that is not an
	// error: a request it had nothing to do for, and why (selective
	// recompute of a model whose attention is the fused op).
	Note string
	// Failed says the pass returned an error: the module is as it left
	// it, half done, which Run then returns.
	Failed bool
}

// Hooks observe a Run; the dump writer uses them. Nil fields are skipped.
type Hooks struct {
	// Before sees the module before the first pass that runs.
	Before func(m *ir.Module)
	// After sees the module after each pass (also unchanged ones).
	After func(r Result, m *ir.Module)
}

// Run applies every pass the module has not had yet. On error the module
// is left as the failing pass left it, for dumping.
func Run(m *ir.Module, opts *Options, hooks Hooks) ([]Result, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := checkResume(m); err != nil {
		return nil, err
	}
	if hooks.Before != nil {
		hooks.Before(m)
	}
	var results []Result
	before := hash(m)
	for _, p := range passes {
		if m.HasRun(p.Name) {
			results = append(results, Result{Name: p.Name, Skipped: "already applied"})
			if p.Name == opts.StopAfter {
				break // a resumed module already past StopAfter runs nothing more
			}
			continue
		}
		if opts.Generate && trainingOnly[p.Name] {
			results = append(results, Result{Name: p.Name, Skipped: "forward only (generation)"})
			continue
		}
		if slices.Contains(opts.Disable, p.Name) {
			results = append(results, Result{Name: p.Name, Skipped: "disabled"})
			if p.Name == opts.StopAfter {
				break
			}
			continue
		}
		if opts.Interrupted != nil {
			if err := opts.Interrupted(); err != nil {
				return results, err
			}
		}
		start := time.Now()
		note, err := runOne(p, m, opts)
		r := Result{Name: p.Name, Ms: float64(time.Since(start).Microseconds()) / 1000, Note: note, Failed: err != nil}
		if err == nil {
			m.MarkPass(p.Name)
		}
		after := hash(m)
		r.Changed = after != before
		before = after
		results = append(results, r)
		if hooks.After != nil {
			hooks.After(r, m)
		}
		if err != nil {
			return results, err
		}
		if opts.Verify {
			if err := ir.Verify(m, p.Name); err != nil {
				return results, err
			}
		}
		if p.Name == opts.StopAfter {
			break
		}
	}
	return results, nil
}

func runOne(p Pass, m *ir.Module, opts *Options) (note string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic during pass %q while compiling %q: %v\n%s", p.Name, m.Name, r, debug.Stack())
		}
	}()
	// The pass gets its own copy of the options, whose notes are its own:
	// the caller's options are not written to.
	o := *opts
	var notes []string
	o.notes = &notes
	if err := p.Fn(m, &o); err != nil {
		return strings.Join(notes, "; "), fmt.Errorf("pass %q: %w", p.Name, err)
	}
	return strings.Join(notes, "; "), nil
}

// checkResume accepts a module whose applied passes are a prefix of the
// table, so a dump continues exactly where it stopped.
func checkResume(m *ir.Module) error {
	for i, name := range m.Passes {
		if i >= len(passes) || passes[i].Name != name {
			var want []string
			for _, p := range passes {
				want = append(want, p.Name)
			}
			return fmt.Errorf("module records passes %v, which is not a prefix of this compiler's pass order %v", m.Passes, want)
		}
	}
	return nil
}

// hash fingerprints the module's contents; the list of applied passes is
// left out, or every pass would count as a change.
func hash(m *ir.Module) [32]byte {
	applied := m.Passes
	m.Passes = nil
	defer func() { m.Passes = applied }()
	return ir.PrintHash(m) // streamed: the text is never held whole
}

// ErrDisabledRequired is returned when a required pass is disabled.
var ErrDisabledRequired = errors.New("a required pass cannot be disabled")
