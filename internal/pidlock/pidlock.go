// Package pidlock holds the mechanics gcompile's lock files share (a
// --checkpoint-dir's gcompile.lock, a data prepare's PREFIX.lock): a lock
// is a file made with O_EXCL that names the process holding it, by host,
// pid and the pid's start time, so that a lock left by a process that is
// gone is told from a live one's on the same host, and taken over by one
// process only. What a lock holds and what a refusal says are the
// callers'.
package pidlock

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
)

// Create makes the lock file at path holding content, failing with an
// error for which errors.Is(err, fs.ErrExist) holds if there is one. A
// lock that cannot be written whole is removed: it is this process's.
func Create(path string, content []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(content)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return werr
	}
	return nil
}

// Release removes the lock at path if it still holds mine.
func Release(path string, mine []byte) {
	if got, err := os.ReadFile(path); err == nil && bytes.Equal(got, mine) {
		os.Remove(path)
	}
}

// Alive says whether the process a lock names still runs: on another host
// that cannot be known, and the lock counts as held; on this one, the pid
// must run and, where the lock recorded it, have the start time it had
// (a pid is reused, a pid with its start time is not).
func Alive(host string, pid int, start string) bool {
	if me, _ := os.Hostname(); host != me {
		return true
	}
	if pid <= 0 || !processRuns(pid) {
		return false
	}
	if start != "" {
		if now := ProcessStart(pid); now != "" && now != start {
			return false
		}
	}
	return true
}

// ProcessStart is a process's start time as /proc/PID/stat gives it
// (field 22, in clock ticks since boot), "" where there is no /proc.
func ProcessStart(pid int) string {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(raw)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		fields := strings.Fields(s[i+1:])
		if len(fields) > 19 {
			return fields[19] // field 22 counted from the state, field 3
		}
	}
	return ""
}

// GuardStale is how long a takeover waits for another's guard; where
// the guard is a file made with O_EXCL (not unix), also how old one must
// be to be taken for one a process crashed holding, and removed.
const GuardStale = 10 * time.Second

// guardPoll is how often a takeover waits for another's guard.
const guardPoll = 5 * time.Millisecond

// TakeOver removes the stale lock at path, whose bytes were read as
// stale, so that the next Create may take it. Removing it by path would
// race with another process taking over the same stale lock: that one
// may have removed it and made its own in between, and both would then
// hold it. Setting the lock aside and putting it back if it was not the
// stale one still leaves a moment with no lock at path, in which a third
// process takes it. So a takeover holds a guard of its own (holdGuard,
// one process at a time) and removes the lock only if it still holds
// stale; a lock made since is another's, and the caller's next attempt
// finds its holder. It returns nil when there is nothing left to do.
func TakeOver(path string, stale []byte) error {
	guard := path + ".takeover"
	release, err := holdGuard(guard)
	if err != nil {
		return fmt.Errorf("take over the stale lock %s: %w", path, err)
	}
	defer release()
	now, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // taken over and released, or being made again
	case err != nil:
		return fmt.Errorf("take over the stale lock %s: %w", path, err)
	case !bytes.Equal(now, stale):
		return nil // another process's lock, made since
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the stale lock %s: %w", path, err)
	}
	return nil
}

// holdExclusive takes the guard file at path by making it with O_EXCL, and
// returns its release: where there is no flock. A guard older than
// GuardStale is taken for one a process crashed holding and removed,
// which a holder stopped that long, or two takeovers that both find it
// old, defeat; flock (holdGuard) has neither.
func holdExclusive(path string) (func(), error) {
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
