package sample

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// fakeTokens is an in-memory Tokens that stores only document lengths and
// makes up each token from its position, so a test can tell where any token
// came from and a fake of a million documents costs a few megabytes.
type fakeTokens struct {
	lens     []int
	lenCalls atomic.Int64
	reads    atomic.Int64
	failDoc  int // Read of this document fails; -1 for none
	// pause, when set, runs at every SequenceLen: a test holds a build
	// there.
	pause func()

	mu     sync.Mutex
	record bool
	log    []span
}

func newFake(lens []int) *fakeTokens { return &fakeTokens{lens: lens, failDoc: -1} }

// tokenAt is the token at offset off of document doc: distinct for every
// (doc, off) with doc < 32768 and off < 65536.
func tokenAt(doc, off int) int32 { return int32(uint32(doc)<<16 | uint32(off)) }

func (f *fakeTokens) NumSequences() int { return len(f.lens) }

func (f *fakeTokens) SequenceLen(i int) int {
	f.lenCalls.Add(1)
	if f.pause != nil {
		f.pause()
	}
	if i < 0 || i >= len(f.lens) {
		return -1
	}
	return f.lens[i]
}

func (f *fakeTokens) Read(doc, off int, dst []int32) error {
	f.reads.Add(1)
	if doc == f.failDoc {
		return fmt.Errorf("disk on fire")
	}
	if doc < 0 || doc >= len(f.lens) || off < 0 || off+len(dst) > f.lens[doc] {
		return fmt.Errorf("read of %d tokens at %d of document %d, which has %d", len(dst), off, doc, f.lens[doc])
	}
	if f.record {
		f.mu.Lock()
		f.log = append(f.log, span{doc: doc, off: off, n: len(dst)})
		f.mu.Unlock()
	}
	for i := range dst {
		dst[i] = tokenAt(doc, off+i)
	}
	return nil
}

// lengths is n document lengths in [lo, hi], the same for the same seed.
func lengths(n, lo, hi int, seed uint64) []int {
	out := make([]int, n)
	x := seed
	for i := range out {
		x = mix(x)
		out[i] = lo + int(x%uint64(hi-lo+1))
	}
	return out
}
