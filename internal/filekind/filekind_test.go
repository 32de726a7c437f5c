package filekind

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	dir := t.TempDir()
	file, pipe := filepath.Join(dir, "f"), filepath.Join(dir, "p")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	require.NoError(t, syscall.Mkfifo(pipe, 0o644))
	for _, tc := range []struct {
		path, want string
	}{{file, "a file"}, {dir, "a folder"}, {pipe, "a named pipe"}, {os.DevNull, "a character device"}} {
		fi, err := os.Stat(tc.path)
		require.NoError(t, err)
		assert.Equal(t, tc.want, Of(fi.Mode()), tc.path)
	}
	assert.Equal(t, "a socket", Of(fs.ModeSocket))
	assert.Equal(t, "a block device", Of(fs.ModeDevice))
	assert.Equal(t, "a symbolic link", Of(fs.ModeSymlink))
	assert.Equal(t, "a special file", Of(fs.ModeIrregular))
}
