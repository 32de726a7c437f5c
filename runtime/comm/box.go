package comm

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gcompile/runtime"
)

// msgKey addresses one message: its sender and receiver ranks and where
// it belongs, a collective's (group, sequence number, phase) or a send's
// tag.
type msgKey struct {
	from, to int32
	kind     uint8
	phase    uint8
	group    uint64 // hash of the group's key; 0 for point-to-point
	seq      int64  // collective sequence number, or the send's tag
}

// frame is one received message: its header and payload. The payload
// lives in a pooled buffer (pb, nil when it is not pooled), which the
// receiver gives back with release once it has read it, or, for a frame
// inPlace, already where its receiver's sink put it (data is nil).
type frame struct {
	hdr     header
	data    []byte
	pb      *[]byte
	inPlace bool
}

// size is the payload's length, wherever it is.
func (f *frame) size() int {
	if f.inPlace {
		return int(f.hdr.length)
	}
	return len(f.data)
}

// release gives the frame's buffer back to the pool.
func (f *frame) release() {
	putBuf(f.pb)
	f.pb, f.data = nil, nil
}

// waiter is a receiver blocked in take: the channel that wakes it and the
// timer that bounds its wait. Both are reused from one wait to the next,
// since most receives find their message not there yet and a new channel
// and timer per receive were a good part of a small message's cost.
type waiter struct {
	ch chan struct{}
	t  *time.Timer
}

var waiters = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}

// expire arms the waiter's timer (nil channel: no timeout).
func (w *waiter) expire(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	if w.t == nil {
		w.t = time.NewTimer(d)
	} else {
		w.t.Reset(d)
	}
	return w.t.C
}

// recycle disarms the waiter and returns it to the pool. Since Go 1.23 a
// stopped timer delivers nothing stale; a wake token left in the channel
// is drained.
func (w *waiter) recycle() {
	if w.t != nil {
		w.t.Stop()
	}
	select {
	case <-w.ch:
	default:
	}
	waiters.Put(w)
}

// box holds messages that arrived before anyone asked for them and
// receivers waiting for messages that have not arrived. Messages on one
// key are taken in arrival order (a connection delivers in send order).
type box struct {
	mu      sync.Mutex
	queued  map[msgKey][]frame
	waiting map[msgKey][]*waiter
	// broken is non-nil once every wait must end (an abort): why.
	broken error
	// gone maps a process index to why it can no longer send.
	gone map[int]error
	// wake is every registered waiter, signalled on abort or a lost peer.
	wake map[*waiter]struct{}
	// sinks are the destinations receivers registered for keys.
	sinks map[msgKey]*sink
	// grace is how long unexpect lets a write into a sink run before it
	// kicks it (sinkGrace; tests shorten it).
	grace time.Duration
}

func newBox() *box {
	return &box{
		queued:  map[msgKey][]frame{},
		waiting: map[msgKey][]*waiter{},
		gone:    map[int]error{},
		wake:    map[*waiter]struct{}{},
		sinks:   map[msgKey]*sink{},
		grace:   sinkGrace,
	}
}

// put files a message and wakes its receiver.
func (b *box) put(k msgKey, f frame) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sinks[k]; s != nil {
		s.off += f.size()
	}
	b.queueLocked(k, f)
}

func (b *box) queueLocked(k msgKey, f frame) {
	b.queued[k] = append(b.queued[k], f)
	if ws := b.waiting[k]; len(ws) > 0 {
		signal(ws[0].ch)
	}
}

// A sink is where a receiver wants a message's payload: the frames on its
// key are then written straight into it, by the connection's reader (or
// a sender in this process), rather than into a buffer that the receiver
// copies out of. This saves a pass over the data, and the buffer memory,
// for every message whose receiver is waiting; it matters for large ones,
// whose buffered chunks have left the cache by the time they are copied.
//
// The box still orders everything: a frame written in place leaves an
// inPlace frame in the queue, taken like any other in FIFO order, and a
// frame the sink cannot take (its header is not the one expected, its
// region may not be written yet) is queued as usual, for the receiver to
// copy or reject. Either way the sink's offset moves past it, so each
// frame's place is fixed by its order of arrival, as the receiver counts.
type sink struct {
	bufs  [][]byte // the destination: their concatenation
	base  int      // where the message starts in it
	size  int      // the message's length
	chunk int      // the payload of its frames but the last
	// want is what the frames' headers must say: kind, op, dtype and
	// the agreed values.
	want header
	// written, if not nil, bounds the region that may be overwritten: a
	// collective receives into memory it sent from, which must have gone
	// out first.
	written *atomic.Int64

	off     int           // where the next frame on the key belongs
	busy    chan struct{} // non-nil while a frame is being written in; closed after
	kick    func()        // ends a write in that hangs (fails the reader's connection)
	dropped bool          // the receiver is gone: write nothing more
}

// accepts reports whether h may be written in at the sink's offset.
func (s *sink) accepts(h header) bool {
	n := int(h.length)
	w := s.want
	return n > 0 && n == min(s.size-s.off, s.chunk) &&
		h.kind == w.kind && h.op == w.op && h.dtype == w.dtype && h.agree1 == w.agree1 && h.agree2 == w.agree2 &&
		(s.written == nil || s.written.Load() >= int64(s.off+n))
}

// expect registers s as the destination of the frames on k and reports
// whether it did. Frames already queued are the receiver's to copy: the
// sink starts after them. A key another receiver waits on (or has a sink
// for) gets none, since which of them a frame is for is only known when
// one takes it.
func (b *box) expect(k msgKey, s *sink) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sinks[k] != nil || len(b.waiting[k]) > 0 {
		return false
	}
	for i := range b.queued[k] {
		s.off += b.queued[k][i].size()
	}
	b.sinks[k] = s
	return true
}

// sinkGrace is how long unexpect lets a frame being written into a sink
// finish before it kicks the reader writing it: only a peer that stops
// halfway through a frame, without closing its connection, takes that
// long.
const sinkGrace = 5 * time.Second

// unexpect withdraws a sink and returns once nothing writes into it any
// more, so that its receiver may return and its caller reuse the memory.
func (b *box) unexpect(k msgKey, s *sink) {
	b.mu.Lock()
	if b.sinks[k] == s {
		delete(b.sinks, k)
	}
	s.dropped = true
	busy, kick := s.busy, s.kick
	b.mu.Unlock()
	if busy == nil {
		return
	}
	t := time.NewTimer(b.grace)
	defer t.Stop()
	select {
	case <-busy:
	case <-t.C:
		if kick != nil {
			kick()
		}
		<-busy
	}
}

// claim reserves the sink on k for an arriving frame with header h and
// returns the pieces of memory its payload goes to; nil if the frame must
// be queued instead. kick ends the write if it hangs. The caller fills the
// pieces and then calls filled.
func (b *box) claim(k msgKey, h header, kick func()) (*sink, [][]byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sinks[k]
	if s == nil || s.busy != nil || !s.accepts(h) {
		return nil, nil
	}
	s.busy, s.kick = make(chan struct{}), kick
	at := s.base + s.off
	return s, spans(s.bufs, at, at+int(h.length))
}

// filled ends a claim: the payload is in place (err nil), or the write
// failed and the frame is lost with its connection.
func (b *box) filled(k msgKey, s *sink, h header, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(s.busy)
	s.busy, s.kick = nil, nil
	if err != nil || s.dropped {
		return
	}
	s.off += int(h.length)
	b.queueLocked(k, frame{hdr: h, inPlace: true})
}

// signal wakes a waiter without blocking: its channel holds one token.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// fail ends every wait: err is the reason each reports.
func (b *box) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken == nil {
		b.broken = err
	}
	for w := range b.wake {
		signal(w.ch)
	}
}

// lose marks process proc as unable to send any more messages and wakes
// everyone, so that those waiting on it fail at once.
func (b *box) lose(proc int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.gone[proc]; !ok {
		b.gone[proc] = err
	}
	for w := range b.wake {
		signal(w.ch)
	}
}

// take waits for the next message on k from a rank of process fromProc.
// A message that arrived before an abort or the loss of its sender is
// still delivered; only a wait for one that cannot come fails.
func (b *box) take(k msgKey, fromProc int, timeout time.Duration, what func() string) (frame, error) {
	b.mu.Lock()
	if f, ok := b.popLocked(k); ok {
		b.mu.Unlock()
		return f, nil
	}
	w := waiters.Get().(*waiter)
	b.waiting[k] = append(b.waiting[k], w)
	b.wake[w] = struct{}{}
	b.mu.Unlock()
	defer b.forget(k, w)
	expired := w.expire(timeout)
	for {
		b.mu.Lock()
		if ws := b.waiting[k]; len(ws) > 0 && ws[0] == w {
			if f, ok := b.popLocked(k); ok {
				b.mu.Unlock()
				return f, nil
			}
		}
		if err := b.broken; err != nil {
			b.mu.Unlock()
			return frame{}, err
		}
		if err, ok := b.gone[fromProc]; ok {
			b.mu.Unlock()
			return frame{}, err
		}
		b.mu.Unlock()
		select {
		case <-w.ch:
		case <-expired:
			b.mu.Lock()
			defer b.mu.Unlock()
			if ws := b.waiting[k]; len(ws) > 0 && ws[0] == w {
				if f, ok := b.popLocked(k); ok {
					return f, nil
				}
			}
			return frame{}, fmt.Errorf("%w after %v %s", runtime.ErrTimeout, timeout, what())
		}
	}
}

// popLocked takes the oldest message on k.
func (b *box) popLocked(k msgKey) (frame, bool) {
	q := b.queued[k]
	if len(q) == 0 {
		return frame{}, false
	}
	f := q[0]
	q[0] = frame{}
	if len(q) == 1 {
		delete(b.queued, k)
	} else {
		b.queued[k] = q[1:]
	}
	return f, true
}

// forget removes a finished waiter, passes any message already queued on
// its key to the next one and recycles the waiter.
func (b *box) forget(k msgKey, w *waiter) {
	b.mu.Lock()
	delete(b.wake, w)
	ws := b.waiting[k]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(b.waiting, k)
	} else {
		b.waiting[k] = ws
		if len(b.queued[k]) > 0 {
			signal(ws[0].ch)
		}
	}
	b.mu.Unlock()
	w.recycle()
}

// pending counts messages no one has taken.
func (b *box) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, q := range b.queued {
		n += len(q)
	}
	return n
}
