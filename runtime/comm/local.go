package cpu

// This file is the in-process collective layer: N virtual devices, one
// goroutine each, exchange data through a Comm instead of a network. The
// semantics follow NCCL's (collectives are matched by call order within a
// group, Send/Recv pairs by (from, to, tag)), so a program that runs here
// runs unchanged on a real fabric; what this implementation adds is that
// every reduction is bit-reproducible and that disagreements between
// members fail every member with the same error instead of deadlocking.

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Float is the element type collectives move.
type Float interface{ ~float32 | ~float64 }

// Errors a Comm call can wrap; the message around them names the call, the
// group, the ranks involved and the rule that was broken.
var (
	// ErrAborted marks a call that failed because Abort was called; the
	// error also wraps the cause handed to Abort.
	ErrAborted = errors.New("comm aborted")
	// ErrGroup marks an invalid group, a rank outside the comm or a caller
	// that is not a member of the group it names.
	ErrGroup = errors.New("invalid group")
	// ErrArgs marks a member whose own arguments break a rule (a length
	// that does not fit the group, a root outside it, overlapping buffers).
	// Every member of that collective gets the same error, so none hangs.
	ErrArgs = errors.New("invalid arguments")
	// ErrMismatch marks members of one collective, or the two sides of a
	// Send/Recv pair, that disagree: on the collective, the element type,
	// a length or the root.
	ErrMismatch = errors.New("members disagree")
)

// Group is an ordered set of global device ranks. A member's position in
// Ranks is its rank within the group; reductions add contributions in
// position order, whatever order members arrive in, so runs are bit-reproducible.
type Group struct{ Ranks []int }

// Pos is rank's position in the group, or -1 if it is not a member.
func (g Group) Pos(rank int) int {
	for i, r := range g.Ranks {
		if r == rank {
			return i
		}
	}
	return -1
}

// Size is the number of members.
func (g Group) Size() int { return len(g.Ranks) }

// String prints the ranks in position order, e.g. "[0 2 5]".
func (g Group) String() string { return fmt.Sprint(g.Ranks) }

// CommStats counts completed operations, for metrics. A collective counts
// once however many members it has; a failed one does not count.
type CommStats struct {
	AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast, Barrier int64
	// SendRecv counts matched Send/Recv pairs.
	SendRecv int64
	// Bytes is the payload handed in by all members together: for
	// AllReduce, ReduceScatter, AllGather and AllToAll every member's input,
	// for Broadcast the root's buffer, for a Send/Recv pair the sent buffer.
	Bytes int64
}

// op names a collective (and, for Stats, the point-to-point pair).
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

func (o op) String() string { return opNames[o] }

// Comm connects a fixed number of in-process devices.
//
// One mutex guards all matching state; it is held only to register an
// arrival, never while data is copied or reduced, so independent groups
// run concurrently and contend only for those few instructions.
type Comm struct {
	devices int

	mu       sync.Mutex
	groups   map[string]*groupState // by groupKey of the rank list
	sends    map[p2pKey][]*p2pOp    // Sends waiting for their Recv, FIFO per key
	recvs    map[p2pKey][]*p2pOp    // Recvs waiting for their Send, FIFO per key
	abortErr error                  // the first cause handed to Abort
	abortCh  chan struct{}          // closed by the first Abort

	calls [numOps]atomic.Int64
	bytes atomic.Int64
}

// NewComm makes a comm for devices devices, ranks 0..devices-1. With
// devices <= 0 every call fails, since no rank is valid.
func NewComm(devices int) *Comm {
	return &Comm{
		devices: devices,
		groups:  map[string]*groupState{},
		sends:   map[p2pKey][]*p2pOp{},
		recvs:   map[p2pKey][]*p2pOp{},
		abortCh: make(chan struct{}),
	}
}

// Devices is the number of devices the comm connects.
func (c *Comm) Devices() int { return c.devices }

// Abort wakes every member blocked in any collective or Recv with err (wrapped) and makes all later calls fail
// fast with it; a device whose step failed calls it so the others do not hang.
//
// Only the first cause is kept: later Aborts are usually the other devices
// reporting the first failure back. A collective whose members had all
// arrived before the Abort still completes, because its members may
// already be reading one another's buffers.
func (c *Comm) Abort(err error) {
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

// Stats counts per collective kind and total bytes moved (sent by all members), for metrics.
func (c *Comm) Stats() CommStats {
	return CommStats{
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

// abortedLocked is the error for a call made after, or woken by, Abort.
func (c *Comm) abortedLocked(where string) error {
	return fmt.Errorf("%s: %w: %w", where, ErrAborted, c.abortErr)
}

func (c *Comm) aborted(where string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.abortedLocked(where)
}

// groupState is the matching state of one distinct rank list.
type groupState struct {
	ranks []int
	posOf []int // global rank -> position, -1 for non-members
	// next is each member's next sequence number: the k-th collective call
	// of every member meets the k-th calls of the others.
	next     []uint64
	meetings map[uint64]*meeting
}

// groupKey encodes a rank list so that equal lists, and only they, share
// matching state.
func groupKey(buf []byte, ranks []int) []byte {
	for i, r := range ranks {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendInt(buf, int64(r), 10)
	}
	return buf
}

// groupLocked finds or creates g's state. A group is validated once, when
// its state is created; states are kept only for valid groups.
func (c *Comm) groupLocked(g Group) (*groupState, error) {
	var a [64]byte
	key := groupKey(a[:0], g.Ranks)
	if gs, ok := c.groups[string(key)]; ok {
		return gs, nil
	}
	if len(g.Ranks) == 0 {
		return nil, fmt.Errorf("%w: the group has no members", ErrGroup)
	}
	posOf := make([]int, max(c.devices, 0))
	for i := range posOf {
		posOf[i] = -1
	}
	for p, r := range g.Ranks {
		if r < 0 || r >= c.devices {
			return nil, fmt.Errorf("%w: rank %d at position %d is outside [0,%d)", ErrGroup, r, p, c.devices)
		}
		if q := posOf[r]; q >= 0 {
			return nil, fmt.Errorf("%w: rank %d appears twice, at positions %d and %d", ErrGroup, r, q, p)
		}
		posOf[r] = p
	}
	gs := &groupState{
		ranks:    append([]int(nil), g.Ranks...),
		posOf:    posOf,
		next:     make([]uint64, len(g.Ranks)),
		meetings: map[uint64]*meeting{},
	}
	c.groups[string(key)] = gs
	return gs, nil
}

// slot is what one member brings to a meeting.
type slot struct {
	op   op
	elem reflect.Type // nil for Barrier
	// lens are the lengths members must agree on (see lenName): each
	// bucket buffer for AllReduce, len(buf) for Broadcast, len(in) and
	// len(out) for the others, len(out) first for ReduceScatter.
	lens []int
	root int // Broadcast only
	data any // [][]T for AllReduce, []T (the input) otherwise
	// err is this member's own rule violation, found before it arrived; it
	// still arrives so that the others fail with it instead of hanging.
	err error
	// part is the member's share of an AllReduce result, []T, published
	// before it counts itself done.
	part any
}

// meeting is one collective of one group: the k-th call of every member.
type meeting struct {
	ranks   []int
	seq     uint64
	slots   []slot        // by position
	arrived int           // guarded by Comm.mu
	ready   chan struct{} // closed by the last arrival once err is set
	err     error         // the verdict on the arguments, the same for all
	pending atomic.Int64  // members still reading the others' slots
	done    chan struct{} // closed when pending reaches zero
}

// join registers the caller's arrival at its group's next collective and
// waits for the other members. On success every member has arrived, the
// arguments agree and the caller may read every slot.
func (c *Comm) join(g Group, rank int, s slot) (*meeting, int, error) {
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
	if rank < 0 || rank >= c.devices {
		c.mu.Unlock()
		return nil, 0, fmt.Errorf("%s: %w: rank %d is outside [0,%d)", where(), ErrGroup, rank, c.devices)
	}
	pos := gs.posOf[rank]
	if pos < 0 {
		c.mu.Unlock()
		return nil, 0, fmt.Errorf("%s: %w: rank %d is not a member of the group", where(), ErrGroup, rank)
	}
	seq := gs.next[pos]
	gs.next[pos]++
	m := gs.meetings[seq]
	if m == nil {
		m = &meeting{
			ranks: gs.ranks,
			seq:   seq,
			slots: make([]slot, len(gs.ranks)),
			ready: make(chan struct{}),
			done:  make(chan struct{}),
		}
		m.pending.Store(int64(len(gs.ranks)))
		gs.meetings[seq] = m
	}
	m.slots[pos] = s
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
		select {
		case <-m.ready:
		case <-c.abortCh:
			// A full meeting goes ahead regardless: its last arrival is
			// about to open it and the others will read this member's
			// buffers, so this member must stay until they are done.
			c.mu.Lock()
			full := m.arrived == len(m.slots)
			c.mu.Unlock()
			if !full {
				return nil, 0, c.aborted(where())
			}
			<-m.ready
		}
	}
	if m.err != nil {
		return nil, 0, m.err
	}
	return m, pos, nil
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
				m.seq, m.ranks, ErrMismatch, m.ranks[0], s0.op, m.ranks[p], p, s.op)
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
		if s.elem != s0.elem {
			return fmt.Errorf("%s: %w on the element type: rank %d (position 0) passes %v but rank %d (position %d) passes %v",
				where, ErrMismatch, m.ranks[0], s0.elem, m.ranks[p], p, s.elem)
		}
		if len(s.lens) != len(s0.lens) {
			return fmt.Errorf("%s: %w on the bucket: rank %d (position 0) passes %d buffers but rank %d (position %d) passes %d",
				where, ErrMismatch, m.ranks[0], len(s0.lens), m.ranks[p], p, len(s.lens))
		}
		for i := range s.lens {
			if s.lens[i] != s0.lens[i] {
				return fmt.Errorf("%s: %w on %s: rank %d (position 0) passes %d elements but rank %d (position %d) passes %d",
					where, ErrMismatch, lenName(s0.op, i), m.ranks[0], s0.lens[i], m.ranks[p], p, s.lens[i])
			}
		}
		if s.root != s0.root {
			return fmt.Errorf("%s: %w on the root: rank %d (position 0) names position %d but rank %d (position %d) names position %d",
				where, ErrMismatch, m.ranks[0], s0.root, m.ranks[p], p, s.root)
		}
	}
	return nil
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
func (c *Comm) count(m *meeting) {
	s0 := &m.slots[0]
	c.calls[s0.op].Add(1)
	if s0.elem == nil {
		return
	}
	var elems int
	switch s0.op {
	case opAllReduce:
		for _, n := range s0.lens {
			elems += n
		}
		elems *= len(m.slots)
	case opBroadcast:
		elems = s0.lens[0]
	case opReduceScatter:
		elems = s0.lens[1] * len(m.slots)
	default:
		elems = s0.lens[0] * len(m.slots)
	}
	c.bytes.Add(int64(elems) * int64(s0.elem.Size()))
}

// argError is a member's own rule violation, named from its point of view.
func argError(o op, g Group, rank int, format string, args ...any) error {
	return fmt.Errorf("%v on group %v by rank %d: %w: %s", o, g, rank, ErrArgs, fmt.Sprintf(format, args...))
}

// overlap reports whether a and b share any element.
func overlap[T any](a, b []T) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	size := unsafe.Sizeof(a[0])
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b))*size && b0 < a0+uintptr(len(a))*size
}

// same reports whether a and b are the very same elements.
func same[T any](a, b []T) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// add accumulates src into dst, one rounding in T per element, so that
// repeated calls build ((x0 + x1) + x2) + ... exactly.
func add[T Float](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// reduceSpan adds (or, for the first member, copies) the elements
// [lo, lo+len(dst)) of the concatenation of bufs into dst.
func reduceSpan[T Float](dst []T, bufs [][]T, lo int, first bool) {
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
		if first {
			copy(dst[:k], seg[:k])
		} else {
			add(dst[:k], seg[:k])
		}
		dst = dst[k:]
	}
}

// AllReduce sums bufs in place: every member's bufs[i] becomes the sum over
// members, added in group position order in T. Several bufs form one
// bucket and cost one rendezvous; all members must pass the same number of
// buffers with the same lengths, and a member's buffers must not overlap
// one another.
//
// Each member reduces a 1/n share of the bucket (the concatenation of
// bufs) from everyone's buffers into a private slice; once all shares are
// done, every member copies all of them out. No member writes its buffers
// while another may still read them, and each element is summed by exactly
// one member in a fixed order, so the result is the same bits however the
// goroutines are scheduled.
func AllReduce[T Float](c *Comm, g Group, rank int, bufs ...[]T) error {
	lens := make([]int, len(bufs))
	total := 0
	for i, b := range bufs {
		lens[i] = len(b)
		total += len(b)
	}
	m, pos, err := c.join(g, rank, slot{op: opAllReduce, elem: reflect.TypeFor[T](), lens: lens, data: bufs})
	if err != nil {
		return err
	}
	n := len(m.slots)
	if n == 1 {
		// The sum of one contribution is itself.
		m.finish()
		return nil
	}
	lo, hi := pos*total/n, (pos+1)*total/n
	part := make([]T, hi-lo)
	for q := range m.slots {
		reduceSpan(part, m.slots[q].data.([][]T), lo, q == 0)
	}
	m.slots[pos].part = part
	m.finish()
	bi, bo := 0, 0
	for q := range m.slots {
		for p := m.slots[q].part.([]T); len(p) > 0; {
			for bo == len(bufs[bi]) {
				bi, bo = bi+1, 0
			}
			k := copy(bufs[bi][bo:], p)
			p, bo = p[k:], bo+k
		}
	}
	return nil
}

// ReduceScatter sums the members' in and leaves this member's chunk of the
// sum in out: len(in) = g.Size()*len(out) and out = Σ over members, in
// position order, of in[pos*len(out):(pos+1)*len(out)] for the caller's
// position pos. out must not overlap in, except as exactly that chunk of in
// (NCCL's in-place form).
func ReduceScatter[T Float](c *Comm, g Group, rank int, in, out []T) error {
	n, k := g.Size(), len(out)
	var bad error
	inPlace := false
	switch p := g.Pos(rank); {
	case len(in) != n*k:
		bad = argError(opReduceScatter, g, rank, "len(in) is %d, want group size %d × len(out) %d = %d", len(in), n, k, n*k)
	case p >= 0 && same(out, in[p*k:(p+1)*k]):
		inPlace = k > 0
	case overlap(in, out):
		bad = argError(opReduceScatter, g, rank, "out overlaps in other than as in's own chunk [%d:%d] (the in-place form)", p*k, (p+1)*k)
	}
	m, pos, err := c.join(g, rank, slot{op: opReduceScatter, elem: reflect.TypeFor[T](), lens: []int{k, len(in)}, data: in, err: bad})
	if err != nil {
		return err
	}
	dst := out
	if inPlace {
		dst = make([]T, k)
	}
	for q := range m.slots {
		src := m.slots[q].data.([]T)[pos*k : (pos+1)*k]
		if q == 0 {
			copy(dst, src)
		} else {
			add(dst, src)
		}
	}
	m.finish()
	if inPlace {
		copy(out, dst)
	}
	return nil
}

// AllGather concatenates the members' in in position order:
// len(out) = g.Size()*len(in) and out[p*len(in):(p+1)*len(in)] is member
// p's in. in must not overlap out, except as exactly the caller's own chunk
// of out (NCCL's in-place form).
func AllGather[T Float](c *Comm, g Group, rank int, in, out []T) error {
	n, k := g.Size(), len(in)
	var bad error
	inPlace := false
	switch p := g.Pos(rank); {
	case len(out) != n*k:
		bad = argError(opAllGather, g, rank, "len(out) is %d, want group size %d × len(in) %d = %d", len(out), n, k, n*k)
	case p >= 0 && same(in, out[p*k:(p+1)*k]):
		inPlace = true
	case overlap(in, out):
		bad = argError(opAllGather, g, rank, "in overlaps out other than as out's own chunk [%d:%d] (the in-place form)", p*k, (p+1)*k)
	}
	m, pos, err := c.join(g, rank, slot{op: opAllGather, elem: reflect.TypeFor[T](), lens: []int{k, len(out)}, data: in, err: bad})
	if err != nil {
		return err
	}
	for q := range m.slots {
		if q == pos && inPlace {
			continue
		}
		copy(out[q*k:(q+1)*k], m.slots[q].data.([]T))
	}
	m.finish()
	return nil
}

// AllToAll exchanges chunks: len(in) = len(out) = g.Size()*chunk, chunk j of
// in goes to member j and chunk p of out comes from member p. in and out
// must not overlap.
func AllToAll[T Float](c *Comm, g Group, rank int, in, out []T) error {
	n := g.Size()
	var bad error
	switch {
	case len(in) != len(out):
		bad = argError(opAllToAll, g, rank, "len(in) is %d but len(out) is %d; they must be equal", len(in), len(out))
	case n > 0 && len(in)%n != 0:
		bad = argError(opAllToAll, g, rank, "len(in) %d is not a multiple of the group size %d", len(in), n)
	case overlap(in, out):
		bad = argError(opAllToAll, g, rank, "in and out overlap")
	}
	m, pos, err := c.join(g, rank, slot{op: opAllToAll, elem: reflect.TypeFor[T](), lens: []int{len(in), len(out)}, data: in, err: bad})
	if err != nil {
		return err
	}
	k := len(in) / n
	for q := range m.slots {
		copy(out[q*k:(q+1)*k], m.slots[q].data.([]T)[pos*k:(pos+1)*k])
	}
	m.finish()
	return nil
}

// Broadcast copies the buffer of the member at position root into every
// other member's buf. root is a group position, not a global rank.
func Broadcast[T Float](c *Comm, g Group, rank, root int, buf []T) error {
	var bad error
	if root < 0 || root >= g.Size() {
		bad = argError(opBroadcast, g, rank, "root position %d is outside the group's [0,%d)", root, g.Size())
	}
	m, pos, err := c.join(g, rank, slot{op: opBroadcast, elem: reflect.TypeFor[T](), lens: []int{len(buf)}, root: root, data: buf, err: bad})
	if err != nil {
		return err
	}
	if pos != root {
		copy(buf, m.slots[root].data.([]T))
	}
	m.finish()
	return nil
}

// Barrier returns once every member of g has called it.
func Barrier(c *Comm, g Group, rank int) error {
	_, _, err := c.join(g, rank, slot{op: opBarrier})
	return err
}

// p2pKey matches a Send with its Recv.
type p2pKey struct{ from, to, tag int }

// p2pOp is one side of a Send/Recv pair waiting for the other.
type p2pOp struct {
	elem    reflect.Type
	buf     any  // []T
	matched bool // guarded by Comm.mu: the other side has taken it
	err     error
	done    chan struct{} // closed by the other side after the copy
}

// Send copies buf to the matching Recv (same from, to and tag) and returns
// once the receiver has taken it: rendezvous semantics, like NCCL send/recv
// pairs. Sends on one key are matched in FIFO order. A device cannot send to
// itself, since both sides block until the other arrives.
func Send[T Float](c *Comm, from, to, tag int, buf []T) error {
	return p2p(c, true, from, to, tag, buf)
}

// Recv blocks until the matching Send (same from, to and tag) arrives and
// copies its buffer into buf; the lengths and element types must match.
func Recv[T Float](c *Comm, from, to, tag int, buf []T) error {
	return p2p(c, false, from, to, tag, buf)
}

func p2p[T Float](c *Comm, send bool, from, to, tag int, buf []T) error {
	name := "Recv"
	if send {
		name = "Send"
	}
	where := func() string { return fmt.Sprintf("%s from rank %d to rank %d (tag %d)", name, from, to, tag) }
	elem := reflect.TypeFor[T]()
	c.mu.Lock()
	if c.abortErr != nil {
		defer c.mu.Unlock()
		return c.abortedLocked(where())
	}
	for _, r := range []int{from, to} {
		if r < 0 || r >= c.devices {
			c.mu.Unlock()
			return fmt.Errorf("%s: %w: rank %d is outside [0,%d)", where(), ErrGroup, r, c.devices)
		}
	}
	if from == to {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w: a device cannot send to itself (Send and Recv each wait for the other)", where(), ErrArgs)
	}
	key := p2pKey{from, to, tag}
	mine, theirs := c.recvs, c.sends
	if send {
		mine, theirs = c.sends, c.recvs
	}
	if q := theirs[key]; len(q) > 0 {
		peer := q[0]
		q[0] = nil
		if len(q) == 1 {
			delete(theirs, key)
		} else {
			theirs[key] = q[1:]
		}
		peer.matched = true
		var err error
		sendElem, recvElem, sendN, recvN := elem, peer.elem, len(buf), lenOf(peer.buf)
		if !send {
			sendElem, recvElem, sendN, recvN = recvElem, sendElem, recvN, sendN
		}
		switch {
		case sendElem != recvElem:
			err = fmt.Errorf("Send/Recv from rank %d to rank %d (tag %d): %w on the element type: Send passes %v but Recv expects %v", from, to, tag, ErrMismatch, sendElem, recvElem)
		case sendN != recvN:
			err = fmt.Errorf("Send/Recv from rank %d to rank %d (tag %d): %w on the length: Send passes %d elements but Recv expects %d", from, to, tag, ErrMismatch, sendN, recvN)
		default:
			c.calls[opSendRecv].Add(1)
			c.bytes.Add(int64(len(buf)) * int64(elem.Size()))
		}
		c.mu.Unlock()
		if err == nil {
			if send {
				copy(peer.buf.([]T), buf)
			} else {
				copy(buf, peer.buf.([]T))
			}
		}
		peer.err = err
		close(peer.done)
		return err
	}
	me := &p2pOp{elem: elem, buf: buf, done: make(chan struct{})}
	mine[key] = append(mine[key], me)
	c.mu.Unlock()
	select {
	case <-me.done:
	case <-c.abortCh:
		c.mu.Lock()
		if !me.matched {
			q := mine[key]
			for i, o := range q {
				if o == me {
					q = append(q[:i], q[i+1:]...)
					break
				}
			}
			if len(q) == 0 {
				delete(mine, key)
			} else {
				mine[key] = q
			}
			defer c.mu.Unlock()
			return c.abortedLocked(where())
		}
		// The other side is copying from or into buf right now.
		c.mu.Unlock()
		<-me.done
	}
	return me.err
}

// lenOf is the length of a slice stored in an any, whatever its element
// type; a mismatched type is reported, so it must not panic here.
func lenOf(buf any) int {
	switch b := buf.(type) {
	case []float32:
		return len(b)
	case []float64:
		return len(b)
	}
	return reflect.ValueOf(buf).Len()
}
