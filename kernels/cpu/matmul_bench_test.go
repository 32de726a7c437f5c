package cpu

import (
	"math/rand/v2"
	"testing"
)

func benchGemm(b *testing.B, batch, m, n, k int, f func(c, a, bb []float32, batch, m, n, k int, tA, tB, bS bool)) {
	r := rand.New(rand.NewPCG(1, 2))
	a := make([]float32, batch*m*k)
	bb := make([]float32, batch*k*n)
	c := make([]float32, batch*m*n)
	for i := range a {
		a[i] = r.Float32()
	}
	for i := range bb {
		bb[i] = r.Float32()
	}
	b.ResetTimer()
	for range b.N {
		f(c, a, bb, batch, m, n, k, false, false, false)
	}
	b.ReportMetric(2*float64(batch*m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkMatMul(b *testing.B) {
	b.Run("1024", func(b *testing.B) { benchGemm(b, 1, 1024, 1024, 1024, MatMul[float32]) })
	b.Run("512", func(b *testing.B) { benchGemm(b, 1, 512, 512, 512, MatMul[float32]) })
	b.Run("batch32x128x128x64", func(b *testing.B) { benchGemm(b, 32, 128, 128, 64, MatMul[float32]) })
}

func BenchmarkMatMulGonum(b *testing.B) {
	b.Run("1024", func(b *testing.B) { benchGemm(b, 1, 1024, 1024, 1024, matMulGonum32) })
	b.Run("512", func(b *testing.B) { benchGemm(b, 1, 512, 512, 512, matMulGonum32) })
	b.Run("batch32x128x128x64", func(b *testing.B) { benchGemm(b, 32, 128, 128, 64, matMulGonum32) })
}
