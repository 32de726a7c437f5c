package cpu

import (
	"fmt"
	"math"
)

// checkRows panics unless every slice in xs holds rows·n elements.
func checkRows(kernel string, rows, n int, xs ...int) {
	checkNonNeg(kernel, rows, n)
	for i, l := range xs {
		if l != rows*n {
			panic(fmt.Sprintf("cpu.%s: operand %d has %d elements, want rows·n = %d·%d", kernel, i, l, rows, n))
		}
	}
}

// softmaxRow writes the softmax of x into out and returns the row's
// log-sum-exp. Subtracting the row max keeps exp from overflowing; a row
// whose entries are all −Inf has no mass anywhere, so it becomes all zeros
// rather than the NaNs that −Inf − (−Inf) would produce.
func softmaxRow[T Float](out, x []T) float64 {
	m := rowMax(x)
	if math.IsInf(m, -1) {
		clear(out)
		return m
	}
	s := 0.0
	for j, v := range x {
		e := math.Exp(float64(v) - m)
		out[j] = T(e)
		s += e
	}
	inv := 1 / s
	for j := range out {
		out[j] = T(float64(out[j]) * inv)
	}
	return m + math.Log(s)
}

// Softmax applies a numerically stable softmax to each of rows rows of n
// elements. Entries equal to −Inf (masked positions) get probability 0; a
// row that is entirely −Inf becomes all zeros. out may alias x.
func Softmax[T Float](out, x []T, rows, n int) {
	checkRows("Softmax", rows, n, len(out), len(x))
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			softmaxRow(out[r*n:(r+1)*n], x[r*n:(r+1)*n])
		}
	})
}

// SoftmaxGrad computes dx = y·(dy − Σⱼ dy·y) row by row, where y is the
// saved softmax output. dx may alias dy or y.
func SoftmaxGrad[T Float](dx, y, dy []T, rows, n int) {
	checkRows("SoftmaxGrad", rows, n, len(dx), len(y), len(dy))
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			yr, gr, dr := y[r*n:(r+1)*n], dy[r*n:(r+1)*n], dx[r*n:(r+1)*n]
			dot := 0.0
			for j, v := range yr {
				dot += float64(v) * float64(gr[j])
			}
			for j, v := range yr {
				dr[j] = T(float64(v) * (float64(gr[j]) - dot))
			}
		}
	})
}

// CausalMask views x as [batch, s, t] attention scores, s queries by t
// keys, with the queries aligned to the end of the keys so query i may see
// keys j ≤ i + (t − s) (this covers both full self-attention, s = t, and
// decoding with a cache, s < t). Masked entries are set to fill and the
// rest copied. With fill = −Inf it is the forward mask; with fill = 0 it is
// its own gradient. out may alias x.
func CausalMask[T Float](out, x []T, batch, s, t int, fill T) {
	checkNonNeg("CausalMask", batch, s, t)
	checkRows("CausalMask", batch*s, t, len(out), len(x))
	ParallelFor(batch*s, rowGrain(t), func(lo, hi int) {
		for row := lo; row < hi; row++ {
			i := row % s
			// Keys [0, limit) are visible to this query.
			limit := min(max(i+(t-s)+1, 0), t)
			o, v := out[row*t:(row+1)*t], x[row*t:(row+1)*t]
			copy(o[:limit], v[:limit])
			for j := limit; j < t; j++ {
				o[j] = fill
			}
		}
	})
}

// rowStats returns the mean and 1/√(var+eps) of x with the biased
// variance, using two passes in float64: the one-pass E[x²]−E[x]² form
// loses everything to cancellation when the mean is large.
func rowStats[T Float](x []T, eps float64) (mean, rstd float64) {
	n := float64(len(x))
	for _, v := range x {
		mean += float64(v)
	}
	mean /= n
	vr := 0.0
	for _, v := range x {
		d := float64(v) - mean
		vr += d * d
	}
	vr /= n
	return mean, 1 / math.Sqrt(vr+eps)
}

// LayerNorm normalises each of rows rows of n elements:
// out = (x − μ)/√(σ² + eps)·γ + β with the biased variance σ², statistics
// in float64. gamma and beta have n elements. out may alias x.
func LayerNorm[T Float](out, x, gamma, beta []T, rows, n int, eps float64) {
	checkRows("LayerNorm", rows, n, len(out), len(x))
	checkLen("LayerNorm", "gamma", len(gamma), n)
	checkLen("LayerNorm", "beta", len(beta), n)
	if n == 0 {
		return
	}
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := x[r*n:(r+1)*n], out[r*n:(r+1)*n]
			mean, rstd := rowStats(xr, eps)
			for j, v := range xr {
				or[j] = T((float64(v)-mean)*rstd*float64(gamma[j]) + float64(beta[j]))
			}
		}
	})
}

// LayerNormGradX is the input gradient of [LayerNorm]. With x̂ the
// normalised input and g = dy·γ it computes
// dx = (g − mean(g) − x̂·mean(g·x̂))/√(σ²+eps). The statistics are
// recomputed from x, so nothing has to be saved from the forward pass.
// dx may alias dy.
func LayerNormGradX[T Float](dx, x, gamma, dy []T, rows, n int, eps float64) {
	checkRows("LayerNormGradX", rows, n, len(dx), len(x), len(dy))
	checkLen("LayerNormGradX", "gamma", len(gamma), n)
	if n == 0 {
		return
	}
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, gr, dr := x[r*n:(r+1)*n], dy[r*n:(r+1)*n], dx[r*n:(r+1)*n]
			mean, rstd := rowStats(xr, eps)
			var sg, sgx float64
			for j, v := range xr {
				g := float64(gr[j]) * float64(gamma[j])
				sg += g
				sgx += g * (float64(v) - mean) * rstd
			}
			sg /= float64(n)
			sgx /= float64(n)
			for j, v := range xr {
				g := float64(gr[j]) * float64(gamma[j])
				xh := (float64(v) - mean) * rstd
				dr[j] = T((g - sg - xh*sgx) * rstd)
			}
		}
	})
}

// LayerNormGradGamma computes dgamma[j] = Σ_rows dy·x̂ for [LayerNorm],
// recomputing x̂ from x. (The beta gradient is a plain [ReduceSum] of dy.)
func LayerNormGradGamma[T Float](dgamma, x, dy []T, rows, n int, eps float64) {
	checkRows("LayerNormGradGamma", rows, n, len(x), len(dy))
	checkLen("LayerNormGradGamma", "dgamma", len(dgamma), n)
	if n == 0 {
		return
	}
	stats := make([]float64, 2*rows)
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			stats[2*r], stats[2*r+1] = rowStats(x[r*n:(r+1)*n], eps)
		}
	})
	// Split by columns rather than rows: each goroutine owns a stripe of
	// dgamma, so no partial sums need merging and the result does not
	// depend on how many goroutines ran.
	ParallelFor(n, 64, func(lo, hi int) {
		acc := make([]float64, hi-lo)
		for r := range rows {
			mean, rstd := stats[2*r], stats[2*r+1]
			xr, gr := x[r*n+lo:r*n+hi], dy[r*n+lo:r*n+hi]
			for j, v := range xr {
				acc[j] += float64(gr[j]) * (float64(v) - mean) * rstd
			}
		}
		for j, v := range acc {
			dgamma[lo+j] = T(v)
		}
	})
}

// Embedding gathers rows of table ([vocab, dim]) into out ([len(ids), dim]):
// out[i,:] = table[ids[i],:]. It returns an error naming the first id
// outside [0, vocab) and its position; out is left untouched in that case.
func Embedding[T Float](out, table []T, ids []int32, vocab, dim int) error {
	checkRows("Embedding", vocab, dim, len(table))
	checkRows("Embedding", len(ids), dim, len(out))
	if err := checkIDs("Embedding", "id", ids, vocab); err != nil {
		return err
	}
	ParallelFor(len(ids), rowGrain(dim), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			id := int(ids[i])
			copy(out[i*dim:(i+1)*dim], table[id*dim:(id+1)*dim])
		}
	})
	return nil
}

// EmbeddingGrad is the gradient of [Embedding]: it zeroes dtable
// ([vocab, dim]) and adds row i of dy ([len(ids), dim]) into row ids[i].
// Repeated ids accumulate. An out-of-range id is reported before anything
// is written.
func EmbeddingGrad[T Float](dtable, dy []T, ids []int32, vocab, dim int) error {
	return embeddingGradRows("EmbeddingGrad", dtable, dy, ids, 0, vocab, dim, vocab)
}

// embeddingGradRows is EmbeddingGrad for the rows [offset, offset+rows)
// of a [vocab, dim] table (all of them, or a device's vocab-parallel
// share: see EmbeddingGradRange); ids outside them add nothing.
func embeddingGradRows[T Float](kernel string, dtable, dy []T, ids []int32, offset, rows, dim, vocab int) error {
	checkRows(kernel, rows, dim, len(dtable))
	checkRows(kernel, len(ids), dim, len(dy))
	if err := checkIDs(kernel, "id", ids, vocab); err != nil {
		return err
	}
	clear(dtable)
	// Serial on purpose: repeated ids would make a parallel scatter race.
	for i, id := range ids {
		r := int(id) - offset
		if r < 0 || r >= rows {
			continue
		}
		d, g := dtable[r*dim:(r+1)*dim], dy[i*dim:(i+1)*dim]
		for j, v := range g {
			d[j] += v
		}
	}
	return nil
}

// checkIDs returns an error for the first value of ids outside [0, limit).
func checkIDs(kernel, what string, ids []int32, limit int) error {
	for i, id := range ids {
		if id < 0 || int(id) >= limit {
			return fmt.Errorf("cpu.%s: %s %d at position %d is out of range [0, %d)", kernel, what, id, i, limit)
		}
	}
	return nil
}

// CrossEntropy returns the mean over rows of −log softmax(logits)[label],
// with logits [rows, vocab] and one label per row. The log-sum-exp is taken
// in float64 after subtracting the row max, so large logits neither
// overflow nor lose precision. It returns an error naming the first label
// outside [0, vocab). With rows = 0 the loss is 0.
func CrossEntropy[T Float](logits []T, labels []int32, rows, vocab int) (T, error) {
	checkRows("CrossEntropy", rows, vocab, len(logits))
	checkLen("CrossEntropy", "labels", len(labels), rows)
	if err := checkIDs("CrossEntropy", "label", labels, vocab); err != nil {
		return 0, err
	}
	if rows == 0 {
		return 0, nil
	}
	// Per-row losses summed in row order afterwards keep the result
	// independent of how the rows were split across goroutines.
	loss := make([]float64, rows)
	lse := logSumExp[T]
	if f, ok := any(logSumExp32).(func([]T) float64); ok {
		lse = f // float32 logits: the exponentials by ExpForFloat32
	}
	ParallelFor(rows, rowGrain(vocab), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := logits[r*vocab : (r+1)*vocab]
			loss[r] = lse(x) - float64(x[labels[r]])
		}
	})
	s := 0.0
	for _, v := range loss {
		s += v
	}
	return T(s / float64(rows)), nil
}

// logSumExp returns log Σ exp(x) computed stably in float64.
func logSumExp[T Float](x []T) float64 {
	m := rowMax(x)
	if math.IsInf(m, 0) {
		return m
	}
	s := 0.0
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}

// logSumExp32 is logSumExp of float32 values with ExpForFloat32 for
// math.Exp, at a few times the speed: on a real vocabulary (32,000
// entries a row) the cross-entropy's exponentials took more of a CPU
// step than every matmul together. float64 programs (the oracle tests')
// keep math.Exp.
func logSumExp32(x []float32) float64 {
	m := rowMax(x)
	if math.IsInf(m, 0) || m != m {
		return logSumExp(x)
	}
	s := 0.0
	for _, v := range x {
		// v − m is exact in float64 (two float32 values), so a large
		// max loses nothing before the scale.
		s += ExpForFloat32(float64(v) - m)
	}
	return m + math.Log(s)
}

// ExpForFloat32 is e^x for x ≤ 0 (an exponent less a row's max) whose
// result a float32 takes, at a few times math.Exp's speed: exp2N's
// table of 2^(i/64) times a cubic in the remainder (exp2N's is
// quadratic), relative error below 5e-11, so that a float32 rounds it
// as it rounds math.Exp's but for one value in thousands (exp2N's 3e-8
// made Adam's steps of tiny gradients drift between plans). The
// cross-entropies on float32 logits, whole or split over a vocabulary,
// take their exponentials by it, so the two agree.
func ExpForFloat32(x float64) float64 {
	y := x * expK
	if y < expMinY {
		return 0
	}
	t, f := exp2Parts(y)
	return t + t*f*(expC1+f*(expC2+f*expC3))
}

// expC3 is the cubic term of ExpForFloat32's polynomial: (ln2/64)³/6.
const expC3 = expC1 * expC1 * expC1 / 6

// rowMax is the largest element of x as math.Max would fold it (NaN if
// any element is NaN, −Inf for an empty row), without math.Max's per-call
// handling of signed zeros, which cannot change a softmax.
func rowMax[T Float](x []T) float64 {
	m := math.Inf(-1)
	for _, v := range x {
		f := float64(v)
		if f != f {
			return f
		}
		if f > m {
			m = f
		}
	}
	return m
}

// CrossEntropyGrad writes the gradient of [CrossEntropy] scaled by the
// upstream gradient dloss: dlogits = (softmax(logits) − onehot(label))·
// dloss/rows. It returns an error naming the first bad label.
func CrossEntropyGrad[T Float](dlogits, logits []T, labels []int32, dloss T, rows, vocab int) error {
	checkRows("CrossEntropyGrad", rows, vocab, len(dlogits), len(logits))
	checkLen("CrossEntropyGrad", "labels", len(labels), rows)
	if err := checkIDs("CrossEntropyGrad", "label", labels, vocab); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	scale := float64(dloss) / float64(rows)
	if l32, ok := any(logits).([]float32); ok {
		crossEntropyGrad32(any(dlogits).([]float32), l32, labels, scale, rows, vocab)
		return nil
	}
	ParallelFor(rows, rowGrain(vocab), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			crossEntropyGradRow(dlogits[r*vocab:(r+1)*vocab], logits[r*vocab:(r+1)*vocab], labels[r], scale)
		}
	})
	return nil
}

// crossEntropyGradRow is one row of CrossEntropyGrad by math.Exp.
func crossEntropyGradRow[T Float](d, x []T, l int32, scale float64) {
	lse := logSumExp(x)
	// The label's logit is read before the loop writes: d may be x (the
	// op works in place).
	xl := x[l]
	for j, v := range x {
		d[j] = T(math.Exp(float64(v)-lse) * scale)
	}
	d[l] = T((math.Exp(float64(xl)-lse) - 1) * scale)
}

// crossEntropyGrad32 is CrossEntropyGrad on float32 logits: one
// ExpForFloat32 a logit (logSumExp32's), kept in float64 for the row's
// normalization, where the float64 kernel takes two math.Exp. A row
// whose max is not finite takes the float64 kernel's path.
func crossEntropyGrad32(dlogits, logits []float32, labels []int32, scale float64, rows, vocab int) {
	ParallelFor(rows, rowGrain(vocab), func(lo, hi int) {
		p := make([]float64, vocab)
		for r := lo; r < hi; r++ {
			x, d := logits[r*vocab:(r+1)*vocab], dlogits[r*vocab:(r+1)*vocab]
			l := labels[r]
			m := rowMax(x)
			if math.IsInf(m, 0) || m != m {
				crossEntropyGradRow(d, x, l, scale)
				continue
			}
			s := 0.0
			for j, v := range x {
				p[j] = ExpForFloat32(float64(v) - m)
				s += p[j]
			}
			// d may be x (in place): x is read above, before any write.
			k := scale / s
			for j := range d {
				d[j] = float32(p[j] * k)
			}
			d[l] = float32((p[l]/s - 1) * scale)
		}
	})
}

// SumSquares returns Σ x², accumulated in float64; gradient clipping uses
// it to compute global norms.
func SumSquares[T Float](x []T) float64 {
	const chunk = elemGrain
	parts := make([]float64, (len(x)+chunk-1)/chunk)
	// Fixed-size chunks summed in order give the same answer however many
	// goroutines there are.
	ParallelFor(len(parts), 1, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			s := 0.0
			for _, v := range x[c*chunk : min((c+1)*chunk, len(x))] {
				s += float64(v) * float64(v)
			}
			parts[c] = s
		}
	})
	s := 0.0
	for _, v := range parts {
		s += v
	}
	return s
}
