package indexed

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The documents testdata/megatron_format.py writes (its DOCUMENTS), as the
// sequences and document indices a reader must see.
var scriptDatasets = map[DType]struct {
	seqs [][]int32
	docs []int64
}{
	Uint16: {
		seqs: [][]int32{{1, 2, 3, 50256}, {10, 11}, {12, 13, 14, 50256}, {}, {7, 8, 50256}, {0, 65535, 256, 50256}},
		docs: []int64{0, 1, 3, 3, 5, 6},
	},
	Int32: {
		seqs: [][]int32{{1, 2, 3, 100000}, {10, 11}, {12, 13, 14, 100000}, {}, {7, 8, 100000}, {0, 2147483647, 65536, 100000}},
		docs: []int64{0, 1, 3, 3, 5, 6},
	},
}

func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the interop tests run Megatron's format through testdata/megatron_format.py")
	}
	return p
}

func checkScriptDataset(t *testing.T, prefix string, dt DType) {
	t.Helper()
	want := scriptDatasets[dt]
	d, err := Open(prefix)
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, dt, d.DType())
	assert.Equal(t, len(want.seqs), d.NumSequences())
	assert.Equal(t, len(want.docs)-1, d.NumDocuments())
	assert.Equal(t, want.docs, d.Documents())
	assert.Equal(t, want.seqs, sequences(t, d))
	var tokens int64
	var hi int32
	for _, s := range want.seqs {
		tokens += int64(len(s))
		for _, v := range s {
			hi = max(hi, v)
		}
	}
	assert.Equal(t, tokens, d.Tokens())
	m, err := d.MaxToken()
	require.NoError(t, err)
	assert.Equal(t, hi, m)
}

// TestGoldenFixture reads the pair megatron_format.py wrote once, so the
// reading side is checked even where Python is missing.
func TestGoldenFixture(t *testing.T) {
	for _, tc := range []struct {
		name string
		dt   DType
	}{{"golden_uint16", Uint16}, {"golden_int32", Int32}} {
		t.Run(tc.name, func(t *testing.T) {
			checkScriptDataset(t, filepath.Join("testdata", tc.name), tc.dt)
		})
	}
}

func TestOpenReadsScriptDataset(t *testing.T) {
	py := python(t)
	for _, dt := range []DType{Uint16, Int32} {
		t.Run(dt.String(), func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "megatron")
			out, err := exec.Command(py, filepath.Join("testdata", "megatron_format.py"), "write", prefix, dt.String()).CombinedOutput()
			require.NoError(t, err, "%s", out)
			checkScriptDataset(t, prefix, dt)
		})
	}
}

func TestScriptReadsWriterDataset(t *testing.T) {
	py := python(t)
	docs := [][]int32{{5, 6, 7, 0}, {}, {1}, {65535, 0, 1, 2, 3}, {42, 42}}
	for _, dt := range []DType{Uint16, Int32} {
		t.Run(dt.String(), func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "ours")
			w, err := Create(prefix, dt)
			require.NoError(t, err)
			for _, doc := range docs {
				require.NoError(t, w.Add(doc))
			}
			require.NoError(t, w.Commit())
			out, err := exec.Command(py, filepath.Join("testdata", "megatron_format.py"), "read", prefix).Output()
			require.NoError(t, err)
			var got struct {
				DType     string    `json:"dtype"`
				Sequences [][]int32 `json:"sequences"`
				DocIdx    []int64   `json:"document_indices"`
			}
			require.NoError(t, json.Unmarshal(out, &got))
			assert.Equal(t, dt.String(), got.DType)
			assert.Equal(t, docs, got.Sequences)
			assert.Equal(t, []int64{0, 1, 2, 3, 4, 5}, got.DocIdx)
		})
	}
}
