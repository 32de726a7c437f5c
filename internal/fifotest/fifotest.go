//go:build unix

// Package fifotest holds the one helper the tests of every reader of a
// user's files share: a FIFO in place of a file must be refused (or
// replaced) before it is opened, since opening one for reading waits for
// a writer, and a regression would hang the test binary rather than fail.
package fifotest

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// OpenWithin runs open and returns its error, failing the test when it
// has not returned after 5 s with fifo in place of a file it reads; a
// writer is then opened on fifo so the blocked call ends.
func OpenWithin(t testing.TB, fifo string, open func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- open() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = w.Close()
		}
		t.Fatalf("still opening after 5 s with %s a FIFO: it must be refused before it is opened", fifo)
		return nil
	}
}
