package indexed

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConvertPaths: the in-place conversions (aligned bytes on a
// little-endian machine) and the byte-by-byte ones used otherwise (here
// forced by misaligning the bytes) agree for every dtype.
func TestConvertPaths(t *testing.T) {
	for _, dt := range []DType{Uint8, Int8, Int16, Int32, Int64, Uint16} {
		t.Run(dt.String(), func(t *testing.T) {
			_, hi := dt.Range()
			tokens := []int32{0, 1, hi, hi - 1, 7, hi / 2, 3, 2, 1}
			size := dt.Size()
			backing := alignedBytes(len(tokens)*size + 8)
			for _, off := range []int{0, 1} {
				b := backing[off : off+len(tokens)*size]
				encodeTokens(b, tokens, dt)
				got := make([]int32, len(tokens))
				require.Equal(t, -1, decode(got, b, dt))
				assert.Equal(t, tokens, got, "offset %d", off)
				lo, top := bytesMinMax(b, dt)
				assert.Equal(t, int64(0), lo)
				assert.Equal(t, int64(hi), top)
				for i := range tokens {
					assert.Equal(t, int64(tokens[i]), tokenAt(b, i, dt))
				}
			}
		})
	}
	// A negative id is found on both paths.
	for _, dt := range []DType{Int8, Int16, Int32, Int64} {
		_, bin := rawDataset{dtype: dt, docs: [][][]int64{{{4, -3, 5}}}}.bytes()
		for _, off := range []int{0, 1} {
			b := alignedBytes(len(bin) + 1)[off:]
			copy(b, bin)
			b = b[:len(bin)]
			assert.Equal(t, 1, decode(make([]int32, 3), b, dt), "%s offset %d", dt, off)
			lo, _ := bytesMinMax(b, dt)
			assert.Negative(t, lo, "%s offset %d", dt, off)
		}
	}
}
