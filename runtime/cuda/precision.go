package cuda

import (
	"fmt"
	"slices"

	"gcompile/ir"
)

// touches16 reports whether the instruction reads or writes a 16-bit buffer.
func (c *compiler) touches16() bool {
	if c.in.Out >= 0 && c.buf(c.in.Out).Type.DType.Is16() {
		return true
	}
	for _, a := range c.in.Args {
		if c.buf(a).Type.DType.Is16() {
			return true
		}
	}
	return false
}

// widenKernel and narrowKernel convert between a 16-bit format and fp32;
// the narrowing rounds to nearest even exactly as the CPU backend does.
func widenKernel(dt ir.DType) string {
	if dt == ir.BF16 {
		return "gc_bf16_to_f32"
	}
	return "gc_f16_to_f32"
}

func narrowKernel(dt ir.DType) string {
	if dt == ir.BF16 {
		return "gc_f32_to_bf16"
	}
	return "gc_f32_to_f16"
}

// Casts convert between the formats themselves, so they never pass
// through the 16-bit emulation.
func init() {
	register((*compiler).cast, "cast")
}

// emulate16 runs an instruction on fp16 or bf16 buffers as the CPU
// backend's compile16 does: each 16-bit argument is widened into an fp32
// copy in the scratch workspace, f prepares the fp32 kernels on the
// copies (fp32 accumulation in reductions, softmax and LayerNorm), and a
// 16-bit result is rounded back. Other operands are used where they are. The copies are
// workspace, outside the arena and the memory plan, as on the CPU.
func (c *compiler) emulate16(f prepare) (func() error, error) {
	in := c.in
	if in.Bucket > 0 {
		return nil, fmt.Errorf("bucketed %s of 16-bit values is not supported by the cuda backend yet", in.Op)
	}
	ids := slices.Clone(in.Args)
	if in.Out >= 0 {
		ids = append(ids, in.Out)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	c.shadow = map[int]loc{}
	var widen []*launch
	for _, id := range ids {
		b := c.buf(id)
		if !b.Type.DType.Is16() {
			continue
		}
		if b.Host {
			return nil, fmt.Errorf("%s is offloaded to host memory; only a copy may read it", bufferName(b))
		}
		n := b.Type.Shape.NumElements()
		c.shadow[id] = c.scratch(4 * n)
		if !slices.Contains(in.Args, id) {
			continue
		}
		l, err := c.kernel(widenKernel(b.Type.DType), parg{at: c.shadow[id], dt: ir.F32}, parg{at: at(b), dt: b.Type.DType}, n)
		if err != nil {
			return nil, err
		}
		widen = append(widen, l)
	}
	run, err := f(c)
	if err != nil {
		return nil, err
	}
	steps := []func() error{c.runs(widen...), run}
	if in.Out >= 0 {
		if b := c.buf(in.Out); b.Type.DType.Is16() {
			n := b.Type.Shape.NumElements()
			l, err := c.kernel(narrowKernel(b.Type.DType), parg{at: at(b), dt: b.Type.DType}, parg{at: c.shadow[in.Out], dt: ir.F32}, n)
			if err != nil {
				return nil, err
			}
			steps = append(steps, c.runs(l))
		}
	}
	return seq(steps...), nil
}

// cast converts between fp32, the 16-bit formats and i32 (to fp32), and
// copies a buffer to one of its own dtype.
func (c *compiler) cast() (func() error, error) {
	src, dst := c.buf(c.in.Args[0]), c.buf(c.in.Out)
	from, to := src.Type.DType, dst.Type.DType
	n := dst.Type.Shape.NumElements()
	in, out := parg{at: at(src), dt: from}, parg{at: at(dst), dt: to}
	switch {
	case from == to:
		return c.deviceCopy(src, dst)
	case from == ir.F32 && to.Is16():
		return c.one(narrowKernel(to), out, in, n)
	case from.Is16() && to == ir.F32:
		return c.one(widenKernel(from), out, in, n)
	case from == ir.I32 && to == ir.F32:
		return c.one("gc_i32_to_f32", out, in, n)
	}
	return nil, fmt.Errorf("the cuda backend cannot cast %v to %v", from, to)
}
