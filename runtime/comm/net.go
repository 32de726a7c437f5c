package comm

// This file is the transport between processes: one TCP connection
// between every two processes of a job, a writer and a reader goroutine
// on each, and a box where arriving messages wait for their receivers.
// Ranks held by the same process exchange messages through the box
// directly. Collectives are built from messages between members in the
// direct, order-preserving way: each member sums its own share of a
// reduction from every member's contribution in group-position order, so
// results are the bits Local gives.
//
// What keeps it fast: payloads go in chunks (chunkSize), so that a member
// sums one chunk while the next is on the wire and sends each summed
// chunk back at once; an arriving payload is read straight into the
// memory of a receiver that waits for it (a sink, see box.go) or else
// into a pooled buffer; a reader buffers small frames, and a writer sends
// every frame queued with one writev.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"gcompile/ir"
	"gcompile/runtime"
)

// NetConfig configures a process's end of a Net.
type NetConfig struct {
	// Layout says which ranks every process holds, and which is this one.
	Layout runtime.Layout
	// Token is the job's token: a connection that does not present it is
	// refused.
	Token string
	// Bind is the host this process listens on ("" is 127.0.0.1: a
	// single machine). Advertise is the host the others dial ("": Bind).
	Bind, Advertise string
	// Prefix is prepended to the keys the processes publish their
	// addresses under, so several comms can share one directory.
	Prefix string
	// Timeout bounds every wait for another rank (0: DefaultTimeout).
	Timeout time.Duration
	// Logf, when set, is told of refused connections.
	Logf func(format string, args ...any)
}

// Net connects the ranks of a job spread over processes. Create it in
// every process with NewNet; close it, after the job's final barrier, with
// Close.
type Net struct {
	layout  runtime.Layout
	timeout time.Duration
	box     *box
	peers   []*peer // by process; nil for this one
	chunk   int     // chunkSize, but for tests

	mu       sync.Mutex
	seqs     map[string]int64 // next collective sequence number, by group key and rank
	abortErr error
	closing  atomic.Bool

	counters
}

var _ runtime.Comm = (*Net)(nil)

// peer is the connection to one other process.
type peer struct {
	proc int
	addr string
	conn net.Conn
	n    *Net

	mu      sync.Mutex
	cond    *sync.Cond // signals the writer: frames queued, or stop
	queue   []outFrame
	stopped bool  // the writer has exited
	err     error // why the connection failed, once it has
	bye     atomic.Bool
	done    chan struct{} // closed when the writer exits
}

// outFrame is a frame waiting for the writer: its header, its payload
// pieces and who waits for the write.
type outFrame struct {
	hdr  header
	bufs [][]byte
	// pb is the pooled buffer holding a private copy of the payload (a
	// Send's), given back once written; nil when bufs are the caller's.
	pb *[]byte
	// sent is told when the payload has been written; nil: nobody waits.
	sent *sendGroup
	// written, if not nil, counts the payload bytes written so far.
	written *atomic.Int64
}

// finish reports the frame written (or not, with err) and gives back its
// buffer.
func (f *outFrame) finish(err error) {
	putBuf(f.pb)
	if err == nil && f.written != nil {
		f.written.Add(int64(f.hdr.length))
	}
	if f.sent != nil {
		f.sent.finish(err)
	}
}

// sendGroup counts the frames one collective call has handed to writers
// and keeps the first write error, so that the call can wait until the
// memory it sent from may change. One per call and phase, instead of a
// channel per frame.
type sendGroup struct {
	wg  sync.WaitGroup
	mu  sync.Mutex
	err error
}

func (s *sendGroup) finish(err error) {
	if err != nil {
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
	}
	s.wg.Done()
}

// wait returns once every frame added so far has been written, with the
// first error.
func (s *sendGroup) wait() error {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// NewNet joins this process to the job's comm: it listens, publishes its
// address in dir (the rendezvous store), dials every process with a lower index and accepts the
// others, then returns once it is connected to all of them (or ctx ends).
func NewNet(ctx context.Context, cfg NetConfig, dir runtime.Directory) (*Net, error) {
	if err := cfg.Layout.Check(); err != nil {
		return nil, err
	}
	n := &Net{
		layout:  cfg.Layout,
		timeout: cfg.Timeout,
		box:     newBox(),
		chunk:   chunkSize,
		peers:   make([]*peer, cfg.Layout.Procs),
		seqs:    map[string]int64{},
	}
	if n.timeout == 0 {
		n.timeout = runtime.DefaultTimeout
	}
	if cfg.Layout.Procs == 1 {
		return n, nil
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bind := cfg.Bind
	if bind == "" {
		bind = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(bind, "0"))
	if err != nil {
		return nil, fmt.Errorf("comm: listening on %s: %w", bind, err)
	}
	defer ln.Close()
	advertise := cfg.Advertise
	if advertise == "" {
		advertise = bind
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	me := cfg.Layout.Proc
	addrKey := func(p int) string { return cfg.Prefix + "comm/addr/" + strconv.Itoa(p) }
	if err := dir.Set(ctx, addrKey(me), []byte(net.JoinHostPort(advertise, port))); err != nil {
		return nil, fmt.Errorf("comm: publishing this process's address: %w", err)
	}

	// Accept the processes above this one while dialing those below.
	accepted := make(chan error, 1)
	go func() { accepted <- n.acceptAll(ctx, ln, cfg.Token, logf) }()
	var errs []error
	for p := range me {
		raw, err := dir.Get(ctx, addrKey(p))
		if err != nil {
			errs = append(errs, fmt.Errorf("comm: the address of process %d: %w", p, err))
			break
		}
		if err := n.dial(ctx, p, string(raw), cfg.Token); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(errs) > 0 {
		ln.Close()
	}
	errs = append(errs, <-accepted)
	if err := errors.Join(errs...); err != nil {
		n.closeConns()
		return nil, err
	}
	for _, p := range n.peers {
		if p != nil {
			go p.write()
			go p.read()
		}
	}
	return n, nil
}

func (n *Net) dial(ctx context.Context, p int, addr, token string) error {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.SetDeadline(time.Now().Add(handshakeTimeout))
			err = dialHandshake(c, n.layout.Proc, p, token)
			if err == nil {
				c.SetDeadline(time.Time{})
				n.peers[p] = newPeer(n, p, addr, c)
				return nil
			}
			c.Close()
			if errors.Is(err, errRefused) {
				return fmt.Errorf("comm: process %d at %s: %w", p, addr, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("comm: connecting to process %d at %s: %w (last error: %v)", p, addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// acceptAll takes connections until every process above this one has
// connected. A connection that fails the handshake is refused, logged and
// closed; the others keep being waited for.
func (n *Net) acceptAll(ctx context.Context, ln net.Listener, token string, logf func(string, ...any)) error {
	me, procs := n.layout.Proc, n.layout.Procs
	want := procs - 1 - me
	if want == 0 {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for want > 0 {
		c, err := ln.Accept()
		if err != nil {
			var missing []int
			for p := me + 1; p < procs; p++ {
				if n.peers[p] == nil {
					missing = append(missing, p)
				}
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return fmt.Errorf("comm: process(es) %v never connected: %w", missing, err)
		}
		c.SetDeadline(time.Now().Add(handshakeTimeout))
		p, refusal := acceptHandshake(c, me, procs, token, func(p int) error {
			if p <= me || n.peers[p] != nil {
				return fmt.Errorf("process %d must not dial process %d (or dialed twice)", p, me)
			}
			return nil
		})
		if refusal != nil {
			logf("comm: refused a connection from %s: %v", c.RemoteAddr(), refusal)
			c.Close()
			continue
		}
		c.SetDeadline(time.Time{})
		n.peers[p] = newPeer(n, p, c.RemoteAddr().String(), c)
		want--
	}
	return nil
}

func newPeer(n *Net, proc int, addr string, c net.Conn) *peer {
	p := &peer{proc: proc, addr: addr, conn: c, n: n, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Size is the number of ranks in the job.
func (n *Net) Size() int { return n.layout.Devices }

// Stats counts the operations this process's ranks took part in.
func (n *Net) Stats() runtime.CommStats { return n.stats() }

// Pending is the number of messages that arrived and were not taken.
func (n *Net) Pending() int { return n.box.pending() }

// describe names a process for messages: its index, ranks and address.
func (n *Net) describe(p int) string {
	k := n.layout.PerProc()
	s := fmt.Sprintf("process %d (ranks %d–%d", p, p*k, p*k+k-1)
	if k == 1 {
		s = fmt.Sprintf("process %d (rank %d", p, p*k)
	}
	if pe := n.peers[p]; pe != nil {
		s += " at " + pe.addr
	}
	return s + ")"
}

// enqueue hands a frame to the writer.
func (p *peer) enqueue(f outFrame) {
	p.mu.Lock()
	if p.stopped {
		err := p.err
		p.mu.Unlock()
		f.finish(err)
		return
	}
	p.queue = append(p.queue, f)
	if len(p.queue) == 1 {
		// The writer waits only on an empty queue.
		p.cond.Signal()
	}
	p.mu.Unlock()
}

// A writer takes every frame queued, up to these bounds, and writes them
// with one writev: under load a frame rarely goes alone, and a syscall
// per frame (and a wakeup per frame) dominated small collectives. Large
// frames go one by one, so that each is reported written (and the memory
// it came from may take the reply) as soon as it is.
const (
	maxBatchFrames = 64
	maxBatchBytes  = chunkSize
)

// write sends queued frames in order until the connection fails or the
// comm closes and the queue is empty.
func (p *peer) write() {
	defer close(p.done)
	var (
		batch []outFrame
		hdrs  []byte
		vec   net.Buffers
	)
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && !p.stopped {
			p.cond.Wait()
		}
		if len(p.queue) == 0 {
			p.mu.Unlock()
			return
		}
		k, bytes := 0, 0
		for k < len(p.queue) && k < maxBatchFrames && bytes < maxBatchBytes {
			bytes += int(p.queue[k].hdr.length)
			k++
		}
		if k == len(p.queue) {
			// Swap the slices: the queue refills the drained batch's array.
			batch, p.queue = p.queue, batch[:0]
		} else {
			batch = append(batch[:0], p.queue[:k]...)
			rest := copy(p.queue, p.queue[k:])
			clear(p.queue[rest:])
			p.queue = p.queue[:rest]
		}
		p.mu.Unlock()

		hdrs = slices.Grow(hdrs[:0], len(batch)*headerSize)[:len(batch)*headerSize]
		vec = vec[:0]
		for i := range batch {
			h := hdrs[i*headerSize : (i+1)*headerSize]
			batch[i].hdr.encode(h)
			vec = append(vec, h)
			for _, b := range batch[i].bufs {
				if len(b) > 0 {
					vec = append(vec, b)
				}
			}
		}
		w := vec
		_, err := w.WriteTo(p.conn)
		clear(vec) // keep no reference to the callers' memory
		for i := range batch {
			batch[i].finish(err)
		}
		clear(batch)
		if err != nil {
			p.fail(fmt.Errorf("%w: writing to %s: %w", runtime.ErrPeerLost, p.n.describe(p.proc), err))
			return
		}
	}
}

// fail stops the writer, fails every queued frame and tells the box that
// nothing more comes from this process.
func (p *peer) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	err = p.err
	p.stopped = true
	q := p.queue
	p.queue = nil
	p.cond.Broadcast()
	p.mu.Unlock()
	for i := range q {
		q[i].finish(err)
	}
	p.n.box.lose(p.proc, err)
}

// kick makes a read that hangs fail, and with it the connection: for a
// receiver that must not return while the reader writes into its memory.
func (p *peer) kick() { p.conn.SetReadDeadline(time.Now()) }

// readBufSize is the reader's buffer: one read takes in many small frames
// at once (a header and its payload no longer cost a syscall each), while
// a payload larger than it is read straight into its own buffer.
const readBufSize = 4 << 10

// read files every arriving frame in the box until the connection ends.
func (p *peer) read() {
	n := p.n
	r := bufio.NewReaderSize(p.conn, readBufSize)
	hdr := make([]byte, headerSize)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			switch {
			case p.bye.Load() || n.closing.Load():
				p.fail(fmt.Errorf("%w: %s closed its connection at the end of the job", runtime.ErrPeerLost, n.describe(p.proc)))
			default:
				p.fail(fmt.Errorf("%w: %s: connection lost (%v); the process died or its machine is unreachable", runtime.ErrPeerLost, n.describe(p.proc), err))
			}
			return
		}
		h := decodeHeader(hdr)
		if err := n.checkIncoming(p.proc, h); err != nil {
			p.fail(fmt.Errorf("%w: %s sent a bad frame: %v", runtime.ErrPeerLost, n.describe(p.proc), err))
			p.conn.Close()
			return
		}
		if h.kind == kindColl || h.kind == kindP2P {
			k := keyOf(h)
			if s, dst := n.box.claim(k, h, p.kick); s != nil {
				var err error
				for _, d := range dst {
					if _, err = io.ReadFull(r, d); err != nil {
						break
					}
				}
				n.box.filled(k, s, h, err)
				if err != nil {
					p.fail(fmt.Errorf("%w: %s: connection lost mid-message (%v)", runtime.ErrPeerLost, n.describe(p.proc), err))
					return
				}
				continue
			}
		}
		data, pb := getBuf(int(h.length))
		if _, err := io.ReadFull(r, data); err != nil {
			putBuf(pb)
			p.fail(fmt.Errorf("%w: %s: connection lost mid-message (%v)", runtime.ErrPeerLost, n.describe(p.proc), err))
			return
		}
		switch h.kind {
		case kindAbort:
			why := string(data)
			putBuf(pb)
			n.remoteAbort(p.proc, why)
		case kindBye:
			putBuf(pb)
			p.bye.Store(true)
		default:
			n.box.put(keyOf(h), frame{hdr: h, data: data, pb: pb})
		}
	}
}

// checkIncoming refuses a frame that could not have come from process p:
// an unknown kind, a sender p does not hold, a receiver this process does
// not hold, a length past any buffer.
func (n *Net) checkIncoming(p int, h header) error {
	switch h.kind {
	case kindColl, kindP2P, kindAbort, kindBye:
	default:
		return fmt.Errorf("unknown frame kind %d", h.kind)
	}
	if h.length > maxFrame {
		return fmt.Errorf("payload of %d bytes", h.length)
	}
	if h.kind == kindColl || h.kind == kindP2P {
		from, to := int(h.from), int(h.to)
		if from < 0 || from >= n.layout.Devices || n.layout.ProcOf(from) != p {
			return fmt.Errorf("sender rank %d is not one of its ranks", from)
		}
		if to < 0 || to >= n.layout.Devices || !n.layout.Holds(to) {
			return fmt.Errorf("receiver rank %d is not held here", to)
		}
	}
	return nil
}

func keyOf(h header) msgKey {
	return msgKey{from: h.from, to: h.to, kind: h.kind, phase: h.phase, group: h.group, seq: h.seq}
}

// post delivers a collective's frame: into the box when this process
// holds the receiver (copying the payload into the receiver's sink or a
// pooled buffer, since the sender may reuse its memory), else to the
// receiver's process, whose writer tells sent once the payload is written
// and adds its length to written (if not nil).
func (n *Net) post(h header, bufs [][]byte, sent *sendGroup, written *atomic.Int64) {
	var size int
	for _, b := range bufs {
		size += len(b)
	}
	h.length = uint64(size)
	p := n.layout.ProcOf(int(h.to))
	if p != n.layout.Proc {
		sent.wg.Add(1)
		n.peers[p].enqueue(outFrame{hdr: h, bufs: bufs, sent: sent, written: written})
		return
	}
	k := keyOf(h)
	if s, dst := n.box.claim(k, h, nil); s != nil {
		gather(dst, bufs)
		n.box.filled(k, s, h, nil)
		return
	}
	data, pb := getBuf(size)
	gather([][]byte{data}, bufs)
	n.box.put(k, frame{hdr: h, data: data, pb: pb})
}

// gather copies the concatenation of src into that of dst, as long.
func gather(dst, src [][]byte) {
	var d []byte
	for _, s := range src {
		for len(s) > 0 {
			for len(d) == 0 {
				d, dst = dst[0], dst[1:]
			}
			k := copy(d, s)
			d, s = d[k:], s[k:]
		}
	}
}

// Abort fails every call of this process's ranks, blocked or later, and
// tells every other process, whose calls fail too.
func (n *Net) Abort(err error) {
	if err == nil {
		err = errors.New("Abort was called with a nil error")
	}
	n.abort(err, -1)
}

// remoteAbort is another process's Abort arriving here.
func (n *Net) remoteAbort(p int, why string) {
	n.abort(fmt.Errorf("%s aborted the job: %s", n.describe(p), why), p)
}

// abort keeps the first cause and passes it on to every process but the
// one it came from (from < 0: it arose here). Passing on what was heard
// matters: this process may close its connections next, and a process
// waiting on it must learn why before it sees them close.
func (n *Net) abort(err error, from int) {
	n.mu.Lock()
	first := n.abortErr == nil
	if first {
		n.abortErr = err
	}
	n.mu.Unlock()
	if !first {
		return
	}
	n.box.fail(fmt.Errorf("%w: %w", runtime.ErrAborted, err))
	msg := []byte(err.Error())
	me := int32(n.layout.Lead(n.layout.Proc))
	for q, p := range n.peers {
		if p != nil && q != from {
			p.enqueue(outFrame{hdr: header{kind: kindAbort, from: me, length: uint64(len(msg))}, bufs: [][]byte{msg}})
		}
	}
}

func (n *Net) aborted() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.abortErr != nil {
		return fmt.Errorf("%w: %w", runtime.ErrAborted, n.abortErr)
	}
	return nil
}

// Close says goodbye to every other process, lets the writers send what
// is queued (at most a few seconds), and closes the connections. Call it
// once the job is done with the comm everywhere (after a final barrier),
// so that no process still waits for a message from this one.
func (n *Net) Close() error {
	if n.closing.Swap(true) {
		return nil
	}
	from := int32(n.layout.Lead(n.layout.Proc))
	for _, p := range n.peers {
		if p != nil {
			p.enqueue(outFrame{hdr: header{kind: kindBye, from: from}})
			p.mu.Lock()
			p.stopped = true // the writer drains the queue, then exits
			p.cond.Broadcast()
			p.mu.Unlock()
		}
	}
	deadline := time.After(5 * time.Second)
	for _, p := range n.peers {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-deadline:
		}
	}
	n.closeConns()
	return nil
}

func (n *Net) closeConns() {
	for _, p := range n.peers {
		if p != nil && p.conn != nil {
			p.conn.Close()
		}
	}
}

// call is one rank's part in one collective.
type call struct {
	n     *Net
	g     runtime.Group
	rank  int
	pos   int
	op    op
	dt    ir.DType
	seq   int64
	group uint64
	// agree1, agree2 are what members must agree on besides op and
	// dtype (lengths, a root), sent with every frame.
	agree1, agree2 int64
	// sent counts the frames of each phase handed to writers, so that
	// the call can wait for one phase's writes before it overwrites what
	// that phase sent.
	sent [2]sendGroup
	// written counts, by member, the bytes of phase 0 written to it.
	written []atomic.Int64
}

func (c *call) where() string {
	return fmt.Sprintf("%v on group %v by rank %d (collective #%d)", c.op, c.g, c.rank, c.seq)
}

func groupHash(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// begin checks the group and the caller, and numbers the call. bad is
// the caller's own rule violation (nil: none): the call still takes its
// number, then fails and aborts the job, since the other members wait
// for it.
func (n *Net) begin(g runtime.Group, rank int, o op, dt ir.DType, agree1, agree2 int64, bad error) (*call, error) {
	where := func() string { return fmt.Sprintf("%v on group %v by rank %d", o, g, rank) }
	if err := n.aborted(); err != nil {
		return nil, fmt.Errorf("%s: %w", where(), err)
	}
	if err := g.Check(n.layout.Devices); err != nil {
		return nil, fmt.Errorf("%s: %w", where(), err)
	}
	pos := g.Pos(rank)
	if pos < 0 {
		return nil, fmt.Errorf("%s: %w: rank %d is not a member of the group", where(), runtime.ErrGroup, rank)
	}
	if !n.layout.Holds(rank) {
		return nil, fmt.Errorf("%s: %w: rank %d is held by process %d, not this one (%d)", where(), runtime.ErrGroup, rank, n.layout.ProcOf(rank), n.layout.Proc)
	}
	key := g.Key()
	n.mu.Lock()
	sk := key + "#" + strconv.Itoa(rank)
	seq := n.seqs[sk]
	n.seqs[sk] = seq + 1
	n.mu.Unlock()
	c := &call{n: n, g: g, rank: rank, pos: pos, op: o, dt: dt, seq: seq, group: groupHash(key), agree1: agree1, agree2: agree2}
	if bad != nil {
		return nil, c.fail(fmt.Errorf("%s: %w", c.where(), bad))
	}
	return c, nil
}

// fail aborts the job with the caller's error: the other members are
// waiting for this one, which will not come.
func (c *call) fail(err error) error {
	c.n.Abort(err)
	return err
}

// chunkSize bounds the payload of one collective frame. A member's data
// for another goes out in chunks, so that the receiver reduces (or
// copies) one chunk while the next is on the wire and replies with its
// share's chunk as soon as it is summed, and so that every chunk fits a
// pooled buffer small enough to stay in cache between its arrival and its
// use. It is a multiple of every element size, and every process of a job
// must cut at the same size (Net.chunk; tests make it small).
const chunkSize = 256 << 10

// chunkLen is the length of the chunk at offset off of a size-byte
// payload: chunks of Net.chunk bytes and a shorter last one; a payload of
// no bytes is one empty frame, so that every phase is a message the
// receiver can check.
func (c *call) chunkLen(size, off int) int { return min(size-off, c.n.chunk) }

// send posts one frame, bufs, to the member at position q; wait collects
// the writes.
func (c *call) send(q int, phase uint8, bufs ...[]byte) {
	h := header{kind: kindColl, op: uint8(c.op), dtype: uint8(c.dt), phase: phase,
		from: int32(c.rank), to: int32(c.g.Ranks[q]), group: c.group, seq: c.seq, agree1: c.agree1, agree2: c.agree2}
	var written *atomic.Int64
	if phase == 0 && c.written != nil {
		written = &c.written[q]
	}
	c.n.post(h, bufs, &c.sent[phase], written)
}

// key is the key of the phase's frames from the member at position q.
func (c *call) key(q int, phase uint8) msgKey {
	return msgKey{from: int32(c.g.Ranks[q]), to: int32(c.rank), kind: kindColl, phase: phase, group: c.group, seq: c.seq}
}

// expect registers the concatenation of bufs, from byte base on, as the
// destination of the size bytes the member at position q sends in the
// phase, which recvData then finds in place. written, if not nil, bounds
// what may be overwritten yet. The caller must call the returned func
// before it returns.
func (c *call) expect(q int, phase uint8, bufs [][]byte, base, size int, written *atomic.Int64) func() {
	if size == 0 {
		return func() {}
	}
	k := c.key(q, phase)
	s := &sink{bufs: bufs, base: base, size: size, chunk: c.n.chunk, written: written,
		want: header{kind: kindColl, op: uint8(c.op), dtype: uint8(c.dt), agree1: c.agree1, agree2: c.agree2}}
	if !c.n.box.expect(k, s) {
		return func() {}
	}
	return func() { c.n.box.unexpect(k, s) }
}

// sendData posts the concatenation of bufs to the member at position q,
// in chunks.
func (c *call) sendData(q int, phase uint8, bufs ...[]byte) {
	size := 0
	for _, b := range bufs {
		size += len(b)
	}
	if size <= c.n.chunk {
		c.send(q, phase, bufs...)
		return
	}
	for off := 0; off < size; off += c.n.chunk {
		c.send(q, phase, spans(bufs, off, off+c.chunkLen(size, off))...)
	}
}

// wait returns once every payload this call sent has been written or
// copied, so the caller may change the buffers it sent from.
func (c *call) wait() error {
	err := c.sent[0].wait()
	if err1 := c.sent[1].wait(); err == nil {
		err = err1
	}
	if err != nil {
		return fmt.Errorf("%s: %w", c.where(), err)
	}
	return nil
}

// recv takes the phase's next frame from the member at position q and
// checks that it agrees with this call and carries size bytes. The caller
// releases the frame once it has read it.
func (c *call) recv(q int, phase uint8, size int) (frame, error) {
	from := c.g.Ranks[q]
	k := c.key(q, phase)
	fromProc := c.n.layout.ProcOf(from)
	f, err := c.n.box.take(k, fromProc, c.n.timeout, func() string {
		return fmt.Sprintf("waiting for rank %d (%s)", from, c.n.describe(fromProc))
	})
	if err != nil {
		err = fmt.Errorf("%s: %w", c.where(), err)
		if errors.Is(err, runtime.ErrTimeout) || errors.Is(err, runtime.ErrPeerLost) {
			c.n.Abort(err)
		}
		return frame{}, err
	}
	if err := c.agrees(q, f.hdr); err != nil {
		f.release()
		return frame{}, c.fail(err)
	}
	if f.size() != size {
		got := f.size()
		f.release()
		return frame{}, c.fail(fmt.Errorf("%s: %w on the data: rank %d sent %d bytes, %d expected", c.where(), runtime.ErrMismatch, from, got, size))
	}
	return f, nil
}

// recvData takes the size bytes the member at position q sends in the
// phase with sendData, handing each chunk that is not already in place to
// use with its offset.
func (c *call) recvData(q int, phase uint8, size int, use func(off int, data []byte)) error {
	for off := 0; ; {
		n := c.chunkLen(size, off)
		f, err := c.recv(q, phase, n)
		if err != nil {
			return err
		}
		if !f.inPlace {
			use(off, f.data)
		}
		f.release()
		if off += n; off >= size {
			return nil
		}
	}
}

// agrees compares what a member sent with this call.
func (c *call) agrees(q int, h header) error {
	from := c.g.Ranks[q]
	switch {
	case op(h.op) != c.op:
		return fmt.Errorf("collective #%d on group %v: %w on the collective: rank %d called %v but rank %d (position %d) called %v; every member must make the same collective calls in the same order",
			c.seq, c.g, runtime.ErrMismatch, c.rank, c.op, from, q, op(h.op))
	case ir.DType(h.dtype) != c.dt:
		return fmt.Errorf("%s: %w on the element type: rank %d passes %v but rank %d (position %d) passes %v",
			c.where(), runtime.ErrMismatch, c.rank, c.dt, from, q, ir.DType(h.dtype))
	case h.agree1 != c.agree1 || h.agree2 != c.agree2:
		return fmt.Errorf("%s: %w on %s: rank %d passes %s but rank %d (position %d) passes %s",
			c.where(), runtime.ErrMismatch, agreeName(c.op), c.rank, agreeText(c.op, c.dt, c.agree1, c.agree2), from, q, agreeText(c.op, c.dt, h.agree1, h.agree2))
	}
	return nil
}

func agreeName(o op) string {
	switch o {
	case opAllReduce:
		return "the bucket"
	case opBroadcast:
		return "the buffer or the root"
	case opReduceScatter:
		return "len(out)"
	}
	return "len(in)"
}

func agreeText(o op, dt ir.DType, a1, a2 int64) string {
	switch o {
	case opAllReduce:
		return fmt.Sprintf("%d elements in %d buffers", elems(dt, int(a1)), a2)
	case opBroadcast:
		return fmt.Sprintf("%d elements from position %d", elems(dt, int(a1)), a2)
	}
	return fmt.Sprintf("%d elements", elems(dt, int(a1)))
}

// counted records a finished collective once per process: by the first
// of its members this process holds.
func (c *call) counted(bytes int) {
	for _, r := range c.g.Ranks {
		if c.n.layout.Holds(r) {
			if r == c.rank {
				c.n.add(c.op, int64(bytes))
			}
			return
		}
	}
}

// spans cuts the byte range [lo, hi) of the concatenation of bufs into
// the pieces of each buffer it covers.
func spans(bufs [][]byte, lo, hi int) [][]byte {
	var out [][]byte
	for _, b := range bufs {
		if hi <= 0 {
			break
		}
		if lo < len(b) {
			out = append(out, b[max(lo, 0):min(hi, len(b))])
		}
		lo -= len(b)
		hi -= len(b)
	}
	return out
}

// copyInto copies data into the concatenation of bufs at byte offset off.
func copyInto(bufs [][]byte, off int, data []byte) {
	for _, b := range bufs {
		if len(data) == 0 {
			return
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		k := copy(b[off:], data)
		data, off = data[k:], 0
	}
}

// releaseAll gives back the buffers of the frames fs.
func releaseAll(fs []frame) {
	for i := range fs {
		fs[i].release()
	}
}

// reduceChunk sums one chunk of the members' contributions into dst, in
// position order with one rounding per add, as Local sums: own is the
// caller's contribution, cut into pieces where dst's are cut (it may be
// dst itself, which the sum then replaces), and rs[q] is the chunk member
// q sent (rs[pos] is unused).
func reduceChunk(dt ir.DType, dst, own [][]byte, rs []frame, pos int) {
	if pos == 0 {
		off := 0
		for i, d := range dst {
			if !same(d, own[i]) {
				copy(d, own[i])
			}
			for q := 1; q < len(rs); q++ {
				accumulate(dt, d, rs[q].data[off:off+len(d)], false)
			}
			off += len(d)
		}
		return
	}
	// The first term is member 0's: sum into the buffer it arrived in,
	// which this call owns, and copy the sum into place last, since own
	// (perhaps dst) must stay intact until its own term is added.
	acc := rs[0].data
	for q := 1; q < len(rs); q++ {
		if q != pos {
			accumulate(dt, acc, rs[q].data, false)
			continue
		}
		off := 0
		for _, w := range own {
			accumulate(dt, acc[off:off+len(w)], w, false)
			off += len(w)
		}
	}
	off := 0
	for _, d := range dst {
		off += copy(d, acc[off:])
	}
}

// AllReduce sums bufs in place. Member p sums share p of the bucket from
// every member's contribution in position order and sends it to the
// others: a direct reduce-scatter, then an all-gather, each member
// sending 2·(n−1)/n of the bucket. Both run chunk by chunk and overlap: a
// chunk of the share is summed as soon as every member's arrived and goes
// back out at once, while the next chunks are still on the wire. The
// share is summed in place, in bufs, since no other member reads it.
func (n *Net) AllReduce(g runtime.Group, rank int, dt ir.DType, bufs ...[]byte) error {
	total, bad := allReduceArgs(dt, bufs)
	c, err := n.begin(g, rank, opAllReduce, dt, int64(total), int64(len(bufs)), bad)
	if err != nil {
		return err
	}
	m := g.Size()
	if m == 1 {
		c.counted(total)
		return nil
	}
	es := int(dt.Size())
	count := total / es
	span := func(j int) (int, int) { return j * count / m * es, (j + 1) * count / m * es }
	c.written = make([]atomic.Int64, m)
	for q := range m {
		if q != c.pos {
			lo, hi := span(q)
			c.sendData(q, 0, spans(bufs, lo, hi)...)
		}
	}
	// The sums of the other shares go straight to where they belong, once
	// this member's terms there have been written out (a member in this
	// process has its terms copied as soon as they are sent).
	for q := range m {
		if q != c.pos {
			var written *atomic.Int64
			if !n.layout.Holds(g.Ranks[q]) {
				written = &c.written[q]
			}
			lo, hi := span(q)
			defer c.expect(q, 1, bufs, lo, hi-lo, written)()
		}
	}
	lo, hi := span(c.pos)
	rs := make([]frame, m)
	for off := 0; ; {
		k := c.chunkLen(hi-lo, off)
		for q := range m {
			if q != c.pos {
				if rs[q], err = c.recv(q, 0, k); err != nil {
					releaseAll(rs)
					return err
				}
			}
		}
		mine := spans(bufs, lo+off, lo+off+k)
		reduceChunk(dt, mine, mine, rs, c.pos)
		releaseAll(rs)
		for q := range m {
			if q != c.pos {
				c.send(q, 1, mine...)
			}
		}
		if off += k; off >= hi-lo {
			break
		}
	}
	// The other shares' sums land where this member sent its terms from:
	// those writes must be done.
	if err := c.sent[0].wait(); err != nil {
		return c.fail(fmt.Errorf("%s: %w", c.where(), err))
	}
	for q := range m {
		if q != c.pos {
			qlo, qhi := span(q)
			err := c.recvData(q, 1, qhi-qlo, func(off int, data []byte) { copyInto(bufs, qlo+off, data) })
			if err != nil {
				return err
			}
		}
	}
	if err := c.wait(); err != nil {
		return c.fail(err)
	}
	c.counted(total * m)
	return nil
}

// ReduceScatter sums the members' in, leaving the caller's chunk in out.
func (n *Net) ReduceScatter(g runtime.Group, rank int, dt ir.DType, in, out []byte) error {
	m, k := g.Size(), len(out)
	// The in-place form needs no care here: the sum is made in a received
	// buffer and lands on out last.
	_, bad := reduceScatterArgs(g, rank, dt, in, out)
	c, err := n.begin(g, rank, opReduceScatter, dt, int64(k), 0, bad)
	if err != nil {
		return err
	}
	for q := range m {
		if q != c.pos {
			c.sendData(q, 0, in[q*k:(q+1)*k])
		}
	}
	own := in[c.pos*k : (c.pos+1)*k]
	rs := make([]frame, m)
	for off := 0; ; {
		n := c.chunkLen(k, off)
		for q := range m {
			if q != c.pos {
				if rs[q], err = c.recv(q, 0, n); err != nil {
					releaseAll(rs)
					return err
				}
			}
		}
		reduceChunk(dt, [][]byte{out[off : off+n]}, [][]byte{own[off : off+n]}, rs, c.pos)
		releaseAll(rs)
		if off += n; off >= k {
			break
		}
	}
	if err := c.wait(); err != nil {
		return c.fail(err)
	}
	c.counted(len(in) * m)
	return nil
}

// AllGather concatenates the members' in, in position order, into out.
func (n *Net) AllGather(g runtime.Group, rank int, dt ir.DType, in, out []byte) error {
	m, k := g.Size(), len(in)
	inPlace, bad := allGatherArgs(g, rank, dt, in, out)
	c, err := n.begin(g, rank, opAllGather, dt, int64(k), 0, bad)
	if err != nil {
		return err
	}
	for q := range m {
		if q != c.pos {
			defer c.expect(q, 0, [][]byte{out}, q*k, k, nil)()
		}
	}
	for q := range m {
		if q != c.pos {
			c.sendData(q, 0, in)
		}
	}
	if !inPlace {
		copy(out[c.pos*k:], in)
	}
	for q := range m {
		if q != c.pos {
			if err := c.recvData(q, 0, k, func(off int, data []byte) { copy(out[q*k+off:], data) }); err != nil {
				return err
			}
		}
	}
	if err := c.wait(); err != nil {
		return c.fail(err)
	}
	c.counted(k * m)
	return nil
}

// AllToAll sends chunk j of in to member j and puts member p's chunk at
// chunk p of out.
func (n *Net) AllToAll(g runtime.Group, rank int, dt ir.DType, in, out []byte) error {
	m := g.Size()
	bad := allToAllArgs(g, dt, in, out)
	c, err := n.begin(g, rank, opAllToAll, dt, int64(len(in)), 0, bad)
	if err != nil {
		return err
	}
	k := len(in) / m
	for q := range m {
		if q != c.pos {
			defer c.expect(q, 0, [][]byte{out}, q*k, k, nil)()
		}
	}
	for q := range m {
		if q != c.pos {
			c.sendData(q, 0, in[q*k:(q+1)*k])
		}
	}
	copy(out[c.pos*k:(c.pos+1)*k], in[c.pos*k:(c.pos+1)*k])
	for q := range m {
		if q != c.pos {
			if err := c.recvData(q, 0, k, func(off int, data []byte) { copy(out[q*k+off:], data) }); err != nil {
				return err
			}
		}
	}
	if err := c.wait(); err != nil {
		return c.fail(err)
	}
	c.counted(len(in) * m)
	return nil
}

// Broadcast copies the root member's buf into every other member's.
func (n *Net) Broadcast(g runtime.Group, rank, root int, dt ir.DType, buf []byte) error {
	bad := broadcastArgs(g, root, dt, buf)
	c, err := n.begin(g, rank, opBroadcast, dt, int64(len(buf)), int64(root), bad)
	if err != nil {
		return err
	}
	if c.pos == root {
		for q := range g.Size() {
			if q != root {
				c.sendData(q, 0, buf)
			}
		}
		if err := c.wait(); err != nil {
			return c.fail(err)
		}
	} else {
		defer c.expect(root, 0, [][]byte{buf}, 0, len(buf), nil)()
		if err := c.recvData(root, 0, len(buf), func(off int, data []byte) { copy(buf[off:], data) }); err != nil {
			return err
		}
	}
	c.counted(len(buf))
	return nil
}

// Barrier returns once every member has called it: all report to the
// member at position 0, which then releases them.
func (n *Net) Barrier(g runtime.Group, rank int) error {
	c, err := n.begin(g, rank, opBarrier, ir.Invalid, 0, 0, nil)
	if err != nil {
		return err
	}
	m := g.Size()
	if c.pos == 0 {
		for q := 1; q < m; q++ {
			if _, err := c.recv(q, 0, 0); err != nil {
				return err
			}
		}
		for q := 1; q < m; q++ {
			c.send(q, 1)
		}
	} else {
		c.send(0, 0)
		if _, err := c.recv(0, 1, 0); err != nil {
			return err
		}
	}
	if err := c.wait(); err != nil {
		return c.fail(err)
	}
	c.counted(0)
	return nil
}

// p2pCheck validates a Send or Recv's ranks and buffer; mine is the rank
// this process must hold.
func (n *Net) p2pCheck(where func() string, from, to, mine int, dt ir.DType, size int) error {
	if err := n.aborted(); err != nil {
		return fmt.Errorf("%s: %w", where(), err)
	}
	for _, r := range []int{from, to} {
		if r < 0 || r >= n.layout.Devices {
			return fmt.Errorf("%s: %w: rank %d is outside [0,%d)", where(), runtime.ErrGroup, r, n.layout.Devices)
		}
	}
	if from == to {
		return fmt.Errorf("%s: %w: a device cannot send to itself", where(), runtime.ErrArgs)
	}
	if !n.layout.Holds(mine) {
		return fmt.Errorf("%s: %w: rank %d is held by process %d, not this one (%d)", where(), runtime.ErrGroup, mine, n.layout.ProcOf(mine), n.layout.Proc)
	}
	if err := checkElems(dt, "buf", size); err != nil {
		return fmt.Errorf("%s: %w", where(), err)
	}
	return nil
}

// Send posts a copy of buf for rank to and returns at once.
func (n *Net) Send(from, to, tag int, dt ir.DType, buf []byte) error {
	where := func() string { return fmt.Sprintf("Send from rank %d to rank %d (tag %d)", from, to, tag) }
	if err := n.p2pCheck(where, from, to, from, dt, len(buf)); err != nil {
		return err
	}
	h := header{kind: kindP2P, dtype: uint8(dt), from: int32(from), to: int32(to), seq: int64(tag), length: uint64(len(buf))}
	p := n.layout.ProcOf(to)
	k := keyOf(h)
	if p == n.layout.Proc {
		if s, dst := n.box.claim(k, h, nil); s != nil {
			gather(dst, [][]byte{buf})
			n.box.filled(k, s, h, nil)
			return nil
		}
	}
	data, pb := getBuf(len(buf))
	copy(data, buf)
	if p != n.layout.Proc {
		n.peers[p].enqueue(outFrame{hdr: h, bufs: [][]byte{data}, pb: pb})
		return nil
	}
	n.box.put(k, frame{hdr: h, data: data, pb: pb})
	return nil
}

// Recv waits for the next message from rank from to rank to with tag.
func (n *Net) Recv(from, to, tag int, dt ir.DType, buf []byte) error {
	where := func() string { return fmt.Sprintf("Recv from rank %d to rank %d (tag %d)", from, to, tag) }
	if err := n.p2pCheck(where, from, to, to, dt, len(buf)); err != nil {
		return err
	}
	k := msgKey{from: int32(from), to: int32(to), kind: kindP2P, seq: int64(tag)}
	if len(buf) > 0 {
		// Straight into buf if the message is not here yet.
		s := &sink{bufs: [][]byte{buf}, size: len(buf), chunk: len(buf), want: header{kind: kindP2P, dtype: uint8(dt)}}
		if n.box.expect(k, s) {
			defer n.box.unexpect(k, s)
		}
	}
	fromProc := n.layout.ProcOf(from)
	f, err := n.box.take(k, fromProc, n.timeout, func() string {
		return fmt.Sprintf("waiting for rank %d (%s)", from, n.describe(fromProc))
	})
	if err != nil {
		err = fmt.Errorf("%s: %w", where(), err)
		if errors.Is(err, runtime.ErrTimeout) || errors.Is(err, runtime.ErrPeerLost) {
			n.Abort(err)
		}
		return err
	}
	if err := matchError(p2pKey{from, to, tag}, ir.DType(f.hdr.dtype), f.size(), dt, len(buf)); err != nil {
		f.release()
		n.Abort(err)
		return err
	}
	if !f.inPlace {
		copy(buf, f.data)
	}
	f.release()
	n.add(opSendRecv, int64(len(buf)))
	return nil
}
