// Package nn holds the layers of a GPT written in the frontend DSL. Names
// follow Hugging Face GPT-2 (c_attn, c_proj, c_fc, ln_1, …) so a saved
// checkpoint maps onto other tools' tensors, and weights are [in,out] as in
// GPT-2's Conv1D: y = x·W + b.
//
// Each layer records the tensor-parallel hints Megatron-LM applies to it
// (fused q,k,v and the MLP's first weight column-parallel, both output
// projections row-parallel, the embedding vocab-parallel), so the shard pass
// can split the model without the user restating it.
package nn

import (
	"math"

	"gcompile/frontend"
)

// LayerNormEps is GPT-2's LayerNorm epsilon.
const LayerNormEps = 1e-5

// InitStd is GPT-2's standard deviation for weight initialisation.
const InitStd = 0.02

// Linear is y = x·W + b with W [in,out] named name.weight and b name.bias.
func Linear(x *frontend.Tensor, name string, out int, hint frontend.Parallel, std float64) *frontend.Tensor {
	b := x.Builder()
	in := x.Dim(-1)
	w := b.Param(name+".weight", []int{in, out}, frontend.Normal(std), hint)
	// A row-parallel layer's bias is added once, after the partial sums are
	// reduced, so it is not split: no hint.
	biasHint := hint
	if hint == frontend.RowParallel {
		biasHint = frontend.NoParallel
	}
	bias := b.Param(name+".bias", []int{out}, frontend.Zeros, biasHint)
	return x.MatMul(w).Add(bias)
}

// LayerNorm normalises over the last dim with name.weight (γ, ones) and
// name.bias (β, zeros).
func LayerNorm(x *frontend.Tensor, name string) *frontend.Tensor {
	b := x.Builder()
	n := x.Dim(-1)
	g := b.Param(name+".weight", []int{n}, frontend.Ones, frontend.NoParallel)
	beta := b.Param(name+".bias", []int{n}, frontend.Zeros, frontend.NoParallel)
	return x.LayerNorm(g, beta, LayerNormEps)
}

// Embedding looks ids up in a vocab-parallel table name.weight [vocab,dim]
// and returns the embeddings and the table (for a tied LM head).
func Embedding(ids *frontend.Tensor, name string, vocab, dim int) (out, table *frontend.Tensor) {
	table = ids.Builder().Param(name+".weight", []int{vocab, dim}, frontend.Normal(InitStd), frontend.VocabParallel)
	return table.Gather(ids), table
}

// Attention is causal multi-head self-attention over x [batch,seq,hidden]
// with fused q,k,v (name.c_attn, column-parallel: heads split across tensor
// ranks) and output projection name.c_proj (row-parallel). projStd is the
// output projection's init std (GPT-2 scales it by 1/√(2·layers)).
func Attention(x *frontend.Tensor, name string, heads int, projStd float64) *frontend.Tensor {
	b := x.Builder()
	batch, seq, hidden := x.Dim(0), x.Dim(1), x.Dim(2)
	if heads <= 0 || hidden%heads != 0 {
		b.Errorf("attention %s: hidden size %d is not divisible by %d heads", name, hidden, heads)
		return x
	}
	hd := hidden / heads
	// q, k and v are three column blocks of one weight; under tensor
	// parallelism each rank takes its heads' columns of every block.
	qkv := Linear(x, name+".c_attn", 3*hidden, frontend.FusedColumnParallel(3), InitStd)
	split := func(i int) *frontend.Tensor {
		// [b,s,h] → [b,s,heads,hd] → [b,heads,s,hd]. Heads stay a dim of
		// their own (not merged with the batch) so they can be split
		// across tensor-parallel ranks.
		return qkv.Slice(2, i*hidden, (i+1)*hidden).
			Reshape(batch, seq, heads, hd).
			Transpose(0, 2, 1, 3)
	}
	q, k, v := split(0), split(1), split(2)
	att := q.MatMulT(k).Scale(1 / math.Sqrt(float64(hd))).CausalMask().Softmax()
	y := att.MatMul(v).
		Transpose(0, 2, 1, 3).
		Reshape(batch, seq, hidden)
	return Linear(y, name+".c_proj", hidden, frontend.RowParallel, projStd)
}

// MLP is c_fc (4·hidden, column-parallel) → activation → c_proj (row-parallel).
// activation is "gelu" (GPT-2's tanh approximation) or "relu".
func MLP(x *frontend.Tensor, name, activation string, projStd float64) *frontend.Tensor {
	hidden := x.Dim(-1)
	h := Linear(x, name+".c_fc", 4*hidden, frontend.ColumnParallel, InitStd)
	switch activation {
	case "relu":
		h = h.Relu()
	default:
		h = h.Gelu()
	}
	return Linear(h, name+".c_proj", hidden, frontend.RowParallel, projStd)
}

// BlockConfig sizes a transformer block.
type BlockConfig struct {
	Heads      int
	Layers     int    // total layers, for GPT-2's residual projection init scaling
	Activation string // "gelu" or "relu"
}

// TransformerBlock is GPT-2's pre-LayerNorm block:
// x + attn(ln_1(x)), then + mlp(ln_2(·)).
func TransformerBlock(x *frontend.Tensor, name string, cfg BlockConfig) *frontend.Tensor {
	projStd := InitStd / math.Sqrt(2*float64(max(cfg.Layers, 1)))
	x = x.Add(Attention(LayerNorm(x, name+".ln_1"), name+".attn", cfg.Heads, projStd))
	return x.Add(MLP(LayerNorm(x, name+".ln_2"), name+".mlp", cfg.Activation, projStd))
}

// CrossEntropy is the mean token loss of logits [..., vocab] against
// integer labels of the leading shape.
func CrossEntropy(logits, labels *frontend.Tensor) *frontend.Tensor {
	if logits.Value() == nil {
		return logits
	}
	shape := logits.Shape()
	rows := 1
	for _, d := range shape[:max(len(shape)-1, 0)] {
		rows *= d
	}
	return logits.Reshape(rows, logits.Dim(-1)).CrossEntropy(labels.Reshape(rows))
}
