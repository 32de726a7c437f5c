package cuda

import (
	"fmt"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime"
	"gcompile/runtime/cuda/driver"
)

// Ring attention (context parallelism, as the CPU backend's
// runtime/cpu/ring.go): an attention instruction whose q is split on its
// sequence over cp passes K/V chunks around the cp devices itself. Step t
// computes on the chunk held while the next one moves: the shift of the
// chunks runs on the comm stream (comm.shift: every member's chunk goes
// to the next member at once) and the compute stream waits for it only
// before step t+1, so the transfer of step t overlaps the kernels of step
// t, as Megatron-Core's context parallelism does.
//
//   - attention: K/V travel; each step's output and log-sum-exp
//     (gc_attention's lse) are merged into the running ones
//     (gc_att_merge), the instruction's result itself;
//   - attention_stats: K travels; the log-sum-exps merge
//     (gc_att_stats_merge), D = dout·out is the first step's;
//   - attention_grad_q: K/V travel; each chunk's share of dq adds;
//   - attention_grad_k and _v: K (and V) travel with the gradient of
//     their chunk, each device adding its queries' share before the chunk
//     moves on (so those shifts follow the compute), and the finished
//     gradient takes one more step home into the result.
//
// A step whose chunk a causal mask wholly hides runs no kernel
// (runtime.Ring.Chunk). The device's own chunk is step 0 and is never
// hidden, so its kernels write the running result directly. The chunks
// and partial results are carved from the instruction's planned scratch
// buffer (lower.RingScratch sizes it for the CPU backend's float64
// accumulators; this backend's fp32 ones need less).

// ringStep is what one step of a ring instruction queues on the compute
// stream, and whether the chunks move on after it.
type ringStep struct {
	kernels []*launch
	shift   bool
}

// ringPlan is one ring instruction as the device runs it.
type ringPlan struct {
	g          group
	site       *site
	computed   driver.Event // recorded on the compute stream before a shift
	shifted    driver.Event // recorded on the comm stream after it
	bytes      []int64
	bufs       [2][]loc // the chunks, held and received, per stream
	args       []loc    // the device's own chunks (step 0)
	steps      []ringStep
	homeSrc    int // the stream whose finished chunk goes home, or -1
	home       loc // where it lands
	shiftAfter bool
}

// ringAttention compiles the instruction as ring attention on ring r with
// the device's own problem d.
func (c *compiler) ringAttention(r runtime.Ring, d kcpu.AttentionDims) (func() error, error) {
	in, dev := c.in, c.d
	if len(in.Scratch) != 1 {
		return nil, fmt.Errorf("%s: ring attention needs its scratch buffer, and the program gives it %d", in.Op, len(in.Scratch))
	}
	planned := c.buf(in.Scratch[0])
	base, left := at(planned), planned.Bytes
	take := func(n int64) parg {
		size := (4*n + 7) &^ 7
		p := parg{at: base, dt: ir.F32}
		base, left = base.add(size), left-size
		return p
	}
	qLen := int64(d.Batch * d.Heads * d.SQ * d.HeadDim)
	kvLen := int64(d.Batch * d.KVHeads * d.SK * d.HeadDim)
	rows := int64(d.Batch * d.Heads * d.SQ)
	p := &ringPlan{g: dev.axisGroup(r.Axis), homeSrc: -1}
	// travel lists the operands that go round: streams of kvLen floats,
	// the device's own first.
	travel := func(own ...parg) {
		for _, o := range own {
			p.args = append(p.args, o.at)
			p.bytes = append(p.bytes, 4*kvLen)
			a, b := take(kvLen), take(kvLen)
			p.bufs[0], p.bufs[1] = append(p.bufs[0], a.at), append(p.bufs[1], b.at)
		}
	}
	// chunk is stream s's operand at step t: the device's own at step 0,
	// then the two buffers in turn.
	chunk := func(s, t int) parg {
		if t == 0 {
			return parg{at: p.args[s], dt: ir.F32}
		}
		return parg{at: p.bufs[(t+1)%2][s], dt: ir.F32}
	}
	tiles := func(seq int) int64 {
		per := min(attRows, attTile/d.HeadDim)
		return int64((seq + per - 1) / per)
	}
	out := c.out()
	var add func(t int, dc kcpu.AttentionDims) ([]*launch, error)
	switch in.Op {
	case "attention":
		q := c.arg(0)
		travel(c.arg(1), c.arg(2))
		lse, part, lsp := take(rows), take(qLen), take(rows)
		add = func(t int, dc kcpu.AttentionDims) ([]*launch, error) {
			sizes := attSizes(dc, tiles(dc.SQ))
			if t == 0 {
				l, err := c.kernel("gc_attention", append([]any{out, lse, q, chunk(0, t), chunk(1, t)}, sizes...)...)
				return []*launch{l}, err
			}
			l, err := c.kernel("gc_attention", append([]any{part, lsp, q, chunk(0, t), chunk(1, t)}, sizes...)...)
			if err != nil {
				return nil, err
			}
			m, err := c.kernel("gc_att_merge", out, lse, part, lsp, int64(d.Batch), int64(d.Heads), int64(d.SQ), int64(d.HeadDim))
			return []*launch{l, m}, err
		}
	case "attention_stats":
		q, o, dout := c.arg(0), c.arg(2), c.arg(3)
		travel(c.arg(1))
		part := take(2 * rows)
		add = func(t int, dc kcpu.AttentionDims) ([]*launch, error) {
			sizes := attSizes(dc, tiles(dc.SQ))
			if t == 0 {
				l, err := c.kernel("gc_attention_stats", append([]any{out, q, chunk(0, t), o, dout}, sizes...)...)
				return []*launch{l}, err
			}
			l, err := c.kernel("gc_attention_stats", append([]any{part, q, chunk(0, t), o, dout}, sizes...)...)
			if err != nil {
				return nil, err
			}
			m, err := c.kernel("gc_att_stats_merge", out, part, rows)
			return []*launch{l, m}, err
		}
	case "attention_grad_q":
		q, dout, stats := c.arg(0), c.arg(3), c.arg(4)
		travel(c.arg(1), c.arg(2))
		part := take(qLen)
		add = func(t int, dc kcpu.AttentionDims) ([]*launch, error) {
			sizes := attSizes(dc, tiles(dc.SQ))
			dst := out
			if t > 0 {
				dst = part
			}
			l, err := c.kernel("gc_attention_grad_q", append([]any{dst, q, chunk(0, t), chunk(1, t), dout, stats}, sizes...)...)
			if err != nil || t == 0 {
				return []*launch{l}, err
			}
			s, err := c.kernel("gc_add", out, out, part, qLen)
			return []*launch{l, s}, err
		}
	case "attention_grad_k", "attention_grad_v":
		q := c.arg(0)
		var dout, stats parg
		var own []parg
		if in.Op == "attention_grad_k" {
			dout, stats = c.arg(3), c.arg(4)
			own = []parg{c.arg(1), c.arg(2)}
		} else {
			dout, stats = c.arg(2), c.arg(3)
			own = []parg{c.arg(1)}
		}
		// The gradient's stream starts in the first buffer: step 0
		// writes the device's share of its own chunk there.
		g0 := take(kvLen)
		travel(own...)
		gs := len(p.args)
		p.args = append(p.args, g0.at)
		p.bytes = append(p.bytes, 4*kvLen)
		g1 := take(kvLen)
		p.bufs[0], p.bufs[1] = append(p.bufs[0], g1.at), append(p.bufs[1], g0.at)
		part := take(kvLen)
		p.shiftAfter = true
		p.homeSrc, p.home = gs, out.at
		add = func(t int, dc kcpu.AttentionDims) ([]*launch, error) {
			sizes := attSizes(dc, tiles(dc.SK))
			grad := chunk(gs, t)
			dst := grad
			if t > 0 {
				dst = part
			}
			args := []any{dst, q, chunk(0, t)}
			if in.Op == "attention_grad_k" {
				args = append(args, chunk(1, t))
			}
			l, err := c.kernel("gc_"+in.Op, append(append(args, dout, stats), sizes...)...)
			if err != nil || t == 0 {
				return []*launch{l}, err
			}
			s, err := c.kernel("gc_add", grad, grad, part, kvLen)
			return []*launch{l, s}, err
		}
	default:
		return nil, fmt.Errorf("ring attention: op %s is not an attention op", in.Op)
	}
	if left < 0 {
		return nil, fmt.Errorf("%s: ring attention's scratch is %d bytes short (lower.RingScratch and the runtime disagree)", in.Op, -left)
	}
	for t := range r.N {
		dc, hidden := r.Chunk(d, r.Src(t))
		if t == 0 && hidden {
			return nil, fmt.Errorf("%s: ring attention: the device's own chunk is hidden from its queries (%+v)", in.Op, dc)
		}
		var st ringStep
		if !hidden {
			ls, err := add(t, dc)
			if err != nil {
				return nil, err
			}
			st.kernels = ls
		}
		st.shift = t < r.N-1
		p.steps = append(p.steps, st)
	}
	var err error
	if p.site, err = dev.comm.site(dev); err != nil {
		return nil, err
	}
	if p.computed, err = dev.event(); err != nil {
		return nil, err
	}
	if p.shifted, err = dev.event(); err != nil {
		return nil, err
	}
	if _, err := dev.commStream(); err != nil {
		return nil, err
	}
	c.note(fmt.Sprintf("ring attention over %s, %d steps, chunks shifted on the comm stream", dev.prog.Mesh.Axes[r.Axis].Name, r.N))
	return func() error { return dev.runRing(p) }, nil
}

// attSizes are the sizes and positions every attention kernel takes after
// its pointers, for problem d in tiles tiles. Without positions a query i
// sees key j ≤ i + sk − sq, which positions say as a query run starting
// at sk − sq and a key run at 0.
func attSizes(d kcpu.AttentionDims, tiles int64) []any {
	qp, kp, qb, kb := [2]int{d.SK - d.SQ, 0}, [2]int{0, 0}, d.SQ, d.SK
	if d.Positioned {
		qp, kp, qb, kb = d.QPos, d.KPos, d.QBreak, d.KBreak
	}
	return []any{int64(d.Batch), int64(d.Heads), int64(d.KVHeads), int64(d.SQ), int64(d.SK), int64(d.HeadDim),
		tiles, int64(d.Group), int64(d.QHeadOffset), int64(d.KVHeadOffset), float32(d.Scale), d.Causal,
		int64(qp[0]), int64(qb), int64(qp[1]), int64(kp[0]), int64(kb), int64(kp[1])}
}

// runRing queues one ring instruction: per step its kernels on the
// compute stream and the shift of its chunks on the comm stream, ordered
// by two events.
func (d *Device) runRing(p *ringPlan) error {
	drv := d.rt.drv
	// shift moves the chunks held at step t into the other buffers: it
	// waits for the compute stream's work so far (which made or read what
	// it overwrites), and the compute stream waits for it before it
	// reads them.
	shift := func(srcs, dsts []driver.DevicePtr, bytes []int64) error {
		if err := drv.EventRecord(p.computed, d.compute); err != nil {
			return err
		}
		if err := drv.StreamWaitEvent(d.comms, p.computed); err != nil {
			return err
		}
		if err := d.comm.shift(d, p.g, p.site, d.comms, srcs, dsts, bytes); err != nil {
			return fmt.Errorf("ring attention: %w", err)
		}
		return drv.EventRecord(p.shifted, d.comms)
	}
	held := func(t int) []driver.DevicePtr {
		ptrs := make([]driver.DevicePtr, len(p.args))
		for s := range ptrs {
			if t == 0 {
				ptrs[s] = d.ptr(p.args[s])
			} else {
				ptrs[s] = d.ptr(p.bufs[(t+1)%2][s])
			}
		}
		return ptrs
	}
	received := func(t int) []driver.DevicePtr { return held(t + 1) }
	for t, st := range p.steps {
		if st.shift && !p.shiftAfter {
			if err := shift(held(t), received(t), p.bytes); err != nil {
				return err
			}
		}
		for _, l := range st.kernels {
			if err := d.run(l); err != nil {
				return err
			}
		}
		if st.shift && p.shiftAfter {
			if err := shift(held(t), received(t), p.bytes); err != nil {
				return err
			}
		}
		if st.shift {
			if err := drv.StreamWaitEvent(d.compute, p.shifted); err != nil {
				return err
			}
		}
	}
	if p.homeSrc < 0 {
		return nil
	}
	// The gradient held now is the next device's, complete: it goes home,
	// and this device's own comes from the previous one.
	last := len(p.steps) - 1
	src := []driver.DevicePtr{held(last)[p.homeSrc]}
	if err := shift(src, []driver.DevicePtr{d.ptr(p.home)}, p.bytes[p.homeSrc:p.homeSrc+1]); err != nil {
		return err
	}
	return drv.StreamWaitEvent(d.compute, p.shifted)
}
