//go:build !unix

package pidlock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// processRuns cannot tell here, so a lock always counts as held: the
// refusal says to remove it if its process is gone.
func processRuns(int) bool { return true }

// holdGuard takes the guard file at path by making it with O_EXCL, and
// returns its release. With no flock, a guard older than GuardStale is
// taken for one a process crashed holding and removed.
func holdGuard(path string) (func(), error) {
	for wait := time.Duration(0); ; wait += guardPoll {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			f.Close()
			return func() { os.Remove(path) }, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) > GuardStale {
			os.Remove(path)
			continue
		}
		if wait > GuardStale {
			return nil, fmt.Errorf("another process is taking it over (%s stays)", path)
		}
		time.Sleep(guardPoll)
	}
}
