package cuda

import (
	"fmt"

	"gcompile/ir"
	"gcompile/lower"
)

// compiler turns one instruction into a closure that queues its work,
// as its op's registered preparation (registry.go) says. The
// preparations mirror the CPU backend's kernels (runtime/cpu) op by op,
// so that both backends run a program the same way; where the CPU calls
// a Go kernel this queues the matching CUDA kernel of package
// kernels/cuda.
type compiler struct {
	d     *Device
	in    lower.Instr
	index int
	// shadow holds the fp32 scratch copies that stand in for 16-bit
	// buffers while an instruction is emulated (precision.go).
	shadow map[int]loc
	notes  []string
}

// compile prepares instruction i. The scratch workspace starts again at
// offset 0: instructions run one after another on the compute stream.
func (d *Device) compile(i int, in lower.Instr) (f func() error, err error) {
	d.scratch.cur = 0
	c := &compiler{d: d, in: in, index: i}
	defer func() {
		// A malformed instruction (arguments the op does not have, shapes
		// of the wrong rank) is an error naming it, not a crash.
		if r := recover(); r != nil {
			f, err = nil, fmt.Errorf("malformed instruction (%d args, %d arg types, out %d): %v", len(in.Args), len(in.ArgTypes), in.Out, r)
		}
		d.notes = append(d.notes, c.notes)
	}()
	if in.Out < 0 && in.Op != "send" {
		return nil, fmt.Errorf("%s has no result buffer", in.Op)
	}
	for _, id := range append(in.Args[:len(in.Args):len(in.Args)], in.Out) {
		if id >= len(d.prog.Buffers) || id < 0 && id != in.Out {
			return nil, fmt.Errorf("buffer %d is not in the program", id)
		}
	}
	return c.instr()
}

func (c *compiler) note(s string) { c.notes = append(c.notes, s) }

func (c *compiler) buf(id int) lower.Buffer { return c.d.prog.Buffers[id] }

// dtype is what buffer id holds as the kernels see it: fp32 for a 16-bit
// buffer being emulated.
func (c *compiler) dtype(id int) ir.DType {
	if _, ok := c.shadow[id]; ok {
		return ir.F32
	}
	return c.buf(id).Type.DType
}

func (c *compiler) loc(id int) loc {
	if l, ok := c.shadow[id]; ok {
		return l
	}
	return at(c.buf(id))
}

func (c *compiler) ptr(id int) parg { return parg{at: c.loc(id), dt: c.dtype(id)} }

func (c *compiler) arg(i int) parg { return c.ptr(c.in.Args[i]) }

func (c *compiler) out() parg { return c.ptr(c.in.Out) }

// bits marks an operand of a kernel that only moves elements.
func bits(p parg) parg { p.bits = true; return p }

// scratch reserves n bytes of the instruction's workspace.
func (c *compiler) scratch(n int64) loc { return loc{inScratch, c.d.scratch.take(n)} }

// status reserves a status word for one kernel call that validates ids.
func (c *compiler) status() parg {
	w := c.d.nstatus
	c.d.nstatus++
	c.d.statusOf = append(c.d.statusOf, c.index)
	return parg{at: loc{inStatus, 4 * int64(w)}, dt: ir.I32}
}

// shape is argument i's local shape.
func (c *compiler) shape(i int) []int { return []int(c.in.ArgTypes[i].Shape) }

func (c *compiler) outShape() []int { return []int(c.in.OutType.Shape) }

func numel(s []int) int64 { return ir.Shape(s).NumElements() }

// runs is a closure that queues launches in order.
func (c *compiler) runs(ls ...*launch) func() error {
	d := c.d
	return func() error {
		for _, l := range ls {
			if err := d.run(l); err != nil {
				return err
			}
		}
		return nil
	}
}

func seq(fs ...func() error) func() error {
	return func() error {
		for _, f := range fs {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}

// one plans a single kernel call as the whole instruction.
func (c *compiler) one(name string, args ...any) (func() error, error) {
	l, err := c.kernel(name, args...)
	if err != nil {
		return nil, err
	}
	return c.runs(l), nil
}

// instr prepares the instruction the way its op is registered.
func (c *compiler) instr() (func() error, error) {
	p, ok := backendOps.lookup(c.in.Op)
	if !ok {
		return nil, fmt.Errorf("the cuda backend has no kernel for op %s", c.in.Op)
	}
	return p(c)
}
