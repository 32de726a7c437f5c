//go:build !linux

package cpu

// addressSpaceLimit is known on Linux only.
func addressSpaceLimit() (int64, bool) { return 0, false }

// virtualSize is known on Linux only.
func virtualSize(string) (int64, bool) { return 0, false }
