/*
 * A stand-in for libnccl.so used by the nccl package's tests.
 *
 * It has the real C prototypes and plays one rank of a communicator whose
 * other ranks are simulated: what peer p sends to this rank r is byte j of
 * peer_byte(p, r, j), and in reductions peer p contributes send[i] + (p - r)
 * (float32 only). "Device" pointers are host pointers, so the tests can check
 * every offset and count by looking at the bytes. Send/recv inside a group
 * are queued and run at ncclGroupEnd, sends first, as NCCL requires for a
 * rank exchanging with itself.
 *
 * -DNO_ALLTOALL leaves out ncclAlltoAll, which most NCCL versions lack.
 * -DNEW_API adds ncclCommSplit (NCCL 2.18) and ncclCommInitRankScalable
 * (2.23), which record their arguments.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
};
enum { ncclFloat32 = 7, ncclNumTypes = 12 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

typedef struct { char internal[128]; } ncclUniqueId;
struct comm { int nranks, rank; };
typedef struct comm *ncclComm_t;
typedef struct stream *cudaStream_t;

static char last_error[256];
static ncclUniqueId last_id;
static int last_nranks = -1, last_rank = -1;
static long live_comms;
static cudaStream_t last_stream;
static int group_depth;
static int native_alltoall;
static int sends, recvs;
static int sent_first[64];
static size_t sent_bytes[64];

struct op { int is_send; void *buf; size_t bytes; int peer; };
static struct op queue[256];
static int queued;

static ncclResult_t fail(ncclResult_t r, const char *msg) {
	snprintf(last_error, sizeof last_error, "%s", msg);
	return r;
}

static size_t type_size(int t) {
	static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
	return t >= 0 && t < ncclNumTypes ? sizes[t] : 0;
}

static unsigned char peer_byte(int p, int r, size_t j) { return (unsigned char)(p * 31 + r * 7 + j * 3 + 1); }

ncclResult_t ncclGetVersion(int *v) {
	if (!v) return fail(ncclInvalidArgument, "version is NULL");
	*v = 22803;
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	if (!id) return fail(ncclInvalidArgument, "id is NULL");
	for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 7 + 3);
	return ncclSuccess;
}

/* The id arrives by value: 128 bytes on the stack, between two ints that
 * travel in registers. */
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank) {
	last_id = id;
	last_nranks = nranks;
	last_rank = rank;
	if (!c) return fail(ncclInvalidArgument, "comm is NULL");
	if (nranks < 1 || nranks > 64 || rank < 0 || rank >= nranks)
		return fail(ncclInvalidArgument, "rank out of range");
	int zero = 1;
	for (int i = 0; i < 128; i++) zero &= id.internal[i] == 0;
	if (zero) return fail(ncclInvalidArgument, "unique id was never initialised");
	struct comm *cm = malloc(sizeof *cm);
	cm->nranks = nranks;
	cm->rank = rank;
	live_comms++;
	*c = cm;
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
	if (!c) return fail(ncclInvalidArgument, "comm is NULL");
	free(c);
	live_comms--;
	return ncclSuccess;
}

static long aborted_comms;
static ncclResult_t async_error;

ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (!c) return ncclSuccess;
	free(c);
	live_comms--;
	aborted_comms++;
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r) {
	if (!c || !r) return fail(ncclInvalidArgument, "comm or output is NULL");
	*r = async_error;
	return ncclSuccess;
}

#ifdef NEW_API
static int last_color = -2, last_key = -2, last_nids = -1;
static void *last_config = (void *)1;

/* The new communicator has the parent's size; key is its rank. */
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, void *config) {
	last_color = color;
	last_key = key;
	last_config = config;
	if (!c || !out) return fail(ncclInvalidArgument, "comm or output is NULL");
	if (color == -1) {
		*out = NULL;
		return ncclSuccess;
	}
	if (key < 0 || key >= c->nranks) return fail(ncclInvalidArgument, "key out of range");
	struct comm *cm = malloc(sizeof *cm);
	cm->nranks = c->nranks;
	cm->rank = key;
	live_comms++;
	*out = cm;
	return ncclSuccess;
}

/* The last of the ids is what fake_last_id reports. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *c, int nranks, int rank, int nids, ncclUniqueId *ids, void *config) {
	last_nids = nids;
	last_config = config;
	if (nids < 1 || !ids) return fail(ncclInvalidArgument, "no ids");
	return ncclCommInitRank(c, nranks, ids[nids - 1], rank);
}

int fake_last_color(void) { return last_color; }
int fake_last_key(void) { return last_key; }
int fake_last_nids(void) { return last_nids; }
int fake_last_config_is_null(void) { return last_config == NULL; }
#endif

ncclResult_t ncclCommCount(const ncclComm_t c, int *n) {
	if (!c || !n) return fail(ncclInvalidArgument, "comm is NULL");
	*n = c->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) {
	if (!c || !r) return fail(ncclInvalidArgument, "comm is NULL");
	*r = c->rank;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
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

const char *ncclGetLastError(ncclComm_t c) {
	(void)c;
	return last_error;
}

static ncclResult_t check_comm(ncclComm_t c, int dtype) {
	if (!c) return fail(ncclInvalidArgument, "comm is NULL");
	if (!type_size(dtype)) return fail(ncclInvalidArgument, "invalid data type");
	return ncclSuccess;
}

static float reduce(int op, float a, float b) {
	switch (op) {
	case ncclProd: return a * b;
	case ncclMax: return a > b ? a : b;
	case ncclMin: return a < b ? a : b;
	}
	return a + b;
}

/* Peer p's value of element x is send[x] + (p - r). */
static ncclResult_t reduce_from(const float *send, size_t base, float *out, size_t count, int op, ncclComm_t c) {
	if (op < ncclSum || op > ncclAvg) return fail(ncclInvalidArgument, "invalid reduction");
	for (size_t i = 0; i < count; i++) {
		float acc = send[base + i] + (float)(0 - c->rank);
		for (int p = 1; p < c->nranks; p++) acc = reduce(op, acc, send[base + i] + (float)(p - c->rank));
		if (op == ncclAvg) acc /= (float)c->nranks;
		out[i] = acc;
	}
	return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, ncclComm_t c, cudaStream_t s) {
	ncclResult_t r = check_comm(c, dtype);
	if (r) return r;
	if (dtype != ncclFloat32) return fail(ncclInvalidArgument, "the stand-in reduces float32 only");
	last_stream = s;
	float *tmp = malloc(count * sizeof(float) + 1);
	r = reduce_from(send, 0, tmp, count, op, c);
	if (!r) memcpy(recv, tmp, count * sizeof(float));
	free(tmp);
	return r;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dtype, int op, ncclComm_t c, cudaStream_t s) {
	ncclResult_t r = check_comm(c, dtype);
	if (r) return r;
	if (dtype != ncclFloat32) return fail(ncclInvalidArgument, "the stand-in reduces float32 only");
	last_stream = s;
	return reduce_from(send, (size_t)c->rank * recvcount, recv, recvcount, op, c);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int dtype, ncclComm_t c, cudaStream_t s) {
	ncclResult_t r = check_comm(c, dtype);
	if (r) return r;
	last_stream = s;
	size_t chunk = sendcount * type_size(dtype);
	for (int p = 0; p < c->nranks; p++) {
		unsigned char *dst = (unsigned char *)recv + (size_t)p * chunk;
		if (p == c->rank) memmove(dst, send, chunk);
		else for (size_t j = 0; j < chunk; j++) dst[j] = peer_byte(p, c->rank, j);
	}
	return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, ncclComm_t c, cudaStream_t s) {
	ncclResult_t r = check_comm(c, dtype);
	if (r) return r;
	if (root < 0 || root >= c->nranks) return fail(ncclInvalidArgument, "root out of range");
	last_stream = s;
	size_t n = count * type_size(dtype);
	if (root == c->rank) memmove(recv, send, n);
	else for (size_t j = 0; j < n; j++) ((unsigned char *)recv)[j] = peer_byte(root, c->rank, j);
	return ncclSuccess;
}

static void do_send(struct op *o) {
	sends++;
	sent_first[o->peer] = o->bytes ? *(unsigned char *)o->buf : -1;
	sent_bytes[o->peer] = o->bytes;
}

static ncclResult_t do_recv(struct op *o, ncclComm_t c, struct op *ops, int n) {
	recvs++;
	if (o->peer != c->rank) {
		for (size_t j = 0; j < o->bytes; j++) ((unsigned char *)o->buf)[j] = peer_byte(o->peer, c->rank, j);
		return ncclSuccess;
	}
	for (int i = 0; i < n; i++) {
		if (ops[i].is_send && ops[i].peer == c->rank && ops[i].bytes == o->bytes) {
			memmove(o->buf, ops[i].buf, o->bytes);
			ops[i].peer = -1; /* matched */
			return ncclSuccess;
		}
	}
	return fail(ncclInvalidUsage, "receive from self without a matching send in the group");
}

static ncclComm_t group_comm;

static ncclResult_t p2p(int is_send, void *buf, size_t count, int dtype, int peer, ncclComm_t c, cudaStream_t s) {
	ncclResult_t r = check_comm(c, dtype);
	if (r) return r;
	if (peer < 0 || peer >= c->nranks) return fail(ncclInvalidArgument, "peer out of range");
	last_stream = s;
	struct op o = {is_send, buf, count * type_size(dtype), peer};
	if (group_depth == 0) {
		if (is_send) { do_send(&o); return ncclSuccess; }
		return do_recv(&o, c, NULL, 0);
	}
	if (queued == 256) return fail(ncclInternalError, "too many operations in one group");
	queue[queued++] = o;
	group_comm = c;
	return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, int dtype, int peer, ncclComm_t c, cudaStream_t s) {
	return p2p(1, (void *)send, count, dtype, peer, c, s);
}

ncclResult_t ncclRecv(void *recv, size_t count, int dtype, int peer, ncclComm_t c, cudaStream_t s) {
	return p2p(0, recv, count, dtype, peer, c, s);
}

ncclResult_t ncclGroupStart(void) {
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0) return ncclSuccess;
	ncclResult_t r = ncclSuccess;
	for (int i = 0; i < queued; i++)
		if (queue[i].is_send) do_send(&queue[i]);
	for (int i = 0; i < queued && !r; i++)
		if (!queue[i].is_send) r = do_recv(&queue[i], group_comm, queue, queued);
	queued = 0;
	return r;
}

#ifndef NO_ALLTOALL
ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, int dtype, ncclComm_t c, cudaStream_t s) {
	ncclResult_t r = check_comm(c, dtype);
	if (r) return r;
	last_stream = s;
	native_alltoall++;
	size_t chunk = count * type_size(dtype);
	for (int p = 0; p < c->nranks; p++) {
		const unsigned char *src = (const unsigned char *)send + (size_t)p * chunk;
		unsigned char *dst = (unsigned char *)recv + (size_t)p * chunk;
		sent_first[p] = chunk ? src[0] : -1;
		sent_bytes[p] = chunk;
		if (p == c->rank) memmove(dst, src, chunk);
		else for (size_t j = 0; j < chunk; j++) dst[j] = peer_byte(p, c->rank, j);
	}
	return ncclSuccess;
}
#endif

/* Introspection for the tests. */
void fake_last_id(unsigned char *out) { memcpy(out, last_id.internal, 128); }
int fake_last_nranks(void) { return last_nranks; }
int fake_last_rank(void) { return last_rank; }
long fake_live_comms(void) { return live_comms; }
long fake_aborted_comms(void) { return aborted_comms; }
void fake_set_async_error(int r) { async_error = r; }
void *fake_last_stream(void) { return last_stream; }
int fake_group_depth(void) { return group_depth; }
int fake_native_alltoall(void) { return native_alltoall; }
int fake_sends(void) { return sends; }
int fake_recvs(void) { return recvs; }
int fake_sent_first(int p) { return sent_first[p]; }
size_t fake_sent_bytes(int p) { return sent_bytes[p]; }
unsigned char fake_peer_byte(int p, int r, size_t j) { return peer_byte(p, r, j); }
