package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
)

var elemSizes = []int{1, 31, 1000, 4099}

// ulp2 is 2⁻²², two units in the last place of a float32 near 1.
const ulp2 = 1.0 / (1 << 22)

// requireWithin checks |got−want| ≤ bound[i] element by element, with
// NaNs and infinities matching exactly.
func requireWithin(t *testing.T, want, got []float32, bound []float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		if math.IsNaN(w) || math.IsInf(w, 0) {
			if math.IsNaN(w) && math.IsNaN(g) || w == g {
				continue
			}
			t.Fatalf("%s: element %d = %v, want %v", what, i, g, w)
		}
		if d := math.Abs(g - w); !(d <= bound[i]) {
			t.Fatalf("%s: element %d = %v, want %v (|diff| %.3g > bound %.3g)", what, i, g, w, d, bound[i])
		}
	}
	checkGuard(t, got)
}

// forShapes runs body for every size, block size and grid of the
// elementwise tests.
func forShapes(t *testing.T, body func(t *testing.T, n int, grid, block uint32)) {
	for _, n := range elemSizes {
		for _, block := range blockSizes {
			for _, grid := range grids(n, block) {
				t.Run(fmt.Sprintf("n%d_b%d_g%d", n, block, grid), func(t *testing.T) { body(t, n, grid, block) })
			}
		}
	}
}

// Single IEEE operations (and sqrt, correctly rounded on both sides)
// must agree with the Go kernels bit for bit.
func TestElementwiseExact(t *testing.T) {
	binary := map[string]func(o, a, b []float32){"gc_add": kcpu.Add[float32], "gc_sub": kcpu.Sub[float32], "gc_mul": kcpu.Mul[float32], "gc_div": kcpu.Div[float32]}
	unary := map[string]func(o, x []float32){"gc_neg": kcpu.Neg[float32], "gc_relu": kcpu.Relu[float32], "gc_sqrt": kcpu.Sqrt[float32]}
	grads := map[string]func(o, x, dy []float32){"gc_relu_grad": kcpu.ReluGrad[float32]}
	forShapes(t, func(t *testing.T, n int, grid, block uint32) {
		r := newRand(uint64(n)*7 + uint64(block))
		a, b := randNorm(r, n, 3), randNorm(r, n, 3)
		if n > 4 {
			a[0], b[1], a[2], b[3] = 0, 0, float32(math.Inf(1)), float32(math.NaN()) // IEEE edge cases
		}
		for name, f := range binary {
			want, got := make([]float32, n), out(n)
			f(want, a, b)
			launch(t, name, grid, block, got, a, b, n)
			requireBits(t, want, got, name)
		}
		for name, f := range unary {
			x := a
			if name == "gc_sqrt" {
				x = randVec(r, n, 0, 100)
			}
			want, got := make([]float32, n), out(n)
			f(want, x)
			launch(t, name, grid, block, got, x, n)
			requireBits(t, want, got, name)
		}
		for name, f := range grads {
			want, got := make([]float32, n), out(n)
			f(want, a, b)
			launch(t, name, grid, block, got, a, b, n)
			requireBits(t, want, got, name)
		}
		s := []float32{-1.75}
		want, got := make([]float32, n), out(n)
		kcpu.Scale(want, a, s[0])
		launch(t, "gc_scale", grid, block, got, a, s, n)
		requireBits(t, want, got, "gc_scale")
		got = out(n)
		launch(t, "gc_scale_by", grid, block, got, a, n, s[0])
		requireBits(t, want, got, "gc_scale_by")
	})
}

// Outputs may be an input (updates in place).
func TestElementwiseInPlace(t *testing.T) {
	r := newRand(3)
	n := 777
	a, b := randNorm(r, n, 1), randNorm(r, n, 1)
	want := make([]float32, n)
	kcpu.Add(want, a, b)
	launch(t, "gc_add", 2, 64, a, a, b, n)
	requireBits(t, want, a, "gc_add in place")
}

// exp, log and tanh run in float (glibc's expf, logf, tanhf here, CUDA's
// on a GPU) against Go's float64 functions rounded to float32: they may
// differ in the last place, so the bound is 2⁻²² relative.
func TestElementwiseTranscendental(t *testing.T) {
	cases := []struct {
		name   string
		f      func(o, x []float32)
		lo, hi float64
	}{
		{"gc_exp", kcpu.Exp[float32], -80, 80},
		{"gc_log", kcpu.Log[float32], 1e-30, 1e30},
		{"gc_tanh", kcpu.Tanh[float32], -12, 12},
	}
	worst := map[string]float64{}
	forShapes(t, func(t *testing.T, n int, grid, block uint32) {
		r := newRand(uint64(n) + 11)
		for _, c := range cases {
			x := randVec(r, n, c.lo, c.hi)
			if c.name == "gc_log" { // spread over many binades
				for i := range x {
					x[i] = float32(math.Exp(math.Log(c.lo) + (math.Log(c.hi)-math.Log(c.lo))*r.Float64()))
				}
			}
			want, got := make([]float32, n), out(n)
			c.f(want, x)
			launch(t, c.name, grid, block, got, x, n)
			worst[c.name] = max(worst[c.name], requireClose(t, want, got, ulp2, 0, c.name))
		}
	})
	t.Logf("largest relative error: %v", worst)
}

// geluBound is the error allowed for GELU and its gradient at x. u is
// formed in float by four roundings (relative error up to 4·2⁻²⁴), and
// exp(−2|u|) multiplies an argument error by its condition number 2|u|:
// 8|u|·2⁻²⁴, plus a few roundings of the terms. The Go reference forms
// 1 + tanh u in float64, which cancels for very negative x (it returns 0
// where GELU is −4e-24), so its own absolute error, |x|·2⁻⁵³ and the like,
// is allowed too: there the kernel is the more accurate of the two.
func geluBound(x, dy float32) (gelu, grad float64) {
	z := float64(x)
	u := 0.7978845608028654 * (z + 0.044715*z*z*z)
	s := 1 / (1 + math.Exp(-2*u))
	sc := 1 / (1 + math.Exp(2*u))
	k := (6 + 8*math.Abs(u)) / (1 << 24)
	du := 0.7978845608028654 * (1 + 3*0.044715*z*z)
	ref := math.Abs(z) / (1 << 53)
	refGrad := (1 + math.Abs(z*du)) / (1 << 52) * math.Abs(float64(dy))
	return k*math.Abs(z*s) + ref + 1e-37, k*(math.Abs(s)+math.Abs(2*s*sc*z*du))*math.Abs(float64(dy)) + refGrad + 1e-37
}

func TestGelu(t *testing.T) {
	forShapes(t, func(t *testing.T, n int, grid, block uint32) {
		r := newRand(uint64(n) + 5)
		x, dy := randVec(r, n, -9, 9), randNorm(r, n, 1)
		bg, bd := make([]float64, n), make([]float64, n)
		for i := range x {
			bg[i], bd[i] = geluBound(x[i], dy[i])
		}
		want, got := make([]float32, n), out(n)
		kcpu.Gelu(want, x)
		launch(t, "gc_gelu", grid, block, got, x, n)
		requireWithin(t, want, got, bg, "gc_gelu")
		want, got = make([]float32, n), out(n)
		kcpu.GeluGrad(want, x, dy)
		launch(t, "gc_gelu_grad", grid, block, got, x, dy, n)
		requireWithin(t, want, got, bd, "gc_gelu_grad")
	})
}

// Kernels of a few float32 operations mirror the Go arithmetic; a fused
// multiply-add (on a GPU, or in Go on arm64) may round once where the
// other rounds twice, so the bound is 2⁻²² of the terms' magnitudes.
func TestElementwiseFloatFormulas(t *testing.T) {
	forShapes(t, func(t *testing.T, n int, grid, block uint32) {
		r := newRand(uint64(n) + 9)
		y, dy, m, g, p := randVec(r, n, -1, 1), randNorm(r, n, 1), randNorm(r, n, 1e-2), randNorm(r, n, 1e-2), randNorm(r, n, 1)
		v := randVec(r, n, 0, 1e-4)
		bound := func(terms func(i int) float64) []float64 {
			b := make([]float64, n)
			for i := range b {
				b[i] = ulp2*terms(i) + 1e-38
			}
			return b
		}
		abs := func(x float32) float64 { return math.Abs(float64(x)) }

		want, got := make([]float32, n), out(n)
		kcpu.TanhGrad(want, y, dy)
		launch(t, "gc_tanh_grad", grid, block, got, y, dy, n)
		requireWithin(t, want, got, bound(func(i int) float64 { return abs(dy[i]) * (1 + abs(y[i]*y[i])) }), "gc_tanh_grad")

		const b1, b2, mom, wd = 0.9, 0.95, 0.9, 0.1
		want, got = make([]float32, n), out(n)
		kcpu.AdamMoment1(want, m, g, b1)
		launch(t, "gc_adam_m", grid, block, got, m, g, n, float32(b1))
		requireWithin(t, want, got, bound(func(i int) float64 { return abs(m[i]) + abs(g[i]) }), "gc_adam_m")

		want, got = make([]float32, n), out(n)
		kcpu.AdamMoment2(want, v, g, b2)
		launch(t, "gc_adam_v", grid, block, got, v, g, n, float32(b2))
		requireWithin(t, want, got, bound(func(i int) float64 { return abs(v[i]) + abs(g[i]*g[i]) }), "gc_adam_v")

		want, got = make([]float32, n), out(n)
		kcpu.SGDMomentum(want, m, g, p, mom, wd)
		launch(t, "gc_sgd_buf", grid, block, got, m, g, p, n, float32(mom), float32(wd))
		requireWithin(t, want, got, bound(func(i int) float64 { return abs(m[i]) + abs(g[i]) + abs(wd*p[i]) }), "gc_sgd_buf")

		lr := []float32{3e-3}
		want, got = make([]float32, n), out(n)
		kcpu.SGDUpdate(want, p, m, lr[0])
		launch(t, "gc_sgd", grid, block, got, p, m, lr, n)
		requireWithin(t, want, got, bound(func(i int) float64 { return abs(p[i]) + abs(lr[0]*m[i]) }), "gc_sgd")
	})
}

// Launch errors: the emulator checks arguments against the table.
func TestLaunchArgumentErrors(t *testing.T) {
	e := emulator(t)
	x := make([]float32, 4)
	err := e.Launch("gc_neg", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, x, x)
	require.ErrorContains(t, err, "2 arguments for 3 parameters")
	err = e.Launch("gc_neg", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, x, []float64{1}, 4)
	require.ErrorContains(t, err, "argument 1 (const float* x)")
	err = e.Launch("gc_scale_by", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, x, x, 4, 2.0)
	require.ErrorContains(t, err, "got float64")
	err = e.Launch("gc_nope", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0)
	require.ErrorContains(t, err, "unknown kernel")
	err = e.Launch("gc_neg", [3]uint32{1, 1, 1}, [3]uint32{2048, 1, 1}, 0, x, x, 4)
	require.ErrorContains(t, err, "launch dimensions")
	err = e.Launch("gc_neg", [3]uint32{0, 1, 1}, [3]uint32{32, 1, 1}, 0, x, x, 4)
	require.ErrorContains(t, err, "launch dimensions")
}

// The packed ReLU mask holds the CPU kernel's bytes, and the gradient
// from it copies dy exactly (NaN payloads too) where the bit is set.
func TestReluMask(t *testing.T) {
	for _, s := range [][2]int{{1, 1}, {3, 8}, {5, 37}, {4, 1000}} {
		rows, n := s[0], s[1]
		w := kcpu.MaskRowBytes(n)
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("r%d_n%d_b%d", rows, n, block), func(t *testing.T) {
				r := newRand(uint64(rows*n) + 6)
				x, dy := randNorm(r, rows*n, 1), randNorm(r, rows*n, 1)
				x[0] = float32(math.NaN())
				dy[len(dy)-1] = math.Float32frombits(0x7fc0beef)
				want := make([]uint8, rows*w)
				kcpu.ReluMask(want, x, rows, n)
				buf := make([]uint8, rows*w+guardLen)
				for i := range buf {
					buf[i] = 0xa5
				}
				got := buf[:rows*w]
				for _, grid := range grids(rows*w, block) {
					launch(t, "gc_relu_mask", grid, block, got, x, rows, n)
					require.Equal(t, want, got)
					for _, b := range buf[rows*w:] {
						require.Equal(t, uint8(0xa5), b, "wrote past the mask")
					}
				}
				wantDx := make([]float32, rows*n)
				kcpu.ReluGradMask(wantDx, want, dy, rows, n)
				for _, grid := range grids(rows*n, block) {
					gotDx := out(rows * n)
					launch(t, "gc_relu_grad_mask", grid, block, gotDx, got, dy, rows, n)
					requireBitsStrict(t, wantDx, gotDx, "gc_relu_grad_mask")
				}
			})
		}
	}
}

// siluBound is the error allowed for SiLU and its gradient at x, in units
// of u = 2⁻²⁴. σ is formed in float: expf(−|z|) (CUDA's expf is within 2
// ulp, 4u; the argument is exact), 1 + e and a divide (u each), so σ(z)
// and σ(−z) are within 8u; SiLU's product adds u and the reference's own
// rounding to float32 another: 10u of |x·σ(x)|. The gradient
// σ·(1 + x·σ(−x))·dy cancels inside the bracket near x ≈ −1.28, so its
// bound is on the magnitude of the terms: 8u (σ) + 5u (x·σ(−x)) + 3u
// (the sum and two products) + u (reference), rounded up to 20u of
// |dy|·σ·(1 + |x|·σ(−x)). The Go reference forms 1 − σ in float64, which
// loses |x|·2⁻⁵³ for large x; that is allowed too. 1e-37 covers results
// that underflow (expf(−100) is subnormal).
func siluBound(x, dy float32) (silu, grad float64) {
	const u = 1.0 / (1 << 24)
	z := math.Abs(float64(x))
	s, sc := 1/(1+math.Exp(-float64(x))), 1/(1+math.Exp(float64(x)))
	g := math.Abs(float64(dy))
	return 10*u*z*s + 1e-37, 20*u*g*s*(1+z*sc) + z/(1<<52)*g + 1e-37
}

func TestSilu(t *testing.T) {
	forShapes(t, func(t *testing.T, n int, grid, block uint32) {
		r := newRand(uint64(n) + 13)
		x, dy := randVec(r, n, -30, 30), randNorm(r, n, 1)
		if n > 8 { // the exp's edges: 0, −0, underflow, saturation, ±Inf, NaN
			copy(x, []float32{0, float32(math.Copysign(0, -1)), -100, 100, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), -1.2784645})
		}
		bs, bd := make([]float64, n), make([]float64, n)
		for i := range x {
			bs[i], bd[i] = siluBound(x[i], dy[i])
		}
		want, got := make([]float32, n), out(n)
		kcpu.Silu(want, x)
		launch(t, "gc_silu", grid, block, got, x, n)
		requireWithin(t, want, got, bs, "gc_silu")
		if n > 8 {
			require.Equal(t, math.Float32bits(want[1]), math.Float32bits(got[1]), "silu(−0) is −0")
		}
		want, got = make([]float32, n), out(n)
		kcpu.SiluGrad(want, x, dy)
		launch(t, "gc_silu_grad", grid, block, got, x, dy, n)
		requireWithin(t, want, got, bd, "gc_silu_grad")

		// In place, as the backend may run it: the same bits.
		inPlace := append(out(n)[:0], x...)
		launch(t, "gc_silu_grad", grid, block, inPlace, inPlace, dy, n)
		requireBits(t, got, inPlace, "gc_silu_grad in place")
	})
}
