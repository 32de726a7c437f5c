package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func refSoftmax(x []float64, rows, n int) []float64 {
	out := make([]float64, len(x))
	for r := range rows {
		row := x[r*n : (r+1)*n]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		s := 0.0
		for _, v := range row {
			s += math.Exp(v - m)
		}
		for j, v := range row {
			out[r*n+j] = math.Exp(v-m) / s
		}
	}
	return out
}

var rowCases = [][2]int{{1, 1}, {1, 5}, {3, 1}, {4, 7}, {2, 64}, {300, 100}}

func testSoftmax[T Float](t *testing.T) {
	r := newRand(13)
	for _, c := range rowCases {
		rows, n := c[0], c[1]
		x := randVec[T](r, rows*n, -10, 10)
		out := make([]T, len(x))
		Softmax(out, x, rows, n)
		want := refSoftmax(to64(x), rows, n)
		requireClose(t, want, out, tolOf[T](), fmt.Sprint(c))

		y := out
		dy := randVec[T](r, len(x), -1, 1)
		dx := make([]T, len(x))
		SoftmaxGrad(dx, y, dy, rows, n)
		for i := range rows {
			dot := 0.0
			for j := range n {
				dot += float64(y[i*n+j]) * float64(dy[i*n+j])
			}
			for j := range n {
				k := i*n + j
				want[k] = float64(y[k]) * (float64(dy[k]) - dot)
			}
		}
		requireClose(t, want, dx, tolOf[T](), fmt.Sprint("grad ", c))
	}
}

func TestSoftmax(t *testing.T) { both(t, testSoftmax[float32], testSoftmax[float64]) }

func TestSoftmaxStability(t *testing.T) {
	inf := float32(math.Inf(-1))
	x := []float32{1000, 1001, inf, 999, inf, inf, inf, inf, -1e30, 0, inf, 5}
	out := make([]float32, len(x))
	Softmax(out, x, 3, 4)
	for _, v := range out {
		require.False(t, math.IsNaN(float64(v)))
	}
	// Masked entries get nothing, the all-masked row is all zeros.
	require.Equal(t, float32(0), out[2])
	require.Equal(t, []float32{0, 0, 0, 0}, out[4:8])
	requireClose(t, refSoftmax([]float64{1000, 1001, math.Inf(-1), 999}, 1, 4), out[:4], 1e-6, "large logits")
	// In place is allowed.
	Softmax(x, x, 3, 4)
	require.Equal(t, out, x)
}

func testCausalMask[T Float](t *testing.T) {
	r := newRand(14)
	for _, c := range [][3]int{{2, 3, 5}, {1, 4, 4}, {1, 1, 1}, {3, 2, 2}, {1, 5, 3}} {
		batch, s, tt := c[0], c[1], c[2]
		x := randVec[T](r, batch*s*tt, -1, 1)
		for _, fill := range []T{T(math.Inf(-1)), 0} {
			out := make([]T, len(x))
			CausalMask(out, x, batch, s, tt, fill)
			want := make([]float64, len(x))
			for b := range batch {
				for i := range s {
					for j := range tt {
						k := (b*s+i)*tt + j
						if j <= i+(tt-s) {
							want[k] = float64(x[k])
						} else {
							want[k] = float64(fill)
						}
					}
				}
			}
			requireClose(t, want, out, 0, fmt.Sprint(c))
		}
	}
}

func TestCausalMask(t *testing.T) { both(t, testCausalMask[float32], testCausalMask[float64]) }

func refLayerNorm(x, gamma, beta []float64, rows, n int, eps float64) []float64 {
	out := make([]float64, len(x))
	for r := range rows {
		row := x[r*n : (r+1)*n]
		mean := 0.0
		for _, v := range row {
			mean += v
		}
		mean /= float64(n)
		vr := 0.0
		for _, v := range row {
			vr += (v - mean) * (v - mean)
		}
		vr /= float64(n)
		for j, v := range row {
			out[r*n+j] = (v-mean)/math.Sqrt(vr+eps)*gamma[j] + beta[j]
		}
	}
	return out
}

func testLayerNorm[T Float](t *testing.T) {
	r := newRand(15)
	const eps = 1e-5
	for _, c := range rowCases {
		rows, n := c[0], c[1]
		x := randVec[T](r, rows*n, -3, 5)
		g := randVec[T](r, n, 0.5, 1.5)
		b := randVec[T](r, n, -1, 1)
		out := make([]T, len(x))
		LayerNorm(out, x, g, b, rows, n, eps)
		requireClose(t, refLayerNorm(to64(x), to64(g), to64(b), rows, n, eps), out, 10*tolOf[T](), fmt.Sprint(c))
	}
	// A large common offset must not destroy the variance.
	x := []T{10000, 10001, 10002, 10003}
	out := make([]T, 4)
	LayerNorm(out, x, []T{1, 1, 1, 1}, []T{0, 0, 0, 0}, 1, 4, 0)
	requireClose(t, refLayerNorm(to64(x), []float64{1, 1, 1, 1}, []float64{0, 0, 0, 0}, 1, 4, 0), out, tolOf[T](), "offset")
}

func TestLayerNorm(t *testing.T) { both(t, testLayerNorm[float32], testLayerNorm[float64]) }

func testEmbedding[T Float](t *testing.T) {
	r := newRand(16)
	const vocab, dim = 11, 6
	table := randVec[T](r, vocab*dim, -1, 1)
	ids := []int32{3, 0, 10, 3, 7}
	out := make([]T, len(ids)*dim)
	require.NoError(t, Embedding(out, table, ids, vocab, dim))
	for i, id := range ids {
		require.Equal(t, table[int(id)*dim:(int(id)+1)*dim], out[i*dim:(i+1)*dim])
	}

	dy := randVec[T](r, len(out), -1, 1)
	dtable := randVec[T](r, len(table), -1, 1) // must be zeroed
	require.NoError(t, EmbeddingGrad(dtable, dy, ids, vocab, dim))
	want := make([]float64, len(table))
	for i, id := range ids {
		for j := range dim {
			want[int(id)*dim+j] += float64(dy[i*dim+j])
		}
	}
	requireClose(t, want, dtable, tolOf[T](), "EmbeddingGrad")

	for _, bad := range []int32{-1, vocab, 1 << 30} {
		ids := []int32{1, 2, bad}
		before := append([]T(nil), out[:3*dim]...)
		err := Embedding(out[:3*dim], table, ids, vocab, dim)
		require.ErrorContains(t, err, fmt.Sprintf("id %d at position 2", bad))
		require.Equal(t, before, out[:3*dim], "out untouched on error")
		err = EmbeddingGrad(dtable, dy[:3*dim], ids, vocab, dim)
		require.ErrorContains(t, err, fmt.Sprintf("id %d at position 2", bad))
	}
	require.NoError(t, Embedding(out[:0], table, nil, vocab, dim))
}

func TestEmbedding(t *testing.T) { both(t, testEmbedding[float32], testEmbedding[float64]) }

func refCrossEntropy(x []float64, labels []int32, rows, vocab int) float64 {
	s := 0.0
	for r := range rows {
		p := refSoftmax(x[r*vocab:(r+1)*vocab], 1, vocab)
		s -= math.Log(p[labels[r]])
	}
	return s / float64(rows)
}

func testCrossEntropy[T Float](t *testing.T) {
	r := newRand(17)
	for _, c := range [][2]int{{1, 1}, {1, 5}, {4, 7}, {300, 50}} {
		rows, vocab := c[0], c[1]
		x := randVec[T](r, rows*vocab, -5, 5)
		labels := make([]int32, rows)
		for i := range labels {
			labels[i] = int32(r.IntN(vocab))
		}
		loss, err := CrossEntropy(x, labels, rows, vocab)
		require.NoError(t, err)
		requireClose(t, []float64{refCrossEntropy(to64(x), labels, rows, vocab)}, []T{loss}, tolOf[T](), fmt.Sprint(c))

		dl := make([]T, len(x))
		require.NoError(t, CrossEntropyGrad(dl, x, labels, T(2.5), rows, vocab))
		want := refSoftmax(to64(x), rows, vocab)
		for i := range rows {
			want[i*vocab+int(labels[i])]--
		}
		for i := range want {
			want[i] *= 2.5 / float64(rows)
		}
		requireClose(t, want, dl, tolOf[T](), fmt.Sprint("grad ", c))
		// In place over the logits (the lowering's overwriteLastReads):
		// the same gradient, bit for bit.
		inPlace := slices.Clone(x)
		require.NoError(t, CrossEntropyGrad(inPlace, inPlace, labels, T(2.5), rows, vocab))
		require.Equal(t, dl, inPlace, "in place, %v", c)
	}

	// Huge logits must not overflow the log-sum-exp.
	loss, err := CrossEntropy([]T{1e4, 0, -1e4}, []int32{1}, 1, 3)
	require.NoError(t, err)
	require.InDelta(t, 1e4, float64(loss), 1e-3)

	loss, err = CrossEntropy([]T{}, nil, 0, 3)
	require.NoError(t, err)
	require.Zero(t, loss)

	x := []T{1, 2, 3, 4, 5, 6}
	_, err = CrossEntropy(x, []int32{0, 3}, 2, 3)
	require.ErrorContains(t, err, "label 3 at position 1")
	err = CrossEntropyGrad(make([]T, 6), x, []int32{-2, 0}, 1, 2, 3)
	require.ErrorContains(t, err, "label -2 at position 0")
}

func TestCrossEntropy(t *testing.T) { both(t, testCrossEntropy[float32], testCrossEntropy[float64]) }

func testSumSquares[T Float](t *testing.T) {
	r := newRand(18)
	for _, n := range []int{0, 1, 17, 100000} {
		x := randVec[T](r, n, -2, 2)
		want := 0.0
		for _, v := range x {
			want += float64(v) * float64(v)
		}
		requireClose(t, []float64{want}, []float64{SumSquares(x)}, 1e-12, fmt.Sprint(n))
	}
}

func TestSumSquares(t *testing.T) { both(t, testSumSquares[float32], testSumSquares[float64]) }

func TestRowKernelsBadLength(t *testing.T) {
	require.Panics(t, func() { Softmax(make([]float32, 5), make([]float32, 6), 2, 3) })
	require.Panics(t, func() {
		LayerNorm(make([]float32, 6), make([]float32, 6), make([]float32, 2), make([]float32, 3), 2, 3, 1e-5)
	})
	require.Panics(t, func() { CausalMask(make([]float32, 5), make([]float32, 5), 1, 2, 3, 0) })
	require.Panics(t, func() { _, _ = CrossEntropy(make([]float32, 6), make([]int32, 1), 2, 3) })
}

// BenchmarkCrossEntropy is the loss and its gradient on a real
// vocabulary (Llama 2's 32,000) at 256 rows, float32: the exponentials
// dominate.
func BenchmarkCrossEntropy(b *testing.B) {
	const rows, vocab = 256, 32000
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, rows*vocab)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 3)
	}
	labels := make([]int32, rows)
	for i := range labels {
		labels[i] = int32(r.IntN(vocab))
	}
	d := make([]float32, len(x))
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		if _, err := CrossEntropy(x, labels, rows, vocab); err != nil {
			b.Fatal(err)
		}
		if err := CrossEntropyGrad(d, x, labels, 1, rows, vocab); err != nil {
			b.Fatal(err)
		}
	}
}

// ExpForFloat32 is e^x to 5e-11 relative over the exponents a softmax
// row takes (x ≤ 0, down to where float32 has nothing), 0 below, and
// NaN for NaN.
func TestExpForFloat32(t *testing.T) {
	worst := 0.0
	for i := range 200000 {
		x := -104 * float64(i) / 200000
		want := math.Exp(x)
		got := ExpForFloat32(x)
		worst = max(worst, math.Abs(got/want-1))
	}
	require.Less(t, worst, 5e-11)
	require.Zero(t, ExpForFloat32(-200))
	require.True(t, math.IsNaN(ExpForFloat32(math.NaN())))
	require.Equal(t, 1.0, ExpForFloat32(0))
}
