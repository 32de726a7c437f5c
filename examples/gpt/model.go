// Package gpt is the reference model: GPT-2's architecture at any size.
//
//	gcompile examples/gpt/model.go --set layers=12,hidden=768,heads=12,seq=1024,vocab=50257
//
// Token and learned position embeddings, pre-LayerNorm blocks (package gpt2),
// a final LayerNorm and an LM head tied to the token embedding, trained on the
// mean next-token cross-entropy; the defaults train on a CPU in minutes.
package gpt

import (
	"fmt"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/frontend/nn/gpt2"
	"gcompile/ir"
)

// Model records the GPT into b.
func Model(b *frontend.Builder) {
	layers := b.Int("layers", 2, "transformer blocks")
	hidden := b.Int("hidden", 128, "model width h")
	heads := b.Int("heads", 4, "attention heads (must divide hidden)")
	vocab := b.Int("vocab", 256, "vocabulary size (256: bytes)")
	seq := b.Sequence(64)
	activation := b.String("activation", "gelu", "MLP activation", "gelu", "relu")
	attention := b.Implementation("attention", "fused", "attention core: one fused op, or primitive ops with [batch, heads, seq, seq] scores and probabilities", "fused", "unfused")
	batch := b.Batch()
	tokens := b.Input("tokens", ir.I32, batch, seq)
	targets := b.Input("targets", ir.I32, batch, seq)

	x, wte := nn.Embedding(tokens, "wte", vocab, hidden)
	wpe := b.Param("wpe.weight", []int{context(b), hidden}, frontend.Normal(0.01), frontend.NoParallel)
	x = nn.PositionEmbedding(x, wpe)
	for i := range layers {
		b.Layer(i)
		x = gpt2.Block(x, fmt.Sprintf("h.%d", i), gpt2.BlockConfig{Heads: heads, Layers: layers, Activation: activation, Unfused: attention == "unfused"})
	}
	b.Layer(-1)
	x = nn.LayerNorm(x, "ln_f", gpt2.LayerNormEps)
	logits := x.Reshape(batch*seq, hidden).MatMulT(wte) // tied LM head
	b.Loss(nn.CrossEntropy(logits, targets))
	b.ExportConfig(map[string]any{"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2",
		"vocab_size": vocab, "n_positions": wpe.Dim(0), "n_ctx": wpe.Dim(0), "n_embd": hidden, "n_layer": layers, "n_head": heads,
		"n_inner": 4 * hidden, "activation_function": map[string]string{"gelu": "gelu_new", "relu": "relu"}[activation],
		"layer_norm_epsilon": gpt2.LayerNormEps, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0, "tie_word_embeddings": true})
}

// context reads the context length, the rows of the position table
// (GPT-2's n_positions: 1024 in its published checkpoints), which may
// exceed the sequence trained on. Those checkpoints also hold the causal
// mask buffers of Hugging Face's attention, which the model has no use for.
func context(b *frontend.Builder) int {
	seq := b.TrainedSequence()
	ctx := b.Int("ctx", seq, "context length: rows of the position table (default: seq; GPT-2: 1024), at least seq")
	if ctx < seq {
		b.Errorf("--set ctx=%d: the position table needs at least seq=%d rows", ctx, seq)
		ctx = seq
	}
	b.IgnoreOnLoad("h.*.attn.bias", "h.*.attn.masked_bias")
	return ctx
}
