// Package emu runs the CUDA kernels of package cuda on the CPU, so that
// they can be tested, and the CUDA backend with them, on machines without
// a GPU.
//
// [Build] compiles the kernel sources with g++ (C++20, -O1) against a shim
// (csrc/emu.h) that turns CUDA's vocabulary into C++: __global__ and
// __device__ vanish, __shared__ becomes static (blocks run one at a time,
// so a function-local static is exactly one block's shared memory), the
// built-in index variables are per thread or per launch, __syncthreads is
// a barrier over the block's threads, and warp shuffles and ballots meet
// in a per-warp slot array between two barriers over the warp. The
// runtime (csrc/emu.cpp) runs each CUDA thread of a block as a fiber (a
// ucontext with a stack of its own) on the launching OS thread, from a
// pool reused across blocks and launches; a barrier switches to the next
// fiber that can run, and blocks run one after another. That is faithful
// for barriers and shuffles (every thread really waits for the others),
// cheap (a barrier is a counter and a context switch in user space, where
// an OS thread per CUDA thread cost a trip through the kernel's scheduler
// per thread), and says nothing about speed on a GPU. A barrier that some
// thread of the block never reaches is reported ([StatusStuck]) rather
// than waited on forever.
//
// A generated dispatch (see [Dispatch]) exports one C entry point,
// [LaunchSymbol], that takes a kernel name, launch dimensions and a
// cuLaunchKernel-style parameter array, so a stand-in libcuda can forward
// its launches to the same library ([Emu.Path]). From Go, [Emu.Launch]
// takes slices and scalars, checks them against the kernel table and pins
// the slices for the call. [BuildWith] adds generated kernels (package
// codegen's fused ones) beside the table's.
//
// What the emulator does not model: concurrency between blocks (a kernel
// that relied on two blocks running at once would wait forever here) or
// between the threads of a block (one that spins on another thread's
// write without a barrier would too), memory
// ordering beyond what its barriers give, warp divergence (every lane of
// a warp must reach the same shuffle), and the GPU's math library: expf,
// logf and tanhf are glibc's here, which may differ from CUDA's in the
// last place.
package emu
