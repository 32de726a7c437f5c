package cuda

import (
	"fmt"

	"gcompile/ir"
)

// Elementwise ops: one grid-stride kernel over the result's elements,
// named gc_<op>, and the packed ReLU masks.
func init() {
	register(addWiden16(onFP32(resultDType, binaryKernel)), "add")
	register(onFP32(resultDType, binaryKernel), "sub", "mul", "div")
	register(onFP32(resultDType, unaryKernel), "neg", "exp", "log", "tanh", "sqrt", "gelu", "relu", "silu")
	// Activation gradients take (x, dy), or (y, dy) for tanh.
	register(onFP32(resultDType, binaryKernel), "gelu_grad", "relu_grad", "tanh_grad", "silu_grad")
	// The scalar factor is argument 1, read from device memory.
	register(onFP32(resultDType, binaryKernel), "scale")
	// The masks check their own operands: the result of relu_mask is u8.
	register(emulated((*compiler).bitmask), "relu_mask", "relu_grad_mask")
}

// addWiden16 runs an add of an fp32 value and a 16-bit one into an fp32
// result (lowering's sums of mixed-precision gradients over the
// microbatches) as one kernel that widens the 16-bit operand as it reads
// it: emulate16 would widen it into the workspace first. Other adds take
// f.
func addWiden16(f prepare) prepare {
	return func(c *compiler) (func() error, error) {
		in := c.in
		if in.Out < 0 || len(in.Args) != 2 || in.Scale != 0 || c.dtype(in.Out) != ir.F32 || c.dtype(in.Args[0]) != ir.F32 {
			return f(c)
		}
		name := "gc_add_widen_f16"
		switch c.dtype(in.Args[1]) {
		case ir.BF16:
			name = "gc_add_widen_bf16"
		case ir.F16:
		default:
			return f(c)
		}
		return c.one(name, c.out(), c.arg(0), c.arg(1), numel(c.outShape()))
	}
}

// binaryKernel is gc_<op>(out, a, b, n).
func binaryKernel(c *compiler) (func() error, error) {
	return c.one("gc_"+c.in.Op, c.out(), c.arg(0), c.arg(1), numel(c.outShape()))
}

// unaryKernel is gc_<op>(out, x, n).
func unaryKernel(c *compiler) (func() error, error) {
	return c.one("gc_"+c.in.Op, c.out(), c.arg(0), numel(c.outShape()))
}

// bitmask runs the packed ReLU mask ops on the local shapes, as the CPU
// backend does: rows of the float operand's last dim, ⌈n/8⌉ mask bytes
// per row.
func (c *compiler) bitmask() (func() error, error) {
	in := c.in
	f := 0 // the float operand: x, or dy
	if in.Op == "relu_grad_mask" {
		f = 1
	}
	if dt := c.dtype(in.Args[f]); dt != ir.F32 {
		return nil, fmt.Errorf("the cuda backend cannot run %s on %v", in.Op, dt)
	}
	t := in.ArgTypes[f]
	if t.Rank() < 1 {
		return nil, fmt.Errorf("%s needs a tensor of rank ≥ 1, got %v", in.Op, t)
	}
	n := int64(t.Shape[t.Rank()-1])
	rows := numel(t.Shape) / max(n, 1)
	mask := in.OutType
	if in.Op == "relu_grad_mask" {
		mask = in.ArgTypes[0]
	}
	want := t.Shape.Clone()
	want[len(want)-1] = int((n + 7) / 8)
	if mask.DType != ir.U8 || !mask.Shape.Equal(want) {
		return nil, fmt.Errorf("%s: the local mask is %v, want u8%v for the local %v", in.Op, mask, want, t)
	}
	if in.Op == "relu_mask" {
		return c.one("gc_relu_mask", c.out(), c.arg(0), rows, n)
	}
	return c.one("gc_relu_grad_mask", c.out(), c.arg(0), c.arg(1), rows, n)
}
