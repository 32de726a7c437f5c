//go:build unix

package indexed

import (
	"os"
	"path/filepath"
	"strconv"
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

// TestOpenRefusesFIFO puts a FIFO in place of each of a dataset's files:
// Open refuses it, naming it, instead of waiting for a writer.
func TestOpenRefusesFIFO(t *testing.T) {
	for _, ext := range []string{".idx", ".bin"} {
		for _, mapped := range []bool{true, false} {
			t.Run(ext+"/mmap="+strconv.FormatBool(mapped), func(t *testing.T) {
				if !mapped {
					withoutMmap(t)
				}
				prefix := filepath.Join(t.TempDir(), "d")
				rawDataset{dtype: Uint16, docs: [][][]int64{{{1, 2, 3}}, {{4, 5}}}}.write(t, prefix)
				fifo := prefix + ext
				require.NoError(t, os.Remove(fifo))
				require.NoError(t, syscall.Mkfifo(fifo, 0o644))
				err := openWithin(t, fifo, func() error {
					d, err := Open(prefix)
					if err == nil {
						_ = d.Close()
					}
					return err
				})
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrFormat)
				assert.Contains(t, err.Error(), fifo+": ")
				assert.Contains(t, err.Error(), "not a regular file")
			})
		}
	}
}
