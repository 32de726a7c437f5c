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
//	                   (with their parameters' types and the source)
//	libcublasLt.so.12  real (naive) GEMMs in f32, f16 and bf16 with f32
//	                   accumulation and round-to-nearest-even outputs
//	libnccl.so.2       communicators of any size, between threads of one
//	                   process or processes of one machine (see NCCL below)
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
// Kernels that are not in the kernels/cuda table (those a backend
// generates at run time, such as package codegen's fused ones) run too:
// the module image carries its source, and the first launch of such a
// kernel builds an emulator of the module with the table's compiler and
// flags (once per source, kept under gen/ in the emulator's folder, the
// shim's runtime compiled once for all of them). A source the emulator
// cannot build (CUDA intrinsics the shim lacks) fails that launch with
// CUDA_ERROR_LAUNCH_FAILED and the compiler's message.
//
// Streams and events exist and are checked, but everything completes when
// queued, so a missing ordering edge cannot show in results. Two things
// make such edges testable: a wait on an event that was never recorded
// fails with CUDA_ERROR_INVALID_VALUE (a GPU would wait for nothing), and
// [Libs.StartTrace] records every call that queues work or orders
// streams (launches, copies, memsets, event records, stream waits and
// synchronizations, the fake NCCL's collectives and transfers) with its
// stream and event, for [Libs.StopTrace]; [Libs.TraceMark] adds a line
// of the caller's between them.
//
// What it cannot do: catch out-of-bounds accesses inside a kernel (those
// touch host memory, and may crash the test); overlap work or model
// stream ordering (everything completes when queued).
//
// # NCCL
//
// ncclGetUniqueId names a rendezvous (an abstract Unix-domain socket) that
// any process of the machine can reach, so the id may travel to other
// processes by any means. The process holding rank 0 hosts the
// communicator's hub, which pairs the ranks' calls and computes the
// results; every rank, in any process or thread, connects to it. Results
// are what NCCL defines, with reductions applied in rank order (x0 + x1 +
// x2 + … elementwise, one rounding per step in the element type; fp16 and
// bf16 through float32, rounded to nearest-even after each step), so sums
// are bit-identical to the CPU backend's. The 8-bit float types are moved
// but not reduced.
//
// Where it differs from a GPU, and why:
//
//   - Calls block until their data is exchanged, so one thread that drives
//     several ranks must put their calls (ncclCommInitRank included) in one
//     ncclGroupStart/End, as NCCL requires; a group posts every call
//     before it waits for any.
//   - Sends are buffered: ncclSend returns once its data is with the hub.
//     Programs that would deadlock on a GPU because both sides send first
//     therefore complete; sends and receives still pair up in issue order
//     per pair of ranks, and a receive whose count or type differs from
//     its send fails with ncclInvalidUsage naming both. A send to oneself
//     must pair with a receive in the same group, as on a GPU.
//   - It is stricter where a GPU would hang or corrupt memory: collectives
//     whose kind, count, type, reduction or root differ across ranks fail
//     on every rank with ncclInvalidUsage; a call that fails its argument
//     checks on one rank makes the matching call fail on the others
//     instead of leaving them waiting; buffers must lie in one live
//     allocation of the rank's device (or pinned host memory); two ranks
//     of one communicator on one device of a process fail ("Duplicate GPU
//     detected"). A rank's device is the calling thread's current context's
//     at ncclCommInitRank.
//   - Nothing waits forever: ncclCommAbort from another thread wakes the
//     calls blocked on that communicator (ncclSystemError, "aborted"); a
//     rank that aborts, or whose process dies, fails every other rank's
//     pending and later calls with ncclRemoteError within milliseconds,
//     and ncclCommGetAsyncError reports it. GCOMPILE_FAKEGPU_NCCL_TIMEOUT
//     ends any other wait.
//   - Rank 0's process hosts the hub, so it must outlive the communicator:
//     its ncclCommDestroy waits until the ranks of other processes have
//     left (NCCL's destroy is an intra-node collective too).
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
// The NCCL stand-in reads, at each wait:
//
//	GCOMPILE_FAKEGPU_NCCL_TIMEOUT  seconds a call waits for other ranks
//	                               before it fails with ncclSystemError
//	                               (default 120; a safety net, not a
//	                               model of NCCL's timeouts)
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
