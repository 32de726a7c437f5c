package cpu

import (
	"fmt"
	"testing"
)

// Measured on the 2-vCPU development machine (Sapphire Rapids, KVM,
// GOMAXPROCS=2, otherwise idle), medians of 6 runs; raw output and
// benchstat in bench/results/cpu-gemm-2026-12-02.txt:
//
//	                               packed (MatMul)   gonum Sgemm   GFLOP/s
//	512³                           131               7.2
//	1024³                          148               7.3
//	2048³                          168               7.8
//	2048×768×768                   155               7.6
//	2048×3072×768                  169               8.0
//	768×768×2048 transA            147               4.8
//	2048×768×768 transB            168               11.8
//	32 × 128×128×64                145               9.1
//	64 × 128×128×32 transB         103               9.2
//
// BenchmarkPeakFMA measured 204 GFLOP/s with both workers on zmm FMAs
// (129 on one), so 1024³ runs at 73 % and 2048³ at 83 % of this
// machine's measured fp32 peak.

// gemmBenchShape is one MatMul call of the benchmarks.
type gemmBenchShape struct {
	name                    string
	batch, m, n, k          int
	transA, transB, bShared bool
}

// gemmBenchShapes: squares, then the reference GPT's own products (hidden
// 768, MLP 3072, 2048 tokens a step, 12 heads of 64 or 24 of 32, sequence
// 128).
var gemmBenchShapes = []gemmBenchShape{
	{name: "512", batch: 1, m: 512, n: 512, k: 512},
	{name: "1024", batch: 1, m: 1024, n: 1024, k: 1024},
	{name: "2048", batch: 1, m: 2048, n: 2048, k: 2048},
	// Activations times a weight: projections, MLP up and down.
	{name: "2048x768x768", batch: 1, m: 2048, n: 768, k: 768},
	{name: "2048x3072x768", batch: 1, m: 2048, n: 3072, k: 768},
	{name: "2048x768x3072", batch: 1, m: 2048, n: 768, k: 3072},
	// Weight gradient xᵀ·dy and input gradient dy·wᵀ.
	{name: "768x768x2048_tA", batch: 1, m: 768, n: 768, k: 2048, transA: true},
	{name: "2048x768x768_tB", batch: 1, m: 2048, n: 768, k: 768, transB: true},
	// Attention: q·kᵀ and p·v per head.
	{name: "32x128x128x64", batch: 32, m: 128, n: 128, k: 64},
	{name: "64x128x128x32_tB", batch: 64, m: 128, n: 128, k: 32, transB: true},
	{name: "64x128x128x32", batch: 64, m: 128, n: 128, k: 32},
	{name: "64x128x32x128", batch: 64, m: 128, n: 32, k: 128},
}

func benchGemm(b *testing.B, s gemmBenchShape, f func(c, a, bb []float32, batch, m, n, k int, tA, tB, bS bool)) {
	r := newRand(1)
	nb := s.batch
	if s.bShared {
		nb = 1
	}
	a := randVec[float32](r, s.batch*s.m*s.k, -1, 1)
	bb := randVec[float32](r, nb*s.k*s.n, -1, 1)
	c := make([]float32, s.batch*s.m*s.n)
	f(c, a, bb, s.batch, s.m, s.n, s.k, s.transA, s.transB, s.bShared) // warm the buffer pools
	b.ResetTimer()
	for range b.N {
		f(c, a, bb, s.batch, s.m, s.n, s.k, s.transA, s.transB, s.bShared)
	}
	b.ReportMetric(2*float64(s.batch*s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkMatMul runs every shape through the path MatMul takes (packed)
// and through gonum's Sgemm (gonum); compare them with
// benchstat -col /impl.
func BenchmarkMatMul(b *testing.B) {
	for _, s := range gemmBenchShapes {
		b.Run(fmt.Sprintf("shape=%s/impl=packed", s.name), func(b *testing.B) { benchGemm(b, s, MatMul[float32]) })
		b.Run(fmt.Sprintf("shape=%s/impl=gonum", s.name), func(b *testing.B) { benchGemm(b, s, matMulGonum32) })
	}
}
