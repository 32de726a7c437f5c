package passes

import (
	"fmt"
	"strings"

	"gcompile/ir"
)

// Names of the optimizer's inputs and outputs the runtime feeds and reads.
const (
	InputLR       = "lr"        // scalar of the params' dtype: learning rate of this step (the runtime's schedule)
	InputStep     = "step"      // i64 scalar: 1-based step number (Adam bias correction)
	OutputGradNrm = "grad_norm" // global gradient L2 norm before clipping
)

// optimizer appends, for every param, the update the chosen optimizer makes
// from the param's gradient, and lists param and state updates in the
// module. Params are the fp32 master weights; optimizer state (Adam's m and
// v, SGD's momentum buffer) is fp32 state named after its param. With
// ClipNorm > 0 all gradients are first scaled by min(1, c/‖g‖) with ‖g‖
// the global L2 norm, as torch.nn.utils.clip_grad_norm_ does. The gradient
// outputs are consumed and removed, so gradients need not outlive the step.
func optimizer(m *ir.Module, o *Options) error {
	params := m.Params()
	if len(params) == 0 {
		return fmt.Errorf("module %q has no params to optimise", m.Name)
	}
	grads := make([]*ir.Value, len(params))
	for i, p := range params {
		if grads[i] = m.Output(GradPrefix + p.Name()); grads[i] == nil {
			return fmt.Errorf("%s: no gradient output %q (autodiff must run first)", p.Where(), GradPrefix+p.Name())
		}
	}
	ob := &optBuilder{m: m, at: params[0], names: map[string]bool{}}
	for _, v := range m.Values {
		if n := v.Name(); n != "" {
			ob.names[n] = true
		}
	}
	// The learning rate has the master weights' dtype (f32, or f64 in reference runs).
	lr := ob.source("input", ir.T(params[0].Type.DType), ir.Attrs{"name": InputLR})
	step := ob.source("input", ir.T(ir.I64), ir.Attrs{"name": InputStep})
	sumsq := ob.op("sum_squares", nil, grads...)
	m.SetOutput(OutputGradNrm, ob.op("sqrt", nil, sumsq))
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
			mState := ob.state("adam.m/"+p.Name(), p.Type)
			vState := ob.state("adam.v/"+p.Name(), p.Type)
			m1 := ob.op("adam_m", ir.Attrs{"beta1": o.Beta1}, mState, g)
			v1 := ob.op("adam_v", ir.Attrs{"beta2": o.Beta2}, vState, g)
			p1 := ob.op("adamw", ir.Attrs{"beta1": o.Beta1, "beta2": o.Beta2, "eps": o.Eps, "wd": wd}, p, m1, v1, lr, step)
			ob.update(mState, m1)
			ob.update(vState, v1)
			ob.update(p, p1)
		case "sgd":
			buf := ob.state("sgd.momentum/"+p.Name(), p.Type)
			buf1 := ob.op("sgd_buf", ir.Attrs{"momentum": o.Momentum, "wd": wd}, buf, g, p)
			ob.update(buf, buf1)
			ob.update(p, ob.op("sgd", nil, p, buf1, lr))
		}
	}
	if ob.err != nil {
		return ob.err
	}
	kept := m.Outputs[:0]
	for _, out := range m.Outputs {
		if !strings.HasPrefix(out.Name, GradPrefix) {
			kept = append(kept, out)
		}
	}
	m.Outputs = kept
	return nil
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
		s := ob.source("state", p.Type, ir.Attrs{"name": "2bw.prev/" + p.Name(), "init": "copy:" + p.Name()})
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
