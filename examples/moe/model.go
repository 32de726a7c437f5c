// Package moe is the GPT of examples/gpt with every other block's MLP
// replaced by a mixture of experts (GShard's and Switch's layout: odd
// blocks are MoE blocks).
//
//	gcompile examples/moe/model.go --set router=switch,experts=8 --run
//
// The loss trained on is the mean next-token cross-entropy plus each MoE
// layer's weighted balancing and z losses; the cross-entropy alone is
// reported as the output lm_loss.
package moe

import (
	"fmt"
	"math"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/frontend/nn/gpt2"
	"gcompile/ir"
)

// Model records the MoE GPT into b.
func Model(b *frontend.Builder) {
	layers := b.Int("layers", 2, "transformer blocks (odd ones are MoE blocks)")
	hidden := b.Int("hidden", 128, "model width h")
	heads := b.Int("heads", 4, "attention heads (must divide hidden)")
	vocab := b.Int("vocab", 256, "vocabulary size (256: bytes)")
	seq := b.Sequence(64)
	cfg := nn.MoEConfig{
		Experts:            b.Int("experts", 4, "experts per MoE layer"),
		Router:             b.String("router", nn.RouterSwitch, "router", nn.RouterKinds...),
		K:                  b.Int("k", 2, "experts per token (noisy-topk, softmax-topk)"),
		CapacityFactor:     b.Float("capacity", 2, "capacity factor: slots per expert = ⌈k·group·factor/experts⌉"),
		EvalCapacityFactor: b.Float("eval_capacity", 0, "evaluation's capacity factor (0: the training one)"),
		GroupSize:          b.IntOrZero("group", 0, "tokens per routing group (0: one sequence)"),
		AuxLoss:            b.Float("aux", -1, "weight of the balancing loss (negative: 1e-2, Switch's; 0.1 for noisy-topk, Shazeer et al.'s w_importance = w_load; 1e-2·experts² for gshard, whose loss (1/E)·Σ(c_e/S)·m_e is E² times smaller than Switch's E·Σf·P; 0: none)"),
		ZLoss:              b.Float("zloss", 1e-3, "weight of the router z-loss"),
		FFN:                b.IntOrZero("ffn", 0, "each expert's hidden width (0: 4·hidden)"),
		Jitter:             b.Float("jitter", 0, "router input jitter ε (Switch: 1e-2)"),
		ExpertDropout:      b.Float("expert_dropout", 0, "dropout inside experts"),
	}
	if layers < 2 {
		// Block 1 is the first MoE block: with fewer, the router's
		// settings would be accepted and never read.
		b.Errorf("--set layers=%d: the MoE GPT's odd blocks are its MoE blocks, so it needs layers ≥ 2 (examples/gpt is the GPT without experts)", layers)
	}
	if k := cfg.K; k != 2 && cfg.Router != nn.RouterNoisyTopK && cfg.Router != nn.RouterSoftmaxTopK {
		// The other routers fix their own count: it would be ignored.
		b.Errorf("--set k=%d: the %s router does not take k (switch sends a token to 1 expert, gshard to 2, expert-choice fills each expert's capacity); k applies to noisy-topk and softmax-topk", k, cfg.Router)
	}
	if cfg.AuxLoss < 0 {
		switch cfg.Router {
		case nn.RouterNoisyTopK:
			cfg.AuxLoss = 0.1 // its CV² importance and load losses, each weighted 0.1 in the paper
		case nn.RouterGShard:
			cfg.AuxLoss = 1e-2 * float64(cfg.Experts*cfg.Experts)
		default:
			cfg.AuxLoss = 1e-2
		}
	}
	switch rs := b.IntOrZero("random_second", 1, "gshard: keep the second expert with probability g₂/0.2 (1) or always (0)"); rs {
	case 0:
		cfg.SecondThreshold = -1
	case 1:
	default:
		b.Errorf("--set random_second=%d: want 1 (keep the second expert with probability g₂/0.2) or 0 (always)", rs)
	}
	batch := b.Batch()
	tokens := b.Input("tokens", ir.I32, batch, seq)
	targets := b.Input("targets", ir.I32, batch, seq)

	x, wte := nn.Embedding(tokens, "wte", vocab, hidden)
	wpe := b.Param("wpe.weight", []int{b.TrainedSequence(), hidden}, frontend.Normal(0.01), frontend.NoParallel)
	x = nn.PositionEmbedding(x, wpe)
	projStd := nn.InitStd / math.Sqrt(2*float64(max(layers, 1)))
	cfg.ProjStd = projStd
	var aux *frontend.Tensor
	for i := range layers {
		b.Layer(i)
		name := fmt.Sprintf("h.%d", i)
		x = x.Add(gpt2.Attention(nn.LayerNorm(x, name+".ln_1", gpt2.LayerNormEps), name+".attn", heads, projStd))
		h := nn.LayerNorm(x, name+".ln_2", gpt2.LayerNormEps)
		if i%2 == 0 {
			x = x.Add(gpt2.MLP(h, name+".mlp", "gelu", projStd))
			continue
		}
		y, a := nn.MoE(h, name+".moe", cfg)
		x = x.Add(y)
		if aux == nil {
			aux = a
		} else if a != nil {
			aux = aux.Add(a)
		}
	}
	b.Layer(-1)
	x = nn.LayerNorm(x, "ln_f", gpt2.LayerNormEps)
	logits := x.Reshape(batch*seq, hidden).MatMulT(wte) // tied LM head
	lm := nn.CrossEntropy(logits, targets)
	if aux == nil {
		b.Loss(lm)
		return
	}
	b.Output("lm_loss", lm)
	b.Loss(lm.Add(aux))
}
