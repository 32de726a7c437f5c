package cpu

import "math"

// Adafactor (Shazeer & Stern 2018, Algorithms 4 and 5 with β1 = 0, update
// clipping and relative step sizes). A matrix G (n×m, row-major) keeps
// only the decayed row sums R ∈ ℝⁿ and column sums C ∈ ℝᵐ of G² + ε₁, so
// its second-moment state is O(n+m) instead of O(n·m); the full estimate
// V̂ = R·Cᵀ/(1ᵀR) is rebuilt on the fly, one element at a time, and never
// stored. Sums, norms and the update run in float64 whatever T is: ε₁ =
// 1e-30 and products of tiny sums would underflow float32.

// AdafactorBeta2 is the step-dependent decay β̂₂ₜ = 1 − t^(−decay) (the
// paper uses decay 0.8). At t = 1 it is 0, so the first accumulators are
// the first squared gradients and no bias correction is needed; step is
// clamped to 1 for the same reason.
func AdafactorBeta2(step int, decay float64) float64 {
	return 1 - math.Pow(float64(max(step, 1)), -decay)
}

// AdafactorRows sets out[i] = β2·row[i] + (1−β2)·Σⱼ (g[i,j]² + eps1) for
// g of n rows of m. out may alias row.
func AdafactorRows[T Float](out, row, g []T, n, m int, beta2, eps1 float64) {
	checkLen("AdafactorRows", "g", len(g), n*m)
	checkLen("AdafactorRows", "out", len(out), n)
	checkLen("AdafactorRows", "row", len(row), n)
	ParallelFor(n, rowGrain(m), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			s := 0.0
			for _, x := range g[i*m : (i+1)*m] {
				s += float64(x)*float64(x) + eps1
			}
			out[i] = T(beta2*float64(row[i]) + (1-beta2)*s)
		}
	})
}

// AdafactorCols sets out[j] = β2·col[j] + (1−β2)·Σᵢ (g[i,j]² + eps1) for
// g of n rows of m. Each worker owns a block of columns and walks every
// row, so the sums need no reduction across workers. out may alias col.
func AdafactorCols[T Float](out, col, g []T, n, m int, beta2, eps1 float64) {
	checkLen("AdafactorCols", "g", len(g), n*m)
	checkLen("AdafactorCols", "out", len(out), m)
	checkLen("AdafactorCols", "col", len(col), m)
	ParallelFor(m, rowGrain(n), func(lo, hi int) {
		s := make([]float64, hi-lo)
		for i := range n {
			for j, x := range g[i*m+lo : i*m+hi] {
				s[j] += float64(x)*float64(x) + eps1
			}
		}
		for j := lo; j < hi; j++ {
			out[j] = T(beta2*float64(col[j]) + (1-beta2)*s[j-lo])
		}
	})
}

// AdafactorMoment sets out = β2·v + (1−β2)·(g² + eps1), the unfactored
// second moment Adafactor keeps for vectors. out may alias v.
func AdafactorMoment[T Float](out, v, g []T, beta2, eps1 float64) {
	checkSame("AdafactorMoment", len(out), len(v), len(g))
	forElems(len(out), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := float64(g[i])
			out[i] = T(beta2*float64(v[i]) + (1-beta2)*(x*x+eps1))
		}
	})
}

// AdafactorStep holds the hyper-parameters of one Adafactor update.
type AdafactorStep struct {
	Step    int     // t, from 1
	Eps2    float64 // floor of the parameter scale, ε₂ (1e-3)
	Clip    float64 // update clipping threshold d (1)
	RelStep float64 // cap of the relative step size ρₜ = min(RelStep, 1/√t) (1e-2)
}

// Adafactor sets out = p − αₜ·Û for the n×m matrix p with accumulators
// row and col already updated for this step:
//
//	V̂ = row·colᵀ/Σrow, U = g/√V̂, Û = U/max(1, RMS(U)/d),
//	αₜ = max(ε₂, RMS(p))·min(ρ, 1/√t)
//
// An element whose V̂ is 0 (only possible with eps1 = 0 and a zero
// gradient row or column) gets U = 0, not 0/0. out may alias p: RMS(p) is
// taken before anything is written.
func Adafactor[T Float](out, p, g, row, col []T, n, m int, h AdafactorStep) {
	checkLen("Adafactor", "out", len(out), n*m)
	checkSame("Adafactor", len(out), len(p), len(g))
	checkLen("Adafactor", "row", len(row), n)
	checkLen("Adafactor", "col", len(col), m)
	sum := 0.0
	for _, r := range row {
		sum += float64(r)
	}
	// 1/√V̂[i,j] = 1/√(row[i]/Σrow) · 1/√col[j].
	rinv := make([]float64, n)
	for i, r := range row {
		if r != 0 { // else Σrow may be 0 too
			rinv[i] = invSqrt(float64(r) / sum)
		}
	}
	cinv := make([]float64, m)
	for j, c := range col {
		cinv[j] = invSqrt(float64(c))
	}
	adafactorApply(out, p, g, rinv, cinv, h)
}

// AdafactorVec is Adafactor for a param kept unfactored (vectors,
// scalars, tensors of rank > 2): U = g/√v with v already updated.
func AdafactorVec[T Float](out, p, g, v []T, h AdafactorStep) {
	checkSame("AdafactorVec", len(out), len(p), len(g), len(v))
	rinv := make([]float64, len(v))
	for i, x := range v {
		rinv[i] = invSqrt(float64(x))
	}
	adafactorApply(out, p, g, rinv, []float64{1}, h)
}

// invSqrt is 1/√x, and 0 for x = 0 so that a zero gradient with a zero
// second moment moves nothing.
func invSqrt(x float64) float64 {
	if x == 0 {
		return 0
	}
	return 1 / math.Sqrt(x)
}

// adafactorApply does the clipped relative step with U[i,j] =
// g[i,j]·rinv[i]·cinv[j] over len(rinv) rows of len(cinv). U is computed
// twice (once for its RMS, once for the update) rather than stored: it is
// as large as the param, which is what the factored state saves.
func adafactorApply[T Float](out, p, g []T, rinv, cinv []float64, h AdafactorStep) {
	n, m := len(rinv), len(cinv)
	if n*m == 0 {
		return
	}
	size := float64(n * m)
	rmsP := math.Sqrt(SumSquares(p) / size)
	rowSq := make([]float64, n)
	ParallelFor(n, rowGrain(m), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			s := 0.0
			for j, x := range g[i*m : (i+1)*m] {
				u := float64(x) * rinv[i] * cinv[j]
				s += u * u
			}
			rowSq[i] = s
		}
	})
	sumSq := 0.0
	for _, s := range rowSq { // in order: the same answer for any worker count
		sumSq += s
	}
	rmsU := math.Sqrt(sumSq / size)
	step := max(h.Step, 1)
	alpha := max(h.Eps2, rmsP) * min(h.RelStep, 1/math.Sqrt(float64(step)))
	coef := alpha / max(1, rmsU/h.Clip)
	ParallelFor(n, rowGrain(m), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o, pp, gg := out[i*m:(i+1)*m], p[i*m:(i+1)*m], g[i*m:(i+1)*m]
			for j := range o {
				o[j] = T(float64(pp[j]) - coef*float64(gg[j])*rinv[i]*cinv[j])
			}
		}
	})
}
