//go:build !linux

package cpu

// addressSpaceLimit is known on Linux only.
func addressSpaceLimit() (int64, bool) { return 0, false }
