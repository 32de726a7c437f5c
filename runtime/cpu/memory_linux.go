package cpu

import (
	"math"
	"os"
	"strconv"
	"strings"
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

// virtualSize is the process's address space in use (VmSize in a
// /proc/PID/status file), in bytes.
func virtualSize(status string) (int64, bool) {
	data, err := os.ReadFile(status)
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		rest, found := strings.CutPrefix(line, "VmSize:")
		if !found {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64/1024 {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}
