package cpu

import (
	"fmt"
	"math"
)

// The kernels of the Llama family's layers: SiLU (the gate of SwiGLU),
// RMSNorm and rotary position embeddings. Like the GPT kernels they
// compute in float64 and round once, so float32 results do not depend on
// how the work is split.

// Silu sets out[i] = x·σ(x), the SiLU (swish) activation. out may alias x.
func Silu[T Float](out, x []T) {
	checkSame("Silu", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			z := float64(v[i])
			o[i] = T(z * sigmoid(z))
		}
	})
}

// SiluGrad sets dx[i] = dy·σ(x)·(1 + x·(1 − σ(x))), the derivative of
// [Silu]. dx may alias x or dy.
func SiluGrad[T Float](dx, x, dy []T) {
	checkSame("SiluGrad", len(dx), len(x), len(dy))
	forElems(len(dx), func(lo, hi int) {
		o, v, g := dx[lo:hi], x[lo:hi], dy[lo:hi]
		for i := range o {
			z := float64(v[i])
			s := sigmoid(z)
			o[i] = T(float64(g[i]) * s * (1 + z*(1-s)))
		}
	})
}

// sigmoid is 1/(1+e^−z), written so that neither branch overflows.
func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	e := math.Exp(z)
	return e / (1 + e)
}

// rmsScale is 1/√(mean(x²) + eps) for one row, in float64.
func rmsScale[T Float](x []T, eps float64) float64 {
	ss := 0.0
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	return 1 / math.Sqrt(ss/float64(len(x))+eps)
}

// RMSNorm normalises each of rows rows of n elements by their root mean
// square: out = x/√(mean(x²) + eps)·γ, the statistic in float64. gamma has
// n elements. out may alias x.
func RMSNorm[T Float](out, x, gamma []T, rows, n int, eps float64) {
	checkRows("RMSNorm", rows, n, len(out), len(x))
	checkLen("RMSNorm", "gamma", len(gamma), n)
	if n == 0 {
		return
	}
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := x[r*n:(r+1)*n], out[r*n:(r+1)*n]
			rs := rmsScale(xr, eps)
			for j, v := range xr {
				or[j] = T(float64(v) * rs * float64(gamma[j]))
			}
		}
	})
}

// RMSNormGradX is the input gradient of [RMSNorm]. With r = 1/√(mean(x²)+eps),
// x̂ = x·r and g = dy·γ it computes dx = r·(g − x̂·mean(g·x̂)), recomputing r
// from x. dx may alias dy.
func RMSNormGradX[T Float](dx, x, gamma, dy []T, rows, n int, eps float64) {
	checkRows("RMSNormGradX", rows, n, len(dx), len(x), len(dy))
	checkLen("RMSNormGradX", "gamma", len(gamma), n)
	if n == 0 {
		return
	}
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, gr, dr := x[r*n:(r+1)*n], dy[r*n:(r+1)*n], dx[r*n:(r+1)*n]
			rs := rmsScale(xr, eps)
			sgx := 0.0
			for j, v := range xr {
				sgx += float64(gr[j]) * float64(gamma[j]) * float64(v) * rs
			}
			sgx /= float64(n)
			for j, v := range xr {
				g := float64(gr[j]) * float64(gamma[j])
				dr[j] = T((g - float64(v)*rs*sgx) * rs)
			}
		}
	})
}

// RMSNormGradGamma computes dgamma[j] = Σ_rows dy·x̂ for [RMSNorm],
// recomputing x̂ from x; columns are summed in row order, so the result does
// not depend on the number of goroutines.
func RMSNormGradGamma[T Float](dgamma, x, dy []T, rows, n int, eps float64) {
	checkRows("RMSNormGradGamma", rows, n, len(x), len(dy))
	checkLen("RMSNormGradGamma", "dgamma", len(dgamma), n)
	if n == 0 {
		return
	}
	scale := make([]float64, rows)
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			scale[r] = rmsScale(x[r*n:(r+1)*n], eps)
		}
	})
	ParallelFor(n, 64, func(lo, hi int) {
		acc := make([]float64, hi-lo)
		for r := range rows {
			xr, gr := x[r*n+lo:r*n+hi], dy[r*n+lo:r*n+hi]
			for j, v := range xr {
				acc[j] += float64(gr[j]) * float64(v) * scale[r]
			}
		}
		for j, v := range acc {
			dgamma[lo+j] = T(v)
		}
	})
}

// RoPEAngle is the rotation angle of pair i of a row at position pos for
// head size d: pos·theta^(−2i/d), in float64.
func RoPEAngle(pos, i, d int, theta float64) float64 {
	return float64(pos) * math.Pow(theta, -2*float64(i)/float64(d))
}

// RoPETable holds the cosines and sines of [RoPEAngle] for every position
// and pair of a row of d elements: the same for every row at a position
// and every step, so a backend builds it once per instruction.
type RoPETable struct {
	positions, d int
	cos, sin     []float64 // [positions, d/2]
}

// NewRoPETable tabulates the rotation of positions rows of d elements (d
// even) with base theta.
func NewRoPETable(positions, d int, theta float64) RoPETable {
	return NewRoPETableAt(nil, positions, d, theta)
}

// NewRoPETableAt is [NewRoPETable] for rows at the given global
// positions (nil: 0, 1, …): a device's chunks of a sequence split over
// a context-parallel axis.
func NewRoPETableAt(at []int, positions, d int, theta float64) RoPETable {
	if d%2 != 0 {
		panic("cpu.RoPE: odd row size")
	}
	if at != nil && len(at) != positions {
		panic(fmt.Sprintf("cpu.RoPE: %d positions for %d rows", len(at), positions))
	}
	half := d / 2
	t := RoPETable{positions: positions, d: d, cos: make([]float64, positions*half), sin: make([]float64, positions*half)}
	for p := range positions {
		pos := p
		if at != nil {
			pos = at[p]
		}
		for i := range half {
			t.sin[p*half+i], t.cos[p*half+i] = math.Sincos(RoPEAngle(pos, i, d, theta))
		}
	}
	return t
}

// RoPE applies rotary position embeddings to x, read as batch·positions
// rows of d elements (d even) where row r is at position r mod positions.
// It uses Hugging Face Llama's rotate-half pairing: element i and element
// i+d/2 of a row are rotated together by [RoPEAngle]:
//
//	out[i]     = x[i]·cos − x[i+d/2]·sin
//	out[i+d/2] = x[i+d/2]·cos + x[i]·sin
//
// inverse rotates by minus the angle, which is the transpose: the vjp.
// out may not alias x.
func RoPE[T Float](out, x []T, batch, positions, d int, theta float64, inverse bool) {
	RoPEWith(out, x, batch, NewRoPETable(positions, d, theta), inverse)
}

// RoPEWith is [RoPE] with the angles' table built beforehand.
func RoPEWith[T Float](out, x []T, batch int, t RoPETable, inverse bool) {
	positions, d := t.positions, t.d
	checkRows("RoPE", batch*positions, d, len(out), len(x))
	if d == 0 || positions == 0 {
		return
	}
	half := d / 2
	sign := 1.0
	if inverse {
		sign = -1
	}
	ParallelFor(batch*positions, rowGrain(d), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p := r % positions
			xr, or := x[r*d:(r+1)*d], out[r*d:(r+1)*d]
			cs, sn := t.cos[p*half:(p+1)*half], t.sin[p*half:(p+1)*half]
			for i := range half {
				a, b := float64(xr[i]), float64(xr[i+half])
				s := sign * sn[i]
				or[i] = T(a*cs[i] - b*s)
				or[i+half] = T(b*cs[i] + a*s)
			}
		}
	})
}

// RepeatInterleave reads x as [outer, n, inner] and writes out as
// [outer, n·repeats, inner], each of the n slices repeated in place:
// grouped-query attention's k and v heads shared among query heads.
func RepeatInterleave[T any](out, x []T, outer, n, inner, repeats int) {
	checkRows("RepeatInterleave", outer, n*inner, len(x))
	checkRows("RepeatInterleave", outer, n*repeats*inner, len(out))
	ParallelFor(outer*n, rowGrain(inner), func(lo, hi int) {
		for row := lo; row < hi; row++ {
			o, i := row/n, row%n
			src := x[row*inner : (row+1)*inner]
			for k := range repeats {
				at := (o*n*repeats + i*repeats + k) * inner
				copy(out[at:at+inner], src)
			}
		}
	})
}

// RepeatInterleaveGrad is the vjp of [RepeatInterleave]: dx[o, i, :] is
// the sum of dy[o, i·repeats+k, :] over k, added in order of k.
func RepeatInterleaveGrad[T Float](dx, dy []T, outer, n, inner, repeats int) {
	checkRows("RepeatInterleaveGrad", outer, n*inner, len(dx))
	checkRows("RepeatInterleaveGrad", outer, n*repeats*inner, len(dy))
	ParallelFor(outer*n, rowGrain(inner), func(lo, hi int) {
		acc := make([]float64, inner)
		for row := lo; row < hi; row++ {
			o, i := row/n, row%n
			clear(acc)
			for k := range repeats {
				at := (o*n*repeats + i*repeats + k) * inner
				for j, v := range dy[at : at+inner] {
					acc[j] += float64(v)
				}
			}
			for j, v := range acc {
				dx[row*inner+j] = T(v)
			}
		}
	})
}
