package tokenizer

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// HFFiles names a tokenizer's files as AutoTokenizer reads them beside a
// model, unzipped: a tokenizer.json with the config beside it, and
// GPT-2's encoder.json and vocab.bpe as vocab.json and merges.txt.
func TestHFFilesAreWhatAutoTokenizerReads(t *testing.T) {
	unzip := func(path string) []byte {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		require.NoError(t, err)
		out, err := io.ReadAll(zr)
		require.NoError(t, err)
		return out
	}
	read := func(path string) []byte {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		return raw
	}
	llama3 := filepath.Join("testdata", "llama3")
	gpt2 := filepath.Join("testdata", "gpt2")
	for _, tc := range []struct {
		name         string
		path, merges string
		want         []HFFile
	}{
		{"a folder", llama3, "", []HFFile{
			{"tokenizer.json", unzip(filepath.Join(llama3, "tokenizer.json.gz"))},
			{"tokenizer_config.json", read(filepath.Join(llama3, "tokenizer_config.json"))}}},
		{"the file", filepath.Join(llama3, "tokenizer.json.gz"), "", []HFFile{
			{"tokenizer.json", unzip(filepath.Join(llama3, "tokenizer.json.gz"))},
			{"tokenizer_config.json", read(filepath.Join(llama3, "tokenizer_config.json"))}}},
		{"GPT-2's pair", filepath.Join(gpt2, "encoder.json.gz"), filepath.Join(gpt2, "vocab.bpe.gz"), []HFFile{
			{"vocab.json", unzip(filepath.Join(gpt2, "encoder.json.gz"))},
			{"merges.txt", unzip(filepath.Join(gpt2, "vocab.bpe.gz"))}}},
		{"GPT-2's folder", gpt2, "", []HFFile{
			{"vocab.json", unzip(filepath.Join(gpt2, "encoder.json.gz"))},
			{"merges.txt", unzip(filepath.Join(gpt2, "vocab.bpe.gz"))}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path, tc.merges)
			require.NoError(t, err)
			got, err := HFFiles(tc.path, tc.merges)
			require.NoError(t, err)
			require.Len(t, got, len(tc.want))
			for i, f := range got {
				assert.Equal(t, tc.want[i].Name, f.Name)
				assert.True(t, bytes.Equal(tc.want[i].Data, f.Data), "%s: %d bytes, want %d", f.Name, len(f.Data), len(tc.want[i].Data))
			}
		})
	}
}
