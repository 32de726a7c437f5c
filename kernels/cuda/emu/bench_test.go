package emu

import (
	"fmt"
	"testing"
)

// BenchmarkBlockReduction launches a row reduction (a block barrier and
// warp shuffles per step) over 64 rows of 16384 elements, one block a
// row: the barrier-bound work the kernel tests are made of.
func BenchmarkBlockReduction(b *testing.B) {
	if buildErr != nil {
		b.Skipf("no emulator: %v", buildErr)
	}
	e := built
	const rows, cols = 64, 16384
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	out := make([]float32, rows)
	for _, block := range []uint32{256, 1024} {
		b.Run(fmt.Sprintf("block=%d", block), func(b *testing.B) {
			for b.Loop() {
				if err := e.Launch("gc_reduce_sum_rows", [3]uint32{rows, 1, 1}, [3]uint32{block, 1, 1}, 0, out, x, int64(rows), int64(cols), 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
