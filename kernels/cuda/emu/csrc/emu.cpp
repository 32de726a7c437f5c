// emu.cpp — the emulator's runtime: a pool of persistent worker threads,
// one per CUDA thread of a block, reused across blocks and launches.
#include "emu.h"

#include <pthread.h>

#include <barrier>
#include <memory>
#include <mutex>
#include <semaphore>
#include <vector>

thread_local uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace gc_emu {

thread_local unsigned tid;

namespace {

// Warp is the meeting point of one warp's lanes for shuffles and votes.
struct Warp {
  explicit Warp(unsigned n) : bar(n) {}
  std::barrier<> bar;
  uint64_t slots[32] = {};
};

// Launch is the state of the launch in progress (one at a time).
struct Launch {
  Dims dims{};
  unsigned threads = 0;
  Body body = nullptr;
  void* args = nullptr;
  std::unique_ptr<std::barrier<>> block_bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<unsigned char> shared;
};

Launch* current = nullptr;

struct Worker {
  std::binary_semaphore go{0};
  unsigned id = 0;
};

// The pool grows to the largest block seen and is never torn down: its
// threads live as long as the process, so nothing has to join them at
// exit.
std::mutex launch_mu;
std::vector<Worker*> workers;
std::atomic<unsigned> remaining{0};
std::binary_semaphore block_done{0};

void* worker_main(void* p) {
  Worker* w = static_cast<Worker*>(p);
  tid = w->id;
  for (;;) {
    w->go.acquire();
    Launch* l = current;
    const unsigned bx = l->dims.bx, by = l->dims.by;
    threadIdx.x = tid % bx;
    threadIdx.y = (tid / bx) % by;
    threadIdx.z = tid / (bx * by);
    l->body(l->args);
    if (remaining.fetch_sub(1) == 1) block_done.release();
  }
  return nullptr;
}

bool grow(unsigned n) {
  while (workers.size() < n) {
    Worker* w = new Worker;
    w->id = (unsigned)workers.size();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_t th;
    const int rc = pthread_create(&th, &attr, worker_main, w);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      delete w;
      return false;
    }
    pthread_detach(th);
    workers.push_back(w);
  }
  return true;
}

}  // namespace

void sync_block() { current->block_bar->arrive_and_wait(); }

const uint64_t* warp_exchange(uint64_t mine) {
  Warp& w = *current->warps[tid >> 5];
  w.slots[tid & 31u] = mine;
  w.bar.arrive_and_wait();
  return w.slots;
}

void warp_release() {
  // A second barrier so no lane overwrites its slot before every lane of
  // the warp has read the exchange.
  current->warps[tid >> 5]->bar.arrive_and_wait();
}

void* dynamic_shared() { return current->shared.empty() ? nullptr : current->shared.data(); }

int run(const Dims& d, Body body, void* args) {
  const unsigned long long threads = (unsigned long long)d.bx * d.by * d.bz;
  if (d.gx == 0 || d.gy == 0 || d.gz == 0 || threads == 0 || threads > 1024 || d.gx > 0x7fffffffu ||
      d.gy > 65535 || d.gz > 65535 || d.bz > 64 || d.shmem > 227 * 1024) {
    return GC_EMU_BAD_DIMS;
  }
  std::lock_guard<std::mutex> lock(launch_mu);
  if (!grow((unsigned)threads)) return GC_EMU_NO_THREADS;
  Launch l;
  l.dims = d;
  l.threads = (unsigned)threads;
  l.body = body;
  l.args = args;
  l.block_bar = std::make_unique<std::barrier<>>((std::ptrdiff_t)threads);
  for (unsigned w = 0; w < l.threads; w += 32) {
    l.warps.push_back(std::make_unique<Warp>(l.threads - w < 32 ? l.threads - w : 32));
  }
  l.shared.resize(d.shmem);
  current = &l;
  blockDim = dim3{d.bx, d.by, d.bz};
  gridDim = dim3{d.gx, d.gy, d.gz};
  for (unsigned z = 0; z < d.gz; z++) {
    for (unsigned y = 0; y < d.gy; y++) {
      for (unsigned x = 0; x < d.gx; x++) {
        blockIdx = uint3{x, y, z};
        remaining.store(l.threads);
        for (unsigned t = 0; t < l.threads; t++) workers[t]->go.release();
        block_done.acquire();
      }
    }
  }
  current = nullptr;
  return GC_EMU_OK;
}

}  // namespace gc_emu
