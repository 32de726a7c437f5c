package m

import (
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

// Model reads its tokens as floats, which training does not feed.
func Model(b *frontend.Builder) {
	batch := b.Batch()
	tokens := b.Input("tokens", ir.F32, batch, 8)
	targets := b.Input("targets", ir.I32, batch, 8)
	w := b.Param("w", []int{8, 256}, frontend.Normal(0.02), frontend.NoParallel)
	b.Loss(nn.CrossEntropy(tokens.MatMul(w).Reshape(batch, 256), targets.Slice(1, 0, 1).Reshape(batch)))
}
