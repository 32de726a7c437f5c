package ir

import (
	"fmt"
	"slices"
)

// Mixture-of-experts routing with static shapes. Tokens are cut into
// routing groups of T tokens, [G, T, M]; every expert has C slots per
// group (its capacity). Routing is one integer tensor, slot → token:
//
//	src[g, e, c] = t   slot c of expert e in group g holds token t
//	src[g, e, c] = −1  the slot is empty
//
// so a token may sit in several experts (top-k, expert choice) or in none
// (dropped over capacity: it passes through the residual). Dispatch
// gathers tokens into an [E, G, C, M] buffer, experts first, so that
// splitting experts over a mesh axis is a split of dim 0 and the move
// from groups split to experts split is one all_to_all; combine scatters
// the experts' results back to [G, T, M] weighted by the gate of each
// slot. Nothing is [tokens, E, C]: the index tensor is [G, E, C].
//
//	top_k_mask(x[..., n])                  1 at the k largest of each row, else 0
//	less(a, b)                             1 where a < b, else 0
//	moe_route(scores[G,T,E], mask[G,T,E])  → i32 src[G,E,C]
//	moe_dispatch(x[G,T,M], src [, w])      → [E,G,C,M]   w·x[src]
//	moe_combine(y[E,G,C,M], src [, w])     → [G,T,M]     Σ over a token's slots of w·y
//	moe_slot_dot(y[E,G,C,M], src, x[G,T,M]) → [G,E,C]    y·x[src] (the gates' gradient)
//	moe_slot_gather(p[G,T,E], src)         → [G,E,C]     p[g, src, e] (a slot's gate)
//	moe_slot_scatter(w[G,E,C], src)        → [G,T,E]     its vjp
//
// moe_route fills each expert's slots in a fixed order that depends only
// on the group's scores: every token's first choice (its highest-scoring
// selected expert) in token order, then every second choice, and so on;
// an expert that is full drops the rest. Ties in a score go to the lower
// expert index, in a position to the lower token index. Because the group
// is the unit, the same tokens are dropped whatever devices hold the
// groups.
//
// The slot weights w stay fp32 when the experts run in 16 bits (F32Args):
// the router computes them in fp32.

// MoEGateDType is the dtype of a slot weight and of its gradient for
// expert values of dtype d: fp32 whatever 16-bit dtype d is, float64 in a
// float64 program.
func MoEGateDType(d DType) DType { return AttentionStatsDType(d) }

func init() {
	register(&OpInfo{Name: "top_k_mask", Arity: 1, Attrs: []AttrSpec{req("k", AttrInt)}, Infer: inferTopKMask, Grad: NoGrad, Cost: perOut(2),
		Doc: "x[...,n] → 1 at the k largest elements of each row along the last dim, else 0 (ties to the lower index, NaN lowest); a constant for autodiff"})
	// less is elementwise but not marked so: its 0/1 result is a routing
	// decision, not worth a fused kernel's generated code.
	register(&OpInfo{Name: "less", Arity: 2, Infer: sameTypes(true), Grad: NoGrad, Cost: perOut(1),
		Doc: "elementwise 1 where a < b, else 0; a constant for autodiff"})
	register(&OpInfo{Name: "random", Arity: 1, Attrs: []AttrSpec{req("dist", AttrString), req("stream", AttrInt), opt("dims", AttrInts), opt("dtype", AttrString), opt("p", AttrFloat)},
		Infer: inferRandom, Grad: NoGrad, Cost: perOut(RandomFlops),
		Doc: "key i32[...] → [..., dims...] (dtype, default f32): per element a counter-based draw from hash(key, stream, index within dims): dist uniform U(0,1), normal N(0,1), or dropout (inverted dropout's multiplier: 1/(1−p) where the uniform draw is below 1−p, else 0); key −1 (evaluation) gives 0.5, 0 and 1"})
	register(&OpInfo{Name: "normal_cdf", Arity: 1, Infer: inferFloatRank1Or0, Cost: perOut(TranscendentalFlops + 2),
		Doc: "Φ(x), the standard normal CDF, elementwise (Shazeer et al.'s smooth load estimate)"})
	register(&OpInfo{Name: "moe_route", Arity: 2, Attrs: []AttrSpec{req("capacity", AttrInt)}, Infer: inferMoERoute, Grad: NoGrad, Cost: perArg(0, 4),
		Doc: "args (scores[G,T,E], mask[G,T,E]) → i32 src[G,E,capacity]: the token in each expert slot (−1 empty); per group, every token's first choice in token order, then every second, …, until an expert is full"})
	register(&OpInfo{Name: "moe_dispatch", Arity: Variadic, Infer: inferMoEDispatch, NoGradArgs: []int{1}, F32Args: []int{2}, Cost: moeMoveCost,
		Doc: "args (x[G,T,M], src[G,E,C] [, w[G,E,C]]) → [E,G,C,M]: out[e,g,c] = w[g,e,c]·x[g,src[g,e,c]], 0 for an empty slot"})
	register(&OpInfo{Name: "moe_combine", Arity: Variadic, Attrs: []AttrSpec{req("tokens", AttrInt)}, Infer: inferMoECombine, NoGradArgs: []int{1}, F32Args: []int{2}, Cost: moeMoveCost,
		Doc: "args (y[E,G,C,M], src[G,E,C] [, w[G,E,C]]) → [G,tokens,M]: out[g,t] = Σ over the slots holding t, experts in order, of w·y[e,g,c]; 0 for a token in no slot"})
	register(&OpInfo{Name: "moe_slot_dot", Arity: 3, Infer: inferMoESlotDot, Grad: GradNotImplemented, NoGradArgs: []int{1}, Cost: moeSlotDotCost,
		Doc: "vjp of a slot weight: args (y[E,G,C,M], src[G,E,C], x[G,T,M]) → [G,E,C] = Σ_m y[e,g,c,m]·x[g,src,m] (fp32 for 16-bit y), 0 for an empty slot"})
	register(&OpInfo{Name: "moe_slot_gather", Arity: 2, Infer: inferMoESlotGather, NoGradArgs: []int{1}, Cost: perOut(1),
		Doc: "args (p[G,T,E], src[G,E,C]) → [G,E,C] = p[g,src[g,e,c],e], 0 for an empty slot: the router's weight of each slot"})
	register(&OpInfo{Name: "moe_slot_scatter", Arity: 2, Attrs: []AttrSpec{req("tokens", AttrInt)}, Infer: inferMoESlotScatter, NoGradArgs: []int{1}, Cost: perArg(0, 1),
		Doc: "vjp of moe_slot_gather: args (w[G,E,C], src[G,E,C]) → [G,tokens,E] with w[g,e,c] at [g,src,e], 0 elsewhere"})
}

// moeMoveCost: dispatch and combine move every element of the buffer once
// and multiply it by its weight when there is one.
func moeMoveCost(args []Type, out Type, _ Attrs) (int64, int64) {
	var flops int64
	if len(args) == 3 {
		flops = max(elems(out), elems(args[0]))
	}
	return flops, ioBytes(args, out)
}

// moeSlotDotCost: one multiply-add per element of the expert buffer.
func moeSlotDotCost(args []Type, out Type, _ Attrs) (int64, int64) {
	return SatMul(2, elems(args[0])), ioBytes(args, out)
}

func inferTopKMask(args []Type, a Attrs) (Type, error) {
	x := args[0]
	if !x.DType.IsFloat() || x.Rank() < 1 {
		return Type{}, fmt.Errorf("needs a float tensor of rank ≥ 1, got %v", x)
	}
	if k, n := a.Int("k", 0), x.Shape[x.Rank()-1]; k < 1 || k > n {
		return Type{}, fmt.Errorf("k must be in 1..%d (the last dim of %v), got %d", n, x, k)
	}
	return x, nil
}

// checkSrc checks a slot → token index: i32 [G, E, C].
func checkSrc(src Type) error {
	if src.DType != I32 || src.Rank() != 3 {
		return fmt.Errorf("src must be i32[groups,experts,capacity], got %v", src)
	}
	return nil
}

func inferMoERoute(args []Type, a Attrs) (Type, error) {
	scores, mask := args[0], args[1]
	if !scores.DType.IsFloat() || scores.Rank() != 3 {
		return Type{}, fmt.Errorf("scores must be a float [groups,tokens,experts], got %v", scores)
	}
	if !mask.Equal(scores) {
		return Type{}, fmt.Errorf("mask must be %v like the scores, got %v", scores, mask)
	}
	c := a.Int("capacity", 0)
	if c < 1 {
		return Type{}, fmt.Errorf("capacity must be at least 1, got %d", c)
	}
	return T(I32, scores.Shape[0], scores.Shape[2], c), nil
}

// checkWeights checks the optional slot weights of dispatch and combine
// against src and the expert values' dtype.
func checkWeights(args []Type, d DType) error {
	if len(args) < 2 || len(args) > 3 {
		return fmt.Errorf("takes 2 or 3 args (values, src [, weights]), got %d", len(args))
	}
	if err := checkSrc(args[1]); err != nil {
		return err
	}
	if len(args) == 3 {
		w := args[2]
		if !w.Shape.Equal(args[1].Shape) || (w.DType != d && w.DType != MoEGateDType(d)) {
			return fmt.Errorf("weights must be %v or %v %v like src, got %v", d, MoEGateDType(d), args[1].Shape, w)
		}
	}
	return nil
}

func inferMoEDispatch(args []Type, _ Attrs) (Type, error) {
	if err := checkWeights(args, args[0].DType); err != nil {
		return Type{}, err
	}
	x, src := args[0], args[1]
	if !x.DType.IsFloat() || x.Rank() != 3 || x.Shape[0] != src.Shape[0] {
		return Type{}, fmt.Errorf("x must be a float [groups=%d,tokens,hidden], got %v", src.Shape[0], x)
	}
	return T(x.DType, src.Shape[1], src.Shape[0], src.Shape[2], x.Shape[2]), nil
}

// checkExpertBuffer checks y[E, G, C, M] against src[G, E, C].
func checkExpertBuffer(y, src Type) error {
	if !y.DType.IsFloat() || y.Rank() != 4 || y.Shape[0] != src.Shape[1] || y.Shape[1] != src.Shape[0] || y.Shape[2] != src.Shape[2] {
		return fmt.Errorf("y must be a float [experts=%d,groups=%d,capacity=%d,hidden] for src %v, got %v",
			src.Shape[1], src.Shape[0], src.Shape[2], src, y)
	}
	return nil
}

func inferMoECombine(args []Type, a Attrs) (Type, error) {
	if err := checkWeights(args, args[0].DType); err != nil {
		return Type{}, err
	}
	y, src := args[0], args[1]
	if err := checkExpertBuffer(y, src); err != nil {
		return Type{}, err
	}
	t := a.Int("tokens", 0)
	if t < 1 {
		return Type{}, fmt.Errorf("tokens must be at least 1, got %d", t)
	}
	return T(y.DType, src.Shape[0], t, y.Shape[3]), nil
}

func inferMoESlotDot(args []Type, _ Attrs) (Type, error) {
	y, src, x := args[0], args[1], args[2]
	if err := checkSrc(src); err != nil {
		return Type{}, err
	}
	if err := checkExpertBuffer(y, src); err != nil {
		return Type{}, err
	}
	if x.DType != y.DType || x.Rank() != 3 || x.Shape[0] != src.Shape[0] || x.Shape[2] != y.Shape[3] {
		return Type{}, fmt.Errorf("x must be %v [groups=%d,tokens,hidden=%d], got %v", y.DType, src.Shape[0], y.Shape[3], x)
	}
	return Type{DType: MoEGateDType(y.DType), Shape: src.Shape.Clone()}, nil
}

func inferMoESlotGather(args []Type, _ Attrs) (Type, error) {
	p, src := args[0], args[1]
	if err := checkSrc(src); err != nil {
		return Type{}, err
	}
	if !p.DType.IsFloat() || p.Rank() != 3 || p.Shape[0] != src.Shape[0] || p.Shape[2] != src.Shape[1] {
		return Type{}, fmt.Errorf("p must be a float [groups=%d,tokens,experts=%d], got %v", src.Shape[0], src.Shape[1], p)
	}
	return Type{DType: p.DType, Shape: src.Shape.Clone()}, nil
}

func inferMoESlotScatter(args []Type, a Attrs) (Type, error) {
	w, src := args[0], args[1]
	if err := checkSrc(src); err != nil {
		return Type{}, err
	}
	if !w.DType.IsFloat() || !w.Shape.Equal(src.Shape) {
		return Type{}, fmt.Errorf("w must be a float %v like src, got %v", src.Shape, w)
	}
	t := a.Int("tokens", 0)
	if t < 1 {
		return Type{}, fmt.Errorf("tokens must be at least 1, got %d", t)
	}
	return T(w.DType, src.Shape[0], t, src.Shape[1]), nil
}

// RandomFlops is the cost of one counter-based draw: a 64-bit mix (about
// ten integer operations) and, for a normal, Box–Muller's log, sqrt and
// cosine.
const RandomFlops = 10 + 2*TranscendentalFlops

// RandomDists are the distributions the random op draws from.
var RandomDists = []string{"uniform", "normal", "dropout"}

func inferRandom(args []Type, a Attrs) (Type, error) {
	key := args[0]
	if key.DType != I32 {
		return Type{}, fmt.Errorf("key must be i32, got %v", key)
	}
	d := a.Str("dist")
	if !slices.Contains(RandomDists, d) {
		return Type{}, fmt.Errorf("dist %q: want one of %v", d, RandomDists)
	}
	if p := a.Float("p", 0); d == "dropout" && !(p >= 0 && p < 1) {
		return Type{}, fmt.Errorf("dropout probability p=%g must be in [0, 1)", p)
	}
	dt := F32
	if s := a.Str("dtype"); s != "" {
		d, err := ParseDType(s)
		if err != nil || !d.IsFloat() {
			return Type{}, fmt.Errorf("dtype %q: want a float dtype", s)
		}
		dt = d
	}
	shape := key.Shape.Clone()
	for _, d := range a.Ints("dims") {
		if d < 1 {
			return Type{}, fmt.Errorf("dims %v: every dim must be positive", a.Ints("dims"))
		}
		shape = append(shape, d)
	}
	return Type{DType: dt, Shape: shape}, nil
}

func inferFloatRank1Or0(args []Type, _ Attrs) (Type, error) {
	if !args[0].DType.IsFloat() {
		return Type{}, fmt.Errorf("needs a float tensor, got %v", args[0])
	}
	return args[0], nil
}
