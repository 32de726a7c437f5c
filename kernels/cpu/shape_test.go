package cpu

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func refBroadcast(in []float64, inShape, outShape []int) []float64 {
	out := make([]float64, prod(outShape))
	off := len(outShape) - len(inShape)
	for i := range out {
		o := unravel(i, outShape)
		idx := make([]int, len(inShape))
		for d := range inShape {
			if inShape[d] != 1 {
				idx[d] = o[d+off]
			}
		}
		out[i] = in[ravel(idx, inShape)]
	}
	return out
}

func testBroadcast[T Float](t *testing.T) {
	r := newRand(7)
	cases := []struct{ in, out []int }{
		{[]int{3, 1}, []int{2, 3, 4}},
		{[]int{4}, []int{3, 4}},
		{[]int{}, []int{2, 2}},
		{[]int{1}, []int{5}},
		{[]int{2, 1, 3}, []int{2, 4, 3}},
		{[]int{2, 3}, []int{2, 3}},
		{[]int{1, 1}, []int{1, 1}},
		{[]int{1, 5, 1}, []int{3, 5, 7}},
		{[]int{6, 1}, []int{6, 3000}},
		{[]int{3}, []int{0, 3}},
	}
	for _, c := range cases {
		in := randVec[T](r, prod(c.in), -1, 1)
		out := make([]T, prod(c.out))
		Broadcast(out, in, c.in, c.out)
		requireClose(t, refBroadcast(to64(in), c.in, c.out), out, 0, fmt.Sprint(c))
	}
	require.Panics(t, func() { Broadcast(make([]T, 6), make([]T, 2), []int{2}, []int{2, 3}) })
	require.Panics(t, func() { Broadcast(make([]T, 2), make([]T, 2), []int{1, 2}, []int{2}) })
}

func TestBroadcast(t *testing.T) { both(t, testBroadcast[float32], testBroadcast[float64]) }

func refTranspose(in []float64, inShape, perm []int) []float64 {
	outShape := make([]int, len(perm))
	for i, p := range perm {
		outShape[i] = inShape[p]
	}
	out := make([]float64, len(in))
	for i := range out {
		o := unravel(i, outShape)
		idx := make([]int, len(perm))
		for d, p := range perm {
			idx[p] = o[d]
		}
		out[i] = in[ravel(idx, inShape)]
	}
	return out
}

// perms returns every permutation of 0..n-1.
func perms(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var res [][]int
	for _, p := range perms(n - 1) {
		for pos := 0; pos <= len(p); pos++ {
			q := slices.Insert(slices.Clone(p), pos, n-1)
			res = append(res, q)
		}
	}
	return res
}

func testTranspose[T Float](t *testing.T) {
	r := newRand(8)
	shapes := [][]int{{}, {5}, {5, 7}, {2, 3, 4}, {2, 1, 3, 1}, {3, 33, 65}, {2, 3, 4, 5}, {1, 40, 1}, {0, 3}}
	for _, s := range shapes {
		for _, p := range perms(len(s)) {
			in := randVec[T](r, prod(s), -1, 1)
			out := make([]T, len(in))
			Transpose(out, in, s, p)
			requireClose(t, refTranspose(to64(in), s, p), out, 0, fmt.Sprint(s, p))
		}
	}
	// Big batched last-two swap goes through the blocked parallel path.
	s := []int{4, 70, 130}
	in := randVec[T](r, prod(s), -1, 1)
	out := make([]T, len(in))
	Transpose(out, in, s, []int{0, 2, 1})
	requireClose(t, refTranspose(to64(in), s, []int{0, 2, 1}), out, 0, "batched")
	require.Panics(t, func() { Transpose(out, in, s, []int{0, 1, 1}) })
	require.Panics(t, func() { Transpose(out, in, s, []int{0, 1}) })
}

func TestTranspose(t *testing.T) { both(t, testTranspose[float32], testTranspose[float64]) }

func refSlice(in []float64, shape []int, dim, start, end int) []float64 {
	var out []float64
	for i, v := range in {
		if idx := unravel(i, shape); idx[dim] >= start && idx[dim] < end {
			out = append(out, v)
		}
	}
	return out
}

func testSlice[T Float](t *testing.T) {
	r := newRand(9)
	cases := []struct {
		shape           []int
		dim, start, end int
	}{
		{[]int{5}, 0, 1, 4},
		{[]int{3, 4}, 0, 0, 3},
		{[]int{3, 4}, 1, 2, 3},
		{[]int{2, 5, 3}, 1, 1, 5},
		{[]int{2, 5, 3}, 2, 0, 1},
		{[]int{2, 5, 3}, 0, 1, 2},
		{[]int{2, 5, 3}, 1, 2, 2},
	}
	for _, c := range cases {
		in := randVec[T](r, prod(c.shape), -1, 1)
		want := refSlice(to64(in), c.shape, c.dim, c.start, c.end)
		out := make([]T, len(want))
		Slice(out, in, c.shape, c.dim, c.start, c.end)
		requireClose(t, want, out, 0, fmt.Sprint(c))

		// SliceGrad scatters dy back; reading it with Slice must give dy
		// back and everything outside the window must be zero.
		dy := randVec[T](r, len(want), -1, 1)
		dx := randVec[T](r, len(in), -1, 1)
		SliceGrad(dx, dy, c.shape, c.dim, c.start, c.end)
		wantDx := make([]float64, len(in))
		k := 0
		for i := range wantDx {
			if idx := unravel(i, c.shape); idx[c.dim] >= c.start && idx[c.dim] < c.end {
				wantDx[i] = float64(dy[k])
				k++
			}
		}
		requireClose(t, wantDx, dx, 0, fmt.Sprint("grad ", c))
	}
	require.Panics(t, func() { Slice(make([]T, 2), make([]T, 4), []int{4}, 0, 3, 5) })
	require.Panics(t, func() { Slice(make([]T, 2), make([]T, 4), []int{4}, 1, 0, 2) })
	require.Panics(t, func() { SliceGrad(make([]T, 4), make([]T, 2), []int{4}, 0, 3, 2) })
}

func TestSlice(t *testing.T) { both(t, testSlice[float32], testSlice[float64]) }

func testConcat[T Float](t *testing.T) {
	r := newRand(10)
	cases := []struct {
		shapes [][]int
		dim    int
	}{
		{[][]int{{2}, {3}}, 0},
		{[][]int{{2, 3}, {1, 3}, {4, 3}}, 0},
		{[][]int{{2, 3}, {2, 1}, {2, 0}, {2, 2}}, 1},
		{[][]int{{2, 2, 3}, {2, 4, 3}}, 1},
		{[][]int{{2, 2, 3}}, 2},
	}
	for _, c := range cases {
		ins := make([][]T, len(c.shapes))
		outShape := slices.Clone(c.shapes[0])
		outShape[c.dim] = 0
		for i, s := range c.shapes {
			ins[i] = randVec[T](r, prod(s), -1, 1)
			outShape[c.dim] += s[c.dim]
		}
		// Reference: element at out index idx comes from the input whose
		// range along dim covers idx[dim].
		want := make([]float64, prod(outShape))
		for i := range want {
			idx := unravel(i, outShape)
			p := idx[c.dim]
			for j, s := range c.shapes {
				if p < s[c.dim] {
					idx[c.dim] = p
					want[i] = float64(ins[j][ravel(idx, s)])
					break
				}
				p -= s[c.dim]
			}
		}
		out := make([]T, len(want))
		Concat(out, ins, c.shapes, c.dim)
		requireClose(t, want, out, 0, fmt.Sprint(c))
	}
	Concat(make([]T, 0), nil, nil, 0)
	require.Panics(t, func() { Concat(make([]T, 5), [][]T{make([]T, 2), make([]T, 3)}, [][]int{{1, 2}, {3, 1}}, 0) })
}

func TestConcat(t *testing.T) { both(t, testConcat[float32], testConcat[float64]) }

// refReduce folds in over axes with op, starting from init.
func refReduce(in []float64, shape, axes []int, init float64, op func(a, b float64) float64) []float64 {
	var outShape []int
	for d, s := range shape {
		if !slices.Contains(axes, d) {
			outShape = append(outShape, s)
		}
	}
	out := make([]float64, prod(outShape))
	for i := range out {
		out[i] = init
	}
	for i, v := range in {
		idx := unravel(i, shape)
		var o []int
		for d, x := range idx {
			if !slices.Contains(axes, d) {
				o = append(o, x)
			}
		}
		j := ravel(o, outShape)
		out[j] = op(out[j], v)
	}
	return out
}

var reduceCases = []struct{ shape, axes []int }{
	{[]int{4, 5}, []int{1}},
	{[]int{4, 5}, []int{0}},
	{[]int{4, 5}, []int{0, 1}},
	{[]int{4, 5}, []int{}},
	{[]int{2, 3, 4}, []int{0, 2}},
	{[]int{2, 3, 4}, []int{1}},
	{[]int{2, 3, 4}, []int{1, 2}},
	{[]int{2, 3, 4}, []int{0, 1, 2}},
	{[]int{3, 1, 4}, []int{1}},
	{[]int{3, 1, 4}, []int{0, 1}},
	{[]int{1, 7}, []int{0}},
	{[]int{}, []int{}},
	{[]int{9}, []int{0}},
	{[]int{2, 3, 4, 5}, []int{1, 3}},
	{[]int{300, 129}, []int{1}},
	{[]int{129, 300}, []int{0}},
}

func testReduce[T Float](t *testing.T) {
	r := newRand(11)
	sum := func(a, b float64) float64 { return a + b }
	for _, c := range reduceCases {
		in := randVec[T](r, prod(c.shape), -2, 2)
		want := refReduce(to64(in), c.shape, c.axes, 0, sum)
		out := make([]T, len(want))
		ReduceSum(out, in, c.shape, c.axes)
		requireClose(t, want, out, tolOf[T](), fmt.Sprint("sum ", c))

		group := 1
		for _, a := range c.axes {
			group *= c.shape[a]
		}
		for i := range want {
			want[i] /= float64(group)
		}
		ReduceMean(out, in, c.shape, c.axes)
		requireClose(t, want, out, tolOf[T](), fmt.Sprint("mean ", c))

		want = refReduce(to64(in), c.shape, c.axes, math.Inf(-1), math.Max)
		ReduceMax(out, in, c.shape, c.axes)
		requireClose(t, want, out, 0, fmt.Sprint("max ", c))
	}
}

func TestReduce(t *testing.T) { both(t, testReduce[float32], testReduce[float64]) }

func TestReduceEdgeCases(t *testing.T) {
	// Reducing an empty dim: sums are 0, max is −Inf, mean is 0/0.
	out := make([]float64, 6)
	ReduceSum(out, nil, []int{2, 0, 3}, []int{1})
	require.Equal(t, make([]float64, 6), out)
	ReduceMax(out, nil, []int{2, 0, 3}, []int{1})
	require.Equal(t, math.Inf(-1), out[0])
	ReduceMean(out, nil, []int{2, 0, 3}, []int{1})
	require.True(t, math.IsNaN(out[0]))

	// NaN is not hidden by max, wherever it sits in the group.
	m := make([]float32, 2)
	nan := float32(math.NaN())
	ReduceMax(m, []float32{nan, 1, 2, nan}, []int{2, 2}, []int{1})
	require.True(t, math.IsNaN(float64(m[0])) && math.IsNaN(float64(m[1])))
	ReduceMax(m, []float32{nan, 1, 2, nan}, []int{2, 2}, []int{0})
	require.True(t, math.IsNaN(float64(m[0])) && math.IsNaN(float64(m[1])))

	// float32 sums accumulate in float64: a million 0.1s stay accurate.
	big := make([]float32, 1<<20)
	Fill(big, 0.1)
	s := make([]float32, 1)
	ReduceSum(s, big, []int{1 << 20}, []int{0})
	require.InDelta(t, float64(float32(0.1))*(1<<20), float64(s[0]), 1e-2)

	require.Panics(t, func() { ReduceSum(out, make([]float64, 6), []int{2, 3}, []int{1, 0}) })
	require.Panics(t, func() { ReduceSum(out, make([]float64, 6), []int{2, 3}, []int{2}) })
	require.Panics(t, func() { ReduceSum(out[:2], make([]float64, 6), []int{2, 3}, []int{0}) })
}

func testReduceMaxGrad[T Float](t *testing.T) {
	r := newRand(12)
	for _, c := range reduceCases {
		x := randVec[T](r, prod(c.shape), -2, 2)
		y := make([]T, len(refReduce(to64(x), c.shape, c.axes, 0, math.Max)))
		ReduceMax(y, x, c.shape, c.axes)
		dy := randVec[T](r, len(y), -1, 1)
		dx := randVec[T](r, len(x), -1, 1)
		ReduceMaxGrad(dx, x, y, dy, c.shape, c.axes)
		// Random inputs have no ties, so each group's dy lands on its
		// single max; summing dx per group must give back dy and the
		// nonzero entries must be at the max.
		back := refReduce(to64(dx), c.shape, c.axes, 0, func(a, b float64) float64 { return a + b })
		requireClose(t, to64(dy), mustT[T](back), 0, fmt.Sprint(c))
		maxAt := refBroadcastReduced(to64(y), c.shape, c.axes)
		for i := range dx {
			if float64(x[i]) != maxAt[i] {
				require.Zero(t, dx[i])
			}
		}
	}
	// Ties share the gradient evenly.
	x := []T{1, 3, 3, 0, 2, 2, 2, -1}
	y := make([]T, 2)
	ReduceMax(y, x, []int{2, 4}, []int{1})
	dx := make([]T, 8)
	ReduceMaxGrad(dx, x, y, []T{1, 3}, []int{2, 4}, []int{1})
	require.Equal(t, []T{0, 0.5, 0.5, 0, 1, 1, 1, 0}, dx)
}

func TestReduceMaxGrad(t *testing.T) { both(t, testReduceMaxGrad[float32], testReduceMaxGrad[float64]) }

// mustT converts a float64 reference back to T for requireClose.
func mustT[T Float](x []float64) []T {
	o := make([]T, len(x))
	for i, v := range x {
		o[i] = T(v)
	}
	return o
}

// refBroadcastReduced spreads a reduced result back over the input shape.
func refBroadcastReduced(y []float64, shape, axes []int) []float64 {
	keep := slices.Clone(shape)
	for _, a := range axes {
		keep[a] = 1
	}
	return refBroadcast(y, keep, shape)
}

func TestEmbeddingRange(t *testing.T) {
	table := []float32{1, 2, 3, 4} // rows 10 and 11 of the vocabulary, dim 2
	out := make([]float32, 6)
	EmbeddingRange(out, table, []int32{11, 3, 10}, 10, 2, 2)
	if want := []float32{3, 4, 0, 0, 1, 2}; !slicesEqual(out, want) {
		t.Fatalf("got %v, want %v", out, want)
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
