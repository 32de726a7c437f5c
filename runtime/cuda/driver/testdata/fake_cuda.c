/*
 * A stand-in for libcuda.so used by the driver package's tests.
 *
 * Every entry point has the C prototype of the real driver API (with the
 * versioned symbol names cuda.h maps to). "Device memory" is host memory from
 * malloc, so copies round-trip real bytes; the module loader accepts images
 * that start with "FAKECUBIN" and lists kernel names after it; the one kernel
 * it can run, "axpy", computes y[i] += a * x[i] from its void** parameters.
 * fake_* functions let the test read back what the library received.
 *
 * Compile with -DNO_ELAPSED_V2 to leave out cuEventElapsedTime_v2, as older
 * drivers do.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct ctx_st *CUcontext;
typedef struct stream_st *CUstream;
typedef struct event_st *CUevent;
typedef struct module_st *CUmodule;
typedef struct func_st *CUfunction;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
};

#define FAKE_DEVICES 2
#define FAKE_MAX_ALLOC (1ull << 30)

static int initialized;
static unsigned init_flags;
static int ctx_refs[FAKE_DEVICES];
static CUcontext current_ctx;
static long live_allocs;
static long live_host_allocs;
static long live_streams;
static long live_events;
static long live_modules;
static double clock_ms;
static int elapsed_variant;

/* The last launch, for the test to inspect. */
static unsigned launch_dims[6];
static unsigned launch_shared;
static CUstream launch_stream;
static CUstream last_async_stream;
static unsigned last_stream_flags;
static unsigned last_event_flags;
static unsigned last_wait_flags;

struct ctx_st { int device; };
struct stream_st { unsigned flags; };
struct event_st { unsigned flags; double at_ms; int recorded; };
struct func_st { char name[64]; };
struct module_st { int nfuncs; struct func_st funcs[8]; };

static struct ctx_st contexts[FAKE_DEVICES] = {{0}, {1}};

#define NEED_INIT() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (!current_ctx) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned int flags) {
	init_flags = flags;
	if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
	initialized = 1;
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	*v = 12080;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	NEED_INIT();
	*n = FAKE_DEVICES;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT();
	if (ordinal < 0 || ordinal >= FAKE_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= FAKE_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "Fake H100 #%d", d);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= FAKE_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case 1: *v = 1024; break;        /* MAX_THREADS_PER_BLOCK */
	case 8: *v = 49152; break;       /* MAX_SHARED_MEMORY_PER_BLOCK */
	case 10: *v = 32; break;         /* WARP_SIZE */
	case 13: *v = 1980000; break;    /* CLOCK_RATE, kHz */
	case 16: *v = 132 + d; break;    /* MULTIPROCESSOR_COUNT */
	case 36: *v = 2619000; break;    /* MEMORY_CLOCK_RATE, kHz */
	case 37: *v = 5120; break;       /* GLOBAL_MEMORY_BUS_WIDTH */
	case 38: *v = 52428800; break;   /* L2_CACHE_SIZE */
	case 39: *v = 2048; break;       /* MAX_THREADS_PER_MULTIPROCESSOR */
	case 75: *v = 9; break;          /* COMPUTE_CAPABILITY_MAJOR */
	case 76: *v = 0; break;          /* COMPUTE_CAPABILITY_MINOR */
	case 81: *v = 233472; break;     /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
	case 97: *v = 232448; break;     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= FAKE_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
	*bytes = (size_t)85899345920ull + (size_t)d; /* 80 GiB, plus the ordinal to tell devices apart */
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= FAKE_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
	ctx_refs[d]++;
	*ctx = &contexts[d];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= FAKE_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
	if (ctx_refs[d] == 0) return CUDA_ERROR_INVALID_CONTEXT;
	ctx_refs[d]--;
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
	NEED_INIT();
	if (ctx && ctx != &contexts[0] && ctx != &contexts[1]) return CUDA_ERROR_INVALID_CONTEXT;
	current_ctx = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
	NEED_CTX();
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
	NEED_CTX();
	if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
	struct stream_st *st = malloc(sizeof *st);
	st->flags = flags;
	last_stream_flags = flags;
	live_streams++;
	*s = st;
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s) {
	NEED_CTX();
	if (!s) return CUDA_ERROR_INVALID_HANDLE;
	free(s);
	live_streams--;
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
	NEED_CTX();
	(void)s;
	return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
	NEED_CTX();
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	last_async_stream = s;
	last_wait_flags = flags;
	return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
	NEED_CTX();
	struct event_st *ev = calloc(1, sizeof *ev);
	ev->flags = flags;
	last_event_flags = flags;
	live_events++;
	*e = ev;
	return CUDA_SUCCESS;
}

/* Each record advances a fake clock by 1.25 ms. */
CUresult cuEventRecord(CUevent e, CUstream s) {
	NEED_CTX();
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	clock_ms += 1.25;
	e->at_ms = clock_ms;
	e->recorded = 1;
	last_async_stream = s;
	return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent e) {
	NEED_CTX();
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b) {
	NEED_CTX();
	if (!a || !b || !ms) return CUDA_ERROR_INVALID_HANDLE;
	if (!a->recorded || !b->recorded) return CUDA_ERROR_NOT_READY;
	*ms = (float)(b->at_ms - a->at_ms);
	return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
	elapsed_variant = 1;
	return elapsed(ms, a, b);
}

#ifndef NO_ELAPSED_V2
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
	elapsed_variant = 2;
	return elapsed(ms, a, b);
}
#endif

CUresult cuEventDestroy_v2(CUevent e) {
	NEED_CTX();
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	free(e);
	live_events--;
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n == 0) return CUDA_ERROR_INVALID_VALUE;
	if (n > FAKE_MAX_ALLOC) return CUDA_ERROR_OUT_OF_MEMORY;
	void *m = malloc(n);
	if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
	live_allocs++;
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	free((void *)(uintptr_t)p);
	live_allocs--;
	return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **p, size_t n) {
	NEED_CTX();
	if (n == 0) return CUDA_ERROR_INVALID_VALUE;
	if (n > FAKE_MAX_ALLOC) return CUDA_ERROR_OUT_OF_MEMORY;
	*p = malloc(n);
	live_host_allocs++;
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
	NEED_CTX();
	if (!p) return CUDA_ERROR_INVALID_VALUE;
	free(p);
	live_host_allocs--;
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	NEED_CTX();
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	memcpy(dst, (void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	last_async_stream = s;
	return cuMemcpyHtoD_v2(dst, src, n);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	last_async_stream = s;
	return cuMemcpyDtoH_v2(dst, src, n);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	last_async_stream = s;
	return cuMemcpyDtoD_v2(dst, src, n);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
	NEED_CTX();
	if (!dst) return CUDA_ERROR_INVALID_VALUE;
	memset((void *)(uintptr_t)dst, v, n);
	return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
	NEED_CTX();
	if (!dst || (dst & 3)) return CUDA_ERROR_INVALID_VALUE;
	uint32_t *p = (uint32_t *)(uintptr_t)dst;
	for (size_t i = 0; i < n; i++) p[i] = v;
	last_async_stream = s;
	return CUDA_SUCCESS;
}

/* Image format: "FAKECUBIN" followed by ':'-prefixed kernel names. */
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
	NEED_CTX();
	const char *s = image;
	if (!s || strncmp(s, "FAKECUBIN", 9) != 0) return CUDA_ERROR_INVALID_IMAGE;
	struct module_st *mod = calloc(1, sizeof *mod);
	s += 9;
	while (*s == ':' && mod->nfuncs < 8) {
		s++;
		size_t n = strcspn(s, ":");
		if (n >= sizeof mod->funcs[0].name) n = sizeof mod->funcs[0].name - 1;
		memcpy(mod->funcs[mod->nfuncs].name, s, n);
		mod->nfuncs++;
		s += strcspn(s, ":");
	}
	live_modules++;
	*m = mod;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
	NEED_CTX();
	if (!m) return CUDA_ERROR_INVALID_HANDLE;
	for (int i = 0; i < m->nfuncs; i++) {
		if (strcmp(m->funcs[i].name, name) == 0) {
			*f = &m->funcs[i];
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_NOT_FOUND;
}

CUresult cuModuleUnload(CUmodule m) {
	NEED_CTX();
	if (!m) return CUDA_ERROR_INVALID_HANDLE;
	free(m);
	live_modules--;
	return CUDA_SUCCESS;
}

/* axpy(float *y, const float *x, float a, int n): y[i] += a * x[i]. */
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx, unsigned by, unsigned bz, unsigned shared,
                        CUstream s, void **params, void **extra) {
	NEED_CTX();
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (extra) return CUDA_ERROR_INVALID_VALUE;
	if ((unsigned long)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
	launch_dims[0] = gx; launch_dims[1] = gy; launch_dims[2] = gz;
	launch_dims[3] = bx; launch_dims[4] = by; launch_dims[5] = bz;
	launch_shared = shared;
	launch_stream = s;
	if (strcmp(f->name, "axpy") == 0) {
		if (!params) return CUDA_ERROR_INVALID_VALUE;
		float *y = (float *)(uintptr_t)*(CUdeviceptr *)params[0];
		const float *x = (const float *)(uintptr_t)*(CUdeviceptr *)params[1];
		float a = *(float *)params[2];
		int n = *(int *)params[3];
		for (int i = 0; i < n; i++) y[i] += a * x[i];
	}
	return CUDA_SUCCESS;
}

static const char *err_name(CUresult e) {
	switch (e) {
	case CUDA_SUCCESS: return "CUDA_SUCCESS";
	case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
	case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
	case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
	case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
	case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
	case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
	case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
	case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
	case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
	}
	return NULL;
}

static const char *err_string(CUresult e) {
	switch (e) {
	case CUDA_SUCCESS: return "no error";
	case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
	case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
	case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
	case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
	case CUDA_ERROR_INVALID_IMAGE: return "device kernel image is invalid";
	case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
	case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
	case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
	case CUDA_ERROR_NOT_READY: return "device not ready";
	}
	return NULL;
}

/* Like the real driver: unknown codes leave *s NULL and return INVALID_VALUE. */
CUresult cuGetErrorName(CUresult e, const char **s) {
	*s = err_name(e);
	return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult e, const char **s) {
	*s = err_string(e);
	return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Introspection for the tests. */
unsigned fake_init_flags(void) { return init_flags; }
int fake_ctx_refs(int d) { return ctx_refs[d]; }
void *fake_current_ctx(void) { return current_ctx; }
long fake_live(int what) {
	switch (what) {
	case 0: return live_allocs;
	case 1: return live_host_allocs;
	case 2: return live_streams;
	case 3: return live_events;
	case 4: return live_modules;
	}
	return -1;
}
unsigned fake_launch_dim(int i) { return launch_dims[i]; }
unsigned fake_launch_shared(void) { return launch_shared; }
void *fake_launch_stream(void) { return launch_stream; }
void *fake_last_async_stream(void) { return last_async_stream; }
unsigned fake_last_flags(int what) {
	switch (what) {
	case 0: return last_stream_flags;
	case 1: return last_event_flags;
	case 2: return last_wait_flags;
	}
	return 0xffffffffu;
}
int fake_elapsed_variant(void) { return elapsed_variant; }
