package cpu

import (
	kcpu "gcompile/kernels/cpu"
)

// Shape and movement ops: they copy elements to new positions without
// arithmetic, so an i32 instance (token ids cut into microbatches, for
// example) runs the float32 kernel on the bits.
func init() {
	builtin(Kernel{F32: transpose[float32], F64: transpose[float64], Bits: true}, "transpose")
	builtin(Kernel{F32: slice[float32], F64: slice[float64], Bits: true}, "slice")
	builtin(Kernel{F32: sliceGrad[float32], F64: sliceGrad[float64], Bits: true}, "slice_grad")
	builtin(Kernel{F32: concat[float32], F64: concat[float64], Bits: true}, "concat")
	builtin(Kernel{F32: broadcast[float32], F64: broadcast[float64], Bits: true}, "broadcast")
	builtin(Kernel{F32: repeatInterleave[float32], F64: repeatInterleave[float64], Bits: true}, "repeat_interleave")
	builtin(Kernel{F32: repeatInterleaveGrad[float32], F64: repeatInterleaveGrad[float64]}, "repeat_interleave_grad")
}

// repeatSplit reads shape as [outer, shape[dim], inner] (local sizes: a
// device holding a slice of dim repeats its own slices).
func repeatSplit(shape []int, dim int) (outer, n, inner int) {
	outer, inner = 1, 1
	for _, d := range shape[:dim] {
		outer *= d
	}
	for _, d := range shape[dim+1:] {
		inner *= d
	}
	return outer, shape[dim], inner
}

func repeatInterleave[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, dim, r := c.Out(), c.Arg(0), c.Instr.Attrs.Int("dim", 0), c.Instr.Attrs.Int("repeats", 1)
	outer, n, inner := repeatSplit(c.Shape(0), dim)
	return ok(func() { kcpu.RepeatInterleave(out, x, outer, n, inner, r) }), nil
}

func repeatInterleaveGrad[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, dy, dim, r := c.Out(), c.Arg(0), c.Instr.Attrs.Int("dim", 0), c.Instr.Attrs.Int("repeats", 1)
	outer, n, inner := repeatSplit(c.OutShape(), dim)
	return ok(func() { kcpu.RepeatInterleaveGrad(out, dy, outer, n, inner, r) }), nil
}

func transpose[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, s, perm := c.Out(), c.Arg(0), c.Shape(0), c.Instr.Attrs.Ints("perm")
	return ok(func() { kcpu.Transpose(out, x, s, perm) }), nil
}

func slice[T kcpu.Float](c *Call[T]) (func() error, error) {
	a := c.Instr.Attrs
	out, x, s := c.Out(), c.Arg(0), c.Shape(0)
	dim := a.Int("dim", 0)
	// A split dim is sliced in local coordinates: the global bounds fall
	// on block boundaries, which shrink by the split factor.
	f := c.Instr.Value.Args[0].Type.Shape[dim] / s[dim]
	start, end := a.Int("start", 0)/f, a.Int("end", 0)/f
	return ok(func() { kcpu.Slice(out, x, s, dim, start, end) }), nil
}

func sliceGrad[T kcpu.Float](c *Call[T]) (func() error, error) {
	a := c.Instr.Attrs
	out, dy, outShape := c.Out(), c.Arg(0), c.OutShape()
	dim := a.Int("dim", 0)
	f := c.Instr.Value.Type.Shape[dim] / outShape[dim]
	start := a.Int("start", 0) / f
	end := start + c.Shape(0)[dim]
	return ok(func() { kcpu.SliceGrad(out, dy, outShape, dim, start, end) }), nil
}

func concat[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, ins := c.Out(), c.Args()
	shapes := make([][]int, len(c.Instr.Args))
	for i := range shapes {
		shapes[i] = c.Shape(i)
	}
	dim := c.Instr.Attrs.Int("dim", 0)
	return ok(func() { kcpu.Concat(out, ins, shapes, dim) }), nil
}

func broadcast[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, s, outShape := c.Out(), c.Arg(0), c.Shape(0), c.OutShape()
	return ok(func() { kcpu.Broadcast(out, x, s, outShape) }), nil
}
