package sample

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestOrdersPinned pins the orders' derivation: a change here reorders
// every cached index and every resumed run's data, so it must come with a
// new formatVersion and a note to users.
func TestOrdersPinned(t *testing.T) {
	// SplitMix64's published first output for seed 0.
	assert.Equal(t, uint64(0xe220a8397b1dcdaf), mix(0))

	docs := identity[uint32](10)
	shuffle(docs, stream(1, 0, streamDocs))
	assert.Equal(t, []uint32{3, 4, 2, 0, 1, 9, 5, 7, 6, 8}, docs)

	wins := identity[uint64](10)
	shuffle(wins, stream(-7, 3, streamSamples))
	assert.Equal(t, []uint64{9, 5, 6, 4, 1, 0, 3, 2, 8, 7}, wins)
}

func TestBelow(t *testing.T) {
	r := stream(3, 3, 0)
	for _, n := range []uint64{1, 2, 3, 7, 1 << 32, math.MaxUint64} {
		for range 1000 {
			assert.Less(t, below(r, n), n)
		}
	}
	// Every position of a shuffle is reached from every start: a coarse
	// check that the draws are not stuck.
	seen := make([][]bool, 5)
	for i := range seen {
		seen[i] = make([]bool, 5)
	}
	for e := range int64(400) {
		a := identity[uint32](5)
		shuffle(a, stream(9, e, streamDocs))
		for pos, v := range a {
			seen[v][pos] = true
		}
	}
	for v := range seen {
		assert.NotContains(t, seen[v], false, "element %d reaches every position", v)
	}
	assert.True(t, slices.Equal(identity[uint32](3), []uint32{0, 1, 2}))
}
