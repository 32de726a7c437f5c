// Package nn holds model-agnostic layers written in the frontend DSL:
// linear layers in either weight layout, with or without bias; LayerNorm
// and RMSNorm; token embeddings; rotary position embeddings; the SwiGLU
// MLP; causal self-attention with grouped-query heads, as the fused
// attention op or as primitive ops; the token loss; mixture-of-experts
// layers (MoE: five routers, capacity-bounded or dropless, GELU, ReLU or
// SwiGLU experts, Mixtral's param layout) and the balancing loss that a
// model's MoE layers may share (Balance).
// Compositions of them (GPT-2's block, package gpt2; Llama's, in
// examples/llama) live elsewhere.
//
// Each layer records the tensor-parallel hints Megatron-LM applies to it
// (projections into heads or the MLP's hidden width column-parallel, the
// projections back row-parallel, the embedding vocab-parallel), so the
// shard pass can split a model without the user restating them. Ops
// recorded inside a layer report the line of the user's call.
package nn

import (
	"fmt"
	"math"
	"slices"

	"gcompile/frontend"
)

// InitStd is the standard deviation GPT-2 and Llama initialise weights with.
const InitStd = 0.02

// LinearConfig describes a linear layer y = x·W (+ b).
type LinearConfig struct {
	// Bias adds name.bias [out].
	Bias bool
	// OutIn stores the weight [out,in] and computes x·Wᵀ, as torch's
	// nn.Linear and Hugging Face checkpoints do; otherwise it is [in,out]
	// (GPT-2's Conv1D).
	OutIn bool
	// Parallel is the tensor-parallel hint, written for the [in,out]
	// layout; OutIn adapts it.
	Parallel frontend.Parallel
	// Std is the weight's init std (0: InitStd).
	Std float64
}

// Dense is a linear layer to out features with weight name.weight.
func Dense(x *frontend.Tensor, name string, out int, cfg LinearConfig) *frontend.Tensor {
	b := x.Builder()
	in := x.Dim(-1)
	std := cfg.Std
	if std == 0 {
		std = InitStd
	}
	shape, hint := []int{in, out}, cfg.Parallel
	if cfg.OutIn {
		shape, hint = []int{out, in}, hint.OutIn()
	}
	w := b.Param(name+".weight", shape, frontend.Normal(std), hint)
	var bias *frontend.Tensor
	if cfg.Bias {
		// A row-parallel layer's bias is added once, after the partial sums
		// are reduced, so it is not split: no hint.
		biasHint := cfg.Parallel
		if biasHint == frontend.RowParallel {
			biasHint = frontend.NoParallel
		}
		bias = b.Param(name+".bias", []int{out}, frontend.Zeros, biasHint)
	}
	var y *frontend.Tensor
	if cfg.OutIn {
		y = x.MatMulT(w)
	} else {
		y = x.MatMul(w)
	}
	if bias != nil {
		y = y.Add(bias)
	}
	return y
}

// Linear is GPT-2's y = x·W + b with W [in,out] named name.weight and b
// name.bias.
func Linear(x *frontend.Tensor, name string, out int, hint frontend.Parallel, std float64) *frontend.Tensor {
	return Dense(x, name, out, LinearConfig{Bias: true, Parallel: hint, Std: std})
}

// LayerNorm normalises over the last dim with name.weight (γ, ones) and
// name.bias (β, zeros).
func LayerNorm(x *frontend.Tensor, name string, eps float64) *frontend.Tensor {
	b := x.Builder()
	n := x.Dim(-1)
	g := b.Param(name+".weight", []int{n}, frontend.Ones, frontend.NoParallel)
	beta := b.Param(name+".bias", []int{n}, frontend.Zeros, frontend.NoParallel)
	return x.LayerNorm(g, beta, eps)
}

// RMSNorm normalises over the last dim by the root mean square with
// name.weight (γ, ones) and no shift.
func RMSNorm(x *frontend.Tensor, name string, eps float64) *frontend.Tensor {
	g := x.Builder().Param(name+".weight", []int{x.Dim(-1)}, frontend.Ones, frontend.NoParallel)
	return x.RMSNorm(g, eps)
}

// Embedding looks ids up in a vocab-parallel table name.weight [vocab,dim]
// and returns the embeddings and the table (for a tied LM head).
func Embedding(ids *frontend.Tensor, name string, vocab, dim int) (out, table *frontend.Tensor) {
	table = ids.Builder().Param(name+".weight", []int{vocab, dim}, frontend.Normal(InitStd), frontend.VocabParallel)
	return table.Gather(ids), table
}

// PositionEmbedding adds learned position embeddings to x [batch, seq,
// dim] from table [positions, dim]: row p of the table to the token at
// position p. In training a token's position is its row, so that is the
// table's first seq rows (the table itself when it has seq rows); when the
// model is built for generation it is the table gathered at each token's
// position (Builder.Positions).
func PositionEmbedding(x, table *frontend.Tensor) *frontend.Tensor {
	b := x.Builder()
	if x.Value() == nil || table.Value() == nil {
		return b.Poisoned()
	}
	if b.Generating() {
		pos := b.Positions()
		// The table's rows bound the positions the runtime may feed.
		if v := pos.Value(); v != nil && (v.Attrs.Int("limit", 0) == 0 || v.Attrs.Int("limit", 0) > table.Dim(0)) {
			v.Attrs["limit"] = table.Dim(0)
		}
		return x.Add(table.Gather(pos))
	}
	if seq := x.Dim(1); table.Dim(0) != seq {
		table = table.Slice(0, 0, seq)
	}
	return x.Add(table)
}

// SplitHeads views x [batch, seq, heads·hd] as [batch, heads, seq, hd].
// Heads stay a dim of their own (not merged with the batch) so they can be
// split across tensor-parallel ranks.
func SplitHeads(x *frontend.Tensor, heads int) *frontend.Tensor {
	if heads <= 0 {
		x.Builder().Errorf("SplitHeads(x, %d): want a positive number of heads", heads)
		return x
	}
	if x.Value() == nil {
		return x
	}
	if s := x.Shape(); len(s) != 3 || s[2]%heads != 0 {
		x.Builder().Errorf("SplitHeads(x, %d): x %v must be [batch, seq, hidden] with hidden divisible by the %d heads", heads, s, heads)
		return x.Builder().Poisoned()
	}
	batch, seq := x.Dim(0), x.Dim(1)
	return x.Reshape(batch, seq, heads, x.Dim(2)/heads).Transpose(0, 2, 1, 3)
}

// CausalAttention is softmax(q·kᵀ/√hd + causal mask)·v for q [batch,
// heads, seq, hd] and k, v [batch, kvHeads, seq, hd], merged back to
// [batch, seq, heads·hd]. With fewer k/v heads than query heads
// (grouped-query attention) each k/v head serves heads/kvHeads
// consecutive query heads. It is the fused attention op (Tensor.Attention):
// no [batch, heads, seq, seq] tensor is made, so --recompute selective has
// nothing to drop here, and the pass says so. CausalAttentionUnfused is
// the same attention as primitive ops.
func CausalAttention(q, k, v *frontend.Tensor) *frontend.Tensor {
	if !sharedHeads(q, k) {
		return q.Builder().Poisoned()
	}
	// The op's output is [batch, seq, heads, hd]: merging the heads is a
	// view, no transpose. Its sizes are read from it, once the op has
	// checked q's rank.
	out := q.Attention(k, v, true)
	if out.Value() == nil {
		return out
	}
	s := out.Shape()
	return out.Reshape(s[0], s[1], s[2]*s[3])
}

// CausalAttentionUnfused is CausalAttention written as primitive ops:
// k and v repeated to the query heads, q·kᵀ, its scaling, the causal mask
// and the softmax, then the product with v. Its scores and probabilities,
// the [batch, heads, seq, seq] tensors, are tagged as what --recompute
// selective drops. It is kept to check the fused op against and for
// studying the memory the fused op saves.
//
// When the model is built for generation it is CausalAttention: the keys
// and values are cached, and the fused op over the cache is the only
// attention generation records.
func CausalAttentionUnfused(q, k, v *frontend.Tensor) *frontend.Tensor {
	b := q.Builder()
	if b.Generating() {
		return CausalAttention(q, k, v)
	}
	if !sharedHeads(q, k) {
		return b.Poisoned()
	}
	batch, heads, seq, hd := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	if kv := k.Dim(1); kv != heads {
		k = k.RepeatInterleave(1, heads/kv)
		v = v.RepeatInterleave(1, heads/kv)
	}
	var att *frontend.Tensor
	b.RecomputeSelective(func() {
		att = q.MatMulT(k).Scale(1 / math.Sqrt(float64(hd))).CausalMask().Softmax()
	})
	return att.MatMul(v).Transpose(0, 2, 1, 3).Reshape(batch, seq, heads*hd)
}

// sharedHeads reports whether k's heads divide q's, reporting the error
// when they do not (a poisoned tensor has been reported already).
func sharedHeads(q, k *frontend.Tensor) bool {
	if q.Value() == nil || k.Value() == nil {
		return false
	}
	if len(q.Shape()) != 4 || len(k.Shape()) != 4 {
		return true // the attention op names the ranks, once
	}
	if heads, kv := q.Dim(1), k.Dim(1); kv <= 0 || heads%kv != 0 {
		q.Builder().Errorf("attention: %d query heads cannot share %d k/v heads evenly", heads, kv)
		return false
	}
	return true
}

// AttentionConfig sizes grouped-query self-attention.
type AttentionConfig struct {
	Heads   int
	KVHeads int     // 0: Heads (multi-head attention)
	HeadDim int     // 0: hidden/Heads
	Theta   float64 // RoPE base; 0: no rotary embedding
	Bias    bool    // biases on q, k and v (Qwen2 has them; Llama does not)
	ProjStd float64 // init std of the output projection (0: InitStd)
	// Unfused writes the attention core as primitive ops
	// (CausalAttentionUnfused) instead of the fused attention op.
	Unfused bool
}

// GroupedQueryAttention is causal self-attention over x [batch,seq,hidden]
// with Hugging Face Llama's projections, weights [out,in]:
// name.q_proj (column-parallel), name.k_proj and name.v_proj (split by
// whole k/v heads when tensor parallelism divides them, replicated
// otherwise), name.o_proj (row-parallel), and rotary embeddings on q and k.
func GroupedQueryAttention(x *frontend.Tensor, name string, cfg AttentionConfig) *frontend.Tensor {
	b := x.Builder()
	if x.Value() == nil {
		// An earlier op failed and said why; its poisoned result has no
		// sizes to check (a "hidden size 0" here would be noise).
		return x
	}
	hidden := x.Dim(-1)
	kvHeads, hd := cfg.KVHeads, cfg.HeadDim
	if kvHeads == 0 {
		kvHeads = cfg.Heads
	}
	if hd == 0 && cfg.Heads > 0 {
		hd = hidden / cfg.Heads
	}
	switch {
	case cfg.Heads <= 0:
		b.Errorf("attention %s: Heads %d: want at least 1", name, cfg.Heads)
		return b.Poisoned()
	case cfg.HeadDim < 0:
		b.Errorf("attention %s: HeadDim %d: want a positive size, or 0 for hidden/Heads", name, cfg.HeadDim)
		return b.Poisoned()
	case cfg.KVHeads < 0:
		b.Errorf("attention %s: KVHeads %d: want a positive count, or 0 for Heads", name, cfg.KVHeads)
		return b.Poisoned()
	case hd <= 0 || cfg.HeadDim == 0 && hidden%cfg.Heads != 0:
		b.Errorf("attention %s: hidden size %d is not divisible by %d heads", name, hidden, cfg.Heads)
		return b.Poisoned()
	case cfg.Heads%kvHeads != 0:
		b.Errorf("attention %s: %d heads are not a multiple of %d k/v heads", name, cfg.Heads, kvHeads)
		return b.Poisoned()
	case cfg.Theta != 0 && hd%2 != 0:
		b.Errorf("attention %s: rotary embeddings need an even head size, got %d", name, hd)
		return b.Poisoned()
	}
	proj := func(suffix string, heads int, hint frontend.Parallel) *frontend.Tensor {
		y := Dense(x, name+"."+suffix, heads*hd, LinearConfig{Bias: cfg.Bias, OutIn: true, Parallel: hint})
		return SplitHeads(y, heads)
	}
	q := proj("q_proj", cfg.Heads, frontend.ColumnParallel)
	k := proj("k_proj", kvHeads, frontend.HeadParallel(hd))
	v := proj("v_proj", kvHeads, frontend.HeadParallel(hd))
	if cfg.Theta != 0 {
		q, k = q.RoPE(cfg.Theta), k.RoPE(cfg.Theta)
	}
	core := CausalAttention
	if cfg.Unfused {
		core = CausalAttentionUnfused
	}
	y := core(q, k, v)
	return Dense(y, name+".o_proj", hidden, LinearConfig{OutIn: true, Parallel: frontend.RowParallel, Std: cfg.ProjStd})
}

// SwiGLU is Llama's MLP, weights [out,in] without biases:
// name.down_proj(silu(name.gate_proj(x)) · name.up_proj(x)), the gate and
// up projections column-parallel and the down projection row-parallel.
func SwiGLU(x *frontend.Tensor, name string, ffn int, downStd float64) *frontend.Tensor {
	cfg := LinearConfig{OutIn: true, Parallel: frontend.ColumnParallel}
	gate := Dense(x, name+".gate_proj", ffn, cfg)
	up := Dense(x, name+".up_proj", ffn, cfg)
	return Dense(gate.Silu().Mul(up), name+".down_proj", x.Dim(-1), LinearConfig{OutIn: true, Parallel: frontend.RowParallel, Std: downStd})
}

// CrossEntropy is the mean token loss of logits [..., vocab] against
// integer labels of the leading shape.
//
// When the vocabulary is padded past the ids the data can hold
// (Builder.Classes, from the tokenizer), the padding classes are masked out
// of the softmax: a constant row of 0 for real classes and −1e30 for the
// padding is added to the logits, so their probability is exactly 0, they
// take no gradient, and the loss is the one an unpadded vocabulary gives.
func CrossEntropy(logits, labels *frontend.Tensor) *frontend.Tensor {
	if logits.Value() == nil {
		return logits
	}
	shape := logits.Shape()
	rows := 1
	for _, d := range shape[:max(len(shape)-1, 0)] {
		rows *= d
	}
	if labels != nil && labels.Value() != nil {
		// Labels of another shape with as many ids would reshape to a row
		// each and pair every row with another's label (transposed targets
		// trained without a word). Either side flattened to its rows is
		// the model's own flattening, in row order, and is taken.
		lead := shape[:max(len(shape)-1, 0)]
		if ls := labels.Shape(); len(ls) > 1 && len(lead) > 1 && !slices.Equal(ls, lead) {
			logits.Builder().Errorf("CrossEntropy: labels %v must have the logits' leading shape %v (or either be flat, [%d]): logits %v", ls, lead, rows, shape)
			return logits.Builder().Poisoned()
		}
	}
	vocab := logits.Dim(-1)
	flat := logits.Reshape(rows, vocab)
	if classes := logits.Builder().Classes(); classes > 0 && classes < vocab {
		flat = flat.Add(vocabMask(logits.Builder(), classes, vocab))
	}
	return flat.CrossEntropy(labels.Reshape(rows))
}

// PaddingLogit is what the vocabulary mask adds to a padding class's
// logit: far below any real logit, so exp of it is 0 in every float type
// (fp16 rounds it to −Inf), yet finite, so no 0·∞ can turn into a NaN.
const PaddingLogit = -1e30

// vocabMask is the [1, vocab] table of 0 for the first classes classes and
// PaddingLogit for the rest.
func vocabMask(b *frontend.Builder, classes, vocab int) *frontend.Tensor {
	mask := make([]float64, vocab)
	for i := classes; i < vocab; i++ {
		mask[i] = PaddingLogit
	}
	// The name's prefix is how --save finds the head's table to trim.
	return b.Constant(fmt.Sprintf("vocab_mask_%d_of_%d", classes, vocab), mask, 1, vocab)
}
