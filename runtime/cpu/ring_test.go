package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime"
	"gcompile/runtime/comm"
)

// Ring attention over n devices, each holding one chunk of the sequence
// (or, in the zigzag layout, chunks i and 2n−1−i of 2n),
// computes what the single-device fused kernels compute on the whole
// sequence, in float64 to rounding: the output, the statistics (the
// log-sum-exp merged over chunks, D), and dq, dk, dv, causal or not, with
// grouped-query attention. The single-device kernels are themselves
// checked by finite differences (kernels/cpu TestAttentionGradFD).
func TestRingAttentionMatchesOneDevice(t *testing.T) {
	for _, c := range []struct {
		n, seq, heads, kv int
		causal, zigzag    bool
	}{
		{2, 8, 2, 1, true, false}, {2, 8, 2, 2, false, false}, {3, 12, 4, 2, true, false}, {4, 16, 2, 1, true, false}, {4, 8, 2, 2, false, false},
		{2, 8, 2, 1, true, true}, {3, 12, 4, 2, true, true}, {4, 16, 2, 1, true, true}, {4, 16, 2, 2, false, true},
	} {
		t.Run(fmt.Sprintf("n%d_seq%d_h%d_kv%d_causal%v_zigzag%v", c.n, c.seq, c.heads, c.kv, c.causal, c.zigzag), func(t *testing.T) {
			const batch, hd = 2, 4
			whole := kcpu.AttentionDims{Batch: batch, Heads: c.heads, KVHeads: c.kv, SQ: c.seq, SK: c.seq, HeadDim: hd,
				Group: c.heads / c.kv, Causal: c.causal, Scale: 1 / math.Sqrt(hd)}
			rng := rand.New(rand.NewPCG(1, uint64(c.n)))
			fill := func(n int) []float64 {
				x := make([]float64, n)
				for i := range x {
					x[i] = rng.NormFloat64()
				}
				return x
			}
			qLen, kvLen := batch*c.heads*c.seq*hd, batch*c.kv*c.seq*hd
			q, k, v, dout := fill(qLen), fill(kvLen), fill(kvLen), fill(qLen)
			out, stats := make([]float64, qLen), make([]float64, 2*batch*c.heads*c.seq)
			dq, dk, dv := make([]float64, qLen), make([]float64, kvLen), make([]float64, kvLen)
			kcpu.Attention(out, q, k, v, whole)
			kcpu.AttentionStats(stats, q, k, out, dout, whole)
			kcpu.AttentionGradQ(dq, q, k, v, dout, stats, whole)
			kcpu.AttentionGradK(dk, q, k, v, dout, stats, whole)
			kcpu.AttentionGradV(dv, q, k, dout, stats, whole)

			// Each device's chunk: rows [pos·L, (pos+1)·L) of dim 2 of
			// q, k, v, stats ([b, h, s, ·]) and of dim 1 of out, dout
			// ([b, s, h, hd]).
			L := c.seq / c.n
			part := whole
			part.SQ, part.SK = L, L
			seqChunk := func(x []float64, outer, inner, pos int) []float64 {
				// x is [outer, seq, inner]; the device's rows are
				// [outer, L, inner].
				rows := func(o, lo, hi int) []float64 { return x[(o*c.seq+lo)*inner : (o*c.seq+hi)*inner] }
				y := make([]float64, 0, outer*L*inner)
				for o := range outer {
					if c.zigzag {
						h := L / 2
						lo, hi := pos, 2*c.n-1-pos
						y = append(append(y, rows(o, lo*h, (lo+1)*h)...), rows(o, hi*h, (hi+1)*h)...)
					} else {
						y = append(y, rows(o, pos*L, (pos+1)*L)...)
					}
				}
				return y
			}
			qChunk := func(x []float64, pos int) []float64 { return seqChunk(x, batch*c.heads, hd, pos) }
			kvChunk := func(x []float64, pos int) []float64 { return seqChunk(x, batch*c.kv, hd, pos) }
			oChunk := func(x []float64, pos int) []float64 { return seqChunk(x, batch, c.heads*hd, pos) }
			sChunk := func(x []float64, pos int) []float64 { return seqChunk(x, batch*c.heads, 2, pos) }

			type result struct{ out, stats, dq, dk, dv []float64 }
			got := make([]result, c.n)
			require.NoError(t, ringAll(c.n, c.zigzag, func(r ring) error {
				pos := r.Pos
				qc, kc, vc, gc := qChunk(q, pos), kvChunk(k, pos), kvChunk(v, pos), oChunk(dout, pos)
				res := result{out: make([]float64, len(gc)), stats: make([]float64, 2*batch*c.heads*L),
					dq: make([]float64, len(qc)), dk: make([]float64, len(kc)), dv: make([]float64, len(kc))}
				steps := []func() error{
					func() error { return newRingForward[float64](part, nil).run(r, res.out, qc, kc, vc) },
					func() error { return newRingStats[float64](part, nil).run(r, res.stats, qc, kc, res.out, gc) },
					func() error { return newRingGradQ[float64](part, nil).run(r, res.dq, qc, kc, vc, gc, res.stats) },
					func() error { return newRingGradKV[float64](part, true, nil).run(r, res.dk, qc, kc, vc, gc, res.stats) },
					func() error {
						return newRingGradKV[float64](part, false, nil).run(r, res.dv, qc, kc, nil, gc, res.stats)
					},
				}
				for _, f := range steps {
					if err := f(); err != nil {
						return err
					}
				}
				got[pos] = res
				return nil
			}))
			for pos := range c.n {
				for _, x := range []struct {
					name      string
					got, want []float64
				}{
					{"out", got[pos].out, oChunk(out, pos)}, {"stats", got[pos].stats, sChunk(stats, pos)},
					{"dq", got[pos].dq, qChunk(dq, pos)}, {"dk", got[pos].dk, kvChunk(dk, pos)}, {"dv", got[pos].dv, kvChunk(dv, pos)},
				} {
					require.Len(t, x.got, len(x.want))
					for i := range x.want {
						require.InDelta(t, x.want[i], x.got[i], 1e-12*(1+math.Abs(x.want[i])), "device %d: %s[%d]", pos, x.name, i)
					}
				}
			}
		})
	}
}

// The zigzag layout balances a causal ring: every rank attends to the
// same number of (query, key) pairs over its steps, an even share of the
// whole's; in contiguous chunks of L rows rank i does i·L² + L(L+1)/2,
// the last nearly 2·cp−1 times the first's.
func TestRingZigzagBalancesCausalWork(t *testing.T) {
	for _, n := range []int{2, 4, 8} {
		const seq = 64
		d := kcpu.AttentionDims{Batch: 1, Heads: 1, KVHeads: 1, SQ: seq / n, SK: seq / n, HeadDim: 1, Group: 1, Causal: true, Scale: 1}
		work := func(zigzag bool) []int {
			out := make([]int, n)
			for pos := range n {
				r := runtime.Ring{Pos: pos, N: n, Zigzag: zigzag}
				for t := range n {
					if dc, hidden := r.Chunk(d, r.Src(t)); !hidden {
						out[pos] += dc.Pairs()
					}
				}
			}
			return out
		}
		whole := seq * (seq + 1) / 2
		zig, flat := work(true), work(false)
		for pos := range n {
			require.Equal(t, whole/n, zig[pos], "cp%d zigzag: rank %d's pairs", n, pos)
		}
		require.Equal(t, whole, sum(flat), "cp%d contiguous: every pair once", n)
		L := seq / n
		for pos := range n {
			require.Equal(t, pos*L*L+L*(L+1)/2, flat[pos], "cp%d contiguous: rank %d sees every earlier chunk whole and its own causally", n, pos)
		}
	}
}

func sum(x []int) int {
	s := 0
	for _, v := range x {
		s += v
	}
	return s
}

// ringAll runs f on n devices of a ring over a fresh Local comm, device
// pos getting a ring at pos, and returns the first error.
func ringAll(n int, zigzag bool, f func(r ring) error) error {
	cm := comm.NewLocal(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for pos := range n {
		wg.Go(func() {
			r := ring{Ring: runtime.Ring{Pos: pos, N: n, Zigzag: zigzag}, c: cm, rank: pos, next: (pos + 1) % n, prev: (pos + n - 1) % n, tag: ringTagBase}
			if errs[pos] = f(r); errs[pos] != nil {
				cm.Abort(errs[pos])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// The ring's gradients are the derivatives of its own forward, by
// central finite differences in float64: with f = Σ out·dout over every
// device's chunk, each element of every device's q, k and v chunk is
// moved by ±h and the change of f compared with that device's dq, dk, dv
// (zigzag and contiguous, causal, grouped-query).
func TestRingAttentionGradFD(t *testing.T) {
	for _, zigzag := range []bool{false, true} {
		const n, seq, heads, kv, hd = 2, 8, 2, 1, 2
		L := seq / n
		d := kcpu.AttentionDims{Batch: 1, Heads: heads, KVHeads: kv, SQ: L, SK: L, HeadDim: hd, Group: heads / kv, Causal: true, Scale: 0.7}
		rng := rand.New(rand.NewPCG(7, 1))
		fill := func(m int) [][]float64 {
			x := make([][]float64, n)
			for p := range x {
				x[p] = make([]float64, m)
				for i := range x[p] {
					x[p][i] = rng.NormFloat64()
				}
			}
			return x
		}
		qLen, kvLen := heads*L*hd, kv*L*hd
		q, k, v, dout := fill(qLen), fill(kvLen), fill(kvLen), fill(qLen)
		f := func() float64 {
			outs := make([][]float64, n)
			require.NoError(t, ringAll(n, zigzag, func(r ring) error {
				outs[r.Pos] = make([]float64, qLen)
				return newRingForward[float64](d, nil).run(r, outs[r.Pos], q[r.Pos], k[r.Pos], v[r.Pos])
			}))
			s := 0.0
			for p := range n {
				for i, o := range outs[p] {
					s += o * dout[p][i]
				}
			}
			return s
		}
		dq, dk, dv := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		require.NoError(t, ringAll(n, zigzag, func(r ring) error {
			p := r.Pos
			out, stats := make([]float64, qLen), make([]float64, 2*heads*L)
			dq[p], dk[p], dv[p] = make([]float64, qLen), make([]float64, kvLen), make([]float64, kvLen)
			if err := newRingForward[float64](d, nil).run(r, out, q[p], k[p], v[p]); err != nil {
				return err
			}
			if err := newRingStats[float64](d, nil).run(r, stats, q[p], k[p], out, dout[p]); err != nil {
				return err
			}
			if err := newRingGradQ[float64](d, nil).run(r, dq[p], q[p], k[p], v[p], dout[p], stats); err != nil {
				return err
			}
			if err := newRingGradKV[float64](d, true, nil).run(r, dk[p], q[p], k[p], v[p], dout[p], stats); err != nil {
				return err
			}
			return newRingGradKV[float64](d, false, nil).run(r, dv[p], q[p], k[p], nil, dout[p], stats)
		}))
		const h = 1e-6
		for _, x := range []struct {
			name  string
			in, g [][]float64
		}{{"q", q, dq}, {"k", k, dk}, {"v", v, dv}} {
			for p := range n {
				for i := range x.in[p] {
					keep := x.in[p][i]
					x.in[p][i] = keep + h
					up := f()
					x.in[p][i] = keep - h
					down := f()
					x.in[p][i] = keep
					fd := (up - down) / (2 * h)
					require.InDelta(t, fd, x.g[p][i], 1e-7*(1+math.Abs(fd)), "zigzag %v: d%s of device %d, element %d", zigzag, x.name, p, i)
				}
			}
		}
	}
}
