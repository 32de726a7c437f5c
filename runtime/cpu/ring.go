package cpu

import (
	"fmt"
	"math"
	"unsafe"

	"gcompile/ir"

	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime"
)

// Ring attention (Megatron-Core's context parallelism, Liu et al.'s ring
// attention): under a context-parallel axis every attention operand
// stays split on its sequence, the device holding one contiguous chunk of
// the queries and of the keys. An attention instruction passes chunks
// around the cp ranks itself, one step per rank, by point-to-point sends
// that are buffered (runtime.Comm.Send), so a device sends its chunk,
// computes on the one it holds, then receives the next:
//
//   - attention: K/V chunks travel; each step's partial output is merged
//     into the running one by the log-sum-exp of its rows (kcpu.AttentionLSE);
//   - attention_stats: K chunks travel; the log-sum-exp merges the same
//     way, D = dout·out is local;
//   - attention_grad_q: K/V chunks travel; with the whole rows'
//     statistics each chunk's share of dq simply adds;
//   - attention_grad_k and _v: K (and V) travel with the gradient of their
//     chunk, each device adding its queries' share, and the finished
//     gradient takes one more step home to its owner.
//
// Under a causal mask a chunk of keys wholly after a device's queries is
// passed on without computing; the global positions of the rows (the
// chunk's index times its length) decide (kcpu.AttentionDims.Positioned).

// ring is one device's place on the cp ring (runtime.Ring) and how it
// reaches its neighbours.
type ring struct {
	runtime.Ring
	c          runtime.Comm
	rank       int // the device's global rank
	next, prev int // global ranks it sends to and receives from
	tag        int // the first of the instruction's tags
}

// ringTagBase puts ring transfers in a tag range of their own: pipeline
// transfers use value IDs, host exchanges negative tags.
const ringTagBase = 1 << 28

// ringSend posts x to the next device on the ring, stream s of the tag.
func ringSend[T kcpu.Float](r ring, s int, x []T) error {
	return r.c.Send(r.rank, r.next, r.tag+s, floatDType[T](), asBytes(x))
}

// ringRecv takes the previous device's next chunk of stream s into x.
func ringRecv[T kcpu.Float](r ring, s int, x []T) error {
	return r.c.Recv(r.prev, r.rank, r.tag+s, floatDType[T](), asBytes(x))
}

// floatDType is the IR dtype of T's elements.
func floatDType[T kcpu.Float]() ir.DType {
	var z T
	if unsafe.Sizeof(z) == 4 {
		return ir.F32
	}
	return ir.F64
}

// ringAttentionOf finds the ring an attention instruction runs on: its q
// is split on the sequence (dim 2) over the mesh's context-parallel axis.
// ok is false otherwise.
func ringAttentionOf(d *Device, in lower.Instr) (r ring, ok bool, err error) {
	rg, ok, err := runtime.RingOf(d.prog.Mesh, in, d.coords)
	if !ok || err != nil {
		return ring{}, ok, err
	}
	g := d.axisGroup(rg.Axis)
	n, pos := rg.N, rg.Pos
	return ring{Ring: rg, c: d.comm, rank: d.rank, next: g.Ranks[(pos+1)%n], prev: g.Ranks[(pos+n-1)%n],
		tag: ringTagBase + 4*in.Value.ID}, true, nil
}

// compileRingAttention compiles an attention instruction as ring
// attention when its operands are split over cp; handled is false when
// they are not.
func compileRingAttention[T kcpu.Float](c *Call[T], dims kcpu.AttentionDims) (f func() error, handled bool, err error) {
	r, ok, err := ringAttentionOf(c.d, c.Instr)
	if !ok || err != nil {
		return nil, ok, err
	}
	if len(c.Instr.Scratch) != 1 {
		return nil, true, fmt.Errorf("%s: ring attention needs its scratch buffer, and the program gives it %d", c.Instr.Op, len(c.Instr.Scratch))
	}
	sc := &carver{b: c.d.raw(c.d.prog.Buffers[c.Instr.Scratch[0]])}
	out := c.Out()
	var run func() error
	switch c.Instr.Op {
	case "attention":
		q, k, v := c.Arg(0), c.Arg(1), c.Arg(2)
		w := newRingForward[T](dims, sc)
		run = func() error { return w.run(r, out, q, k, v) }
	case "attention_stats":
		q, k, o, dout := c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3)
		w := newRingStats[T](dims, sc)
		run = func() error { return w.run(r, out, q, k, o, dout) }
	case "attention_grad_q":
		q, k, v, dout, stats := c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3), c.Arg(4)
		w := newRingGradQ[T](dims, sc)
		run = func() error { return w.run(r, out, q, k, v, dout, stats) }
	case "attention_grad_k":
		q, k, v, dout, stats := c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3), c.Arg(4)
		w := newRingGradKV[T](dims, true, sc)
		run = func() error { return w.run(r, out, q, k, v, dout, stats) }
	case "attention_grad_v":
		q, k, dout, stats := c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3)
		w := newRingGradKV[T](dims, false, sc)
		run = func() error { return w.run(r, out, q, k, nil, dout, stats) }
	}
	if run == nil {
		return nil, true, fmt.Errorf("ring attention: op %s is not an attention op", c.Instr.Op)
	}
	if sc.err == nil && len(sc.b) > 0 {
		sc.err = fmt.Errorf("ring attention's scratch has %d bytes it does not use", len(sc.b))
	}
	if sc.err != nil {
		return nil, true, fmt.Errorf("%s: %w (lower.RingScratch and the runtime disagree)", c.Instr.Op, sc.err)
	}
	return run, true, nil
}

// carver hands out the pieces of an instruction's scratch buffer in the
// order lower.RingScratch sizes them, each rounded up to 8 bytes; with no
// buffer (a kernel test) it allocates.
type carver struct {
	b   []byte
	err error
}

func take[T float32 | float64 | kcpu.Float](c *carver, n int) []T {
	var z T
	size := (n*int(unsafe.Sizeof(z)) + 7) &^ 7
	if c == nil || c.b == nil {
		return make([]T, n)
	}
	if size > len(c.b) {
		c.err = fmt.Errorf("ring attention's scratch is %d bytes short", size-len(c.b))
		return make([]T, n)
	}
	x := unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(c.b))), n)
	c.b = c.b[size:]
	return x
}

// kvChunks holds the K/V chunk a device computes with and the one it
// receives, swapped each step.
type kvChunks[T kcpu.Float] struct {
	cur, next [][]T
}

func newKVChunks[T kcpu.Float](sc *carver, streams, n int) kvChunks[T] {
	c := kvChunks[T]{cur: make([][]T, streams), next: make([][]T, streams)}
	for i := range streams {
		c.cur[i] = take[T](sc, n)
	}
	for i := range streams {
		c.next[i] = take[T](sc, n)
	}
	return c
}

// step sends the current chunks on (streams 0…), runs f on them, and
// receives the next ones, except at the last step t = n−1.
func (c *kvChunks[T]) step(r ring, t int, f func(cur [][]T) error) error {
	last := t == r.N-1
	if !last {
		for s, x := range c.cur {
			if err := ringSend(r, s, x); err != nil {
				return fmt.Errorf("ring attention, step %d: %w", t, err)
			}
		}
	}
	if err := f(c.cur); err != nil {
		return err
	}
	if !last {
		for s, x := range c.next {
			if err := ringRecv(r, s, x); err != nil {
				return fmt.Errorf("ring attention, step %d: %w", t, err)
			}
		}
		c.cur, c.next = c.next, c.cur
	}
	return nil
}

// each runs f on every chunk the ring brings (this device's first) that a
// causal mask does not wholly hide, with the problem of that chunk.
func (c *kvChunks[T]) each(r ring, d kcpu.AttentionDims, f func(t int, dc kcpu.AttentionDims, cur [][]T)) error {
	for t := range r.N {
		err := c.step(r, t, func(cur [][]T) error {
			if dc, hidden := r.Chunk(d, r.Src(t)); !hidden {
				f(t, dc, cur)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// rounded writes acc to out in out's precision.
func rounded[T kcpu.Float](out []T, acc []float64) {
	for i, a := range acc {
		out[i] = T(a)
	}
}

// ringForward is the forward's scratch: the running output and
// log-sum-exp of every query row, and one step's.
type ringForward[T kcpu.Float] struct {
	d        kcpu.AttentionDims
	kv       kvChunks[T]
	acc      []float64
	lse, lsT []float64
	part     []T
}

func newRingForward[T kcpu.Float](d kcpu.AttentionDims, sc *carver) *ringForward[T] {
	rows := d.Batch * d.Heads * d.SQ
	w := &ringForward[T]{d: d, kv: newKVChunks[T](sc, 2, d.Batch*d.KVHeads*d.SK*d.HeadDim)}
	w.acc, w.lse, w.lsT = take[float64](sc, rows*d.HeadDim), take[float64](sc, rows), take[float64](sc, rows)
	w.part = take[T](sc, rows*d.HeadDim)
	return w
}

func (w *ringForward[T]) run(r ring, out, q, k, v []T) error {
	d := w.d
	copy(w.kv.cur[0], k)
	copy(w.kv.cur[1], v)
	clear(w.acc)
	for i := range w.lse {
		w.lse[i] = math.Inf(-1)
	}
	err := w.kv.each(r, d, func(_ int, dc kcpu.AttentionDims, cur [][]T) {
		kcpu.AttentionLSE(w.part, w.lsT, q, cur[0], cur[1], dc)
		mergeLSE(w.acc, w.lse, w.part, w.lsT, d)
	})
	rounded(out, w.acc)
	return err
}

// mergeLSE folds one chunk's partial output part (rows normalised over
// that chunk's keys, log-sum-exp lsT) into the running acc and lse:
// o = e^(lse−new)·o + e^(lsT−new)·part with new = log(e^lse + e^lsT). Rows
// are in q's order for lse and in the output's layout [Batch, SQ, Heads,
// HeadDim] for acc and part.
func mergeLSE[T kcpu.Float](acc, lse []float64, part []T, lsT []float64, d kcpu.AttentionDims) {
	hd := d.HeadDim
	for b := range d.Batch {
		for h := range d.Heads {
			for i := range d.SQ {
				row := (b*d.Heads+h)*d.SQ + i
				l2 := lsT[row]
				if math.IsInf(l2, -1) {
					continue // the chunk hides every key from this row
				}
				l1 := lse[row]
				merged := logAddExp(l1, l2)
				a, c := math.Exp(l1-merged), math.Exp(l2-merged)
				o := ((b*d.SQ+i)*d.Heads + h) * hd
				for x := range hd {
					acc[o+x] = acc[o+x]*a + float64(part[o+x])*c
				}
				lse[row] = merged
			}
		}
	}
}

// logAddExp is log(e^a + e^b) for b finite, a finite or −Inf.
func logAddExp(a, b float64) float64 {
	hi := math.Max(a, b)
	return hi + math.Log(math.Exp(a-hi)+math.Exp(b-hi))
}

// ringStats is attention_stats' scratch: each chunk's statistics, and
// the running log-sum-exp.
type ringStats[T kcpu.Float] struct {
	d    kcpu.AttentionDims
	k    kvChunks[T]
	part []T
	lse  []float64
}

func newRingStats[T kcpu.Float](d kcpu.AttentionDims, sc *carver) *ringStats[T] {
	rows := d.Batch * d.Heads * d.SQ
	w := &ringStats[T]{d: d, k: newKVChunks[T](sc, 1, d.Batch*d.KVHeads*d.SK*d.HeadDim)}
	w.part, w.lse = take[T](sc, 2*rows), take[float64](sc, rows)
	return w
}

func (w *ringStats[T]) run(r ring, stats, q, k, out, dout []T) error {
	copy(w.k.cur[0], k)
	for i := range w.lse {
		w.lse[i] = math.Inf(-1)
	}
	err := w.k.each(r, w.d, func(t int, dc kcpu.AttentionDims, cur [][]T) {
		kcpu.AttentionStats(w.part, q, cur[0], out, dout, dc)
		for row, l := range w.lse {
			l2 := float64(w.part[2*row])
			if t == 0 {
				stats[2*row+1] = w.part[2*row+1] // D = dout·out: the same every step
			}
			if math.IsInf(l2, -1) {
				continue
			}
			w.lse[row] = logAddExp(l, l2)
		}
	})
	if err != nil {
		return err
	}
	for row, l := range w.lse {
		stats[2*row] = T(l)
	}
	return nil
}

// ringGradQ is attention_grad_q's scratch: one chunk's share of dq.
type ringGradQ[T kcpu.Float] struct {
	d    kcpu.AttentionDims
	kv   kvChunks[T]
	part []T
	acc  []float64
}

func newRingGradQ[T kcpu.Float](d kcpu.AttentionDims, sc *carver) *ringGradQ[T] {
	n := d.Batch * d.Heads * d.SQ * d.HeadDim
	w := &ringGradQ[T]{d: d, kv: newKVChunks[T](sc, 2, d.Batch*d.KVHeads*d.SK*d.HeadDim)}
	w.part, w.acc = take[T](sc, n), take[float64](sc, n)
	return w
}

func (w *ringGradQ[T]) run(r ring, dq, q, k, v, dout, stats []T) error {
	copy(w.kv.cur[0], k)
	copy(w.kv.cur[1], v)
	clear(w.acc)
	err := w.kv.each(r, w.d, func(_ int, dc kcpu.AttentionDims, cur [][]T) {
		kcpu.AttentionGradQ(w.part, q, cur[0], cur[1], dout, stats, dc)
		for i, x := range w.part {
			w.acc[i] += float64(x)
		}
	})
	rounded(dq, w.acc)
	return err
}

// ringGradKV is attention_grad_k's (or _v's) scratch: the K (and V)
// chunk travels with the gradient of that chunk (the last stream), to
// which every device adds its queries' share.
type ringGradKV[T kcpu.Float] struct {
	d      kcpu.AttentionDims
	k      bool // dk (K and V travel), or dv (K travels)
	chunks kvChunks[T]
	part   []T
}

func newRingGradKV[T kcpu.Float](d kcpu.AttentionDims, k bool, sc *carver) *ringGradKV[T] {
	streams := 2
	if k {
		streams = 3
	}
	n := d.Batch * d.KVHeads * d.SK * d.HeadDim
	w := &ringGradKV[T]{d: d, k: k, chunks: newKVChunks[T](sc, streams, n)}
	w.part = take[T](sc, n)
	return w
}

func (w *ringGradKV[T]) run(r ring, grad, q, k, v, dout, stats []T) error {
	c := &w.chunks
	copy(c.cur[0], k)
	if w.k {
		copy(c.cur[1], v)
	}
	g := len(c.cur) - 1 // the gradient's stream
	clear(c.cur[g])
	// Each step adds this device's share before the chunk moves on, so
	// the sends go after the compute here: the gradient stream carries it.
	for t := range r.N {
		dc, hidden := r.Chunk(w.d, r.Src(t))
		if !hidden {
			if w.k {
				kcpu.AttentionGradK(w.part, q, c.cur[0], c.cur[1], dout, stats, dc)
			} else {
				kcpu.AttentionGradV(w.part, q, c.cur[0], dout, stats, dc)
			}
			for i, x := range w.part {
				c.cur[g][i] += x
			}
		}
		if t == r.N-1 {
			break
		}
		if err := c.step(r, t, func([][]T) error { return nil }); err != nil {
			return err
		}
	}
	// The chunk held now is the next device's, complete: it goes home,
	// and this device's own comes from the previous one.
	if err := ringSend(r, g, c.cur[g]); err != nil {
		return fmt.Errorf("ring attention, returning the gradient: %w", err)
	}
	if err := ringRecv(r, g, grad); err != nil {
		return fmt.Errorf("ring attention, returning the gradient: %w", err)
	}
	return nil
}
