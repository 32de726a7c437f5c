//go:build unix

package prepare

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withFileSizeLimit runs f with the process's file size limit at n bytes,
// so that a write past it fails (EFBIG) as it would on a full disk.
func withFileSizeLimit(t *testing.T, n uint64, f func()) {
	t.Helper()
	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old))
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: old.Max}))
	defer func() { require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)) }()
	f()
}

// A prepare whose outputs cannot be written (the disk fills while the
// dataset is finished) leaves the dataset it would have replaced as it
// was, its record included: the record was removed first, and the old
// .bin and .idx then trained unchecked with any tokenizer.
func TestFailedCommitKeepsTheOldDataset(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"old.txt": "the old dataset", "new.txt": strings.Repeat("a much larger new dataset ", 200)})
	prefix := filepath.Join(dir, "out")
	_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "old.txt")}, OutputPrefix: prefix, AppendEOS: true, Tokenizer: "old"})
	require.NoError(t, err)
	before := map[string][]byte{}
	for _, ext := range []string{".bin", ".idx", ".json"} {
		before[ext], err = os.ReadFile(prefix + ext)
		require.NoError(t, err)
	}
	// The new .bin is 10 kB, written when the dataset is finished; the
	// record, under 1 kB, fits.
	withFileSizeLimit(t, 2048, func() {
		_, err = Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "new.txt")}, OutputPrefix: prefix, AppendEOS: true, Tokenizer: "new"})
	})
	require.ErrorIs(t, err, syscall.EFBIG)
	for ext, b := range before {
		after, err := os.ReadFile(prefix + ext)
		require.NoError(t, err, ext)
		assert.Equal(t, b, after, ext)
	}
	m, ok, err := ReadMeta(prefix)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "old", m.Tokenizer)
	assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json"}, outputs(t, dir, "out"), "no temporary file is left")
}
