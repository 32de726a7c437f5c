package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func randSlice(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	return x
}

// Fed each row's own index as its position, the generation kernels are
// their training counterparts: RoPEAt is RoPE, and AttentionAt over a
// cache filled to the step's length is causal Attention.
func TestGenerationKernelsMatchTrainingOnes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const batch, heads, kv, seq, hd = 2, 4, 2, 7, 8
	x := randSlice(r, batch*heads*seq*hd)
	pos := make([]int32, batch*seq)
	for i := range pos {
		pos[i] = int32(i % seq)
	}
	want, got := make([]float64, len(x)), make([]float64, len(x))
	RoPE(want, x, batch*heads, seq, hd, 100, false)
	RoPEAt(got, x, pos, batch, heads, seq, hd, 100)
	assert.Equal(t, want, got, "rope")

	q, k, v := randSlice(r, batch*heads*seq*hd), randSlice(r, batch*kv*seq*hd), randSlice(r, batch*kv*seq*hd)
	d := AttentionDims{Batch: batch, Heads: heads, KVHeads: kv, SQ: seq, SK: seq, HeadDim: hd, Group: heads / kv, Causal: true, Scale: 0.3}
	Attention(want, q, k, v, d)
	require.NoError(t, AttentionAt(got, q, k, v, pos, d))
	assert.InDeltaSlice(t, want, got, 1e-12, "attention")
}

// KVWrite puts each token's row at its position, in place or into a copy,
// and refuses a position outside the cache.
func TestKVWrite(t *testing.T) {
	const batch, kv, ctx, step, hd = 2, 1, 5, 2, 3
	cache := make([]float32, batch*kv*ctx*hd)
	fresh := []float32{1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}
	pos := []int32{3, 4, 0, 1}
	require.NoError(t, KVWrite(cache, cache, fresh, pos, batch, kv, ctx, step, hd))
	want := []float32{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	assert.Equal(t, want, cache)
	out := make([]float32, len(cache))
	require.NoError(t, KVWrite(out, cache, fresh, []int32{0, 1, 2, 3}, batch, kv, ctx, step, hd))
	assert.Equal(t, []float32{1, 1, 1, 2, 2, 2, 0, 0, 0, 1, 1, 1, 2, 2, 2}, out[:15], "a copy keeps the rest")
	assert.Equal(t, want, cache, "the source is untouched")
	err := KVWrite(cache, cache, fresh, []int32{0, 5, 0, 1}, batch, kv, ctx, step, hd)
	assert.ErrorContains(t, err, "sequence 0's token 1 is at position 5, outside the cache of 5 positions")
}

// AttentionAt takes the blocked kernels when every sequence's queries sit
// at one offset, and its own loop when they do not; both give the causal
// attention of each query over the keys up to its position.
func TestAttentionAtOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const batch, heads, kv, sq, ctx, hd = 2, 4, 2, 3, 40, 8
	q, k, v := randSlice(r, batch*heads*sq*hd), randSlice(r, batch*kv*ctx*hd), randSlice(r, batch*kv*ctx*hd)
	d := AttentionDims{Batch: batch, Heads: heads, KVHeads: kv, SQ: sq, SK: ctx, HeadDim: hd, Group: heads / kv, Scale: 0.3}
	q32, k32, v32 := toF32(q), toF32(k), toF32(v)
	for _, pos := range [][]int32{{20, 21, 22, 20, 21, 22}, {5, 6, 7, 30, 31, 32}, {0, 1, 2, 0, 1, 2}, {9, 3, 7, 39, 0, 12}} {
		got := make([]float64, batch*heads*sq*hd)
		require.NoError(t, AttentionAt(got, q, k, v, pos, d))
		// float32 takes other kernels (packed GEMMs, exp2N).
		got32 := make([]float32, len(got))
		require.NoError(t, AttentionAt(got32, q32, k32, v32, pos, d))
		for i := range got {
			assert.InDelta(t, got[i], float64(got32[i]), 2e-6, "float32, positions %v, element %d", pos, i)
		}
		// Each query alone, over exactly its visible keys.
		for b := range batch {
			for i := range sq {
				n := int(pos[b*sq+i]) + 1
				for h := range heads {
					g := h / (heads / kv)
					want := make([]float64, hd)
					one := AttentionDims{Batch: 1, Heads: 1, KVHeads: 1, SQ: 1, SK: n, HeadDim: hd, Group: 1, Scale: 0.3}
					qi := q[((b*heads+h)*sq+i)*hd:][:hd]
					ki := k[(b*kv+g)*ctx*hd:][:n*hd]
					vi := v[(b*kv+g)*ctx*hd:][:n*hd]
					Attention(want, qi, ki, vi, one)
					assert.InDeltaSlice(t, want, got[((b*sq+i)*heads+h)*hd:][:hd], 1e-12, "positions %v seq %d query %d head %d", pos, b, i, h)
				}
			}
		}
	}
}

func toF32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}
