package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFailuresNamesWhatTestreportPrinted(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      []string
	}{
		{"a failed test and its package", "ok  \tgcompile/ir\t1.0s\n=== RUN   TestX\n--- FAIL: TestX (0.30s)\n    x_test.go:3: boom\nFAIL\tgcompile/cost\t2.1s\n",
			[]string{"TestX", "package gcompile/cost"}},
		{"a subtest", "    --- FAIL: TestY/case_1 (0.00s)\n", []string{"TestY/case_1"}},
		{"a timeout", "--- did not finish: TestSlow\n=== RUN   TestSlow\npanic: test timed out after 15m0s\nFAIL\tgcompile/tests\t900.1s\n",
			[]string{"TestSlow (did not finish)", "test timed out after 15m0s", "package gcompile/tests"}},
		{"a build failure", "FAIL\tgcompile/passes [build failed]\n", []string{"package gcompile/passes"}},
		{"nothing named", "make: *** [Makefile:32: test] Error 2\n", []string{"no failed test named (see the log)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			require.NoError(t, os.WriteFile(path, []byte(tc.log), 0o644))
			assert.Equal(t, tc.want, failures(path))
		})
	}
}

// TestHuntReportsPassesAndFailures runs a target that passes and one that
// fails in clones of a scratch repository.
func TestHuntReportsPassesAndFailures(t *testing.T) {
	repo := t.TempDir()
	mk := "pass:\n\t@echo ok\nfail:\n\t@echo '--- FAIL: TestBroken (0.01s)'; exit 1\nhang:\n\t@sleep 317 & echo $$! > hang.pid; wait\n"
	require.NoError(t, os.WriteFile(filepath.Join(repo, "Makefile"), []byte(mk), 0o644))
	for _, args := range [][]string{{"init", "-q"}, {"add", "Makefile"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"}} {
		_, err := git(repo, args...)
		require.NoError(t, err)
	}
	out := filepath.Join(t.TempDir(), "summary.txt")
	var w nopWriter
	failed, err := hunt(options{rounds: 2, parallel: 2, burn: 1, target: "pass", repo: repo, out: out, timeout: time.Minute}, &w)
	require.NoError(t, err)
	assert.False(t, failed)
	failed, err = hunt(options{rounds: 1, parallel: 1, target: "fail", repo: repo, out: out, timeout: time.Minute}, &w)
	require.NoError(t, err)
	assert.True(t, failed)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(raw), "4 passed, 0 failed")
	assert.Contains(t, string(raw), "0 passed, 1 failed")
	assert.Contains(t, string(raw), "round 1 clone 1: FAIL")
	assert.Contains(t, string(raw), "TestBroken")

	// A run past -timeout is killed with everything it started. Its
	// clone is kept in a temporary folder of this test's own: another
	// suite running at once (a flakehunt of flakehunt) has clones of the
	// same names in the shared one, and removes them.
	t.Setenv("TMPDIR", t.TempDir())
	start := time.Now()
	failed, err = hunt(options{rounds: 1, parallel: 1, target: "hang", repo: repo, timeout: 2 * time.Second, keep: true}, &w)
	require.NoError(t, err)
	assert.True(t, failed)
	assert.Less(t, time.Since(start), time.Minute)
	pids, _ := filepath.Glob(filepath.Join(os.TempDir(), "flakehunt-*", "clone-1", "hang.pid"))
	require.NotEmpty(t, pids)
	for _, p := range pids {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		require.NoError(t, err)
		// SIGKILL is delivered at once; the reaping may take a moment.
		assert.Eventually(t, func() bool { return gone(pid) }, 10*time.Second, 20*time.Millisecond, "the target's child %d is gone", pid)
		os.RemoveAll(filepath.Dir(filepath.Dir(p)))
	}
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// gone says whether pid no longer runs (absent, or a zombie not yet reaped).
func gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	_, after, _ := strings.Cut(string(raw), ") ")
	return strings.HasPrefix(after, "Z")
}
