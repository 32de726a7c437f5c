package main

import (
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
			if syscall.Statfs(dir, &st) != nil {
				return 0, false
			}
			return int64(st.Bavail) * int64(st.Bsize), true
		}
		if dir == filepath.Dir(dir) {
			return 0, false
		}
	}
}
