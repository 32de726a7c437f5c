package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"gcompile/runtime/auth"
)

// ServerOptions configure a store server.
type ServerOptions struct {
	Token            string                           // every connection must present it
	Ranks            int                              // clients say which process rank they are; ids outside [0,Ranks) are refused (0: unchecked)
	MaxKey           int                              // bytes; 0 means 1 KiB
	MaxValue         int                              // bytes; 0 means 16 MiB
	HandshakeTimeout time.Duration                    // 0 means 10 s: a connection that does not complete the handshake in time is closed; also how long a frame, once begun, may stall
	Logf             func(format string, args ...any) // refusals and protocol errors, one line each naming the remote address and the reason; nil: discarded
	// OnMisfit, when set, hears of each process of this job the store
	// refused (see Misfit): the job cannot start as it is, and its host
	// can say so at once rather than wait for the process until a
	// timeout. It is called after the refusal is sent.
	OnMisfit func(Misfit)
	// JobID is the job's public identity (JobIdentity). The store's
	// challenge names it, so that a process of this job with another token
	// knows it reached its own store (DialNearAs), not another job's; a
	// client naming it with a wrong token is a misfit.
	JobID string
}

// Misfit is a process of this job that the store refused: one that
// proved the token but was told another job size, or claimed a rank
// another process holds; or one that names this job's identity but holds
// another token (Unproven).
type Misfit struct {
	Rank   int
	Reason string
	// Duplicate: the rank is held by another process.
	Duplicate bool
	// Unproven: the process did not prove the token. It names this job,
	// but so could another job with the same master address, or anyone
	// who knows the job's public identity, so a caller may wait to see
	// whether the rank comes with the right token.
	Unproven bool
}

// Defaults of ServerOptions.
const (
	DefaultMaxKey           = 1 << 10
	DefaultMaxValue         = 16 << 20
	DefaultHandshakeTimeout = 10 * time.Second
)

// maxValueLimit keeps every frame length representable in the protocol's
// u32 with room for the key and header.
const maxValueLimit = 1 << 30

// serverWriteTimeout bounds one write to a client: a client that stops
// reading its replies loses its connection instead of holding a goroutine.
const serverWriteTimeout = 30 * time.Second

// Server is a rendezvous store: a key-value map shared by the processes
// of one job over TCP. It is safe for concurrent use.
type Server struct {
	opts ServerOptions
	ln   net.Listener
	addr string

	mu       sync.Mutex
	data     map[string][]byte
	notify   map[string]chan struct{} // closed when the key is next written
	barriers map[string]*barrier
	conns    map[*serverConn]struct{}
	refusals map[string]refusalLog // by peer host and text: see serverConn.logRefusal
	joined   int                   // connections that completed the handshake, ever
	active   int                   // of those, still open
	changed  chan struct{}         // closed and replaced when joined or active change
	closed   bool

	done      chan struct{} // closed by Close: wakes every waiter
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// barrier is the server's side of one named barrier.
type barrier struct {
	n         int
	entered   int // counts towards n
	inside    int // calls not yet returned, before or after completion
	completed bool
	done      chan struct{}
}

// Serve starts a store listening on addr ("host:port"; port 0 picks a free
// one). An empty host means loopback, not every interface: a store is
// exposed to the network only when asked (see BindHost).
func Serve(addr string, opts ServerOptions) (*Server, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("store address %q: %w", addr, err)
	}
	ln, err := listen(host, port)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return start(ln, opts), nil
}

// listen binds host:port, an empty host meaning loopback.
func listen(host, port string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	return lc.Listen(context.Background(), "tcp", net.JoinHostPort(hostOrLoopback(host), port))
}

// start serves on ln with options already filled in.
func start(ln net.Listener, opts ServerOptions) *Server {
	s := &Server{
		opts:     opts,
		ln:       ln,
		addr:     ln.Addr().String(),
		data:     map[string][]byte{},
		notify:   map[string]chan struct{}{},
		barriers: map[string]*barrier{},
		conns:    map[*serverConn]struct{}{},
		refusals: map[string]refusalLog{},
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
	}
	s.wg.Add(1)
	go s.accept()
	return s
}

func (o *ServerOptions) fill() error {
	if o.Token == "" {
		return errors.New("store: ServerOptions.Token is empty; every store needs a token (see DefaultToken)")
	}
	if len(o.Token) > maxTokenLen {
		return fmt.Errorf("store: token of %d bytes exceeds %d", len(o.Token), maxTokenLen)
	}
	if o.Ranks < 0 {
		return fmt.Errorf("store: ServerOptions.Ranks %d is negative", o.Ranks)
	}
	if o.MaxKey == 0 {
		o.MaxKey = DefaultMaxKey
	}
	if o.MaxValue == 0 {
		o.MaxValue = DefaultMaxValue
	}
	if o.MaxKey < 1 || o.MaxKey > math.MaxUint16 {
		return fmt.Errorf("store: ServerOptions.MaxKey %d is not in 1..%d", o.MaxKey, math.MaxUint16)
	}
	if o.MaxValue < 8 || o.MaxValue > maxValueLimit {
		// 8: an Add's reply is an int64, and a counter's text is up to
		// 20 bytes; a store too small for counters is a mistake.
		return fmt.Errorf("store: ServerOptions.MaxValue %d is not in 8..%d", o.MaxValue, maxValueLimit)
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.HandshakeTimeout < 0 {
		return fmt.Errorf("store: ServerOptions.HandshakeTimeout %v is negative", o.HandshakeTimeout)
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

// ServeNear starts a store on the first port of [port, port+tries) that
// it can listen on, so that a job whose preferred port is taken (by
// another job, a lingering process) still starts; DialNear finds it. The
// error lists each port's failure.
func ServeNear(host string, port, tries int, opts ServerOptions) (*Server, error) {
	if err := checkPortRange(port, tries); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	var fails []string
	for p := port; p < port+tries; p++ {
		ln, err := listen(host, strconv.Itoa(p))
		if err == nil {
			return start(ln, opts), nil
		}
		fails = append(fails, fmt.Sprintf("%d: %v", p, err))
	}
	return nil, fmt.Errorf("store: no port of %s in %d..%d to listen on: %s", hostOrLoopback(host), port, port+tries-1, summarize(fails))
}

func hostOrLoopback(host string) string {
	if host == "" {
		return loopback
	}
	return host
}

func checkPortRange(port, tries int) error {
	if tries < 1 {
		return fmt.Errorf("port count %d is not at least 1", tries)
	}
	if port < 1 || port > 65535 || tries > 65536-port {
		return fmt.Errorf("ports %d..%d are not within 1..65535", port, port+tries-1)
	}
	return nil
}

// summarize joins per-port failures, eliding the middle of a long list.
func summarize(fails []string) string {
	const keep = 8
	if len(fails) > keep {
		rest := len(fails) - keep
		fails = append(fails[:keep:keep], fmt.Sprintf("… and %d more", rest))
	}
	return strings.Join(fails, "; ")
}

// Addr is the address the store listens on, host:port.
func (s *Server) Addr() string { return s.addr }

// Close stops accepting, closes every connection (telling each client
// that the store is shutting down) and wakes every waiting call; it
// returns once all of the store's goroutines are gone. It is idempotent.
func (s *Server) Close() error { return s.Shutdown("store is shutting down") }

// Shutdown is Close telling each client why: a job that cannot start
// says so to the processes still waiting in the rendezvous.
func (s *Server) Shutdown(reason string) error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		var ready, early []*serverConn
		for c := range s.conns {
			if c.ready {
				ready = append(ready, c)
			} else {
				early = append(early, c)
			}
		}
		s.mu.Unlock()
		close(s.done)
		err = s.ln.Close()
		for _, c := range ready {
			c.goodbye(reason)
		}
		// A goodbye frame in the middle of a handshake would read as a
		// wrong magic; a plain close reads as what it is.
		for _, c := range early {
			c.nc.Close()
		}
		s.wg.Wait()
	})
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("store at %s: close: %w", s.addr, err)
	}
	return nil
}

// MissingRanks are the ranks in [0, Ranks) that no open connection holds
// (nil without ServerOptions.Ranks): the processes a job is waiting for.
func (s *Server) MissingRanks() []int {
	if s.opts.Ranks <= 0 {
		return nil
	}
	s.mu.Lock()
	held := map[int32]bool{}
	for c := range s.conns {
		if c.claimed {
			held[c.rank] = true
		}
	}
	s.mu.Unlock()
	var out []int
	for r := range s.opts.Ranks {
		if !held[int32(r)] {
			out = append(out, r)
		}
	}
	return out
}

// ReachedAt is the address of this machine at which the other machines'
// processes reached the store: the local address of most of the open
// connections that came from another machine (a non-loopback address),
// "" when none did. A process on the master's machine, whose own route to
// the master is loopback (a hosts file mapping the machine's name to
// 127.0.1.1), advertises it to the processes elsewhere.
func (s *Server) ReachedAt() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	count := map[string]int{}
	best := ""
	for c := range s.conns {
		if !c.ready {
			continue
		}
		remote, _, err1 := net.SplitHostPort(c.remote)
		local, _, err2 := net.SplitHostPort(c.local)
		if err1 != nil || err2 != nil || isLoopback(remote) || isLoopback(local) || remote == local {
			continue
		}
		count[local]++
		if count[local] > count[best] || count[local] == count[best] && local < best {
			best = local
		}
	}
	return best
}

// isLoopback reports whether host is a loopback IP address.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// WaitDrained returns once at least clients clients have connected to the
// store (completed the handshake) and none is connected any more, or when
// ctx ends. Rank 0 calls it between its own exit barrier and Close, so
// that the store outlives every other rank's last call (see the package
// documentation for the exit sequence).
func (s *Server) WaitDrained(ctx context.Context, clients int) error {
	for {
		s.mu.Lock()
		joined, active, ch := s.joined, s.active, s.changed
		s.mu.Unlock()
		if joined >= clients && active == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-s.done:
			return fmt.Errorf("store at %s: wait for %d clients to leave: store closed", s.addr, clients)
		case <-ctx.Done():
			return fmt.Errorf("store at %s: wait for %d clients to leave (%d joined, %d still connected): %w", s.addr, clients, joined, active, ctx.Err())
		}
	}
}

// signalLocked wakes WaitDrained; s.mu is held.
func (s *Server) signalLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) accept() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait for some to be
			// released rather than spin or give up on the job.
			s.opts.Logf("store at %s: accept: %v", s.addr, err)
			select {
			case <-time.After(backoff):
			case <-s.done:
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		c := &serverConn{s: s, nc: nc, remote: nc.RemoteAddr().String(), local: nc.LocalAddr().String(), pending: map[uint32]chan struct{}{}}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// serverConn is the server's side of one client connection.
type serverConn struct {
	s      *Server
	nc     net.Conn
	remote string
	local  string // the store's address as this client reached it
	rank   int32
	ready  bool // handshake done; guarded by s.mu
	// claimed: the handshake accepted this connection as its rank's
	// (with ServerOptions.Ranks); guarded by s.mu.
	claimed bool

	wmu sync.Mutex // one frame at a time on the wire

	mu      sync.Mutex
	pending map[uint32]chan struct{} // waiting calls by id: closed to cancel
	waiters sync.WaitGroup
}

func (c *serverConn) logf(format string, args ...any) {
	c.s.opts.Logf("store at %s: client %s: %s", c.s.addr, c.remote, fmt.Sprintf(format, args...))
}

func (c *serverConn) serve() {
	s := c.s
	joined := false
	defer func() {
		c.nc.Close()
		c.mu.Lock()
		for id, ch := range c.pending {
			close(ch)
			delete(c.pending, id)
		}
		c.mu.Unlock()
		// Waiters undo their barrier entries before the connection
		// counts as gone, so WaitDrained never sees a half-left client.
		c.waiters.Wait()
		s.mu.Lock()
		delete(s.conns, c)
		if joined {
			s.active--
			s.signalLocked()
		}
		s.mu.Unlock()
		s.wg.Done()
	}()
	if !c.handshake() {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	joined = true
	c.ready = true
	s.joined++
	s.active++
	s.signalLocked()
	s.mu.Unlock()

	fr := newFrameReader(c.nc, s.opts.HandshakeTimeout, c.limit)
	for {
		f, err := fr.read()
		if err != nil {
			c.readFailed(err)
			return
		}
		if reason := c.handle(f); reason != "" {
			c.logf("rank %d: closing: %s", c.rank, reason)
			c.goodbye(reason)
			return
		}
	}
}

// readFailed logs why reading stopped, unless the client simply left or
// the store is closing.
func (c *serverConn) readFailed(err error) {
	select {
	case <-c.s.done:
		return
	default:
	}
	if errors.Is(err, errIdleEOF) || errors.Is(err, net.ErrClosed) {
		return
	}
	var fe *frameError
	if errors.As(err, &fe) {
		c.logf("rank %d: closing: %v", c.rank, err)
		c.goodbye(err.Error())
		return
	}
	c.logf("rank %d: closing: read: %v", c.rank, err)
}

// handshake reads the hello, proves the token to the client and checks
// the client's proof (see the protocol in wire.go); false means the
// connection was refused (and logged) or broke.
func (c *serverConn) handshake() bool {
	s := c.s
	c.nc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	h, err := readHello(c.nc)
	if err == nil && h.version != protoVersion {
		err = fmt.Errorf("client speaks protocol version %d, this store speaks %d", h.version, protoVersion)
		c.logRefusal("refused: %v", err)
		c.refuseHello(statusBadVersion, err.Error())
		return false
	}
	if err != nil {
		select {
		case <-s.done:
			return false
		default:
		}
		c.logRefusal("refused: %v", err)
		c.refuseHello(statusBadHello, "bad hello: "+err.Error())
		return false
	}
	c.rank = h.rank
	nonce, err := auth.NewNonce()
	if err != nil {
		c.logf("handshake: %v", err)
		return false
	}
	ch := challenge{version: protoVersion, status: statusOK, nonce: nonce, job: s.opts.JobID,
		proof: auth.Proof(s.opts.Token, roleStore, nonce, h.nonce, h.claims())}
	if _, err := c.nc.Write(appendChallenge(nil, ch)); err != nil {
		c.logf("handshake: %v", err)
		return false
	}
	var answer [auth.ProofLen]byte
	if _, err := io.ReadFull(c.nc, answer[:]); err != nil {
		select {
		case <-s.done:
		default:
			c.logRefusal("refused: %v", truncated("proof of the token", err))
		}
		return false
	}
	var status byte
	var reason string
	// misfit: a process of this job that cannot join as it is.
	var misfit *Misfit
	sameJob := s.opts.JobID != "" && h.job == s.opts.JobID
	switch {
	case !auth.Check(answer[:], s.opts.Token, roleClient, h.nonce, nonce, h.claims()):
		status, reason = statusBadToken, fmt.Sprintf("wrong token (claimed rank %d); it belongs to another job or was mistyped", h.rank)
		if sameJob {
			misfit = &Misfit{Rank: int(h.rank), Unproven: true,
				Reason: fmt.Sprintf("rank %d at %s names this job but holds another token: give every process of the job one GCOMPILE_TOKEN (or --token), or none", h.rank, c.remote)}
		}
	case s.opts.Ranks > 0 && h.size != 0 && int(h.size) != s.opts.Ranks:
		status, reason = statusBadSize, fmt.Sprintf("rank %d at %s was told the job has %d processes, the store's process (rank 0) was told %d: give every process the same WORLD_SIZE (or --world-size; torchrun's --nnodes × --nproc-per-node, SLURM's task count)", h.rank, c.remote, h.size, s.opts.Ranks)
		misfit = &Misfit{Rank: int(h.rank), Reason: reason}
	case s.opts.Ranks > 0 && (h.rank < 0 || int(h.rank) >= s.opts.Ranks):
		status, reason = statusBadRank, fmt.Sprintf("rank %d is not in [0, %d)", h.rank, s.opts.Ranks)
	}
	if status == statusOK && s.opts.Ranks > 0 {
		// A rank belongs to one process: a second claim (two processes
		// given one RANK) is refused for good, naming both hosts, so the
		// process with the wrong rank fails at once.
		s.mu.Lock()
		for o := range s.conns {
			if o != c && o.claimed && o.rank == h.rank {
				status, reason = statusBadRank, fmt.Sprintf("rank %d is already in the job, from %s; this process at %s claims it too: two processes were given one rank (check RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK, and --rank)", h.rank, o.remote, c.remote)
				misfit = &Misfit{Rank: int(h.rank), Reason: reason, Duplicate: true}
				break
			}
		}
		if status == statusOK {
			c.claimed = true
		}
		s.mu.Unlock()
	}
	if misfit != nil && s.opts.OnMisfit != nil {
		defer s.opts.OnMisfit(*misfit)
	}
	if status != statusOK {
		c.logRefusal("refused: %s", reason)
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.nc.Write(appendWelcome(nil, welcome{status: status, reason: reason}))
		return false
	}
	ok := appendWelcome(nil, welcome{status: statusOK, maxKey: uint32(s.opts.MaxKey), maxValue: uint32(s.opts.MaxValue)})
	if _, err := c.nc.Write(ok); err != nil {
		c.logf("handshake: %v", err)
		return false
	}
	c.nc.SetDeadline(time.Time{})
	return true
}

// refuseHello refuses a hello before the challenge.
func (c *serverConn) refuseHello(status byte, reason string) {
	c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.nc.Write(appendChallenge(nil, challenge{version: protoVersion, status: status, reason: reason}))
}

// refusalLogEvery is how often one peer's same refusal is logged again:
// another job's processes sweeping past this store, or a process retrying
// with a wrong token, would otherwise fill the log with a line per try.
const refusalLogEvery = time.Minute

// maxRefusalLogs bounds the refusals remembered for refusalLogEvery.
const maxRefusalLogs = 1024

// logRefusal logs a refusal, once per refusalLogEvery for the same peer
// host and text, saying how many were left unsaid since.
func (c *serverConn) logRefusal(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	host, _, _ := net.SplitHostPort(c.remote)
	key := host + "\x00" + msg
	s := c.s
	s.mu.Lock()
	last, seen := s.refusals[key]
	now := time.Now()
	if seen && now.Sub(last.at) < refusalLogEvery {
		last.quiet++
		s.refusals[key] = last
		s.mu.Unlock()
		return
	}
	if len(s.refusals) >= maxRefusalLogs {
		clear(s.refusals) // a peer sending ever new junk must not grow it
	}
	s.refusals[key] = refusalLog{at: now}
	s.mu.Unlock()
	if last.quiet > 0 {
		msg += fmt.Sprintf(" (and %d times more from %s since %s)", last.quiet, host, last.at.Format(time.TimeOnly))
	}
	c.logf("%s", msg)
}

// refusalLog is when a refusal was last logged and how many like it were
// not since.
type refusalLog struct {
	at    time.Time
	quiet int
}

// limit is the largest body a request type may carry.
func (c *serverConn) limit(typ byte) (int, error) {
	if n, ok := bodyLimit(typ, c.s.opts.MaxKey, c.s.opts.MaxValue); ok {
		return n, nil
	}
	return 0, badFrame("unknown request type %d", typ)
}

// goodbye tells the client why the store is hanging up, then hangs up.
// It never waits on a write already in progress: that writer's deadline
// or the close below ends it.
func (c *serverConn) goodbye(reason string) {
	if c.wmu.TryLock() {
		if len(reason) > maxReasonLen {
			reason = reason[:maxReasonLen]
		}
		c.nc.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		c.nc.Write(appendFrame(nil, respGoodbye, 0, []byte(reason)))
		c.wmu.Unlock()
	}
	c.nc.Close()
}

// reply sends a reply frame; a failed write ends the connection.
func (c *serverConn) reply(id uint32, status byte, parts ...[]byte) {
	buf := appendFrame(nil, respReply, id, append([][]byte{{status}}, parts...)...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(serverWriteTimeout))
	if _, err := c.nc.Write(buf); err != nil {
		select {
		case <-c.s.done:
		default:
			if !errors.Is(err, net.ErrClosed) {
				c.logf("rank %d: closing: write: %v", c.rank, err)
			}
		}
		c.nc.Close()
	}
}

// fail replies with an error. The text is clipped: it quotes keys, and
// the client accepts no reply longer than a value or maxReasonLen.
func (c *serverConn) fail(id uint32, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxReasonLen {
		msg = msg[:maxReasonLen]
	}
	c.reply(id, statusError, []byte(msg))
}

// key checks a key from a request body.
func (c *serverConn) key(b []byte) (string, string) {
	if len(b) == 0 {
		return "", "empty key"
	}
	if len(b) > c.s.opts.MaxKey {
		return "", fmt.Sprintf("key of %d bytes exceeds the limit of %d", len(b), c.s.opts.MaxKey)
	}
	return string(b), ""
}

// handle serves one request. A non-empty result is a protocol violation
// that ends the connection; errors of the request itself (a counter that
// is not a number) are replied and the connection goes on.
func (c *serverConn) handle(f frame) string {
	s := c.s
	switch f.typ {
	case reqSet:
		if len(f.body) < 4 {
			return "set frame shorter than its key length"
		}
		n := binary.BigEndian.Uint32(f.body)
		if uint64(n) > uint64(len(f.body)-4) {
			return fmt.Sprintf("set key length %d exceeds the frame", n)
		}
		key, bad := c.key(f.body[4 : 4+n])
		if bad != "" {
			return "set: " + bad
		}
		value := f.body[4+n:]
		if len(value) > s.opts.MaxValue {
			return fmt.Sprintf("set %q: value of %d bytes exceeds the limit of %d", key, len(value), s.opts.MaxValue)
		}
		s.mu.Lock()
		s.setLocked(key, value)
		s.mu.Unlock()
		c.reply(f.id, statusOK)
	case reqGet:
		key, bad := c.key(f.body)
		if bad != "" {
			return "get: " + bad
		}
		return c.startWait(f.id, func(cancel <-chan struct{}) { c.get(f.id, key, cancel) })
	case reqCheck, reqWait:
		keys, err := parseKeys(f.body, s.opts.MaxKey)
		if err != nil {
			return reqNames[f.typ] + ": " + err.Error()
		}
		if f.typ == reqCheck {
			s.mu.Lock()
			all := s.missingLocked(keys) == ""
			s.mu.Unlock()
			r := byte(0)
			if all {
				r = 1
			}
			c.reply(f.id, statusOK, []byte{r})
			return ""
		}
		return c.startWait(f.id, func(cancel <-chan struct{}) { c.wait(f.id, keys, cancel) })
	case reqAdd:
		if len(f.body) < 8 {
			return "add frame shorter than its delta"
		}
		delta := int64(binary.BigEndian.Uint64(f.body))
		key, bad := c.key(f.body[8:])
		if bad != "" {
			return "add: " + bad
		}
		s.mu.Lock()
		v, err := s.addLocked(key, delta)
		s.mu.Unlock()
		if err != nil {
			c.fail(f.id, "%v", err)
			return ""
		}
		c.reply(f.id, statusOK, binary.BigEndian.AppendUint64(nil, uint64(v)))
	case reqBarrier:
		if len(f.body) < 4 {
			return "barrier frame shorter than its count"
		}
		n := binary.BigEndian.Uint32(f.body)
		name, bad := c.key(f.body[4:])
		if bad != "" {
			return "barrier name: " + bad
		}
		if n < 1 || n > maxBarrier {
			c.fail(f.id, "barrier %q: participant count %d is not in 1..%d", name, n, maxBarrier)
			return ""
		}
		return c.startWait(f.id, func(cancel <-chan struct{}) { c.barrier(f.id, name, int(n), cancel) })
	case reqCancel:
		if len(f.body) != 0 {
			return "cancel frame has a body"
		}
		c.mu.Lock()
		if ch, ok := c.pending[f.id]; ok {
			close(ch)
			delete(c.pending, f.id)
		}
		c.mu.Unlock()
	default:
		// limit refuses unknown types before their body is read.
		return fmt.Sprintf("unknown request type %d", f.typ)
	}
	return ""
}

// startWait runs a call that may wait in its own goroutine, cancellable
// by id.
func (c *serverConn) startWait(id uint32, run func(cancel <-chan struct{})) string {
	c.mu.Lock()
	if _, dup := c.pending[id]; dup {
		c.mu.Unlock()
		return fmt.Sprintf("request id %d reused while that request is still waiting", id)
	}
	if len(c.pending) >= maxPendingPerConn {
		c.mu.Unlock()
		return fmt.Sprintf("more than %d calls waiting on one connection", maxPendingPerConn)
	}
	cancel := make(chan struct{})
	c.pending[id] = cancel
	c.waiters.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.waiters.Done()
		run(cancel)
		c.mu.Lock()
		if c.pending[id] == cancel {
			delete(c.pending, id)
		}
		c.mu.Unlock()
	}()
	return ""
}

func (s *Server) setLocked(key string, value []byte) {
	s.data[key] = value
	if ch, ok := s.notify[key]; ok {
		close(ch)
		delete(s.notify, key)
	}
}

// addLocked adds delta to the counter at key, stored as decimal text so
// that Get reads it like any value.
func (s *Server) addLocked(key string, delta int64) (int64, error) {
	var cur int64
	if v, ok := s.data[key]; ok {
		var err error
		if cur, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return 0, fmt.Errorf("add %d to %q: it holds %q, not a decimal integer", delta, key, clip(v))
		}
	}
	next := cur + delta
	if (delta > 0 && next < cur) || (delta < 0 && next > cur) {
		return 0, fmt.Errorf("add %d to %q: %d would overflow int64", delta, key, cur)
	}
	s.setLocked(key, []byte(strconv.FormatInt(next, 10)))
	return next, nil
}

// clip shortens a value quoted in an error.
func clip(v []byte) []byte {
	if len(v) > 64 {
		return append(v[:64:64], "…"...)
	}
	return v
}

// missingLocked is the first key of keys not in the store, "" when all are.
func (s *Server) missingLocked(keys []string) string {
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			return k
		}
	}
	return ""
}

// notifyLocked is the channel closed when key is next written.
func (s *Server) notifyLocked(key string) chan struct{} {
	ch, ok := s.notify[key]
	if !ok {
		ch = make(chan struct{})
		s.notify[key] = ch
	}
	return ch
}

// sleep waits for ch to be closed; false when the call was cancelled, the
// connection ended or the store closed.
func (c *serverConn) sleep(ch <-chan struct{}, cancel <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-cancel:
	case <-c.s.done:
	}
	return false
}

func (c *serverConn) get(id uint32, key string, cancel <-chan struct{}) {
	s := c.s
	for {
		s.mu.Lock()
		v, ok := s.data[key]
		var ch chan struct{}
		if !ok {
			ch = s.notifyLocked(key)
		}
		s.mu.Unlock()
		if ok {
			c.reply(id, statusOK, v)
			return
		}
		if !c.sleep(ch, cancel) {
			return
		}
	}
}

func (c *serverConn) wait(id uint32, keys []string, cancel <-chan struct{}) {
	s := c.s
	for {
		s.mu.Lock()
		missing := s.missingLocked(keys)
		var ch chan struct{}
		if missing != "" {
			ch = s.notifyLocked(missing)
		}
		s.mu.Unlock()
		if missing == "" {
			c.reply(id, statusOK)
			return
		}
		if !c.sleep(ch, cancel) {
			return
		}
	}
}

func (c *serverConn) barrier(id uint32, name string, n int, cancel <-chan struct{}) {
	s := c.s
	s.mu.Lock()
	b := s.barriers[name]
	if b == nil {
		b = &barrier{n: n, done: make(chan struct{})}
		s.barriers[name] = b
	}
	switch {
	case b.completed:
		s.mu.Unlock()
		c.fail(id, "barrier %q completed with %d clients and some are still leaving it; use a new name for every barrier", name, b.n)
		return
	case b.n != n:
		s.mu.Unlock()
		c.fail(id, "barrier %q: entered for %d clients, but %d already wait in it for %d", name, n, b.entered, b.n)
		return
	}
	b.entered++
	b.inside++
	if b.entered == b.n {
		b.completed = true
		close(b.done)
	}
	s.mu.Unlock()

	passed := c.sleep(b.done, cancel)
	if passed {
		c.reply(id, statusOK)
	}
	s.mu.Lock()
	if !passed && !b.completed {
		// A client that gives up (timeout, exit) leaves the barrier, so
		// that the count stays true and it may enter again.
		b.entered--
	}
	b.inside--
	if b.inside == 0 && s.barriers[name] == b {
		// Forgotten once empty, so that a job entering a barrier per
		// step does not grow the store.
		delete(s.barriers, name)
	}
	s.mu.Unlock()
}
