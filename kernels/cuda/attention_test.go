package cuda_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// attTileRows is the rows of one tile for head dim hd, as attention.cu
// and runtime/cuda size them.
func attTileRows(hd int) int { return min(32, 2048/hd) }

// attKernels runs the five attention kernels on the emulator with one
// grid and block: the forward, the statistics from the forward's output,
// and the three gradients from those statistics. lse is the forward's
// log-sum-exp of each query row.
func attKernels(t *testing.T, d kcpu.AttentionDims, grid, block uint32, q, k, v, dout []float32) (out, lse, stats, dq, dk, dv []float32) {
	t.Helper()
	rows := attTileRows(d.HeadDim)
	qTiles, kTiles := int64((d.SQ+rows-1)/rows), int64((d.SK+rows-1)/rows)
	nq, nk := d.Batch*d.Heads*d.SQ*d.HeadDim, d.Batch*d.KVHeads*d.SK*d.HeadDim
	out, lse, stats = outBuf(nq), outBuf(d.Batch*d.Heads*d.SQ), outBuf(d.Batch*d.Heads*d.SQ*2)
	dq, dk, dv = outBuf(nq), outBuf(nk), outBuf(nk)
	run := func(name string, tiles int64, ptrs ...any) {
		launch(t, name, grid, block, append(ptrs, attSizes(d, tiles)...)...)
	}
	run("gc_attention", qTiles, out, lse, q, k, v)
	run("gc_attention_stats", qTiles, stats, q, k, out, dout)
	run("gc_attention_grad_q", qTiles, dq, q, k, v, dout, stats)
	run("gc_attention_grad_k", kTiles, dk, q, k, v, dout, stats)
	run("gc_attention_grad_v", kTiles, dv, q, k, dout, stats)
	return out, lse, stats, dq, dk, dv
}

// attSizes are the sizes and position runs the kernels take after their
// pointers, as runtime/cuda passes them: without positions, a query run
// at sk − sq and a key run at 0 (key j ≤ i + sk − sq).
func attSizes(d kcpu.AttentionDims, tiles int64) []any {
	causal := int32(0)
	if d.Causal {
		causal = 1
	}
	qp, kp, qb, kb := [2]int{d.SK - d.SQ, 0}, [2]int{0, 0}, d.SQ, d.SK
	if d.Positioned {
		qp, kp, qb, kb = d.QPos, d.KPos, d.QBreak, d.KBreak
	}
	return []any{int64(d.Batch), int64(d.Heads), int64(d.KVHeads), int64(d.SQ), int64(d.SK), int64(d.HeadDim), tiles,
		int64(d.Group), int64(d.QHeadOffset), int64(d.KVHeadOffset), float32(d.Scale), causal,
		int64(qp[0]), int64(qb), int64(qp[1]), int64(kp[0]), int64(kb), int64(kp[1])}
}

// outBuf is out for any length, including 0.
func outBuf(n int) []float32 { return out(n) }

// attBound allows float32 sums against the CPU kernels' float64 ones: a
// few ulps of each element plus 1e-5 of the tensor's largest element
// (a sum over keys and head dims rounds at that scale).
func attBound(want []float32) []float64 {
	scale := 0.0
	for _, w := range want {
		// A row that sees no key has −inf statistics, which must match
		// exactly (requireWithin) and must not make every bound infinite.
		if !math.IsInf(float64(w), 0) {
			scale = math.Max(scale, math.Abs(float64(w)))
		}
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
				out, _, stats, dq, dk, dv := attKernels(t, d, grid, block, q, k, v, dout)
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
	got, _, _, _, _, _ := attKernels(t, d, 2, 64, q, k, v, dout)
	requireWithin(t, want, got, attBound(want), "out")
	require.Len(t, got, n)
}

// With the rows' global positions (a device's chunks of a sequence split
// over a context-parallel axis, in one run or the zigzag layout's two),
// the kernels compute what the CPU kernels compute: key chunks before,
// at, after and straddling the queries', rows that see no key (zero
// output, −inf log-sum-exp), and the log-sum-exp the forward writes.
func TestAttentionPositionedMatchesCPU(t *testing.T) {
	// Chunks of 40 rows at head dim 128 are tiles of 16 rows: the zigzag
	// runs break inside a tile.
	base := kcpu.AttentionDims{Batch: 2, Heads: 4, KVHeads: 2, SQ: 40, SK: 40, HeadDim: 128, Group: 2, Causal: true, Positioned: true}
	cases := []struct {
		name       string
		qPos, kPos [2]int
		qBrk, kBrk int
	}{
		{"keys before", [2]int{80, 80}, [2]int{40, 40}, 40, 40},
		{"keys at", [2]int{40, 40}, [2]int{40, 40}, 40, 40},
		{"keys after", [2]int{0, 0}, [2]int{40, 40}, 40, 40},
		{"keys straddle", [2]int{28, 28}, [2]int{12, 12}, 40, 40},
		// zigzag, 2·4 chunks of 20: device 1 holds chunks 1 and 6.
		{"zigzag own", [2]int{20, 120}, [2]int{20, 120}, 20, 20},
		{"zigzag from device 0", [2]int{20, 120}, [2]int{0, 140}, 20, 20},
		{"zigzag from device 2", [2]int{20, 120}, [2]int{40, 100}, 20, 20},
		{"zigzag device 0 from 3", [2]int{0, 140}, [2]int{60, 80}, 20, 20},
	}
	for n, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := base
			d.QPos, d.KPos, d.QBreak, d.KBreak = c.qPos, c.kPos, c.qBrk, c.kBrk
			d.Scale = 1 / math.Sqrt(float64(d.HeadDim))
			r := newRand(uint64(900 + n))
			nq, nk := d.Batch*d.Heads*d.SQ*d.HeadDim, d.Batch*d.KVHeads*d.SK*d.HeadDim
			q, k, v, dout := randNorm(r, nq, 1.5), randNorm(r, nk, 1.5), randNorm(r, nk, 1), randNorm(r, nq, 1)
			wOut, wStats := make([]float32, nq), make([]float32, d.Batch*d.Heads*d.SQ*2)
			wdq, wdk, wdv := make([]float32, nq), make([]float32, nk), make([]float32, nk)
			lse64 := make([]float64, d.Batch*d.Heads*d.SQ)
			kcpu.AttentionLSE(wOut, lse64, q, k, v, d)
			kcpu.AttentionStats(wStats, q, k, wOut, dout, d)
			kcpu.AttentionGradQ(wdq, q, k, v, dout, wStats, d)
			kcpu.AttentionGradK(wdk, q, k, v, dout, wStats, d)
			kcpu.AttentionGradV(wdv, q, k, dout, wStats, d)
			wLSE := make([]float32, len(lse64))
			for i, x := range lse64 {
				wLSE[i] = float32(x)
			}
			out, lse, stats, dq, dk, dv := attKernels(t, d, 5, 64, q, k, v, dout)
			requireWithin(t, wOut, out, attBound(wOut), "out")
			requireWithin(t, wLSE, lse, attBound(wLSE), "lse")
			requireWithin(t, wStats, stats, attBound(wStats), "stats")
			requireWithin(t, wdq, dq, attBound(wdq), "dq")
			requireWithin(t, wdk, dk, attBound(wdk), "dk")
			requireWithin(t, wdv, dv, attBound(wdv), "dv")
		})
	}
}

// Ring attention on the emulator: each of n devices' chunks of a causal
// (or not) sequence, in the zigzag and the contiguous layout, runs the
// positioned kernels against every device's key chunk as the ring brings
// them, the forward's partial outputs folded by gc_att_merge and the
// statistics by gc_att_stats_merge, dq summed over key chunks and dk, dv
// over query devices. Put back together, every result equals the
// whole-sequence kernels' within float32 rounding.
func TestRingAttentionOnTheEmulator(t *testing.T) {
	for _, c := range []struct {
		n              int
		zigzag, causal bool
	}{{2, true, true}, {4, true, true}, {4, false, true}, {2, true, false}} {
		t.Run(fmt.Sprintf("n%d_zigzag%v_causal%v", c.n, c.zigzag, c.causal), func(t *testing.T) {
			// Head dim 128: tiles of 16 rows, so chunks span several
			// and the zigzag runs break inside one.
			const seqLen = 80
			whole := kcpu.AttentionDims{Batch: 1, Heads: 4, KVHeads: 2, SQ: seqLen, SK: seqLen, HeadDim: 128, Group: 2, Causal: c.causal}
			whole.Scale = 1 / math.Sqrt(float64(whole.HeadDim))
			r := newRand(uint64(950 + c.n))
			nq, nk := whole.Heads*seqLen*whole.HeadDim, whole.KVHeads*seqLen*whole.HeadDim
			q, k, v, dout := randNorm(r, nq, 1.5), randNorm(r, nk, 1.5), randNorm(r, nk, 1), randNorm(r, nq, 1)
			wOut, _, wStats, wdq, wdk, wdv := attKernels(t, whole, 5, 64, q, k, v, dout)

			// rowsOf lists the global rows device p holds, in its order.
			L := seqLen / c.n
			rowsOf := func(p int) []int {
				var rows []int
				if c.zigzag {
					for _, ch := range []int{ir.ZigzagChunk(2*p, c.n), ir.ZigzagChunk(2*p+1, c.n)} {
						for i := range L / 2 {
							rows = append(rows, ch*L/2+i)
						}
					}
					return rows
				}
				for i := range L {
					rows = append(rows, p*L+i)
				}
				return rows
			}
			// move copies rows of a whole tensor x ([heads, seq, hd]
			// when seqDim is 1, [seq, heads, hd] when 0) into a device's
			// tensor y, or back (toWhole).
			hd := whole.HeadDim
			move := func(x, y []float32, heads, seqDim int, rows []int, toWhole bool) {
				for h := range heads {
					for i, g := range rows {
						at, mine := (h*seqLen+g)*hd, (h*len(rows)+i)*hd
						if seqDim == 0 {
							at, mine = (g*heads+h)*hd, (i*heads+h)*hd
						}
						if toWhole {
							copy(x[at:at+hd], y[mine:mine+hd])
						} else {
							copy(y[mine:mine+hd], x[at:at+hd])
						}
					}
				}
			}
			chunk := func(x []float32, heads, seqDim int, rows []int) []float32 {
				y := make([]float32, heads*len(rows)*hd)
				move(x, y, heads, seqDim, rows, false)
				return y
			}
			place := func(x, y []float32, heads, seqDim int, rows []int) { move(x, y, heads, seqDim, rows, true) }
			positions := func(d kcpu.AttentionDims, p, src int) kcpu.AttentionDims {
				d.Positioned = true
				if c.zigzag {
					d.QPos = [2]int{ir.ZigzagChunk(2*p, c.n) * L / 2, ir.ZigzagChunk(2*p+1, c.n) * L / 2}
					d.KPos = [2]int{ir.ZigzagChunk(2*src, c.n) * L / 2, ir.ZigzagChunk(2*src+1, c.n) * L / 2}
					d.QBreak, d.KBreak = L/2, L/2
				} else {
					d.QPos, d.KPos, d.QBreak, d.KBreak = [2]int{p * L, 0}, [2]int{src * L, 0}, L, L
				}
				return d
			}
			local := whole
			local.SQ, local.SK = L, L
			tiles := int64((L + attTileRows(hd) - 1) / attTileRows(hd))
			call := func(name string, d kcpu.AttentionDims, ptrs ...any) {
				launch(t, name, 5, 64, append(ptrs, attSizes(d, tiles)...)...)
			}
			qc, kc, vc, gc := make([][]float32, c.n), make([][]float32, c.n), make([][]float32, c.n), make([][]float32, c.n)
			for p := range c.n {
				qc[p], gc[p] = chunk(q, whole.Heads, 1, rowsOf(p)), chunk(dout, whole.Heads, 0, rowsOf(p))
				kc[p], vc[p] = chunk(k, whole.KVHeads, 1, rowsOf(p)), chunk(v, whole.KVHeads, 1, rowsOf(p))
			}
			rows := whole.Heads * L
			outs, stats := make([][]float32, c.n), make([][]float32, c.n)
			gotOut, gotLSE := make([]float32, nq), make([]float32, whole.Heads*seqLen)
			gotdq, gotdk, gotdv := make([]float32, nq), make([]float32, nk), make([]float32, nk)
			for p := range c.n {
				// The forward and the statistics, step 0 the device's own
				// chunk, then the others as the ring brings them.
				acc, lse, part, lsp := outBuf(rows*hd), outBuf(rows), outBuf(rows*hd), outBuf(rows)
				st, sp := outBuf(2*rows), outBuf(2*rows)
				for step := range c.n {
					src := ((p-step)%c.n + c.n) % c.n
					d := positions(local, p, src)
					if step == 0 {
						call("gc_attention", d, acc, lse, qc[p], kc[src], vc[src])
						continue
					}
					call("gc_attention", d, part, lsp, qc[p], kc[src], vc[src])
					launch(t, "gc_att_merge", 3, 32, acc, lse, part, lsp, int64(1), int64(whole.Heads), int64(L), int64(hd))
				}
				for step := range c.n {
					src := ((p-step)%c.n + c.n) % c.n
					d := positions(local, p, src)
					if step == 0 {
						call("gc_attention_stats", d, st, qc[p], kc[src], acc, gc[p])
						continue
					}
					call("gc_attention_stats", d, sp, qc[p], kc[src], acc, gc[p])
					launch(t, "gc_att_stats_merge", 3, 32, st, sp, int64(rows))
				}
				outs[p], stats[p] = acc, st
				place(gotOut, acc, whole.Heads, 0, rowsOf(p))
				for h := range whole.Heads {
					for i, g := range rowsOf(p) {
						gotLSE[h*seqLen+g] = st[2*(h*L+i)]
					}
				}
			}
			for p := range c.n {
				// dq over the key chunks; dk and dv of chunk src over the
				// query devices.
				dq := make([]float32, rows*hd)
				for src := range c.n {
					d := positions(local, p, src)
					part := outBuf(rows * hd)
					call("gc_attention_grad_q", d, part, qc[p], kc[src], vc[src], gc[p], stats[p])
					for i := range dq {
						dq[i] += part[i]
					}
				}
				place(gotdq, dq, whole.Heads, 1, rowsOf(p))
			}
			for src := range c.n {
				dk, dv := make([]float32, len(kc[src])), make([]float32, len(kc[src]))
				for p := range c.n {
					d := positions(local, p, src)
					pk, pv := outBuf(len(dk)), outBuf(len(dv))
					call("gc_attention_grad_k", d, pk, qc[p], kc[src], vc[src], gc[p], stats[p])
					call("gc_attention_grad_v", d, pv, qc[p], kc[src], gc[p], stats[p])
					for i := range dk {
						dk[i] += pk[i]
						dv[i] += pv[i]
					}
				}
				place(gotdk, dk, whole.KVHeads, 1, rowsOf(src))
				place(gotdv, dv, whole.KVHeads, 1, rowsOf(src))
			}
			wLSE := make([]float32, len(gotLSE))
			for i := range wLSE {
				wLSE[i] = wStats[2*i]
			}
			requireWithin(t, wOut, gotOut, attBound(wOut), "out")
			requireWithin(t, wLSE, gotLSE, attBound(wLSE), "log-sum-exp")
			requireWithin(t, wdq, gotdq, attBound(wdq), "dq")
			requireWithin(t, wdk, gotdk, attBound(wdk), "dk")
			requireWithin(t, wdv, gotdv, attBound(wdv), "dv")
		})
	}
}
