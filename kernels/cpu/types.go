package cpu

import (
	"fmt"
	"runtime"
	"sync"
)

// Float is the set of element types that the floating-point kernels accept.
// Derived types are allowed so callers may use their own named float types.
type Float interface{ ~float32 | ~float64 }

// Number is the set of element types that [Cast] converts between.
type Number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

// ParallelFor calls fn on disjoint half-open subranges that together cover
// [0, n). The range is split over runtime.GOMAXPROCS(0) goroutines when n is
// at least 2·grain, so that tiny loops do not pay goroutine start-up costs;
// otherwise fn(0, n) runs on the calling goroutine. ParallelFor returns once
// every call to fn has returned. A grain below 1 is treated as 1, and n ≤ 0
// calls nothing.
func ParallelFor(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	workers := runtime.GOMAXPROCS(0)
	if workers < 2 || n < 2*grain {
		fn(0, n)
		return
	}
	// Never make chunks smaller than grain: the caller picked it as the
	// smallest amount of work that is worth a goroutine.
	chunks := min(workers, n/grain)
	var wg sync.WaitGroup
	lo := 0
	for i := range chunks {
		hi := lo + (n-lo)/(chunks-i)
		if i == chunks-1 {
			// Run the last chunk here instead of idling in Wait.
			fn(lo, hi)
			break
		}
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, hi)
		lo = hi
	}
	wg.Wait()
}

// elemGrain is the smallest number of elements worth handing to a goroutine
// in cheap elementwise loops; below about this many the spawn and join cost
// more than the arithmetic.
const elemGrain = 16384

// rowGrain picks a row grain so that each goroutine gets roughly elemGrain
// elements of work when rows have n elements each.
func rowGrain(n int) int {
	if n <= 0 {
		return elemGrain
	}
	return max(1, elemGrain/n)
}

// checkLen panics when a slice does not hold exactly want elements. The
// runtime derives all lengths from the compiled graph, so a mismatch is a
// lowering bug and is reported loudly rather than silently truncating.
func checkLen(kernel, name string, got, want int) {
	if got != want {
		panic(fmt.Sprintf("cpu.%s: len(%s) = %d, want %d", kernel, name, got, want))
	}
}

// fmtLen formats the panic message for an operand whose length disagrees
// with out; operand i counts from 0 after out.
func fmtLen(kernel string, i, got, want int) string {
	return fmt.Sprintf("cpu.%s: operand %d has %d elements, out has %d", kernel, i+1, got, want)
}

// checkNonNeg panics on negative dimensions, which can only come from a
// lowering bug.
func checkNonNeg(kernel string, dims ...int) {
	for _, d := range dims {
		if d < 0 {
			panic(fmt.Sprintf("cpu.%s: negative dimension %d", kernel, d))
		}
	}
}
