package cpu

import (
	"math"
	"testing"
)

func testOptim[T Float](t *testing.T) {
	r := newRand(19)
	tol := tolOf[T]()
	for _, n := range []int{0, 1, 9, 40000} {
		p := randVec[T](r, n, -1, 1)
		g := randVec[T](r, n, -1, 1)
		m := randVec[T](r, n, -0.1, 0.1)
		v := randVec[T](r, n, 0, 0.01)
		const b1, b2, lr, eps, wd = 0.9, 0.999, 1e-3, 1e-8, 0.01
		wantM := make([]float64, n)
		wantV := make([]float64, n)
		for i := range n {
			wantM[i] = b1*float64(m[i]) + (1-b1)*float64(g[i])
			wantV[i] = b2*float64(v[i]) + (1-b2)*float64(g[i])*float64(g[i])
		}
		// Update in place, as the runtime does.
		AdamMoment1(m, m, g, T(b1))
		AdamMoment2(v, v, g, T(b2))
		requireClose(t, wantM, m, tol, "AdamMoment1")
		requireClose(t, wantV, v, tol, "AdamMoment2")

		for _, step := range []int{1, 7} {
			out := make([]T, n)
			AdamW(out, p, m, v, T(lr), T(b1), T(b2), T(eps), T(wd), step)
			want := make([]float64, n)
			bc1 := 1 - math.Pow(float64(T(b1)), float64(step))
			bc2 := 1 - math.Pow(float64(T(b2)), float64(step))
			for i := range n {
				x := float64(p[i])
				mh := float64(m[i]) / bc1
				vh := float64(v[i]) / bc2
				want[i] = x - float64(T(lr))*float64(T(wd))*x - float64(T(lr))*mh/(math.Sqrt(vh)+float64(T(eps)))
			}
			requireClose(t, want, out, tol, "AdamW")
		}

		// SGD with momentum from a zero buffer: first step is g + wd·p.
		buf := make([]T, n)
		SGDMomentum(buf, buf, g, p, T(0.9), T(wd))
		want := make([]float64, n)
		for i := range n {
			want[i] = float64(g[i]) + float64(T(wd))*float64(p[i])
		}
		requireClose(t, want, buf, tol, "SGDMomentum first step")
		SGDMomentum(buf, buf, g, p, T(0.9), T(wd))
		for i := range n {
			want[i] = float64(T(0.9))*want[i] + float64(g[i]) + float64(T(wd))*float64(p[i])
		}
		requireClose(t, want, buf, 10*tol, "SGDMomentum second step")
		for i := range n {
			want[i] = float64(p[i]) - float64(T(0.1))*float64(buf[i])
		}
		SGDUpdate(p, p, buf, T(0.1))
		requireClose(t, want, p, tol, "SGDUpdate")
	}
}

func TestOptim(t *testing.T) { both(t, testOptim[float32], testOptim[float64]) }

func TestAdamWStepClamp(t *testing.T) {
	// step 0 would divide by a zero bias correction; it is treated as 1.
	a, b := make([]float64, 1), make([]float64, 1)
	AdamW(a, []float64{1}, []float64{0.1}, []float64{0.01}, 1e-3, 0.9, 0.999, 1e-8, 0, 0)
	AdamW(b, []float64{1}, []float64{0.1}, []float64{0.01}, 1e-3, 0.9, 0.999, 1e-8, 0, 1)
	requireClose(t, to64(b), a, 0, "step 0")
}
