//go:build unix

package prepare

import (
	"io/fs"
	"syscall"
)

// fileID is what makes two paths one file: its device and inode, the same
// through any symbolic or hard link to it.
type fileID struct{ dev, ino uint64 }

// idOf is info's file identity; ok is false where the file system gives
// none to trust (no inode number), and the file is then never taken for
// another.
func idOf(_ string, info fs.FileInfo) (fileID, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || st.Ino == 0 {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, true
}
