package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"syscall"
)

// exitStatus is an error with the exit status it stands for. A run that
// a signal stopped before its last step exits 128 + the signal's number
// (143 for SIGTERM, 130 for SIGINT), as a shell reports a process the
// signal ended, even when it wrote a checkpoint and its outputs: a
// scheduler or a requeue loop must not take it for a finished run. Only a
// finished run (or one --stop-after ended) exits 0.
type exitStatus struct {
	err  error
	code int
}

func (e *exitStatus) Error() string { return e.err.Error() }
func (e *exitStatus) Unwrap() error { return e.err }

// stopSignals are the signals that stop gcompile's work cleanly: SIGINT
// and SIGTERM (a user, a scheduler), and SIGHUP (the terminal or ssh
// session the run was started from went away), which would otherwise
// end a run at once, without the checkpoint a stop at the step boundary
// writes. Training also catches SIGPIPE (watchSignals).
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// signalStatus is the exit status of a run stopped by sig.
func signalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// signalName is how the messages name a signal: SIGTERM, not "terminated".
func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGPIPE:
		return "SIGPIPE"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGBUS:
		return "SIGBUS"
	}
	return fmt.Sprint(sig)
}

// interruptedRank matches the failure a process of a job reports when a
// signal reached it before training (job.go), as the other processes
// receive it: they exit with the same status.
var interruptedRank = regexp.MustCompile(`rank \d+ was interrupted by (SIGTERM|SIGINT|SIGHUP)`)

// exitCode is the status gcompile exits with after err (not nil).
func exitCode(err error) int {
	var es *exitStatus
	if errors.As(err, &es) {
		return es.code
	}
	if m := interruptedRank.FindStringSubmatch(err.Error()); m != nil {
		switch m[1] {
		case "SIGINT":
			return signalStatus(syscall.SIGINT)
		case "SIGHUP":
			return signalStatus(syscall.SIGHUP)
		}
		return signalStatus(syscall.SIGTERM)
	}
	return 1
}

// signalContext ends at the first of stopSignals; got says which
// signal ended it (nil while none has). stop restores the default
// handling.
func signalContext() (ctx context.Context, got func() os.Signal, stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, stopSignals...)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	var sig os.Signal
	caught := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			sig = s
			close(caught)
			cancel(fmt.Errorf("%s", signalName(s)))
		case <-done:
		}
	}()
	got = func() os.Signal {
		select {
		case <-caught:
			return sig
		default:
			return nil
		}
	}
	stop = func() {
		signal.Stop(ch)
		select {
		case <-done:
		default:
			close(done)
		}
	}
	return ctx, got, stop
}
