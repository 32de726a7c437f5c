//go:build unix

package prepare

import (
	"context"
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

// TestFIFORefused puts a FIFO where data prepare or a training run reads a
// user's file: each is refused (or, in a folder, skipped) without waiting
// for a writer.
func TestFIFORefused(t *testing.T) {
	run := func(inputs ...string) func(dir string) error {
		return func(dir string) error {
			for i := range inputs {
				inputs[i] = filepath.Join(dir, inputs[i])
			}
			_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: inputs, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true})
			return err
		}
	}
	tests := []struct {
		name     string
		fifo     string // made in the test's folder, beside a.txt
		do       func(dir string) error
		want     error // nil: no error
		contains string
	}{
		{"text input", "in.txt", run("in.txt"), ErrInput, "not a regular file"},
		{"JSON Lines input", "in.jsonl", run("in.jsonl"), ErrInput, "not a regular file"},
		{"gzipped input", "in.txt.gz", run("in.txt.gz"), ErrInput, "not a regular file"},
		{"in a folder, beside a text file", "in.txt", run("."), nil, ""},
		{"dataset metadata", "ds.json", func(dir string) error {
			_, _, err := ReadMeta(filepath.Join(dir, "ds"))
			return err
		}, ErrMeta, "not a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{"a.txt": "some text"})
			fifo := filepath.Join(dir, tc.fifo)
			require.NoError(t, syscall.Mkfifo(fifo, 0o644))
			err := openWithin(t, fifo, func() error { return tc.do(dir) })
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), fifo)
			assert.Contains(t, err.Error(), tc.contains)
		})
	}
}
