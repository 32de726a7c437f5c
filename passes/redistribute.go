package passes

import (
	"fmt"
	"slices"

	"gcompile/ir"
)

// redistribute expands each redistribute op into collectives from the
// fixed conversion table, one mesh axis at a time:
//
//	P → R     all_reduce        S(d) → R     all_gather
//	P → S(d)  reduce_scatter    R → S(d)     shard_slice (local, no traffic)
//	S(i) → S(j)  all_to_all
//
// A split in fused blocks, S(d)xK, converts with the same collectives
// carrying blocks=K (each device's part is its slice of every block).
//
// Reductions run first (they shrink nothing but must happen before a
// slice), then slices and re-shardings, gathers last. The final collective
// keeps the redistribute op's id, so later dumps line up. The backward of
// each collective is its conjugate because autodiff runs before placement:
// the gradient graph is placed and redistributed like any other.
func redistribute(m *ir.Module, o *Options) error {
	var out []*ir.Value
	for _, v := range m.Values {
		if v.Op != "redistribute" {
			out = append(out, v)
			continue
		}
		steps, err := conversions(m, v.Args[0].Place, v.Place)
		if err != nil {
			return fmt.Errorf("%s: %w", v.Where(), err)
		}
		cur := v.Args[0]
		for i, st := range steps {
			place := append([]ir.Placement(nil), cur.Place...)
			place[st.axis] = st.to
			if i == len(steps)-1 {
				v.Op, v.Attrs, v.Args = st.op, st.attrs, []*ir.Value{cur}
				out = append(out, v)
				break
			}
			c, err := m.NewValue(st.op, []*ir.Value{cur}, st.attrs, v.Meta, v.Pos)
			if err != nil {
				return err
			}
			c.Place = place
			out = append(out, c)
			cur = c
		}
		if len(steps) == 0 {
			return fmt.Errorf("%s: redistribute to the placement it already has", v.Where())
		}
	}
	m.Values = out
	sinkSlices(m, o)
	return nil
}

// sinkSlices makes a value that every use cuts with the same local slice
// (R → S(d) on one axis) be produced split. A broadcast of a replicated
// operand, or a constant, computes its block as cheaply as the whole, so
// materialising the whole and slicing it afterwards only costs memory —
// a [batch, seq, 4h] bias broadcast replicated over dp is dp times its
// block, and per-device memory then grows with dp. The broadcast's
// operand is sliced instead where the split dim is one of its own (a
// [seq, h] position table split on seq under sequence parallelism). An
// elementwise op computes its block from its arguments' blocks, so the
// slice moves onto its arguments, and on up while a value exists only to
// be sliced.
func sinkSlices(m *ir.Module, o *Options) {
	if m.Mesh == nil {
		return
	}
	// The ops' own sharding rules say which argument blocks make which
	// result block; placement preferences do not matter here.
	s := &sharder{m: m, o: o, dp: m.Mesh.DataAxis(), tp: m.Mesh.WeightAxis(), ep: m.Mesh.ExpertAxis(), cp: m.Mesh.SequenceAxis(), prefer: map[*ir.Value][]ir.Placement{}}
	held := map[*ir.Value]bool{} // outputs and updated states keep their placement
	for _, o := range m.Outputs {
		held[o.Value] = true
	}
	for _, u := range m.Updates {
		held[u.State], held[u.Value] = true, true
	}
	for changed := true; changed; {
		changed = narrowBroadcasts(m, held)
		uses := m.Uses()
		replace := map[*ir.Value]*ir.Value{}
		before := map[*ir.Value][]*ir.Value{}
		for _, v := range m.Values {
			if held[v] || !sinkable(v) {
				continue
			}
			axis, dim, ok := commonSlice(m, v, uses[v])
			if !ok {
				continue
			}
			split := ir.Placement{Kind: ir.Shard, Dim: dim}
			if v.Op == "all_reduce" {
				// Reduced whole and then sliced is a reduce-scatter.
				if m.Mesh.Axis(v.Attrs.Str("axis")) != axis || v.Attrs.Int("bucket", 0) != 0 {
					continue
				}
				v.Op, v.Attrs = "reduce_scatter", splitAttrs(m.Mesh.Axes[axis].Name, split)
			} else {
				cut, ok := cuts(s, v, axis, split)
				if !ok {
					continue
				}
				for i, a := range v.Args {
					if cut[i] < 0 {
						continue
					}
					p := ir.Placement{Kind: ir.Shard, Dim: cut[i]}
					xs, err := m.NewValue("shard_slice", []*ir.Value{a}, splitAttrs(m.Mesh.Axes[axis].Name, p), v.Meta, v.Pos)
					if err != nil {
						continue
					}
					xs.Place = slices.Clone(a.Place)
					xs.Place[axis] = p
					before[v] = append(before[v], xs)
					v.Args[i] = xs
				}
			}
			v.Place = slices.Clone(v.Place)
			v.Place[axis] = split
			for _, u := range uses[v] {
				replace[u] = v
			}
			changed = true
		}
		if len(replace) == 0 {
			continue
		}
		rewrite := func(v *ir.Value) {
			for i, a := range v.Args {
				if r := replace[a]; r != nil {
					v.Args[i] = r
				}
			}
		}
		var kept []*ir.Value
		for _, v := range m.Values {
			if replace[v] == nil {
				kept = append(kept, v)
			}
			rewrite(v)
		}
		// A slice made this round may cut a slice another value of this
		// round replaced (the second axis of a dim split over dp and ep).
		for _, xs := range before {
			for _, v := range xs {
				rewrite(v)
			}
		}
		m.Values = splice(kept, before, nil)
	}
}

// sinkable ops may compute a block of their result from blocks of their
// arguments: constants, broadcasts, and ops with a sharding rule that are
// not an optimizer's update (those write state, which keeps its place);
// an all-reduce whose every use slices it is a reduce-scatter.
func sinkable(v *ir.Value) bool {
	switch v.Op {
	case "broadcast", "all_reduce", "all_gather", "embedding_grad":
		return true
	case "const":
		return len(v.Args) == 0
	}
	info, ok := ir.Lookup(v.Op)
	_, ruled := shardRules[v.Op]
	return ok && ruled && info.Update == ir.NoUpdate
}

// cuts finds which argument of v to cut on which dim (-1: none) so that v
// yields the block split of its result on axis. A broadcast takes its
// operand's dim under the split one unless it is broadcast (absent or 1);
// a constant needs nothing; any other op asks its sharding rule, trying
// argument cuts from the fewest bytes up, for one whose result is split
// with no redistribution of its arguments.
func cuts(s *sharder, v *ir.Value, axis int, split ir.Placement) ([]int, bool) {
	cut := make([]int, len(v.Args))
	for i := range cut {
		cut[i] = -1
	}
	switch v.Op {
	case "const":
		return cut, true
	case "all_gather":
		// A gather over another axis, of another dim, gathers the block
		// as well from the block of its argument: the 16-bit copy of a
		// position table ZeRO splits over dp on its width, read in rows
		// over tp under sequence parallelism.
		if s.m.Mesh.Axis(v.Attrs.Str("axis")) == axis || v.Attrs.Int("dim", -1) == split.Dim || v.Args[0].Place[axis].Kind != ir.Replicate {
			return nil, false
		}
		cut[0] = split.Dim
		return cut, true
	case "embedding_grad":
		// Whole ids and dy give any rows of the table's gradient: the
		// backends' kernels sum only the ids in the device's rows
		// (runtime.VocabRows), as a vocab-parallel lookup reads only them.
		ok := split.Dim == 0 && v.Args[0].Place[axis].Kind == ir.Replicate && v.Args[1].Place[axis].Kind == ir.Replicate
		return cut, ok
	case "broadcast":
		a := v.Args[0]
		if d := split.Dim - (v.Type.Rank() - a.Type.Rank()); d >= 0 && a.Type.Shape[d] != 1 {
			if a.Place[axis].Kind != ir.Replicate {
				return nil, false
			}
			cut[0] = d
		}
		return cut, true
	}
	if len(v.Args) > 4 {
		return nil, false
	}
	best, bestBytes := []int(nil), int64(-1)
	var try func(i int, bytes int64)
	try = func(i int, bytes int64) {
		if bestBytes >= 0 && bytes >= bestBytes {
			return
		}
		if i == len(v.Args) {
			have := make([]ir.Placement, len(v.Args))
			for j, a := range v.Args {
				have[j] = a.Place[axis]
				if cut[j] >= 0 {
					have[j] = ir.Placement{Kind: ir.Shard, Dim: cut[j]}
				}
			}
			want, out, err := AxisRule{s: s, v: v, ax: axis, have: have}.apply()
			if err != nil || !out.Equal(split) || len(want) != len(have) {
				return
			}
			for j := range want {
				if !want[j].Equal(have[j]) {
					return
				}
			}
			best, bestBytes = slices.Clone(cut), bytes
			return
		}
		try(i+1, bytes)
		a := v.Args[i]
		if a.Place[axis].Kind != ir.Replicate {
			return
		}
		for d := range a.Type.Rank() {
			cut[i] = d
			try(i+1, bytes+a.Type.Bytes())
			cut[i] = -1
		}
	}
	try(0, 0)
	return best, best != nil
}

// narrowBroadcasts makes a slice of a broadcast along a dim the broadcast
// creates (a microbatch's rows of a bias broadcast to the whole batch) a
// broadcast to the slice's shape, and drops broadcasts left without a use,
// so the whole batch is never materialised for one microbatch's part.
func narrowBroadcasts(m *ir.Module, held map[*ir.Value]bool) bool {
	changed := false
	for _, v := range m.Values {
		if v.Op != "slice" || v.Args[0].Op != "broadcast" || held[v] {
			continue
		}
		b := v.Args[0]
		x := b.Args[0]
		d := v.Attrs.Int("dim", -1) - (b.Type.Rank() - x.Type.Rank())
		if d >= 0 && x.Type.Shape[d] != 1 {
			continue
		}
		v.Op, v.Args = "broadcast", []*ir.Value{x}
		v.Attrs = ir.Attrs{"shape": []int(v.Type.Shape.Clone())}
		changed = true
	}
	if !changed {
		return false
	}
	uses := m.Uses()
	var kept []*ir.Value
	for _, v := range m.Values {
		if v.Op == "broadcast" && len(uses[v]) == 0 && !held[v] {
			continue
		}
		kept = append(kept, v)
	}
	m.Values = kept
	return true
}

// commonSlice reports whether every use of v is a shard_slice of one
// plain split (no fused blocks) on the same axis and dim, from R.
func commonSlice(m *ir.Module, v *ir.Value, uses []*ir.Value) (axis, dim int, ok bool) {
	if len(uses) == 0 || m.Mesh == nil || v.Place == nil {
		return 0, 0, false
	}
	axis = -1
	for _, u := range uses {
		if u.Op != "shard_slice" || u.Attrs.Int("blocks", 1) > 1 {
			return 0, 0, false
		}
		a := m.Mesh.Axis(u.Attrs.Str("axis"))
		d := u.Attrs.Int("dim", -1)
		if a < 0 || d < 0 || axis >= 0 && (a != axis || d != dim) {
			return 0, 0, false
		}
		axis, dim = a, d
	}
	if v.Place[axis].Kind != ir.Replicate {
		return 0, 0, false
	}
	return axis, dim, true
}

type conversion struct {
	axis  int
	to    ir.Placement
	op    string
	attrs ir.Attrs
	order float64
	// wholeBlocks: a finer axis splits the dim in blocks the step moves
	// whole, so it is not joined around the step.
	wholeBlocks bool
}

func conversions(m *ir.Module, from, to []ir.Placement) ([]conversion, error) {
	var steps []conversion
	for ax := range from {
		a, b := from[ax], to[ax]
		if a.Equal(b) {
			continue
		}
		name := m.Mesh.Axes[ax].Name
		c := conversion{axis: ax, to: b}
		switch {
		case a.Kind == ir.Partial && b.Kind == ir.Replicate:
			c.op, c.attrs, c.order = "all_reduce", ir.Attrs{"axis": name}, 0
		case a.Kind == ir.Partial && b.Kind == ir.Shard:
			c.op, c.attrs, c.order = "reduce_scatter", splitAttrs(name, b), 0
		case a.Kind == ir.Replicate && b.Kind == ir.Shard:
			c.op, c.attrs, c.order = "shard_slice", splitAttrs(name, b), 1
		case a.Kind == ir.Shard && b.Kind == ir.Shard && (a.NumBlocks() > 1 || b.NumBlocks() > 1):
			// No sharding rule asks for this today; an all_to_all that
			// re-blocks would need its own layout on both sides.
			return nil, fmt.Errorf("no conversion from %v to %v on axis %s: all_to_all moves unblocked shards only, which is %w", a, b, name, ErrNotYet)
		case a.Kind == ir.Shard && b.Kind == ir.Shard:
			c.op, c.attrs, c.order = "all_to_all", ir.Attrs{"axis": name, "from": a.Dim, "to": b.Dim}, 1
		case a.Kind == ir.Shard && b.Kind == ir.Replicate:
			c.op, c.attrs, c.order = "all_gather", splitAttrs(name, a), 2
		default:
			return nil, fmt.Errorf("no conversion from %v to %v on axis %s", a, b, name)
		}
		steps = append(steps, c)
	}
	// Stable order: reductions, then slices, then gathers. Among
	// reductions the data-parallel one goes last, so a gradient's dp
	// reduction is the step the optimizer reads and can join a bucket.
	for i := range steps {
		if steps[i].order == 0 && steps[i].axis == m.Mesh.DataAxis() {
			steps[i].order = 0.5
		}
	}
	// A dim split by several axes is split in the mesh's split order for
	// that dim (ir.Mesh.SplitOrderOn: tp first, except under an outer cp):
	// on such a dim slices go coarse to fine and gathers fine to coarse,
	// so every collective joins or splits contiguous parts. A finer axis
	// that splits the dim before and after a coarser step is joined just
	// before it and split again just after.
	ranks := map[int]map[int]int{} // dim → axis → position in its split order
	rankOn := func(d int) map[int]int {
		if r, ok := ranks[d]; ok {
			return r
		}
		r := map[int]int{}
		for i, ax := range m.Mesh.SplitOrderOn(d, from, to) {
			r[ax] = i
		}
		ranks[d] = r
		return r
	}
	// wholeBlocks: an all_to_all that splits dim d over a coarser axis
	// while ax splits it in blocks, the coarser axes of the result taking
	// whole blocks each (ir.BlockBox): cutting the device's part along d
	// then cuts whole blocks, and nothing need be joined first. The
	// expert buffer of a mixture of experts whose routing groups are split
	// over cp in blocks (one a sequence) goes back to its sequences over
	// ep so.
	wholeBlocks := func(st conversion, ax, d int) bool {
		k := from[ax].NumBlocks()
		if st.op != "all_to_all" || k <= 1 {
			return false
		}
		coarser := 1
		rank := rankOn(d)
		for a := range to {
			if rank[a] < rank[ax] && to[a].Kind == ir.Shard && to[a].Dim == d {
				coarser *= m.Mesh.Axes[a].Size
			}
		}
		return k%coarser == 0
	}
	for i, st := range append([]conversion(nil), steps...) {
		d := stepDim(from, st)
		rank := rankOn(d)
		for ax := range from {
			finer := rank[ax] > rank[st.axis] && m.Mesh.Axes[ax].Size > 1
			if finer && d >= 0 && from[ax].Placed(d) && to[ax].Equal(from[ax]) && wholeBlocks(st, ax, d) {
				steps[i].wholeBlocks = true
				continue
			}
			if finer && d >= 0 && from[ax].Placed(d) && to[ax].Equal(from[ax]) {
				name := m.Mesh.Axes[ax].Name
				steps = append(steps,
					conversion{axis: ax, to: ir.Placement{}, op: "all_gather", attrs: splitAttrs(name, from[ax]), order: st.order - 0.25},
					conversion{axis: ax, to: from[ax], op: "shard_slice", attrs: splitAttrs(name, from[ax]), order: st.order + 0.25})
			}
		}
	}
	shared := func(st conversion) bool {
		d := stepDim(from, st)
		for ax := range from {
			if ax != st.axis && d >= 0 && (from[ax].Placed(d) || to[ax].Placed(d)) {
				return true
			}
		}
		return false
	}
	before := func(a, b conversion) bool {
		if a.order != b.order {
			return a.order < b.order
		}
		if !shared(a) || !shared(b) || stepDim(from, a) != stepDim(from, b) {
			return false // stable: mesh order
		}
		rank := rankOn(stepDim(from, a))
		if a.op == "all_gather" {
			return rank[a.axis] > rank[b.axis]
		}
		return rank[a.axis] < rank[b.axis]
	}
	for i := 1; i < len(steps); i++ {
		for j := i; j > 0 && before(steps[j], steps[j-1]); j-- {
			steps[j], steps[j-1] = steps[j-1], steps[j]
		}
	}
	cur := append([]ir.Placement(nil), from...)
	for _, st := range steps {
		next := append([]ir.Placement(nil), cur...)
		next[st.axis] = st.to
		if d := stepDim(cur, st); d >= 0 && !st.wholeBlocks && (m.Mesh.InnerSplit(cur, st.axis, d) || m.Mesh.InnerSplit(next, st.axis, d)) {
			return nil, fmt.Errorf("no conversion from %s to %s: %s on axis %s would join or split dim %d while a finer axis splits it, which is %w",
				ir.PlacementString(from), ir.PlacementString(to), st.op, m.Mesh.Axes[st.axis].Name, d, ErrNotYet)
		}
		cur = next
	}
	return steps, nil
}

// stepDim is the dim a step joins or splits (the shard's on either side),
// or -1 for a reduction to whole.
func stepDim(from []ir.Placement, st conversion) int {
	switch {
	case st.to.Kind == ir.Shard:
		return st.to.Dim
	case from[st.axis].Kind == ir.Shard:
		return from[st.axis].Dim
	}
	return -1
}

// splitAttrs are the attributes of a collective that splits or joins the
// dim p shards on axis: blocks is written only for a fused (blocked) dim,
// so dumps of plain splits read as they always have.
func splitAttrs(axis string, p ir.Placement) ir.Attrs {
	a := ir.Attrs{"axis": axis, "dim": p.Dim}
	if p.NumBlocks() > 1 {
		a["blocks"] = p.NumBlocks()
	}
	return a
}

// Oversized lists the values every use of which cuts them with the same
// slice: each device materialises more than it needs (see sinkSlices).
// Params, optimizer state and inputs are whole on purpose (kept or fed
// that way) and not listed, nor is a slice sliced again on another axis
// (a cut over several axes is made one axis at a time).
func Oversized(m *ir.Module) []*ir.Value {
	if m.Mesh == nil {
		return nil
	}
	uses := m.Uses()
	var out []*ir.Value
	for _, v := range m.Values {
		switch v.Op {
		case "param", "state", "input", "shard_slice":
			continue
		}
		if _, _, ok := commonSlice(m, v, uses[v]); ok {
			out = append(out, v)
		}
	}
	return out
}
