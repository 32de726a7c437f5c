package indexed

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// evenDataset writes a dataset of seqs equal sequences of uint16 tokens
// totalling binBytes, with a sparse .bin (its contents do not matter to
// Open), and returns its prefix.
func evenDataset(b *testing.B, dir string, seqs int, binBytes int64) string {
	b.Helper()
	prefix := filepath.Join(dir, fmt.Sprintf("even-%d-%d", seqs, binBytes))
	perSeq := binBytes / 2 / int64(seqs)
	idx := make([]byte, 0, headerSize+12*seqs+8*(seqs+1))
	idx = append(idx, magic...)
	idx = binary.LittleEndian.AppendUint64(idx, 1)
	idx = append(idx, byte(Uint16))
	idx = binary.LittleEndian.AppendUint64(idx, uint64(seqs))
	idx = binary.LittleEndian.AppendUint64(idx, uint64(seqs+1))
	for range seqs {
		idx = binary.LittleEndian.AppendUint32(idx, uint32(perSeq))
	}
	for i := range seqs {
		idx = binary.LittleEndian.AppendUint64(idx, uint64(int64(i)*perSeq*2))
	}
	for i := range seqs + 1 {
		idx = binary.LittleEndian.AppendUint64(idx, uint64(i))
	}
	require.NoError(b, os.WriteFile(prefix+".idx", idx, 0o644))
	f, err := os.Create(prefix + ".bin")
	require.NoError(b, err)
	require.NoError(b, f.Truncate(perSeq*2*int64(seqs)))
	require.NoError(b, f.Close())
	return prefix
}

// BenchmarkOpen: opening costs one pass over the .idx, whatever the size
// of the .bin (1 MB or 256 MB with the same 1000 sequences), and grows
// with the number of sequences only.
func BenchmarkOpen(b *testing.B) {
	dir := b.TempDir()
	for _, tc := range []struct {
		seqs int
		bin  int64
	}{{1000, 1 << 20}, {1000, 256 << 20}, {1_000_000, 256 << 20}} {
		prefix := evenDataset(b, dir, tc.seqs, tc.bin)
		b.Run(fmt.Sprintf("seqs=%d/bin=%dMB", tc.seqs, tc.bin>>20), func(b *testing.B) {
			for b.Loop() {
				d, err := Open(prefix)
				if err != nil {
					b.Fatal(err)
				}
				d.Close()
			}
		})
	}
}

// BenchmarkMaxToken: the full scan's throughput in MB of .bin per second,
// with the file in the page cache (the second and later iterations).
func BenchmarkMaxToken(b *testing.B) {
	dir := b.TempDir()
	for _, dt := range []DType{Uint16, Int32} {
		prefix := filepath.Join(dir, dt.String())
		w, err := Create(prefix, dt)
		require.NoError(b, err)
		doc := make([]int32, 1<<20)
		for i := range doc {
			doc[i] = int32((i * 7919) % 50000)
		}
		const size = 64 << 20
		for range size / (len(doc) * dt.Size()) {
			require.NoError(b, w.Add(doc))
		}
		require.NoError(b, w.Commit())
		b.Run(dt.String(), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				d, err := Open(prefix)
				if err != nil {
					b.Fatal(err)
				}
				if m, err := d.MaxToken(); err != nil || m != 49999 {
					b.Fatal(m, err)
				}
				d.Close()
			}
		})
	}
}
