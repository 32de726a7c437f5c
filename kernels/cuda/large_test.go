package cuda_test

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/kernels/cuda"
)

// TestLargerShapes runs the rewritten reductions, softmax, transpose and
// embedding gradient on shapes nearer a model's (many tiles and rows, a
// streamed row at 256 threads, a vocabulary of thousands). Slow under
// the emulator, so only with GCOMPILE_FULL_TESTS=1.
func TestLargerShapes(t *testing.T) {
	if os.Getenv("GCOMPILE_FULL_TESTS") != "1" {
		t.Skip("skipping: set GCOMPILE_FULL_TESTS=1 for the larger shapes")
	}
	const block = 256
	r := newRand(2024)

	t.Run("reduce_sum_cols", func(t *testing.T) {
		shape, axes := []int{4097, 300}, []int{0}
		n := numel(shape)
		x := randNorm(r, n, 1)
		want, mag, ax := make([]float32, 300), make([]float32, 300), make([]float32, n)
		for i, v := range x {
			ax[i] = float32(math.Abs(float64(v)))
		}
		kcpu.ReduceSum(want, x, shape, axes)
		kcpu.ReduceSum(mag, ax, shape, axes)
		outer, red, inner, err := cuda.ReduceGeometry(shape, axes)
		require.NoError(t, err)
		got := out(300)
		launch(t, "gc_reduce_sum_cols", 16, block, got, x, outer, red, inner, 0)
		bound := make([]float64, 300)
		for i := range bound {
			bound[i] = ulp2*math.Abs(float64(want[i])) + float64(mag[i])/(1<<40)
		}
		requireWithin(t, want, got, bound, "gc_reduce_sum_cols")
	})

	t.Run("softmax_streamed", func(t *testing.T) {
		const rows, n = 3, 5000 // more than 16·256 values a row
		x := randNorm(r, rows*n, 4)
		want, got := make([]float32, rows*n), out(rows*n)
		kcpu.Softmax(want, x, rows, n)
		launch(t, "gc_softmax", 2, block, got, x, rows, n)
		requireWithin(t, want, got, softmaxBound(x, rows, n, want), "gc_softmax")
	})

	t.Run("transpose", func(t *testing.T) {
		shape, perm := []int{3, 300, 257}, []int{0, 2, 1}
		n := numel(shape)
		x := randNorm(r, n, 1)
		want, got := make([]float32, n), out(n)
		kcpu.Transpose(want, x, shape, perm)
		g, err := cuda.TransposeGather(shape, perm)
		require.NoError(t, err)
		require.True(t, g.Tiled())
		launch(t, "gc_gather", 64, block, append([]any{got, x}, g.Args()...)...)
		requireBits(t, want, got, "gc_gather")
	})

	t.Run("embedding_grad", func(t *testing.T) {
		const vocab, dim, count = 5000, 8, 20000
		ids := make([]int32, count)
		for i := range ids {
			ids[i] = int32(r.IntN(vocab))
			if i%7 == 0 {
				ids[i] = 17 // a frequent token
			}
		}
		dy := randNorm(r, count*dim, 1)
		want, got, status := make([]float32, vocab*dim), out(vocab*dim), []int32{0}
		require.NoError(t, kcpu.EmbeddingGrad(want, dy, ids, vocab, dim))
		embeddingGrad(t, 128, block, got, status, ids, dy, vocab, dim, 0, vocab)
		requireBits(t, want, got, fmt.Sprintf("gc_embedding_grad %d×%d", vocab, dim))
		require.Zero(t, status[0])
	})
}
