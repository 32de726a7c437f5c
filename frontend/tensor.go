package frontend

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gcompile/ir"
)

// Tensor is a value in the model being recorded. A Tensor whose op failed
// is poisoned (no value): ops on it record nothing and report nothing more,
// so one mistake gives one error.
type Tensor struct {
	b *Builder
	v *ir.Value
}

// Poisoned is a tensor with no value, for a layer that has reported an
// error (b.Errorf) to return: ops on it record nothing and report nothing
// more, so the model's one mistake gives one error.
func (b *Builder) Poisoned() *Tensor { return &Tensor{b: b} }

// Value is the recorded IR value (nil when poisoned).
func (t *Tensor) Value() *ir.Value {
	nilTensor(t)
	return t.v
}

// Shape is the tensor's static shape (nil when poisoned).
func (t *Tensor) Shape() []int {
	nilTensor(t)
	if t.v == nil {
		return nil
	}
	return t.v.Type.Shape.Clone()
}

// Dim returns the size of dim i (negative i counts from the end); 0 when
// the tensor is poisoned.
func (t *Tensor) Dim(i int) int {
	nilTensor(t)
	if t.v == nil {
		return 0
	}
	r := t.v.Type.Rank()
	if i < -r || i >= r {
		t.b.fail(userPos(), fmt.Errorf("Dim(%d) of %v: a rank-%d tensor has dims %d..%d", i, t.v.Type, r, -r, r-1))
		return 0
	}
	if i < 0 {
		i += r
	}
	return t.v.Type.Shape[i]
}

// DType is the element type.
func (t *Tensor) DType() ir.DType {
	nilTensor(t)
	if t.v == nil {
		return ir.Invalid
	}
	return t.v.Type.DType
}

// Builder returns the builder recording t.
func (t *Tensor) Builder() *Builder {
	nilTensor(t)
	return t.b
}

// errNilTensor is the panic of a method called on a nil *Tensor, which
// has no builder to record the error in: the loader reports it at the
// user's line.
var errNilTensor = errors.New("a method called on a nil *Tensor (a variable never assigned a tensor?)")

// errZeroTensor is the panic of a method called on a Tensor no builder
// made (a frontend.Tensor{} literal), which has no builder either.
var errZeroTensor = errors.New("a method called on a zero frontend.Tensor{}, which no builder made: tensors come from b.Input, b.Param, b.Constant and the ops on them")

// nilTensor panics with errNilTensor when t is nil, errZeroTensor when no
// builder made it: a method that reads t before op() would otherwise
// fail with a bare nil dereference.
func nilTensor(t *Tensor) {
	if t == nil {
		panic(errNilTensor)
	}
	if t.b == nil {
		panic(errZeroTensor)
	}
}

func (t *Tensor) op(op string, attrs ir.Attrs, others ...*Tensor) *Tensor {
	nilTensor(t)
	if t.b.foreign(userPos(), others...) {
		return &Tensor{b: t.b}
	}
	args := []*ir.Value{t.v}
	for _, o := range others {
		args = append(args, o.v)
	}
	return t.b.record(userPos(), op, attrs, args)
}

func (b *Builder) record(pos ir.Pos, op string, attrs ir.Attrs, args []*ir.Value) *Tensor {
	b.live()
	if slices.Contains(args, nil) {
		return &Tensor{b: b}
	}
	meta := b.meta()
	for _, a := range args {
		// A param declared inside KeepFP32 keeps every op that reads it
		// in fp32, wherever the op is recorded.
		if a.Op == "param" && a.Meta.Precision == ir.F32 {
			meta.Precision = ir.F32
		}
	}
	v, err := b.m.Add(op, args, attrs, meta, pos)
	if err != nil {
		b.report(err)
		return &Tensor{b: b}
	}
	return &Tensor{b: b, v: v}
}

// binary broadcasts the smaller operand NumPy-style, then applies op.
func (t *Tensor) binary(op string, u *Tensor) *Tensor {
	nilTensor(t)
	if t.b.foreign(userPos(), u) || t.v == nil || u.v == nil {
		return &Tensor{b: t.b}
	}
	pos := userPos()
	x, y := t.v, u.v
	switch {
	case x.Type.Shape.Equal(y.Type.Shape):
	case ir.BroadcastCompatible(y.Type.Shape, x.Type.Shape):
		y = t.b.record(pos, "broadcast", ir.Attrs{"shape": []int(x.Type.Shape.Clone())}, []*ir.Value{y}).v
	case ir.BroadcastCompatible(x.Type.Shape, y.Type.Shape):
		x = t.b.record(pos, "broadcast", ir.Attrs{"shape": []int(y.Type.Shape.Clone())}, []*ir.Value{x}).v
	default:
		t.b.fail(pos, fmt.Errorf("%s: shapes %v and %v do not broadcast", op, x.Type, y.Type))
		return &Tensor{b: t.b}
	}
	return t.b.record(pos, op, nil, []*ir.Value{x, y})
}

// Add returns t + u, broadcasting NumPy-style.
func (t *Tensor) Add(u *Tensor) *Tensor { return t.binary("add", u) }

// Sub returns t − u, broadcasting NumPy-style.
func (t *Tensor) Sub(u *Tensor) *Tensor { return t.binary("sub", u) }

// Mul returns t · u elementwise, broadcasting NumPy-style.
func (t *Tensor) Mul(u *Tensor) *Tensor { return t.binary("mul", u) }

// Div returns t / u elementwise, broadcasting NumPy-style.
func (t *Tensor) Div(u *Tensor) *Tensor { return t.binary("div", u) }

// Scale multiplies every element by the constant s.
func (t *Tensor) Scale(s float64) *Tensor {
	nilTensor(t)
	if t.v == nil {
		return t
	}
	pos := userPos()
	if math.IsNaN(s) || math.IsInf(s, 0) {
		t.b.fail(pos, fmt.Errorf("Scale(%g): the factor must be a finite number", s))
		return &Tensor{b: t.b}
	}
	return t.b.record(pos, "scale", nil, []*ir.Value{t.v, t.b.scalarConst(s, pos)})
}

// Neg returns −t.
func (t *Tensor) Neg() *Tensor { return t.op("neg", nil) }

// Exp returns eᵗ.
func (t *Tensor) Exp() *Tensor { return t.op("exp", nil) }

// Log returns ln t.
func (t *Tensor) Log() *Tensor { return t.op("log", nil) }

// Tanh returns tanh t.
func (t *Tensor) Tanh() *Tensor { return t.op("tanh", nil) }

// Sqrt returns √t.
func (t *Tensor) Sqrt() *Tensor { return t.op("sqrt", nil) }

// Gelu is GPT-2's tanh approximation of GELU.
func (t *Tensor) Gelu() *Tensor { return t.op("gelu", nil) }

// Relu returns max(t, 0).
func (t *Tensor) Relu() *Tensor { return t.op("relu", nil) }

// Silu is x·σ(x), the SiLU (swish) activation of SwiGLU.
func (t *Tensor) Silu() *Tensor { return t.op("silu", nil) }

// RMSNorm normalises over the last dim by the root mean square and scales
// by gamma: x/√(mean(x²)+eps)·γ, the statistic in float64 on every backend.
func (t *Tensor) RMSNorm(gamma *Tensor, eps float64) *Tensor {
	return t.op("rmsnorm", ir.Attrs{"eps": eps}, gamma)
}

// RoPE rotates t [..., positions, d] by rotary position embeddings with
// base theta, in Hugging Face Llama's rotate-half layout: element i of a
// row at position p turns with element i+d/2 by p·theta^(−2i/d).
//
// When the model is built for generation, the position of a row is the
// token's absolute position (Builder.Positions), not its row.
func (t *Tensor) RoPE(theta float64) *Tensor {
	nilTensor(t)
	if t.b.Generating() {
		return t.op("rope_at", ir.Attrs{"theta": theta}, t.b.Positions())
	}
	return t.op("rope", ir.Attrs{"theta": theta})
}

// Attention is fused scaled dot-product attention, softmax(t·kᵀ/√hd
// [+ causal mask])·v, for t = q [batch, heads, seq, hd] and k, v
// [batch, kvHeads, seq, hd] with heads a multiple of kvHeads (grouped-query
// attention: query head i reads k/v head i/(heads/kvHeads), no copies of
// k and v). The result is [batch, seq, heads, hd], FlashAttention's layout:
// Reshape(batch, seq, heads·hd) merges the heads without a copy. It is one
// op, attention, computed block by block with an online softmax as
// FlashAttention-2 does: no [seq, seq] scores or probabilities exist, in
// the forward or in the backward. Under causal, query i sees keys
// j ≤ i + (kv seq − q seq).
func (t *Tensor) Attention(k, v *Tensor, causal bool) *Tensor {
	return t.ScaledAttention(k, v, causal, 1/math.Sqrt(float64(max(t.Dim(-1), 1))))
}

// ScaledAttention is Attention with the scores multiplied by scale
// instead of 1/√hd.
//
// When the model is built for generation, causal attention keeps its keys
// and values in a cache of its own (see Generation).
func (t *Tensor) ScaledAttention(k, v *Tensor, causal bool, scale float64) *Tensor {
	nilTensor(t)
	if t.b.Generating() {
		return t.cachedAttention(k, v, causal, scale)
	}
	attrs := ir.Attrs{"scale": scale}
	if causal {
		attrs["causal"] = true
	}
	return t.op("attention", attrs, k, v)
}

// MatMul multiplies the last two dims: [...,m,k]·[k,n] or batched [...,m,k]·[...,k,n].
func (t *Tensor) MatMul(w *Tensor) *Tensor { return t.op("matmul", nil, w) }

// MatMulT multiplies by w transposed in its last two dims: t·wᵀ. The tied
// LM head (x·wteᵀ) and attention scores (q·kᵀ) use it without a transpose copy.
func (t *Tensor) MatMulT(w *Tensor) *Tensor { return t.op("matmul", ir.Attrs{"transB": true}, w) }

// Reshape views the elements with a new shape of the same size.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	nilTensor(t)
	if t.v != nil && t.v.Type.Shape.Equal(shape) {
		return t
	}
	return t.op("reshape", ir.Attrs{"shape": slices.Clone(shape)})
}

// Transpose permutes the dims: out dim i is t's dim perm[i].
func (t *Tensor) Transpose(perm ...int) *Tensor {
	return t.op("transpose", ir.Attrs{"perm": slices.Clone(perm)})
}

// Slice takes [start,end) along dim.
func (t *Tensor) Slice(dim, start, end int) *Tensor {
	return t.op("slice", ir.Attrs{"dim": dim, "start": start, "end": end})
}

// RepeatInterleave repeats each slice along dim `repeats` times in place
// ([k0,k1] → [k0,k0,k1,k1]): grouped-query attention's k/v heads shared by
// consecutive query heads.
func (t *Tensor) RepeatInterleave(dim, repeats int) *Tensor {
	nilTensor(t)
	if repeats == 1 {
		return t
	}
	return t.op("repeat_interleave", ir.Attrs{"dim": dim, "repeats": repeats})
}

// Concat joins tensors along dim.
func Concat(dim int, ts ...*Tensor) *Tensor {
	if len(ts) == 0 {
		// No tensor, no builder to report to: the build reports a panic
		// in the model at its line ("model panicked: …"), which a tensor
		// of nothing would only lead to as "did not call b.Loss".
		panic("frontend.Concat: no tensors to concatenate")
	}
	nilTensor(ts[0])
	if t := ts[0]; t.v != nil && dim < 0 && dim >= -t.v.Type.Rank() {
		dim += t.v.Type.Rank() // counted from the end, as the reductions take it
	}
	return ts[0].op("concat", ir.Attrs{"dim": dim}, ts[1:]...)
}

// Broadcast expands t to shape (NumPy rules).
func (t *Tensor) Broadcast(shape ...int) *Tensor {
	return t.op("broadcast", ir.Attrs{"shape": slices.Clone(shape)})
}

// Sum reduces over axes (all axes when none are given).
func (t *Tensor) Sum(axes ...int) *Tensor { return t.reduce("reduce_sum", axes) }

// Mean averages over axes (all axes when none are given).
func (t *Tensor) Mean(axes ...int) *Tensor { return t.reduce("reduce_mean", axes) }

// Max takes the maximum over axes (all axes when none are given).
func (t *Tensor) Max(axes ...int) *Tensor { return t.reduce("reduce_max", axes) }

func (t *Tensor) reduce(op string, axes []int) *Tensor {
	nilTensor(t)
	if t.v == nil {
		return t
	}
	if len(axes) == 0 {
		for i := range t.v.Type.Rank() {
			axes = append(axes, i)
		}
	}
	axes = slices.Clone(axes)
	r := t.v.Type.Rank()
	for i, a := range axes {
		if a < -r || a >= r {
			// Named as written: normalised, -3 of a rank-2 tensor would
			// read as -1.
			t.b.fail(userPos(), fmt.Errorf("%s over axis %d of %v: a rank-%d tensor has axes %d..%d", op, a, t.v.Type, r, -r, r-1))
			return &Tensor{b: t.b}
		}
		if a < 0 {
			axes[i] = a + r
		}
	}
	slices.Sort(axes)
	return t.op(op, ir.Attrs{"axes": axes})
}

// Softmax normalises over the last dim.
func (t *Tensor) Softmax() *Tensor { return t.op("softmax", nil) }

// CausalMask hides future keys in attention scores [...,s,t] with −Inf.
func (t *Tensor) CausalMask() *Tensor { return t.op("causal_mask", nil) }

// LayerNorm normalises over the last dim with scale gamma and shift beta.
func (t *Tensor) LayerNorm(gamma, beta *Tensor, eps float64) *Tensor {
	return t.op("layernorm", ir.Attrs{"eps": eps}, gamma, beta)
}

// Gather looks up rows of the table t ([vocab,dim]) by ids.
func (t *Tensor) Gather(ids *Tensor) *Tensor { return t.op("embedding", nil, ids) }

// CrossEntropy is the mean over rows of −log softmax(t)[label].
//
// When the model is built for generation, t is what the module outputs
// (ir.OutputLogits): the loss itself is not computed.
func (t *Tensor) CrossEntropy(labels *Tensor) *Tensor {
	nilTensor(t)
	if t.b.Generating() && t.v != nil {
		if t.b.logits != nil {
			t.b.fail(userPos(), errors.New("CrossEntropy is called twice: generation needs one set of logits to sample from"))
		}
		t.b.logits = t.v
	}
	return t.op("cross_entropy", nil, labels)
}

// Cast converts the element type.
func (t *Tensor) Cast(d ir.DType) *Tensor { return t.op("cast", ir.Attrs{"to": d.String()}) }
