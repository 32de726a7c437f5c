package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The bit layout is the contract the CUDA kernels and any dump reader
// share: little-endian bits within a byte, each row starting on a byte.
func TestReluMaskLayout(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tiny := math.SmallestNonzeroFloat32
	tests := []struct {
		name    string
		x       []float32
		rows, n int
		want    []uint8
	}{
		{"signs to bits, low bit first", []float32{1, -1, 0, 2, float32(nan), float32(inf), float32(-inf), 3}, 1, 8, []uint8{0b1010_1001}},
		{"a partial last byte keeps its high bits clear", []float32{-1, -1, -1, -1, -1, -1, -1, -1, 0.5}, 1, 9, []uint8{0, 1}},
		{"negative zero is not positive, a denormal is", []float32{float32(math.Copysign(0, -1)), float32(tiny)}, 1, 2, []uint8{0b10}},
		{"each row starts on a byte", []float32{1, 1, 1, -1, 1, -1}, 2, 3, []uint8{0b111, 0b010}},
		{"no elements", nil, 3, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mask := make([]uint8, tt.rows*MaskRowBytes(tt.n))
			for i := range mask {
				mask[i] = 0xff // stale bytes must be overwritten
			}
			ReluMask(mask, tt.x, tt.rows, tt.n)
			if len(tt.want) == 0 {
				assert.Empty(t, mask)
				return
			}
			assert.Equal(t, tt.want, mask)
		})
	}
}

func TestMaskRowBytes(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 1, 7: 1, 8: 1, 9: 2, 16: 2, 128: 16, 129: 17} {
		assert.Equal(t, want, MaskRowBytes(n), "n=%d", n)
	}
}

// The gradient through the mask equals relu_grad through x bit for bit
// (signed zeros, NaN and infinities in dy included), for row lengths that
// do and do not fill their last byte, and across the parallel split.
func testReluGradMaskExact[T Float](t *testing.T) {
	r := newRand(7)
	for _, shape := range [][2]int{{1, 1}, {1, 7}, {3, 8}, {5, 9}, {2, 13}, {300, 257}, {4, 40000}} {
		rows, n := shape[0], shape[1]
		x := randVec[T](r, rows*n, -2, 2)
		dy := randVec[T](r, rows*n, -3, 3)
		for i := 0; i < len(x); i += 5 {
			x[i] = 0 // ties at zero are where masks and signs could disagree
		}
		if len(dy) > 3 {
			dy[0], dy[1], dy[2] = T(math.NaN()), T(math.Inf(-1)), T(math.Copysign(0, -1))
		}
		want := make([]T, len(x))
		ReluGrad(want, x, dy)

		mask := make([]uint8, rows*MaskRowBytes(n))
		ReluMask(mask, x, rows, n)
		got := make([]T, len(x))
		ReluGradMask(got, mask, dy, rows, n)
		for i := range want {
			require.Equal(t, math.Float64bits(float64(want[i])), math.Float64bits(float64(got[i])), "%dx%d: element %d (x=%v dy=%v)", rows, n, i, x[i], dy[i])
		}

		// In place: dx aliases dy.
		inPlace := append([]T(nil), dy...)
		ReluGradMask(inPlace, mask, inPlace, rows, n)
		for i := range want {
			require.Equal(t, math.Float64bits(float64(want[i])), math.Float64bits(float64(inPlace[i])), "%dx%d in place: element %d", rows, n, i)
		}
	}
}

func TestReluGradMaskExact(t *testing.T) {
	both(t, testReluGradMaskExact[float32], testReluGradMaskExact[float64])
}

// Lengths that disagree with the shape are lowering bugs and panic with a
// message naming the kernel and the operand.
func TestBitmaskLengthChecks(t *testing.T) {
	x := make([]float32, 16)
	assert.PanicsWithValue(t, "cpu.ReluMask: len(mask) = 3, want 2", func() { ReluMask(make([]uint8, 3), x, 2, 8) })
	assert.PanicsWithValue(t, "cpu.ReluMask: len(x) = 16, want 18", func() { ReluMask(make([]uint8, 4), x, 2, 9) })
	assert.PanicsWithValue(t, "cpu.ReluGradMask: len(dy) = 8, want 16", func() { ReluGradMask(x, make([]uint8, 2), x[:8], 2, 8) })
	assert.PanicsWithValue(t, "cpu.ReluGradMask: len(mask) = 1, want 2", func() { ReluGradMask(x, make([]uint8, 1), x, 2, 8) })
	assert.PanicsWithValue(t, "cpu.ReluMask: negative dimension -1", func() { ReluMask(nil, x, -1, 8) })
}

// The backward through a mask against relu_grad through x, on one GPT-2
// small MLP activation per sequence of 1024 tokens ([1024, 3072]).
func BenchmarkReluBackward(b *testing.B) {
	const rows, n = 1024, 3072
	r := newRand(1)
	x, dy := randVec[float32](r, rows*n, -1, 1), randVec[float32](r, rows*n, -1, 1)
	dx := make([]float32, rows*n)
	mask := make([]uint8, rows*MaskRowBytes(n))
	b.Run("relu_grad", func(b *testing.B) {
		b.SetBytes(int64(4 * 3 * rows * n))
		for b.Loop() {
			ReluGrad(dx, x, dy)
		}
	})
	b.Run("relu_mask", func(b *testing.B) {
		b.SetBytes(int64(4*rows*n + len(mask)))
		for b.Loop() {
			ReluMask(mask, x, rows, n)
		}
	})
	b.Run("relu_grad_mask", func(b *testing.B) {
		b.SetBytes(int64(4*2*rows*n + len(mask)))
		for b.Loop() {
			ReluGradMask(dx, mask, dy, rows, n)
		}
	})
}
