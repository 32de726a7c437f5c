package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Gradient kernels are checked against central finite differences of a
// scalar loss L(x) = Σ dy·f(x) in float64, so the test does not share any
// derivation with the kernel it checks.

const (
	fdStep = 1e-5
	fdTol  = 1e-7
)

// numGrad returns ∂L/∂x by central differences; x is restored afterwards.
func numGrad(loss func() float64, x []float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		orig := x[i]
		x[i] = orig + fdStep
		up := loss()
		x[i] = orig - fdStep
		down := loss()
		x[i] = orig
		g[i] = (up - down) / (2 * fdStep)
	}
	return g
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func TestGradElementwiseFD(t *testing.T) {
	r := newRand(20)
	n := 40
	// Keep inputs away from Relu's kink at 0.
	x := randVec[float64](r, n, 0.05, 3)
	for i := range x {
		if i%2 == 0 {
			x[i] = -x[i]
		}
	}
	dy := randVec[float64](r, n, -1, 1)
	tmp := make([]float64, n)
	dx := make([]float64, n)

	GeluGrad(dx, x, dy)
	requireClose(t, numGrad(func() float64 { Gelu(tmp, x); return dot(dy, tmp) }, x), dx, fdTol, "GeluGrad")

	y := make([]float64, n)
	Tanh(y, x)
	TanhGrad(dx, y, dy)
	requireClose(t, numGrad(func() float64 { Tanh(tmp, x); return dot(dy, tmp) }, x), dx, fdTol, "TanhGrad")

	ReluGrad(dx, x, dy)
	requireClose(t, numGrad(func() float64 { Relu(tmp, x); return dot(dy, tmp) }, x), dx, fdTol, "ReluGrad")
}

func TestSoftmaxGradFD(t *testing.T) {
	r := newRand(21)
	for _, c := range [][2]int{{1, 1}, {1, 6}, {3, 5}} {
		rows, n := c[0], c[1]
		x := randVec[float64](r, rows*n, -3, 3)
		dy := randVec[float64](r, rows*n, -1, 1)
		y := make([]float64, len(x))
		Softmax(y, x, rows, n)
		dx := make([]float64, len(x))
		SoftmaxGrad(dx, y, dy, rows, n)
		tmp := make([]float64, len(x))
		requireClose(t, numGrad(func() float64 { Softmax(tmp, x, rows, n); return dot(dy, tmp) }, x), dx, fdTol, "SoftmaxGrad")
	}
}

func TestLayerNormGradFD(t *testing.T) {
	r := newRand(22)
	const eps = 1e-5
	for _, c := range [][2]int{{1, 2}, {1, 7}, {4, 5}} {
		rows, n := c[0], c[1]
		x := randVec[float64](r, rows*n, -2, 3)
		g := randVec[float64](r, n, 0.5, 1.5)
		b := randVec[float64](r, n, -1, 1)
		dy := randVec[float64](r, rows*n, -1, 1)
		tmp := make([]float64, len(x))
		loss := func() float64 { LayerNorm(tmp, x, g, b, rows, n, eps); return dot(dy, tmp) }

		dx := make([]float64, len(x))
		LayerNormGradX(dx, x, g, dy, rows, n, eps)
		requireClose(t, numGrad(loss, x), dx, fdTol, "LayerNormGradX")

		dg := make([]float64, n)
		LayerNormGradGamma(dg, x, dy, rows, n, eps)
		requireClose(t, numGrad(loss, g), dg, fdTol, "LayerNormGradGamma")

		// dbeta is documented as ReduceSum(dy) over rows.
		db := make([]float64, n)
		ReduceSum(db, dy, []int{rows, n}, []int{0})
		requireClose(t, numGrad(loss, b), db, fdTol, "dbeta")
	}
}

func testLayerNormGradLarge[T Float](t *testing.T) {
	// Wide rows and many rows exercise the parallel row and column splits;
	// compared with the float64 kernels on the same (T-rounded) data.
	r := newRand(23)
	rows, n := 257, 300
	x := randVec[T](r, rows*n, -2, 3)
	g := randVec[T](r, n, 0.5, 1.5)
	dy := randVec[T](r, rows*n, -1, 1)
	dx := make([]T, len(x))
	LayerNormGradX(dx, x, g, dy, rows, n, 1e-5)
	dx64 := make([]float64, len(x))
	LayerNormGradX(dx64, to64(x), to64(g), to64(dy), rows, n, 1e-5)
	requireClose(t, dx64, dx, 10*tolOf[T](), "dx")
	dg := make([]T, n)
	LayerNormGradGamma(dg, x, dy, rows, n, 1e-5)
	dg64 := make([]float64, n)
	LayerNormGradGamma(dg64, to64(x), to64(dy), rows, n, 1e-5)
	requireClose(t, dg64, dg, 10*tolOf[T](), "dgamma")
}

func TestLayerNormGradLarge(t *testing.T) {
	both(t, testLayerNormGradLarge[float32], testLayerNormGradLarge[float64])
}

func TestCrossEntropyGradFD(t *testing.T) {
	r := newRand(24)
	rows, vocab := 3, 5
	x := randVec[float64](r, rows*vocab, -3, 3)
	labels := []int32{4, 0, 2}
	const dloss = 1.7
	dx := make([]float64, len(x))
	require.NoError(t, CrossEntropyGrad(dx, x, labels, dloss, rows, vocab))
	loss := func() float64 {
		l, err := CrossEntropy(x, labels, rows, vocab)
		require.NoError(t, err)
		return dloss * l
	}
	requireClose(t, numGrad(loss, x), dx, fdTol, "CrossEntropyGrad")
}

func TestReduceMaxGradFD(t *testing.T) {
	r := newRand(25)
	for _, c := range reduceCases {
		if prod(c.shape) > 1000 {
			continue // finite differences are quadratic in the size
		}
		x := randVec[float64](r, prod(c.shape), -2, 2)
		y := refReduce(x, c.shape, c.axes, math.Inf(-1), math.Max)
		dy := randVec[float64](r, len(y), -1, 1)
		dx := make([]float64, len(x))
		ReduceMaxGrad(dx, x, y, dy, c.shape, c.axes)
		tmp := make([]float64, len(y))
		loss := func() float64 { ReduceMax(tmp, x, c.shape, c.axes); return dot(dy, tmp) }
		requireClose(t, numGrad(loss, x), dx, fdTol, "ReduceMaxGrad")
	}
}

func TestCausalMaskGradFD(t *testing.T) {
	r := newRand(26)
	batch, s, tt := 2, 3, 4
	x := randVec[float64](r, batch*s*tt, -1, 1)
	dy := randVec[float64](r, len(x), -1, 1)
	dx := make([]float64, len(x))
	CausalMask(dx, dy, batch, s, tt, 0)
	tmp := make([]float64, len(x))
	// Any constant fill has zero derivative; a finite one keeps the loss
	// finite where −Inf would not.
	loss := func() float64 { CausalMask(tmp, x, batch, s, tt, -3); return dot(dy, tmp) }
	requireClose(t, numGrad(loss, x), dx, fdTol, "CausalMask grad")
}

func TestEmbeddingGradFD(t *testing.T) {
	r := newRand(27)
	vocab, dim := 5, 3
	table := randVec[float64](r, vocab*dim, -1, 1)
	ids := []int32{4, 1, 4, 0}
	dy := randVec[float64](r, len(ids)*dim, -1, 1)
	dt := make([]float64, len(table))
	require.NoError(t, EmbeddingGrad(dt, dy, ids, vocab, dim))
	tmp := make([]float64, len(ids)*dim)
	loss := func() float64 {
		require.NoError(t, Embedding(tmp, table, ids, vocab, dim))
		return dot(dy, tmp)
	}
	requireClose(t, numGrad(loss, table), dt, fdTol, "EmbeddingGrad")
}
