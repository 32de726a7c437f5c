package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// entries are the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// WriteFileAtomic replaces the file and touches nothing else beside it: a
// user's file named like a fixed temporary name is kept.
func TestWriteFileAtomicTouchesNoOtherFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.json")
	require.NoError(t, os.WriteFile(path+".tmp", []byte("the user's"), 0o600))
	require.NoError(t, WriteFileAtomic(path, []byte("first")))
	require.NoError(t, WriteFileAtomic(path, []byte("second")))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "second", string(raw))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm(), "readable as os.WriteFile's outputs are")
	raw, err = os.ReadFile(path + ".tmp")
	require.NoError(t, err)
	assert.Equal(t, "the user's", string(raw))
	assert.Equal(t, []string{"m.json", "m.json.tmp"}, entries(t, dir))
}

// A write that fails (a full disk, here a temporary file that cannot be
// written; or a folder where the file goes, which the rename cannot
// replace) leaves the file that was there and no temporary file, synced
// or not (ReplaceFile, the dumps').
func TestWriteFileAtomicFailureLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.json")
	require.NoError(t, os.WriteFile(path, []byte("before"), 0o644))

	saved := createTemp
	t.Cleanup(func() { createTemp = saved })
	createTemp = func(dir, pattern string) (*os.File, error) {
		f, err := os.CreateTemp(dir, pattern)
		if err != nil {
			return nil, err
		}
		name := f.Name()
		require.NoError(t, f.Close())
		return os.Open(name) // read-only: every write fails
	}
	for _, write := range []func(string, []byte) error{WriteFileAtomic, ReplaceFile} {
		err := write(path, []byte("after"))
		require.Error(t, err)
		assert.ErrorContains(t, err, "write "+path)
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "before", string(raw))
		assert.Equal(t, []string{"m.json"}, entries(t, dir))
	}
	createTemp = saved

	blocked := filepath.Join(dir, "blocked")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "keep"), 0o755))
	require.Error(t, WriteFileAtomic(blocked, []byte("after")))
	assert.Equal(t, []string{"blocked", "m.json"}, entries(t, dir))
}

// An output gets the mode os.WriteFile gives a new file, 0644 less the
// umask: readable by others under umask 022, private under 077.
func TestWriteFileAtomicKeepsTheUmask(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		umask int
		want  os.FileMode
	}{{0o022, 0o644}, {0o077, 0o600}} {
		old := syscall.Umask(tc.umask)
		path := filepath.Join(dir, fmt.Sprintf("m-%o.json", tc.umask))
		err := WriteFileAtomic(path, []byte("{}"))
		syscall.Umask(old)
		require.NoError(t, err)
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, tc.want, fi.Mode().Perm(), "umask %o", tc.umask)
	}
}

// A temporary file that a process of this host left when it was killed
// (a --save cut short) is removed by the next write of the same file;
// one of a live process, one of another host and a name CreateTemp does
// not make are kept.
func TestWriteRemovesTheTemporaryFilesOfTheKilled(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	_, myHost, _ := strings.Cut(tempOwner(), "@")
	names := map[string]bool{ // kept?
		fmt.Sprintf(".w.safetensors.%d@%s.abc.tmp", gone.Process.Pid, myHost):     false,
		fmt.Sprintf(".w.safetensors.%d@%s.abc.tmp", os.Getppid(), myHost):         true,
		fmt.Sprintf(".w.safetensors.%d@%s.abc.tmp", gone.Process.Pid, "0badc0de"): true,
		".w.safetensors.mine.tmp": true,
	}
	for name := range names {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("half"), 0o644))
	}
	require.NoError(t, WriteFileAtomic(path, []byte("whole")))
	for name, kept := range names {
		_, err := os.Stat(filepath.Join(dir, name))
		assert.Equal(t, kept, err == nil, "%s kept", name)
	}
	f, err := CreateTemp(dir, ".x.*.tmp")
	require.NoError(t, err)
	defer f.Close()
	assert.True(t, strings.HasPrefix(filepath.Base(f.Name()), ".x."+tempOwner()+"."), f.Name())
}

// An output named through a symbolic link is written where the link
// leads, a link to a file yet to be written too: the link stays, and no
// temporary file is left in either folder.
func TestOutputsAreWrittenThroughLinks(t *testing.T) {
	for name, write := range map[string]func(string, []byte) error{"WriteFileAtomic": WriteFileAtomic, "ReplaceFile": ReplaceFile} {
		t.Run(name, func(t *testing.T) {
			dir, other := t.TempDir(), t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(other, "old.json"), []byte("old"), 0o644))
			require.NoError(t, os.Symlink(filepath.Join(other, "old.json"), filepath.Join(dir, "a.json")))
			require.NoError(t, os.Symlink(filepath.Join(other, "new.json"), filepath.Join(dir, "b.json")))
			for _, f := range []string{"a.json", "b.json"} {
				require.NoError(t, write(filepath.Join(dir, f), []byte("from "+f)))
				fi, err := os.Lstat(filepath.Join(dir, f))
				require.NoError(t, err)
				assert.NotZero(t, fi.Mode()&os.ModeSymlink, "%s is still a link", f)
			}
			for target, want := range map[string]string{"old.json": "from a.json", "new.json": "from b.json"} {
				raw, err := os.ReadFile(filepath.Join(other, target))
				require.NoError(t, err)
				assert.Equal(t, want, string(raw))
			}
			assert.Equal(t, []string{"a.json", "b.json"}, entries(t, dir))
			assert.Equal(t, []string{"new.json", "old.json"}, entries(t, other))
		})
	}
}
