package cpu

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkAttentionAtDecode is one decode step's attention: 4 query
// heads over 2 k/v heads of 32, one query at position 4095 of the cache.
func BenchmarkAttentionAtDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	const heads, kv, ctx, hd = 4, 2, 4096, 32
	f32 := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	q, k, v := f32(heads*hd), f32(kv*ctx*hd), f32(kv*ctx*hd)
	out := make([]float32, heads*hd)
	d := AttentionDims{Batch: 1, Heads: heads, KVHeads: kv, SQ: 1, SK: ctx, HeadDim: hd, Group: heads / kv, Scale: 0.18}
	pos := []int32{ctx - 1}
	b.SetBytes(int64(2 * kv * ctx * hd * 4))
	for b.Loop() {
		if err := AttentionAt(out, q, k, v, pos, d); err != nil {
			b.Fatal(err)
		}
	}
}
