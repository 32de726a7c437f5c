package cpu

import (
	"fmt"
	"slices"
	"unsafe"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// touches16 reports whether an instruction reads or writes a 16-bit buffer.
func (d *Device) touches16(in lower.Instr) bool {
	if in.Out >= 0 && d.prog.Buffers[in.Out].Type.DType.Is16() {
		return true
	}
	for _, a := range in.Args {
		if d.prog.Buffers[a].Type.DType.Is16() {
			return true
		}
	}
	return false
}

// compile16 emulates an instruction on fp16 or bf16 buffers: its
// arguments are widened to float32 in a scratch area, the float32 kernel
// runs there (fp32 accumulation in GEMM, softmax, LayerNorm and
// reductions), and the result is rounded back to the 16-bit format. Other
// arguments (ids, the step, fp32 values) are copied into the scratch as
// they are, and its workspace is given room there. The scratch is
// allocated at load, one per such instruction, outside the arena: the
// memory plan counts the 16-bit buffers only, so measured peaks do not
// include it.
func (d *Device) compile16(in lower.Instr) (func() error, error) {
	if in.Bucket > 0 {
		return nil, fmt.Errorf("bucketed %s of 16-bit values is not supported by the cpu backend yet", in.Op)
	}
	prog := *d.prog
	prog.Buffers = slices.Clone(d.prog.Buffers)
	ids := slices.Clone(in.Args)
	if in.Out >= 0 {
		ids = append(ids, in.Out)
	}
	// The instruction's workspace (ring attention's chunks) moves to the
	// scratch with it: the kernel runs on the shadow device.
	ids = append(ids, in.Scratch...)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var size int64
	for _, id := range ids {
		b := prog.Buffers[id]
		if b.Type.DType.Is16() {
			b.Type.DType = ir.F32
			b.Bytes *= 2
		}
		// Every operand lives in the scratch, offloaded or not.
		b.Offset, b.Host = size, false
		size += (b.Bytes + 7) &^ 7
		prog.Buffers[id] = b
	}
	shadow := *d
	shadow.prog = &prog
	shadow.arena = make([]uint64, size/8)
	shadow.run = nil
	if size > 0 {
		shadow.bytes = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(shadow.arena))), size)
	} else {
		shadow.bytes = nil
	}
	f, err := shadow.compile(in)
	if err != nil {
		return nil, err
	}
	type conv struct {
		bf16, wide bool
		half       []uint16
		f32        []float32
		raw, tmp   []byte
	}
	mk := func(id int) conv {
		b := d.prog.Buffers[id]
		c := conv{wide: b.Type.DType.Is16(), bf16: b.Type.DType == ir.BF16}
		if c.wide {
			c.half, c.f32 = view[uint16](d, id), view[float32](&shadow, id)
		} else {
			c.raw, c.tmp = d.raw(b), shadow.raw(prog.Buffers[id])
		}
		return c
	}
	var ins []conv
	for _, id := range ids {
		if slices.Contains(in.Args, id) {
			ins = append(ins, mk(id))
		}
	}
	var out *conv
	if in.Out >= 0 {
		c := mk(in.Out)
		out = &c
	}
	return func() error {
		for _, c := range ins {
			if c.wide {
				kcpu.Widen16(c.f32, c.half, c.bf16)
			} else {
				copy(c.tmp, c.raw)
			}
		}
		if err := f(); err != nil {
			return err
		}
		if out != nil {
			if out.wide {
				kcpu.Round16(out.half, out.f32, out.bf16)
			} else {
				copy(out.raw, out.tmp)
			}
		}
		return nil
	}, nil
}

// compileCast16 converts between float32 and the 16-bit formats.
func (d *Device) compileCast16(src, dst lower.Buffer) (func() error, bool) {
	switch {
	case src.Type.DType == ir.F32 && dst.Type.DType.Is16():
		x, y, bf := view[float32](d, src.ID), view[uint16](d, dst.ID), dst.Type.DType == ir.BF16
		return ok(func() { kcpu.Round16(y, x, bf) }), true
	case src.Type.DType.Is16() && dst.Type.DType == ir.F32:
		x, y, bf := view[uint16](d, src.ID), view[float32](d, dst.ID), src.Type.DType == ir.BF16
		return ok(func() { kcpu.Widen16(y, x, bf) }), true
	}
	return nil, false
}

// compileAddWiden16 runs an add of an fp32 value and a 16-bit one into
// an fp32 result (lowering's sums of mixed-precision gradients over the
// microbatches) as one kernel that widens the 16-bit operand as it reads
// it, with no float32 copy of it: compile16's scratch, one per
// instruction, would hold every gradient's copy for the whole run.
func (d *Device) compileAddWiden16(in lower.Instr) (func() error, bool) {
	if in.Op != "add" || in.Out < 0 || len(in.Args) != 2 || in.Scale != 0 {
		return nil, false
	}
	a, b, out := d.prog.Buffers[in.Args[0]], d.prog.Buffers[in.Args[1]], d.prog.Buffers[in.Out]
	if a.Type.DType != ir.F32 || out.Type.DType != ir.F32 || !b.Type.DType.Is16() || a.Host || b.Host || out.Host {
		return nil, false
	}
	x, y, o, bf := view[float32](d, a.ID), view[uint16](d, b.ID), view[float32](d, out.ID), b.Type.DType == ir.BF16
	return ok(func() { kcpu.AddWiden16(o, x, y, bf) }), true
}
