package cpu

import (
	"fmt"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// cast converts between dtypes itself, 16-bit formats included
// (precision.go), so the backend neither widens its operands nor picks a
// float kernel for it.
func init() {
	builtin(Kernel{raw: compileCast}, "cast")
}

func compileCast(d *Device, in lower.Instr) (func() error, error) {
	src, dst := d.prog.Buffers[in.Args[0]], d.prog.Buffers[in.Out]
	type pair struct{ from, to ir.DType }
	switch (pair{src.Type.DType, dst.Type.DType}) {
	case pair{ir.F32, ir.F64}:
		x, y := view[float32](d, src.ID), view[float64](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), nil
	case pair{ir.F64, ir.F32}:
		x, y := view[float64](d, src.ID), view[float32](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), nil
	case pair{ir.F32, ir.F32}, pair{ir.F64, ir.F64}:
		x, y := d.raw(src), d.raw(dst)
		return ok(func() { copy(y, x) }), nil
	case pair{ir.I32, ir.F32}:
		x, y := view[int32](d, src.ID), view[float32](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), nil
	}
	if f, ok := d.compileCast16(src, dst); ok {
		return f, nil
	}
	return nil, fmt.Errorf("the cpu backend cannot cast %v to %v yet", src.Type.DType, dst.Type.DType)
}
