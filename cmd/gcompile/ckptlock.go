package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gcompile/runtime/checkpoint"
)

// lockName is the file in a --checkpoint-dir that says which run writes
// its checkpoints there.
const lockName = "gcompile.lock"

// lockWriteGrace is how long an unreadable lock is taken to be one
// another run has made and not written yet, rather than a stale one.
const lockWriteGrace = 10 * time.Second

// ckptLock is what the lock file holds: enough to name the holder and to
// tell a live holder from a dead one on the same host (a pid is reused,
// a pid with its start time is not).
type ckptLock struct {
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Start   string `json:"process_start,omitempty"` // /proc/PID/stat's start time, in clock ticks since boot
	Since   string `json:"since"`
	Command string `json:"command"`
}

// lockCheckpointDir makes this run the only one writing checkpoints into
// dir, before it trains: a second run on the same folder would otherwise
// die at its first checkpoint with a rename error, its training lost. A
// lock left by a run that is gone (same host, no such process) is taken
// over, and the folders its interrupted saves left (step-N.partial) are
// removed. The function returned releases the lock.
func lockCheckpointDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--checkpoint-dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, lockName)
	host, _ := os.Hostname()
	me := ckptLock{Host: host, PID: os.Getpid(), Start: processStart(os.Getpid()), Since: time.Now().UTC().Format(time.RFC3339),
		Command: strings.Join(os.Args, " ")}
	raw, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, werr := f.Write(append(raw, '\n'))
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(path)
				return nil, fmt.Errorf("--checkpoint-dir %s: writing %s: %w", dir, lockName, werr)
			}
			// A partial save left by a run that is gone: the next save
			// would remove it too, but the folder is ours from now.
			_ = checkpoint.RemovePartials(dir)
			release := func() { releaseLock(path, me) }
			forget := onHardExit(release)
			return func() { forget(); release() }, nil
		}
		if !errors.Is(err, fs.ErrExist) || attempt >= maxLockAttempts {
			return nil, fmt.Errorf("--checkpoint-dir %s: taking %s: %w", dir, lockName, err)
		}
		stale, rawErr := os.ReadFile(path)
		if errors.Is(rawErr, fs.ErrNotExist) {
			continue // released or taken over since: try again
		}
		held, readErr := readLock(path)
		if rawErr != nil {
			readErr = rawErr
		}
		if readErr != nil {
			// Another run creates the lock and then writes it: one read
			// between the two is empty, and is not a stale lock.
			if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) < lockWriteGrace {
				return nil, fmt.Errorf("--checkpoint-dir %s is being taken by another run (its %s, made %s ago, is not written yet): give this run another --checkpoint-dir, or try again if that run is gone",
					dir, lockName, time.Since(fi.ModTime()).Round(time.Millisecond))
			}
		}
		if readErr == nil && held.alive(host) {
			return nil, fmt.Errorf("--checkpoint-dir %s is in use by another run: pid %d on %s since %s (%s); two runs writing one folder would overwrite each other's checkpoints: give this run another --checkpoint-dir, or remove %s if that run is gone",
				dir, held.PID, held.Host, held.Since, held.Command, path)
		}
		// A stale lock (its process is gone) or an unreadable one (a
		// crash while writing it): take it over.
		if err := takeOver(path, stale); err != nil {
			return nil, fmt.Errorf("--checkpoint-dir %s: removing the stale %s: %w", dir, lockName, err)
		}
	}
}

// maxLockAttempts bounds the tries to take a lock that other runs keep
// taking over and releasing.
const maxLockAttempts = 8

// takeOver removes the stale lock at path, whose contents were stale, so
// that the next O_EXCL create may take it. Removing it by path would race
// with another run taking over the same stale lock: that run may have
// removed it and made its own in between, and both would then hold the
// folder. So a takeover holds a guard file of its own (O_EXCL, one run
// at a time) and removes the lock only if it still holds what was read
// stale; a lock made since is another run's, and the next attempt names
// its holder. A guard older than lockWriteGrace is one a run crashed
// holding, and is removed.
func takeOver(path string, stale []byte) error {
	guard := path + ".takeover"
	for wait := 0; ; wait++ {
		f, err := os.OpenFile(guard, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			f.Close()
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		if fi, err := os.Stat(guard); err == nil && time.Since(fi.ModTime()) > lockWriteGrace {
			os.Remove(guard)
			continue
		}
		if wait*int(guardPoll) > int(lockWriteGrace) {
			return fmt.Errorf("another run is taking the lock over (%s stays)", guard)
		}
		time.Sleep(guardPoll)
	}
	defer os.Remove(guard)
	now, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // taken over and released, or being made again
	case err != nil:
		return err
	case !bytes.Equal(now, stale):
		return nil // another run's lock, made since
	}
	return os.Remove(path)
}

// guardPoll is how often a takeover waits for another's guard.
const guardPoll = 5 * time.Millisecond

func readLock(path string) (ckptLock, error) {
	var l ckptLock
	raw, err := os.ReadFile(path)
	if err != nil {
		return l, err
	}
	err = json.Unmarshal(raw, &l)
	return l, err
}

// alive says whether the lock's process still runs. On another host that
// cannot be known: the lock then counts as held, and the message says how
// to clear it.
func (l ckptLock) alive(host string) bool {
	if l.Host != host {
		return true
	}
	if l.PID <= 0 {
		return false
	}
	if err := syscall.Kill(l.PID, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	// The pid runs; it is the holder unless it was reused since.
	if l.Start != "" {
		if now := processStart(l.PID); now != "" && now != l.Start {
			return false
		}
	}
	return true
}

// releaseLock removes the lock if it is still this run's.
func releaseLock(path string, me ckptLock) {
	if held, err := readLock(path); err == nil && held.PID == me.PID && held.Host == me.Host && held.Start == me.Start {
		os.Remove(path)
	}
}

// processStart is a process's start time as /proc/PID/stat gives it
// (field 22), "" where there is no /proc.
func processStart(pid int) string {
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

// hardExitHooks are what an exit that skips the deferred calls (a second
// signal's) still does first: release the locks this run holds, which on
// a shared file system another host could never take over.
var hardExitHooks struct {
	sync.Mutex
	next int
	fns  map[int]func()
}

// onHardExit registers f to run before hardExit exits; the function
// returned forgets it.
func onHardExit(f func()) (forget func()) {
	h := &hardExitHooks
	h.Lock()
	defer h.Unlock()
	if h.fns == nil {
		h.fns = map[int]func(){}
	}
	id := h.next
	h.next++
	h.fns[id] = f
	return func() {
		h.Lock()
		delete(h.fns, id)
		h.Unlock()
	}
}

// runHardExitHooks runs and forgets every registered hook.
func runHardExitHooks() {
	h := &hardExitHooks
	h.Lock()
	fns := h.fns
	h.fns = nil
	h.Unlock()
	for _, f := range fns {
		f()
	}
}

// hardExit exits with code at once, after the hooks.
func hardExit(code int) {
	runHardExitHooks()
	os.Exit(code)
}
