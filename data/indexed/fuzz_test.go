package indexed

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseIndex: no bytes make the .idx parser panic, and whatever it
// accepts is consistent enough for every accessor to stay in bounds.
func FuzzParseIndex(f *testing.F) {
	for _, name := range []string{"golden_uint16.idx", "golden_int32.idx"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	idx, _ := small.bytes()
	f.Add(idx)
	f.Add(put64(idx, 18, 1<<63))
	f.Add([]byte("MMIDIDX\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := parseIndex("fuzz.idx", data)
		if err != nil {
			return
		}
		size := int64(x.dtype.Size())
		var sum int64
		for i := 0; i < x.nseq; i++ {
			if x.seqLen(i) < 0 || x.seqPtr(i) != sum {
				t.Fatalf("accepted sequence %d: length %d, pointer %d (want %d)", i, x.seqLen(i), x.seqPtr(i), sum)
			}
			sum += int64(x.seqLen(i)) * size
		}
		if sum != x.binSize {
			t.Fatalf("binSize %d, sequences add up to %d", x.binSize, sum)
		}
		if x.ndocIdx < 1 || x.docIdx(0) != 0 || x.docIdx(x.ndocIdx-1) != int64(x.nseq) {
			t.Fatalf("accepted document indices of length %d", x.ndocIdx)
		}
	})
}
