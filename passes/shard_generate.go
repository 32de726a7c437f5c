package passes

import (
	"strings"

	"gcompile/ir"
)

// Sharding of generation's ops (ir/generate.go). A step's positions
// [batch, step] follow the batch: split with it over dp, whole where the
// heads are split. The key/value caches are states whose placement no
// plan seeds: a cache holds what its kv_write stores, so it is placed
// like the keys it is given (split by heads where tp splits k and v, by
// sequences where dp splits the batch), and the state never travels.

func init() {
	shardRules["rope_at"] = ropeAtRule
	shardRules["kv_write"] = kvWriteRule
	shardRules["attention_at"] = attentionAtRule
}

// isKVCache reports whether v is a key/value cache state.
func isKVCache(v *ir.Value) bool {
	return v.Op == "state" && strings.HasPrefix(v.Name(), ir.KVCachePrefix)
}

// placeKVCache gives the cache argument of a kv_write the placement of
// the keys it stores, on each axis where they are split on the batch or
// the heads; elsewhere the cache is whole and the keys are gathered.
func placeKVCache(v *ir.Value) {
	cache, keys := v.Args[0], v.Args[1]
	if cache.Place != nil || !isKVCache(cache) {
		return
	}
	place := make([]ir.Placement, len(keys.Place))
	for ax, p := range keys.Place {
		place[ax] = rep
		if p.Kind == ir.Shard && p.Dim <= 1 && p.NumBlocks() == 1 {
			place[ax] = p
		}
	}
	cache.Place = place
}

// rowsOf is the placement a [batch, step] positions tensor needs beside a
// tensor placed p whose dim 0 is the batch.
func rowsOf(p ir.Placement) ir.Placement {
	if p.Kind == ir.Shard && p.Dim == 0 {
		return shardOn(0)
	}
	return rep
}

// batchOrHeads is where a [batch, heads, …] operand of a generation op
// may stay split: on the batch or the heads, whole otherwise.
func batchOrHeads(r AxisRule, i int) ir.Placement {
	p := r.have[i]
	if p.Kind == ir.Partial {
		p = r.Resolve(i)
	}
	if p.Kind == ir.Shard && p.Dim <= 1 && p.NumBlocks() == 1 {
		return p
	}
	return rep
}

func ropeAtRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	x := batchOrHeads(r, 0)
	return []ir.Placement{x, rowsOf(x)}, x, nil
}

func kvWriteRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	c := batchOrHeads(r, 0)
	return []ir.Placement{c, c, rowsOf(c)}, c, nil
}

// attentionAtRule is the fused attention's rule (attentionRule) for q and
// the cached k and v, with the positions following the batch.
func attentionAtRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	qkv := r
	qkv.have = r.have[:3]
	want, out, err := attentionRule(qkv)
	if err != nil {
		return nil, rep, err
	}
	return append(want, rowsOf(want[0])), out, nil
}
