package passes

import (
	"slices"

	"gcompile/ir"
)

// dataParallel groups the gradient reductions over the data axes into
// buckets of at most BucketMB, in the order the gradients become ready
// (last layers first), as PyTorch DDP and Megatron do: one collective per
// bucket instead of one per tensor. The bucket is an attribute of each
// reduction; the lowering issues a bucket's reductions together once its
// last gradient exists.
//
// The data axes are dp and, under expert parallelism, ep, and under
// context parallelism cp: a gradient shared by the ep ranks (everything
// but the experts') is partial over both and reduced over ep, then over
// dp; every gradient is partial over cp too. Reductions that nothing reads
// before the optimizer (all-reduce, or reduce-scatter under ZeRO-2/3) are
// bucketed by size on their axis; an ep (or cp) reduction whose one
// reader is a bucketed dp reduction joins an ep bucket that mirrors that
// dp bucket, so each ep bucket's gradients are summed before the dp
// bucket that reads them is issued.
func dataParallel(m *ir.Module, o *Options) error {
	limit := int64(o.BucketMB * (1 << 20))
	uses := m.Uses()
	next := 0
	for _, axis := range dataAxes(m.Mesh) {
		next = bucketFinal(m, uses, axis, limit, next)
	}
	// A reduction over ep or cp that a bucketed reduction over another
	// data axis reads joins the bucket that mirrors that one; twice, so a
	// chain (cp, then ep, then dp) is mirrored whichever way it runs.
	type key struct {
		bucket int
		axis   string
	}
	mirror := map[key]int{}
	for range 2 {
		for _, ax := range []int{m.Mesh.ExpertAxis(), m.Mesh.SequenceAxis()} {
			if ax < 0 {
				continue
			}
			axis := m.Mesh.Axes[ax].Name
			for _, v := range m.Values {
				if !isGradReduction(v, axis) || len(uses[v]) != 1 {
					continue
				}
				if _, done := v.Attrs["bucket"].(int); done {
					continue
				}
				u := uses[v][0]
				b, ok := u.Attrs["bucket"].(int)
				if !ok || u.Op != "all_reduce" && u.Op != "reduce_scatter" || u.Meta.Phase != ir.PhaseBwd || u.Attrs.Str("axis") == axis {
					continue
				}
				k := key{b, axis}
				id, ok := mirror[k]
				if !ok {
					id, next = next, next+1
					mirror[k] = id
				}
				v.Attrs["bucket"] = id
			}
		}
	}
	// Narrowed after the buckets are made, so a bucket holds the same
	// gradients in either format.
	return gradReduceDType(m, o)
}

// dataAxes are the names of the mesh's data axes (dp, ep, cp) it has, in
// the order their buckets are numbered.
func dataAxes(mesh *ir.Mesh) []string {
	var names []string
	for _, ax := range []int{mesh.DataAxis(), mesh.ExpertAxis(), mesh.SequenceAxis()} {
		if ax >= 0 {
			names = append(names, mesh.Axes[ax].Name)
		}
	}
	return names
}

// isGradReduction says whether v is a backward reduction over axis.
func isGradReduction(v *ir.Value, axis string) bool {
	return (v.Op == "all_reduce" || v.Op == "reduce_scatter") && v.Attrs.Str("axis") == axis && v.Meta.Phase == ir.PhaseBwd
}

// accumulates says whether u is the gradient accumulation's add of a
// microbatch's reduced gradient g into the running sum (the microbatch
// pass's per-step adds, microbatch -1, in the backward).
func accumulates(g, u *ir.Value) bool {
	return g.Meta.Micro >= 0 && u.Op == "add" && u.Meta.Micro < 0 && u.Meta.Phase == ir.PhaseBwd
}

// fromOtherChunk says whether x reads another chunk's value than stage,
// directly or through the scale or cast that makes x from it: the sum of
// a tied embedding's two parts (passes.microbatch), averaged when the
// microbatches' gradients are.
func fromOtherChunk(x *ir.Value, stage int) bool {
	if (x.Op == "scale" || x.Op == "cast") && len(x.Args) > 0 && x.Args[0].Meta.Stage == stage {
		x = x.Args[0]
	}
	return slices.ContainsFunc(x.Args, func(a *ir.Value) bool { return a.Meta.Stage != stage })
}

// bucketFinal buckets the backward reductions over axis that nothing
// reads before the optimizer, numbering the buckets from first; it
// returns the next free number.
func bucketFinal(m *ir.Module, uses map[*ir.Value][]*ir.Value, axis string, limit int64, first int) int {
	bucket, filled, stage, micro, used := first, int64(0), -2, -2, false
	for _, v := range m.Values {
		if !isGradReduction(v, axis) {
			continue
		}
		// Only a reduction that nothing reads before the optimizer can
		// wait for the rest of its bucket, or one of a microbatch's
		// gradients (ZeRO-2/3's reduce-scatters under gradient
		// accumulation) read only by the sum over microbatches, which
		// the lowering moves after the bucket (lower.groupBuckets).
		// Nor can the reduction of a sum of two chunks' parts (a tied
		// embedding's, whose last-chunk part arrives after this chunk's
		// blocks): its bucket would wait for the other rank, and what
		// reads the rest of the bucket before then would wait with it.
		early := false
		for _, u := range uses[v] {
			early = early || u.Meta.Phase != ir.PhaseOpt && !accumulates(v, u)
		}
		early = early || fromOtherChunk(v.Args[0], v.Meta.Stage)
		if early {
			continue
		}
		size := v.Type.Bytes()
		// A bucket never spans pipeline chunks (each chunk's gradients are
		// ready at a different time on a different rank) nor microbatches
		// (the next microbatch's come a whole backward later).
		if filled > 0 && (filled+size > limit || v.Meta.Stage != stage || v.Meta.Micro != micro) {
			bucket++
			filled = 0
		}
		filled += size
		stage, micro = v.Meta.Stage, v.Meta.Micro
		v.Attrs["bucket"] = bucket
		used = true
	}
	if used {
		return bucket + 1
	}
	return first
}
