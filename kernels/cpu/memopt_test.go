package cpu

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refAdafactorAcc is the accumulator update of Shazeer & Stern's
// Algorithm 4, written as plainly as the paper states it, in float64:
// row and col are updated in place.
func refAdafactorAcc(g, row, col []float64, n, m, t int, eps1 float64) {
	beta := 1 - math.Pow(float64(t), -0.8)
	for i := range n {
		s := 0.0
		for j := range m {
			s += g[i*m+j]*g[i*m+j] + eps1
		}
		row[i] = beta*row[i] + (1-beta)*s
	}
	for j := range m {
		s := 0.0
		for i := range n {
			s += g[i*m+j]*g[i*m+j] + eps1
		}
		col[j] = beta*col[j] + (1-beta)*s
	}
}

func rms(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v * v
	}
	return math.Sqrt(s / float64(len(x)))
}

func refAdafactorStep(p, u []float64, t int, eps2, clip, rel float64) []float64 {
	alpha := math.Max(eps2, rms(p)) * math.Min(rel, 1/math.Sqrt(float64(t)))
	d := math.Max(1, rms(u)/clip)
	out := make([]float64, len(p))
	for i := range p {
		out[i] = p[i] - alpha*u[i]/d
	}
	return out
}

func testAdafactor[T Float](t *testing.T) {
	r := newRand(23)
	tol := tolOf[T]()
	const eps1, eps2, rel = 1e-30, 1e-3, 1e-2
	for _, sh := range [][2]int{{1, 1}, {3, 5}, {7, 1}, {300, 200}} {
		n, m := sh[0], sh[1]
		for _, clip := range []float64{1, 0.3, 100} {
			p := randVec[T](r, n*m, -1, 1)
			row := randVec[T](r, n, 0, 2)
			col := randVec[T](r, m, 0, 2)
			g := randVec[T](r, n*m, -1, 1)
			for _, step := range []int{1, 3, 400} {
				h := AdafactorStep{Step: step, Eps2: eps2, Clip: clip, RelStep: rel}
				wantRow, wantCol := to64(row), to64(col)
				refAdafactorAcc(to64(g), wantRow, wantCol, n, m, step, eps1)

				beta := AdafactorBeta2(step, 0.8)
				newRow, newCol := make([]T, n), make([]T, m)
				AdafactorRows(newRow, row, g, n, m, beta, eps1)
				AdafactorCols(newCol, col, g, n, m, beta, eps1)
				requireClose(t, wantRow, newRow, tol, "AdafactorRows")
				requireClose(t, wantCol, newCol, tol, "AdafactorCols")
				// The update reads the rounded accumulators the runtime
				// would store; compare with the reference on those.
				want := refAdafactorFrom(to64(p), to64(g), to64(newRow), to64(newCol), n, m, step, eps2, clip, rel)
				out := make([]T, n*m)
				Adafactor(out, p, g, newRow, newCol, n, m, h)
				requireClose(t, want, out, tol, "Adafactor")
			}
		}
	}
}

// refAdafactorFrom is Algorithm 4's update from the given accumulators:
// V̂ = R·C/(1ᵀR), U = G/√V̂, then the clipped relative step.
func refAdafactorFrom(p, g, row, col []float64, n, m, t int, eps2, clip, rel float64) []float64 {
	sumR := 0.0
	for _, r := range row {
		sumR += r
	}
	u := make([]float64, n*m)
	for i := range n {
		for j := range m {
			u[i*m+j] = g[i*m+j] / math.Sqrt(row[i]*col[j]/sumR)
		}
	}
	return refAdafactorStep(p, u, t, eps2, clip, rel)
}

func TestAdafactor(t *testing.T) { both(t, testAdafactor[float32], testAdafactor[float64]) }

func testAdafactorVec[T Float](t *testing.T) {
	r := newRand(29)
	tol := tolOf[T]()
	for _, n := range []int{1, 9, 40000} {
		p := randVec[T](r, n, -1, 1)
		g := randVec[T](r, n, -1, 1)
		v := randVec[T](r, n, 0, 2)
		for _, step := range []int{1, 2, 10001} {
			beta := AdafactorBeta2(step, 0.8)
			want := make([]float64, n)
			for i := range n {
				x := float64(g[i])
				want[i] = beta*float64(v[i]) + (1-beta)*(x*x+1e-30)
			}
			nv := make([]T, n)
			AdafactorMoment(nv, v, g, beta, 1e-30)
			requireClose(t, want, nv, tol, "AdafactorMoment")
			u := make([]float64, n)
			for i := range n {
				u[i] = float64(g[i]) / math.Sqrt(float64(nv[i]))
			}
			wantP := refAdafactorStep(to64(p), u, step, 1e-3, 1, 1e-2)
			out := make([]T, n)
			AdafactorVec(out, p, g, nv, AdafactorStep{Step: step, Eps2: 1e-3, Clip: 1, RelStep: 1e-2})
			requireClose(t, wantP, out, tol, "AdafactorVec")
		}
	}
}

func TestAdafactorVec(t *testing.T) { both(t, testAdafactorVec[float32], testAdafactorVec[float64]) }

func TestAdafactorEdges(t *testing.T) {
	assert.Equal(t, 0.0, AdafactorBeta2(1, 0.8), "the first step keeps no history")
	assert.Equal(t, AdafactorBeta2(1, 0.8), AdafactorBeta2(0, 0.8), "step 0 is treated as 1")
	assert.InDelta(t, 1-math.Pow(2, -0.8), AdafactorBeta2(2, 0.8), 1e-15)

	// A zero gradient with eps1 = 0 leaves zero accumulators; the param
	// must not become NaN.
	p := []float64{1, 2, 3, 4}
	g := make([]float64, 4)
	row, col := make([]float64, 2), make([]float64, 2)
	AdafactorRows(row, row, g, 2, 2, 0, 0)
	AdafactorCols(col, col, g, 2, 2, 0, 0)
	out := make([]float64, 4)
	Adafactor(out, p, g, row, col, 2, 2, AdafactorStep{Step: 1, Eps2: 1e-3, Clip: 1, RelStep: 1e-2})
	assert.Equal(t, p, out)

	// In place, as the runtime may run it: RMS(p) is read before writing.
	r := newRand(5)
	p = randVec[float64](r, 12, -1, 1)
	g = randVec[float64](r, 12, -1, 1)
	row, col = randVec[float64](r, 3, 0.5, 1), randVec[float64](r, 4, 0.5, 1)
	want := make([]float64, 12)
	h := AdafactorStep{Step: 4, Eps2: 1e-3, Clip: 1, RelStep: 1e-2}
	Adafactor(want, p, g, row, col, 3, 4, h)
	Adafactor(p, p, g, row, col, 3, 4, h)
	assert.Equal(t, want, p)

	// Float32 accumulators of ε₁-sized sums do not underflow the update.
	p32, g32 := []float32{0.5, -0.5}, []float32{0, 1e-20}
	r32, c32 := make([]float32, 1), make([]float32, 2)
	AdafactorRows(r32, r32, g32, 1, 2, 0, 1e-30)
	AdafactorCols(c32, c32, g32, 1, 2, 0, 1e-30)
	out32 := make([]float32, 2)
	Adafactor(out32, p32, g32, r32, c32, 1, 2, h)
	for _, x := range out32 {
		require.False(t, math.IsNaN(float64(x)) || math.IsInf(float64(x), 0), "update %v", out32)
	}
}

// refSM3 is SM3-II for a matrix as the paper states it: ν from the old
// accumulators, the step with ν, then each accumulator the max of ν over
// its cover. row and col are updated in place; the new param is returned.
func refSM3(p, g, row, col []float64, n, m int, lr float64) []float64 {
	nu := make([]float64, n*m)
	for i := range n {
		for j := range m {
			nu[i*m+j] = math.Min(row[i], col[j]) + g[i*m+j]*g[i*m+j]
		}
	}
	out := make([]float64, n*m)
	for k := range out {
		out[k] = p[k]
		if nu[k] > 0 {
			out[k] -= lr * g[k] / math.Sqrt(nu[k])
		}
	}
	for i := range n {
		row[i] = math.Inf(-1)
		for j := range m {
			row[i] = math.Max(row[i], nu[i*m+j])
		}
	}
	for j := range m {
		col[j] = math.Inf(-1)
		for i := range n {
			col[j] = math.Max(col[j], nu[i*m+j])
		}
	}
	return out
}

func testSM3[T Float](t *testing.T) {
	r := newRand(31)
	tol := tolOf[T]()
	for _, sh := range [][2]int{{1, 1}, {4, 6}, {1, 9}, {300, 200}} {
		n, m := sh[0], sh[1]
		p := randVec[T](r, n*m, -1, 1)
		row, col := make([]T, n), make([]T, m)
		wantRow, wantCol, wantP := to64(row), to64(col), to64(p)
		for step := range 3 {
			g := randVec[T](r, n*m, -1, 1)
			if step == 1 {
				g[0] = 0 // a zero entry with (at step 0) zero accumulators
			}
			wantP = refSM3(wantP, to64(g), wantRow, wantCol, n, m, 0.1)
			newRow, newCol, out := make([]T, n), make([]T, m), make([]T, n*m)
			SM3Rows(newRow, row, col, g, n, m)
			SM3Cols(newCol, row, col, g, n, m)
			SM3(out, p, g, row, col, n, m, 0.1)
			requireClose(t, wantRow, newRow, tol, "SM3Rows")
			requireClose(t, wantCol, newCol, tol, "SM3Cols")
			requireClose(t, wantP, out, 10*tol, "SM3")
			p, row, col = out, newRow, newCol
			// Continue the reference from what the kernels stored.
			wantP, wantRow, wantCol = to64(p), to64(row), to64(col)
		}
	}
}

func TestSM3(t *testing.T) { both(t, testSM3[float32], testSM3[float64]) }

func testSM3Vec[T Float](t *testing.T) {
	r := newRand(37)
	tol := tolOf[T]()
	for _, n := range []int{1, 9, 40000} {
		p := randVec[T](r, n, -1, 1)
		g := randVec[T](r, n, -1, 1)
		g[0] = 0
		v := make([]T, n)
		want := make([]float64, n)
		for i := range n {
			want[i] = float64(g[i]) * float64(g[i])
		}
		SM3Accumulate(v, v, g)
		requireClose(t, want, v, tol, "SM3Accumulate")
		wantP := make([]float64, n)
		for i := range n {
			wantP[i] = float64(p[i])
			if v[i] != 0 {
				wantP[i] -= 0.1 * float64(g[i]) / math.Sqrt(float64(v[i]))
			}
		}
		SM3Vec(p, p, g, v, 0.1)
		requireClose(t, wantP, p, tol, "SM3Vec")
	}
}

func TestSM3Vec(t *testing.T) { both(t, testSM3Vec[float32], testSM3Vec[float64]) }

// The accumulator kernels may write over their own accumulator (the
// runtime may update state in place); the result must not change.
func TestFactoredKernelsInPlace(t *testing.T) {
	r := newRand(41)
	const n, m = 300, 200
	g := randVec[float64](r, n*m, -1, 1)
	row, col := randVec[float64](r, n, 0, 1), randVec[float64](r, m, 0, 1)
	check := func(what string, f func(out, acc []float64), acc []float64) {
		want := make([]float64, len(acc))
		f(want, acc)
		f(acc, acc)
		assert.Equal(t, want, acc, what)
	}
	check("AdafactorRows", func(o, a []float64) { AdafactorRows(o, a, g, n, m, 0.3, 1e-30) }, slices.Clone(row))
	check("AdafactorCols", func(o, a []float64) { AdafactorCols(o, a, g, n, m, 0.3, 1e-30) }, slices.Clone(col))
	check("SM3Rows", func(o, a []float64) { SM3Rows(o, a, col, g, n, m) }, slices.Clone(row))
	check("SM3Cols", func(o, a []float64) { SM3Cols(o, row, a, g, n, m) }, slices.Clone(col))
	p := randVec[float64](r, n*m, -1, 1)
	check("SM3", func(o, a []float64) { SM3(o, a, g, row, col, n, m, 0.1) }, slices.Clone(p))
}
