package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"gcompile/runtime/auth"
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

// The handshake opens every connection between two processes of a job,
// a challenge-response in which the job's token never crosses the wire
// (package auth). The dialer sends
//
//	magic[8] proc u32 nonce[32]
//
// the acceptor answers 0, its nonce[32] and its proof (role
// roleAcceptor), or refuses the hello (1, reason); the dialer sends its
// proof (roleDialer; 32 zero bytes when the acceptor's did not check),
// and the acceptor's verdict ends it: 0, or 1 and the reason. Both proofs
// cover both process indexes, so a proof for one pair passes for no
// other.
var handshakeMagic = [8]byte{'G', 'C', 'N', 'E', 'T', 0, 0, 2}

// The roles the two proofs of a handshake name.
const (
	roleAcceptor = "gcompile comm acceptor"
	roleDialer   = "gcompile comm dialer"
)

// errRefused marks a handshake the other side refused; the reason is in
// the message.
var errRefused = errors.New("connection refused by the peer")

// pairClaims are the facts both proofs cover: who dialed whom.
func pairClaims(dialer, acceptor int) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(dialer))
	return binary.LittleEndian.AppendUint32(b, uint32(acceptor))
}

// dialHandshake is the dialer's side: process me proves the token to
// process to and checks that process's proof.
func dialHandshake(c net.Conn, me, to int, token string) error {
	nonce, err := auth.NewNonce()
	if err != nil {
		return err
	}
	b := append(handshakeMagic[:], binary.LittleEndian.AppendUint32(nil, uint32(me))...)
	if _, err := c.Write(append(b, nonce[:]...)); err != nil {
		return err
	}
	var status [1]byte
	if _, err := io.ReadFull(c, status[:]); err != nil {
		return fmt.Errorf("reading the handshake's challenge: %w", err)
	}
	if status[0] != 0 {
		return readRefusal(c)
	}
	var ch [auth.NonceLen + auth.ProofLen]byte
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return fmt.Errorf("reading the handshake's challenge: %w", err)
	}
	theirs := auth.Nonce(ch[:auth.NonceLen])
	claims := pairClaims(me, to)
	proven := auth.Check(ch[auth.NonceLen:], token, roleAcceptor, theirs, nonce, claims)
	var answer [auth.ProofLen]byte
	if proven {
		answer = auth.Proof(token, roleDialer, nonce, theirs, claims)
	}
	if _, err := c.Write(answer[:]); err != nil {
		return err
	}
	if err := readVerdict(c); err != nil {
		return err
	}
	if !proven {
		return fmt.Errorf("%w: it could not prove the job's token", errRefused)
	}
	return nil
}

// acceptHandshake is the acceptor's side for process me of procs: it
// reads the dialer's hello, proves the token, checks the dialer's proof
// and then check(dialer). It returns the dialer's index, and the reason
// it was refused (already told to the dialer), or nil.
func acceptHandshake(c net.Conn, me, procs int, token string, check func(p int) error) (int, error) {
	var b [8 + 4 + auth.NonceLen]byte
	// The magic first: a stray peer's short message is named for what it
	// is, not as a truncated hello.
	if _, err := io.ReadFull(c, b[:8]); err != nil {
		return 0, fmt.Errorf("reading the handshake: %w", err)
	}
	if [8]byte(b[:8]) != handshakeMagic {
		err := errors.New("not a gcompile comm handshake (bad magic)")
		writeVerdict(c, err)
		return 0, err
	}
	if _, err := io.ReadFull(c, b[8:]); err != nil {
		return 0, fmt.Errorf("reading the handshake: %w", err)
	}
	proc := int(int32(binary.LittleEndian.Uint32(b[8:])))
	if proc < 0 || proc >= procs {
		err := fmt.Errorf("process index %d is outside the job's [0,%d)", proc, procs)
		writeVerdict(c, err)
		return proc, err
	}
	theirs := auth.Nonce(b[12:])
	nonce, err := auth.NewNonce()
	if err != nil {
		return proc, err
	}
	claims := pairClaims(proc, me)
	proof := auth.Proof(token, roleAcceptor, nonce, theirs, claims)
	if _, err := c.Write(append(append([]byte{0}, nonce[:]...), proof[:]...)); err != nil {
		return proc, err
	}
	var answer [auth.ProofLen]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil {
		return proc, fmt.Errorf("reading the proof of the token: %w", err)
	}
	var refusal error
	if !auth.Check(answer[:], token, roleDialer, theirs, nonce, claims) {
		refusal = errors.New("wrong job token")
	} else {
		refusal = check(proc)
	}
	if err := writeVerdict(c, refusal); err != nil && refusal == nil {
		refusal = err
	}
	return proc, refusal
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
	return readRefusal(c)
}

// readRefusal reads a refusal's reason, its status byte already read.
func readRefusal(c net.Conn) error {
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
