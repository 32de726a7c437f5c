package compile

import (
	"errors"
	"fmt"
	"strings"

	"gcompile/frontend"
	"gcompile/frontend/loader"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// Generation is what CompileGeneration builds: the two programs of
// generation under one plan, from the same Model() as training.
//   - Prefill runs a prompt: Prompt tokens per sequence at once, each
//     appended to the key/value caches.
//   - Decode runs one new token per sequence against the caches.
//
// Both hold the same params and caches (by name, with the same local
// shapes), so the runtime loads the weights into each and moves the
// caches from the prefill program to the decode program once per batch
// of prompts. Each outputs ir.OutputLogits whole on every device: the
// decode's [batch, vocab], and the prefill's [batch, vocab] for each
// prompt's last token, fed as ir.InputLastToken (or [batch·step, vocab]
// for a head the frontend cannot narrow).
type Generation struct {
	Prefill, Decode *lower.Program
	// PrefillPasses and DecodePasses are what the pass table did to each
	// module.
	PrefillPasses, DecodePasses []passes.Result
	// Batch is the sequences of one step, Prompt the prefill's tokens per
	// sequence and Context the positions each cache holds.
	Batch, Prompt, Context int
	// IgnoreOnLoad is the model's ir.Module.IgnoreOnLoad.
	IgnoreOnLoad []string
}

// Devices is the number of devices the programs span.
func (g *Generation) Devices() int {
	if g.Decode.Mesh == nil {
		return 1
	}
	return g.Decode.Mesh.Devices()
}

// Fingerprint identifies both programs (lower.Fingerprint).
func (g *Generation) Fingerprint() string { return lower.Fingerprint(g.Prefill, g.Decode) }

// CheckGenerationPlan refuses the parts of a validated plan that a
// generation step does not have yet: it is forward only, in fp32, over
// data and tensor parallelism.
func CheckGenerationPlan(c *Config) error {
	var bad []string
	rule := func(cond bool, format string, args ...any) {
		if cond {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	rule(c.PP > 1, "--pp %d: generation runs on data and tensor parallelism (dp, tp); a pipeline of one token per step is %v", c.PP, ErrNotYet)
	rule(c.EP > 1, "--ep %d: expert parallelism in generation is %v", c.EP, ErrNotYet)
	rule(c.CP > 1, "--cp %d: context parallelism in generation (a key/value cache split over cp) is %v", c.CP, ErrNotYet)
	rule(c.SequenceParallel, "--sequence-parallel: a decode step has one token per sequence, nothing to split over tp")
	rule(c.Zero > 0, "--zero %d: generation keeps no optimizer state or gradients to shard", c.Zero)
	rule(c.Precision != "" && c.Precision != "fp32", "--precision %s: generation runs in fp32; 16-bit generation is %v", c.Precision, ErrNotYet)
	rule(c.DPSync == "async", "--dp-sync async: generation has no updates to exchange")
	rule(c.Offload != "" && c.Offload != "none", "--offload %s: offloaded generation is %v", c.Offload, ErrNotYet)
	rule(c.Microbatches > 1 && !c.FilledMicrobatches, "--microbatches %d: generation runs every sequence of the batch in one step", c.Microbatches)
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "\n"))
	}
	return nil
}

// CompileGeneration builds the model twice for generation, at prompt
// tokens per step and at one, runs the pass table on each (the training
// passes skipped: passes.Options.Generate) and lowers both, for the plan
// of c, which Validate and CheckGenerationPlan must have accepted.
// batch is the sequences of one step: the plan's dp must divide it.
// context is the positions each key/value cache holds: the longest
// prompt plus the tokens to generate. hooks see the decode module around
// every pass (dumps). With c.MemLimit, a program that does not fit is an
// error naming the cache's size.
func CompileGeneration(c *Config, build ModelBuilder, batch, prompt, context int, hooks passes.Hooks) (*Generation, error) {
	if build == nil {
		if strings.HasSuffix(c.Model, ".gir") {
			return nil, fmt.Errorf("%s: a .gir dump is one compiled step; generation builds the model again from its model.go", c.Model)
		}
		build = c.modelBuilder()
	}
	g := &Generation{Batch: batch, Prompt: prompt, Context: context}
	if dp := max(c.DP, 1); batch%dp != 0 {
		return nil, fmt.Errorf("generation: %d sequences cannot be split over dp=%d", batch, dp)
	}
	var err error
	if g.Prefill, g.PrefillPasses, err = compileStep(c, build, batch, prompt, context, passes.Hooks{}, &g.IgnoreOnLoad); err != nil {
		var model modelError
		if errors.As(err, &model) {
			return nil, model.error // the model's own (a --set it does not read, a DSL error): no program's
		}
		return nil, fmt.Errorf("the prefill program (%d tokens per sequence): %w", prompt, err)
	}
	// Named by its role, also for a prompt of one token, whose prefill
	// is a decode step's shape.
	tokens := "tokens"
	if prompt == 1 {
		tokens = "token"
	}
	g.Prefill.Name = fmt.Sprintf("prefill (%d %s × %d sequences)", prompt, tokens, batch)
	if g.Decode, g.DecodePasses, err = compileStep(c, build, batch, 1, context, hooks, &g.IgnoreOnLoad); err != nil {
		return nil, fmt.Errorf("the decode program: %w", err)
	}
	if c.MemLimit > 0 {
		for _, p := range []*lower.Program{g.Prefill, g.Decode} {
			for r := range g.Devices() {
				if err := p.CheckFits(fmt.Sprintf("%s on device %d", p.Name, r), c.MemLimit); err != nil {
					return nil, fmt.Errorf("%w\n  the key/value cache is %s per device: %s", err, lower.HumanBytes(KVCacheBytes(p)), kvCacheShapes(p))
				}
			}
		}
	}
	return g, nil
}

// ModelBuilder builds the model's module for a frontend configuration:
// a model.go through the loader, or a model function in tests
// (frontend.Build).
type ModelBuilder func(frontend.Config) (*ir.Module, error)

// modelBuilder builds c's model.go through the loader with c's --set.
func (c *Config) modelBuilder() ModelBuilder {
	return func(fc frontend.Config) (*ir.Module, error) {
		set, err := frontend.ParseSet(c.Set)
		if err != nil {
			return nil, err
		}
		fc.Set = set
		fc.Name = c.ModelName()
		l := &loader.Loader{Timeout: c.ModelTimeout, Context: c.Interrupt}
		return l.Load(c.Model, fc)
	}
}

// modelError is an error of building the model itself, which the
// prefill and decode builds meet alike.
type modelError struct{ error }

func (e modelError) Unwrap() error { return e.error }

// compileStep builds, passes and lowers one generation step.
func compileStep(c *Config, build ModelBuilder, batch, step, context int, hooks passes.Hooks, ignore *[]string) (*lower.Program, []passes.Result, error) {
	m, err := build(frontend.Config{Batch: batch, Classes: c.Classes, Generate: &frontend.Generation{Step: step, Context: context}})
	if err != nil {
		return nil, nil, modelError{err}
	}
	// A model that reads its sequence length with Int rather than
	// Sequence records training's tokens, which no step of generation
	// feeds.
	if t := m.Source("tokens"); t != nil && (t.Type.Rank() != 2 || t.Type.Shape[1] != step) {
		return nil, nil, fmt.Errorf("%s: the model's tokens are %v, not [%d, %d]: read the sequence length with b.Sequence(…) rather than b.Int(\"seq\", …) so that a generation step can set it", t.Where(), t.Type, batch, step)
	}
	*ignore = m.IgnoreOnLoad
	o := c.PassOptions()
	o.Generate = true
	res, err := passes.Run(m, o, hooks)
	if err != nil {
		return nil, res, err
	}
	prog, err := lower.Lower(m)
	if err != nil {
		return nil, res, err
	}
	prog.Name = fmt.Sprintf("decode (1 token × %d sequences)", batch)
	return prog, res, nil
}

// KVCacheBytes is what one device of p holds in key/value caches.
func KVCacheBytes(p *lower.Program) int64 {
	var n int64
	for _, b := range p.Buffers {
		if b.KVCache() {
			n += b.Bytes
		}
	}
	return n
}

// kvCacheShapes says how the caches add up: layers × k and v × the local
// shape.
func kvCacheShapes(p *lower.Program) string {
	var n int
	var t ir.Type
	for _, b := range p.Buffers {
		if b.KVCache() {
			n++
			t = b.Type
		}
	}
	if n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d caches (k and v of %d layers) of %v [batch, kv_heads, context, head_dim] = %s each", n, n/2, t, lower.HumanBytes(t.Bytes()))
}
