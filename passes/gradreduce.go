package passes

import (
	"fmt"
	"maps"
	"slices"

	"gcompile/ir"
)

// GradReduceDTypes are --grad-reduce-dtype's values: the gradients'
// data-parallel reductions in fp32 (the default, Megatron-LM's main_grad),
// or in a 16-bit format (DeepSpeed's communication_data_type under fp16,
// Megatron-LM's --grad-reduce-in-bf16).
var GradReduceDTypes = []string{"fp32", "bf16", "fp16"}

// gradReduceDType, the data-parallel pass's last step, narrows the
// backward's reductions of params' fp32 gradients over the data axes
// (dp, ep, cp; readByTheUpdate) to Options.GradReduceDType, keeping
// their buckets: half the
// bytes on the wire, for a sum rounded to the 16-bit format at each add,
// as NCCL's 16-bit reductions round (the attribute round_each). Where the
// reduced value is the fp32 copy of a 16-bit gradient, the 16-bit
// gradient is reduced itself; elsewhere a cast narrows it first. A cast
// back to fp32 follows each reduction, for the optimizer (or the sum over
// microbatches) to read. A chain of reductions over several data axes
// stays 16-bit between them.
//
// The sum is no longer the one device's: a run that reduces in 16 bits
// trains close to, not exactly like, one device.
func gradReduceDType(m *ir.Module, o *Options) error {
	var dt ir.DType
	switch o.GradReduceDType {
	case "", "fp32":
		return nil
	case "bf16":
		dt = ir.BF16
	case "fp16":
		dt = ir.F16
	default:
		return fmt.Errorf("--grad-reduce-dtype %q: want one of %v", o.GradReduceDType, GradReduceDTypes)
	}
	data := map[string]bool{}
	for _, axis := range dataAxes(m.Mesh) {
		data[axis] = true
	}
	uses := m.Uses()
	grads := map[*ir.Value]bool{}
	for i := len(m.Values) - 1; i >= 0; i-- {
		// Last first: a chain's later reduction is known before the one
		// it reads.
		if v := m.Values[i]; data[v.Attrs.Str("axis")] && isGradReduction(v, v.Attrs.Str("axis")) && readByTheUpdate(v, uses, grads) {
			grads[v] = true
		}
	}
	out := make([]*ir.Value, 0, len(m.Values))
	widened := map[*ir.Value]*ir.Value{} // a narrowed reduction's fp32 cast, by the reduction
	made := map[*ir.Value]bool{}         // every cast made here
	bypassed := map[*ir.Value]bool{}     // fp32 copies a reduction read and reads no more
	for _, v := range m.Values {
		if !grads[v] || v.Type.DType != ir.F32 {
			out = append(out, v)
			continue
		}
		x := v.Args[0]
		in := x
		switch {
		case widened[x] != nil:
			// A chain: the reduction over another data axis before this
			// one, narrowed already.
			in = x
			bypassed[widened[x]] = true
		case x.Op == "cast" && x.Args[0].Type.DType == dt:
			// The fp32 copy of a 16-bit value (a 16-bit gradient, or a
			// reduction narrowed here): reduce the 16 bits themselves.
			in = x.Args[0]
			bypassed[x] = true
		default:
			c, err := m.NewValue("cast", []*ir.Value{x}, ir.Attrs{"to": dt.String()}, v.Meta, v.Pos)
			if err != nil {
				return err
			}
			c.Place = slices.Clone(x.Place)
			out = append(out, c)
			made[c] = true
			in = c
		}
		attrs := v.Attrs.Clone()
		attrs["round_each"] = true
		v.Args[0], v.Attrs = in, attrs
		v.Type.DType = dt
		wide, err := m.NewValue("cast", []*ir.Value{v}, ir.Attrs{"to": "f32"}, v.Meta, v.Pos)
		if err != nil {
			return err
		}
		wide.Place = slices.Clone(v.Place)
		widened[v] = wide
		made[wide] = true
		out = append(out, v, wide)
	}
	if len(widened) == 0 {
		return nil
	}
	// What read a reduction reads its fp32 cast.
	for _, u := range out {
		if _, narrowed := widened[u]; narrowed || made[u] {
			continue
		}
		for i, a := range u.Args {
			if w, ok := widened[a]; ok {
				u.Args[i] = w
			}
		}
	}
	for i := range m.Outputs {
		if w, ok := widened[m.Outputs[i].Value]; ok {
			m.Outputs[i].Value = w
		}
	}
	m.Values = out
	// Drop the casts nothing reads any more: the fp32 copies of 16-bit
	// gradients only their reduction read, and the fp32 casts between two
	// reductions of a chain.
	uses = m.Uses()
	outputs := map[*ir.Value]bool{}
	for _, o := range m.Outputs {
		outputs[o.Value] = true
	}
	m.Values = slices.DeleteFunc(m.Values, func(v *ir.Value) bool { return bypassed[v] && len(uses[v]) == 0 && !outputs[v] })
	m.Values = castWhereRead(m.Values, widened, uses)
	o.notef("%d gradient reductions over %v in %v, each add rounded", len(widened), slices.Sorted(maps.Keys(data)), dt)
	return nil
}

// castWhereRead moves each fp32 cast of a narrowed reduction from beside
// the reduction to just before its first reader. Beside it, the cast
// would be the bucket's first reader: the lowering puts such a reader
// right after the bucket, and the compute stream would wait there for
// the reduction instead of going on with the backward (on the CUDA
// backend's comm stream, and as the cost model prices it). A cast only
// the optimizer reads becomes the optimizer's (PhaseOpt).
func castWhereRead(values []*ir.Value, widened map[*ir.Value]*ir.Value, uses map[*ir.Value][]*ir.Value) []*ir.Value {
	casts := map[*ir.Value]bool{}
	for _, w := range widened {
		if len(uses[w]) > 0 {
			casts[w] = true
		}
	}
	out := make([]*ir.Value, 0, len(values))
	placed := map[*ir.Value]bool{}
	for _, v := range values {
		if casts[v] {
			continue
		}
		for _, a := range v.Args {
			if casts[a] && !placed[a] {
				if !slices.ContainsFunc(uses[a], func(u *ir.Value) bool { return u.Meta.Phase != ir.PhaseOpt }) {
					a.Meta.Phase = ir.PhaseOpt
				}
				out = append(out, a)
				placed[a] = true
			}
		}
		out = append(out, v)
	}
	return out
}

// readByTheUpdate says whether reduction v sums a param's gradient:
// only the optimizer reads it, or the sum over microbatches, or a
// reduction over another data axis that does (grads). A reduction the
// backward reads on (an activation's gradient summed over cp, a
// router's) keeps its format.
func readByTheUpdate(v *ir.Value, uses map[*ir.Value][]*ir.Value, grads map[*ir.Value]bool) bool {
	for _, u := range uses[v] {
		if u.Meta.Phase != ir.PhaseOpt && !accumulates(v, u) && !grads[u] {
			return false
		}
	}
	return len(uses[v]) > 0
}
