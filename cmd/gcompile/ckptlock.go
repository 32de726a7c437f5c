package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"gcompile/internal/filekind"
	"gcompile/internal/pidlock"
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
	me := ckptLock{Host: host, PID: os.Getpid(), Start: pidlock.ProcessStart(os.Getpid()), Since: time.Now().UTC().Format(time.RFC3339),
		Command: strings.Join(os.Args, " ")}
	raw, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	mine := append(raw, '\n')
	for attempt := 0; ; attempt++ {
		err := pidlock.Create(path, mine)
		if err == nil {
			// A partial save left by a run that is gone: the next save
			// would remove it too, but the folder is ours from now.
			_ = checkpoint.RemovePartials(dir)
			release := func() { pidlock.Release(path, mine) }
			forget := onHardExit(release)
			return func() { forget(); release() }, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("--checkpoint-dir %s: writing %s: %w", dir, lockName, err)
		}
		if attempt >= maxLockAttempts {
			return nil, fmt.Errorf("--checkpoint-dir %s: taking %s: %w", dir, lockName, err)
		}
		if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
			// Not a lock gcompile wrote (a pipe would hang the read):
			// nothing to take over, and nothing to remove on the user's
			// behalf.
			return nil, fmt.Errorf("--checkpoint-dir %s: its %s is %s, not the lock file a run writes: remove it (it keeps two runs from writing one folder)", dir, lockName, filekind.Of(fi.Mode()))
		}
		stale, readErr := os.ReadFile(path)
		if errors.Is(readErr, fs.ErrNotExist) {
			continue // released or taken over since: try again
		}
		var held ckptLock
		if readErr == nil {
			readErr = json.Unmarshal(stale, &held)
		}
		if readErr != nil {
			// Another run creates the lock and then writes it: one read
			// between the two is empty, and is not a stale lock.
			if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) < lockWriteGrace {
				return nil, fmt.Errorf("--checkpoint-dir %s is being taken by another run (its %s, made %s ago, is not written yet): give this run another --checkpoint-dir, or try again if that run is gone",
					dir, lockName, time.Since(fi.ModTime()).Round(time.Millisecond))
			}
		}
		if readErr == nil && pidlock.Alive(held.Host, held.PID, held.Start) {
			return nil, fmt.Errorf("--checkpoint-dir %s is in use by another run: pid %d on %s since %s (%s); two runs writing one folder would overwrite each other's checkpoints: give this run another --checkpoint-dir, or remove %s if that run is gone",
				dir, held.PID, held.Host, held.Since, held.Command, path)
		}
		// A stale lock (its process is gone) or an unreadable one (a
		// crash while writing it): take it over.
		if err := pidlock.TakeOver(path, stale); err != nil {
			return nil, fmt.Errorf("--checkpoint-dir %s: %w", dir, err)
		}
	}
}

// maxLockAttempts bounds the tries to take a lock that other runs keep
// taking over and releasing.
const maxLockAttempts = 8

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
