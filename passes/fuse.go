package passes

import (
	"fmt"
	"slices"

	"gcompile/ir"
)

// fuse merges groups of elementwise ops into single `fused` ops (with
// Options.Fuse; off by default). A group is a tree of f32 elementwise
// values of one type, one placement and one metadata block (layer, phase,
// stage, chunk, microbatch), whose inner values are read only by their
// parent in the group and are neither outputs nor updates. The fused
// value takes the root's place in program order, reads the group's
// external inputs and carries the group as its body (ir.FusedBody), so a
// backend computes it in one pass over the elements and the inner values
// never get buffers.
//
// What stays outside, and why:
//   - 16-bit and f64 values: the CPU backend emulates 16-bit types op by
//     op (widen, compute, round), and the fused kernels are float32 only.
//   - A value read by two ops, or by an op in another group: fusing it
//     would mean computing it twice or keeping it anyway.
//   - Outputs and updates inside a group: they need their own buffers.
//   - A group whose root is an update: the lowering writes an optimizer
//     op's update in place over the state, which a fused op would lose.
//   - Per-step values of a microbatched step: the lowering orders them
//     by readiness across microbatches (and pipeline ranks), not by
//     program order, so a group of them could keep inputs alive longer.
//   - scale, where_finite and other ops with a scalar or non-elementwise
//     operand: they are not elementwise in the op table.
//
// Grouping trees (each inner value has one user) that are contiguous in
// program order keeps the pass linear and the memory plan honest: the
// fused op runs where the group ran, its inputs live exactly as long as
// before, and at its one instruction it holds what the group's first
// instruction held (every input and one result), so the peak never rises.
func fuse(m *ir.Module, o *Options) error {
	if !o.Fuse {
		return nil
	}
	groups := fuseGroups(m)
	if len(groups) == 0 {
		return nil
	}
	replace := map[*ir.Value]*ir.Value{} // root → fused value
	drop := map[*ir.Value]bool{}         // inner values
	for _, g := range groups {
		f, err := fusedValue(m, g)
		if err != nil {
			return err
		}
		root := g[len(g)-1]
		replace[root] = f
		for _, v := range g[:len(g)-1] {
			drop[v] = true
		}
	}
	values := make([]*ir.Value, 0, len(m.Values))
	for _, v := range m.Values {
		if drop[v] {
			continue
		}
		if f := replace[v]; f != nil {
			v = f
		}
		// A fused value may read another group's root too.
		for i, a := range v.Args {
			if f := replace[a]; f != nil {
				v.Args[i] = f
			}
		}
		values = append(values, v)
	}
	m.Values = values
	for i, out := range m.Outputs {
		if f := replace[out.Value]; f != nil {
			m.Outputs[i].Value = f
		}
	}
	// Updates need no rewrite: fuseGroups never puts an update in a group.
	return nil
}

// fuseGroups returns the groups of two or more values the pass fuses,
// each in program order with its root last, ordered by root.
func fuseGroups(m *ir.Module) [][]*ir.Value {
	// sole[a] is the one value that reads a (possibly in several operand
	// slots); values read by two or more have shared[a].
	sole := map[*ir.Value]*ir.Value{}
	shared := map[*ir.Value]bool{}
	for _, v := range m.Values {
		for _, a := range v.Args {
			if u, seen := sole[a]; seen && u != v {
				shared[a] = true
			}
			sole[a] = v
		}
	}
	pinned := map[*ir.Value]bool{}
	for _, out := range m.Outputs {
		pinned[out.Value] = true
	}
	isUpdate := map[*ir.Value]bool{}
	for _, u := range m.Updates {
		pinned[u.Value] = true
		isUpdate[u.Value] = true
	}
	// group[v] is the tree v belongs to so far. A tree is a contiguous run
	// of m.Values ending at its root, the only member read from outside.
	type tree struct {
		first, root int // indices into m.Values
		members     []*ir.Value
	}
	// In a microbatched step the lowering emits per-step values (Micro
	// -1: gradient sums, the optimizer) as soon as their args are ready,
	// not in module order, so a group of them could hold its first inputs
	// over several microbatches.
	microbatched := m.Microbatched()
	group := map[*ir.Value]*tree{}
	var trees []*tree
	for i, v := range m.Values {
		if !fusable(v) || isUpdate[v] || microbatched && v.Meta.Micro < 0 {
			continue
		}
		g := &tree{first: i, root: i, members: []*ir.Value{v}}
		// Take in the trees of v's args while they end right before what
		// g holds: a group with other values between its members would
		// keep its inputs alive over them, which can raise the peak.
		for {
			var next *tree
			for _, a := range v.Args {
				ga := group[a]
				if ga != nil && ga != g && ga.root == g.first-1 && !shared[a] && sole[a] == v && !pinned[a] && sameBlock(a, v) {
					next = ga
					break
				}
			}
			if next == nil {
				break
			}
			g.members = append(g.members, next.members...)
			g.first = next.first
			for _, w := range next.members {
				group[w] = g
			}
		}
		group[v] = g
		trees = append(trees, g)
	}
	var out [][]*ir.Value
	for _, g := range trees {
		// A tree merged into a later one no longer maps its root to itself.
		if len(g.members) < 2 || group[m.Values[g.root]] != g {
			continue
		}
		out = append(out, m.Values[g.first:g.root+1])
	}
	return out
}

// fusable values are f32 elementwise ops whose attributes a fused body
// can carry (floats only).
func fusable(v *ir.Value) bool {
	info, ok := ir.Lookup(v.Op)
	if !ok || !info.Elementwise || v.Op == ir.FusedOp || v.Type.DType != ir.F32 {
		return false
	}
	for _, x := range v.Attrs {
		if _, isFloat := x.(float64); !isFloat {
			return false
		}
	}
	return true
}

// sameBlock says whether two values may share a fused op: same type, same
// placement and the same metadata, so the lowering and the pipeline cut
// see the group as one of the block's instructions.
func sameBlock(a, b *ir.Value) bool {
	return a.Type.Equal(b.Type) && ir.SamePlacement(a.Place, b.Place) && a.Meta == b.Meta
}

// fusedValue builds the fused op for a group (program order, root last):
// its args are the values the group reads from outside, in order of first
// use.
func fusedValue(m *ir.Module, g []*ir.Value) (*ir.Value, error) {
	temp := make(map[*ir.Value]int, len(g))
	argIndex := map[*ir.Value]int{}
	var args []*ir.Value
	body := make(ir.FusedBody, len(g))
	for i, v := range g {
		st := ir.FusedStep{Op: v.Op}
		for _, a := range v.Args {
			if t, inner := temp[a]; inner {
				st.Args = append(st.Args, ir.FusedRef{Index: t})
				continue
			}
			k, seen := argIndex[a]
			if !seen {
				k = len(args)
				argIndex[a] = k
				args = append(args, a)
			}
			st.Args = append(st.Args, ir.FusedRef{Arg: true, Index: k})
		}
		if len(v.Attrs) > 0 {
			st.Attrs = v.Attrs.Clone()
		}
		body[i] = st
		temp[v] = i
	}
	root := g[len(g)-1]
	f, err := m.NewValue(ir.FusedOp, args, ir.Attrs{"body": body.String()}, root.Meta, root.Pos)
	if err != nil {
		return nil, fmt.Errorf("fusing %d values ending at %s: %w", len(g), root.Where(), err)
	}
	f.Place = slices.Clone(root.Place)
	return f, nil
}
