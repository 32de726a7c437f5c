package cpu

import (
	"fmt"
	"math"
	"unsafe"

	"gonum.org/v1/gonum/blas"
)

// Fused attention, FlashAttention-2's algorithm (Dao 2023) on the CPU:
// out = softmax(scale·q·kᵀ [causal-masked])·v without ever holding the
// [sq, sk] scores. Each (batch, head) is one task of ParallelFor; inside
// it the queries are taken a block at a time and the keys and values of
// one key block are visited by every row of the query block while they
// are in cache, each row keeping a running maximum, a running sum of
// exponentials and an accumulator of p·v rescaled whenever the maximum
// grows (the online softmax). Only a [block, block] tile of scores exists
// at a time. Like the other kernels of the package they compute in
// float64 and round once: the blocks are widened once and multiplied by
// gonum's dgemm, serial at these sizes, so a task always sums in the same
// order and results do not depend on how the work is split. That is the
// float64 path; float32 (and types derived from it, all that the runtime
// runs below float64) takes attention_f32.go's kernels, which keep the
// blocks in float32 and multiply them with the packed GEMM's micro-kernel,
// several times faster. The internal functions below hand over to them
// after checking the dims when told to (fast; see attPlan).
//
// The backward splits into the ops of the IR (ir/attention.go): the
// statistics pass (log-sum-exp and D = Σ dout·out per query row), then
// dq per (batch, query head), and dk and dv per (batch, k/v head), each
// recomputing the probabilities p = exp(scale·q·k − lse) block by block.
// dk and dv sum over the query heads that share their k/v head inside
// one task, so grouped-query attention needs no atomic or ordered
// reduction.

// Block sizes: attBlockQ query rows share each visit of attBlockK keys.
// The float32 kernels (attention_f32.go) take twice the query rows: each
// key block is then transposed for the micro-kernel half as often, which
// measured 10–15 % faster at sequence 1024 and in the forward at 128;
// their scratch stays near 200 KiB per worker.
const (
	attBlockQ   = 64
	attBlockK   = 64
	attBlockQ32 = 128
	attBlockK32 = 64
)

// attFastMin is the per-head work, SQ·SK·HeadDim, from which the exported
// kernels run float32 on attention_f32.go's kernels; below it they keep
// the float64 staging of this file. Such heads take microseconds either
// way, and the float64 path rounds once where the float32 one rounds
// like the unfused composition (about twice the error): the small models
// of the equivalence tests (tests/), which check that sharded training
// follows one device within 1e-4 after 20 steps, were calibrated with it
// and stay on it. Per head, so that splitting the batch or the heads
// never changes which path a head takes.
const attFastMin = 1 << 15

// attF32 reports whether T can take the float32 kernels at all (a head
// dim of 0 keeps the behaviour it always had: gonum rejects the empty
// blocks).
func attF32[T Float](d AttentionDims) bool {
	var z T
	return unsafe.Sizeof(z) == 4 && d.HeadDim > 0
}

// attPlan is how the exported kernels run d in T: the block sizes and
// whether on the float32 kernels.
func attPlan[T Float](d AttentionDims) (bq, bk int, fast bool) {
	if attF32[T](d) && d.SQ*d.SK*d.HeadDim >= attFastMin {
		return attBlockQ32, attBlockK32, true
	}
	return attBlockQ, attBlockK, false
}

// AttentionDims is one attention problem as a device holds it: the local
// shapes of q [Batch, Heads, SQ, HeadDim] and k, v [Batch, KVHeads, SK,
// HeadDim], and where the device's heads sit among the model's.
type AttentionDims struct {
	Batch, Heads, KVHeads, SQ, SK, HeadDim int
	// Group is the number of query heads that share one k/v head in the
	// whole model (its heads / its k/v heads): query head h reads k/v
	// head h/Group, by global indices.
	Group int
	// QHeadOffset and KVHeadOffset are the global indices of the
	// device's first query head and first k/v head: 0 on one device, and
	// under tensor parallelism the offsets of the device's block of q and
	// of k (0 when k is whole).
	QHeadOffset, KVHeadOffset int
	// Causal hides key j from query i when j > i + (SK − SQ), or, when
	// Positioned, when key j's global position is past query i's: for a
	// device that holds chunks of the queries and is given chunks of the
	// keys (ring attention over a context-parallel axis). A query that
	// sees none of the keys gets an output of zeros and a log-sum-exp of
	// −Inf (AttentionLSE).
	Causal     bool
	Positioned bool
	// QPos and KPos place the rows when Positioned, in at most two runs
	// (the zigzag layout's two chunks): query i < QBreak is at
	// QPos[0]+i, a later one at QPos[1]+i−QBreak, with QPos[1] ≥
	// QPos[0]+QBreak so positions rise; keys likewise. QBreak = SQ (KBreak
	// = SK) is one run.
	QPos, KPos     [2]int
	QBreak, KBreak int
	// Scale multiplies the scores.
	Scale float64
}

// kvHead is the local k/v head that local query head h reads.
func (d AttentionDims) kvHead(h int) int { return (d.QHeadOffset+h)/d.Group - d.KVHeadOffset }

// queryHeads is the range of local query heads that read local k/v head
// j (empty when none of the device's query heads do).
func (d AttentionDims) queryHeads(j int) (lo, hi int) {
	first := (d.KVHeadOffset+j)*d.Group - d.QHeadOffset
	lo, hi = max(first, 0), min(first+d.Group, d.Heads)
	return lo, max(hi, lo)
}

// visible is the end of the keys query i may see: all SK, or under
// causal i + (SK − SQ) + 1.
func (d AttentionDims) visible(i int) int {
	switch {
	case !d.Causal:
		return d.SK
	case d.Positioned:
		// Keys at or before the query's position: a prefix, positions
		// rising.
		q := d.qPos(i)
		first := min(d.KBreak, max(0, q-d.KPos[0]+1))
		return first + min(d.SK-d.KBreak, max(0, q-d.KPos[1]+1))
	}
	return min(d.SK, i+d.SK-d.SQ+1)
}

// qPos and kPos are a positioned query's and key's global positions.
func (d AttentionDims) qPos(i int) int {
	if i < d.QBreak {
		return d.QPos[0] + i
	}
	return d.QPos[1] + i - d.QBreak
}

func (d AttentionDims) kPos(j int) int {
	if j < d.KBreak {
		return d.KPos[0] + j
	}
	return d.KPos[1] + j - d.KBreak
}

// Pairs is how many (query, key) pairs of one head the mask lets
// through: the work a causal attention does.
func (d AttentionDims) Pairs() int {
	n := 0
	for i := range d.SQ {
		n += d.visible(i)
	}
	return n
}

// Hidden reports whether a causal mask hides every key from every
// query: the first key comes after the last query.
func (d AttentionDims) Hidden() bool {
	return d.Causal && d.Positioned && d.SQ > 0 && d.SK > 0 && d.kPos(0) > d.qPos(d.SQ-1)
}

// firstQuery is the first query that sees key j (causal), else 0.
func (d AttentionDims) firstQuery(j int) int {
	switch {
	case !d.Causal:
		return 0
	case d.Positioned:
		// The first query at or after the key's position.
		k := d.kPos(j)
		if k <= d.QPos[0]+d.QBreak-1 {
			return max(0, k-d.QPos[0])
		}
		return d.QBreak + min(d.SQ-d.QBreak, max(0, k-d.QPos[1]))
	}
	return max(0, j-(d.SK-d.SQ))
}

// check panics, as the package's kernels do, when the dims are not a
// problem the kernels can run or a slice does not match them: the
// runtime derives them from the compiled graph, so a mismatch is a bug.
func (d AttentionDims) check(kernel string, lens map[string][2]int) {
	checkNonNeg(kernel, d.Batch, d.Heads, d.KVHeads, d.SQ, d.SK, d.HeadDim, d.QHeadOffset, d.KVHeadOffset)
	if d.Group < 1 || d.Causal && !d.Positioned && d.SQ > d.SK || !(d.Scale > 0) {
		panic(fmt.Sprintf("cpu.%s: bad attention dims %+v", kernel, d))
	}
	for h := range d.Heads {
		if j := d.kvHead(h); j < 0 || j >= d.KVHeads {
			panic(fmt.Sprintf("cpu.%s: local query head %d reads k/v head %d, outside the device's %d (dims %+v)", kernel, h, j, d.KVHeads, d))
		}
	}
	for name, l := range lens {
		checkLen(kernel, name, l[0], l[1])
	}
}

func (d AttentionDims) qLen() int     { return d.Batch * d.Heads * d.SQ * d.HeadDim }
func (d AttentionDims) kvLen() int    { return d.Batch * d.KVHeads * d.SK * d.HeadDim }
func (d AttentionDims) statsLen() int { return d.Batch * d.Heads * d.SQ * 2 }

// qRow, oRow and kvRow are the offsets of query row i of query head h
// in q [b, h, sq, hd], of its row in the output (and dout) [b, sq, h, hd],
// and of key row j of k/v head g in k and v, in batch b.
func (d AttentionDims) qRow(b, h, i int) int  { return ((b*d.Heads+h)*d.SQ + i) * d.HeadDim }
func (d AttentionDims) oRow(b, h, i int) int  { return ((b*d.SQ+i)*d.Heads + h) * d.HeadDim }
func (d AttentionDims) kvRow(b, g, j int) int { return ((b*d.KVHeads+g)*d.SK + j) * d.HeadDim }

// stageRows widens n rows of hd elements of src, the first at off and
// each stride after the one before, into dst: the blocks the inner loops
// read are float64 and contiguous, converted once per block rather than
// once per product.
func stageRows[T Float](dst []float64, src []T, off, stride, n, hd int) {
	for r := range n {
		row, d := src[off+r*stride:][:hd], dst[r*hd:][:hd]
		for x, v := range row {
			d[x] = float64(v)
		}
	}
}

// stageRowsT is stageRows transposed: dst is hd × n with leading
// dimension ld, so products with the block's transpose read rows of it
// (gonum's kernels are faster over long rows than over short dots).
func stageRowsT[T Float](dst []float64, ld int, src []T, off, stride, n, hd int) {
	for r := range n {
		row := src[off+r*stride:][:hd]
		for x, v := range row {
			dst[x*ld+r] = float64(v)
		}
	}
}

// dot64 is Σ a·b, in four interleaved sums (a fixed order, so results
// are reproducible).
func dot64(a, b []float64) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// gemm is c = alpha·op(a)·op(b) + beta·c on the staged float64 blocks
// (row-major, leading dimensions lda, ldb, ldc): gonum's serial kernel
// at these sizes, so one task's products run on its own goroutine in a
// fixed order.
func gemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	ta, tb := blas.NoTrans, blas.NoTrans
	if transA {
		ta = blas.Trans
	}
	if transB {
		tb = blas.Trans
	}
	blasImpl.Dgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// Attention sets out = softmax(Scale·q·kᵀ, causal-masked)·v for every
// batch and query head, blocked with an online softmax (no [SQ, SK]
// buffer). out is [Batch, SQ, Heads, HeadDim] (dout too, in the
// gradients), the layout the output projection reads. out must not alias
// q, k or v.
func Attention[T Float](out, q, k, v []T, d AttentionDims) {
	bq, bk, fast := attPlan[T](d)
	attentionForward(out, nil, q, k, v, d, bq, bk, fast)
}

// AttentionLSE is [Attention] that also writes each query row's
// log-sum-exp of its visible scaled scores to lse ([Batch, Heads, SQ], q's
// row order): what merges partial results over chunks of the keys
// (o = Σ e^(lseₜ−lse)·oₜ with lse = log Σ e^lseₜ). A row that sees no key
// gets zeros and −Inf.
func AttentionLSE[T Float](out []T, lse []float64, q, k, v []T, d AttentionDims) {
	if len(lse) != d.Batch*d.Heads*d.SQ {
		panic(fmt.Sprintf("cpu.AttentionLSE: lse has %d elements, want %d", len(lse), d.Batch*d.Heads*d.SQ))
	}
	bq, bk, fast := attPlan[T](d)
	attentionForward(out, lse, q, k, v, d, bq, bk, fast)
}

// finishRow writes a query row's output acc/l (zeros when the row saw
// no key) and, when lse is not nil, its log-sum-exp m + log l.
func finishRow[T Float, A float32 | float64](o []T, acc []A, m, l float64, lse []float64, row int) {
	if l == 0 {
		clear(o)
		if lse != nil {
			lse[row] = math.Inf(-1)
		}
		return
	}
	inv := 1 / l
	for x, a := range acc {
		o[x] = T(float64(a) * inv)
	}
	if lse != nil {
		lse[row] = m + math.Log(l)
	}
}

func attentionForward[T Float](out []T, lse []float64, q, k, v []T, d AttentionDims, bq, bk int, fast bool) {
	d.check("Attention", map[string][2]int{"out": {len(out), d.qLen()}, "q": {len(q), d.qLen()}, "k": {len(k), d.kvLen()}, "v": {len(v), d.kvLen()}})
	if o32, ok := as32(out); ok && fast {
		q32, _ := as32(q)
		k32, _ := as32(k)
		v32, _ := as32(v)
		attentionForward32(sgemmKernels[0], o32, lse, q32, k32, v32, d, bq, bk)
		return
	}
	hd := d.HeadDim
	ParallelFor(d.Batch*d.Heads, 1, func(lo, hi int) {
		qf, kt, vf, acc := make([]float64, bq*hd), make([]float64, hd*bk), make([]float64, bk*hd), make([]float64, bq*hd)
		sf := make([]float64, bq*bk) // one block of scores, then of probabilities
		m, l := make([]float64, bq), make([]float64, bq)
		for task := lo; task < hi; task++ {
			b, h := task/d.Heads, task%d.Heads
			g := d.kvHead(h)
			for i0 := 0; i0 < d.SQ; i0 += bq {
				rows := min(bq, d.SQ-i0)
				stageRows(qf, q, d.qRow(b, h, i0), hd, rows, hd)
				clear(acc[:rows*hd])
				for r := range rows {
					m[r], l[r] = math.Inf(-1), 0
				}
				end := d.visible(i0 + rows - 1) // the last row sees the most keys
				for j0 := 0; j0 < end; j0 += bk {
					keys := min(j0+bk, end) - j0
					stageRowsT(kt, bk, k, d.kvRow(b, g, j0), hd, keys, hd)
					stageRows(vf, v, d.kvRow(b, g, j0), hd, keys, hd)
					gemm(false, false, rows, keys, hd, d.Scale, qf, hd, kt, bk, 0, sf, bk)
					for r := range rows {
						row := sf[r*bk : r*bk+keys]
						n := max(0, min(keys, d.visible(i0+r)-j0))
						blockMax := math.Inf(-1)
						for _, x := range row[:n] {
							blockMax = math.Max(blockMax, x)
						}
						if mNew := math.Max(m[r], blockMax); mNew > m[r] {
							// The running max grew: what was summed so far
							// is rescaled to it (exp(−Inf) = 0 the first time).
							alpha := math.Exp(m[r] - mNew)
							l[r] *= alpha
							for x := range acc[r*hd : (r+1)*hd] {
								acc[r*hd+x] *= alpha
							}
							m[r] = mNew
						}
						for c := range row {
							p := 0.0
							if c < n {
								p = math.Exp(row[c] - m[r])
								l[r] += p
							}
							row[c] = p
						}
					}
					gemm(false, false, rows, hd, keys, 1, sf, bk, vf, hd, 1, acc, hd)
				}
				for r := range rows {
					finishRow(out[d.oRow(b, h, i0+r):][:hd], acc[r*hd:(r+1)*hd], m[r], l[r], lse, (b*d.Heads+h)*d.SQ+i0+r)
				}
			}
		}
	})
}

// AttentionStats writes, for every query row, stats[2·row] = the
// log-sum-exp of its scaled, masked scores and stats[2·row+1] = D =
// Σ dout·out, the two statistics the attention gradients share (rows in
// q's order, [Batch, Heads, SQ, 2]).
func AttentionStats[T Float](stats, q, k, out, dout []T, d AttentionDims) {
	bq, bk, fast := attPlan[T](d)
	attentionStats(stats, q, k, out, dout, d, bq, bk, fast)
}

func attentionStats[T Float](stats, q, k, out, dout []T, d AttentionDims, bq, bk int, fast bool) {
	d.check("AttentionStats", map[string][2]int{"stats": {len(stats), d.statsLen()}, "q": {len(q), d.qLen()}, "k": {len(k), d.kvLen()},
		"out": {len(out), d.qLen()}, "dout": {len(dout), d.qLen()}})
	if s32, ok := as32(stats); ok && fast {
		q32, _ := as32(q)
		k32, _ := as32(k)
		o32, _ := as32(out)
		g32, _ := as32(dout)
		attentionStats32(sgemmKernels[0], s32, q32, k32, o32, g32, d, bq, bk)
		return
	}
	hd := d.HeadDim
	ParallelFor(d.Batch*d.Heads, 1, func(lo, hi int) {
		qf, kt, sf := make([]float64, bq*hd), make([]float64, hd*bk), make([]float64, bq*bk)
		of, gf := make([]float64, hd), make([]float64, hd)
		m, l := make([]float64, bq), make([]float64, bq)
		for task := lo; task < hi; task++ {
			b, h := task/d.Heads, task%d.Heads
			g := d.kvHead(h)
			for i0 := 0; i0 < d.SQ; i0 += bq {
				rows := min(bq, d.SQ-i0)
				stageRows(qf, q, d.qRow(b, h, i0), hd, rows, hd)
				for r := range rows {
					m[r], l[r] = math.Inf(-1), 0
				}
				end := d.visible(i0 + rows - 1)
				for j0 := 0; j0 < end; j0 += bk {
					keys := min(j0+bk, end) - j0
					stageRowsT(kt, bk, k, d.kvRow(b, g, j0), hd, keys, hd)
					gemm(false, false, rows, keys, hd, d.Scale, qf, hd, kt, bk, 0, sf, bk)
					for r := range rows {
						for _, sc := range sf[r*bk : r*bk+max(0, min(keys, d.visible(i0+r)-j0))] {
							if sc > m[r] {
								l[r] = l[r]*math.Exp(m[r]-sc) + 1
								m[r] = sc
							} else {
								l[r] += math.Exp(sc - m[r])
							}
						}
					}
				}
				for r := range rows {
					i := i0 + r
					row := (b*d.Heads+h)*d.SQ + i
					stageRows(of, out, d.oRow(b, h, i), hd, 1, hd)
					stageRows(gf, dout, d.oRow(b, h, i), hd, 1, hd)
					stats[2*row] = T(m[r] + math.Log(l[r]))
					stats[2*row+1] = T(dot64(gf, of))
				}
			}
		}
	})
}

// dsBlock turns a block of scaled scores s (rows × keys, leading
// dimension ld) into the gradient of the scores, ds = p·(dp − D) with
// p = exp(s − lse), or into p when dp is nil; masked entries (key c of
// the block past visible(row)) become 0. lse and D of block row r are
// stats[2·(row0+r)] and stats[2·(row0+r)+1].
func dsBlock[T Float](s, dp []float64, ld, rows, keys int, stats []T, row0 int, visible func(r int) int) {
	for r := range rows {
		lse, dsum := float64(stats[2*(row0+r)]), float64(stats[2*(row0+r)+1])
		n := max(0, min(keys, visible(r)))
		sr := s[r*ld : r*ld+keys]
		for c := range sr {
			switch {
			case c >= n:
				sr[c] = 0
			case dp == nil:
				sr[c] = math.Exp(sr[c] - lse)
			default:
				sr[c] = math.Exp(sr[c]-lse) * (dp[r*ld+c] - dsum)
			}
		}
	}
}

// AttentionGradQ sets dq = Scale·Σⱼ pᵢⱼ·(doutᵢ·vⱼ − Dᵢ)·kⱼ with p
// recomputed from q, k and the log-sum-exp in stats.
func AttentionGradQ[T Float](dq, q, k, v, dout, stats []T, d AttentionDims) {
	bq, bk, fast := attPlan[T](d)
	attentionGradQ(dq, q, k, v, dout, stats, d, bq, bk, fast)
}

func attentionGradQ[T Float](dq, q, k, v, dout, stats []T, d AttentionDims, bq, bk int, fast bool) {
	d.check("AttentionGradQ", map[string][2]int{"dq": {len(dq), d.qLen()}, "q": {len(q), d.qLen()}, "k": {len(k), d.kvLen()},
		"v": {len(v), d.kvLen()}, "dout": {len(dout), d.qLen()}, "stats": {len(stats), d.statsLen()}})
	if dq32, ok := as32(dq); ok && fast {
		q32, _ := as32(q)
		k32, _ := as32(k)
		v32, _ := as32(v)
		g32, _ := as32(dout)
		s32, _ := as32(stats)
		attentionGradQ32(sgemmKernels[0], dq32, q32, k32, v32, g32, s32, d, bq, bk)
		return
	}
	hd := d.HeadDim
	ParallelFor(d.Batch*d.Heads, 1, func(lo, hi int) {
		qf, gf, acc := make([]float64, bq*hd), make([]float64, bq*hd), make([]float64, bq*hd)
		kf, kt, vt := make([]float64, bk*hd), make([]float64, hd*bk), make([]float64, hd*bk)
		sf, pf := make([]float64, bq*bk), make([]float64, bq*bk)
		for task := lo; task < hi; task++ {
			b, h := task/d.Heads, task%d.Heads
			g := d.kvHead(h)
			for i0 := 0; i0 < d.SQ; i0 += bq {
				rows := min(bq, d.SQ-i0)
				stageRows(qf, q, d.qRow(b, h, i0), hd, rows, hd)
				stageRows(gf, dout, d.oRow(b, h, i0), d.Heads*hd, rows, hd)
				clear(acc[:rows*hd])
				end := d.visible(i0 + rows - 1)
				for j0 := 0; j0 < end; j0 += bk {
					keys := min(j0+bk, end) - j0
					stageRows(kf, k, d.kvRow(b, g, j0), hd, keys, hd)
					stageRowsT(kt, bk, k, d.kvRow(b, g, j0), hd, keys, hd)
					stageRowsT(vt, bk, v, d.kvRow(b, g, j0), hd, keys, hd)
					gemm(false, false, rows, keys, hd, d.Scale, qf, hd, kt, bk, 0, sf, bk)
					gemm(false, false, rows, keys, hd, 1, gf, hd, vt, bk, 0, pf, bk)
					dsBlock(sf, pf, bk, rows, keys, stats, (b*d.Heads+h)*d.SQ+i0, func(r int) int { return d.visible(i0+r) - j0 })
					gemm(false, false, rows, hd, keys, 1, sf, bk, kf, hd, 1, acc, hd)
				}
				for r := range rows {
					o := dq[d.qRow(b, h, i0+r):][:hd]
					for x, a := range acc[r*hd : (r+1)*hd] {
						o[x] = T(d.Scale * a)
					}
				}
			}
		}
	})
}

// AttentionGradK sets dk = Scale·Σᵢ pᵢⱼ·(doutᵢ·vⱼ − Dᵢ)·qᵢ, summed over
// the device's query heads that read each k/v head (zero for a k/v head
// none of them reads).
func AttentionGradK[T Float](dk, q, k, v, dout, stats []T, d AttentionDims) {
	d.check("AttentionGradK", map[string][2]int{"dk": {len(dk), d.kvLen()}, "q": {len(q), d.qLen()}, "k": {len(k), d.kvLen()},
		"v": {len(v), d.kvLen()}, "dout": {len(dout), d.qLen()}, "stats": {len(stats), d.statsLen()}})
	bq, bk, fast := attPlan[T](d)
	attentionGradKV(dk, q, k, v, dout, stats, d, bq, bk, fast)
}

// AttentionGradV sets dv = Σᵢ pᵢⱼ·doutᵢ, summed over the device's query
// heads that read each k/v head.
func AttentionGradV[T Float](dv, q, k, dout, stats []T, d AttentionDims) {
	d.check("AttentionGradV", map[string][2]int{"dv": {len(dv), d.kvLen()}, "q": {len(q), d.qLen()}, "k": {len(k), d.kvLen()},
		"dout": {len(dout), d.qLen()}, "stats": {len(stats), d.statsLen()}})
	bq, bk, fast := attPlan[T](d)
	attentionGradKV(dv, q, k, nil, dout, stats, d, bq, bk, fast)
}

// attentionGradKV is dk (v given) or dv (v nil). One task per (batch,
// k/v head) owns its rows of the result: for each key block it visits,
// a query block at a time, every query row of every query head sharing
// the k/v head that sees the block, so the sums over heads and queries
// are in one fixed order.
func attentionGradKV[T Float](dkv, q, k, v, dout, stats []T, d AttentionDims, bq, bk int, fast bool) {
	if r32, ok := as32(dkv); ok && fast {
		q32, _ := as32(q)
		k32, _ := as32(k)
		v32, _ := as32(v)
		g32, _ := as32(dout)
		s32, _ := as32(stats)
		attentionGradKV32(sgemmKernels[0], r32, q32, k32, v32, g32, s32, d, bq, bk, v != nil)
		return
	}
	hd := d.HeadDim
	ParallelFor(d.Batch*d.KVHeads, 1, func(lo, hi int) {
		kt, vt, acc := make([]float64, hd*bk), make([]float64, hd*bk), make([]float64, bk*hd)
		qf, gf := make([]float64, bq*hd), make([]float64, bq*hd)
		sf, pf := make([]float64, bq*bk), make([]float64, bq*bk)
		for task := lo; task < hi; task++ {
			b, g := task/d.KVHeads, task%d.KVHeads
			hLo, hHi := d.queryHeads(g)
			for j0 := 0; j0 < d.SK; j0 += bk {
				keys := min(bk, d.SK-j0)
				stageRowsT(kt, bk, k, d.kvRow(b, g, j0), hd, keys, hd)
				if v != nil {
					stageRowsT(vt, bk, v, d.kvRow(b, g, j0), hd, keys, hd)
				}
				clear(acc[:keys*hd])
				for h := hLo; h < hHi; h++ {
					for i0 := d.firstQuery(j0); i0 < d.SQ; i0 += bq {
						rows := min(bq, d.SQ-i0)
						stageRows(qf, q, d.qRow(b, h, i0), hd, rows, hd)
						stageRows(gf, dout, d.oRow(b, h, i0), d.Heads*hd, rows, hd)
						gemm(false, false, rows, keys, hd, d.Scale, qf, hd, kt, bk, 0, sf, bk)
						visible := func(r int) int { return d.visible(i0+r) - j0 }
						row0 := (b*d.Heads+h)*d.SQ + i0
						if v == nil {
							// dv += pᵀ·dout
							dsBlock[T](sf, nil, bk, rows, keys, stats, row0, visible)
							gemm(true, false, keys, hd, rows, 1, sf, bk, gf, hd, 1, acc, hd)
							continue
						}
						// dk += dsᵀ·q
						gemm(false, false, rows, keys, hd, 1, gf, hd, vt, bk, 0, pf, bk)
						dsBlock(sf, pf, bk, rows, keys, stats, row0, visible)
						gemm(true, false, keys, hd, rows, 1, sf, bk, qf, hd, 1, acc, hd)
					}
				}
				scale := d.Scale
				if v == nil {
					scale = 1
				}
				for c := range keys {
					o := dkv[d.kvRow(b, g, j0+c):][:hd]
					for x, a := range acc[c*hd : (c+1)*hd] {
						o[x] = T(scale * a)
					}
				}
			}
		}
	})
}
