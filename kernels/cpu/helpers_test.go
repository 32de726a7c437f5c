package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// both runs a generic test body once per element type.
func both(t *testing.T, f32, f64 func(t *testing.T)) {
	t.Run("float32", f32)
	t.Run("float64", f64)
}

// tolOf is the relative tolerance the tests allow for T: a few ulps of
// float32 accumulated over short sums, or near-exact for float64.
func tolOf[T Float]() float64 {
	var z T
	if unsafe.Sizeof(z) == 4 {
		return 1e-5
	}
	return 1e-12
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// randVec returns n values uniform in [lo, hi), already rounded to T so
// the float64 reference sees exactly what the kernel sees.
func randVec[T Float](r *rand.Rand, n int, lo, hi float64) []T {
	v := make([]T, n)
	for i := range v {
		v[i] = T(lo + (hi-lo)*r.Float64())
	}
	return v
}

func to64[T Float](x []T) []float64 {
	o := make([]float64, len(x))
	for i, v := range x {
		o[i] = float64(v)
	}
	return o
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// requireClose checks |got−want| ≤ tol·(1+|want|) element by element,
// treating matching infinities and NaNs as equal.
func requireClose[T Float](t *testing.T, want []float64, got []T, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i, w := range want {
		g := float64(got[i])
		// Plain comparisons first: testify's reflection-based checks are
		// too slow to call on every element of a large vector.
		switch {
		case math.IsNaN(w):
			if !math.IsNaN(g) {
				require.Failf(t, "mismatch", "index %d: want NaN, got %v %s", i, g, what)
			}
		case math.IsInf(w, 0):
			if g != w {
				require.Failf(t, "mismatch", "index %d: want %v, got %v %s", i, w, g, what)
			}
		case !(math.Abs(g-w) <= tol*(1+math.Abs(w))):
			require.Failf(t, "mismatch", "index %d: want %v, got %v (tol %g) %s", i, w, g, tol, what)
		}
	}
}

// unravel turns a flat row-major index into a multi-index for shape.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// ravel is the inverse of unravel.
func ravel(idx, shape []int) int {
	f := 0
	for d, v := range idx {
		f = f*shape[d] + v
	}
	return f
}
