//go:build unix

package pidlock

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A takeover's guard is never taken from a holder that lives, however
// long it has held it (a process stopped, a file system that stalls):
// taking a guard for abandoned by its age had let a second takeover
// proceed beside the first. The holder's release lets the waiting one on.
func TestGuardIsNotTakenFromALiveHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	stale := []byte("stale\n")
	require.NoError(t, os.WriteFile(path, stale, 0o644))
	guard := path + ".takeover"
	f, err := os.OpenFile(guard, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))
	old := time.Now().Add(-time.Hour)
	require.NoError(t, os.Chtimes(guard, old, old))

	done := make(chan error, 1)
	go func() { done <- TakeOver(path, stale) }()
	select {
	case err := <-done:
		t.Fatalf("the takeover went on while the guard was held (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	assert.FileExists(t, path, "the stale lock stays while another holds the guard")
	require.NoError(t, os.Remove(guard))
	require.NoError(t, f.Close())
	require.NoError(t, <-done)
	assert.NoFileExists(t, path)
	assert.NoFileExists(t, guard)
}

// Where the file system has no flock (Lustre without it: ENOSYS), the
// guard is made with O_EXCL instead, and a stale lock is still taken
// over, once, leaving no guard file behind.
func TestGuardWithoutFlock(t *testing.T) {
	old := flock
	t.Cleanup(func() { flock = old })
	flock = func(int, int) error { return syscall.ENOSYS }
	dir := t.TempDir()
	path := filepath.Join(dir, "x.lock")
	stale := []byte("stale\n")
	require.NoError(t, os.WriteFile(path, stale, 0o644))
	require.NoError(t, TakeOver(path, stale))
	assert.NoFileExists(t, path)
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, left, "no guard file left")
	oneTakesOver(t, false)
}
