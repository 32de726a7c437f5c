package comm

// This file is the in-process transport: N devices, one goroutine each,
// exchange data through shared memory instead of a network. Members of a
// collective publish their buffers and read each other's; what this
// implementation adds to NCCL's semantics is that every reduction is
// bit-reproducible and that disagreements between members fail every
// member with the same error instead of deadlocking.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gcompile/ir"
	"gcompile/runtime"
)

// op names a collective (and, for Stats, a received message).
type op uint8

const (
	opAllReduce op = iota
	opReduceScatter
	opAllGather
	opAllToAll
	opBroadcast
	opBarrier
	opSendRecv
	numOps
)

var opNames = [numOps]string{"AllReduce", "ReduceScatter", "AllGather", "AllToAll", "Broadcast", "Barrier", "Send/Recv"}

func (o op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// counters are a comm's Stats.
type counters struct {
	calls [numOps]atomic.Int64
	bytes atomic.Int64
}

func (c *counters) add(o op, bytes int64) {
	c.calls[o].Add(1)
	c.bytes.Add(bytes)
}

func (c *counters) stats() runtime.CommStats {
	return runtime.CommStats{
		AllReduce:     c.calls[opAllReduce].Load(),
		ReduceScatter: c.calls[opReduceScatter].Load(),
		AllGather:     c.calls[opAllGather].Load(),
		AllToAll:      c.calls[opAllToAll].Load(),
		Broadcast:     c.calls[opBroadcast].Load(),
		Barrier:       c.calls[opBarrier].Load(),
		SendRecv:      c.calls[opSendRecv].Load(),
		Bytes:         c.bytes.Load(),
	}
}

// Local connects a fixed number of devices of one process.
//
// One mutex guards all matching state; it is held only to register an
// arrival, never while data is copied or reduced, so independent groups
// run concurrently and contend only for those few instructions.
type Local struct {
	size    int
	timeout time.Duration

	mu       sync.Mutex
	groups   map[string]*groupState // by Group.Key
	mail     map[p2pKey][]message   // sent, not yet received, FIFO per key
	waits    map[p2pKey][]*recvWait // receivers waiting, FIFO per key
	abortErr error                  // the first cause handed to Abort
	abortCh  chan struct{}          // closed by the first Abort

	counters
}

var _ runtime.Comm = (*Local)(nil)

// NewLocal makes a comm for size devices, ranks 0..size-1, whose calls
// wait at most runtime.DefaultTimeout for one another. With size ≤ 0
// every call fails, since no rank is valid.
func NewLocal(size int) *Local {
	return &Local{
		size:    size,
		timeout: runtime.DefaultTimeout,
		groups:  map[string]*groupState{},
		mail:    map[p2pKey][]message{},
		waits:   map[p2pKey][]*recvWait{},
		abortCh: make(chan struct{}),
	}
}

// SetTimeout bounds how long a call waits for the other members (d ≤ 0:
// forever). A call that times out aborts the comm: the members that did
// arrive cannot complete without the others.
func (c *Local) SetTimeout(d time.Duration) { c.timeout = d }

// Size is the number of devices the comm connects.
func (c *Local) Size() int { return c.size }

// Stats counts per collective kind and total bytes moved.
func (c *Local) Stats() runtime.CommStats { return c.stats() }

// Abort wakes every member blocked in any collective or Recv with err
// (wrapped) and makes all later calls fail fast with it.
//
// Only the first cause is kept: later Aborts are usually the other devices
// reporting the first failure back. A collective whose members had all
// arrived before the Abort still completes, because its members may
// already be reading one another's buffers.
func (c *Local) Abort(err error) {
	if err == nil {
		err = errors.New("Abort was called with a nil error")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abortErr == nil {
		c.abortErr = err
		close(c.abortCh)
	}
}

// abortedLocked is the error for a call made after, or woken by, Abort.
func (c *Local) abortedLocked(where string) error {
	return fmt.Errorf("%s: %w: %w", where, runtime.ErrAborted, c.abortErr)
}

func (c *Local) aborted(where string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.abortedLocked(where)
}

// timer is the wait limit of one call: a nil channel when there is none.
func (c *Local) timer() (<-chan time.Time, func()) {
	if c.timeout <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(c.timeout)
	return t.C, func() { t.Stop() }
}

// groupState is the matching state of one distinct group.
type groupState struct {
	ranks []int
	posOf map[int]int
	// next is each member's next sequence number: the k-th collective
	// call of every member meets the k-th calls of the others.
	next     []uint64
	meetings map[uint64]*meeting
}

// groupLocked finds or creates g's state. A group is validated once, when
// its state is created; states are kept only for valid groups.
func (c *Local) groupLocked(g runtime.Group) (*groupState, error) {
	key := g.Key()
	if gs, ok := c.groups[key]; ok {
		return gs, nil
	}
	if err := g.Check(c.size); err != nil {
		return nil, err
	}
	gs := &groupState{
		ranks:    append([]int(nil), g.Ranks...),
		posOf:    make(map[int]int, len(g.Ranks)),
		next:     make([]uint64, len(g.Ranks)),
		meetings: map[uint64]*meeting{},
	}
	for p, r := range g.Ranks {
		gs.posOf[r] = p
	}
	c.groups[key] = gs
	return gs, nil
}

// slot is what one member brings to a meeting.
type slot struct {
	op op
	dt ir.DType // Invalid for Barrier
	// lens are the lengths in bytes members must agree on (see lenName):
	// each bucket buffer for AllReduce, len(buf) for Broadcast, len(in)
	// and len(out) for the others, len(out) first for ReduceScatter.
	lens []int
	root int      // Broadcast only
	data [][]byte // the bucket for AllReduce; the input alone otherwise
	// err is this member's own rule violation, found before it arrived; it
	// still arrives so that the others fail with it instead of hanging.
	err error
	// part is the member's share of an AllReduce result, published before
	// it counts itself done.
	part []byte
}

// meeting is one collective of one group: the k-th call of every member.
type meeting struct {
	ranks   []int
	seq     uint64
	slots   []slot        // by position
	present []bool        // guarded by Local.mu
	arrived int           // guarded by Local.mu
	ready   chan struct{} // closed by the last arrival once err is set
	err     error         // the verdict on the arguments, the same for all
	pending atomic.Int64  // members still reading the others' slots
	done    chan struct{} // closed when pending reaches zero
}

// join registers the caller's arrival at its group's next collective and
// waits for the other members. On success every member has arrived, the
// arguments agree and the caller may read every slot.
func (c *Local) join(g runtime.Group, rank int, s slot) (*meeting, int, error) {
	// Formatted only on failure: the success path should not allocate for it.
	where := func() string { return fmt.Sprintf("%v on group %v by rank %d", s.op, g, rank) }
	c.mu.Lock()
	if c.abortErr != nil {
		defer c.mu.Unlock()
		return nil, 0, c.abortedLocked(where())
	}
	gs, err := c.groupLocked(g)
	if err != nil {
		c.mu.Unlock()
		return nil, 0, fmt.Errorf("%s: %w", where(), err)
	}
	if rank < 0 || rank >= c.size {
		c.mu.Unlock()
		return nil, 0, fmt.Errorf("%s: %w: rank %d is outside [0,%d)", where(), runtime.ErrGroup, rank, c.size)
	}
	pos, member := gs.posOf[rank]
	if !member {
		c.mu.Unlock()
		return nil, 0, fmt.Errorf("%s: %w: rank %d is not a member of the group", where(), runtime.ErrGroup, rank)
	}
	seq := gs.next[pos]
	gs.next[pos]++
	m := gs.meetings[seq]
	if m == nil {
		m = &meeting{
			ranks:   gs.ranks,
			seq:     seq,
			slots:   make([]slot, len(gs.ranks)),
			present: make([]bool, len(gs.ranks)),
			ready:   make(chan struct{}),
			done:    make(chan struct{}),
		}
		m.pending.Store(int64(len(gs.ranks)))
		gs.meetings[seq] = m
	}
	m.slots[pos] = s
	m.present[pos] = true
	m.arrived++
	last := m.arrived == len(m.slots)
	if last {
		// Nobody else will look this meeting up: every member's sequence
		// number has moved past it.
		delete(gs.meetings, seq)
	}
	c.mu.Unlock()

	if last {
		m.err = m.check()
		if m.err == nil {
			c.count(m)
		}
		close(m.ready)
	} else {
		expired, stop := c.timer()
		defer stop()
		select {
		case <-m.ready:
		case <-c.abortCh:
			if !c.full(m) {
				return nil, 0, c.aborted(where())
			}
			// A full meeting goes ahead regardless: its last arrival is
			// about to open it and the others will read this member's
			// buffers, so this member must stay until they are done.
			<-m.ready
		case <-expired:
			if !c.full(m) {
				err := fmt.Errorf("%s: %w after %v waiting for rank(s) %v (collective #%d)", where(), runtime.ErrTimeout, c.timeout, c.missing(m), m.seq)
				c.Abort(err)
				return nil, 0, err
			}
			<-m.ready
		}
	}
	if m.err != nil {
		return nil, 0, m.err
	}
	return m, pos, nil
}

func (c *Local) full(m *meeting) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.arrived == len(m.slots)
}

// missing lists the members that have not arrived.
func (c *Local) missing(m *meeting) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for p, ok := range m.present {
		if !ok {
			out = append(out, m.ranks[p])
		}
	}
	return out
}

// finish marks the caller done reading the other members' slots and waits
// until all are, so that no member returns (and lets its caller overwrite
// its input) while another still reads it. It needs no abort path: every
// member of an open meeting is computing, not waiting for anyone.
func (m *meeting) finish() {
	if m.pending.Add(-1) == 0 {
		close(m.done)
	}
	<-m.done
}

// check gives the verdict on a full meeting, the same error for every
// member: the collective kind first (nothing else is comparable across
// kinds), then each member's own violations, then agreement on the
// element type, lengths and root.
func (m *meeting) check() error {
	s0 := &m.slots[0]
	for p := 1; p < len(m.slots); p++ {
		if s := &m.slots[p]; s.op != s0.op {
			return fmt.Errorf("collective #%d on group %v: %w on the collective: rank %d (position 0) called %v but rank %d (position %d) called %v; every member must make the same collective calls in the same order",
				m.seq, m.ranks, runtime.ErrMismatch, m.ranks[0], s0.op, m.ranks[p], p, s.op)
		}
	}
	for p := range m.slots {
		if err := m.slots[p].err; err != nil {
			return err
		}
	}
	where := fmt.Sprintf("%v on group %v (collective #%d)", s0.op, m.ranks, m.seq)
	for p := 1; p < len(m.slots); p++ {
		s := &m.slots[p]
		if s.dt != s0.dt {
			return fmt.Errorf("%s: %w on the element type: rank %d (position 0) passes %v but rank %d (position %d) passes %v",
				where, runtime.ErrMismatch, m.ranks[0], s0.dt, m.ranks[p], p, s.dt)
		}
		if len(s.lens) != len(s0.lens) {
			return fmt.Errorf("%s: %w on the bucket: rank %d (position 0) passes %d buffers but rank %d (position %d) passes %d",
				where, runtime.ErrMismatch, m.ranks[0], len(s0.lens), m.ranks[p], p, len(s.lens))
		}
		for i := range s.lens {
			if s.lens[i] != s0.lens[i] {
				return fmt.Errorf("%s: %w on %s: rank %d (position 0) passes %d elements but rank %d (position %d) passes %d",
					where, runtime.ErrMismatch, lenName(s0.op, i), m.ranks[0], elems(s0.dt, s0.lens[i]), m.ranks[p], p, elems(s.dt, s.lens[i]))
			}
		}
		if s.root != s0.root {
			return fmt.Errorf("%s: %w on the root: rank %d (position 0) names position %d but rank %d (position %d) names position %d",
				where, runtime.ErrMismatch, m.ranks[0], s0.root, m.ranks[p], p, s.root)
		}
	}
	return nil
}

// elems is a length in bytes as a count of dt elements.
func elems(dt ir.DType, bytes int) int {
	if s := int(dt.Size()); s > 0 {
		return bytes / s
	}
	return bytes
}

// lenName says which argument the i-th agreed length of o measures.
func lenName(o op, i int) string {
	switch o {
	case opAllReduce:
		return fmt.Sprintf("len(bufs[%d])", i)
	case opBroadcast:
		return "len(buf)"
	case opReduceScatter:
		return [2]string{"len(out)", "len(in)"}[i]
	}
	return [2]string{"len(in)", "len(out)"}[i]
}

// count records a collective that passed its check.
func (c *Local) count(m *meeting) {
	s0 := &m.slots[0]
	var bytes int
	switch s0.op {
	case opBarrier:
	case opAllReduce:
		for _, n := range s0.lens {
			bytes += n
		}
		bytes *= len(m.slots)
	case opBroadcast:
		bytes = s0.lens[0]
	case opReduceScatter:
		bytes = s0.lens[1] * len(m.slots)
	default:
		bytes = s0.lens[0] * len(m.slots)
	}
	c.add(s0.op, int64(bytes))
}

// own names a member's own rule violation (nil: none) from its point of
// view.
func own(o op, g runtime.Group, rank int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%v on group %v by rank %d: %w", o, g, rank, err)
}

// reduceSpan adds (or, for the first member, copies) the bytes
// [lo, lo+len(dst)) of the concatenation of bufs into dst.
func reduceSpan(dt ir.DType, dst []byte, bufs [][]byte, lo int, first bool) {
	for _, b := range bufs {
		if len(dst) == 0 {
			return
		}
		if lo >= len(b) {
			lo -= len(b)
			continue
		}
		seg := b[lo:]
		lo = 0
		k := min(len(seg), len(dst))
		accumulate(dt, dst[:k], seg[:k], first)
		dst = dst[k:]
	}
}

// AllReduce sums bufs in place, adding members in group position order in
// dt. Each member reduces a 1/n share of the bucket (the concatenation of
// bufs, cut at element boundaries) from everyone's buffers into a private
// slice; once all shares are done, every member copies all of them out.
// No member writes its buffers while another may still read them, and
// each element is summed by exactly one member in a fixed order, so the
// result is the same bits however the goroutines are scheduled. A
// member's buffers must not overlap one another.
func (c *Local) AllReduce(g runtime.Group, rank int, dt ir.DType, bufs ...[]byte) error {
	lens := make([]int, len(bufs))
	for i, b := range bufs {
		lens[i] = len(b)
	}
	total, bad := allReduceArgs(dt, bufs)
	m, pos, err := c.join(g, rank, slot{op: opAllReduce, dt: dt, lens: lens, data: bufs, err: own(opAllReduce, g, rank, bad)})
	if err != nil {
		return err
	}
	n := len(m.slots)
	if n == 1 {
		// The sum of one contribution is itself.
		m.finish()
		return nil
	}
	es := int(dt.Size())
	count := total / es
	lo, hi := pos*count/n*es, (pos+1)*count/n*es
	part := make([]byte, hi-lo)
	for q := range m.slots {
		reduceSpan(dt, part, m.slots[q].data, lo, q == 0)
	}
	m.slots[pos].part = part
	m.finish()
	bi, bo := 0, 0
	for q := range m.slots {
		for p := m.slots[q].part; len(p) > 0; {
			for bo == len(bufs[bi]) {
				bi, bo = bi+1, 0
			}
			k := copy(bufs[bi][bo:], p)
			p, bo = p[k:], bo+k
		}
	}
	return nil
}

// ReduceScatter sums the members' in and leaves the caller's chunk of the
// sum in out. out must not overlap in, except as exactly the caller's
// chunk of in (NCCL's in-place form).
func (c *Local) ReduceScatter(g runtime.Group, rank int, dt ir.DType, in, out []byte) error {
	k := len(out)
	inPlace, bad := reduceScatterArgs(g, rank, dt, in, out)
	m, pos, err := c.join(g, rank, slot{op: opReduceScatter, dt: dt, lens: []int{k, len(in)}, data: [][]byte{in}, err: own(opReduceScatter, g, rank, bad)})
	if err != nil {
		return err
	}
	dst := out
	if inPlace {
		dst = make([]byte, k)
	}
	for q := range m.slots {
		accumulate(dt, dst, m.slots[q].data[0][pos*k:(pos+1)*k], q == 0)
	}
	m.finish()
	if inPlace {
		copy(out, dst)
	}
	return nil
}

// AllGather concatenates the members' in in position order. in must not
// overlap out, except as exactly the caller's own chunk of out (NCCL's
// in-place form).
func (c *Local) AllGather(g runtime.Group, rank int, dt ir.DType, in, out []byte) error {
	k := len(in)
	inPlace, bad := allGatherArgs(g, rank, dt, in, out)
	m, pos, err := c.join(g, rank, slot{op: opAllGather, dt: dt, lens: []int{k, len(out)}, data: [][]byte{in}, err: own(opAllGather, g, rank, bad)})
	if err != nil {
		return err
	}
	for q := range m.slots {
		if q == pos && inPlace {
			continue
		}
		copy(out[q*k:(q+1)*k], m.slots[q].data[0])
	}
	m.finish()
	return nil
}

// AllToAll exchanges chunks; in and out must not overlap.
func (c *Local) AllToAll(g runtime.Group, rank int, dt ir.DType, in, out []byte) error {
	n := g.Size()
	bad := allToAllArgs(g, dt, in, out)
	m, pos, err := c.join(g, rank, slot{op: opAllToAll, dt: dt, lens: []int{len(in), len(out)}, data: [][]byte{in}, err: own(opAllToAll, g, rank, bad)})
	if err != nil {
		return err
	}
	k := len(in) / n
	for q := range m.slots {
		copy(out[q*k:(q+1)*k], m.slots[q].data[0][pos*k:(pos+1)*k])
	}
	m.finish()
	return nil
}

// Broadcast copies the buffer of the member at position root into every
// other member's buf. root is a group position, not a global rank.
func (c *Local) Broadcast(g runtime.Group, rank, root int, dt ir.DType, buf []byte) error {
	bad := broadcastArgs(g, root, dt, buf)
	m, pos, err := c.join(g, rank, slot{op: opBroadcast, dt: dt, lens: []int{len(buf)}, root: root, data: [][]byte{buf}, err: own(opBroadcast, g, rank, bad)})
	if err != nil {
		return err
	}
	if pos != root {
		copy(buf, m.slots[root].data[0])
	}
	m.finish()
	return nil
}

// Barrier returns once every member of g has called it.
func (c *Local) Barrier(g runtime.Group, rank int) error {
	_, _, err := c.join(g, rank, slot{op: opBarrier})
	return err
}

// p2pKey matches a Send with its Recv.
type p2pKey struct{ from, to, tag int }

// message is a sent buffer no Recv has taken yet.
type message struct {
	dt   ir.DType
	data []byte
}

// recvWait is a Recv waiting for its Send.
type recvWait struct {
	dt     ir.DType
	buf    []byte
	filled bool // guarded by Local.mu: a Send has taken it
	err    error
	done   chan struct{} // closed by the Send after the copy
}

// p2pCheck validates a Send or Recv's ranks and buffer.
func (c *Local) p2pCheck(where func() string, from, to int, dt ir.DType, n int) error {
	for _, r := range []int{from, to} {
		if r < 0 || r >= c.size {
			return fmt.Errorf("%s: %w: rank %d is outside [0,%d)", where(), runtime.ErrGroup, r, c.size)
		}
	}
	if from == to {
		return fmt.Errorf("%s: %w: a device cannot send to itself", where(), runtime.ErrArgs)
	}
	if err := checkElems(dt, "buf", n); err != nil {
		return fmt.Errorf("%s: %w", where(), err)
	}
	return nil
}

// matchError is the verdict on a Send and the Recv it met.
func matchError(k p2pKey, sendDT ir.DType, sendN int, recvDT ir.DType, recvN int) error {
	switch {
	case sendDT != recvDT:
		return fmt.Errorf("Send/Recv from rank %d to rank %d (tag %d): %w on the element type: Send passes %v but Recv expects %v", k.from, k.to, k.tag, runtime.ErrMismatch, sendDT, recvDT)
	case sendN != recvN:
		return fmt.Errorf("Send/Recv from rank %d to rank %d (tag %d): %w on the length: Send passes %d elements but Recv expects %d", k.from, k.to, k.tag, runtime.ErrMismatch, elems(sendDT, sendN), elems(recvDT, recvN))
	}
	return nil
}

// Send posts a copy of buf for the Recv with the same from, to and tag
// and returns at once. Sends on one key are received in FIFO order.
func (c *Local) Send(from, to, tag int, dt ir.DType, buf []byte) error {
	where := func() string { return fmt.Sprintf("Send from rank %d to rank %d (tag %d)", from, to, tag) }
	key := p2pKey{from, to, tag}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abortErr != nil {
		return c.abortedLocked(where())
	}
	if err := c.p2pCheck(where, from, to, dt, len(buf)); err != nil {
		return err
	}
	if q := c.waits[key]; len(q) > 0 {
		w := q[0]
		q[0] = nil
		if len(q) == 1 {
			delete(c.waits, key)
		} else {
			c.waits[key] = q[1:]
		}
		w.filled = true
		w.err = matchError(key, dt, len(buf), w.dt, len(w.buf))
		if w.err == nil {
			copy(w.buf, buf)
			c.add(opSendRecv, int64(len(buf)))
		}
		close(w.done)
		return w.err
	}
	c.mail[key] = append(c.mail[key], message{dt: dt, data: append([]byte(nil), buf...)})
	return nil
}

// Recv waits for the next Send with the same from, to and tag and copies
// its buffer into buf; the lengths and element types must match.
func (c *Local) Recv(from, to, tag int, dt ir.DType, buf []byte) error {
	where := func() string { return fmt.Sprintf("Recv from rank %d to rank %d (tag %d)", from, to, tag) }
	key := p2pKey{from, to, tag}
	c.mu.Lock()
	if err := c.p2pCheck(where, from, to, dt, len(buf)); err != nil {
		c.mu.Unlock()
		return err
	}
	if q := c.mail[key]; len(q) > 0 {
		msg := q[0]
		q[0] = message{}
		if len(q) == 1 {
			delete(c.mail, key)
		} else {
			c.mail[key] = q[1:]
		}
		c.mu.Unlock()
		if err := matchError(key, msg.dt, len(msg.data), dt, len(buf)); err != nil {
			return err
		}
		copy(buf, msg.data)
		c.add(opSendRecv, int64(len(buf)))
		return nil
	}
	if c.abortErr != nil {
		defer c.mu.Unlock()
		return c.abortedLocked(where())
	}
	w := &recvWait{dt: dt, buf: buf, done: make(chan struct{})}
	c.waits[key] = append(c.waits[key], w)
	c.mu.Unlock()
	expired, stop := c.timer()
	defer stop()
	var cause error
	select {
	case <-w.done:
		return w.err
	case <-c.abortCh:
	case <-expired:
		cause = fmt.Errorf("%s: %w after %v waiting for rank %d", where(), runtime.ErrTimeout, c.timeout, from)
	}
	c.mu.Lock()
	if w.filled {
		// The Send is copying into buf right now.
		c.mu.Unlock()
		<-w.done
		return w.err
	}
	q := c.waits[key]
	for i, o := range q {
		if o == w {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(c.waits, key)
	} else {
		c.waits[key] = q
	}
	if cause == nil {
		defer c.mu.Unlock()
		return c.abortedLocked(where())
	}
	c.mu.Unlock()
	c.Abort(cause)
	return cause
}

// Pending is the number of messages sent and not yet received: zero
// between the steps of a program whose sends all have their receives.
func (c *Local) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, q := range c.mail {
		n += len(q)
	}
	return n
}
