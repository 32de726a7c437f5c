package comm

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"gcompile/runtime"
)

// benchSizes are the all-reduce sizes every transport is measured at, in
// bytes: 1 KiB to 64 MiB by factors of 4.
var benchSizes = []int{1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26}

// sizeName names a benchmark size: "64KiB", "16MiB".
func sizeName(size int) string {
	if size >= 1<<20 {
		return fmt.Sprintf("%dMiB", size>>20)
	}
	return fmt.Sprintf("%dKiB", size>>10)
}

// reportCPU adds the CPU time per operation since start: on a machine
// shared with other work it varies far less than the wall time, and it is
// what the transport costs whatever the machine's load.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// benchAllReduce times an all-reduce of size bytes of float32 between the
// two ranks of comms, in bus bandwidth: 2·(n−1)/n · bytes per second,
// NCCL's convention (= size for n = 2). Each rank is one goroutine that
// makes all b.N calls, as a device's goroutine does in a job.
func benchAllReduce(b *testing.B, size int, comms [2]runtime.Comm) {
	g := runtime.Group{Ranks: []int{0, 1}}
	bufs := [][]float32{make([]float32, size/4), make([]float32, size/4)}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := cpuTime()
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			for range b.N {
				if err := AllReduce(comms[r], g, r, bufs[r]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	reportCPU(b, start)
}

// BenchmarkLocalAllReduce is Local's all-reduce between two ranks, the
// bound for what Net can reach with both ranks in one process.
func BenchmarkLocalAllReduce(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			c := NewLocal(2)
			benchAllReduce(b, size, [2]runtime.Comm{c, c})
		})
	}
}
