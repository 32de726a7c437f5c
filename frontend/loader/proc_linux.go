package loader

import (
	"os/exec"
	"syscall"
)

// isolate puts cmd in its own process group, so that killGroup ends it
// together with whatever it started, and asks the kernel to SIGKILL it
// when gcompile dies: a gcompile killed with SIGKILL runs no deferred
// cleanup, and the model must not outlive it.
//
// Pdeathsig fires when the thread that started the child exits, not the
// process; the Go runtime ends a thread only when a goroutine exits while
// locked to it, so the loader keeps its goroutine locked to the thread
// while the child runs and no other goroutine can take that thread down.
func isolate(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup SIGKILLs the process group that isolate gave cmd. It is safe
// to call more than once and after the process has exited: the group
// lives on while anything the child started does, and once it is empty
// the kill fails with ESRCH (its id could be taken again only by a new
// group leader given the same pid in between, which the loader's kills,
// moments after the child's end, leave next to no time for). It reports no
// error because there is nothing left to do when a kill fails.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// quit asks the driver for its goroutines' stacks (SIGQUIT: the Go
// runtime prints them and exits); false if the signal was not sent.
func quit(cmd *exec.Cmd) bool {
	return cmd.Process != nil && cmd.Process.Signal(syscall.SIGQUIT) == nil
}
