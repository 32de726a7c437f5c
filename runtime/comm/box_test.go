package comm

import (
	"errors"
	"math/bits"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime"
)

// Frames on a key with a sink land at the offsets their order of arrival
// gives them, whether the sink took them or they were queued (before the
// sink existed, or because their region was not free yet), and the
// receiver takes them in that order.
func TestSinkPlacesFramesInArrivalOrder(t *testing.T) {
	b := newBox()
	k := msgKey{from: 1, to: 0, kind: kindColl, seq: 3}
	hdr := func(n int) header {
		return header{kind: kindColl, op: uint8(opAllGather), dtype: 1, agree1: 10, length: uint64(n)}
	}
	b.put(k, frame{hdr: hdr(4), data: []byte{1, 2, 3, 4}}) // before the sink
	dst := make([]byte, 10)
	var written atomic.Int64
	s := &sink{bufs: [][]byte{dst[:3], dst[3:]}, size: 10, chunk: 4, written: &written,
		want: header{kind: kindColl, op: uint8(opAllGather), dtype: 1, agree1: 10}}
	require.True(t, b.expect(k, s))
	assert.False(t, b.expect(k, &sink{}), "one sink per key")

	// The region of the second frame has not gone out yet: queued.
	written.Store(4)
	got, _ := b.claim(k, hdr(4), nil)
	assert.Nil(t, got)
	b.put(k, frame{hdr: hdr(4), data: []byte{5, 6, 7, 8}})

	// The third may be written: it goes to [8, 10), across no piece.
	written.Store(10)
	assert.Nil(t, func() *sink { s, _ := b.claim(k, hdr(3), nil); return s }(), "a length that does not fit")
	bad := hdr(2)
	bad.agree1 = 11
	assert.Nil(t, func() *sink { s, _ := b.claim(k, bad, nil); return s }(), "a header that disagrees")
	s2, pieces := b.claim(k, hdr(2), nil)
	require.Same(t, s, s2)
	require.Len(t, pieces, 1)
	copy(pieces[0], []byte{9, 10})
	b.filled(k, s, hdr(2), nil)
	b.unexpect(k, s)

	var seen [][]byte
	for range 3 {
		f, err := b.take(k, 1, time.Second, func() string { return "" })
		require.NoError(t, err)
		if f.inPlace {
			seen = append(seen, nil)
		} else {
			seen = append(seen, f.data)
		}
	}
	assert.Equal(t, [][]byte{{1, 2, 3, 4}, {5, 6, 7, 8}, nil}, seen)
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 9, 10}, dst, "only the frame taken in place was written")
	assert.Zero(t, b.pending())
}

// A receiver that gives up does not return while a frame is being written
// into its memory; a write that hangs is kicked after the grace period.
func TestUnexpectWaitsForTheWriteInProgress(t *testing.T) {
	b := newBox()
	k := msgKey{from: 1, to: 0, kind: kindP2P, seq: 7}
	h := header{kind: kindP2P, dtype: 1, length: 8}
	s := &sink{bufs: [][]byte{make([]byte, 8)}, size: 8, chunk: 8, want: header{kind: kindP2P, dtype: 1}}
	require.True(t, b.expect(k, s))
	kicked := make(chan struct{})
	s2, _ := b.claim(k, h, func() { close(kicked) })
	require.NotNil(t, s2)

	b.grace = time.Hour
	done := make(chan struct{})
	go func() { b.unexpect(k, s); close(done) }()
	select {
	case <-done:
		t.Fatal("unexpect returned while the frame was being written")
	case <-time.After(20 * time.Millisecond):
	}
	b.filled(k, s, h, nil)
	within(t, func() { <-done })
	assert.Zero(t, b.pending(), "a frame written for a receiver gone is dropped")

	// A write that never ends is kicked, which fails it.
	s = &sink{bufs: [][]byte{make([]byte, 8)}, size: 8, chunk: 8, want: header{kind: kindP2P, dtype: 1}}
	require.True(t, b.expect(k, s))
	s2, _ = b.claim(k, h, func() { b.filled(k, s, h, errors.New("kicked")) })
	require.NotNil(t, s2)
	b.grace = time.Millisecond
	within(t, func() { b.unexpect(k, s) })
}

// Messages larger than any pooled buffer go in one frame, straight into
// a waiting receiver's buffer or queued for a later one, between
// processes and inside one.
func TestNetLargeSendRecv(t *testing.T) {
	nets := newNets(t, 4, 2, 5*time.Second)
	const n = maxPooled/4 + 1001
	msg := make([]float32, n)
	for i := range msg {
		msg[i] = float32(i)
	}
	for _, pair := range [][2]int{{0, 3}, {2, 3}} {
		from, to := pair[0], pair[1]
		// The receiver waits first: the payload goes straight into buf.
		got := make(chan []float32, 1)
		go func() {
			buf := make([]float32, n)
			if err := Recv(netOf(nets, to), from, to, 1, buf); err != nil {
				t.Error(err)
			}
			got <- buf
		}()
		time.Sleep(10 * time.Millisecond)
		require.NoError(t, Send(netOf(nets, from), from, to, 1, msg))
		within(t, func() { assert.Equal(t, msg, <-got) })
		// The message waits for its receiver.
		require.NoError(t, Send(netOf(nets, from), from, to, 2, msg))
		waitUntil(t, "the message arrives", func() bool { return netOf(nets, to).Pending() == 1 })
		buf := make([]float32, n)
		require.NoError(t, Recv(netOf(nets, to), from, to, 2, buf))
		assert.Equal(t, msg, buf)
	}
	for _, n := range nets {
		assert.Zero(t, n.Pending())
	}
	g := runtime.Group{Ranks: []int{0, 1, 2, 3}}
	require.NoError(t, errors.Join(runMembers(t, g, func(_, r int) error { return netOf(nets, r).Barrier(g, r) })...))
}

func TestBufPool(t *testing.T) {
	for _, n := range []int{1, 511, 512, 513, 4096, maxPooled - 1, maxPooled} {
		b, pb := getBuf(n)
		require.Len(t, b, n)
		require.NotNil(t, pb)
		assert.GreaterOrEqual(t, cap(*pb), n)
		assert.Equal(t, cap(*pb), 1<<max(minPooledShift, bits.Len(uint(n-1))), "%d bytes", n)
		putBuf(pb)
	}
	b, pb := getBuf(maxPooled + 1)
	assert.Len(t, b, maxPooled+1)
	assert.Nil(t, pb, "past the largest class: not pooled")
	b, pb = getBuf(0)
	assert.Empty(t, b)
	assert.Nil(t, pb)
	putBuf(nil)
}
