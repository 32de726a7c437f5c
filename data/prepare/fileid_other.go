//go:build !unix

package prepare

import (
	"io/fs"
	"path/filepath"
)

// fileID is what makes two paths one file: without inode numbers, its
// absolute path with every symbolic link resolved (hard links stay apart).
type fileID struct{ path string }

// idOf is the file identity of path; ok is false when its links cannot be
// resolved, and the file is then never taken for another.
func idOf(path string, _ fs.FileInfo) (fileID, bool) {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fileID{}, false
	}
	if p, err = filepath.Abs(p); err != nil {
		return fileID{}, false
	}
	return fileID{path: p}, true
}
