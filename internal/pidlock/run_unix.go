//go:build unix

package pidlock

import (
	"errors"
	"syscall"
)

// processRuns says whether a process of that pid exists on this host (one
// of another user counts: signal 0 is then refused, not unanswered).
func processRuns(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
