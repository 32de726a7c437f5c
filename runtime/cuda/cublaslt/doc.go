// Package cublaslt runs GEMMs through cuBLASLt, bound with purego (no cgo),
// so gcompile keeps building as one binary with CGO_ENABLED=0.
//
// cuBLASLt (rather than cuBLAS) is used because it takes the data types of
// A, B and C separately from the compute type, runs on a caller's stream
// with a caller's workspace, and does strided batches in one call: exactly
// the bf16/fp16 GEMMs with fp32 accumulation that mixed-precision training
// needs.
//
// The package exposes one thing: a Plan for
//
//	C = alpha·op(A)·op(B) + beta·C
//
// on row-major matrices (gcompile's tensors are row-major), for f32, f16 and
// bf16 inputs, with transposes and strided batches, accumulating in fp32
// with fp32 alpha and beta. NewMatmul builds the descriptors and asks
// cuBLASLt's heuristic for an algorithm once; Run then executes it on a
// stream as often as needed.
//
// # Row-major through the column-major API
//
// cuBLASLt's default layout is column-major. A row-major r×c matrix with
// leading dimension ld has exactly the bytes of a column-major c×r matrix
// with the same ld: its transpose. So the plan computes
//
//	Cᵀ = op(B)ᵀ·op(A)ᵀ
//
// in column-major terms: cuBLASLt's "A" is our B and its "B" is our A, each
// keeping its own transpose flag, and m and n swap. This is the usual swap
// trick; it was chosen over CUBLASLT_ORDER_ROW because column-major is the
// order every cuBLASLt algorithm supports, so the heuristic is never
// narrowed by the layout.
//
// # Errors
//
// A failed call is an *Error naming the function and the status, with the
// text from cublasLtGetStatusName/cublasLtGetStatusString when the library
// has them (cublasGetStatusString lives in libcublas, which is not loaded)
// and from this package's table otherwise.
package cublaslt
