//go:build linux

package sample

import "syscall"

// adviseRandom tells the kernel that b, an index mapping, is read at random
// places, so that a page fault does not read ahead megabytes around each
// lookup.
func adviseRandom(b []byte) {
	if len(b) > 0 {
		_ = syscall.Madvise(b, syscall.MADV_RANDOM)
	}
}
