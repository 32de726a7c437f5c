package main

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A child started from a goroutine that then exits locked to its thread
// (which ends the thread) is SIGKILLed by its Pdeathsig when started with
// cmd.Start, and lives on when started with startTied. The first case
// shows the hazard is real on this kernel, so the second cannot pass for
// want of it.
func TestATiedChildOutlivesTheThreadThatAskedForIt(t *testing.T) {
	for _, tc := range []struct {
		name     string
		start    func(*exec.Cmd) error
		survives bool
	}{
		{"cmd.Start", func(cmd *exec.Cmd) error {
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			return cmd.Start()
		}, false},
		{"startTied", startTied, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			started := make(chan error, 1)
			onAnEndingThread(func() { started <- tc.start(cmd) })
			require.NoError(t, <-started)
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})
			if !tc.survives {
				select {
				case err := <-exited:
					var ee *exec.ExitError
					require.ErrorAs(t, err, &ee)
					ws := ee.Sys().(syscall.WaitStatus)
					assert.Equal(t, syscall.SIGKILL, ws.Signal(), "killed by its Pdeathsig")
					exited <- err // for the cleanup
				case <-time.After(30 * time.Second):
					t.Fatal("the child outlived the thread that started it")
				}
				return
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("the child died with the thread that asked for it: %v", err)
			case <-time.After(500 * time.Millisecond):
			}
		})
	}
}

// onAnEndingThread runs f on a goroutine locked to a thread that ends
// with it. The runtime never ends the main thread (a goroutine that exits
// locked to it parks it instead), so a goroutine that finds itself there
// holds it while another runs f.
func onAnEndingThread(f func()) {
	go func() {
		runtime.LockOSThread() // never unlocked off the main thread
		if syscall.Gettid() == syscall.Getpid() {
			done := make(chan struct{})
			onAnEndingThread(func() { f(); close(done) })
			<-done
			runtime.UnlockOSThread()
			return
		}
		f()
	}()
}
