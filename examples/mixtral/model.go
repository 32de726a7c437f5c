// Package mixtral is a Mixtral-family sparse decoder at any size.
//
//	gcompile examples/mixtral/model.go --set layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,experts=8,vocab=32000,seq=4096
//
// The Llama of examples/llama with every block's MLP a mixture of SwiGLU
// experts: a router (softmax over all experts in fp32, the top k, their
// probabilities renormalised to sum to 1) sends each token to k experts,
// each w2·(silu(w1·x) ⊙ (w3·x)), and adds their outputs weighted by those
// probabilities. Routing is dropless: every expert has a slot for every
// token of its routing group, so no token is ever dropped. The loss
// trained on is the mean next-token cross-entropy plus router_aux_loss_coef
// (--set aux) times the load-balancing loss of all layers at once, as
// Hugging Face's load_balancing_loss_func computes it (per routing group
// here, averaged over groups: see nn.Balance); the cross-entropy alone is
// reported as the output lm_loss and the balancing loss as aux. Parameter
// names and layouts are Hugging Face's MixtralForCausalLM
// (model.layers.N.block_sparse_moe.gate.weight [experts, hidden],
// model.layers.N.block_sparse_moe.experts.E.w1.weight [ffn, hidden], …):
// the program holds each layer's experts stacked, split over --ep, and
// --save, --load and export exchange one tensor per expert. The defaults
// are a byte-level model small enough to train on a CPU in seconds.
package mixtral

import (
	"fmt"
	"math"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

// Model records the Mixtral into b.
func Model(b *frontend.Builder) {
	layers := b.Int("layers", 2, "decoder layers")
	hidden := b.Int("hidden", 64, "model width (hidden_size)")
	heads := b.Int("heads", 4, "query heads (must divide hidden)")
	kvHeads := b.Int("kv_heads", 2, "key/value heads (num_key_value_heads; must divide heads)")
	ffn := b.Int("ffn", 128, "each expert's SwiGLU width (intermediate_size)")
	experts := b.Int("experts", 4, "experts per layer (num_local_experts)")
	k := b.Int("k", 2, "experts per token (num_experts_per_tok)")
	vocab := b.Int("vocab", 256, "vocabulary size (256: bytes)")
	seq := b.Sequence(64)
	theta := b.Float("rope_theta", 1e6, "rotary embedding base")
	eps := b.Float("rms_norm_eps", 1e-5, "RMSNorm epsilon")
	coef := b.Float("aux", 0.02, "weight of the load-balancing loss (router_aux_loss_coef)")
	group := b.IntOrZero("group", 0, "tokens per routing group (0: one sequence)")
	attention := b.Implementation("attention", "fused", "attention core: one fused op, or primitive ops with k/v repeated to the query heads", "fused", "unfused")
	batch := b.Batch()
	if !(theta > 1) {
		b.Errorf("--set rope_theta=%v: want a base > 1 (Mixtral: 1000000)", theta)
		theta = 1e6 // named once: the layers go on with the default
	}
	if !(coef >= 0) || math.IsInf(coef, 0) {
		b.Errorf("--set aux=%v: want a finite weight ≥ 0 (Mixtral: 0.02)", coef)
		coef = 0.02
	}
	if k > experts {
		// Checked here once rather than by each layer.
		b.Errorf("--set k=%d: each token goes to k of the %d experts; want k ≤ experts", k, experts)
		return
	}

	tokens := b.Input("tokens", ir.I32, batch, seq)
	targets := b.Input("targets", ir.I32, batch, seq)

	x, _ := nn.Embedding(tokens, "model.embed_tokens", vocab, hidden)
	attn := nn.AttentionConfig{Heads: heads, KVHeads: kvHeads, Theta: theta, Unfused: attention == "unfused"}
	balance := &nn.Balance{}
	moe := nn.MoEConfig{Experts: experts, Router: nn.RouterSoftmaxTopK, K: k, Dropless: true, GroupSize: group,
		FFN: ffn, Activation: nn.ActivationSwiGLU, Layout: nn.MoELayoutMixtral, Balance: balance}
	for i := range layers {
		b.Layer(i)
		name := fmt.Sprintf("model.layers.%d", i)
		x = x.Add(nn.GroupedQueryAttention(nn.RMSNorm(x, name+".input_layernorm", eps), name+".self_attn", attn))
		// The layer's own aux is its z-loss, weighted 0: Mixtral has none.
		y, _ := nn.MoE(nn.RMSNorm(x, name+".post_attention_layernorm", eps), name+".block_sparse_moe", moe)
		x = x.Add(y)
	}
	b.Layer(-1)
	x = nn.RMSNorm(x, "model.norm", eps)
	logits := nn.Dense(x.Reshape(batch*seq, hidden), "lm_head", vocab, nn.LinearConfig{OutIn: true, Parallel: frontend.ColumnParallel})
	lm := nn.CrossEntropy(logits, targets)
	aux := balance.Loss()
	if aux == nil {
		b.Loss(lm)
		return
	}
	b.Output("lm_loss", lm)
	b.Output("aux", aux)
	b.Loss(lm.Add(aux.Scale(coef)))
	b.ExportConfig(map[string]any{"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral",
		"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
		"num_attention_heads": heads, "num_key_value_heads": kvHeads, "head_dim": hidden / heads,
		"hidden_act": "silu", "max_position_embeddings": b.TrainedSequence(), "rms_norm_eps": eps, "rope_theta": theta,
		"num_local_experts": experts, "num_experts_per_tok": k, "router_aux_loss_coef": coef, "output_router_logits": false,
		"sliding_window": nil, "tie_word_embeddings": false})
}
