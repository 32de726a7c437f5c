package m

import (
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

func Model(b *frontend.Builder) {
	batch := b.Batch()
	seq := b.Sequence(16)
	tokens := b.Input("tokens", ir.I32, batch, seq)
	targets := b.Input("targets", ir.I32, batch, seq)
	x, _ := nn.Embedding(tokens, "wte", 256, 16)
	mask := b.Input("mask", ir.F32, batch, seq, 16)
	x = x.Mul(mask)
	w := b.Param("head", []int{16, 256}, frontend.Normal(0.02), frontend.NoParallel)
	b.Loss(x.Reshape(batch*seq, 16).MatMul(w).CrossEntropy(targets.Reshape(batch * seq)))
}
