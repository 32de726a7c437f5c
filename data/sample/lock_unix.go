//go:build unix

package sample

import (
	"os"
	"syscall"
)

// lockExclusive takes an exclusive advisory lock (flock) on f, waiting for
// whoever holds it. Linux's NFS client maps flock to the server's byte-
// range locks, so processes of a job on other hosts wait too.
func lockExclusive(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}
