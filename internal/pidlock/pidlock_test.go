package pidlock

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A lock names a live process by host, pid and start time: a pid that is
// gone, or reused by a process started at another time, is not alive; a
// lock of another host, which cannot be told, counts as alive.
func TestAlive(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	me := os.Getpid()
	start := ProcessStart(me)
	for _, tc := range []struct {
		name  string
		host  string
		pid   int
		start string
		alive bool
	}{
		{"this process", host, me, start, true},
		{"this process, no start recorded", host, me, "", true},
		{"a process that is gone", host, dead.Process.Pid, "", false},
		{"a pid reused since", host, me, "1", start == ""},
		{"no pid", host, 0, "", false},
		{"another host", "node7", 1, "", true},
	} {
		assert.Equal(t, tc.alive, Alive(tc.host, tc.pid, tc.start), tc.name)
	}
}

// Taking over removes the stale lock read, never a lock another process
// made in its place since, and leaves no file of its own behind.
func TestTakeOverKeepsALiveLock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.lock")
	stale, live := []byte("stale\n"), []byte("live\n")
	require.NoError(t, os.WriteFile(path, live, 0o644))
	require.NoError(t, TakeOver(path, stale))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, live, b)
	require.NoError(t, os.WriteFile(path, stale, 0o644))
	require.NoError(t, TakeOver(path, stale))
	assert.NoFileExists(t, path)
	require.NoError(t, TakeOver(path, stale), "nothing to take over")
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, left)
}

// Processes that find the same stale lock take it over one at a time:
// exactly one of them holds it after. Removing it by path, or setting it
// aside and putting it back, let two hold it (the second removed, or set
// aside, the lock the first had just made).
//
// The guard a takeover holds may itself be left by a process that
// crashed holding it: the racers that find it take it one at a time too.
// (Removing a guard that had aged let two proceed: the second removed the
// guard the first had just made.)
func TestOneTakesOverAStaleLock(t *testing.T) {
	for _, crashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "no guard left", true: "a guard left by a crash"}[crashed], func(t *testing.T) {
			oneTakesOver(t, crashed)
		})
	}
}

func oneTakesOver(t *testing.T, crashed bool) {
	stale := []byte("stale\n")
	for round := range 200 {
		path := filepath.Join(t.TempDir(), "x.lock")
		require.NoError(t, os.WriteFile(path, stale, 0o644))
		if crashed {
			guard := path + ".takeover"
			require.NoError(t, os.WriteFile(guard, nil, 0o644))
			old := time.Now().Add(-time.Minute)
			require.NoError(t, os.Chtimes(guard, old, old))
		}
		var wg sync.WaitGroup
		var held atomic.Int32
		for i := range 4 {
			wg.Go(func() {
				mine := []byte{byte('a' + i), '\n'}
				for range 8 {
					err := Create(path, mine)
					if err == nil {
						held.Add(1)
						return
					}
					got, err := os.ReadFile(path)
					if err != nil {
						continue
					}
					if string(got) != string(stale) {
						return // another's lock: held
					}
					require.NoError(t, TakeOver(path, got))
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, held.Load(), "round %d: processes holding the lock", round)
	}
}

// A lock is released only by its holder.
func TestRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	require.NoError(t, Create(path, []byte("mine\n")))
	assert.ErrorIs(t, Create(path, []byte("yours\n")), os.ErrExist)
	Release(path, []byte("yours\n"))
	assert.FileExists(t, path)
	Release(path, []byte("mine\n"))
	assert.NoFileExists(t, path)
}
