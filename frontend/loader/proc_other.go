//go:build !unix

package loader

import "os/exec"

// isolate does nothing where there are no process groups.
func isolate(cmd *exec.Cmd) {}

// killGroup kills the process itself where there are no process groups;
// an error means it has already exited.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
}

// quit cannot ask for the stacks without SIGQUIT: the driver is killed.
func quit(*exec.Cmd) bool { return false }
