package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"gcompile/runtime/auth"
)

// Errors a caller may want to tell apart; returned errors wrap them.
var (
	// ErrRefused: the store refused the handshake (wrong token, rank out
	// of range, other protocol version). Retrying does not help.
	ErrRefused = errors.New("refused by the store")
	// ErrNotStore: something other than a store answered at the address.
	ErrNotStore = errors.New("not a gcompile store")
	// ErrDisconnected: the store closed the connection (it was closed,
	// its process died, or it hung up on a protocol error).
	ErrDisconnected = errors.New("closed the connection")
	// ErrClientClosed: the call was made on, or interrupted by, Close.
	ErrClientClosed = errors.New("client closed")
)

// attemptTimeout bounds one connection attempt (connect and handshake):
// a store answers within milliseconds, and a peer that accepts but stays
// silent must not stall Dial or a DialNear sweep.
const attemptTimeout = 3 * time.Second

// clientWriteTimeout bounds one frame's write. A store that stops reading
// for this long is treated as gone.
const clientWriteTimeout = time.Minute

// Client is one process's connection to the store. Its methods are safe
// for concurrent use and share the connection: a Get that waits does not
// hold up a Set from another goroutine.
//
// Every method honours its context. When the context ends before the
// store answered, the method returns an error wrapping ctx.Err() that
// names the keys; the client stays usable (a waiting call is cancelled in
// the store). A request that was already sent may still take effect: a
// Set or Add whose context ended may have been applied.
type Client struct {
	addr             string
	nc               net.Conn
	maxKey, maxValue int

	out chan []byte // frames for the writer

	mu     sync.Mutex
	nextID uint32
	calls  map[uint32]chan frame

	dead    chan struct{} // closed when the connection is finished
	deadErr error         // why; set before dead is closed
	endOnce sync.Once
	wg      sync.WaitGroup
}

// refusal is the store's refusal of a handshake.
type refusal struct {
	status byte
	reason string
	job    string // the store's job identity, when it got as far as saying
}

func (r *refusal) Error() string {
	return "the store refused the connection: " + r.reason
}

func (r *refusal) Unwrap() error { return ErrRefused }

// Member is how a process presents itself to its job's store.
type Member struct {
	// Token is the job's token. It never crosses the wire: the handshake
	// proves it (see package auth).
	Token string
	Rank  int
	// Size is the job's process count as this process was told; a store
	// told another refuses it (0: not said).
	Size int
	// Job is the job's public identity (JobIdentity), "" if none. A store
	// of the same identity that refuses the token is this job's store:
	// the job's processes were given different tokens.
	Job string
	// JobNamed says the launcher named the job (World.JobID): then that
	// refusal is final at once. Otherwise the identity comes from the
	// master address alone, which another job may share, so DialNearAs
	// keeps looking for sameJobGrace before giving up.
	JobNamed bool
}

// sameJobGrace is how long DialNearAs keeps sweeping after a store of its
// job's identity refused its token, when the launcher did not name the
// job: the store may be another job's on the same master address, and
// this job's own store may still be starting.
var sameJobGrace = 5 * time.Second

func (m Member) check() error {
	if len(m.Token) > maxTokenLen {
		return fmt.Errorf("token of %d bytes exceeds %d", len(m.Token), maxTokenLen)
	}
	if m.Token == "" {
		return errors.New("the token is empty")
	}
	if m.Rank < -1<<31 || m.Rank > 1<<31-1 {
		return fmt.Errorf("rank %d does not fit the protocol's int32", m.Rank)
	}
	if m.Size < 0 || m.Size > 1<<31-1 {
		return fmt.Errorf("size %d does not fit the protocol's u32", m.Size)
	}
	if len(m.Job) > maxJobLen {
		return fmt.Errorf("job identity of %d bytes exceeds %d", len(m.Job), maxJobLen)
	}
	return nil
}

// Dial connects to the store at addr as process rank, proving token.
// Until the store answers it retries with a short backoff, since rank 0
// may start its store after the others dial; it gives up when ctx ends,
// with an error that wraps ctx.Err() and says what the last attempt met.
// A store's refusal, or an answer from something that is not a store, is
// final and returned at once.
func Dial(ctx context.Context, addr, token string, rank int) (*Client, error) {
	m := Member{Token: token, Rank: rank}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("dial store at %s: %w", addr, err)
	}
	backoff := 10 * time.Millisecond
	var last error
	for {
		c, err := dialOnce(ctx, addr, m)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, ErrRefused) || errors.Is(err, ErrNotStore) {
			return nil, fmt.Errorf("dial store at %s: %w", addr, err)
		}
		// An attempt the context cut short says less than the one before.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		if cerr := sleepCtx(ctx, backoff); cerr != nil {
			return nil, fmt.Errorf("dial store at %s: %w (last attempt: %w)", addr, cerr, last)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// DialNear finds this job's store on host among the ports [port,
// port+tries) — where ServeNear put it — and connects to it. It skips
// ports where nothing listens, where something that is not a store
// answers, and where a store refuses the token (another job's store),
// sweeping the range again after a short pause until ctx ends; the error
// then lists what each port said. A store that accepts the token but
// refuses the process (its rank, its job size) is this job's store: that
// refusal is final.
func DialNear(ctx context.Context, host string, port, tries int, token string, rank int) (*Client, error) {
	return DialNearAs(ctx, host, port, tries, Member{Token: token, Rank: rank})
}

// DialNearAs is DialNear for a process that says more of itself (its
// job's size and identity): a store of the same job identity that refuses
// its token ends the search (see Member.JobNamed), naming the cause, so a
// job whose processes were given different tokens fails within seconds
// instead of sweeping until ctx ends.
func DialNearAs(ctx context.Context, host string, port, tries int, m Member) (*Client, error) {
	if err := checkPortRange(port, tries); err != nil {
		return nil, fmt.Errorf("dial store on %s: %w", host, err)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("dial store on %s: %w", host, err)
	}
	said := make([]string, tries)
	wasRefused := make([]bool, tries)
	backoff := 20 * time.Millisecond
	var sameJob error // a refusal of the token by a store of this job's identity
	var sameJobAt time.Time
	for {
		for i := range tries {
			addr := net.JoinHostPort(host, strconv.Itoa(port+i))
			c, err := dialOnce(ctx, addr, m)
			if err == nil {
				return c, nil
			}
			var r *refusal
			if errors.As(err, &r) && (r.status == statusBadRank || r.status == statusBadSize) {
				return nil, fmt.Errorf("dial store at %s: %w", addr, err)
			}
			if errors.As(err, &r) && r.status == statusBadToken && m.Job != "" && r.job == m.Job {
				e := fmt.Errorf("dial store at %s: %w: it is this job's store (job %s), so the job's processes were given different tokens: give them all one GCOMPILE_TOKEN (or --token), or none", addr, err, m.Job)
				if m.JobNamed {
					return nil, e
				}
				if sameJob == nil {
					sameJob, sameJobAt = e, time.Now()
				}
			}
			// What a store said outlives the store: a refusal is kept over
			// the dial errors after it closed, being the more telling.
			if said[i] == "" || ctx.Err() == nil && (errors.As(err, &r) || !wasRefused[i]) {
				said[i] = fmt.Sprintf("%d: %v", port+i, err)
				wasRefused[i] = errors.As(err, &r)
			}
			if ctx.Err() != nil {
				break
			}
		}
		if sameJob != nil && time.Since(sameJobAt) >= sameJobGrace {
			return nil, fmt.Errorf("%w (no other store on ports %d..%d accepted it within %v)", sameJob, port, port+tries-1, sameJobGrace)
		}
		if cerr := sleepCtx(ctx, backoff); cerr != nil {
			return nil, fmt.Errorf("dial store on %s ports %d..%d: %w; %s", host, port, port+tries-1, cerr, summarize(compact(said)))
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// compact drops ports never tried (the context ended mid-sweep).
func compact(said []string) []string {
	out := said[:0:0]
	for _, s := range said {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dialOnce makes one connection attempt: connect, handshake, start the
// client's reader and writer.
func dialOnce(ctx context.Context, addr string, m Member) (*Client, error) {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	d := net.Dialer{KeepAliveConfig: keepAlive}
	nc, err := d.DialContext(actx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// The context, not a fixed deadline, bounds the handshake; closing the
	// connection is how a blocked read learns the context ended.
	stop := context.AfterFunc(actx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	w, err := handshake(nc, m)
	if !stop() {
		nc.Close()
		if err == nil || isTimeout(err) {
			err = actx.Err()
			if ctx.Err() == nil {
				err = fmt.Errorf("no answer to the handshake within %v", attemptTimeout)
			}
		}
		return nil, err
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	switch {
	case w.status != statusOK:
		nc.Close()
		return nil, &refusal{status: w.status, reason: w.reason, job: w.job}
	case w.maxKey < 1 || w.maxValue < 8 || w.maxValue > maxValueLimit:
		nc.Close()
		return nil, fmt.Errorf("store at %s announced unusable limits (key %d, value %d bytes): %w", addr, w.maxKey, w.maxValue, ErrNotStore)
	}
	nc.SetDeadline(time.Time{})
	c := &Client{
		addr:     addr,
		nc:       nc,
		maxKey:   int(w.maxKey),
		maxValue: int(w.maxValue),
		out:      make(chan []byte),
		calls:    map[uint32]chan frame{},
		dead:     make(chan struct{}),
	}
	c.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// handshake proves m's token to the store and checks the store's proof
// of it (see the protocol in wire.go). A store that could not prove the
// token is refused whatever it answers.
func handshake(nc net.Conn, m Member) (welcome, error) {
	nonce, err := auth.NewNonce()
	if err != nil {
		return welcome{}, err
	}
	h := hello{version: protoVersion, rank: int32(m.Rank), size: uint32(m.Size), nonce: nonce, job: m.Job}
	if _, err := nc.Write(appendHello(nil, h)); err != nil {
		return welcome{}, err
	}
	ch, err := readChallenge(nc)
	switch {
	case err != nil:
		return welcome{}, err
	case ch.status != statusOK:
		return welcome{status: ch.status, reason: ch.reason}, nil
	case ch.version != protoVersion:
		return welcome{status: statusBadVersion, reason: fmt.Sprintf("store speaks protocol version %d, this client %d", ch.version, protoVersion)}, nil
	}
	proven := auth.Check(ch.proof[:], m.Token, roleStore, ch.nonce, nonce, h.claims())
	var answer [auth.ProofLen]byte
	if proven {
		answer = auth.Proof(m.Token, roleClient, nonce, ch.nonce, h.claims())
	}
	if _, err := nc.Write(answer[:]); err != nil {
		return welcome{}, err
	}
	w, err := readWelcome(nc)
	if err != nil {
		return welcome{}, err
	}
	w.job = ch.job
	if !proven && w.status == statusOK {
		w.status, w.reason = statusBadToken, "the store could not prove the job's token (another job's store, or a peer posing as one)"
	}
	return w, nil
}

// Addr is the store's address.
func (c *Client) Addr() string { return c.addr }

// Close closes the connection; calls in flight return ErrClientClosed.
// It is idempotent.
func (c *Client) Close() error {
	c.end(fmt.Errorf("store at %s: %w", c.addr, ErrClientClosed))
	c.wg.Wait()
	return nil
}

// end finishes the connection, recording why for every call in flight
// and every later one; the first reason wins.
func (c *Client) end(err error) {
	c.endOnce.Do(func() {
		c.deadErr = err
		close(c.dead)
		c.nc.Close()
	})
}

func (c *Client) readLoop() {
	defer c.wg.Done()
	fr := newFrameReader(c.nc, 0, c.limit)
	for {
		f, err := fr.read()
		if err != nil {
			c.lost(err, "")
			return
		}
		switch f.typ {
		case respGoodbye:
			c.lost(nil, string(f.body))
			return
		case respReply:
			c.mu.Lock()
			ch, ok := c.calls[f.id]
			delete(c.calls, f.id)
			c.mu.Unlock()
			if ok {
				ch <- f // buffered: never blocks
			}
			// A reply for an abandoned call is dropped.
		}
	}
}

// lost ends the connection because the store went away (or hung up with
// reason), unless Close got there first.
func (c *Client) lost(err error, reason string) {
	detail := ""
	switch {
	case reason != "":
		detail = ": " + reason
	case err != nil && !errors.Is(err, errIdleEOF) && !errors.Is(err, net.ErrClosed):
		detail = fmt.Sprintf(" (%v)", err)
	}
	c.end(fmt.Errorf("store at %s %w%s", c.addr, ErrDisconnected, detail))
}

// limit bounds the frames a client accepts: replies carry at most a value.
func (c *Client) limit(typ byte) (int, error) {
	switch typ {
	case respReply:
		return 1 + max(c.maxValue, maxReasonLen, 8), nil
	case respGoodbye:
		return maxReasonLen, nil
	}
	return 0, badFrame("unknown frame type %d from the store", typ)
}

func (c *Client) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case buf := <-c.out:
			c.nc.SetWriteDeadline(time.Now().Add(clientWriteTimeout))
			if _, err := c.nc.Write(buf); err != nil {
				c.lost(err, "")
				return
			}
		case <-c.dead:
			return
		}
	}
}

// failure is the error of a call the connection's end interrupted.
func (c *Client) failure() error { return c.deadErr }

// call sends a request and waits for its reply. what names the call in
// errors. A call that waits in the store (cancellable) is cancelled there
// when ctx ends, so the store does not keep a goroutine for nobody.
func (c *Client) call(ctx context.Context, what string, typ byte, cancellable bool, body ...[]byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store at %s: %s: %w", c.addr, what, err)
	}
	select {
	case <-c.dead:
		return nil, fmt.Errorf("%s: %w", what, c.failure())
	default:
	}
	ch := make(chan frame, 1)
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	c.calls[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
	}
	buf := appendFrame(nil, typ, id, body...)
	select {
	case c.out <- buf:
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("store at %s: %s: %w", c.addr, what, ctx.Err())
	case <-c.dead:
		forget()
		return nil, fmt.Errorf("%s: %w", what, c.failure())
	}
	select {
	case f := <-ch:
		if len(f.body) == 0 {
			return nil, fmt.Errorf("store at %s: %s: empty reply", c.addr, what)
		}
		if f.body[0] != statusOK {
			return nil, fmt.Errorf("store at %s: %s: %s", c.addr, what, f.body[1:])
		}
		return f.body[1:], nil
	case <-ctx.Done():
		forget()
		if cancellable {
			c.cancel(id)
		}
		return nil, fmt.Errorf("store at %s: %s: %w", c.addr, what, ctx.Err())
	case <-c.dead:
		forget()
		return nil, fmt.Errorf("%s: %w", what, c.failure())
	}
}

// cancel tells the store to drop a waiting call. The caller does not wait
// for the frame to go out; the writer sends it after the request itself.
func (c *Client) cancel(id uint32) {
	buf := appendFrame(nil, reqCancel, id)
	// Not counted in c.wg: Close may already be waiting on it, and this
	// goroutine ends by itself once the connection does.
	go func() {
		select {
		case c.out <- buf:
		case <-c.dead:
		}
	}()
}

// checkKey refuses, before sending, a key the store would hang up on.
func (c *Client) checkKey(what, key string) error {
	if key == "" {
		return fmt.Errorf("store at %s: %s: empty key", c.addr, what)
	}
	if len(key) > c.maxKey {
		return fmt.Errorf("store at %s: %s: key of %d bytes exceeds the store's limit of %d", c.addr, what, len(key), c.maxKey)
	}
	return nil
}

// Set stores value under key, replacing any value there, and wakes the
// calls waiting for key. The store keeps its own copy.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	what := fmt.Sprintf("set %q", key)
	if err := c.checkKey(what, key); err != nil {
		return err
	}
	if len(value) > c.maxValue {
		return fmt.Errorf("store at %s: %s: value of %d bytes exceeds the store's limit of %d", c.addr, what, len(value), c.maxValue)
	}
	_, err := c.call(ctx, what, reqSet, false, u32(uint32(len(key))), []byte(key), value)
	return err
}

// Get returns the value at key, waiting until some client sets it or ctx
// ends.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	what := fmt.Sprintf("get %q", key)
	if err := c.checkKey(what, key); err != nil {
		return nil, err
	}
	return c.call(ctx, what, reqGet, true, []byte(key))
}

func (c *Client) checkKeys(what string, keys []string) error {
	if len(keys) == 0 || len(keys) > maxKeysPerRequest {
		return fmt.Errorf("store at %s: %s: %d keys, not in 1..%d", c.addr, what, len(keys), maxKeysPerRequest)
	}
	size := 4
	for _, k := range keys {
		if err := c.checkKey(what, k); err != nil {
			return err
		}
		size += 4 + len(k)
	}
	if lim, _ := bodyLimit(reqWait, c.maxKey, c.maxValue); size > lim {
		return fmt.Errorf("store at %s: %s: key list of %d bytes exceeds the store's limit of %d", c.addr, what, size, lim)
	}
	return nil
}

// Check reports whether every key exists, without waiting.
func (c *Client) Check(ctx context.Context, keys ...string) (bool, error) {
	what := fmt.Sprintf("check %q", keys)
	if err := c.checkKeys(what, keys); err != nil {
		return false, err
	}
	r, err := c.call(ctx, what, reqCheck, false, keysBody(keys))
	if err != nil {
		return false, err
	}
	if len(r) != 1 {
		return false, fmt.Errorf("store at %s: %s: reply of %d bytes, want 1", c.addr, what, len(r))
	}
	return r[0] == 1, nil
}

// Wait returns once every key exists, or when ctx ends.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	what := fmt.Sprintf("wait for %q", keys)
	if err := c.checkKeys(what, keys); err != nil {
		return err
	}
	_, err := c.call(ctx, what, reqWait, true, keysBody(keys))
	return err
}

// Add adds delta to the counter at key (a missing key counts as 0) and
// returns the new value. The counter is stored as decimal text, so Get
// reads it; adding to a key that holds anything else is an error.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	what := fmt.Sprintf("add %d to %q", delta, key)
	if err := c.checkKey(what, key); err != nil {
		return 0, err
	}
	r, err := c.call(ctx, what, reqAdd, false, binary.BigEndian.AppendUint64(nil, uint64(delta)), []byte(key))
	if err != nil {
		return 0, err
	}
	if len(r) != 8 {
		return 0, fmt.Errorf("store at %s: %s: reply of %d bytes, want 8", c.addr, what, len(r))
	}
	return int64(binary.BigEndian.Uint64(r)), nil
}

// Barrier returns once n clients have entered the barrier called name.
// Every client must pass the same n. Give each barrier a new name (e.g.
// "step-17"): the store forgets a barrier once all its clients have left,
// so a name used again may meet either the old barrier (an error) or a
// new one. A client whose ctx ends leaves the barrier (so it may enter it
// again); the barrier does not complete without it. Barrier names are
// apart from keys.
func (c *Client) Barrier(ctx context.Context, name string, n int) error {
	what := fmt.Sprintf("barrier %q for %d clients", name, n)
	if err := c.checkKey(what, name); err != nil {
		return err
	}
	if n < 1 || n > maxBarrier {
		return fmt.Errorf("store at %s: %s: client count not in 1..%d", c.addr, what, maxBarrier)
	}
	_, err := c.call(ctx, what, reqBarrier, true, u32(uint32(n)), []byte(name))
	return err
}
