package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSilu(t *testing.T) { both(t, testSilu[float32], testSilu[float64]) }

func testSilu[T Float](t *testing.T) {
	x := []T{-40, -2, -0.5, 0, 0.5, 2, 40}
	got := make([]T, len(x))
	Silu(got, x)
	want := make([]float64, len(x))
	for i, v := range x {
		z := float64(v)
		want[i] = z / (1 + math.Exp(-z))
	}
	requireClose(t, want, got, tolOf[T](), "silu")
	require.False(t, math.IsNaN(float64(got[0])), "silu(−40) must not overflow to NaN")
}

func TestRMSNormRowsHaveUnitRMS(t *testing.T) {
	both(t, testRMSNormUnit[float32], testRMSNormUnit[float64])
}

func testRMSNormUnit[T Float](t *testing.T) {
	r := newRand(3)
	rows, n := 5, 12
	x := randVec[T](r, rows*n, -3, 3)
	gamma := make([]T, n)
	for i := range gamma {
		gamma[i] = 1
	}
	out := make([]T, len(x))
	RMSNorm(out, x, gamma, rows, n, 0)
	for i := range rows {
		ss := 0.0
		for _, v := range out[i*n : (i+1)*n] {
			ss += float64(v) * float64(v)
		}
		require.InDelta(t, 1, math.Sqrt(ss/float64(n)), 10*tolOf[T](), "row %d", i)
	}
}

// TestRoPE checks the rotate-half layout against the formula, that
// position 0 is untouched, that the inverse undoes the rotation, and that
// rotations keep each pair's length.
func TestRoPE(t *testing.T) { both(t, testRoPE[float32], testRoPE[float64]) }

func testRoPE[T Float](t *testing.T) {
	r := newRand(5)
	batch, positions, d, theta := 3, 7, 8, 100.0
	x := randVec[T](r, batch*positions*d, -1, 1)
	out := make([]T, len(x))
	RoPE(out, x, batch, positions, d, theta, false)
	want := make([]float64, len(x))
	for row := range batch * positions {
		p := row % positions
		for i := range d / 2 {
			a := float64(p) / math.Pow(theta, float64(2*i)/float64(d))
			x0, x1 := float64(x[row*d+i]), float64(x[row*d+i+d/2])
			want[row*d+i] = x0*math.Cos(a) - x1*math.Sin(a)
			want[row*d+i+d/2] = x1*math.Cos(a) + x0*math.Sin(a)
		}
	}
	requireClose(t, want, out, tolOf[T](), "rope")
	require.Equal(t, x[:d], out[:d], "position 0 is not rotated")
	back := make([]T, len(x))
	RoPE(back, out, batch, positions, d, theta, true)
	requireClose(t, to64(x), back, 4*tolOf[T](), "inverse rope")
}
