package cpu

import (
	"fmt"
	"sync"
)

// Mailbox carries pipeline transfers between devices. A send copies the
// data and returns at once (like an isend whose buffer is free to reuse); a
// receive waits for its message. Messages between the same two devices with
// the same tag arrive in order. Buffered sends are what make a schedule that
// the simulator proved deadlock-free also deadlock-free here.
type Mailbox struct {
	mu    sync.Mutex
	cond  *sync.Cond
	boxes map[mailKey][][]byte
	err   error
}

type mailKey struct{ from, to, tag int }

// NewMailbox returns an empty mailbox.
func NewMailbox() *Mailbox {
	mb := &Mailbox{boxes: map[mailKey][][]byte{}}
	mb.cond = sync.NewCond(&mb.mu)
	return mb
}

// Send posts a copy of data.
func (mb *Mailbox) Send(from, to, tag int, data []byte) error {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if mb.err != nil {
		return mb.err
	}
	k := mailKey{from, to, tag}
	mb.boxes[k] = append(mb.boxes[k], append([]byte(nil), data...))
	mb.cond.Broadcast()
	return nil
}

// Recv waits for the next message from from to to with tag and copies it
// into data, whose size must match.
func (mb *Mailbox) Recv(from, to, tag int, data []byte) error {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	k := mailKey{from, to, tag}
	for len(mb.boxes[k]) == 0 && mb.err == nil {
		mb.cond.Wait()
	}
	if mb.err != nil {
		return mb.err
	}
	msg := mb.boxes[k][0]
	mb.boxes[k] = mb.boxes[k][1:]
	if len(msg) != len(data) {
		return fmt.Errorf("pipeline transfer %d from device %d to %d: %d bytes sent, %d expected", tag, from, to, len(msg), len(data))
	}
	copy(data, msg)
	return nil
}

// Abort wakes every waiting receiver with err.
func (mb *Mailbox) Abort(err error) {
	mb.mu.Lock()
	if mb.err == nil {
		mb.err = fmt.Errorf("pipeline aborted: %w", err)
	}
	mb.cond.Broadcast()
	mb.mu.Unlock()
}
