package indexed

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawDataset is a dataset as Megatron lays it out, built byte by byte so
// that tests can write what Writer never would (int64 ids past int32,
// negative ids, sentence-split documents) and then corrupt it.
type rawDataset struct {
	dtype DType
	// docs are the documents, each a list of sequences.
	docs [][][]int64
}

func (r rawDataset) bytes() (idx, bin []byte) {
	size := r.dtype.Size()
	var lens []int32
	var ptrs []int64
	docIdx := []int64{0}
	for _, doc := range r.docs {
		for _, seq := range doc {
			ptrs = append(ptrs, int64(len(bin)))
			lens = append(lens, int32(len(seq)))
			for _, v := range seq {
				var b [8]byte
				binary.LittleEndian.PutUint64(b[:], uint64(v))
				bin = append(bin, b[:size]...)
			}
		}
		docIdx = append(docIdx, int64(len(lens)))
	}
	idx = append(idx, magic...)
	idx = binary.LittleEndian.AppendUint64(idx, 1)
	idx = append(idx, byte(r.dtype))
	idx = binary.LittleEndian.AppendUint64(idx, uint64(len(lens)))
	idx = binary.LittleEndian.AppendUint64(idx, uint64(len(docIdx)))
	for _, n := range lens {
		idx = binary.LittleEndian.AppendUint32(idx, uint32(n))
	}
	for _, p := range ptrs {
		idx = binary.LittleEndian.AppendUint64(idx, uint64(p))
	}
	for _, d := range docIdx {
		idx = binary.LittleEndian.AppendUint64(idx, uint64(d))
	}
	return idx, bin
}

func writeFiles(t testing.TB, prefix string, idx, bin []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(prefix+".idx", idx, 0o644))
	require.NoError(t, os.WriteFile(prefix+".bin", bin, 0o644))
}

func (r rawDataset) write(t testing.TB, prefix string) {
	t.Helper()
	idx, bin := r.bytes()
	writeFiles(t, prefix, idx, bin)
}

// sequences reads every sequence of d.
func sequences(t testing.TB, d *Dataset) [][]int32 {
	t.Helper()
	out := make([][]int32, d.NumSequences())
	for i := range out {
		out[i] = make([]int32, d.SequenceLen(i))
		require.NoError(t, d.Read(i, 0, out[i]))
	}
	return out
}

// withoutMmap runs the rest of the test reading through the files, as on
// systems that cannot map them.
func withoutMmap(t *testing.T) {
	old := canMap
	canMap = false
	t.Cleanup(func() { canMap = old })
}

func put64(b []byte, off int, v uint64) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint64(b[off:], v)
	return b
}

func put32(b []byte, off int, v uint32) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(b[off:], v)
	return b
}
