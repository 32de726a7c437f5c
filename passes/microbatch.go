package passes

import (
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// microbatch unrolls gradient accumulation: with m microbatches it records
// the forward and backward graph once per microbatch, each on its share of
// the batch inputs, and replaces the loss by the mean over microbatches
// and every gradient by the sum of the microbatches' (each backward starts
// from dloss/m), which is what the optimizer then consumes. Params and
// constants are shared; each copy's values carry micro=k, which the pipeline
// schedule will order.
//
// Microbatch k takes rows k·b … (k+1)·b of every data-parallel rank's own
// block of the batch (the input is viewed as [dp, m, b, …]), so each device
// accumulates over exactly the rows it holds and the partial gradients are
// reduced across devices once per step, not once per microbatch. The mean
// of equal-sized microbatch means is the mean over the whole batch, so the
// step computes the same gradient as without accumulation.
func microbatch(m *ir.Module, o *Options) error {
	n := o.Microbatches
	if n <= 1 {
		return nil
	}
	// The batch is split over dp×ep (dp coarser): each device's block is
	// one of dp·ep.
	dp := o.Mesh.SizeOf(o.Mesh.DataAxis()) * o.Mesh.SizeOf(o.Mesh.ExpertAxis())
	loss := m.Output(ir.OutputLoss)
	if loss == nil {
		return fmt.Errorf("module %q has no %q output", m.Name, ir.OutputLoss)
	}
	var sources, body []*ir.Value
	for _, v := range m.Values {
		info, _ := ir.Lookup(v.Op)
		switch {
		case info.Source:
			sources = append(sources, v)
		case v.Meta.Phase == ir.PhaseFwd || v.Meta.Phase == ir.PhaseBwd:
			body = append(body, v)
		default:
			return fmt.Errorf("%s: microbatching runs before the optimizer; found a %v value", v.Where(), v.Meta.Phase)
		}
	}
	place, batchDim, err := microPlacements(m, sources, body, n)
	if err != nil {
		return err
	}
	seeded := seededByLoss(m.Values)
	uses := m.Uses() // before m.Values is rebuilt below
	rescale := map[*ir.Value]*ir.Value{}
	narrow := map[narrowKey]*ir.Value{}
	replaced := map[*ir.Value]bool{}
	microMesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "micro", Size: n}}}
	m.Values = sources
	// Each microbatch's backward starts from dloss/n, the gradient of its
	// share of the step's loss, as Megatron-LM divides each microbatch's
	// loss by their number: the gradients are then summed, not averaged.
	// Under mixed precision the seed is the loss scale, and a microbatch's
	// 16-bit gradients are its share of the step's, as a data-parallel
	// replica's are; seeded with the whole scale they were n times the
	// share, and an fp16 step overflowed that one device took.
	var share *ir.Value
	if seed := autodiffSeed(sources); seed != nil {
		c, err := m.AddSource("const", ir.T(seed.Type.DType), ir.Attrs{"value": 1 / float64(n)}, seed.Meta, seed.Pos)
		if err != nil {
			return err
		}
		if share, err = m.Add("scale", []*ir.Value{seed, c}, nil, seed.Meta, seed.Pos); err != nil {
			return err
		}
		for _, v := range body {
			for i, a := range v.Args {
				if a == seed {
					v.Args[i] = share
				}
			}
		}
		seeded[share] = true
		place[share], batchDim[share] = place[seed], batchDim[seed]
	}
	// Values that do not depend on the batch are the same for every
	// microbatch: computed once.
	for _, v := range body {
		if place[v].Kind == ir.Replicate {
			m.Values = append(m.Values, v)
		}
	}
	// A param read on two pipeline chunks (a tied embedding, read by the
	// first chunk's lookup and the last's head) has a gradient summed from
	// the two chunks' parts, autodiff's add. Each part is summed over the
	// microbatches on its own chunk and the two sums are added once, as
	// Megatron-LM all-reduces the two copies' gradients once a step: added
	// for each microbatch, the last chunk's part crossed to the first m
	// times a step.
	split := map[*ir.Value]bool{}
	for _, out := range m.Outputs {
		if v := out.Value; strings.HasPrefix(out.Name, ir.GradPrefix) && v.Op == "add" && len(uses[v]) == 0 &&
			place[v].Kind != ir.Replicate && v.Args[0].Meta.Stage != v.Args[1].Meta.Stage {
			split[v] = true
		}
	}
	var losses []*ir.Value
	grads := map[string][]*ir.Value{}
	parts := map[string][2][]*ir.Value{}
	for k := range n {
		copyOf := map[*ir.Value]*ir.Value{}
		for _, x := range sources {
			if !batchInput(x) {
				continue
			}
			slice, err := microSlice(m, x, k, n, dp)
			if err != nil {
				return err
			}
			copyOf[x] = slice
		}
		for _, v := range body {
			if place[v].Kind == ir.Replicate || split[v] {
				continue
			}
			meta := v.Meta
			meta.Micro = k
			args := make([]*ir.Value, len(v.Args))
			for i, a := range v.Args {
				switch {
				case copyOf[a] != nil:
					args[i] = copyOf[a]
				case batchDim[a] >= 0 && place[a].Kind == ir.Replicate && !place[v].Equal(ir.Placement{}) && narrowable(a, batchDim[a]):
					// A broadcast along the batch, used with per-microbatch
					// values: the same broadcast to one microbatch's rows,
					// made for each microbatch, so it lives only around
					// that microbatch's uses. Made for the whole batch and
					// sliced, it held the whole batch's bytes across every
					// microbatch (a bias broadcast [batch, seq, 4h] a
					// layer: m times the activations it stands beside).
					if args[i], err = narrowed(m, narrow, rescale, a, batchDim[a], n, seeded[a], meta); err != nil {
						return err
					}
					replaced[a] = true
				case batchDim[a] >= 0 && place[a].Kind == ir.Replicate && !place[v].Equal(ir.Placement{}):
					// A whole value, the same along the batch (a
					// broadcast), used with per-microbatch ones: this
					// microbatch's block of it.
					d := batchDim[a]
					b := a.Type.Shape[d] / n
					if seeded[a] {
						// A gradient of the whole batch's mean (a
						// reduce_mean's vjp, 1/rows of the batch) reaching
						// one microbatch's rows: the microbatch's own loss
						// is a mean over n times fewer rows, and its share
						// of the step's is 1/n of it (the seed's share).
						if a, err = rescaled(m, rescale, a, n); err != nil {
							return err
						}
					}
					s, err := m.Add("slice", []*ir.Value{a}, ir.Attrs{"dim": d, "start": k * b, "end": (k + 1) * b}, meta, v.Pos)
					if err != nil {
						return err
					}
					args[i] = s
				default:
					args[i] = a
				}
			}
			attrs := v.Attrs.Clone()
			if v.Op == "reshape" || v.Op == "broadcast" {
				// Shapes in attributes shrink like the value does.
				attrs["shape"] = []int(ir.LocalShape(v.Type.Shape, []ir.Placement{place[v]}, microMesh))
			}
			c, err := m.Add(v.Op, args, attrs, meta, v.Pos)
			if err != nil {
				return fmt.Errorf("microbatch %d: %w", k, err)
			}
			copyOf[v] = c
		}
		lk := loss
		if c := copyOf[loss]; c != nil {
			lk = c
		}
		losses = append(losses, lk)
		for _, out := range m.Outputs {
			if split[out.Value] {
				ps := parts[out.Name]
				for i, a := range out.Value.Args {
					if c := copyOf[a]; c != nil {
						a = c
					}
					ps[i] = append(ps[i], a)
				}
				parts[out.Name] = ps
				continue
			}
			if strings.HasPrefix(out.Name, ir.GradPrefix) || strings.HasPrefix(out.Name, ir.AuxPrefix) {
				g := out.Value
				if c := copyOf[g]; c != nil {
					g = c
				}
				grads[out.Name] = append(grads[out.Name], g)
			}
		}
	}
	// The whole-batch broadcasts narrowed for the microbatches are left
	// with no reader.
	if len(replaced) > 0 {
		uses := m.Uses()
		m.Values = slices.DeleteFunc(m.Values, func(v *ir.Value) bool { return replaced[v] && len(uses[v]) == 0 })
	}
	// The sums are kept in fp32 (Meta.Precision), as Megatron-LM keeps its
	// main_grad: mixed precision then adds the microbatches' 16-bit
	// gradients in fp32, where a 16-bit sum of n loss-scaled gradients
	// would overflow n times sooner than one batch's gradient (an fp16
	// step skipped that one device takes) and bf16 would round each
	// partial sum to 8 bits. Each partial sum is added as soon as its
	// microbatch's value exists
	// (Hoist below): added after the last microbatch, every microbatch's
	// gradients were alive at once, n times the gradients' bytes.
	var sums []*ir.Value
	// total adds vs up, with at's metadata, and divides the sum by the
	// number of microbatches when mean is set.
	total := func(vs []*ir.Value, at *ir.Value, phase ir.Phase, mean bool) (*ir.Value, error) {
		meta := at.Meta
		meta.Micro, meta.Phase, meta.Precision = -1, phase, ir.F32
		acc := vs[0]
		for _, v := range vs[1:] {
			var err error
			if acc, err = m.Add("add", []*ir.Value{acc, v}, nil, meta, at.Pos); err != nil {
				return nil, err
			}
			sums = append(sums, acc)
		}
		if !mean {
			return acc, nil
		}
		c, err := m.AddSource("const", ir.T(at.Type.DType), ir.Attrs{"value": 1 / float64(n)}, meta, at.Pos)
		if err != nil {
			return nil, err
		}
		avg, err := m.Add("scale", []*ir.Value{acc, c}, nil, meta, at.Pos)
		sums = append(sums, avg)
		return avg, err
	}
	l, err := total(losses, loss, ir.PhaseFwd, true)
	if err != nil {
		return err
	}
	m.SetOutput(ir.OutputLoss, l)
	for i, out := range m.Outputs {
		if ps, ok := parts[out.Name]; ok {
			v := out.Value
			a, err := total(ps[0], v.Args[0], ir.PhaseBwd, false)
			if err != nil {
				return err
			}
			b, err := total(ps[1], v.Args[1], ir.PhaseBwd, false)
			if err != nil {
				return err
			}
			g, err := total([]*ir.Value{a, b}, v, ir.PhaseBwd, share == nil)
			if err != nil {
				return err
			}
			m.Outputs[i].Value = g
			continue
		}
		if gs := grads[out.Name]; gs != nil {
			// The model's own outputs are forward values, averaged like
			// the loss; gradients are sums of the microbatches' shares.
			phase, mean := ir.PhaseBwd, share == nil
			if strings.HasPrefix(out.Name, ir.AuxPrefix) {
				phase, mean = ir.PhaseFwd, true
			}
			g, err := total(gs, out.Value, phase, mean)
			if err != nil {
				return err
			}
			m.Outputs[i].Value = g
		}
	}
	m.Hoist(sums...)
	return nil
}

// autodiffSeed is autodiff's seed, dloss = 1, the first backward value
// (a scalar const), or nil.
func autodiffSeed(values []*ir.Value) *ir.Value {
	for _, v := range values {
		if v.Meta.Phase == ir.PhaseBwd {
			if v.Op == "const" && v.Type.Rank() == 0 && v.Attrs.Float("value", 0) == 1 {
				return v
			}
			return nil
		}
	}
	return nil
}

// narrowable reports whether a is a broadcast whose operand does not vary
// along dim d (absent there, or 1): the same broadcast to fewer rows is
// the block of it a microbatch reads.
func narrowable(a *ir.Value, d int) bool {
	if a.Op != "broadcast" {
		return false
	}
	x := a.Args[0]
	od := d - (a.Type.Rank() - x.Type.Rank())
	return od < 0 || x.Type.Shape[od] == 1
}

type narrowKey struct {
	v     *ir.Value
	micro int
}

// narrowed is broadcast a made for one microbatch's rows of dim d (n
// microbatches), once for the microbatch of meta; seeded (a gradient of
// the whole batch's mean reaching a microbatch's rows) scales its operand
// by n first, as rescaled does the whole value.
func narrowed(m *ir.Module, done map[narrowKey]*ir.Value, rescale map[*ir.Value]*ir.Value, a *ir.Value, d, n int, seeded bool, meta ir.Meta) (*ir.Value, error) {
	key := narrowKey{a, meta.Micro}
	if r := done[key]; r != nil {
		return r, nil
	}
	x := a.Args[0]
	if seeded {
		var err error
		if x, err = rescaled(m, rescale, x, n); err != nil {
			return nil, err
		}
	}
	shape := slices.Clone(a.Type.Shape)
	shape[d] /= n
	r, err := m.Add("broadcast", []*ir.Value{x}, ir.Attrs{"shape": []int(shape)}, meta, a.Pos)
	done[key] = r
	return r, err
}

// rescaled is a times n, made once (shared by the microbatches).
func rescaled(m *ir.Module, done map[*ir.Value]*ir.Value, a *ir.Value, n int) (*ir.Value, error) {
	if r := done[a]; r != nil {
		return r, nil
	}
	c, err := m.AddSource("const", ir.T(a.Type.DType), ir.Attrs{"value": float64(n)}, a.Meta, a.Pos)
	if err != nil {
		return nil, err
	}
	r, err := m.Add("scale", []*ir.Value{a, c}, nil, a.Meta, a.Pos)
	done[a] = r
	return r, err
}

// seededByLoss marks the backward values that depend on autodiff's seed
// (the first backward value, dloss = 1): gradients of the loss, as
// opposed to forward values the backward reads again.
func seededByLoss(values []*ir.Value) map[*ir.Value]bool {
	seeded := map[*ir.Value]bool{}
	first := true
	for _, v := range values {
		if v.Meta.Phase != ir.PhaseBwd {
			continue
		}
		if first {
			first = false
			seeded[v] = v.Op == "const"
			continue
		}
		for _, a := range v.Args {
			if seeded[a] {
				seeded[v] = true
				break
			}
		}
	}
	return seeded
}

// microPlacements places every value on a virtual axis of n microbatches
// with the sharding rules: batch inputs split on dim 0, everything else
// derived. Split values are per-microbatch (cloned), partial ones are sums
// over a microbatch's rows (gradients: averaged across microbatches), whole
// ones do not depend on the batch (shared). slices[v] is the dim along which
// a whole value is cut into microbatch blocks where a split value meets it,
// or -1. A value an op would need whole but that depends on the batch
// cannot be split into microbatches: that is an error naming the op.
func microPlacements(m *ir.Module, sources, body []*ir.Value, n int) (map[*ir.Value]ir.Placement, map[*ir.Value]int, error) {
	s := &sharder{m: &ir.Module{Mesh: &ir.Mesh{Axes: []ir.MeshAxis{{Name: "micro", Size: n}}}}, prefer: map[*ir.Value][]ir.Placement{}, tp: -1, dp: -1, ep: -1, cp: -1}
	place := map[*ir.Value]ir.Placement{}
	slices := map[*ir.Value]int{}
	for _, x := range sources {
		slices[x] = -1
		if batchInput(x) {
			place[x] = shardOn(0)
		}
	}
	saved := make(map[*ir.Value][]ir.Placement, len(body))
	for _, v := range body {
		slices[v] = -1
		saved[v] = v.Place
		have := make([]ir.Placement, len(v.Args))
		for i, a := range v.Args {
			have[i] = place[a]
		}
		r := AxisRule{s: s, v: v, ax: 0, have: have}
		want, out, err := r.apply()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: cannot split into %d microbatches: %w", v.Where(), n, err)
		}
		for i, a := range v.Args {
			if want[i].Equal(have[i]) {
				continue
			}
			if have[i].Kind == ir.Replicate && want[i].Kind == ir.Shard && uniformAlong(a, want[i].Dim) {
				slices[a] = want[i].Dim
				continue
			}
			return nil, nil, fmt.Errorf("%s: cannot split into %d microbatches: %s needs %s placed %v on the batch but it is %v", v.Where(), n, v.Op, a.Ref(), want[i], have[i])
		}
		place[v] = out
	}
	return place, slices, nil
}

// uniformAlong reports whether every block of v along dim d is the same,
// so that cutting it per microbatch is exact: a broadcast that creates d
// or passes it through from such a value, a constant filled with one
// value, and elementwise ops (and scale) of such values. The gradient of
// a mean over the batch times a table (Σ x⊙R's) is one.
func uniformAlong(v *ir.Value, d int) bool {
	switch v.Op {
	case "broadcast":
		if broadcastExpands(v, d) {
			return true
		}
		x := v.Args[0]
		in := d - (v.Type.Rank() - x.Type.Rank())
		return in >= 0 && x.Type.Shape[in] == v.Type.Shape[d] && uniformAlong(x, in)
	case "const":
		return v.Attrs.Str("data") == ""
	case "scale":
		return uniformAlong(v.Args[0], d)
	}
	info, ok := ir.Lookup(v.Op)
	if !ok || !info.Elementwise {
		return false
	}
	for _, a := range v.Args {
		if a.Type.Rank() == v.Type.Rank() && !uniformAlong(a, d) {
			return false
		}
	}
	return true
}

// broadcastExpands reports whether a broadcast creates dim d (every block
// along d is the same), so cutting it per microbatch is exact.
func broadcastExpands(b *ir.Value, d int) bool {
	in, out := b.Args[0].Type.Shape, b.Type.Shape
	off := len(out) - len(in)
	return d < off || in[d-off] == 1 && out[d] != 1
}

// microSlice is microbatch k of a batch input x [B, …]: viewed as
// [dp, m, B/(dp·m), …], index k on dim 1, back to [B/m, …].
func microSlice(m *ir.Module, x *ir.Value, k, n, dp int) (*ir.Value, error) {
	b := x.Type.Shape[0]
	if b%(dp*n) != 0 {
		return nil, fmt.Errorf("%s: batch input %q %v: dim 0 (%d) must be divisible by dp·ep·microbatches = %d", x.Where(), x.Name(), x.Type, b, dp*n)
	}
	meta := x.Meta
	meta.Micro = k
	rest := []int(x.Type.Shape[1:])
	view := append([]int{dp, n, b / (dp * n)}, rest...)
	r, err := m.Add("reshape", []*ir.Value{x}, ir.Attrs{"shape": view}, meta, x.Pos)
	if err != nil {
		return nil, err
	}
	s, err := m.Add("slice", []*ir.Value{r}, ir.Attrs{"dim": 1, "start": k, "end": k + 1}, meta, x.Pos)
	if err != nil {
		return nil, err
	}
	return m.Add("reshape", []*ir.Value{s}, ir.Attrs{"shape": append([]int{b / n}, rest...)}, meta, x.Pos)
}

// batchInput reports whether source x is a batch input, split into
// microbatches (and over dp) on dim 0: an input of rank ≥ 1 the model did
// not declare whole.
func batchInput(x *ir.Value) bool {
	return x.Op == "input" && x.Type.Rank() > 0 && !x.Attrs.Bool("whole")
}
