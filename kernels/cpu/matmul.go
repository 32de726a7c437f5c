package cpu

import (
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// blasImpl is stateless; a package-level value avoids re-creating it per call.
var blasImpl gonum.Implementation

// MatMul computes, for each of batch independent problems, c = op(a)·op(b),
// overwriting c.
//
// op(a) is m×k; it is stored m×k row-major, or k×m when transA is set.
// op(b) is k×n; it is stored k×n, or n×k when transB is set. Problem i reads
// a[i*m*k:], writes c[i*m*n:] and reads b[i*k*n:], or b[0:] for every
// problem when bShared is set (a weight matrix applied to a batch of
// activations). c must not alias a or b.
//
// When b is shared and a is not transposed, the batch is folded into m and
// solved as one large product, which keeps the GEMM well shaped. Other
// batched calls run small problems in parallel, one per goroutine, and
// large ones one after another, each using every core.
func MatMul[T Float](c, a, b []T, batch, m, n, k int, transA, transB, bShared bool) {
	checkNonNeg("MatMul", batch, m, n, k)
	checkLen("MatMul", "a", len(a), batch*m*k)
	checkLen("MatMul", "c", len(c), batch*m*n)
	if bShared {
		checkLen("MatMul", "b", len(b), k*n)
	} else {
		checkLen("MatMul", "b", len(b), batch*k*n)
	}
	switch av := any(a).(type) {
	case []float32:
		matMul(any(c).([]float32), av, any(b).([]float32), batch, m, n, k, transA, transB, bShared, gemm32)
	case []float64:
		matMul(any(c).([]float64), av, any(b).([]float64), batch, m, n, k, transA, transB, bShared, gemm64)
	default:
		// Named float types share their representation with the builtin
		// type of the same size, so reinterpret instead of copying.
		var zero T
		if unsafe.Sizeof(zero) == 4 {
			matMul(reinterpret[T, float32](c), reinterpret[T, float32](a), reinterpret[T, float32](b),
				batch, m, n, k, transA, transB, bShared, gemm32)
		} else {
			matMul(reinterpret[T, float64](c), reinterpret[T, float64](a), reinterpret[T, float64](b),
				batch, m, n, k, transA, transB, bShared, gemm64)
		}
	}
}

// reinterpret views s as a slice of U. Only called when T and U have the
// same size and both are IEEE floats, so the bits mean the same thing.
func reinterpret[T Float, U float32 | float64](s []T) []U {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*U)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

// gemmFunc overwrites the m×n matrix c (leading dimension ldc) with
// op(a)·op(b); lda and ldb are the leading dimensions of a and b as stored.
type gemmFunc[E float32 | float64] func(transA, transB bool, m, n, k int, a []E, lda int, b []E, ldb int, c []E, ldc int)

func matMul[E float32 | float64](c, a, b []E, batch, m, n, k int, transA, transB, bShared bool, gemm gemmFunc[E]) {
	if batch == 0 || m == 0 || n == 0 {
		return
	}
	if k == 0 {
		// An empty inner dimension is a sum of nothing; BLAS rejects the
		// zero leading dimension this would imply.
		clear(c)
		return
	}
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	if bShared && !transA {
		// Stacked row-major m×k blocks are one (batch·m)×k matrix.
		gemm(false, transB, batch*m, n, k, a, lda, b, ldb, c, n)
		return
	}
	strideB := k * n
	if bShared {
		strideB = 0
	}
	one := func(i int) {
		gemm(transA, transB, m, n, k,
			a[i*m*k:(i+1)*m*k], lda,
			b[i*strideB:i*strideB+k*n], ldb,
			c[i*m*n:(i+1)*m*n], n)
	}
	// Large problems each use every core themselves; a batch of tiny
	// ones is over before goroutines would start.
	if batch == 1 || m*n*k >= sgemmParallelMin || batch*m*n*k < batchSerialMax {
		for i := range batch {
			one(i)
		}
		return
	}
	parallelChunks(batch, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			one(i)
		}
	})
}

// batchSerialMax is the batch·m·n·k under which a batched product runs
// on the calling goroutine: about a microsecond of work, what starting a
// goroutine costs.
const batchSerialMax = 1 << 16

func blasTrans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// gemm32Gonum is fp32 through gonum's Sgemm: the benchmarks' baseline and
// an independent check in the tests.
func gemm32Gonum(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	blasImpl.Sgemm(blasTrans(transA), blasTrans(transB), m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
}

// gemm64 is the fp64 product; gonum's Dgemm is used as is.
func gemm64(transA, transB bool, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	blasImpl.Dgemm(blasTrans(transA), blasTrans(transB), m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
}

// matMulGonum32 is MatMul with the fp32 path pinned to gonum's Sgemm, so
// the benchmarks can compare the packed GEMM with it on equal terms.
func matMulGonum32(c, a, b []float32, batch, m, n, k int, transA, transB, bShared bool) {
	matMul(c, a, b, batch, m, n, k, transA, transB, bShared, gemm32Gonum)
}
