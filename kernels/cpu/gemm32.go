package cpu

import "sync"

// gemm32 is the fp32 product MatMul uses. It picks, per problem, whichever
// of gonum's Sgemm and gemm32Blocked measured faster for that kind of shape
// on the 2-core development machine (figures in matmul_bench_test.go):
//
//   - op(b) transposed: gonum computes A·Bᵀ with contiguous dot products,
//     which beat the blocked kernel's transpose-then-axpy (≈15 vs ≈13
//     GFLOP/s at 2048×768×768).
//   - narrow outputs (n < gemmMinN) or tiny products: the blocked kernel's
//     axpy rows are too short to amortise their call overhead.
//   - everything else, the common activation·weight and weight-gradient
//     shapes, goes to gemm32Blocked (≈1.3–2× gonum).
func gemm32(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if transB || n < gemmMinN || m*n*k < gemmSmall {
		gemm32Gonum(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
		return
	}
	gemm32Blocked(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
}

// Blocking for gemm32Blocked. A kc×nc panel of B (256×1024 floats, 1 MiB)
// stays resident in the per-core L2 while each row of C (nc floats, 4 KiB)
// stays in L1 and receives kc rank-one row updates.
const (
	gemmKC = 256
	gemmNC = 1024
	// gemmRowGrain keeps at least this many rows of C per goroutine so each
	// one streams the B panel enough times to pay for pulling it into L2.
	gemmRowGrain = 16
	// gemmSmall is the m·n·k below which gonum's Sgemm is used directly:
	// at that size the per-row call overhead of the blocked kernel wins
	// nothing.
	gemmSmall = 64 * 64 * 64
	// gemmMinN is the narrowest c for which the blocked kernel is used;
	// at n = 64 gonum was still ~1.5× faster.
	gemmMinN = 128
)

// packPool recycles the transposed-B buffers; the runtime calls MatMul with
// the same shapes every training step.
var packPool = sync.Pool{New: func() any { return new([]float32) }}

// gemm32Blocked overwrites c with op(a)·op(b).
//
// gonum's Sgemm works on 64×64 tiles, so its vectorised axpy inner loop
// runs on 64-float rows and spends much of its time on call and loop
// overhead. This kernel keeps the same assembly axpy (through the exported
// level-1 Saxpy) but feeds it rows up to gemmNC long from a cache-blocked B
// panel, and splits rows of c over goroutines. On the 2-core development
// machine that is ~1.3× faster at 1024³; see matmul_bench_test.go.
//
// It accepts every layout so it can be tested on its own, but gemm32 only
// sends it the shapes where it wins.
func gemm32Blocked(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if transB {
		// Rows of op(b) must be contiguous for the axpy; transpose once
		// up front, which costs O(k·n) against the O(m·n·k) product.
		buf := packPool.Get().(*[]float32)
		defer packPool.Put(buf)
		if cap(*buf) < k*n {
			*buf = make([]float32, k*n)
		}
		bt := (*buf)[:k*n]
		transpose2D(bt, b[:(n-1)*ldb+k], n, k, ldb)
		b, ldb = bt, n
	}
	ParallelFor(m, gemmRowGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			clear(c[i*ldc : i*ldc+n])
		}
		for jc := 0; jc < n; jc += gemmNC {
			nc := min(gemmNC, n-jc)
			for pc := 0; pc < k; pc += gemmKC {
				kc := min(gemmKC, k-pc)
				for i := lo; i < hi; i++ {
					crow := c[i*ldc+jc : i*ldc+jc+nc]
					for l := pc; l < pc+kc; l++ {
						var ail float32
						if transA {
							ail = a[l*lda+i]
						} else {
							ail = a[i*lda+l]
						}
						blasImpl.Saxpy(nc, ail, b[l*ldb+jc:l*ldb+jc+nc], 1, crow, 1)
					}
				}
			}
		}
	})
}
