package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Asynchronous data parallelism as a job of several processes (the
// parameter server and replica 0 in process 0, replica r in the process
// holding rank r) trains with staleness 0 bit for bit as in one process:
// the same loss and gradient norm at every step, the same held-out loss,
// the same saved master weights, and every replica's and the server's
// measured peak equal to the plan's.
func TestAsyncAcrossProcessesMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	t.Setenv(asMainEnv, "1")
	cases := []struct {
		nproc, devices int
	}{
		{2, 2},
	}
	if fullMatrix() {
		cases = append(cases, []struct{ nproc, devices int }{{2, 4}, {4, 4}}...)
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("dp%d over %d procs", tc.devices, tc.nproc), func(t *testing.T) {
			plan := []string{"--devices", strconv.Itoa(tc.devices), "--dp", strconv.Itoa(tc.devices), "--dp-sync", "async", "--staleness", "0"}
			dir := t.TempDir()
			require.NoError(t, mainErr(append([]string{"launch", "--nproc", strconv.Itoa(tc.nproc), "--"}, jobArgs(t, dir, plan...)...)))
			got := assertMatchesOneProcess(t, plan, tc.nproc, dir)
			require.NotNil(t, got.Async)
			assert.Equal(t, 0, got.Async.MaxStalenessSeen)
			assert.Len(t, got.Devices, tc.devices+1, "every replica and the server")
		})
	}
}

// asyncFaultArgs is a long asynchronous run of devices replicas (so a
// fault lands mid-training) with the given --timeout.
func asyncFaultArgs(t *testing.T, devices int, timeout string) []string {
	t.Helper()
	model, err := jobModel()
	require.NoError(t, err)
	d := strconv.Itoa(devices)
	return []string{model, "--run", "--steps", "100000", "--eval-batches", "1", "--max-data-mb", "1",
		"--devices", d, "--dp", d, "--dp-sync", "async", "--timeout", timeout}
}

// kill -9 of a replica's process mid-run: the server's process sees its
// connection close and aborts the job, so every other process exits
// non-zero, long before the timeout, naming the lost process.
func TestAsyncJobLosesAReplicaProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	assertLossNamed(t, startProcs(t, 4, asyncFaultArgs(t, 4, "20s"), nil), 2)
}

// A stalled process (SIGSTOP) is named by the others' timeout: a stalled
// replica by the server's process, which waits for its request or its
// gradients; a stalled server's process by the replica waiting for its
// weights.
func TestAsyncJobTimesOutOnAStalledProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	for _, tc := range []struct {
		stalled, waiter int
		want            string
	}{
		{1, 0, "timed out after 3s waiting for rank 1 (process 1 (rank 1"},
		{0, 1, "timed out after 3s waiting for rank 0 (process 0 (rank 0"},
	} {
		t.Run(fmt.Sprintf("process %d stalls", tc.stalled), func(t *testing.T) {
			t.Parallel() // each waits out a timeout and the job's drain
			ps := startProcs(t, 2, asyncFaultArgs(t, 2, "3s"), nil)
			waitForTraining(t, ps)
			require.NoError(t, ps[tc.stalled].cmd.Process.Signal(syscall.SIGSTOP))
			start := time.Now()
			w := ps[tc.waiter]
			done := make(chan error, 1)
			go func() { done <- w.cmd.Wait() }()
			select {
			case err := <-done:
				w.err = err
			case <-time.After(30 * time.Second):
				t.Fatalf("process %d did not time out:\n%s", tc.waiter, w.output())
			}
			// What became of the stalled process, for a failure to name:
			// still stopped, as it should be, or ended by something else
			// (a signal, which its wait status names).
			stalled := stalledState(ps[tc.stalled])
			require.Error(t, w.err, "the stalled process: %s", stalled)
			assert.Contains(t, w.output(), tc.want, "the stalled process: %s", stalled)
			t.Logf("process %d exited %v after the stall: %s (the stalled process: %s)", tc.waiter, time.Since(start).Round(time.Millisecond), lastLine(w.output()), stalled)
			if ps[tc.stalled].cmd.ProcessState == nil {
				ps[tc.stalled].cmd.Process.Signal(syscall.SIGKILL)
				ps[tc.stalled].cmd.Wait()
			}
		})
	}
}

// stalledState says whether p is still stopped (its /proc state "T") or
// what ended it, reaping it then: a stalled process that is gone before
// the test kills it was ended by something outside the job.
func stalledState(p *proc) string {
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)); err == nil {
		// The state follows the command's closing parenthesis.
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
			return fmt.Sprintf("alive, state %c", stat[i+2])
		}
	}
	p.err = p.cmd.Wait()
	return "ended before the test killed it: " + p.cmd.ProcessState.String()
}

// stalledState tells a stopped process from one something else ended.
func TestStalledState(t *testing.T) {
	p := &proc{cmd: exec.Command("sleep", "60")}
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
	require.Eventually(t, func() bool { return stalledState(p) == "alive, state T" }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	var got string
	require.Eventually(t, func() bool {
		got = stalledState(p)
		return p.cmd.ProcessState != nil
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "ended before the test killed it: signal: killed", got)
}
