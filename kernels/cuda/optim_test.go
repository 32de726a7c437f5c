package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
)

// Optimizer kernels compute in double where the CPU kernels compute in
// float64, in the same order, so on amd64 they agree bit for bit; the
// bound (2⁻²² of the terms) leaves room for a fused multiply-add on a
// GPU. bitsDiffer counts the elements that are not identical, for the log.
func bitsDiffer(want, got []float32) int {
	n := 0
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			n++
		}
	}
	return n
}

func termsBound(n int, terms func(i int) float64) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = ulp2*terms(i) + 1e-38
	}
	return b
}

func abs32(x float32) float64 { return math.Abs(float64(x)) }

func TestAdamW(t *testing.T) {
	const b1, b2, eps = 0.9, 0.95, 1e-8
	for _, n := range elemSizes {
		for _, step := range []int64{1, 2, 1000} {
			for _, wd := range []float32{0.1, 0} {
				t.Run(fmt.Sprintf("n%d_step%d_wd%v", n, step, wd), func(t *testing.T) {
					r := newRand(uint64(n) + uint64(step))
					p, m := randNorm(r, n, 1), randNorm(r, n, 1e-3)
					v := randVec(r, n, 0, 1e-5)
					if wd == 0 {
						clear(p) // the update alone, with nothing to hide it
					}
					lr := []float32{3e-4}
					want := make([]float32, n)
					kcpu.AdamW(want, p, m, v, lr[0], b1, b2, eps, wd, int(step))
					for _, block := range []uint32{32, 256} {
						got := out(n)
						launch(t, "gc_adamw", 3, block, got, p, m, v, lr, []int64{step}, n, float32(b1), float32(b2), float32(eps), wd)
						requireWithin(t, want, got, termsBound(n, func(i int) float64 { return abs32(p[i]) + abs32(want[i]-p[i]) }), "gc_adamw")
						if d := bitsDiffer(want, got); d > 0 {
							t.Logf("gc_adamw: %d of %d elements differ in the last bits", d, n)
						}
					}
				})
			}
		}
	}
}

func TestAdafactor(t *testing.T) {
	const eps1, decay, eps2, clip, rel = 1e-30, 0.8, 1e-3, 1.0, 1e-2
	for _, s := range [][2]int{{1, 1}, {5, 37}, {3, 1000}, {300, 7}} {
		n, m := s[0], s[1]
		for _, step := range []int64{1, 7} {
			for _, block := range []uint32{32, 256} {
				t.Run(fmt.Sprintf("%dx%d_step%d_b%d", n, m, step, block), func(t *testing.T) {
					r := newRand(uint64(n*m) + uint64(step))
					p, g := randNorm(r, n*m, 1), randNorm(r, n*m, 1e-2)
					if n > 2 {
						clear(g[m : 2*m]) // a zero gradient row
					}
					row0, col0 := randVec(r, n, 0, 1e-3), randVec(r, m, 0, 1e-3)
					beta := kcpu.AdafactorBeta2(int(step), decay)
					st := []int64{step}

					wantRow, gotRow := make([]float32, n), out(n)
					kcpu.AdafactorRows(wantRow, row0, g, n, m, beta, eps1)
					launch(t, "gc_adafactor_row", uint32(min(n, 16)), block, gotRow, row0, g, st, n, m, float32(eps1), float32(decay))
					requireClose(t, wantRow, gotRow, ulp2, 0, "gc_adafactor_row")

					wantCol, gotCol := make([]float32, m), out(m)
					kcpu.AdafactorCols(wantCol, col0, g, n, m, beta, eps1)
					launch(t, "gc_adafactor_col", 2, block, gotCol, col0, g, st, n, m, float32(eps1), float32(decay))
					requireClose(t, wantCol, gotCol, ulp2, 0, "gc_adafactor_col")
					again := out(m)
					launch(t, "gc_adafactor_col", 5, block, again, col0, g, st, n, m, float32(eps1), float32(decay))
					requireBits(t, gotCol, again, "gc_adafactor_col on another grid")

					wantV, gotV := make([]float32, n*m), out(n*m)
					v0 := randVec(r, n*m, 0, 1e-3)
					kcpu.AdafactorMoment(wantV, v0, g, beta, eps1)
					launch(t, "gc_adafactor_v", 3, block, gotV, v0, g, st, n*m, float32(eps1), float32(decay))
					requireClose(t, wantV, gotV, ulp2, 0, "gc_adafactor_v")

					h := kcpu.AdafactorStep{Step: int(step), Eps2: eps2, Clip: clip, RelStep: rel}
					const grid = 4
					ws, partial := make([]float32, 4), make([]float32, 4*grid)
					want, got := make([]float32, n*m), out(n*m)
					kcpu.Adafactor(want, p, g, wantRow, wantCol, n, m, h)
					launch(t, "gc_adafactor_rowsum", 1, block, ws, wantRow, n)
					launch(t, "gc_adafactor_partial", grid, block, partial, p, g, wantRow, wantCol, ws, n, m)
					launch(t, "gc_adafactor_finish", 1, block, ws, partial, st, grid, n*m, float32(eps2), float32(clip), float32(rel))
					launch(t, "gc_adafactor_apply", 3, block, got, p, g, wantRow, wantCol, ws, n, m)
					requireWithin(t, want, got, termsBound(n*m, func(i int) float64 { return abs32(p[i]) + abs32(want[i]-p[i]) }), "gc_adafactor_apply")

					// In place, as the runtime runs it: out is p.
					inPlace := out(n * m)
					copy(inPlace, p)
					launch(t, "gc_adafactor_apply", 3, block, inPlace, inPlace, g, wantRow, wantCol, ws, n, m)
					requireBits(t, got, inPlace, "gc_adafactor_apply in place")

					wantVec, gotVec := make([]float32, n*m), out(n*m)
					kcpu.AdafactorVec(wantVec, p, g, wantV, h)
					launch(t, "gc_adafactor_vec_partial", grid, block, partial, p, g, wantV, n*m)
					launch(t, "gc_adafactor_finish", 1, block, ws, partial, st, grid, n*m, float32(eps2), float32(clip), float32(rel))
					launch(t, "gc_adafactor_vec_apply", 3, block, gotVec, p, g, wantV, ws, n*m)
					requireWithin(t, wantVec, gotVec, termsBound(n*m, func(i int) float64 { return abs32(p[i]) + abs32(wantVec[i]-p[i]) }), "gc_adafactor_vec_apply")
				})
			}
		}
	}
}

func TestSM3(t *testing.T) {
	for _, s := range [][2]int{{1, 1}, {5, 37}, {3, 1000}, {300, 7}} {
		n, m := s[0], s[1]
		for _, block := range []uint32{32, 256} {
			t.Run(fmt.Sprintf("%dx%d_b%d", n, m, block), func(t *testing.T) {
				r := newRand(uint64(n*m) + 5)
				p, g := randNorm(r, n*m, 1), randNorm(r, n*m, 1e-2)
				row, col := randVec(r, n, 0, 1e-4), randVec(r, m, 0, 1e-4)
				g[0], row[0] = 0, 0 // ν = 0: the entry must not move
				col[0] = 0
				lr := []float32{0.05}

				wantRow, gotRow := make([]float32, n), out(n)
				kcpu.SM3Rows(wantRow, row, col, g, n, m)
				launch(t, "gc_sm3_row", uint32(min(n, 16)), block, gotRow, row, col, g, n, m)
				requireClose(t, wantRow, gotRow, ulp2, 0, "gc_sm3_row")

				wantCol, gotCol := make([]float32, m), out(m)
				kcpu.SM3Cols(wantCol, row, col, g, n, m)
				launch(t, "gc_sm3_col", 2, block, gotCol, row, col, g, n, m)
				requireClose(t, wantCol, gotCol, ulp2, 0, "gc_sm3_col")
				again := out(m)
				launch(t, "gc_sm3_col", 5, block, again, row, col, g, n, m)
				requireBits(t, gotCol, again, "gc_sm3_col on another grid")

				want, got := make([]float32, n*m), out(n*m)
				kcpu.SM3(want, p, g, row, col, n, m, float64(lr[0]))
				launch(t, "gc_sm3", 3, block, got, p, g, row, col, lr, n, m)
				requireWithin(t, want, got, termsBound(n*m, func(i int) float64 { return abs32(p[i]) + abs32(want[i]-p[i]) }), "gc_sm3")
				require.Equal(t, p[0], got[0], "an entry with ν = 0 stays put")

				v := randVec(r, n*m, 0, 1e-4)
				wantV, gotV := make([]float32, n*m), out(n*m)
				kcpu.SM3Accumulate(wantV, v, g)
				launch(t, "gc_sm3_v", 3, block, gotV, v, g, n*m)
				requireClose(t, wantV, gotV, ulp2, 0, "gc_sm3_v")

				wantVec, gotVec := make([]float32, n*m), out(n*m)
				kcpu.SM3Vec(wantVec, p, g, wantV, float64(lr[0]))
				launch(t, "gc_sm3_vec", 3, block, gotVec, p, g, wantV, lr, n*m)
				requireWithin(t, wantVec, gotVec, termsBound(n*m, func(i int) float64 { return abs32(p[i]) + abs32(wantVec[i]-p[i]) }), "gc_sm3_vec")
				t.Logf("bits differing: sm3 %d, sm3_vec %d of %d", bitsDiffer(want, got), bitsDiffer(wantVec, gotVec), n*m)
			})
		}
	}
}

// where_finite takes the new value only when the overflow count is 0.
func TestWhereFinite(t *testing.T) {
	r := newRand(8)
	n := 1000
	fresh, old := randNorm(r, n, 1), randNorm(r, n, 1)
	for _, count := range []float32{0, 1, 7} {
		got := out(n)
		launch(t, "gc_where_finite", 3, 64, got, []float32{count}, fresh, old, n)
		want := old
		if count == 0 {
			want = fresh
		}
		requireBits(t, want, got, fmt.Sprintf("gc_where_finite count %v", count))
	}
	// In place over the old state, as the runtime updates it.
	state := out(n)
	copy(state, old)
	launch(t, "gc_where_finite", 3, 64, state, []float32{0}, fresh, state, n)
	requireBits(t, fresh, state, "gc_where_finite in place")
}

// clip_coef mirrors compile.go: min(1, max_norm/(√ss + 1e-6)) in float64.
func TestClipCoef(t *testing.T) {
	for _, ss := range []float32{0, 0.25, 1, 4, 1e6, 3.4e38, float32(math.Inf(1)), float32(math.NaN())} {
		for _, maxNorm := range []float64{1, 0.5} {
			want := float32(min(1, maxNorm/(math.Sqrt(float64(ss))+1e-6)))
			got := out(1)
			launch(t, "gc_clip_coef", 2, 32, got, []float32{ss}, float32(maxNorm))
			requireBits(t, []float32{want}, got, fmt.Sprintf("gc_clip_coef(%v, %v)", ss, maxNorm))
		}
	}
}
