//go:build unix

package sample

import (
	"fmt"
	"math"
	"os"
	"syscall"

	"gcompile/internal/filekind"
)

// mapFile maps a cache file read-only, so that the kernel shares its pages
// between the processes of a job and can drop them under pressure.
// Files are only ever replaced by rename, never rewritten in place, so a
// mapping stays valid while another process rebuilds the file.
func mapFile(path string) ([]byte, func() error, error) {
	if err := regular(path); err != nil {
		return nil, nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%w: %s is not a regular file (%s)", errStale, path, filekind.Of(st.Mode()))
	}
	size := st.Size()
	if size < headerSize {
		return nil, nil, fmt.Errorf("%w: %s has %d bytes, less than a header", errStale, path, size)
	}
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("%w: %s has %d bytes, more than this machine can map", errStale, path, size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}
