package dist

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gcompile/runtime/auth"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hang is how long a test waits before it calls a call hung. Nothing
// correct comes near it; it only turns a hang into a failure.
const hang = 5 * time.Second

const testToken = "test-token"

// logLines collects a server's log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// waitFor returns the first line containing every part, failing the test
// if none appears in time.
func (l *logLines) waitFor(t *testing.T, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(hang)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, line := range l.lines {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				l.mu.Unlock()
				return line
			}
		}
		l.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Fatalf("no log line with %q; got:\n%s", parts, strings.Join(l.lines, "\n"))
	return ""
}

func startServer(t *testing.T, opts ServerOptions) (*Server, *logLines) {
	t.Helper()
	logs := &logLines{}
	if opts.Token == "" {
		opts.Token = testToken
	}
	opts.Logf = logs.logf
	s, err := Serve("127.0.0.1:0", opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s, logs
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func dialT(t *testing.T, addr string, rank int) *Client {
	t.Helper()
	c, err := Dial(ctxFor(t, hang), addr, testToken, rank)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// within runs f and fails the test if it has not returned after hang.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(hang):
		t.Fatalf("%s hung", what)
	}
}

func TestStoreSetGetCheckAdd(t *testing.T) {
	s, _ := startServer(t, ServerOptions{Ranks: 2})
	ctx := ctxFor(t, hang)
	a, b := dialT(t, s.Addr(), 0), dialT(t, s.Addr(), 1)

	ok, err := b.Check(ctx, "addr/0")
	require.NoError(t, err)
	assert.False(t, ok)

	require.NoError(t, a.Set(ctx, "addr/0", []byte("10.0.0.1:4000")))
	v, err := b.Get(ctx, "addr/0")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:4000", string(v))

	ok, err = b.Check(ctx, "addr/0", "addr/1")
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, b.Set(ctx, "addr/1", nil))
	ok, err = a.Check(ctx, "addr/0", "addr/1")
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, a.Wait(ctx, "addr/0", "addr/1"))

	// An empty value is a value; replacing one is allowed.
	v, err = a.Get(ctx, "addr/1")
	require.NoError(t, err)
	assert.Empty(t, v)
	require.NoError(t, a.Set(ctx, "addr/1", []byte("x")))
	v, err = b.Get(ctx, "addr/1")
	require.NoError(t, err)
	assert.Equal(t, "x", string(v))

	n, err := a.Add(ctx, "count", 5)
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	n, err = b.Add(ctx, "count", -7)
	require.NoError(t, err)
	assert.EqualValues(t, -2, n)
	v, err = a.Get(ctx, "count")
	require.NoError(t, err)
	assert.Equal(t, "-2", string(v))

	// A counter over a non-number is refused; the connection goes on.
	_, err = a.Add(ctx, "addr/0", 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"addr/0"`)
	assert.Contains(t, err.Error(), "not a decimal integer")
	require.NoError(t, a.Set(ctx, "big", []byte(strconv.FormatInt(1<<63-1, 10))))
	_, err = a.Add(ctx, "big", 1)
	require.ErrorContains(t, err, "overflow")
	n, err = a.Add(ctx, "count", 0)
	require.NoError(t, err)
	assert.EqualValues(t, -2, n)
}

func TestStoreManyClients(t *testing.T) {
	const n = 8
	s, _ := startServer(t, ServerOptions{Ranks: n})
	ctx := ctxFor(t, hang)
	clients := make([]*Client, n)
	for i := range clients {
		clients[i] = dialT(t, s.Addr(), i)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("rank/%d", i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	totals := make(chan int64, n)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Wait first: most clients wait for keys not yet set.
			got := make(chan error, 1)
			go func() { got <- c.Wait(ctx, keys...) }()
			if err := c.Set(ctx, keys[i], []byte{byte(i)}); err != nil {
				errs <- err
			}
			if err := <-got; err != nil {
				errs <- err
			}
			for j := range n {
				v, err := c.Get(ctx, keys[j])
				if err != nil || len(v) != 1 || int(v[0]) != j {
					errs <- fmt.Errorf("client %d: get %s = %v, %v", i, keys[j], v, err)
				}
			}
			if _, err := c.Add(ctx, "entered", 1); err != nil {
				errs <- err
			}
			if err := c.Barrier(ctx, "after-add", n); err != nil {
				errs <- err
			}
			// After the barrier every Add is visible to everyone.
			v, err := c.Add(ctx, "entered", 0)
			if err != nil {
				errs <- err
			}
			totals <- v
		}()
	}
	wg.Wait()
	close(errs)
	close(totals)
	for err := range errs {
		t.Error(err)
	}
	for v := range totals {
		assert.EqualValues(t, n, v)
	}
}

func TestGetBeforeSetUnblocks(t *testing.T) {
	s, _ := startServer(t, ServerOptions{})
	ctx := ctxFor(t, hang)
	a, b := dialT(t, s.Addr(), 0), dialT(t, s.Addr(), 1)

	// Many calls, on several clients and one connection, wait on one key.
	const waiters = 20
	got := make(chan string, 2*waiters)
	for i := range 2 * waiters {
		c := a
		if i%2 == 1 {
			c = b
		}
		go func() {
			v, err := c.Get(ctx, "nccl-id")
			if err != nil {
				got <- err.Error()
				return
			}
			got <- string(v)
		}()
	}
	wait := make(chan error, 1)
	go func() { wait <- b.Wait(ctx, "nccl-id", "other") }()

	time.Sleep(20 * time.Millisecond) // let the calls reach the store; correctness does not depend on it
	c := dialT(t, s.Addr(), 2)
	require.NoError(t, c.Set(ctx, "nccl-id", []byte("uid")))
	for range 2 * waiters {
		select {
		case v := <-got:
			assert.Equal(t, "uid", v)
		case <-time.After(hang):
			t.Fatal("Get did not wake on Set")
		}
	}
	select {
	case err := <-wait:
		t.Fatalf("Wait returned before all its keys existed: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, c.Set(ctx, "other", []byte("o")))
	select {
	case err := <-wait:
		require.NoError(t, err)
	case <-time.After(hang):
		t.Fatal("Wait did not wake on its last key")
	}
}

// pendingIn counts the store's waiting calls, for checks that a timed-out
// call was cancelled in the store.
func pendingIn(s *Server) int {
	s.mu.Lock()
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	n := 0
	for _, c := range conns {
		c.mu.Lock()
		n += len(c.pending)
		c.mu.Unlock()
	}
	return n
}

func TestTimeoutNamesKeysAndLeavesClientUsable(t *testing.T) {
	s, _ := startServer(t, ServerOptions{})
	c := dialT(t, s.Addr(), 0)
	other := dialT(t, s.Addr(), 1)

	short := func() context.Context { return ctxFor(t, 30*time.Millisecond) }
	_, err := c.Get(short(), "never/set")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), `get "never/set"`)
	assert.Contains(t, err.Error(), s.Addr())

	err = c.Wait(short(), "a-key", "b-key")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), `"a-key"`)
	assert.Contains(t, err.Error(), `"b-key"`)

	err = c.Barrier(short(), "start", 2)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), `barrier "start"`)

	// A cancelled context fails at once as well.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.Get(cctx, "k")
	require.ErrorIs(t, err, context.Canceled)

	// The store dropped the abandoned calls...
	require.Eventually(t, func() bool { return pendingIn(s) == 0 }, hang, 5*time.Millisecond)

	// ...and the client goes on: the key set later is read, and the
	// barrier it left counts it again when it re-enters.
	ctx := ctxFor(t, hang)
	require.NoError(t, other.Set(ctx, "never/set", []byte("now")))
	v, err := c.Get(ctx, "never/set")
	require.NoError(t, err)
	assert.Equal(t, "now", string(v))

	done := make(chan error, 1)
	go func() { done <- other.Barrier(ctx, "start", 2) }()
	select {
	case err := <-done:
		t.Fatalf("barrier completed with one client, the timed-out one still counted: %v", err)
	case <-time.After(30 * time.Millisecond):
	}
	require.NoError(t, c.Barrier(ctx, "start", 2))
	require.NoError(t, <-done)
}

func TestBarrierRules(t *testing.T) {
	s, _ := startServer(t, ServerOptions{})
	ctx := ctxFor(t, hang)
	a, b := dialT(t, s.Addr(), 0), dialT(t, s.Addr(), 1)

	// A completed barrier is forgotten once its clients have left.
	require.NoError(t, a.Barrier(ctx, "solo", 1))
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.barriers) == 0
	}, hang, 2*time.Millisecond)
	// While one is still inside, the name is taken.
	s.mu.Lock()
	s.barriers["busy"] = &barrier{n: 2, entered: 2, inside: 1, completed: true, done: make(chan struct{})}
	s.mu.Unlock()
	require.ErrorContains(t, a.Barrier(ctx, "busy", 2), `barrier "busy" completed with 2 clients and some are still leaving it`)
	s.mu.Lock()
	delete(s.barriers, "busy")
	s.mu.Unlock()

	waiting := make(chan error, 1)
	go func() { waiting <- a.Barrier(ctx, "pair", 2) }()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		br := s.barriers["pair"]
		return br != nil && br.entered == 1
	}, hang, 2*time.Millisecond)
	err := b.Barrier(ctx, "pair", 3)
	require.ErrorContains(t, err, `entered for 3 clients, but 1 already wait in it for 2`)
	require.NoError(t, b.Barrier(ctx, "pair", 2))
	require.NoError(t, <-waiting)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.barriers) == 0
	}, hang, 2*time.Millisecond)

	// A barrier's name is apart from keys.
	ok, err := a.Check(ctx, "pair")
	require.NoError(t, err)
	assert.False(t, ok)

	require.ErrorContains(t, a.Barrier(ctx, "zero", 0), "client count not in")
}

func TestServerCloseWakesBlockedCalls(t *testing.T) {
	logs := &logLines{}
	s, err := Serve("127.0.0.1:0", ServerOptions{Token: testToken, Logf: logs.logf})
	require.NoError(t, err)
	a, b := dialT(t, s.Addr(), 0), dialT(t, s.Addr(), 1)
	ctx := ctxFor(t, time.Minute) // far beyond hang: the calls must not end by timeout

	errs := make(chan error, 4)
	go func() { _, err := a.Get(ctx, "k"); errs <- err }()
	go func() { errs <- a.Wait(ctx, "k", "j") }()
	go func() { errs <- b.Barrier(ctx, "exit", 3) }()
	go func() { _, err := b.Get(ctx, "other"); errs <- err }()
	require.Eventually(t, func() bool { return pendingIn(s) == 4 }, hang, 2*time.Millisecond)

	within(t, "Server.Close", func() { require.NoError(t, s.Close()) })
	require.NoError(t, s.Close(), "Close is idempotent")
	for range 4 {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, ErrDisconnected)
			assert.Contains(t, err.Error(), "store at "+s.Addr()+" closed the connection")
			assert.Contains(t, err.Error(), "shutting down")
		case <-time.After(hang):
			t.Fatal("a blocked call did not return when the store closed")
		}
	}
	// Later calls fail at once with the same cause.
	err = a.Set(ctx, "k", nil)
	require.ErrorIs(t, err, ErrDisconnected)
	// Closing a store is not a protocol error.
	logs.mu.Lock()
	assert.Empty(t, logs.lines)
	logs.mu.Unlock()
}

// fakeStore accepts one connection, completes the handshake, and hangs up
// once the first request arrives: without a goodbye (""), it is what a
// store's process being killed looks like from the client.
func fakeStore(t *testing.T, goodbye string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		h, err := readHello(nc)
		if err != nil {
			return
		}
		nonce := auth.Nonce{1}
		nc.Write(appendChallenge(nil, challenge{version: protoVersion, status: statusOK, nonce: nonce,
			proof: auth.Proof(testToken, roleStore, nonce, h.nonce, h.claims())}))
		if _, err := io.ReadFull(nc, make([]byte, auth.ProofLen)); err != nil {
			return
		}
		nc.Write(appendWelcome(nil, welcome{maxKey: 64, maxValue: 64}))
		var hdr [headerLen]byte
		io.ReadFull(nc, hdr[:])
		// The whole request is read: unread data would make the close a
		// reset, which may overtake the goodbye.
		io.CopyN(io.Discard, nc, int64(binary.BigEndian.Uint32(hdr[:]))-5)
		if goodbye != "" {
			nc.Write(appendFrame(nil, respGoodbye, 0, []byte(goodbye)))
		}
	}()
	return ln.Addr().String()
}

func TestStoreKilledIsSeenPromptly(t *testing.T) {
	for _, goodbye := range []string{"", "key 100% wrong"} {
		addr := fakeStore(t, goodbye)
		c := dialT(t, addr, 0)
		ctx := ctxFor(t, time.Minute)
		start := time.Now()
		_, err := c.Get(ctx, "k")
		require.ErrorIs(t, err, ErrDisconnected)
		assert.Contains(t, err.Error(), "store at "+addr+" closed the connection")
		if goodbye != "" {
			assert.True(t, strings.HasSuffix(err.Error(), "closed the connection: "+goodbye), err.Error())
		}
		assert.Less(t, time.Since(start), hang)
	}
}

func TestClientCloseEndsItsCalls(t *testing.T) {
	s, _ := startServer(t, ServerOptions{})
	c := dialT(t, s.Addr(), 0)
	errs := make(chan error, 1)
	go func() { _, err := c.Get(ctxFor(t, time.Minute), "k"); errs <- err }()
	require.Eventually(t, func() bool { return pendingIn(s) == 1 }, hang, 2*time.Millisecond)
	within(t, "Client.Close", func() { require.NoError(t, c.Close()) })
	require.NoError(t, c.Close())
	require.ErrorIs(t, <-errs, ErrClientClosed)
	require.ErrorIs(t, c.Set(context.Background(), "k", nil), ErrClientClosed)
	// The store lets go of the departed client's waiting call.
	require.Eventually(t, func() bool { return pendingIn(s) == 0 }, hang, 2*time.Millisecond)
}

func TestHandshakeRefusals(t *testing.T) {
	s, logs := startServer(t, ServerOptions{Ranks: 4})
	tests := []struct {
		name, token string
		rank        int
		want        string
	}{
		{"wrong token", "other-job", 1, "wrong token"},
		{"rank too large", testToken, 4, "rank 4 is not in [0, 4)"},
		{"negative rank", testToken, -1, "rank -1 is not in [0, 4)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxFor(t, hang)
			start := time.Now()
			_, err := Dial(ctx, s.Addr(), tc.token, tc.rank)
			require.ErrorIs(t, err, ErrRefused)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), s.Addr())
			// A retried refusal would run into ctx's deadline (hang); half of
			// it is a wide margin for a loaded machine.
			assert.Less(t, time.Since(start), hang/2, "a refusal is final, not retried")
			line := logs.waitFor(t, "refused", tc.want)
			assert.Contains(t, line, "client 127.0.0.1:", "the log names the remote address")
			assert.NotContains(t, line, "\n")
		})
	}
}

// Two processes claiming one rank: the second is refused at once and
// for good (DialNear does not sweep on), naming the rank and both
// addresses; once the first has gone, the rank can be claimed again.
func TestDuplicateRankIsRefused(t *testing.T) {
	s, logs := startServer(t, ServerOptions{Ranks: 2})
	first, err := Dial(ctxFor(t, hang), s.Addr(), testToken, 1)
	require.NoError(t, err)
	start := time.Now()
	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	_, err = DialNear(ctxFor(t, hang), host, p, 1, testToken, 1)
	require.ErrorIs(t, err, ErrRefused)
	assert.Less(t, time.Since(start), hang/2, "a refusal is final, not retried")
	assert.Regexp(t, `rank 1 is already in the job, from 127\.0\.0\.1:\d+; this process at 127\.0\.0\.1:\d+ claims it too`, err.Error())
	logs.waitFor(t, "refused", "rank 1 is already in the job")
	other, err := Dial(ctxFor(t, hang), s.Addr(), testToken, 0)
	require.NoError(t, err, "another rank still joins")
	require.NoError(t, other.Close())
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool {
		c, err := Dial(ctxFor(t, hang), s.Addr(), testToken, 1)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, hang, 10*time.Millisecond, "the rank is free again once its connection closed")
}

// A store of the same job that refuses the token ends the search (the
// job's processes were given different tokens), at once when the
// launcher named the job and after sameJobGrace when only the master
// address did; another job's store refusing it is swept past, as before.
// The store hears of the process of its job with the wrong token.
func TestTokenRefusedByOwnJobIsFinal(t *testing.T) {
	const job = "0123456789abcdef"
	misfits := make(chan Misfit, 64)
	s, _ := startServer(t, ServerOptions{Ranks: 2, JobID: job, OnMisfit: func(m Misfit) {
		select {
		case misfits <- m:
		default:
		}
	}})
	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	start := time.Now()
	_, err = DialNearAs(ctxFor(t, hang), host, p, 1, Member{Token: "a-different-token", Rank: 1, Job: job, JobNamed: true})
	require.ErrorIs(t, err, ErrRefused)
	assert.Less(t, time.Since(start), hang/2, "final, not swept again")
	assert.Contains(t, err.Error(), "it is this job's store (job 0123456789abcdef), so the job's processes were given different tokens")
	m := <-misfits
	assert.Equal(t, 1, m.Rank)
	assert.True(t, m.Unproven)
	assert.Contains(t, m.Reason, "names this job but holds another token")

	defer func(g time.Duration) { sameJobGrace = g }(sameJobGrace)
	sameJobGrace = 200 * time.Millisecond
	start = time.Now()
	_, err = DialNearAs(ctxFor(t, hang), host, p, 1, Member{Token: "a-different-token", Rank: 1, Job: job})
	require.ErrorIs(t, err, ErrRefused)
	assert.GreaterOrEqual(t, time.Since(start), sameJobGrace, "another job on the same master address gets its grace")
	assert.Contains(t, err.Error(), "no other store on ports")
	require.Eventually(t, func() bool { return len(misfits) > 0 }, hang, time.Millisecond)
	for len(misfits) > 0 {
		<-misfits
	}

	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = DialNearAs(short, host, p, 1, Member{Token: "a-different-token", Rank: 0, Job: "fedcba9876543210", JobNamed: true})
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "another job's store is swept past until the context ends")
	for len(misfits) > 0 {
		assert.Equal(t, 1, (<-misfits).Rank, "a process of another job is no misfit of this one")
	}

	a := JobIdentity(World{Launcher: "slurm", JobID: "77", Size: 2, MasterAddr: "h", MasterPort: 1})
	assert.Len(t, a, 16)
	assert.NotEqual(t, a, JobIdentity(World{Launcher: "slurm", JobID: "78", Size: 2, MasterAddr: "h", MasterPort: 1}))
	assert.Equal(t, a, JobIdentity(World{Launcher: "slurm", JobID: "77", Size: 3, MasterAddr: "h", MasterPort: 1}), "a process told another size is of the same job (and refused for it)")
	plain := JobIdentity(World{Size: 2, MasterAddr: "h", MasterPort: 1})
	assert.Len(t, plain, 16, "without a launcher's id the master address names the job")
	assert.NotEqual(t, plain, JobIdentity(World{Size: 2, MasterAddr: "h", MasterPort: 2}))
}

// A process told another job size than rank 0 is refused for good, and
// the store hears of it: WORLD_SIZE differing between processes fails the
// job at once instead of after a timeout.
func TestSizeMismatchIsFinal(t *testing.T) {
	misfits := make(chan Misfit, 1)
	s, _ := startServer(t, ServerOptions{Ranks: 2, OnMisfit: func(m Misfit) { misfits <- m }})
	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	_, err = DialNearAs(ctxFor(t, hang), host, p, 1, Member{Token: testToken, Rank: 1, Size: 3})
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "was told the job has 3 processes, the store's process (rank 0) was told 2")
	m := <-misfits
	assert.Equal(t, 1, m.Rank)
	assert.False(t, m.Unproven)
	c, err := DialNearAs(ctxFor(t, hang), host, p, 1, Member{Token: testToken, Rank: 1, Size: 2})
	require.NoError(t, err)
	c.Close()
}

// The token never crosses the wire: every byte of a handshake that
// succeeds, and of one that fails, passes a recorder that finds neither
// token, nor its hex or base64 forms.
func TestTokenNeverOnTheWire(t *testing.T) {
	const token = "a-secret-token-that-must-not-leak"
	s, err := Serve("127.0.0.1:0", ServerOptions{Token: token, Ranks: 2})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	rec := newRecordingProxy(t, s.Addr())
	c, err := Dial(ctxFor(t, hang), rec.addr, token, 1)
	require.NoError(t, err)
	require.NoError(t, c.Set(ctxFor(t, hang), "k", []byte("v")))
	c.Close()
	_, err = Dial(ctxFor(t, hang), rec.addr, token+"-wrong", 0)
	require.ErrorIs(t, err, ErrRefused)
	wire := rec.bytes()
	require.Contains(t, string(wire), magic, "the recorder saw the handshakes")
	for _, form := range []string{token, token + "-wrong", hex.EncodeToString([]byte(token)), base64.StdEncoding.EncodeToString([]byte(token))} {
		assert.NotContains(t, string(wire), form)
	}
	// Two handshakes never send the same bytes: nothing to replay. The
	// second is rank 1's again, on a store of its own: this store may not
	// yet have seen the first connection close through the proxy, and
	// would refuse a second rank 1 (a loaded machine did).
	s2, err := Serve("127.0.0.1:0", ServerOptions{Token: token, Ranks: 2})
	require.NoError(t, err)
	t.Cleanup(func() { s2.Close() })
	again := newRecordingProxy(t, s2.Addr())
	c, err = Dial(ctxFor(t, hang), again.addr, token, 1)
	require.NoError(t, err)
	c.Close()
	first := wire[:min(len(wire), len(again.bytes()))]
	assert.NotEqual(t, first, again.bytes()[:len(first)])
}

// recordingProxy forwards connections to a store, keeping every byte in
// either direction.
type recordingProxy struct {
	addr string
	mu   sync.Mutex
	buf  []byte
}

func newRecordingProxy(t *testing.T, target string) *recordingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	p := &recordingProxy{addr: ln.Addr().String()}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			pipe := func(dst, src net.Conn) {
				b := make([]byte, 4096)
				for {
					n, err := src.Read(b)
					p.mu.Lock()
					p.buf = append(p.buf, b[:n]...)
					p.mu.Unlock()
					if n > 0 {
						dst.Write(b[:n])
					}
					if err != nil {
						dst.Close()
						src.Close()
						return
					}
				}
			}
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	return p
}

func (p *recordingProxy) bytes() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.buf...)
}

// rawConn connects to addr and, when token is not empty, completes the
// handshake by hand: tests use it to send what no Client would.
func rawConn(t *testing.T, addr, token string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(hang))
	if token != "" {
		w, err := handshake(nc, Member{Token: token, Rank: 0})
		require.NoError(t, err)
		require.Equal(t, statusOK, w.status, w.reason)
	}
	return nc
}

// closedByServer reads until the server hangs up, returning the goodbye
// reason if one came; it fails the test if the server keeps the
// connection open.
func closedByServer(t *testing.T, nc net.Conn) string {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(hang))
	fr := newFrameReader(nc, 0, func(byte) (int, error) { return 1 << 20, nil })
	reason := ""
	for {
		f, err := fr.read()
		if err != nil {
			require.False(t, isTimeout(err), "the server did not close the connection: %v", err)
			return reason
		}
		if f.typ == respGoodbye {
			reason = string(f.body)
		}
	}
}

func TestProtocolViolationsCloseTheConnection(t *testing.T) {
	s, logs := startServer(t, ServerOptions{MaxKey: 16, MaxValue: 64, HandshakeTimeout: 100 * time.Millisecond})
	setBody := func(key string, value []byte) []byte {
		return append(append(u32(uint32(len(key))), key...), value...)
	}
	tests := []struct {
		name  string
		token string // "" sends raw bytes from the first byte
		send  []byte
		want  string
	}{
		{"oversized value", testToken, appendFrame(nil, reqSet, 1, setBody("k", make([]byte, 65))), "exceeds the limit"},
		{"oversized key", testToken, appendFrame(nil, reqGet, 1, make([]byte, 17)), "exceeds the limit of 16"},
		{"oversized key in set", testToken, appendFrame(nil, reqSet, 1, setBody(strings.Repeat("k", 17), nil)), "key of 17 bytes exceeds the limit of 16"},
		{"key length beyond frame", testToken, appendFrame(nil, reqSet, 1, u32(50), []byte("k")), "exceeds the frame"},
		{"empty key", testToken, appendFrame(nil, reqGet, 1), "empty key"},
		{"unknown request type", testToken, appendFrame(nil, 99, 1, []byte("x")), "unknown request type 99"},
		{"short frame", testToken, []byte{0, 0, 0, 2, 1, 0, 0, 0, 0}, "shorter than its type and id"},
		{"truncated frame", testToken, appendFrame(nil, reqGet, 1, []byte("key"))[:10], "stalled inside a get frame body"},
		{"huge length", testToken, []byte{0xff, 0xff, 0xff, 0xff, reqSet, 0, 0, 0, 1}, "exceeds the limit"},
		{"bad key list", testToken, appendFrame(nil, reqWait, 1, u32(3), u32(1), []byte("a")), "truncated at key 1 of 3"},
		{"cancel with body", testToken, appendFrame(nil, reqCancel, 1, []byte("x")), "exceeds the limit of 0"},
		{"http", "", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "not a store client"},
		{"stalled hello", "", []byte(magic + "\x00"), "stalled inside a hello"},
		{"bad version", "", appendHello(nil, hello{version: 9}), "protocol version 9"},
		{"the first protocol", "", append([]byte(magic), 0, 1, 0, 0, 0, 0, 0, 32), "protocol version 1"},
		{"no proof of the token", "", appendHello(nil, hello{version: protoVersion, rank: 1}), "stalled inside a proof of the token"},
		{"short job", "", appendHello(nil, hello{version: protoVersion, rank: 1, job: "job"})[:helloLen+1], "stalled inside a hello's job"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nc := rawConn(t, s.Addr(), tc.token)
			local := nc.LocalAddr().String()
			_, err := nc.Write(tc.send)
			require.NoError(t, err)
			if tc.token != "" {
				reason := closedByServer(t, nc)
				assert.Contains(t, reason, tc.want, "the goodbye says why")
			} else {
				nc.SetReadDeadline(time.Now().Add(hang))
				_, err := io.ReadAll(nc)
				require.False(t, isTimeout(err), "the server kept a refused connection open")
			}
			logs.waitFor(t, "client "+local, tc.want)
		})
	}
	// None of that disturbed the store for others.
	c := dialT(t, s.Addr(), 0)
	ctx := ctxFor(t, hang)
	require.NoError(t, c.Set(ctx, "k", []byte("v")))
	_, err := c.Get(ctx, "k")
	require.NoError(t, err)
}

func TestTooManyWaitingCallsCloseTheConnection(t *testing.T) {
	s, logs := startServer(t, ServerOptions{})
	nc := rawConn(t, s.Addr(), testToken)
	local := nc.LocalAddr().String()
	var frames []byte
	for i := range maxPendingPerConn + 1 {
		frames = appendFrame(frames, reqGet, uint32(i), []byte(fmt.Sprintf("w%d", i)))
	}
	_, err := nc.Write(frames)
	require.NoError(t, err)
	assert.Contains(t, closedByServer(t, nc), "more than 1024 calls waiting")
	logs.waitFor(t, "client "+local, "more than 1024 calls waiting")
	require.Eventually(t, func() bool { return pendingIn(s) == 0 }, hang, 2*time.Millisecond)
}

func TestClientRefusesOversizedBeforeSending(t *testing.T) {
	s, _ := startServer(t, ServerOptions{MaxKey: 16, MaxValue: 64})
	c := dialT(t, s.Addr(), 0)
	ctx := ctxFor(t, hang)
	require.ErrorContains(t, c.Set(ctx, "k", make([]byte, 65)), "value of 65 bytes exceeds the store's limit of 64")
	require.ErrorContains(t, c.Set(ctx, strings.Repeat("k", 17), nil), "key of 17 bytes exceeds the store's limit of 16")
	_, err := c.Get(ctx, "")
	require.ErrorContains(t, err, "empty key")
	require.ErrorContains(t, c.Wait(ctx), "0 keys")
	// The connection was never put at risk.
	require.NoError(t, c.Set(ctx, "k", make([]byte, 64)))
}

func TestSlowClientDoesNotBlockOthers(t *testing.T) {
	s, _ := startServer(t, ServerOptions{HandshakeTimeout: time.Minute})
	// One connection stuck in its handshake, one stuck inside a frame.
	stuck := rawConn(t, s.Addr(), "")
	_, err := stuck.Write([]byte(magic))
	require.NoError(t, err)
	mid := rawConn(t, s.Addr(), testToken)
	_, err = mid.Write(appendFrame(nil, reqSet, 1, u32(1), []byte("k"), make([]byte, 100))[:20])
	require.NoError(t, err)

	c := dialT(t, s.Addr(), 0)
	ctx := ctxFor(t, hang)
	require.NoError(t, c.Set(ctx, "x", []byte("y")))
	_, err = c.Get(ctx, "x")
	require.NoError(t, err)
	// Close does not wait for them either.
	within(t, "Server.Close with stuck clients", func() { require.NoError(t, s.Close()) })
}

func TestDialRetriesUntilTheStoreStarts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	type result struct {
		c   *Client
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := Dial(ctxFor(t, hang), addr, testToken, 1)
		res <- result{c, err}
	}()
	time.Sleep(50 * time.Millisecond)
	s, err := Serve(addr, ServerOptions{Token: testToken})
	require.NoError(t, err)
	defer s.Close()
	r := <-res
	require.NoError(t, r.err)
	defer r.c.Close()
	require.NoError(t, r.c.Set(ctxFor(t, hang), "k", nil))
}

// Dial tries until its context ends and then names the last attempt that
// said something: here, a port nothing listens on refuses. The port is
// one below the ephemeral range (consecutivePorts), so no other
// process's connection takes it meanwhile, and the context lasts long
// enough for an attempt to end before it even on a loaded machine (with
// 250 ms, two test suites and a spinning core on two CPUs once cut the
// first attempt short, which then said only "i/o timeout").
func TestDialGivesUpWithTheLastError(t *testing.T) {
	_, lns := consecutivePorts(t, 1)
	addr := lns[0].Addr().String()
	require.NoError(t, lns[0].Close())
	_, err := Dial(ctxFor(t, time.Second), addr, testToken, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), addr)
	assert.Contains(t, err.Error(), "refused")
}

// speaker is a TCP service that is not a store: it greets every
// connection with a line of its own protocol and hangs up.
func speaker(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			nc.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			nc.Close()
		}
	}()
}

// consecutivePorts holds n consecutive free loopback ports. They are
// sought below Linux's ephemeral range, which lingering client sockets
// (TIME_WAIT after a fuzzing run, say) can fill.
func consecutivePorts(t *testing.T, n int) (int, []net.Listener) {
	t.Helper()
	for range 200 {
		base := 15000 + mrand.IntN(17000)
		var lns []net.Listener
		for i := range n {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) == n {
			return base, lns
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
	t.Fatal("no run of free ports")
	return 0, nil
}

func TestServeNearAndDialNear(t *testing.T) {
	base, lns := consecutivePorts(t, 4)
	// base: a service that is not a store; base+1: another job's store;
	// base+2: ours (ServeNear must skip the busy base+1... and base);
	// base+3: left free.
	speaker(t, lns[0])
	require.NoError(t, lns[1].Close())
	otherJob, err := Serve(lns[1].Addr().String(), ServerOptions{Token: "other-job"})
	require.NoError(t, err)
	defer otherJob.Close()
	require.NoError(t, lns[2].Close())
	require.NoError(t, lns[3].Close())

	logs := &logLines{}
	ours, err := ServeNear("127.0.0.1", base, 4, ServerOptions{Token: testToken, Logf: logs.logf})
	require.NoError(t, err)
	defer ours.Close()
	assert.Equal(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(base+2)), ours.Addr())

	c, err := DialNear(ctxFor(t, hang), "127.0.0.1", base, 4, testToken, 3)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, ours.Addr(), c.Addr())
	require.NoError(t, c.Set(ctxFor(t, hang), "k", nil))

	// With our store gone, the sweep reports every port.
	require.NoError(t, ours.Close())
	_, err = DialNear(ctxFor(t, 400*time.Millisecond), "127.0.0.1", base, 4, testToken, 3)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	msg := err.Error()
	assert.Contains(t, msg, fmt.Sprintf("%d: ", base))
	assert.Contains(t, msg, "not a gcompile store")
	assert.Contains(t, msg, "SSH-2.0")
	assert.Contains(t, msg, "wrong token")
	assert.Contains(t, msg, fmt.Sprintf("%d: dial tcp", base+2))
}

func TestDialNearRankRefusalIsFinal(t *testing.T) {
	s, _ := startServer(t, ServerOptions{Ranks: 2})
	port := s.ln.Addr().(*net.TCPAddr).Port
	start := time.Now()
	_, err := DialNear(ctxFor(t, hang), "127.0.0.1", port, 1, testToken, 7)
	require.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "rank 7 is not in [0, 2)")
	assert.Less(t, time.Since(start), hang/2, "a refusal is final, not retried until the deadline")
}

func TestServeNearAllBusy(t *testing.T) {
	base, lns := consecutivePorts(t, 2)
	for _, ln := range lns {
		defer ln.Close()
	}
	_, err := ServeNear("127.0.0.1", base, 2, ServerOptions{Token: testToken})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("%d: ", base))
	assert.Contains(t, err.Error(), fmt.Sprintf("%d: ", base+1))
	assert.Contains(t, err.Error(), "address already in use")
	assert.Equal(t, 1, strings.Count(err.Error(), "store:"), "one prefix, not one per port")
}

func TestOptionAndRangeErrors(t *testing.T) {
	bad := []struct {
		opts ServerOptions
		want string
	}{
		{ServerOptions{}, "Token is empty"},
		{ServerOptions{Token: "t", Ranks: -1}, "Ranks -1"},
		{ServerOptions{Token: "t", MaxKey: 1 << 17}, "MaxKey"},
		{ServerOptions{Token: "t", MaxValue: 4}, "MaxValue 4"},
		{ServerOptions{Token: "t", HandshakeTimeout: -1}, "HandshakeTimeout"},
	}
	for _, tc := range bad {
		_, err := Serve("127.0.0.1:0", tc.opts)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := ServeNear("127.0.0.1", 65535, 2, ServerOptions{Token: "t"})
	require.ErrorContains(t, err, "not within 1..65535")
	_, err = DialNear(context.Background(), "127.0.0.1", 100, 0, "t", 0)
	require.ErrorContains(t, err, "port count 0")
	_, err = Serve("nonsense", ServerOptions{Token: "t"})
	require.ErrorContains(t, err, `"nonsense"`)
}

func TestServeDefaultsToLoopback(t *testing.T) {
	s, err := Serve(":0", ServerOptions{Token: testToken})
	require.NoError(t, err)
	defer s.Close()
	host, _, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
}

func TestWaitDrainedAndExitSequence(t *testing.T) {
	const n = 4
	s, err := Serve("127.0.0.1:0", ServerOptions{Token: testToken, Ranks: n})
	require.NoError(t, err)

	// Too early: nobody has come yet.
	err = s.WaitDrained(ctxFor(t, 20*time.Millisecond), n)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "0 joined")

	clients := make([]*Client, n)
	for i := range clients {
		clients[i] = dialT(t, s.Addr(), i)
	}
	err = s.WaitDrained(ctxFor(t, 20*time.Millisecond), n)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "4 still connected")

	// The exit sequence: everyone enters the exit barrier and closes; the
	// host waits for the others to leave before closing the store.
	ctx := ctxFor(t, hang)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Stagger the exits; the host must wait for the slowest.
			time.Sleep(time.Duration(i) * 5 * time.Millisecond)
			errs <- clients[i].Barrier(ctx, "exit", n)
			clients[i].Close()
		}()
	}
	require.NoError(t, clients[0].Barrier(ctx, "exit", n))
	require.NoError(t, clients[0].Close())
	require.NoError(t, s.WaitDrained(ctx, n))
	require.NoError(t, s.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a rank saw the store close inside its exit barrier")
	}
	require.Error(t, s.WaitDrained(ctx, n+1), "a closed store drains no more")
}

func TestBindHost(t *testing.T) {
	mine := func() []net.IP {
		return []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.1.2.3"), net.ParseIP("fe80::1")}
	}
	names := map[string][]net.IP{
		"me":         {net.ParseIP("10.1.2.3")},
		"me-dual":    {net.ParseIP("127.0.1.1"), net.ParseIP("10.1.2.3")},
		"loop-only":  {net.ParseIP("127.0.1.1")},
		"elsewhere":  {net.ParseIP("10.9.9.9")},
		"localhost2": {net.ParseIP("127.0.0.1")},
	}
	lookup := func(h string) ([]net.IP, error) {
		if ips, ok := names[h]; ok {
			return ips, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: h, IsNotFound: true}
	}
	tests := []struct{ in, want string }{
		{"", "127.0.0.1"},
		{"localhost", "127.0.0.1"},
		{"LOCALHOST.", "127.0.0.1"},
		{"box.localhost", "127.0.0.1"},
		{"127.0.0.1", "127.0.0.1"},
		{"::1", "::1"},
		{"[::1]", "::1"},
		{"127.0.1.1", "127.0.1.1"},
		{"10.1.2.3", "10.1.2.3"},
		{"fe80::1", "fe80::1"},
		{"10.9.9.9", "0.0.0.0"},
		{"me", "10.1.2.3"},
		{"me-dual", "10.1.2.3"},
		{"loop-only", "0.0.0.0"},
		{"localhost2", "0.0.0.0"},
		{"elsewhere", "0.0.0.0"},
		{"unknown", "0.0.0.0"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, bindHost(tc.in, lookup, mine), tc.in)
	}
	// The real resolver and interfaces agree on the plain cases.
	assert.Equal(t, "127.0.0.1", BindHost(""))
	assert.Equal(t, "127.0.0.1", BindHost("127.0.0.1"))
	assert.Equal(t, "0.0.0.0", BindHost("192.0.2.1"), "TEST-NET-1 is nobody's interface")
}

func TestReplyFramesSurviveConcurrency(t *testing.T) {
	// Large values and waits interleave on one connection; every reply
	// must reach its own call.
	s, _ := startServer(t, ServerOptions{})
	c := dialT(t, s.Addr(), 0)
	ctx := ctxFor(t, hang)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("v%d", i)
			val := make([]byte, 300<<10+i)
			binary.BigEndian.PutUint32(val, uint32(i))
			go func() { assert.NoError(t, c.Set(ctx, key, val)) }()
			got, err := c.Get(ctx, key)
			if assert.NoError(t, err) {
				assert.Len(t, got, len(val))
				assert.EqualValues(t, i, binary.BigEndian.Uint32(got))
			}
		}()
	}
	wg.Wait()
}

func TestErrorsAreDistinct(t *testing.T) {
	for _, e := range []error{ErrRefused, ErrNotStore, ErrDisconnected, ErrClientClosed} {
		for _, f := range []error{ErrRefused, ErrNotStore, ErrDisconnected, ErrClientClosed} {
			assert.Equal(t, e == f, errors.Is(e, f))
		}
	}
}
