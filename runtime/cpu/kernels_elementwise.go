package cpu

import (
	"errors"
	"fmt"

	"gcompile/codegen"
	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// Elementwise ops: arithmetic, activations and their gradients, the fused
// groups codegen runs, scaling by a scalar, and ReLU's packed masks.
func init() {
	builtin(binaryKernel(kcpu.Add[float32], kcpu.Add[float64]), "add")
	builtin(binaryKernel(kcpu.Sub[float32], kcpu.Sub[float64]), "sub")
	builtin(binaryKernel(kcpu.Mul[float32], kcpu.Mul[float64]), "mul")
	builtin(binaryKernel(kcpu.Div[float32], kcpu.Div[float64]), "div")
	builtin(unaryKernel(kcpu.Neg[float32], kcpu.Neg[float64]), "neg")
	builtin(unaryKernel(kcpu.Exp[float32], kcpu.Exp[float64]), "exp")
	builtin(unaryKernel(kcpu.Log[float32], kcpu.Log[float64]), "log")
	builtin(unaryKernel(kcpu.Tanh[float32], kcpu.Tanh[float64]), "tanh")
	builtin(unaryKernel(kcpu.Sqrt[float32], kcpu.Sqrt[float64]), "sqrt")
	builtin(unaryKernel(kcpu.Gelu[float32], kcpu.Gelu[float64]), "gelu")
	builtin(unaryKernel(kcpu.Relu[float32], kcpu.Relu[float64]), "relu")
	builtin(unaryKernel(kcpu.Silu[float32], kcpu.Silu[float64]), "silu")
	// Gradients of activations take (x or y, dy): two equal-shaped
	// arguments, like the arithmetic above.
	builtin(binaryKernel(kcpu.GeluGrad[float32], kcpu.GeluGrad[float64]), "gelu_grad")
	builtin(binaryKernel(kcpu.ReluGrad[float32], kcpu.ReluGrad[float64]), "relu_grad")
	builtin(binaryKernel(kcpu.TanhGrad[float32], kcpu.TanhGrad[float64]), "tanh_grad")
	builtin(binaryKernel(kcpu.SiluGrad[float32], kcpu.SiluGrad[float64]), "silu_grad")
	builtin(Kernel{F32: fused[float32], F64: fused[float64]}, ir.FusedOp)
	builtin(Kernel{F32: scale[float32], F64: scale[float64]}, "scale")
	// The float operand of a mask op (x of relu_mask, dy of
	// relu_grad_mask) picks the kernel: the mask itself is u8.
	builtin(Kernel{F32: reluMask[float32], F64: reluMask[float64], TypeOf: Arg(0)}, "relu_mask")
	builtin(Kernel{F32: reluGradMask[float32], F64: reluGradMask[float64], TypeOf: Arg(1)}, "relu_grad_mask")
}

// binaryKernel is the kernel of an elementwise op of two equal-shaped arguments.
func binaryKernel(f32 func(o, x, y []float32), f64 func(o, x, y []float64)) Kernel {
	return Kernel{F32: binaryOf(f32), F64: binaryOf(f64)}
}

func binaryOf[T kcpu.Float](f func(o, x, y []T)) Builder[T] {
	return func(c *Call[T]) (func() error, error) {
		out, x, y := c.Out(), c.Arg(0), c.Arg(1)
		return ok(func() { f(out, x, y) }), nil
	}
}

// unaryKernel is the kernel of an elementwise op of one argument.
func unaryKernel(f32 func(o, x []float32), f64 func(o, x []float64)) Kernel {
	return Kernel{F32: unaryOf(f32), F64: unaryOf(f64)}
}

func unaryOf[T kcpu.Float](f func(o, x []T)) Builder[T] {
	return func(c *Call[T]) (func() error, error) {
		out, x := c.Out(), c.Arg(0)
		return ok(func() { f(out, x) }), nil
	}
}

// fused runs a group of elementwise ops the fuse pass merged: codegen
// runs the same kernels over cache-sized tiles, bit for bit as unfused.
func fused[T kcpu.Float](c *Call[T]) (func() error, error) {
	body, err := ir.ParseFusedBody(c.Instr.Attrs.Str("body"), len(c.Instr.Args))
	if err != nil {
		return nil, fmt.Errorf("fused: %w", err)
	}
	run, err := codegen.CPU(body, c.Out(), c.Args())
	if err != nil {
		return nil, fmt.Errorf("fused: %w", err)
	}
	return ok(run), nil
}

func scale[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x, s := c.Out(), c.Arg(0), c.Arg(1)
	return ok(func() { kcpu.Scale(out, x, s[0]) }), nil
}

func reluMask[T kcpu.Float](c *Call[T]) (func() error, error) {
	rows, n, err := maskGeometry(c, 0)
	if err != nil {
		return nil, err
	}
	m, x := view[uint8](c.d, c.Instr.Out), c.Arg(0)
	if err := errors.Join(sized(c, "mask", len(m), rows*kcpu.MaskRowBytes(n)), sized(c, "float", len(x), rows*n)); err != nil {
		return nil, err
	}
	return ok(func() { kcpu.ReluMask(m, x, rows, n) }), nil
}

func reluGradMask[T kcpu.Float](c *Call[T]) (func() error, error) {
	rows, n, err := maskGeometry(c, 1)
	if err != nil {
		return nil, err
	}
	m, dy := view[uint8](c.d, c.Instr.Args[0]), c.Arg(1)
	if err := errors.Join(sized(c, "mask", len(m), rows*kcpu.MaskRowBytes(n)), sized(c, "float", len(dy), rows*n)); err != nil {
		return nil, err
	}
	out := c.Out()
	if err := sized(c, "result", len(out), rows*n); err != nil {
		return nil, err
	}
	return ok(func() { kcpu.ReluGradMask(out, m, dy, rows, n) }), nil
}

// maskGeometry is the rows and row length of a mask op's float operand
// (argument f), checked against the mask's type. The shapes are the local
// ones: under a split of the last dim each device packs its own elements,
// which the sharding rule made whole bytes. 16-bit operands were widened
// by compile16 before this is reached.
func maskGeometry[T kcpu.Float](c *Call[T], f int) (rows, n int, err error) {
	in := c.Instr
	t := in.ArgTypes[f]
	if t.Rank() < 1 {
		return 0, 0, fmt.Errorf("%s needs a tensor of rank ≥ 1, got %v", in.Op, t)
	}
	n = t.Shape[t.Rank()-1]
	rows = 1
	for _, k := range t.Shape[:t.Rank()-1] {
		rows *= k
	}
	mask := in.OutType
	if in.Op == "relu_grad_mask" {
		mask = in.ArgTypes[0]
	}
	want := t.Shape.Clone()
	want[len(want)-1] = kcpu.MaskRowBytes(n)
	if mask.DType != ir.U8 || !mask.Shape.Equal(want) {
		return 0, 0, fmt.Errorf("%s: the local mask is %v, want u8%v for the local %v", in.Op, mask, want, t)
	}
	return rows, n, nil
}

// sized checks a buffer's length against the local shapes at load: the
// mask kernels panic on lengths that disagree with the shape.
func sized[T kcpu.Float](c *Call[T], what string, got, want int) error {
	if got != want {
		return fmt.Errorf("%s: %s buffer holds %d elements, the local shapes need %d", c.Instr.Op, what, got, want)
	}
	return nil
}
