package cuda

import (
	"fmt"
	"math"
	"slices"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
	"gcompile/lower"
)

// compiler turns one instruction into a closure that queues its work.
// It mirrors runtime/cpu/compile.go case by case, so that both backends
// run a program the same way; where the CPU calls a Go kernel this queues
// the matching CUDA kernel of package kernels/cuda.
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

func (c *compiler) instr() (func() error, error) {
	switch c.in.Op {
	case "send", "recv":
		return c.transfer()
	case "copy":
		return c.copyInstr()
	case "cast":
		return c.cast()
	case "matmul":
		if c.nativeGemm() {
			return c.matmul()
		}
	}
	if c.touches16() {
		return c.emulate16()
	}
	return c.op()
}

// op compiles an instruction whose float buffers are all fp32 (or
// emulated as such).
func (c *compiler) op() (func() error, error) {
	in := c.in
	switch in.Op {
	case "relu_mask", "relu_grad_mask":
		return c.bitmask()
	case "all_reduce", "reduce_scatter", "all_gather", "shard_slice", "all_to_all":
		return c.collective()
	}
	dt := c.dtype(in.Out)
	switch in.Op {
	case "cross_entropy", "sum_squares", "clip_coef", "nonfinite_count":
		// Scalar results: the first argument's dtype decides the kernel.
		dt = c.dtype(in.Args[0])
	}
	switch {
	case dt == ir.F32:
	case dt == ir.I32 && movesOnly[in.Op]:
		// Ops that only move elements run on the bits: an i32 buffer
		// moved by a float kernel is copied exactly.
	default:
		return nil, fmt.Errorf("the cuda backend cannot run %s on %v", in.Op, dt)
	}
	f, err := c.kernels()
	if err != nil || in.Scale == 0 {
		return f, err
	}
	n := numel(c.outShape())
	scale, err := c.kernel(kcuda.InstrScale, c.out(), c.out(), n, float32(in.Scale))
	if err != nil {
		return nil, err
	}
	return seq(f, c.runs(scale)), nil
}

// movesOnly ops copy elements without arithmetic.
var movesOnly = map[string]bool{"slice": true, "slice_grad": true, "transpose": true, "concat": true, "broadcast": true}

// kernels plans the kernel calls of one op, as compileKernel does on the CPU.
func (c *compiler) kernels() (func() error, error) {
	if f, handled, err := c.vocabParallel(); handled || err != nil {
		return f, err
	}
	in := c.in
	a := in.Attrs
	outShape := c.outShape()
	n := numel(outShape)
	// mv marks operands of moves-only kernels, which may hold i32 bits.
	mv := func(p parg) parg {
		if movesOnly[in.Op] {
			return bits(p)
		}
		return p
	}
	lastDim := func(s []int) (rows, n int64) {
		k := int64(s[len(s)-1])
		return numel(s) / max(k, 1), k
	}
	switch in.Op {
	case "add", "sub", "mul", "div":
		return c.one("gc_"+in.Op, c.out(), c.arg(0), c.arg(1), n)
	case "neg", "exp", "log", "tanh", "sqrt", "gelu", "relu":
		return c.one("gc_"+in.Op, c.out(), c.arg(0), n)
	case "gelu_grad", "relu_grad", "tanh_grad":
		return c.one("gc_"+in.Op, c.out(), c.arg(0), c.arg(1), n)
	case "softmax_grad":
		rows, k := lastDim(outShape)
		return c.one("gc_softmax_grad", c.out(), c.arg(0), c.arg(1), rows, k)
	case "scale":
		return c.one("gc_scale", c.out(), c.arg(0), c.arg(1), n)
	case "matmul":
		return c.matmul()
	case "transpose":
		g, err := kcuda.TransposeGather(c.shape(0), a.Ints("perm"))
		if err != nil {
			return nil, err
		}
		return c.one("gc_gather", append([]any{mv(c.out()), mv(c.arg(0))}, g.Args()...)...)
	case "broadcast":
		g, err := kcuda.BroadcastGather(c.shape(0), outShape)
		if err != nil {
			return nil, err
		}
		return c.one("gc_gather", append([]any{mv(c.out()), mv(c.arg(0))}, g.Args()...)...)
	case "slice":
		s := c.shape(0)
		dim := a.Int("dim", 0)
		outer, dd, inner, err := kcuda.SliceGeometry(s, dim)
		if err != nil {
			return nil, err
		}
		// A split dim is sliced in local coordinates: the global bounds
		// fall on block boundaries, which shrink by the split factor.
		f := in.Value.Args[0].Type.Shape[dim] / s[dim]
		start, end := a.Int("start", 0)/f, a.Int("end", 0)/f
		return c.one("gc_slice", mv(c.out()), mv(c.arg(0)), outer, dd, inner, int64(start), int64(end-start))
	case "slice_grad":
		dim := a.Int("dim", 0)
		outer, dd, inner, err := kcuda.SliceGeometry(outShape, dim)
		if err != nil {
			return nil, err
		}
		f := in.Value.Type.Shape[dim] / outShape[dim]
		start := a.Int("start", 0) / f
		return c.one("gc_slice_grad", mv(c.out()), mv(c.arg(0)), outer, dd, inner, int64(start), int64(c.shape(0)[dim]))
	case "concat":
		dim := a.Int("dim", 0)
		outer, total, inner, err := kcuda.SliceGeometry(outShape, dim)
		if err != nil {
			return nil, err
		}
		var ls []*launch
		start := int64(0)
		for i := range in.Args {
			w := int64(c.shape(i)[dim])
			l, err := c.kernel("gc_concat_piece", mv(c.out()), mv(c.arg(i)), outer, total, inner, start, w)
			if err != nil {
				return nil, err
			}
			ls = append(ls, l)
			start += w
		}
		return c.runs(ls...), nil
	case "reduce_sum", "reduce_mean", "reduce_max":
		axes := slices.Sorted(slices.Values(a.Ints("axes")))
		outer, r, inner, err := kcuda.ReduceGeometry(c.shape(0), slices.Compact(axes))
		if err != nil {
			return nil, err
		}
		mean := in.Op == "reduce_mean"
		if in.Op == "reduce_max" {
			if inner == 1 {
				return c.one("gc_reduce_max_rows", c.out(), c.arg(0), outer, r)
			}
			return c.one("gc_reduce_max_cols", c.out(), c.arg(0), outer, r, inner)
		}
		if inner == 1 {
			return c.one("gc_reduce_sum_rows", c.out(), c.arg(0), outer, r, mean)
		}
		return c.one("gc_reduce_sum_cols", c.out(), c.arg(0), outer, r, inner, mean)
	case "reduce_max_grad":
		axes := slices.Sorted(slices.Values(a.Ints("axes")))
		outer, r, inner, err := kcuda.ReduceGeometry(c.shape(0), slices.Compact(axes))
		if err != nil {
			return nil, err
		}
		return c.one("gc_reduce_max_grad", c.out(), c.arg(0), c.arg(1), c.arg(2), outer, r, inner)
	case "softmax":
		rows, k := lastDim(outShape)
		return c.one("gc_softmax", c.out(), c.arg(0), rows, k)
	case "causal_mask":
		r := len(outShape)
		if r < 2 {
			return nil, fmt.Errorf("causal_mask needs rank ≥ 2, got %v", in.OutType)
		}
		s, t := int64(outShape[r-2]), int64(outShape[r-1])
		rows := n / max(t, 1)
		fill := float32(a.Float("fill", math.Inf(-1)))
		return c.one("gc_causal_mask", c.out(), c.arg(0), rows, s, t, fill)
	case "layernorm":
		rows, k := lastDim(outShape)
		return c.one("gc_layernorm", c.out(), c.arg(0), c.arg(1), c.arg(2), rows, k, float32(a.Float("eps", 0)))
	case "layernorm_grad_x":
		rows, k := lastDim(outShape)
		return c.one("gc_layernorm_grad_x", c.out(), c.arg(0), c.arg(1), c.arg(2), rows, k, float32(a.Float("eps", 0)))
	case "layernorm_grad_gamma":
		rows, k := lastDim(c.shape(0))
		stats := parg{at: c.scratch(16 * rows), dt: ir.F32}
		l1, err := c.kernel("gc_layernorm_stats", stats, c.arg(0), rows, k, float32(a.Float("eps", 0)))
		if err != nil {
			return nil, err
		}
		l2, err := c.kernel("gc_layernorm_grad_gamma", c.out(), c.arg(0), c.arg(1), stats, rows, k)
		if err != nil {
			return nil, err
		}
		return c.runs(l1, l2), nil
	case "embedding":
		s := c.shape(0)
		return c.one("gc_embedding", c.out(), c.status(), c.arg(0), c.arg(1), numel(c.shape(1)), int64(s[0]), int64(s[1]))
	case "embedding_grad":
		return c.one("gc_embedding_grad", c.out(), c.status(), c.arg(0), c.arg(1), numel(c.shape(0)), int64(outShape[0]), int64(outShape[1]))
	case "cross_entropy":
		s := c.shape(0)
		rows, vocab := int64(s[0]), int64(s[1])
		pairs := parg{at: c.scratch(8 * rows), dt: ir.F32}
		l1, err := c.kernel("gc_cross_entropy_rows", pairs, c.status(), c.arg(0), c.arg(1), rows, vocab)
		if err != nil {
			return nil, err
		}
		l2, err := c.kernel("gc_finish_sum", c.out(), pairs, rows, max(rows, 1))
		if err != nil {
			return nil, err
		}
		return c.runs(l1, l2), nil
	case "cross_entropy_grad":
		s := c.shape(0)
		return c.one("gc_cross_entropy_grad", c.out(), c.status(), c.arg(0), c.arg(1), c.arg(2), int64(s[0]), int64(s[1]))
	case "sum_squares", "nonfinite_count":
		return c.globalSum()
	case "where_finite":
		return c.one("gc_where_finite", c.out(), c.arg(0), c.arg(1), c.arg(2), n)
	case "clip_coef":
		return c.one("gc_clip_coef", c.out(), c.arg(0), float32(a.Float("max_norm", 0)))
	case "adam_m":
		return c.one("gc_adam_m", c.out(), c.arg(0), c.arg(1), n, float32(a.Float("beta1", 0)))
	case "adam_v":
		return c.one("gc_adam_v", c.out(), c.arg(0), c.arg(1), n, float32(a.Float("beta2", 0)))
	case "adamw":
		f, err := c.one("gc_adamw", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), n,
			float32(a.Float("beta1", 0)), float32(a.Float("beta2", 0)), float32(a.Float("eps", 0)), float32(a.Float("wd", 0)))
		return c.checkStep(4, f, err)
	case "sgd_buf":
		return c.one("gc_sgd_buf", c.out(), c.arg(0), c.arg(1), c.arg(2), n, float32(a.Float("momentum", 0)), float32(a.Float("wd", 0)))
	case "sgd":
		return c.one("gc_sgd", c.out(), c.arg(0), c.arg(1), c.arg(2), n)
	case "adafactor_row", "adafactor_col":
		gs := c.shape(1)
		f, err := c.one("gc_"+in.Op, c.out(), c.arg(0), c.arg(1), c.arg(2), int64(gs[0]), int64(gs[1]),
			float32(a.Float("eps1", 0)), float32(a.Float("decay", 0)))
		return c.checkStep(2, f, err)
	case "adafactor_v":
		f, err := c.one("gc_adafactor_v", c.out(), c.arg(0), c.arg(1), c.arg(2), n, float32(a.Float("eps1", 0)), float32(a.Float("decay", 0)))
		return c.checkStep(2, f, err)
	case "adafactor", "adafactor_vec":
		return c.adafactor()
	case "sm3_row":
		// Args are (row, g, col); the kernel takes (row, col, g).
		s := c.shape(1)
		return c.one("gc_sm3_row", c.out(), c.arg(0), c.arg(2), c.arg(1), int64(s[0]), int64(s[1]))
	case "sm3_col":
		// Args are (col, g, row).
		s := c.shape(1)
		return c.one("gc_sm3_col", c.out(), c.arg(2), c.arg(0), c.arg(1), int64(s[0]), int64(s[1]))
	case "sm3":
		s := c.shape(0)
		return c.one("gc_sm3", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), int64(s[0]), int64(s[1]))
	case "sm3_v":
		return c.one("gc_sm3_v", c.out(), c.arg(0), c.arg(1), n)
	case "sm3_vec":
		return c.one("gc_sm3_vec", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), n)
	}
	return nil, fmt.Errorf("the cuda backend has no kernel for op %s", in.Op)
}

// checkStep makes an optimizer update fail, as on the CPU, when the step
// number it reads (argument i, an input the runtime sets) is below 1: the
// kernel cannot report it.
func (c *compiler) checkStep(i int, f func() error, err error) (func() error, error) {
	if err != nil {
		return nil, err
	}
	id := c.in.Args[i]
	if c.buf(id).Kind != lower.Input {
		return f, nil
	}
	d, op := c.d, c.in.Op
	return func() error {
		if s, ok := d.scalars[id]; ok && s < 1 {
			return fmt.Errorf("%s: step must be ≥ 1, got %d", op, int64(s))
		}
		return f()
	}, nil
}

// partialGrid is the grid of a partial-sum launch over n elements: the
// number of per-block results it leaves.
func (c *compiler) partialGrid(n int64) uint32 {
	rt := c.d.rt
	return rt.gridFor(n, rt.threadsFor(n))
}

// globalSum is sum_squares or nonfinite_count over every argument: one
// partial launch per argument into consecutive per-block slots, then one
// block adds them in order.
func (c *compiler) globalSum() (func() error, error) {
	in := c.in
	grids := make([]uint32, len(in.Args))
	var total int64
	for i := range in.Args {
		grids[i] = c.partialGrid(numel(c.shape(i)))
		total += int64(grids[i])
	}
	partialName, finish, width, pdt := "gc_sum_squares_partial", "gc_finish_sum", int64(8), ir.F32
	if in.Op == "nonfinite_count" {
		partialName, finish, width, pdt = "gc_nonfinite_partial", "gc_finish_count", 4, ir.I32
	}
	base := c.scratch(width * total)
	var ls []*launch
	var off int64
	for i := range in.Args {
		p := parg{at: base.add(width * off), dt: pdt}
		l, err := c.kernelGrid(partialName, grids[i], p, c.arg(i), numel(c.shape(i)))
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		off += int64(grids[i])
	}
	var l *launch
	var err error
	if in.Op == "nonfinite_count" {
		l, err = c.kernel(finish, c.out(), parg{at: base, dt: ir.I32}, total)
	} else {
		l, err = c.kernel(finish, c.out(), parg{at: base, dt: ir.F32}, total, int64(1))
	}
	if err != nil {
		return nil, err
	}
	return c.runs(append(ls, l)...), nil
}

// adafactor is the factored (or vector) Adafactor update: the row sum,
// per-block partial norms, the clipped coefficient, then the update.
func (c *compiler) adafactor() (func() error, error) {
	in := c.in
	a := in.Attrs
	ws := parg{at: c.scratch(16), dt: ir.F32}
	step := c.arg(len(in.Args) - 1)
	eps2, clip, rel := float32(a.Float("eps2", 0)), float32(a.Float("clip", 0)), float32(a.Float("rel_step", 0))
	var ls []*launch
	add := func(l *launch, err error) error {
		if err == nil {
			ls = append(ls, l)
		}
		return err
	}
	if in.Op == "adafactor" {
		// Args are (p, g, row, col, step).
		s := c.shape(0)
		rows, cols := int64(s[0]), int64(s[1])
		grid := c.partialGrid(rows * cols)
		partial := parg{at: c.scratch(16 * int64(grid)), dt: ir.F32}
		if err := add(c.kernel("gc_adafactor_rowsum", ws, c.arg(2), rows)); err != nil {
			return nil, err
		}
		if err := add(c.kernelGrid("gc_adafactor_partial", grid, partial, c.arg(0), c.arg(1), c.arg(2), c.arg(3), ws, rows, cols)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("gc_adafactor_finish", ws, partial, step, int64(grid), rows*cols, eps2, clip, rel)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("gc_adafactor_apply", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), ws, rows, cols)); err != nil {
			return nil, err
		}
		return c.checkStep(len(in.Args)-1, c.runs(ls...), nil)
	}
	// Args are (p, g, v, step).
	n := numel(c.shape(0))
	grid := c.partialGrid(n)
	partial := parg{at: c.scratch(16 * int64(grid)), dt: ir.F32}
	if err := add(c.kernelGrid("gc_adafactor_vec_partial", grid, partial, c.arg(0), c.arg(1), c.arg(2), n)); err != nil {
		return nil, err
	}
	if err := add(c.kernel("gc_adafactor_finish", ws, partial, step, int64(grid), n, eps2, clip, rel)); err != nil {
		return nil, err
	}
	if err := add(c.kernel("gc_adafactor_vec_apply", c.out(), c.arg(0), c.arg(1), c.arg(2), ws, n)); err != nil {
		return nil, err
	}
	return c.checkStep(len(in.Args)-1, c.runs(ls...), nil)
}

// bitmask runs the packed ReLU mask ops on the local shapes, as
// compileBitmaskOf does on the CPU.
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
