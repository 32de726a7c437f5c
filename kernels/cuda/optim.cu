// optim.cu — optimizer updates (AdamW, SGD with momentum, Adafactor,
// SM3), the mixed-precision guard and the clipping coefficient. Where the
// CPU kernel computes in float64 these do too: the optimizer is a small
// share of a step, and matching the CPU closely keeps master weights of
// the two backends together. The learning rate and the step number are
// read from device memory (the runtime writes them each step), so a
// captured program serves every step. Outputs may be the state they
// update (in place).

extern "C" __global__ void gc_adam_m(float* out, const float* m, const float* g, long long n,
                                     float beta1) {
  GC_FOR_EACH(i, n) out[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
}

extern "C" __global__ void gc_adam_v(float* out, const float* v, const float* g, long long n,
                                     float beta2) {
  GC_FOR_EACH(i, n) out[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
}

// gc_step_count is the step number t of the bias corrections and decay
// schedules; a step below 1 counts as 1 (the runtime rejects it before
// launching).
static __device__ __forceinline__ double gc_step_count(const long long* step) {
  return (double)(step[0] < 1 ? 1 : step[0]);
}

// gc_adamw: p − lr·wd·p − lr·(m/(1−β1ᵗ))/(√(v/(1−β2ᵗ)) + eps) with the
// moments already updated.
extern "C" __global__ void gc_adamw(float* out, const float* p, const float* m, const float* v,
                                    const float* lr, const long long* step, long long n, float beta1,
                                    float beta2, float eps, float wd) {
  const double t = gc_step_count(step);
  const double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
  const double rate = (double)lr[0], decay = rate * (double)wd;
  GC_FOR_EACH(i, n) {
    const double x = (double)p[i];
    const double upd = rate * ((double)m[i] / bc1) / (sqrt((double)v[i] / bc2) + (double)eps);
    out[i] = (float)(x - decay * x - upd);
  }
}

// gc_sgd_buf: buf' = momentum·buf + (g + wd·p), PyTorch's momentum buffer.
extern "C" __global__ void gc_sgd_buf(float* out, const float* buf, const float* g, const float* p,
                                      long long n, float momentum, float wd) {
  GC_FOR_EACH(i, n) out[i] = momentum * buf[i] + (g[i] + wd * p[i]);
}

extern "C" __global__ void gc_sgd(float* out, const float* p, const float* buf, const float* lr,
                                  long long n) {
  const float rate = lr[0];
  GC_FOR_EACH(i, n) out[i] = p[i] - rate * buf[i];
}

// gc_adafactor_beta2 is β̂₂ₜ = 1 − t^(−decay), 0 at the first step.
static __device__ __forceinline__ double gc_adafactor_beta2(const long long* step, float decay) {
  return 1.0 - pow(gc_step_count(step), -(double)decay);
}

// gc_adafactor_row: out[i] = β·row[i] + (1−β)·Σⱼ (g[i,j]² + eps1) for g
// of n rows of m; one block per row.
extern "C" __global__ void gc_adafactor_row(float* out, const float* row, const float* g,
                                            const long long* step, long long n, long long m,
                                            float eps1, float decay) {
  const double beta = gc_adafactor_beta2(step, decay);
  GC_FOR_ROWS(i, n) {
    const float* gi = g + i * m;
    double s = 0;
    GC_FOR_ROW(j, m) s += (double)gi[j] * (double)gi[j] + (double)eps1;
    s = gc_block_sum(s);
    if (threadIdx.x == 0) out[i] = (float)(beta * (double)row[i] + (1.0 - beta) * s);
  }
}

// gc_adafactor_col: the column sums, over column tiles (common.cuh's
// gc_cols): the block's warps split the n rows of 32 adjacent columns and
// combine in a fixed order, where a thread per column walked all n rows
// alone. Same bytes (g read once), many more loads in flight.
extern "C" __global__ void gc_adafactor_col(float* out, const float* col, const float* g,
                                            const long long* step, long long n, long long m,
                                            float eps1, float decay) {
  const double beta = gc_adafactor_beta2(step, decay);
  const gc_cols t = gc_cols_of(1, n, m);
  GC_FOR_ROWS(tile, t.tiles) {
    long long o;
    const long long j = gc_cols_column(t, tile, &o);
    double s = gc_cols_walk(
        t, j < m, 0.0,
        [&](long long i) { return (double)g[i * m + j] * (double)g[i * m + j] + (double)eps1; },
        gc_add_op());
    s = gc_cols_combine(t, s, gc_add_op());
    if (threadIdx.x < (unsigned)t.cw && j < m) out[j] = (float)(beta * (double)col[j] + (1.0 - beta) * s);
  }
}

// gc_adafactor_v: the unfactored second moment of a vector.
extern "C" __global__ void gc_adafactor_v(float* out, const float* v, const float* g,
                                          const long long* step, long long n, float eps1,
                                          float decay) {
  const double beta = gc_adafactor_beta2(step, decay);
  GC_FOR_EACH(i, n) {
    const double x = (double)g[i];
    out[i] = (float)(beta * (double)v[i] + (1.0 - beta) * (x * x + (double)eps1));
  }
}

// The Adafactor update of a matrix p (n×m) with accumulators row, col
// already updated takes four launches, because it needs two global
// norms before any element moves (and out may be p):
//   gc_adafactor_rowsum   ws[0:2] = Σ row                       (one block)
//   gc_adafactor_partial  per block: Σp², ΣU² with U = g/√V̂      (any grid)
//   gc_adafactor_finish   ws[2:4] = αₜ/max(1, RMS(U)/d)         (one block)
//   gc_adafactor_apply    out = p − coef·U                     (any grid)
// where V̂ = row·colᵀ/Σrow, so 1/√V̂[i,j] = 1/√(row[i]/Σrow)·1/√col[j].
// A vector (gc_adafactor_vec_*) has U = g/√v and no row sum. ws holds
// four floats (two pairs); partial four per block of the partial launch.

static __device__ __forceinline__ double gc_adafactor_rinv(float r, double sum) {
  return r != 0 ? gc_inv_sqrt((double)r / sum) : 0.0;  // a zero row: Σrow may be 0 too
}

extern "C" __global__ void gc_adafactor_rowsum(float* ws, const float* row, long long n) {
  if (blockIdx.x != 0) return;
  double s = 0;
  GC_FOR_ROW(i, n) s += (double)row[i];
  s = gc_block_sum(s);
  if (threadIdx.x == 0) gc_store_pair(ws, s);
}

// gc_adafactor_store_partial adds Σp² and ΣU² over the block and stores
// them as two pairs at partial[4·blockIdx.x].
static __device__ __forceinline__ void gc_adafactor_store_partial(float* partial, double pp,
                                                                  double uu) {
  pp = gc_block_sum(pp);
  uu = gc_block_sum(uu);
  if (threadIdx.x == 0) {
    gc_store_pair(partial + 4 * blockIdx.x, pp);
    gc_store_pair(partial + 4 * blockIdx.x + 2, uu);
  }
}

extern "C" __global__ void gc_adafactor_partial(float* partial, const float* p, const float* g,
                                                const float* row, const float* col, const float* ws,
                                                long long n, long long m) {
  const double sum = gc_load_pair(ws);
  double pp = 0, uu = 0;
  GC_FOR_EACH(e, n * m) {
    const long long i = e / m, j = e - i * m;
    const double u = (double)g[e] * gc_adafactor_rinv(row[i], sum) * gc_inv_sqrt((double)col[j]);
    pp += (double)p[e] * (double)p[e];
    uu += u * u;
  }
  gc_adafactor_store_partial(partial, pp, uu);
}

extern "C" __global__ void gc_adafactor_vec_partial(float* partial, const float* p, const float* g,
                                                    const float* v, long long n) {
  double pp = 0, uu = 0;
  GC_FOR_EACH(i, n) {
    const double u = (double)g[i] * gc_inv_sqrt((double)v[i]);
    pp += (double)p[i] * (double)p[i];
    uu += u * u;
  }
  gc_adafactor_store_partial(partial, pp, uu);
}

// gc_adafactor_finish: αₜ = max(eps2, RMS(p))·min(rel_step, 1/√t) and the
// clipped coefficient αₜ/max(1, RMS(U)/clip) into ws[2:4]; blocks is the
// grid size of the partial launch and size the number of elements.
extern "C" __global__ void gc_adafactor_finish(float* ws, const float* partial, const long long* step,
                                               long long blocks, long long size, float eps2,
                                               float clip, float rel_step) {
  if (blockIdx.x != 0) return;
  double pp = 0, uu = 0;
  GC_FOR_ROW(b, blocks) {
    pp += gc_load_pair(partial + 4 * b);
    uu += gc_load_pair(partial + 4 * b + 2);
  }
  pp = gc_block_sum(pp);
  uu = gc_block_sum(uu);
  if (threadIdx.x != 0) return;
  const double t = gc_step_count(step);
  const double rms_p = sqrt(pp / (double)size), rms_u = sqrt(uu / (double)size);
  const double alpha = gc_max((double)eps2, rms_p) * gc_min((double)rel_step, 1.0 / sqrt(t));
  gc_store_pair(ws + 2, alpha / gc_max(1.0, rms_u / (double)clip));
}

extern "C" __global__ void gc_adafactor_apply(float* out, const float* p, const float* g,
                                              const float* row, const float* col, const float* ws,
                                              long long n, long long m) {
  const double sum = gc_load_pair(ws), coef = gc_load_pair(ws + 2);
  GC_FOR_EACH(e, n * m) {
    const long long i = e / m, j = e - i * m;
    out[e] = (float)((double)p[e] - coef * (double)g[e] * gc_adafactor_rinv(row[i], sum) *
                                        gc_inv_sqrt((double)col[j]));
  }
}

extern "C" __global__ void gc_adafactor_vec_apply(float* out, const float* p, const float* g,
                                                  const float* v, const float* ws, long long n) {
  const double coef = gc_load_pair(ws + 2);
  GC_FOR_EACH(i, n) out[i] = (float)((double)p[i] - coef * (double)g[i] * gc_inv_sqrt((double)v[i]));
}

// ---- SM3 ------------------------------------------------------------------
// ν[i,j] = min(row[i], col[j]) + g[i,j]² from the previous accumulators;
// the three matrix kernels read only the old accumulators, so they may
// run in any order before the new ones are written back.

static __device__ __forceinline__ double gc_sm3_nu(float row, float col, float g) {
  const double x = (double)g;
  return gc_min((double)row, (double)col) + x * x;
}

// gc_sm3_row: out[i] = maxⱼ ν[i,j]; one block per row.
extern "C" __global__ void gc_sm3_row(float* out, const float* row, const float* col, const float* g,
                                      long long n, long long m) {
  const double lo = -1.0 / 0.0;
  GC_FOR_ROWS(i, n) {
    double best = lo;
    GC_FOR_ROW(j, m) best = gc_max(best, gc_sm3_nu(row[i], col[j], g[i * m + j]));
    best = gc_block_max(best, lo);
    if (threadIdx.x == 0 && m > 0) out[i] = (float)best;
  }
}

// gc_sm3_col: out[j] = maxᵢ ν[i,j], over column tiles as
// gc_adafactor_col (g read once, as before; a max is exact in any order).
extern "C" __global__ void gc_sm3_col(float* out, const float* row, const float* col, const float* g,
                                      long long n, long long m) {
  const gc_cols t = gc_cols_of(1, n, m);
  GC_FOR_ROWS(tile, t.tiles) {
    long long o;
    const long long j = gc_cols_column(t, tile, &o);
    const float cj = j < m ? col[j] : 0.0f;
    double best = gc_cols_walk(
        t, j < m, -1.0 / 0.0, [&](long long i) { return gc_sm3_nu(row[i], cj, g[i * m + j]); },
        gc_max_op());
    best = gc_cols_combine(t, best, gc_max_op());
    if (threadIdx.x < (unsigned)t.cw && j < m && n > 0) out[j] = (float)best;
  }
}

// gc_sm3: out = p − lr·g/√ν; where ν = 0 the entry does not move.
extern "C" __global__ void gc_sm3(float* out, const float* p, const float* g, const float* row,
                                  const float* col, const float* lr, long long n, long long m) {
  const double rate = (double)lr[0];
  GC_FOR_EACH(e, n * m) {
    const long long i = e / m, j = e - i * m;
    out[e] = (float)((double)p[e] - rate * (double)g[e] * gc_inv_sqrt(gc_sm3_nu(row[i], col[j], g[e])));
  }
}

// gc_sm3_v: out = v + g², SM3 with one cover per entry (AdaGrad).
extern "C" __global__ void gc_sm3_v(float* out, const float* v, const float* g, long long n) {
  GC_FOR_EACH(i, n) {
    const double x = (double)g[i];
    out[i] = (float)((double)v[i] + x * x);
  }
}

extern "C" __global__ void gc_sm3_vec(float* out, const float* p, const float* g, const float* v,
                                      const float* lr, long long n) {
  const double rate = (double)lr[0];
  GC_FOR_EACH(i, n) out[i] = (float)((double)p[i] - rate * (double)g[i] * gc_inv_sqrt((double)v[i]));
}

// ---- Mixed precision and clipping -----------------------------------------

// gc_where_finite: out = new when the overflow count is 0, else old, so a
// step with an inf/NaN gradient changes nothing. out may be old.
extern "C" __global__ void gc_where_finite(float* out, const float* count, const float* fresh,
                                           const float* old, long long n) {
  const bool take = count[0] == 0.0f;
  GC_FOR_EACH(i, n) out[i] = take ? fresh[i] : old[i];
}

// gc_clip_coef: min(1, max_norm/(√Σg² + 1e-6)) from the global sum of
// squares, as torch's clip_grad_norm_. One thread writes it.
extern "C" __global__ void gc_clip_coef(float* out, const float* sumsq, float max_norm) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  out[0] = (float)gc_min(1.0, (double)max_norm / (sqrt((double)sumsq[0]) + 1e-6));
}
