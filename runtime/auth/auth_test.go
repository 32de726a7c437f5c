package auth

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProof(t *testing.T) {
	a, err := NewNonce()
	require.NoError(t, err)
	b, err := NewNonce()
	require.NoError(t, err)
	require.NotEqual(t, a, b, "two nonces drawn alike")
	claim := []byte("rank 3")
	p := Proof("secret", "client", a, b, claim)
	assert.True(t, Check(p[:], "secret", "client", a, b, claim))
	for name, ok := range map[string]bool{
		"another token":  Check(p[:], "secret!", "client", a, b, claim),
		"another role":   Check(p[:], "secret", "server", a, b, claim),
		"nonces swapped": Check(p[:], "secret", "client", b, a, claim),
		"another claim":  Check(p[:], "secret", "client", a, b, []byte("rank 4")),
		"claims split":   Check(p[:], "secret", "client", a, b, []byte("rank"), []byte(" 3")),
		"truncated":      Check(p[:16], "secret", "client", a, b, claim),
	} {
		assert.False(t, ok, name)
	}
	assert.False(t, bytes.Contains(p[:], []byte("secret")))
}
