package passes

import (
	"gcompile/ir"
)

// dataParallel groups the gradient reductions over dp (all-reduce, or
// reduce-scatter under ZeRO-2/3) into buckets of at most BucketMB, in the
// order the gradients become ready (last layers first), as PyTorch DDP and
// Megatron do: one collective per bucket instead of one per tensor. The
// bucket is an attribute of each reduction; the lowering issues a bucket's
// reductions together once its last gradient exists.
func dataParallel(m *ir.Module, o *Options) error {
	dp := m.Mesh.DataAxis()
	if dp < 0 {
		return nil
	}
	limit := int64(o.BucketMB * (1 << 20))
	bucket, filled, stage := 0, int64(0), -2
	uses := m.Uses()
	for _, v := range m.Values {
		if (v.Op != "all_reduce" && v.Op != "reduce_scatter") || v.Attrs.Str("axis") != m.Mesh.Axes[dp].Name || v.Meta.Phase != ir.PhaseBwd {
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
	}
	return nil
}
