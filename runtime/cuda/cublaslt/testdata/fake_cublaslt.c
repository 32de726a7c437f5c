/*
 * A stand-in for libcublasLt.so used by the cublaslt package's tests.
 *
 * It has the real C prototypes and checks attribute sizes the way cuBLASLt
 * does (CUBLAS_STATUS_INVALID_VALUE on a mismatch). cublasLtMatmul really
 * computes D = alpha*op(A)*op(B) + beta*C on host memory (the tests' "device"
 * pointers are host pointers) following cuBLASLt's documented column-major
 * semantics, for f32, f16 and bf16 inputs with f32 accumulation. So a test
 * comparing the result with a row-major product computed in Go checks the
 * whole mapping from row-major tensors to cuBLASLt's layouts, not just that
 * calls were made.
 *
 * The heuristic hands out one algorithm with a recognizable bit pattern, and
 * cublasLtMatmul refuses an algorithm without it, so the 64-byte struct must
 * make the round trip through Go intact. The algorithm asks for 4096 bytes
 * of workspace when the preference allows it.
 *
 * -DNO_STATUS_STRINGS leaves out cublasLtGetStatusName/String.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int cublasStatus_t;
enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_ARCH_MISMATCH = 8,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_INTERNAL_ERROR = 14,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum { CUBLAS_COMPUTE_32F = 68 };
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };

typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;

struct handle { int magic; };
struct desc { int compute, scale, transa, transb; };
struct layout { int type, order; uint64_t rows, cols; int64_t ld; int32_t batch; int64_t stride; };
/* align[0..3]: the byte alignment the caller promises for A, B, C and D
 * (cuBLASLt's default assumption is 256). */
struct pref { uint64_t max_ws; uint32_t align[4]; };

typedef struct handle *cublasLtHandle_t;
typedef struct desc *cublasLtMatmulDesc_t;
typedef struct layout *cublasLtMatrixLayout_t;
typedef struct pref *cublasLtMatmulPreference_t;
typedef struct stream *cudaStream_t;

#define ALGO_MAGIC 0xA160000000000000ull
#define ALGO_WS 4096u

static long live;
static cudaStream_t last_stream;
static void *last_workspace;
static size_t last_workspace_size;
static float last_alpha, last_beta;
static int matmuls;
static int misaligned;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
	if (!h) return CUBLAS_STATUS_INVALID_VALUE;
	*h = malloc(sizeof **h);
	(*h)->magic = 0x17;
	live++;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
	if (!h || h->magic != 0x17) return CUBLAS_STATUS_NOT_INITIALIZED;
	free(h);
	live--;
	return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return 120902; }

#ifndef NO_STATUS_STRINGS
const char *cublasLtGetStatusName(cublasStatus_t s) {
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "success";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
	case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested feature is not supported";
	}
	return "unknown error";
}
#endif

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, int compute, int scale) {
	if (!d) return CUBLAS_STATUS_INVALID_VALUE;
	if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
	*d = calloc(1, sizeof **d);
	(*d)->compute = compute;
	(*d)->scale = scale;
	live++;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
	if (!d) return CUBLAS_STATUS_INVALID_VALUE;
	free(d);
	live--;
	return CUBLAS_STATUS_SUCCESS;
}

/* Attribute values are int32_t for TRANSA (3) and TRANSB (4). */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, int attr, const void *buf, size_t n) {
	if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
	switch (attr) {
	case 3:
	case 4: {
		if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
		int32_t v = *(const int32_t *)buf;
		if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
		if (attr == 3) d->transa = v; else d->transb = v;
		return CUBLAS_STATUS_SUCCESS;
	}
	}
	return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
	if (!l) return CUBLAS_STATUS_INVALID_VALUE;
	if (type != CUDA_R_32F && type != CUDA_R_16F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
	if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE; /* column-major: ld >= rows */
	*l = calloc(1, sizeof **l);
	(*l)->type = type;
	(*l)->rows = rows;
	(*l)->cols = cols;
	(*l)->ld = ld;
	(*l)->batch = 1;
	live++;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
	if (!l) return CUBLAS_STATUS_INVALID_VALUE;
	free(l);
	live--;
	return CUBLAS_STATUS_SUCCESS;
}

/* ORDER (1) and BATCH_COUNT (5) are int32_t, STRIDED_BATCH_OFFSET (6) int64_t. */
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, int attr, const void *buf, size_t n) {
	if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
	switch (attr) {
	case 1:
		if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
		l->order = *(const int32_t *)buf;
		return l->order == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
	case 5:
		if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
		l->batch = *(const int32_t *)buf;
		return l->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
	case 6:
		if (n != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
		l->stride = *(const int64_t *)buf;
		return CUBLAS_STATUS_SUCCESS;
	}
	return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
	if (!p) return CUBLAS_STATUS_INVALID_VALUE;
	*p = calloc(1, sizeof **p);
	for (int i = 0; i < 4; i++) (*p)->align[i] = 256;
	live++;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
	if (!p) return CUBLAS_STATUS_INVALID_VALUE;
	free(p);
	live--;
	return CUBLAS_STATUS_SUCCESS;
}

/* MAX_WORKSPACE_BYTES (1) is uint64_t. */
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, int attr, const void *buf, size_t n) {
	if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
	if (attr >= 5 && attr <= 8) { /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
		uint32_t v;
		if (n != sizeof v) return CUBLAS_STATUS_INVALID_VALUE;
		memcpy(&v, buf, sizeof v);
		if (v == 0 || (v & (v - 1))) return CUBLAS_STATUS_INVALID_VALUE;
		p->align[attr - 5] = v;
		return CUBLAS_STATUS_SUCCESS;
	}
	if (attr != 1 || n != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
	p->max_ws = *(const uint64_t *)buf;
	return CUBLAS_STATUS_SUCCESS;
}

/* Shapes must agree as cuBLASLt requires: op(A) is m x k, op(B) k x n,
 * C and D m x n, and every layout has the same batch count. */
static int shapes(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                  cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, uint64_t *m, uint64_t *n, uint64_t *k) {
	uint64_t am = d->transa == CUBLAS_OP_N ? a->rows : a->cols;
	uint64_t ak = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
	uint64_t bk = d->transb == CUBLAS_OP_N ? b->rows : b->cols;
	uint64_t bn = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
	if (ak != bk || c->rows != am || c->cols != bn || dd->rows != am || dd->cols != bn) return 0;
	if (a->batch != b->batch || a->batch != c->batch || a->batch != dd->batch) return 0;
	if (a->type != b->type || c->type != dd->type) return 0;
	*m = am; *n = bn; *k = ak;
	return 1;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *out, int *returned) {
	uint64_t m, n, k;
	if (!h || h->magic != 0x17) return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!d || !a || !b || !c || !dd || !pref || !out || !returned || requested <= 0) return CUBLAS_STATUS_INVALID_VALUE;
	if (!shapes(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < 8; i++) out->algo.data[i] = ALGO_MAGIC + (uint64_t)i * 0x1111;
	out->workspaceSize = pref->max_ws >= ALGO_WS ? ALGO_WS : 0;
	out->algo.data[7] = out->workspaceSize;
	/* The chosen algorithm relies on the alignments the preference
	 * promised, as a real one may (vector loads): data[6] carries them. */
	out->algo.data[6] = 0;
	for (int i = 0; i < 4; i++) out->algo.data[6] |= (uint64_t)pref->align[i] << (16 * i);
	out->state = CUBLAS_STATUS_SUCCESS;
	out->wavesCount = 0.75f;
	*returned = 1;
	return CUBLAS_STATUS_SUCCESS;
}

static float half_to_float(uint16_t h) {
	uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	float v;
	if (exp == 0) v = ldexpf((float)man, -24);
	else if (exp == 31) v = man ? NAN : INFINITY;
	else v = ldexpf((float)(man | 0x400), (int)exp - 25);
	return sign ? -v : v;
}

/* Round to nearest, ties to even (lrintf in the default rounding mode),
 * over the whole float range: subnormal results, overflow to infinity, and
 * NaN quieted with its top payload bits kept, as github.com/x448/float16
 * (the CPU backend's conversion) does, so results agree bit for bit. */
static uint16_t float_to_half(float f) {
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	if (isnan(f)) {
		uint32_t u;
		memcpy(&u, &f, 4);
		return sign | 0x7e00 | (uint16_t)((u & 0x7fffff) >> 13);
	}
	float a = fabsf(f);
	if (isinf(a)) return sign | 0x7c00;
	if (a == 0) return sign;
	int e;
	frexpf(a, &e);          /* a = m * 2^e, m in [0.5, 1) */
	int exp = e - 1 + 15;    /* biased exponent of 1.m form */
	if (exp <= 0) return sign | (uint16_t)lrintf(ldexpf(a, 24));
	if (exp >= 31) return sign | 0x7c00;
	uint32_t man = (uint32_t)lrintf(ldexpf(a, 10 - (e - 1))); /* 1.m * 2^10 */
	if (man == 0x800) { man = 0x400; exp++; }
	if (exp >= 31) return sign | 0x7c00;
	return sign | (uint16_t)(exp << 10) | (uint16_t)(man & 0x3ff);
}

static float bf16_to_float(uint16_t b) {
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Round to nearest, ties to even; a NaN stays a quiet NaN (the rounding
 * carry could otherwise turn it into infinity), as the CPU backend does. */
static uint16_t float_to_bf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)(u >> 16) | 0x40;
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static size_t elem_size(int type) { return type == CUDA_R_32F ? 4 : 2; }

static float load(const void *base, int type, int64_t i) {
	switch (type) {
	case CUDA_R_32F: return ((const float *)base)[i];
	case CUDA_R_16F: return half_to_float(((const uint16_t *)base)[i]);
	default: return bf16_to_float(((const uint16_t *)base)[i]);
	}
}

static void store(void *base, int type, int64_t i, float v) {
	switch (type) {
	case CUDA_R_32F: ((float *)base)[i] = v; break;
	case CUDA_R_16F: ((uint16_t *)base)[i] = float_to_half(v); break;
	default: ((uint16_t *)base)[i] = float_to_bf16(v); break;
	}
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b,
                              const void *beta, const void *C, cublasLtMatrixLayout_t c,
                              void *D, cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspace_size, cudaStream_t stream) {
	uint64_t m, n, k;
	if (!h || h->magic != 0x17) return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!d || !alpha || !beta || !A || !B || !C || !D || !algo) return CUBLAS_STATUS_INVALID_VALUE;
	if (!shapes(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
	for (int i = 0; i < 6; i++)
		if (algo->data[i] != ALGO_MAGIC + (uint64_t)i * 0x1111) return CUBLAS_STATUS_INVALID_VALUE;
	/* Every batch's pointers must have the alignment the algorithm was
	 * chosen for; a misaligned operand is refused rather than read. */
	{
		const void *base[4] = {A, B, C, D};
		cublasLtMatrixLayout_t lay[4] = {a, b, c, dd};
		for (int i = 0; i < 4; i++) {
			uint64_t al = (algo->data[6] >> (16 * i)) & 0xffff;
			if (al == 0) return CUBLAS_STATUS_INVALID_VALUE;
			for (int32_t bt = 0; bt < lay[i]->batch; bt++) {
				uintptr_t ptr = (uintptr_t)base[i] + (uintptr_t)(bt * lay[i]->stride) * elem_size(lay[i]->type);
				if (ptr % al) {
					misaligned++;
					return CUBLAS_STATUS_NOT_SUPPORTED;
				}
			}
		}
	}
	if (workspace_size < algo->data[7] || (algo->data[7] && !workspace)) return CUBLAS_STATUS_INVALID_VALUE;
	last_stream = stream;
	last_workspace = workspace;
	last_workspace_size = workspace_size;
	float al = *(const float *)alpha, be = *(const float *)beta;
	last_alpha = al;
	last_beta = be;
	matmuls++;
	for (int32_t bt = 0; bt < a->batch; bt++) {
		const char *Ab = (const char *)A + (size_t)(bt * a->stride) * elem_size(a->type);
		const char *Bb = (const char *)B + (size_t)(bt * b->stride) * elem_size(b->type);
		const char *Cb = (const char *)C + (size_t)(bt * c->stride) * elem_size(c->type);
		char *Db = (char *)D + (size_t)(bt * dd->stride) * elem_size(dd->type);
		for (uint64_t j = 0; j < n; j++) {
			for (uint64_t i = 0; i < m; i++) {
				float acc = 0;
				for (uint64_t p = 0; p < k; p++) {
					int64_t ai = d->transa == CUBLAS_OP_N ? (int64_t)(i + p * a->ld) : (int64_t)(p + i * a->ld);
					int64_t bi = d->transb == CUBLAS_OP_N ? (int64_t)(p + j * b->ld) : (int64_t)(j + p * b->ld);
					acc += load(Ab, a->type, ai) * load(Bb, b->type, bi);
				}
				float old = be != 0 ? load(Cb, c->type, (int64_t)(i + j * c->ld)) : 0;
				store(Db, dd->type, (int64_t)(i + j * dd->ld), al * acc + be * old);
			}
		}
	}
	return CUBLAS_STATUS_SUCCESS;
}

/* Introspection for the tests. */
int fake_misaligned(void) { return misaligned; }
long fake_live(void) { return live; }
void *fake_last_stream(void) { return last_stream; }
void *fake_last_workspace(void) { return last_workspace; }
size_t fake_last_workspace_size(void) { return last_workspace_size; }
float fake_last_alpha(void) { return last_alpha; }
float fake_last_beta(void) { return last_beta; }
int fake_matmuls(void) { return matmuls; }
size_t fake_heuristic_size(void) { return sizeof(cublasLtMatmulHeuristicResult_t); }
size_t fake_heuristic_offset(int field) {
	switch (field) {
	case 0: return offsetof(cublasLtMatmulHeuristicResult_t, algo);
	case 1: return offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize);
	case 2: return offsetof(cublasLtMatmulHeuristicResult_t, state);
	case 3: return offsetof(cublasLtMatmulHeuristicResult_t, wavesCount);
	case 4: return offsetof(cublasLtMatmulHeuristicResult_t, reserved);
	}
	return (size_t)-1;
}
