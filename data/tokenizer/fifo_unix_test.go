//go:build unix

package tokenizer

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openWithin runs open and returns its error, failing the test when it has
// not returned after a few seconds: opening a FIFO for reading waits for a
// writer, so a regression would otherwise hang the test binary.
func openWithin(t *testing.T, fifo string, open func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- open() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		// A writer lets the blocked open return, so the goroutine ends.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = w.Close()
		}
		t.Fatalf("still opening after 5 s with %s a FIFO: it must be refused before it is opened", fifo)
		return nil
	}
}

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
			err := openWithin(t, fifo, func() error {
				_, err := Load(filepath.Join(dir, tc.path), merges)
				return err
			})
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrFormat)
			assert.Contains(t, err.Error(), fifo+": not a regular file")
		})
	}
}
