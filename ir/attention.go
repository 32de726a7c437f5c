package ir

import (
	"fmt"
	"math"
)

// Fused attention, FlashAttention-2 style (Dao 2023): softmax(scale·q·kᵀ
// [+ causal mask])·v computed block by block with an online softmax, so
// no [s, s] matrix of scores or probabilities is ever a value of the
// module. The IR has one result per op, so the work is split the way
// LayerNorm's is: the forward op returns only the output, and the
// backward ops recompute what they need from the forward's inputs.
//
//	attention(q, k, v)                     → out   [b, sq, h, hd]
//	attention_stats(q, k, out, dout)       → stats [b, h, sq, 2]: per query
//	                                          row the log-sum-exp of its
//	                                          scaled scores and D = Σ dout·out
//	attention_grad_q(q, k, v, dout, stats) → dq    [b, h, sq, hd]
//	attention_grad_k(q, k, v, dout, stats) → dk    [b, kv, sk, hd]
//	attention_grad_v(q, k, dout, stats)    → dv    [b, kv, sk, hd]
//
// q is [b, heads, sq, hd] and k, v are [b, kvHeads, sk, hd] with heads a
// multiple of kvHeads: query head i reads k/v head i/(heads/kvHeads)
// (grouped-query attention, handled inside the kernels rather than by
// repeating k and v). Under causal, query i sees keys j ≤ i + (sk − sq),
// the queries aligned to the end of the keys as causal_mask aligns them.
// scale multiplies the scores (the frontend writes 1/√hd).
//
// The output is written as [b, sq, heads, hd], FlashAttention's layout and
// the one the output projection reads: merging the heads is then a
// reshape (a view), so the one buffer is both what the projection reads
// and what the backward keeps, and the fused op keeps nothing for its
// backward beyond what the unfused attention keeps besides its
// probabilities.
//
// The statistics are recomputed in the backward rather than saved by the
// forward: keeping them would need a second result, and the one extra
// q·kᵀ sweep is what LayerNorm's and cross-entropy's gradients pay for
// their row statistics too. They are shared by the three gradient ops, so
// the sweep is made once per backward, and they stay fp32 under mixed
// precision (F32Args), as does every accumulation in the kernels.

// AttentionStatsDType is the dtype of the statistics the attention
// gradients share: fp32 whatever 16-bit dtype q has, float64 in a float64
// program.
func AttentionStatsDType(q DType) DType {
	if q == F64 {
		return F64
	}
	return F32
}

// AttentionShape is the problem one attention op solves, from its q and
// k types (global or local): batch, query heads, k/v heads, query and key
// lengths and the head dim.
type AttentionShape struct {
	Batch, Heads, KVHeads, SQ, SK, HeadDim int
}

// Group is the number of query heads that share one k/v head.
func (s AttentionShape) Group() int { return s.Heads / max(s.KVHeads, 1) }

// Pairs is the number of (query, key) scores of one query head: every
// sq·sk pair, or under causal only those a query may see. The kernels
// skip key blocks wholly above the diagonal, so this is the work they do
// up to the diagonal blocks' masked half.
func (s AttentionShape) Pairs(causal bool) int64 {
	sq, sk := int64(s.SQ), int64(s.SK)
	if !causal {
		return SatMul(sq, sk)
	}
	// Query i sees i + (sk − sq) + 1 keys: Σ over i < sq.
	return SatAdd(SatMul(sq, sk-sq+1), SatMul(sq, sq-1)/2)
}

// AttentionOutType is the type of attention's output for q: [b, sq,
// heads, hd].
func AttentionOutType(q Type) Type {
	return T(q.DType, q.Shape[0], q.Shape[2], q.Shape[1], q.Shape[3])
}

// AttentionShapeOf reads the problem from the types of q and k.
func AttentionShapeOf(q, k Type) AttentionShape {
	return AttentionShape{Batch: q.Shape[0], Heads: q.Shape[1], KVHeads: k.Shape[1], SQ: q.Shape[2], SK: k.Shape[2], HeadDim: q.Shape[3]}
}

// checkAttention checks q and k (and v when given) of an attention op
// and its attributes.
func checkAttention(q, k Type, v *Type, a Attrs) error {
	if q.Rank() != 4 || !q.DType.IsFloat() {
		return fmt.Errorf("q must be a float tensor [batch, heads, seq, head_dim], got %v", q)
	}
	if k.Rank() != 4 || k.DType != q.DType || k.Shape[0] != q.Shape[0] || k.Shape[3] != q.Shape[3] {
		return fmt.Errorf("k must be %v[%d, kv_heads, seq, %d] to match q %v, got %v", q.DType, q.Shape[0], q.Shape[3], q, k)
	}
	if k.Shape[1] == 0 || q.Shape[1]%k.Shape[1] != 0 {
		return fmt.Errorf("%d query heads cannot share %d k/v heads evenly (q %v, k %v)", q.Shape[1], k.Shape[1], q, k)
	}
	if v != nil && !v.Equal(k) {
		return fmt.Errorf("v must be %v like k, got %v", k, *v)
	}
	if a.Bool("causal") && q.Shape[2] > k.Shape[2] {
		return fmt.Errorf("causal attention of %d queries over %d keys: more queries than keys", q.Shape[2], k.Shape[2])
	}
	if s := a.Float("scale", 0); !(s > 0) || math.IsInf(s, 0) {
		return fmt.Errorf("scale must be a finite positive number, got %v", s)
	}
	return nil
}

func attentionStatsType(q Type) Type {
	return T(AttentionStatsDType(q.DType), q.Shape[0], q.Shape[1], q.Shape[2], 2)
}

// inferAttention types attention(q, k, v): [b, sq, heads, hd].
func inferAttention(args []Type, a Attrs) (Type, error) {
	if err := checkAttention(args[0], args[1], &args[2], a); err != nil {
		return Type{}, err
	}
	return AttentionOutType(args[0]), nil
}

// inferAttentionStats types attention_stats(q, k, out, dout).
func inferAttentionStats(args []Type, a Attrs) (Type, error) {
	q := args[0]
	if err := checkAttention(q, args[1], nil, a); err != nil {
		return Type{}, err
	}
	for i, what := range []string{"out", "dout"} {
		if want := AttentionOutType(q); !args[2+i].Equal(want) {
			return Type{}, fmt.Errorf("%s must be %v (attention's output for q %v), got %v", what, want, q, args[2+i])
		}
	}
	return attentionStatsType(q), nil
}

// checkAttentionGrad checks dout and stats of a gradient op.
func checkAttentionGrad(q, dout, stats Type) error {
	if want := AttentionOutType(q); !dout.Equal(want) {
		return fmt.Errorf("dout must be %v (attention's output for q %v), got %v", want, q, dout)
	}
	if want := attentionStatsType(q); !stats.Equal(want) {
		return fmt.Errorf("stats must be %v (attention_stats of q %v), got %v", want, q, stats)
	}
	return nil
}

// inferAttentionGrad types attention_grad_q and attention_grad_k (q, k,
// v, dout, stats): the gradient of q, or of k (v's type).
func inferAttentionGrad(ofK bool) func([]Type, Attrs) (Type, error) {
	return func(args []Type, a Attrs) (Type, error) {
		q, k := args[0], args[1]
		if err := checkAttention(q, k, &args[2], a); err != nil {
			return Type{}, err
		}
		if err := checkAttentionGrad(q, args[3], args[4]); err != nil {
			return Type{}, err
		}
		if ofK {
			return k, nil
		}
		return q, nil
	}
}

// inferAttentionGradV types attention_grad_v (q, k, dout, stats): dv has
// v's type, which is k's.
func inferAttentionGradV(args []Type, a Attrs) (Type, error) {
	q, k := args[0], args[1]
	if err := checkAttention(q, k, nil, a); err != nil {
		return Type{}, err
	}
	if err := checkAttentionGrad(q, args[2], args[3]); err != nil {
		return Type{}, err
	}
	return k, nil
}

// attentionCost counts perPair(hd) flops for every score pair of every
// query head (AttentionShape.Pairs) plus perOut flops per result element,
// with every argument read once and the result written once.
func attentionCost(perPair func(hd int64) int64, perOut int64) CostFunc {
	return func(args []Type, out Type, a Attrs) (int64, int64) {
		s := AttentionShapeOf(args[0], args[1])
		heads := SatMul(int64(s.Batch), int64(s.Heads))
		flops := SatMul(SatMul(heads, s.Pairs(a.Bool("causal"))), perPair(int64(s.HeadDim)))
		return SatAdd(flops, SatMul(perOut, elems(out))), ioBytes(args, out)
	}
}

// Attention's flops per score pair, by the conventions of cost.go:
//
//	attention        q·k (2·hd), scale, running max, exp(s − m), sum, p·v (2·hd)
//	attention_stats  q·k (2·hd), scale, max, exp(s − m), sum; D = Σ dout·out
//	                 adds 2 per element of out (counted on dout's elements)
//	attention_grad_q q·k (2·hd), p = exp(scale·s − lse) (2 + exp),
//	                 dp = dout·v (2·hd), ds = p·(dp − D) (2), dq += ds·k (2·hd)
//	attention_grad_k as grad_q with dk += dsᵀ·q
//	attention_grad_v q·k (2·hd), p (2 + exp), dv += pᵀ·dout (2·hd)
//
// Counted over the pairs a query may see (AttentionShape.Pairs): under
// causal about half of sq·sk, since the kernels skip the key blocks above
// the diagonal.
var (
	attentionFwdCost = attentionCost(func(hd int64) int64 { return 4*hd + 4 + TranscendentalFlops }, 0)
	attentionGradQK  = attentionCost(func(hd int64) int64 { return 6*hd + 4 + TranscendentalFlops }, 0)
	attentionGradV   = attentionCost(func(hd int64) int64 { return 4*hd + 2 + TranscendentalFlops }, 0)
)

// attentionStatsCost adds D's multiply-add per element of dout to the
// log-sum-exp sweep.
func attentionStatsCost(args []Type, out Type, a Attrs) (int64, int64) {
	flops, bytes := attentionCost(func(hd int64) int64 { return 2*hd + 4 + TranscendentalFlops }, 0)(args, out, a)
	return SatAdd(flops, SatMul(2, elems(args[3]))), bytes
}
