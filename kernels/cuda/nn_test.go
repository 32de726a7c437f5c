package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
)

// rowShapes are (rows, n): single elements, rows shorter and longer than
// every block size, and more rows than the looping grid has blocks.
var rowShapes = [][2]int{{1, 1}, {5, 37}, {3, 1000}, {7, 300}, {2, 2051}}

// forRows runs body for every row shape, block size and grid (one block
// per row, and a grid of 2 that must loop over the rows).
func forRows(t *testing.T, body func(t *testing.T, rows, n int, grid, block uint32)) {
	for _, s := range rowShapes {
		for _, block := range blockSizes {
			for _, grid := range []uint32{uint32(s[0]), 2} {
				t.Run(fmt.Sprintf("r%d_n%d_b%d_g%d", s[0], s[1], block, grid), func(t *testing.T) { body(t, s[0], s[1], grid, block) })
			}
		}
	}
}

// softmaxBound: exp runs in float on x − max, which is rounded to float
// first, so an element's relative error grows with |x − max| (exp's
// condition number), plus a few roundings.
func softmaxBound(x []float32, rows, n int, want []float32) []float64 {
	b := make([]float64, len(x))
	for r := range rows {
		m := math.Inf(-1)
		for _, v := range x[r*n : (r+1)*n] {
			m = math.Max(m, float64(v))
		}
		for j := r * n; j < (r+1)*n; j++ {
			if math.IsInf(m, -1) || math.IsInf(float64(x[j]), -1) { // masked: exactly zero
				continue
			}
			b[j] = (6+math.Abs(float64(x[j])-m))/(1<<24)*math.Abs(float64(want[j])) + 1e-38
		}
	}
	return b
}

func TestSoftmax(t *testing.T) {
	forRows(t, func(t *testing.T, rows, n int, grid, block uint32) {
		r := newRand(uint64(rows*n) + 1)
		x := randNorm(r, rows*n, 4)
		if n > 3 {
			for j := range n { // row 0 fully masked, as a causal mask can leave it
				x[j] = float32(math.Inf(-1))
			}
			x[n+1] = float32(math.Inf(-1))
		}
		want, got := make([]float32, rows*n), out(rows*n)
		kcpu.Softmax(want, x, rows, n)
		launch(t, "gc_softmax", grid, block, got, x, rows, n)
		requireWithin(t, want, got, softmaxBound(x, rows, n, want), "gc_softmax")

		// In place.
		inPlace := out(rows * n)
		copy(inPlace, x)
		launch(t, "gc_softmax", grid, block, inPlace, inPlace, rows, n)
		requireBits(t, got, inPlace, "gc_softmax in place")

		y, dy := want, randNorm(r, rows*n, 1)
		wantDx, gotDx := make([]float32, rows*n), out(rows*n)
		kcpu.SoftmaxGrad(wantDx, y, dy, rows, n)
		launch(t, "gc_softmax_grad", grid, block, gotDx, y, dy, rows, n)
		bound := make([]float64, rows*n)
		for i := range bound {
			bound[i] = ulp2*math.Abs(float64(wantDx[i])) + 1e-12*math.Abs(float64(y[i]))
		}
		requireWithin(t, wantDx, gotDx, bound, "gc_softmax_grad")
	})
}

func TestCausalMask(t *testing.T) {
	for _, c := range [][3]int{{2, 5, 5}, {3, 4, 9}, {1, 33, 33}, {2, 3, 1}} {
		batch, s, tt := c[0], c[1], c[2]
		for _, fill := range []float32{float32(math.Inf(-1)), 0} {
			n := batch * s * tt
			x := randNorm(newRand(uint64(n)), n, 1)
			want := make([]float32, n)
			kcpu.CausalMask(want, x, batch, s, tt, fill)
			for _, block := range blockSizes {
				got := out(n)
				launch(t, "gc_causal_mask", 2, block, got, x, batch*s, s, tt, fill)
				requireBits(t, want, got, fmt.Sprintf("gc_causal_mask %v fill %v", c, fill))
			}
		}
	}
}

func TestLayerNorm(t *testing.T) {
	const eps = 1e-5
	forRows(t, func(t *testing.T, rows, n int, grid, block uint32) {
		r := newRand(uint64(rows*n) + 2)
		x := randNorm(r, rows*n, 2)
		for j := range n { // a row with a large mean: two passes keep the variance
			x[j] += 1000
		}
		gamma, beta, dy := randNorm(r, n, 1), randNorm(r, n, 1), randNorm(r, rows*n, 1)

		want, got := make([]float32, rows*n), out(rows*n)
		kcpu.LayerNorm(want, x, gamma, beta, rows, n, eps)
		launch(t, "gc_layernorm", grid, block, got, x, gamma, beta, rows, n, float32(eps))
		requireClose(t, want, got, ulp2, 1e-6, "gc_layernorm")

		want, got = make([]float32, rows*n), out(rows*n)
		kcpu.LayerNormGradX(want, x, gamma, dy, rows, n, eps)
		launch(t, "gc_layernorm_grad_x", grid, block, got, x, gamma, dy, rows, n, float32(eps))
		requireClose(t, want, got, ulp2, 1e-6, "gc_layernorm_grad_x")

		stats := make([]float32, 4*rows)
		launch(t, "gc_layernorm_stats", grid, block, stats, x, rows, n, float32(eps))
		want, got = make([]float32, n), out(n)
		kcpu.LayerNormGradGamma(want, x, dy, rows, n, eps)
		launch(t, "gc_layernorm_grad_gamma", 2, block, got, x, dy, stats, rows, n)
		requireClose(t, want, got, ulp2, 1e-6, "gc_layernorm_grad_gamma")
	})
}

func TestEmbedding(t *testing.T) {
	for _, c := range [][3]int{{50, 37, 300}, {7, 300, 11}, {1, 1, 1}, {300, 5, 97}} {
		vocab, dim, count := c[0], c[1], c[2]
		r := newRand(uint64(vocab*dim + count))
		table := randNorm(r, vocab*dim, 1)
		ids := make([]int32, count)
		for i := range ids {
			ids[i] = int32(r.IntN(vocab))
			if i%3 == 0 { // repeats, so the gradient must add in order
				ids[i] = ids[0]
			}
		}
		dy := randNorm(r, count*dim, 1)
		for _, block := range blockSizes {
			t.Run(fmt.Sprintf("v%d_d%d_c%d_b%d", vocab, dim, count, block), func(t *testing.T) {
				want, got := make([]float32, count*dim), out(count*dim)
				require.NoError(t, kcpu.Embedding(want, table, ids, vocab, dim))
				status := []int32{0}
				launch(t, "gc_embedding", 3, block, got, status, table, ids, count, vocab, dim)
				requireBits(t, want, got, "gc_embedding")
				require.Zero(t, status[0])

				wantG, gotG := make([]float32, vocab*dim), out(vocab*dim)
				require.NoError(t, kcpu.EmbeddingGrad(wantG, dy, ids, vocab, dim))
				for _, grid := range []uint32{uint32(min(vocab, 50)), 3} {
					embeddingGrad(t, grid, block, gotG, status, ids, dy, vocab, dim, 0, vocab)
					requireBits(t, wantG, gotG, "gc_embedding_grad")
				}
				require.Zero(t, status[0])

				// Vocab-parallel gradient: each shard's rows, bit for bit
				// the CPU kernel's, and together the whole gradient.
				for p, lo := 0, 0; lo < vocab; p++ {
					hi := min(lo+(vocab+2)/3, vocab)
					wantS, gotS := make([]float32, (hi-lo)*dim), out((hi-lo)*dim)
					require.NoError(t, kcpu.EmbeddingGradRange(wantS, dy, ids, lo, hi-lo, dim, vocab))
					require.Equal(t, wantG[lo*dim:hi*dim], wantS, "shard %d of the CPU gradient", p)
					embeddingGrad(t, uint32(min(hi-lo, 50)), block, gotS, status, ids, dy, hi-lo, dim, lo, vocab)
					requireBits(t, wantS, gotS, fmt.Sprintf("gc_embedding_grad rows [%d,%d)", lo, hi))
					lo = hi
				}
				require.Zero(t, status[0])

				// Vocab-parallel: the shards' lookups add up to the whole.
				parts := min(3, vocab)
				rowsPer := (vocab + parts - 1) / parts
				sum := make([]float32, count*dim)
				for p := range parts {
					lo, hi := p*rowsPer, min((p+1)*rowsPer, vocab)
					shard := table[lo*dim : hi*dim]
					wantR, gotR := make([]float32, count*dim), out(count*dim)
					kcpu.EmbeddingRange(wantR, shard, ids, lo, hi-lo, dim)
					launch(t, "gc_embedding_range", 2, block, gotR, shard, ids, count, lo, hi-lo, dim)
					requireBits(t, wantR, gotR, "gc_embedding_range")
					kcpu.Add(sum, sum, gotR)
				}
				requireBits(t, want, sum, "sum of vocab-parallel lookups")
			})
		}
	}
}

// embeddingGrad runs the embedding gradient as the runtime does, five
// launches over a workspace of rows + len(ids) ints: clear, count (and
// validate), scan in one block, place, then one block per row. The
// workspace starts as junk, as scratch memory does.
func embeddingGrad(t *testing.T, grid, block uint32, dtable []float32, status, ids []int32, dy []float32, rows, dim, offset, total int) {
	t.Helper()
	count := len(ids)
	index, list := make([]int32, max(rows, 1)), make([]int32, max(count, 1))
	for i := range index {
		index[i] = -7
	}
	for i := range list {
		list[i] = -7
	}
	launch(t, "gc_embedding_grad_clear", grid, block, index, rows)
	launch(t, "gc_embedding_grad_count", grid, block, index, status, ids, count, rows, offset, total)
	launch(t, "gc_embedding_grad_scan", 2, block, index, rows)
	launch(t, "gc_embedding_grad_place", grid, block, list, index, ids, count, rows, offset)
	launch(t, "gc_embedding_grad", grid, block, dtable, index, list, ids, dy, count, rows, dim, offset)
}

// Rows with many positions: one past what a block sorts in shared memory
// (2048; it scans the ids in order instead), one of exactly 2048, and
// rows with one position or none. 300 counts cross the scan's rounds
// (8 counts per thread). Bit for bit the CPU's serial sums.
func TestEmbeddingGradLongRows(t *testing.T) {
	const vocab, dim, count = 300, 3, 4200
	r := newRand(99)
	ids := make([]int32, count)
	for i := range ids {
		switch {
		case i < 2049:
			ids[i] = 7
		case i < 2049+2048:
			ids[i] = 250
		default:
			ids[i] = int32(r.IntN(vocab))
		}
	}
	r.Shuffle(count, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	dy := randNorm(r, count*dim, 1)
	want := make([]float32, vocab*dim)
	require.NoError(t, kcpu.EmbeddingGrad(want, dy, ids, vocab, dim))
	for _, block := range []uint32{32, 96} {
		got, status := out(vocab*dim), []int32{0}
		embeddingGrad(t, 64, block, got, status, ids, dy, vocab, dim, 0, vocab)
		requireBits(t, want, got, fmt.Sprintf("gc_embedding_grad block %d", block))
		require.Zero(t, status[0])
	}
	// A device's rows [200, 300) of the table, with the row of 2048.
	wantS, gotS, status := make([]float32, 100*dim), out(100*dim), []int32{0}
	require.NoError(t, kcpu.EmbeddingGradRange(wantS, dy, ids, 200, 100, dim, vocab))
	embeddingGrad(t, 16, 32, gotS, status, ids, dy, 100, dim, 200, vocab)
	requireBits(t, wantS, gotS, "gc_embedding_grad rows [200, 300)")
	require.Zero(t, status[0])
}

// A bad id is flagged, never read out of bounds.
func TestEmbeddingBadIDs(t *testing.T) {
	vocab, dim := 10, 4
	table := randNorm(newRand(1), vocab*dim, 1)
	ids := []int32{1, 10, -1, 3}
	status := []int32{0}
	got := out(len(ids) * dim)
	launch(t, "gc_embedding", 1, 32, got, status, table, ids, len(ids), vocab, dim)
	require.Equal(t, int32(1), status[0])
	require.Equal(t, table[dim:2*dim], got[:dim])
	require.Equal(t, make([]float32, dim), got[dim:2*dim])

	status[0] = 0
	dt := out(vocab * dim)
	dy := randNorm(newRand(2), len(ids)*dim, 1)
	embeddingGrad(t, 4, 32, dt, status, ids, dy, vocab, dim, 0, vocab)
	require.Equal(t, int32(1), status[0])
	// The bad ids add nothing; the good ones their rows.
	want := make([]float32, vocab*dim)
	require.NoError(t, kcpu.EmbeddingGrad(want, dy[:dim], ids[:1], vocab, dim))
	for i, v := range dy[3*dim : 4*dim] {
		want[3*dim+i] = v
	}
	requireBits(t, want, dt, "gc_embedding_grad with bad ids")

	status[0] = 0
	loss := make([]float32, 2*2)
	launch(t, "gc_cross_entropy_rows", 2, 32, loss, status, table[:2*vocab], []int32{0, int32(vocab)}, 2, vocab)
	require.Equal(t, int32(1), status[0])
}

// ceBound allows the float exp of x − lse its condition number, plus the
// rounding of (p − 1)·scale at the label.
func ceGradBound(logits []float32, rows, vocab int, want []float32, scale float64) []float64 {
	b := make([]float64, len(want))
	for r := range rows {
		x := logits[r*vocab : (r+1)*vocab]
		m := math.Inf(-1)
		for _, v := range x {
			m = math.Max(m, float64(v))
		}
		s := 0.0
		for _, v := range x {
			s += math.Exp(float64(v) - m)
		}
		lse := m + math.Log(s)
		for j, v := range x {
			i := r*vocab + j
			b[i] = (8+math.Abs(float64(v)-lse))/(1<<24)*math.Abs(float64(want[i])) + math.Abs(scale)/(1<<23)
		}
	}
	return b
}

func TestCrossEntropy(t *testing.T) {
	forRows(t, func(t *testing.T, rows, vocab int, grid, block uint32) {
		r := newRand(uint64(rows*vocab) + 3)
		logits := randNorm(r, rows*vocab, 3)
		labels := make([]int32, rows)
		for i := range labels {
			labels[i] = int32(r.IntN(vocab))
		}
		want, err := kcpu.CrossEntropy(logits, labels, rows, vocab)
		require.NoError(t, err)
		status := []int32{0}
		perRow := make([]float32, 2*rows)
		launch(t, "gc_cross_entropy_rows", grid, block, perRow, status, logits, labels, rows, vocab)
		got := out(1)
		launch(t, "gc_finish_sum", 1, block, got, perRow, rows, rows)
		require.Zero(t, status[0])
		// The loss is a mean of log-sum-exps whose exps ran in float.
		requireClose(t, []float32{want}, got, 2e-6, 1e-6, "cross-entropy loss")

		dloss := []float32{0.75}
		wantG, gotG := make([]float32, rows*vocab), out(rows*vocab)
		require.NoError(t, kcpu.CrossEntropyGrad(wantG, logits, labels, dloss[0], rows, vocab))
		launch(t, "gc_cross_entropy_grad", grid, block, gotG, status, logits, labels, dloss, rows, vocab)
		requireWithin(t, wantG, gotG, ceGradBound(logits, rows, vocab, wantG, float64(dloss[0])/float64(rows)), "gc_cross_entropy_grad")
		require.Zero(t, status[0])
		// In place over the logits (the lowering writes the loss's
		// gradient over them where it reads them last): the same bits.
		inPlace := append([]float32(nil), logits...)
		launch(t, "gc_cross_entropy_grad", grid, block, inPlace, status, inPlace, labels, dloss, rows, vocab)
		require.Equal(t, gotG, inPlace, "gc_cross_entropy_grad in place")
	})
}

// The vocab-parallel pieces, run for each of parts devices with the
// collectives done here in Go (an all-gather of row maxima, an all-reduce
// of the sums in device order), give the full-vocabulary loss and
// gradient.
func TestVocabParallelCrossEntropy(t *testing.T) {
	for _, parts := range []int{1, 2, 3} {
		for _, s := range [][2]int{{5, 37}, {3, 1000}, {2, 96}} {
			rows, local := s[0], s[1]
			vocab := parts * local
			for _, block := range []uint32{32, 256} {
				t.Run(fmt.Sprintf("p%d_r%d_v%d_b%d", parts, rows, vocab, block), func(t *testing.T) {
					r := newRand(uint64(parts*rows*vocab) + 4)
					logits := randNorm(r, rows*vocab, 3)
					labels := make([]int32, rows)
					for i := range labels {
						labels[i] = int32(r.IntN(vocab))
					}
					shard := func(p int) []float32 { // device p's columns, row-major
						o := make([]float32, rows*local)
						for i := range rows {
							copy(o[i*local:(i+1)*local], logits[i*vocab+p*local:i*vocab+(p+1)*local])
						}
						return o
					}
					maxes := make([]float32, parts*rows) // all-gathered
					for p := range parts {
						launch(t, "gc_vocab_ce_max", uint32(rows), block, maxes[p*rows:(p+1)*rows], shard(p), rows, local)
					}
					sums := make([]float32, 2*rows) // all-reduced
					gmax := make([]float32, rows)
					for p := range parts {
						part := make([]float32, 2*rows)
						launch(t, "gc_vocab_ce_sums", 2, block, part, gmax, shard(p), labels, maxes, rows, local, p*local, parts)
						kcpu.Add(sums, sums, part)
					}
					want, err := kcpu.CrossEntropy(logits, labels, rows, vocab)
					require.NoError(t, err)
					got := out(1)
					launch(t, "gc_vocab_ce_loss", 1, block, got, sums, gmax, rows)
					requireClose(t, []float32{want}, got, 2e-6, 1e-6, "vocab-parallel loss")

					dloss := []float32{1.5}
					wantG := make([]float32, rows*vocab)
					require.NoError(t, kcpu.CrossEntropyGrad(wantG, logits, labels, dloss[0], rows, vocab))
					bound := ceGradBound(logits, rows, vocab, wantG, float64(dloss[0])/float64(rows))
					for p := range parts {
						gotG := out(rows * local)
						launch(t, "gc_vocab_ce_grad", 3, block, gotG, shard(p), labels, gmax, sums, dloss, rows, local, p*local)
						for i := range rows {
							for j := range local {
								g, w := float64(gotG[i*local+j]), float64(wantG[i*vocab+p*local+j])
								// The sum of exps crossed devices as float: one more rounding.
								if d := math.Abs(g - w); d > 2*bound[i*vocab+p*local+j] {
									t.Fatalf("device %d row %d col %d: %v, want %v", p, i, j, g, w)
								}
							}
						}
						checkGuard(t, gotG)
					}
				})
			}
		}
	}
}

// rmsScales are the rows' 1/√(mean(x²) + eps) and mean|g·x̂| (g = dy·γ),
// in float64, for the RMSNorm bounds.
func rmsScales(x, gamma, dy []float32, rows, n int, eps float64) (scale, meanAbs []float64) {
	scale, meanAbs = make([]float64, rows), make([]float64, rows)
	for r := range rows {
		ss := 0.0
		for _, v := range x[r*n : (r+1)*n] {
			ss += float64(v) * float64(v)
		}
		scale[r] = 1 / math.Sqrt(ss/float64(n)+eps)
		for j := range n {
			meanAbs[r] += math.Abs(float64(dy[r*n+j]) * float64(gamma[j]) * float64(x[r*n+j]) * scale[r])
		}
		meanAbs[r] /= float64(n)
	}
	return scale, meanAbs
}

// The kernels evaluate the CPU kernels' float64 expressions in the same
// order, except for the sums over a row (a block reduction against a
// serial loop: they differ by at most n·2⁻⁵² of the sum of the terms'
// magnitudes) and the γ gradient's scale (a float pair, 48 bits). Both
// sides round to float32 once, so outside cancellation they differ by at
// most one ulp where they straddle a rounding boundary: 2⁻²² relative
// has twice that. The input gradient subtracts x̂·mean(g·x̂) from g, which
// can cancel, so its bound adds n·2⁻⁵⁰ of the terms' magnitude r·(|g| +
// |x̂|·mean|g·x̂|); the γ gradient adds rows over positive and negative
// terms, so its bound adds 2⁻³⁸ of Σ|dy·x̂| (the scale's 2⁻⁴¹ and more).
// eps is a float32 on both sides here: the backend's rounding of the
// attribute to float is a change of input, not an error of the kernel.
func TestRMSNorm(t *testing.T) {
	const eps32 = float32(1e-5)
	eps := float64(eps32)
	forRows(t, func(t *testing.T, rows, n int, grid, block uint32) {
		r := newRand(uint64(rows*n) + 12)
		x := randNorm(r, rows*n, 2)
		for j := range n { // a large row, and one whose mean square is below eps
			x[j] *= 1000
			if rows > 1 {
				x[n+j] *= 1e-3
			}
		}
		gamma, dy := randNorm(r, n, 1), randNorm(r, rows*n, 1)
		scale, meanAbs := rmsScales(x, gamma, dy, rows, n, eps)

		want, got := make([]float32, rows*n), out(rows*n)
		kcpu.RMSNorm(want, x, gamma, rows, n, eps)
		launch(t, "gc_rmsnorm", grid, block, got, x, gamma, rows, n, eps32)
		requireClose(t, want, got, ulp2, 1e-38, "gc_rmsnorm")

		inPlace := append(out(rows * n)[:0], x...)
		launch(t, "gc_rmsnorm", grid, block, inPlace, inPlace, gamma, rows, n, eps32)
		requireBits(t, got, inPlace, "gc_rmsnorm in place")

		want, got = make([]float32, rows*n), out(rows*n)
		kcpu.RMSNormGradX(want, x, gamma, dy, rows, n, eps)
		launch(t, "gc_rmsnorm_grad_x", grid, block, got, x, gamma, dy, rows, n, eps32)
		bound := make([]float64, rows*n)
		for i := range bound {
			row, j := i/n, i%n
			g, xh := math.Abs(float64(dy[i])*float64(gamma[j])), math.Abs(float64(x[i])*scale[row])
			terms := scale[row] * (g + xh*meanAbs[row])
			bound[i] = ulp2*math.Abs(float64(want[i])) + float64(n)/(1<<50)*terms + 1e-38
		}
		requireWithin(t, want, got, bound, "gc_rmsnorm_grad_x")

		inPlace = append(out(rows * n)[:0], dy...)
		launch(t, "gc_rmsnorm_grad_x", grid, block, inPlace, x, gamma, inPlace, rows, n, eps32)
		requireBits(t, got, inPlace, "gc_rmsnorm_grad_x in place of dy")

		stats := make([]float32, 2*rows)
		launch(t, "gc_rmsnorm_stats", grid, block, stats, x, rows, n, eps32)
		for row := range rows {
			s := float64(stats[2*row]) + float64(stats[2*row+1])
			require.InEpsilon(t, scale[row], s, 1.0/(1<<40), "row %d scale", row)
		}
		want, got = make([]float32, n), out(n)
		kcpu.RMSNormGradGamma(want, x, dy, rows, n, eps)
		launch(t, "gc_rmsnorm_grad_gamma", 2, block, got, x, dy, stats, rows, n)
		requireWithin(t, want, got, rmsGammaBound(want, x, dy, scale, rows, n), "gc_rmsnorm_grad_gamma")
	})
}

// The kernel computes the CPU kernel's angle, p·theta^(−2i/d), and its
// sine and cosine in double, from different math libraries (CUDA's or
// glibc's against Go's): pow and sin/cos are within a few double ulps, so
// the angle is within |angle|·2⁻⁵¹ and sin and cos within
// (1 + |angle|)·2⁻⁵⁰. The rotation is then within (|a| + |b|) times that
// before the single rounding to float32, which may differ by an ulp
// (2⁻²² relative has twice that). The bound allows 2⁻⁴⁸.
func TestRoPE(t *testing.T) {
	shapes := [][3]int{{1, 1, 2}, {2, 5, 8}, {3, 7, 64}, {1, 300, 128}, {2, 33, 6}, {1, 4096, 4}}
	for _, s := range shapes {
		batch, positions, d := s[0], s[1], s[2]
		rows, half := batch*positions, d/2
		for _, theta := range []float64{10000, 500000} {
			for _, inverse := range []bool{false, true} {
				inv := 0
				if inverse {
					inv = 1
				}
				r := newRand(uint64(rows*d) + uint64(theta) + uint64(inv))
				x := randNorm(r, rows*d, 1)
				// Context parallelism's chunks (at the larger base): the
				// rows' positions in two runs, from 7 and from
				// 7·positions + 3 halfway.
				first, brk, second := 0, positions, 0
				var at []int
				if positions > 1 && theta == 500000 {
					first, brk, second = 7, positions/2, 7*positions+3
					for p := range positions {
						if p < brk {
							at = append(at, first+p)
						} else {
							at = append(at, second+p-brk)
						}
					}
				}
				want := make([]float32, rows*d)
				kcpu.RoPEWith(want, x, batch, kcpu.NewRoPETableAt(at, positions, d, theta), inverse)
				bound := make([]float64, rows*d)
				for row := range rows {
					p := row % positions
					if at != nil {
						p = at[p]
					}
					for i := range half {
						angle := kcpu.RoPEAngle(p, i, d, theta)
						k := (math.Abs(float64(x[row*d+i])) + math.Abs(float64(x[row*d+i+half]))) * (1 + angle) / (1 << 48)
						for _, e := range []int{row*d + i, row*d + i + half} {
							bound[e] = ulp2*math.Abs(float64(want[e])) + k + 1e-38
						}
					}
				}
				for _, block := range blockSizes {
					for _, grid := range grids(rows*half, block) {
						t.Run(fmt.Sprintf("b%d_p%d_d%d_theta%g_inv%d_b%d_g%d", batch, positions, d, theta, inv, block, grid), func(t *testing.T) {
							got := out(rows * d)
							launch(t, "gc_rope", grid, block, got, x, rows, positions, first, brk, second, half, float32(theta), inv)
							requireWithin(t, want, got, bound, "gc_rope")
						})
					}
				}
			}
		}
	}
}

// The γ gradients are column reductions over rows: rows across warps and
// a block's rows (33, 257, 1025) and tiles of 8 and of 32 columns with an
// overhang (40). Any grid gives the same bits.
func TestNormGammaGradColumns(t *testing.T) {
	const eps32 = float32(1e-5)
	eps := float64(eps32)
	for _, s := range [][2]int{{1025, 5}, {257, 40}, {33, 40}} {
		rows, n := s[0], s[1]
		r := newRand(uint64(rows*n) + 21)
		x, dy := randNorm(r, rows*n, 2), randNorm(r, rows*n, 1)
		for j := range n {
			x[j] += 1000 // a row with a large mean
		}
		// The statistics are row kernels, tested above: one warp each.
		stats, rs := make([]float32, 4*rows), make([]float32, 2*rows)
		launch(t, "gc_layernorm_stats", 7, 32, stats, x, rows, n, eps32)
		launch(t, "gc_rmsnorm_stats", 7, 32, rs, x, rows, n, eps32)
		for _, block := range []uint32{32, 256} {
			t.Run(fmt.Sprintf("r%d_n%d_b%d", rows, n, block), func(t *testing.T) {
				want, got := make([]float32, n), out(n)
				kcpu.LayerNormGradGamma(want, x, dy, rows, n, eps)
				launch(t, "gc_layernorm_grad_gamma", 3, block, got, x, dy, stats, rows, n)
				requireClose(t, want, got, ulp2, 1e-6, "gc_layernorm_grad_gamma")
				again := out(n)
				launch(t, "gc_layernorm_grad_gamma", 1, block, again, x, dy, stats, rows, n)
				requireBits(t, got, again, "gc_layernorm_grad_gamma on one block")

				scale, _ := rmsScales(x, make([]float32, n), dy, rows, n, eps)
				want, got = make([]float32, n), out(n)
				kcpu.RMSNormGradGamma(want, x, dy, rows, n, eps)
				launch(t, "gc_rmsnorm_grad_gamma", 3, block, got, x, dy, rs, rows, n)
				requireWithin(t, want, got, rmsGammaBound(want, x, dy, scale, rows, n), "gc_rmsnorm_grad_gamma")
			})
		}
	}
}

// Rows longer than a block holds in registers are read in sweeps: the
// softmax statistics move from sweep to sweep (a rising row), skip sweeps
// that are all −Inf (masked at the start or the end), and LayerNorm's
// merges and shifted sums meet a row whose first element is far from its
// mean. Block 32 streams these rows of 1100 (16·32 < 1100), block 96
// keeps them in registers; both agree with the CPU kernels.
func TestRowSweeps(t *testing.T) {
	const rows, n = 4, 1100
	r := newRand(5)
	x := randNorm(r, rows*n, 3)
	for j := range n {
		switch {
		case j < 600:
			x[j] = float32(math.Inf(-1)) // row 0: masked start
		case j >= 500:
			x[n+j] = float32(math.Inf(-1)) // row 1: masked end
		}
		x[2*n+j] = float32(j) / 64 // row 2: rising, the max moves every sweep
	}
	x[3*n] = 40 // row 3: its first element far above the rest
	labels := []int32{700, 3, 1099, 0}
	for _, block := range []uint32{32, 96} {
		t.Run(fmt.Sprintf("b%d", block), func(t *testing.T) {
			want, got := make([]float32, rows*n), out(rows*n)
			kcpu.Softmax(want, x, rows, n)
			launch(t, "gc_softmax", 2, block, got, x, rows, n)
			requireWithin(t, want, got, softmaxBound(x, rows, n, want), "gc_softmax")

			wantLoss, err := kcpu.CrossEntropy(x, labels, rows, n)
			require.NoError(t, err)
			status, perRow, loss := []int32{0}, make([]float32, 2*rows), out(1)
			launch(t, "gc_cross_entropy_rows", 3, block, perRow, status, x, labels, rows, n)
			launch(t, "gc_finish_sum", 1, block, loss, perRow, rows, rows)
			requireClose(t, []float32{wantLoss}, loss, 2e-6, 1e-6, "cross-entropy loss")
			dloss := []float32{0.5}
			wantG, gotG := make([]float32, rows*n), out(rows*n)
			require.NoError(t, kcpu.CrossEntropyGrad(wantG, x, labels, dloss[0], rows, n))
			launch(t, "gc_cross_entropy_grad", 3, block, gotG, status, x, labels, dloss, rows, n)
			bound := ceGradBound(x, rows, n, wantG, float64(dloss[0])/rows)
			for i, v := range x {
				if math.IsInf(float64(v), -1) {
					bound[i] = 0 // exactly 0 (the bound's ∞·0 is NaN)
				}
			}
			requireWithin(t, wantG, gotG, bound, "gc_cross_entropy_grad")
			require.Zero(t, status[0])

			// LayerNorm on the finite rows (2 and 3), shifted to a large mean.
			const eps = 1e-5
			ln := append([]float32(nil), x[2*n:]...)
			for i := range ln {
				ln[i] += 1000
			}
			gamma, beta, dy := randNorm(r, n, 1), randNorm(r, n, 1), randNorm(r, 2*n, 1)
			wantL, gotL := make([]float32, 2*n), out(2*n)
			kcpu.LayerNorm(wantL, ln, gamma, beta, 2, n, eps)
			launch(t, "gc_layernorm", 2, block, gotL, ln, gamma, beta, 2, n, float32(eps))
			requireClose(t, wantL, gotL, ulp2, 1e-6, "gc_layernorm")
			wantL, gotL = make([]float32, 2*n), out(2*n)
			kcpu.LayerNormGradX(wantL, ln, gamma, dy, 2, n, eps)
			launch(t, "gc_layernorm_grad_x", 2, block, gotL, ln, gamma, dy, 2, n, float32(eps))
			requireClose(t, wantL, gotL, ulp2, 1e-6, "gc_layernorm_grad_x")
			inPlace := append(out(2 * n)[:0], dy...)
			launch(t, "gc_layernorm_grad_x", 2, block, inPlace, ln, gamma, inPlace, 2, n, float32(eps))
			requireBits(t, gotL, inPlace, "gc_layernorm_grad_x in place of dy")
		})
	}
}

// rmsGammaBound is how far gc_rmsnorm_grad_gamma may be from the CPU's
// dγ: two ulps of the result plus 2⁻³⁸ of the column's absolute terms
// (the sums' orders differ).
func rmsGammaBound(want, x, dy []float32, scale []float64, rows, n int) []float64 {
	bound := make([]float64, n)
	for j := range n {
		sum := 0.0
		for row := range rows {
			sum += math.Abs(float64(dy[row*n+j]) * float64(x[row*n+j]) * scale[row])
		}
		bound[j] = ulp2*math.Abs(float64(want[j])) + sum/(1<<38) + 1e-38
	}
	return bound
}
