package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func refGelu(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func testBinary[T Float](t *testing.T) {
	r := newRand(3)
	tol := tolOf[T]()
	cases := []struct {
		name string
		fn   func(out, a, b []T)
		ref  func(a, b float64) float64
	}{
		{"Add", Add[T], func(a, b float64) float64 { return a + b }},
		{"Sub", Sub[T], func(a, b float64) float64 { return a - b }},
		{"Mul", Mul[T], func(a, b float64) float64 { return a * b }},
		{"Div", Div[T], func(a, b float64) float64 { return a / b }},
	}
	// 40000 crosses elemGrain so the parallel split is exercised too.
	for _, n := range []int{0, 1, 7, 40000} {
		for _, c := range cases {
			a := randVec[T](r, n, -3, 3)
			b := randVec[T](r, n, 0.5, 2)
			out := make([]T, n)
			c.fn(out, a, b)
			want := make([]float64, n)
			for i := range want {
				want[i] = c.ref(float64(a[i]), float64(b[i]))
			}
			requireClose(t, want, out, tol, c.name)
			// In place: out aliases a.
			c.fn(a, a, b)
			requireClose(t, want, a, tol, c.name+" aliased")
		}
	}
}

func TestBinary(t *testing.T) { both(t, testBinary[float32], testBinary[float64]) }

func testUnary[T Float](t *testing.T) {
	r := newRand(4)
	tol := tolOf[T]()
	cases := []struct {
		name   string
		fn     func(out, x []T)
		ref    func(x float64) float64
		lo, hi float64
	}{
		{"Neg", Neg[T], func(x float64) float64 { return -x }, -3, 3},
		{"Exp", Exp[T], math.Exp, -5, 5},
		{"Log", Log[T], math.Log, 0.01, 10},
		{"Tanh", Tanh[T], math.Tanh, -4, 4},
		{"Sqrt", Sqrt[T], math.Sqrt, 0, 10},
		{"Relu", Relu[T], func(x float64) float64 { return math.Max(x, 0) }, -3, 3},
		{"Gelu", Gelu[T], refGelu, -6, 6},
	}
	for _, n := range []int{0, 1, 5, 40000} {
		for _, c := range cases {
			x := randVec[T](r, n, c.lo, c.hi)
			out := make([]T, n)
			c.fn(out, x)
			want := make([]float64, n)
			for i := range want {
				want[i] = c.ref(float64(x[i]))
			}
			requireClose(t, want, out, tol, c.name)
			c.fn(x, x)
			requireClose(t, want, x, tol, c.name+" aliased")
		}
	}
}

func TestUnary(t *testing.T) { both(t, testUnary[float32], testUnary[float64]) }

func TestUnarySpecialValues(t *testing.T) {
	x := []float64{0, -1, math.Inf(1), math.Inf(-1)}
	out := make([]float64, 4)
	Log(out, x)
	require.Equal(t, math.Inf(-1), out[0])
	require.True(t, math.IsNaN(out[1]))
	Relu(out, x)
	require.Equal(t, []float64{0, 0, math.Inf(1), 0}, out)
	Gelu(out, []float64{0, -30, 30, 1})
	require.Equal(t, 0.0, out[0])
	require.InDelta(t, 0, out[1], 1e-12)
	require.InDelta(t, 30, out[2], 1e-12)
}

func testUnaryGrads[T Float](t *testing.T) {
	r := newRand(5)
	tol := tolOf[T]()
	n := 33
	x := randVec[T](r, n, -4, 4)
	dy := randVec[T](r, n, -2, 2)
	dx := make([]T, n)

	ReluGrad(dx, x, dy)
	want := make([]float64, n)
	for i := range want {
		if x[i] > 0 {
			want[i] = float64(dy[i])
		}
	}
	requireClose(t, want, dx, tol, "ReluGrad")

	y := make([]T, n)
	Tanh(y, x)
	TanhGrad(dx, y, dy)
	for i := range want {
		yy := float64(y[i])
		want[i] = float64(dy[i]) * (1 - yy*yy)
	}
	requireClose(t, want, dx, tol, "TanhGrad")

	GeluGrad(dx, x, dy)
	for i := range want {
		z := float64(x[i])
		c := math.Sqrt(2 / math.Pi)
		th := math.Tanh(c * (z + 0.044715*z*z*z))
		want[i] = float64(dy[i]) * (0.5*(1+th) + 0.5*z*(1-th*th)*c*(1+3*0.044715*z*z))
	}
	requireClose(t, want, dx, tol, "GeluGrad")
}

func TestUnaryGrads(t *testing.T) { both(t, testUnaryGrads[float32], testUnaryGrads[float64]) }

func testScaleFill[T Float](t *testing.T) {
	r := newRand(6)
	for _, n := range []int{0, 3, 40000} {
		x := randVec[T](r, n, -1, 1)
		out := make([]T, n)
		Scale(out, x, T(-2.5))
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(x[i]) * -2.5
		}
		requireClose(t, want, out, tolOf[T](), "Scale")
		Fill(out, T(7))
		for i := range want {
			want[i] = 7
		}
		requireClose(t, want, out, 0, "Fill")
	}
}

func TestScaleFill(t *testing.T) { both(t, testScaleFill[float32], testScaleFill[float64]) }

func TestElementwiseBadLength(t *testing.T) {
	require.Panics(t, func() { Add(make([]float32, 2), make([]float32, 3), make([]float32, 2)) })
	require.Panics(t, func() { Exp(make([]float64, 2), make([]float64, 1)) })
}

func TestCast(t *testing.T) {
	f := []float64{1.9, -1.9, 0, 1e10, 2.5}
	i32 := make([]int32, 3)
	Cast(i32, f[:3])
	require.Equal(t, []int32{1, -1, 0}, i32)
	f32 := make([]float32, len(f))
	Cast(f32, f)
	require.Equal(t, []float32{1.9, -1.9, 0, 1e10, 2.5}, f32)
	i64 := []int64{-5, 1 << 40}
	back := make([]float64, 2)
	Cast(back, i64)
	require.Equal(t, []float64{-5, 1 << 40}, back)
	w := make([]int64, 2)
	Cast(w, []int32{-7, 9})
	require.Equal(t, []int64{-7, 9}, w)
	big := make([]float32, 40000)
	Cast(big, make([]int32, 40000))
	require.Panics(t, func() { Cast(make([]float32, 1), []int32{1, 2}) })
}
