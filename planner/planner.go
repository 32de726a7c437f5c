// Package planner chooses a parallel plan: it enumerates every valid
// (tp, pp, vpp, dp, microbatch size and count, ZeRO stage, sequence
// parallelism, recompute, offload) for a model, a device count, a global
// batch and a hardware description, prunes with the cost model's fast
// analytic estimate, and compiles the most promising plans with the
// compile driver so that what it reports — peak memory per device and the
// detailed predicted step — is the compiled plan's own.
//
// Why two stages: compiling a plan costs from milliseconds to seconds, and
// a large job has tens of thousands of candidates, so the search ranks by
// a closed-form estimate and pays for compiles only at the top. The
// estimate's memory is a lower bound (persistent bytes), so pruning on it
// never drops a plan that fits; whether a plan near the limit fits is
// decided by its compiled memory plan.
package planner

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/ir"
	"gcompile/passes"
)

// Request is what to plan for.
type Request struct {
	// Base is the user's configuration: the model, batch, devices and
	// every flag; an axis named in Base.Explicit is fixed at Base's value
	// ("tp", "pp", "dp", "ep", "vpp", "microbatches", "zero", "sequence-parallel",
	// "recompute", "offload", "schedule"); the others are searched.
	Base     compile.Config
	Hardware *cost.Hardware
	// Module is the model as the frontend built it (before any pass) at
	// Base.Batch; the planner reads its shape and compiles copies of it.
	Module *ir.Module
	// Shape stands in for Module when nothing is compiled (NoCompile):
	// planning a model too large to build quickly, from its shape alone.
	Shape *cost.Transformer
	// TopK is how many plans to compile and report (default 5); 0 with
	// NoCompile reports estimates only.
	TopK      int
	NoCompile bool
	// MemoryBytes is the memory per device (default: the hardware's).
	MemoryBytes int64
}

// Candidate is one plan and what is known of it.
type Candidate struct {
	Config   compile.Config
	Plan     cost.Plan
	Estimate *cost.Estimate
	// Prediction and PeakBytes (the largest device's compiled peak) are
	// set when the plan was compiled.
	Prediction *cost.Prediction
	PeakBytes  int64
	Compiled   bool
	// Rejected says why the plan was dropped ("" for a ranked plan).
	Rejected string
	// OverMemory: not compiled, and its estimate is over the device's
	// memory (only a compile can settle it). Such plans rank after every
	// plan that fits. NearMemory: not compiled, and its estimate is
	// within EstimateMargin below the memory, where the estimate's error
	// may hide an overflow: such plans rank after those further below.
	OverMemory, NearMemory bool
}

// EstimateMargin is how far the memory estimate of a plan not compiled
// may fall short of its compiled arena: on Llama 7B at 64 devices the
// estimate read 6–10 % under the compiled peak for some plans (and up to
// 17 % over for others), so an estimate within it of the device's memory
// does not say the plan fits.
const EstimateMargin = 0.10

// memoryClass ranks an estimate against the device's memory: 0 below
// it by more than EstimateMargin, 1 within that margin, 2 over it.
func memoryClass(estimate, capBytes int64) int {
	switch {
	case estimate > capBytes:
		return 2
	case float64(estimate) > (1-EstimateMargin)*float64(capBytes):
		return 1
	}
	return 0
}

// StepSeconds is the detailed prediction when compiled, else the
// estimate.
func (c *Candidate) StepSeconds() float64 {
	if c.Prediction != nil {
		return c.Prediction.StepSeconds
	}
	return c.Estimate.StepSeconds
}

// MemoryBytes is the compiled peak, or the estimate (0: neither).
func (c *Candidate) MemoryBytes() int64 {
	switch {
	case c.Compiled:
		return c.PeakBytes
	case c.Estimate == nil:
		return 0 // rejected before it was priced
	}
	return c.Estimate.MemoryEstimate
}

// Result is the search's outcome.
type Result struct {
	Shape cost.Transformer
	// Ranked are the reported plans, fastest first; Rejected the plans
	// dropped, each with its reason (memory, a compile error); Considered
	// counts every candidate enumerated.
	Ranked, Rejected []*Candidate
	Considered       int
	// RejectedCount counts every rejected candidate (Rejected keeps the
	// first maxRejected).
	RejectedCount int
	// rejectedBy counts every rejected candidate by its reason; closest
	// is the rejected one whose memory is least (the one nearest to
	// fitting when none fits).
	rejectedBy map[string]int
	closest    *Candidate
	// Pruned counts candidates dropped by the memory lower bound (their
	// reasons are in Rejected, up to a limit).
	Pruned int
	// MemoryBytes is the memory per device the plans were held to.
	MemoryBytes int64
	// Compiled counts the candidates compiled (0 without compiling).
	Compiled int
	// Params, Precision and Set are the model the plans are of (Params 0
	// for a shape alone), which a calibration from the table's rows
	// checks its model against.
	Params         int64
	Precision, Set string
}

// maxCompiles bounds the candidates one search compiles when none of
// those the estimate ranked best fits: each is a compile of the model.
const maxCompiles = 64

// ErrNoPlan is returned when no candidate survives.
var ErrNoPlan = errors.New("no plan fits")

// Plan runs the search.
func Plan(req Request) (*Result, error) {
	if req.Hardware == nil || req.Module == nil && (req.Shape == nil || !req.NoCompile) {
		return nil, fmt.Errorf("planner: a hardware description and a module (or, without compiling, a shape) are needed")
	}
	var shape cost.Transformer
	selective := true // a shape alone: assume the layer library's tags
	if req.Module != nil {
		var err error
		if shape, err = ShapeOf(req.Module); err != nil {
			return nil, err
		}
		selective = false
		for _, v := range req.Module.Values {
			if v.Meta.Selective {
				selective = true
				break
			}
		}
	} else {
		shape = *req.Shape
	}
	capBytes := req.MemoryBytes
	if capBytes <= 0 {
		capBytes = req.Hardware.MemoryBytes()
	}
	topK := req.TopK
	if topK <= 0 {
		topK = 5
	}
	res := &Result{Shape: shape, MemoryBytes: capBytes, Precision: req.Base.Precision, Set: req.Base.Set}
	if req.Module != nil {
		res.Params = compile.ParamCount(req.Module)
	}
	var feasible []*Candidate
	for _, cfg := range enumerate(req.Base, shape, req.Hardware, selective) {
		res.Considered++
		probe, why := admit(cfg, shape)
		c := &Candidate{Config: probe, Plan: planOf(probe), Rejected: why}
		if why != "" {
			res.reject(c)
			continue
		}
		e, err := req.Hardware.EstimateFast(shape, c.Plan)
		if err != nil {
			// The candidate is named beside its reason: the estimate's own
			// naming of it would make every candidate's reason its own,
			// and the one mistake of a fixed axis a line per candidate.
			c.Rejected = strings.TrimPrefix(err.Error(), fmt.Sprintf("plan %s: ", c.Plan))
			res.reject(c)
			continue
		}
		c.Estimate = e
		if e.MemoryLowerBound > capBytes {
			c.Rejected = fmt.Sprintf("params and optimizer state alone need %s per device, over the %s available", gib(e.MemoryLowerBound), gib(capBytes))
			res.Pruned++
			res.reject(c)
			continue
		}
		feasible = append(feasible, c)
	}
	// Plans whose estimate fits rank before those whose estimate does not
	// (which only a compile can settle); then by estimated step.
	sort.SliceStable(feasible, func(i, j int) bool {
		fi, fj := memoryClass(feasible[i].Estimate.MemoryEstimate, capBytes), memoryClass(feasible[j].Estimate.MemoryEstimate, capBytes)
		if fi != fj {
			return fi < fj
		}
		return feasible[i].Estimate.StepSeconds < feasible[j].Estimate.StepSeconds
	})
	if req.NoCompile {
		for i, c := range feasible {
			if i >= topK {
				break
			}
			// The simulator's pipeline step for the reported plans.
			if e, err := req.Hardware.Estimate(shape, c.Plan); err == nil {
				c.Estimate = e
			}
			class := memoryClass(c.Estimate.MemoryEstimate, capBytes)
			c.OverMemory, c.NearMemory = class == 2, class == 1
			res.Ranked = append(res.Ranked, c)
		}
	} else {
		gir, remove, err := compile.TempModuleFile(req.Module)
		if err != nil {
			return nil, err
		}
		defer remove()
		// try ranks c once compiled, or rejects it with why it does not
		// compile or fit.
		try := func(c *Candidate) {
			if err := compileCandidate(c, gir, req.Hardware, capBytes); err != nil {
				c.Rejected = err.Error()
				res.reject(c)
				return
			}
			res.Ranked = append(res.Ranked, c)
		}
		// A plan of thousands of microbatches (a large --batch over a
		// pipeline) takes minutes to compile, a block each: the search
		// leaves it out unless the count was pinned.
		if !req.Base.Explicit["microbatches"] && !req.Base.Explicit["micro-batch-size"] {
			feasible = slices.DeleteFunc(feasible, func(c *Candidate) bool {
				if c.Config.Microbatches <= MaxSearchedMicrobatches {
					return false
				}
				c.Rejected = fmt.Sprintf("more than %d microbatches, which the search does not compile (a block each); pin --microbatches or --micro-batch-size to compile such a plan", MaxSearchedMicrobatches)
				res.reject(c)
				return true
			})
		}
		// Each layout's best-estimated plan is compiled before a second
		// plan of any layout: the estimate ranks one layout's machinery
		// (ZeRO, offload, recompute) less well than the layouts, and the
		// top five were once all ZeRO and offload variants of one layout
		// that compiled slower than a layout none of them was.
		seen := map[layout]bool{}
		var order, later []*Candidate
		for _, c := range feasible {
			if k := layoutOf(c.Config); !seen[k] {
				seen[k] = true
				order = append(order, c)
			} else {
				later = append(later, c)
			}
		}
		feasible = append(order, later...)
		tries := 0
		for _, c := range feasible {
			if len(res.Ranked) >= topK || tries >= 3*topK {
				break
			}
			tries++
			try(c)
		}
		if len(res.Ranked) == 0 && tries < len(feasible) {
			// None of those the estimate ranked best fits once compiled
			// (its memory figure is rough near the limit): the rest, the
			// smallest by that figure first, until one does, so that
			// "no plan fits" is said only of plans compiled.
			var rest []*Candidate
			for _, c := range feasible[tries:] {
				// The estimate is rarely 2× off a compiled arena: plans
				// further over are not worth a compile each.
				if float64(c.Estimate.MemoryEstimate) <= 2*float64(capBytes) {
					rest = append(rest, c)
				}
			}
			sort.SliceStable(rest, func(i, j int) bool {
				return rest[i].Estimate.MemoryEstimate < rest[j].Estimate.MemoryEstimate
			})
			for _, c := range rest {
				if len(res.Ranked) > 0 || tries >= maxCompiles {
					break
				}
				tries++
				try(c)
			}
		}
		res.Compiled = tries
		// The estimate ranks the machinery (ZeRO, offload, recompute)
		// of one layout less well than the layouts themselves: the
		// best compiled layout is also compiled with less of it, up to
		// two variants, which then compete on their compiled prices for
		// the topK rows reported.
		rankPlans(res.Ranked)
		if len(res.Ranked) > 0 {
			best := res.Ranked[0]
			var variants []*Candidate
			for _, c := range feasible {
				if !c.Compiled && c.Rejected == "" && sameLayout(c.Config, best.Config) && machinery(c.Config) < machinery(best.Config) {
					variants = append(variants, c)
				}
			}
			sort.SliceStable(variants, func(i, j int) bool { return machinery(variants[i].Config) < machinery(variants[j].Config) })
			for _, c := range variants[:min(len(variants), 2)] {
				try(c)
			}
			rankPlans(res.Ranked)
			res.Ranked = res.Ranked[:min(len(res.Ranked), topK)]
		}
	}
	rankPlans(res.Ranked)
	if res.Considered == 0 {
		return res, fmt.Errorf("%w on %d devices: no candidate exists: %s", ErrNoPlan, req.Base.Devices, noCandidates(req.Base, shape))
	}
	if len(res.Ranked) == 0 {
		// The rules the fixed axes break by themselves come first: each
		// candidate's compile error says the same less directly.
		// A reason many candidates share (an option the user fixed that
		// no plan can take) is said once, with how many it rejected.
		why := append(fixedConflicts(req.Base, shape), res.rejectionReasons()...)
		if c := res.closest; c != nil && c.MemoryBytes() > capBytes {
			// The reasons come in the search's order: the plan that came
			// nearest is named, with how far it is.
			fixes := []string{"more devices"}
			if c.Config.Recompute != "full" {
				fixes = append(fixes, "--recompute full")
			}
			if !strings.Contains(c.Config.Offload, "params") {
				fixes = append(fixes, "--offload optimizer,params")
			}
			why = append(why, fmt.Sprintf("the closest to fitting, %s, needs %s per device, %.2f× the %s available (%s would lower it)",
				Describe(c.Config), gib(c.MemoryBytes()), float64(c.MemoryBytes())/float64(capBytes), gib(capBytes), strings.Join(fixes, ", ")))
		}
		searched := fmt.Sprintf("%d candidates", res.Considered)
		if res.Compiled > 0 {
			searched += fmt.Sprintf(", %d of them compiled", res.Compiled)
		}
		return res, fmt.Errorf("%w on %d devices (%s): %s", ErrNoPlan, req.Base.Devices, searched, strings.Join(why, "; "))
	}
	return res, nil
}

// rankPlans orders the plans that fit before those near the memory by
// their estimate (NearMemory) and those over it (OverMemory), then by
// predicted step, and plans within 0.1 % of one
// another (a step in tiers of 0.1 %, far finer than the cost model's
// accuracy) by how much machinery they use: the one without ZeRO, offload
// or recompute first. Ties otherwise fell to the last bits of the price,
// so the pick depended on how many plans were compiled.
func rankPlans(cs []*Candidate) {
	tier := func(c *Candidate) int64 { return int64(math.Floor(math.Log(c.StepSeconds()) / math.Log1p(1e-3))) }
	class := func(c *Candidate) int {
		switch {
		case c.OverMemory:
			return 2
		case c.NearMemory:
			return 1
		}
		return 0
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if ci, cj := class(cs[i]), class(cs[j]); ci != cj {
			return ci < cj
		}
		ti, tj := tier(cs[i]), tier(cs[j])
		if ti != tj {
			return ti < tj
		}
		return machinery(cs[i].Config) < machinery(cs[j].Config)
	})
}

// layout is how a plan splits the model and the batch (the axes,
// chunks, microbatches, schedule and sequence parallelism), whatever its
// ZeRO, offload and recompute.
type layout struct {
	tp, pp, dp, ep, cp, vpp, microbatches int
	cpImpl, schedule                      string
	sp                                    bool
}

func layoutOf(c compile.Config) layout {
	return layout{c.TP, c.PP, c.DP, c.EP, c.CP, c.VPP, c.Microbatches, c.CPImpl, c.Schedule, c.SequenceParallel}
}

// sameLayout says whether a and b split the model and the batch alike.
func sameLayout(a, b compile.Config) bool { return layoutOf(a) == layoutOf(b) }

// machinery scores what a plan adds to plain parallelism: ZeRO's stage,
// offload, recompute.
func machinery(c compile.Config) int {
	n := c.Zero
	if c.Offload != "" && c.Offload != "none" {
		n += 4
	}
	if c.Recompute != "" && c.Recompute != "none" {
		n += 2
	}
	return n
}

// CheckFixed refuses, before any search or calibration, the axes the
// user fixed that break a rule by themselves (fixedConflicts), as the
// search would once it had found no candidate.
func CheckFixed(base compile.Config, m *ir.Module) error {
	shape, err := ShapeOf(m)
	if err != nil {
		return err
	}
	if why := FixedConflicts(base, shape); len(why) > 0 {
		return fmt.Errorf("%w on %d devices: no candidate exists: %s", ErrNoPlan, base.Devices, strings.Join(why, "; "))
	}
	return nil
}

// CheckCandidates refuses, before a calibration's or a refinement's
// compiles, flags that leave no candidate the search could price: every
// one refused by the plan's own rules (--vpp without a pipeline, a
// schedule for pp 1, sequence parallelism without tp, ZeRO over a dp the
// hidden size does not split), as the search would say after them.
func CheckCandidates(base compile.Config, m *ir.Module, hw *cost.Hardware) error {
	shape, err := ShapeOf(m)
	if err != nil {
		return err
	}
	cands := enumerate(base, shape, hw, true)
	if len(cands) == 0 {
		return fmt.Errorf("%w on %d devices: no candidate exists: %s", ErrNoPlan, base.Devices, noCandidates(base, shape))
	}
	res := &Result{}
	for _, cfg := range cands {
		probe, why := admit(cfg, shape)
		if why == "" {
			return nil
		}
		res.reject(&Candidate{Config: probe, Rejected: why})
	}
	return fmt.Errorf("%w on %d devices (%d candidates): %s", ErrNoPlan, base.Devices, len(cands), strings.Join(res.rejectionReasons(), "; "))
}

// admit validates a candidate as the compiler would before any pricing:
// the config Validate completes (cfg itself when it fails), and why it
// cannot run, "" when it can.
func admit(cfg compile.Config, t cost.Transformer) (compile.Config, string) {
	probe := cfg
	probe.Explicit = map[string]bool{}
	maps.Copy(probe.Explicit, cfg.Explicit)
	if err := probe.Validate(); err != nil {
		return cfg, firstLine(err)
	}
	return probe, zeroSplit(t, planOf(probe))
}

// rejectionReasons says why the candidates were rejected: a reason many
// share (an option the user fixed that no plan can take) once, with how
// many it rejected, five reasons at most.
func (r *Result) rejectionReasons() []string {
	var reasons, why []string
	first := map[string]*Candidate{}
	for _, c := range r.Rejected {
		if first[c.Rejected] == nil {
			first[c.Rejected] = c
			reasons = append(reasons, c.Rejected)
		}
	}
	listed := 0
	for i, reason := range reasons {
		if i >= 5 {
			why = append(why, fmt.Sprintf("… and %d more reasons", len(reasons)-i))
			break
		}
		n := r.rejectedBy[reason]
		listed += n
		switch {
		case n == r.RejectedCount:
			why = append(why, fmt.Sprintf("every candidate: %s", reason))
		case n > 1:
			why = append(why, fmt.Sprintf("%s and %d more: %s", Describe(first[reason].Config), n-1, reason))
		default:
			why = append(why, fmt.Sprintf("%s: %s", Describe(first[reason].Config), reason))
		}
	}
	if rest := r.RejectedCount - listed; rest > 0 && len(reasons) <= 5 {
		why = append(why, fmt.Sprintf("%d more candidates for other reasons", rest))
	}
	return why
}

// FixedConflicts are the rules the axes marked explicit in base break by
// themselves against a model of shape t (tp dividing its heads, pp its
// layers, …), each naming its flag and the figure it must fit.
func FixedConflicts(base compile.Config, t cost.Transformer) []string {
	return fixedConflicts(base, t)
}

// noCandidates says why the search had nothing to try: the rules every
// candidate's degrees must meet, with the ones the user fixed.
func noCandidates(base compile.Config, t cost.Transformer) string {
	if why := fixedConflicts(base, t); len(why) > 0 {
		return strings.Join(why, "; ")
	}
	var fixed []string
	for _, f := range []struct {
		name string
		v    int
	}{{"tp", base.TP}, {"pp", base.PP}, {"dp", base.DP}, {"ep", base.EP}, {"cp", base.CP}, {"vpp", base.VPP}, {"microbatches", base.Microbatches}} {
		if base.Explicit[f.name] {
			fixed = append(fixed, fmt.Sprintf("--%s %d", f.name, f.v))
		}
	}
	given := ""
	if len(fixed) > 0 {
		given = " with " + strings.Join(fixed, ", ") + " as given"
	}
	return fmt.Sprintf("no tp·pp·dp·ep·cp = %d%s has tp dividing the %d heads, the FFN width %d and the vocabulary %d, pp dividing the %d layers, and dp·ep dividing --batch %d (give a --devices or --batch with more divisors)",
		base.Devices, given, t.Heads, t.FFN, t.Vocab, t.Layers, base.Batch)
}

// fixedConflicts are the rules the axes the user fixed break by
// themselves, whatever the planner chooses for the others: each names
// its flags and the figure it must fit.
func fixedConflicts(base compile.Config, t cost.Transformer) []string {
	fixed := func(name string) bool { return base.Explicit[name] }
	var why []string
	if k, ok := strings.CutPrefix(base.Recompute, "every="); ok && t.Layers > 0 {
		// The recompute pass would refuse it in every candidate's compile.
		if _, err := passes.SegmentLayers(k, t.Layers); err != nil {
			why = append(why, err.Error())
		}
	}
	if k, ok := strings.CutPrefix(base.Recompute, "block="); ok && t.Layers > 0 {
		if _, err := passes.BlockLayers(k, t.Layers); err != nil {
			why = append(why, err.Error())
		}
	}
	prod, names, vals, all := 1, []string{}, []string{}, true
	for _, a := range []struct {
		name string
		v    int
	}{{"tp", base.TP}, {"pp", base.PP}, {"dp", base.DP}, {"ep", base.EP}, {"cp", base.CP}} {
		if !fixed(a.name) {
			all = false
			continue
		}
		prod *= max(a.v, 1)
		names, vals = append(names, a.name), append(vals, fmt.Sprint(max(a.v, 1)))
	}
	given := fmt.Sprintf("%s = %s = %d as given", strings.Join(names, "·"), strings.Join(vals, "·"), prod)
	if len(names) == 1 {
		given = fmt.Sprintf("--%s %d as given", names[0], prod)
	}
	switch {
	case len(names) > 0 && all && prod != base.Devices:
		why = append(why, fmt.Sprintf("%s must equal --devices %d", given, base.Devices))
	case len(names) > 0 && base.Devices%prod != 0:
		why = append(why, fmt.Sprintf("%s must divide --devices %d", given, base.Devices))
	}
	if fixed("tp") && base.TP > 1 {
		for _, d := range []struct {
			what string
			n    int
		}{{"heads", t.Heads}, {"FFN width", t.FFN}, {"vocabulary", t.Vocab}} {
			if d.n > 0 && d.n%base.TP != 0 {
				why = append(why, fmt.Sprintf("--tp %d does not divide the model's %d %s", base.TP, d.n, d.what))
			}
		}
	}
	if fixed("pp") && base.PP > 1 {
		if chunks := base.PP * max(base.VPP, 1); t.Layers > 0 && t.Layers%chunks != 0 {
			why = append(why, fmt.Sprintf("pp·vpp = %d as given does not divide the model's %d layers", chunks, t.Layers))
		}
	}
	if fixed("dp") || fixed("ep") {
		if r := max(base.DP, 1) * max(base.EP, 1); base.Batch%r != 0 {
			name := "dp·ep"
			switch {
			case !fixed("ep"):
				name = "dp"
			case !fixed("dp"):
				name = "ep"
			}
			why = append(why, fmt.Sprintf("%s = %d as given does not divide --batch %d", name, r, base.Batch))
		}
	}
	if per := base.Microbatches * base.MicroBatchSize; fixed("microbatches") && fixed("micro-batch-size") && !fixed("dp") && per > 0 && base.Batch%per != 0 {
		why = append(why, fmt.Sprintf("--microbatches %d × --micro-batch-size %d = %d sequences a data-parallel rank, and no dp·ep makes --batch %d of them (give one of them)", base.Microbatches, base.MicroBatchSize, per, base.Batch))
	}
	if r := max(base.DP, 1) * max(base.EP, 1); fixed("microbatches") && fixed("micro-batch-size") && fixed("dp") && (fixed("ep") || t.Experts == 0) && base.Microbatches*base.MicroBatchSize*r != base.Batch {
		why = append(why, fmt.Sprintf("--microbatches %d and --micro-batch-size %d disagree over dp·ep = %d: their product is %d sequences a step, --batch is %d (give one of them)", base.Microbatches, base.MicroBatchSize, r, base.Microbatches*base.MicroBatchSize*r, base.Batch))
	}
	return why
}

// maxRejected bounds the reasons kept: a large search rejects thousands.
const maxRejected = 200

// zeroSplit is why the compiler would refuse p's ZeRO stage on shape t,
// "" when it would not: ZeRO splits every param over dp along a dim dp
// divides (passes.sharder.zeroPlace), and a norm's weight has one dim, the
// hidden size. The estimate alone would price the plan, and a search that
// does not compile (large models) offered it.
func zeroSplit(t cost.Transformer, p cost.Plan) string {
	if p.Zero == 0 || p.DP <= 1 || t.Hidden%p.DP == 0 {
		return ""
	}
	return fmt.Sprintf("ZeRO-%d splits every param over dp=%d along a dim dp divides, and hidden %d (a norm weight's only dim) is not a multiple of %d", p.Zero, p.DP, t.Hidden, p.DP)
}

func (r *Result) reject(c *Candidate) {
	r.RejectedCount++
	if r.rejectedBy == nil {
		r.rejectedBy = map[string]int{}
	}
	r.rejectedBy[c.Rejected]++
	if m := c.MemoryBytes(); m > r.MemoryBytes && (r.closest == nil || m < r.closest.MemoryBytes()) {
		r.closest = c // over the memory, the nearest
	}
	if len(r.Rejected) < maxRejected {
		r.Rejected = append(r.Rejected, c)
	}
}

// compileCandidate compiles the plan from the module's .gir with the
// compile driver, records the largest device's peak and prices the
// programs in detail.
func compileCandidate(c *Candidate, gir string, hw *cost.Hardware, capBytes int64) error {
	cfg := c.Config
	cfg.Model = gir
	cfg.Set = ""
	cfg.Explicit = map[string]bool{}
	cfg.MemLimit = 0
	res, err := compile.Compile(&cfg, passes.Hooks{})
	if err != nil {
		// The search's own copy of the module is no file of the user's:
		// its line ("(/tmp/gcompile-module-…/model.gir:4)") goes, the
		// model's own position stays.
		return fmt.Errorf("compile: %s", strings.ReplaceAll(firstLine(err), gir, "the built module"))
	}
	// What must fit is each device's arena (lower.Program.CheckFits, as
	// --device-memory checks a run): the live bytes at the peak plus what
	// the memory plan's placement leaves between them.
	var peak, arena int64
	for r := range res.Devices() {
		p := res.ProgramOf(r)
		peak, arena = max(peak, p.PeakBytes), max(arena, p.ArenaBytes)
	}
	c.PeakBytes, c.Compiled = peak, true
	if arena > capBytes {
		return fmt.Errorf("the compiled plan's arena is %s per device (%s live at the peak), over the %s available", gib(arena), gib(peak), gib(capBytes))
	}
	pred, err := hw.Predict(res.Programs, res.Schedule)
	if err != nil {
		return err
	}
	c.Prediction = pred
	return nil
}

// MaxSearchedMicrobatches is the most microbatches of a plan the search
// compiles when --microbatches is not pinned.
const MaxSearchedMicrobatches = 256

// planOf is the cost model's view of a configuration.
func planOf(c compile.Config) cost.Plan {
	dp, ep := max(c.DP, 1), max(c.EP, 1)
	m := max(c.Microbatches, 1)
	return cost.Plan{TP: max(c.TP, 1), PP: max(c.PP, 1), DP: dp, EP: ep, CP: max(c.CP, 1), CPImpl: c.CPImpl, CPLayout: c.CPLayout, VPP: max(c.VPP, 1),
		MicroBatch: max(c.Batch/dp/ep/m, 1), Microbatches: m, Zero: c.Zero,
		SequenceParallel: c.SequenceParallel, Recompute: c.Recompute, Offload: c.Offload,
		Precision: c.Precision, Schedule: c.Schedule, Optimizer: c.Optimizer, BucketBytes: c.BucketMB * (1 << 20), SerialReductions: c.SerialGradReduce,
		GradReduceBytes: gradReduceBytes(c.GradReduceDType),
		Compress:        c.Compress, OffloadPrefetch: c.OffloadPrefetch}
}

// gradReduceBytes is the bytes of a gradient element --grad-reduce-dtype
// reduces: 2 for a 16-bit format, else 0 (the cost model's fp32).
func gradReduceBytes(dtype string) float64 {
	if dtype == "bf16" || dtype == "fp16" {
		return 2
	}
	return 0
}

// Describe is a plan in the flags' words.
func Describe(c compile.Config) string {
	s := fmt.Sprintf("tp=%d pp=%d dp=%d", max(c.TP, 1), max(c.PP, 1), max(c.DP, 1))
	if c.EP > 1 {
		s += fmt.Sprintf(" ep=%d", c.EP)
	}
	if c.CP > 1 {
		s += fmt.Sprintf(" cp=%d", c.CP)
		switch {
		case c.CPImpl == "all2all":
			s += " all2all"
		case c.CPLayout == "contiguous":
			s += " contiguous" // the ring's zigzag layout is the default
		}
	}
	if c.VPP > 1 {
		s += fmt.Sprintf(" vpp=%d", c.VPP)
	}
	if c.PP > 1 && c.Schedule != "" && c.Schedule != "1f1b" && c.Schedule != "interleaved" {
		// 1F1B, or interleaved where vpp says so, unless named.
		s += " " + c.Schedule
	}
	// Divided in turn: the product of a measured row's axes may overflow.
	s += fmt.Sprintf(" mb=%d×%d", max(c.Batch/max(c.DP, 1)/max(c.EP, 1)/max(c.Microbatches, 1), 1), max(c.Microbatches, 1))
	if c.Zero > 0 {
		s += fmt.Sprintf(" zero=%d", c.Zero)
	}
	if c.SequenceParallel {
		s += " sp"
	}
	if c.Recompute != "" && c.Recompute != "none" {
		s += " rc=" + c.Recompute
	}
	if c.Offload != "" && c.Offload != "none" {
		s += " offload=" + c.Offload
	}
	return s
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func gib(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/1024) // as lower.HumanBytes rounds it, so the table and the pick line agree
}
