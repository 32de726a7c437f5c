//go:build amd64 && !purego

package cpu

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkPeakFMA measures this machine's fp32 peak: independent FMA
// chains on every worker, nothing else. GEMM figures are quoted as a
// fraction of it.
func BenchmarkPeakFMA(b *testing.B) {
	avx2FMA, avx512 := x86Features()
	loops := []struct {
		name  string
		ok    bool
		flops int // per iteration
		fn    func(int)
	}{
		{"zmm", avx512, 12 * 16 * 2, fmaPeakAVX512},
		{"ymm", avx2FMA, 12 * 8 * 2, fmaPeakAVX2},
	}
	for _, l := range loops {
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/workers=%d", l.name, workers), func(b *testing.B) {
				if !l.ok {
					b.Skipf("no %s FMA on this CPU", l.name)
				}
				const iters = 1 << 20
				for range b.N {
					var wg sync.WaitGroup
					for range workers {
						wg.Go(func() { l.fn(iters) })
					}
					wg.Wait()
				}
				b.ReportMetric(float64(workers*iters*l.flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkSgemmKernels runs one shape through each micro-kernel this
// machine supports, to compare them with each other.
func BenchmarkSgemmKernels(b *testing.B) {
	for _, kern := range sgemmKernels {
		for _, s := range []int{256, 1024} {
			b.Run(fmt.Sprintf("kernel=%s/%d", kern.name, s), func(b *testing.B) {
				if kern == sgemmGeneric && s > 256 {
					b.Skip("too slow to be interesting")
				}
				g := newGemmOperands(1, false, false, s, s, s, 0, 0)
				c := make([]float32, s*s)
				for range b.N {
					sgemm(kern, true, false, false, s, s, s, g.a, g.lda, g.b, g.ldb, c, s)
				}
				b.ReportMetric(2*float64(s*s*s)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
