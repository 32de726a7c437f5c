// common.cuh — the prelude that Go prepends to every kernel source.
//
// It must compile in three places without any #include: NVRTC (which
// provides the CUDA builtins and math functions itself), clang in CUDA
// mode with -nocudainc (which provides neither, so this file declares
// them), and g++ through the emulator's shim (emu/csrc/emu.h, which defines
// GC_EMU and every builtin before this file is read).
//
// Kernels reach warps and blocks only through the gc_ helpers below, so
// each of the three worlds needs to supply just these few primitives.

#if defined(GC_EMU)
// The emulator's shim has defined the builtins, the math functions and
// gc_shfl_xor, gc_ballot, gc_popc and gc_atomic_max_int; its atomicAdd
// serves gc_atomic_add_int. g++ would warn about (and -Werror refuse) an
// unroll pragma, and unrolling changes nothing there.
static inline int gc_atomic_add_int(int* p, int v) { return atomicAdd(p, v); }
#define GC_UNROLL

#elif defined(__clang__) && !defined(__CUDACC_RTC__)
// clang -x cuda -nocudainc: no CUDA headers, so the builtin variables,
// the warp primitives and the libdevice math entry points are declared
// here. The NVPTX special registers are read through clang builtins.
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))

struct gc_reg_tid {
  __declspec(property(get = get_x)) unsigned x;
  static __device__ unsigned get_x() { return __nvvm_read_ptx_sreg_tid_x(); }
};
struct gc_reg_ctaid {
  __declspec(property(get = get_x)) unsigned x;
  static __device__ unsigned get_x() { return __nvvm_read_ptx_sreg_ctaid_x(); }
};
struct gc_reg_ntid {
  __declspec(property(get = get_x)) unsigned x;
  static __device__ unsigned get_x() { return __nvvm_read_ptx_sreg_ntid_x(); }
};
struct gc_reg_nctaid {
  __declspec(property(get = get_x)) unsigned x;
  static __device__ unsigned get_x() { return __nvvm_read_ptx_sreg_nctaid_x(); }
};
extern const __device__ gc_reg_tid threadIdx;
extern const __device__ gc_reg_ctaid blockIdx;
extern const __device__ gc_reg_ntid blockDim;
extern const __device__ gc_reg_nctaid gridDim;

extern "C" __device__ float __nv_expf(float);
extern "C" __device__ float __nv_logf(float);
extern "C" __device__ float __nv_tanhf(float);
extern "C" __device__ float __nv_sqrtf(float);
extern "C" __device__ double __nv_sqrt(double);
extern "C" __device__ double __nv_log(double);
extern "C" __device__ double __nv_exp(double);
extern "C" __device__ double __nv_pow(double, double);
extern "C" __device__ double __nv_sin(double);
extern "C" __device__ double __nv_cos(double);
extern "C" __device__ double __nv_erfc(double);
static __device__ __forceinline__ float expf(float x) { return __nv_expf(x); }
static __device__ __forceinline__ float logf(float x) { return __nv_logf(x); }
static __device__ __forceinline__ float tanhf(float x) { return __nv_tanhf(x); }
static __device__ __forceinline__ float sqrtf(float x) { return __nv_sqrtf(x); }
static __device__ __forceinline__ double sqrt(double x) { return __nv_sqrt(x); }
static __device__ __forceinline__ double log(double x) { return __nv_log(x); }
static __device__ __forceinline__ double exp(double x) { return __nv_exp(x); }
static __device__ __forceinline__ double pow(double x, double y) { return __nv_pow(x, y); }
static __device__ __forceinline__ double sin(double x) { return __nv_sin(x); }
static __device__ __forceinline__ double cos(double x) { return __nv_cos(x); }
static __device__ __forceinline__ double erfc(double x) { return __nv_erfc(x); }
static __device__ __forceinline__ float fabsf(float x) { return __builtin_fabsf(x); }
// __syncthreads is a clang builtin for NVPTX.

static __device__ __forceinline__ int gc_shfl_xor(int v, int lane_mask) {
  return __nvvm_shfl_sync_bfly_i32(0xffffffffu, v, lane_mask, 0x1f);
}
static __device__ __forceinline__ float gc_shfl_xor(float v, int lane_mask) {
  return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, lane_mask, 0x1f);
}
static __device__ __forceinline__ long long gc_shfl_xor(long long v, int lane_mask) {
  const int lo = __nvvm_shfl_sync_bfly_i32(0xffffffffu, (int)v, lane_mask, 0x1f);
  const int hi = __nvvm_shfl_sync_bfly_i32(0xffffffffu, (int)(v >> 32), lane_mask, 0x1f);
  return (long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}
static __device__ __forceinline__ double gc_shfl_xor(double v, int lane_mask) {
  return __builtin_bit_cast(double, gc_shfl_xor(__builtin_bit_cast(long long, v), lane_mask));
}
static __device__ __forceinline__ unsigned gc_ballot(bool p) {
  return __nvvm_vote_ballot_sync(0xffffffffu, p);
}
static __device__ __forceinline__ int gc_popc(unsigned v) { return __builtin_popcount(v); }
static __device__ __forceinline__ void gc_atomic_max_int(int* p, int v) { __nvvm_atom_max_gen_i(p, v); }
static __device__ __forceinline__ int gc_atomic_add_int(int* p, int v) { return __nvvm_atom_add_gen_i(p, v); }
#define GC_UNROLL _Pragma("unroll")

#else
// NVRTC and nvcc: the builtins exist; only the gc_ wrappers are needed.
template <typename T>
static __device__ __forceinline__ T gc_shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
static __device__ __forceinline__ unsigned gc_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
static __device__ __forceinline__ int gc_popc(unsigned v) { return __popc(v); }
static __device__ __forceinline__ void gc_atomic_max_int(int* p, int v) { atomicMax(p, v); }
static __device__ __forceinline__ int gc_atomic_add_int(int* p, int v) { return atomicAdd(p, v); }
#define GC_UNROLL _Pragma("unroll")
#endif

// ---- Loops --------------------------------------------------------------

// GC_FOR_EACH visits i in [0, n) with a grid-stride loop: correct for any
// grid and block size, each index exactly once.
#define GC_FOR_EACH(i, n)                                                        \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)blockDim.x * gridDim.x)

// GC_FOR_ROWS gives each block whole rows: row blockIdx.x, then
// blockIdx.x + gridDim.x, … so a grid smaller than rows still covers them.
#define GC_FOR_ROWS(r, rows) for (long long r = blockIdx.x; r < (rows); r += gridDim.x)

// GC_FOR_ROW strides the block's threads over the n elements of one row.
#define GC_FOR_ROW(j, n) for (long long j = threadIdx.x; j < (n); j += blockDim.x)

// ---- Scalars ------------------------------------------------------------

static __device__ __forceinline__ unsigned gc_float_bits(float f) {
  union { float f; unsigned u; } c;
  c.f = f;
  return c.u;
}

static __device__ __forceinline__ float gc_bits_float(unsigned u) {
  union { float f; unsigned u; } c;
  c.u = u;
  return c.f;
}

static __device__ __forceinline__ bool gc_nonfinite(float x) {
  return (gc_float_bits(x) & 0x7f800000u) == 0x7f800000u;
}

// gc_max and gc_min propagate a NaN from either side, as Go's built-in
// max and min do (fmaxf would drop it and hide a NaN in the data).
template <typename T>
static __device__ __forceinline__ T gc_max(T a, T b) { return (b > a || b != b) ? b : a; }
template <typename T>
static __device__ __forceinline__ T gc_min(T a, T b) { return (b < a || b != b) ? b : a; }

// gc_inv_sqrt is 1/√x, and 0 at x = 0 so a zero gradient with a zero
// second moment moves nothing (kernels/cpu's invSqrt).
static __device__ __forceinline__ double gc_inv_sqrt(double x) { return x == 0 ? 0.0 : 1.0 / sqrt(x); }

static __device__ __forceinline__ float gc_neg_inf() { return gc_bits_float(0xff800000u); }

// A double that must outlive a kernel (a partial sum, a row statistic)
// is kept in a float buffer as two floats, hi + lo, which carry about 48
// bits: buffers stay float-only and the value loses almost nothing.
static __device__ __forceinline__ void gc_store_pair(float* p, double v) {
  float hi = (float)v;
  p[0] = hi;
  p[1] = (float)(v - (double)hi);
}

static __device__ __forceinline__ double gc_load_pair(const float* p) {
  return (double)p[0] + (double)p[1];
}

// ---- 16-bit floats ------------------------------------------------------
// Written by hand so that every backend rounds the same way: round to
// nearest, ties to even, as kernels/cpu/half.go (bf16) and
// github.com/x448/float16 (fp16) do, bit for bit.

// gc_f16_from_f32 rounds to IEEE binary16. Overflow gives ±Inf, tiny
// values become subnormals or ±0, and a NaN keeps its top payload bits
// with the quiet bit set.
static __device__ __forceinline__ unsigned short gc_f16_from_f32(float f) {
  const unsigned u = gc_float_bits(f);
  const unsigned sign = (u >> 16) & 0x8000u;
  const unsigned exp = (u >> 23) & 0xffu;
  const unsigned man = u & 0x7fffffu;
  if (exp == 0xffu) {
    return (unsigned short)(sign | 0x7c00u | (man != 0 ? 0x200u | (man >> 13) : 0u));
  }
  const int e = (int)exp - 127 + 15;  // the binary16 biased exponent
  if (e >= 31) return (unsigned short)(sign | 0x7c00u);
  if (e <= 0) {
    // Subnormal (or zero): the implicit bit joins the mantissa and the
    // whole is shifted right; below 2^-25 nothing is left to round up.
    if (e < -10) return (unsigned short)sign;
    const unsigned full = man | 0x800000u;
    const unsigned shift = (unsigned)(14 - e);  // 14 … 24
    unsigned h = full >> shift;
    const unsigned rest = full & ((1u << shift) - 1u);
    const unsigned half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) h++;  // may carry into the exponent: fine
    return (unsigned short)(sign | h);
  }
  unsigned h = sign | ((unsigned)e << 10) | (man >> 13);
  const unsigned rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // a carry rounds up to ±Inf correctly
  return (unsigned short)h;
}

// gc_f32_from_f16 widens binary16 exactly; a NaN comes back quiet.
static __device__ __forceinline__ float gc_f32_from_f16(unsigned short h) {
  const unsigned sign = ((unsigned)h & 0x8000u) << 16;
  unsigned exp = ((unsigned)h >> 10) & 0x1fu;
  unsigned man = (unsigned)h & 0x3ffu;
  if (exp == 0x1fu) return gc_bits_float(sign | 0x7f800000u | (man != 0 ? 0x400000u : 0u) | (man << 13));
  if (exp == 0) {
    if (man == 0) return gc_bits_float(sign);
    // Subnormal: shift the leading one up to the implicit position.
    unsigned e = 113;  // 127 − 15 + 1
    while ((man & 0x400u) == 0) {
      man <<= 1;
      e--;
    }
    return gc_bits_float(sign | (e << 23) | ((man & 0x3ffu) << 13));
  }
  return gc_bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// gc_bf16_from_f32 keeps the top 16 bits, rounded to nearest even; a NaN
// keeps its sign and top payload and is made quiet.
static __device__ __forceinline__ unsigned short gc_bf16_from_f32(float f) {
  const unsigned u = gc_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  const unsigned lsb = (u >> 16) & 1u;
  return (unsigned short)((u + 0x7fffu + lsb) >> 16);
}

static __device__ __forceinline__ float gc_f32_from_bf16(unsigned short h) {
  return gc_bits_float((unsigned)h << 16);
}

// ---- Block reductions ---------------------------------------------------
// Fixed shapes, fixed order: a warp butterfly, then the first warp folds
// the per-warp results. For a given blockDim the order never changes, so
// results are bit-reproducible run to run. blockDim.x must be a multiple
// of 32 (at most 1024); every thread of the block must call these.

template <typename T>
static __device__ __forceinline__ T gc_warp_sum(T v) {
  for (int m = 16; m > 0; m >>= 1) v += gc_shfl_xor(v, m);
  return v;
}

template <typename T>
static __device__ __forceinline__ T gc_warp_max(T v) {
  for (int m = 16; m > 0; m >>= 1) v = gc_max(v, gc_shfl_xor(v, m));
  return v;
}

template <typename T>
static __device__ __forceinline__ T gc_block_sum(T v) {
  __shared__ T partial[32];
  __shared__ T total;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  v = gc_warp_sum(v);
  // A one-warp block (what the runtime gives a row of up to 32) needs no
  // shared memory or barrier; the result is the same (the missing warps
  // would only add zeros).
  if (blockDim.x == 32) return v;
  __syncthreads();  // readers of an earlier call are done with partial/total
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x >> 5) ? partial[lane] : (T)0;
    v = gc_warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// gc_block_max propagates NaN; the identity is the caller's lo (−Inf).
template <typename T>
static __device__ __forceinline__ T gc_block_max(T v, T lo) {
  __shared__ T partial[32];
  __shared__ T total;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  v = gc_warp_max(v);
  if (blockDim.x == 32) return v;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (blockDim.x >> 5) ? partial[lane] : lo;
    v = gc_warp_max(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// gc_row_max is the maximum of one row of n for the whole block: a NaN
// wins, an empty row gives −Inf. Every thread of the block must call it.
static __device__ __forceinline__ float gc_row_max(const float* x, long long n) {
  const float lo = gc_neg_inf();
  float m = lo;
  GC_FOR_ROW(j, n) m = gc_max(m, x[j]);
  return gc_block_max(m, lo);
}

// ---- Rows in registers ---------------------------------------------------
// A row kernel that needs statistics of its row before it can write it
// (softmax, LayerNorm, RMSNorm, the cross-entropy gradient) reads the row
// in sweeps of GC_ROW_CACHE·blockDim.x elements, thread t holding elements
// t, t + blockDim.x, … of a sweep in registers. A row that fits one sweep
// (up to 4096 floats at the runtime's 256 threads) is read from memory
// once and written from registers; a longer one is read once for the
// statistics and once more to write. A thread meets its elements in the
// same order either way (GC_FOR_ROW's), so a per-thread sum does not
// depend on which way ran.
#define GC_ROW_CACHE 16

#define GC_SWEEPS(base, n) \
  for (long long base = 0; base < (n); base += (long long)GC_ROW_CACHE * blockDim.x)

static __device__ __forceinline__ bool gc_row_fits(long long n) {
  return n <= (long long)GC_ROW_CACHE * blockDim.x;
}

// gc_sweep_at is the index in the row of this thread's element c of the
// sweep that starts at base.
static __device__ __forceinline__ long long gc_sweep_at(long long base, int c) {
  return base + threadIdx.x + (long long)c * blockDim.x;
}

// gc_sweep_load reads this thread's elements of a sweep of x (a row of n)
// into v, with 0 past the end of the row.
static __device__ __forceinline__ void gc_sweep_load(float (&v)[GC_ROW_CACHE], const float* x,
                                                     long long base, long long n) {
  GC_UNROLL
  for (int c = 0; c < GC_ROW_CACHE; c++) {
    const long long j = gc_sweep_at(base, c);
    v[c] = j < n ? x[j] : 0.0f;
  }
}

// ---- Mean and variance in one pass ----------------------------------------
// gc_moments is a count, a mean and the sum of squared deviations from that
// mean (Welford's M2). The moments of two disjoint parts merge without
// cancellation (Chan, Golub and LeVeque), so a row with a large mean keeps
// its variance, as the two-pass form does, from a single read.
struct gc_moments {
  double n, mean, m2;
};

static __device__ __forceinline__ gc_moments gc_moments_merge(gc_moments a, gc_moments b) {
  if (b.n == 0) return a;
  if (a.n == 0) return b;
  gc_moments r;
  r.n = a.n + b.n;
  const double d = b.mean - a.mean, f = b.n / r.n;
  r.mean = a.mean + d * f;
  r.m2 = a.m2 + b.m2 + d * d * a.n * f;
  return r;
}

// gc_sweep_moments are the moments of this thread's elements of one sweep
// (v as gc_sweep_load left it), two passes over the registers.
static __device__ __forceinline__ gc_moments gc_sweep_moments(const float (&v)[GC_ROW_CACHE],
                                                              long long base, long long n) {
  double s = 0;
  int k = 0;
  GC_UNROLL
  for (int c = 0; c < GC_ROW_CACHE; c++) {
    if (gc_sweep_at(base, c) < n) {
      s += (double)v[c];
      k++;
    }
  }
  gc_moments m = {(double)k, 0.0, 0.0};
  if (k == 0) return m;
  m.mean = s / (double)k;
  GC_UNROLL
  for (int c = 0; c < GC_ROW_CACHE; c++) {
    if (gc_sweep_at(base, c) < n) {
      const double d = (double)v[c] - m.mean;
      m.m2 += d * d;
    }
  }
  return m;
}

// gc_block_moments merges every thread's moments in a fixed order and
// returns the block's to every thread: a butterfly over each warp in which
// the lower lane's part always comes first (both lanes of a pair compute
// the same bits), then the warps in order. Every thread must call it.
static __device__ __forceinline__ gc_moments gc_block_moments(gc_moments m) {
  __shared__ gc_moments part[32];
  __shared__ gc_moments total;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int k = 1; k < 32; k <<= 1) {
    gc_moments o;
    o.n = gc_shfl_xor(m.n, k);
    o.mean = gc_shfl_xor(m.mean, k);
    o.m2 = gc_shfl_xor(m.m2, k);
    m = (lane & (unsigned)k) ? gc_moments_merge(o, m) : gc_moments_merge(m, o);
  }
  if (blockDim.x == 32) return m;
  __syncthreads();  // readers of an earlier call are done with part/total
  if (lane == 0) part[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    gc_moments t = part[0];
    for (unsigned w = 1; w < (blockDim.x >> 5); w++) t = gc_moments_merge(t, part[w]);
    total = t;
  }
  __syncthreads();
  return total;
}

// ---- Column reductions ----------------------------------------------------
// A reduction over the middle dim of [outer, r, inner] (bias and β
// gradients over leading dims, LayerNorm's and RMSNorm's γ gradients,
// Adafactor's and SM3's column statistics) gives each block tiles of cw
// adjacent columns of one outer index, cw = inner rounded up to a power of
// two, at most 32. Lane l of warp w takes column l mod cw and rows
// w·g + ⌊l/cw⌋, stepping by W·g (g = 32/cw rows per warp, W warps), so a
// warp's load is 32 adjacent floats (one 128-byte line) when cw = 32, or
// g whole rows of inner ≤ cw floats, and every warp of the block works on
// the tile at once. A thread per column, as before, left a column's r
// loads in a row to one thread, and a matrix with few columns to a handful
// of warps on the whole GPU; the bytes read (each element once) are the
// same, the loads in flight are blockDim/cw times more.
// Each thread folds its rows in increasing order; the lanes of a column
// meet in a fixed butterfly, the warps in warp order through shared
// memory. The result depends on blockDim alone (not on the grid or on
// timing), and no atomics are involved.
struct gc_cols {
  long long r, per, tiles, step;
  int cw, col, row0;
};

static __device__ __forceinline__ gc_cols gc_cols_of(long long outer, long long r, long long inner) {
  gc_cols g;
  g.cw = 1;
  while (g.cw < 32 && g.cw < inner) g.cw <<= 1;
  const int g_rows = 32 / g.cw;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  g.r = r;
  g.per = (inner + g.cw - 1) / g.cw;
  g.tiles = outer * g.per;
  g.col = (int)(lane & (unsigned)(g.cw - 1));
  g.row0 = (int)warp * g_rows + (int)(lane / (unsigned)g.cw);
  g.step = (long long)(blockDim.x >> 5) * g_rows;
  return g;
}

// gc_cols_column is the column this thread reads in tile t (inner or more
// when the tile overhangs the matrix: then it reads nothing), and *o the
// tile's outer index.
static __device__ __forceinline__ long long gc_cols_column(const gc_cols& g, long long t,
                                                           long long* o) {
  *o = t / g.per;
  return (t - *o * g.per) * g.cw + g.col;
}

// gc_cols_walk folds term(j) into acc over this thread's rows j in
// increasing order, issuing four loads before it adds them.
template <typename T, typename Term, typename Op>
static __device__ __forceinline__ T gc_cols_walk(const gc_cols& g, bool active, T acc, Term term,
                                                 Op op) {
  if (!active) return acc;
  const long long s = g.step;
  long long j = g.row0;
  for (; j + 3 * s < g.r; j += 4 * s) {
    const T a = term(j), b = term(j + s), c = term(j + 2 * s), d = term(j + 3 * s);
    acc = op(op(op(op(acc, a), b), c), d);
  }
  for (; j < g.r; j += s) acc = op(acc, term(j));
  return acc;
}

// gc_cols_combine folds the threads' partials of each column of the tile
// and returns the column's total to every thread of it. Every thread of
// the block must call it.
template <typename T, typename Op>
static __device__ __forceinline__ T gc_cols_combine(const gc_cols& g, T v, Op op) {
  __shared__ T part[32][32];
  __shared__ T total[32];
  for (int m = 16; m >= g.cw; m >>= 1) v = op(v, gc_shfl_xor(v, m));
  if (blockDim.x == 32) return v;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  __syncthreads();  // readers of an earlier tile are done with total
  if (lane < (unsigned)g.cw) part[warp][lane] = v;
  __syncthreads();
  if (threadIdx.x < (unsigned)g.cw) {
    T t = part[0][threadIdx.x];
    for (unsigned w = 1; w < (blockDim.x >> 5); w++) t = op(t, part[w][threadIdx.x]);
    total[threadIdx.x] = t;
  }
  __syncthreads();
  return total[g.col];
}

struct gc_add_op {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

struct gc_max_op {
  template <typename T>
  __device__ T operator()(T a, T b) const { return gc_max(a, b); }
};

// Constants of GELU's tanh approximation.
#define GC_GELU_C 0.7978845608028654f  // √(2/π)
#define GC_GELU_A 0.044715f
