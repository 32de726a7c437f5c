// Package codegen turns the body of a fused op (ir.FusedBody, made by the
// fuse pass) into code a backend runs: a Go closure for the CPU backend
// ([CPU]) and the CUDA C source of one kernel for the CUDA backend
// ([CUDA]).
//
// Both compute exactly what the unfused ops compute. The CPU closure
// calls the same kernels/cpu functions the CPU backend calls for each op,
// over tiles of a few thousand elements held in scratch: every element
// goes through the same float32 or float64 arithmetic, so a fused program
// is bit-identical to the unfused one, and the intermediate values never
// leave the cache. The CUDA kernel writes each op as the expression its
// kernels/cuda kernel uses and keeps every intermediate rounded to float
// before the next op reads it, so the compiler cannot contract a multiply
// of one op with an add of the next into an FMA the unfused kernels
// would not have formed.
//
// codegen imports kernels/cpu for the scalar kernels: sharing them, not
// copying their arithmetic, is what makes fusion bit-exact on the CPU.
package codegen
