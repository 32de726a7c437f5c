package cpu

import (
	"fmt"
	"unsafe"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime"
)

// axisGroup is the group of devices that differ from this one only on
// mesh axis ax, ordered by their coordinate on it.
func (d *Device) axisGroup(ax int) runtime.Group {
	return runtime.Group{Ranks: d.prog.Mesh.AxisRanks(d.coords, ax)}
}

// asBytes is x's memory as bytes, shared: what a Comm moves.
func asBytes[T any](x []T) []byte {
	if len(x) == 0 {
		return []byte{}
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(z)))
}

// pieces splits a tensor of shape s along dim into n equal blocks laid out
// one after another (what the flat collectives move), and back.
func toPieces[T any](dst, src []T, s []int, dim, n int) {
	k := s[dim] / n
	size := len(src) / n
	for j := range n {
		kcpu.Slice(dst[j*size:(j+1)*size], src, s, dim, j*k, (j+1)*k)
	}
}

func fromPieces[T any](dst, src []T, s []int, dim, n int) {
	size := len(src) / n
	ins := make([][]T, n)
	shapes := make([][]int, n)
	for j := range n {
		ins[j] = src[j*size : (j+1)*size]
		shapes[j] = append([]int(nil), s...)
		shapes[j][dim] /= n
	}
	kcpu.Concat(dst, ins, shapes, dim)
}

// blockedView is shape s with dim split into (k, s[dim]/k), and the index
// of the inner part. A tensor split S(dim)xk holds, on each device, its
// slice of every one of the k blocks: in this view that is a plain split
// of the inner dim, so the flat collectives and slicing apply unchanged.
// With k = 1 the view is s itself.
func blockedView(s []int, dim, k int) ([]int, int) {
	if k <= 1 {
		return s, dim
	}
	v := make([]int, 0, len(s)+1)
	v = append(v, s[:dim]...)
	v = append(v, k, s[dim]/k)
	v = append(v, s[dim+1:]...)
	return v, dim + 1
}

// splits reports whether part is one of n equal shares of whole along
// dim, with dim holding a whole number of blocks on every device.
func splits(whole, part []int, dim, blocks, n int) bool {
	if len(whole) != len(part) || dim < 0 || dim >= len(whole) || blocks < 1 || whole[dim]%(blocks*n) != 0 {
		return false
	}
	for d := range whole {
		if d == dim && part[d]*n != whole[d] || d != dim && part[d] != whole[d] {
			return false
		}
	}
	return true
}

// contiguous reports whether blocks along dim are contiguous in memory:
// true when every dim before it has size 1.
func contiguous(s []int, dim int) bool {
	for _, n := range s[:dim] {
		if n != 1 {
			return false
		}
	}
	return true
}

// Collectives over one mesh axis. Slicing and gathering only move
// elements, so i32 values (token ids split over data parallelism) run them
// on the bits; reductions need a float type.
func init() {
	builtin(Kernel{F32: collective[float32], F64: collective[float64]}, "all_reduce", "reduce_scatter")
	builtin(Kernel{F32: collective[float32], F64: collective[float64], Bits: true}, "all_gather", "shard_slice", "all_to_all")
}

func collective[T kcpu.Float](c *Call[T]) (func() error, error) {
	return compileCollective[T](c.d, c.Instr)
}

// compileSum16 runs a 16-bit reduction whose adds round to its format
// (the attribute round_each: the gradient reductions --grad-reduce-dtype
// makes 16-bit) on the 16-bit buffers themselves, so the Comm moves and
// sums 2 bytes an element. Other 16-bit collectives are summed in
// float32 on widened copies and rounded once (compile16). ok is false
// for any other instruction.
func (d *Device) compileSum16(in lower.Instr) (f func() error, ok bool, err error) {
	if in.Op != "all_reduce" && in.Op != "reduce_scatter" || !in.Attrs.Bool("round_each") {
		return nil, false, nil
	}
	dt := in.OutType.DType
	if !dt.Is16() || in.ArgTypes[0].DType != dt {
		return nil, true, fmt.Errorf("%s rounding each add needs a 16-bit operand and result, got %v → %v", in.Op, in.ArgTypes[0], in.OutType)
	}
	f, err = compileCollective[uint16](d, in)
	return f, true, err
}

// compileCollective turns a collective instruction into Comm calls over
// the devices of its mesh axis. The reductions of one gradient bucket are
// consecutive instructions; the first issues them all as one AllReduce.
func compileCollective[T any](d *Device, in lower.Instr) (func() error, error) {
	if d.comm == nil || d.prog.Mesh == nil {
		return nil, fmt.Errorf("%s needs a multi-device program", in.Op)
	}
	ax := d.prog.Mesh.Axis(in.Attrs.Str("axis"))
	if ax < 0 {
		return nil, fmt.Errorf("axis %q is not in mesh %v", in.Attrs.Str("axis"), d.prog.Mesh)
	}
	g := d.axisGroup(ax)
	src, out := view[T](d, in.Args[0]), view[T](d, in.Out)
	switch {
	case in.Op == "all_reduce" && in.Bucket > 0:
		return d.compileBucket(in, g)
	case in.Op == "reduce_scatter" && in.Bucket > 0 && !d.prog.Mesh.Axes[ax].Zigzag:
		if f, err := scatterBucket[T](d, in, g); f != nil || err != nil {
			return f, err
		}
	case in.Op == "all_to_all":
		if d.prog.Mesh.Axes[ax].Zigzag && g.Size() > 1 {
			return nil, fmt.Errorf("all_to_all over %s in the zigzag layout is not supported: its split sequence moves only by slices and gathers", d.prog.Mesh.Axes[ax].Name)
		}
		return allToAll(d, in, g, src, out)
	}
	f, err := collectiveOn[T](d, in, ax, g)
	if err != nil {
		return nil, err
	}
	if !d.prog.Mesh.Axes[ax].Zigzag || g.Size() == 1 || in.Op == "all_reduce" {
		return func() error { return f(src, out) }, nil
	}
	// A zigzag axis (ir.MeshAxis.Zigzag: a context-parallel axis in the
	// balanced layout): in the order the devices hold the chunks of the
	// split dim it is a plain split, so the whole operand is put in that
	// order before a slice or a reduce-scatter, and a gathered result
	// back in the natural order after.
	blocks, err := runtime.CollectiveBlocks(d.prog.Mesh, in)
	if err != nil {
		return nil, err
	}
	z := runtime.ZigzagSplit{Dim: in.Attrs.Int("dim", 0), Blocks: blocks, N: g.Size()}
	whole := []int(in.ArgTypes[0].Shape)
	if in.Op == "all_gather" {
		whole = in.OutType.Shape
	}
	if whole[z.Dim]%(2*z.N*z.Blocks) != 0 {
		return nil, fmt.Errorf("%s over %s (zigzag, %d devices): dim %d of %v does not cut into 2·%d chunks a block", in.Op, d.prog.Mesh.Axes[ax].Name, z.N, z.Dim, whole, z.N)
	}
	held := make([]T, int(ir.Shape(whole).NumElements()))
	if in.Op == "all_gather" {
		return func() error {
			if err := f(src, held); err != nil {
				return err
			}
			runtime.Zigzag(out, held, whole, z, false)
			return nil
		}, nil
	}
	return func() error {
		runtime.Zigzag(held, src, whole, z, true)
		return f(held, out)
	}, nil
}

// collectiveOn is a collective instruction (not a bucket, not an
// all_to_all) as a function of its source and result.
func collectiveOn[T any](d *Device, in lower.Instr, ax int, g runtime.Group) (func(src, out []T) error, error) {
	n := g.Size()
	// Fused blocks: work on the view where the split dim is the inner
	// part of (blocks, size/blocks), in which every device's part is one
	// plain slice.
	dim := in.Attrs.Int("dim", 0)
	blocks, err := runtime.CollectiveBlocks(d.prog.Mesh, in)
	if err != nil {
		return nil, err
	}
	inShape, outShape := []int(in.ArgTypes[0].Shape), []int(in.OutType.Shape)
	switch in.Op {
	case "reduce_scatter", "all_gather", "shard_slice":
		whole, part := inShape, outShape
		if in.Op == "all_gather" {
			whole, part = outShape, inShape
		}
		if !splits(whole, part, dim, blocks, n) {
			return nil, fmt.Errorf("%s on dim %d in %d blocks over %d devices: %v and %v have no such split", in.Op, dim, blocks, n, in.ArgTypes[0], in.OutType)
		}
		split := dim
		inShape, dim = blockedView(inShape, split, blocks)
		outShape, _ = blockedView(outShape, split, blocks)
	}
	comm, rank, dt := d.comm, d.rank, d.prog.Buffers[in.Out].Type.DType
	switch in.Op {
	case "all_reduce":
		return func(src, out []T) error {
			copy(out, src)
			return comm.AllReduce(g, rank, dt, asBytes(out))
		}, nil
	case "reduce_scatter":
		if contiguous(inShape, dim) {
			return func(src, out []T) error { return comm.ReduceScatter(g, rank, dt, asBytes(src), asBytes(out)) }, nil
		}
		tmp := make([]T, int(ir.Shape(inShape).NumElements()))
		return func(src, out []T) error {
			toPieces(tmp, src, inShape, dim, n)
			return comm.ReduceScatter(g, rank, dt, asBytes(tmp), asBytes(out))
		}, nil
	case "all_gather":
		if contiguous(outShape, dim) {
			return func(src, out []T) error { return comm.AllGather(g, rank, dt, asBytes(src), asBytes(out)) }, nil
		}
		tmp := make([]T, int(ir.Shape(outShape).NumElements()))
		return func(src, out []T) error {
			if err := comm.AllGather(g, rank, dt, asBytes(src), asBytes(tmp)); err != nil {
				return err
			}
			fromPieces(out, tmp, outShape, dim, n)
			return nil
		}, nil
	case "shard_slice":
		k := outShape[dim]
		at := d.coords[ax] * k
		return func(src, out []T) error {
			kcpu.Slice(out, src, inShape, dim, at, at+k)
			return nil
		}, nil
	}
	return nil, fmt.Errorf("the cpu backend has no %s yet", in.Op)
}

// compileBucket: the first all_reduce of a bucket reduces every member's
// buffer in one call; the others have nothing left to do.
func (d *Device) compileBucket(in lower.Instr, g runtime.Group) (func() error, error) {
	members, leads := d.prog.BucketRun(d.indexOf(in))
	if !leads {
		return func() error { return nil }, nil
	}
	switch dt := in.OutType.DType; dt {
	case ir.F32:
		return bucketAllReduce[float32](d, members, g), nil
	case ir.F64:
		return bucketAllReduce[float64](d, members, g), nil
	case ir.BF16, ir.F16:
		for _, m := range members {
			if m.OutType.DType != dt || !m.Attrs.Bool("round_each") {
				return nil, fmt.Errorf("bucket %d sums %v with %v %s: one call sums one dtype, rounded alike", in.Bucket-1, in.OutType, m.OutType, m.Op)
			}
		}
		return bucketAllReduce[uint16](d, members, g), nil
	}
	return nil, fmt.Errorf("all_reduce of %v", in.OutType)
}

// indexOf is in's position in the program, from an index built once.
func (d *Device) indexOf(in lower.Instr) int {
	if d.instrAt == nil {
		d.instrAt = make(map[*ir.Value]int, len(d.prog.Instrs))
		for i, x := range d.prog.Instrs {
			if _, seen := d.instrAt[x.Value]; !seen {
				d.instrAt[x.Value] = i
			}
		}
	}
	return d.instrAt[in.Value]
}

func bucketAllReduce[T any](d *Device, members []lower.Instr, g runtime.Group) func() error {
	srcs := make([][]T, len(members))
	outs := make([][]T, len(members))
	raw := make([][]byte, len(members))
	for k, m := range members {
		srcs[k], outs[k] = view[T](d, m.Args[0]), view[T](d, m.Out)
		raw[k] = asBytes(outs[k])
	}
	dt := d.prog.Buffers[members[0].Out].Type.DType
	return func() error {
		for k := range outs {
			copy(outs[k], srcs[k])
		}
		return d.comm.AllReduce(g, d.rank, dt, raw...)
	}
}

// scatterBucket: the first reduce_scatter of a gradient bucket (ZeRO's)
// reduce-scatters every member's gradient in one call; the others have
// nothing left to do. Device q's chunk of the call is the members'
// q-th pieces one after another, cut into the device's staging buffer,
// so the call leaves each device its members' shards one after another,
// which are copied out. One call a bucket rather than one a gradient: a
// call's cost on this backend is mostly its meeting of the devices, not
// its bytes. A bucket of one gradient (one larger than the bucket size,
// as a rule) needs no staging: it is nil here, and runs as any
// reduce_scatter.
func scatterBucket[T any](d *Device, in lower.Instr, g runtime.Group) (func() error, error) {
	run, leads := d.prog.BucketRun(d.indexOf(in))
	switch {
	case !leads:
		return func() error { return nil }, nil
	case len(run) == 1:
		return nil, nil
	}
	n := g.Size()
	dt := d.prog.Buffers[in.Out].Type.DType
	type member struct {
		src, out []T
		shape    []int
		dim      int
	}
	var members []member
	var chunk int // elements of one device's chunk: its shard of every member
	for _, m := range run {
		if got := d.prog.Buffers[m.Out].Type.DType; got != dt {
			return nil, fmt.Errorf("bucket %d reduce-scatters %v and %v: one call sums one dtype", in.Bucket-1, dt, got)
		}
		dim := m.Attrs.Int("dim", 0)
		blocks, err := runtime.CollectiveBlocks(d.prog.Mesh, m)
		if err != nil {
			return nil, err
		}
		whole, part := []int(m.ArgTypes[0].Shape), []int(m.OutType.Shape)
		if !splits(whole, part, dim, blocks, n) {
			return nil, fmt.Errorf("reduce_scatter on dim %d in %d blocks over %d devices: %v and %v have no such split", dim, blocks, n, m.ArgTypes[0], m.OutType)
		}
		e := member{src: view[T](d, m.Args[0]), out: view[T](d, m.Out)}
		e.shape, e.dim = blockedView(whole, dim, blocks)
		members = append(members, e)
		chunk += len(e.out)
	}
	send, recv := scatterStaging[T](d)
	send, recv = send[:n*chunk], recv[:chunk]
	rawSend, rawRecv := asBytes(send), asBytes(recv)
	return func() error {
		at := 0
		for _, e := range members {
			k, rows := len(e.out), e.shape[e.dim]/n
			for q := range n {
				piece := send[q*chunk+at : q*chunk+at+k]
				if contiguous(e.shape, e.dim) {
					copy(piece, e.src[q*k:(q+1)*k])
				} else {
					kcpu.Slice(piece, e.src, e.shape, e.dim, q*rows, (q+1)*rows)
				}
			}
			at += k
		}
		if err := d.comm.ReduceScatter(g, d.rank, dt, rawSend, rawRecv); err != nil {
			return err
		}
		at = 0
		for _, e := range members {
			at += copy(e.out, recv[at:at+len(e.out)])
		}
		return nil
	}, nil
}

// scatterStaging is the device's staging for its buckets of
// reduce-scatters of several gradients: as large as the largest such
// bucket's gradients (send) and shards (recv), so at most --bucket-mb
// and its share, and shared by every bucket (a device runs one
// instruction at a time).
func scatterStaging[T any](d *Device) (send, recv []T) {
	if s, ok := d.scatterStage.(*[2][]T); ok {
		return s[0], s[1]
	}
	whole, shard := d.prog.LargestScatterBucket()
	s := &[2][]T{make([]T, whole), make([]T, shard)}
	d.scatterStage = s
	return s[0], s[1]
}

// allToAll re-splits a value from dim from to dim to (S(from) → S(to)):
// the local tensor is cut along to into one piece per device, piece q
// goes to device q, and the pieces received are put together along from
// in the order of the devices that sent them.
func allToAll[T any](d *Device, in lower.Instr, g runtime.Group, src, out []T) (func() error, error) {
	n := g.Size()
	from, to := in.Attrs.Int("from", 0), in.Attrs.Int("to", 0)
	inShape, outShape := []int(in.ArgTypes[0].Shape), []int(in.OutType.Shape)
	if !resplits(inShape, outShape, from, to, n) {
		return nil, fmt.Errorf("all_to_all from dim %d to dim %d over %d devices: %v and %v have no such split", from, to, n, in.ArgTypes[0], in.OutType)
	}
	send, recv := make([]T, len(src)), make([]T, len(out))
	rawSend, rawRecv := asBytes(send), asBytes(recv)
	comm, rank, dt := d.comm, d.rank, d.prog.Buffers[in.Out].Type.DType
	return func() error {
		toPieces(send, src, inShape, to, n)
		if err := comm.AllToAll(g, rank, dt, rawSend, rawRecv); err != nil {
			return err
		}
		fromPieces(out, recv, outShape, from, n)
		return nil
	}, nil
}

// resplits reports whether in, split n ways on dim from, and out, split n
// ways on dim to, are local shapes of one tensor.
func resplits(in, out []int, from, to, n int) bool {
	r := len(in)
	if len(out) != r || from == to || from < 0 || from >= r || to < 0 || to >= r || n < 1 {
		return false
	}
	for d := range in {
		switch d {
		case from:
			if out[d] != in[d]*n {
				return false
			}
		case to:
			if in[d] != out[d]*n {
				return false
			}
		default:
			if in[d] != out[d] {
				return false
			}
		}
	}
	return true
}
