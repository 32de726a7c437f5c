package cuda

import (
	"fmt"
	"slices"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cuda/driver"
)

// Collectives check their own dtypes (i32 ids move as bits where only
// bytes move) and apply no Scale: lowering sets one only on the ops that
// take a mean (reduce_mean, cross-entropy).
func init() {
	register(roundingEach(emulated((*compiler).collective)), "all_reduce", "reduce_scatter", "all_gather", "shard_slice", "all_to_all")
}

// roundingEach runs a 16-bit reduction that rounds each add (the
// attribute round_each: the gradient reductions --grad-reduce-dtype
// narrows) on its 16-bit buffers themselves, as the CPU backend's
// compileSum16 does, so the collective moves and sums 2 bytes an
// element; every other instruction goes to f.
func roundingEach(f prepare) prepare {
	return func(c *compiler) (func() error, error) {
		if !c.in.Attrs.Bool("round_each") {
			return f(c)
		}
		in := c.in
		dt := c.dtype(in.Out)
		if in.Op != "all_reduce" && in.Op != "reduce_scatter" || !dt.Is16() || c.dtype(in.Args[0]) != dt {
			return nil, fmt.Errorf("%s rounding each add needs a 16-bit operand and result, got %v → %v", in.Op, in.ArgTypes[0], in.OutType)
		}
		return c.collective()
	}
}

// axisGroup is the group of devices that differ from this one only on
// mesh axis ax, ordered by their coordinate on it.
func (d *Device) axisGroup(ax int) group { return meshGroup(d.prog.Mesh, d.coords, d.rank, ax) }

// meshGroup is the group along mesh axis ax through the device at coords
// (rank rank). The NCCL communicators are made from it too, so their keys
// are the ones the devices' collectives look up.
func meshGroup(m *ir.Mesh, coords []int, rank, ax int) group {
	return newGroup(m.AxisRanks(coords, ax), rank)
}

// blockedView is shape s with dim split into (k, s[dim]/k), and the index
// of the inner part: a tensor split S(dim)xk holds on each device its
// slice of every one of the k blocks, which in this view is a plain split
// of the inner dim. With k = 1 the view is s itself.
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

// pieces plans the launches that cut a tensor of shape s along dim into n
// equal blocks laid out one after another (what the flat collectives
// move), or, with join, put such blocks back together.
func (c *compiler) pieces(whole, flat parg, s []int, dim, n int, join bool) ([]*launch, error) {
	return c.piecesEvery(whole, flat, s, dim, n, numel(s)/int64(n), join)
}

// piecesEvery is pieces with block j at element j·stride of flat: a
// gradient bucket's reduce-scatter lays each member's blocks among the
// other members'.
func (c *compiler) piecesEvery(whole, flat parg, s []int, dim, n int, stride int64, join bool) ([]*launch, error) {
	outer, total, inner, err := kcuda.SliceGeometry(s, dim)
	if err != nil {
		return nil, err
	}
	k := total / int64(n)
	var ls []*launch
	for j := range int64(n) {
		piece := flat
		piece.at = piece.at.add(4 * j * stride)
		var l *launch
		if join {
			l, err = c.kernel("gc_concat_piece", whole, piece, outer, total, inner, j*k, k)
		} else {
			l, err = c.kernel("gc_slice", piece, whole, outer, total, inner, j*k, k)
		}
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// contiguous reports whether blocks along dim are contiguous in memory:
// every dim before it has size 1.
func contiguous(s []int, dim int) bool {
	for _, n := range s[:dim] {
		if n != 1 {
			return false
		}
	}
	return true
}

// collective compiles a collective over the devices of its mesh axis, as
// the CPU backend's compileCollective does: the same groups, the same
// blocked views and piece layouts, reductions in group-position order.
func (c *compiler) collective() (func() error, error) {
	in, d := c.in, c.d
	if d.comm == nil || d.prog.Mesh == nil {
		return nil, fmt.Errorf("%s needs a multi-device program", in.Op)
	}
	ax := d.prog.Mesh.Axis(in.Attrs.Str("axis"))
	if ax < 0 {
		return nil, fmt.Errorf("axis %q is not in mesh %v", in.Attrs.Str("axis"), d.prog.Mesh)
	}
	g := d.axisGroup(ax)
	if a := d.prog.Mesh.Axes[ax]; a.Zigzag && a.Size > 1 && in.Op != "all_reduce" {
		if in.Attrs.Bool("round_each") {
			return nil, fmt.Errorf("a 16-bit %s over %s in the zigzag layout is not supported by the cuda backend", in.Op, a.Name)
		}
		return c.zigzagCollective(a, g)
	}
	return c.collectiveOver(ax, g, c.arg(0), c.out())
}

// collectiveOver compiles the collective over group g of axis ax from src
// into out (the instruction's operands, or their copies in the held order
// of a zigzag axis).
func (c *compiler) collectiveOver(ax int, g group, src, out parg) (func() error, error) {
	in, d := c.in, c.d
	n := g.size()
	dt := c.dtype(in.Out)
	sumDT, es := ir.F32, int64(4) // what a reduction sums, and its size
	switch {
	case dt == ir.F32:
	case dt == ir.I32 && (in.Op == "shard_slice" || in.Op == "all_gather"):
		// i32 ids move as bits.
	case dt.Is16() && in.Attrs.Bool("round_each"):
		sumDT, es = dt, 2
	default:
		return nil, fmt.Errorf("the cuda backend cannot run %s on %v", in.Op, dt)
	}
	if sumDT == ir.F32 {
		src, out = bits(src), bits(out)
	}
	dim := in.Attrs.Int("dim", 0)
	blocks, err := runtime.CollectiveBlocks(d.prog.Mesh, in)
	if err != nil {
		return nil, err
	}
	inShape, outShape := c.shape(0), c.outShape()
	switch in.Op {
	case "reduce_scatter", "all_gather", "shard_slice":
		whole := inShape
		if in.Op == "all_gather" {
			whole = outShape
		}
		if dim < 0 || dim >= len(whole) || blocks < 1 || whole[dim]%(blocks*n) != 0 {
			return nil, fmt.Errorf("%s on dim %d in %d blocks over %d devices: %v has no such split", in.Op, dim, blocks, n, in.ArgTypes[0])
		}
		inShape, dim = blockedView(inShape, in.Attrs.Int("dim", 0), blocks)
		outShape, _ = blockedView(outShape, in.Attrs.Int("dim", 0), blocks)
	}
	if in.Op == "shard_slice" {
		// Local: this device keeps its block; nothing crosses devices.
		k := outShape[dim]
		start := int64(d.coords[ax] * k)
		outer, total, inner, err := kcuda.SliceGeometry(inShape, dim)
		if err != nil {
			return nil, err
		}
		return c.one("gc_slice", out, src, outer, total, inner, start, int64(k))
	}
	s, err := d.comm.site(d)
	if err != nil {
		return nil, err
	}
	cm := d.comm
	c.note(fmt.Sprintf("%s over devices %v", in.Op, g.ranks))
	switch in.Op {
	case "all_reduce":
		if in.Bucket > 0 {
			return c.bucket(g, s, ax)
		}
		count := numel(outShape)
		tmp := c.scratch(es * count)
		return func() error {
			if err := d.rt.drv.MemcpyDtoDAsync(d.ptr(out.at), d.ptr(src.at), uint64(es*count), d.compute); err != nil {
				return err
			}
			return cm.allReduceOn(d, g, s, d.compute, sumDT, []driver.DevicePtr{d.ptr(out.at)}, []int64{count}, d.ptr(tmp))
		}, nil
	case "reduce_scatter":
		if in.Bucket > 0 && sumDT == ir.F32 {
			// A 16-bit bucket's members reduce one by one, below.
			if f, err := c.scatterBucket(g, s, ax); f != nil || err != nil {
				return f, err
			}
		}
		count := numel(outShape)
		if contiguous(inShape, dim) {
			return func() error { return cm.reduceScatter(d, g, s, d.compute, sumDT, d.ptr(src.at), d.ptr(out.at), count) }, nil
		}
		cutFrom, steps := src, []func() error{}
		if sumDT != ir.F32 {
			// The cuts are fp32 kernels: they move a widened copy, which
			// narrows back exactly.
			wide := parg{at: c.scratch(4 * numel(inShape)), dt: ir.F32}
			l, err := c.kernel(widenKernel(sumDT), wide, src, numel(inShape))
			if err != nil {
				return nil, err
			}
			cutFrom, steps = wide, append(steps, c.runs(l))
		}
		tmp := parg{at: c.scratch(4 * numel(inShape)), dt: ir.F32}
		cut, err := c.pieces(cutFrom, tmp, inShape, dim, n, false)
		if err != nil {
			return nil, err
		}
		steps = append(steps, c.runs(cut...))
		send := tmp
		if sumDT != ir.F32 {
			send = parg{at: c.scratch(2 * numel(inShape)), dt: sumDT}
			l, err := c.kernel(narrowKernel(sumDT), send, tmp, numel(inShape))
			if err != nil {
				return nil, err
			}
			steps = append(steps, c.runs(l))
		}
		return seq(append(steps, func() error { return cm.reduceScatter(d, g, s, d.compute, sumDT, d.ptr(send.at), d.ptr(out.at), count) })...), nil
	case "all_gather":
		bytes := 4 * numel(inShape)
		if contiguous(outShape, dim) {
			return func() error { return cm.allGather(d, g, s, d.ptr(src.at), d.ptr(out.at), bytes) }, nil
		}
		tmp := bits(parg{at: c.scratch(4 * numel(outShape)), dt: dt})
		join, err := c.pieces(out, tmp, outShape, dim, n, true)
		if err != nil {
			return nil, err
		}
		return seq(func() error { return cm.allGather(d, g, s, d.ptr(src.at), d.ptr(tmp.at), bytes) }, c.runs(join...)), nil
	case "all_to_all":
		// S(from) → S(to): cut the local tensor along to into one piece
		// per device, exchange piece q with device q, and put the pieces
		// received together along from.
		from, to := in.Attrs.Int("from", 0), in.Attrs.Int("to", 0)
		if from < 0 || from >= len(outShape) || to < 0 || to >= len(inShape) || inShape[to]%n != 0 {
			return nil, fmt.Errorf("all_to_all from dim %d to dim %d over %d devices: %v has no such split", from, to, n, in.ArgTypes[0])
		}
		size := 4 * numel(inShape)
		sendBuf := parg{at: c.scratch(size), dt: ir.F32}
		recvBuf := parg{at: c.scratch(size), dt: ir.F32}
		cut, err := c.pieces(src, sendBuf, inShape, to, n, false)
		if err != nil {
			return nil, err
		}
		join, err := c.pieces(out, recvBuf, outShape, from, n, true)
		if err != nil {
			return nil, err
		}
		chunk := size / int64(n)
		return seq(c.runs(cut...), func() error { return cm.allToAll(d, g, s, d.ptr(sendBuf.at), d.ptr(recvBuf.at), chunk) }, c.runs(join...)), nil
	}
	return nil, fmt.Errorf("the cuda backend has no %s", in.Op)
}

// zigzagCollective compiles a slice, gather or reduce-scatter over a
// zigzag axis (ir.MeshAxis.Zigzag, context parallelism's balanced ring),
// as the CPU backend does: in the order the devices hold the split dim's
// 2·n chunks it is a plain split, so the whole operand is put in that
// order before a slice or a reduce-scatter, and a gathered result back
// in the natural order after.
func (c *compiler) zigzagCollective(a ir.MeshAxis, g group) (func() error, error) {
	in := c.in
	ax := c.d.prog.Mesh.Axis(a.Name)
	if in.Op == "all_to_all" {
		return nil, fmt.Errorf("all_to_all over %s in the zigzag layout is not supported: its split sequence moves only by slices and gathers", a.Name)
	}
	whole := c.shape(0)
	if in.Op == "all_gather" {
		whole = c.outShape()
	}
	dim, n := in.Attrs.Int("dim", 0), g.size()
	blocks, err := runtime.CollectiveBlocks(c.d.prog.Mesh, in)
	if err != nil {
		return nil, err
	}
	if dim < 0 || dim >= len(whole) || blocks < 1 || whole[dim]%(2*n*blocks) != 0 {
		return nil, fmt.Errorf("%s over %s (zigzag, %d devices): dim %d of %v does not cut into 2·%d chunks a block", in.Op, a.Name, n, dim, whole, n)
	}
	view, vdim := blockedView(whole, dim, blocks)
	dt := c.dtype(in.Out)
	size := dt.Size() * numel(whole)
	held := bits(parg{at: c.scratch(size), dt: dt})
	tmp := bits(parg{at: c.scratch(size), dt: dt})
	if in.Op == "all_gather" {
		f, err := c.collectiveOver(ax, g, c.arg(0), held)
		if err != nil {
			return nil, err
		}
		back, err := c.zigzagReorder(bits(c.out()), held, tmp, view, vdim, n, false)
		if err != nil {
			return nil, err
		}
		return seq(f, c.runs(back...)), nil
	}
	to, err := c.zigzagReorder(held, bits(c.arg(0)), tmp, view, vdim, n, true)
	if err != nil {
		return nil, err
	}
	f, err := c.collectiveOver(ax, g, held, c.out())
	if err != nil {
		return nil, err
	}
	return seq(c.runs(to...), f), nil
}

// zigzagReorder plans the copies that put src (shape s) into dst with
// dim's 2·n chunks moved from the natural order into the held one
// (toHeld: held chunk k is natural chunk ir.ZigzagChunk(k, n)) or back,
// through tmp, which holds the chunks one after another.
func (c *compiler) zigzagReorder(dst, src, tmp parg, s []int, dim, n int, toHeld bool) ([]*launch, error) {
	outer, total, inner, err := kcuda.SliceGeometry(s, dim)
	if err != nil {
		return nil, err
	}
	k := total / int64(2*n)
	size := tmp.dt.Size() * numel(s) / int64(2*n)
	var cut, join []*launch
	for j := range 2 * n {
		from, to := int64(j)*k, int64(ir.ZigzagChunk(j, n))*k
		if toHeld {
			from, to = to, from
		}
		piece := tmp
		piece.at = piece.at.add(int64(j) * size)
		l, err := c.kernel("gc_slice", piece, src, outer, total, inner, from, k)
		if err != nil {
			return nil, err
		}
		cut = append(cut, l)
		if l, err = c.kernel("gc_concat_piece", dst, piece, outer, total, inner, to, k); err != nil {
			return nil, err
		}
		join = append(join, l)
	}
	return append(cut, join...), nil
}

// bucketPlan is one gradient bucket as the device runs it: the
// instruction that reduces it (the bucket's first all_reduce), how many
// all_reduces it stands for, their results, the mesh axis, and the two
// events that order the comm stream after the gradients and the compute
// stream after the sums. wait is the instruction before which the compute
// stream waits for the sums (-1: the end of the step).
type bucketPlan struct {
	leader, members int
	outs            []int
	axis            string
	ready, done     driver.Event
	wait            int
}

// bucket: the first all_reduce of a gradient bucket reduces every
// member's buffer in one collective; the others have nothing left to do.
//
// The reduction runs on the device's comm stream, so that it overlaps the
// rest of the backward: on the compute stream each gradient is copied
// into its result buffer and an event is recorded; the comm stream waits
// for it and reduces the results in place, then records done, which the
// compute stream waits for before the first instruction that touches a
// result or uses the axis's collectives again (planBucketWaits). The
// copies stay on the compute stream because the gradients die at the
// bucket: the memory plan hands their bytes to the next temporaries at
// once, while the results stay live, and no other buffer may share their
// bytes, until the optimizer reads them. So nothing the comm stream
// touches is reused before the wait, and the memory plan needs no longer
// lifetimes. A program with SerialBuckets (--overlap-grad-reduce=false)
// reduces each bucket on the compute stream where it stands instead.
func (c *compiler) bucket(g group, s *site, ax int) (func() error, error) {
	d, i := c.d, c.index
	members, leads := d.prog.BucketRun(i)
	if !leads {
		return func() error { return nil }, nil
	}
	srcs := make([]loc, len(members))
	outs := make([]loc, len(members))
	counts := make([]int64, len(members))
	for _, m := range members[1:] {
		// The leader's closure reads and writes the later members'
		// buffers: a pending copy into any of them is waited for here.
		d.touches[i] = append(d.touches[i], m.Args[0], m.Out)
	}
	// A bucket sums fp32, or one 16-bit format rounding each add
	// (--grad-reduce-dtype), as its members all do.
	dt := c.dtype(members[0].Out)
	es, _ := elemSum(dt)
	for k, m := range members {
		if c.dtype(m.Out) != dt || c.dtype(m.Args[0]) != dt || dt != ir.F32 && !(dt.Is16() && m.Attrs.Bool("round_each")) {
			return nil, fmt.Errorf("bucketed all_reduce of %v → %v: the cuda backend reduces buckets of fp32, or of one 16-bit format rounding each add", c.buf(m.Args[0]).Type, c.buf(m.Out).Type)
		}
		srcs[k], outs[k] = at(c.buf(m.Args[0])), at(c.buf(m.Out))
		counts[k] = m.OutType.Shape.NumElements()
	}
	cm := d.comm
	var tmp loc
	if cm.stagesSums() {
		tmp = d.bucketScratch()
	}
	// copyIn copies each member's gradient into its result on the
	// compute stream (see below).
	copyIn := func() ([]driver.DevicePtr, error) {
		bufs := make([]driver.DevicePtr, len(outs))
		for k := range srcs {
			bufs[k] = d.ptr(outs[k])
			if err := d.rt.drv.MemcpyDtoDAsync(bufs[k], d.ptr(srcs[k]), uint64(es*counts[k]), d.compute); err != nil {
				return nil, err
			}
		}
		return bufs, nil
	}
	if d.prog.SerialBuckets {
		// --overlap-grad-reduce=false: the sum runs where it stands in
		// the program, on the compute stream, like any collective.
		c.note(fmt.Sprintf("bucket of %d all_reduces on the compute stream", len(members)))
		return func() error {
			bufs, err := copyIn()
			if err != nil {
				return err
			}
			return cm.allReduceOn(d, g, s, d.compute, dt, bufs, counts, d.ptr(tmp))
		}, nil
	}
	plan, comms, err := d.commBucket(i, members, ax)
	if err != nil {
		return nil, err
	}
	c.note(fmt.Sprintf("bucket of %d all_reduces on the comm stream", len(members)))
	// The members' buffers share bytes where one's result starts after
	// another's input dies, as the memory plan has it for one at a time:
	// each input is copied into its result in order before any sum is
	// made, as the CPU backend does, and the sums are made in place.
	return func() error {
		drv := d.rt.drv
		bufs, err := copyIn()
		if err != nil {
			return err
		}
		if err := drv.EventRecord(plan.ready, d.compute); err != nil {
			return err
		}
		if err := drv.StreamWaitEvent(comms, plan.ready); err != nil {
			return err
		}
		if err := cm.allReduceOn(d, g, s, comms, dt, bufs, counts, d.ptr(tmp)); err != nil {
			return err
		}
		return drv.EventRecord(plan.done, comms)
	}, nil
}

// scatterBucket: the first reduce_scatter of a gradient bucket (ZeRO's)
// reduce-scatters every member's gradient in one collective; the others
// have nothing left to do. Device q's chunk of the collective is the
// members' q-th blocks one after another, cut into a staging buffer, so
// the collective leaves each device its shards one after another, which
// are copied into the members' results.
//
// As a bucket of all-reduces does, it runs on the comm stream, which
// waits for the cuts and the compute stream for the results where they
// are first needed (planBucketWaits). The cuts stay on the compute
// stream, where the gradients die at the bucket, and the comm stream
// reads only the staging buffer: two of them, taken in turn, and the
// cuts into one wait for the bucket before last, which read it, to be
// done. A program with SerialBuckets runs it all on the compute stream.
// A bucket of one gradient (one larger than the bucket size, as a rule,
// which would size the staging buffers past --bucket-mb) is nil here and
// runs as any reduce_scatter, on the compute stream.
func (c *compiler) scatterBucket(g group, s *site, ax int) (func() error, error) {
	d, i := c.d, c.index
	members, leads := d.prog.BucketRun(i)
	switch {
	case !leads:
		return func() error { return nil }, nil
	case len(members) == 1:
		return nil, nil
	}
	n := g.size()
	var chunk int64 // elements of one device's chunk: its shard of every member
	for _, m := range members {
		if c.dtype(m.Out) != ir.F32 || c.dtype(m.Args[0]) != ir.F32 {
			return nil, fmt.Errorf("bucketed reduce_scatter of %v: the cuda backend reduces fp32 buckets", c.buf(m.Out).Type)
		}
		chunk += m.OutType.Shape.NumElements()
	}
	for _, m := range members[1:] {
		// The leader's closure reads and writes the later members'
		// buffers: a pending copy into any of them is waited for here.
		d.touches[i] = append(d.touches[i], m.Args[0], m.Out)
	}
	// Each bucket on the comm stream takes the staging buffer the one
	// before it did not (in order on the compute stream, they share).
	send, recv := d.scatterStaging(len(d.scatterPlans) % 2)
	var cuts []*launch
	var off int64
	for _, m := range members {
		dim := m.Attrs.Int("dim", 0)
		blocks, err := runtime.CollectiveBlocks(d.prog.Mesh, m)
		if err != nil {
			return nil, err
		}
		whole := []int(m.ArgTypes[0].Shape)
		if dim < 0 || dim >= len(whole) || blocks < 1 || whole[dim]%(blocks*n) != 0 {
			return nil, fmt.Errorf("reduce_scatter on dim %d in %d blocks over %d devices: %v has no such split", dim, blocks, n, m.ArgTypes[0])
		}
		view, vdim := blockedView(whole, dim, blocks)
		flat := parg{at: send.add(4 * off), dt: ir.F32}
		ls, err := c.piecesEvery(c.ptr(m.Args[0]), flat, view, vdim, n, chunk, false)
		if err != nil {
			return nil, err
		}
		cuts = append(cuts, ls...)
		off += m.OutType.Shape.NumElements()
	}
	cut := c.runs(cuts...)
	cm, drv := d.comm, d.rt.drv
	// reduce runs the collective on stream st and copies each member's
	// shard into its result there.
	reduce := func(st driver.Stream) error {
		if err := cm.reduceScatter(d, g, s, st, ir.F32, d.ptr(send), d.ptr(recv), chunk); err != nil {
			return err
		}
		var off int64
		for _, m := range members {
			count := m.OutType.Shape.NumElements()
			if err := drv.MemcpyDtoDAsync(d.ptr(at(c.buf(m.Out))), d.ptr(recv.add(4*off)), uint64(4*count), st); err != nil {
				return err
			}
			off += count
		}
		return nil
	}
	if d.prog.SerialBuckets {
		c.note(fmt.Sprintf("bucket of %d reduce_scatters on the compute stream", len(members)))
		return seq(cut, func() error { return reduce(d.compute) }), nil
	}
	plan, comms, err := d.commBucket(i, members, ax)
	if err != nil {
		return nil, err
	}
	var before *bucketPlan // the bucket before last, which read the same staging
	if len(d.scatterPlans) >= 2 {
		before = d.scatterPlans[len(d.scatterPlans)-2]
	}
	d.scatterPlans = append(d.scatterPlans, plan)
	c.note(fmt.Sprintf("bucket of %d reduce_scatters on the comm stream", len(members)))
	return func() error {
		if before != nil {
			if err := drv.StreamWaitEvent(d.compute, before.done); err != nil {
				return err
			}
		}
		if err := cut(); err != nil {
			return err
		}
		if err := drv.EventRecord(plan.ready, d.compute); err != nil {
			return err
		}
		if err := drv.StreamWaitEvent(comms, plan.ready); err != nil {
			return err
		}
		if err := reduce(comms); err != nil {
			return err
		}
		return drv.EventRecord(plan.done, comms)
	}, nil
}

// scatterStaging is staging buffer k (0 or 1) of the gradient buckets'
// reduce-scatters of several gradients: where the cuts are laid out (the
// largest such bucket's gradients, whole: at most --bucket-mb) and where
// the shards land (its shards), outside the per-instruction scratch,
// which later instructions reuse while the comm stream reads these.
func (d *Device) scatterStaging(k int) (send, recv loc) {
	if d.scatterTmp == nil {
		whole, shard := d.prog.LargestScatterBucket()
		var l [2][2]loc
		for j := range l {
			l[j] = [2]loc{{inKeep, d.keep.take(4 * whole)}, {inKeep, d.keep.take(4 * shard)}}
		}
		d.scatterTmp = &l
	}
	return d.scatterTmp[k][0], d.scatterTmp[k][1]
}

// bucketScratch is the workspace the fabric reduces a bucket into: one
// region, as large as the largest bucket of the program, outside the
// per-instruction scratch (later instructions reuse that while the
// reduction runs). The comm stream runs the buckets one after another, so
// they share it.
func (d *Device) bucketScratch() loc {
	if d.bucketTmp == nil {
		sizes := map[int]int64{}
		for _, in := range d.prog.Instrs {
			if in.Op == "all_reduce" && in.Bucket > 0 {
				es, _ := elemSum(in.OutType.DType)
				sizes[in.Bucket] += es * in.OutType.Shape.NumElements()
			}
		}
		var most int64
		for _, n := range sizes {
			most = max(most, n)
		}
		l := loc{inKeep, d.keep.take(most)}
		d.bucketTmp = &l
	}
	return *d.bucketTmp
}

// commStream is the device's stream for gradient buckets' reductions,
// made the first time a bucket asks for it.
func (d *Device) commStream() (driver.Stream, error) {
	if d.comms != 0 || d.rt.drv == nil {
		return d.comms, nil
	}
	s, err := d.rt.drv.StreamCreate(driver.StreamDefault)
	if err != nil {
		return 0, err
	}
	d.comms = s
	return s, nil
}

// commBucket plans the bucket run members, led by instruction i over
// mesh axis ax, on the comm stream: its events, its place among the
// device's buckets (planBucketWaits) and its instructions marked as
// issued there; it returns the plan and the comm stream.
func (d *Device) commBucket(i int, members []lower.Instr, ax int) (*bucketPlan, driver.Stream, error) {
	plan := &bucketPlan{leader: i, members: len(members), axis: d.prog.Mesh.Axes[ax].Name, wait: -1}
	for _, m := range members {
		plan.outs = append(plan.outs, m.Out)
	}
	var err error
	if plan.ready, err = d.event(); err != nil {
		return nil, 0, err
	}
	if plan.done, err = d.event(); err != nil {
		return nil, 0, err
	}
	comms, err := d.commStream()
	if err != nil {
		return nil, 0, err
	}
	d.buckets = append(d.buckets, plan)
	if d.onComm == nil {
		d.onComm = map[int]bool{}
	}
	for k := range members {
		d.onComm[i+k] = true
	}
	return plan, comms, nil
}

// planBucketWaits decides, once at load, where the compute stream waits
// for each bucket's reduction: before the first instruction after the
// bucket that reads or writes bytes of the bucket's results (the
// optimizer reading a gradient, as a rule; the results stay live until
// then, so no other buffer holds those bytes before), or that runs a
// collective on the bucket's mesh axis outside the comm stream, so that
// the collectives of one group (one NCCL communicator) never run at once.
// A bucket whose wait falls past the end of what a step runs is waited
// for at the end of the step, when every stream is synchronized.
func (d *Device) planBucketWaits() {
	instrs := d.prog.Instrs
	for _, b := range d.buckets {
		var spans [][2]int64
		for _, id := range b.outs {
			buf := d.prog.Buffers[id]
			spans = append(spans, [2]int64{buf.Offset, buf.Offset + buf.Bytes})
		}
		for j := b.leader + b.members; j < len(instrs) && b.wait < 0; j++ {
			in := instrs[j]
			if ir.Collectives[in.Op] && in.Attrs.Str("axis") == b.axis && !d.onComm[j] {
				b.wait = j
			}
			for _, id := range d.operands(j) {
				buf := d.prog.Buffers[id]
				for _, sp := range spans {
					if !buf.Host && buf.Bytes > 0 && buf.Offset < sp[1] && sp[0] < buf.Offset+buf.Bytes {
						b.wait = j
					}
				}
			}
		}
		if b.wait >= 0 {
			d.waitBefore[b.wait] = append(d.waitBefore[b.wait], b.done)
			d.notes[b.wait] = append(d.notes[b.wait], fmt.Sprintf("wait for the bucket reduced by instruction %d", b.leader))
		}
	}
}

// operands are the buffers instruction i's closure reads or writes: its
// arguments, its result and what it touches besides (a bucket's first
// all_reduce works on every member's buffers).
func (d *Device) operands(i int) []int {
	in := d.prog.Instrs[i]
	ids := append(slices.Clone(in.Args), d.touches[i]...)
	if in.Out >= 0 {
		ids = append(ids, in.Out)
	}
	return ids
}
