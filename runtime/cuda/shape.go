package cuda

import (
	"fmt"
	"slices"

	kcuda "gcompile/kernels/cuda"
)

// Shape ops and reductions. The moves (transpose, broadcast, slices,
// concat, repeat_interleave) only copy elements, so they also move i32
// buffers (token ids cut into microbatches) on the fp32 kernels, bit for
// bit. repeat_interleave's gradient sums, so it takes fp32 like the
// reductions.
func init() {
	register(onFP32(movesBits, (*compiler).transpose), "transpose")
	register(onFP32(movesBits, (*compiler).broadcast), "broadcast")
	register(onFP32(movesBits, (*compiler).slice), "slice")
	register(onFP32(movesBits, (*compiler).sliceGrad), "slice_grad")
	register(onFP32(movesBits, (*compiler).concat), "concat")
	register(onFP32(movesBits, (*compiler).repeatInterleave), "repeat_interleave")
	register(onFP32(resultDType, (*compiler).repeatInterleaveGrad), "repeat_interleave_grad")
	register(onFP32(resultDType, (*compiler).reduce), "reduce_sum", "reduce_mean", "reduce_max")
	register(onFP32(resultDType, (*compiler).reduceMaxGrad), "reduce_max_grad")
}

func (c *compiler) transpose() (func() error, error) {
	g, err := kcuda.TransposeGather(c.shape(0), c.in.Attrs.Ints("perm"))
	if err != nil {
		return nil, err
	}
	return c.one("gc_gather", append([]any{bits(c.out()), bits(c.arg(0))}, g.Args()...)...)
}

func (c *compiler) broadcast() (func() error, error) {
	g, err := kcuda.BroadcastGather(c.shape(0), c.outShape())
	if err != nil {
		return nil, err
	}
	return c.one("gc_gather", append([]any{bits(c.out()), bits(c.arg(0))}, g.Args()...)...)
}

func (c *compiler) slice() (func() error, error) {
	in, a := c.in, c.in.Attrs
	s := c.shape(0)
	dim := a.Int("dim", 0)
	outer, dd, inner, err := kcuda.SliceGeometry(s, dim)
	if err != nil {
		return nil, err
	}
	// A split dim is sliced in local coordinates: the global bounds fall
	// on block boundaries, which shrink by the split factor.
	f := in.Value.Args[0].Type.Shape[dim] / s[dim]
	start, end := a.Int("start", 0)/f, a.Int("end", 0)/f
	return c.one("gc_slice", bits(c.out()), bits(c.arg(0)), outer, dd, inner, int64(start), int64(end-start))
}

func (c *compiler) sliceGrad() (func() error, error) {
	in, a := c.in, c.in.Attrs
	outShape := c.outShape()
	dim := a.Int("dim", 0)
	outer, dd, inner, err := kcuda.SliceGeometry(outShape, dim)
	if err != nil {
		return nil, err
	}
	f := in.Value.Type.Shape[dim] / outShape[dim]
	start := a.Int("start", 0) / f
	return c.one("gc_slice_grad", bits(c.out()), bits(c.arg(0)), outer, dd, inner, int64(start), int64(c.shape(0)[dim]))
}

// concat copies each argument into its place along dim, one launch each.
func (c *compiler) concat() (func() error, error) {
	dim := c.in.Attrs.Int("dim", 0)
	outer, total, inner, err := kcuda.SliceGeometry(c.outShape(), dim)
	if err != nil {
		return nil, err
	}
	var ls []*launch
	start := int64(0)
	for i := range c.in.Args {
		w := int64(c.shape(i)[dim])
		l, err := c.kernel("gc_concat_piece", bits(c.out()), bits(c.arg(i)), outer, total, inner, start, w)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		start += w
	}
	return c.runs(ls...), nil
}

// repeatGeometry views the smaller side of a repeat_interleave (x, or
// the gradient's dx) as [outer, n, inner] around dim, and checks that the
// larger side (out, or dy) holds n·repeats slices. Shapes are local, as
// in the CPU backend's repeatSplit: a device holding some of dim's slices
// (the k/v heads split over tp) repeats its own.
func (c *compiler) repeatGeometry(small, large []int) (outer, n, inner, repeats int64, err error) {
	a := c.in.Attrs
	dim, r := a.Int("dim", 0), a.Int("repeats", 1)
	if r < 1 {
		return 0, 0, 0, 0, fmt.Errorf("repeats must be ≥ 1, got %d", r)
	}
	outer, n, inner, err = kcuda.SliceGeometry(small, dim)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	want := slices.Clone(small)
	want[dim] *= r
	if !slices.Equal(large, want) {
		return 0, 0, 0, 0, fmt.Errorf("local shapes %v and %v are not %d repeats along dim %d", small, large, r, dim)
	}
	return outer, n, inner, int64(r), nil
}

func (c *compiler) repeatInterleave() (func() error, error) {
	outer, n, inner, r, err := c.repeatGeometry(c.shape(0), c.outShape())
	if err != nil {
		return nil, err
	}
	return c.one("gc_repeat_interleave", bits(c.out()), bits(c.arg(0)), outer, n, inner, r)
}

func (c *compiler) repeatInterleaveGrad() (func() error, error) {
	outer, n, inner, r, err := c.repeatGeometry(c.outShape(), c.shape(0))
	if err != nil {
		return nil, err
	}
	return c.one("gc_repeat_interleave_grad", c.out(), c.arg(0), outer, n, inner, r)
}

// reduceGeometry views argument 0 as (outer, r, inner) around the axes
// being reduced.
func (c *compiler) reduceGeometry() (outer, r, inner int64, err error) {
	axes := slices.Sorted(slices.Values(c.in.Attrs.Ints("axes")))
	return kcuda.ReduceGeometry(c.shape(0), slices.Compact(axes))
}

// reduce picks the row kernel when the reduced elements are contiguous
// (inner = 1) and the column kernel otherwise.
func (c *compiler) reduce() (func() error, error) {
	outer, r, inner, err := c.reduceGeometry()
	if err != nil {
		return nil, err
	}
	if c.in.Op == "reduce_max" {
		if inner == 1 {
			return c.one("gc_reduce_max_rows", c.out(), c.arg(0), outer, r)
		}
		return c.one("gc_reduce_max_cols", c.out(), c.arg(0), outer, r, inner)
	}
	mean := c.in.Op == "reduce_mean"
	if inner == 1 {
		return c.one("gc_reduce_sum_rows", c.out(), c.arg(0), outer, r, mean)
	}
	return c.one("gc_reduce_sum_cols", c.out(), c.arg(0), outer, r, inner, mean)
}

func (c *compiler) reduceMaxGrad() (func() error, error) {
	outer, r, inner, err := c.reduceGeometry()
	if err != nil {
		return nil, err
	}
	return c.one("gc_reduce_max_grad", c.out(), c.arg(0), c.arg(1), c.arg(2), outer, r, inner)
}
