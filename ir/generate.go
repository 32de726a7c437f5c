package ir

import "fmt"

// Generation's ops. A model compiled for generation keeps the keys and
// values of every token it has seen in a cache per attention layer, a
// state [batch, kv_heads, context, head_dim] that lives for the whole
// generation, and reads one more input besides its tokens: the absolute
// position of every token of the step,
//
//	positions i32[batch, step]
//
// (the prompt's 0…P−1 at prefill, the cache length at each decode step).
// Three ops take it where training's ops assume that a token's position is
// its row in the tensor:
//
//	rope_at(x[b,h,s,d], positions)                  → x rotated by each row's position
//	kv_write(cache[b,kv,C,hd], new[b,kv,s,hd], positions) → cache with row s of new at positions[b,s]
//	attention_at(q[b,h,s,hd], k, v [b,kv,C,hd], positions) → [b,s,h,hd], query (b,i) seeing keys ≤ positions[b,i]
//
// kv_write may write over its cache argument (InPlace): the lowering then
// appends the step's keys where the state lives, so a decode step touches
// s rows of the cache, not all C. attention_at reads only the keys a query
// may see, so its cost grows with the tokens generated so far and the
// rest of a step with none of them. Learned position embeddings need no op
// of their own: they are the position table gathered at positions
// (embedding). None of the three has a VJP: generation is forward only.

// PositionsInput is the name of the input that holds the absolute
// position of every token of a generation step.
const PositionsInput = "positions"

// KVCachePrefix starts the name of every key/value cache state
// ("kv_cache/3.k"): the runtime finds them by it, and checkpoints never
// hold them.
const KVCachePrefix = "kv_cache/"

func init() {
	register(&OpInfo{Name: "rope_at", Arity: 2, Attrs: []AttrSpec{req("theta", AttrFloat)}, Infer: inferRoPEAt, Grad: GradNotImplemented, NoGradArgs: []int{1},
		Cost: perOut(3 + TranscendentalFlops),
		Doc:  "args (x[b,h,s,d], positions i32[b,s]) (d even): rope with row (b,·,i) rotated by positions[b,i]·theta^(−2j/d) instead of i; angles in float64"})
	register(&OpInfo{Name: "kv_write", Arity: 3, Infer: inferKVWrite, Grad: GradNotImplemented, NoGradArgs: []int{2}, InPlace: true, Cost: kvWriteCost,
		Doc: "args (cache[b,kv,C,hd], new[b,kv,s,hd], positions i32[b,s]) → cache with new[b,·,i,·] written at row positions[b,i]; may write over cache"})
	register(&OpInfo{Name: "attention_at", Arity: 4, Attrs: []AttrSpec{req("scale", AttrFloat)}, Infer: inferAttentionAt, Grad: GradNotImplemented, NoGradArgs: []int{3},
		Cost: attentionAtCost,
		Doc:  "args (q[b,h,s,hd], k[b,kv,C,hd], v[b,kv,C,hd], positions i32[b,s]) → [b,s,h,hd]: attention with query (b,i) seeing keys j ≤ positions[b,i] of the cache"})
}

// checkPositions checks a positions argument against the [batch, step]
// it must cover.
func checkPositions(pos Type, batch, step int) error {
	if pos.DType != I32 || pos.Rank() != 2 || pos.Shape[0] != batch || pos.Shape[1] != step {
		return fmt.Errorf("positions must be i32[%d, %d] (batch, tokens of the step), got %v", batch, step, pos)
	}
	return nil
}

func inferRoPEAt(args []Type, a Attrs) (Type, error) {
	x := args[0]
	if x.Rank() != 4 {
		return Type{}, fmt.Errorf("needs x [batch, heads, step, d], got %v", x)
	}
	if _, err := inferRoPE(args[:1], a); err != nil {
		return Type{}, err
	}
	return x, checkPositions(args[1], x.Shape[0], x.Shape[2])
}

func inferKVWrite(args []Type, _ Attrs) (Type, error) {
	cache, n := args[0], args[1]
	if cache.Rank() != 4 || !cache.DType.IsFloat() {
		return Type{}, fmt.Errorf("cache must be a float tensor [batch, kv_heads, context, head_dim], got %v", cache)
	}
	if n.Rank() != 4 || n.DType != cache.DType || n.Shape[0] != cache.Shape[0] || n.Shape[1] != cache.Shape[1] || n.Shape[3] != cache.Shape[3] || n.Shape[2] > cache.Shape[2] {
		return Type{}, fmt.Errorf("new keys must be %v[%d, %d, ≤%d, %d] to go into cache %v, got %v", cache.DType, cache.Shape[0], cache.Shape[1], cache.Shape[2], cache.Shape[3], cache, n)
	}
	return cache, checkPositions(args[2], n.Shape[0], n.Shape[2])
}

func inferAttentionAt(args []Type, a Attrs) (Type, error) {
	q := args[0]
	if err := checkAttention(q, args[1], &args[2], a); err != nil {
		return Type{}, err
	}
	return AttentionOutType(q), checkPositions(args[3], q.Shape[0], q.Shape[2])
}

// kvWriteCost moves the step's keys into the cache: new is read and
// written once; the rest of the cache is not touched.
func kvWriteCost(args []Type, _ Type, _ Attrs) (int64, int64) {
	return 0, SatAdd(SatMul(2, args[1].Bytes()), args[2].Bytes())
}

// attentionAtCost prices a step's attention as if every query saw the
// whole cache: the most the kernel does, reached at the end of the
// context. Only q, the keys and values of the whole cache, and the
// result are counted as traffic, which bounds what a step reads.
func attentionAtCost(args []Type, out Type, a Attrs) (int64, int64) {
	return attentionCost(func(hd int64) int64 { return 4*hd + 4 + TranscendentalFlops }, 0)(args[:3], out, a)
}
