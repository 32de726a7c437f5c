//go:build unix

package tokenizer

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/internal/fifotest"
)

// TestLoadRefusesFIFO puts a FIFO in place of each file Load reads: it is
// refused, naming it, instead of waiting for a writer.
func TestLoadRefusesFIFO(t *testing.T) {
	tokenizerJSON := tokJSON(bpeModel(byteLevelVocab(), []any{}), nil, byteLevelPre, nil, nil)
	tests := []struct {
		name  string
		fifo  string
		files map[string]any // JSON files written beside it
		path  string         // Load's path and merges, in the test's folder
		merge string
	}{
		{name: "tokenizer.json named", fifo: "tokenizer.json", path: "tokenizer.json"},
		{name: "tokenizer.json in a folder", fifo: "tokenizer.json", path: "."},
		{name: "merges named", fifo: "merges.txt", files: map[string]any{"vocab.json": byteLevelVocab()}, path: "vocab.json", merge: "merges.txt"},
		{name: "merges.txt in a folder", fifo: "merges.txt", files: map[string]any{"vocab.json": byteLevelVocab()}, path: "."},
		{name: "tokenizer_config.json beside", fifo: "tokenizer_config.json", files: map[string]any{"tokenizer.json": tokenizerJSON}, path: "tokenizer.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, v := range tc.files {
				writeJSON(t, dir, name, v)
			}
			fifo := filepath.Join(dir, tc.fifo)
			require.NoError(t, syscall.Mkfifo(fifo, 0o644))
			merges := ""
			if tc.merge != "" {
				merges = filepath.Join(dir, tc.merge)
			}
			err := fifotest.OpenWithin(t, fifo, func() error {
				_, err := Load(filepath.Join(dir, tc.path), merges)
				return err
			})
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrFormat)
			assert.Contains(t, err.Error(), fifo+": not a regular file")
		})
	}
}
