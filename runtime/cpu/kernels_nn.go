package cpu

import (
	"gcompile/runtime"
	"math"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// Neural-network ops over rows of the last dim: softmax, the causal mask,
// LayerNorm, and the embedding and cross-entropy pairs, whose vocabulary
// may be split across devices (vocab.go).
func init() {
	builtin(Kernel{F32: softmax[float32], F64: softmax[float64]}, "softmax")
	builtin(Kernel{F32: softmaxGrad[float32], F64: softmaxGrad[float64]}, "softmax_grad")
	builtin(Kernel{F32: causalMask[float32], F64: causalMask[float64]}, "causal_mask")
	builtin(Kernel{F32: layerNorm[float32], F64: layerNorm[float64]}, "layernorm")
	builtin(Kernel{F32: layerNormGradX[float32], F64: layerNormGradX[float64]}, "layernorm_grad_x")
	builtin(Kernel{F32: layerNormGradGamma[float32], F64: layerNormGradGamma[float64]}, "layernorm_grad_gamma")
	builtin(Kernel{F32: rmsNorm[float32], F64: rmsNorm[float64]}, "rmsnorm")
	builtin(Kernel{F32: rmsNormGradX[float32], F64: rmsNormGradX[float64]}, "rmsnorm_grad_x")
	builtin(Kernel{F32: rmsNormGradGamma[float32], F64: rmsNormGradGamma[float64]}, "rmsnorm_grad_gamma")
	builtin(Kernel{F32: rope[float32], F64: rope[float64]}, "rope")
	builtin(Kernel{F32: embedding[float32], F64: embedding[float64]}, "embedding")
	builtin(Kernel{F32: embeddingGrad[float32], F64: embeddingGrad[float64]}, "embedding_grad")
	// The loss is a scalar: the logits' dtype picks the kernel.
	builtin(Kernel{F32: crossEntropy[float32], F64: crossEntropy[float64], TypeOf: Arg(0)}, "cross_entropy")
	builtin(Kernel{F32: crossEntropyGrad[float32], F64: crossEntropyGrad[float64]}, "cross_entropy_grad")
}

// lastDim splits a shape into rows of its last dim.
func lastDim(s []int) (rows, n int) {
	n = s[len(s)-1]
	return int(ir.Shape(s).NumElements()) / max(n, 1), n
}

func softmax[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x := c.Out(), c.Arg(0)
	rows, n := lastDim(c.OutShape())
	return ok(func() { kcpu.Softmax(out, x, rows, n) }), nil
}

func softmaxGrad[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, y, dy := c.Out(), c.Arg(0), c.Arg(1)
	rows, n := lastDim(c.OutShape())
	return ok(func() { kcpu.SoftmaxGrad(out, y, dy, rows, n) }), nil
}

func causalMask[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, outShape := c.Out(), c.Arg(0), c.OutShape()
	r := len(outShape)
	s, t := outShape[r-2], outShape[r-1]
	batch := int(ir.Shape(outShape).NumElements()) / (s * t)
	fill := T(c.Instr.Attrs.Float("fill", math.Inf(-1)))
	return ok(func() { kcpu.CausalMask(out, x, batch, s, t, fill) }), nil
}

func layerNorm[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, g, b := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	rows, n := lastDim(c.OutShape())
	eps := c.Instr.Attrs.Float("eps", 0)
	return ok(func() { kcpu.LayerNorm(out, x, g, b, rows, n, eps) }), nil
}

func layerNormGradX[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, g, dy := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	rows, n := lastDim(c.OutShape())
	eps := c.Instr.Attrs.Float("eps", 0)
	return ok(func() { kcpu.LayerNormGradX(out, x, g, dy, rows, n, eps) }), nil
}

func layerNormGradGamma[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, dy := c.Out(), c.Arg(0), c.Arg(1)
	rows, n := lastDim(c.Shape(0))
	eps := c.Instr.Attrs.Float("eps", 0)
	return ok(func() { kcpu.LayerNormGradGamma(out, x, dy, rows, n, eps) }), nil
}

func rmsNorm[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, g := c.Out(), c.Arg(0), c.Arg(1)
	rows, n := lastDim(c.OutShape())
	eps := c.Instr.Attrs.Float("eps", 0)
	return ok(func() { kcpu.RMSNorm(out, x, g, rows, n, eps) }), nil
}

func rmsNormGradX[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, g, dy := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	rows, n := lastDim(c.OutShape())
	eps := c.Instr.Attrs.Float("eps", 0)
	return ok(func() { kcpu.RMSNormGradX(out, x, g, dy, rows, n, eps) }), nil
}

func rmsNormGradGamma[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, dy := c.Out(), c.Arg(0), c.Arg(1)
	rows, n := lastDim(c.Shape(0))
	eps := c.Instr.Attrs.Float("eps", 0)
	return ok(func() { kcpu.RMSNormGradGamma(out, x, dy, rows, n, eps) }), nil
}

// rope reads x as [batch, positions, d]: the dims before the last two are
// rows of independent sequences (batch and heads), so a device holding a
// slice of them rotates its rows exactly as one device would.
func rope[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, shape := c.Out(), c.Arg(0), c.OutShape()
	r := len(shape)
	positions, d := shape[r-2], shape[r-1]
	batch := int(ir.Shape(shape).NumElements()) / max(positions*d, 1)
	theta, inverse := c.Instr.Attrs.Float("theta", 0), c.Instr.Attrs.Bool("inverse")
	// Under context parallelism the device's rows are a chunk of the
	// sequence: their angles are those of their global positions.
	at, err := runtime.SeqPositions(c.d.prog.Mesh, c.Instr.Value, r-2, c.d.coords)
	if err != nil {
		return nil, err
	}
	table := kcpu.NewRoPETableAt(at, positions, d, theta) // once, at load
	return ok(func() { kcpu.RoPEWith(out, x, batch, table, inverse) }), nil
}

func embedding[T kcpu.Float](c *Call[T]) (func() error, error) {
	if f, handled, err := compileVocabParallel[T](c.d, c.Instr); handled || err != nil {
		return f, err
	}
	out, table := c.Out(), c.Arg(0)
	ids, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	vocab, dim := c.Shape(0)[0], c.Shape(0)[1]
	return func() error { return kcpu.Embedding(out, table, ids, vocab, dim) }, nil
}

func embeddingGrad[T kcpu.Float](c *Call[T]) (func() error, error) {
	out := c.Out()
	ids, err := c.Int32(0)
	if err != nil {
		return nil, err
	}
	dy, outShape := c.Arg(1), c.OutShape()
	rows, dim := outShape[0], outShape[1]
	if offset, vocab, split := runtime.VocabRows(c.d.prog.Mesh, c.Instr.Value, c.d.coords); split {
		// The device's rows of a vocab-split gradient (vocab-parallel
		// embedding): ids of other rows add nothing here.
		return func() error { return kcpu.EmbeddingGradRange(out, dy, ids, offset, rows, dim, vocab) }, nil
	}
	return func() error { return kcpu.EmbeddingGrad(out, dy, ids, rows, dim) }, nil
}

func crossEntropy[T kcpu.Float](c *Call[T]) (func() error, error) {
	if f, handled, err := compileVocabParallel[T](c.d, c.Instr); handled || err != nil {
		return f, err
	}
	out, logits := c.Out(), c.Arg(0)
	labels, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	rows, vocab := c.Shape(0)[0], c.Shape(0)[1]
	return func() error {
		l, err := kcpu.CrossEntropy(logits, labels, rows, vocab)
		out[0] = l
		return err
	}, nil
}

func crossEntropyGrad[T kcpu.Float](c *Call[T]) (func() error, error) {
	if f, handled, err := compileVocabParallel[T](c.d, c.Instr); handled || err != nil {
		return f, err
	}
	out, logits, dloss := c.Out(), c.Arg(0), c.Arg(2)
	labels, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	rows, vocab := c.Shape(0)[0], c.Shape(0)[1]
	return func() error { return kcpu.CrossEntropyGrad(out, logits, labels, dloss[0], rows, vocab) }, nil
}
