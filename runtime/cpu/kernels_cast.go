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
	if src.Type.DType == dst.Type.DType {
		x, y := d.raw(src), d.raw(dst)
		return ok(func() { copy(y, x) }), nil
	}
	if f, ok := d.compileCast16(src, dst); ok {
		return f, nil
	}
	if f, ok := castWide(d, src, dst); ok {
		return f, nil
	}
	if f, ok := castVia32(d, src, dst); ok {
		return f, nil
	}
	return nil, fmt.Errorf("the cpu backend cannot cast %v to %v yet", src.Type.DType, dst.Type.DType)
}

// castVia32 casts a 16-bit float to or from any other dtype (f64, i32,
// i64, bool, the other 16-bit format) through f32, in a buffer of the
// kernel's own: a model's x.Cast(ir.I32) runs in bf16 under --precision
// bf16, which was refused at load. Every bf16 and f16 value is an f32
// exactly, so casts from them are exact; a cast to them rounds the
// value's f32, twice-rounded where the value is not an f32 already (an
// f64, an integer past 2^24).
func castVia32(d *Device, src, dst lower.Buffer) (func() error, bool) {
	from, to := src.Type.DType, dst.Type.DType
	if !from.Is16() && !to.Is16() {
		return nil, false
	}
	tmp := make([]float32, src.Type.Shape.NumElements())
	var in func()
	switch {
	case from.Is16():
		x, bf := view[uint16](d, src.ID), from == ir.BF16
		in = func() { kcpu.Widen16(tmp, x, bf) }
	case from == ir.F64:
		x := view[float64](d, src.ID)
		in = func() { kcpu.Cast(tmp, x) }
	case from == ir.I32:
		x := view[int32](d, src.ID)
		in = func() { kcpu.Cast(tmp, x) }
	case from == ir.I64:
		x := view[int64](d, src.ID)
		in = func() { kcpu.Cast(tmp, x) }
	case from == ir.Bool:
		in = fromBool(tmp, view[bool](d, src.ID))
	default:
		return nil, false
	}
	switch {
	case to.Is16():
		y, bf := view[uint16](d, dst.ID), to == ir.BF16
		out := func() { kcpu.Round16(y, tmp, bf) }
		return ok(func() { in(); out() }), true
	case to == ir.Bool:
		out := nonzero(view[bool](d, dst.ID), tmp)
		return ok(func() { in(); out() }), true
	}
	out, can := castTo(d, tmp, dst)
	if !can {
		return nil, false
	}
	return func() error { in(); return out() }, true
}

// castWide converts between any two of f32, f64, i32, i64 and bool as Go
// converts (floats to integers truncate toward zero), with bool as JAX and
// NumPy have it: true is 1, and any value other than zero (NaN included)
// is true. No op makes a bool but cast, so x.Cast(Bool).Cast(F32) is the
// DSL's x ≠ 0 mask.
func castWide(d *Device, src, dst lower.Buffer) (func() error, bool) {
	from, to := src.Type.DType, dst.Type.DType
	if to == ir.Bool {
		var f func()
		switch from {
		case ir.F32:
			f = nonzero(view[bool](d, dst.ID), view[float32](d, src.ID))
		case ir.F64:
			f = nonzero(view[bool](d, dst.ID), view[float64](d, src.ID))
		case ir.I32:
			f = nonzero(view[bool](d, dst.ID), view[int32](d, src.ID))
		case ir.I64:
			f = nonzero(view[bool](d, dst.ID), view[int64](d, src.ID))
		default:
			return nil, false
		}
		return ok(f), true
	}
	if from == ir.Bool {
		x := view[bool](d, src.ID)
		switch to {
		case ir.F32:
			return ok(fromBool(view[float32](d, dst.ID), x)), true
		case ir.F64:
			return ok(fromBool(view[float64](d, dst.ID), x)), true
		case ir.I32:
			return ok(fromBool(view[int32](d, dst.ID), x)), true
		case ir.I64:
			return ok(fromBool(view[int64](d, dst.ID), x)), true
		}
		return nil, false
	}
	switch from {
	case ir.F32:
		return castTo(d, view[float32](d, src.ID), dst)
	case ir.F64:
		return castTo(d, view[float64](d, src.ID), dst)
	case ir.I32:
		return castTo(d, view[int32](d, src.ID), dst)
	case ir.I64:
		return castTo(d, view[int64](d, src.ID), dst)
	}
	return nil, false
}

func castTo[From kcpu.Number](d *Device, x []From, dst lower.Buffer) (func() error, bool) {
	switch dst.Type.DType {
	case ir.F32:
		y := view[float32](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), true
	case ir.F64:
		y := view[float64](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), true
	case ir.I32:
		y := view[int32](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), true
	case ir.I64:
		y := view[int64](d, dst.ID)
		return ok(func() { kcpu.Cast(y, x) }), true
	}
	return nil, false
}

func nonzero[From kcpu.Number](y []bool, x []From) func() {
	return func() {
		for i, v := range x {
			y[i] = v != 0
		}
	}
}

func fromBool[To kcpu.Number](y []To, x []bool) func() {
	return func() {
		for i, v := range x {
			y[i] = 0
			if v {
				y[i] = 1
			}
		}
	}
}
