package passes

import "sort"

// VJPOps lists, sorted, every op that has an entry in the VJP table, so the
// external gradient-check test can assert that its table covers them all.
func VJPOps() []string {
	ops := make([]string, 0, len(vjps))
	for op := range vjps {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	return ops
}
