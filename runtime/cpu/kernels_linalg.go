package cpu

import (
	kcpu "gcompile/kernels/cpu"
)

// Matrix products and reductions over axes.
func init() {
	builtin(Kernel{F32: matmul[float32], F64: matmul[float64]}, "matmul")
	builtin(reduceKernel(kcpu.ReduceSum[float32], kcpu.ReduceSum[float64]), "reduce_sum")
	builtin(reduceKernel(kcpu.ReduceMean[float32], kcpu.ReduceMean[float64]), "reduce_mean")
	builtin(reduceKernel(kcpu.ReduceMax[float32], kcpu.ReduceMax[float64]), "reduce_max")
	builtin(Kernel{F32: reduceMaxGrad[float32], F64: reduceMaxGrad[float64]}, "reduce_max_grad")
}

// matmul maps the IR's matmul forms onto the batched GEMM kernel.
func matmul[T kcpu.Float](c *Call[T]) (func() error, error) {
	a := c.Instr.Attrs
	return compileMatMul(c.Out(), c.Arg(0), c.Arg(1), c.Shape(0), c.Shape(1), a.Bool("transA"), a.Bool("transB")), nil
}

func compileMatMul[T kcpu.Float](c, a, b []T, as, bs []int, ta, tb bool) func() error {
	ra, rb := len(as), len(bs)
	m, k := as[ra-2], as[ra-1]
	if ta {
		m, k = k, m
	}
	n := bs[rb-1]
	if tb {
		n = bs[rb-2]
	}
	batch := 1
	for _, x := range as[:ra-2] {
		batch *= x
	}
	shared := rb == 2
	return ok(func() { kcpu.MatMul(c, a, b, batch, m, n, k, ta, tb, shared) })
}

// reduceKernel is the kernel of a reduction over the axes attribute.
func reduceKernel(f32 func(o, x []float32, s, axes []int), f64 func(o, x []float64, s, axes []int)) Kernel {
	return Kernel{F32: reduceOf(f32), F64: reduceOf(f64)}
}

func reduceOf[T kcpu.Float](f func(o, x []T, s, axes []int)) Builder[T] {
	return func(c *Call[T]) (func() error, error) {
		out, x, s, axes := c.Out(), c.Arg(0), c.Shape(0), c.Instr.Attrs.Ints("axes")
		return ok(func() { f(out, x, s, axes) }), nil
	}
}

func reduceMaxGrad[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, y, dy, s, axes := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Shape(0), c.Instr.Attrs.Ints("axes")
	return ok(func() { kcpu.ReduceMaxGrad(out, x, y, dy, s, axes) }), nil
}
