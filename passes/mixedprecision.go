package passes

import (
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// Names of the mixed-precision pass's input and output: ir's, kept for
// callers that read them from passes.
const (
	// InputLossScale is the f32 scalar loss scale the runtime feeds each
	// step (runtime.LossScaler); it replaces autodiff's seed dloss = 1.
	InputLossScale = ir.InputLossScale
	// OutputNonFinite counts the inf and NaN elements of the unscaled
	// gradients; when it is not 0 the step changed nothing.
	OutputNonFinite = ir.OutputNonFinite
)

// mixedPrecision rewrites the forward and backward to run in fp16 or bf16
// (Micikevicius et al. 2018) after the optimizer has been built on fp32
// master weights:
//
//   - every fwd/bwd op that reads a weight (a param, or PipeDream-2BW's
//     previous version) or a 16-bit value runs in the 16-bit dtype; each
//     fp32 argument it reads is cast down once (a param's cast sits in the
//     forward, so the weight copy is made once per step);
//   - ops of precision class ir.PrecisionF32 in the op table (cross_entropy
//     and its gradient), and ops the model keeps in fp32 (Meta.Precision,
//     b.KeepFP32 in the DSL: a router, say) with their gradients, take
//     fp32 arguments and give fp32 results; values
//     that depend on no weight (the batch inputs, the loss mean over
//     microbatches) stay fp32;
//   - an op's arguments the table lists in F32Args (the attention
//     gradients' log-sum-exp statistics) are read in fp32 even by a
//     16-bit op: a 16-bit copy of a log-sum-exp would be off by up to a
//     few percent in every probability recomputed from it;
//   - autodiff's seed dloss = 1 becomes the f32 input loss_scale, so every
//     gradient is scaled; the optimizer reads each gradient cast to fp32
//     and multiplied by 1/loss_scale, before the global norm and clipping;
//   - nonfinite_count over the unscaled gradients is output as
//     nonfinite_grads, and every param and state update is gated by
//     where_finite: a step whose gradients hold an inf or NaN leaves all
//     params and optimizer state bit-identical, so no inf/NaN can reach
//     the master weights.
//
// On the CPU backend the 16-bit ops are emulated: kernels compute in fp32
// (fp32 GEMM accumulators, softmax and LayerNorm statistics, reductions)
// and round each result to the 16-bit format. Outputs the runtime reads
// are cast back to fp32. With Precision "fp32" (or "") the pass does nothing.
func mixedPrecision(m *ir.Module, o *Options) error {
	var low ir.DType
	switch o.Precision {
	case "fp16":
		low = ir.F16
	case "bf16":
		low = ir.BF16
	default:
		return nil
	}
	params := m.Params()
	for _, p := range params {
		if p.Type.DType != ir.F32 {
			return fmt.Errorf("%s: mixed precision needs fp32 master weights, %q is %v", p.Where(), p.Name(), p.Type)
		}
	}
	seed := autodiffSeed(m.Values)
	if seed == nil {
		return fmt.Errorf("module %q: cannot find autodiff's loss-gradient seed (a bwd const 1 before any other backward value)", m.Name)
	}
	if seed.Type.DType != ir.F32 {
		return fmt.Errorf("%s: mixed precision needs an fp32 loss, got %v", seed.Where(), seed.Type)
	}
	if s := m.Source(ir.InputLossScale); s != nil {
		return fmt.Errorf("%s: name %q is reserved for mixed precision", s.Where(), ir.InputLossScale)
	}

	b := &mpBuilder{m: m, low: low, rep: map[*ir.Value]*ir.Value{}, casts: map[castKey]*ir.Value{},
		scaled: map[*ir.Value]bool{}, unscaled: map[*ir.Value]*ir.Value{}, inv: map[[2]int]*ir.Value{}}
	prevCasts, err := lowPrevWeights(m, low)
	if err != nil {
		return err
	}
	old := m.Values
	m.Values = make([]*ir.Value, 0, len(old)*5/4)
	var grads []*ir.Value // unscaled fp32 gradients, in first-use order
	seen := map[*ir.Value]bool{}
	for _, v := range old {
		if v == seed {
			ls, err := m.AddSource("input", ir.T(ir.F32), ir.Attrs{"name": ir.InputLossScale}, seed.Meta, seed.Pos)
			if err != nil {
				return err
			}
			b.rep[seed] = ls
			b.lossScale = ls
			b.scaled[ls] = true
			continue
		}
		info, _ := ir.Lookup(v.Op)
		if info.Source {
			m.Values = append(m.Values, v)
			continue
		}
		args := make([]*ir.Value, len(v.Args))
		for i, a := range v.Args {
			if r := b.rep[a]; r != nil {
				a = r
			}
			args[i] = a
		}
		switch v.Meta.Phase {
		case ir.PhaseOpt:
			for i, a := range args {
				if b.scaled[a] || a.Type.DType == low {
					args[i] = b.unscale(a, v)
					if !seen[args[i]] && b.scaled[a] {
						seen[args[i]] = true
						grads = append(grads, args[i])
					}
				}
			}
		default:
			toLow := false
			if info.Precision != ir.PrecisionF32 && v.Meta.Precision != ir.F32 {
				for _, a := range args {
					if a.Type.DType == low || (a.Op == "param" || a.Op == "state") && a.Type.DType == ir.F32 {
						toLow = true
					}
				}
			}
			for i, a := range args {
				switch {
				case toLow && a.Type.DType == ir.F32 && slices.Contains(info.F32Args, i):
					// fp32 statistics the op reads as they are.
				case toLow && a.Type.DType == ir.F32:
					args[i] = b.cast(a, low, v)
				case !toLow && a.Type.DType == low && v.Meta.Phase == ir.PhaseBwd && v.Meta.Micro < 0:
					// A microbatch's gradient summed over microbatches
					// (the microbatch pass's fp32 sums): copied as soon as
					// it is made, where ZeRO-2/3 reduce-scatter it.
					args[i] = b.gradCast(a, v)
				case !toLow && a.Type.DType == low:
					args[i] = b.cast(a, ir.F32, v)
				}
			}
		}
		for _, a := range args {
			if b.scaled[a] && v.Meta.Phase != ir.PhaseOpt {
				b.scaled[v] = true
			}
		}
		if b.err != nil {
			return b.err
		}
		t, err := ir.InferType(info, args, v.Attrs)
		if err != nil {
			return fmt.Errorf("%s: in %v: %w", v.Where(), low, err)
		}
		v.Args, v.Type = args, t
		m.Values = append(m.Values, v)
	}
	for i, out := range m.Outputs {
		v := out.Value
		if r := b.rep[v]; r != nil {
			v = r
		}
		if v.Type.DType == low {
			v = b.cast(v, ir.F32, v)
		}
		m.Outputs[i].Value = v
	}
	if len(grads) == 0 {
		placeBeforeGates(m, prevCasts)
		return b.err
	}
	// Each gradient's fp32 copy is made as soon as the gradient is, in the
	// backward, not where the optimizer first reads it: the data-parallel
	// reduction sits on that copy (passes.shard), and a bucket of them
	// must be complete before anything reads one.
	m.Hoist(b.gradCasts...)
	// Each gradient's unscaling runs on its param's pipeline chunk, so the
	// gradients are their own owners: every chunk counts its own and only
	// scalar partials meet on the first param's chunk.
	ob := &optBuilder{m: m, at: params[0]}
	first := len(m.Values)
	count := perStage(ob, "nonfinite_count", grads, grads)
	if ob.err != nil {
		return ob.err
	}
	m.SetOutput(ir.OutputNonFinite, count)
	for i, u := range m.Updates {
		meta := u.Value.Meta
		meta.Phase = ir.PhaseOpt
		g, err := m.Add("where_finite", []*ir.Value{count, u.Value, u.State}, nil, meta, u.State.Pos)
		if err != nil {
			return err
		}
		m.Updates[i].Value = g
	}
	// The count runs once the last gradient is unscaled and each gate
	// right after its update, which it then writes over the state in
	// place (ir's where_finite): appended after every update, the gates
	// would keep each param's and state's new value alive at once, as
	// much again as the params and optimizer state.
	m.Hoist(slices.Clone(m.Values[first:])...)
	placeBeforeGates(m, prevCasts)
	return b.err
}

// lowPrevWeights keeps PipeDream-2BW's previous weights in the 16-bit
// dtype the forward and backward read them in (PipeDream-2BW keeps its
// stashed version in the compute precision): each step the optimizer
// casts the param down just before its update, and the state takes that
// copy. The values are the ones an fp32 version cast down in the forward
// would give, to the bit, for 2 bytes a param rather than 4 kept and 2
// more cast every step. It returns each cast by the update it feeds.
func lowPrevWeights(m *ir.Module, low ir.DType) (map[*ir.Value]*ir.Value, error) {
	// A version some op reads in fp32 (a router the model keeps in fp32)
	// stays fp32.
	readF32 := map[*ir.Value]bool{}
	for _, v := range m.Values {
		info, _ := ir.Lookup(v.Op)
		if v.Meta.Phase == ir.PhaseOpt || info.Source {
			continue
		}
		for i, a := range v.Args {
			if info.Precision == ir.PrecisionF32 || v.Meta.Precision == ir.F32 || slices.Contains(info.F32Args, i) {
				readF32[a] = true
			}
		}
	}
	casts := map[*ir.Value]*ir.Value{}
	for i, u := range m.Updates {
		s := u.State
		if !strings.HasPrefix(s.Name(), ir.PrevPrefix) || s.Type.DType != ir.F32 || u.Value.Op != "param" || readF32[s] {
			continue
		}
		meta := u.Value.Meta
		meta.Phase = ir.PhaseOpt
		c, err := m.NewValue("cast", []*ir.Value{u.Value}, ir.Attrs{"to": low.String()}, meta, u.Value.Pos)
		if err != nil {
			return nil, err
		}
		s.Type.DType = low
		m.Updates[i].Value = c
		casts[s] = c
	}
	return casts, nil
}

// placeBeforeGates puts each previous weight's cast (casts, by state)
// right before the value that updates its state: after the gradients are
// counted, where the update writes the copy straight into the state, and
// before the param's own update overwrites what it reads.
func placeBeforeGates(m *ir.Module, casts map[*ir.Value]*ir.Value) {
	if len(casts) == 0 {
		return
	}
	before := map[*ir.Value]*ir.Value{}
	for _, u := range m.Updates {
		if c := casts[u.State]; c != nil {
			before[u.Value] = c
		}
	}
	values := make([]*ir.Value, 0, len(m.Values)+len(casts))
	for _, v := range m.Values {
		if c := before[v]; c != nil {
			values = append(values, c)
			delete(before, v)
		}
		values = append(values, v)
	}
	// Without gates (no gradient to count) the casts end the step, after
	// the params' updates: an update that reads its param before the cast
	// does is then not done in place, and the cast reads the old value.
	for _, u := range m.Updates {
		if c := before[u.Value]; c != nil {
			values = append(values, c)
		}
	}
	m.Values = values
}

type castKey struct {
	v  *ir.Value
	to ir.DType
}

type mpBuilder struct {
	m         *ir.Module
	low       ir.DType
	lossScale *ir.Value               // the loss_scale input that replaced the seed
	rep       map[*ir.Value]*ir.Value // replaced values (the seed)
	casts     map[castKey]*ir.Value
	scaled    map[*ir.Value]bool // values multiplied by the loss scale
	unscaled  map[*ir.Value]*ir.Value
	inv       map[[2]int]*ir.Value // 1/loss_scale per (stage, chunk)
	gradCasts []*ir.Value          // the gradients' fp32 copies unscale made
	err       error
}

// cast returns a's value in dtype to, made once. The cast takes a's
// metadata; a source's (a weight's) cast runs in the phase of its first
// user, the forward.
func (b *mpBuilder) cast(a *ir.Value, to ir.DType, user *ir.Value) *ir.Value {
	k := castKey{a, to}
	if c := b.casts[k]; c != nil {
		return c
	}
	meta := a.Meta
	if info, _ := ir.Lookup(a.Op); info.Source && a.Op != "const" {
		meta.Phase = user.Meta.Phase
		if meta.Phase == ir.PhaseOpt {
			meta.Phase = ir.PhaseBwd
		}
	}
	c, err := b.m.Add("cast", []*ir.Value{a}, ir.Attrs{"to": to.String()}, meta, a.Pos)
	if err != nil && b.err == nil {
		b.err = err
	}
	b.casts[k] = c
	b.scaled[c] = b.scaled[a]
	return c
}

// gradCast is gradient g's fp32 copy for user, made once; a copy made
// here is hoisted to where g is made (gradCasts).
func (b *mpBuilder) gradCast(g, user *ir.Value) *ir.Value {
	made := b.casts[castKey{g, ir.F32}] == nil
	x := b.cast(g, ir.F32, user)
	if made {
		b.gradCasts = append(b.gradCasts, x)
	}
	return x
}

// unscale is gradient g in fp32 divided by the loss scale, for the
// optimizer op user.
func (b *mpBuilder) unscale(g, user *ir.Value) *ir.Value {
	if u := b.unscaled[g]; u != nil {
		return u
	}
	x := g
	if x.Type.DType != ir.F32 {
		x = b.gradCast(g, user)
	}
	if !b.scaled[g] || b.err != nil {
		return x
	}
	meta := user.Meta
	key := [2]int{meta.Stage, meta.Chunk}
	inv := b.inv[key]
	if inv == nil {
		one, err := b.m.AddSource("const", ir.T(ir.F32), ir.Attrs{"value": 1.0}, meta, user.Pos)
		if err != nil {
			b.err = err
			return nil
		}
		if inv, err = b.m.Add("div", []*ir.Value{one, b.lossScale}, nil, meta, user.Pos); err != nil {
			b.err = err
			return nil
		}
		b.inv[key] = inv
	}
	u, err := b.m.Add("scale", []*ir.Value{x, inv}, nil, meta, user.Pos)
	if err != nil {
		b.err = err
		return nil
	}
	b.unscaled[g] = u
	return u
}
