//go:build unix

package prepare

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/internal/pidlock"
)

// A second prepare of a prefix another one is writing is refused before it
// writes anything, naming the first: two at once each removed what the
// other had renamed into place, and the dataset was lost.
func TestSecondRunOnAPrefixIsRefused(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"old.txt": "old", "a.txt": "first run", "b.txt": "second run"})
	prefix := filepath.Join(dir, "out")
	_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "old.txt")}, OutputPrefix: prefix, AppendEOS: true})
	require.NoError(t, err)

	var once sync.Once
	var second error
	var during []string
	enc := byteEncoder{called: func() {
		once.Do(func() {
			_, second = Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "b.txt")}, OutputPrefix: prefix, AppendEOS: true})
			during = outputs(t, dir, "out.")
		})
	}}
	_, err = Run(context.Background(), enc, Options{Inputs: []string{filepath.Join(dir, "a.txt")}, OutputPrefix: prefix, AppendEOS: true, Workers: 1})
	require.NoError(t, err)

	require.ErrorIs(t, second, ErrLocked)
	host, _ := os.Hostname()
	assert.Contains(t, second.Error(), fmt.Sprintf("another data prepare (pid %d on host %s since ", os.Getpid(), host))
	assert.Contains(t, second.Error(), "is writing "+prefix)
	assert.Contains(t, second.Error(), "remove "+prefix+".lock if that process is gone")
	assert.Len(t, during, 6, "the old dataset, the first run's lock and temporary files, and nothing of the second: %v", during)
	assert.Equal(t, byteEncoder{}.want("first run"), readDataset(t, prefix))
	assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json"}, outputs(t, dir, "out"), "the lock is released")
}

// deadPID is the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// A lock whose process is gone, or one left empty or cut short by a crash
// long ago, is taken over; any other PREFIX.lock stops the run and stays
// as it was.
func TestPrefixLockTakeover(t *testing.T) {
	host, _ := os.Hostname()
	lock := func(l prefixLock) string {
		l.Format = lockFormat
		b, err := json.Marshal(l)
		require.NoError(t, err)
		return string(b) + "\n"
	}
	me := os.Getpid()
	tests := []struct {
		name    string
		content string
		age     time.Duration
		skip    bool
		taken   bool
		msg     string
	}{
		{name: "its process is gone", content: lock(prefixLock{Host: host, PID: deadPID(t), Since: "2020-01-01T00:00:00Z"}), taken: true},
		{name: "its pid runs another process", content: lock(prefixLock{Host: host, PID: me, Start: "1", Since: "2020-01-01T00:00:00Z"}),
			skip: pidlock.ProcessStart(me) == "", taken: true},
		{name: "its process runs", content: lock(prefixLock{Host: host, PID: me, Start: pidlock.ProcessStart(me), Since: "2020-01-01T00:00:00Z"}),
			msg: fmt.Sprintf("another data prepare (pid %d on host %s since 2020-01-01T00:00:00Z) is writing", me, host)},
		{name: "another host", content: lock(prefixLock{Host: "elsewhere", PID: 1, Since: "2020-01-01T00:00:00Z"}),
			msg: "(pid 1 on host elsewhere since 2020-01-01T00:00:00Z)"},
		{name: "someone else's file", content: "# poetry.lock\n[[package]]\n", msg: "out.lock is not a data prepare's lock"},
		{name: "another tool's JSON", content: `{"pid": 1}`, msg: "out.lock is not a data prepare's lock"},
		{name: "being written", content: "", msg: "another data prepare is taking the lock"},
		{name: "written in part", content: lock(prefixLock{Host: host, PID: me})[:20], msg: "another data prepare is taking the lock"},
		// A crash between making the lock and writing it (a power loss
		// leaves it empty): stale, as a checkpoint folder's would be.
		{name: "empty for an hour", content: "", age: time.Hour, taken: true},
		{name: "written in part an hour ago", content: lock(prefixLock{Host: host, PID: me})[:20], age: time.Hour, taken: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.skip {
				t.Skip("no /proc: a process's start time is not known")
			}
			dir := t.TempDir()
			writeTree(t, dir, map[string]string{"a.txt": "text"})
			prefix := filepath.Join(dir, "out")
			require.NoError(t, os.WriteFile(prefix+".lock", []byte(tc.content), 0o644))
			if tc.age > 0 {
				old := time.Now().Add(-tc.age)
				require.NoError(t, os.Chtimes(prefix+".lock", old, old))
			}
			_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "a.txt")}, OutputPrefix: prefix, AppendEOS: true})
			if tc.taken {
				require.NoError(t, err)
				assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json"}, outputs(t, dir, "out"))
				return
			}
			require.ErrorIs(t, err, ErrLocked)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Equal(t, []string{"out.lock"}, outputs(t, dir, "out"), "nothing written, the lock kept")
			b, err := os.ReadFile(prefix + ".lock")
			require.NoError(t, err)
			assert.Equal(t, tc.content, string(b))
		})
	}
}

// Runs racing for one prefix: each one writes the dataset whole or is
// refused, and a dataset, with its record, is always there afterwards.
func TestRacingRunsKeepADataset(t *testing.T) {
	dir := t.TempDir()
	texts := []string{"a", "bb bb", "ccc ccc ccc", "dddd dddd dddd dddd"}
	files := map[string]string{}
	for i, s := range texts {
		files[fmt.Sprintf("%d.txt", i)] = s
	}
	writeTree(t, dir, files)
	prefix := filepath.Join(dir, "out")
	for range 8 {
		var wg sync.WaitGroup
		errs := make([]error, len(texts))
		for i := range texts {
			wg.Go(func() {
				_, errs[i] = Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, fmt.Sprintf("%d.txt", i))}, OutputPrefix: prefix, AppendEOS: true, Workers: 1})
			})
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
				continue
			}
			require.ErrorIs(t, err, ErrLocked)
		}
		require.Positive(t, won)
		got := readDataset(t, prefix)
		require.Len(t, got, 1)
		m, ok, err := ReadMeta(prefix)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, int64(len(got[0])), m.Tokens)
		assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json"}, outputs(t, dir, "out"))
	}
}

// An output folder that cannot be written is named as such, though the
// lock is the first file made there.
func TestRunIntoAFolderNotWritable(t *testing.T) {
	if os.Getuid() == 0 {
		t.Skip("root writes any folder, so an unwritable one cannot be made")
	}
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.txt": "text"})
	ro := filepath.Join(dir, "ro")
	require.NoError(t, os.Mkdir(ro, 0o555))
	_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "a.txt")}, OutputPrefix: filepath.Join(ro, "out"), AppendEOS: true})
	require.ErrorIs(t, err, os.ErrPermission)
	assert.Contains(t, err.Error(), "the output folder is not writable")
}
