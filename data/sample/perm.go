package sample

import (
	"math/bits"
	"math/rand/v2"
)

// The two random streams of an epoch: one orders its documents, the other
// its windows. Separate streams keep the document order unchanged when the
// sequence length (and with it the number of windows) changes.
const (
	streamDocs    = 0
	streamSamples = 1
)

// mix is SplitMix64's finaliser: it spreads consecutive epoch numbers over
// the whole 64-bit space, so the PCG streams of neighbouring epochs share no
// structure.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// stream is the generator of one epoch's document or window order: PCG
// seeded with (uint64(seed), mix(2*epoch+which)).
func stream(seed, epoch int64, which uint64) *rand.PCG {
	return rand.NewPCG(uint64(seed), mix(uint64(epoch)*2+which))
}

// below is a uniform draw from [0, n) for n > 0 by Lemire's
// multiply-and-reject method, fixed here so that orders never change with
// the standard library's range mapping.
func below(r *rand.PCG, n uint64) uint64 {
	hi, lo := bits.Mul64(r.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(r.Uint64(), n)
		}
	}
	return hi
}

// identity is 0, 1, …, n-1.
func identity[T uint32 | uint64](n int64) []T {
	a := make([]T, n)
	for i := range a {
		a[i] = T(i)
	}
	return a
}

// shuffle is Fisher–Yates from the last element down: element i swaps with
// a uniform j in [0, i].
func shuffle[T uint32 | uint64](a []T, r *rand.PCG) {
	for i := len(a) - 1; i > 0; i-- {
		j := below(r, uint64(i)+1)
		a[i], a[j] = a[j], a[i]
	}
}
