package indexed

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// small is a valid dataset with a sentence-split document and an empty one.
var small = rawDataset{dtype: Uint16, docs: [][][]int64{
	{{1, 2, 3}},
	{{4, 5}, {6}},
	{},
	{{7, 8, 9, 10}},
}}

func TestOpenBadInput(t *testing.T) {
	idx, bin := small.bytes()
	// Offsets into small's .idx: 4 sequences, 5 document indices.
	const nseq = 4
	lensAt := headerSize
	ptrsAt := lensAt + 4*nseq
	docsAt := ptrsAt + 8*nseq
	tests := []struct {
		name     string
		idx, bin []byte
		noIdx    bool
		noBin    bool
		suffix   string // added to the prefix given to Open
		want     error
		contains []string
	}{
		{name: "truncated bin", idx: idx, bin: bin[:len(bin)-2], want: ErrTruncated,
			contains: []string{".bin", "has 18 bytes", "describes 20 bytes"}},
		{name: "empty bin", idx: idx, bin: nil, want: ErrTruncated, contains: []string{"has 0 bytes", "describes 20 bytes"}},
		{name: "bin too long", idx: idx, bin: append(append([]byte(nil), bin...), 0, 0), want: ErrFormat,
			contains: []string{"has 22 bytes", "2 bytes too many"}},
		{name: "truncated idx", idx: idx[:len(idx)-8], bin: bin, want: ErrTruncated,
			contains: []string{".idx", "4 sequences and 5 document indices", "take 122 bytes", "has 114"}},
		{name: "idx shorter than header", idx: idx[:20], bin: bin, want: ErrTruncated, contains: []string{"has 20 bytes", "header alone takes 34"}},
		{name: "idx shorter than magic", idx: idx[:5], bin: bin, want: ErrTruncated, contains: []string{"has 5 bytes"}},
		{name: "empty idx", idx: []byte{}, bin: bin, want: ErrTruncated, contains: []string{"has 0 bytes"}},
		{name: "idx extra bytes", idx: append(append([]byte(nil), idx...), 1, 2, 3), bin: bin, want: ErrFormat,
			contains: []string{"3 bytes too many"}},
		{name: "multimodal", idx: append(append([]byte(nil), idx...), 0, 0, 0, 0), bin: bin, want: ErrFormat,
			contains: []string{"multimodal"}},
		{name: "wrong magic", idx: append([]byte("TNTIDX\x00\x00\x00"), idx[9:]...), bin: bin, want: ErrFormat,
			contains: []string{`magic is "TNTIDX`, "MMIDIDX"}},
		{name: "garbage short", idx: []byte("hello"), bin: bin, want: ErrFormat, contains: []string{`"hello"`}},
		{name: "version 2", idx: put64(idx, 9, 2), bin: bin, want: ErrVersion, contains: []string{"version is 2, want 1"}},
		{name: "float64 dtype", idx: append(append(append([]byte(nil), idx[:17]...), byte(Float64)), idx[18:]...), bin: bin, want: ErrDType,
			contains: []string{"float64 (code 6)", "must be integers"}},
		{name: "float32 dtype", idx: append(append(append([]byte(nil), idx[:17]...), byte(Float32)), idx[18:]...), bin: bin, want: ErrDType,
			contains: []string{"float32 (code 7)"}},
		{name: "dtype 0", idx: append(append(append([]byte(nil), idx[:17]...), 0), idx[18:]...), bin: bin, want: ErrDType,
			contains: []string{"dtype code is 0", "1..8"}},
		{name: "dtype 9", idx: append(append(append([]byte(nil), idx[:17]...), 9), idx[18:]...), bin: bin, want: ErrDType,
			contains: []string{"dtype code is 9"}},
		{name: "sequence count overflows", idx: put64(idx, 18, math.MaxUint64), bin: bin, want: ErrFormat,
			contains: []string{"18446744073709551615 sequences", "2^63"}},
		{name: "document count overflows", idx: put64(idx, 26, 1<<62), bin: bin, want: ErrFormat,
			contains: []string{"4611686018427387904 document indices"}},
		{name: "sequence count too large for file", idx: put64(idx, 18, 1000), bin: bin, want: ErrTruncated,
			contains: []string{"1000 sequences and 5 document indices", "take 12074 bytes", "has 122"}},
		{name: "zero document count", idx: append(put64(idx, 26, 0)[:docsAt], make([]byte, 0)...), bin: bin, want: ErrFormat,
			contains: []string{"document count is 0"}},
		{name: "negative length", idx: put32(idx, lensAt+4, math.MaxUint32), bin: bin, want: ErrFormat,
			contains: []string{"sequence_lengths[1] is -1"}},
		{name: "pointer past bin", idx: put64(idx, ptrsAt+8*3, 1<<40), bin: bin, want: ErrFormat,
			contains: []string{"sequence_pointers[3] is 1099511627776, want 12"}},
		{name: "first pointer not 0", idx: put64(idx, ptrsAt, 2), bin: bin, want: ErrFormat,
			contains: []string{"sequence_pointers[0] is 2, want 0"}},
		{name: "overlapping pointers", idx: put64(idx, ptrsAt+8*2, 6), bin: bin, want: ErrFormat,
			contains: []string{"sequence_pointers[2] is 6, want 10", "sequence 1 starts at byte 6 and has 2 tokens"}},
		{name: "lengths past bin", idx: put32(idx, lensAt+4*3, 5), bin: bin, want: ErrTruncated,
			contains: []string{"has 20 bytes", "describes 22 bytes"}},
		{name: "document indices not monotone", idx: put64(idx, docsAt+8*2, 4), bin: bin, want: ErrFormat,
			contains: []string{"document_indices[3] is 3, below document_indices[2] = 4"}},
		{name: "document indices start past 0", idx: put64(idx, docsAt, 1), bin: bin, want: ErrFormat,
			contains: []string{"document_indices[0] is 1, want 0"}},
		{name: "document index past count", idx: put64(idx, docsAt+8*4, 9), bin: bin, want: ErrFormat,
			contains: []string{"document_indices[4] is 9, past the sequence count 4"}},
		{name: "last document index short", idx: put64(idx, docsAt+8*4, 3), bin: bin, want: ErrFormat,
			contains: []string{"last document index is 3, want the sequence count 4"}},
		{name: "no idx", noIdx: true, bin: bin, want: os.ErrNotExist, contains: []string{"a dataset is PREFIX.bin and PREFIX.idx"}},
		{name: "no bin", idx: idx, noBin: true, want: os.ErrNotExist, contains: []string{"PREFIX.bin and PREFIX.idx"}},
		{name: "prefix with .bin", suffix: ".bin", idx: idx, bin: bin, want: os.ErrNotExist, contains: []string{"give the prefix without .bin or .idx"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, mapped := range []bool{true, false} {
				if !mapped {
					withoutMmap(t)
				}
				prefix := filepath.Join(t.TempDir(), "d")
				if !tc.noIdx {
					require.NoError(t, os.WriteFile(prefix+".idx", tc.idx, 0o644))
				}
				if !tc.noBin {
					require.NoError(t, os.WriteFile(prefix+".bin", tc.bin, 0o644))
				}
				d, err := Open(prefix + tc.suffix)
				require.Error(t, err)
				assert.Nil(t, d)
				assert.ErrorIs(t, err, tc.want)
				for _, s := range tc.contains {
					assert.Contains(t, err.Error(), s)
				}
			}
		})
	}
}

func TestOpenFolderIsNotAFile(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "d")
	require.NoError(t, os.Mkdir(prefix+".idx", 0o755))
	_, err := Open(prefix)
	assert.ErrorIs(t, err, ErrFormat)
	assert.Contains(t, err.Error(), "not a regular file")
}

func TestReadAllDTypes(t *testing.T) {
	for _, dt := range []DType{Uint8, Int8, Int16, Int32, Int64, Uint16} {
		for _, mapped := range []bool{true, false} {
			t.Run(dt.String()+"/mmap="+strconv.FormatBool(mapped), func(t *testing.T) {
				if !mapped {
					withoutMmap(t)
				}
				_, hi := dt.Range()
				docs := [][]int32{{0, 1, 2}, {}, {hi, 3, hi - 1}, {7}}
				prefix := filepath.Join(t.TempDir(), "d")
				w, err := Create(prefix, dt)
				require.NoError(t, err)
				for _, doc := range docs {
					require.NoError(t, w.Add(doc))
				}
				assert.Equal(t, int64(4), w.Documents())
				assert.Equal(t, int64(7), w.Tokens())
				require.NoError(t, w.Commit())

				d, err := Open(prefix)
				require.NoError(t, err)
				defer d.Close()
				assert.Equal(t, dt, d.DType())
				assert.Equal(t, prefix, d.Prefix())
				assert.Equal(t, 4, d.NumSequences())
				assert.Equal(t, 4, d.NumDocuments())
				assert.Equal(t, int64(7), d.Tokens())
				assert.Equal(t, []int64{0, 1, 2, 3, 4}, d.Documents())
				assert.Equal(t, docs, sequences(t, d))
				m, err := d.MaxToken()
				require.NoError(t, err)
				assert.Equal(t, hi, m)

				// A window inside a sequence.
				got := make([]int32, 2)
				require.NoError(t, d.Read(2, 1, got))
				assert.Equal(t, []int32{3, hi - 1}, got)
			})
		}
	}
}

func TestReadBounds(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "d")
	small.write(t, prefix)
	d, err := Open(prefix)
	require.NoError(t, err)
	tests := []struct {
		name        string
		seq, offset int
		n           int
		contains    string
	}{
		{"negative sequence", -1, 0, 1, "sequence -1 does not exist (the dataset has 4, 0..3)"},
		{"sequence past end", 4, 0, 1, "sequence 4 does not exist"},
		{"negative offset", 0, -1, 1, "tokens [-1, 0) of sequence 0, which has 3 tokens"},
		{"past the end", 0, 2, 2, "tokens [2, 4) of sequence 0, which has 3 tokens"},
		{"offset past the end", 0, 4, 0, "tokens [4, 4)"},
		{"short sequence", 2, 0, 2, "tokens [0, 2) of sequence 2, which has 1 tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Read(tc.seq, tc.offset, make([]int32, tc.n))
			assert.ErrorIs(t, err, ErrBounds)
			assert.Contains(t, err.Error(), tc.contains)
		})
	}
	require.NoError(t, d.Read(0, 3, nil), "an empty read at the end is fine")
	assert.Equal(t, 0, d.SequenceLen(-1))
	assert.Equal(t, 0, d.SequenceLen(99))

	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "a second Close does nothing")
	assert.ErrorIs(t, d.Read(0, 0, make([]int32, 1)), ErrClosed)
	_, err = d.MaxToken()
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, 0, d.NumSequences())
	assert.Nil(t, d.Documents())
}

func TestInvalidStoredIDs(t *testing.T) {
	tests := []struct {
		name     string
		raw      rawDataset
		seq, pos int
		value    string
	}{
		{"int64 above int32", rawDataset{Int64, [][][]int64{{{1, 2}}, {{3, math.MaxInt32 + 1, 4}}}}, 1, 1, "2147483648"},
		{"int64 negative", rawDataset{Int64, [][][]int64{{{-5}}}}, 0, 0, "-5"},
		{"int16 negative", rawDataset{Int16, [][][]int64{{{1}, {2, 3, -1}}}}, 1, 2, "-1"},
		{"int32 negative", rawDataset{Int32, [][][]int64{{{1, 2, 3, 4}}, {}, {{0, -7}}}}, 1, 1, "-7"},
		{"int8 negative", rawDataset{Int8, [][][]int64{{{-128}}}}, 0, 0, "-128"},
	}
	for _, tc := range tests {
		for _, mapped := range []bool{true, false} {
			t.Run(tc.name+"/mmap="+strconv.FormatBool(mapped), func(t *testing.T) {
				if !mapped {
					withoutMmap(t)
				}
				prefix := filepath.Join(t.TempDir(), "d")
				tc.raw.write(t, prefix)
				d, err := Open(prefix)
				require.NoError(t, err, "Open checks the index, not the ids")
				defer d.Close()
				err = d.Read(tc.seq, 0, make([]int32, d.SequenceLen(tc.seq)))
				assert.ErrorIs(t, err, ErrTokenRange)
				assert.Contains(t, err.Error(), "sequence "+strconv.Itoa(tc.seq)+", token "+strconv.Itoa(tc.pos)+" holds "+tc.value)
				_, err = d.MaxToken()
				assert.ErrorIs(t, err, ErrTokenRange)
				assert.Contains(t, err.Error(), "sequence "+strconv.Itoa(tc.seq)+", token "+strconv.Itoa(tc.pos))
				assert.Contains(t, err.Error(), "holds "+tc.value)
			})
		}
	}
}

func TestMaxTokenEmptyAndLarge(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "empty")
	w, err := Create(prefix, Uint16)
	require.NoError(t, err)
	require.NoError(t, w.Commit())
	d, err := Open(prefix)
	require.NoError(t, err)
	m, err := d.MaxToken()
	require.NoError(t, err)
	assert.Equal(t, int32(-1), m, "no tokens")
	assert.Equal(t, 0, d.NumDocuments())
	require.NoError(t, d.Close())

	// Three scan chunks with the largest id in the middle one, on every
	// read path.
	for _, mapped := range []bool{true, false} {
		t.Run("mmap="+strconv.FormatBool(mapped), func(t *testing.T) {
			if !mapped {
				withoutMmap(t)
			}
			prefix := filepath.Join(t.TempDir(), "large")
			w, err := Create(prefix, Int32)
			require.NoError(t, err)
			doc := make([]int32, 1<<20)
			for i := range doc {
				doc[i] = int32(i % 50000)
			}
			for k := range 5 { // 20 MiB of int32 tokens
				if k == 3 {
					doc[12345] = 70000
				}
				require.NoError(t, w.Add(doc))
				doc[12345] = 12345
			}
			require.NoError(t, w.Commit())
			d, err := Open(prefix)
			require.NoError(t, err)
			defer d.Close()
			m, err := d.MaxToken()
			require.NoError(t, err)
			assert.Equal(t, int32(70000), m)
			m, err = d.MaxToken()
			require.NoError(t, err)
			assert.Equal(t, int32(70000), m, "cached")
		})
	}
}

func TestWriterRefusesTokens(t *testing.T) {
	tests := []struct {
		dt       DType
		doc      []int32
		contains string
	}{
		{Uint16, []int32{1, 65536}, "document 0, token 1 is 65536, which uint16 cannot hold (0..65535)"},
		{Uint16, []int32{-1}, "token 0 is -1, which uint16 cannot hold"},
		{Uint8, []int32{255, 256}, "token 1 is 256, which uint8 cannot hold (0..255)"},
		{Int16, []int32{32768}, "which int16 cannot hold (0..32767)"},
		{Int32, []int32{0, -2}, "token 1 is -2, which int32 cannot hold (0..2147483647)"},
	}
	for _, tc := range tests {
		t.Run(tc.dt.String(), func(t *testing.T) {
			dir := t.TempDir()
			w, err := Create(filepath.Join(dir, "d"), tc.dt)
			require.NoError(t, err)
			err = w.Add(tc.doc)
			assert.ErrorIs(t, err, ErrTokenRange)
			assert.Contains(t, err.Error(), tc.contains)
			assert.Contains(t, err.Error(), "int32")
			require.NoError(t, w.Add([]int32{1}), "a refused document leaves the writer usable")
			w.Abort()
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, entries, "Abort leaves nothing")
		})
	}
}

func TestWriterLifecycle(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "d")
	small.write(t, prefix) // an older dataset under the same name

	w, err := Create(prefix, Int32)
	require.NoError(t, err)
	require.NoError(t, w.Add([]int32{100, 200}))
	// Until Commit, the old dataset is untouched and the new one exists
	// only under temporary names.
	d, err := Open(prefix)
	require.NoError(t, err)
	assert.Equal(t, Uint16, d.DType())
	require.NoError(t, d.Close())
	names := dirNames(t, dir)
	assert.Len(t, names, 4)
	assert.Contains(t, strings.Join(names, " "), "d.bin.tmp-")
	assert.Contains(t, strings.Join(names, " "), "d.idx.tmp-")

	require.NoError(t, w.Commit())
	assert.Equal(t, []string{"d.bin", "d.idx"}, dirNames(t, dir))
	d, err = Open(prefix)
	require.NoError(t, err)
	assert.Equal(t, [][]int32{{100, 200}}, sequences(t, d))
	require.NoError(t, d.Close())

	assert.ErrorIs(t, w.Add([]int32{1}), ErrClosed)
	assert.ErrorIs(t, w.Commit(), ErrClosed)
	w.Abort() // nothing to do after Commit
	assert.Equal(t, []string{"d.bin", "d.idx"}, dirNames(t, dir))
}

// The sizes a Writer announces before Commit are the files' (a record
// written before the dataset appears describes them), and a companion
// goes into place with the pair, replacing the old one.
func TestWriterCompanion(t *testing.T) {
	for _, dt := range []DType{Uint8, Uint16, Int32, Int64} {
		t.Run(dt.String(), func(t *testing.T) {
			dir := t.TempDir()
			prefix := filepath.Join(dir, "d")
			require.NoError(t, os.WriteFile(prefix+".json", []byte("old"), 0o644))
			w, err := Create(prefix, dt)
			require.NoError(t, err)
			for _, doc := range [][]int32{{1, 2, 3}, {}, {4}} {
				require.NoError(t, w.Add(doc))
			}
			binBytes, idxBytes := w.BinBytes(), w.IdxBytes()
			tmp := filepath.Join(dir, "d.json.tmp-1")
			require.NoError(t, os.WriteFile(tmp, []byte("new"), 0o644))
			require.NoError(t, w.Commit(Companion{Temp: tmp, Path: prefix + ".json"}))
			assert.Equal(t, []string{"d.bin", "d.idx", "d.json"}, dirNames(t, dir))
			for ext, want := range map[string]int64{".bin": binBytes, ".idx": idxBytes} {
				st, err := os.Stat(prefix + ext)
				require.NoError(t, err)
				assert.Equal(t, want, st.Size(), ext)
			}
			b, err := os.ReadFile(prefix + ".json")
			require.NoError(t, err)
			assert.Equal(t, "new", string(b))
		})
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestCreateErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		prefix   string
		dt       DType
		want     error
		contains string
	}{
		{"float dtype", filepath.Join(dir, "d"), Float64, ErrDType, "must be stored as an integer type"},
		{"unknown dtype", filepath.Join(dir, "d"), 0, ErrDType, "dtype(0)"},
		{"missing folder", filepath.Join(dir, "nope", "d"), Uint16, os.ErrNotExist, "the output folder"},
		{"prefix is a folder", dir, Uint16, nil, "the prefix is a folder"},
		{"prefix ends in a separator, its folder missing", filepath.Join(dir, "newdir") + string(filepath.Separator), Uint16, nil,
			"the prefix ends in a path separator, so it names a folder; give a path prefix inside it, such as " + filepath.Join(dir, "newdir", "data")},
		{"prefix ends in a separator, its folder there", dir + "/", Uint16, nil, "the prefix ends in a path separator"},
		{"empty prefix", "", Uint16, nil, "the output prefix is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Create(tc.prefix, tc.dt)
			require.Error(t, err)
			assert.Nil(t, w)
			if tc.want != nil {
				assert.ErrorIs(t, err, tc.want)
			}
			assert.Contains(t, err.Error(), tc.contains)
		})
	}
	if os.Getuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		require.NoError(t, os.Mkdir(ro, 0o555))
		_, err := Create(filepath.Join(ro, "d"), Uint16)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not writable")
	}
}

func TestFingerprint(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "d")
	small.write(t, prefix)
	open := func() string {
		d, err := Open(prefix)
		require.NoError(t, err)
		defer d.Close()
		fp := d.Fingerprint()
		assert.Equal(t, fp, d.Fingerprint())
		return fp
	}
	first := open()
	assert.Len(t, first, 32)
	assert.Equal(t, first, open(), "the same files, the same fingerprint")

	// The same sizes and times but one token changed.
	info, err := os.Stat(prefix + ".bin")
	require.NoError(t, err)
	idx, bin := small.bytes()
	bin[len(bin)-1] ^= 1
	writeFiles(t, prefix, idx, bin)
	require.NoError(t, os.Chtimes(prefix+".bin", info.ModTime(), info.ModTime()))
	require.NoError(t, os.Chtimes(prefix+".idx", info.ModTime(), info.ModTime()))
	second := open()
	assert.NotEqual(t, first, second)

	// Only the time changed.
	later := info.ModTime().Add(time.Second)
	require.NoError(t, os.Chtimes(prefix+".bin", later, later))
	assert.NotEqual(t, second, open())

	withoutMmap(t)
	assert.Len(t, open(), 32)
}

// TestTruncatedAfterOpen: a .bin cut short under an open dataset is an
// error, not a crash (the mapped pages past the new end fault).
func TestTruncatedAfterOpen(t *testing.T) {
	for _, mapped := range []bool{true, false} {
		t.Run("mmap="+strconv.FormatBool(mapped), func(t *testing.T) {
			if !mapped {
				withoutMmap(t)
			}
			prefix := filepath.Join(t.TempDir(), "d")
			w, err := Create(prefix, Uint16)
			require.NoError(t, err)
			doc := make([]int32, 1<<16) // several pages
			require.NoError(t, w.Add(doc))
			require.NoError(t, w.Add(doc))
			require.NoError(t, w.Commit())
			d, err := Open(prefix)
			require.NoError(t, err)
			defer d.Close()
			require.NoError(t, os.Truncate(prefix+".bin", 0))
			err = d.Read(1, 0, make([]int32, 100))
			assert.ErrorIs(t, err, ErrTruncated)
			assert.Contains(t, err.Error(), prefix+".bin")
			assert.Contains(t, err.Error(), "after Open")
			_, err = d.MaxToken()
			assert.ErrorIs(t, err, ErrTruncated)
			assert.Contains(t, err.Error(), prefix+".bin")
		})
	}
}

// TestScanKeepsMemoryFlat: scanning a .bin several times larger than the
// allowance leaves the process's resident memory about where it was.
func TestScanKeepsMemoryFlat(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads resident memory from /proc/self/status, which only Linux has")
	}
	prefix := filepath.Join(t.TempDir(), "d")
	const size = 96 << 20
	bin := make([]byte, size)
	bin[size-1] = 1
	writeFiles(t, prefix, rawIndex(Uint8, size), bin)
	bin = nil
	runtime.GC()
	d, err := Open(prefix)
	require.NoError(t, err)
	defer d.Close()
	before := rssFile(t)
	m, err := d.MaxToken()
	require.NoError(t, err)
	assert.Equal(t, int32(1), m)
	grew := rssFile(t) - before
	assert.Less(t, grew, int64(32<<20), "resident file pages grew by %d bytes scanning %d", grew, size)
}

// rawIndex is the .idx of one sequence of n tokens.
func rawIndex(dt DType, n int) []byte {
	idx, _ := rawDataset{dtype: dt, docs: [][][]int64{{{}}}}.bytes()
	return put32(idx, headerSize, uint32(n))
}

// rssFile is the process's resident file-backed memory, in bytes.
func rssFile(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Skip("no RssFile line in /proc/self/status")
	return 0
}

func TestDTypes(t *testing.T) {
	tests := []struct {
		vocab int
		want  DType
	}{
		{256, Uint16}, {50257, Uint16}, {65499, Uint16},
		{65500, Int32}, {65536, Int32}, {128256, Int32}, {0, Int32}, {-1, Int32},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, DTypeFor(tc.vocab), "vocab %d", tc.vocab)
	}
	for code := range 10 {
		dt := DType(code)
		b, err := dt.MarshalText()
		if !dt.known() {
			assert.ErrorIs(t, err, ErrDType)
			assert.Equal(t, "dtype("+strconv.Itoa(code)+")", dt.String())
			assert.Equal(t, 0, dt.Size())
			continue
		}
		require.NoError(t, err)
		var back DType
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, dt, back)
	}
	_, err := ParseDType("bfloat16")
	assert.ErrorIs(t, err, ErrDType)
	assert.Equal(t, []int{1, 1, 2, 4, 8, 8, 4, 2}, []int{Uint8.Size(), Int8.Size(), Int16.Size(), Int32.Size(), Int64.Size(), Float64.Size(), Float32.Size(), Uint16.Size()})
	assert.True(t, errors.Is(fileErr("f", ErrFormat, "x"), ErrFormat))
}

// ContentFingerprint is the same for a copy of the files with other
// modification times, which changes Fingerprint.
func TestContentFingerprintIgnoresTimes(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "a")
	w, err := Create(prefix, Uint16)
	require.NoError(t, err)
	require.NoError(t, w.Add([]int32{1, 2, 3}))
	require.NoError(t, w.Commit())
	a, err := Open(prefix)
	require.NoError(t, err)
	defer a.Close()
	later := time.Now().Add(time.Hour)
	for _, ext := range []string{".bin", ".idx"} {
		raw, err := os.ReadFile(prefix + ext)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "b"+ext), raw, 0o644))
		require.NoError(t, os.Chtimes(filepath.Join(dir, "b"+ext), later, later))
	}
	b, err := Open(filepath.Join(dir, "b"))
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, a.ContentFingerprint(), b.ContentFingerprint())
	assert.NotEqual(t, a.Fingerprint(), b.Fingerprint())
}

// TestReadPastFourGiB reads tokens past 4 GiB of .bin and past 2^32
// tokens, where a 32-bit offset anywhere would wrap: two documents of
// the longest length an .idx can hold (2^31−1 tokens) and a third. The
// .bin is sparse, so the test writes only its markers.
func TestReadPastFourGiB(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "huge")
	lens := []uint32{math.MaxInt32, math.MaxInt32, 3}
	idx := append([]byte(nil), magic...)
	idx = binary.LittleEndian.AppendUint64(idx, 1)
	idx = append(idx, byte(Uint16))
	idx = binary.LittleEndian.AppendUint64(idx, uint64(len(lens)))
	idx = binary.LittleEndian.AppendUint64(idx, uint64(len(lens)+1))
	for _, n := range lens {
		idx = binary.LittleEndian.AppendUint32(idx, n)
	}
	var ptrs []int64
	end := int64(0)
	for _, n := range lens {
		idx = binary.LittleEndian.AppendUint64(idx, uint64(end))
		ptrs = append(ptrs, end)
		end += 2 * int64(n)
	}
	for i := range len(lens) + 1 {
		idx = binary.LittleEndian.AppendUint64(idx, uint64(i))
	}
	require.NoError(t, os.WriteFile(prefix+".idx", idx, 0o644))
	f, err := os.Create(prefix + ".bin")
	require.NoError(t, err)
	require.NoError(t, f.Truncate(end))
	for _, m := range []struct {
		at   int64
		toks []byte
	}{{ptrs[1] + 2*(math.MaxInt32-2), []byte{7, 0, 8, 0}}, {ptrs[2], []byte{1, 0, 2, 0, 3, 1}}} {
		_, err = f.WriteAt(m.toks, m.at)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	for _, mapped := range []bool{true, false} {
		t.Run(fmt.Sprintf("mapped=%v", mapped), func(t *testing.T) {
			if !mapped {
				withoutMmap(t)
			}
			d, err := Open(prefix)
			require.NoError(t, err)
			defer d.Close()
			assert.Equal(t, int64(2*math.MaxInt32+3), d.Tokens())
			got := make([]int32, 3)
			require.NoError(t, d.Read(2, 0, got))
			assert.Equal(t, []int32{1, 2, 259}, got)
			require.NoError(t, d.Read(1, math.MaxInt32-2, got[:2]))
			assert.Equal(t, []int32{7, 8}, got[:2])
			assert.ErrorIs(t, d.Read(2, 1, got), ErrBounds)
		})
	}
}

// A dataset whose .bin and .idx are links (into another folder) is
// written where they lead, the links kept: a prepare rerun over a
// dataset kept on another disk updates it there.
func TestWriterWritesThroughLinks(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	prefix := filepath.Join(dir, "d")
	for _, ext := range []string{".bin", ".idx"} {
		require.NoError(t, os.Symlink(filepath.Join(other, "real"+ext), prefix+ext))
	}
	w, err := Create(prefix, Uint16)
	require.NoError(t, err)
	require.NoError(t, w.Add([]int32{5, 6, 7}))
	require.NoError(t, w.Commit())
	for _, ext := range []string{".bin", ".idx"} {
		fi, err := os.Lstat(prefix + ext)
		require.NoError(t, err)
		assert.NotZero(t, fi.Mode()&os.ModeSymlink, "%s is still a link", ext)
	}
	d, err := Open(filepath.Join(other, "real"))
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, 1, d.NumDocuments())
	assert.Equal(t, int64(3), d.Tokens())
	es, err := os.ReadDir(other)
	require.NoError(t, err)
	assert.Len(t, es, 2, "no temporary file left beside the targets")
}
