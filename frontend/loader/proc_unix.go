//go:build unix && !linux

package loader

import (
	"os/exec"
	"syscall"
)

// isolate puts cmd in its own process group, so that killGroup ends it
// together with whatever it started. Only Linux can also tie the child's
// life to gcompile's (Pdeathsig); elsewhere a gcompile killed with SIGKILL
// leaves the driver to its timeout-free fate.
func isolate(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killGroup SIGKILLs the process group that isolate gave cmd; safe to call
// more than once and after the process exited.
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
