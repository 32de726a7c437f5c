//go:build linux

package indexed

import "syscall"

// dropPages releases the pages of b, a piece of a read-only file mapping,
// from this process: the kernel keeps them in its page cache, but they no
// longer count toward the process's resident memory, so a scan of a large
// .bin does not grow it.
func dropPages(b []byte) {
	if len(b) > 0 {
		_ = syscall.Madvise(b, syscall.MADV_DONTNEED)
	}
}

// adviseRandom tells the kernel that b, the .bin's mapping, is read at
// random places: without it a page fault reads ahead as much as the
// device's read-ahead setting (8 MiB on some machines) around each
// sample, which a run reading a few samples per step never uses.
func adviseRandom(b []byte) {
	if len(b) > 0 {
		_ = syscall.Madvise(b, syscall.MADV_RANDOM)
	}
}
