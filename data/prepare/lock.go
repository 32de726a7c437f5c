package prepare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gcompile/internal/pidlock"
)

// lockFormat marks a PREFIX.lock as a data prepare's, so that a file of
// that name made by something else (a poetry.lock under --output-prefix
// poetry) is never taken for a stale lock and removed.
const lockFormat = "gcompile data prepare lock"

// lockWriteGrace is how long a lock that does not parse is taken for one
// another run has just created and not written yet.
const lockWriteGrace = 10 * time.Second

// lockAttempts bounds the create, read, take-over rounds: each lost round
// means another run created or took over the lock meanwhile.
const lockAttempts = 5

// prefixLock is what PREFIX.lock holds: enough to name the holder and to
// tell a live one from a dead one on the same host (a pid is reused, a pid
// with its start time is not).
type prefixLock struct {
	Format string `json:"format"`
	Host   string `json:"host"`
	PID    int    `json:"pid"`
	Start  string `json:"process_start,omitempty"` // /proc/PID/stat's start time, in clock ticks since boot
	Since  string `json:"since"`
}

func lockPath(prefix string) string { return prefix + ".lock" }

// lockPrefixBytes is how every lock's JSON starts (Format is its first
// field): a file holding less of it is one being written.
var lockPrefixBytes = []byte(`{"format":"` + lockFormat + `"`)

// lockPrefix makes this run the only data prepare writing prefix, before
// anything is written: two runs replacing one dataset each removed what
// the other had renamed into place, and both failed with the old dataset
// gone. A lock whose process is gone (on this host) is taken over. The
// function returned releases the lock.
func lockPrefix(prefix string) (release func(), err error) {
	path := lockPath(prefix)
	host, _ := os.Hostname()
	me := prefixLock{Format: lockFormat, Host: host, PID: os.Getpid(), Start: pidlock.ProcessStart(os.Getpid()),
		Since: time.Now().UTC().Format(time.RFC3339)}
	mine, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	mine = append(mine, '\n')
	for range lockAttempts {
		err := pidlock.Create(path, mine)
		if err == nil {
			return func() { pidlock.Release(path, mine) }, nil
		}
		if errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("prepare: %s: the output folder is not writable (the lock %s cannot be made): %w", prefix, path, err)
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("prepare: take the lock %s: %w", path, err)
		}
		held, raw, err := readLock(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, err
		}
		if pidlock.Alive(held.Host, held.PID, held.Start) {
			return nil, fmt.Errorf("prepare: another data prepare (pid %d on host %s since %s) is writing %s: %w; wait for it to finish, or remove %s if that process is gone",
				held.PID, held.Host, held.Since, prefix, ErrLocked, path)
		}
		if err := pidlock.TakeOver(path, raw); err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
	}
	return nil, fmt.Errorf("prepare: %w: %s was taken and released %d times while this run tried to take it; try again", ErrLocked, path, lockAttempts)
}

// readLock reads the lock at path and its raw bytes. A file that is not
// a data prepare's lock is an error naming it: it is never removed.
func readLock(path string) (prefixLock, []byte, error) {
	var l prefixLock
	fi, err := os.Stat(path)
	if err != nil {
		return l, nil, err
	}
	if !fi.Mode().IsRegular() {
		return l, nil, fmt.Errorf("prepare: %s is not a regular file (%s), so no data prepare's lock: %w; remove it, or choose another output prefix", path, fi.Mode().Type(), ErrLocked)
	}
	f, err := os.Open(path)
	if err != nil {
		return l, nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, 4<<10)) // a lock is a line; someone's yarn.lock may be megabytes
	if err != nil {
		return l, nil, fmt.Errorf("prepare: read the lock %s: %w", path, err)
	}
	if json.Unmarshal(raw, &l) != nil || l.Format != lockFormat {
		age := time.Since(fi.ModTime())
		ours := bytes.HasPrefix(lockPrefixBytes, raw) || bytes.HasPrefix(raw, lockPrefixBytes)
		switch {
		case ours && age < lockWriteGrace:
			// Another run creates the lock, then writes it: a read between
			// the two finds it empty or cut short.
			return l, nil, fmt.Errorf("prepare: another data prepare is taking the lock %s (made %s ago, not written yet): %w; wait for it to finish",
				path, age.Round(time.Millisecond), ErrLocked)
		case ours:
			// Empty or cut short long ago: a crash (a power loss leaves a
			// lock file empty) between making the lock and writing it. It
			// is stale, and taken over as a checkpoint folder's is; the
			// lock returned names no live process.
			host, _ := os.Hostname()
			return prefixLock{Format: lockFormat, Host: host}, raw, nil
		}
		return l, nil, fmt.Errorf("prepare: %s is not a data prepare's lock: %w; choose another output prefix, or remove the file if it is a lock left by a data prepare that is gone", path, ErrLocked)
	}
	return l, raw, nil
}

// removeStaleTemps removes the temporary files an earlier run on prefix
// left when it was killed (SIGKILL, out of memory, power loss): nothing
// else removes them, and a .bin's can be as large as the dataset. Only a
// run holding the lock may call it: no live run then writes such files.
// The names matched are exactly those indexed.Create and writeMetaTemp
// make (PREFIX.bin.tmp-N, PREFIX.idx.tmp-N, PREFIX.json.tmp-N, N digits),
// so no file of another prefix or of a user is taken for one.
func removeStaleTemps(prefix string) (files int, size int64) {
	dir, base := filepath.Dir(prefix), filepath.Base(prefix)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !isStaleTempName(e.Name(), base) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			files++
			size += info.Size()
		}
	}
	return files, size
}

func isStaleTempName(name, base string) bool {
	for _, ext := range []string{".bin", ".idx", ".json"} {
		n, ok := strings.CutPrefix(name, base+ext+".tmp-")
		if ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}
