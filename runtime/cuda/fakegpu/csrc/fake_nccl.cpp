// fake_nccl.cpp — libnccl.so.2 for machines without a GPU: communicators of
// any number of ranks, in one process (a thread per rank, or one thread that
// drives several ranks inside ncclGroupStart/End) or across the processes of
// one machine.
//
// Every exported function has the C prototype of the NCCL entry point it is
// named after. Device pointers are host addresses (see fake_cuda.cpp) and the
// work is done before a call returns, so calls block the way NCCL's host
// side would if every kernel ran to completion at once.
//
// How ranks meet. ncclGetUniqueId writes the magic below and 32 random hex
// digits; they name an abstract Unix-domain socket, reachable from every
// process of the machine (network namespace). The rank 0 of a communicator
// hosts its hub: a listener and, per connected rank, a reader thread and a
// writer thread, in rank 0's process. Every rank, rank 0 included, connects
// to the hub (other ranks retry until rank 0 listens) and says hello;
// ncclCommInitRank returns when all ranks have. The hub executes everything
// between ranks:
//
//   - Collectives are numbered per rank in the order a rank issues them.
//     When every rank has issued collective #k the hub checks that they
//     agree (kind, count, type, reduction, root) and computes each rank's
//     result from the ranks' inputs; disagreement gives every rank
//     ncclInvalidUsage with a message naming the ranks and what differed.
//     Reductions start from rank 0's input and apply rank 1's, then rank
//     2's, and so on, elementwise in the element type: a float32 sum is
//     ((x0 + x1) + x2) + … with one float32 rounding per add, the order and
//     rounding of gcompile's CPU backend. float16 and bfloat16 are widened
//     to float32, combined in float32 and rounded to nearest-even after
//     every step, as the CPU backend's 16-bit arithmetic is (a GPU's
//     native 16-bit add may differ from this in the last bit where the
//     float32 sum lies exactly halfway after its own rounding). Integers
//     wrap.
//     Avg is the sum divided by the rank count (integers truncate). Max and
//     Min ignore NaN as fmaxf/fminf do. The 8-bit float types are moved but
//     not reduced (ncclInvalidArgument).
//   - Sends are buffered: ncclSend copies its data to the hub and returns,
//     and ncclRecv blocks until the next send from that peer is there.
//     Sends and receives between one pair of ranks pair up in issue order,
//     as in NCCL; a receive whose count or type differs from its send fails
//     with ncclInvalidUsage naming both (the send has completed by then).
//     Real NCCL sends wait for their receiver, so the fake accepts some
//     programs that would hang on a GPU (two ranks that both send before
//     they receive, outside a group); pairing order mistakes are still
//     caught. Sends and receives between a rank and itself never reach the
//     hub: they must pair up inside one group, as on a GPU, where the
//     send would otherwise wait forever.
//   - Inside ncclGroupStart/End every call is queued and issued at the
//     outermost ncclGroupEnd: communicators initialised in the group join
//     first (the rank-0 hubs are set up before anyone connects), then every
//     send is posted, then every other operation, and only then does the
//     thread wait for results. One thread can therefore create and drive
//     the ranks of several devices, as NCCL's single-thread multi-GPU
//     pattern does; outside a group such a thread would wait for itself,
//     which also hangs with NCCL.
//
// A call that fails its argument checks on one rank returns the error there
// and still takes its place in the sequence (a "poisoned" contribution), so
// the other ranks' matching call fails with ncclInvalidUsage saying which
// rank failed and why, instead of waiting forever.
//
// No call blocks forever. ncclCommAbort, from any thread, wakes every call
// blocked on that communicator (they return ncclSystemError, "aborted: ...")
// and tells the hub, which fails every other rank's pending and later calls
// with ncclRemoteError. A rank whose connection closes without
// ncclCommDestroy (its process died) does the same to the others, as does
// the death of rank 0's process (the hub's) to everyone; ncclCommGetAsyncError
// reports the error from then on. A rank that leaves with ncclCommDestroy
// fails only the calls that need it; its buffered sends can still be
// received. The hub lives in rank 0's process, so that process must outlive
// the communicator: its ncclCommDestroy waits until the ranks of other
// processes have left (NCCL documents destroy as an intra-node collective;
// ranks of the same process are not waited for, so one thread can destroy
// its ranks one after another), and if it exits or dies first, the others
// get ncclRemoteError. GCOMPILE_FAKEGPU_NCCL_TIMEOUT (seconds,
// default 120) bounds every wait as a safety net: the call fails with
// ncclSystemError saying what it waited for, and the communicator is
// unusable afterwards.
//
// When the fake CUDA driver (GCOMPILE_LIBCUDA) is loaded in the process, the
// checks a GPU would make are made too: a rank's device is the device of the
// calling thread's current context at ncclCommInitRank (device 0 when none is
// current, as with the CUDA runtime); two ranks of one communicator on one
// device of one process fail with ncclInvalidUsage ("Duplicate GPU
// detected", as NCCL says); buffers must lie inside one live allocation,
// device memory of the rank's device or pinned host memory
// (ncclInvalidArgument otherwise, as NCCL_CHECK_POINTERS=1 reports).
//
// Failures record a message that ncclGetLastError returns: the calling
// thread's latest, else the process's latest. GCOMPILE_FAKEGPU_VERBOSE=1
// also prints them to stderr.

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

typedef int ncclResult_t;

namespace {

enum : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum : int { ncclNumTypes = 12, ncclNumOps = 5 };
enum : int {
  kInt8, kUint8, kInt32, kUint32, kInt64, kUint64, kFloat16, kFloat32, kFloat64, kBfloat16, kFp8E4M3, kFp8E5M2,
};
enum : int { kSum, kProd, kMax, kMin, kAvg };
const size_t kTypeSize[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
const char* const kTypeName[ncclNumTypes] = {
    "ncclInt8",    "ncclUint8",   "ncclInt32",    "ncclUint32",     "ncclInt64",      "ncclUint64",
    "ncclFloat16", "ncclFloat32", "ncclFloat64",  "ncclBfloat16",   "ncclFloat8e4m3", "ncclFloat8e5m2",
};
const char* const kOpName[ncclNumOps] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};

const char* type_name(int t) { return t >= 0 && t < ncclNumTypes ? kTypeName[t] : "an unknown type"; }
constexpr int kNoColor = -1;  // NCCL_SPLIT_NOCOLOR

// Collective kinds, as they travel to the hub.
enum : int { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAlltoAll, kSplit, kNumColls };
const char* const kCollName[kNumColls] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                                          "ncclBroadcast", "ncclAlltoAll",      "ncclCommSplit"};

// Ids from ncclGetUniqueId start with this, so a communicator is only made
// from an id this library handed out.
const char kIdMagic[] = "gcompile-fake-nccl-id";
constexpr size_t kIdHex = 32;  // random hex digits after the magic and a space
const char kSocketPrefix[] = "gcompile-fake-nccl/";

struct ncclUniqueId {
  char internal[128];
};

// ---------------------------------------------------------------------------
// Errors

struct Comm;

// Process state. Allocated once and never freed: hub threads may still run
// while the process exits, and must not meet destroyed globals.
struct Globals {
  std::mutex mu;  // guards everything below; never held while taking a Comm's mu
  std::set<Comm*> live;
  std::condition_variable idle;  // a communicator's count of calls in progress fell
  std::string last_error;
};

Globals& G() {
  static Globals* g = new Globals;
  return *g;
}

thread_local std::string thread_error;

bool verbose() {
  const char* v = getenv("GCOMPILE_FAKEGPU_VERBOSE");
  return v && strcmp(v, "1") == 0;
}

// record makes msg the latest error of this thread and of the process.
ncclResult_t record(ncclResult_t r, const std::string& msg) {
  thread_error = msg;
  {
    std::lock_guard<std::mutex> g(G().mu);
    G().last_error = msg;
  }
  if (verbose()) fprintf(stderr, "fakegpu: %s\n", msg.c_str());
  return r;
}

std::string vformat(const char* fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

ncclResult_t fail(ncclResult_t r, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t fail(ncclResult_t r, const char* fn, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return record(r, std::string(fn) + ": " + s);
}

const char* plural(long n) { return n == 1 ? "" : "s"; }

double timeout_seconds() {
  if (const char* s = getenv("GCOMPILE_FAKEGPU_NCCL_TIMEOUT"); s && *s) {
    char* end = nullptr;
    double v = strtod(s, &end);
    if (end != s && *end == '\0' && v > 0 && v < 1e9) return v;
  }
  return 120;
}

// ---------------------------------------------------------------------------
// The fake CUDA driver, when loaded: devices and buffer checks.

// Driver holds a reference to the loaded fake driver for one call, so the
// driver cannot be unloaded under it; it is empty when none is loaded.
struct Driver {
  void* handle = nullptr;
  int (*current_device)(void) = nullptr;
  int (*check_buffer)(unsigned long long, unsigned long long, int, char*, unsigned long) = nullptr;
  void (*trace)(const char*) = nullptr;

  Driver() {
    const char* path = getenv("GCOMPILE_LIBCUDA");
    if (!path || !*path) return;
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!handle) {
      dlerror();  // a driver that is not loaded is no error here
      return;
    }
    current_device = (int (*)(void))dlsym(handle, "gcFakeGPUCurrentDevice");
    using Check = int (*)(unsigned long long, unsigned long long, int, char*, unsigned long);
    check_buffer = (Check)dlsym(handle, "gcFakeGPUCheckBuffer");
    trace = (void (*)(const char*))dlsym(handle, "gcFakeGPUTraceAppend");
    if (!current_device || !check_buffer || !trace) dlerror();
  }
  ~Driver() {
    if (handle) dlclose(handle);
  }
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
};

// trace_call adds a call that queues work on a stream to the fake
// driver's call trace (when it records one), so that a test sees which
// stream each collective was queued on.
void trace_call(const char* fn, const void* stream) {
  Driver d;
  if (!d.trace) return;
  char buf[128];
  snprintf(buf, sizeof buf, "nccl %s stream=0x%llx", fn, (unsigned long long)(uintptr_t)stream);
  d.trace(buf);
}

// calling_device is the device a rank created now would use: the current
// context's, device 0 without one (the CUDA runtime's default), or -1 when
// the fake driver is not loaded.
int calling_device() {
  Driver d;
  if (!d.current_device) return -1;
  int dev = d.current_device();
  return dev < 0 ? 0 : dev;
}

// check_buffer reports a buffer the fake driver does not know, or one on
// another device than the rank's, in *why.
bool check_buffer(const char* what, const void* p, size_t n, int device, std::string* why) {
  if (n == 0) return true;
  Driver d;
  if (!d.check_buffer) return true;
  char msg[512] = "";
  if (d.check_buffer((unsigned long long)(uintptr_t)p, n, device, msg, sizeof msg) == 0) return true;
  *why = std::string(what) + " " + msg;
  return false;
}

// ---------------------------------------------------------------------------
// Ids and sockets

void random_bytes(unsigned char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = getrandom(out + got, n - got, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      break;
    }
    got += (size_t)k;
  }
  if (got == n) return;
  // No getrandom: the time, the process and a counter, mixed (splitmix64).
  static std::atomic<unsigned long long> counter{0};
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)ts.tv_sec << 30) ^
                         ((unsigned long long)getpid() << 17) ^ counter.fetch_add(1);
  for (size_t i = got; i < n; i++) {
    x += 0x9e3779b97f4a7c15ull;
    unsigned long long z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    out[i] = (unsigned char)(z ^ (z >> 31));
  }
}

void make_id(ncclUniqueId* id) {
  unsigned char r[kIdHex / 2];
  random_bytes(r, sizeof r);
  char hex[kIdHex + 1];
  for (size_t i = 0; i < sizeof r; i++) snprintf(hex + 2 * i, 3, "%02x", r[i]);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "%s %s", kIdMagic, hex);
}

// parse_id finds the hub's socket name in an id.
bool parse_id(const ncclUniqueId& id, std::string* name) {
  const size_t m = sizeof kIdMagic - 1;
  if (strncmp(id.internal, kIdMagic, m) != 0 || id.internal[m] != ' ') return false;
  const char* hex = id.internal + m + 1;
  for (size_t i = 0; i < kIdHex; i++) {
    const char c = hex[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  if (hex[kIdHex] != '\0') return false;
  *name = std::string(kSocketPrefix) + std::string(hex, kIdHex);
  return true;
}

socklen_t socket_address(const std::string& name, sockaddr_un* a) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  // An abstract name (leading NUL): nothing on the file system to clean up,
  // and it disappears with the listener.
  memcpy(a->sun_path + 1, name.data(), std::min(name.size(), sizeof a->sun_path - 1));
  return (socklen_t)(offsetof(sockaddr_un, sun_path) + 1 + std::min(name.size(), sizeof a->sun_path - 1));
}

bool write_all(int fd, const void* p, size_t n) {
  const char* b = (const char*)p;
  while (n > 0) {
    // MSG_NOSIGNAL: a peer that died is an error to report, not SIGPIPE.
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    b += k;
    n -= (size_t)k;
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* b = (char*)p;
  while (n > 0) {
    ssize_t k = recv(fd, b, n, 0);
    if (k == 0) return false;
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    b += k;
    n -= (size_t)k;
  }
  return true;
}

// start runs f on a new thread with every signal blocked, so that signals
// meant for the process (SIGCHLD, SIGPROF, …) go to its own threads.
template <class F>
bool start(std::thread* t, F f) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  bool ok = true;
  try {
    *t = std::thread(std::move(f));
  } catch (...) {
    ok = false;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

// ---------------------------------------------------------------------------
// Messages between ranks and their hub

enum : uint32_t { kHello = 1, kColl, kSend, kRecv, kBye, kReply, kBroken };
constexpr uint32_t kWireMagic = 0x6e63636c;  // "nccl"
// Nothing a test sends comes near this; a larger length is a corrupt stream.
constexpr uint64_t kMaxBody = 1ull << 40;

// Wire is a message header. Every rank runs on this machine, so it travels
// in host byte order.
struct Wire {
  uint32_t magic;
  uint32_t type;
  uint64_t tag;    // the sender's request number, echoed by the reply
  int32_t status;  // Reply/Broken: an ncclResult_t; Bye: 1 if aborted;
                   // Coll/Send/Recv: 1 if the call failed its checks (the body says why)
  int32_t kind;    // collective kind
  int32_t dtype, redop, root, peer, color, key;
  int32_t nranks, rank;  // Hello; replies to a split
  int32_t pid, device;   // Hello
  uint64_t count;
  uint64_t body;  // bytes that follow
};

using Body = std::shared_ptr<const std::string>;

struct Msg {
  Wire h{};
  Body body;
  std::string text() const { return body ? *body : std::string(); }
  size_t size() const { return body ? body->size() : 0; }
};

bool read_msg(int fd, Msg* m) {
  if (!read_all(fd, &m->h, sizeof m->h)) return false;
  if (m->h.magic != kWireMagic || m->h.body > kMaxBody) return false;
  try {
    auto b = std::make_shared<std::string>((size_t)m->h.body, '\0');
    if (m->h.body > 0 && !read_all(fd, &(*b)[0], b->size())) return false;
    m->body = std::move(b);
  } catch (const std::bad_alloc&) {
    return false;
  }
  return true;
}

bool write_msg(int fd, Wire h, const void* body, size_t n) {
  h.magic = kWireMagic;
  h.body = n;
  return write_all(fd, &h, sizeof h) && (n == 0 || write_all(fd, body, n));
}

Body text_body(const std::string& s) { return std::make_shared<const std::string>(s); }

// ---------------------------------------------------------------------------
// Elementwise reductions, in the element type

template <typename T>
T load(const char* p) {
  T v;
  memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store(char* p, T v) {
  memcpy(p, &v, sizeof v);
}

// decode16 reads a float16 (5 exponent bits, 10 mantissa bits) or bfloat16
// (8, 7) exactly.
double decode16(uint16_t bits, int ebits, int mbits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const bool neg = (bits >> (ebits + mbits)) & 1;
  const int e = (bits >> mbits) & ((1 << ebits) - 1);
  const uint32_t m = bits & ((1u << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = ldexp((double)m, 1 - bias - mbits);
  } else {
    v = ldexp((double)(m | (1u << mbits)), e - bias - mbits);
  }
  return neg ? -v : v;
}

// encode16 rounds x to the nearest float16 or bfloat16, ties to even,
// overflowing to infinity as IEEE rounding does.
uint16_t encode16(double x, int ebits, int mbits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const uint16_t sign = signbit(x) ? (uint16_t)(1u << (ebits + mbits)) : 0;
  const uint16_t inf = (uint16_t)(((1u << ebits) - 1) << mbits);
  if (isnan(x)) return sign | inf | (uint16_t)(1u << (mbits - 1));
  const double a = fabs(x);
  if (isinf(a)) return sign | inf;
  if (a == 0) return sign;
  int e;
  frexp(a, &e);
  int exp = std::max(e - 1, 1 - bias);  // subnormals share the smallest exponent
  // a in units of the format's spacing at exp; scaling by 2^k is exact, so
  // nearbyint (round-to-nearest-even mode) rounds once.
  double q = nearbyint(ldexp(a, mbits - exp));
  if (q >= ldexp(1.0, mbits + 1)) {  // rounded up to the next power of two
    exp++;
    q = ldexp(q, -1);
  }
  if (exp > bias) return sign | inf;
  const uint32_t qi = (uint32_t)q;
  if (qi < (1u << mbits)) return sign | (uint16_t)qi;  // subnormal
  return sign | (uint16_t)(((uint32_t)(exp + bias) << mbits) | (qi - (1u << mbits)));
}

template <typename T>
void reduce_int(char* acc, const char* in, size_t n, int op) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < n; i++) {
    const T a = load<T>(acc + i * sizeof(T)), b = load<T>(in + i * sizeof(T));
    T r = a;
    switch (op) {
      case kSum:
      case kAvg:
        r = (T)(U)((U)a + (U)b);
        break;
      case kProd:
        // Through unsigned long long: wraps without undefined behaviour,
        // and the low bits are the same.
        r = (T)(U)((unsigned long long)(U)a * (unsigned long long)(U)b);
        break;
      case kMax:
        r = b > a ? b : a;
        break;
      case kMin:
        r = b < a ? b : a;
        break;
    }
    store<T>(acc + i * sizeof(T), r);
  }
}

template <typename T>
void average_int(char* acc, size_t n, int nranks) {
  for (size_t i = 0; i < n; i++) {
    const T a = load<T>(acc + i * sizeof(T));
    T r;
    if constexpr (std::is_signed_v<T>) {
      r = (T)((long long)a / (long long)nranks);
    } else {
      r = (T)((unsigned long long)a / (unsigned long long)nranks);
    }
    store<T>(acc + i * sizeof(T), r);
  }
}

template <typename T>
void reduce_float(char* acc, const char* in, size_t n, int op) {
  for (size_t i = 0; i < n; i++) {
    T a = load<T>(acc + i * sizeof(T));
    const T b = load<T>(in + i * sizeof(T));
    switch (op) {
      case kSum:
      case kAvg:
        a = a + b;
        break;
      case kProd:
        a = a * b;
        break;
      case kMax:
        a = (T)fmax(a, b);  // exact: the result is one of the operands
        break;
      case kMin:
        a = (T)fmin(a, b);
        break;
    }
    store<T>(acc + i * sizeof(T), a);
  }
}

template <typename T>
void average_float(char* acc, size_t n, int nranks) {
  for (size_t i = 0; i < n; i++) store<T>(acc + i * sizeof(T), load<T>(acc + i * sizeof(T)) / (T)nranks);
}

// reduce_16 combines 16-bit floats in float32 (which holds them exactly)
// and rounds each result back.
void reduce_16(char* acc, const char* in, size_t n, int op, int ebits, int mbits) {
  for (size_t i = 0; i < n; i++) {
    const float a = (float)decode16(load<uint16_t>(acc + 2 * i), ebits, mbits);
    const float b = (float)decode16(load<uint16_t>(in + 2 * i), ebits, mbits);
    float r = a;
    switch (op) {
      case kSum:
      case kAvg:
        r = a + b;
        break;
      case kProd:
        r = a * b;
        break;
      case kMax:
        r = fmaxf(a, b);
        break;
      case kMin:
        r = fminf(a, b);
        break;
    }
    store<uint16_t>(acc + 2 * i, encode16(r, ebits, mbits));
  }
}

void average_16(char* acc, size_t n, int nranks, int ebits, int mbits) {
  for (size_t i = 0; i < n; i++) {
    const float a = (float)decode16(load<uint16_t>(acc + 2 * i), ebits, mbits);
    store<uint16_t>(acc + 2 * i, encode16(a / (float)nranks, ebits, mbits));
  }
}

// reduce_step applies acc = acc op in to n elements of type t.
void reduce_step(int t, int op, char* acc, const char* in, size_t n) {
  switch (t) {
    case kInt8: reduce_int<int8_t>(acc, in, n, op); break;
    case kUint8: reduce_int<uint8_t>(acc, in, n, op); break;
    case kInt32: reduce_int<int32_t>(acc, in, n, op); break;
    case kUint32: reduce_int<uint32_t>(acc, in, n, op); break;
    case kInt64: reduce_int<int64_t>(acc, in, n, op); break;
    case kUint64: reduce_int<uint64_t>(acc, in, n, op); break;
    case kFloat16: reduce_16(acc, in, n, op, 5, 10); break;
    case kFloat32: reduce_float<float>(acc, in, n, op); break;
    case kFloat64: reduce_float<double>(acc, in, n, op); break;
    case kBfloat16: reduce_16(acc, in, n, op, 8, 7); break;
  }
}

void average(int t, char* acc, size_t n, int nranks) {
  switch (t) {
    case kInt8: average_int<int8_t>(acc, n, nranks); break;
    case kUint8: average_int<uint8_t>(acc, n, nranks); break;
    case kInt32: average_int<int32_t>(acc, n, nranks); break;
    case kUint32: average_int<uint32_t>(acc, n, nranks); break;
    case kInt64: average_int<int64_t>(acc, n, nranks); break;
    case kUint64: average_int<uint64_t>(acc, n, nranks); break;
    case kFloat16: average_16(acc, n, nranks, 5, 10); break;
    case kFloat32: average_float<float>(acc, n, nranks); break;
    case kFloat64: average_float<double>(acc, n, nranks); break;
    case kBfloat16: average_16(acc, n, nranks, 8, 7); break;
  }
}

// ---------------------------------------------------------------------------
// The hub, in rank 0's process

// Conn is one rank's connection to the hub. Replies go through a queue that
// a writer thread drains, so the hub's readers never block on a rank that
// is busy writing its own requests.
struct Conn {
  int fd;
  int rank = -1;  // set by its hello
  std::mutex mu;  // guards outq and closing
  std::condition_variable cv;
  std::deque<Msg> outq;
  bool closing = false;  // nothing more will be queued
  explicit Conn(int f) : fd(f) {}
  ~Conn() { close(fd); }
};

void push(const std::shared_ptr<Conn>& c, Msg m) {
  if (!c) return;
  std::lock_guard<std::mutex> g(c->mu);
  if (c->closing) return;
  c->outq.push_back(std::move(m));
  c->cv.notify_one();
}

void reply(const std::shared_ptr<Conn>& c, uint64_t tag, int status, Body body) {
  Msg m;
  m.h.type = kReply;
  m.h.tag = tag;
  m.h.status = status;
  m.body = std::move(body);
  push(c, std::move(m));
}

void write_loop(std::shared_ptr<Conn> c) {
  for (;;) {
    Msg m;
    {
      std::unique_lock<std::mutex> l(c->mu);
      c->cv.wait(l, [&] { return !c->outq.empty() || c->closing; });
      if (c->outq.empty()) return;
      m = std::move(c->outq.front());
      c->outq.pop_front();
    }
    if (!write_msg(c->fd, m.h, m.body ? m.body->data() : nullptr, m.size())) {
      std::lock_guard<std::mutex> g(c->mu);
      c->closing = true;
      c->outq.clear();
      return;
    }
  }
}

// Slot gathers the ranks' contributions to one collective.
struct Slot {
  std::vector<bool> in;
  std::vector<Wire> hdr;
  std::vector<Body> data;
  int arrived = 0;
};

std::string describe(const Wire& w) {
  const char* type = type_name(w.dtype);
  const char* op = w.redop >= 0 && w.redop < ncclNumOps ? kOpName[w.redop] : "?";
  const char* name = w.kind >= 0 && w.kind < kNumColls ? kCollName[w.kind] : "an unknown collective";
  switch (w.kind) {
    case kAllReduce:
    case kReduceScatter:
      return format("%s(count %llu, %s, %s)", name, (unsigned long long)w.count, type, op);
    case kBroadcast:
      return format("%s(count %llu, %s, root %d)", name, (unsigned long long)w.count, type, w.root);
    case kSplit:
      return format("%s(color %d, key %d)", name, w.color, w.key);
  }
  return format("%s(count %llu, %s)", name, (unsigned long long)w.count, type);
}

struct Hub {
  std::string name;
  int nranks;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // written to stop the listener

  const int pid = getpid();

  std::mutex mu;  // guards everything below
  std::condition_variable left;  // a rank's connection closed
  bool listening = true;
  int open_conns = 0;  // connections whose reader runs
  std::vector<std::shared_ptr<Conn>> conns;  // by rank, after hello
  std::vector<char> closed;                  // by rank: its connection has closed
  std::vector<uint64_t> hello_tag;
  std::vector<int> pids, devices;
  std::vector<char> gone;  // left with ncclCommDestroy
  int joined = 0;
  bool ready = false;
  bool broken = false;
  int broken_code = ncclSuccess;
  std::string broken_msg;
  std::vector<uint64_t> next_seq;  // per rank: the number of its next collective
  std::map<uint64_t, Slot> slots;
  std::map<std::pair<int, int>, std::deque<Msg>> sends, recvs;  // by (from, to)
  std::map<std::pair<int, int>, uint64_t> sent;                 // sends issued per pair, for messages

  Hub(std::string n, int r)
      : name(std::move(n)),
        nranks(r),
        conns(r),
        closed(r),
        hello_tag(r),
        pids(r),
        devices(r),
        gone(r),
        next_seq(r) {}

  // others_open lists the ranks of other processes still connected; the
  // hub must outlive them. mu is held.
  std::string others_open() const {
    std::string list;
    for (int r = 0; r < nranks; r++) {
      if (conns[r] && !closed[r] && pids[r] != pid) list += (list.empty() ? "" : ", ") + std::to_string(r);
    }
    return list;
  }
  ~Hub() {
    if (listen_fd >= 0) close(listen_fd);
    if (wake[0] >= 0) close(wake[0]);
    if (wake[1] >= 0) close(wake[1]);
  }

  void stop_listening() {
    if (!listening) return;
    listening = false;
    const char x = 1;
    ssize_t k = write(wake[1], &x, 1);
    (void)k;  // the pipe is empty, so the byte fits
  }

  // break_all fails every rank from now on: pending calls through a notice
  // each rank's client turns into errors, later calls at once.
  void break_all(int code, const std::string& msg) {
    if (broken) return;
    broken = true;
    broken_code = code;
    broken_msg = msg;
    for (int r = 0; r < nranks; r++) {
      if (!conns[r] || gone[r]) continue;
      Msg m;
      m.h.type = kBroken;
      m.h.status = code;
      m.body = text_body(msg);
      push(conns[r], std::move(m));
    }
    slots.clear();
    sends.clear();
    recvs.clear();
  }

  void reply_to(int rank, uint64_t tag, int status, Body body) { reply(conns[rank], tag, status, std::move(body)); }

  void fail_slot(Slot& s, int code, const std::string& msg) {
    Body b = text_body(msg);
    for (int r = 0; r < nranks; r++) {
      if (s.in[r]) reply_to(r, s.hdr[r].tag, code, b);
    }
  }

  // hello registers a connection as its rank; false refuses it.
  bool hello(const std::shared_ptr<Conn>& c, const Msg& m) {
    const Wire& w = m.h;
    auto refuse = [&](int code, const std::string& msg) {
      reply(c, w.tag, code, text_body(msg));
      return false;
    };
    if (broken) return refuse(broken_code, broken_msg);
    if (ready) {
      return refuse(ncclInvalidUsage,
                    format("all %d ranks of this communicator have joined; rank %d joined again (an id makes one "
                           "communicator)",
                           nranks, w.rank));
    }
    std::string bad;
    if (w.nranks != nranks) {
      bad = format("rank %d joined with nranks=%d, but rank 0 made the communicator with nranks=%d", w.rank, w.nranks,
                   nranks);
    } else if (w.rank < 0 || w.rank >= nranks) {
      bad = format("rank %d is out of range for %d rank%s", w.rank, nranks, plural(nranks));
    } else if (conns[w.rank]) {
      bad = format("rank %d joined twice", w.rank);
    } else {
      for (int r = 0; r < nranks && bad.empty(); r++) {
        if (conns[r] && w.device >= 0 && pids[r] == w.pid && devices[r] == w.device) {
          bad = format("Duplicate GPU detected: rank %d and rank %d both on device %d of process %d",
                       std::min(r, (int)w.rank), std::max(r, (int)w.rank), w.device, w.pid);
        }
      }
    }
    if (!bad.empty()) {
      // The communicator cannot form; nobody should wait for it.
      break_all(ncclInvalidUsage, bad);
      return refuse(ncclInvalidUsage, bad);
    }
    c->rank = w.rank;
    conns[w.rank] = c;
    hello_tag[w.rank] = w.tag;
    pids[w.rank] = w.pid;
    devices[w.rank] = w.device;
    if (++joined == nranks) {
      ready = true;
      for (int r = 0; r < nranks; r++) reply_to(r, hello_tag[r], ncclSuccess, nullptr);
      stop_listening();
    }
    return true;
  }

  void coll(int rank, const Msg& m) {
    if (broken) {
      reply_to(rank, m.h.tag, broken_code, text_body(broken_msg));
      return;
    }
    const uint64_t seq = next_seq[rank]++;
    Slot& s = slots[seq];
    if (s.in.empty()) {
      s.in.assign(nranks, false);
      s.hdr.resize(nranks);
      s.data.resize(nranks);
    }
    s.in[rank] = true;
    s.hdr[rank] = m.h;
    s.data[rank] = m.body;
    s.arrived++;
    for (int r = 0; r < nranks; r++) {
      if (gone[r] && !s.in[r]) {
        fail_slot(s, ncclRemoteError,
                  format("rank %d destroyed its communicator before it joined collective #%llu (%s)", r,
                         (unsigned long long)seq + 1, describe(m.h).c_str()));
        slots.erase(seq);
        return;
      }
    }
    if (s.arrived == nranks) {
      complete(seq, s);
      slots.erase(seq);
    }
  }

  void complete(uint64_t seq, Slot& s) {
    const unsigned long long num = (unsigned long long)seq + 1;
    for (int r = 0; r < nranks; r++) {
      if (s.hdr[r].status != 0) {
        fail_slot(s, ncclInvalidUsage,
                  format("rank %d's %s (collective #%llu) failed: %s", r,
                         s.hdr[r].kind >= 0 && s.hdr[r].kind < kNumColls ? kCollName[s.hdr[r].kind] : "collective",
                         num, s.data[r] ? s.data[r]->c_str() : ""));
        return;
      }
    }
    const Wire& w = s.hdr[0];
    std::string diff;
    for (int r = 1; r < nranks; r++) {
      const Wire& v = s.hdr[r];
      std::vector<const char*> what;
      if (v.kind != w.kind) {
        what.push_back("collective");
      } else {
        if (w.kind != kSplit && v.count != w.count) what.push_back("count");
        if (w.kind != kSplit && v.dtype != w.dtype) what.push_back("data type");
        if ((w.kind == kAllReduce || w.kind == kReduceScatter) && v.redop != w.redop) what.push_back("reduction");
        if (w.kind == kBroadcast && v.root != w.root) what.push_back("root");
      }
      if (what.empty()) continue;
      std::string list;
      for (size_t i = 0; i < what.size(); i++) list += (i ? ", " : "") + std::string(what[i]);
      diff += format("; rank %d called %s (%s differs)", r, describe(v).c_str(), list.c_str());
    }
    if (!diff.empty()) {
      fail_slot(s, ncclInvalidUsage,
                format("collective #%llu does not match across ranks: rank 0 called %s%s", num, describe(w).c_str(),
                       diff.c_str()));
      return;
    }
    if (w.kind == kSplit) {
      split(s);
      return;
    }
    if (w.kind < 0 || w.kind >= kNumColls || w.dtype < 0 || w.dtype >= ncclNumTypes ||
        ((w.kind == kAllReduce || w.kind == kReduceScatter) && (w.redop < 0 || w.redop >= ncclNumOps)) ||
        (w.kind == kBroadcast && (w.root < 0 || w.root >= nranks))) {
      fail_slot(s, ncclInternalError, format("collective #%llu arrived malformed: %s", num, describe(w).c_str()));
      return;
    }
    const size_t size = kTypeSize[w.dtype];
    const size_t chunk = (size_t)w.count * size;
    const size_t all = chunk * (size_t)nranks;
    for (int r = 0; r < nranks; r++) {
      size_t want = chunk;
      if (w.kind == kReduceScatter || w.kind == kAlltoAll) want = all;
      if (w.kind == kBroadcast && r != w.root) want = 0;
      if ((s.data[r] ? s.data[r]->size() : 0) != want) {
        fail_slot(s, ncclInternalError,
                  format("rank %d sent %zu bytes for %s, not %zu", r, s.data[r] ? s.data[r]->size() : 0,
                         describe(w).c_str(), want));
        return;
      }
    }
    // reduce combines bytes [off, off+len) of every rank's input in rank order.
    auto reduce = [&](size_t off, size_t len) {
      std::string out = s.data[0]->substr(off, len);
      for (int r = 1; r < nranks; r++) reduce_step(w.dtype, w.redop, &out[0], s.data[r]->data() + off, len / size);
      if (w.redop == kAvg) average(w.dtype, &out[0], len / size, nranks);
      return out;
    };
    switch (w.kind) {
      case kAllReduce: {
        Body b = std::make_shared<const std::string>(reduce(0, chunk));
        for (int r = 0; r < nranks; r++) reply_to(r, s.hdr[r].tag, ncclSuccess, b);
        break;
      }
      case kReduceScatter: {
        const std::string full = reduce(0, all);
        for (int r = 0; r < nranks; r++) {
          reply_to(r, s.hdr[r].tag, ncclSuccess, std::make_shared<const std::string>(full.substr(r * chunk, chunk)));
        }
        break;
      }
      case kAllGather: {
        auto out = std::make_shared<std::string>();
        out->reserve(all);
        for (int r = 0; r < nranks; r++) out->append(*s.data[r]);
        Body b = out;
        for (int r = 0; r < nranks; r++) reply_to(r, s.hdr[r].tag, ncclSuccess, b);
        break;
      }
      case kBroadcast: {
        Body b = s.data[w.root];
        for (int r = 0; r < nranks; r++) reply_to(r, s.hdr[r].tag, ncclSuccess, b);
        break;
      }
      case kAlltoAll: {
        for (int r = 0; r < nranks; r++) {
          auto out = std::make_shared<std::string>();
          out->reserve(all);
          for (int p = 0; p < nranks; p++) out->append(*s.data[p], r * chunk, chunk);
          reply_to(r, s.hdr[r].tag, ncclSuccess, out);
        }
        break;
      }
    }
  }

  // split answers ncclCommSplit: ranks of one color form a communicator,
  // ordered by key and then by their rank here, with a fresh id whose
  // hub the new rank 0 hosts.
  void split(Slot& s) {
    std::map<int, std::vector<std::pair<int, int>>> colors;  // color -> (key, rank)
    for (int r = 0; r < nranks; r++) {
      if (s.hdr[r].color != kNoColor) colors[s.hdr[r].color].push_back({s.hdr[r].key, r});
    }
    for (int r = 0; r < nranks; r++) {
      if (s.hdr[r].color == kNoColor) {
        Msg m;
        m.h.type = kReply;
        m.h.tag = s.hdr[r].tag;
        m.h.nranks = 0;
        push(conns[r], std::move(m));
      }
    }
    for (auto& [color, members] : colors) {
      std::sort(members.begin(), members.end());
      ncclUniqueId id;
      make_id(&id);
      Body b = std::make_shared<const std::string>(id.internal, sizeof id.internal);
      for (size_t i = 0; i < members.size(); i++) {
        const int r = members[i].second;
        Msg m;
        m.h.type = kReply;
        m.h.tag = s.hdr[r].tag;
        m.h.nranks = (int32_t)members.size();
        m.h.rank = (int32_t)i;
        m.body = b;
        push(conns[r], std::move(m));
      }
    }
  }

  // pair answers a receive with the send it pairs with.
  void pair(int from, int to, const Msg& sd, const Msg& rv, uint64_t num) {
    if (rv.h.status != 0) return;  // a receive that failed its checks consumes the send; nobody waits
    if (sd.h.status != 0) {
      reply_to(to, rv.h.tag, ncclInvalidUsage,
               text_body(format("ncclRecv on rank %d from rank %d: the matching ncclSend (#%llu from rank %d to "
                                "rank %d) failed: %s",
                                to, from, (unsigned long long)num, from, to, sd.text().c_str())));
      return;
    }
    if (sd.h.count != rv.h.count || sd.h.dtype != rv.h.dtype) {
      reply_to(to, rv.h.tag, ncclInvalidUsage,
               text_body(format("ncclRecv on rank %d expects %llu x %s from rank %d, but the ncclSend it pairs with "
                                "(#%llu from rank %d to rank %d) has %llu x %s; sends and receives between two ranks "
                                "pair up in the order they are issued",
                                to, (unsigned long long)rv.h.count, type_name(rv.h.dtype), from,
                                (unsigned long long)num, from, to, (unsigned long long)sd.h.count,
                                type_name(sd.h.dtype))));
      return;
    }
    reply_to(to, rv.h.tag, ncclSuccess, sd.body);
  }

  void send(int rank, Msg m) {
    const Wire w = m.h;
    if (broken) {
      reply_to(rank, w.tag, broken_code, text_body(broken_msg));
      return;
    }
    const int to = w.peer;
    if (to < 0 || to >= nranks) {
      reply_to(rank, w.tag, ncclInvalidArgument, text_body(format("peer %d does not exist", to)));
      return;
    }
    const auto key = std::make_pair(rank, to);
    const uint64_t num = ++sent[key];
    auto& waiting = recvs[key];
    if (!waiting.empty()) {
      Msg rv = std::move(waiting.front());
      waiting.pop_front();
      pair(rank, to, m, rv, num);
    } else if (gone[to]) {
      reply_to(rank, w.tag, ncclRemoteError,
               text_body(format("rank %d destroyed its communicator; the ncclSend from rank %d to it is never "
                                "received",
                                to, rank)));
      return;
    } else {
      m.h.key = (int32_t)num;  // remembered for messages
      sends[key].push_back(std::move(m));
    }
    reply_to(rank, w.tag, ncclSuccess, nullptr);
  }

  void recv(int rank, Msg m) {
    if (broken) {
      reply_to(rank, m.h.tag, broken_code, text_body(broken_msg));
      return;
    }
    const int from = m.h.peer;
    if (from < 0 || from >= nranks) {
      reply_to(rank, m.h.tag, ncclInvalidArgument, text_body(format("peer %d does not exist", from)));
      return;
    }
    const auto key = std::make_pair(from, rank);
    auto& queued = sends[key];
    if (!queued.empty()) {
      Msg sd = std::move(queued.front());
      queued.pop_front();
      pair(from, rank, sd, m, (uint64_t)sd.h.key);
    } else if (gone[from]) {
      reply_to(rank, m.h.tag, ncclRemoteError,
               text_body(format("rank %d destroyed its communicator; no send from it is left for rank %d's ncclRecv",
                                from, rank)));
    } else {
      recvs[key].push_back(std::move(m));
    }
  }

  // bye handles a rank leaving on purpose.
  void bye(int rank, bool aborted) {
    if (broken) return;
    if (aborted) {
      break_all(ncclRemoteError, format("rank %d called ncclCommAbort", rank));
      return;
    }
    if (!ready) {
      break_all(ncclRemoteError, format("rank %d destroyed its communicator before all ranks joined", rank));
      return;
    }
    gone[rank] = 1;
    for (auto it = slots.begin(); it != slots.end();) {
      Slot& s = it->second;
      if (!s.in[rank]) {
        const Wire* w = nullptr;
        for (int r = 0; r < nranks && !w; r++) {
          if (s.in[r]) w = &s.hdr[r];
        }
        fail_slot(s, ncclRemoteError,
                  format("rank %d destroyed its communicator before it joined collective #%llu (%s)", rank,
                         (unsigned long long)it->first + 1, w ? describe(*w).c_str() : "?"));
        it = slots.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [key, waiting] : recvs) {
      if (key.first != rank) continue;
      for (const Msg& rv : waiting) {
        if (rv.h.status != 0) continue;
        reply_to(key.second, rv.h.tag, ncclRemoteError,
                 text_body(format("rank %d destroyed its communicator; no send from it is left for rank %d's "
                                  "ncclRecv",
                                  rank, key.second)));
      }
      waiting.clear();
    }
  }

  // lost handles a connection that closed without a goodbye.
  void lost(int rank) {
    if (rank < 0 || broken || gone[rank]) return;
    if (!ready) {
      break_all(ncclRemoteError,
                format("rank %d (process %d) disconnected before all ranks joined: its process exited, was killed, or "
                       "gave up waiting",
                       rank, pids[rank]));
      return;
    }
    break_all(ncclRemoteError,
              format("rank %d (process %d) lost its connection without ncclCommDestroy: its process exited or was "
                     "killed",
                     rank, pids[rank]));
  }
};

void serve(std::shared_ptr<Hub> hub, std::shared_ptr<Conn> c) {
  std::thread writer;
  if (start(&writer, [c] { write_loop(c); })) writer.detach();
  Msg m;
  bool said_bye = false;
  bool ok = read_msg(c->fd, &m) && m.h.type == kHello;
  if (ok) {
    std::lock_guard<std::mutex> g(hub->mu);
    ok = hub->hello(c, m);
  }
  while (ok && read_msg(c->fd, &m)) {
    std::lock_guard<std::mutex> g(hub->mu);
    switch (m.h.type) {
      case kColl:
        hub->coll(c->rank, m);
        break;
      case kSend:
        hub->send(c->rank, std::move(m));
        break;
      case kRecv:
        hub->recv(c->rank, std::move(m));
        break;
      case kBye:
        hub->bye(c->rank, m.h.status != 0);
        said_bye = true;
        ok = false;
        break;
      default:
        hub->break_all(ncclInternalError, format("rank %d sent a message of unknown type %u", c->rank, m.h.type));
        ok = false;
    }
  }
  {
    std::lock_guard<std::mutex> g(hub->mu);
    if (c->rank >= 0 && hub->conns[c->rank] == c) {
      if (!said_bye) hub->lost(c->rank);
      hub->closed[c->rank] = 1;
      hub->left.notify_all();
    }
    if (--hub->open_conns == 0) {
      // Everyone who came has left: a communicator that never formed
      // never will, and one that did needs no more listening.
      if (!hub->ready) hub->break_all(ncclRemoteError, "every rank that joined has left");
      hub->stop_listening();
    }
  }
  std::lock_guard<std::mutex> g(c->mu);
  c->closing = true;  // the writer sends what is queued, then ends
  c->cv.notify_one();
}

void accept_loop(std::shared_ptr<Hub> hub) {
  for (;;) {
    pollfd p[2] = {{hub->listen_fd, POLLIN, 0}, {hub->wake[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break;
    if (!p[0].revents) continue;
    int fd = accept4(hub->listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up between poll and accept
    auto c = std::make_shared<Conn>(fd);
    {
      std::lock_guard<std::mutex> g(hub->mu);
      if (!hub->listening) break;
      hub->open_conns++;
    }
    std::thread t;
    if (start(&t, [hub, c] { serve(hub, c); })) {
      t.detach();
    } else {
      std::lock_guard<std::mutex> g(hub->mu);
      hub->open_conns--;
    }
  }
  std::lock_guard<std::mutex> g(hub->mu);
  close(hub->listen_fd);  // frees the name for the id's next use
  hub->listen_fd = -1;
}

// host_hub starts the hub of the communicator named name.
ncclResult_t host_hub(const char* fn, const std::string& name, int nranks, std::shared_ptr<Hub>* out) {
  auto hub = std::make_shared<Hub>(name, nranks);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return fail(ncclSystemError, fn, "socket: %s", strerror(errno));
  sockaddr_un a;
  const socklen_t len = socket_address(name, &a);
  if (bind(fd, (sockaddr*)&a, len) != 0) {
    const int e = errno;
    close(fd);
    if (e == EADDRINUSE) {
      return fail(ncclInvalidUsage, fn,
                  "the unique id is in use by a communicator that is still forming (an id makes one communicator)");
    }
    return fail(ncclSystemError, fn, "bind: %s", strerror(e));
  }
  if (listen(fd, 128) != 0) {
    const int e = errno;
    close(fd);
    return fail(ncclSystemError, fn, "listen: %s", strerror(e));
  }
  hub->listen_fd = fd;
  if (pipe2(hub->wake, O_CLOEXEC) != 0) return fail(ncclSystemError, fn, "pipe: %s", strerror(errno));
  std::thread t;
  if (!start(&t, [hub] { accept_loop(hub); })) return fail(ncclSystemError, fn, "cannot start the hub's thread");
  t.detach();
  *out = hub;
  return ncclSuccess;
}

// ---------------------------------------------------------------------------
// Communicators: one rank's side

struct Comm {
  int nranks = 0;  // 0 until a split in a group completes
  int rank = -1;
  int device = -1;   // -1: unknown (the fake driver is not loaded)
  std::string name;  // the hub's socket name
  std::shared_ptr<Hub> hub;  // the hub this rank hosts (rank 0)
  std::atomic<int> fd{-1};   // set while joining, which an abort may race
  std::thread reader;
  std::timed_mutex wmu;  // one writer at a time

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::map<uint64_t, Msg> replies;  // arrived, not yet taken
  std::set<uint64_t> waiting;       // requests whose reply someone will take
  uint64_t next_tag = 1;
  uint64_t hello_tag = 0;
  int async = ncclSuccess;
  std::string async_msg;
  bool joined = false, aborted = false, closing = false;

  int active = 0;  // calls in progress; guarded by G().mu
};

// set_async records the first error that makes c unusable. c->mu is held.
void set_async(Comm* c, int code, const std::string& msg) {
  if (c->async != ncclSuccess) return;
  c->async = code;
  c->async_msg = msg;
  c->cv.notify_all();
}

void read_loop(Comm* c) {
  Msg m;
  while (read_msg(c->fd, &m)) {
    std::lock_guard<std::mutex> g(c->mu);
    if (m.h.type == kReply) {
      if (c->waiting.count(m.h.tag)) {
        c->replies[m.h.tag] = std::move(m);
        c->cv.notify_all();
      }
    } else if (m.h.type == kBroken) {
      set_async(c, m.h.status, m.text());
    }
    m = Msg();
  }
  std::lock_guard<std::mutex> g(c->mu);
  if (!c->closing && !c->aborted) {
    set_async(c, ncclRemoteError,
              "lost the connection to the communicator's hub: rank 0's process exited or was killed");
  }
  c->cv.notify_all();
}

// Guard counts a call in progress on a communicator, which keeps
// ncclCommDestroy/Abort from freeing it underneath.
struct Guard {
  Comm* c = nullptr;
  Guard() = default;
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  ~Guard() {
    if (!c) return;
    std::lock_guard<std::mutex> g(G().mu);
    if (--c->active == 0) G().idle.notify_all();
  }
};

ncclResult_t acquire(const char* fn, Comm* c, Guard* guard) {
  {
    std::lock_guard<std::mutex> g(G().mu);
    if (G().live.count(c)) {
      c->active++;
      guard->c = c;
      return ncclSuccess;
    }
  }
  return fail(ncclInvalidArgument, fn, "%p is not a live communicator", (void*)c);
}

Comm* new_comm(int nranks, int rank, int device, const std::string& name) {
  Comm* c = new Comm;
  c->nranks = nranks;
  c->rank = rank;
  c->device = device;
  c->name = name;
  std::lock_guard<std::mutex> g(G().mu);
  G().live.insert(c);
  return c;
}

// close_comm ends c: blocked calls wake, the hub hears that c left (on
// purpose, or aborted), and c is freed once no call uses it. It returns
// ncclInvalidArgument for a communicator that is not live, and
// ncclSystemError (with *why) when the ranks of other processes did not
// leave the hub that c hosts in time; c is freed then too.
ncclResult_t close_comm(Comm* c, bool aborted, std::string* why) {
  {
    std::lock_guard<std::mutex> g(G().mu);
    if (!G().live.erase(c)) {
      *why = format("%p is not a live communicator", (void*)c);
      return ncclInvalidArgument;
    }
  }
  {
    std::lock_guard<std::mutex> g(c->mu);
    (aborted ? c->aborted : c->closing) = true;
    c->cv.notify_all();
  }
  if (c->fd >= 0) {
    // A thread stuck writing a huge request must not hold up an abort.
    if (c->wmu.try_lock_for(std::chrono::seconds(1))) {
      Wire w{};
      w.type = kBye;
      w.status = aborted ? 1 : 0;
      write_msg(c->fd, w, nullptr, 0);
      c->wmu.unlock();
    }
    shutdown(c->fd, SHUT_RDWR);  // wakes the reader, and any writer
  }
  ncclResult_t result = ncclSuccess;
  if (c->hub && !aborted) {
    // Ranks in other processes may still need the hub (sends buffered
    // there, their own exchanges): the hub lives in this process, so its
    // host leaves last, as NCCL's destroy is an intra-node collective.
    // Ranks of this process are not waited for: one thread may destroy
    // its ranks one after the other.
    const double secs = timeout_seconds();
    Hub& h = *c->hub;
    std::unique_lock<std::mutex> l(h.mu);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(secs));
    if (!h.left.wait_until(l, deadline, [&] { return h.broken || h.others_open().empty(); })) {
      result = ncclSystemError;
      *why = format("rank 0 timed out after %g s waiting for rank(s) %s of other processes to leave the "
                    "communicator it hosts (GCOMPILE_FAKEGPU_NCCL_TIMEOUT); they lose it now",
                    secs, h.others_open().c_str());
    }
  }
  {
    std::unique_lock<std::mutex> l(G().mu);
    G().idle.wait(l, [&] { return c->active == 0; });
  }
  // A join that raced the abort may have connected since: its reader
  // must wake too.
  if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  if (c->reader.joinable()) c->reader.join();
  if (c->fd >= 0) close(c->fd);
  delete c;
  return result;
}

// post sends a request to c's hub. With want_reply, the reply is kept for
// wait_reply(*tag); otherwise it is dropped when it comes.
ncclResult_t post(Comm* c, const char* fn, Wire w, const void* body, size_t n, bool want_reply, uint64_t* tag) {
  {
    std::unique_lock<std::mutex> l(c->mu);
    std::string why;
    int code = ncclSuccess;
    if (c->aborted) {
      code = ncclSystemError;
      why = format("aborted: ncclCommAbort was called on rank %d's communicator", c->rank);
    } else if (c->closing) {
      code = ncclInvalidUsage;
      why = format("rank %d's communicator is being destroyed", c->rank);
    } else if (c->async != ncclSuccess) {
      code = c->async;
      why = c->async_msg;
    } else if (c->fd < 0) {
      code = ncclInvalidUsage;
      why = format("rank %d's communicator has not joined its peers (its ncclGroupEnd has not run)", c->rank);
    }
    if (code != ncclSuccess) {
      l.unlock();
      return fail(code, fn, "%s", why.c_str());
    }
    w.tag = c->next_tag++;
    if (want_reply) c->waiting.insert(w.tag);
  }
  bool ok;
  {
    std::lock_guard<std::timed_mutex> g(c->wmu);
    ok = write_msg(c->fd, w, body, n);
  }
  if (!ok) {
    std::unique_lock<std::mutex> l(c->mu);
    c->waiting.erase(w.tag);
    if (!c->aborted && !c->closing) {
      set_async(c, ncclRemoteError,
                "lost the connection to the communicator's hub: rank 0's process exited or was killed");
    }
    const std::string why = c->aborted ? std::string("aborted: ncclCommAbort was called") : c->async_msg;
    const int code = c->aborted ? ncclSystemError : c->async;
    l.unlock();
    return fail(code ? code : ncclRemoteError, fn, "%s", why.c_str());
  }
  if (tag) *tag = w.tag;
  return ncclSuccess;
}

// wait_reply waits for the reply to request tag. ncclSuccess means it came
// (its own status may be an error); otherwise the wait ended for the reason
// recorded.
ncclResult_t wait_reply(Comm* c, uint64_t tag, const char* fn, const std::string& what, Msg* out) {
  const double secs = timeout_seconds();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(secs));
  std::unique_lock<std::mutex> l(c->mu);
  for (;;) {
    auto it = c->replies.find(tag);
    if (it != c->replies.end()) {
      *out = std::move(it->second);
      c->replies.erase(it);
      c->waiting.erase(tag);
      return ncclSuccess;
    }
    int code = ncclSuccess;
    std::string why;
    if (c->aborted) {
      code = ncclSystemError;
      why = format("aborted: ncclCommAbort was called on rank %d's communicator while it waited for %s", c->rank,
                   what.c_str());
    } else if (c->closing) {
      code = ncclInvalidUsage;
      why = format("ncclCommDestroy was called on rank %d's communicator while it waited for %s", c->rank,
                   what.c_str());
    } else if (c->async != ncclSuccess) {
      code = c->async;
      why = format("%s (rank %d was waiting for %s)", c->async_msg.c_str(), c->rank, what.c_str());
    } else if (std::chrono::steady_clock::now() >= deadline) {
      code = ncclSystemError;
      why = format("rank %d timed out after %g s waiting for %s (GCOMPILE_FAKEGPU_NCCL_TIMEOUT); the communicator "
                   "is unusable now",
                   c->rank, secs, what.c_str());
      set_async(c, code, why);
    }
    if (code != ncclSuccess) {
      c->waiting.erase(tag);
      l.unlock();
      return fail(code, fn, "%s", why.c_str());
    }
    c->cv.wait_until(l, deadline);
  }
}

// connect_hub connects c to its hub, retrying while rank 0 has yet to
// listen.
ncclResult_t connect_hub(Comm* c, const char* fn) {
  const double secs = timeout_seconds();
  const auto start_time = std::chrono::steady_clock::now();
  sockaddr_un a;
  const socklen_t len = socket_address(c->name, &a);
  int delay_ms = 1;
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(ncclSystemError, fn, "socket: %s", strerror(errno));
    if (connect(fd, (sockaddr*)&a, len) == 0) {
      c->fd = fd;
      return ncclSuccess;
    }
    const int e = errno;
    close(fd);
    if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) {
      return fail(ncclSystemError, fn, "rank %d: connect to rank 0's hub: %s", c->rank, strerror(e));
    }
    {
      std::lock_guard<std::mutex> g(c->mu);
      if (c->aborted || c->closing) {
        return fail(c->aborted ? ncclSystemError : ncclInvalidUsage, fn,
                    "%s was called on rank %d's communicator while it waited for rank 0 to create the communicator",
                    c->aborted ? "aborted: ncclCommAbort" : "ncclCommDestroy", c->rank);
      }
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    if (waited >= secs) {
      return fail(ncclSystemError, fn,
                  "rank %d timed out after %g s waiting for rank 0 of its communicator to call ncclCommInitRank "
                  "(GCOMPILE_FAKEGPU_NCCL_TIMEOUT)",
                  c->rank, secs);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    delay_ms = std::min(delay_ms * 2, 20);
  }
}

// start_join connects c and says hello; finish_join waits until every rank
// has. Rank 0 hosts the hub before either.
ncclResult_t start_join(Comm* c, const char* fn) {
  if (ncclResult_t r = connect_hub(c, fn)) return r;
  if (!start(&c->reader, [c] { read_loop(c); })) {
    return fail(ncclSystemError, fn, "cannot start rank %d's reader thread", c->rank);
  }
  Wire w{};
  w.type = kHello;
  w.nranks = c->nranks;
  w.rank = c->rank;
  w.pid = getpid();
  w.device = c->device;
  return post(c, fn, w, nullptr, 0, true, &c->hello_tag);
}

ncclResult_t finish_join(Comm* c, const char* fn) {
  Msg m;
  const std::string what = format("all %d rank%s to join the communicator", c->nranks, plural(c->nranks));
  if (ncclResult_t r = wait_reply(c, c->hello_tag, fn, what, &m)) return r;
  if (m.h.status != ncclSuccess) return fail(m.h.status, fn, "%s", m.text().c_str());
  std::lock_guard<std::mutex> g(c->mu);
  c->joined = true;
  return ncclSuccess;
}

// ---------------------------------------------------------------------------
// Operations and groups

// Op is one call, run at once or at the outermost ncclGroupEnd.
struct Op {
  enum Kind { kInitOp, kCollOp, kSendOp, kRecvOp } kind;
  const char* fn;
  Comm* comm;
  int coll = -1;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t count = 0;
  int dtype = 0, redop = 0, root = 0, peer = 0, color = 0, key = 0;
  size_t in_bytes = 0, out_bytes = 0;
  bool poisoned = false;  // failed its checks: posted only so peers fail too
  std::string why;
  Comm* child = nullptr;  // ncclCommSplit's new communicator
  // Progress at ncclGroupEnd.
  bool failed = false, self = false, posted = false, split_done = false;
  uint64_t tag = 0;
};

// Groups are per thread, as in NCCL.
thread_local int group_depth = 0;
thread_local std::vector<Op> queued;

// Outcome keeps the first error of a group; that one is the call's result
// and the latest error.
struct Outcome {
  ncclResult_t code = ncclSuccess;
  std::string msg;
  void note(ncclResult_t r) {
    if (r != ncclSuccess && code == ncclSuccess) {
      code = r;
      msg = thread_error;
    }
  }
  ncclResult_t finish() { return code == ncclSuccess ? ncclSuccess : record(code, msg); }
};

std::string waiting_for(const Op& o) {
  const char* type = type_name(o.dtype);
  switch (o.kind) {
    case Op::kSendOp:
      return format("its hub to take its ncclSend of %zu x %s to rank %d", o.count, type, o.peer);
    case Op::kRecvOp:
      return format("a send from rank %d (ncclRecv of %zu x %s)", o.peer, o.count, type);
    case Op::kCollOp:
      if (o.coll == kSplit) return "every rank to call ncclCommSplit";
      return format("every rank to call %s (count %zu, %s)", kCollName[o.coll], o.count, type);
    case Op::kInitOp:
      break;
  }
  return "its communicator to form";
}

ncclResult_t post_op(Op& o) {
  Wire w{};
  w.type = o.kind == Op::kSendOp ? kSend : o.kind == Op::kRecvOp ? kRecv : kColl;
  w.kind = o.coll;
  w.count = o.count;
  w.dtype = o.dtype;
  w.redop = o.redop;
  w.root = o.root;
  w.peer = o.peer;
  w.color = o.color;
  w.key = o.key;
  if (o.poisoned) {
    w.status = 1;
    return post(o.comm, o.fn, w, o.why.data(), o.why.size(), false, nullptr);
  }
  const void* body = nullptr;
  size_t n = 0;
  if (o.kind == Op::kSendOp || (o.kind == Op::kCollOp && o.coll != kSplit)) {
    body = o.sendbuf;
    n = o.in_bytes;
  }
  ncclResult_t r = post(o.comm, o.fn, w, body, n, true, &o.tag);
  o.posted = r == ncclSuccess;
  return r;
}

ncclResult_t finish_op(Op& o) {
  Msg m;
  if (ncclResult_t r = wait_reply(o.comm, o.tag, o.fn, waiting_for(o), &m)) return r;
  if (m.h.status != ncclSuccess) return fail(m.h.status, o.fn, "%s", m.text().c_str());
  if (o.kind == Op::kCollOp && o.coll == kSplit) {
    if (m.h.nranks == 0) return ncclSuccess;  // NCCL_SPLIT_NOCOLOR
    ncclUniqueId id;
    std::string name;
    if (m.size() != sizeof id.internal) return fail(ncclInternalError, o.fn, "the hub sent a malformed id");
    memcpy(id.internal, m.body->data(), sizeof id.internal);
    if (!o.child || !parse_id(id, &name)) return fail(ncclInternalError, o.fn, "the hub sent a malformed id");
    o.child->nranks = m.h.nranks;
    o.child->rank = m.h.rank;
    o.child->name = name;
    o.split_done = true;
    return ncclSuccess;
  }
  if (o.kind == Op::kSendOp) return ncclSuccess;
  if (m.size() != o.out_bytes) {
    return fail(ncclInternalError, o.fn, "the hub sent %zu bytes for a %zu-byte result", m.size(), o.out_bytes);
  }
  if (o.out_bytes > 0) memcpy(o.recvbuf, m.body->data(), o.out_bytes);
  return ncclSuccess;
}

// join_all makes the communicators of comms join their peers: every hub
// first, so that ranks of one communicator in this very group can connect,
// then hellos, then the waits. A communicator that fails to join keeps the
// error for its later calls.
void join_all(const std::vector<std::pair<Comm*, const char*>>& comms, Outcome* out) {
  std::vector<bool> bad(comms.size());
  auto note = [&](size_t i, ncclResult_t r) {
    if (r == ncclSuccess) return;
    bad[i] = true;
    out->note(r);
    std::lock_guard<std::mutex> g(comms[i].first->mu);
    set_async(comms[i].first, r, thread_error);
  };
  for (size_t i = 0; i < comms.size(); i++) {
    Comm* c = comms[i].first;
    if (c->rank == 0) note(i, host_hub(comms[i].second, c->name, c->nranks, &c->hub));
  }
  for (size_t i = 0; i < comms.size(); i++) {
    if (!bad[i]) note(i, start_join(comms[i].first, comms[i].second));
  }
  for (size_t i = 0; i < comms.size(); i++) {
    if (!bad[i]) note(i, finish_join(comms[i].first, comms[i].second));
  }
}

ncclResult_t run(std::vector<Op>& ops) {
  Outcome out;
  std::vector<Guard> guards(ops.size());
  for (size_t i = 0; i < ops.size(); i++) {
    if (ncclResult_t r = acquire(ops[i].fn, ops[i].comm, &guards[i])) {
      ops[i].failed = true;
      out.note(r);
    }
  }

  // Communicators made in this group join first.
  std::vector<std::pair<Comm*, const char*>> joins;
  for (Op& o : ops) {
    if (o.kind == Op::kInitOp && !o.failed) joins.push_back({o.comm, o.fn});
  }
  join_all(joins, &out);

  // Sends and receives between a rank and itself pair up here, in order.
  bool local_failure = false;
  std::map<Comm*, std::pair<std::vector<Op*>, std::vector<Op*>>> self;
  for (Op& o : ops) {
    if ((o.kind == Op::kSendOp || o.kind == Op::kRecvOp) && !o.failed && !o.poisoned && o.peer == o.comm->rank) {
      o.self = true;
      (o.kind == Op::kSendOp ? self[o.comm].first : self[o.comm].second).push_back(&o);
    }
  }
  for (auto& [c, sr] : self) {
    auto& [sends, recvs] = sr;
    if (sends.size() != recvs.size()) {
      out.note(fail(ncclInvalidUsage, "ncclGroupEnd", "the group has %zu send(s) to rank %d and %zu receive(s) from it",
                    sends.size(), c->rank, recvs.size()));
      local_failure = true;
      continue;
    }
    for (size_t k = 0; k < sends.size(); k++) {
      if (sends[k]->in_bytes != recvs[k]->out_bytes) {
        out.note(fail(ncclInvalidUsage, "ncclGroupEnd", "send %zu has %zu bytes but the matching receive expects %zu",
                      k, sends[k]->in_bytes, recvs[k]->out_bytes));
        local_failure = true;
        break;
      }
    }
  }
  if (local_failure) {
    // Nothing runs, but peers hear of it rather than wait.
    for (Op& o : ops) {
      if (!o.poisoned && (o.kind == Op::kCollOp || ((o.kind == Op::kSendOp || o.kind == Op::kRecvOp) && !o.self))) {
        o.poisoned = true;
        o.why = "its group failed: " + out.msg;
      }
    }
  } else {
    for (auto& [c, sr] : self) {
      for (size_t k = 0; k < sr.first.size(); k++) {
        const Op* s = sr.first[k];
        Op* r = sr.second[k];
        if (r->out_bytes > 0 && r->recvbuf != s->sendbuf) memmove(r->recvbuf, s->sendbuf, r->out_bytes);
      }
    }
  }

  // Every send is posted before anything waits, and everything is posted
  // before the first wait, so ranks driven by this thread do not wait on
  // each other.
  for (int pass = 0; pass < 2; pass++) {
    for (Op& o : ops) {
      if (o.failed || o.self || o.kind == Op::kInitOp) continue;
      if ((pass == 0) != (o.kind == Op::kSendOp)) continue;
      if (ncclResult_t r = post_op(o)) {
        o.failed = true;
        out.note(r);
      }
    }
  }
  for (Op& o : ops) {
    if (o.posted) out.note(finish_op(o));
  }

  // Communicators split off in this group join last.
  std::vector<std::pair<Comm*, const char*>> children;
  for (Op& o : ops) {
    if (o.split_done) children.push_back({o.child, o.fn});
  }
  join_all(children, &out);
  for (Op& o : ops) {
    if (o.child && !o.split_done) {
      // The split failed: the new communicator will not form.
      std::lock_guard<std::mutex> g(o.child->mu);
      set_async(o.child, out.code ? out.code : ncclInternalError,
                "the ncclCommSplit that made this communicator failed: " + out.msg);
    }
  }
  return out.finish();
}

// issue runs o now, or queues it inside a group.
ncclResult_t issue(Op o) {
  if (group_depth > 0) {
    queued.push_back(std::move(o));
    return ncclSuccess;
  }
  std::vector<Op> ops;
  ops.push_back(std::move(o));
  return run(ops);
}

// reject returns a failed check's error, after telling the peers: a
// poisoned copy of the call takes its place in the sequence.
ncclResult_t reject(Op o, ncclResult_t code, const std::string& why) {
  o.poisoned = true;
  o.why = why;
  bool joined;
  {
    std::lock_guard<std::mutex> g(o.comm->mu);
    joined = o.comm->joined;
  }
  if (group_depth > 0) {
    queued.push_back(o);
  } else if (joined) {
    std::vector<Op> ops;
    ops.push_back(o);
    Outcome ignored;
    ignored.note(run(ops));
  }
  return record(code, std::string(o.fn) + ": " + why);
}

bool sizes(int type, size_t count, size_t times, size_t* bytes) {
  const size_t per = kTypeSize[type];
  if (times != 0 && count > SIZE_MAX / per / times) return false;
  *bytes = count * per * times;
  return true;
}

// ready_comm refuses a communicator whose rank is still unknown (a split
// queued in this group).
ncclResult_t ready_comm(const char* fn, Comm* c) {
  if (c->nranks > 0) return ncclSuccess;
  return fail(ncclInvalidUsage, fn,
              "the communicator from ncclCommSplit is not ready until the ncclGroupEnd of its group");
}

ncclResult_t collective(const char* fn, int coll, const void* send, void* recv, size_t count, int type, int op,
                        int root, Comm* c) {
  Guard g;
  if (ncclResult_t r = acquire(fn, c, &g)) return r;
  if (ncclResult_t r = ready_comm(fn, c)) return r;
  Op o{Op::kCollOp, fn, c};
  o.coll = coll;
  o.sendbuf = send;
  o.recvbuf = recv;
  o.count = count;
  o.dtype = type;
  o.redop = op;
  o.root = root;
  const bool reduces = coll == kAllReduce || coll == kReduceScatter;
  if (type < 0 || type >= ncclNumTypes) return reject(o, ncclInvalidArgument, format("unknown data type %d", type));
  if (reduces && (op < 0 || op >= ncclNumOps)) {
    return reject(o, ncclInvalidArgument, format("unknown reduction %d", op));
  }
  if (reduces && (type == kFp8E4M3 || type == kFp8E5M2)) {
    return reject(o, ncclInvalidArgument,
                  format("the fake GPU's NCCL moves %s data but does not reduce it", kTypeName[type]));
  }
  const size_t n = (size_t)c->nranks;
  bool ok = true;
  switch (coll) {
    case kAllReduce:
    case kBroadcast:
      ok = sizes(type, count, 1, &o.in_bytes) && sizes(type, count, 1, &o.out_bytes);
      break;
    case kReduceScatter:
      ok = sizes(type, count, n, &o.in_bytes) && sizes(type, count, 1, &o.out_bytes);
      break;
    case kAllGather:
      ok = sizes(type, count, 1, &o.in_bytes) && sizes(type, count, n, &o.out_bytes);
      break;
    case kAlltoAll:
      ok = sizes(type, count, n, &o.in_bytes) && sizes(type, count, n, &o.out_bytes);
      break;
  }
  if (!ok) return reject(o, ncclInvalidArgument, format("count %zu overflows", count));
  if (coll == kBroadcast) {
    if (root < 0 || root >= c->nranks) {
      return reject(o, ncclInvalidArgument,
                    format("root %d does not exist in a communicator of %d rank%s", root, c->nranks,
                           plural(c->nranks)));
    }
    if (c->rank != root) o.in_bytes = 0;  // only the root's send buffer is read
  }
  if (o.out_bytes > 0 && !recv) return reject(o, ncclInvalidArgument, "NULL receive buffer");
  if (o.in_bytes > 0 && !send) return reject(o, ncclInvalidArgument, "NULL send buffer");
  std::string why;
  if (!check_buffer("send buffer", send, o.in_bytes, c->device, &why) ||
      !check_buffer("receive buffer", recv, o.out_bytes, c->device, &why)) {
    return reject(o, ncclInvalidArgument, why);
  }
  return issue(o);
}

ncclResult_t p2p(const char* fn, bool is_send, void* buf, size_t count, int type, int peer, Comm* c) {
  Guard g;
  if (ncclResult_t r = acquire(fn, c, &g)) return r;
  if (ncclResult_t r = ready_comm(fn, c)) return r;
  if (peer < 0 || peer >= c->nranks) {
    return fail(ncclInvalidArgument, fn, "peer %d does not exist in a communicator of %d rank%s", peer, c->nranks,
                plural(c->nranks));
  }
  Op o{is_send ? Op::kSendOp : Op::kRecvOp, fn, c};
  o.count = count;
  o.dtype = type;
  o.peer = peer;
  if (is_send) {
    o.sendbuf = buf;
  } else {
    o.recvbuf = buf;
  }
  const bool self = peer == c->rank;
  // Sends and receives with oneself never reach the hub, so there is no one
  // to tell about a failure.
  auto refuse = [&](ncclResult_t code, const std::string& why) {
    return self ? fail(code, fn, "%s", why.c_str()) : reject(o, code, why);
  };
  if (type < 0 || type >= ncclNumTypes) return refuse(ncclInvalidArgument, format("unknown data type %d", type));
  size_t bytes = 0;
  if (!sizes(type, count, 1, &bytes)) return refuse(ncclInvalidArgument, format("count %zu overflows", count));
  (is_send ? o.in_bytes : o.out_bytes) = bytes;
  if (bytes > 0 && !buf) return refuse(ncclInvalidArgument, is_send ? "NULL send buffer" : "NULL receive buffer");
  std::string why;
  if (!check_buffer(is_send ? "send buffer" : "receive buffer", buf, bytes, c->device, &why)) {
    return refuse(ncclInvalidArgument, why);
  }
  if (self && group_depth == 0) {
    return fail(ncclInvalidUsage, fn,
                "a send or receive between rank %d and itself outside ncclGroupStart/ncclGroupEnd never completes",
                c->rank);
  }
  return issue(o);
}

ncclResult_t init_rank(const char* fn, Comm** comm, int nranks, const ncclUniqueId& id, int rank) {
  if (!comm) return fail(ncclInvalidArgument, fn, "NULL output");
  if (nranks < 1) return fail(ncclInvalidArgument, fn, "nranks %d is not positive", nranks);
  if (rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, fn, "rank %d is out of range for %d rank%s", rank, nranks, plural(nranks));
  }
  std::string name;
  if (!parse_id(id, &name)) return fail(ncclInvalidArgument, fn, "the unique id did not come from ncclGetUniqueId");
  Comm* c = new_comm(nranks, rank, calling_device(), name);
  if (group_depth > 0) {
    queued.push_back(Op{Op::kInitOp, fn, c});
    *comm = c;
    return ncclSuccess;
  }
  std::vector<Op> ops;
  ops.push_back(Op{Op::kInitOp, fn, c});
  if (ncclResult_t r = run(ops)) {
    // The peers hear that this rank gave up.
    const std::string msg = thread_error;
    std::string ignored;
    close_comm(c, true, &ignored);
    return record(r, msg);
  }
  *comm = c;
  return ncclSuccess;
}

// simple_call checks c for a call that neither communicates nor queues.
ncclResult_t simple_call(const char* fn, Comm* c, const void* out, Guard* g) {
  if (ncclResult_t r = acquire(fn, c, g)) return r;
  if (!out) return fail(ncclInvalidArgument, fn, "NULL output");
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
  if (!v) return fail(ncclInvalidArgument, "ncclGetVersion", "NULL output");
  *v = 22803;  // 2.28.3
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId", "NULL output");
  make_id(id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(Comm** comm, int nranks, ncclUniqueId id, int rank) {
  return init_rank("ncclCommInitRank", comm, nranks, id, rank);
}

// Every rank's first id names the communicator; the others, which real NCCL
// spreads its bootstrap over, are not needed on one machine.
ncclResult_t ncclCommInitRankScalable(Comm** comm, int nranks, int rank, int nIds, ncclUniqueId* ids, void* config) {
  (void)config;
  const char* fn = "ncclCommInitRankScalable";
  if (nIds < 1 || nIds > nranks) {
    return fail(ncclInvalidArgument, fn, "nIds %d is not between 1 and nranks (%d)", nIds, nranks);
  }
  if (!ids) return fail(ncclInvalidArgument, fn, "NULL ids");
  return init_rank(fn, comm, nranks, ids[0], rank);
}

ncclResult_t ncclCommSplit(Comm* c, int color, int key, Comm** newcomm, void* config) {
  (void)config;
  const char* fn = "ncclCommSplit";
  Guard g;
  if (ncclResult_t r = acquire(fn, c, &g)) return r;
  if (ncclResult_t r = ready_comm(fn, c)) return r;
  Op o{Op::kCollOp, fn, c};
  o.coll = kSplit;
  o.color = color;
  o.key = key;
  if (!newcomm) return reject(o, ncclInvalidArgument, "NULL output");
  if (color < 0 && color != kNoColor) {
    return reject(o, ncclInvalidArgument, format("color %d is negative and not NCCL_SPLIT_NOCOLOR (-1)", color));
  }
  *newcomm = nullptr;
  if (color != kNoColor) o.child = new_comm(0, -1, c->device, "");
  Comm* child = o.child;
  if (group_depth > 0) {
    queued.push_back(o);
    *newcomm = child;
    return ncclSuccess;
  }
  std::vector<Op> ops;
  ops.push_back(o);
  if (ncclResult_t r = run(ops)) {
    if (child) {
      const std::string msg = thread_error;
      std::string ignored;
      close_comm(child, true, &ignored);
      record(r, msg);
    }
    return r;
  }
  *newcomm = child;
  return ncclSuccess;
}

// The rank that hosts the hub (rank 0) waits here until the ranks of other
// processes have left; see close_comm.
ncclResult_t ncclCommDestroy(Comm* c) {
  if (!c) return ncclSuccess;  // as NCCL
  std::string why;
  if (ncclResult_t r = close_comm(c, false, &why)) return fail(r, "ncclCommDestroy", "%s", why.c_str());
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(Comm* c) {
  if (!c) return ncclSuccess;  // as NCCL
  std::string why;
  if (ncclResult_t r = close_comm(c, true, &why)) return fail(r, "ncclCommAbort", "%s", why.c_str());
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(Comm* c, ncclResult_t* err) {
  Guard g;
  if (ncclResult_t r = simple_call("ncclCommGetAsyncError", c, err, &g)) return r;
  std::lock_guard<std::mutex> l(c->mu);
  *err = c->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(Comm* c, int* n) {
  Guard g;
  if (ncclResult_t r = simple_call("ncclCommCount", c, n, &g)) return r;
  if (ncclResult_t r = ready_comm("ncclCommCount", c)) return r;
  *n = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(Comm* c, int* rank) {
  Guard g;
  if (ncclResult_t r = simple_call("ncclCommUserRank", c, rank, &g)) return r;
  if (ncclResult_t r = ready_comm("ncclCommUserRank", c)) return r;
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(Comm* c, int* device) {
  Guard g;
  if (ncclResult_t r = simple_call("ncclCommCuDevice", c, device, &g)) return r;
  *device = c->device < 0 ? 0 : c->device;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, Comm* c, void* stream) {
  trace_call("ncclAllReduce", stream);
  return collective("ncclAllReduce", kAllReduce, send, recv, count, type, op, 0, c);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, int type, int op, Comm* c,
                               void* stream) {
  trace_call("ncclReduceScatter", stream);
  return collective("ncclReduceScatter", kReduceScatter, send, recv, recvcount, type, op, 0, c);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, int type, Comm* c, void* stream) {
  trace_call("ncclAllGather", stream);
  return collective("ncclAllGather", kAllGather, send, recv, sendcount, type, 0, 0, c);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int type, int root, Comm* c, void* stream) {
  trace_call("ncclBroadcast", stream);
  return collective("ncclBroadcast", kBroadcast, send, recv, count, type, 0, root, c);
}

ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, int type, Comm* c, void* stream) {
  trace_call("ncclAlltoAll", stream);
  return collective("ncclAlltoAll", kAlltoAll, send, recv, count, type, 0, 0, c);
}

ncclResult_t ncclSend(const void* send, size_t count, int type, int peer, Comm* c, void* stream) {
  trace_call("ncclSend", stream);
  return p2p("ncclSend", true, (void*)send, count, type, peer, c);
}

ncclResult_t ncclRecv(void* recv, size_t count, int type, int peer, Comm* c, void* stream) {
  trace_call("ncclRecv", stream);
  return p2p("ncclRecv", false, recv, count, type, peer, c);
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) {
    return fail(ncclInvalidUsage, "ncclGroupEnd", "no group is open (ncclGroupStart was not called)");
  }
  if (--group_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(queued);
  return run(ops);
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

// The message of the calling thread's most recent failure, else of the
// process's. The pointer stays valid on the calling thread until its next
// call.
const char* ncclGetLastError(Comm* c) {
  (void)c;
  thread_local std::string copy;
  if (!thread_error.empty()) {
    copy = thread_error;
  } else {
    std::lock_guard<std::mutex> g(G().mu);
    copy = G().last_error;
  }
  return copy.c_str();
}

}  // extern "C"
