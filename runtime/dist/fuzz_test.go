package dist

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fuzzToken = "fuzz-token"

// fuzzOptions keep limits small so that inputs reach them cheaply.
func fuzzOptions() ServerOptions {
	return ServerOptions{
		Token:            fuzzToken,
		Ranks:            4,
		MaxKey:           32,
		MaxValue:         256,
		HandshakeTimeout: 200 * time.Millisecond,
	}
}

// An input's first byte says what the rest is: fuzzAfterHandshake, the
// frames of a session the harness opened with a proper handshake (a
// fuzzer cannot answer the store's challenge); anything else, the bytes
// of a connection from its first.
const fuzzAfterHandshake = 0

// fuzzSeeds are inputs that reach every part of the protocol: a whole
// session, each kind of refusal, truncations and noise.
func fuzzSeeds() [][]byte {
	hs := append([]byte{1}, appendHello(nil, hello{version: protoVersion, rank: 1, size: 4, job: "j"})...)
	session := func(frames ...[]byte) []byte {
		return bytes.Join(append([][]byte{{fuzzAfterHandshake}}, frames...), nil)
	}
	raw := func(b []byte) []byte { return append([]byte{1}, b...) }
	set := func(id uint32, k, v string) []byte {
		return appendFrame(nil, reqSet, id, u32(uint32(len(k))), []byte(k), []byte(v))
	}
	add := func(id uint32, k string, d int64) []byte {
		return appendFrame(nil, reqAdd, id, binary.BigEndian.AppendUint64(nil, uint64(d)), []byte(k))
	}
	full := session(
		set(1, "a", "value"),
		appendFrame(nil, reqGet, 2, []byte("a")),
		appendFrame(nil, reqCheck, 3, keysBody([]string{"a", "b"})),
		add(4, "n", 3),
		add(5, "a", 1),
		appendFrame(nil, reqWait, 6, keysBody([]string{"a", "n"})),
		appendFrame(nil, reqBarrier, 7, u32(1), []byte("b")),
		appendFrame(nil, reqGet, 8, []byte("missing")),
		appendFrame(nil, reqCancel, 8),
		appendFrame(nil, reqBarrier, 9, u32(3), []byte("never")),
	)
	rng := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, 512)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	return [][]byte{
		{},
		full,
		full[:len(full)-3],
		session(),
		hs,
		hs[:7],
		append(append([]byte{}, hs...), make([]byte, 32)...),
		raw([]byte(magic)),
		session(appendFrame(nil, reqGet, 1, []byte("k"))[:7]),
		session([]byte{0xff, 0xff, 0xff, 0xff, reqSet, 0, 0, 0, 1}),
		session(appendFrame(nil, 42, 1, []byte("x"))),
		session(appendFrame(nil, reqGet, 1, []byte(strings.Repeat("k", 33)))),
		session(set(1, "k", strings.Repeat("v", 257))),
		session(appendFrame(nil, reqWait, 1, u32(2), u32(1), []byte("a"), u32(99))),
		session(appendFrame(nil, reqGet, 1, []byte("k")), appendFrame(nil, reqGet, 1, []byte("k"))),
		session(appendFrame(nil, reqCancel, 77), appendFrame(nil, reqBarrier, 2, u32(0), []byte("z"))),
		session(add(1, "m", 1<<62), add(2, "m", 1<<62)),
		raw(appendHello(nil, hello{version: protoVersion, rank: 9, job: strings.Repeat("j", 255)})),
		raw(appendHello(nil, hello{version: 1, rank: 0})),
		raw([]byte("GET / HTTP/1.1\r\nHost: store\r\n\r\n")),
		raw(noise),
		append(append([]byte{}, hs...), noise...),
	}
}

// fuzzStore is the store a fuzzing process sends its inputs to, with a
// well-behaved client that has been connected through all of them. It is
// replaced every fuzzStoreRuns inputs: often enough to bound what the
// inputs store, rarely enough that the machine does not run out of ports
// (every closed listener and connection lingers in TIME_WAIT).
type fuzzStore struct {
	s    *Server
	c    *Client
	runs int
}

const fuzzStoreRuns = 500

func (fs *fuzzStore) get(t testing.TB) (*Server, *Client) {
	if fs.s != nil && fs.runs >= fuzzStoreRuns {
		fs.close(t)
	}
	if fs.s == nil {
		s, err := Serve("127.0.0.1:0", fuzzOptions())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), hang)
		defer cancel()
		c, err := Dial(ctx, s.Addr(), fuzzToken, 0)
		if err != nil {
			s.Close()
		}
		require.NoError(t, err)
		fs.s, fs.c, fs.runs = s, c, 0
	}
	fs.runs++
	return fs.s, fs.c
}

// close shuts the store down, failing if that hangs.
func (fs *fuzzStore) close(t testing.TB) {
	s, c := fs.s, fs.c
	fs.s, fs.c = nil, nil
	if s == nil {
		return
	}
	done := make(chan error, 1)
	go func() {
		c.Close()
		done <- s.Close()
	}()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(hang):
		t.Fatal("Server.Close hung")
	}
}

// FuzzServer sends arbitrary bytes down a fresh connection to a running
// store. The store must not crash, must close that connection once the
// sender stops (never leave it hanging), and must keep serving a
// well-behaved client all the while.
func FuzzServer(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	fs := &fuzzStore{}
	f.Cleanup(func() { fs.close(f) })
	f.Fuzz(func(t *testing.T, data []byte) {
		s, c := fs.get(t)
		// If this input breaks the store, the next one gets a new store
		// instead of a cascade of failures.
		ok := false
		defer func() {
			if !ok {
				fs.close(t)
			}
		}()

		nc, err := net.Dial("tcp", s.Addr())
		require.NoError(t, err)
		raw := nc.(*net.TCPConn)
		// Reset instead of TIME_WAIT once done: see fuzzStore.
		defer func() {
			raw.SetLinger(0)
			raw.Close()
		}()
		// The store may hang up part way (a refusal): the rest of the
		// write may then fail, which is the store's right.
		raw.SetDeadline(time.Now().Add(hang))
		if len(data) > 0 && data[0] == fuzzAfterHandshake {
			// The last input's connection may still hold rank 1 in the
			// store: a rank belongs to one connection.
			require.Eventually(t, func() bool { return slices.Contains(s.MissingRanks(), 1) }, hang, time.Millisecond)
			w, err := handshake(raw, Member{Token: fuzzToken, Rank: 1})
			require.NoError(t, err)
			require.Equal(t, statusOK, w.status, w.reason)
		}
		if len(data) > 0 {
			raw.Write(data[1:])
		}

		// While the raw connection is open, in whatever state it left the
		// store, the other client is served.
		ctx, cancel := context.WithTimeout(context.Background(), hang)
		defer cancel()
		// A key no input can know in advance, within the small key limit.
		key := fmt.Sprintf("probe-%x", rand.Uint64())
		require.NoError(t, c.Set(ctx, key, []byte("ok")))
		v, err := c.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "ok", string(v))

		// Once the sender is done the store must let go of it.
		raw.CloseWrite()
		_, err = io.Copy(io.Discard, raw)
		require.False(t, isTimeout(err), "the store kept the connection open after its input ended: %v", err)

		n, err := c.Add(ctx, key+"-n", 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		ok = true
	})
}

// The seed corpus in plain `go test` would pass even if the store
// ignored it; this checks that the valid session in it is really served.
func TestFuzzSeedSessionIsServed(t *testing.T) {
	s, _ := startServer(t, fuzzOptions())
	seeds := fuzzSeeds()
	nc := rawConn(t, s.Addr(), fuzzToken)
	require.Equal(t, byte(fuzzAfterHandshake), seeds[1][0])
	_, err := nc.Write(seeds[1][1:])
	require.NoError(t, err)
	fr := newFrameReader(nc, 0, func(byte) (int, error) { return 1 << 10, nil })
	got := map[uint32]string{}
	// Replies to 1..7 come; 8 was cancelled and 9 waits for ever.
	for len(got) < 7 {
		f, err := fr.read()
		require.NoError(t, err)
		require.Equal(t, respReply, f.typ)
		got[f.id] = string(f.body)
	}
	assert.Equal(t, "\x00", got[1])
	assert.Equal(t, "\x00value", got[2])
	assert.Equal(t, "\x00\x00", got[3])
	assert.Equal(t, "\x00"+string(binary.BigEndian.AppendUint64(nil, 3)), got[4])
	assert.Contains(t, got[5], "not a decimal integer")
	assert.Equal(t, "\x00", got[6])
	assert.Equal(t, "\x00", got[7])
}
