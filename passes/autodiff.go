package passes

import (
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// GradPrefix is ir.GradPrefix, kept for callers that read the name from
// passes: "grad/wte.weight" is the gradient of the loss with respect to
// param wte.weight.
const GradPrefix = ir.GradPrefix

// autodiff appends the reverse-mode gradient of the "loss" output with
// respect to every param, one VJP per op (autodiff_vjp.go), and records
// each gradient as an output. Values the loss does not depend on, or that
// do not depend on a param through a gradient (see differentiable), get no
// backward ops.
func autodiff(m *ir.Module, o *Options) error {
	loss := m.Output(ir.OutputLoss)
	if loss == nil {
		return fmt.Errorf("module %q has no %q output to differentiate", m.Name, ir.OutputLoss)
	}
	if loss.Type.Rank() != 0 || !loss.Type.DType.IsFloat() {
		return fmt.Errorf("%s: loss must be a float scalar, got %v", loss.Where(), loss.Type)
	}
	needed := differentiable(m, loss)
	ad := &VJPBuilder{m: m, grads: map[*ir.Value]*ir.Value{}}
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
		info, _ := ir.Lookup(v.Op)
		rule, ok := vjps[v.Op]
		if !ok {
			why := ""
			if info != nil && info.Grad == ir.GradNotImplemented {
				why = fmt.Sprintf(": passes make %s after autodiff, and no second derivative is written", v.Op)
			}
			return fmt.Errorf("%s: op %s has no VJP, so the loss cannot be differentiated through it%s", v.Where(), v.Op, why)
		}
		ad.at = v
		dargs := rule(ad, v, dy)
		if ad.err != nil {
			return ad.err
		}
		for j, a := range v.Args {
			// What a VJP returns for an argument the table says takes no
			// gradient is dropped.
			if j < len(dargs) && dargs[j] != nil && needed[a] && (info == nil || info.HasGrad(j)) {
				ad.accumulate(a, dargs[j])
			}
		}
		if ad.err != nil {
			return ad.err
		}
	}
	var unreached []string
	for _, p := range m.Params() {
		if ad.grads[p] == nil {
			unreached = append(unreached, p.Name())
		}
	}
	if n := len(m.Params()); n > 0 && len(unreached) == n {
		return fmt.Errorf("%s: the loss depends on no param through a differentiable op (a comparison's 0/1 or an integer path has no gradient): training would change nothing", loss.Where())
	}
	if len(unreached) > 0 {
		o.notef("the loss does not reach %d of %d params, which keep their initial values: %s", len(unreached), len(m.Params()), strings.Join(firstFew(unreached, 5), ", "))
	}
	if unread := unreadInputs(m); len(unread) > 0 {
		o.notef("nothing reads input %s, which is fed every step: a loss meant to read it (its labels?) reads something else", strings.Join(unread, ", "))
	}
	params := m.Params()
	gradOuts := make([]ir.Output, 0, len(params))
	for _, p := range params {
		g := ad.grads[p]
		if g == nil {
			// The loss does not depend on p; its gradient is zero.
			ad.at = p
			g, err = m.AddSource("const", p.Type, ir.Attrs{"value": 0.0}, ad.meta(), p.Pos)
			if err != nil {
				return err
			}
		}
		gradOuts = append(gradOuts, ir.Output{Name: ir.GradPrefix + p.Name(), Value: g})
	}
	m.SetOutputs(gradOuts) // one index of the names, not a search per param
	removeDeadBackward(m)
	return nil
}

// removeDeadBackward drops backward values no output needs. A VJP rule
// emits the gradient of every argument it can; when an argument needs none
// (the constant factor of a scale, say) that work would still run and keep
// its inputs alive until the backward.
func removeDeadBackward(m *ir.Module) {
	live := m.Live()
	kept := m.Values[:0]
	for _, v := range m.Values {
		if v.Meta.Phase == ir.PhaseBwd && !live[v] {
			continue
		}
		kept = append(kept, v)
	}
	m.Values = kept
}

// differentiable marks values a gradient flows through: those on a path
// from some param to the loss along which every value has a float dtype
// and every op passes a gradient to the argument on the path (the op's
// table entry says which do not: NoGrad ops and NoGradArgs). A value
// derived from an integer tensor (ids, labels, a cast to int) or from a
// mask or count is a constant to autodiff, so it never demands a VJP.
func differentiable(m *ir.Module, loss *ir.Value) map[*ir.Value]bool {
	fromParam := map[*ir.Value]bool{}
	for _, v := range m.Values {
		if v.Op == "param" {
			fromParam[v] = true
			continue
		}
		if !v.Type.DType.IsFloat() {
			continue
		}
		info, _ := ir.Lookup(v.Op)
		for j, a := range v.Args {
			if fromParam[a] && (info == nil || info.HasGrad(j)) {
				fromParam[v] = true
				break
			}
		}
	}
	toLoss := map[*ir.Value]bool{loss: true}
	for i := len(m.Values) - 1; i >= 0; i-- {
		v := m.Values[i]
		if !toLoss[v] || !v.Type.DType.IsFloat() {
			continue
		}
		info, _ := ir.Lookup(v.Op)
		for j, a := range v.Args {
			if info == nil || info.HasGrad(j) {
				toLoss[a] = true
			}
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

// VJPBuilder emits backward ops that carry the position and layer of the
// forward value they differentiate, in phase bwd. A VJP receives one and
// builds the gradients of its value's arguments with Op and Scalar.
type VJPBuilder struct {
	m     *ir.Module
	grads map[*ir.Value]*ir.Value
	at    *ir.Value // forward value being differentiated
	err   error
}

func (ad *VJPBuilder) meta() ir.Meta {
	meta := ad.at.Meta
	meta.Phase = ir.PhaseBwd
	// The backward keeps its forward op's precision policy; the tag for
	// selective recompute is about forward values only.
	meta.Selective = false
	return meta
}

// Op emits one backward op and returns its value. After the first error,
// or when an argument is nil (a gradient an earlier call failed to make),
// it emits nothing and returns nil; autodiff reports the error.
func (ad *VJPBuilder) Op(op string, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
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

func (ad *VJPBuilder) accumulate(a, g *ir.Value) {
	if prev := ad.grads[a]; prev != nil {
		g = ad.Op("add", nil, prev, g)
		if g != nil && a.Op == "param" {
			// A param read twice (a tied embedding) has its parts added
			// in fp32 under mixed precision, as the microbatches' sums
			// are: on a pipeline its parts are summed on their chunks
			// and added once (passes.microbatch), and the same sum in
			// 16 bits on one device rounded each microbatch's to 8 bits.
			g.Meta.Precision = ir.F32
		}
	}
	ad.grads[a] = g
}

// Scalar emits a backward constant: x as a scalar of dtype d.
func (ad *VJPBuilder) Scalar(x float64, d ir.DType) *ir.Value {
	if ad.err != nil {
		return nil
	}
	v, err := ad.m.AddSource("const", ir.T(d), ir.Attrs{"value": x}, ad.meta(), ad.at.Pos)
	if err != nil {
		ad.err = err
	}
	return v
}

// firstFew is names, or its first n and how many more.
func firstFew(names []string, n int) []string {
	if len(names) <= n {
		return names
	}
	return append(slices.Clone(names[:n]), fmt.Sprintf("and %d more", len(names)-n))
}

// unreadInputs names the module's inputs that no output or update reads (with
// their lines): a model whose loss reads its tokens as labels, or no data
// at all, trains without an error, and its targets input is fed for
// nothing.
func unreadInputs(m *ir.Module) []string {
	reads := m.Live()
	var unread []string
	for _, v := range m.Values {
		if v.Op == "input" && !reads[v] {
			unread = append(unread, fmt.Sprintf("%q (%s)", v.Name(), v.Pos))
		}
	}
	return unread
}
