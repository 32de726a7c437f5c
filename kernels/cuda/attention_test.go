package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
)

// attTileRows is the rows of one tile for head dim hd, as attention.cu
// and runtime/cuda size them.
func attTileRows(hd int) int { return min(32, 2048/hd) }

// attKernels runs the five attention kernels on the emulator with one
// grid and block: the forward, the statistics from the forward's output,
// and the three gradients from those statistics.
func attKernels(t *testing.T, d kcpu.AttentionDims, grid, block uint32, q, k, v, dout []float32) (out, stats, dq, dk, dv []float32) {
	t.Helper()
	rows := attTileRows(d.HeadDim)
	qTiles, kTiles := int64((d.SQ+rows-1)/rows), int64((d.SK+rows-1)/rows)
	nq, nk := d.Batch*d.Heads*d.SQ*d.HeadDim, d.Batch*d.KVHeads*d.SK*d.HeadDim
	out, stats, dq, dk, dv = outBuf(nq), outBuf(d.Batch*d.Heads*d.SQ*2), outBuf(nq), outBuf(nk), outBuf(nk)
	causal := int32(0)
	if d.Causal {
		causal = 1
	}
	sizes := func(tiles int64) []any {
		return []any{int64(d.Batch), int64(d.Heads), int64(d.KVHeads), int64(d.SQ), int64(d.SK), int64(d.HeadDim), tiles,
			int64(d.Group), int64(d.QHeadOffset), int64(d.KVHeadOffset), float32(d.Scale), causal}
	}
	run := func(name string, tiles int64, ptrs ...any) {
		launch(t, name, grid, block, append(ptrs, sizes(tiles)...)...)
	}
	run("gc_attention", qTiles, out, q, k, v)
	run("gc_attention_stats", qTiles, stats, q, k, out, dout)
	run("gc_attention_grad_q", qTiles, dq, q, k, v, dout, stats)
	run("gc_attention_grad_k", kTiles, dk, q, k, v, dout, stats)
	run("gc_attention_grad_v", kTiles, dv, q, k, dout, stats)
	return out, stats, dq, dk, dv
}

// outBuf is out for any length, including 0.
func outBuf(n int) []float32 { return out(n) }

// attBound allows float32 sums against the CPU kernels' float64 ones: a
// few ulps of each element plus 1e-5 of the tensor's largest element
// (a sum over keys and head dims rounds at that scale).
func attBound(want []float32) []float64 {
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	b := make([]float64, len(want))
	for i, w := range want {
		b[i] = 4*ulp2*math.Abs(float64(w)) + 1e-5*scale
	}
	return b
}

// The CUDA attention kernels compute what the CPU kernels compute, within
// float32 rounding, for multi-head and grouped-query attention, causal or
// not, lengths that are no multiple of the tile, fewer queries than keys,
// head dims whose tiles hold fewer than 32 rows, and a device's block of
// the query heads over whole k/v heads (head offsets). Each element is
// summed by one thread in one order, so the block size and grid change no
// bit.
func TestAttentionMatchesCPU(t *testing.T) {
	cases := []kcpu.AttentionDims{
		{Batch: 2, Heads: 2, KVHeads: 2, SQ: 7, SK: 7, HeadDim: 3, Group: 1, Causal: true},
		{Batch: 1, Heads: 4, KVHeads: 2, SQ: 35, SK: 35, HeadDim: 8, Group: 2, Causal: true},
		{Batch: 1, Heads: 2, KVHeads: 1, SQ: 33, SK: 33, HeadDim: 5, Group: 2, Causal: false},
		{Batch: 1, Heads: 2, KVHeads: 1, SQ: 9, SK: 40, HeadDim: 4, Group: 2, Causal: true},
		{Batch: 1, Heads: 2, KVHeads: 2, SQ: 21, SK: 21, HeadDim: 100, Group: 1, Causal: true},
		// Query heads 2 and 3 of 8 over all 2 k/v heads (tp=4 with the
		// k/v heads replicated): both read k/v head 0.
		{Batch: 1, Heads: 2, KVHeads: 2, SQ: 11, SK: 11, HeadDim: 4, Group: 4, QHeadOffset: 2, Causal: true},
		// Query heads 4..7 of 8 over k/v head 1 of 2 (tp=2, both split).
		{Batch: 1, Heads: 4, KVHeads: 1, SQ: 10, SK: 10, HeadDim: 4, Group: 4, QHeadOffset: 4, KVHeadOffset: 1, Causal: false},
	}
	for n, d := range cases {
		d.Scale = 1 / math.Sqrt(float64(d.HeadDim))
		t.Run(fmt.Sprintf("b%d_h%d_kv%d_sq%d_sk%d_hd%d_off%d_%d_causal%v", d.Batch, d.Heads, d.KVHeads, d.SQ, d.SK, d.HeadDim, d.QHeadOffset, d.KVHeadOffset, d.Causal), func(t *testing.T) {
			r := newRand(uint64(700 + n))
			nq, nk := d.Batch*d.Heads*d.SQ*d.HeadDim, d.Batch*d.KVHeads*d.SK*d.HeadDim
			q, k, v, dout := randNorm(r, nq, 1.5), randNorm(r, nk, 1.5), randNorm(r, nk, 1), randNorm(r, nq, 1)
			wOut, wStats := make([]float32, nq), make([]float32, d.Batch*d.Heads*d.SQ*2)
			wdq, wdk, wdv := make([]float32, nq), make([]float32, nk), make([]float32, nk)
			kcpu.Attention(wOut, q, k, v, d)
			kcpu.AttentionStats(wStats, q, k, wOut, dout, d)
			kcpu.AttentionGradQ(wdq, q, k, v, dout, wStats, d)
			kcpu.AttentionGradK(wdk, q, k, v, dout, wStats, d)
			kcpu.AttentionGradV(wdv, q, k, dout, wStats, d)
			// Every block size, with a grid that covers every tile and
			// grids that loop over them.
			var first [5][]float32
			for i, block := range blockSizes {
				grid := []uint32{uint32(d.Batch * d.Heads * 8), 3, 2}[i]
				out, stats, dq, dk, dv := attKernels(t, d, grid, block, q, k, v, dout)
				what := fmt.Sprintf("block %d grid %d", block, grid)
				requireWithin(t, wOut, out, attBound(wOut), "out, "+what)
				requireWithin(t, wStats, stats, attBound(wStats), "stats, "+what)
				requireWithin(t, wdq, dq, attBound(wdq), "dq, "+what)
				requireWithin(t, wdk, dk, attBound(wdk), "dk, "+what)
				requireWithin(t, wdv, dv, attBound(wdv), "dv, "+what)
				if i == 0 {
					first = [5][]float32{out, stats, dq, dk, dv}
					continue
				}
				for j, got := range [][]float32{out, stats, dq, dk, dv} {
					requireBits(t, first[j], got, fmt.Sprintf("result %d, %s against block %d", j, what, blockSizes[0]))
				}
			}
		})
	}
}

// A head dim whose tile holds one row still works (the tile is the
// whole shared buffer).
func TestAttentionLargestHeadDim(t *testing.T) {
	d := kcpu.AttentionDims{Batch: 1, Heads: 1, KVHeads: 1, SQ: 3, SK: 3, HeadDim: 2048, Group: 1, Causal: true, Scale: 1.0 / 64}
	r := newRand(800)
	n := d.SQ * d.HeadDim
	q, k, v, dout := randNorm(r, n, 1), randNorm(r, n, 1), randNorm(r, n, 1), randNorm(r, n, 1)
	want := make([]float32, n)
	kcpu.Attention(want, q, k, v, d)
	got, _, _, _, _ := attKernels(t, d, 2, 64, q, k, v, dout)
	requireWithin(t, want, got, attBound(want), "out")
	require.Len(t, got, n)
}
