package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"gcompile/ir"
	"gcompile/runtime/cuda/driver"
)

// comm is how a device reaches the other devices of its cluster:
// collectives over groups of ranks and pipeline transfers. The fabric
// connects virtual devices that share one GPU; ncclComm connects one
// device per GPU through NCCL.
type comm interface {
	// site prepares one call site (an instruction's collective) at load.
	site(d *Device) (*site, error)
	// allReduce sums every member's bufs[k] (counts[k] fp32 elements) in
	// place on d's compute stream. tmp is workspace of the total count
	// when stagesSums says so: the fabric reduces into it and copies the
	// sums back once no member reads its buffers.
	allReduce(d *Device, g group, s *site, bufs []driver.DevicePtr, counts []int64, tmp driver.DevicePtr) error
	// allReduceOn is allReduce of dt elements (fp32, or bf16 or fp16
	// with each add rounded to the format: --grad-reduce-dtype) queued
	// on stream st of d: the comm stream, for a gradient bucket.
	allReduceOn(d *Device, g group, s *site, st driver.Stream, dt ir.DType, bufs []driver.DevicePtr, counts []int64, tmp driver.DevicePtr) error
	// stagesSums reports whether allReduce needs its tmp workspace.
	stagesSums() bool
	// reduceScatter: out (count dt elements, as allReduceOn's) becomes
	// the sum over members of chunk pos of their src (group size × count
	// elements), on stream st of d (the comm stream for a gradient
	// bucket).
	reduceScatter(d *Device, g group, s *site, st driver.Stream, dt ir.DType, src, out driver.DevicePtr, count int64) error
	// allGather: chunk q of out (bytes each) becomes member q's src.
	allGather(d *Device, g group, s *site, src, out driver.DevicePtr, bytes int64) error
	// allToAll: chunk q of out becomes chunk pos of member q's src.
	allToAll(d *Device, g group, s *site, src, out driver.DevicePtr, bytes int64) error
	// shift passes buffers one step round the ring of g's members, on
	// stream st: each member's dsts[k] becomes the bytes[k] bytes of the
	// previous member's srcs[k] (ring attention's chunks).
	shift(d *Device, g group, s *site, st driver.Stream, srcs, dsts []driver.DevicePtr, bytes []int64) error
	// prepareSend reserves what one send instruction needs, at load;
	// prepareRecv does the same for a receive from peer.
	prepareSend(d *Device, peer int, bytes int64) (*sendSlot, error)
	prepareRecv(d *Device, peer, tag int, bytes int64) error
	// send hands bytes at src to device peer and returns without waiting
	// for it; recv waits for the matching send and copies it into dst.
	send(d *Device, s *sendSlot, peer, tag int, src driver.DevicePtr, bytes int64) error
	recv(d *Device, peer, tag int, dst driver.DevicePtr, bytes int64) error
	// abort wakes every device waiting for another with err.
	abort(err error)
}

// group is the devices of one collective, in rank order along a mesh
// axis, and this device's position among them.
type group struct {
	ranks []int
	pos   int
	key   string
}

func newGroup(ranks []int, rank int) group {
	g := group{ranks: ranks, pos: -1}
	var b strings.Builder
	for i, r := range ranks {
		if r == rank {
			g.pos = i
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(r))
	}
	g.key = b.String()
	return g
}

// size is the number of members.
func (g group) size() int { return len(g.ranks) }

// site is one collective call site of one device: the events that order
// the members' streams around it.
type site struct{ ready, done driver.Event }

// sendSlot is one send instruction's staging buffer and the event that
// marks it filled.
type sendSlot struct {
	staging loc
	ready   driver.Event
}

// ErrAborted marks a collective or receive that gave up because another
// device failed.
var ErrAborted = errors.New("cluster aborted")

// fabric connects virtual devices that share one GPU (one context, one
// address space). A collective is a rendezvous on the host: every member
// records an event when its inputs are ready and publishes its buffers'
// addresses; once all have arrived each member's stream waits for the
// others' events, and the member computes its own result from the
// others' buffers with device-to-device copies and the add kernel, always
// adding in group-position order, so results are bit-reproducible and
// equal to the CPU backend's fixed-order sums. A second rendezvous, on
// events recorded after the reads, keeps any member from overwriting its
// inputs before the others have read them. Nothing blocks a stream on the
// host: the host only waits for the other devices to queue their work.
type fabric struct {
	mu   sync.Mutex
	cond *sync.Cond
	seqs map[string]*groupSeq
	mail map[mailKey][]message
	err  error
}

type groupSeq struct {
	next []uint64 // each member's next collective
	open map[uint64]*meeting
}

// meeting is the k-th collective of one group.
type meeting struct {
	slots             []slot
	arrived, departed int
	verdict           error
	verdictDecided    bool
}

// slot is what one member brings: what it calls (members must agree),
// its ready event and its buffers, then its done event.
type slot struct {
	what        string
	ready, done driver.Event
	ptrs        []driver.DevicePtr
}

type mailKey struct{ from, to, tag int }

type message struct {
	src   driver.DevicePtr
	bytes int64
	ready driver.Event
}

func newFabric() *fabric {
	f := &fabric{seqs: map[string]*groupSeq{}, mail: map[mailKey][]message{}}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *fabric) abort(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	f.cond.Broadcast()
}

func (f *fabric) site(d *Device) (*site, error) {
	ready, err := d.event()
	if err != nil {
		return nil, err
	}
	done, err := d.event()
	if err != nil {
		return nil, err
	}
	return &site{ready, done}, nil
}

// arrive registers a member at its group's next collective and waits for
// the others.
func (f *fabric) arrive(g group, s slot) (*meeting, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	gs := f.seqs[g.key]
	if gs == nil {
		gs = &groupSeq{next: make([]uint64, g.size()), open: map[uint64]*meeting{}}
		f.seqs[g.key] = gs
	}
	seq := gs.next[g.pos]
	gs.next[g.pos]++
	m := gs.open[seq]
	if m == nil {
		m = &meeting{slots: make([]slot, g.size())}
		gs.open[seq] = m
	}
	m.slots[g.pos] = s
	m.arrived++
	if m.arrived == g.size() {
		delete(gs.open, seq)
		f.cond.Broadcast()
	}
	for m.arrived < g.size() && f.err == nil {
		f.cond.Wait()
	}
	if m.arrived < g.size() {
		return nil, f.err
	}
	if !m.verdictDecided {
		m.verdictDecided = true
		for q := 1; q < len(m.slots); q++ {
			if m.slots[q].what != m.slots[0].what {
				m.verdict = fmt.Errorf("collective #%d on devices [%s]: device %d (position 0) calls %s but device %d (position %d) calls %s; every member must make the same collective calls in the same order",
					seq, g.key, g.ranks[0], m.slots[0].what, g.ranks[q], q, m.slots[q].what)
				break
			}
		}
	}
	return m, m.verdict
}

// depart publishes the member's done event and waits for the others'.
func (f *fabric) depart(m *meeting, pos int, done driver.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m.slots[pos].done = done
	m.departed++
	if m.departed == len(m.slots) {
		f.cond.Broadcast()
	}
	for m.departed < len(m.slots) && f.err == nil {
		f.cond.Wait()
	}
	if m.departed < len(m.slots) {
		return f.err
	}
	return nil
}

// meet runs one collective on the member's stream st: work reads the
// other members' buffers (their ptrs) between the two rendezvous, queued
// on st too.
func (f *fabric) meet(d *Device, g group, s *site, st driver.Stream, what string, ptrs []driver.DevicePtr, work func(m *meeting) error) error {
	drv := d.rt.drv
	if err := drv.EventRecord(s.ready, st); err != nil {
		return err
	}
	m, err := f.arrive(g, slot{what: what, ready: s.ready, ptrs: ptrs})
	if err != nil {
		return err
	}
	for q, sl := range m.slots {
		if q != g.pos {
			if err := drv.StreamWaitEvent(st, sl.ready); err != nil {
				return err
			}
		}
	}
	if err := work(m); err != nil {
		return err
	}
	if err := drv.EventRecord(s.done, st); err != nil {
		return err
	}
	if err := f.depart(m, g.pos, s.done); err != nil {
		return err
	}
	for q, sl := range m.slots {
		if q != g.pos {
			if err := drv.StreamWaitEvent(st, sl.done); err != nil {
				return err
			}
		}
	}
	return nil
}

// sum writes into out the sum of the members' dt buffers at index k of
// their ptrs, offset by off elements, on stream st: a copy of position
// 0's, then one add per further position, in order (a 16-bit add rounds
// to its format, as the CPU backend's Comm does).
func sum(d *Device, st driver.Stream, dt ir.DType, m *meeting, k int, off, count int64, out driver.DevicePtr) error {
	if count == 0 {
		return nil
	}
	drv := d.rt.drv
	es, add := elemSum(dt)
	at := func(q int) driver.DevicePtr { return m.slots[q].ptrs[k].Add(uint64(es * off)) }
	if err := drv.MemcpyDtoDAsync(out, at(0), uint64(es*count), st); err != nil {
		return err
	}
	for q := 1; q < len(m.slots); q++ {
		if err := d.call(st, add, abs{out, dt}, abs{out, dt}, abs{at(q), dt}, count); err != nil {
			return err
		}
	}
	return nil
}

// elemSum is a summed dtype's element size and the kernel that adds two
// buffers of it: fp32, or a 16-bit format rounded at every add.
func elemSum(dt ir.DType) (int64, string) {
	switch dt {
	case ir.BF16:
		return 2, "gc_add_bf16"
	case ir.F16:
		return 2, "gc_add_f16"
	}
	return 4, "gc_add"
}

func (f *fabric) stagesSums() bool { return true }

func (f *fabric) allReduce(d *Device, g group, s *site, bufs []driver.DevicePtr, counts []int64, tmp driver.DevicePtr) error {
	return f.allReduceOn(d, g, s, d.compute, ir.F32, bufs, counts, tmp)
}

func (f *fabric) allReduceOn(d *Device, g group, s *site, st driver.Stream, dt ir.DType, bufs []driver.DevicePtr, counts []int64, tmp driver.DevicePtr) error {
	es, _ := elemSum(dt)
	what := fmt.Sprintf("all_reduce of %v %v elements", counts, dt)
	err := f.meet(d, g, s, st, what, bufs, func(m *meeting) error {
		var off int64
		for k := range bufs {
			if err := sum(d, st, dt, m, k, 0, counts[k], tmp.Add(uint64(es*off))); err != nil {
				return err
			}
			off += counts[k]
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Every member has read the others' buffers: the sums may land.
	var off int64
	for k, b := range bufs {
		if counts[k] > 0 {
			if err := d.rt.drv.MemcpyDtoDAsync(b, tmp.Add(uint64(es*off)), uint64(es*counts[k]), st); err != nil {
				return err
			}
		}
		off += counts[k]
	}
	return nil
}

func (f *fabric) reduceScatter(d *Device, g group, s *site, st driver.Stream, dt ir.DType, src, out driver.DevicePtr, count int64) error {
	what := fmt.Sprintf("reduce_scatter into %d %v elements", count, dt)
	return f.meet(d, g, s, st, what, []driver.DevicePtr{src}, func(m *meeting) error {
		return sum(d, st, dt, m, 0, int64(g.pos)*count, count, out)
	})
}

func (f *fabric) allGather(d *Device, g group, s *site, src, out driver.DevicePtr, bytes int64) error {
	what := fmt.Sprintf("all_gather of %d bytes each", bytes)
	return f.meet(d, g, s, d.compute, what, []driver.DevicePtr{src}, func(m *meeting) error {
		for q, sl := range m.slots {
			if err := d.rt.drv.MemcpyDtoDAsync(out.Add(uint64(int64(q)*bytes)), sl.ptrs[0], uint64(bytes), d.compute); err != nil {
				return err
			}
		}
		return nil
	})
}

func (f *fabric) allToAll(d *Device, g group, s *site, src, out driver.DevicePtr, bytes int64) error {
	what := fmt.Sprintf("all_to_all of %d-byte chunks", bytes)
	return f.meet(d, g, s, d.compute, what, []driver.DevicePtr{src}, func(m *meeting) error {
		for q, sl := range m.slots {
			from := sl.ptrs[0].Add(uint64(int64(g.pos) * bytes))
			if err := d.rt.drv.MemcpyDtoDAsync(out.Add(uint64(int64(q)*bytes)), from, uint64(bytes), d.compute); err != nil {
				return err
			}
		}
		return nil
	})
}

func (f *fabric) shift(d *Device, g group, s *site, st driver.Stream, srcs, dsts []driver.DevicePtr, bytes []int64) error {
	what := fmt.Sprintf("ring shift of %v bytes", bytes)
	prev := (g.pos + g.size() - 1) % g.size()
	return f.meet(d, g, s, st, what, srcs, func(m *meeting) error {
		for k, dst := range dsts {
			if err := d.rt.drv.MemcpyDtoDAsync(dst, m.slots[prev].ptrs[k], uint64(bytes[k]), st); err != nil {
				return err
			}
		}
		return nil
	})
}

func (f *fabric) prepareSend(d *Device, _ int, bytes int64) (*sendSlot, error) {
	return newSendSlot(d, bytes)
}

// newSendSlot reserves a send's staging region and the event that marks
// it filled.
func newSendSlot(d *Device, bytes int64) (*sendSlot, error) {
	ready, err := d.event()
	if err != nil {
		return nil, err
	}
	return &sendSlot{staging: loc{inKeep, d.keep.take(bytes)}, ready: ready}, nil
}

// prepareRecv needs nothing: a receive copies from the sender's staging.
func (f *fabric) prepareRecv(*Device, int, int, int64) error { return nil }

// send copies the data into the send's staging buffer and posts it: the
// sender may overwrite src at once, and the staging buffer is read by the
// receiver within the step (every step ends with all devices idle).
func (f *fabric) send(d *Device, s *sendSlot, peer, tag int, src driver.DevicePtr, bytes int64) error {
	drv := d.rt.drv
	staging := d.ptr(s.staging)
	if err := drv.MemcpyDtoDAsync(staging, src, uint64(bytes), d.compute); err != nil {
		return err
	}
	if err := drv.EventRecord(s.ready, d.compute); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	k := mailKey{d.rank, peer, tag}
	f.mail[k] = append(f.mail[k], message{src: staging, bytes: bytes, ready: s.ready})
	f.cond.Broadcast()
	return nil
}

func (f *fabric) recv(d *Device, peer, tag int, dst driver.DevicePtr, bytes int64) error {
	k := mailKey{peer, d.rank, tag}
	f.mu.Lock()
	for len(f.mail[k]) == 0 && f.err == nil {
		f.cond.Wait()
	}
	if f.err != nil {
		f.mu.Unlock()
		return f.err
	}
	msg := f.mail[k][0]
	f.mail[k] = f.mail[k][1:]
	f.mu.Unlock()
	if msg.bytes != bytes {
		return fmt.Errorf("pipeline transfer %d from device %d to %d: %d bytes sent, %d expected", tag, peer, d.rank, msg.bytes, bytes)
	}
	drv := d.rt.drv
	if err := drv.StreamWaitEvent(d.compute, msg.ready); err != nil {
		return err
	}
	return drv.MemcpyDtoDAsync(dst, msg.src, uint64(bytes), d.compute)
}
