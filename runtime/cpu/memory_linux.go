package cpu

import (
	"math"
	"syscall"
)

// addressSpaceLimit is the process's soft RLIMIT_AS (ulimit -v), if any:
// past it every allocation fails, whatever memory the machine has.
func addressSpaceLimit() (int64, bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &lim); err != nil || lim.Cur >= math.MaxInt64 {
		return 0, false
	}
	return int64(lim.Cur), true
}
