// Package fakegpu is a working stand-in for an NVIDIA GPU, for testing the
// CUDA backend on machines that have none.
//
// It compiles, with the system's g++ and gcc, four shared libraries that
// implement the C entry points the runtime/cuda bindings bind, under the
// sonames the bindings look for:
//
//	libcuda.so.1       the driver: devices, primary contexts (current per OS
//	                   thread), streams, events, memory, modules, launches
//	libnvrtc.so.12     a "compiler" that checks options, fails on #error with
//	                   NVRTC's log format, and lists the kernels it finds
//	libcublasLt.so.12  real (naive) GEMMs in f32, f16 and bf16 with f32
//	                   accumulation and round-to-nearest-even outputs
//	libnccl.so.2       communicators of one rank: collectives are copies
//
// plus the kernel emulator of package kernels/cuda/emu, which runs the CUDA
// C kernels of kernels/cuda on CPU threads. Kernels therefore compute real
// results: a program run on the fake GPU can be compared with the CPU
// backend number for number. Device memory is host memory, so everything
// runs synchronously; timings measure the emulation and say nothing about
// a GPU.
//
// The fake is strict where a real GPU is, so that backend bugs surface
// here rather than on the first GPU run: calls without a current context
// fail with CUDA_ERROR_INVALID_CONTEXT (the context is per OS thread, so
// tests must lock their goroutine to a thread); copies and memsets must
// stay inside one live allocation; memory beyond the configured size fails
// with CUDA_ERROR_OUT_OF_MEMORY; launches need valid dimensions and at most
// 48 KiB of dynamic shared memory; a module must come from the fake NVRTC
// for an architecture the device (compute capability 9.0) runs, sm_90 or
// sm_90a, else CUDA_ERROR_NO_BINARY_FOR_GPU; a kernel the source does not
// define is CUDA_ERROR_NOT_FOUND. Fresh device memory reads as 0xff bytes (NaN),
// so a buffer used before it is written shows up in results. Releasing a
// primary context's last retain frees what was made in it.
//
// Each failure also records a sentence saying what was wrong; [Libs.LastError]
// returns it (set GCOMPILE_FAKEGPU_VERBOSE=1 to print them to stderr too).
// [Libs.MemUsed] reads the driver's count of device memory in use, for
// tests that check a backend frees what it allocates.
//
// What it cannot do: run kernels that are not in the kernels/cuda table
// (generated kernels compile and load, but launching them fails with
// CUDA_ERROR_LAUNCH_FAILED); catch out-of-bounds accesses inside a kernel
// (those touch host memory, and may crash the test); overlap work or model
// stream ordering (everything completes when queued); more than one NCCL
// rank.
//
// # Configuration
//
// The driver reads these when cuInit is called and no primary context is
// retained, so a test can set them (with t.Setenv) after [Install]:
//
//	GCOMPILE_FAKEGPU_DEVICES  number of devices, 0 to 64 (default 1)
//	GCOMPILE_FAKEGPU_MEMORY   bytes per device, e.g. 1048576, 512M, 8G
//	                          (default 8G)
//
// [Install] sets GCOMPILE_LIBCUDA, GCOMPILE_LIBNVRTC, GCOMPILE_LIBCUBLASLT,
// GCOMPILE_LIBNCCL (read by runtime/cuda/dl) and GCOMPILE_FAKEGPU_EMU (the
// emulator library, read at each launch).
//
// # Use
//
// In a test:
//
//	func TestOnFakeGPU(t *testing.T) {
//		fakegpu.Install(t) // builds once per test binary; skips without g++
//		runtime.LockOSThread() // the CUDA context is current per thread
//		defer runtime.UnlockOSThread()
//		drv, err := driver.Load() // finds the fake through GCOMPILE_LIBCUDA
//		require.NoError(t, err)
//		defer drv.Close()
//		require.NoError(t, drv.Init())
//		dev, err := drv.Device(0)
//		require.NoError(t, err)
//		ctx, err := drv.PrimaryCtxRetain(dev)
//		require.NoError(t, err)
//		defer drv.PrimaryCtxRelease(dev)
//		require.NoError(t, drv.SetCurrent(ctx))
//		// … nvrtc.Load, cublaslt.Load, nccl.Load work the same way.
//	}
//
// Install uses t.Setenv, so it cannot serve tests that call t.Parallel. To
// run a program (the gcompile CLI, say) on the fake GPU, pass it
// [Libs.Env].
//
// Without g++ or gcc, Install skips the test, or fails it when
// GCOMPILE_REQUIRE_GCC=1.
//
// # Builds
//
// The libraries are built once per test binary into a folder of the user's
// cache (gcompile/fakegpu/<hash>) named after a hash of every input: the C
// sources, the kernel sources, the compiler flags and the compilers. Later
// test binaries with the same inputs reuse it; a file lock keeps test
// binaries that run at the same time from building over each other. The
// cuBLASLt stand-in is runtime/cuda/cublaslt/testdata/fake_cublaslt.c,
// shared with that package's tests, so it is read from the source tree.
package fakegpu
