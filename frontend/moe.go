package frontend

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"

	"gcompile/ir"
)

// The mixture-of-experts primitives (ir/moe.go); package nn's MoE layer
// composes them into routers.

// TopKMask is 1 at the k largest elements of each row along the last dim
// and 0 elsewhere (ties to the lower index); no gradient flows through it.
func (t *Tensor) TopKMask(k int) *Tensor { return t.op("top_k_mask", ir.Attrs{"k": k}) }

// Less is 1 where t < u and 0 elsewhere, broadcasting NumPy-style; no
// gradient flows through it.
func (t *Tensor) Less(u *Tensor) *Tensor { return t.binary("less", u) }

// MoERoute assigns tokens to expert slots from scores [G,T,E] and a 0/1
// selection mask [G,T,E]: the i32 [G,E,capacity] token of each slot, −1
// for an empty one. Each group fills every token's first choice in token
// order, then every second choice, until an expert is full.
func MoERoute(scores, mask *Tensor, capacity int) *Tensor {
	return scores.op("moe_route", ir.Attrs{"capacity": capacity}, mask)
}

// MoEDispatch gathers the tokens of x [G,T,M] into the expert buffer
// [E,G,C,M] by src [G,E,C], each scaled by its slot's weight w [G,E,C]
// when w is not nil.
func (t *Tensor) MoEDispatch(src, w *Tensor) *Tensor {
	nilTensor(t)
	if w == nil {
		return t.op("moe_dispatch", nil, src)
	}
	return t.op("moe_dispatch", nil, src, w)
}

// MoECombine scatters the expert buffer t [E,G,C,M] back to [G,tokens,M]:
// each token gets the sum over its slots of w·y (w nil: weight 1), zeros
// for a token no expert took.
func (t *Tensor) MoECombine(src, w *Tensor, tokens int) *Tensor {
	nilTensor(t)
	attrs := ir.Attrs{"tokens": tokens}
	if w == nil {
		return t.op("moe_combine", attrs, src)
	}
	return t.op("moe_combine", attrs, src, w)
}

// MoESlotGather reads p [G,T,E] at each slot's token and expert: the
// router's weight of every slot, [G,E,C], 0 for an empty slot.
func (t *Tensor) MoESlotGather(src *Tensor) *Tensor { return t.op("moe_slot_gather", nil, src) }

// RandomKeys is the model's per-token random keys, the i32 batch input
// ir.InputRandomKey [batch, seq] the runtime fills each training step
// from (seed, step, token index), and with −1 for evaluation. Every call
// returns the same input; its shape must not change.
func (b *Builder) RandomKeys(batch, seq int) *Tensor {
	if v := b.m.Source(ir.InputRandomKey); v != nil {
		if !v.Type.Shape.Equal(ir.Shape{batch, seq}) {
			b.fail(userPos(), fmt.Errorf("random keys are %v; a second use asks for [%d,%d]", v.Type, batch, seq))
			return &Tensor{b: b}
		}
		return &Tensor{b: b, v: v}
	}
	return b.Input(ir.InputRandomKey, ir.I32, batch, seq)
}

// Random draws, for every key of t (RandomKeys or a view of them), the
// numbers of a tensor of shape dims from dist ("uniform" on (0,1) or
// "normal"), in the named stream: one layer's router noise and another's
// jitter are different streams, so they are independent. A key of −1
// gives the distribution's centre. The result has t's shape followed by
// dims, in the model's float dtype; no gradient flows through it.
func (t *Tensor) Random(dist, stream string, dims ...int) *Tensor {
	return t.op("random", randomAttrs(t.b, dist, stream, dims))
}

// DropoutMask draws inverted dropout's multipliers for every key of t:
// 1/(1−p) with probability 1−p, else 0, in the named stream; 1 for a key
// of −1 (evaluation).
func (t *Tensor) DropoutMask(stream string, p float64, dims ...int) *Tensor {
	nilTensor(t)
	attrs := randomAttrs(t.b, "dropout", stream, dims)
	attrs["p"] = p
	return t.op("random", attrs)
}

// randomAttrs names a stream by a hash of its name, so the same name
// gives the same numbers in every build of the model.
func randomAttrs(b *Builder, dist, stream string, dims []int) ir.Attrs {
	h := fnv.New32a()
	h.Write([]byte(stream))
	return ir.Attrs{"dist": dist, "stream": int(h.Sum32() & 0x7fffffff), "dims": slices.Clone(dims), "dtype": b.cfg.Float.String()}
}

// NormalCDF is Φ(t), the standard normal CDF, elementwise.
func (t *Tensor) NormalCDF() *Tensor { return t.op("normal_cdf", nil) }

// Scalar is the constant x as a rank-0 tensor of the model's float dtype,
// for arithmetic with tensors (broadcast by Add, Mul, …).
func (b *Builder) Scalar(x float64) *Tensor {
	pos := userPos()
	if math.IsNaN(x) {
		// As a Constant's: every value computed from it would be NaN, and
		// the run would stop at its first loss, naming no line.
		b.fail(pos, fmt.Errorf("Scalar(NaN): the value is NaN, which would make every value computed from it NaN"))
		return &Tensor{b: b}
	}
	return &Tensor{b: b, v: b.scalarConst(x, pos)}
}
