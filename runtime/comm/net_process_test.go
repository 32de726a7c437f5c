package comm

// Net between two real OS processes: the test binary starts itself again
// as the peer, which holds rank 1 and takes its orders from rank 0 over
// the comm itself. Both processes find each other through fileDir, a
// directory both can read.

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime"
)

// fileDir is a Directory over a folder that every process of the job can
// read: one file per key, written whole through a rename so that a reader
// never sees half a value.
type fileDir string

func (d fileDir) path(key string) string {
	return filepath.Join(string(d), hex.EncodeToString([]byte(key)))
}

func (d fileDir) Set(_ context.Context, key string, value []byte) error {
	tmp, err := os.CreateTemp(string(d), ".set-*")
	if err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	_, err = tmp.Write(value)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), d.path(key))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("key %q: %w", key, err)
	}
	return nil
}

func (d fileDir) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		v, err := os.ReadFile(d.path(key))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("key %q: %w", key, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The environment that makes the test binary the peer process: the
// directory to meet in and the job's token.
const (
	peerDirEnv   = "GCOMPILE_COMM_PEER_DIR"
	peerTokenEnv = "GCOMPILE_COMM_PEER_TOKEN"
)

// Orders from rank 0 to the peer, sent as [what, bytes, rounds] on tag
// orderTag before every series of all-reduces.
const (
	orderTag   = 1 << 20
	orderQuit  = 0 // leave: a final barrier, then close
	orderBench = 1 // all-reduce a zero buffer of that many bytes, rounds times, then send back the CPU time taken
	orderCheck = 2 // all-reduce peerInput(1, bytes), then send back the result
)

// peerInput is rank's contribution in the checked all-reduce: values of
// very different magnitudes, so that the order of the sum shows in the
// bits.
func peerInput(rank, size int) []float32 {
	x := make([]float32, size/4)
	for i := range x {
		x[i] = float32(math.Sin(float64(i*(rank+3)))) * float32(int(1)<<(rank*5+i%7))
	}
	return x
}

// TestNetPeerProcess is the peer's side. In an ordinary run it has
// nothing to do; startPeer runs it in a child process.
func TestNetPeerProcess(t *testing.T) {
	dir := os.Getenv(peerDirEnv)
	if dir == "" {
		t.Skip("runs only as the peer process that startPeer starts")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := NetConfig{Layout: runtime.Layout{Devices: 2, Procs: 2, Proc: 1}, Token: os.Getenv(peerTokenEnv), Timeout: 2 * time.Minute}
	n, err := NewNet(ctx, cfg, fileDir(dir))
	require.NoError(t, err)
	defer n.Close()
	g := runtime.Group{Ranks: []int{0, 1}}
	for {
		order := make([]int64, 3)
		require.NoError(t, Recv(n, 0, 1, orderTag, order))
		what, size, rounds := order[0], int(order[1]), order[2]
		switch what {
		case orderQuit:
			require.NoError(t, n.Barrier(g, 1))
			return
		case orderBench:
			buf := make([]float32, size/4)
			require.NoError(t, n.Barrier(g, 1))
			start := cpuTime()
			for range rounds {
				require.NoError(t, AllReduce(n, g, 1, buf))
			}
			require.NoError(t, Send(n, 1, 0, orderTag, []int64{int64(cpuTime() - start)}))
		case orderCheck:
			buf := peerInput(1, size)
			require.NoError(t, AllReduce(n, g, 1, buf))
			require.NoError(t, Send(n, 1, 0, orderTag, buf))
		default:
			t.Fatalf("unknown order %d", what)
		}
	}
}

// peerProc is a running peer process and rank 0's Net to it.
type peerProc struct {
	net *Net
	cmd *exec.Cmd
	out bytes.Buffer
}

// startPeer starts the test binary again as the peer process holding
// rank 1 and connects to it as rank 0.
func startPeer(tb testing.TB) *peerProc {
	tb.Helper()
	dir := tb.TempDir()
	token := strconv.FormatInt(time.Now().UnixNano(), 36)
	p := &peerProc{cmd: exec.Command(os.Args[0], "-test.run=^TestNetPeerProcess$", "-test.count=1", "-test.v")}
	p.cmd.Env = append(os.Environ(), peerDirEnv+"="+dir, peerTokenEnv+"="+token)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	require.NoError(tb, p.cmd.Start())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := NetConfig{Layout: runtime.Layout{Devices: 2, Procs: 2, Proc: 0}, Token: token, Timeout: 2 * time.Minute}
	n, err := NewNet(ctx, cfg, fileDir(dir))
	if err != nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		tb.Fatalf("connecting to the peer process: %v\npeer output:\n%s", err, p.out.String())
	}
	p.net = n
	return p
}

// order tells the peer what to do next.
func (p *peerProc) order(what, size, rounds int) error {
	return Send(p.net, 0, 1, orderTag, []int64{int64(what), int64(size), int64(rounds)})
}

// stop dismisses the peer and waits for it to exit.
func (p *peerProc) stop(tb testing.TB) {
	tb.Helper()
	g := runtime.Group{Ranks: []int{0, 1}}
	err := p.order(orderQuit, 0, 0)
	if err == nil {
		err = p.net.Barrier(g, 0)
	}
	p.net.Close()
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case werr := <-exited:
		err = errors.Join(err, werr)
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		err = errors.Join(err, errors.New("the peer process did not exit"), <-exited)
	}
	if err != nil {
		tb.Errorf("stopping the peer process: %v\npeer output:\n%s", err, p.out.String())
	}
}

// An all-reduce between two processes gives the bits Local gives.
func TestNetBetweenTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second process")
	}
	p := startPeer(t)
	defer p.stop(t)
	g := runtime.Group{Ranks: []int{0, 1}}
	for _, size := range []int{4, 4 * 1001, 3 << 20} {
		require.NoError(t, p.order(orderCheck, size, 1))
		mine := peerInput(0, size)
		require.NoError(t, AllReduce(p.net, g, 0, mine))
		theirs := make([]float32, size/4)
		require.NoError(t, Recv(p.net, 1, 0, orderTag, theirs))

		local := NewLocal(2)
		want := [][]float32{peerInput(0, size), peerInput(1, size)}
		errs := runMembers(t, g, func(_, r int) error { return AllReduce(local, g, r, want[r]) })
		require.NoError(t, errors.Join(errs...))
		assert.Equal(t, bitsOf(want[0]), bitsOf(mine), "rank 0, %d bytes", size)
		assert.Equal(t, bitsOf(want[1]), bitsOf(theirs), "rank 1, %d bytes", size)
	}
}

// BenchmarkNetProcessAllReduce is the bus bandwidth of an all-reduce
// between two OS processes over loopback TCP, one rank each: the test
// binary started again as the second process.
func BenchmarkNetProcessAllReduce(b *testing.B) {
	p := startPeer(b)
	defer p.stop(b)
	g := runtime.Group{Ranks: []int{0, 1}}
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			buf := make([]float32, size/4)
			if err := p.order(orderBench, size, b.N); err != nil {
				b.Fatal(err)
			}
			if err := p.net.Barrier(g, 0); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size)) // busbw = 2·(n−1)/n · size = size for n = 2
			b.ReportAllocs()
			b.ResetTimer()
			start := cpuTime()
			for range b.N {
				if err := AllReduce(p.net, g, 0, buf); err != nil {
					b.Fatal(err)
				}
			}
			mine := cpuTime() - start
			b.StopTimer()
			theirs := make([]int64, 1)
			if err := Recv(p.net, 1, 0, orderTag, theirs); err != nil {
				b.Fatal(err)
			}
			// Both processes' CPU time: what the all-reduce costs the machine.
			b.ReportMetric(float64(mine+time.Duration(theirs[0]))/float64(b.N), "cpu-ns/op")
		})
	}
}
