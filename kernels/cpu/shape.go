package cpu

import (
	"fmt"
	"math"
)

// shapeSize returns the number of elements of shape, panicking on a
// negative dimension.
func shapeSize(kernel string, shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("cpu.%s: negative dimension in shape %v", kernel, shape))
		}
		n *= d
	}
	return n
}

// mergeStrided simplifies a gather from in to a contiguous out described by
// out dims and the matching in strides: size-1 dims are dropped and a dim is
// folded into the next one when stepping over it is the same as stepping
// over the whole inner dim. Fewer, longer dims mean longer inner loops.
// The result always has at least one dim.
func mergeStrided(dims, strides []int) ([]int, []int) {
	md := make([]int, 0, len(dims))
	ms := make([]int, 0, len(dims))
	for i, d := range dims {
		if d == 1 {
			continue
		}
		if n := len(md); n > 0 && ms[n-1] == strides[i]*d {
			md[n-1] *= d
			ms[n-1] = strides[i]
			continue
		}
		md = append(md, d)
		ms = append(ms, strides[i])
	}
	if len(md) == 0 {
		return []int{1}, []int{0}
	}
	return md, ms
}

// gather fills the contiguous out from in, where out has the given dims and
// stepping along out dim i moves strides[i] elements in in. Work is split
// over goroutines by rows of the innermost dim.
func gather[T Float](out, in []T, dims, strides []int) {
	if len(out) == 0 {
		return
	}
	dims, strides = mergeStrided(dims, strides)
	r := len(dims)
	inner, istr := dims[r-1], strides[r-1]
	rows := len(out) / inner
	ParallelFor(rows, rowGrain(inner), func(lo, hi int) {
		// Decode the first row's multi-index so every chunk starts
		// independently of the others.
		idx := make([]int, r-1)
		base := 0
		rem := lo
		for d := r - 2; d >= 0; d-- {
			idx[d] = rem % dims[d]
			rem /= dims[d]
			base += idx[d] * strides[d]
		}
		for row := lo; row < hi; row++ {
			o := out[row*inner : (row+1)*inner]
			switch istr {
			case 1:
				copy(o, in[base:base+inner])
			case 0:
				v := in[base]
				for j := range o {
					o[j] = v
				}
			default:
				p := base
				for j := range o {
					o[j] = in[p]
					p += istr
				}
			}
			for d := r - 2; d >= 0; d-- {
				idx[d]++
				base += strides[d]
				if idx[d] < dims[d] {
					break
				}
				base -= strides[d] * dims[d]
				idx[d] = 0
			}
		}
	})
}

// Broadcast expands in to outShape following NumPy rules: inShape is
// right-aligned against outShape, and each in dim must equal the out dim or
// be 1 (missing leading dims count as 1); size-1 dims are repeated.
func Broadcast[T Float](out, in []T, inShape, outShape []int) {
	const kernel = "Broadcast"
	checkLen(kernel, "in", len(in), shapeSize(kernel, inShape))
	checkLen(kernel, "out", len(out), shapeSize(kernel, outShape))
	r := len(outShape)
	off := r - len(inShape)
	if off < 0 {
		panic(fmt.Sprintf("cpu.Broadcast: in shape %v has more dims than out shape %v", inShape, outShape))
	}
	strides := make([]int, r)
	s := 1
	for i := len(inShape) - 1; i >= 0; i-- {
		switch d := inShape[i]; {
		case d == outShape[i+off]:
			strides[i+off] = s
		case d == 1:
			strides[i+off] = 0
		default:
			panic(fmt.Sprintf("cpu.Broadcast: in shape %v does not broadcast to %v", inShape, outShape))
		}
		s *= inShape[i]
	}
	gather(out, in, outShape, strides)
}

// Transpose permutes the dims of in: out has shape[i] = inShape[perm[i]].
// Swapping the last two dims of a (batched) matrix, the common case, uses a
// cache-blocked kernel; other permutations gather with strides.
func Transpose[T Float](out, in []T, inShape, perm []int) {
	const kernel = "Transpose"
	n := shapeSize(kernel, inShape)
	checkLen(kernel, "in", len(in), n)
	checkLen(kernel, "out", len(out), n)
	r := len(inShape)
	if len(perm) != r {
		panic(fmt.Sprintf("cpu.Transpose: perm %v does not match shape %v", perm, inShape))
	}
	seen := make([]bool, r)
	for _, p := range perm {
		if p < 0 || p >= r || seen[p] {
			panic(fmt.Sprintf("cpu.Transpose: %v is not a permutation of %d dims", perm, r))
		}
		seen[p] = true
	}
	if n == 0 {
		return
	}
	inStr := make([]int, r)
	s := 1
	for i := r - 1; i >= 0; i-- {
		inStr[i] = s
		s *= inShape[i]
	}
	dims := make([]int, r)
	strides := make([]int, r)
	for i, p := range perm {
		dims[i] = inShape[p]
		strides[i] = inStr[p]
	}
	md, ms := mergeStrided(dims, strides)
	k := len(md)
	// After merging, a batched matrix transpose reads as out dims
	// [..., P, Q] where P is contiguous in in (stride 1) and Q is not.
	if k >= 2 && ms[k-2] == 1 && ms[k-1] != 1 {
		p, q, ld := md[k-2], md[k-1], ms[k-1]
		batch := len(out) / (p * q)
		// The batch dims of a matrix transpose are the outermost and
		// contiguous, so batch b starts at b·p·q in both slices.
		if k == 2 || (k == 3 && ms[0] == p*q) {
			ParallelFor(batch, 1, func(lo, hi int) {
				for b := lo; b < hi; b++ {
					transpose2D(out[b*p*q:(b+1)*p*q], in[b*p*q:b*p*q+(q-1)*ld+p], q, p, ld)
				}
			})
			return
		}
	}
	gather(out, in, md, ms)
}

// transposeBlock is the tile edge for transpose2D: 32×32 float64 tiles
// (8 KiB each way) keep both the read and the write side in L1.
const transposeBlock = 32

// transpose2D writes the transpose of the rows×cols matrix src (leading
// dimension ld) into dst as a contiguous cols×rows matrix, tile by tile so
// that neither side is walked with a cache-hostile stride for long.
func transpose2D[T Float](dst, src []T, rows, cols, ld int) {
	for i0 := 0; i0 < rows; i0 += transposeBlock {
		i1 := min(i0+transposeBlock, rows)
		for j0 := 0; j0 < cols; j0 += transposeBlock {
			j1 := min(j0+transposeBlock, cols)
			for i := i0; i < i1; i++ {
				row := src[i*ld+j0 : i*ld+j1]
				for j, v := range row {
					dst[(j0+j)*rows+i] = v
				}
			}
		}
	}
}

// sliceGeom validates a Slice/SliceGrad request and returns the number of
// outer blocks, the size of dim and the size of one step along dim.
func sliceGeom(kernel string, shape []int, dim, start, end int) (outer, d, inner int) {
	if dim < 0 || dim >= len(shape) {
		panic(fmt.Sprintf("cpu.%s: dim %d out of range for shape %v", kernel, dim, shape))
	}
	shapeSize(kernel, shape)
	d = shape[dim]
	if start < 0 || start > end || end > d {
		panic(fmt.Sprintf("cpu.%s: range [%d, %d) out of bounds for dim %d of size %d", kernel, start, end, dim, d))
	}
	outer, inner = 1, 1
	for _, v := range shape[:dim] {
		outer *= v
	}
	for _, v := range shape[dim+1:] {
		inner *= v
	}
	return outer, d, inner
}

// Slice copies the elements with index in [start, end) along dim of in
// (shape inShape) into out, whose shape is inShape with dim resized to
// end−start.
func Slice[T any](out, in []T, inShape []int, dim, start, end int) {
	outer, d, inner := sliceGeom("Slice", inShape, dim, start, end)
	w := (end - start) * inner
	checkLen("Slice", "in", len(in), outer*d*inner)
	checkLen("Slice", "out", len(out), outer*w)
	for o := range outer {
		copy(out[o*w:(o+1)*w], in[(o*d+start)*inner:(o*d+end)*inner])
	}
}

// SliceGrad is the gradient of [Slice]: dx (shape xShape) is zero except
// that dy is written at [start, end) along dim.
func SliceGrad[T Float](dx, dy []T, xShape []int, dim, start, end int) {
	outer, d, inner := sliceGeom("SliceGrad", xShape, dim, start, end)
	w := (end - start) * inner
	checkLen("SliceGrad", "dx", len(dx), outer*d*inner)
	checkLen("SliceGrad", "dy", len(dy), outer*w)
	clear(dx)
	for o := range outer {
		copy(dx[(o*d+start)*inner:(o*d+end)*inner], dy[o*w:(o+1)*w])
	}
}

// Concat joins ins along dim. Every shape must have the same rank and agree
// outside dim; out has the shared shape with dim the sum of the inputs'.
func Concat[T any](out []T, ins [][]T, shapes [][]int, dim int) {
	if len(ins) != len(shapes) {
		panic(fmt.Sprintf("cpu.Concat: %d inputs but %d shapes", len(ins), len(shapes)))
	}
	if len(ins) == 0 {
		checkLen("Concat", "out", len(out), 0)
		return
	}
	ref := shapes[0]
	if dim < 0 || dim >= len(ref) {
		panic(fmt.Sprintf("cpu.Concat: dim %d out of range for shape %v", dim, ref))
	}
	total := 0
	for i, s := range shapes {
		if len(s) != len(ref) {
			panic(fmt.Sprintf("cpu.Concat: shape %v has a different rank from %v", s, ref))
		}
		for j := range s {
			if j != dim && s[j] != ref[j] {
				panic(fmt.Sprintf("cpu.Concat: shape %v does not match %v outside dim %d", s, ref, dim))
			}
		}
		checkLen("Concat", fmt.Sprintf("ins[%d]", i), len(ins[i]), shapeSize("Concat", s))
		total += s[dim]
	}
	outer, inner := 1, 1
	for _, v := range ref[:dim] {
		outer *= v
	}
	for _, v := range ref[dim+1:] {
		inner *= v
	}
	checkLen("Concat", "out", len(out), outer*total*inner)
	p := 0
	for o := range outer {
		for i, x := range ins {
			w := shapes[i][dim] * inner
			copy(out[p:p+w], x[o*w:(o+1)*w])
			p += w
		}
	}
}

// reducePlan validates axes against shape and merges neighbouring dims that
// are both reduced or both kept, dropping size-1 dims, so the reduction
// walks as few and as long runs as possible. It returns the merged dims,
// which of them are reduced, the output size and the number of input
// elements folded into each output element.
func reducePlan(kernel string, shape, axes []int) (dims []int, red []bool, outSize, group int) {
	shapeSize(kernel, shape)
	isRed := make([]bool, len(shape))
	for i, a := range axes {
		if a < 0 || a >= len(shape) {
			panic(fmt.Sprintf("cpu.%s: axis %d out of range for shape %v", kernel, a, shape))
		}
		if i > 0 && a <= axes[i-1] {
			panic(fmt.Sprintf("cpu.%s: axes %v must be sorted and unique", kernel, axes))
		}
		isRed[a] = true
	}
	outSize, group = 1, 1
	for i, d := range shape {
		if isRed[i] {
			group *= d
		} else {
			outSize *= d
		}
		if d == 1 {
			continue
		}
		if n := len(dims); n > 0 && red[n-1] == isRed[i] {
			dims[n-1] *= d
			continue
		}
		dims = append(dims, d)
		red = append(red, isRed[i])
	}
	if len(dims) == 0 {
		dims, red = []int{1}, []bool{false}
	}
	return dims, red, outSize, group
}

// reduceRuns calls fn for every run of the innermost merged dim, in input
// order. inOff is where the run starts in the input and outOff the output
// element it maps to; when redInner is false the run maps element by
// element onto out[outOff:outOff+n] instead.
func reduceRuns(dims []int, red []bool, fn func(inOff, outOff, n int, redInner bool)) {
	r := len(dims)
	inner := dims[r-1]
	outStr := make([]int, r)
	s := 1
	for i := r - 1; i >= 0; i-- {
		if !red[i] {
			outStr[i] = s
			s *= dims[i]
		}
	}
	outer := 1
	for _, d := range dims[:r-1] {
		outer *= d
	}
	if inner == 0 {
		return
	}
	idx := make([]int, r-1)
	outOff := 0
	for o := range outer {
		fn(o*inner, outOff, inner, red[r-1])
		for d := r - 2; d >= 0; d-- {
			idx[d]++
			outOff += outStr[d]
			if idx[d] < dims[d] {
				break
			}
			outOff -= outStr[d] * dims[d]
			idx[d] = 0
		}
	}
}

// isRowReduce reports whether the merged plan is "reduce the last axis of
// a matrix", which is common enough (softmax-like sums, per-token norms) to
// deserve a parallel path.
func isRowReduce(dims []int, red []bool) bool {
	return len(dims) == 2 && !red[0] && red[1]
}

// sumInto writes into acc (one float64 per output element) the sum of each
// reduced group of in. float64 accumulation keeps long fp32 sums accurate.
func sumInto[T Float](acc []float64, in []T, dims []int, red []bool) {
	if isRowReduce(dims, red) {
		n := dims[1]
		ParallelFor(dims[0], rowGrain(n), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				s := 0.0
				for _, v := range in[r*n : (r+1)*n] {
					s += float64(v)
				}
				acc[r] = s
			}
		})
		return
	}
	clear(acc)
	reduceRuns(dims, red, func(inOff, outOff, n int, redInner bool) {
		run := in[inOff : inOff+n]
		if redInner {
			s := 0.0
			for _, v := range run {
				s += float64(v)
			}
			acc[outOff] += s
			return
		}
		a := acc[outOff : outOff+n]
		for j, v := range run {
			a[j] += float64(v)
		}
	})
}

// ReduceSum sums in (shape inShape) over axes, which must be sorted, unique
// and in range. out holds the reduced shape; its layout is the same whether
// the caller keeps the reduced dims as size 1 or drops them. Sums are
// accumulated in float64.
func ReduceSum[T Float](out, in []T, inShape []int, axes []int) {
	reduceSumScaled("ReduceSum", out, in, inShape, axes, false)
}

// ReduceMean is [ReduceSum] divided by the number of elements in each
// reduced group (NaN when that number is zero, as 0/0).
func ReduceMean[T Float](out, in []T, inShape []int, axes []int) {
	reduceSumScaled("ReduceMean", out, in, inShape, axes, true)
}

func reduceSumScaled[T Float](kernel string, out, in []T, inShape, axes []int, mean bool) {
	dims, red, outSize, group := reducePlan(kernel, inShape, axes)
	checkLen(kernel, "in", len(in), shapeSize(kernel, inShape))
	checkLen(kernel, "out", len(out), outSize)
	if outSize == 0 {
		return
	}
	acc := make([]float64, outSize)
	sumInto(acc, in, dims, red)
	scale := 1.0
	if mean {
		scale = 1 / float64(group)
	}
	for i, v := range acc {
		out[i] = T(v * scale)
	}
}

// maxNaN returns the larger of a and b, propagating NaN from either side so
// a NaN in the input is not silently hidden by the max.
func maxNaN[T Float](a, b T) T {
	if b > a || b != b {
		return b
	}
	return a
}

// ReduceMax takes the maximum of in (shape inShape) over axes, laid out as
// for [ReduceSum]. An empty group yields −Inf; a NaN in a group yields NaN.
func ReduceMax[T Float](out, in []T, inShape []int, axes []int) {
	const kernel = "ReduceMax"
	dims, red, outSize, _ := reducePlan(kernel, inShape, axes)
	checkLen(kernel, "in", len(in), shapeSize(kernel, inShape))
	checkLen(kernel, "out", len(out), outSize)
	negInf := T(math.Inf(-1))
	if isRowReduce(dims, red) {
		n := dims[1]
		ParallelFor(dims[0], rowGrain(n), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				m := negInf
				for _, v := range in[r*n : (r+1)*n] {
					m = maxNaN(m, v)
				}
				out[r] = m
			}
		})
		return
	}
	for i := range out {
		out[i] = negInf
	}
	reduceRuns(dims, red, func(inOff, outOff, n int, redInner bool) {
		run := in[inOff : inOff+n]
		if redInner {
			m := out[outOff]
			for _, v := range run {
				m = maxNaN(m, v)
			}
			out[outOff] = m
			return
		}
		o := out[outOff : outOff+n]
		for j, v := range run {
			o[j] = maxNaN(o[j], v)
		}
	})
}

// ReduceMaxGrad is the gradient of [ReduceMax]: y = ReduceMax(x) and dy
// have the reduced shape, and dx (x's shape) receives each group's dy split
// evenly among the elements equal to that group's max, 0 elsewhere.
// Splitting ties evenly keeps the gradient symmetric, which is what a
// finite-difference check of a tie sees.
func ReduceMaxGrad[T Float](dx, x, y, dy []T, inShape, axes []int) {
	const kernel = "ReduceMaxGrad"
	dims, red, outSize, _ := reducePlan(kernel, inShape, axes)
	n := shapeSize(kernel, inShape)
	checkLen(kernel, "x", len(x), n)
	checkLen(kernel, "dx", len(dx), n)
	checkLen(kernel, "y", len(y), outSize)
	checkLen(kernel, "dy", len(dy), outSize)
	count := make([]int, outSize)
	reduceRuns(dims, red, func(inOff, outOff, n int, redInner bool) {
		for j, v := range x[inOff : inOff+n] {
			o := outOff
			if !redInner {
				o += j
			}
			if v == y[o] {
				count[o]++
			}
		}
	})
	reduceRuns(dims, red, func(inOff, outOff, n int, redInner bool) {
		d := dx[inOff : inOff+n]
		for j, v := range x[inOff : inOff+n] {
			o := outOff
			if !redInner {
				o += j
			}
			if v == y[o] {
				d[j] = dy[o] / T(count[o])
			} else {
				d[j] = 0
			}
		}
	})
}
