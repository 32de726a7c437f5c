package cpu

import (
	"fmt"
	"math"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// attCase is one attention problem of the tests; bq, bk are the block
// sizes the blocked kernels run with (0: the package's).
type attCase struct {
	batch, heads, kv, sq, sk, hd int
	causal                       bool
	bq, bk                       int
}

func (c attCase) String() string {
	return fmt.Sprintf("b%d_h%d_kv%d_sq%d_sk%d_hd%d_causal%v_blocks%dx%d", c.batch, c.heads, c.kv, c.sq, c.sk, c.hd, c.causal, c.bq, c.bk)
}

func (c attCase) dims() AttentionDims {
	return AttentionDims{Batch: c.batch, Heads: c.heads, KVHeads: c.kv, SQ: c.sq, SK: c.sk, HeadDim: c.hd,
		Group: c.heads / c.kv, Causal: c.causal, Scale: 1 / math.Sqrt(float64(c.hd))}
}

// blocks are the case's block sizes, or the package's for the kernels
// that run it, and whether those are the float32 ones: always for
// float32 here, however small the case, so that every case tests them
// (the exported kernels keep small heads on the float64 staging, see
// attPlan and TestAttentionPlan).
func blocks[T Float](c attCase) (bq, bk int, fast bool) {
	fast = attF32[T](c.dims())
	switch {
	case c.bq != 0:
		return c.bq, c.bk, fast
	case fast:
		return attBlockQ32, attBlockK32, fast
	}
	return attBlockQ, attBlockK, fast
}

// attCases cover multi-head and grouped-query attention (1, 2 and 4
// query heads per k/v head), causal and not, lengths that are no
// multiple of the blocks (the last block partial, the diagonal inside a
// block), fewer queries than keys, and the package's own blocks. The
// float32 kernels read q, k, v and dout in place when the head dim is
// whole tiles of the micro-kernel (64 here) and copy them otherwise (the
// small ones, and 40), and the last rows of a block that do not fill a
// panel of the micro-kernel come from a copy either way (most lengths).
var attCases = []attCase{
	{batch: 2, heads: 2, kv: 2, sq: 7, sk: 7, hd: 3, causal: true, bq: 4, bk: 3},
	{batch: 1, heads: 4, kv: 2, sq: 13, sk: 13, hd: 5, causal: true, bq: 4, bk: 5},
	{batch: 2, heads: 4, kv: 1, sq: 9, sk: 9, hd: 4, causal: false, bq: 2, bk: 4},
	{batch: 1, heads: 4, kv: 1, sq: 5, sk: 11, hd: 3, causal: true, bq: 3, bk: 4},
	{batch: 1, heads: 2, kv: 1, sq: 6, sk: 10, hd: 2, causal: false, bq: 4, bk: 3},
	{batch: 1, heads: 2, kv: 2, sq: 67, sk: 67, hd: 8, causal: true},
	{batch: 1, heads: 4, kv: 2, sq: 70, sk: 70, hd: 4, causal: false},
	{batch: 2, heads: 4, kv: 2, sq: 150, sk: 150, hd: 64, causal: true},
	{batch: 1, heads: 2, kv: 1, sq: 70, sk: 200, hd: 64, causal: true},
	{batch: 1, heads: 2, kv: 2, sq: 100, sk: 90, hd: 64, causal: false},
	{batch: 1, heads: 3, kv: 3, sq: 130, sk: 130, hd: 40, causal: true},
	{batch: 1, heads: 2, kv: 1, sq: 77, sk: 77, hd: 64, causal: true, bq: 24, bk: 32},
	{batch: 1, heads: 2, kv: 1, sq: 50, sk: 61, hd: 96, causal: true, bq: 13, bk: 7},
}

// attRef is the unfused composition in float64, row by row: scores,
// mask, softmax, p·v, and the gradients through the whole [sq, sk]
// probabilities (dv = pᵀ·dout, dp = dout·vᵀ, ds = p·(dp − Σ p·dp),
// dq = scale·ds·k, dk = scale·dsᵀ·q), the reference the blocked kernels
// must equal.
func attRef(d AttentionDims, q, k, v, dout []float64) (out, dq, dk, dv []float64) {
	hd := d.HeadDim
	out, dq = make([]float64, d.qLen()), make([]float64, d.qLen())
	dk, dv = make([]float64, d.kvLen()), make([]float64, d.kvLen())
	p, dp := make([]float64, d.SK), make([]float64, d.SK)
	for b := range d.Batch {
		for h := range d.Heads {
			g := d.kvHead(h)
			for i := range d.SQ {
				qi, gi := q[d.qRow(b, h, i):][:hd], dout[d.oRow(b, h, i):][:hd]
				m := math.Inf(-1)
				for j := range d.SK {
					p[j] = math.Inf(-1)
					if j < d.visible(i) {
						p[j] = d.Scale * dot(qi, k[d.kvRow(b, g, j):][:hd])
					}
					m = math.Max(m, p[j])
				}
				sum := 0.0
				for j := range p {
					p[j] = math.Exp(p[j] - m)
					sum += p[j]
				}
				dsum := 0.0
				for j := range p {
					p[j] /= sum
					vj := v[d.kvRow(b, g, j):][:hd]
					dp[j] = dot(gi, vj)
					dsum += p[j] * dp[j]
					for x := range hd {
						out[d.oRow(b, h, i)+x] += p[j] * vj[x]
						dv[d.kvRow(b, g, j)+x] += p[j] * gi[x]
					}
				}
				for j := range p {
					ds := p[j] * (dp[j] - dsum)
					for x := range hd {
						dq[d.qRow(b, h, i)+x] += d.Scale * ds * k[d.kvRow(b, g, j)+x]
						dk[d.kvRow(b, g, j)+x] += d.Scale * ds * qi[x]
					}
				}
			}
		}
	}
	return out, dq, dk, dv
}

// attRun runs the fused forward and the three gradients in T.
func attRun[T Float](c attCase, q, k, v, dout []T) (out, dq, dk, dv []T) {
	d := c.dims()
	bq, bk, fast := blocks[T](c)
	out, dq = make([]T, d.qLen()), make([]T, d.qLen())
	dk, dv = make([]T, d.kvLen()), make([]T, d.kvLen())
	stats := make([]T, d.statsLen())
	attentionForward(out, nil, q, k, v, d, bq, bk, fast)
	attentionStats(stats, q, k, out, dout, d, bq, bk, fast)
	attentionGradQ(dq, q, k, v, dout, stats, d, bq, bk, fast)
	attentionGradKV(dk, q, k, v, dout, stats, d, bq, bk, fast)
	attentionGradKV(dv, q, k, nil, dout, stats, d, bq, bk, fast)
	return out, dq, dk, dv
}

func testAttentionMatchesUnfused[T Float](t *testing.T) {
	for n, c := range attCases {
		t.Run(c.String(), func(t *testing.T) {
			r := newRand(uint64(100 + n))
			d := c.dims()
			q, k, v := randVec[T](r, d.qLen(), -2, 2), randVec[T](r, d.kvLen(), -2, 2), randVec[T](r, d.kvLen(), -1, 1)
			dout := randVec[T](r, d.qLen(), -1, 1)
			out, dq, dk, dv := attRun(c, q, k, v, dout)
			wOut, wdq, wdk, wdv := attRef(d, to64(q), to64(k), to64(v), to64(dout))
			tol := tolOf[T]()
			requireClose(t, wOut, out, tol, "out")
			requireClose(t, wdq, dq, tol, "dq")
			requireClose(t, wdk, dk, tol, "dk")
			requireClose(t, wdv, dv, tol, "dv")
		})
	}
}

// The blocked kernels equal the unfused composition: forward and all
// three gradients, in float32 within 1e-5 and in float64 within 1e-12.
func TestAttentionMatchesUnfused(t *testing.T) {
	both(t, testAttentionMatchesUnfused[float32], testAttentionMatchesUnfused[float64])
}

// The gradients are the derivatives of L = Σ dout·attention(q, k, v),
// by central differences in float64: a check that shares no derivation
// with the kernels or the reference.
func TestAttentionGradFD(t *testing.T) {
	for n, c := range []attCase{
		{batch: 1, heads: 2, kv: 1, sq: 5, sk: 5, hd: 3, causal: true, bq: 2, bk: 3},
		{batch: 2, heads: 2, kv: 2, sq: 3, sk: 4, hd: 2, causal: false, bq: 2, bk: 2},
		{batch: 1, heads: 4, kv: 1, sq: 3, sk: 6, hd: 2, causal: true, bq: 2, bk: 4},
	} {
		t.Run(c.String(), func(t *testing.T) {
			r := newRand(uint64(200 + n))
			d := c.dims()
			q, k, v := randVec[float64](r, d.qLen(), -1, 1), randVec[float64](r, d.kvLen(), -1, 1), randVec[float64](r, d.kvLen(), -1, 1)
			dout := randVec[float64](r, d.qLen(), -1, 1)
			_, dq, dk, dv := attRun(c, q, k, v, dout)
			tmp := make([]float64, d.qLen())
			loss := func() float64 { Attention(tmp, q, k, v, d); return dot(dout, tmp) }
			requireClose(t, numGrad(loss, q), dq, fdTol, "dq")
			requireClose(t, numGrad(loss, k), dk, fdTol, "dk")
			requireClose(t, numGrad(loss, v), dv, fdTol, "dv")
		})
	}
}

// Under tensor parallelism a device holds some query heads and either
// its own k/v heads or all of them: with the offsets of its blocks it
// computes exactly its query heads' rows of out and dq, its k/v heads'
// rows of dk and dv when they are split, and its query heads' share of
// every k/v head when they are whole (the shares add up to the whole).
func TestAttentionHeadOffsets(t *testing.T) {
	whole := attCase{batch: 2, heads: 8, kv: 2, sq: 9, sk: 9, hd: 3, causal: true, bq: 4, bk: 4}
	d := whole.dims()
	r := newRand(300)
	q, k, v := randVec[float64](r, d.qLen(), -2, 2), randVec[float64](r, d.kvLen(), -2, 2), randVec[float64](r, d.kvLen(), -1, 1)
	dout := randVec[float64](r, d.qLen(), -1, 1)
	wOut, wdq, wdk, wdv := attRun(whole, q, k, v, dout)
	// heads picks heads [lo, lo+n) of x [batch, heads, seq, hd];
	// outHeads of x [batch, seq, heads, hd] (out and dout).
	heads := func(x []float64, all, lo, n, seq int) []float64 {
		var o []float64
		for b := range d.Batch {
			o = append(o, x[((b*all+lo)*seq)*d.HeadDim:((b*all+lo+n)*seq)*d.HeadDim]...)
		}
		return o
	}
	outHeads := func(x []float64, lo, n int) []float64 {
		var o []float64
		for row := range d.Batch * d.SQ {
			o = append(o, x[(row*d.Heads+lo)*d.HeadDim:(row*d.Heads+lo+n)*d.HeadDim]...)
		}
		return o
	}
	for _, tc := range []struct {
		name    string
		devices int
		kvSplit bool
	}{{"k/v split with q", 2, true}, {"k/v whole, 4 devices", 4, false}, {"k/v whole, 8 devices", 8, false}} {
		t.Run(tc.name, func(t *testing.T) {
			hq := d.Heads / tc.devices
			sumK, sumV := make([]float64, d.kvLen()), make([]float64, d.kvLen())
			for dev := range tc.devices {
				local := d
				local.Heads, local.QHeadOffset = hq, dev*hq
				lk, lv := k, v
				if tc.kvSplit {
					local.KVHeads, local.KVHeadOffset = d.KVHeads/tc.devices, dev*d.KVHeads/tc.devices
					lk, lv = heads(k, d.KVHeads, local.KVHeadOffset, local.KVHeads, d.SK), heads(v, d.KVHeads, local.KVHeadOffset, local.KVHeads, d.SK)
				}
				lq, ldout := heads(q, d.Heads, dev*hq, hq, d.SQ), outHeads(dout, dev*hq, hq)
				out, dq := make([]float64, local.qLen()), make([]float64, local.qLen())
				dk, dv, stats := make([]float64, local.kvLen()), make([]float64, local.kvLen()), make([]float64, local.statsLen())
				Attention(out, lq, lk, lv, local)
				AttentionStats(stats, lq, lk, out, ldout, local)
				AttentionGradQ(dq, lq, lk, lv, ldout, stats, local)
				AttentionGradK(dk, lq, lk, lv, ldout, stats, local)
				AttentionGradV(dv, lq, lk, ldout, stats, local)
				requireClose(t, outHeads(wOut, dev*hq, hq), out, 1e-12, "out")
				requireClose(t, heads(wdq, d.Heads, dev*hq, hq, d.SQ), dq, 1e-12, "dq")
				if tc.kvSplit {
					requireClose(t, heads(wdk, d.KVHeads, local.KVHeadOffset, local.KVHeads, d.SK), dk, 1e-12, "dk")
					requireClose(t, heads(wdv, d.KVHeads, local.KVHeadOffset, local.KVHeads, d.SK), dv, 1e-12, "dv")
					continue
				}
				for i := range dk {
					sumK[i] += dk[i]
					sumV[i] += dv[i]
				}
			}
			if !tc.kvSplit {
				requireClose(t, to64(wdk), sumK, 1e-12, "Σ dk over devices")
				requireClose(t, to64(wdv), sumV, 1e-12, "Σ dv over devices")
			}
		})
	}
}

// Every task sums in a fixed order, so the results are the same bits
// whether the tasks run on one goroutine or many (head dims copied and
// read in place, one block and several).
func TestAttentionDeterministic(t *testing.T) {
	for n, c := range []attCase{
		{batch: 3, heads: 4, kv: 2, sq: 70, sk: 70, hd: 8, causal: true},
		{batch: 2, heads: 4, kv: 2, sq: 300, sk: 300, hd: 64, causal: true},
	} {
		t.Run(c.String(), func(t *testing.T) {
			d := c.dims()
			r := newRand(uint64(400 + n))
			q, k, v := randVec[float32](r, d.qLen(), -2, 2), randVec[float32](r, d.kvLen(), -2, 2), randVec[float32](r, d.kvLen(), -1, 1)
			dout := randVec[float32](r, d.qLen(), -1, 1)
			o1, q1, k1, v1 := attRun(c, q, k, v, dout)
			for _, procs := range []int{1, 3} {
				prev := goruntime.GOMAXPROCS(procs)
				o2, q2, k2, v2 := attRun(c, q, k, v, dout)
				goruntime.GOMAXPROCS(prev)
				require.Equal(t, o1, o2)
				require.Equal(t, q1, q2)
				require.Equal(t, k1, k2)
				require.Equal(t, v1, v2)
			}
		})
	}
}

// Scores far apart: the float32 forward and statistics move a row's
// reference whenever a score exceeds it by more than expSlack, and
// probabilities far below the largest underflow to zero. Small integers
// make every score exact in float32, so the kernels must match the
// float64 reference as closely as ever.
func TestAttentionWideScores(t *testing.T) {
	for n, c := range []attCase{
		{batch: 1, heads: 2, kv: 1, sq: 90, sk: 90, hd: 4, causal: true},
		{batch: 1, heads: 2, kv: 2, sq: 40, sk: 150, hd: 4, causal: false, bq: 16, bk: 32},
	} {
		t.Run(c.String(), func(t *testing.T) {
			d := c.dims()
			d.Scale = 1
			r := newRand(uint64(600 + n))
			ints := func(n int, lim float64) []float32 {
				x := randVec[float32](r, n, -lim, lim)
				for i := range x {
					x[i] = float32(math.Round(float64(x[i])))
				}
				return x
			}
			q, k := ints(d.qLen(), 6), ints(d.kvLen(), 6)
			v, dout := randVec[float32](r, d.kvLen(), -1, 1), randVec[float32](r, d.qLen(), -1, 1)
			bq, bk, _ := blocks[float32](c)
			out, dq := make([]float32, d.qLen()), make([]float32, d.qLen())
			dk, dv, stats := make([]float32, d.kvLen()), make([]float32, d.kvLen()), make([]float32, d.statsLen())
			attentionForward(out, nil, q, k, v, d, bq, bk, true)
			attentionStats(stats, q, k, out, dout, d, bq, bk, true)
			attentionGradQ(dq, q, k, v, dout, stats, d, bq, bk, true)
			attentionGradKV(dk, q, k, v, dout, stats, d, bq, bk, true)
			attentionGradKV(dv, q, k, nil, dout, stats, d, bq, bk, true)
			wOut, wdq, wdk, wdv := attRef(d, to64(q), to64(k), to64(v), to64(dout))
			requireClose(t, wOut, out, 1e-5, "out")
			requireClose(t, wdq, dq, 1e-5, "dq")
			requireClose(t, wdk, dk, 1e-5, "dk")
			requireClose(t, wdv, dv, 1e-5, "dv")
		})
	}
}

// A scale near float64's range (1e20 times the scores) makes the forward
// a hard max: each row's weight goes to its largest scores, shared among
// ties. It used to loop for ever: the rounding of x·scale against the
// row's reference put a score e¹⁶ past a reference that was already the
// largest left.
func TestAttentionHugeScaleEnds(t *testing.T) {
	c := attCase{batch: 1, heads: 2, kv: 1, sq: 40, sk: 40, hd: 4, causal: true}
	d := c.dims()
	r := newRand(700)
	ints := func(n int) []float32 {
		x := randVec[float32](r, n, -2, 2)
		for i := range x {
			x[i] = float32(math.Round(float64(x[i])))
		}
		return x
	}
	q, k, v := ints(d.qLen()), ints(d.kvLen()), randVec[float32](r, d.kvLen(), -1, 1)
	bq, bk, _ := blocks[float32](c)
	for _, scale := range []float64{1e20, 1e30, 1e300} {
		d.Scale = scale
		out := make([]float32, d.qLen())
		done := make(chan struct{})
		go func() {
			attentionForward(out, nil, q, k, v, d, bq, bk, true)
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("scale %g: the forward did not end", scale)
		}
		want, _, _, _ := attRef(d, to64(q), to64(k), to64(v), make([]float64, d.qLen()))
		requireClose(t, want, out, 1e-5, fmt.Sprintf("out at scale %g", scale))
	}
}

// attBenchCases are the shapes BenchmarkAttention times: the 4-layer
// GPT's attention (h=256 in 4 heads of 64, sequence 128, batch 8) and
// the same at sequence 1024.
var attBenchCases = []attCase{
	{batch: 8, heads: 4, kv: 4, sq: 128, sk: 128, hd: 64, causal: true},
	{batch: 8, heads: 4, kv: 4, sq: 1024, sk: 1024, hd: 64, causal: true},
}

// attUnfused is the composition nn.CausalAttentionUnfused lowers to, on
// the same kernels the runtime calls, with its [b·h, s, s] buffers: the
// baseline the fused kernels are timed against.
type attUnfused struct {
	d                    AttentionDims
	s, p, dp, o1, do1    []float32
	dq, dk, dv, out, dsc []float32
}

func newAttUnfused(d AttentionDims) *attUnfused {
	bh, ss := d.Batch*d.Heads, d.SQ*d.SK
	return &attUnfused{d: d, s: make([]float32, bh*ss), p: make([]float32, bh*ss), dp: make([]float32, bh*ss), dsc: make([]float32, bh*ss),
		o1: make([]float32, d.qLen()), do1: make([]float32, d.qLen()), out: make([]float32, d.qLen()),
		dq: make([]float32, d.qLen()), dk: make([]float32, d.kvLen()), dv: make([]float32, d.kvLen())}
}

func (u *attUnfused) forward(q, k, v []float32) {
	d := u.d
	bh := d.Batch * d.Heads
	MatMul(u.s, q, k, bh, d.SQ, d.SK, d.HeadDim, false, true, false)
	Scale(u.s, u.s, float32(d.Scale))
	CausalMask(u.s, u.s, bh, d.SQ, d.SK, float32(math.Inf(-1)))
	Softmax(u.p, u.s, bh*d.SQ, d.SK)
	MatMul(u.o1, u.p, v, bh, d.SQ, d.HeadDim, d.SK, false, false, false)
	Transpose(u.out, u.o1, []int{d.Batch, d.Heads, d.SQ, d.HeadDim}, []int{0, 2, 1, 3})
}

func (u *attUnfused) backward(q, k, v, dout []float32) {
	d := u.d
	bh := d.Batch * d.Heads
	Transpose(u.do1, dout, []int{d.Batch, d.SQ, d.Heads, d.HeadDim}, []int{0, 2, 1, 3})
	MatMul(u.dp, u.do1, v, bh, d.SQ, d.SK, d.HeadDim, false, true, false)
	MatMul(u.dv, u.p, u.do1, bh, d.SK, d.HeadDim, d.SQ, true, false, false)
	SoftmaxGrad(u.dsc, u.p, u.dp, bh*d.SQ, d.SK)
	CausalMask(u.dsc, u.dsc, bh, d.SQ, d.SK, 0)
	Scale(u.dsc, u.dsc, float32(d.Scale))
	MatMul(u.dq, u.dsc, k, bh, d.SQ, d.HeadDim, d.SK, false, false, false)
	MatMul(u.dk, u.dsc, q, bh, d.SK, d.HeadDim, d.SQ, true, false, false)
}

// BenchmarkAttention times the fused kernels in float32 against the
// unfused composition: pass=fwd is the forward, pass=bwd what a training
// step adds (the statistics and dq, dk, dv for the fused op; the
// gradients of every unfused op). Compare with benchstat -col /impl.
func BenchmarkAttention(b *testing.B) {
	for _, c := range attBenchCases {
		d := c.dims()
		r := newRand(500)
		q, k, v := randVec[float32](r, d.qLen(), -2, 2), randVec[float32](r, d.kvLen(), -2, 2), randVec[float32](r, d.kvLen(), -1, 1)
		dout := randVec[float32](r, d.qLen(), -1, 1)
		out, stats := make([]float32, d.qLen()), make([]float32, d.statsLen())
		dq, dk, dv := make([]float32, d.qLen()), make([]float32, d.kvLen()), make([]float32, d.kvLen())
		name := fmt.Sprintf("b%d_h%d_s%d_hd%d", c.batch, c.heads, c.sq, c.hd)
		b.Run(name+"/pass=fwd/impl=fused", func(b *testing.B) {
			for b.Loop() {
				Attention(out, q, k, v, d)
			}
		})
		b.Run(name+"/pass=bwd/impl=fused", func(b *testing.B) {
			Attention(out, q, k, v, d)
			for b.Loop() {
				AttentionStats(stats, q, k, out, dout, d)
				AttentionGradQ(dq, q, k, v, dout, stats, d)
				AttentionGradK(dk, q, k, v, dout, stats, d)
				AttentionGradV(dv, q, k, dout, stats, d)
			}
		})
		u := newAttUnfused(d)
		b.Run(name+"/pass=fwd/impl=unfused", func(b *testing.B) {
			for b.Loop() {
				u.forward(q, k, v)
			}
		})
		b.Run(name+"/pass=bwd/impl=unfused", func(b *testing.B) {
			u.forward(q, k, v)
			for b.Loop() {
				u.backward(q, k, v, dout)
			}
		})
	}
}

// The float32 kernels tile by whatever micro-kernel the CPU gets (12×32
// with AVX-512, 6×16 with AVX2, 4×4 in Go): each this machine can run
// must give the unfused results.
func TestAttentionEveryMicroKernel(t *testing.T) {
	for _, kern := range sgemmKernels {
		t.Run(kern.name, func(t *testing.T) {
			for n, c := range attCases {
				r := newRand(uint64(700 + n))
				d := c.dims()
				q, k, v := randVec[float32](r, d.qLen(), -2, 2), randVec[float32](r, d.kvLen(), -2, 2), randVec[float32](r, d.kvLen(), -1, 1)
				dout := randVec[float32](r, d.qLen(), -1, 1)
				bq, bk, _ := blocks[float32](c)
				out, dq := make([]float32, d.qLen()), make([]float32, d.qLen())
				dk, dv, stats := make([]float32, d.kvLen()), make([]float32, d.kvLen()), make([]float32, d.statsLen())
				attentionForward32(kern, out, nil, q, k, v, d, bq, bk)
				attentionStats32(kern, stats, q, k, out, dout, d, bq, bk)
				attentionGradQ32(kern, dq, q, k, v, dout, stats, d, bq, bk)
				attentionGradKV32(kern, dk, q, k, v, dout, stats, d, bq, bk, true)
				attentionGradKV32(kern, dv, q, k, nil, dout, stats, d, bq, bk, false)
				wOut, wdq, wdk, wdv := attRef(d, to64(q), to64(k), to64(v), to64(dout))
				what := c.String()
				requireClose(t, wOut, out, 1e-5, "out "+what)
				requireClose(t, wdq, dq, 1e-5, "dq "+what)
				requireClose(t, wdk, dk, 1e-5, "dk "+what)
				requireClose(t, wdv, dv, 1e-5, "dv "+what)
			}
		})
	}
}

// exp2N, the float32 kernels' exponential, is within 3e-8 of math.Exp
// wherever float32 has a normal value, 0 below its range, and NaN on NaN.
func TestAttentionExp(t *testing.T) {
	for x := -87.0; x <= expSlack+1; x += 0.000731 {
		want, got := math.Exp(x), exp2N(x*expK)
		require.InDelta(t, 1, got/want, 3e-8, "e^%v", x)
	}
	require.Zero(t, exp2N(-105*expK))
	require.Zero(t, exp2N(math.Inf(-1)))
	require.True(t, math.IsNaN(exp2N(math.NaN())))
}

// The exported kernels run float32 heads of less than attFastMin work on
// the float64 staging and the rest on the float32 kernels, whatever the
// batch and the number of heads: the same bits as the internal functions
// told which.
func TestAttentionPlan(t *testing.T) {
	for _, c := range []attCase{
		{batch: 4, heads: 4, kv: 2, sq: 16, sk: 16, hd: 8, causal: true},
		{batch: 1, heads: 2, kv: 2, sq: 40, sk: 40, hd: 32, causal: true},
	} {
		t.Run(c.String(), func(t *testing.T) {
			d := c.dims()
			_, _, fast := attPlan[float32](d)
			require.Equal(t, d.SQ*d.SK*d.HeadDim >= attFastMin, fast)
			bq, bk := attBlockQ, attBlockK
			if fast {
				bq, bk = attBlockQ32, attBlockK32
			}
			r := newRand(800)
			q, k, v := randVec[float32](r, d.qLen(), -2, 2), randVec[float32](r, d.kvLen(), -2, 2), randVec[float32](r, d.kvLen(), -1, 1)
			dout := randVec[float32](r, d.qLen(), -1, 1)
			out, want := make([]float32, d.qLen()), make([]float32, d.qLen())
			Attention(out, q, k, v, d)
			attentionForward(want, nil, q, k, v, d, bq, bk, fast)
			require.Equal(t, want, out)
			stats, wantStats := make([]float32, d.statsLen()), make([]float32, d.statsLen())
			AttentionStats(stats, q, k, out, dout, d)
			attentionStats(wantStats, q, k, out, dout, d, bq, bk, fast)
			require.Equal(t, wantStats, stats)
			dq, wantQ := make([]float32, d.qLen()), make([]float32, d.qLen())
			AttentionGradQ(dq, q, k, v, dout, stats, d)
			attentionGradQ(wantQ, q, k, v, dout, stats, d, bq, bk, fast)
			require.Equal(t, wantQ, dq)
			dk, wantK := make([]float32, d.kvLen()), make([]float32, d.kvLen())
			AttentionGradK(dk, q, k, v, dout, stats, d)
			attentionGradKV(wantK, q, k, v, dout, stats, d, bq, bk, fast)
			require.Equal(t, wantK, dk)
			dv, wantV := make([]float32, d.kvLen()), make([]float32, d.kvLen())
			AttentionGradV(dv, q, k, dout, stats, d)
			attentionGradKV(wantV, q, k, nil, dout, stats, d, bq, bk, fast)
			require.Equal(t, wantV, dv)
		})
	}
}
