package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/kernels/cuda"
)

var reduceCases = []struct{ shape, axes []int }{
	{[]int{5, 37}, []int{1}},
	{[]int{3, 1000}, []int{1}}, // rows longer than the block
	{[]int{8, 4, 33}, []int{0, 1}},
	{[]int{4, 6, 5}, []int{1}},
	{[]int{2, 3, 4, 5}, []int{1, 2}},
	{[]int{700}, []int{0}},
	{[]int{3, 1, 4}, []int{1}},
	{[]int{2, 5, 1}, []int{1, 2}},
	{[]int{6, 4}, []int{}},
	// Column tiles: r across warps and rows of the block (1025, 33, 257),
	// tiles of 4 columns, an overhanging tile of 32 (80 = 2·32 + 16), and
	// 31 of 32 lanes.
	{[]int{1025, 3}, []int{0}},
	{[]int{33, 2, 40}, []int{0}},
	{[]int{2, 257, 31}, []int{1}},
}

// reduceLaunch runs the row or the column form of a reduction, as the
// op table says: rows when nothing follows the reduced dims.
func reduceLaunch(t *testing.T, rows, cols string, got, x []float32, shape, axes []int, block uint32, extra ...any) {
	t.Helper()
	outer, r, inner, err := cuda.ReduceGeometry(shape, axes)
	require.NoError(t, err)
	if inner == 1 {
		launch(t, rows, uint32(max(outer, 1)), block, append([]any{got, x, outer, r}, extra...)...)
		got2 := out(len(got))
		launch(t, rows, 2, block, append([]any{got2, x, outer, r}, extra...)...) // a grid smaller than rows
		requireBits(t, got, got2, rows+" with fewer blocks than rows")
		return
	}
	launch(t, cols, 3, block, append([]any{got, x, outer, r, inner}, extra...)...)
	// The order of a column's sum is fixed by the block size alone: any
	// grid gives the same bits.
	got2 := out(len(got))
	launch(t, cols, 1, block, append([]any{got2, x, outer, r, inner}, extra...)...)
	requireBits(t, got, got2, cols+" on one block")
}

// Sums accumulate in double on both sides; the GPU adds in a tree, the
// CPU in order, so they may round differently at the last step: the bound
// is 2⁻²² of the result plus 2⁻⁴⁰ of Σ|x| (for cancelling sums).
func TestReduceSumMean(t *testing.T) {
	for _, c := range reduceCases {
		for _, block := range blockSizes {
			for _, mean := range []int{0, 1} {
				t.Run(fmt.Sprintf("%v_%v_b%d_mean%d", c.shape, c.axes, block, mean), func(t *testing.T) {
					n := numel(c.shape)
					x := randNorm(newRand(uint64(n)), n, 1)
					ax := make([]float32, n)
					for i, v := range x {
						ax[i] = float32(math.Abs(float64(v)))
					}
					_, r, _, err := cuda.ReduceGeometry(c.shape, c.axes)
					require.NoError(t, err)
					m := n / int(max(r, 1))
					want, mag := make([]float32, m), make([]float32, m)
					if mean == 1 {
						kcpu.ReduceMean(want, x, c.shape, c.axes)
					} else {
						kcpu.ReduceSum(want, x, c.shape, c.axes)
					}
					kcpu.ReduceSum(mag, ax, c.shape, c.axes)
					bound := make([]float64, m)
					for i := range bound {
						bound[i] = ulp2*math.Abs(float64(want[i])) + float64(mag[i])/(1<<40)
					}
					got := out(m)
					reduceLaunch(t, "gc_reduce_sum_rows", "gc_reduce_sum_cols", got, x, c.shape, c.axes, block, mean)
					requireWithin(t, want, got, bound, "reduce_sum")
				})
			}
		}
	}
}

// Max is exact and propagates NaN.
func TestReduceMax(t *testing.T) {
	for _, c := range reduceCases {
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("%v_%v_b%d", c.shape, c.axes, block), func(t *testing.T) {
				n := numel(c.shape)
				x := randNorm(newRand(uint64(n)+1), n, 1)
				x[n/2] = float32(math.NaN())
				_, r, _, err := cuda.ReduceGeometry(c.shape, c.axes)
				require.NoError(t, err)
				m := n / int(max(r, 1))
				want, got := make([]float32, m), out(m)
				kcpu.ReduceMax(want, x, c.shape, c.axes)
				reduceLaunch(t, "gc_reduce_max_rows", "gc_reduce_max_cols", got, x, c.shape, c.axes, block)
				requireBits(t, want, got, "reduce_max")
			})
		}
	}
}

// Ties share the gradient evenly, bit for bit as the CPU kernel.
func TestReduceMaxGrad(t *testing.T) {
	for _, c := range reduceCases {
		t.Run(fmt.Sprintf("%v_%v", c.shape, c.axes), func(t *testing.T) {
			n := numel(c.shape)
			r := newRand(uint64(n) + 2)
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(r.IntN(3)) // many ties
			}
			outer, red, inner, err := cuda.ReduceGeometry(c.shape, c.axes)
			require.NoError(t, err)
			m := int(outer * inner)
			y, dy := make([]float32, m), randNorm(r, m, 1)
			kcpu.ReduceMax(y, x, c.shape, c.axes)
			want, got := make([]float32, n), out(n)
			kcpu.ReduceMaxGrad(want, x, y, dy, c.shape, c.axes)
			for _, block := range []uint32{32, 64} {
				launch(t, "gc_reduce_max_grad", 2, block, got, x, y, dy, outer, red, inner)
				requireBits(t, want, got, "gc_reduce_max_grad")
			}
		})
	}
}

func TestReduceGeometry(t *testing.T) {
	o, r, i, err := cuda.ReduceGeometry([]int{2, 1, 3, 4, 5}, []int{1, 2, 3})
	require.NoError(t, err)
	require.Equal(t, []int64{2, 12, 5}, []int64{o, r, i})
	_, _, _, err = cuda.ReduceGeometry([]int{2, 3, 4}, []int{0, 2})
	require.ErrorContains(t, err, "not contiguous")
	_, _, _, err = cuda.ReduceGeometry([]int{2, 3}, []int{1, 0})
	require.ErrorContains(t, err, "sorted")
	// Size-1 dims between reduced ones do not break the run.
	o, r, i, err = cuda.ReduceGeometry([]int{2, 3, 1, 4}, []int{1, 3})
	require.NoError(t, err)
	require.Equal(t, []int64{2, 12, 1}, []int64{o, r, i})
}

// The global sum of squares over several tensors (gradient clipping)
// and the count of infinities and NaNs (the fp16 overflow check): one
// partial launch per tensor, then one finishing block.
func TestGlobalSums(t *testing.T) {
	sizes := []int{1, 1000, 4099, 37}
	for _, block := range blockSizes {
		for _, grid := range []uint32{1, 5} {
			t.Run(fmt.Sprintf("b%d_g%d", block, grid), func(t *testing.T) {
				r := newRand(uint64(block))
				var xs [][]float32
				var ss float64
				nonfinite := 0
				for k, n := range sizes {
					x := randNorm(r, n, float64(k+1))
					if k == 1 {
						x[3], x[10], x[999] = float32(math.Inf(1)), float32(math.NaN()), float32(math.Inf(-1))
					}
					xs = append(xs, x)
					ss += kcpu.SumSquares(x)
					nonfinite += kcpu.CountNonFinite(x)
				}
				// Sum of squares over the finite tensors only (an inf makes it inf).
				finite := append(append([][]float32(nil), xs[0]), xs[2:]...)
				ssFinite := 0.0
				for _, x := range finite {
					ssFinite += kcpu.SumSquares(x)
				}
				partial := make([]float32, 2*int(grid)*len(finite))
				for k, x := range finite {
					launch(t, "gc_sum_squares_partial", grid, block, partial[2*int(grid)*k:], x, len(x))
				}
				got := out(1)
				launch(t, "gc_finish_sum", 1, block, got, partial, len(partial)/2, 1)
				requireClose(t, []float32{float32(ssFinite)}, got, ulp2, 0, "sum of squares")

				counts := make([]int32, int(grid)*len(xs))
				for k, x := range xs {
					launch(t, "gc_nonfinite_partial", grid, block, counts[int(grid)*k:], x, len(x))
				}
				got = out(1)
				launch(t, "gc_finish_count", 2, block, got, counts, len(counts))
				require.Equal(t, float32(nonfinite), got[0])
				require.True(t, math.IsInf(ss, 1) || math.IsNaN(ss))
			})
		}
	}
}
