package cpu

// EmbeddingRange looks up ids in the rows [offset, offset+rows) of a
// vocab-parallel table held by this device; ids outside that range give
// zero rows, so the devices' results add up to the whole lookup.
func EmbeddingRange[T Float](out, table []T, ids []int32, offset, rows, dim int) {
	for i, id := range ids {
		o := out[i*dim : (i+1)*dim]
		r := int(id) - offset
		if r < 0 || r >= rows {
			clear(o)
			continue
		}
		copy(o, table[r*dim:(r+1)*dim])
	}
}

// EmbeddingGradRange is EmbeddingGrad for the rows [offset, offset+rows)
// of a vocab-row table split across devices: dtable is those rows, and
// ids outside them (other devices' rows) add nothing. Every id must still
// lie in [0, vocab). Each row sums its positions in order, as
// EmbeddingGrad does, so the shards are the whole gradient's rows bit for
// bit.
func EmbeddingGradRange[T Float](dtable, dy []T, ids []int32, offset, rows, dim, vocab int) error {
	return embeddingGradRows("EmbeddingGradRange", dtable, dy, ids, offset, rows, dim, vocab)
}
