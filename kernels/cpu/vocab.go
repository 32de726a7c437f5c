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
