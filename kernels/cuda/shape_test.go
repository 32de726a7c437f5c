package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/kernels/cuda"
)

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// Data movement is exact: every element must arrive with its bits.
func TestGatherTranspose(t *testing.T) {
	cases := []struct{ shape, perm []int }{
		{[]int{37, 53}, []int{1, 0}},
		{[]int{2, 5, 4, 3}, []int{0, 2, 1, 3}}, // heads out of [batch, seq, heads, dim]
		{[]int{2, 4, 5, 3}, []int{0, 1, 3, 2}}, // kᵀ
		{[]int{3, 4, 5}, []int{0, 2, 1}},
		{[]int{2, 3, 4, 5}, []int{3, 0, 2, 1}},
		{[]int{2, 1, 3, 1, 2, 2, 3, 2}, []int{7, 6, 5, 4, 3, 2, 1, 0}}, // rank 8, six dims after merging
		{[]int{1, 1}, []int{1, 0}},
		{[]int{4, 0, 3}, []int{2, 1, 0}},
		// Through shared-memory tiles: tile edges inside both dims, a
		// batch dim before them, between them, and merged ones.
		{[]int{33, 65}, []int{1, 0}},
		{[]int{2, 40, 33}, []int{0, 2, 1}},
		{[]int{33, 3, 40}, []int{2, 1, 0}},
		{[]int{17, 2, 3, 16}, []int{3, 1, 2, 0}},
	}
	tiled := map[string]bool{"[37 53]": true, "[33 65]": true, "[2 40 33]": true, "[33 3 40]": true, "[17 2 3 16]": true}
	for _, c := range cases {
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("%v_%v_b%d", c.shape, c.perm, block), func(t *testing.T) {
				n := numel(c.shape)
				x := randNorm(newRand(uint64(n)), n, 1)
				want := make([]float32, n)
				kcpu.Transpose(want, x, c.shape, c.perm)
				g, err := cuda.TransposeGather(c.shape, c.perm)
				require.NoError(t, err)
				require.Equal(t, tiled[fmt.Sprint(c.shape)], g.Tiled(), "tiled")
				for _, grid := range grids(n, block) {
					got := out(n)
					launch(t, "gc_gather", grid, block, append([]any{got, x}, g.Args()...)...)
					requireBits(t, want, got, "gc_gather transpose")
				}
			})
		}
	}
}

func TestGatherBroadcast(t *testing.T) {
	cases := []struct{ in, out []int }{
		{[]int{5}, []int{3, 4, 5}},
		{[]int{3, 1, 5}, []int{3, 4, 5}},
		{[]int{1}, []int{7}},
		{[]int{}, []int{2, 3}},
		{[]int{4, 1}, []int{2, 4, 33}},
		{[]int{2, 1, 3, 1}, []int{2, 5, 3, 4}},
	}
	for _, c := range cases {
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("%v_to_%v_b%d", c.in, c.out, block), func(t *testing.T) {
				x := randNorm(newRand(3), numel(c.in), 1)
				n := numel(c.out)
				want := make([]float32, n)
				kcpu.Broadcast(want, x, c.in, c.out)
				g, err := cuda.BroadcastGather(c.in, c.out)
				require.NoError(t, err)
				require.False(t, g.Tiled(), "a broadcast reads along out's last dim")
				for _, grid := range grids(n, block) {
					got := out(n)
					launch(t, "gc_gather", grid, block, append([]any{got, x}, g.Args()...)...)
					requireBits(t, want, got, "gc_gather broadcast")
				}
			})
		}
	}
}

func TestGatherGeometryErrors(t *testing.T) {
	_, err := cuda.TransposeGather([]int{2, 3}, []int{0, 0})
	require.ErrorContains(t, err, "not a permutation")
	_, err = cuda.TransposeGather([]int{2, 3, 2, 3, 2, 3, 2}, []int{6, 5, 4, 3, 2, 1, 0})
	require.ErrorContains(t, err, "at most 6")
	_, err = cuda.BroadcastGather([]int{3}, []int{4})
	require.ErrorContains(t, err, "does not broadcast")
}

func TestSliceConcat(t *testing.T) {
	cases := []struct {
		shape             []int
		dim, start, width int
	}{
		{[]int{4, 96}, 1, 32, 32}, // q, k, v out of a fused projection
		{[]int{2, 3, 96}, 2, 64, 32},
		{[]int{10, 7}, 0, 3, 5},
		{[]int{3, 5, 7}, 1, 0, 5},
		{[]int{300, 9}, 1, 8, 1},
		{[]int{6}, 0, 2, 0},
	}
	for _, c := range cases {
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("%v_d%d_%d+%d_b%d", c.shape, c.dim, c.start, c.width, block), func(t *testing.T) {
				outer, d, inner, err := cuda.SliceGeometry(c.shape, c.dim)
				require.NoError(t, err)
				n := numel(c.shape)
				x := randNorm(newRand(uint64(n)), n, 1)
				m := int(outer) * c.width * int(inner)
				want := make([]float32, m)
				kcpu.Slice(want, x, c.shape, c.dim, c.start, c.start+c.width)
				for _, grid := range grids(m, block) {
					got := out(m)
					launch(t, "gc_slice", grid, block, got, x, outer, d, inner, c.start, c.width)
					requireBits(t, want, got, "gc_slice")
				}

				dy := want
				wantDx := make([]float32, n)
				kcpu.SliceGrad(wantDx, dy, c.shape, c.dim, c.start, c.start+c.width)
				for _, grid := range grids(n, block) {
					got := out(n)
					launch(t, "gc_slice_grad", grid, block, got, dy, outer, d, inner, c.start, c.width)
					requireBits(t, wantDx, got, "gc_slice_grad")
				}

				// Concatenate the slice, the part before and the part after.
				shapeOf := func(w int) []int {
					s := append([]int(nil), c.shape...)
					s[c.dim] = w
					return s
				}
				widths := []int{c.start, c.width, int(d) - c.start - c.width}
				var parts [][]float32
				var shapes [][]int
				for _, w := range widths {
					shapes = append(shapes, shapeOf(w))
					parts = append(parts, randNorm(newRand(uint64(w)+1), int(outer)*w*int(inner), 1))
				}
				wantCat := make([]float32, n)
				kcpu.Concat(wantCat, parts, shapes, c.dim)
				got := out(n)
				start := 0
				for i, w := range widths {
					launch(t, "gc_concat_piece", 2, block, got, parts[i], outer, d, inner, start, w)
					start += w
				}
				requireBits(t, wantCat, got, "gc_concat_piece")
			})
		}
	}
}

// Token ids are sliced by the float kernels as bits: an int32 seen as a
// float32 (a subnormal for small ids) must come through untouched.
func TestMovesKeepIntBits(t *testing.T) {
	ids := []int32{0, 1, 2, 255, 50256, 1 << 30, -1, 0x7fc00001}
	x := make([]float32, len(ids))
	for i, id := range ids {
		x[i] = float32frombits(uint32(id))
	}
	got := out(len(ids))
	launch(t, "gc_slice", 1, 32, got, x, 1, len(ids), 1, 0, len(ids))
	for i, id := range ids {
		require.Equal(t, uint32(id), float32bits(got[i]), "id %d", id)
	}
	rep := out(2 * len(ids))
	launch(t, "gc_repeat_interleave", 1, 32, rep, x, 1, len(ids), 1, 2)
	for i, id := range ids {
		require.Equal(t, uint32(id), float32bits(rep[2*i]), "repeated id %d", id)
		require.Equal(t, uint32(id), float32bits(rep[2*i+1]), "repeated id %d", id)
	}
}

// repeatCases are repeat_interleave's [outer, n, inner] and repeats: the
// k/v heads of grouped-query attention, inner 1, a single repeat, many
// repeats, and empty extents.
var repeatCases = []struct{ outer, n, inner, repeats int }{
	{2, 2, 20, 3}, // [batch, kv heads, seq·head size] to 6 query heads
	{1, 5, 1, 4},
	{3, 1, 7, 1},
	{4, 3, 33, 2},
	{1, 2, 3, 40},
	{300, 1, 1, 2},
	{0, 3, 4, 2},
	{2, 0, 5, 3},
	{2, 3, 0, 2},
}

// repeat_interleave is a move: every element arrives with its bits,
// infinities, signed zeros, subnormals and NaN payloads included.
func TestRepeatInterleave(t *testing.T) {
	specials := []float32{float32frombits(0x80000000), float32frombits(0x7f800000), float32frombits(0xff800000),
		float32frombits(0x00000001), float32frombits(0x7fc12345)}
	for _, c := range repeatCases {
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("%dx%dx%d_r%d_b%d", c.outer, c.n, c.inner, c.repeats, block), func(t *testing.T) {
				n := c.outer * c.n * c.inner
				x := randNorm(newRand(uint64(n)+7), n, 1)
				for i, v := range specials {
					if i < n {
						x[(i*7919)%n] = v
					}
				}
				m := n * c.repeats
				want := make([]float32, m)
				kcpu.RepeatInterleave(want, x, c.outer, c.n, c.inner, c.repeats)
				for _, grid := range grids(m, block) {
					got := out(m)
					launch(t, "gc_repeat_interleave", grid, block, got, x, c.outer, c.n, c.inner, c.repeats)
					for i := range want {
						require.Equal(t, float32bits(want[i]), float32bits(got[i]), "gc_repeat_interleave element %d", i)
					}
					checkGuard(t, got)
				}
			})
		}
	}
}

// The gradient adds each slice's copies in order of the copy, in double,
// rounded once: the CPU kernel's result to the last bit.
func TestRepeatInterleaveGrad(t *testing.T) {
	for _, c := range repeatCases {
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("%dx%dx%d_r%d_b%d", c.outer, c.n, c.inner, c.repeats, block), func(t *testing.T) {
				n := c.outer * c.n * c.inner
				m := n * c.repeats
				r := newRand(uint64(m) + 11)
				dy := randNorm(r, m, 1)
				// Magnitudes over many binades, so a float accumulator or
				// another order would show in the last bits.
				for i := range dy {
					dy[i] *= float32(math.Ldexp(1, r.IntN(40)-20))
				}
				want := make([]float32, n)
				kcpu.RepeatInterleaveGrad(want, dy, c.outer, c.n, c.inner, c.repeats)
				for _, grid := range grids(n, block) {
					got := out(n)
					launch(t, "gc_repeat_interleave_grad", grid, block, got, dy, c.outer, c.n, c.inner, c.repeats)
					requireBits(t, want, got, "gc_repeat_interleave_grad")
				}
			})
		}
	}
}

// Two columns whose sums tell the accumulation apart: 1 + 2⁻³⁰ − 1 is 0
// in float and 2⁻³⁰ in double; 2⁶⁰ + 1 − 2⁶⁰ is 0 in double added in
// order of the copy, 1 in any order that adds the 2⁶⁰s first.
func TestRepeatInterleaveGradAccumulatesInDoubleInOrder(t *testing.T) {
	const big = float32(1 << 60)
	tiny := float32(math.Ldexp(1, -30))
	// [outer 1, n 1, inner 2] repeated 3 times: dy[k, j] is copy k of column j.
	dy := []float32{1, big, tiny, 1, -1, -big}
	want := []float32{tiny, 0}
	cpuGot := make([]float32, 2)
	kcpu.RepeatInterleaveGrad(cpuGot, dy, 1, 1, 2, 3)
	requireBits(t, want, cpuGot[:2:2], "the CPU kernel")
	got := out(2)
	launch(t, "gc_repeat_interleave_grad", 1, 32, got, dy, 1, 1, 2, 3)
	requireBits(t, want, got, "gc_repeat_interleave_grad")
}
