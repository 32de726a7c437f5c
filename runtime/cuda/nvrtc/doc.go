// Package nvrtc compiles CUDA C++ kernels to CUBIN at run time with NVRTC,
// bound through purego (no cgo), and caches the results on disk.
//
// gcompile embeds its kernels as CUDA C sources and builds with
// CGO_ENABLED=0, so neither nvcc nor CUDA headers are needed to build it.
// On a GPU machine each kernel is compiled on first use for the device's
// exact architecture (--gpu-architecture=sm_XY), straight to CUBIN: no PTX
// is handed to the driver's JIT, so what runs is what NVRTC produced.
//
// A compile failure is a *CompileError whose message includes the
// compiler's log, so a broken generated kernel reports its line and error.
//
// # Cache
//
// Compiling a kernel takes NVRTC tens to hundreds of milliseconds; a
// training run uses dozens of kernels and is started many times. Cache keeps
// CUBINs in a folder ($GCOMPILE_CACHE, else the user cache folder's
// gcompile/cubin) under the SHA-256 of everything that determines the
// output: the source, its name, the architecture, the options, the NVRTC
// version and the driver version. A hit reads the file and does not call
// NVRTC. Files are written to a temporary name and renamed into place, so a
// concurrent or interrupted run never sees half a CUBIN, and each file
// carries a checksum so a damaged one is recompiled rather than loaded.
package nvrtc
