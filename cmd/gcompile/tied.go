package main

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Linux delivers a child's Pdeathsig when the thread that forked it ends,
// not when the process does, and the Go runtime ends a thread (any but
// the main one) whenever a goroutine exits while locked to it. A child
// started from an ordinary goroutine therefore dies, SIGKILLed, if any
// goroutine later runs on the thread the fork happened to use, locks it
// and exits: in a gcompile that runs other work beside the launcher, or
// in a test binary, that is an unrelated goroutine taking down a healthy
// rank.
//
// startTied starts every such child from one goroutine that stays locked
// to its thread for the life of the process, so the parent the kernel
// watches is a thread that ends only with gcompile.
var (
	tiedOnce   sync.Once
	tiedStarts chan func()
)

// startTied starts cmd so that it receives SIGKILL when gcompile ends,
// however it ends, and at no other time.
func startTied(cmd *exec.Cmd) error {
	tiedOnce.Do(func() {
		tiedStarts = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: see above
			for start := range tiedStarts {
				start()
			}
		}()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	tiedStarts <- func() { done <- cmd.Start() }
	return <-done
}
