package comm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/runtime"
)

// memDir is an in-memory Directory: what the rendezvous store is to a
// job, for processes simulated in one test binary.
type memDir struct {
	mu   sync.Mutex
	cond *sync.Cond
	kv   map[string][]byte
}

func newMemDir() *memDir {
	d := &memDir{kv: map[string][]byte{}}
	d.cond = sync.NewCond(&d.mu)
	return d
}

func (d *memDir) Set(_ context.Context, key string, value []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kv[key] = append([]byte(nil), value...)
	d.cond.Broadcast()
	return nil
}

func (d *memDir) Get(ctx context.Context, key string) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if v, ok := d.kv[key]; ok {
			return v, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		d.cond.Wait()
	}
}

// newNets connects procs simulated processes holding devices ranks
// between them over loopback TCP, one Net each.
func newNets(t *testing.T, devices, procs int, timeout time.Duration) []*Net {
	t.Helper()
	dir := newMemDir()
	nets := make([]*Net, procs)
	errs := make([]error, procs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for p := range procs {
		wg.Go(func() {
			cfg := NetConfig{Layout: runtime.Layout{Devices: devices, Procs: procs, Proc: p}, Token: "job-token", Timeout: timeout}
			nets[p], errs[p] = NewNet(ctx, cfg, dir)
		})
	}
	wg.Wait()
	for p, err := range errs {
		require.NoError(t, err, "process %d", p)
	}
	t.Cleanup(func() {
		for _, n := range nets {
			n.Close()
		}
	})
	return nets
}

// netOf is the Net of the process holding rank.
func netOf(nets []*Net, rank int) *Net { return nets[nets[0].layout.ProcOf(rank)] }

// Every collective gives, across processes, the very bits Local gives,
// for groups that span processes in orders unlike rank order.
func TestNetMatchesLocalBitForBit(t *testing.T) {
	const devices, procs = 6, 3
	nets := newNets(t, devices, procs, 5*time.Second)
	for _, n := range nets {
		// Many chunks per message, cut inside elements' runs and across
		// the bucket's buffers (the default size is met between two
		// processes in TestNetBetweenTwoProcesses).
		n.chunk = 328
	}
	local := NewLocal(devices)
	rng := rand.New(rand.NewPCG(1, 2))
	groups := []runtime.Group{
		{Ranks: []int{0, 1, 2, 3, 4, 5}},
		{Ranks: []int{5, 0, 3}},
		{Ranks: []int{1, 4}},
		{Ranks: []int{2, 3}, Channel: "host"},
	}
	type run func(c runtime.Comm, g runtime.Group, p, rank int) ([][]float32, error)
	cases := map[string]run{}
	for _, n := range []int{1, 7, 1001} {
		ins := make([][]float32, devices)
		for r := range ins {
			ins[r] = randSlice[float32](rng, 6*n)
			for i := range ins[r] {
				ins[r][i] *= float32(int(1) << (r * 3))
			}
		}
		cases[fmt.Sprintf("AllReduce bucket %d", n)] = func(c runtime.Comm, g runtime.Group, p, rank int) ([][]float32, error) {
			a, b := append([]float32(nil), ins[rank][:n]...), append([]float32(nil), ins[rank][n:]...)
			err := AllReduce(c, g, rank, a, b)
			return [][]float32{a, b}, err
		}
		cases[fmt.Sprintf("ReduceScatter %d", n)] = func(c runtime.Comm, g runtime.Group, p, rank int) ([][]float32, error) {
			k := len(ins[rank]) / 6
			in := ins[rank][:k*g.Size()]
			out := make([]float32, k)
			return [][]float32{out}, ReduceScatter(c, g, rank, in, out)
		}
		cases[fmt.Sprintf("AllGather %d", n)] = func(c runtime.Comm, g runtime.Group, p, rank int) ([][]float32, error) {
			out := make([]float32, n*g.Size())
			return [][]float32{out}, AllGather(c, g, rank, ins[rank][:n], out)
		}
		cases[fmt.Sprintf("AllToAll %d", n)] = func(c runtime.Comm, g runtime.Group, p, rank int) ([][]float32, error) {
			in := ins[rank][:n*g.Size()]
			out := make([]float32, len(in))
			return [][]float32{out}, AllToAll(c, g, rank, in, out)
		}
		cases[fmt.Sprintf("Broadcast %d", n)] = func(c runtime.Comm, g runtime.Group, p, rank int) ([][]float32, error) {
			buf := append([]float32(nil), ins[rank][:n]...)
			return [][]float32{buf}, Broadcast(c, g, rank, g.Size()-1, buf)
		}
	}
	for name, f := range cases {
		for _, g := range groups {
			t.Run(fmt.Sprintf("%s/%v", name, g), func(t *testing.T) {
				want := runMembersOut(t, g, func(p, r int) ([][]float32, error) { return f(local, g, p, r) })
				got := runMembersOut(t, g, func(p, r int) ([][]float32, error) { return f(netOf(nets, r), g, p, r) })
				for p := range want {
					for i := range want[p] {
						assert.Equal(t, bitsOf(want[p][i]), bitsOf(got[p][i]), "position %d buffer %d", p, i)
					}
				}
			})
		}
	}
	for _, n := range nets {
		assert.Zero(t, n.Pending(), "every message was taken")
	}
}

// runMembersOut calls f for every member of g concurrently and returns
// its buffers by position; every call must succeed.
func runMembersOut(t *testing.T, g runtime.Group, f func(p, r int) ([][]float32, error)) [][][]float32 {
	t.Helper()
	out := make([][][]float32, g.Size())
	errs := runMembers(t, g, func(p, r int) error {
		var err error
		out[p], err = f(p, r)
		return err
	})
	for p, err := range errs {
		require.NoError(t, err, "position %d", p)
	}
	return out
}

func TestNetBarrierAndSendRecv(t *testing.T) {
	nets := newNets(t, 4, 2, 5*time.Second)
	g := runtime.Group{Ranks: []int{3, 0, 2, 1}}
	errs := runMembers(t, g, func(p, r int) error { return netOf(nets, r).Barrier(g, r) })
	for _, err := range errs {
		require.NoError(t, err)
	}
	// Sends are buffered and FIFO per (from, to, tag), across processes
	// and inside one.
	for _, pair := range [][2]int{{0, 3}, {3, 0}, {0, 1}} {
		from, to := pair[0], pair[1]
		for i := range 5 {
			require.NoError(t, Send(netOf(nets, from), from, to, 7, []float64{float64(i), -1}))
		}
		require.NoError(t, Send(netOf(nets, from), from, to, 8, []int32{42}))
		got := make([]int32, 1)
		require.NoError(t, Recv(netOf(nets, to), from, to, 8, got))
		assert.Equal(t, []int32{42}, got, "tags are matched apart")
		for i := range 5 {
			buf := make([]float64, 2)
			require.NoError(t, Recv(netOf(nets, to), from, to, 7, buf))
			assert.Equal(t, []float64{float64(i), -1}, buf)
		}
	}
	st := nets[0].Stats()
	assert.Equal(t, int64(1), st.Barrier)
	assert.Positive(t, st.SendRecv)
}

func TestNetRefusesCallsItCannotMake(t *testing.T) {
	nets := newNets(t, 4, 2, time.Second)
	err := AllReduce(nets[0], runtime.Group{Ranks: []int{2, 3}}, 2, make([]float32, 1))
	assert.ErrorIs(t, err, runtime.ErrGroup)
	assert.ErrorContains(t, err, "rank 2 is held by process 1, not this one (0)")
	err = Send(nets[0], 2, 0, 1, make([]float32, 1))
	assert.ErrorContains(t, err, "rank 2 is held by process 1")
	err = Recv(nets[0], 1, 1, 1, make([]float32, 1))
	assert.ErrorContains(t, err, "a device cannot send to itself")
	err = nets[0].AllGather(runtime.Group{Ranks: []int{0, 9}}, 0, ir.F32, make([]byte, 4), make([]byte, 8))
	assert.ErrorContains(t, err, "rank 9 at position 1 is outside [0,4)")
}

// Members that disagree fail, each with the rule broken or with the
// abort that the first to notice sends, and the job stops rather than
// hangs.
func TestNetMismatchFailsEveryMember(t *testing.T) {
	nets := newNets(t, 2, 2, 5*time.Second)
	g := runtime.Group{Ranks: []int{0, 1}}
	errs := runMembers(t, g, func(p, r int) error {
		if p == 0 {
			return AllReduce(nets[0], g, r, make([]float32, 3))
		}
		return AllReduce(nets[1], g, r, make([]float32, 4))
	})
	for p, err := range errs {
		require.Error(t, err, "position %d", p)
		assert.True(t, errors.Is(err, runtime.ErrMismatch) || errors.Is(err, runtime.ErrAborted), "position %d: %v", p, err)
	}
	joined := errs[0].Error() + errs[1].Error()
	assert.Contains(t, joined, "members disagree on the bucket")
	assert.Contains(t, joined, "3 elements in 1 buffers")
}

// A rank that never comes is named by the timeout; the others learn of
// it through the abort.
func TestNetTimeoutNamesTheMissingRank(t *testing.T) {
	nets := newNets(t, 3, 3, 300*time.Millisecond)
	g := runtime.Group{Ranks: []int{0, 1, 2}}
	errs := make([]error, 2)
	within(t, func() {
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() { errs[r] = AllReduce(nets[r], g, r, make([]float32, 5)) })
		}
		wg.Wait()
	})
	joined := errors.Join(errs...).Error()
	assert.Contains(t, joined, "timed out after 300ms waiting for rank 2 (process 2 (rank 2 at")
	for r, err := range errs {
		assert.True(t, errors.Is(err, runtime.ErrTimeout) || errors.Is(err, runtime.ErrAborted), "rank %d: %v", r, err)
	}
	// The third process hears of it too and fails fast.
	within(t, func() {
		err := AllReduce(nets[2], g, 2, make([]float32, 5))
		assert.ErrorIs(t, err, runtime.ErrAborted)
	})
}

// A process whose connections drop (killed, or its machine gone) fails
// the calls waiting on it at once, naming it, not after the timeout.
func TestNetLostProcessFailsWaitersPromptly(t *testing.T) {
	nets := newNets(t, 2, 2, time.Minute)
	done := make(chan error, 1)
	go func() { done <- Recv(nets[0], 1, 0, 3, make([]float32, 2)) }()
	time.Sleep(20 * time.Millisecond)
	nets[1].closeConns() // no goodbye: as if the process died
	select {
	case err := <-done:
		assert.ErrorIs(t, err, runtime.ErrPeerLost)
		assert.ErrorContains(t, err, "process 1 (rank 1 at")
		assert.ErrorContains(t, err, "connection lost")
	case <-time.After(5 * time.Second):
		t.Fatal("the receiver still waits for a process that is gone")
	}
}

// An abort in one process reaches the calls of every other.
func TestNetAbortReachesOtherProcesses(t *testing.T) {
	nets := newNets(t, 4, 2, time.Minute)
	g := runtime.Group{Ranks: []int{2, 3}}
	done := make(chan error, 1)
	go func() { done <- AllReduce(nets[1], g, 2, make([]float64, 2)) }()
	time.Sleep(20 * time.Millisecond)
	nets[0].Abort(errors.New("device 1: step 4: kernel failed"))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, runtime.ErrAborted)
		assert.ErrorContains(t, err, "process 0 (ranks 0–1 at")
		assert.ErrorContains(t, err, "aborted the job: device 1: step 4: kernel failed")
	case <-time.After(5 * time.Second):
		t.Fatal("the abort did not reach the other process")
	}
}

func TestNetRefusesAWrongToken(t *testing.T) {
	dir := newMemDir()
	var logged []string
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() {
			cfg := NetConfig{Layout: runtime.Layout{Devices: 2, Procs: 2, Proc: p}, Token: fmt.Sprint("token-", p),
				Logf: func(f string, a ...any) { mu.Lock(); logged = append(logged, fmt.Sprintf(f, a...)); mu.Unlock() }}
			var n *Net
			n, errs[p] = NewNet(ctx, cfg, dir)
			if n != nil {
				n.Close()
			}
		})
	}
	wg.Wait()
	assert.ErrorContains(t, errs[1], "connection refused by the peer: wrong job token")
	assert.ErrorContains(t, errs[0], "process(es) [1] never connected")
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, logged)
	assert.Contains(t, logged[0], "refused a connection from 127.0.0.1:")
	assert.Contains(t, logged[0], "wrong job token")
}

// Garbage on a comm port is refused and logged; the job's own
// connections are unaffected.
func TestNetSurvivesAStrayConnection(t *testing.T) {
	dir := newMemDir()
	var mu sync.Mutex
	var logged []string
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nets := make([]*Net, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		cfg := NetConfig{Layout: runtime.Layout{Devices: 2, Procs: 2, Proc: 0}, Token: "t",
			Logf: func(f string, a ...any) { mu.Lock(); logged = append(logged, fmt.Sprintf(f, a...)); mu.Unlock() }}
		nets[0], errs[0] = NewNet(ctx, cfg, dir)
	})
	addr, err := dir.Get(ctx, "comm/addr/0")
	require.NoError(t, err)
	c, err := net.Dial("tcp", string(addr))
	require.NoError(t, err)
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	c.Close()
	wg.Go(func() {
		nets[1], errs[1] = NewNet(ctx, NetConfig{Layout: runtime.Layout{Devices: 2, Procs: 2, Proc: 1}, Token: "t"}, dir)
	})
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	defer nets[0].Close()
	defer nets[1].Close()
	mu.Lock()
	assert.True(t, strings.Contains(strings.Join(logged, "\n"), "not a gcompile comm handshake"), "%q", logged)
	mu.Unlock()
	g := runtime.Group{Ranks: []int{0, 1}}
	errs = runMembers(t, g, func(p, r int) error { return AllReduce(nets[r], g, r, []float32{1}) })
	require.NoError(t, errors.Join(errs...))
}

// BenchmarkNetAllReduce is the bandwidth of an all-reduce between two
// processes' worth of Net over loopback TCP (one OS process here; see
// BenchmarkNetProcessAllReduce for two real processes), in bus bandwidth:
// 2·(n−1)/n · bytes per second, NCCL's convention.
func BenchmarkNetAllReduce(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			dir := newMemDir()
			nets := make([]*Net, 2)
			var wg sync.WaitGroup
			for p := range 2 {
				wg.Go(func() {
					var err error
					nets[p], err = NewNet(context.Background(), NetConfig{Layout: runtime.Layout{Devices: 2, Procs: 2, Proc: p}, Token: "t"}, dir)
					if err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			if b.Failed() {
				return
			}
			defer nets[0].Close()
			defer nets[1].Close()
			benchAllReduce(b, size, [2]runtime.Comm{nets[0], nets[1]})
		})
	}
}

// recordConn keeps every byte written through it.
type recordConn struct {
	net.Conn
	mu  *sync.Mutex
	out *[]byte
}

func (r recordConn) Write(b []byte) (int, error) {
	r.mu.Lock()
	*r.out = append(*r.out, b...)
	r.mu.Unlock()
	return r.Conn.Write(b)
}

// The handshake between two processes proves the token without sending
// it, refuses a dialer with another token on either side's word, and
// never repeats its bytes.
func TestHandshakeKeepsTheTokenOffTheWire(t *testing.T) {
	const token = "comm-secret-token"
	run := func(dialToken, acceptToken string) (wire []byte, dialErr, acceptErr error) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		var mu sync.Mutex
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, acceptErr = acceptHandshake(recordConn{b, &mu, &wire}, 0, 2, acceptToken, func(int) error { return nil })
		}()
		dialErr = dialHandshake(recordConn{a, &mu, &wire}, 1, 0, dialToken)
		<-done
		return wire, dialErr, acceptErr
	}
	wire, dErr, aErr := run(token, token)
	require.NoError(t, dErr)
	require.NoError(t, aErr)
	assert.NotContains(t, string(wire), token)
	again, _, _ := run(token, token)
	assert.NotEqual(t, wire, again, "fresh nonces every time")

	wire, dErr, aErr = run(token+"-other", token)
	assert.ErrorContains(t, aErr, "wrong job token")
	assert.ErrorIs(t, dErr, errRefused)
	assert.NotContains(t, string(wire), "-other")
	assert.ErrorContains(t, dErr, "wrong job token", "the acceptor's verdict reaches the dialer")
}
