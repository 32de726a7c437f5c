package passes

import (
	"fmt"
	"strings"

	"gcompile/ir"
)

// Names of the optimizer's inputs and outputs the runtime feeds and reads:
// ir's, kept for callers that read them from passes.
const (
	InputLR       = ir.InputLR        // scalar of the params' dtype: learning rate of this step (the runtime's schedule)
	InputStep     = ir.InputStep      // i64 scalar: 1-based step number (Adam bias correction)
	OutputGradNrm = ir.OutputGradNorm // global gradient L2 norm before clipping
)

// optimizer appends, for every param, the update the chosen optimizer makes
// from the param's gradient, and lists param and state updates in the
// module. Params are the fp32 master weights; optimizer state (Adam's m and
// v, SGD's momentum buffer, Adafactor's and SM3's accumulators) is fp32
// state named after its param. With ClipNorm > 0 all gradients are first
// scaled by min(1, c/‖g‖) with ‖g‖ the global L2 norm, as
// torch.nn.utils.clip_grad_norm_ does. The gradient outputs are consumed
// and removed, so gradients need not outlive the step.
func optimizer(m *ir.Module, o *Options) error {
	params := m.Params()
	if len(params) == 0 {
		return fmt.Errorf("module %q has no params to optimise", m.Name)
	}
	grads := make([]*ir.Value, len(params))
	outs := m.OutputsByName() // m.Output per param searched every output
	for i, p := range params {
		if grads[i] = outs[ir.GradPrefix+p.Name()]; grads[i] == nil {
			return fmt.Errorf("%s: no gradient output %q (autodiff must run first)", p.Where(), ir.GradPrefix+p.Name())
		}
	}
	ob := &optBuilder{m: m, at: params[0], names: map[string]bool{}}
	for _, v := range m.Values {
		if n := v.Name(); n != "" {
			ob.names[n] = true
		}
	}
	// The learning rate has the master weights' dtype (f32, or f64 in reference runs).
	lr := ob.source("input", ir.T(params[0].Type.DType), ir.Attrs{"name": ir.InputLR})
	step := ob.source("input", ir.T(ir.I64), ir.Attrs{"name": ir.InputStep})
	sumsq := perStage(ob, "sum_squares", params, grads)
	m.SetOutput(ir.OutputGradNorm, ob.op("sqrt", nil, sumsq))
	if o.ClipNorm > 0 {
		coef := ob.op("clip_coef", ir.Attrs{"max_norm": o.ClipNorm}, sumsq)
		for i, g := range grads {
			ob.at = params[i]
			grads[i] = ob.op("scale", nil, g, coef)
		}
	}
	if o.TwoBW {
		if err := twoBW(m, ob, params); err != nil {
			return err
		}
	}
	for i, p := range params {
		ob.at = p
		g := grads[i]
		wd := 0.0
		if p.Type.Rank() >= 2 {
			wd = o.WeightDecay
		}
		switch o.Optimizer {
		case "adamw":
			mState := ob.state(ir.AdamMPrefix+p.Name(), p.Type)
			vState := ob.state(ir.AdamVPrefix+p.Name(), p.Type)
			m1 := ob.op("adam_m", ir.Attrs{"beta1": o.Beta1}, mState, g)
			v1 := ob.op("adam_v", ir.Attrs{"beta2": o.Beta2}, vState, g)
			p1 := ob.op("adamw", ir.Attrs{"beta1": o.Beta1, "beta2": o.Beta2, "eps": o.Eps, "wd": wd}, p, m1, v1, lr, step)
			ob.update(mState, m1)
			ob.update(vState, v1)
			ob.update(p, p1)
		case "sgd":
			buf := ob.state(ir.SGDMomentumPrefix+p.Name(), p.Type)
			buf1 := ob.op("sgd_buf", ir.Attrs{"momentum": o.Momentum, "wd": wd}, buf, g, p)
			ob.update(buf, buf1)
			ob.update(p, ob.op("sgd", nil, p, buf1, lr))
		case "adafactor":
			adafactor(ob, p, g, step)
		case "sm3":
			sm3(ob, p, g, lr)
		}
	}
	if ob.err != nil {
		return ob.err
	}
	kept := m.Outputs[:0]
	for _, out := range m.Outputs {
		if !strings.HasPrefix(out.Name, ir.GradPrefix) {
			kept = append(kept, out)
		}
	}
	m.Outputs = kept
	return nil
}

// Adafactor's constants: the defaults of Shazeer & Stern (2018). They
// are attributes of the ops, so a dump shows them.
const (
	adafactorEps1    = 1e-30 // ε₁, added to G² so that no accumulator is 0
	adafactorEps2    = 1e-3  // ε₂, the smallest parameter scale: zero-initialised params still move
	adafactorDecay   = 0.8   // β̂₂ₜ = 1 − t^(−0.8): no history at t = 1, hence no bias correction
	adafactorClip    = 1.0   // d: the update is scaled down to RMS ≤ d
	adafactorRelStep = 1e-2  // ρₜ = min(1e-2, 1/√t)
)

// adafactor emits Shazeer & Stern's Adafactor with β1 = 0 (no first
// moment, the paper's memory-saving setting), update clipping and relative
// step sizes (their Algorithms 4 and 5):
//
//	β̂₂ₜ = 1 − t^(−0.8)
//	R ← β̂₂ₜ·R + (1−β̂₂ₜ)·(G²+ε₁)·1ₘ, C ← β̂₂ₜ·C + (1−β̂₂ₜ)·1ₙᵀ·(G²+ε₁)
//	V̂ = R·C/(1ₙᵀR), U = G/√V̂, Û = U/max(1, RMS(U)/d)
//	X ← X − αₜ·Û, αₜ = max(ε₂, RMS(X))·min(10⁻², 1/√t)
//
// A matrix keeps only its row sums R ("adafactor.row:NAME", n floats) and
// column sums C ("adafactor.col:NAME", m floats): 4·(n+m) bytes of state
// instead of Adam's 8·n·m. Every other rank (vectors, scalars, and tensors
// of rank > 2, which are not factored yet) keeps the full second moment
// "adafactor.v/NAME" (the paper's Algorithm 5).
//
// The step size is relative to the param's own scale, so the learning rate
// input (the runtime's --lr schedule) does not apply, as with Hugging
// Face's Adafactor(relative_step=True); ρₜ is the schedule. Neither paper
// uses weight decay and none is applied: WeightDecay is AdamW's and SGD's.
func adafactor(ob *optBuilder, p, g, step *ir.Value) {
	acc := ir.Attrs{"eps1": adafactorEps1, "decay": adafactorDecay}
	upd := ir.Attrs{"eps2": adafactorEps2, "clip": adafactorClip, "rel_step": adafactorRelStep}
	if p.Type.Rank() != 2 {
		v := ob.state(ir.AdafactorVPrefix+p.Name(), p.Type)
		v1 := ob.op("adafactor_v", acc, v, g, step)
		ob.update(v, v1)
		ob.update(p, ob.op("adafactor_vec", upd, p, g, v1, step))
		return
	}
	row, col := factoredStates(ob, "adafactor", p)
	row1 := ob.op("adafactor_row", acc, row, g, step)
	col1 := ob.op("adafactor_col", acc, col, g, step)
	ob.update(row, row1)
	ob.update(col, col1)
	ob.update(p, ob.op("adafactor", upd, p, g, row1, col1, step))
}

// sm3 emits SM3-II (Anil et al. 2019) without momentum, as the paper's
// algorithm states it. A matrix is covered by its rows and its columns,
// with one accumulator μ each ("sm3.row:NAME", "sm3.col:NAME": 4·(n+m)
// bytes); for entry j in row r and column c
//
//	ν(j) = min(μ(r), μ(c)) + g(j)²   from the previous step's μ
//	θ(j) ← θ(j) − η·g(j)/√ν(j)        (no move where ν = 0)
//	μ(r) ← max over j ∈ r of ν(j), likewise μ(c)
//
// so the update op reads the old accumulators and the new ones are the
// maxima of the same ν. Other ranks are covered element by element, which
// is AdaGrad: "sm3.v/NAME" ← v + g², θ ← θ − η·g/√v. η is the runtime's
// learning rate (--lr and its schedule). No weight decay, as in the paper.
func sm3(ob *optBuilder, p, g, lr *ir.Value) {
	if p.Type.Rank() != 2 {
		v := ob.state(ir.SM3VPrefix+p.Name(), p.Type)
		v1 := ob.op("sm3_v", nil, v, g)
		ob.update(v, v1)
		ob.update(p, ob.op("sm3_vec", nil, p, g, v1, lr))
		return
	}
	row, col := factoredStates(ob, "sm3", p)
	ob.update(row, ob.op("sm3_row", nil, row, g, col))
	ob.update(col, ob.op("sm3_col", nil, col, g, row))
	ob.update(p, ob.op("sm3", nil, p, g, row, col, lr))
}

// factoredStates declares the row and column accumulators of matrix p,
// named PREFIX.row:NAME and PREFIX.col:NAME. Not PREFIX.row/NAME: the
// shard pass places a state named X/NAME like param NAME on tp, and a
// vector of NAME's row statistics cannot be split like NAME (a
// column-parallel weight is split on dim 1, which a vector lacks). These
// accumulators are whole on tp; the update gathers what it needs.
func factoredStates(ob *optBuilder, prefix string, p *ir.Value) (row, col *ir.Value) {
	dt, n, m := p.Type.DType, p.Type.Shape[0], p.Type.Shape[1]
	row = ob.state(prefix+".row:"+p.Name(), ir.T(dt, n))
	col = ob.state(prefix+".col:"+p.Name(), ir.T(dt, m))
	return row, col
}

// perStage is op (a variadic sum over every element of every arg:
// sum_squares, nonfinite_count) over args, where args[i] belongs to
// owners[i]'s pipeline chunk. Under pipeline parallelism each chunk
// reduces its own arguments and only the scalar partials travel to the
// first owner's chunk to be added, so no gradient leaves its stage for the
// global norm or the overflow check. Without chunks it is one op.
func perStage(ob *optBuilder, op string, owners, args []*ir.Value) *ir.Value {
	var order []int
	byStage := map[int][]*ir.Value{}
	at := map[int]*ir.Value{}
	for i, a := range args {
		s := owners[i].Meta.Stage
		if _, ok := byStage[s]; !ok {
			order = append(order, s)
			at[s] = owners[i]
		}
		byStage[s] = append(byStage[s], a)
	}
	first := ob.at
	var total *ir.Value
	for _, s := range order {
		ob.at = at[s]
		part := ob.op(op, nil, byStage[s]...)
		if total == nil {
			total = part
			continue
		}
		ob.at = first
		total = ob.op("add", nil, total, part)
	}
	ob.at = first
	return total
}

type optBuilder struct {
	m     *ir.Module
	names map[string]bool // source names in use
	at    *ir.Value       // the param being updated: its position and layer
	err   error
}

func (ob *optBuilder) meta() ir.Meta {
	meta := ir.NoMeta
	meta.Layer = ob.at.Meta.Layer
	meta.Stage = ob.at.Meta.Stage // a param's update runs on its pipeline chunk
	meta.Phase = ir.PhaseOpt
	return meta
}

func (ob *optBuilder) op(op string, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
	if ob.err != nil {
		return nil
	}
	v, err := ob.m.Add(op, args, attrs, ob.meta(), ob.at.Pos)
	if err != nil {
		ob.err = err
	}
	return v
}

func (ob *optBuilder) source(op string, t ir.Type, attrs ir.Attrs) *ir.Value {
	if ob.err != nil {
		return nil
	}
	if name := attrs.Str("name"); ob.names[name] {
		ob.err = fmt.Errorf("%s: name %q is reserved for the optimizer", ob.m.Source(name).Where(), name)
		return nil
	}
	ob.names[attrs.Str("name")] = true
	v, err := ob.m.AddSource(op, t, attrs, ob.meta(), ob.at.Pos)
	if err != nil {
		ob.err = err
	}
	return v
}

func (ob *optBuilder) state(name string, t ir.Type) *ir.Value {
	return ob.source("state", t, ir.Attrs{"name": name, "init": "zeros"})
}

func (ob *optBuilder) update(state, v *ir.Value) {
	if ob.err == nil {
		ob.m.Updates = append(ob.m.Updates, ir.Update{State: state, Value: v})
	}
}

// twoBW keeps a second version of every param for PipeDream-2BW: the
// forward and backward read "2bw.prev/NAME" (the weights of the previous
// step, so the gradients are ∇f(W(t−1))), the optimizer updates the
// current weights, and after the step the previous version takes the
// current weights as they were before the update. The first step uses the
// initial weights for both.
func twoBW(m *ir.Module, ob *optBuilder, params []*ir.Value) error {
	prev := map[*ir.Value]*ir.Value{}
	for _, p := range params {
		ob.at = p
		meta := p.Meta
		s := ob.source("state", p.Type, ir.Attrs{"name": ir.PrevPrefix + p.Name(), "init": ir.InitCopyPrefix + p.Name()})
		if ob.err != nil {
			return ob.err
		}
		s.Meta = meta
		s.Meta.Phase = ir.PhaseFwd
		prev[p] = s
		ob.update(s, p) // listed before p's own update: it reads p before the update
	}
	// Each previous version sits right after its param: its users come
	// before the optimizer.
	isPrev := map[*ir.Value]bool{}
	for _, s := range prev {
		isPrev[s] = true
	}
	var values []*ir.Value
	for _, v := range m.Values {
		if isPrev[v] {
			continue
		}
		values = append(values, v)
		if s := prev[v]; s != nil {
			values = append(values, s)
		}
	}
	m.Values = values
	for _, v := range m.Values {
		if v.Meta.Phase == ir.PhaseOpt {
			continue
		}
		for i, a := range v.Args {
			if s := prev[a]; s != nil {
				v.Args[i] = s
			}
		}
	}
	return ob.err
}
