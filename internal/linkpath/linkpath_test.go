package linkpath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTarget(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other")
	require.NoError(t, os.MkdirAll(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, "file"), nil, 0o644))
	link := func(name, to string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.Symlink(to, p))
		return p
	}
	abs := link("abs", filepath.Join(other, "file"))
	rel := link("rel", "other/file")
	chain := link("chain", "rel")
	dangling := link("dangling", "other/new")
	link("loop-a", "loop-b")
	loop := link("loop-b", "loop-a")
	for _, tc := range []struct {
		name, path, want string
	}{
		{"a plain file", filepath.Join(other, "file"), filepath.Join(other, "file")},
		{"a path that does not exist", filepath.Join(dir, "none"), filepath.Join(dir, "none")},
		{"an absolute link", abs, filepath.Join(other, "file")},
		{"a link relative to its folder", rel, filepath.Join(other, "file")},
		{"a chain of links", chain, filepath.Join(other, "file")},
		{"a link to a file yet to be written", dangling, filepath.Join(other, "new")},
		{"a loop is the path itself", loop, loop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Target(tc.path))
		})
	}
}
