// nn.cu — softmax, the causal mask, LayerNorm, RMSNorm, rotary position
// embeddings, embeddings and the cross-entropy loss, with their gradients
// and the vocab-parallel pieces.
// Row kernels give one block per row (GC_FOR_ROWS also covers a grid
// smaller than rows; the runtime sizes the block to the row, so a row of
// up to 32 gets one warp and reduces with shuffles alone) and stride the
// block over the row; statistics and sums are kept in double, as the CPU
// kernels do, while exp and log run in float. Kernels that need a row's
// statistics before writing it read the row in register sweeps
// (common.cuh's GC_ROW_CACHE): one read when the row fits, else one read
// for the statistics and one to write, never a read per statistic.

// gc_lse_sweep folds one sweep of registers (v, from gc_sweep_load) into a
// thread's running softmax statistics: *m its largest element so far and
// *s = Σ exp(x − *m). The sweep's own max comes first, the exps run in
// float against it, and when the running max moves the old sum is
// rescaled once in double (an online softmax, one rescale per sweep
// rather than per element). A sweep of nothing but −Inf adds nothing.
static __device__ __forceinline__ void gc_lse_sweep(float* m, double* s,
                                                    const float (&v)[GC_ROW_CACHE], long long base,
                                                    long long n) {
  float mc = gc_neg_inf();
  GC_UNROLL
  for (int c = 0; c < GC_ROW_CACHE; c++) {
    if (gc_sweep_at(base, c) < n) mc = gc_max(mc, v[c]);
  }
  if (mc == gc_neg_inf()) return;
  double sc = 0;
  GC_UNROLL
  for (int c = 0; c < GC_ROW_CACHE; c++) {
    if (gc_sweep_at(base, c) < n) sc += (double)expf(v[c] - mc);
  }
  const float mn = gc_max(*m, mc);
  *s = *s * exp((double)*m - (double)mn) + sc * exp((double)mc - (double)mn);
  *m = mn;
}

// gc_block_lse gives every thread the row's max *M and *S = Σ exp(x − *M)
// from the threads' running statistics. A NaN or +Inf max makes *S NaN.
static __device__ __forceinline__ void gc_block_lse(float m, double s, float* M, double* S) {
  const float lo = gc_neg_inf();
  const float mm = gc_block_max(m, lo);
  *S = gc_block_sum(m == lo ? 0.0 : s * exp((double)m - (double)mm));
  *M = mm;
}

// gc_row_lse runs the sweeps over one row of n for the whole block; v
// holds the row afterwards when it fits one sweep.
static __device__ __forceinline__ void gc_row_lse(const float* x, long long n,
                                                  float (&v)[GC_ROW_CACHE], float* M, double* S) {
  float m = gc_neg_inf();
  double s = 0;
  GC_SWEEPS(base, n) {
    gc_sweep_load(v, x, base, n);
    gc_lse_sweep(&m, &s, v, base, n);
  }
  gc_block_lse(m, s, M, S);
}

// gc_softmax: out = exp(x − max)/Σ per row of n. A row that is all −Inf
// (fully masked) becomes zeros rather than NaNs. out may be x.
// Shaped as an online softmax: the max and the sum come from one read of
// the row (gc_row_lse), where the block used to read it three times (max,
// then exp with a store, then a rescale of what it had stored). Memory
// traffic per element: 12 bytes read/written before (3 reads of x or out,
// 2 writes), 8 after for rows of up to GC_ROW_CACHE·blockDim (the values
// stay in registers: 1 read, 1 write), 12 for longer rows (2 reads, 1
// write).
extern "C" __global__ void gc_softmax(float* out, const float* x, long long rows, long long n) {
  const float lo = gc_neg_inf();
  const bool fits = gc_row_fits(n);
  GC_FOR_ROWS(r, rows) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float v[GC_ROW_CACHE];
    float m;
    double s;
    gc_row_lse(xr, n, v, &m, &s);
    if (m == lo) {
      GC_FOR_ROW(j, n) o[j] = 0.0f;
      continue;
    }
    const double inv = 1.0 / s;
    if (fits) {
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) o[j] = (float)((double)expf(v[c] - m) * inv);
      }
    } else {
      GC_FOR_ROW(j, n) o[j] = (float)((double)expf(xr[j] - m) * inv);
    }
  }
}

// gc_softmax_grad: dx = y·(dy − Σ dy·y) per row, y the saved softmax. dx
// may be y or dy. y and dy stay in registers between the dot product and
// the write when the row fits: 12 bytes per element (2 reads, 1 write)
// instead of 20 (the dot product read both, the write read both again).
extern "C" __global__ void gc_softmax_grad(float* dx, const float* y, const float* dy, long long rows,
                                           long long n) {
  const bool fits = gc_row_fits(n);
  GC_FOR_ROWS(r, rows) {
    const float *yr = y + r * n, *gr = dy + r * n;
    float* d = dx + r * n;
    float yv[GC_ROW_CACHE], gv[GC_ROW_CACHE];
    double dot = 0;
    GC_SWEEPS(base, n) {
      gc_sweep_load(yv, yr, base, n);
      gc_sweep_load(gv, gr, base, n);
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        if (gc_sweep_at(base, c) < n) dot += (double)yv[c] * (double)gv[c];
      }
    }
    dot = gc_block_sum(dot);
    if (fits) {
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) d[j] = (float)((double)yv[c] * ((double)gv[c] - dot));
      }
    } else {
      GC_FOR_ROW(j, n) d[j] = (float)((double)yr[j] * ((double)gr[j] - dot));
    }
  }
}

// gc_causal_mask views x as rows = batch·s query rows of t keys, queries
// aligned to the end of the keys: query q sees keys j ≤ q + t − s. Hidden
// entries become fill (−Inf forward; 0 makes it its own gradient).
extern "C" __global__ void gc_causal_mask(float* out, const float* x, long long rows, long long s,
                                          long long t, float fill) {
  GC_FOR_EACH(i, rows * t) {
    const long long row = i / t, j = i - row * t, q = row % s;
    out[i] = j <= q + (t - s) ? x[i] : fill;
  }
}

// gc_ln_stats gives every thread of the block a row's mean and
// 1/√(var + eps) (biased variance), in double. A row that fits one sweep
// is read once into v (which keeps it) and its statistics are the CPU's
// two passes over the registers; a longer row is read once, each sweep's
// moments merged into the thread's (Chan's update, gc_moments) and the
// threads' merged in a fixed order: one read and no cancellation, where
// the two passes used to read the row twice. n must be at least 1.
static __device__ __forceinline__ void gc_ln_stats(const float* x, long long n, float eps,
                                                   float (&v)[GC_ROW_CACHE], double* mean,
                                                   double* rstd) {
  if (gc_row_fits(n)) {
    gc_sweep_load(v, x, 0, n);
    double s = 0;
    GC_UNROLL
    for (int c = 0; c < GC_ROW_CACHE; c++) {
      if (gc_sweep_at(0, c) < n) s += (double)v[c];
    }
    const double mu = gc_block_sum(s) / (double)n;
    double q = 0;
    GC_UNROLL
    for (int c = 0; c < GC_ROW_CACHE; c++) {
      if (gc_sweep_at(0, c) < n) {
        const double d = (double)v[c] - mu;
        q += d * d;
      }
    }
    *mean = mu;
    *rstd = 1.0 / sqrt(gc_block_sum(q) / (double)n + (double)eps);
    return;
  }
  gc_moments m = {0.0, 0.0, 0.0};
  GC_SWEEPS(base, n) {
    gc_sweep_load(v, x, base, n);
    m = gc_moments_merge(m, gc_sweep_moments(v, base, n));
  }
  m = gc_block_moments(m);
  *mean = m.mean;
  *rstd = 1.0 / sqrt(m.m2 / (double)n + (double)eps);
}

// gc_layernorm: out = (x − μ)/√(σ² + eps)·γ + β per row of n. out may be x.
// One read of x and one write per element for rows that fit the
// registers (12 bytes per element before: x read for the mean, the
// variance and the output), 8 + 4 bytes for longer rows.
extern "C" __global__ void gc_layernorm(float* out, const float* x, const float* gamma,
                                        const float* beta, long long rows, long long n, float eps) {
  if (n == 0) return;
  const bool fits = gc_row_fits(n);
  GC_FOR_ROWS(r, rows) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float v[GC_ROW_CACHE];
    double mean, rstd;
    gc_ln_stats(xr, n, eps, v, &mean, &rstd);
    if (fits) {
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) o[j] = (float)(((double)v[c] - mean) * rstd * (double)gamma[j] + (double)beta[j]);
      }
    } else {
      GC_FOR_ROW(j, n) o[j] = (float)(((double)xr[j] - mean) * rstd * (double)gamma[j] + (double)beta[j]);
    }
  }
}

// gc_layernorm_grad_x: with x̂ the normalised input and g = dy·γ,
// dx = (g − mean(g) − x̂·mean(g·x̂))/√(σ² + eps); the statistics are
// recomputed from x. dx may be dy.
// Rows that fit keep x and dy in registers: x and dy are read once (8
// bytes per element, plus the 4 written) where they were read four and
// two times (24 bytes). Longer rows gather everything in one pass, the
// moments of x with Σg and Σg·(x − x₀) (x₀ the row's first element, a
// shift that keeps the sum from cancelling when the mean is large), and
// read x and dy once more to write: 16 bytes read per element.
extern "C" __global__ void gc_layernorm_grad_x(float* dx, const float* x, const float* gamma,
                                               const float* dy, long long rows, long long n,
                                               float eps) {
  if (n == 0) return;
  const bool fits = gc_row_fits(n);
  GC_FOR_ROWS(r, rows) {
    const float *xr = x + r * n, *gr = dy + r * n;
    float* d = dx + r * n;
    float xv[GC_ROW_CACHE], gv[GC_ROW_CACHE];
    double mean, rstd, sg = 0, sgx = 0;
    if (fits) {
      gc_ln_stats(xr, n, eps, xv, &mean, &rstd);
      gc_sweep_load(gv, gr, 0, n);
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) {
          const double g = (double)gv[c] * (double)gamma[j];
          sg += g;
          sgx += g * (((double)xv[c] - mean) * rstd);
        }
      }
      sg = gc_block_sum(sg) / (double)n;
      sgx = gc_block_sum(sgx) / (double)n;
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) {
          const double g = (double)gv[c] * (double)gamma[j];
          const double xh = ((double)xv[c] - mean) * rstd;
          d[j] = (float)((g - sg - xh * sgx) * rstd);
        }
      }
      continue;
    }
    const double x0 = (double)xr[0];
    gc_moments m = {0.0, 0.0, 0.0};
    GC_SWEEPS(base, n) {
      gc_sweep_load(xv, xr, base, n);
      gc_sweep_load(gv, gr, base, n);
      m = gc_moments_merge(m, gc_sweep_moments(xv, base, n));
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(base, c);
        if (j < n) {
          const double g = (double)gv[c] * (double)gamma[j];
          sg += g;
          sgx += g * ((double)xv[c] - x0);
        }
      }
    }
    m = gc_block_moments(m);
    mean = m.mean;
    rstd = 1.0 / sqrt(m.m2 / (double)n + (double)eps);
    sg = gc_block_sum(sg);
    sgx = gc_block_sum(sgx);
    sgx = (sgx - (mean - x0) * sg) * rstd / (double)n;  // Σg·x̂/n
    sg /= (double)n;
    GC_FOR_ROW(j, n) {
      const double g = (double)gr[j] * (double)gamma[j];
      const double xh = ((double)xr[j] - mean) * rstd;
      d[j] = (float)((g - sg - xh * sgx) * rstd);
    }
  }
}

// gc_layernorm_stats stores each row's mean and 1/√(var + eps) as two
// float pairs at stats[4·row]: the first step of the γ gradient. One read
// of x (two before).
extern "C" __global__ void gc_layernorm_stats(float* stats, const float* x, long long rows,
                                              long long n, float eps) {
  if (n == 0) return;
  GC_FOR_ROWS(r, rows) {
    float v[GC_ROW_CACHE];
    double mean, rstd;
    gc_ln_stats(x + r * n, n, eps, v, &mean, &rstd);
    if (threadIdx.x == 0) {
      gc_store_pair(stats + 4 * r, mean);
      gc_store_pair(stats + 4 * r + 2, rstd);
    }
  }
}

// gc_layernorm_grad_gamma: dγ[j] = Σ_rows dy·x̂, x̂ from the stats that
// gc_layernorm_stats left. A column reduction over tiles (gc_cols) where
// it was a thread per column: the same 8 bytes per element (x and dy) and
// a broadcast of the row's stats, but with the block's warps splitting the
// rows of 32 columns. Deterministic; the order differs from the CPU's
// serial one, so the last bit may.
extern "C" __global__ void gc_layernorm_grad_gamma(float* dgamma, const float* x, const float* dy,
                                                   const float* stats, long long rows,
                                                   long long n) {
  const gc_cols g = gc_cols_of(1, rows, n);
  GC_FOR_ROWS(t, g.tiles) {
    long long o;
    const long long k = gc_cols_column(g, t, &o);
    double acc = gc_cols_walk(
        g, k < n, 0.0,
        [&](long long r) {
          const double mean = gc_load_pair(stats + 4 * r), rstd = gc_load_pair(stats + 4 * r + 2);
          return (double)dy[r * n + k] * ((double)x[r * n + k] - mean) * rstd;
        },
        gc_add_op());
    acc = gc_cols_combine(g, acc, gc_add_op());
    if (threadIdx.x < (unsigned)g.cw && k < n) dgamma[k] = (float)acc;
  }
}

// gc_rms_sweeps returns a row's 1/√(mean(x²) + eps) for the whole block,
// the sum of squares in double (no centring, so one pass loses nothing);
// v holds the row afterwards when it fits one sweep.
static __device__ __forceinline__ double gc_rms_sweeps(const float* x, long long n, float eps,
                                                       float (&v)[GC_ROW_CACHE]) {
  double s = 0;
  GC_SWEEPS(base, n) {
    gc_sweep_load(v, x, base, n);
    GC_UNROLL
    for (int c = 0; c < GC_ROW_CACHE; c++) {
      if (gc_sweep_at(base, c) < n) s += (double)v[c] * (double)v[c];
    }
  }
  return 1.0 / sqrt(gc_block_sum(s) / (double)n + (double)eps);
}

// gc_rmsnorm: out = x/√(mean(x²) + eps)·γ per row of n. out may be x.
// 8 bytes per element (x read once, out written) for rows that fit the
// registers, where x used to be read twice (12).
extern "C" __global__ void gc_rmsnorm(float* out, const float* x, const float* gamma, long long rows,
                                      long long n, float eps) {
  const bool fits = gc_row_fits(n);
  GC_FOR_ROWS(r, rows) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    float v[GC_ROW_CACHE];
    const double rs = gc_rms_sweeps(xr, n, eps, v);
    if (fits) {
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) o[j] = (float)((double)v[c] * rs * (double)gamma[j]);
      }
    } else {
      GC_FOR_ROW(j, n) o[j] = (float)((double)xr[j] * rs * (double)gamma[j]);
    }
  }
}

// gc_rmsnorm_grad_x: with r = 1/√(mean(x²) + eps), x̂ = x·r and g = dy·γ,
// dx = r·(g − x̂·mean(g·x̂)); r is recomputed from x. dx may be dy.
// Rows that fit keep x and dy in registers (x and dy read once: 12 bytes
// per element with the write, where x was read three times and dy twice:
// 24); longer rows take Σx² and Σg·x in one pass and read x and dy once
// more to write (20).
extern "C" __global__ void gc_rmsnorm_grad_x(float* dx, const float* x, const float* gamma,
                                             const float* dy, long long rows, long long n,
                                             float eps) {
  const bool fits = gc_row_fits(n);
  GC_FOR_ROWS(r, rows) {
    const float *xr = x + r * n, *gr = dy + r * n;
    float* d = dx + r * n;
    float xv[GC_ROW_CACHE], gv[GC_ROW_CACHE];
    if (fits) {
      const double rs = gc_rms_sweeps(xr, n, eps, xv);
      gc_sweep_load(gv, gr, 0, n);
      double sgx = 0;
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) sgx += (double)gv[c] * (double)gamma[j] * (double)xv[c] * rs;
      }
      sgx = gc_block_sum(sgx) / (double)n;
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < n) {
          const double g = (double)gv[c] * (double)gamma[j];
          d[j] = (float)((g - (double)xv[c] * rs * sgx) * rs);
        }
      }
      continue;
    }
    double ss = 0, sgx = 0;
    GC_SWEEPS(base, n) {
      gc_sweep_load(xv, xr, base, n);
      gc_sweep_load(gv, gr, base, n);
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(base, c);
        if (j < n) {
          ss += (double)xv[c] * (double)xv[c];
          sgx += (double)gv[c] * (double)gamma[j] * (double)xv[c];
        }
      }
    }
    const double rs = 1.0 / sqrt(gc_block_sum(ss) / (double)n + (double)eps);
    sgx = gc_block_sum(sgx) * rs / (double)n;
    GC_FOR_ROW(j, n) {
      const double g = (double)gr[j] * (double)gamma[j];
      d[j] = (float)((g - (double)xr[j] * rs * sgx) * rs);
    }
  }
}

// gc_rmsnorm_stats stores each row's 1/√(mean(x²) + eps) as a float pair
// at stats[2·row]: the first step of the γ gradient (one read of x, as
// before).
extern "C" __global__ void gc_rmsnorm_stats(float* stats, const float* x, long long rows, long long n,
                                            float eps) {
  GC_FOR_ROWS(r, rows) {
    float v[GC_ROW_CACHE];
    const double rs = gc_rms_sweeps(x + r * n, n, eps, v);
    if (threadIdx.x == 0) gc_store_pair(stats + 2 * r, rs);
  }
}

// gc_rmsnorm_grad_gamma: dγ[j] = Σ_rows dy·x̂, x̂ from the scales that
// gc_rmsnorm_stats left; column tiles as gc_layernorm_grad_gamma (the
// same 8 bytes per element, the block's warps on each tile).
extern "C" __global__ void gc_rmsnorm_grad_gamma(float* dgamma, const float* x, const float* dy,
                                                 const float* stats, long long rows, long long n) {
  const gc_cols g = gc_cols_of(1, rows, n);
  GC_FOR_ROWS(t, g.tiles) {
    long long o;
    const long long k = gc_cols_column(g, t, &o);
    double acc = gc_cols_walk(
        g, k < n, 0.0,
        [&](long long r) {
          return (double)dy[r * n + k] * (double)x[r * n + k] * gc_load_pair(stats + 2 * r);
        },
        gc_add_op());
    acc = gc_cols_combine(g, acc, gc_add_op());
    if (threadIdx.x < (unsigned)g.cw && k < n) dgamma[k] = (float)acc;
  }
}

// gc_rope applies rotary position embeddings in Hugging Face Llama's
// rotate-half layout: x is rows of d = 2·half elements, row r the
// (r mod positions)-th of its sequence, at position first + that below brk
// and second + that − brk from it (a device's chunks of a sequence split
// over a context-parallel axis; 0, positions, 0 for a whole sequence),
// and elements i and i + half of a row turn together
// by p·theta^(−2i/d) (minus that when inverse is not 0, the transpose and
// so the vjp):
//   out[i]      = x[i]·cos − x[i+half]·sin
//   out[i+half] = x[i+half]·cos + x[i]·sin
// The angle (pow, sin, cos) and the products are double, rounded to float
// once, as the CPU kernel; theta arrives as a float and is widened. One
// thread per pair; out must not be x.
extern "C" __global__ void gc_rope(float* out, const float* x, long long rows, long long positions,
                                   long long first, long long brk, long long second, long long half, float theta,
                                   int inverse) {
  const long long d = 2 * half;
  GC_FOR_EACH(e, rows * half) {
    const long long r = e / half, i = e - r * half, local = r % positions;
    const long long p = local < brk ? first + local : second + local - brk;
    const double angle = (double)p * pow((double)theta, -2.0 * (double)i / (double)d);
    const double cs = cos(angle), sn = inverse ? -sin(angle) : sin(angle);
    const float* xr = x + r * d;
    float* o = out + r * d;
    const double a = (double)xr[i], b = (double)xr[i + half];
    o[i] = (float)(a * cs - b * sn);
    o[i + half] = (float)(b * cs + a * sn);
  }
}

// gc_embedding gathers rows of table ([vocab, dim]): out[i,:] =
// table[ids[i],:]. An id outside [0, vocab) gives a zero row and sets
// status[0] to 1; the caller zeroes status before and checks it after
// (then names the bad id from its host copy of the ids).
extern "C" __global__ void gc_embedding(float* out, int* status, const float* table, const int* ids,
                                        long long count, long long vocab, long long dim) {
  GC_FOR_EACH(e, count * dim) {
    const long long i = e / dim, j = e - i * dim;
    const int id = ids[i];
    if (id < 0 || id >= vocab) {
      out[e] = 0.0f;
      if (j == 0) gc_atomic_max_int(status, 1);
      continue;
    }
    out[e] = table[(long long)id * dim + j];
  }
}

// gc_embedding_range is the vocab-parallel lookup: this device holds
// rows [offset, offset+rows) of the table and gives zero rows for ids
// outside them, so the devices' results add up to the whole lookup.
extern "C" __global__ void gc_embedding_range(float* out, const float* table, const int* ids,
                                              long long count, long long offset, long long rows,
                                              long long dim) {
  GC_FOR_EACH(e, count * dim) {
    const long long i = e / dim, j = e - i * dim;
    const long long r = (long long)ids[i] - offset;
    out[e] = (r >= 0 && r < rows) ? table[r * dim + j] : 0.0f;
  }
}

// ---- The embedding gradient ----------------------------------------------
// dtable ([vocab, dim]: the rows [offset, offset+vocab) of a [total, dim]
// table, all of it unless the table is split by rows across devices) =
// Σ over positions i with ids[i] = offset+v of dy[i,:]. Each sum runs in
// increasing position order, in float, as the CPU kernel's serial loop,
// so the result is its to the last bit and does not vary run to run.
// A counting sort of the positions by row gives every row its own list,
// so a row's block reads only its own positions (up to GC_EMB_SORT of
// them, below), where one block per row used to scan all count ids
// (vocab·count id reads) with a barrier per blockDim ids. Five launches
// over a workspace of vocab + count ints, index and list:
//   gc_embedding_grad_clear   index = 0                      (any grid)
//   gc_embedding_grad_count   index[v] = #positions of row v, and the
//                             status word for ids outside [0, total)
//   gc_embedding_grad_scan    index[v] = Σ_{u<v} index[u]    (one block)
//   gc_embedding_grad_place   list[index[v]++] = i: row v's positions
//                             end up in list[index[v−1], index[v])
//   gc_embedding_grad         one block per row: sorts its positions
//                             (their order within the row is the order
//                             of the atomic increments) and adds the dy
//                             rows in that order
// The atomics are integer increments, exact in any order; only the
// placement within a row varies, and the sort undoes it. Ids are read
// twice and the workspace a few times: about 8 bytes per token and 12 per
// table row, against 4·vocab per token before.

extern "C" __global__ void gc_embedding_grad_clear(int* index, long long vocab) {
  GC_FOR_EACH(v, vocab) index[v] = 0;
}

extern "C" __global__ void gc_embedding_grad_count(int* index, int* status, const int* ids,
                                                   long long count, long long vocab,
                                                   long long offset, long long total) {
  GC_FOR_EACH(i, count) {
    const int id = ids[i];
    if (id < 0 || id >= total) {
      gc_atomic_max_int(status, 1);
      continue;
    }
    const long long v = (long long)id - offset;
    if (v >= 0 && v < vocab) gc_atomic_add_int(index + v, 1);
  }
}

// gc_embedding_grad_scan turns the counts into exclusive prefix sums in
// place: rounds of 8 adjacent counts per thread, a butterfly scan over
// each warp (xor shuffles: the upper half of each pair adds the lower
// half's total), the warps' totals through shared memory, and a carry
// from round to round. One block; vocab·4 bytes read and written.
#define GC_SCAN_RUN 8
extern "C" __global__ void gc_embedding_grad_scan(int* index, long long vocab) {
  if (blockIdx.x != 0) return;
  __shared__ int totals[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  long long carry = 0;
  for (long long base = 0; base < vocab; base += (long long)GC_SCAN_RUN * blockDim.x) {
    const long long first = base + (long long)threadIdx.x * GC_SCAN_RUN;
    int v[GC_SCAN_RUN];
    int own = 0;
    GC_UNROLL
    for (int c = 0; c < GC_SCAN_RUN; c++) {
      const int k = first + c < vocab ? index[first + c] : 0;
      v[c] = own;  // exclusive within the run
      own += k;
    }
    int incl = own, tot = own;
    for (int m = 1; m < 32; m <<= 1) {
      const int other = gc_shfl_xor(tot, m);
      if (lane & (unsigned)m) incl += other;
      tot += other;
    }
    __syncthreads();  // the previous round's readers are done with totals
    if (lane == 0) totals[warp] = tot;
    __syncthreads();
    long long before = carry, round = 0;
    for (unsigned w = 0; w < warps; w++) {
      before += w < warp ? totals[w] : 0;
      round += totals[w];
    }
    before += incl - own;
    GC_UNROLL
    for (int c = 0; c < GC_SCAN_RUN; c++) {
      if (first + c < vocab) index[first + c] = (int)(before + v[c]);
    }
    carry += round;
  }
}

extern "C" __global__ void gc_embedding_grad_place(int* list, int* index, const int* ids,
                                                   long long count, long long vocab,
                                                   long long offset) {
  GC_FOR_EACH(i, count) {
    const long long v = (long long)ids[i] - offset;
    if (v >= 0 && v < vocab) list[gc_atomic_add_int(index + v, 1)] = (int)i;
  }
}

// GC_EMB_SORT is the most positions a row sorts in shared memory. A row
// with more (a padding token, say) scans the ids in order instead, as the
// old kernel did for every row: at most count/GC_EMB_SORT rows can, so
// that costs at most count²/GC_EMB_SORT id reads in all.
#define GC_EMB_SORT 2048

extern "C" __global__ void gc_embedding_grad(float* dtable, const int* index, const int* list,
                                             const int* ids, const float* dy, long long count,
                                             long long vocab, long long dim, long long offset) {
  __shared__ int pos[GC_EMB_SORT];
  __shared__ int hits[32];
  __shared__ int chunk[1024];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  GC_FOR_ROWS(v, vocab) {
    float* d = dtable + v * dim;
    const long long lo = v == 0 ? 0 : index[v - 1], len = index[v] - lo;
    if (len <= 1) {  // most rows of a large vocabulary: nothing to sort
      const float* g = len ? dy + (long long)list[lo] * dim : nullptr;
      GC_FOR_ROW(j, dim) d[j] = g ? 0.0f + g[j] : 0.0f;
      continue;
    }
    if (len <= GC_EMB_SORT) {
      // The row's positions, padded to a power of two, bitonic-sorted.
      long long p2 = 1;
      while (p2 < len) p2 <<= 1;
      for (long long k = threadIdx.x; k < p2; k += blockDim.x) pos[k] = k < len ? list[lo + k] : 0x7fffffff;
      __syncthreads();
      for (long long size = 2; size <= p2; size <<= 1) {
        for (long long half = size >> 1; half > 0; half >>= 1) {
          for (long long i = threadIdx.x; i < p2; i += blockDim.x) {
            const long long l = i ^ half;
            if (l > i) {
              const int a = pos[i], b = pos[l];
              if ((a > b) == ((i & size) == 0)) {
                pos[i] = b;
                pos[l] = a;
              }
            }
          }
          __syncthreads();
        }
      }
      GC_FOR_ROW(j, dim) {
        float acc = 0.0f;
        for (long long k = 0; k < len; k++) acc += dy[(long long)pos[k] * dim + j];
        d[j] = acc;
      }
      __syncthreads();  // pos is refilled for the next row
      continue;
    }
    // A long row: every id in order, chunk by chunk, the chunk's matches
    // compacted in position order (ballots and a prefix over warps).
    GC_FOR_ROW(j, dim) d[j] = 0.0f;
    for (long long base = 0; base < count; base += blockDim.x) {
      const long long i = base + threadIdx.x;
      const bool hit = i < count && ids[i] == offset + v;
      const unsigned ballot = gc_ballot(hit);
      if (lane == 0) hits[warp] = gc_popc(ballot);
      __syncthreads();
      int before = 0, found = 0;
      for (unsigned w = 0; w < warps; w++) {
        before += w < warp ? hits[w] : 0;
        found += hits[w];
      }
      if (hit) chunk[before + gc_popc(ballot & ((1u << lane) - 1u))] = (int)threadIdx.x;
      __syncthreads();
      for (int k = 0; k < found; k++) {
        const float* g = dy + (base + chunk[k]) * dim;
        GC_FOR_ROW(j, dim) d[j] += g[j];
      }
      __syncthreads();  // hits and chunk are rewritten by the next chunk
    }
  }
}

// gc_cross_entropy_rows writes each row's loss, log Σ exp(x) − x[label],
// as a float pair at loss[2·row]; gc_finish_sum with divisor rows then
// gives the mean. A label outside [0, vocab) sets status[0] to 1 and
// gives a zero loss for its row. The log-sum-exp is an online one
// (gc_row_lse): one read of the row, where it was two (max, then Σexp).
extern "C" __global__ void gc_cross_entropy_rows(float* loss, int* status, const float* logits,
                                                 const int* labels, long long rows, long long vocab) {
  GC_FOR_ROWS(r, rows) {
    const float* x = logits + r * vocab;
    const int label = labels[r];
    float v[GC_ROW_CACHE];
    float m;
    double s;
    gc_row_lse(x, vocab, v, &m, &s);
    const double lse = gc_nonfinite(m) ? (double)m : (double)m + log(s);
    if (threadIdx.x != 0) continue;
    if (label < 0 || label >= vocab) {
      gc_atomic_max_int(status, 1);
      gc_store_pair(loss + 2 * r, 0.0);
      continue;
    }
    gc_store_pair(loss + 2 * r, lse - (double)x[label]);
  }
}

// gc_cross_entropy_grad: dlogits = (softmax(x) − onehot(label))·dloss/rows
// per row; dloss is the upstream gradient in device memory. The
// log-sum-exp is online (one read), and a row that fits the registers is
// written from them: 8 bytes per element (1 read, 1 write) where the
// block read the row three times (16); longer rows 12.
extern "C" __global__ void gc_cross_entropy_grad(float* dlogits, int* status, const float* logits,
                                                 const int* labels, const float* dloss,
                                                 long long rows, long long vocab) {
  const double scale = (double)dloss[0] / (double)rows;
  const bool fits = gc_row_fits(vocab);
  GC_FOR_ROWS(r, rows) {
    const float* x = logits + r * vocab;
    float* d = dlogits + r * vocab;
    const int label = labels[r];
    float v[GC_ROW_CACHE];
    float m;
    double s;
    gc_row_lse(x, vocab, v, &m, &s);
    const double lse = gc_nonfinite(m) ? (double)m : (double)m + log(s);
    const bool bad = label < 0 || label >= vocab;
    if (bad && threadIdx.x == 0) gc_atomic_max_int(status, 1);
    if (fits) {
      GC_UNROLL
      for (int c = 0; c < GC_ROW_CACHE; c++) {
        const long long j = gc_sweep_at(0, c);
        if (j < vocab) {
          const double p = (double)expf((float)((double)v[c] - lse));
          d[j] = (float)((j == label ? p - 1.0 : p) * scale);
        }
      }
    } else {
      GC_FOR_ROW(j, vocab) {
        const double p = (double)expf((float)((double)x[j] - lse));
        d[j] = (float)((j == label ? p - 1.0 : p) * scale);
      }
    }
  }
}

// ---- Vocab-parallel cross-entropy ---------------------------------------
// Logits are split by vocabulary across a group of devices; each holds
// columns [offset, offset+vocab). Only rows-sized vectors cross devices:
//   1. gc_vocab_ce_max          local row max            → all-gather (parts·rows)
//   2. gc_vocab_ce_sums         global max, local Σexp and target logit
//                                                          → all-reduce (2·rows)
//   3. gc_vocab_ce_loss         mean of log Σ + max − target   (the loss), or
//      gc_vocab_ce_grad         exp(x − max)/Σ·scale − scale at the label.

extern "C" __global__ void gc_vocab_ce_max(float* rowmax, const float* logits, long long rows,
                                           long long vocab) {
  GC_FOR_ROWS(r, rows) {
    const float m = gc_row_max(logits + r * vocab, vocab);
    if (threadIdx.x == 0) rowmax[r] = m;
  }
}

// gc_vocab_ce_sums takes maxes gathered from parts devices (device p's
// row maxima at maxes[p·rows]), writes the global max of each row to
// gmax and, in sums, Σ exp(x − max) over local columns (sums[row]) and the
// target logit when the label is local, else 0 (sums[rows + row]): the
// caller all-reduces sums over the group.
extern "C" __global__ void gc_vocab_ce_sums(float* sums, float* gmax, const float* logits,
                                            const int* labels, const float* maxes, long long rows,
                                            long long vocab, long long offset, int parts) {
  const float lo = gc_neg_inf();
  GC_FOR_ROWS(r, rows) {
    const float* x = logits + r * vocab;
    float m = lo;
    for (int p = 0; p < parts; p++) m = gc_max(m, maxes[p * rows + r]);
    double s = 0;
    GC_FOR_ROW(j, vocab) s += (double)expf(x[j] - m);
    s = gc_block_sum(s);
    if (threadIdx.x == 0) {
      gmax[r] = m;
      sums[r] = (float)s;
      const long long c = (long long)labels[r] - offset;
      sums[rows + r] = (c >= 0 && c < vocab) ? x[c] : 0.0f;
    }
  }
}

// gc_vocab_ce_loss: out = mean over rows of log Σ + max − target, from
// the all-reduced sums; one block.
extern "C" __global__ void gc_vocab_ce_loss(float* out, const float* sums, const float* gmax,
                                            long long rows) {
  if (blockIdx.x != 0) return;
  double l = 0;
  GC_FOR_ROW(r, rows) l += log((double)sums[r]) + (double)gmax[r] - (double)sums[rows + r];
  l = gc_block_sum(l);
  if (threadIdx.x == 0) out[0] = (float)(l / (double)rows);
}

// gc_vocab_ce_grad: d = exp(x − max)/Σ·scale over local columns, minus
// scale at the label when it is local; scale = dloss/rows.
extern "C" __global__ void gc_vocab_ce_grad(float* dlogits, const float* logits, const int* labels,
                                            const float* gmax, const float* sums,
                                            const float* dloss, long long rows, long long vocab,
                                            long long offset) {
  const double scale = (double)dloss[0] / (double)rows;
  GC_FOR_EACH(e, rows * vocab) {
    const long long r = e / vocab, j = e - r * vocab;
    float v = (float)((double)expf(logits[e] - gmax[r]) / (double)sums[r] * scale);
    if (j == (long long)labels[r] - offset) v -= (float)scale;
    dlogits[e] = v;
  }
}
