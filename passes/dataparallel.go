package passes

import (
	"gcompile/ir"
)

// dataParallel groups the gradient reductions over the data axes into
// buckets of at most BucketMB, in the order the gradients become ready
// (last layers first), as PyTorch DDP and Megatron do: one collective per
// bucket instead of one per tensor. The bucket is an attribute of each
// reduction; the lowering issues a bucket's reductions together once its
// last gradient exists.
//
// The data axes are dp and, under expert parallelism, ep: a gradient
// shared by the ep ranks (everything but the experts') is partial over
// both and reduced over ep, then over dp. Reductions that nothing reads
// before the optimizer (all-reduce, or reduce-scatter under ZeRO-2/3) are
// bucketed by size on their axis; an ep reduction whose one reader is a
// bucketed dp reduction joins an ep bucket that mirrors that dp bucket,
// so each ep bucket's gradients are summed before the dp bucket that
// reads them is issued.
func dataParallel(m *ir.Module, o *Options) error {
	limit := int64(o.BucketMB * (1 << 20))
	uses := m.Uses()
	next := 0
	for _, ax := range []int{m.Mesh.DataAxis(), m.Mesh.ExpertAxis()} {
		if ax >= 0 {
			next = bucketFinal(m, uses, m.Mesh.Axes[ax].Name, limit, next)
		}
	}
	dp, ep := m.Mesh.DataAxis(), m.Mesh.ExpertAxis()
	if dp < 0 || ep < 0 {
		return nil
	}
	mirror := map[int]int{} // dp bucket → its ep bucket
	for _, v := range m.Values {
		if !isGradReduction(v, m.Mesh.Axes[ep].Name) || len(uses[v]) != 1 {
			continue
		}
		u := uses[v][0]
		b, ok := u.Attrs["bucket"].(int)
		if !ok || !isGradReduction(u, m.Mesh.Axes[dp].Name) {
			continue
		}
		id, ok := mirror[b]
		if !ok {
			id, next = next, next+1
			mirror[b] = id
		}
		v.Attrs["bucket"] = id
	}
	return nil
}

// isGradReduction says whether v is a backward reduction over axis.
func isGradReduction(v *ir.Value, axis string) bool {
	return (v.Op == "all_reduce" || v.Op == "reduce_scatter") && v.Attrs.Str("axis") == axis && v.Meta.Phase == ir.PhaseBwd
}

// bucketFinal buckets the backward reductions over axis that nothing
// reads before the optimizer, numbering the buckets from first; it
// returns the next free number.
func bucketFinal(m *ir.Module, uses map[*ir.Value][]*ir.Value, axis string, limit int64, first int) int {
	bucket, filled, stage, used := first, int64(0), -2, false
	for _, v := range m.Values {
		if !isGradReduction(v, axis) {
			continue
		}
		// Only a reduction that nothing reads before the optimizer can
		// wait for the rest of its bucket.
		early := false
		for _, u := range uses[v] {
			early = early || u.Meta.Phase != ir.PhaseOpt
		}
		if early {
			continue
		}
		size := v.Type.Bytes()
		// A bucket never spans pipeline chunks: each chunk's gradients are
		// ready at a different time on a different rank.
		if filled > 0 && (filled+size > limit || v.Meta.Stage != stage) {
			bucket++
			filled = 0
		}
		filled += size
		stage = v.Meta.Stage
		v.Attrs["bucket"] = bucket
		used = true
	}
	if used {
		return bucket + 1
	}
	return first
}
