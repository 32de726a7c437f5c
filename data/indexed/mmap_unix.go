//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package indexed

import (
	"fmt"
	"os"
	"syscall"
)

// canMap says whether this system memory-maps datasets; tests turn it off
// to exercise the read-through fallback.
var canMap = true

// mapFile maps the first size bytes of f read-only. The mapping outlives f,
// so f may be closed at once.
func mapFile(f *os.File, size int64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%d bytes do not fit this system's address space", size)
	}
	return syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

func unmapFile(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return syscall.Munmap(b)
}
