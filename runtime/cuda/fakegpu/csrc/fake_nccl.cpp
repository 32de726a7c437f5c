// fake_nccl.cpp — libnccl.so.2 for machines without a GPU: communicators of
// one rank.
//
// Every exported function has the C prototype of the NCCL entry point it is
// named after. With one rank every collective is a copy (a sum over one
// rank is its only term), so the results are exactly what NCCL gives for a
// world of one. Device pointers are host addresses (see fake_cuda.cpp) and
// the work is done before a call returns.
//
// What a world of one cannot do fails with ncclInvalidUsage or
// ncclInvalidArgument and a message that ncclGetLastError returns: a
// communicator of more than one rank, a peer or root other than 0, a send
// or receive to self outside ncclGroupStart/End (NCCL would wait forever),
// unpaired or mismatched sends and receives within a group.

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <set>
#include <string>
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
const size_t kTypeSize[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
// Ids from ncclGetUniqueId start with this, so a communicator is only made
// from an id this library handed out.
const char kIdMagic[] = "gcompile-fake-nccl-id";

struct ncclUniqueId {
  char internal[128];
};

struct Comm {
  unsigned long long id;
};

std::mutex mu;
std::set<Comm*> comms;
unsigned long long next_comm = 1;
unsigned long long next_id = 1;
std::string last_error;

ncclResult_t fail(ncclResult_t r, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t fail(ncclResult_t r, const char* fn, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(mu);
  last_error = std::string(fn) + ": " + buf;
  return r;
}

// One queued operation of a group. Everything issued inside a group runs,
// in order, at the outermost ncclGroupEnd.
struct Op {
  enum Kind { Copy, Send, Recv } kind;
  const char* fn;
  void* dst;
  const void* src;
  size_t bytes;
};

// Groups are per thread, as in NCCL.
thread_local int group_depth = 0;
thread_local std::vector<Op> queued;

ncclResult_t check_comm(const char* fn, Comm* c) {
  std::lock_guard<std::mutex> g(mu);
  if (!comms.count(c)) {
    char buf[64];
    snprintf(buf, sizeof buf, "%p", (void*)c);
    last_error = std::string(fn) + ": " + buf + " is not a live communicator";
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t check_type(const char* fn, int t, size_t count, size_t* bytes) {
  if (t < 0 || t >= ncclNumTypes) return fail(ncclInvalidArgument, fn, "unknown data type %d", t);
  if (count > SIZE_MAX / kTypeSize[t]) return fail(ncclInvalidArgument, fn, "count %zu overflows", count);
  *bytes = count * kTypeSize[t];
  return ncclSuccess;
}

// issue runs a copy now, or queues it inside a group.
ncclResult_t issue(Op op) {
  if (op.bytes > 0 && (!op.dst && op.kind != Op::Send)) return fail(ncclInvalidArgument, op.fn, "NULL receive buffer");
  if (op.bytes > 0 && (!op.src && op.kind != Op::Recv)) return fail(ncclInvalidArgument, op.fn, "NULL send buffer");
  if (group_depth > 0) {
    queued.push_back(op);
    return ncclSuccess;
  }
  if (op.kind != Op::Copy) {
    return fail(ncclInvalidUsage, op.fn,
                "a send or receive between rank 0 and itself outside ncclGroupStart/ncclGroupEnd never completes");
  }
  if (op.bytes > 0 && op.dst != op.src) memmove(op.dst, op.src, op.bytes);
  return ncclSuccess;
}

ncclResult_t collective(const char* fn, const void* send, void* recv, size_t count, int type, int op, bool reduces,
                        Comm* c) {
  if (ncclResult_t r = check_comm(fn, c)) return r;
  size_t bytes = 0;
  if (ncclResult_t r = check_type(fn, type, count, &bytes)) return r;
  if (reduces && (op < 0 || op >= ncclNumOps)) return fail(ncclInvalidArgument, fn, "unknown reduction %d", op);
  return issue(Op{Op::Copy, fn, recv, send, bytes});
}

ncclResult_t p2p(const char* fn, bool is_send, void* buf, size_t count, int type, int peer, Comm* c) {
  if (ncclResult_t r = check_comm(fn, c)) return r;
  size_t bytes = 0;
  if (ncclResult_t r = check_type(fn, type, count, &bytes)) return r;
  if (peer != 0) return fail(ncclInvalidArgument, fn, "peer %d does not exist in a communicator of 1 rank", peer);
  if (is_send) return issue(Op{Op::Send, fn, nullptr, buf, bytes});
  return issue(Op{Op::Recv, fn, buf, nullptr, bytes});
}

// run executes a finished group: the k-th receive takes the k-th send's
// bytes, as NCCL matches operations between one pair of ranks in order.
ncclResult_t run(std::vector<Op>& ops) {
  std::vector<const Op*> sends, recvs;
  for (const Op& o : ops) {
    if (o.kind == Op::Send) sends.push_back(&o);
    if (o.kind == Op::Recv) recvs.push_back(&o);
  }
  if (sends.size() != recvs.size()) {
    return fail(ncclInvalidUsage, "ncclGroupEnd", "the group has %zu send(s) to rank 0 and %zu receive(s) from it",
                sends.size(), recvs.size());
  }
  for (size_t k = 0; k < sends.size(); k++) {
    if (sends[k]->bytes != recvs[k]->bytes) {
      return fail(ncclInvalidUsage, "ncclGroupEnd", "send %zu has %zu bytes but the matching receive expects %zu", k,
                  sends[k]->bytes, recvs[k]->bytes);
    }
  }
  size_t next_recv = 0;
  for (const Op& o : ops) {
    switch (o.kind) {
      case Op::Copy:
        if (o.bytes > 0 && o.dst != o.src) memmove(o.dst, o.src, o.bytes);
        break;
      case Op::Recv: {
        const Op* s = sends[next_recv++];
        if (o.bytes > 0 && o.dst != s->src) memmove(o.dst, s->src, o.bytes);
        break;
      }
      case Op::Send:
        break;
    }
  }
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
  memset(id, 0, sizeof *id);
  unsigned long long n;
  {
    std::lock_guard<std::mutex> g(mu);
    n = next_id++;
  }
  snprintf(id->internal, sizeof id->internal, "%s %llu", kIdMagic, n);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(Comm** comm, int nranks, ncclUniqueId id, int rank) {
  const char* fn = "ncclCommInitRank";
  if (!comm) return fail(ncclInvalidArgument, fn, "NULL output");
  if (nranks != 1) {
    return fail(ncclInvalidUsage, fn, "the fake GPU's NCCL has communicators of 1 rank only, not %d", nranks);
  }
  if (rank != 0) return fail(ncclInvalidArgument, fn, "rank %d is out of range for 1 rank", rank);
  if (strncmp(id.internal, kIdMagic, sizeof kIdMagic - 1) != 0) {
    return fail(ncclInvalidArgument, fn, "the unique id did not come from ncclGetUniqueId");
  }
  std::lock_guard<std::mutex> g(mu);
  Comm* c = new Comm{next_comm++};
  comms.insert(c);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(Comm* c) {
  if (ncclResult_t r = check_comm("ncclCommDestroy", c)) return r;
  std::lock_guard<std::mutex> g(mu);
  comms.erase(c);
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(Comm* c, int* n) {
  if (ncclResult_t r = check_comm("ncclCommCount", c)) return r;
  if (!n) return fail(ncclInvalidArgument, "ncclCommCount", "NULL output");
  *n = 1;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(Comm* c, int* rank) {
  if (ncclResult_t r = check_comm("ncclCommUserRank", c)) return r;
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank", "NULL output");
  *rank = 0;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, Comm* c, void* stream) {
  (void)stream;
  return collective("ncclAllReduce", send, recv, count, type, op, true, c);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, int type, int op, Comm* c,
                               void* stream) {
  (void)stream;
  return collective("ncclReduceScatter", send, recv, recvcount, type, op, true, c);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, int type, Comm* c, void* stream) {
  (void)stream;
  return collective("ncclAllGather", send, recv, sendcount, type, 0, false, c);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int type, int root, Comm* c, void* stream) {
  (void)stream;
  if (root != 0) {
    if (ncclResult_t r = check_comm("ncclBroadcast", c)) return r;
    return fail(ncclInvalidArgument, "ncclBroadcast", "root %d does not exist in a communicator of 1 rank", root);
  }
  return collective("ncclBroadcast", send, recv, count, type, 0, false, c);
}

ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, int type, Comm* c, void* stream) {
  (void)stream;
  return collective("ncclAlltoAll", send, recv, count, type, 0, false, c);
}

ncclResult_t ncclSend(const void* send, size_t count, int type, int peer, Comm* c, void* stream) {
  (void)stream;
  return p2p("ncclSend", true, (void*)send, count, type, peer, c);
}

ncclResult_t ncclRecv(void* recv, size_t count, int type, int peer, Comm* c, void* stream) {
  (void)stream;
  return p2p("ncclRecv", false, recv, count, type, peer, c);
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd", "no group is open (ncclGroupStart was not called)");
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

// The message of the most recent failure (NCCL keeps one per process too).
const char* ncclGetLastError(Comm* c) {
  (void)c;
  thread_local std::string copy;
  std::lock_guard<std::mutex> g(mu);
  copy = last_error;
  return copy.c_str();
}

}  // extern "C"
