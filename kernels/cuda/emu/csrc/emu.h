// emu.h — makes CUDA kernel sources compile as C++20 with g++ and run on
// the CPU, each CUDA thread of a block a fiber (emu.cpp).
//
// Blocks of a launch run one after another, so a function-local static is
// exactly one block's shared memory: __shared__ becomes `static`. The
// built-in index variables are per thread (threadIdx) or per launch
// (blockIdx, blockDim, gridDim, written before the block's threads start);
// threadIdx and tid are the running fiber's, set each time one resumes.
// __syncthreads is a barrier over the block's threads, and warp shuffles
// and votes exchange values through a per-warp slot array between two
// barriers over the warp's threads, so every thread of a warp must reach
// the same shuffle, as on hardware with a full mask.
#pragma once

#define GC_EMU 1

#include <math.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
using uint3 = dim3;

extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

namespace gc_emu {

// The running thread's slot in the current block (linear thread id).
extern unsigned tid;

void sync_block();
// exchange publishes 8 bytes from this lane and returns every lane's
// bytes of its warp (lanes beyond the warp's size read as zero).
const uint64_t* warp_exchange(uint64_t mine);
void warp_release();
// dynamic_shared is the launch's `shmem` bytes of dynamic shared memory.
void* dynamic_shared();

template <typename T>
inline T shfl(T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  uint64_t mine = 0;
  std::memcpy(&mine, &v, sizeof(T));
  const uint64_t* all = warp_exchange(mine);
  T r;
  std::memcpy(&r, &all[src_lane & 31], sizeof(T));
  warp_release();
  return r;
}

inline unsigned lane() { return tid & 31u; }

}  // namespace gc_emu

inline void __syncthreads() { gc_emu::sync_block(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  (void)width;
  return gc_emu::shfl(v, (int)gc_emu::lane() ^ lane_mask);
}

template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  // A source past the end of the warp returns the caller's own value.
  const unsigned src = gc_emu::lane() + delta;
  T r = gc_emu::shfl(v, (int)(src < (unsigned)width ? src : gc_emu::lane()));
  return r;
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  const uint64_t* all = gc_emu::warp_exchange(pred != 0);
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; l++) {
    if (all[l] != 0) bits |= 1u << l;
  }
  gc_emu::warp_release();
  return bits & mask;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }

inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

inline int atomicExch(int* p, int v) { return std::atomic_ref<int>(*p).exchange(v); }

// The gc_ primitives that common.cuh expects every world to provide.
template <typename T>
inline T gc_shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
inline unsigned gc_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
inline int gc_popc(unsigned v) { return __popc(v); }
inline void gc_atomic_max_int(int* p, int v) { atomicMax(p, v); }

// GC_EMU_EXTERN_SHARED stands in for `extern __shared__ T name[]`.
#define GC_EMU_EXTERN_SHARED(T, name) T* name = static_cast<T*>(gc_emu::dynamic_shared())

namespace gc_emu {

// Launch dimensions and the kernel, with its arguments bound.
struct Dims {
  unsigned gx, gy, gz, bx, by, bz, shmem;
};

using Body = void (*)(void* args);

// run executes body(args) for every thread of every block; it returns 0
// or a GC_EMU_* error code.
int run(const Dims& d, Body body, void* args);

}  // namespace gc_emu

// Status codes of gc_emu_launch.
#define GC_EMU_OK 0
#define GC_EMU_UNKNOWN_KERNEL 1
#define GC_EMU_BAD_DIMS 2
#define GC_EMU_BAD_PARAMS 3
#define GC_EMU_NO_THREADS 4
#define GC_EMU_STUCK 5
