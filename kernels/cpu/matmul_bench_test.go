package cpu

import (
	"testing"
)

// Measured fp32 throughput, 2-core Intel Xeon (Sapphire Rapids, KVM),
// GOMAXPROCS=2, Go 1.26, CGO_ENABLED=0. The machine was shared with other
// builds while measuring, so each figure is best / median of 8 alternating
// runs of -benchtime 3x; the ratio is what matters, not the absolute value.
//
//	                          MatMul (blocked)   MatMulGonum (Sgemm)
//	1024×1024×1024            12.1 / 10.6        11.7 / 8.0   GFLOP/s
//	512×512×512               15.6 / 10.0        10.8 / 8.5   GFLOP/s
//	batch 32 × 128×128×64     13.3 / 8.4          9.6 / 8.1   GFLOP/s
//
// A later, more contended session gave 11.6 / 8.5 vs 8.7 / 5.8 at 1024³,
// 10.6 / 8.0 vs 8.7 / 6.1 at 512³ and 9.2 / 6.6 vs 9.3 / 5.1 batched: the
// blocked kernel wins clearly on the large squares and roughly ties on the
// small batched problems.
//
// Other shapes (best-of-3 medians) that set gemm32's dispatch rules:
//
//	768×768×2048, transA (weight gradient)    15.3 vs  7.0  → blocked
//	2048×3072×768 (MLP up-projection)         14.2 vs  8.7  → blocked
//	2048×768×768, transB                      13.1 vs 15.0  → gonum
//	2048×64×768, transB                        9.8 vs 14.9  → gonum
//	2048×16×768 (narrow n)                     3.4 vs  6.3  → gonum
//
// A register-blocked 4×4 pure-Go microkernel over packed panels was also
// tried and reached only ~4.9 GFLOP/s at 1024³: without SIMD the sixteen
// scalar accumulators spill on amd64, so it was dropped in favour of
// gonum's vectorised axpy fed by a better blocking.

func benchGemm(b *testing.B, batch, m, n, k int, f func(c, a, bb []float32, batch, m, n, k int, tA, tB, bS bool)) {
	r := newRand(1)
	a := randVec[float32](r, batch*m*k, -1, 1)
	bb := randVec[float32](r, batch*k*n, -1, 1)
	c := make([]float32, batch*m*n)
	b.ResetTimer()
	for range b.N {
		f(c, a, bb, batch, m, n, k, false, false, false)
	}
	b.ReportMetric(2*float64(batch*m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkMatMul measures the fp32 path MatMul actually takes.
func BenchmarkMatMul(b *testing.B) {
	b.Run("1024", func(b *testing.B) { benchGemm(b, 1, 1024, 1024, 1024, MatMul[float32]) })
	b.Run("512", func(b *testing.B) { benchGemm(b, 1, 512, 512, 512, MatMul[float32]) })
	b.Run("batch32x128x128x64", func(b *testing.B) { benchGemm(b, 32, 128, 128, 64, MatMul[float32]) })
}

// BenchmarkMatMulGonum is the same problems through gonum's Sgemm alone,
// the baseline the blocked kernel has to beat to be selected.
func BenchmarkMatMulGonum(b *testing.B) {
	b.Run("1024", func(b *testing.B) { benchGemm(b, 1, 1024, 1024, 1024, matMulGonum32) })
	b.Run("512", func(b *testing.B) { benchGemm(b, 1, 512, 512, 512, matMulGonum32) })
	b.Run("batch32x128x128x64", func(b *testing.B) { benchGemm(b, 32, 128, 128, 64, matMulGonum32) })
}
