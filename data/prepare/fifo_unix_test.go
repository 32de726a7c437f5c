//go:build unix

package prepare

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/internal/fifotest"
)

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
			err := fifotest.OpenWithin(t, fifo, func() error { return tc.do(dir) })
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
