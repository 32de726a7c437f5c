package dist

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"gcompile/runtime/auth"
)

// The store's protocol. Integers are big-endian.
//
// A connection opens with a challenge-response in which the job's token
// never crosses the wire (package auth). The client's hello:
//
//	magic[4] version u16 rank i32 size u32 nonce[32] jobLen u8 job[jobLen]
//
// (size: the job's process count as the client was told, 0 if unsaid;
// job: the job's public identity, JobIdentity). The store's challenge:
//
//	magic[4] version u16 status u8, then
//	  status ok:  nonce[32] proof[32] jobLen u8 job[jobLen]
//	  otherwise:  reasonLen u16 reason[reasonLen]   (a bad hello or version)
//
// where the store's proof is auth.Proof(token, roleStore, its nonce, the
// client's, claims) and claims are rank, size and job as the hello gave
// them. The client answers with its own proof (roleClient, nonces the
// other way round), or 32 zero bytes when the store's proof did not check:
// a peer that could not prove the token gets nothing to guess it from.
// The store's verdict:
//
//	status u8, then
//	  status ok:  maxKey u32 maxValue u32
//	  otherwise:  reasonLen u16 reason[reasonLen]
//
// The magic comes first both ways so that either side can tell at once
// that the other is not a store (an HTTP server, another job's service).
// After the handshake both sides send frames:
//
//	length u32 (of what follows) type u8 id u32 body[length-5]
//
// A request's id comes back in its reply, so that one connection carries
// many calls at once (a Get blocked on a key does not hold up a Set) and
// a cancel can name the call it ends. Request bodies:
//
//	set      keyLen u32 key value
//	get      key
//	check    count u32, then count × (keyLen u32 key)
//	wait     as check
//	add      delta i64 key
//	barrier  n u32 name
//	cancel   (empty; id is the request to cancel)
//
// A reply's body is status u8 then, when ok, the result (get: the value;
// check: 1 byte, 1 when all exist; add: the new value as i64; others:
// nothing), else the error's text. The server's last word before it
// closes a connection on purpose is a goodbye frame (id 0) whose body is
// the reason.
const (
	magic        = "gcRZ"
	protoVersion = 2

	helloLen    = 4 + 2 + 4 + 4 + auth.NonceLen + 1
	maxTokenLen = 4096
	maxJobLen   = 255

	// The roles the two proofs of a handshake name.
	roleStore  = "gcompile store"
	roleClient = "gcompile store client"

	headerLen = 4 + 1 + 4 // length, type, id

	// maxKeysPerRequest bounds a check or wait so that one frame's keys
	// cost at most about a mebibyte with the default key limit.
	maxKeysPerRequest = 1024

	// maxReasonLen bounds refusal and error texts both ways.
	maxReasonLen = 4096

	// maxPendingPerConn bounds the calls one connection may have waiting
	// in the server, each of which holds a goroutine.
	maxPendingPerConn = 1024

	// maxBarrier bounds a barrier's participant count: more processes
	// than any job has, small enough that counts never overflow.
	maxBarrier = 1 << 24
)

// Request types.
const (
	reqSet byte = 1 + iota
	reqGet
	reqCheck
	reqWait
	reqAdd
	reqBarrier
	reqCancel
)

// Server-to-client frame types.
const (
	respReply byte = 1 + iota
	respGoodbye
)

// Reply and handshake statuses.
const (
	statusOK byte = iota
	statusError
	statusBadToken
	statusBadRank
	statusBadVersion
	statusBadHello
	statusBadSize
)

var reqNames = map[byte]string{
	reqSet: "set", reqGet: "get", reqCheck: "check", reqWait: "wait",
	reqAdd: "add", reqBarrier: "barrier", reqCancel: "cancel",
}

// bodyLimit is the largest body a request type may carry under the
// store's key and value limits; false for an unknown type. Both sides use
// it: the server to refuse a frame before reading it, the client to
// refuse a call before sending it. A key list is bounded by a Set's size
// too, so that no frame costs the store more than a value.
func bodyLimit(typ byte, maxKey, maxValue int) (int, bool) {
	set := 4 + maxKey + maxValue
	switch typ {
	case reqSet:
		return set, true
	case reqGet:
		return maxKey, true
	case reqCheck, reqWait:
		return min(4+maxKeysPerRequest*(4+maxKey), set), true
	case reqAdd:
		return 8 + maxKey, true
	case reqBarrier:
		return 4 + maxKey, true
	case reqCancel:
		return 0, true
	}
	return 0, false
}

// keepAlive probes idle connections so that a peer whose machine
// vanished (no FIN, no RST) is noticed in about half a minute instead of
// the system's default of hours; live peers' kernels answer the probes,
// so an idle but healthy job is never cut off.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// frame is a decoded frame of either direction.
type frame struct {
	typ  byte
	id   uint32
	body []byte
}

// appendFrame encodes a frame; parts are concatenated into the body.
func appendFrame(dst []byte, typ byte, id uint32, parts ...[]byte) []byte {
	n := 5
	for _, p := range parts {
		n += len(p)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint32(dst, id)
	for _, p := range parts {
		dst = append(dst, p...)
	}
	return dst
}

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// keysBody encodes a check or wait body.
func keysBody(keys []string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(keys)))
	for _, k := range keys {
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
	}
	return b
}

// parseKeys decodes a check or wait body, checking every length against
// the bytes actually there and every key against maxKey.
func parseKeys(body []byte, maxKey int) ([]string, error) {
	if len(body) < 4 {
		return nil, errors.New("key list shorter than its count")
	}
	count := binary.BigEndian.Uint32(body)
	body = body[4:]
	if count == 0 || count > maxKeysPerRequest {
		return nil, fmt.Errorf("key count %d is not in 1..%d", count, maxKeysPerRequest)
	}
	keys := make([]string, 0, count)
	for i := uint32(0); i < count; i++ {
		if len(body) < 4 {
			return nil, fmt.Errorf("key list truncated at key %d of %d", i, count)
		}
		n := binary.BigEndian.Uint32(body)
		body = body[4:]
		if n == 0 || n > uint32(maxKey) {
			return nil, fmt.Errorf("key %d of %d bytes is not in 1..%d", i, n, maxKey)
		}
		if uint32(len(body)) < n {
			return nil, fmt.Errorf("key list truncated inside key %d", i)
		}
		keys = append(keys, string(body[:n]))
		body = body[n:]
	}
	if len(body) != 0 {
		return nil, fmt.Errorf("%d stray bytes after the key list", len(body))
	}
	return keys, nil
}

// frameReader reads frames from a connection, bounding each frame's size
// by its type before allocating, and, when stall > 0, bounding how long
// any part of a frame may take to arrive once the frame has begun: an
// idle connection is fine, a half-sent frame is not.
type frameReader struct {
	nc    net.Conn
	r     *bufio.Reader
	stall time.Duration
	limit func(typ byte) (int, error) // largest body for the type, or why the type is refused
}

func newFrameReader(nc net.Conn, stall time.Duration, limit func(byte) (int, error)) *frameReader {
	return &frameReader{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), stall: stall, limit: limit}
}

// errIdleEOF is a clean end of the stream between frames.
var errIdleEOF = errors.New("connection closed between frames")

// frameError is a malformed frame: the peer broke the protocol.
type frameError struct{ msg string }

func (e *frameError) Error() string { return e.msg }

func badFrame(format string, args ...any) error {
	return &frameError{fmt.Sprintf(format, args...)}
}

func (fr *frameReader) arm() {
	if fr.stall > 0 {
		fr.nc.SetReadDeadline(time.Now().Add(fr.stall))
	}
}

func (fr *frameReader) read() (frame, error) {
	if fr.stall > 0 {
		// Waiting for the next frame may last as long as the job does.
		fr.nc.SetReadDeadline(time.Time{})
	}
	if _, err := fr.r.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return frame{}, errIdleEOF
		}
		return frame{}, err
	}
	fr.arm()
	var hdr [headerLen]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return frame{}, truncated("frame header", err)
	}
	length := binary.BigEndian.Uint32(hdr[:4])
	f := frame{typ: hdr[4], id: binary.BigEndian.Uint32(hdr[5:])}
	if length < 5 {
		return frame{}, badFrame("frame length %d is shorter than its type and id", length)
	}
	lim, err := fr.limit(f.typ)
	if err != nil {
		return frame{}, err
	}
	n := int64(length) - 5
	if n > int64(lim) {
		return frame{}, badFrame("%s frame of %d bytes exceeds the limit of %d", frameTypeName(f.typ), n, lim)
	}
	f.body = make([]byte, n)
	// Read in slices so that the deadline measures progress, not the
	// whole transfer: a large value over a slow link is fine as long as
	// it keeps coming.
	const step = 256 << 10
	for off := 0; off < len(f.body); off += step {
		fr.arm()
		if _, err := io.ReadFull(fr.r, f.body[off:min(off+step, len(f.body))]); err != nil {
			return frame{}, truncated(frameTypeName(f.typ)+" frame body", err)
		}
	}
	return f, nil
}

func frameTypeName(typ byte) string {
	if n, ok := reqNames[typ]; ok {
		return n
	}
	return fmt.Sprintf("type-%d", typ)
}

// truncated phrases a read that stopped inside a frame.
func truncated(what string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return badFrame("connection closed inside a %s", what)
	case errors.As(err, &ne) && ne.Timeout():
		return badFrame("stalled inside a %s", what)
	}
	return err
}

// hello is the client's first message: who it says it is and its
// challenge to the store.
type hello struct {
	version uint16
	rank    int32
	size    uint32 // processes in the job as the client was told; 0: not said
	nonce   auth.Nonce
	job     string // the job's public identity as the client knows it
}

// claims are the hello's facts both proofs cover: a proof made for one
// rank, size and job does not pass for another.
func (h hello) claims() []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(h.rank))
	b = binary.BigEndian.AppendUint32(b, h.size)
	return append(b, h.job...)
}

func appendHello(dst []byte, h hello) []byte {
	dst = append(dst, magic...)
	dst = binary.BigEndian.AppendUint16(dst, h.version)
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.rank))
	dst = binary.BigEndian.AppendUint32(dst, h.size)
	dst = append(dst, h.nonce[:]...)
	dst = append(dst, byte(len(h.job)))
	return append(dst, h.job...)
}

// readHello reads a hello. A wrong magic is reported with what came
// instead, so the log says what kind of peer knocked. A hello of another
// protocol version is returned after its version, unread further: its
// layout is not this one's.
func readHello(r io.Reader) (hello, error) {
	var b [helloLen]byte
	if n, err := io.ReadFull(r, b[:6]); err != nil {
		if n >= len(magic) && string(b[:len(magic)]) != magic {
			return hello{}, badFrame("not a store client (it sent %q)", b[:n])
		}
		return hello{}, truncated("hello", err)
	}
	if string(b[:4]) != magic {
		return hello{}, badFrame("not a store client (it sent %q)", b[:6])
	}
	h := hello{version: binary.BigEndian.Uint16(b[4:])}
	if h.version != protoVersion {
		return h, nil
	}
	if _, err := io.ReadFull(r, b[6:]); err != nil {
		return hello{}, truncated("hello", err)
	}
	h.rank = int32(binary.BigEndian.Uint32(b[6:]))
	h.size = binary.BigEndian.Uint32(b[10:])
	copy(h.nonce[:], b[14:])
	job := make([]byte, b[helloLen-1])
	if _, err := io.ReadFull(r, job); err != nil {
		return hello{}, truncated("hello's job", err)
	}
	h.job = string(job)
	return h, nil
}

// challenge is the store's answer to a hello: its own nonce and its proof
// of the token, or a refusal of the hello itself.
type challenge struct {
	version uint16
	status  byte
	nonce   auth.Nonce
	proof   [auth.ProofLen]byte
	job     string // the store's job identity
	reason  string
}

func appendChallenge(dst []byte, c challenge) []byte {
	dst = append(dst, magic...)
	dst = binary.BigEndian.AppendUint16(dst, c.version)
	dst = append(dst, c.status)
	if c.status != statusOK {
		return appendReason(dst, c.reason)
	}
	dst = append(dst, c.nonce[:]...)
	dst = append(dst, c.proof[:]...)
	dst = append(dst, byte(len(c.job)))
	return append(dst, c.job...)
}

func appendReason(dst []byte, r string) []byte {
	if len(r) > maxReasonLen {
		r = r[:maxReasonLen]
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(r)))
	return append(dst, r...)
}

func readReason(r io.Reader) (string, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return "", fmt.Errorf("handshake refusal truncated: %w", err)
	}
	reason := make([]byte, min(int(binary.BigEndian.Uint16(l[:])), maxReasonLen))
	if _, err := io.ReadFull(r, reason); err != nil {
		return "", fmt.Errorf("handshake refusal truncated: %w", err)
	}
	return string(reason), nil
}

// notStoreError is what readChallenge returns for a peer that answers
// with something other than the store's magic.
type notStoreError struct{ got []byte }

func (e *notStoreError) Error() string {
	return fmt.Sprintf("not a gcompile store (it answered %q)", e.got)
}

func (e *notStoreError) Unwrap() error { return ErrNotStore }

func readChallenge(r io.Reader) (challenge, error) {
	var b [7]byte
	n, err := io.ReadFull(r, b[:])
	if n > 0 {
		k := min(n, len(magic))
		if string(b[:k]) != magic[:k] {
			return challenge{}, &notStoreError{got: b[:n]}
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return challenge{}, fmt.Errorf("closed the connection during the handshake: %w", io.ErrUnexpectedEOF)
		}
		return challenge{}, err
	}
	c := challenge{version: binary.BigEndian.Uint16(b[4:]), status: b[6]}
	if c.status != statusOK {
		c.reason, err = readReason(r)
		return c, err
	}
	if c.version != protoVersion {
		return c, nil // its layout is not this one's; dialOnce refuses it
	}
	var body [auth.NonceLen + auth.ProofLen + 1]byte
	if _, err := io.ReadFull(r, body[:]); err != nil {
		return challenge{}, fmt.Errorf("handshake challenge truncated: %w", err)
	}
	copy(c.nonce[:], body[:])
	copy(c.proof[:], body[auth.NonceLen:])
	job := make([]byte, body[len(body)-1])
	if _, err := io.ReadFull(r, job); err != nil {
		return challenge{}, fmt.Errorf("handshake challenge truncated: %w", err)
	}
	c.job = string(job)
	return c, nil
}

// welcome is the store's last word in the handshake: accepted with its
// limits, or refused with the reason.
type welcome struct {
	status           byte
	maxKey, maxValue uint32
	reason           string
	job              string // the store's job identity, from its challenge
}

func appendWelcome(dst []byte, w welcome) []byte {
	dst = append(dst, w.status)
	if w.status == statusOK {
		dst = binary.BigEndian.AppendUint32(dst, w.maxKey)
		return binary.BigEndian.AppendUint32(dst, w.maxValue)
	}
	return appendReason(dst, w.reason)
}

func readWelcome(r io.Reader) (welcome, error) {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return welcome{}, fmt.Errorf("closed the connection during the handshake: %w", io.ErrUnexpectedEOF)
		}
		return welcome{}, err
	}
	w := welcome{status: b[0]}
	if w.status == statusOK {
		var lim [8]byte
		if _, err := io.ReadFull(r, lim[:]); err != nil {
			return welcome{}, fmt.Errorf("handshake answer truncated: %w", err)
		}
		w.maxKey = binary.BigEndian.Uint32(lim[:])
		w.maxValue = binary.BigEndian.Uint32(lim[4:])
		return w, nil
	}
	var err error
	w.reason, err = readReason(r)
	return w, err
}
