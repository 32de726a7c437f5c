package cpu

import (
	"fmt"
	"math"
	"unsafe"
)

// Generation's kernels (the ops rope_at, kv_write and attention_at): each
// token's position comes from a positions tensor [batch, step] instead
// of its row, so a decode step at position t rotates, stores and attends
// as row t of one long sequence would.

// RoPEAt is [RoPE] with row (b, h, i) of x [batch, heads, step, d] at
// position pos[b·step + i]: the same angles ([RoPEAngle]) and pairing, so
// a token rotated here equals the row at its position in a whole-sequence
// RoPE. out may not alias x.
func RoPEAt[T Float](out, x []T, pos []int32, batch, heads, step, d int, theta float64) {
	checkRows("RoPEAt", batch*heads*step, d, len(out), len(x))
	if len(pos) != batch*step {
		panic(fmt.Sprintf("cpu.RoPEAt: %d positions for batch %d × step %d", len(pos), batch, step))
	}
	if d == 0 {
		return
	}
	half := d / 2
	// The angles of each (b, i), shared by every head.
	cos, sin := make([]float64, batch*step*half), make([]float64, batch*step*half)
	for r, p := range pos {
		for i := range half {
			sin[r*half+i], cos[r*half+i] = math.Sincos(RoPEAngle(int(p), i, d, theta))
		}
	}
	ParallelFor(batch*heads*step, rowGrain(d), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			b, i := r/(heads*step), r%step
			t := (b*step + i) * half
			cs, sn := cos[t:t+half], sin[t:t+half]
			xr, or := x[r*d:(r+1)*d], out[r*d:(r+1)*d]
			for j := range half {
				a, c := float64(xr[j]), float64(xr[j+half])
				or[j] = T(a*cs[j] - c*sn[j])
				or[j+half] = T(c*cs[j] + a*sn[j])
			}
		}
	})
}

// KVWrite stores the step's keys or values new [batch, kv, step, hd] into
// cache [batch, kv, ctx, hd]: row i of sequence b goes to row pos[b·step+i].
// out is the cache after the write: when it is cache itself (the lowering
// writes in place) only the step's rows are touched; otherwise the cache
// is copied first. A position outside the cache is an error, not a write
// out of bounds.
func KVWrite[T Float](out, cache, new []T, pos []int32, batch, kv, ctx, step, hd int) error {
	checkNonNeg("KVWrite", batch, kv, ctx, step, hd)
	n := batch * kv * ctx * hd
	if len(out) != n || len(cache) != n || len(new) != batch*kv*step*hd || len(pos) != batch*step {
		panic(fmt.Sprintf("cpu.KVWrite: lengths out %d, cache %d, new %d, positions %d for [%d,%d,%d,%d] and step %d", len(out), len(cache), len(new), len(pos), batch, kv, ctx, hd, step))
	}
	if err := checkCachePositions("kv_write", pos, step, ctx); err != nil {
		return err
	}
	if n > 0 && unsafe.SliceData(out) != unsafe.SliceData(cache) {
		copy(out, cache)
	}
	for b := range batch {
		for g := range kv {
			for i := range step {
				src := ((b*kv+g)*step + i) * hd
				dst := ((b*kv+g)*ctx + int(pos[b*step+i])) * hd
				copy(out[dst:dst+hd], new[src:src+hd])
			}
		}
	}
	return nil
}

// AttentionAt is attention of q [Batch, Heads, SQ, HeadDim] over a cache
// k, v [Batch, KVHeads, SK, HeadDim] in which query (b, i) sees the keys
// at positions 0…pos[b·SQ+i]: the causal attention of a token at that
// position in one long sequence, however many tokens the step holds.
// Keys past a query's position are never read, so a step's work grows
// with the tokens so far, not with the cache's size. d.Causal is not
// read; the positions are the mask. Several queries at one offset (a
// prefill) run on the blocked kernels (attentionPrefix); otherwise
// float32 takes packed GEMMs (attentionAt32) and float64 a plain loop.
// out is [Batch, SQ, Heads, HeadDim] like [Attention]'s and may not alias
// q, k or v.
func AttentionAt[T Float](out, q, k, v []T, pos []int32, d AttentionDims) error {
	checkNonNeg("AttentionAt", d.Batch, d.Heads, d.KVHeads, d.SQ, d.SK, d.HeadDim, d.QHeadOffset, d.KVHeadOffset)
	if d.Group < 1 || !(d.Scale > 0) || len(out) != d.qLen() || len(q) != d.qLen() || len(k) != d.kvLen() || len(v) != d.kvLen() || len(pos) != d.Batch*d.SQ {
		panic(fmt.Sprintf("cpu.AttentionAt: dims %+v do not match out %d, q %d, k %d, v %d, positions %d", d, len(out), len(q), len(k), len(v), len(pos)))
	}
	if err := checkCachePositions("attention_at", pos, d.SQ, d.SK); err != nil {
		return err
	}
	if p0, ok := commonOffset(pos, d.Batch, d.SQ); ok && d.SQ > 1 {
		attentionPrefix(out, q, k, v, p0, d)
		return nil
	}
	if o32, ok := as32(out); ok && d.HeadDim > 0 {
		q32, _ := as32(q)
		k32, _ := as32(k)
		v32, _ := as32(v)
		attentionAt32(o32, q32, k32, v32, pos, d)
		return nil
	}
	// float64 (the oracle tests' programs): a plain loop, math.Exp.
	hd := d.HeadDim
	eachGroup(d, func(b, g, h0, n int) {
		s := make([]float64, n*d.SK)
		acc := make([]float64, n*hd)
		qf := make([]float64, n*hd)
		m, sum := make([]float64, n), make([]float64, n)
		for i := range d.SQ {
			keys := int(pos[b*d.SQ+i]) + 1
			for hh := range n {
				qr := q[d.qRow(b, h0+hh, i):][:hd]
				for x := range hd {
					qf[hh*hd+x] = float64(qr[x])
				}
				m[hh], sum[hh] = math.Inf(-1), 0
			}
			for j := range keys {
				kr := k[d.kvRow(b, g, j):][:hd]
				for hh := range n {
					x := dotRow(qf[hh*hd:(hh+1)*hd], kr) * d.Scale
					s[hh*d.SK+j] = x
					m[hh] = math.Max(m[hh], x)
				}
			}
			for hh := range n {
				row := s[hh*d.SK : hh*d.SK+keys]
				for j, x := range row {
					row[j] = math.Exp(x - m[hh])
					sum[hh] += row[j]
				}
			}
			clear(acc)
			for j := range keys {
				vr := v[d.kvRow(b, g, j):][:hd]
				for hh := range n {
					axpyRow(acc[hh*hd:(hh+1)*hd], s[hh*d.SK+j], vr)
				}
			}
			for hh := range n {
				o := out[d.oRow(b, h0+hh, i):][:hd]
				inv := 1 / sum[hh]
				for x, a := range acc[hh*hd : (hh+1)*hd] {
					o[x] = T(a * inv)
				}
			}
		}
	})
	return nil
}

// attentionAt32 is AttentionAt in float32 on the packed GEMM kernels:
// per query row and k/v head, the scores of the query heads that share it
// are one product with the visible keys (S = Q·Kᵀ), the softmax runs on
// S's rows (exp2N), and the output is P·V, with float32 sums as the
// blocked attention kernels have.
func attentionAt32(out, q, k, v []float32, pos []int32, d AttentionDims) {
	hd := d.HeadDim
	kern := sgemmKernels[0]
	eachGroup(d, func(b, g, h0, n int) {
		sc := make([]float32, n*d.SK)
		for i := range d.SQ {
			keys := int(pos[b*d.SQ+i]) + 1
			kb := k[d.kvRow(b, g, 0):][:keys*hd]
			vb := v[d.kvRow(b, g, 0):][:keys*hd]
			// q's heads of row i are SQ·hd apart; out's are hd apart.
			qa := q[d.qRow(b, h0, i):][:(n-1)*d.SQ*hd+hd]
			sgemm(kern, false, false, true, n, keys, hd, qa, d.SQ*hd, kb, hd, sc, keys)
			for hh := range n {
				row := sc[hh*keys : (hh+1)*keys]
				m := float64(rowMax32(row))
				sum := 0.0
				a, c := d.Scale*expK, m*d.Scale*expK
				for j, x := range row {
					p := float32(exp2N(float64(x)*a - c))
					row[j] = p
					sum += float64(p)
				}
				inv := float32(1 / sum)
				for j := range row {
					row[j] *= inv
				}
			}
			oa := out[d.oRow(b, h0, i):][:n*hd]
			sgemm(kern, false, false, false, n, hd, keys, sc[:n*keys], keys, vb, hd, oa, hd)
		}
	})
}

// eachGroup runs fn, in parallel, for every (sequence b, k/v head g)
// with the device's query heads that read g, [h0, h0+n): they are
// computed together, reading each of g's keys and values once.
func eachGroup(d AttentionDims, fn func(b, g, h0, n int)) {
	ParallelFor(d.Batch*d.KVHeads, 1, func(lo, hi int) {
		for task := lo; task < hi; task++ {
			b, g := task/d.KVHeads, task%d.KVHeads
			if h0, h1 := d.queryHeads(g); h1 > h0 {
				fn(b, g, h0, h1-h0)
			}
		}
	})
}

// commonOffset reports whether every sequence's tokens sit at p0, p0+1, …
// for one p0: a prefill from an empty cache, or a decode step of
// sequences of equal length.
func commonOffset(pos []int32, batch, step int) (int, bool) {
	if len(pos) == 0 {
		return 0, false
	}
	p0 := int(pos[0])
	for b := range batch {
		for i := range step {
			if int(pos[b*step+i]) != p0+i {
				return 0, false
			}
		}
	}
	return p0, true
}

// attentionPrefix is AttentionAt when every query row i sits at p0+i
// and there are several (a prefill; one query gains nothing from the
// copy and the blocking):
// causal attention over the cache's first p0+SQ positions, the queries
// aligned to their end, which is what [Attention] computes. Those
// positions are copied out of the cache (its rows are SK apart) so the
// blocked kernels, with their float32 path, run on them.
func attentionPrefix[T Float](out, q, k, v []T, p0 int, d AttentionDims) {
	keys := p0 + d.SQ
	hd := d.HeadDim
	kp, vp := make([]T, d.Batch*d.KVHeads*keys*hd), make([]T, d.Batch*d.KVHeads*keys*hd)
	for bg := range d.Batch * d.KVHeads {
		copy(kp[bg*keys*hd:(bg+1)*keys*hd], k[bg*d.SK*hd:])
		copy(vp[bg*keys*hd:(bg+1)*keys*hd], v[bg*d.SK*hd:])
	}
	d.SK, d.Causal = keys, true
	Attention(out, q, kp, vp, d)
}

// dotRow is q·k with four partial sums, which the CPU can overlap.
func dotRow[T Float](q []float64, k []T) float64 {
	k = k[:len(q)]
	var s0, s1, s2, s3 float64
	x := 0
	for ; x+4 <= len(q); x += 4 {
		s0 += q[x] * float64(k[x])
		s1 += q[x+1] * float64(k[x+1])
		s2 += q[x+2] * float64(k[x+2])
		s3 += q[x+3] * float64(k[x+3])
	}
	for ; x < len(q); x++ {
		s0 += q[x] * float64(k[x])
	}
	return (s0 + s1) + (s2 + s3)
}

// axpyRow is acc += p·v.
func axpyRow[T Float](acc []float64, p float64, v []T) {
	v = v[:len(acc)]
	x := 0
	for ; x+4 <= len(acc); x += 4 {
		acc[x] += p * float64(v[x])
		acc[x+1] += p * float64(v[x+1])
		acc[x+2] += p * float64(v[x+2])
		acc[x+3] += p * float64(v[x+3])
	}
	for ; x < len(acc); x++ {
		acc[x] += p * float64(v[x])
	}
}

// checkCachePositions refuses a token position outside a cache of ctx
// positions, naming the sequence and token (positions are [batch, step]).
func checkCachePositions(op string, pos []int32, step, ctx int) error {
	for r, p := range pos {
		if p < 0 || int(p) >= ctx {
			return fmt.Errorf("%s: sequence %d's token %d is at position %d, outside the cache of %d positions", op, r/max(step, 1), r%max(step, 1), p, ctx)
		}
	}
	return nil
}
