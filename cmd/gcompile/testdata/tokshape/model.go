package m

import (
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

// Model reads targets one token longer than its tokens, which training
// feeds the same rows.
func Model(b *frontend.Builder) {
	batch := b.Batch()
	tokens := b.Input("tokens", ir.I32, batch, 8)
	targets := b.Input("targets", ir.I32, batch, 9)
	emb, _ := nn.Embedding(tokens, "emb", 256, 8)
	x := emb.Reshape(batch*8, 8)
	w := b.Param("w", []int{8, 256}, frontend.Normal(0.02), frontend.NoParallel)
	b.Loss(nn.CrossEntropy(x.MatMul(w), targets.Slice(1, 0, 8).Reshape(batch*8)))
}
