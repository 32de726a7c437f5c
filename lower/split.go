package lower

import (
	"fmt"
	"strconv"

	"gcompile/ir"
)

// BoundaryPrefix names the values that cross from the gradient program to
// the update program: "boundary/17" is value %17 of the original module.
const BoundaryPrefix = "boundary/"

// SplitAtOptimizer cuts a compiled single-device module in two: the
// gradient program (forward and backward; outputs the loss and every value
// the optimizer reads) and the update program (the optimizer, whose inputs
// are those values and which updates params and optimizer state). A runtime
// that does not run the two in lockstep — asynchronous data parallelism,
// where replicas compute gradients on stale weights and a single update
// program applies them — runs them separately. Boundary lists the names
// that connect them, in order.
func SplitAtOptimizer(m *ir.Module) (grad, update *ir.Module, boundary []string, err error) {
	if m.Mesh != nil {
		return nil, nil, nil, fmt.Errorf("module %q is placed on mesh %v: split the single-device module", m.Name, m.Mesh)
	}
	isOpt := func(v *ir.Value) bool { return v.Meta.Phase == ir.PhaseOpt }
	isSource := func(v *ir.Value) bool {
		info, _ := ir.Lookup(v.Op)
		return info.Source
	}
	crossing := map[*ir.Value]bool{}
	for _, v := range m.Values {
		if !isOpt(v) || isSource(v) {
			continue
		}
		for _, a := range v.Args {
			if !isOpt(a) && !isSource(a) && !crossing[a] {
				crossing[a] = true
				boundary = append(boundary, BoundaryPrefix+strconv.Itoa(a.ID))
			}
		}
	}
	grad, update = ir.NewModule(m.Name+".grad"), ir.NewModule(m.Name+".update")
	gradOf, updOf := map[*ir.Value]*ir.Value{}, map[*ir.Value]*ir.Value{}
	copyInto := func(dst *ir.Module, of map[*ir.Value]*ir.Value, v *ir.Value) error {
		var c *ir.Value
		var err error
		if isSource(v) {
			c, err = dst.AddSource(v.Op, v.Type, v.Attrs.Clone(), v.Meta, v.Pos)
		} else {
			args := make([]*ir.Value, len(v.Args))
			for i, a := range v.Args {
				if args[i] = of[a]; args[i] == nil {
					return fmt.Errorf("%s: arg %s is not on this side of the split", v.Where(), a.Ref())
				}
			}
			c, err = dst.Add(v.Op, args, v.Attrs.Clone(), v.Meta, v.Pos)
		}
		of[v] = c
		return err
	}
	used := func(side func(*ir.Value) bool) map[*ir.Value]bool {
		u := map[*ir.Value]bool{}
		for _, v := range m.Values {
			if side(v) && !isSource(v) {
				for _, a := range v.Args {
					u[a] = true
				}
			}
		}
		return u
	}
	usedByGrad := used(func(v *ir.Value) bool { return !isOpt(v) })
	usedByUpd := used(isOpt)
	loss := m.Output(ir.OutputLoss)
	updated := map[*ir.Value]bool{} // a search of the updates per source was quadratic in the params
	for _, u := range m.Updates {
		updated[u.State] = true
	}
	for _, v := range m.Values {
		switch {
		case isSource(v):
			if usedByGrad[v] || loss == v {
				if err := copyInto(grad, gradOf, v); err != nil {
					return nil, nil, nil, err
				}
			}
			if usedByUpd[v] || updated[v] || v.Op == "input" && isOpt(v) {
				if err := copyInto(update, updOf, v); err != nil {
					return nil, nil, nil, err
				}
			}
		case !isOpt(v):
			if err := copyInto(grad, gradOf, v); err != nil {
				return nil, nil, nil, err
			}
			if crossing[v] {
				in, err := update.AddSource("input", v.Type, ir.Attrs{"name": BoundaryPrefix + strconv.Itoa(v.ID)}, v.Meta, v.Pos)
				if err != nil {
					return nil, nil, nil, err
				}
				updOf[v] = in
			}
		default:
			if err := copyInto(update, updOf, v); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	// SetOutputs: one index of the names, not a search per output (every
	// param's gradient crosses).
	var gradOuts, updOuts []ir.Output
	for _, o := range m.Outputs {
		if c := gradOf[o.Value]; c != nil && !isOpt(o.Value) {
			gradOuts = append(gradOuts, ir.Output{Name: o.Name, Value: c})
		} else if c := updOf[o.Value]; c != nil {
			updOuts = append(updOuts, ir.Output{Name: o.Name, Value: c})
		}
	}
	for _, a := range m.Values {
		if crossing[a] {
			gradOuts = append(gradOuts, ir.Output{Name: BoundaryPrefix + strconv.Itoa(a.ID), Value: gradOf[a]})
		}
	}
	grad.SetOutputs(gradOuts)
	update.SetOutputs(updOuts)
	for _, u := range m.Updates {
		update.Updates = append(update.Updates, ir.Update{State: updOf[u.State], Value: updOf[u.Value]})
	}
	if err := ir.Verify(grad, "split"); err != nil {
		return nil, nil, nil, err
	}
	if err := ir.Verify(update, "split"); err != nil {
		return nil, nil, nil, err
	}
	return grad, update, boundary, nil
}
