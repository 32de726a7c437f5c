// fake_cuda.cpp — libcuda.so.1 for machines without a GPU.
//
// Every exported function has the C prototype of the CUDA driver API entry
// point it is named after (the versioned names cuda.h maps to). The device is
// the host: device memory is 256-byte aligned host memory, copies and memsets
// happen when called (so every stream is always idle and async means
// synchronous), and kernels run on the CPU through the kernel emulator
// library named by GCOMPILE_FAKEGPU_EMU (gc_emu_launch, see
// kernels/cuda/emu). Modules are the images fake_nvrtc.cpp produces.
//
// The checks a real driver makes and a backend can get wrong are made here
// too, with the real status codes: a current context per OS thread, handles
// that must be live, device ranges that must lie inside one allocation, a
// memory limit, launch dimensions and shared memory within the device's
// limits, an image built for a compatible architecture. Each failure also
// records a sentence saying what was wrong, which gcFakeGPULastError
// returns (a real driver has no such call; the Go package reads it).
// gcFakeGPUCurrentDevice and gcFakeGPUCheckBuffer let the fake NCCL
// (fake_nccl.cpp) learn each rank's device and check its buffers, as NCCL
// asks the CUDA runtime.
//
// Kernels a backend generates at run time are not in the emulator's
// table. The image of their module carries its source (fake_nvrtc.cpp), so
// the first launch of such a kernel builds an emulator of the module with
// the same compiler and flags as the table's (GC_FAKE_EMU_CXX and
// GC_FAKE_EMU_FLAGS, set when this library is built), from the shim
// sources beside the emulator library, and keeps it on disk under a hash
// of its inputs (gen/ in the emulator's folder).
//
// Work completes when it is queued, so stream ordering cannot go wrong
// here; what a backend asks of it can be checked instead. A wait on an
// event that was never recorded fails (on a GPU it would silently wait for
// nothing), and gcFakeGPUTraceStart records every call that queues work or
// orders streams (launches, copies, event records, stream waits, and the
// fake NCCL's calls through gcFakeGPUTraceAppend) with its stream, for
// gcFakeGPUTraceRead.
//
// Configuration, read by cuInit whenever no primary context is retained:
//   GCOMPILE_FAKEGPU_DEVICES  number of devices (default 1, 0 to 64)
//   GCOMPILE_FAKEGPU_MEMORY   bytes per device, with an optional K, M, G or
//                             T suffix (powers of 1024); default 8G
//   GCOMPILE_FAKEGPU_EMU      path of the kernel emulator library, read at
//                             each launch
//   GCOMPILE_FAKEGPU_VERBOSE  1: also print each failure to stderr

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

extern char** environ;

// The compiler and flags of generated kernels' emulators; the Go package
// that builds this library sets them to the kernel emulator's.
#ifndef GC_FAKE_EMU_CXX
#define GC_FAKE_EMU_CXX "g++"
#endif
#ifndef GC_FAKE_EMU_FLAGS
#define GC_FAKE_EMU_FLAGS \
  "-std=c++20 -O1 -fPIC -shared -pthread -ffp-contract=off -fno-fast-math -Wall -Wno-unused-function -Werror"
#endif

namespace {

enum : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_STUB_LIBRARY = 34,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_INVALID_SOURCE = 300,
  CUDA_ERROR_FILE_NOT_FOUND = 301,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_LAUNCH_TIMEOUT = 702,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};

struct ErrorText {
  int code;
  const char* name;
  const char* text;
};

// The names and descriptions the real driver gives for these codes.
const ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
     "the provided PTX was compiled with an unsupported toolchain."},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

constexpr int kMaxDevices = 64;
constexpr size_t kAlign = 256;  // cuMemAlloc's alignment guarantee
constexpr unsigned long long kDefaultMemory = 8ull << 30;
constexpr int kDriverVersion = 12080;
constexpr unsigned kSharedPerBlock = 48 * 1024;  // without cuFuncSetAttribute opt-in
const char kDeviceName[] = "gcompile fake GPU (CPU emulation)";
const char kImageMagic[] = "GCFAKECUBIN 1\n";  // written by fake_nvrtc.cpp

// Special stream handles the driver accepts besides created streams.
const uintptr_t kStreamLegacy = 0x1, kStreamPerThread = 0x2;

struct Ctx {
  int device = 0;
  int refs = 0;  // primary context retains; 0 means destroyed
};

struct Stream {
  unsigned long long id;
  Ctx* ctx;
  unsigned flags;
};

struct Event {
  unsigned long long id;
  Ctx* ctx;
  unsigned flags;
  bool recorded = false;
  long long ns = 0;  // CLOCK_MONOTONIC at record time
};

struct Module;

// The kernel emulator's entry point (gc_emu_launch, see kernels/cuda/emu).
typedef int (*EmuLaunch)(const char*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void**);

// Code is what a module's image says about its source: every kernel with
// its parameters' C types, and the source itself. The emulator of the
// kernels the table lacks is built from it on the first launch of one.
struct Code {
  std::string source;
  std::vector<std::pair<std::string, std::vector<std::string>>> kernels;
  std::mutex mu;  // guards what follows
  bool tried = false;
  EmuLaunch launch = nullptr;
  std::string error;
};

struct Func {
  Module* mod;
  std::string name;
  std::shared_ptr<Code> code;
};

struct Module {
  unsigned long long id;
  Ctx* ctx;
  std::vector<std::unique_ptr<Func>> funcs;
};

struct Alloc {
  size_t size;     // as requested
  size_t charged;  // rounded up to the alignment, counted against the device
  int device;
};

// All driver state. One mutex guards it; kernels run outside it.
std::mutex mu;
bool initialized = false;
int num_devices = 1;
unsigned long long total_memory = kDefaultMemory;
Ctx contexts[kMaxDevices];
unsigned long long used[kMaxDevices];
std::map<uintptr_t, Alloc> device_allocs;
struct HostAlloc {
  size_t size;  // as requested
  int device;
};
std::map<uintptr_t, HostAlloc> host_allocs;  // pinned host memory
std::set<Stream*> streams;
std::set<Event*> events;
std::set<Module*> modules;
std::set<Func*> funcs;
unsigned long long next_id = 1;

std::mutex err_mu;
std::string last_error;

thread_local Ctx* current = nullptr;

const int kEventDisableTiming = 0x2;

// fail records why fn returned code and returns code.
CUresult fail(CUresult code, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
CUresult fail(CUresult code, const char* fn, const char* fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::string msg = std::string(fn) + ": " + buf;
  {
    std::lock_guard<std::mutex> g(err_mu);
    last_error = msg;
  }
  const char* v = getenv("GCOMPILE_FAKEGPU_VERBOSE");
  if (v && strcmp(v, "1") == 0) fprintf(stderr, "fakegpu: %s\n", msg.c_str());
  return code;
}

// The call trace (gcFakeGPUTraceStart). Entries are bounded so that a
// forgotten trace cannot take the host's memory.
std::atomic<bool> tracing{false};
std::mutex trace_mu;
std::vector<std::string> trace_log;
bool trace_full = false;
constexpr size_t kTraceMax = 1 << 20;

void trace_line(const std::string& line) {
  std::lock_guard<std::mutex> g(trace_mu);
  if (!tracing.load()) return;
  if (trace_log.size() >= kTraceMax) {
    trace_full = true;
    return;
  }
  trace_log.push_back(line);
}

void trace(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void trace(const char* fmt, ...) {
  if (!tracing.load()) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  trace_line(buf);
}

// handle prints a stream or event handle for the trace: 0 is the legacy
// default stream.
unsigned long long handle(const void* p) { return (unsigned long long)(uintptr_t)p; }

// parse_size reads a byte count with an optional K/M/G/T suffix (powers of
// 1024, an optional trailing "iB" or "B").
bool parse_size(const char* s, unsigned long long* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || errno != 0) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
  }
  if (shift && *end == 'i') end++;
  if (*end == 'B') end++;
  if (*end != '\0') return false;
  if (shift && v > (~0ull >> shift)) return false;
  *out = v << shift;
  return true;
}

// configure reads the environment. Called with mu held.
CUresult configure() {
  int n = 1;
  if (const char* s = getenv("GCOMPILE_FAKEGPU_DEVICES"); s && *s) {
    char* end = nullptr;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v > kMaxDevices) {
      return fail(CUDA_ERROR_INVALID_VALUE, "cuInit", "GCOMPILE_FAKEGPU_DEVICES=%s is not a device count from 0 to %d",
                  s, kMaxDevices);
    }
    n = (int)v;
  }
  unsigned long long mem = kDefaultMemory;
  if (const char* s = getenv("GCOMPILE_FAKEGPU_MEMORY"); s && *s) {
    if (!parse_size(s, &mem) || mem == 0) {
      return fail(CUDA_ERROR_INVALID_VALUE, "cuInit",
                  "GCOMPILE_FAKEGPU_MEMORY=%s is not a positive byte count (e.g. 8589934592, 512M, 8G)", s);
    }
  }
  num_devices = n;
  total_memory = mem;
  for (int d = 0; d < kMaxDevices; d++) contexts[d].device = d;
  return CUDA_SUCCESS;
}

bool any_context_live() {
  for (int d = 0; d < kMaxDevices; d++) {
    if (contexts[d].refs > 0) return true;
  }
  return false;
}

long long now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

CUresult need_init(const char* fn) {
  if (!initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, fn, "cuInit has not been called");
  return CUDA_SUCCESS;
}

CUresult need_device(const char* fn, CUdevice d) {
  if (CUresult r = need_init(fn)) return r;
  if (d < 0 || d >= num_devices) {
    return fail(CUDA_ERROR_INVALID_DEVICE, fn, "device %d does not exist (%d device(s))", d, num_devices);
  }
  return CUDA_SUCCESS;
}

// need_ctx checks that the calling thread has a live current context.
CUresult need_ctx(const char* fn) {
  if (CUresult r = need_init(fn)) return r;
  if (!current) return fail(CUDA_ERROR_INVALID_CONTEXT, fn, "no context is current on this thread");
  if (current->refs == 0) {
    return fail(CUDA_ERROR_INVALID_CONTEXT, fn, "the current context (device %d) has been released",
                current->device);
  }
  return CUDA_SUCCESS;
}

CUresult need_stream(const char* fn, void* s) {
  uintptr_t h = (uintptr_t)s;
  if (h == 0 || h == kStreamLegacy || h == kStreamPerThread) return CUDA_SUCCESS;
  Stream* st = (Stream*)s;
  if (!streams.count(st)) return fail(CUDA_ERROR_INVALID_HANDLE, fn, "stream %p is not a live stream", s);
  if (st->ctx != current) {
    return fail(CUDA_ERROR_INVALID_HANDLE, fn, "stream %llu belongs to device %d, not the current context's device %d",
                st->id, st->ctx->device, current->device);
  }
  return CUDA_SUCCESS;
}

CUresult need_event(const char* fn, void* e) {
  if (!events.count((Event*)e)) return fail(CUDA_ERROR_INVALID_HANDLE, fn, "event %p is not a live event", e);
  return CUDA_SUCCESS;
}

// need_range checks that [p, p+n) lies inside one live device allocation.
CUresult need_range(const char* fn, const char* what, CUdeviceptr p, size_t n) {
  if (n == 0) return CUDA_SUCCESS;
  auto it = device_allocs.upper_bound((uintptr_t)p);
  if (it != device_allocs.begin()) {
    --it;
    const uintptr_t base = it->first;
    if (p >= base && p - base <= it->second.size && n <= it->second.size - (p - base)) return CUDA_SUCCESS;
    if (p >= base && p - base < it->second.size) {
      return fail(CUDA_ERROR_INVALID_VALUE, fn,
                  "%s range 0x%llx+%zu runs %zu bytes past the end of its %zu-byte allocation at 0x%llx", what,
                  (unsigned long long)p, n, (size_t)(p - base) + n - it->second.size, it->second.size,
                  (unsigned long long)base);
    }
  }
  return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s 0x%llx is not in any live device allocation", what,
              (unsigned long long)p);
}

// destroy_context frees everything created in ctx, as the driver does when
// a primary context's last retain is released. Called with mu held.
void destroy_context(Ctx* ctx) {
  for (auto it = device_allocs.begin(); it != device_allocs.end();) {
    if (it->second.device == ctx->device) {
      used[ctx->device] -= it->second.charged;
      free((void*)it->first);
      it = device_allocs.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = host_allocs.begin(); it != host_allocs.end();) {
    if (it->second.device == ctx->device) {
      free((void*)it->first);
      it = host_allocs.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = streams.begin(); it != streams.end();) {
    if ((*it)->ctx == ctx) {
      delete *it;
      it = streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = events.begin(); it != events.end();) {
    if ((*it)->ctx == ctx) {
      delete *it;
      it = events.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = modules.begin(); it != modules.end();) {
    if ((*it)->ctx == ctx) {
      for (auto& f : (*it)->funcs) funcs.erase(f.get());
      delete *it;
      it = modules.erase(it);
    } else {
      ++it;
    }
  }
}

// The kernel emulator, loaded on first launch from GCOMPILE_FAKEGPU_EMU.
std::mutex emu_mu;
std::map<std::string, EmuLaunch> emu_loaded;

CUresult load_emulator(EmuLaunch* out) {
  const char* path = getenv("GCOMPILE_FAKEGPU_EMU");
  if (!path || !*path) {
    return fail(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel",
                "GCOMPILE_FAKEGPU_EMU is not set: it must name the kernel emulator library (kernels/cuda/emu)");
  }
  std::lock_guard<std::mutex> g(emu_mu);
  auto it = emu_loaded.find(path);
  if (it != emu_loaded.end()) {
    *out = it->second;
    return CUDA_SUCCESS;
  }
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return fail(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel", "loading the kernel emulator %s: %s", path,
                e ? e : "dlopen failed");
  }
  void* sym = dlsym(h, "gc_emu_launch");
  if (!sym) {
    return fail(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel", "%s has no gc_emu_launch: not a kernel emulator", path);
  }
  EmuLaunch fn = (EmuLaunch)sym;
  emu_loaded[path] = fn;
  *out = fn;
  return CUDA_SUCCESS;
}

bool read_file(const std::string& path, std::string* out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  out->clear();
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  const bool ok = !ferror(f);
  fclose(f);
  return ok;
}

bool write_file(const std::string& path, const std::string& data) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = fwrite(data.data(), 1, data.size(), f) == data.size();
  return fclose(f) == 0 && ok;
}

// fnv64 hashes the inputs of a generated emulator.
unsigned long long fnv64(const std::vector<const std::string*>& parts) {
  unsigned long long h = 1469598103934665603ull;
  for (const std::string* p : parts) {
    for (unsigned char c : *p) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // a separator no text contains
  }
  return h;
}

// emu_dispatch writes what kernels/cuda/emu's Dispatch writes for the
// table: per kernel an argument struct, a body calling the kernel with it
// and an unpacker of cuLaunchKernel's parameter array, and the
// gc_emu_launch entry point that finds a kernel by name.
std::string emu_dispatch(const std::vector<const std::pair<std::string, std::vector<std::string>>*>& ks) {
  std::string b = "\n// Generated by the fake CUDA driver for the module's own kernels.\nnamespace {\n\n";
  b += "using gc_emu_unpack = int (*)(const gc_emu::Dims&, void**);\n\n";
  for (const auto* k : ks) {
    const std::string& n = k->first;
    const std::vector<std::string>& ps = k->second;
    b += "struct args_" + n + " {\n";
    for (size_t i = 0; i < ps.size(); i++) b += "  " + ps[i] + " a" + std::to_string(i) + ";\n";
    b += "};\n\nvoid body_" + n + "(void* p) {\n";
    if (ps.empty()) {
      b += "  (void)p;\n  " + n + "();\n}\n\n";
    } else {
      b += "  const args_" + n + "& a = *static_cast<const args_" + n + "*>(p);\n  " + n + "(";
      for (size_t i = 0; i < ps.size(); i++) b += (i ? ", a.a" : "a.a") + std::to_string(i);
      b += ");\n}\n\n";
    }
    b += "int unpack_" + n + "(const gc_emu::Dims& d, void** params) {\n  args_" + n + " a{};\n";
    for (size_t i = 0; i < ps.size(); i++) {
      const std::string k = std::to_string(i);
      b += "  if (params[" + k + "] == nullptr) return GC_EMU_BAD_PARAMS;\n";
      b += "  std::memcpy(&a.a" + k + ", params[" + k + "], sizeof(a.a" + k + "));\n";
    }
    b += "  return gc_emu::run(d, body_" + n + ", &a);\n}\n\n";
  }
  b += "struct gc_emu_entry {\n  const char* name;\n  gc_emu_unpack unpack;\n};\n\n";
  b += "const gc_emu_entry gc_emu_table[] = {\n";
  for (const auto* k : ks) b += "    {\"" + k->first + "\", unpack_" + k->first + "},\n";
  b += "};\n\n}  // namespace\n\n";
  b += "extern \"C\" int gc_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,\n"
       "                             unsigned by, unsigned bz, unsigned shmem, void** params) {\n"
       "  if (name == nullptr) return GC_EMU_UNKNOWN_KERNEL;\n"
       "  for (const gc_emu_entry& e : gc_emu_table) {\n"
       "    if (std::strcmp(e.name, name) == 0) {\n"
       "      if (params == nullptr) return GC_EMU_BAD_PARAMS;\n"
       "      return e.unpack(gc_emu::Dims{gx, gy, gz, bx, by, bz, shmem}, params);\n"
       "    }\n"
       "  }\n"
       "  return GC_EMU_UNKNOWN_KERNEL;\n"
       "}\n";
  return b;
}

// run_compiler runs the emulator's compiler with its flags, then args,
// its output going to log; on failure it returns the output in *why.
bool run_compiler(const std::vector<std::string>& extra, const std::string& log, std::string* why) {
  std::vector<std::string> args = {GC_FAKE_EMU_CXX};
  const std::string flags = GC_FAKE_EMU_FLAGS;
  for (size_t i = 0; i < flags.size();) {
    size_t j = flags.find(' ', i);
    if (j == std::string::npos) j = flags.size();
    if (j > i) args.push_back(flags.substr(i, j - i));
    i = j + 1;
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    *why = std::string("starting ") + argv[0] + ": " + strerror(rc);
    return false;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      *why = std::string("waiting for ") + argv[0] + ": " + strerror(errno);
      return false;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::string out;
  read_file(log, &out);
  if (out.size() > 400) out = out.substr(0, 400) + "...";
  *why = std::string(argv[0]) + " failed: " + out;
  return false;
}

// build_once makes target (in gen) unless it exists: it writes files into
// a fresh folder, compiles there with args (where "@" stands for the
// output) and renames the output into place, so a process making the same
// target at the same time never loads half of it.
bool build_once(const std::string& gen, const std::string& target,
                const std::vector<std::pair<std::string, const std::string*>>& files,
                const std::vector<std::string>& args, std::string* why) {
  if (access(target.c_str(), R_OK) == 0) return true;
  std::string dir = gen + "/build.XXXXXX";
  if (!mkdtemp(&dir[0])) {
    *why = "making a build folder in " + gen + ": " + strerror(errno);
    return false;
  }
  bool ok = true;
  for (const auto& f : files) {
    if (ok && !write_file(dir + "/" + f.first, *f.second)) {
      ok = false;
      *why = "writing " + dir + "/" + f.first + ": " + strerror(errno);
    }
  }
  const std::string out = dir + "/out";
  std::vector<std::string> full;
  for (const std::string& a : args) full.push_back(a == "@" ? out : a[0] == '+' ? dir + "/" + a.substr(1) : a);
  if (ok) ok = run_compiler(full, dir + "/log", why);
  if (ok && rename(out.c_str(), target.c_str()) != 0) {
    ok = false;
    *why = "installing " + target + ": " + strerror(errno);
  }
  for (const auto& f : files) unlink((dir + "/" + f.first).c_str());
  unlink((dir + "/log").c_str());
  unlink(out.c_str());
  rmdir(dir.c_str());
  return ok;
}

// build_generated builds (or finds on disk) the emulator of code's kernels
// that base does not run and returns its entry point, or "" and why not.
// The shim's runtime is compiled once into an object all such emulators
// link.
std::string build_generated(const Code& code, EmuLaunch base, EmuLaunch* out) {
  const char* path = getenv("GCOMPILE_FAKEGPU_EMU");
  std::string dir = path ? path : "";
  const size_t slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  std::string shim, runtime;
  if (!read_file(dir + "/emu.h", &shim) || !read_file(dir + "/emu.cpp", &runtime)) {
    return "the emulator's folder " + dir + " has no emu.h and emu.cpp (kernels/cuda/emu.Build writes them there)";
  }
  std::vector<const std::pair<std::string, std::vector<std::string>>*> extra;
  for (const auto& k : code.kernels) {
    if (base(k.first.c_str(), 1, 1, 1, 1, 1, 1, 0, nullptr) == 1) extra.push_back(&k);
  }
  const std::string unit = "// A module's kernels for the emulator, written by the fake CUDA driver.\n#include \"emu.h\"\n" +
                           code.source + "\n" + emu_dispatch(extra);
  const std::string cxx = GC_FAKE_EMU_CXX, flags = GC_FAKE_EMU_FLAGS;
  const std::string gen = dir + "/gen";
  if (mkdir(gen.c_str(), 0755) != 0 && errno != EEXIST) return "making " + gen + ": " + strerror(errno);
  char name[64];
  snprintf(name, sizeof name, "/emu-%016llx.o", fnv64({&cxx, &flags, &shim, &runtime}));
  const std::string obj = gen + name;
  std::string why;
  if (!build_once(gen, obj, {{"emu.h", &shim}, {"emu.cpp", &runtime}}, {"-c", "-o", "@", "+emu.cpp"}, &why)) {
    return "building the emulator's runtime: " + why;
  }
  snprintf(name, sizeof name, "/%016llx.so", fnv64({&cxx, &flags, &shim, &runtime, &unit}));
  const std::string lib = gen + name;
  // Each emulator resolves its own symbols (its thread pool, the index
  // variables) whatever else the process has loaded.
  if (!build_once(gen, lib, {{"emu.h", &shim}, {"unit.cpp", &unit}}, {"-Wl,-Bsymbolic", "-o", "@", "+unit.cpp", obj},
                  &why)) {
    return "building it from the module's source: " + why;
  }
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return "loading " + lib + ": " + (e ? e : "dlopen failed");
  }
  *out = (EmuLaunch)dlsym(h, "gc_emu_launch");
  if (!*out) return lib + " has no gc_emu_launch";
  return "";
}

// generated_emulator is the emulator of code's kernels the table lacks,
// built on the first call.
CUresult generated_emulator(const std::string& kernel, Code* code, EmuLaunch base, EmuLaunch* out) {
  std::lock_guard<std::mutex> g(code->mu);
  if (!code->tried) {
    code->tried = true;
    code->error = build_generated(*code, base, &code->launch);
  }
  if (!code->launch) {
    return fail(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel", "%s has no CPU emulation: %s", kernel.c_str(),
                code->error.c_str());
  }
  *out = code->launch;
  return CUDA_SUCCESS;
}

// parse_arch reads "sm_90", "sm_90a", "sm_100f" into major, minor and
// whether a suffix ties the code to exactly that architecture.
bool parse_arch(const std::string& arch, int* major, int* minor, bool* exact) {
  if (arch.compare(0, 3, "sm_") != 0) return false;
  size_t i = 3;
  int v = 0, digits = 0;
  while (i < arch.size() && arch[i] >= '0' && arch[i] <= '9') {
    v = v * 10 + (arch[i] - '0');
    i++;
    digits++;
  }
  if (digits < 2 || digits > 3) return false;
  *exact = false;
  if (i < arch.size()) {
    if (i + 1 != arch.size() || (arch[i] != 'a' && arch[i] != 'f')) return false;
    *exact = true;
  }
  *major = v / 10;
  *minor = v % 10;
  return true;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int flags) {
  std::lock_guard<std::mutex> g(mu);
  if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit", "flags must be 0, got %u", flags);
  // The environment is read again while nothing depends on the old
  // configuration, so tests can change it between uses of the library.
  if (!initialized || !any_context_live()) {
    if (CUresult r = configure()) {
      initialized = false;
      return r;
    }
  }
  if (num_devices == 0) {
    initialized = false;
    return fail(CUDA_ERROR_NO_DEVICE, "cuInit", "GCOMPILE_FAKEGPU_DEVICES=0");
  }
  initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
  if (!v) return fail(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion", "NULL output");
  *v = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_init("cuDeviceGetCount")) return r;
  if (!n) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount", "NULL output");
  *n = num_devices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_device("cuDeviceGet", ordinal)) return r;
  if (!d) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet", "NULL output");
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_device("cuDeviceGetName", d)) return r;
  if (!name || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName", "no room for the name");
  snprintf(name, (size_t)len, "%s", kDeviceName);
  return CUDA_SUCCESS;
}

// The attributes of an H100 SXM, the part the fake stands in for.
CUresult cuDeviceGetAttribute(int* v, int attrib, CUdevice d) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_device("cuDeviceGetAttribute", d)) return r;
  if (!v) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "NULL output");
  switch (attrib) {
    case 1: *v = 1024; break;             // MAX_THREADS_PER_BLOCK
    case 2: *v = 1024; break;             // MAX_BLOCK_DIM_X
    case 3: *v = 1024; break;             // MAX_BLOCK_DIM_Y
    case 4: *v = 64; break;               // MAX_BLOCK_DIM_Z
    case 5: *v = 2147483647; break;       // MAX_GRID_DIM_X
    case 6: *v = 65535; break;            // MAX_GRID_DIM_Y
    case 7: *v = 65535; break;            // MAX_GRID_DIM_Z
    case 8: *v = kSharedPerBlock; break;  // MAX_SHARED_MEMORY_PER_BLOCK
    case 9: *v = 65536; break;            // TOTAL_CONSTANT_MEMORY
    case 10: *v = 32; break;              // WARP_SIZE
    case 12: *v = 65536; break;           // MAX_REGISTERS_PER_BLOCK
    case 13: *v = 1980000; break;         // CLOCK_RATE, kHz
    case 15: *v = 1; break;               // GPU_OVERLAP
    case 16: *v = 132; break;             // MULTIPROCESSOR_COUNT
    case 17: *v = 0; break;               // KERNEL_EXEC_TIMEOUT
    case 18: *v = 0; break;               // INTEGRATED
    case 19: *v = 1; break;               // CAN_MAP_HOST_MEMORY
    case 20: *v = 0; break;               // COMPUTE_MODE (default)
    case 31: *v = 1; break;               // CONCURRENT_KERNELS
    case 32: *v = 1; break;               // ECC_ENABLED
    case 33: *v = d + 1; break;           // PCI_BUS_ID
    case 34: *v = 0; break;               // PCI_DEVICE_ID
    case 36: *v = 2619000; break;         // MEMORY_CLOCK_RATE, kHz
    case 37: *v = 5120; break;            // GLOBAL_MEMORY_BUS_WIDTH
    case 38: *v = 52428800; break;        // L2_CACHE_SIZE
    case 39: *v = 2048; break;            // MAX_THREADS_PER_MULTIPROCESSOR
    case 40: *v = 2; break;               // ASYNC_ENGINE_COUNT
    case 41: *v = 1; break;               // UNIFIED_ADDRESSING
    case 50: *v = 0; break;               // PCI_DOMAIN_ID
    case 75: *v = 9; break;               // COMPUTE_CAPABILITY_MAJOR
    case 76: *v = 0; break;               // COMPUTE_CAPABILITY_MINOR
    case 81: *v = 233472; break;          // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82: *v = 65536; break;           // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 83: *v = 1; break;               // MANAGED_MEMORY
    case 84: *v = 0; break;               // MULTI_GPU_BOARD
    case 95: *v = 1; break;               // COOPERATIVE_LAUNCH
    case 97: *v = 232448; break;          // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 106: *v = 32; break;             // MAX_BLOCKS_PER_MULTIPROCESSOR
    default:
      return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "attribute %d is not emulated", attrib);
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_device("cuDeviceTotalMem", d)) return r;
  if (!bytes) return fail(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem", "NULL output");
  *bytes = (size_t)total_memory;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_device("cuDevicePrimaryCtxRetain", d)) return r;
  if (!ctx) return fail(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain", "NULL output");
  contexts[d].refs++;
  *ctx = &contexts[d];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_device("cuDevicePrimaryCtxRelease", d)) return r;
  if (contexts[d].refs == 0) {
    return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease", "device %d's primary context is not retained",
                d);
  }
  if (--contexts[d].refs == 0) destroy_context(&contexts[d]);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(void* ctx) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_init("cuCtxSetCurrent")) return r;
  if (ctx == nullptr) {
    current = nullptr;
    return CUDA_SUCCESS;
  }
  const uintptr_t off = (uintptr_t)ctx - (uintptr_t)&contexts[0];
  if ((uintptr_t)ctx < (uintptr_t)&contexts[0] || off % sizeof(Ctx) != 0 || off / sizeof(Ctx) >= (uintptr_t)num_devices) {
    return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "%p is not a context", ctx);
  }
  Ctx* c = &contexts[off / sizeof(Ctx)];
  if (c->refs == 0) {
    return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "device %d's primary context is not retained",
                c->device);
  }
  current = c;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  std::lock_guard<std::mutex> g(mu);
  return need_ctx("cuCtxSynchronize");
}

CUresult cuStreamCreate(void** s, unsigned int flags) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuStreamCreate")) return r;
  if (!s) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate", "NULL output");
  if (flags > 1) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate", "unknown flags 0x%x", flags);
  Stream* st = new Stream{next_id++, current, flags};
  streams.insert(st);
  *s = st;
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(void* s) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuStreamDestroy")) return r;
  Stream* st = (Stream*)s;
  if (!streams.count(st)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy", "stream %p is not a live stream", s);
  streams.erase(st);
  delete st;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(void* s) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuStreamSynchronize")) return r;
  if (CUresult r = need_stream("cuStreamSynchronize", s)) return r;
  trace("sync stream=0x%llx", handle(s));
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(void* s, void* e, unsigned int flags) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuStreamWaitEvent")) return r;
  if (CUresult r = need_stream("cuStreamWaitEvent", s)) return r;
  if (CUresult r = need_event("cuStreamWaitEvent", e)) return r;
  if (flags > 1) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent", "unknown flags 0x%x", flags);
  // Stricter than a GPU, which would wait for nothing: such a wait is an
  // ordering edge whose other end is missing.
  if (!((Event*)e)->recorded) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent",
                "event %llu has never been recorded: the stream would wait for nothing", ((Event*)e)->id);
  }
  trace("wait stream=0x%llx event=0x%llx", handle(s), handle(e));
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(void** e, unsigned int flags) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuEventCreate")) return r;
  if (!e) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate", "NULL output");
  if (flags & ~0xfu) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate", "unknown flags 0x%x", flags);
  Event* ev = new Event{next_id++, current, flags};
  events.insert(ev);
  *e = ev;
  return CUDA_SUCCESS;
}

// Work is done when it is queued, so an event completes when recorded.
CUresult cuEventRecord(void* e, void* s) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuEventRecord")) return r;
  if (CUresult r = need_event("cuEventRecord", e)) return r;
  if (CUresult r = need_stream("cuEventRecord", s)) return r;
  Event* ev = (Event*)e;
  ev->recorded = true;
  ev->ns = now_ns();
  trace("record event=0x%llx stream=0x%llx", handle(e), handle(s));
  return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(void* e) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuEventSynchronize")) return r;
  return need_event("cuEventSynchronize", e);
}

static CUresult elapsed(const char* fn, float* ms, void* a, void* b) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx(fn)) return r;
  if (!ms) return fail(CUDA_ERROR_INVALID_VALUE, fn, "NULL output");
  if (CUresult r = need_event(fn, a)) return r;
  if (CUresult r = need_event(fn, b)) return r;
  Event *s = (Event*)a, *t = (Event*)b;
  if ((s->flags | t->flags) & kEventDisableTiming) {
    return fail(CUDA_ERROR_INVALID_HANDLE, fn, "an event was created with CU_EVENT_DISABLE_TIMING");
  }
  if (!s->recorded || !t->recorded) {
    return fail(CUDA_ERROR_INVALID_HANDLE, fn, "an event has not been recorded");
  }
  *ms = (float)((double)(t->ns - s->ns) / 1e6);
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float* ms, void* a, void* b) { return elapsed("cuEventElapsedTime", ms, a, b); }

CUresult cuEventElapsedTime_v2(float* ms, void* a, void* b) { return elapsed("cuEventElapsedTime", ms, a, b); }

CUresult cuEventDestroy_v2(void* e) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuEventDestroy")) return r;
  if (CUresult r = need_event("cuEventDestroy", e)) return r;
  events.erase((Event*)e);
  delete (Event*)e;
  return CUDA_SUCCESS;
}

// Fresh device memory is filled with 0xff bytes (a NaN in every float
// format) so that a buffer read before it is written shows up in results
// rather than passing as zeros.
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuMemAlloc")) return r;
  if (!p) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "NULL output");
  if (n == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "zero bytes requested");
  const int d = current->device;
  if (n > total_memory) {
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "%zu bytes requested on device %d, which has %llu in all", n, d,
                total_memory);
  }
  const size_t charged = (n + kAlign - 1) / kAlign * kAlign;
  if (charged > total_memory - used[d]) {
    size_t live = 0;
    for (const auto& a : device_allocs) live += a.second.device == d;
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc",
                "%zu bytes requested on device %d: %llu of %llu bytes are in use in %zu allocation(s)", n, d, used[d],
                total_memory, live);
  }
  void* m = aligned_alloc(kAlign, charged);
  if (!m) {
    return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "the host could not provide %zu bytes for device %d", charged, d);
  }
  memset(m, 0xff, charged);
  device_allocs[(uintptr_t)m] = Alloc{n, charged, d};
  used[d] += charged;
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuMemFree")) return r;
  auto it = device_allocs.find((uintptr_t)p);
  if (it == device_allocs.end()) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree", "0x%llx is not the start of a live device allocation", p);
  }
  used[it->second.device] -= it->second.charged;
  free((void*)it->first);
  device_allocs.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void** p, size_t n) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuMemAllocHost")) return r;
  if (!p) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAllocHost", "NULL output");
  if (n == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAllocHost", "zero bytes requested");
  const size_t rounded = (n + kAlign - 1) / kAlign * kAlign;
  void* m = aligned_alloc(kAlign, rounded);
  if (!m) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocHost", "the host could not provide %zu bytes", n);
  host_allocs[(uintptr_t)m] = HostAlloc{n, current->device};
  *p = m;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* p) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuMemFreeHost")) return r;
  auto it = host_allocs.find((uintptr_t)p);
  if (it == host_allocs.end()) {
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", "%p did not come from cuMemAllocHost", p);
  }
  free(p);
  host_allocs.erase(it);
  return CUDA_SUCCESS;
}

static CUresult copy(const char* fn, void* s, bool check_stream, void* dst, bool dst_dev, const void* src, bool src_dev,
                     size_t n) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx(fn)) return r;
  if (check_stream) {
    if (CUresult r = need_stream(fn, s)) return r;
  }
  if (n == 0) return CUDA_SUCCESS;
  if (dst_dev) {
    if (CUresult r = need_range(fn, "destination", (CUdeviceptr)(uintptr_t)dst, n)) return r;
  } else if (!dst) {
    return fail(CUDA_ERROR_INVALID_VALUE, fn, "NULL host destination");
  }
  if (src_dev) {
    if (CUresult r = need_range(fn, "source", (CUdeviceptr)(uintptr_t)src, n)) return r;
  } else if (!src) {
    return fail(CUDA_ERROR_INVALID_VALUE, fn, "NULL host source");
  }
  memmove(dst, src, n);
  trace("copy %s stream=0x%llx dst=0x%llx src=0x%llx bytes=%zu", fn, check_stream ? handle(s) : handle((void*)kStreamLegacy),
        handle(dst), handle(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return copy("cuMemcpyHtoD", nullptr, false, (void*)(uintptr_t)dst, true, src, false, n);
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return copy("cuMemcpyDtoH", nullptr, false, dst, false, (const void*)(uintptr_t)src, true, n);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy("cuMemcpyDtoD", nullptr, false, (void*)(uintptr_t)dst, true, (const void*)(uintptr_t)src, true, n);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
  return copy("cuMemcpyHtoDAsync", s, true, (void*)(uintptr_t)dst, true, src, false, n);
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
  return copy("cuMemcpyDtoHAsync", s, true, dst, false, (const void*)(uintptr_t)src, true, n);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
  return copy("cuMemcpyDtoDAsync", s, true, (void*)(uintptr_t)dst, true, (const void*)(uintptr_t)src, true, n);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuMemsetD8")) return r;
  if (CUresult r = need_range("cuMemsetD8", "destination", dst, n)) return r;
  if (n) memset((void*)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, void* s) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuMemsetD32Async")) return r;
  if (CUresult r = need_stream("cuMemsetD32Async", s)) return r;
  if (dst % 4 != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async", "0x%llx is not 4-byte aligned", dst);
  if (n > ~(size_t)0 / 4) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemsetD32Async", "%zu words overflow", n);
  if (CUresult r = need_range("cuMemsetD32Async", "destination", dst, n * 4)) return r;
  uint32_t* p = (uint32_t*)(uintptr_t)dst;
  for (size_t i = 0; i < n; i++) p[i] = v;
  trace("memset stream=0x%llx dst=0x%llx bytes=%zu", handle(s), dst, n * 4);
  return CUDA_SUCCESS;
}

// An image is the text fake_nvrtc.cpp writes:
//   GCFAKECUBIN 1\n  arch sm_90\n  kernel <name>\n ...  end\n  NUL
CUresult cuModuleLoadData(void** m, const void* image) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuModuleLoadData")) return r;
  if (!m || !image) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData", "NULL argument");
  const char* s = (const char*)image;
  if (strncmp(s, kImageMagic, sizeof kImageMagic - 1) != 0) {
    return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData",
                "the image does not start with \"GCFAKECUBIN 1\": only images from the fake NVRTC can be loaded");
  }
  s += sizeof kImageMagic - 1;
  std::string arch;
  auto code = std::make_shared<Code>();
  bool ended = false;
  while (*s && !ended) {
    const char* nl = strchr(s, '\n');
    if (!nl) break;
    std::string line(s, (size_t)(nl - s));
    s = nl + 1;
    if (line.compare(0, 5, "arch ") == 0) {
      arch = line.substr(5);
    } else if (line.compare(0, 7, "kernel ") == 0) {
      // kernel NAME, then each parameter's type after a tab.
      std::vector<std::string> fields;
      size_t i = 7;
      for (;;) {
        size_t j = line.find('\t', i);
        fields.push_back(line.substr(i, j == std::string::npos ? std::string::npos : j - i));
        if (j == std::string::npos) break;
        i = j + 1;
      }
      code->kernels.push_back({fields[0], std::vector<std::string>(fields.begin() + 1, fields.end())});
    } else if (line.compare(0, 7, "source ") == 0) {
      char* end = nullptr;
      const unsigned long long n = strtoull(line.c_str() + 7, &end, 10);
      if (*end != '\0' || strnlen(s, n) < n || s[n] != '\n') {
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "the image's source block is malformed");
      }
      code->source.assign(s, n);
      s += n + 1;
    } else if (line == "end") {
      ended = true;
    } else {
      return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "unexpected image line \"%s\"", line.c_str());
    }
  }
  if (!ended) return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "the image is truncated (no \"end\" line)");
  int major = 0, minor = 0;
  bool exact = false;
  if (!parse_arch(arch, &major, &minor, &exact)) {
    return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "the image's architecture \"%s\" is not sm_XY", arch.c_str());
  }
  // The device is compute capability 9.0. A CUBIN runs on its own major
  // version at an equal or higher minor; an "a"/"f" suffix pins it exactly.
  const int dev_major = 9, dev_minor = 0;
  if (major != dev_major || minor > dev_minor || (exact && minor != dev_minor)) {
    return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData",
                "the image was built for %s; the device is sm_%d%d", arch.c_str(), dev_major, dev_minor);
  }
  Module* mod = new Module{next_id++, current, {}};
  const auto kernels = code->kernels;
  // Without a source only the table's kernels can run.
  if (code->source.empty()) code.reset();
  for (const auto& k : kernels) {
    mod->funcs.push_back(std::unique_ptr<Func>(new Func{mod, k.first, code}));
    funcs.insert(mod->funcs.back().get());
  }
  modules.insert(mod);
  *m = mod;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void** f, void* m, const char* name) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuModuleGetFunction")) return r;
  Module* mod = (Module*)m;
  if (!modules.count(mod)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction", "module %p is not loaded", m);
  if (!f || !name) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction", "NULL argument");
  for (auto& fn : mod->funcs) {
    if (fn->name == name) {
      *f = fn.get();
      return CUDA_SUCCESS;
    }
  }
  return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction",
              "module %llu has no kernel \"%s\" (its %zu kernels are the extern \"C\" __global__ functions of the source)",
              mod->id, name, mod->funcs.size());
}

CUresult cuModuleUnload(void* m) {
  std::lock_guard<std::mutex> g(mu);
  if (CUresult r = need_ctx("cuModuleUnload")) return r;
  Module* mod = (Module*)m;
  if (!modules.count(mod)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload", "module %p is not loaded", m);
  for (auto& fn : mod->funcs) funcs.erase(fn.get());
  modules.erase(mod);
  delete mod;
  return CUDA_SUCCESS;
}

// Kernels run to completion before the call returns, on the emulator's
// threads; one launch runs at a time (the emulator serializes them).
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void* s, void** params, void** extra) {
  const char* fn = "cuLaunchKernel";
  std::string name;
  std::shared_ptr<Code> code;
  {
    std::lock_guard<std::mutex> g(mu);
    if (CUresult r = need_ctx(fn)) return r;
    if (!funcs.count((Func*)f)) return fail(CUDA_ERROR_INVALID_HANDLE, fn, "function %p is not loaded", f);
    if (CUresult r = need_stream(fn, s)) return r;
    name = ((Func*)f)->name;
    code = ((Func*)f)->code;
  }
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) {
    return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s: grid (%u,%u,%u) or block (%u,%u,%u) has a zero dimension", name.c_str(),
                gx, gy, gz, bx, by, bz);
  }
  if (bx > 1024 || by > 1024 || bz > 64 || (unsigned long long)bx * by * bz > 1024) {
    return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s: block (%u,%u,%u) exceeds 1024 threads or (1024,1024,64)",
                name.c_str(), bx, by, bz);
  }
  if (gx > 2147483647u || gy > 65535 || gz > 65535) {
    return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s: grid (%u,%u,%u) exceeds (2147483647,65535,65535)", name.c_str(), gx,
                gy, gz);
  }
  if (shared > kSharedPerBlock) {
    return fail(CUDA_ERROR_INVALID_VALUE, fn,
                "%s: %u bytes of dynamic shared memory exceed the %u a kernel gets without opting in", name.c_str(),
                shared, kSharedPerBlock);
  }
  if (extra) return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s: the extra parameter buffer is not supported", name.c_str());
  EmuLaunch launch = nullptr;
  if (CUresult r = load_emulator(&launch)) return r;
  trace("launch %s stream=0x%llx", name.c_str(), handle(s));
  int rc = launch(name.c_str(), gx, gy, gz, bx, by, bz, shared, params);
  if (rc == 1 && code) {
    // Not in the table: a kernel generated at run time, emulated from its
    // module's source.
    EmuLaunch generated = nullptr;
    if (CUresult r = generated_emulator(name, code.get(), launch, &generated)) return r;
    rc = generated(name.c_str(), gx, gy, gz, bx, by, bz, shared, params);
  }
  switch (rc) {
    case 0:
      return CUDA_SUCCESS;
    case 1:
      return fail(CUDA_ERROR_LAUNCH_FAILED, fn,
                  "%s has no CPU emulation (it is neither in the kernels/cuda table nor in its module's source)",
                  name.c_str());
    case 2:
      return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s: the emulator rejected grid (%u,%u,%u) block (%u,%u,%u) shared %u",
                  name.c_str(), gx, gy, gz, bx, by, bz, shared);
    case 3:
      return fail(CUDA_ERROR_INVALID_VALUE, fn, "%s: kernelParams is NULL or holds a NULL entry", name.c_str());
    case 4:
      return fail(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, fn, "%s: the emulator could not start its threads", name.c_str());
  }
  return fail(CUDA_ERROR_LAUNCH_FAILED, fn, "%s: the emulator returned status %d", name.c_str(), rc);
}

// Like the real driver, an unknown code leaves *s NULL and returns
// CUDA_ERROR_INVALID_VALUE.
CUresult cuGetErrorName(CUresult e, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& t : kErrors) {
    if (t.code == e) {
      *s = t.name;
      return CUDA_SUCCESS;
    }
  }
  *s = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult e, const char** s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& t : kErrors) {
    if (t.code == e) {
      *s = t.text;
      return CUDA_SUCCESS;
    }
  }
  *s = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// gcFakeGPULastError is the sentence recorded with the most recent failure
// of any call, or "" if none failed. The pointer stays valid on the calling
// thread until its next call.
const char* gcFakeGPULastError(void) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> g(err_mu);
  copy = last_error;
  return copy.c_str();
}

// gcFakeGPUCurrentDevice is the device of the calling thread's current
// context, or -1 when none is current (or cuInit has not run). The fake
// NCCL asks, as NCCL asks the CUDA runtime, which device a rank uses.
int gcFakeGPUCurrentDevice(void) {
  std::lock_guard<std::mutex> g(mu);
  if (!initialized || !current || current->refs == 0) return -1;
  return current->device;
}

// gcFakeGPUCheckBuffer returns 0 if [p, p+n) lies inside one live
// allocation: device memory (of device, when device >= 0) or pinned host
// memory, which NCCL also accepts. Otherwise it returns -1 and writes why
// into msg (len bytes). The fake NCCL checks its buffers with it, as NCCL
// does with NCCL_CHECK_POINTERS=1, so a bad pointer is an error rather
// than a write into the host's memory.
int gcFakeGPUCheckBuffer(unsigned long long p, unsigned long long n, int device, char* msg, unsigned long len) {
  std::lock_guard<std::mutex> g(mu);
  if (n == 0) return 0;
  auto inside = [&](const auto& allocs, uintptr_t* base, size_t* size) {
    auto it = allocs.upper_bound((uintptr_t)p);
    if (it == allocs.begin()) return false;
    --it;
    *base = it->first;
    *size = it->second.size;
    return p >= *base && p - *base < *size;
  };
  uintptr_t base = 0;
  size_t size = 0;
  if (inside(device_allocs, &base, &size)) {
    if (n > size - (p - base)) {
      snprintf(msg, len, "0x%llx+%llu runs %llu bytes past the end of its %zu-byte allocation at 0x%llx", p, n,
               (unsigned long long)(p - base + n - size), size, (unsigned long long)base);
      return -1;
    }
    const int d = device_allocs.find(base)->second.device;
    if (device >= 0 && d != device) {
      snprintf(msg, len, "0x%llx is memory of device %d, but the rank uses device %d", p, d, device);
      return -1;
    }
    return 0;
  }
  if (inside(host_allocs, &base, &size)) {
    if (n > size - (p - base)) {
      snprintf(msg, len, "0x%llx+%llu runs %llu bytes past the end of its %zu-byte pinned host allocation at 0x%llx", p,
               n, (unsigned long long)(p - base + n - size), size, (unsigned long long)base);
      return -1;
    }
    return 0;
  }
  snprintf(msg, len, "0x%llx is not in any live device or pinned host allocation", p);
  return -1;
}

// gcFakeGPUTraceStart empties the call trace and starts recording.
void gcFakeGPUTraceStart(void) {
  std::lock_guard<std::mutex> g(trace_mu);
  trace_log.clear();
  trace_full = false;
  tracing.store(true);
}

// gcFakeGPUTraceStop stops recording; the trace stays readable.
void gcFakeGPUTraceStop(void) { tracing.store(false); }

// gcFakeGPUTraceAppend adds a line to the trace while it records: the
// fake NCCL's calls, or a caller's marks between its own calls.
void gcFakeGPUTraceAppend(const char* line) {
  if (line) trace_line(line);
}

// gcFakeGPUTraceRead is the trace, one call per line, with a last line
// "truncated" if entries were dropped. The pointer stays valid on the
// calling thread until its next call.
const char* gcFakeGPUTraceRead(void) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> g(trace_mu);
  copy.clear();
  for (const std::string& l : trace_log) copy += l + "\n";
  if (trace_full) copy += "truncated\n";
  return copy.c_str();
}

// gcFakeGPUMemUsed is the device memory in use on device d, in bytes (each
// allocation counted rounded up to 256 bytes), or -1 for no such device.
long long gcFakeGPUMemUsed(int d) {
  std::lock_guard<std::mutex> g(mu);
  if (d < 0 || d >= kMaxDevices) return -1;
  return (long long)used[d];
}

}  // extern "C"
