package cpu

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParallelFor(t *testing.T) {
	cases := []struct{ n, grain int }{
		{0, 1}, {-3, 1}, {1, 1}, {2, 1}, {7, 3}, {100, 1}, {100, 50}, {100, 49}, {1000, 0}, {10, 100},
	}
	for _, c := range cases {
		var mu sync.Mutex
		hits := make([]int, max(c.n, 0))
		ParallelFor(c.n, c.grain, func(lo, hi int) {
			require.LessOrEqual(t, 0, lo)
			require.LessOrEqual(t, lo, hi)
			mu.Lock()
			defer mu.Unlock()
			for i := lo; i < hi; i++ {
				hits[i]++
			}
		})
		for i, h := range hits {
			require.Equal(t, 1, h, "n=%d grain=%d index %d", c.n, c.grain, i)
		}
	}
}
