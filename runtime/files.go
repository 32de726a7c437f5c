package runtime

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"gcompile/internal/linkpath"
	"gcompile/internal/pidlock"
)

// createTemp makes the temporary file WriteFileAtomic writes; a variable
// so a test can make the write fail as a full disk does.
var createTemp = CreateTemp

// CreateTemp is os.CreateTemp with the mode an output gets from
// os.WriteFile: 0644 less the process's umask, where os.CreateTemp's
// files are private (0600). An output renamed into place from it is then
// readable by whom the user's umask allows, as one written in place is.
// The pattern's "*" becomes the process's pid and host (tempOwner) and a
// random part, so that RemoveStaleTemps can tell a file a killed process
// left from one another process is writing.
func CreateTemp(dir, pattern string) (*os.File, error) {
	prefix, suffix, _ := strings.Cut(pattern, "*")
	owner := tempOwner()
	for range 10000 {
		name := filepath.Join(dir, prefix+owner+"."+strconv.FormatUint(rand.Uint64(), 36)+suffix)
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if os.IsExist(err) {
			continue
		}
		return f, err
	}
	return nil, &os.PathError{Op: "createtemp", Path: filepath.Join(dir, pattern), Err: os.ErrExist}
}

// WriteFileAtomic writes b to path through a temporary file of its own in
// path's folder, renamed over path once complete and synced (as the
// checkpoint writer does): a reader never sees half a file, a write that
// fails (a full disk) leaves the file that was there and no temporary
// file, and no other file beside path is touched (a fixed temporary name
// would overwrite a user's file of that name).
func WriteFileAtomic(path string, b []byte) error { return writeFile(path, b, true) }

// ReplaceFile is WriteFileAtomic without the sync: a reader never sees
// half a file, and a failed write leaves the old file, but a machine's
// crash may lose the new one. For outputs remade at will (the compile's
// dumps), many at a time.
func ReplaceFile(path string, b []byte) error { return writeFile(path, b, false) }

func writeFile(path string, b []byte, sync bool) (err error) {
	path = linkpath.Target(path)
	f, err := createTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: temporary file: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close() // already failing; the first error says why
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("write %s: sync: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	RemoveStaleTemps(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	return nil
}

// TempNameOverhead is the most a temporary file's name made from the
// pattern ".NAME.*.tmp" adds to NAME: the dots and ".tmp", a pid (7
// digits at Linux's largest), "@", the host's 8 hex digits, "." and a
// random uint64 in base 36 (13 characters).
const TempNameOverhead = len("..") + 7 + len("@") + 8 + len(".") + 13 + len(".tmp")

// tempOwner names this process in its temporary files: its pid, then its
// host's name hashed (a host name may hold dots). Neither changes while
// the process runs: it is made once.
var tempOwner = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	h := fnv.New32a()
	h.Write([]byte(host))
	return fmt.Sprintf("%d@%08x", os.Getpid(), h.Sum32())
})

// RemoveStaleTemps removes the temporary files of pattern (CreateTemp's)
// in dir that a process of this host left when it was killed before it
// renamed or removed them: a --save killed mid-write left one of the
// model's size, and each requeue another. Another host's, a live
// process's and those of names CreateTemp did not make are kept; it says
// how many it removed.
func RemoveStaleTemps(dir, pattern string) int {
	prefix, suffix, _ := strings.Cut(pattern, "*")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	host, _ := os.Hostname()
	mine := tempOwner()
	_, myHost, _ := strings.Cut(mine, "@")
	n := 0
	for _, e := range entries {
		middle, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if middle, ok = strings.CutSuffix(middle, suffix); !ok {
			continue
		}
		owner, _, _ := strings.Cut(middle, ".")
		pidText, hostHash, ok := strings.Cut(owner, "@")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || hostHash != myHost || owner == mine || pidlock.Alive(host, pid, "") {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}
