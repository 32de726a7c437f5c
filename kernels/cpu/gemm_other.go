//go:build !amd64 || purego

package cpu

// sgemmKernels: only the portable kernel outside amd64, or with the purego
// build tag (which keeps the assembly out).
var sgemmKernels = []*sgemmKernel{sgemmGeneric}
