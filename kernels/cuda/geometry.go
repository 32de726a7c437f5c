package cuda

import "fmt"

// GatherRank is the most dims gc_gather walks after merging.
const GatherRank = 6

// Gather holds gc_gather's arguments after out and in: the element count,
// out's dims (Dims[0] is implied by N) and the input stride of each.
type Gather struct {
	N       int64
	Dims    [GatherRank]int64
	Strides [GatherRank]int64
}

// Args returns the arguments in kernel order: n, d1…d5, s0…s5.
func (g Gather) Args() []any {
	a := []any{g.N}
	for _, d := range g.Dims[1:] {
		a = append(a, d)
	}
	for _, s := range g.Strides {
		a = append(a, s)
	}
	return a
}

// Tiled reports whether gc_gather moves g through 32×33 shared-memory
// tiles (shape.cu's gc_gather_tiled) rather than element by element:
// when out's last dim is not contiguous in the input (stride ≠ 1) but some
// other out dim is, and both have at least 16 elements, so that a tile
// reads rows of the input and writes rows of out. This mirrors the
// kernel's own test; the result is the same either way.
func (g Gather) Tiled() bool {
	if g.N == 0 || g.Strides[GatherRank-1] == 1 || g.Dims[GatherRank-1] < 16 {
		return false
	}
	for i := GatherRank - 2; i >= 0; i-- {
		if g.Strides[i] == 1 && g.Dims[i] >= 16 {
			return true
		}
	}
	return false
}

// gatherOf merges out dims whose strides chain (stepping over dim k is
// stepping once over the whole of dim k+1) and drops size-1 dims, then
// pads to GatherRank. Merging is what lets a rank-8 transpose that only
// moves two blocks of dims fit six.
func gatherOf(dims, strides []int) (Gather, error) {
	var md, ms []int64
	n := int64(1)
	for i, d := range dims {
		if d < 0 {
			return Gather{}, fmt.Errorf("negative dim %d in %v", d, dims)
		}
		n *= int64(d)
		if d == 1 {
			continue
		}
		if k := len(md); k > 0 && ms[k-1] == int64(strides[i])*int64(d) {
			md[k-1] *= int64(d)
			ms[k-1] = int64(strides[i])
			continue
		}
		md = append(md, int64(d))
		ms = append(ms, int64(strides[i]))
	}
	if len(md) > GatherRank {
		return Gather{}, fmt.Errorf("gather of dims %v with strides %v needs %d dims after merging; gc_gather walks at most %d", dims, strides, len(md), GatherRank)
	}
	g := Gather{N: n}
	pad := GatherRank - len(md)
	for i := range GatherRank {
		if i < pad {
			g.Dims[i] = 1
			continue
		}
		g.Dims[i], g.Strides[i] = md[i-pad], ms[i-pad]
	}
	if n == 0 {
		// Nothing is read; keep every divisor non-zero all the same.
		for i := range g.Dims {
			g.Dims[i] = max(g.Dims[i], 1)
		}
	}
	return g, nil
}

// TransposeGather gives gc_gather's arguments for the IR's transpose:
// out dim i is in dim perm[i].
func TransposeGather(inShape, perm []int) (Gather, error) {
	r := len(inShape)
	if len(perm) != r {
		return Gather{}, fmt.Errorf("transpose perm %v does not match shape %v", perm, inShape)
	}
	seen := make([]bool, r)
	for _, p := range perm {
		if p < 0 || p >= r || seen[p] {
			return Gather{}, fmt.Errorf("transpose perm %v is not a permutation of %d dims", perm, r)
		}
		seen[p] = true
	}
	inStride := make([]int, r)
	s := 1
	for i := r - 1; i >= 0; i-- {
		inStride[i] = s
		s *= inShape[i]
	}
	dims, strides := make([]int, r), make([]int, r)
	for i, p := range perm {
		dims[i], strides[i] = inShape[p], inStride[p]
	}
	return gatherOf(dims, strides)
}

// BroadcastGather gives gc_gather's arguments for the IR's broadcast
// (NumPy rules: inShape right-aligned, each dim equal or 1).
func BroadcastGather(inShape, outShape []int) (Gather, error) {
	r := len(outShape)
	off := r - len(inShape)
	if off < 0 {
		return Gather{}, fmt.Errorf("broadcast of %v to fewer dims %v", inShape, outShape)
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
			return Gather{}, fmt.Errorf("shape %v does not broadcast to %v", inShape, outShape)
		}
		s *= inShape[i]
	}
	return gatherOf(outShape, strides)
}

// SliceGeometry views shape as [outer, d, inner] around dim, the form
// gc_slice, gc_slice_grad and gc_concat_piece take.
func SliceGeometry(shape []int, dim int) (outer, d, inner int64, err error) {
	if dim < 0 || dim >= len(shape) {
		return 0, 0, 0, fmt.Errorf("dim %d out of range for shape %v", dim, shape)
	}
	outer, inner = 1, 1
	for _, v := range shape[:dim] {
		outer *= int64(v)
	}
	for _, v := range shape[dim+1:] {
		inner *= int64(v)
	}
	return outer, int64(shape[dim]), inner, nil
}

// ReduceGeometry views a reduction of shape over axes (sorted, unique)
// as [outer, r, inner] with r the reduced extent: size-1 dims are
// dropped and neighbouring dims that are both kept or both reduced are
// merged. The reduced dims must then form one run, which covers the
// reductions the IR produces (bias and LayerNorm β gradients over the
// leading dims, row sums over the last); others are an error that names
// the shape and axes.
func ReduceGeometry(shape, axes []int) (outer, r, inner int64, err error) {
	red := make([]bool, len(shape))
	for i, a := range axes {
		if a < 0 || a >= len(shape) {
			return 0, 0, 0, fmt.Errorf("axis %d out of range for shape %v", a, shape)
		}
		if i > 0 && a <= axes[i-1] {
			return 0, 0, 0, fmt.Errorf("axes %v must be sorted and unique", axes)
		}
		red[a] = true
	}
	outer, r, inner = 1, 1, 1
	// 0: before the reduced run, 1: inside it, 2: after it.
	phase := 0
	for i, d := range shape {
		if d < 0 {
			return 0, 0, 0, fmt.Errorf("negative dim in shape %v", shape)
		}
		if red[i] {
			r *= int64(d)
		}
		if d == 1 {
			continue
		}
		switch {
		case red[i] && phase == 2:
			return 0, 0, 0, fmt.Errorf("reducing shape %v over axes %v: the reduced dims are not contiguous after dropping size-1 dims; the kernels take [outer, r, inner]", shape, axes)
		case red[i]:
			phase = 1
		case phase == 0:
			outer *= int64(d)
		default:
			phase = 2
			inner *= int64(d)
		}
	}
	return outer, r, inner, nil
}
