// Package cpu holds the hand-written CPU kernels that the gcompile CPU
// runtime calls for every lowered op.
//
// Kernels work on plain contiguous row-major Go slices. The runtime hands
// them views into one byte arena, so no kernel allocates its outputs: the
// caller always passes the destination first. Most kernels are generic over
// [Float] (float32 and float64 and types derived from them) so that one
// implementation serves both precisions; where precision matters
// (reductions, normalisation statistics, log-sum-exp) the arithmetic is done
// in float64 regardless of T.
//
// Aliasing: elementwise kernels and optimizer updates allow the output to
// be the very same slice as an input, so the runtime can update buffers in
// place. All other kernels require out to be disjoint from their inputs
// unless their documentation says otherwise.
//
// Errors and panics: kernels whose result depends on data that the caller
// cannot validate cheaply ahead of time (token ids, class labels) return an
// error that names the offending value and position. Mismatched slice
// lengths or shapes are bugs in the code that lowered the graph, not data
// problems, so they panic with a message that says what disagreed.
//
// Parallelism: row-wise and large elementwise kernels split their work with
// [ParallelFor] over runtime.GOMAXPROCS(0) goroutines; matrix products go
// through [MatMul]: float32 products run the package's packed GEMM, whose
// micro-kernel (AVX-512 or AVX2 assembly, or portable Go) is chosen at
// start-up by what the CPU supports, split over rows of the result so
// every element sums in one order; float64 products use gonum's BLAS.
package cpu
