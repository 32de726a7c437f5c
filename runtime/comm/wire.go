package comm

import (
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Frame kinds on a connection between two processes.
const (
	kindColl  uint8 = 1 + iota // a collective's data, one phase, one member to another
	kindP2P                    // a Send's data
	kindAbort                  // the sending process aborted; the payload says why
	kindBye                    // the sending process closes the connection on purpose
)

// header precedes every frame's payload. Collective frames carry what the
// members must agree on (op, dtype, agree), so a receiver checks them
// against its own call before using the data.
type header struct {
	kind, op, dtype, phase uint8
	from, to               int32
	group                  uint64 // hash of the group's key
	seq                    int64  // collective sequence number or send tag
	agree1, agree2         int64
	length                 uint64
}

const headerSize = 4 + 4 + 4 + 8 + 8 + 8 + 8 + 8

// maxFrame bounds one payload: a garbled length must not make a receiver
// try to allocate the machine's memory.
const maxFrame = 1 << 36

func (h header) encode(b []byte) {
	b[0], b[1], b[2], b[3] = h.kind, h.op, h.dtype, h.phase
	le := binary.LittleEndian
	le.PutUint32(b[4:], uint32(h.from))
	le.PutUint32(b[8:], uint32(h.to))
	le.PutUint64(b[12:], h.group)
	le.PutUint64(b[20:], uint64(h.seq))
	le.PutUint64(b[28:], uint64(h.agree1))
	le.PutUint64(b[36:], uint64(h.agree2))
	le.PutUint64(b[44:], h.length)
}

func decodeHeader(b []byte) header {
	le := binary.LittleEndian
	return header{
		kind: b[0], op: b[1], dtype: b[2], phase: b[3],
		from:   int32(le.Uint32(b[4:])),
		to:     int32(le.Uint32(b[8:])),
		group:  le.Uint64(b[12:]),
		seq:    int64(le.Uint64(b[20:])),
		agree1: int64(le.Uint64(b[28:])),
		agree2: int64(le.Uint64(b[36:])),
		length: le.Uint64(b[44:]),
	}
}

// The handshake opens every connection between two processes of a job:
// the dialer sends the magic, its process index and the job's token; the
// acceptor answers with a status byte, then (on refusal) the reason.
var handshakeMagic = [8]byte{'G', 'C', 'N', 'E', 'T', 0, 0, 1}

const maxToken = 1 << 10

// errRefused marks a handshake the other side refused; the reason is in
// the message.
var errRefused = errors.New("connection refused by the peer")

func writeHello(c net.Conn, proc int, token string) error {
	if len(token) > maxToken {
		return fmt.Errorf("the job token is %d bytes; at most %d", len(token), maxToken)
	}
	b := make([]byte, 0, 16+len(token))
	b = append(b, handshakeMagic[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(proc))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(token)))
	b = append(b, token...)
	_, err := c.Write(b)
	return err
}

// readHello reads a dialer's hello and checks it; the error is the reason
// the connection is refused.
func readHello(c net.Conn, token string, procs int) (int, error) {
	var b [16]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, fmt.Errorf("reading the handshake: %w", err)
	}
	if [8]byte(b[:8]) != handshakeMagic {
		return 0, errors.New("not a gcompile comm handshake (bad magic)")
	}
	proc := int(int32(binary.LittleEndian.Uint32(b[8:])))
	n := binary.LittleEndian.Uint32(b[12:])
	if n > maxToken {
		return 0, fmt.Errorf("token of %d bytes; at most %d", n, maxToken)
	}
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, fmt.Errorf("reading the token: %w", err)
	}
	if subtle.ConstantTimeCompare(got, []byte(token)) != 1 {
		return proc, errors.New("wrong job token")
	}
	if proc < 0 || proc >= procs {
		return proc, fmt.Errorf("process index %d is outside the job's [0,%d)", proc, procs)
	}
	return proc, nil
}

func writeVerdict(c net.Conn, refusal error) error {
	if refusal == nil {
		_, err := c.Write([]byte{0})
		return err
	}
	msg := refusal.Error()
	b := append([]byte{1}, binary.LittleEndian.AppendUint32(nil, uint32(len(msg)))...)
	_, err := c.Write(append(b, msg...))
	return err
}

func readVerdict(c net.Conn) error {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("reading the handshake answer: %w", err)
	}
	if b[0] == 0 {
		return nil
	}
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return fmt.Errorf("%w (reason unreadable: %w)", errRefused, err)
	}
	msg := make([]byte, min(binary.LittleEndian.Uint32(n[:]), 4096))
	if _, err := io.ReadFull(c, msg); err != nil {
		return fmt.Errorf("%w (reason unreadable: %w)", errRefused, err)
	}
	return fmt.Errorf("%w: %s", errRefused, msg)
}

// handshakeTimeout bounds a connection's handshake, so a stray connection
// cannot hold the acceptor.
const handshakeTimeout = 10 * time.Second
