//go:build !unix

package pidlock

// processRuns cannot tell here, so a lock always counts as held: the
// refusal says to remove it if its process is gone.
func processRuns(int) bool { return true }

// holdGuard takes the guard file at path: with no flock, holdExclusive.
func holdGuard(path string) (func(), error) { return holdExclusive(path) }
