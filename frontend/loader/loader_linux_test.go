package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
)

// alive tells whether pid is a live process: a zombie is not (a killed
// orphan waits as one until init, which may not reap promptly in a
// container, gets to it).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')') // the command name may hold spaces
	fields := strings.Fields(string(data[i+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// eventuallyDead waits up to 10 s for pid to die.
func eventuallyDead(t *testing.T, pid int, what string) {
	t.Helper()
	assert.Eventually(t, func() bool { return !alive(pid) }, 10*time.Second, 20*time.Millisecond, "%s (pid %d) is still running", what, pid)
}

// readPids waits for the model to write its pid file: the driver's pid,
// then its child's if it started one.
func readPids(t *testing.T, path string, wait time.Duration) []int {
	t.Helper()
	var data []byte
	require.Eventually(t, func() bool {
		var err error
		data, err = os.ReadFile(path)
		return err == nil
	}, wait, 20*time.Millisecond, "the model never wrote %s", path)
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	return pids
}

// A Model() that never returns is killed at the timeout, with what it
// started, and the load says so in one line; nothing is left behind.
func TestTimeoutKillsTheModel(t *testing.T) {
	l, output, progress := testLoader(t)
	l.Timeout = 2 * time.Second
	// The timeout under test is Model()'s; the build gets the default, as
	// it may be slow on a loaded machine.
	l.BuildTimeout = DefaultTimeout
	pidfile := filepath.Join(t.TempDir(), "pids")
	start := time.Now()
	_, err := l.Load(behaveModel, frontend.Config{Set: map[string]string{"mode": "6", "spawn": "2", "pidfile": pidfile}})
	elapsed := time.Since(start)

	require.Error(t, err)
	// Asked for its stacks, the driver says where the model was stuck.
	assert.Equal(t, fmt.Sprintf("%s: Model() did not return within 2s (--model-timeout); it was at %s:%d", behaveModel, behaveModel, lineOf(t, behaveSrc, "time.Sleep(10 * time.Millisecond)")), err.Error())
	var te *TimeoutError
	assert.ErrorAs(t, err, &te)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, elapsed, time.Minute)

	pids := readPids(t, pidfile, time.Second)
	require.Len(t, pids, 2, "the model started its grandchild")
	assert.False(t, alive(pids[0]), "the driver (pid %d) outlived the load", pids[0])
	eventuallyDead(t, pids[1], "the model's child")
	assertNoWorkDirs(t, l)
	assert.Contains(t, output.String(), "hello on stdout\n", "the model's prints come out even when it hangs")
	assert.NotContains(t, output.String(), "SIGQUIT", "the stacks are not the model's output")
	assert.Equal(t, "building model "+behaveModel+" …\n", progress.String(), "a load over a second says what it is doing")
}

// A gcompile killed outright (SIGKILL, no deferred cleanup) takes the
// model driver with it. The test binary, rerun as a helper, plays
// gcompile.
func TestDriverDiesWithTheLoader(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	pidfile := filepath.Join(t.TempDir(), "pids")
	helper := exec.Command(exe, "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"="+behaveModel, helperEnv+"_TMP="+t.TempDir(), helperEnv+"_PIDFILE="+pidfile)
	var stderr strings.Builder
	helper.Stderr = &stderr
	require.NoError(t, helper.Start())
	defer func() { _ = helper.Process.Kill() }()

	pids := readPids(t, pidfile, 2*time.Minute)
	require.Len(t, pids, 1)
	require.True(t, alive(pids[0]), "the driver should be running Model()")
	require.NoError(t, helper.Process.Signal(syscall.SIGKILL))
	err = helper.Wait()
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "helper: %v\n%s", err, stderr.String())
	eventuallyDead(t, pids[0], "the driver of a killed loader")
	if alive(pids[0]) {
		_ = syscall.Kill(pids[0], syscall.SIGKILL)
	}
}
