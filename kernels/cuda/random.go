package cuda

import "math"

// DropoutArgs returns gc_random_dropout's keep and scale for the drop
// probability p (0 ≤ p < 1), deciding as kernels/cpu's RandomDropout
// does: a draw whose top 23 bits m give the uniform (m + ½)/2²³ below
// 1 − p, both in double, is kept, and the kept ones are
// float32(1/(1 − p)). The uniform grows with m, so the kept draws are
// those with m < keep, keep the number of such m: the kernel compares
// integers, and no double crosses the launch.
func DropoutArgs(p float64) (keep int64, scale float32) {
	const n = 1 << 23
	kept := 1 - p
	unit := func(m int64) float64 { return (float64(m) + 0.5) / n } // kernels/cpu's unit23
	keep = min(max(int64(math.Ceil(kept*n-0.5)), 0), n)
	// The estimate is exact but for the rounding of kept·n − ½; settle it
	// with the CPU's own comparison.
	for keep > 0 && !(unit(keep-1) < kept) {
		keep--
	}
	for keep < n && unit(keep) < kept {
		keep++
	}
	return keep, float32(1 / (1 - p))
}
