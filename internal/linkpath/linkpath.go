// Package linkpath finds where an output named through a symbolic link
// lands, for the writers that replace a file by renaming a finished
// temporary file over it.
package linkpath

import (
	"os"
	"path/filepath"
)

// Target is the file an output written to path lands in: path itself,
// or where the symbolic links it names lead (a chain of them, each
// relative to its own folder; the last may not exist yet). An output is
// written through a link, as a shell's redirection or cp writes: renaming
// the new file over the link would replace the user's link with a file
// and leave the file it named stale. A chain of more than 40 links (a
// loop) is path itself, which the write then names in its error.
func Target(path string) string {
	p := path
	for range 40 {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return p
		}
		to, err := os.Readlink(p)
		if err != nil {
			return p
		}
		if !filepath.IsAbs(to) {
			to = filepath.Join(filepath.Dir(p), to)
		}
		p = to
	}
	return path
}
