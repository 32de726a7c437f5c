package comm

import (
	"fmt"
	"sync"
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

// frame is one received message: its header and payload.
type frame struct {
	hdr  header
	data []byte
}

// box holds messages that arrived before anyone asked for them and
// receivers waiting for messages that have not arrived. Messages on one
// key are taken in arrival order (a connection delivers in send order).
type box struct {
	mu      sync.Mutex
	queued  map[msgKey][]frame
	waiting map[msgKey][]chan struct{}
	// broken is non-nil once every wait must end (an abort): why.
	broken error
	// gone maps a process index to why it can no longer send.
	gone map[int]error
	// wake is every registered waiter, signalled on abort or a lost peer.
	wake map[chan struct{}]struct{}
}

func newBox() *box {
	return &box{
		queued:  map[msgKey][]frame{},
		waiting: map[msgKey][]chan struct{}{},
		gone:    map[int]error{},
		wake:    map[chan struct{}]struct{}{},
	}
}

// put files a message and wakes its receiver.
func (b *box) put(k msgKey, f frame) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queued[k] = append(b.queued[k], f)
	if ws := b.waiting[k]; len(ws) > 0 {
		signal(ws[0])
	}
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
	for ch := range b.wake {
		signal(ch)
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
	for ch := range b.wake {
		signal(ch)
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
	ch := make(chan struct{}, 1)
	b.waiting[k] = append(b.waiting[k], ch)
	b.wake[ch] = struct{}{}
	b.mu.Unlock()
	defer b.forget(k, ch)
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	for {
		b.mu.Lock()
		if ws := b.waiting[k]; len(ws) > 0 && ws[0] == ch {
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
		case <-ch:
		case <-expired:
			b.mu.Lock()
			defer b.mu.Unlock()
			if ws := b.waiting[k]; len(ws) > 0 && ws[0] == ch {
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

// forget removes a finished waiter and passes any message already queued
// on its key to the next one.
func (b *box) forget(k msgKey, ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.wake, ch)
	ws := b.waiting[k]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(b.waiting, k)
		return
	}
	b.waiting[k] = ws
	if len(b.queued[k]) > 0 {
		signal(ws[0])
	}
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
