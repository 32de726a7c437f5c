package cpu

import (
	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime"
)

// The fused attention ops (kernels/cpu/attention.go). Each instruction
// finds at load where the device's heads sit (runtime.AttentionDims), so
// a device holding a block of the query heads reads the right k/v heads
// whether k and v are split with them or whole. The statistics are f32
// even when q is 16-bit: the backend widens the 16-bit operands and runs
// the float32 kernels, and an f32 operand is read as it is.
func init() {
	builtin(Kernel{F32: attention[float32], F64: attention[float64]}, "attention")
	builtin(Kernel{F32: attentionStats[float32], F64: attentionStats[float64]}, "attention_stats")
	builtin(Kernel{F32: attentionGradQ[float32], F64: attentionGradQ[float64]}, "attention_grad_q")
	builtin(Kernel{F32: attentionGradK[float32], F64: attentionGradK[float64]}, "attention_grad_k")
	builtin(Kernel{F32: attentionGradV[float32], F64: attentionGradV[float64]}, "attention_grad_v")
}

func attentionDims[T kcpu.Float](c *Call[T]) (kcpu.AttentionDims, error) {
	return runtime.AttentionDims(c.d.prog.Mesh, c.Instr, c.d.coords)
}

func attention[T kcpu.Float](c *Call[T]) (func() error, error) {
	d, err := attentionDims(c)
	if err != nil {
		return nil, err
	}
	if f, ring, err := compileRingAttention(c, d); ring || err != nil {
		return f, err
	}
	out, q, k, v := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	return ok(func() { kcpu.Attention(out, q, k, v, d) }), nil
}

func attentionStats[T kcpu.Float](c *Call[T]) (func() error, error) {
	d, err := attentionDims(c)
	if err != nil {
		return nil, err
	}
	if f, ring, err := compileRingAttention(c, d); ring || err != nil {
		return f, err
	}
	stats, q, k, out, dout := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3)
	return ok(func() { kcpu.AttentionStats(stats, q, k, out, dout, d) }), nil
}

func attentionGradQ[T kcpu.Float](c *Call[T]) (func() error, error) {
	d, err := attentionDims(c)
	if err != nil {
		return nil, err
	}
	if f, ring, err := compileRingAttention(c, d); ring || err != nil {
		return f, err
	}
	dq, q, k, v, dout, stats := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3), c.Arg(4)
	return ok(func() { kcpu.AttentionGradQ(dq, q, k, v, dout, stats, d) }), nil
}

func attentionGradK[T kcpu.Float](c *Call[T]) (func() error, error) {
	d, err := attentionDims(c)
	if err != nil {
		return nil, err
	}
	if f, ring, err := compileRingAttention(c, d); ring || err != nil {
		return f, err
	}
	dk, q, k, v, dout, stats := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3), c.Arg(4)
	return ok(func() { kcpu.AttentionGradK(dk, q, k, v, dout, stats, d) }), nil
}

func attentionGradV[T kcpu.Float](c *Call[T]) (func() error, error) {
	d, err := attentionDims(c)
	if err != nil {
		return nil, err
	}
	if f, ring, err := compileRingAttention(c, d); ring || err != nil {
		return f, err
	}
	dv, q, k, dout, stats := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3)
	return ok(func() { kcpu.AttentionGradV(dv, q, k, dout, stats, d) }), nil
}

// Generation's ops (kernels/cpu/generate.go): positions come from the
// step's positions input, and a position outside the cache fails the step
// with its sequence named instead of writing out of bounds.
func init() {
	builtin(Kernel{F32: ropeAt[float32], F64: ropeAt[float64]}, "rope_at")
	builtin(Kernel{F32: kvWrite[float32], F64: kvWrite[float64]}, "kv_write")
	builtin(Kernel{F32: attentionAt[float32], F64: attentionAt[float64]}, "attention_at")
}

func ropeAt[T kcpu.Float](c *Call[T]) (func() error, error) {
	pos, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	out, x, s := c.Out(), c.Arg(0), c.Shape(0)
	theta := c.Instr.Attrs.Float("theta", 0)
	return ok(func() { kcpu.RoPEAt(out, x, pos, s[0], s[1], s[2], s[3], theta) }), nil
}

func kvWrite[T kcpu.Float](c *Call[T]) (func() error, error) {
	pos, err := c.Int32(2)
	if err != nil {
		return nil, err
	}
	out, cache, n, s, step := c.Out(), c.Arg(0), c.Arg(1), c.Shape(0), c.Shape(1)[2]
	return func() error { return kcpu.KVWrite(out, cache, n, pos, s[0], s[1], s[2], step, s[3]) }, nil
}

func attentionAt[T kcpu.Float](c *Call[T]) (func() error, error) {
	d, err := attentionDims(c)
	if err != nil {
		return nil, err
	}
	pos, err := c.Int32(3)
	if err != nil {
		return nil, err
	}
	out, q, k, v := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	return func() error { return kcpu.AttentionAt(out, q, k, v, pos, d) }, nil
}
