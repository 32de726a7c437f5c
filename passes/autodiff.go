package passes

import (
	"fmt"

	"gcompile/ir"
)

// GradPrefix names autodiff's outputs: "grad/wte.weight" is the gradient
// of the loss with respect to param wte.weight.
const GradPrefix = "grad/"

// autodiff appends the reverse-mode gradient of the "loss" output with
// respect to every param, one VJP per op (autodiff_vjp.go), and records
// each gradient as an output. Values the loss does not depend on, or that
// do not depend on a param, get no backward ops.
func autodiff(m *ir.Module, _ *Options) error {
	loss := m.Output("loss")
	if loss == nil {
		return fmt.Errorf("module %q has no \"loss\" output to differentiate", m.Name)
	}
	if loss.Type.Rank() != 0 || !loss.Type.DType.IsFloat() {
		return fmt.Errorf("%s: loss must be a float scalar, got %v", loss.Where(), loss.Type)
	}
	needed := differentiable(m, loss)
	ad := &adBuilder{m: m, grads: map[*ir.Value]*ir.Value{}}
	ad.at = loss
	seed, err := m.AddSource("const", loss.Type, ir.Attrs{"value": 1.0}, ad.meta(), loss.Pos)
	if err != nil {
		return err
	}
	ad.grads[loss] = seed
	// Reverse program order visits every use of a value before the value.
	for i := len(m.Values) - 1; i >= 0; i-- {
		v := m.Values[i]
		dy := ad.grads[v]
		if dy == nil || !needed[v] || len(v.Args) == 0 {
			continue
		}
		rule, ok := vjps[v.Op]
		if !ok {
			return fmt.Errorf("%s: op %s has no VJP, so the loss cannot be differentiated through it", v.Where(), v.Op)
		}
		ad.at = v
		dargs := rule(ad, v, dy)
		if ad.err != nil {
			return ad.err
		}
		for j, a := range v.Args {
			if j < len(dargs) && dargs[j] != nil && needed[a] {
				ad.accumulate(a, dargs[j])
			}
		}
		if ad.err != nil {
			return ad.err
		}
	}
	for _, p := range m.Params() {
		g := ad.grads[p]
		if g == nil {
			// The loss does not depend on p; its gradient is zero.
			ad.at = p
			g, err = m.AddSource("const", p.Type, ir.Attrs{"value": 0.0}, ad.meta(), p.Pos)
			if err != nil {
				return err
			}
		}
		m.SetOutput(GradPrefix+p.Name(), g)
	}
	removeDeadBackward(m)
	return nil
}

// removeDeadBackward drops backward values no output needs. A VJP rule
// emits the gradient of every argument it can; when an argument needs none
// (the constant factor of a scale, say) that work would still run and keep
// its inputs alive until the backward.
func removeDeadBackward(m *ir.Module) {
	live := map[*ir.Value]bool{}
	for _, o := range m.Outputs {
		live[o.Value] = true
	}
	for _, u := range m.Updates {
		live[u.Value] = true
	}
	for i := len(m.Values) - 1; i >= 0; i-- {
		v := m.Values[i]
		if live[v] {
			for _, a := range v.Args {
				live[a] = true
			}
		}
	}
	kept := m.Values[:0]
	for _, v := range m.Values {
		if v.Meta.Phase == ir.PhaseBwd && !live[v] {
			continue
		}
		kept = append(kept, v)
	}
	m.Values = kept
}

// differentiable marks values on a path from some param to the loss.
func differentiable(m *ir.Module, loss *ir.Value) map[*ir.Value]bool {
	fromParam := map[*ir.Value]bool{}
	for _, v := range m.Values {
		if v.Op == "param" {
			fromParam[v] = true
			continue
		}
		for _, a := range v.Args {
			if fromParam[a] {
				fromParam[v] = true
				break
			}
		}
	}
	toLoss := map[*ir.Value]bool{loss: true}
	for i := len(m.Values) - 1; i >= 0; i-- {
		v := m.Values[i]
		if !toLoss[v] {
			continue
		}
		for _, a := range v.Args {
			toLoss[a] = true
		}
	}
	needed := map[*ir.Value]bool{}
	for v := range toLoss {
		if fromParam[v] {
			needed[v] = true
		}
	}
	return needed
}

// adBuilder emits backward ops that carry the position and layer of the
// forward value they differentiate, in phase bwd.
type adBuilder struct {
	m     *ir.Module
	grads map[*ir.Value]*ir.Value
	at    *ir.Value // forward value being differentiated
	err   error
}

func (ad *adBuilder) meta() ir.Meta {
	meta := ad.at.Meta
	meta.Phase = ir.PhaseBwd
	return meta
}

// op emits one backward op; after the first error it emits nothing.
func (ad *adBuilder) op(op string, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
	if ad.err != nil {
		return nil
	}
	for _, a := range args {
		if a == nil {
			return nil
		}
	}
	v, err := ad.m.Add(op, args, attrs, ad.meta(), ad.at.Pos)
	if err != nil {
		ad.err = fmt.Errorf("VJP of %s: %w", ad.at.Where(), err)
		return nil
	}
	return v
}

func (ad *adBuilder) accumulate(a, g *ir.Value) {
	if prev := ad.grads[a]; prev != nil {
		g = ad.op("add", nil, prev, g)
	}
	ad.grads[a] = g
}

func (ad *adBuilder) scalar(x float64, d ir.DType) *ir.Value {
	if ad.err != nil {
		return nil
	}
	v, err := ad.m.AddSource("const", ir.T(d), ir.Attrs{"value": x}, ad.meta(), ad.at.Pos)
	if err != nil {
		ad.err = err
	}
	return v
}
