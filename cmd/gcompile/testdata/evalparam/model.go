package m

import (
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

// Model adds a bias when evaluating that training never declares (and,
// with --set shape=1, a table of another shape).
func Model(b *frontend.Builder) {
	batch := b.Batch()
	shape := b.Int("shape", 2, "1: the table is wider when evaluating")
	tokens := b.Input("tokens", ir.I32, batch, 8)
	targets := b.Input("targets", ir.I32, batch, 8)
	width := 8
	if shape == 1 && b.Evaluating() {
		width = 16
	}
	emb, _ := nn.Embedding(tokens, "emb", 256, width)
	x := emb.Reshape(batch*8, width)
	if shape == 2 && b.Evaluating() {
		x = x.Add(b.Param("eval_only.bias", []int{width}, frontend.Normal(1), frontend.NoParallel))
	}
	w := b.Param("w", []int{width, 256}, frontend.Normal(0.02), frontend.NoParallel)
	b.Loss(nn.CrossEntropy(x.MatMul(w), targets.Reshape(batch*8)))
}
