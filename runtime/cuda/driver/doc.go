// Package driver binds the CUDA driver API (libcuda) through purego, without
// cgo, so gcompile builds as one binary with CGO_ENABLED=0 and finds the
// driver only when a GPU backend is asked for.
//
// It covers what the CUDA backend needs to run a lowered program: device
// properties, the primary context, streams and events, device and pinned
// host memory, synchronous and asynchronous copies, memsets, loading a CUBIN
// produced by NVRTC, and kernel launches. Handles are typed (Device, Context,
// Stream, Event, Module, Function, DevicePtr) so they cannot be mixed up, and
// every call checks its status: a failure is an *Error carrying the API name
// and the driver's own name and text for the code, e.g.
//
//	cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: out of memory
//
// errors.Is(err, driver.ErrorOutOfMemory) tests for a given code.
//
// The symbols bound are the ones cuda.h maps the API names to (for example
// cuMemAlloc is cuMemAlloc_v2, cuDevicePrimaryCtxRelease is
// cuDevicePrimaryCtxRelease_v2), in their legacy default-stream form (not the
// _ptds/_ptsz variants). Elapsed time uses cuEventElapsedTime_v2 where the
// driver has it (12.8 and later) and cuEventElapsedTime otherwise.
//
// # Threads
//
// A CUDA context is current per OS thread, and goroutines move between
// threads. Code that calls the driver must either lock its goroutine to a
// thread (runtime.LockOSThread) after SetCurrent, or call SetCurrent before
// each sequence of calls.
//
// # Host memory and asynchronous copies
//
// The synchronous copies take Go byte slices; the driver is done with them
// when the call returns. The asynchronous ones take HostMem, pinned memory
// from MemAllocHost, because the copy happens after the call returns and Go
// memory may not be read by the device then.
package driver
