// Package gpt2 composes the generic layers of package nn into GPT-2's
// transformer block. Names follow Hugging Face GPT-2 (c_attn, c_proj, c_fc,
// ln_1, …) and weights are [in,out] as in GPT-2's Conv1D (y = x·W + b), so a
// saved checkpoint maps onto other tools' tensors.
package gpt2

import (
	"math"

	"gcompile/frontend"
	"gcompile/frontend/nn"
)

// LayerNormEps is GPT-2's LayerNorm epsilon.
const LayerNormEps = 1e-5

// Attention is causal multi-head self-attention over x [batch,seq,hidden]
// with fused q,k,v (name.c_attn, column-parallel: heads split across tensor
// ranks) and output projection name.c_proj (row-parallel). projStd is the
// output projection's init std (GPT-2 scales it by 1/√(2·layers)). The
// attention core is the fused attention op (nn.CausalAttention).
func Attention(x *frontend.Tensor, name string, heads int, projStd float64) *frontend.Tensor {
	return attention(x, name, heads, projStd, nn.CausalAttention)
}

// AttentionUnfused is Attention with the core written as primitive ops
// (nn.CausalAttentionUnfused), whose [batch, heads, seq, seq] scores and
// probabilities --recompute selective may drop.
func AttentionUnfused(x *frontend.Tensor, name string, heads int, projStd float64) *frontend.Tensor {
	return attention(x, name, heads, projStd, nn.CausalAttentionUnfused)
}

func attention(x *frontend.Tensor, name string, heads int, projStd float64, core func(q, k, v *frontend.Tensor) *frontend.Tensor) *frontend.Tensor {
	b := x.Builder()
	hidden := x.Dim(2)
	if heads <= 0 || hidden%heads != 0 {
		b.Errorf("attention %s: hidden size %d is not divisible by %d heads", name, hidden, heads)
		return x
	}
	// q, k and v are three column blocks of one weight; under tensor
	// parallelism each rank takes its heads' columns of every block.
	qkv := nn.Linear(x, name+".c_attn", 3*hidden, frontend.FusedColumnParallel(3), nn.InitStd)
	split := func(i int) *frontend.Tensor {
		return nn.SplitHeads(qkv.Slice(2, i*hidden, (i+1)*hidden), heads)
	}
	q, k, v := split(0), split(1), split(2)
	return nn.Linear(core(q, k, v), name+".c_proj", hidden, frontend.RowParallel, projStd)
}

// MLP is c_fc (4·hidden, column-parallel) → activation → c_proj (row-parallel).
// activation is "gelu" (GPT-2's tanh approximation; "" too) or "relu";
// anything else is an error, not GELU.
func MLP(x *frontend.Tensor, name, activation string, projStd float64) *frontend.Tensor {
	hidden := x.Dim(-1)
	h := nn.Linear(x, name+".c_fc", 4*hidden, frontend.ColumnParallel, nn.InitStd)
	switch activation {
	case "relu":
		h = h.Relu()
	case "gelu", "":
		h = h.Gelu()
	default:
		x.Builder().Errorf("MLP %s: activation %q: want gelu or relu", name, activation)
		return x.Builder().Poisoned()
	}
	return nn.Linear(h, name+".c_proj", hidden, frontend.RowParallel, projStd)
}

// BlockConfig sizes a transformer block.
type BlockConfig struct {
	Heads      int
	Layers     int    // total layers, for GPT-2's residual projection init scaling
	Activation string // "gelu" or "relu"
	// Unfused writes the attention core as primitive ops
	// (AttentionUnfused) instead of the fused attention op.
	Unfused bool
}

// Block is GPT-2's pre-LayerNorm block: x + attn(ln_1(x)), then
// + mlp(ln_2(·)).
func Block(x *frontend.Tensor, name string, cfg BlockConfig) *frontend.Tensor {
	projStd := nn.InitStd / math.Sqrt(2*float64(max(cfg.Layers, 1)))
	attn := Attention
	if cfg.Unfused {
		attn = AttentionUnfused
	}
	x = x.Add(attn(nn.LayerNorm(x, name+".ln_1", LayerNormEps), name+".attn", cfg.Heads, projStd))
	return x.Add(MLP(nn.LayerNorm(x, name+".ln_2", LayerNormEps), name+".mlp", cfg.Activation, projStd))
}
