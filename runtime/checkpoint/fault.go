package checkpoint

import (
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// FaultEnv names the fault-injection variable of the crash tests: with
// FaultEnv=N the process kills itself (SIGKILL, as kill -9 does) at the
// N-th point of a checkpoint save where a crash could leave a half-written
// checkpoint behind (after a file's bytes, after its sync, after each
// manifest step, between renames). Unset, faultPoint does nothing.
const FaultEnv = "GCOMPILE_FAULT_KILL_AT"

var (
	faultAt     = faultTarget()
	faultPoints atomic.Int64
)

func faultTarget() int64 {
	n, err := strconv.ParseInt(os.Getenv(FaultEnv), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// faultPoint is one point where a crash is tested; where says which, for
// a reader of the code.
func faultPoint(where string) {
	_ = where
	if faultAt == 0 || faultPoints.Add(1) != faultAt {
		return
	}
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
		time.Sleep(time.Hour) // the kill is asynchronous; nothing more may be written
	}
}
