// Package auth proves that two processes hold the same job token without
// the token crossing the wire.
//
// Each side of a connection sends a fresh random nonce; each then proves
// it holds the token with an HMAC-SHA256 keyed by the token over both
// nonces and what the connection claims (its rank, its job). A sniffer
// sees only nonces and proofs: nothing it can replay (the next
// connection's nonces differ) and nothing that names the token. Each
// proof names its role, so a side cannot be made to compute the other
// side's proof (a reflection). Guessing the token offline from a recorded
// proof costs one HMAC per guess: a random token (gcompile launch makes
// one of 128 bits) is safe, a short word chosen by hand is not.
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// NonceLen and ProofLen are the sizes on the wire.
const (
	NonceLen = 32
	ProofLen = sha256.Size
)

// Nonce is a fresh random challenge.
type Nonce [NonceLen]byte

// NewNonce draws a nonce from the system's random source.
func NewNonce() (Nonce, error) {
	var n Nonce
	if _, err := rand.Read(n[:]); err != nil {
		return n, fmt.Errorf("drawing a handshake nonce: %w", err)
	}
	return n, nil
}

// Proof is what role proves of token on a connection whose nonces are
// mine (the prover's) and theirs, over the connection's claims: every
// part is length-prefixed, so no two lists of parts meet.
func Proof(token, role string, mine, theirs Nonce, claims ...[]byte) [ProofLen]byte {
	m := hmac.New(sha256.New, []byte(token))
	part := func(b []byte) {
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(b)))
		m.Write(l[:])
		m.Write(b)
	}
	part([]byte(role))
	part(mine[:])
	part(theirs[:])
	for _, c := range claims {
		part(c)
	}
	var out [ProofLen]byte
	m.Sum(out[:0])
	return out
}

// Check reports whether proof is role's proof of token, in constant time.
// mine and theirs are as the prover named them.
func Check(proof []byte, token, role string, mine, theirs Nonce, claims ...[]byte) bool {
	want := Proof(token, role, mine, theirs, claims...)
	return hmac.Equal(proof, want[:])
}
