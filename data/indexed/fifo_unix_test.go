//go:build unix

package indexed

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/internal/fifotest"
)

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
				err := fifotest.OpenWithin(t, fifo, func() error {
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
