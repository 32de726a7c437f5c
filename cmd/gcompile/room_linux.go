package main

import (
	"math"
	"os"
	"path/filepath"
	"syscall"
)

// freeBytes is the space an unprivileged writer has left on the file
// system that holds path, or the nearest folder above it that exists; ok
// is false when it cannot be told.
func freeBytes(path string) (n int64, ok bool) {
	for dir := filepath.Clean(path); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(dir); err == nil {
			var st syscall.Statfs_t
			// A file system that counts no blocks (tmpfs without a size,
			// some FUSE mounts) does not say what it holds.
			if syscall.Statfs(dir, &st) != nil || st.Blocks == 0 {
				return 0, false
			}
			unit := uint64(st.Frsize) // f_bavail counts fragments
			if unit == 0 {
				unit = uint64(st.Bsize)
			}
			if unit == 0 || st.Bavail > math.MaxInt64/unit {
				return math.MaxInt64, true
			}
			return int64(st.Bavail * unit), true
		}
		if dir == filepath.Dir(dir) {
			return 0, false
		}
	}
}

// sameFileSystem says whether the deepest existing folders of a and b are
// on one file system (one device), whose free space they share.
func sameFileSystem(a, b string) bool {
	dev := func(p string) (uint64, bool) {
		for d := filepath.Clean(p); ; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					return uint64(st.Dev), true
				}
				return 0, false
			}
			if d == filepath.Dir(d) {
				return 0, false
			}
		}
	}
	da, okA := dev(a)
	db, okB := dev(b)
	return okA && okB && da == db
}
