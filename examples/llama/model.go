// Package llama is a Llama-family decoder at any size.
//
//	gcompile examples/llama/model.go --set layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,seq=2048,rope_theta=500000
//
// Token embeddings, pre-RMSNorm blocks of grouped-query attention with
// rotary position embeddings and a SwiGLU MLP, a final RMSNorm and an
// untied LM head, no biases, trained on the mean next-token cross-entropy.
// Parameter names and layouts are Hugging Face's LlamaForCausalLM
// (model.layers.N.self_attn.q_proj.weight, [out,in]), so --save and --load
// exchange weights with that ecosystem. The defaults are a byte-level model
// small enough to train on a CPU in minutes.
package llama

import (
	"fmt"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

// Model records the Llama into b.
func Model(b *frontend.Builder) {
	layers := b.Int("layers", 2, "decoder layers")
	hidden := b.Int("hidden", 128, "model width (hidden_size)")
	heads := b.Int("heads", 4, "query heads (must divide hidden)")
	kvHeads := b.Int("kv_heads", 2, "key/value heads (num_key_value_heads; must divide heads)")
	ffn := b.Int("ffn", 352, "SwiGLU width (intermediate_size)")
	vocab := b.Int("vocab", 256, "vocabulary size (256: bytes)")
	seq := b.Sequence(64)
	theta := b.Float("rope_theta", 10000, "rotary embedding base")
	if !(theta > 1) {
		// The layer library reads 0 as "no rotary embedding"; a Llama
		// always has one.
		b.Errorf("--set rope_theta=%v: want a base > 1 (Llama 2: 10000, Llama 3: 500000)", theta)
		theta = 10000 // named once: the layers go on with the default
	}
	eps := b.Float("rms_norm_eps", 1e-5, "RMSNorm epsilon")
	attention := b.Implementation("attention", "fused", "attention core: one fused op, or primitive ops with k/v repeated to the query heads", "fused", "unfused")
	batch := b.Batch()

	tokens := b.Input("tokens", ir.I32, batch, seq)
	targets := b.Input("targets", ir.I32, batch, seq)

	x, _ := nn.Embedding(tokens, "model.embed_tokens", vocab, hidden)
	attn := nn.AttentionConfig{Heads: heads, KVHeads: kvHeads, Theta: theta, Unfused: attention == "unfused"}
	for i := range layers {
		b.Layer(i)
		name := fmt.Sprintf("model.layers.%d", i)
		x = x.Add(nn.GroupedQueryAttention(nn.RMSNorm(x, name+".input_layernorm", eps), name+".self_attn", attn))
		x = x.Add(nn.SwiGLU(nn.RMSNorm(x, name+".post_attention_layernorm", eps), name+".mlp", ffn, 0))
	}
	b.Layer(-1)
	x = nn.RMSNorm(x, "model.norm", eps)
	// Untied, [vocab,hidden]: column-parallel splits the vocabulary, so
	// under tensor parallelism the loss is vocab-parallel.
	logits := nn.Dense(x.Reshape(batch*seq, hidden), "lm_head", vocab, nn.LinearConfig{OutIn: true, Parallel: frontend.ColumnParallel})
	b.Loss(nn.CrossEntropy(logits, targets))
	b.ExportConfig(map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
		"num_attention_heads": heads, "num_key_value_heads": kvHeads, "head_dim": hidden / heads,
		"hidden_act": "silu", "max_position_embeddings": b.TrainedSequence(), "rms_norm_eps": eps, "rope_theta": theta,
		"attention_bias": false, "mlp_bias": false, "tie_word_embeddings": false})
}
