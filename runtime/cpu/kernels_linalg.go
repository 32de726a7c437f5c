package cpu

import (
	"gcompile/ir"
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
	ta, tb := c.Instr.Attrs.Bool("transA"), c.Instr.Attrs.Bool("transB")
	g, err := ir.MatMulGEMM(c.Shape(0), c.Shape(1), ta, tb)
	if err != nil {
		return nil, err
	}
	out, x, y := c.Out(), c.Arg(0), c.Arg(1)
	return ok(func() { kcpu.MatMul(out, x, y, g.Batch, g.M, g.N, g.K, ta, tb, g.SharedB) }), nil
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
