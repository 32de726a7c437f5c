package cpu

import "math"

// SM3-II (Anil et al. 2019, "Memory-Efficient Adaptive Optimization"). An
// n×m matrix (row-major) is covered by its n rows and m columns, each with
// one accumulator μ, so the state is O(n+m). For entry (i,j) the two
// covers containing it give
//
//	ν[i,j] = min(row[i], col[j]) + g[i,j]²
//
// from the accumulators of the previous step; the param moves by
// −η·g/√ν and each accumulator becomes the max of ν over its cover. ν is
// rebuilt wherever it is needed rather than stored (it is as large as the
// param); the three kernels below each read the old accumulators, so they
// may run in any order before the new ones are written back.

// sm3Nu is ν for one entry, in float64.
func sm3Nu[T Float](row, col, g T) float64 {
	x := float64(g)
	return min(float64(row), float64(col)) + x*x
}

// SM3Rows sets out[i] = maxⱼ ν[i,j], the new row accumulators. out may
// alias row (row i is read only for out[i]), not col.
func SM3Rows[T Float](out, row, col, g []T, n, m int) {
	checkLen("SM3Rows", "g", len(g), n*m)
	checkLen("SM3Rows", "out", len(out), n)
	checkLen("SM3Rows", "row", len(row), n)
	checkLen("SM3Rows", "col", len(col), m)
	ParallelFor(n, rowGrain(m), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			best := math.Inf(-1)
			for j, x := range g[i*m : (i+1)*m] {
				best = max(best, sm3Nu(row[i], col[j], x))
			}
			if m > 0 {
				out[i] = T(best)
			}
		}
	})
}

// SM3Cols sets out[j] = maxᵢ ν[i,j], the new column accumulators. Each
// worker owns a block of columns and walks every row. out may alias col,
// not row.
func SM3Cols[T Float](out, row, col, g []T, n, m int) {
	checkLen("SM3Cols", "g", len(g), n*m)
	checkLen("SM3Cols", "out", len(out), m)
	checkLen("SM3Cols", "row", len(row), n)
	checkLen("SM3Cols", "col", len(col), m)
	ParallelFor(m, rowGrain(n), func(lo, hi int) {
		best := make([]float64, hi-lo)
		for j := range best {
			best[j] = math.Inf(-1)
		}
		for i := range n {
			for j, x := range g[i*m+lo : i*m+hi] {
				best[j] = max(best[j], sm3Nu(row[i], col[lo+j], x))
			}
		}
		if n > 0 {
			for j, b := range best {
				out[lo+j] = T(b)
			}
		}
	})
}

// SM3 sets out = p − lr·g/√ν with ν from the old accumulators row and
// col. Where ν = 0 the gradient is 0 too (ν ≥ g²) and the entry does not
// move, instead of becoming 0/0. out may alias p.
func SM3[T Float](out, p, g, row, col []T, n, m int, lr float64) {
	checkLen("SM3", "out", len(out), n*m)
	checkSame("SM3", len(out), len(p), len(g))
	checkLen("SM3", "row", len(row), n)
	checkLen("SM3", "col", len(col), m)
	ParallelFor(n, rowGrain(m), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o, pp, gg := out[i*m:(i+1)*m], p[i*m:(i+1)*m], g[i*m:(i+1)*m]
			for j := range o {
				o[j] = T(float64(pp[j]) - lr*float64(gg[j])*invSqrt(sm3Nu(row[i], col[j], gg[j])))
			}
		}
	})
}

// SM3Accumulate sets out = v + g²: SM3 with one cover per entry, which is
// AdaGrad, for params kept unfactored. out may alias v.
func SM3Accumulate[T Float](out, v, g []T) {
	checkSame("SM3Accumulate", len(out), len(v), len(g))
	forElems(len(out), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := float64(g[i])
			out[i] = T(float64(v[i]) + x*x)
		}
	})
}

// SM3Vec sets out = p − lr·g/√v with v already accumulated this step
// (for a singleton cover ν and the new accumulator coincide); entries with
// v = 0 do not move. out may alias p.
func SM3Vec[T Float](out, p, g, v []T, lr float64) {
	checkSame("SM3Vec", len(out), len(p), len(g), len(v))
	forElems(len(out), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			out[i] = T(float64(p[i]) - lr*float64(g[i])*invSqrt(float64(v[i])))
		}
	})
}
