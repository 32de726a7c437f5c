// Package dl finds the NVIDIA shared libraries at run time and binds their C
// functions to Go function values, without cgo.
//
// gcompile builds with CGO_ENABLED=0 so that one binary, built anywhere, runs
// on a laptop without CUDA and on a GPU machine alike. Instead of linking
// against libcuda, libnvrtc, libcublasLt and libnccl at build time, the
// runtime/cuda packages open them with dlopen (through
// github.com/ebitengine/purego) the first time a GPU backend is asked for,
// and bind each entry point by name. No CUDA headers or toolkit are needed to
// build or test the project; a machine without the libraries gets a clear
// error naming what was searched, not a link failure.
//
// The resulting binary is not fully static: purego makes it link the system
// C library (libc, libdl, libpthread), which dlopen needs and which every
// glibc system has. Nothing from CUDA is linked.
//
// # Where libraries are looked for
//
// A [Spec] names a library: how to call it in messages, the environment
// variable that overrides the search, its sonames in order of preference and
// the folders the NVIDIA Python wheels put it in. [Search.Open] tries, in
// order:
//
//  1. the override variable, if set: a path to the file, used as-is. If it
//     cannot be loaded that is the error; nothing else is tried, so a typo
//     never silently picks up a different library;
//  2. each folder of LD_LIBRARY_PATH;
//  3. /usr/local/cuda/lib64, /usr/local/cuda/targets/<arch>-linux/lib,
//     /usr/lib/<arch>-linux-gnu, /usr/lib64;
//  4. Python site-packages folders joined with the wheel subfolders
//     (nvidia/cuda_nvrtc/lib, nvidia/cublas/lib, nvidia/nccl/lib, and
//     nvidia/cu13/lib where CUDA 13 wheels put everything but NCCL). Site
//     folders are taken from GCOMPILE_PYTHON_SITE, $VIRTUAL_ENV,
//     $CONDA_PREFIX, ~/.local, /usr/local/lib and /usr/lib (site- and
//     dist-packages), in that order, so the active environment wins over
//     the system one;
//  5. the bare soname, resolved by the dynamic loader (ld.so.cache).
//
// Inside each folder the sonames are tried in the Spec's order (for example
// libnvrtc.so.13 before libnvrtc.so.12), so a folder earlier in the list
// wins over a newer soname in a later folder, as with the dynamic loader.
// A file that exists but does not load (wrong architecture, truncated) is
// recorded and the search goes on.
//
// When nothing loads, the error wraps [ErrNotFound] and lists every path
// tried with the reason it failed, and names the variable to set.
//
// # Environment variables
//
//	GCOMPILE_LIBCUDA      path to libcuda.so (the CUDA driver)
//	GCOMPILE_LIBNVRTC     path to libnvrtc.so (runtime CUDA C++ compiler)
//	GCOMPILE_LIBCUBLASLT  path to libcublasLt.so (GEMMs)
//	GCOMPILE_LIBNCCL      path to libnccl.so (collectives)
//	GCOMPILE_PYTHON_SITE  extra site-packages folders (':'-separated) to
//	                      search for NVIDIA wheels, before the usual ones
//	LD_LIBRARY_PATH       searched before the standard CUDA folders
//
// # Binding symbols
//
// purego.RegisterLibFunc panics when a symbol is missing. [Lib.Bind] looks
// the symbol up first and returns an error naming the symbol and the library
// instead, and [Lib.BindAll] reports every missing symbol of a table at once,
// so a version mismatch is diagnosed in one go. Symbols that only newer
// library versions have (ncclAlltoAll, cuEventElapsedTime_v2) are bound with
// [Optional] or [FirstOf].
package dl
