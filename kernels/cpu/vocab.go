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
	checkRows("EmbeddingGradRange", rows, dim, len(dtable))
	checkRows("EmbeddingGradRange", len(ids), dim, len(dy))
	if err := checkIDs("EmbeddingGradRange", "id", ids, vocab); err != nil {
		return err
	}
	clear(dtable)
	for i, id := range ids {
		r := int(id) - offset
		if r < 0 || r >= rows {
			continue
		}
		d, g := dtable[r*dim:(r+1)*dim], dy[i*dim:(i+1)*dim]
		for j, v := range g {
			d[j] += v
		}
	}
	return nil
}
