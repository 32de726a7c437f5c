//go:build !linux

package indexed

// dropPages does nothing where madvise is not available: the pages of a
// scanned mapping stay resident until the kernel needs them back.
func dropPages([]byte) {}

// adviseRandom does nothing where madvise is not available.
func adviseRandom([]byte) {}
