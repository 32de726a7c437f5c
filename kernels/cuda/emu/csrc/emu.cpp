// emu.cpp — the emulator's runtime: each CUDA thread of a block is a
// fiber (a stack of its own and the registers to resume it) on the
// launching OS thread, and a barrier switches to the next fiber that can
// run. The fibers are a pool grown to the largest block, reused across
// blocks and launches.
//
// One OS thread per CUDA thread had every barrier of a 256-thread block
// cost 256 context switches through the kernel's scheduler: on 2 cores a
// test of the kernels spent more time in the system than in the kernels.
// A fiber switch stays in user space (on x86-64 a few instructions that
// swap the callee-saved registers and the stack; elsewhere swapcontext,
// which also sets the signal mask, a system call), and nothing runs
// concurrently, so a barrier is a counter.
#include "emu.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <mutex>
#include <vector>

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace gc_emu {

unsigned tid;

namespace {

// Each fiber's stack: 1 MiB of address space (the size the worker
// threads had), committed as it is touched, below a guard page.
constexpr size_t kStack = 1 << 20;
constexpr size_t kGuard = 4096;

// Context is where a suspended fiber (or the scheduler) resumes.
#if defined(__x86_64__)
// gc_emu_switch(save, to) pushes the callee-saved registers, stores the
// stack pointer in *save, loads `to` and pops its registers: the System V
// ABI leaves nothing else for a call to preserve but the x87 and MXCSR
// control words, which no kernel changes.
extern "C" void gc_emu_switch(void** save, void* to);
asm(R"(
  .pushsection .text
  .globl gc_emu_switch
  .hidden gc_emu_switch
  .type gc_emu_switch, @function
gc_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gc_emu_switch, .-gc_emu_switch
  .popsection
)");

struct Context {
  void* sp = nullptr;
};

void switch_context(Context& from, const Context& to) { gc_emu_switch(&from.sp, to.sp); }

// init_context prepares c to enter entry on the given stack: six zero
// registers for gc_emu_switch to pop, then entry as the return address,
// placed so that entry starts with the stack aligned as after a call.
bool init_context(Context& c, char* stack, size_t size, void (*entry)()) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top - 64);
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  sp[6] = reinterpret_cast<void*>(entry);
  sp[7] = nullptr;
  c.sp = sp;
  return true;
}
#else
struct Context {
  ucontext_t uc;
};

void switch_context(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }

// save_context is getcontext out of line: getcontext returns twice, which
// keeps the compiler from proving its callers' locals initialized.
__attribute__((noinline)) bool save_context(ucontext_t* c) { return getcontext(c) == 0; }

bool init_context(Context& c, char* stack, size_t size, void (*entry)()) {
  if (!save_context(&c.uc)) return false;
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
  return true;
}
#endif

// Barrier counts the fibers that reached it; the last one to arrive
// starts a new generation, which releases the others.
struct Barrier {
  unsigned n = 0, arrived = 0, gen = 0;
};

struct Fiber {
  Context ctx;
  char* stack = nullptr;
  unsigned id = 0;
  uint3 idx{};
  bool done = false;
  // The barrier this fiber waits on, and its generation on arrival.
  const Barrier* waiting = nullptr;
  unsigned gen = 0;
};

// Warp is the meeting point of one warp's lanes for shuffles and votes.
struct Warp {
  Barrier bar;
  uint64_t slots[32] = {};
};

// Launch is the state of the launch in progress (one at a time).
struct Launch {
  unsigned threads = 0;
  Body body = nullptr;
  void* args = nullptr;
  Barrier block_bar;
  std::vector<Warp> warps;
  std::vector<unsigned char> shared;
};

Launch* current = nullptr;
std::mutex launch_mu;
std::vector<Fiber*> fibers;
Context scheduler;
Fiber* running = nullptr;

// fiber_loop runs the current launch's body once per block it is resumed
// for, and never returns.
void fiber_loop() {
  Fiber* self = running;
  for (;;) {
    current->body(current->args);
    self->done = true;
    switch_context(self->ctx, scheduler);
  }
}

bool grow(unsigned n) {
  while (fibers.size() < n) {
    void* mem = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (mem == MAP_FAILED) return false;
    if (mprotect(mem, kGuard, PROT_NONE) != 0) {
      munmap(mem, kStack + kGuard);
      return false;
    }
    Fiber* f = new Fiber;
    f->id = (unsigned)fibers.size();
    f->stack = static_cast<char*>(mem) + kGuard;
    if (!init_context(f->ctx, f->stack, kStack, fiber_loop)) {
      munmap(mem, kStack + kGuard);
      delete f;
      return false;
    }
    fibers.push_back(f);
  }
  return true;
}

// arrive waits at b until all its fibers have reached it: the last one
// goes on at once, the others switch to the scheduler until it has.
void arrive(Barrier& b) {
  if (++b.arrived == b.n) {
    b.arrived = 0;
    b.gen++;
    return;
  }
  Fiber* f = running;
  f->waiting = &b;
  f->gen = b.gen;
  switch_context(f->ctx, scheduler);
}

// run_block resumes the block's fibers in turn, each until it finishes or
// waits at a barrier, until all have finished. A pass in which no fiber
// can run means a barrier some threads never reach.
bool run_block(Launch& l) {
  unsigned live = l.threads;
  for (unsigned t = 0; t < l.threads; t++) {
    fibers[t]->done = false;
    fibers[t]->waiting = nullptr;
  }
  while (live > 0) {
    bool ran = false;
    for (unsigned t = 0; t < l.threads; t++) {
      Fiber* f = fibers[t];
      if (f->done || (f->waiting != nullptr && f->waiting->gen == f->gen)) continue;
      f->waiting = nullptr;
      running = f;
      tid = f->id;
      threadIdx = f->idx;
      switch_context(scheduler, f->ctx);
      ran = true;
      if (f->done) live--;
    }
    if (!ran) {
      // The waiting fibers are abandoned mid-kernel: they start afresh at
      // the next launch (a kernel's frames hold nothing to destroy).
      for (unsigned t = 0; t < l.threads; t++) {
        if (!fibers[t]->done) init_context(fibers[t]->ctx, fibers[t]->stack, kStack, fiber_loop);
      }
      return false;
    }
  }
  return true;
}

}  // namespace

void sync_block() { arrive(current->block_bar); }

const uint64_t* warp_exchange(uint64_t mine) {
  Warp& w = current->warps[tid >> 5];
  w.slots[tid & 31u] = mine;
  arrive(w.bar);
  return w.slots;
}

void warp_release() {
  // A second barrier so no lane overwrites its slot before every lane of
  // the warp has read the exchange.
  arrive(current->warps[tid >> 5].bar);
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
  l.threads = (unsigned)threads;
  l.body = body;
  l.args = args;
  l.block_bar.n = l.threads;
  l.warps.resize((l.threads + 31) / 32);
  for (unsigned w = 0; w < l.warps.size(); w++) {
    l.warps[w].bar.n = l.threads - 32 * w < 32 ? l.threads - 32 * w : 32;
  }
  l.shared.resize(d.shmem);
  for (unsigned t = 0; t < l.threads; t++) {
    fibers[t]->idx = uint3{t % d.bx, (t / d.bx) % d.by, t / (d.bx * d.by)};
  }
  current = &l;
  blockDim = dim3{d.bx, d.by, d.bz};
  gridDim = dim3{d.gx, d.gy, d.gz};
  int rc = GC_EMU_OK;
  for (unsigned z = 0; z < d.gz && rc == GC_EMU_OK; z++) {
    for (unsigned y = 0; y < d.gy && rc == GC_EMU_OK; y++) {
      for (unsigned x = 0; x < d.gx && rc == GC_EMU_OK; x++) {
        blockIdx = uint3{x, y, z};
        if (!run_block(l)) rc = GC_EMU_STUCK;
      }
    }
  }
  current = nullptr;
  return rc;
}

}  // namespace gc_emu
