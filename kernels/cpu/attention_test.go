package cpu

import (
	"fmt"
	"math"
	goruntime "runtime"
	"testing"

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

func (c attCase) blocks() (int, int) {
	if c.bq == 0 {
		return attBlockQ, attBlockK
	}
	return c.bq, c.bk
}

// attCases cover multi-head and grouped-query attention (1, 2 and 4
// query heads per k/v head), causal and not, lengths that are no
// multiple of the blocks (the last block partial, the diagonal inside a
// block), fewer queries than keys, and the package's own blocks.
var attCases = []attCase{
	{batch: 2, heads: 2, kv: 2, sq: 7, sk: 7, hd: 3, causal: true, bq: 4, bk: 3},
	{batch: 1, heads: 4, kv: 2, sq: 13, sk: 13, hd: 5, causal: true, bq: 4, bk: 5},
	{batch: 2, heads: 4, kv: 1, sq: 9, sk: 9, hd: 4, causal: false, bq: 2, bk: 4},
	{batch: 1, heads: 4, kv: 1, sq: 5, sk: 11, hd: 3, causal: true, bq: 3, bk: 4},
	{batch: 1, heads: 2, kv: 1, sq: 6, sk: 10, hd: 2, causal: false, bq: 4, bk: 3},
	{batch: 1, heads: 2, kv: 2, sq: 67, sk: 67, hd: 8, causal: true},
	{batch: 1, heads: 4, kv: 2, sq: 70, sk: 70, hd: 4, causal: false},
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
	bq, bk := c.blocks()
	out, dq = make([]T, d.qLen()), make([]T, d.qLen())
	dk, dv = make([]T, d.kvLen()), make([]T, d.kvLen())
	stats := make([]T, d.statsLen())
	attentionForward(out, q, k, v, d, bq, bk)
	attentionStats(stats, q, k, out, dout, d, bq, bk)
	attentionGradQ(dq, q, k, v, dout, stats, d, bq, bk)
	attentionGradKV(dk, q, k, v, dout, stats, d, bq, bk)
	attentionGradKV(dv, q, k, nil, dout, stats, d, bq, bk)
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
// whether the tasks run on one goroutine or many.
func TestAttentionDeterministic(t *testing.T) {
	c := attCase{batch: 3, heads: 4, kv: 2, sq: 70, sk: 70, hd: 8, causal: true}
	d := c.dims()
	r := newRand(400)
	q, k, v := randVec[float32](r, d.qLen(), -2, 2), randVec[float32](r, d.kvLen(), -2, 2), randVec[float32](r, d.kvLen(), -1, 1)
	dout := randVec[float32](r, d.qLen(), -1, 1)
	o1, q1, k1, v1 := attRun(c, q, k, v, dout)
	prev := goruntime.GOMAXPROCS(1)
	o2, q2, k2, v2 := attRun(c, q, k, v, dout)
	goruntime.GOMAXPROCS(prev)
	require.Equal(t, o1, o2)
	require.Equal(t, q1, q2)
	require.Equal(t, k1, k2)
	require.Equal(t, v1, v2)
}
