package cpu

import (
	"errors"
	"fmt"
	"math"

	"gcompile/codegen"
	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// compile turns one instruction into a closure over arena views. Shapes,
// strides and views are resolved here, once, not on every step.
func (d *Device) compile(in lower.Instr) (func() error, error) {
	switch in.Op {
	case "send", "recv":
		return d.compileTransfer(in)
	}
	out := d.prog.Buffers[in.Out]
	dt := out.Type.DType
	switch in.Op {
	case "copy":
		src := d.raw(d.prog.Buffers[in.Args[0]])
		dst := d.raw(out)
		return func() error { copy(dst, src); return nil }, nil
	case "cast":
		return d.compileCast(in)
	}
	if d.touches16(in) {
		return d.compile16(in)
	}
	switch in.Op {
	case "relu_mask", "relu_grad_mask":
		return d.compileBitmask(in)
	case "all_reduce", "reduce_scatter", "all_gather", "shard_slice", "all_to_all":
		switch {
		case dt == ir.F32, dt == ir.I32 && (in.Op == "shard_slice" || in.Op == "all_gather"):
			return compileCollective[float32](d, in) // i32 ids move as bits
		case dt == ir.F64:
			return compileCollective[float64](d, in)
		}
	case "cross_entropy", "sum_squares", "clip_coef", "nonfinite_count":
		// Scalar results: dtype of the first argument decides the kernel.
		dt = d.prog.Buffers[in.Args[0]].Type.DType
	}
	switch dt {
	case ir.F32:
		return compileFloat[float32](d, in)
	case ir.F64:
		return compileFloat[float64](d, in)
	case ir.I32:
		// Ops that only move elements run on the bits: an i32 buffer
		// viewed as float32 is copied exactly (token ids cut into
		// microbatches, for example).
		if movesOnly[in.Op] {
			return compileFloat[float32](d, in)
		}
	}
	return nil, fmt.Errorf("the cpu backend cannot run %s on %v yet", in.Op, dt)
}

// movesOnly ops copy elements without arithmetic.
var movesOnly = map[string]bool{"slice": true, "slice_grad": true, "transpose": true, "concat": true, "broadcast": true}

func ok(f func()) func() error { return func() error { f(); return nil } }

func compileFloat[T kcpu.Float](d *Device, in lower.Instr) (func() error, error) {
	f, err := compileKernel[T](d, in)
	if err != nil || in.Scale == 0 {
		return f, err
	}
	out, scale := view[T](d, in.Out), T(in.Scale)
	return func() error {
		if err := f(); err != nil {
			return err
		}
		kcpu.Scale(out, out, scale)
		return nil
	}, nil
}

func compileKernel[T kcpu.Float](d *Device, in lower.Instr) (func() error, error) {
	if f, handled, err := compileVocabParallel[T](d, in); handled || err != nil {
		return f, err
	}
	out := view[T](d, in.Out)
	arg := func(i int) []T { return view[T](d, in.Args[i]) }
	// Shapes are the instruction's local ones: a reshape shares its
	// argument's buffer, and a sharded value is smaller than its IR type.
	shape := func(i int) []int { return []int(in.ArgTypes[i].Shape) }
	a := in.Attrs
	outShape := []int(in.OutType.Shape)
	lastDim := func(s []int) (rows, n int) {
		n = s[len(s)-1]
		return int(ir.Shape(s).NumElements()) / max(n, 1), n
	}
	switch in.Op {
	case "add", "sub", "mul", "div":
		x, y := arg(0), arg(1)
		f := map[string]func(o, a, b []T){"add": kcpu.Add[T], "sub": kcpu.Sub[T], "mul": kcpu.Mul[T], "div": kcpu.Div[T]}[in.Op]
		return ok(func() { f(out, x, y) }), nil
	case "neg", "exp", "log", "tanh", "sqrt", "gelu", "relu":
		x := arg(0)
		f := map[string]func(o, x []T){"neg": kcpu.Neg[T], "exp": kcpu.Exp[T], "log": kcpu.Log[T], "tanh": kcpu.Tanh[T], "sqrt": kcpu.Sqrt[T], "gelu": kcpu.Gelu[T], "relu": kcpu.Relu[T]}[in.Op]
		return ok(func() { f(out, x) }), nil
	case "gelu_grad", "relu_grad", "tanh_grad", "softmax_grad":
		x, dy := arg(0), arg(1)
		if in.Op == "softmax_grad" {
			rows, n := lastDim(outShape)
			return ok(func() { kcpu.SoftmaxGrad(out, x, dy, rows, n) }), nil
		}
		f := map[string]func(o, x, dy []T){"gelu_grad": kcpu.GeluGrad[T], "relu_grad": kcpu.ReluGrad[T], "tanh_grad": kcpu.TanhGrad[T]}[in.Op]
		return ok(func() { f(out, x, dy) }), nil
	case ir.FusedOp:
		// A group of elementwise ops the fuse pass merged: codegen runs
		// the same kernels over cache-sized tiles, bit for bit as unfused.
		body, err := ir.ParseFusedBody(a.Str("body"), len(in.Args))
		if err != nil {
			return nil, fmt.Errorf("fused: %w", err)
		}
		args := make([][]T, len(in.Args))
		for i := range args {
			args[i] = arg(i)
		}
		run, err := codegen.CPU(body, out, args)
		if err != nil {
			return nil, fmt.Errorf("fused: %w", err)
		}
		return ok(run), nil
	case "scale":
		x, s := arg(0), arg(1)
		return ok(func() { kcpu.Scale(out, x, s[0]) }), nil
	case "matmul":
		return compileMatMul(out, arg(0), arg(1), shape(0), shape(1), a.Bool("transA"), a.Bool("transB")), nil
	case "transpose":
		x, s, perm := arg(0), shape(0), a.Ints("perm")
		return ok(func() { kcpu.Transpose(out, x, s, perm) }), nil
	case "slice":
		x, s := arg(0), shape(0)
		dim := a.Int("dim", 0)
		// A split dim is sliced in local coordinates: the global bounds
		// fall on block boundaries, which shrink by the split factor.
		f := in.Value.Args[0].Type.Shape[dim] / s[dim]
		start, end := a.Int("start", 0)/f, a.Int("end", 0)/f
		return ok(func() { kcpu.Slice(out, x, s, dim, start, end) }), nil
	case "slice_grad":
		dy := arg(0)
		dim := a.Int("dim", 0)
		f := in.Value.Type.Shape[dim] / outShape[dim]
		start := a.Int("start", 0) / f
		end := start + shape(0)[dim]
		return ok(func() { kcpu.SliceGrad(out, dy, outShape, dim, start, end) }), nil
	case "concat":
		ins := make([][]T, len(in.Args))
		shapes := make([][]int, len(in.Args))
		for i := range in.Args {
			ins[i], shapes[i] = arg(i), shape(i)
		}
		dim := a.Int("dim", 0)
		return ok(func() { kcpu.Concat(out, ins, shapes, dim) }), nil
	case "broadcast":
		x, s := arg(0), shape(0)
		return ok(func() { kcpu.Broadcast(out, x, s, outShape) }), nil
	case "reduce_sum", "reduce_mean", "reduce_max":
		x, s, axes := arg(0), shape(0), a.Ints("axes")
		f := map[string]func(o, x []T, s, axes []int){"reduce_sum": kcpu.ReduceSum[T], "reduce_mean": kcpu.ReduceMean[T], "reduce_max": kcpu.ReduceMax[T]}[in.Op]
		return ok(func() { f(out, x, s, axes) }), nil
	case "reduce_max_grad":
		x, y, dy, s, axes := arg(0), arg(1), arg(2), shape(0), a.Ints("axes")
		return ok(func() { kcpu.ReduceMaxGrad(out, x, y, dy, s, axes) }), nil
	case "softmax":
		x := arg(0)
		rows, n := lastDim(outShape)
		return ok(func() { kcpu.Softmax(out, x, rows, n) }), nil
	case "causal_mask":
		x := arg(0)
		r := len(outShape)
		s, t := outShape[r-2], outShape[r-1]
		batch := int(ir.Shape(outShape).NumElements()) / (s * t)
		fill := T(a.Float("fill", math.Inf(-1)))
		return ok(func() { kcpu.CausalMask(out, x, batch, s, t, fill) }), nil
	case "layernorm":
		x, g, b := arg(0), arg(1), arg(2)
		rows, n := lastDim(outShape)
		eps := a.Float("eps", 0)
		return ok(func() { kcpu.LayerNorm(out, x, g, b, rows, n, eps) }), nil
	case "layernorm_grad_x":
		x, g, dy := arg(0), arg(1), arg(2)
		rows, n := lastDim(outShape)
		eps := a.Float("eps", 0)
		return ok(func() { kcpu.LayerNormGradX(out, x, g, dy, rows, n, eps) }), nil
	case "layernorm_grad_gamma":
		x, dy := arg(0), arg(1)
		rows, n := lastDim(shape(0))
		eps := a.Float("eps", 0)
		return ok(func() { kcpu.LayerNormGradGamma(out, x, dy, rows, n, eps) }), nil
	case "embedding":
		table := arg(0)
		ids, err := int32Arg(d, in, 1)
		if err != nil {
			return nil, err
		}
		vocab, dim := shape(0)[0], shape(0)[1]
		return func() error { return kcpu.Embedding(out, table, ids, vocab, dim) }, nil
	case "embedding_grad":
		ids, err := int32Arg(d, in, 0)
		if err != nil {
			return nil, err
		}
		dy := arg(1)
		vocab, dim := outShape[0], outShape[1]
		return func() error { return kcpu.EmbeddingGrad(out, dy, ids, vocab, dim) }, nil
	case "cross_entropy":
		logits := arg(0)
		labels, err := int32Arg(d, in, 1)
		if err != nil {
			return nil, err
		}
		rows, vocab := shape(0)[0], shape(0)[1]
		return func() error {
			l, err := kcpu.CrossEntropy(logits, labels, rows, vocab)
			out[0] = l
			return err
		}, nil
	case "cross_entropy_grad":
		logits, dloss := arg(0), arg(2)
		labels, err := int32Arg(d, in, 1)
		if err != nil {
			return nil, err
		}
		rows, vocab := shape(0)[0], shape(0)[1]
		return func() error { return kcpu.CrossEntropyGrad(out, logits, labels, dloss[0], rows, vocab) }, nil
	case "sum_squares":
		xs := make([][]T, len(in.Args))
		for i := range in.Args {
			xs[i] = arg(i)
		}
		return ok(func() {
			var s float64
			for _, x := range xs {
				s += kcpu.SumSquares(x)
			}
			out[0] = T(s)
		}), nil
	case "nonfinite_count":
		xs := make([][]T, len(in.Args))
		for i := range in.Args {
			xs[i] = arg(i)
		}
		return ok(func() {
			n := 0
			for _, x := range xs {
				n += kcpu.CountNonFinite(x)
			}
			out[0] = T(n)
		}), nil
	case "where_finite":
		// Args (count, new, old); out may share old's buffer (an update in place).
		c, nw, old := arg(0), arg(1), arg(2)
		return ok(func() {
			if c[0] == 0 {
				copy(out, nw)
			} else {
				copy(out, old)
			}
		}), nil
	case "clip_coef":
		ss, maxNorm := arg(0), a.Float("max_norm", 0)
		return ok(func() { out[0] = T(min(1, maxNorm/(math.Sqrt(float64(ss[0]))+1e-6))) }), nil
	case "adam_m":
		m, g, b1 := arg(0), arg(1), T(a.Float("beta1", 0))
		return ok(func() { kcpu.AdamMoment1(out, m, g, b1) }), nil
	case "adam_v":
		v, g, b2 := arg(0), arg(1), T(a.Float("beta2", 0))
		return ok(func() { kcpu.AdamMoment2(out, v, g, b2) }), nil
	case "adamw":
		p, m, v, lr := arg(0), arg(1), arg(2), arg(3)
		step := view[int64](d, in.Args[4])
		b1, b2, eps, wd := T(a.Float("beta1", 0)), T(a.Float("beta2", 0)), T(a.Float("eps", 0)), T(a.Float("wd", 0))
		return func() error {
			if step[0] < 1 {
				return fmt.Errorf("adamw: step must be ≥ 1, got %d", step[0])
			}
			kcpu.AdamW(out, p, m, v, lr[0], b1, b2, eps, wd, int(step[0]))
			return nil
		}, nil
	case "sgd_buf":
		buf, g, p := arg(0), arg(1), arg(2)
		mom, wd := T(a.Float("momentum", 0)), T(a.Float("wd", 0))
		return ok(func() { kcpu.SGDMomentum(out, buf, g, p, mom, wd) }), nil
	case "sgd":
		p, buf, lr := arg(0), arg(1), arg(2)
		return ok(func() { kcpu.SGDUpdate(out, p, buf, lr[0]) }), nil
	case "adafactor_row", "adafactor_col", "adafactor_v":
		acc, g := arg(0), arg(1)
		step := view[int64](d, in.Args[2])
		eps1, decay := a.Float("eps1", 0), a.Float("decay", 0)
		return func() error {
			if step[0] < 1 {
				return fmt.Errorf("%s: step must be ≥ 1, got %d", in.Op, step[0])
			}
			beta := kcpu.AdafactorBeta2(int(step[0]), decay)
			switch gs := shape(1); in.Op {
			case "adafactor_row":
				kcpu.AdafactorRows(out, acc, g, gs[0], gs[1], beta, eps1)
			case "adafactor_col":
				kcpu.AdafactorCols(out, acc, g, gs[0], gs[1], beta, eps1)
			default:
				kcpu.AdafactorMoment(out, acc, g, beta, eps1)
			}
			return nil
		}, nil
	case "adafactor", "adafactor_vec":
		// Args are (p, g, row, col, step) or (p, g, v, step).
		p, g, v := arg(0), arg(1), arg(2)
		var col []T
		if in.Op == "adafactor" {
			col = arg(3)
		}
		step := view[int64](d, in.Args[len(in.Args)-1])
		h := kcpu.AdafactorStep{Eps2: a.Float("eps2", 0), Clip: a.Float("clip", 0), RelStep: a.Float("rel_step", 0)}
		return func() error {
			if step[0] < 1 {
				return fmt.Errorf("%s: step must be ≥ 1, got %d", in.Op, step[0])
			}
			h.Step = int(step[0])
			if col != nil {
				kcpu.Adafactor(out, p, g, v, col, shape(0)[0], shape(0)[1], h)
			} else {
				kcpu.AdafactorVec(out, p, g, v, h)
			}
			return nil
		}, nil
	case "sm3_row", "sm3_col":
		// Args are (own accumulator, g, other accumulator).
		row, g, col := arg(0), arg(1), arg(2)
		n, m := shape(1)[0], shape(1)[1]
		if in.Op == "sm3_col" {
			row, col = col, row
			return ok(func() { kcpu.SM3Cols(out, row, col, g, n, m) }), nil
		}
		return ok(func() { kcpu.SM3Rows(out, row, col, g, n, m) }), nil
	case "sm3":
		p, g, row, col, lr := arg(0), arg(1), arg(2), arg(3), arg(4)
		n, m := shape(0)[0], shape(0)[1]
		return ok(func() { kcpu.SM3(out, p, g, row, col, n, m, float64(lr[0])) }), nil
	case "sm3_v":
		v, g := arg(0), arg(1)
		return ok(func() { kcpu.SM3Accumulate(out, v, g) }), nil
	case "sm3_vec":
		p, g, v, lr := arg(0), arg(1), arg(2), arg(3)
		return ok(func() { kcpu.SM3Vec(out, p, g, v, float64(lr[0])) }), nil
	}
	return nil, fmt.Errorf("the cpu backend has no kernel for op %s", in.Op)
}

// compileBitmask runs the packed ReLU mask ops. The float operand (x of
// relu_mask, dy of relu_grad_mask) picks the kernel; 16-bit operands were
// widened by compile16 before this is reached.
func (d *Device) compileBitmask(in lower.Instr) (func() error, error) {
	f := 0 // the float operand: x, or dy
	if in.Op == "relu_grad_mask" {
		f = 1
	}
	switch dt := d.prog.Buffers[in.Args[f]].Type.DType; dt {
	case ir.F32:
		return compileBitmaskOf[float32](d, in, f)
	case ir.F64:
		return compileBitmaskOf[float64](d, in, f)
	default:
		return nil, fmt.Errorf("the cpu backend cannot run %s on %v", in.Op, dt)
	}
}

func compileBitmaskOf[T kcpu.Float](d *Device, in lower.Instr, f int) (func() error, error) {
	// The local shapes: under a split of the last dim each device packs its
	// own elements, which the sharding rule made whole bytes.
	t := in.ArgTypes[f]
	if t.Rank() < 1 {
		return nil, fmt.Errorf("%s needs a tensor of rank ≥ 1, got %v", in.Op, t)
	}
	n := t.Shape[t.Rank()-1]
	rows := 1
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
		return nil, fmt.Errorf("%s: the local mask is %v, want u8%v for the local %v", in.Op, mask, want, t)
	}
	// The kernels panic on lengths that disagree with the shape; say so
	// here, at load, instead.
	sized := func(what string, got, want int) error {
		if got != want {
			return fmt.Errorf("%s: %s buffer holds %d elements, the local shapes need %d", in.Op, what, got, want)
		}
		return nil
	}
	m := view[uint8](d, in.Args[0])
	if in.Op == "relu_mask" {
		m = view[uint8](d, in.Out)
	}
	x := view[T](d, in.Args[f])
	if err := errors.Join(sized("mask", len(m), rows*want[len(want)-1]), sized("float", len(x), rows*n)); err != nil {
		return nil, err
	}
	if in.Op == "relu_mask" {
		return ok(func() { kcpu.ReluMask(m, x, rows, n) }), nil
	}
	out := view[T](d, in.Out)
	if err := sized("result", len(out), rows*n); err != nil {
		return nil, err
	}
	return ok(func() { kcpu.ReluGradMask(out, m, x, rows, n) }), nil
}

func int32Arg(d *Device, in lower.Instr, i int) ([]int32, error) {
	b := d.prog.Buffers[in.Args[i]]
	if b.Type.DType != ir.I32 {
		return nil, fmt.Errorf("%s: the cpu backend takes i32 ids and labels, got %v", in.Op, b.Type)
	}
	return view[int32](d, b.ID), nil
}

// compileMatMul maps the IR's matmul forms onto the batched GEMM kernel.
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

func (d *Device) compileCast(in lower.Instr) (func() error, error) {
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

// compileTransfer moves a value between pipeline ranks: to the device with
// the same data- and tensor-parallel coordinates on the peer rank. Sends
// are buffered (Comm.Send returns at once), as the schedule's deadlock
// proof assumes.
func (d *Device) compileTransfer(in lower.Instr) (func() error, error) {
	m := d.prog.Mesh
	ax := -1
	if m != nil {
		ax = m.Axis("pp")
	}
	if ax < 0 || d.comm == nil {
		return nil, fmt.Errorf("%s needs a pipeline (a pp mesh axis and a comm)", in.Op)
	}
	c := append([]int(nil), d.coords...)
	c[ax] = in.Peer
	peer, comm, rank, tag := m.Rank(c), d.comm, d.rank, in.Tag
	if in.Op == "send" {
		b := d.prog.Buffers[in.Args[0]]
		data, dt := d.raw(b), b.Type.DType
		return func() error { return comm.Send(rank, peer, tag, dt, data) }, nil
	}
	b := d.prog.Buffers[in.Out]
	data, dt := d.raw(b), b.Type.DType
	return func() error { return comm.Recv(peer, rank, tag, dt, data) }, nil
}
