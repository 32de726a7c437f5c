package cuda

import (
	"fmt"
	"math"

	"gcompile/ir"
	"gcompile/runtime"
)

// Neural-network layers: softmax, the causal mask, LayerNorm, RMSNorm,
// rotary position embeddings, embedding and cross-entropy. The layers
// over the last dim launch one block per row; the embedding and
// cross-entropy kernels validate ids and labels through a status word
// each, checked after the step. Embedding and cross-entropy whose
// vocabulary is split across the mesh run the vocab-parallel path
// (vocab.go).
func init() {
	register(onFP32(resultDType, (*compiler).softmax), "softmax")
	register(onFP32(resultDType, (*compiler).softmaxGrad), "softmax_grad")
	register(onFP32(resultDType, (*compiler).causalMask), "causal_mask")
	register(onFP32(resultDType, (*compiler).layerNorm), "layernorm", "layernorm_grad_x")
	register(onFP32(resultDType, (*compiler).layerNormGradGamma), "layernorm_grad_gamma")
	register(onFP32(resultDType, (*compiler).rmsNorm), "rmsnorm", "rmsnorm_grad_x")
	register(onFP32(resultDType, (*compiler).rmsNormGradGamma), "rmsnorm_grad_gamma")
	register(onFP32(resultDType, (*compiler).rope), "rope")
	register(onFP32(resultDType, orVocabParallel((*compiler).embedding)), "embedding")
	register(onFP32(resultDType, (*compiler).embeddingGrad), "embedding_grad")
	// The loss is a scalar: the logits' dtype decides the kernel.
	register(onFP32(argDType, orVocabParallel((*compiler).crossEntropy)), "cross_entropy")
	register(onFP32(resultDType, orVocabParallel((*compiler).crossEntropyGrad)), "cross_entropy_grad")
}

// lastDim views shape s as rows of its last dim.
func lastDim(s []int) (rows, n int64) {
	k := int64(s[len(s)-1])
	return numel(s) / max(k, 1), k
}

func (c *compiler) softmax() (func() error, error) {
	rows, k := lastDim(c.outShape())
	return c.one("gc_softmax", c.out(), c.arg(0), rows, k)
}

func (c *compiler) softmaxGrad() (func() error, error) {
	rows, k := lastDim(c.outShape())
	return c.one("gc_softmax_grad", c.out(), c.arg(0), c.arg(1), rows, k)
}

func (c *compiler) causalMask() (func() error, error) {
	outShape := c.outShape()
	r := len(outShape)
	if r < 2 {
		return nil, fmt.Errorf("causal_mask needs rank ≥ 2, got %v", c.in.OutType)
	}
	s, t := int64(outShape[r-2]), int64(outShape[r-1])
	rows := numel(outShape) / max(t, 1)
	fill := float32(c.in.Attrs.Float("fill", math.Inf(-1)))
	return c.one("gc_causal_mask", c.out(), c.arg(0), rows, s, t, fill)
}

// layerNorm is the forward and the input gradient: one kernel, named
// after the op, with the same operands (x, gamma, beta or dy).
func (c *compiler) layerNorm() (func() error, error) {
	rows, k := lastDim(c.outShape())
	return c.one("gc_"+c.in.Op, c.out(), c.arg(0), c.arg(1), c.arg(2), rows, k, float32(c.in.Attrs.Float("eps", 0)))
}

// layerNormGradGamma recomputes each row's statistics into the workspace,
// then sums the columns.
func (c *compiler) layerNormGradGamma() (func() error, error) {
	rows, k := lastDim(c.shape(0))
	stats := parg{at: c.scratch(16 * rows), dt: ir.F32}
	l1, err := c.kernel("gc_layernorm_stats", stats, c.arg(0), rows, k, float32(c.in.Attrs.Float("eps", 0)))
	if err != nil {
		return nil, err
	}
	l2, err := c.kernel("gc_layernorm_grad_gamma", c.out(), c.arg(0), c.arg(1), stats, rows, k)
	if err != nil {
		return nil, err
	}
	return c.runs(l1, l2), nil
}

// rmsNorm is the forward, gc_rmsnorm(x, gamma), and the input gradient,
// gc_rmsnorm_grad_x(x, gamma, dy): one kernel named after the op, over
// the op's operands in order.
func (c *compiler) rmsNorm() (func() error, error) {
	rows, k := lastDim(c.outShape())
	args := []any{c.out()}
	for i := range c.in.Args {
		args = append(args, c.arg(i))
	}
	args = append(args, rows, k, float32(c.in.Attrs.Float("eps", 0)))
	return c.one("gc_"+c.in.Op, args...)
}

// rmsNormGradGamma recomputes each row's scale into the workspace (a
// float pair per row), then sums the columns.
func (c *compiler) rmsNormGradGamma() (func() error, error) {
	rows, k := lastDim(c.shape(0))
	stats := parg{at: c.scratch(8 * rows), dt: ir.F32}
	l1, err := c.kernel("gc_rmsnorm_stats", stats, c.arg(0), rows, k, float32(c.in.Attrs.Float("eps", 0)))
	if err != nil {
		return nil, err
	}
	l2, err := c.kernel("gc_rmsnorm_grad_gamma", c.out(), c.arg(0), c.arg(1), stats, rows, k)
	if err != nil {
		return nil, err
	}
	return c.runs(l1, l2), nil
}

// rope reads x as rows of its last dim d, row r at position r mod
// shape[-2], as the CPU backend does on the local shape: the dims before
// the last two are independent sequences (batch and heads). The kernel
// takes theta as a float, so a theta that float32 cannot hold exactly is
// refused rather than silently rotating by other angles than the CPU's.
func (c *compiler) rope() (func() error, error) {
	s := c.outShape()
	r := len(s)
	if r < 2 || s[r-1]%2 != 0 {
		return nil, fmt.Errorf("rope needs [..., positions, d] with d even, got %v", c.in.OutType)
	}
	positions, d := int64(s[r-2]), int64(s[r-1])
	// Under context parallelism the rows are a chunk (two, zigzag) of the
	// sequence, at their global positions.
	at, err := runtime.SeqPositions(c.d.prog.Mesh, c.in.Value, r-2, c.d.coords)
	if err != nil {
		return nil, err
	}
	first, brk, second := int64(0), positions, int64(0)
	if at != nil {
		first = int64(at[0])
		for i := 1; i < len(at); i++ {
			if at[i] != at[i-1]+1 {
				brk, second = int64(i), int64(at[i])
				break
			}
		}
	}
	theta := c.in.Attrs.Float("theta", 0)
	if float64(float32(theta)) != theta {
		return nil, fmt.Errorf("rope: theta %v is not exact in float32, which the kernel takes", theta)
	}
	rows := numel(s) / max(d, 1)
	return c.one("gc_rope", c.out(), c.arg(0), rows, positions, first, brk, second, d/2, float32(theta), c.in.Attrs.Bool("inverse"))
}

func (c *compiler) embedding() (func() error, error) {
	s := c.shape(0)
	return c.one("gc_embedding", c.out(), c.status(), c.arg(0), c.arg(1), numel(c.shape(1)), int64(s[0]), int64(s[1]))
}

func (c *compiler) embeddingGrad() (func() error, error) {
	outShape := c.outShape()
	rows := int64(outShape[0])
	offset, total := int64(0), rows
	if o, vocab, split := runtime.VocabRows(c.d.prog.Mesh, c.in.Value, c.d.coords); split {
		// The device's rows of a vocab-split gradient (see the CPU
		// backend's embeddingGrad).
		offset, total = int64(o), int64(vocab)
	}
	// A counting sort of the positions by row, then one block per row
	// (kernels/cuda/nn.cu): index holds each row's end, list the
	// positions row by row.
	count := numel(c.shape(0))
	index := parg{at: c.scratch(4 * max(rows, 1)), dt: ir.I32}
	list := parg{at: c.scratch(4 * max(count, 1)), dt: ir.I32}
	steps := []struct {
		name string
		args []any
	}{
		{"gc_embedding_grad_clear", []any{index, rows}},
		{"gc_embedding_grad_count", []any{index, c.status(), c.arg(0), count, rows, offset, total}},
		{"gc_embedding_grad_scan", []any{index, rows}},
		{"gc_embedding_grad_place", []any{list, index, c.arg(0), count, rows, offset}},
		{"gc_embedding_grad", []any{c.out(), index, list, c.arg(0), c.arg(1), count, rows, int64(outShape[1]), offset}},
	}
	ls := make([]*launch, len(steps))
	for i, s := range steps {
		l, err := c.kernel(s.name, s.args...)
		if err != nil {
			return nil, err
		}
		ls[i] = l
	}
	return c.runs(ls...), nil
}

// crossEntropy computes a (loss, count) pair per row into the workspace,
// then one block adds them in order and divides by the rows.
func (c *compiler) crossEntropy() (func() error, error) {
	s := c.shape(0)
	rows, vocab := int64(s[0]), int64(s[1])
	pairs := parg{at: c.scratch(8 * rows), dt: ir.F32}
	l1, err := c.kernel("gc_cross_entropy_rows", pairs, c.status(), c.arg(0), c.arg(1), rows, vocab)
	if err != nil {
		return nil, err
	}
	l2, err := c.kernel("gc_finish_sum", c.out(), pairs, rows, max(rows, 1))
	if err != nil {
		return nil, err
	}
	return c.runs(l1, l2), nil
}

func (c *compiler) crossEntropyGrad() (func() error, error) {
	s := c.shape(0)
	return c.one("gc_cross_entropy_grad", c.out(), c.status(), c.arg(0), c.arg(1), c.arg(2), int64(s[0]), int64(s[1]))
}
