//go:build unix

package pidlock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// processRuns says whether a process of that pid exists on this host (one
// of another user counts: signal 0 is then refused, not unanswered).
func processRuns(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// flock is syscall.Flock; a test stands in a file system without it.
var flock = syscall.Flock

// holdGuard takes the guard file at path with flock and returns its
// release, which removes the file and then lets go. A process that dies
// holding it lets go with its descriptors, so no guard is ever stale: a
// guard left to age and then removed by path let two takeovers that both
// found it old proceed, the second removing the guard the first had just
// made. A lock taken on a file its holder removed since guards nothing,
// so it is dropped and taken again on the file now at path.
//
// A file system without flock (Lustre mounted without it, some FUSE and
// CIFS mounts: ENOSYS, EOPNOTSUPP, ENOLCK) gets the guard made with
// O_EXCL instead, as where there is no flock at all.
func holdGuard(path string) (func(), error) {
	for waited := time.Duration(0); ; {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		err = flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			held, herr := f.Stat()
			now, nerr := os.Stat(path)
			if herr == nil && nerr == nil && os.SameFile(held, now) {
				return func() {
					os.Remove(path)
					f.Close()
				}, nil
			}
			f.Close()
			if nerr != nil && !errors.Is(nerr, fs.ErrNotExist) || herr != nil {
				// Not the holder before us removing it (a stale handle on
				// NFS, say): wait and count it, as for a held guard.
				if waited > GuardStale {
					return nil, fmt.Errorf("lock %s: %w", path, errors.Join(herr, nerr))
				}
				time.Sleep(guardPoll)
				waited += guardPoll
			}
			continue
		}
		f.Close()
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOLCK):
			// The file just opened guards nothing here: the O_EXCL guard
			// has another name.
			os.Remove(path)
			return holdExclusive(path + ".excl")
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return nil, fmt.Errorf("lock %s: %w", path, err)
		case waited > GuardStale:
			return nil, fmt.Errorf("another process is taking it over (it holds %s)", path)
		}
		time.Sleep(guardPoll)
		waited += guardPoll
	}
}
