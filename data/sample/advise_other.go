//go:build !linux

package sample

// adviseRandom does nothing where madvise is not available.
func adviseRandom([]byte) {}
