package passes

import (
	"math"

	"gcompile/ir"
)

// Mixture-of-experts ops (ir/moe.go): their VJPs and sharding rules.
func init() {
	tokens := func(v *ir.Value) ir.Attrs { return ir.Attrs{"tokens": v.Args[0].Type.Shape[1]} }
	// dispatch(x, src, w) = w·x[src]: x's gradient gathers the buffer's
	// gradient back to the tokens with the same weights, w's is the dot
	// of each slot's gradient with its token.
	vjps["moe_dispatch"] = func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		x, src := v.Args[0], v.Args[1]
		if len(v.Args) == 2 {
			return []*ir.Value{ad.Op("moe_combine", tokens(v), dy, src), nil}
		}
		w := v.Args[2]
		return []*ir.Value{ad.Op("moe_combine", tokens(v), dy, src, w), nil, ad.Op("moe_slot_dot", nil, dy, src, x)}
	}
	// combine(y, src, w) = Σ w·y at each token: y's gradient is the
	// token's gradient dispatched to its slots with the weights, w's the
	// dot of each slot's result with its token's gradient.
	vjps["moe_combine"] = func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		y, src := v.Args[0], v.Args[1]
		if len(v.Args) == 2 {
			return []*ir.Value{ad.Op("moe_dispatch", nil, dy, src), nil}
		}
		w := v.Args[2]
		return []*ir.Value{ad.Op("moe_dispatch", nil, dy, src, w), nil, ad.Op("moe_slot_dot", nil, y, src, dy)}
	}
	vjps["moe_slot_gather"] = func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("moe_slot_scatter", tokens(v), dy, v.Args[1]), nil}
	}
	vjps["moe_slot_scatter"] = func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("moe_slot_gather", nil, dy, v.Args[1]), nil}
	}

	// dΦ(x) = φ(x)·dy = exp(−x²/2)/√(2π)·dy.
	vjps["normal_cdf"] = func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		x := v.Args[0]
		dt := x.Type.DType
		half := ad.Op("scale", nil, ad.Op("mul", nil, x, x), ad.Scalar(-0.5, dt))
		pdf := ad.Op("scale", nil, ad.Op("exp", nil, half), ad.Scalar(1/math.Sqrt(2*math.Pi), dt))
		return []*ir.Value{ad.Op("mul", nil, dy, pdf)}
	}

	shardRules["normal_cdf"] = ElementwiseRule
	shardRules["random"] = randomRule
	shardRules["top_k_mask"] = topKMaskRule
	shardRules["less"] = ElementwiseRule
	for op, dims := range moeDims {
		shardRules[op] = moeRule(dims)
	}
}

// moeOpDims says where an MoE op's operands keep the routing group and
// the hidden size: group[i] and hidden[i] are argument i's dims (−1: none),
// the last entry the result's. A linear argument carries a partial sum
// through when every other argument is whole.
type moeOpDims struct {
	group, hidden []int
	linear        []bool
	// hiddenPartial: a split of the hidden size gives a partial result
	// (the dot products of moe_slot_dot) rather than a split one.
	hiddenPartial bool
}

var moeDims = map[string]moeOpDims{
	"moe_route":        {group: []int{0, 0, 0}, hidden: []int{-1, -1, -1}, linear: []bool{false, false}},
	"moe_dispatch":     {group: []int{0, 0, 0, 1}, hidden: []int{2, -1, -1, 3}, linear: []bool{true, false, true}},
	"moe_combine":      {group: []int{1, 0, 0, 0}, hidden: []int{3, -1, -1, 2}, linear: []bool{true, false, true}},
	"moe_slot_dot":     {group: []int{1, 0, 0, 0}, hidden: []int{3, -1, 2, -1}, linear: []bool{true, false, true}, hiddenPartial: true},
	"moe_slot_gather":  {group: []int{0, 0, 0}, hidden: []int{-1, -1, -1}, linear: []bool{true, false}},
	"moe_slot_scatter": {group: []int{0, 0, 0}, hidden: []int{-1, -1, -1}, linear: []bool{true, false}},
}

// moeRule places an MoE op on one axis. Groups are independent, so a
// split of the groups runs locally: every operand split on its group dim,
// in the same blocks.
// Otherwise a split of the hidden size (tensor parallelism inside the
// experts) runs locally when the op only moves hidden vectors, and gives
// partial dot products in moe_slot_dot. A partial sum passes through a
// linear operand when the others are whole; anything else is gathered,
// since a routing decision or an index cannot be split another way.
func moeRule(d moeOpDims) ShardRule {
	return func(r AxisRule) ([]ir.Placement, ir.Placement, error) {
		n := len(r.have)
		out := len(d.group) - 1
		for i, p := range r.have {
			if p.Kind == ir.Shard && p.Dim == d.group[i] {
				// Blocks: a sequence split over cp into whole groups
				// (mergeSequence), each sequence's groups a block.
				want := make([]ir.Placement, n)
				for j := range want {
					want[j] = moved(p, d.group[j])
				}
				return want, moved(p, d.group[out]), nil
			}
		}
		for i, p := range r.have {
			if p.Kind == ir.Shard && d.hidden[i] >= 0 && p.Dim == d.hidden[i] {
				want := make([]ir.Placement, n)
				for j := range want {
					want[j] = rep
					if d.hidden[j] >= 0 {
						want[j] = moved(p, d.hidden[j])
					}
				}
				if d.hiddenPartial {
					return want, par, nil
				}
				return want, moved(p, d.hidden[out]), nil
			}
		}
		want := r.Same(rep)
		partial := -1
		for i, p := range r.have {
			if p.Kind != ir.Partial {
				continue
			}
			if partial >= 0 || !d.linear[i] {
				return want, rep, nil
			}
			partial = i
		}
		if partial >= 0 {
			want[partial] = par
			return want, par, nil
		}
		return want, rep, nil
	}
}

// topKMaskRule: rows are independent, so a split of any dim but the last
// runs locally; a split row is gathered, and a partial input summed, as
// the choice is not linear.
func topKMaskRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	if p.Kind == ir.Shard && p.Dim < r.v.Type.Rank()-1 {
		return r.have, p, nil
	}
	return []ir.Placement{rep}, rep, nil
}

// randomRule: each key's draws are its own, so the result is split like
// the keys; the trailing dims the draws add are whole.
func randomRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	return r.have, r.have[0], nil
}
