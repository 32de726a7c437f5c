// nn.cu — softmax, the causal mask, LayerNorm, RMSNorm, rotary position
// embeddings, embeddings and the cross-entropy loss, with their gradients
// and the vocab-parallel pieces.
// Row kernels give one block per row (GC_FOR_ROWS also covers a grid
// smaller than rows) and stride the block over the row; statistics and
// sums are kept in double, as the CPU kernels do, while exp and log run
// in float.

// gc_row_logsumexp is log Σ exp(x) over one row of n for the whole block,
// exp in float and the sum in double; an infinite (or NaN) max is its own
// log-sum-exp, as in the CPU kernel.
static __device__ __forceinline__ double gc_row_logsumexp(const float* x, long long n) {
  const float m = gc_row_max(x, n);
  double s = 0;
  if (!gc_nonfinite(m)) GC_FOR_ROW(j, n) s += (double)expf(x[j] - m);
  s = gc_block_sum(s);
  return gc_nonfinite(m) ? (double)m : (double)m + log(s);
}

// gc_softmax: out = exp(x − max)/Σ per row of n. A row that is all −Inf
// (fully masked) becomes zeros rather than NaNs. out may be x.
extern "C" __global__ void gc_softmax(float* out, const float* x, long long rows, long long n) {
  const float lo = gc_neg_inf();
  GC_FOR_ROWS(r, rows) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    const float m = gc_row_max(xr, n);
    if (m == lo) {
      GC_FOR_ROW(j, n) o[j] = 0.0f;
      continue;
    }
    double s = 0;
    GC_FOR_ROW(j, n) {
      const float e = expf(xr[j] - m);
      o[j] = e;
      s += (double)e;
    }
    const double inv = 1.0 / gc_block_sum(s);
    GC_FOR_ROW(j, n) o[j] = (float)((double)o[j] * inv);
  }
}

// gc_softmax_grad: dx = y·(dy − Σ dy·y) per row, y the saved softmax.
extern "C" __global__ void gc_softmax_grad(float* dx, const float* y, const float* dy, long long rows,
                                           long long n) {
  GC_FOR_ROWS(r, rows) {
    const float *yr = y + r * n, *gr = dy + r * n;
    float* d = dx + r * n;
    double dot = 0;
    GC_FOR_ROW(j, n) dot += (double)yr[j] * (double)gr[j];
    dot = gc_block_sum(dot);
    GC_FOR_ROW(j, n) d[j] = (float)((double)yr[j] * ((double)gr[j] - dot));
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

// gc_row_stats returns a row's mean and 1/√(var + eps), biased variance,
// two passes in double (one pass would cancel catastrophically when the
// mean is large).
static __device__ __forceinline__ void gc_row_stats(const float* x, long long n, float eps,
                                                    double* mean, double* rstd) {
  double s = 0;
  GC_FOR_ROW(j, n) s += (double)x[j];
  const double mu = gc_block_sum(s) / (double)n;
  double v = 0;
  GC_FOR_ROW(j, n) {
    const double d = (double)x[j] - mu;
    v += d * d;
  }
  v = gc_block_sum(v) / (double)n;
  *mean = mu;
  *rstd = 1.0 / sqrt(v + (double)eps);
}

// gc_layernorm: out = (x − μ)/√(σ² + eps)·γ + β per row of n. out may be x.
extern "C" __global__ void gc_layernorm(float* out, const float* x, const float* gamma,
                                        const float* beta, long long rows, long long n, float eps) {
  GC_FOR_ROWS(r, rows) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    double mean, rstd;
    gc_row_stats(xr, n, eps, &mean, &rstd);
    GC_FOR_ROW(j, n) o[j] = (float)(((double)xr[j] - mean) * rstd * (double)gamma[j] + (double)beta[j]);
  }
}

// gc_layernorm_grad_x: with x̂ the normalised input and g = dy·γ,
// dx = (g − mean(g) − x̂·mean(g·x̂))/√(σ² + eps); the statistics are
// recomputed from x. dx may be dy.
extern "C" __global__ void gc_layernorm_grad_x(float* dx, const float* x, const float* gamma,
                                               const float* dy, long long rows, long long n,
                                               float eps) {
  GC_FOR_ROWS(r, rows) {
    const float *xr = x + r * n, *gr = dy + r * n;
    float* d = dx + r * n;
    double mean, rstd;
    gc_row_stats(xr, n, eps, &mean, &rstd);
    double sg = 0, sgx = 0;
    GC_FOR_ROW(j, n) {
      const double g = (double)gr[j] * (double)gamma[j];
      sg += g;
      sgx += g * (((double)xr[j] - mean) * rstd);
    }
    sg = gc_block_sum(sg) / (double)n;
    sgx = gc_block_sum(sgx) / (double)n;
    GC_FOR_ROW(j, n) {
      const double g = (double)gr[j] * (double)gamma[j];
      const double xh = ((double)xr[j] - mean) * rstd;
      d[j] = (float)((g - sg - xh * sgx) * rstd);
    }
  }
}

// gc_layernorm_stats stores each row's mean and 1/√(var + eps) as two
// float pairs at stats[4·row]: the first step of the γ gradient.
extern "C" __global__ void gc_layernorm_stats(float* stats, const float* x, long long rows,
                                              long long n, float eps) {
  GC_FOR_ROWS(r, rows) {
    double mean, rstd;
    gc_row_stats(x + r * n, n, eps, &mean, &rstd);
    if (threadIdx.x == 0) {
      gc_store_pair(stats + 4 * r, mean);
      gc_store_pair(stats + 4 * r + 2, rstd);
    }
  }
}

// gc_layernorm_grad_gamma: dγ[j] = Σ_rows dy·x̂, one thread per column
// walking the rows in order (the CPU kernel's order), x̂ from the stats
// that gc_layernorm_stats left.
extern "C" __global__ void gc_layernorm_grad_gamma(float* dgamma, const float* x, const float* dy,
                                                   const float* stats, long long rows,
                                                   long long n) {
  GC_FOR_EACH(j, n) {
    double acc = 0;
    for (long long r = 0; r < rows; r++) {
      const double mean = gc_load_pair(stats + 4 * r), rstd = gc_load_pair(stats + 4 * r + 2);
      acc += (double)dy[r * n + j] * ((double)x[r * n + j] - mean) * rstd;
    }
    dgamma[j] = (float)acc;
  }
}

// gc_row_rms_scale returns a row's 1/√(mean(x²) + eps), the sum of
// squares in double (no centring, so one pass loses nothing).
static __device__ __forceinline__ double gc_row_rms_scale(const float* x, long long n, float eps) {
  double s = 0;
  GC_FOR_ROW(j, n) s += (double)x[j] * (double)x[j];
  return 1.0 / sqrt(gc_block_sum(s) / (double)n + (double)eps);
}

// gc_rmsnorm: out = x/√(mean(x²) + eps)·γ per row of n. out may be x.
extern "C" __global__ void gc_rmsnorm(float* out, const float* x, const float* gamma, long long rows,
                                      long long n, float eps) {
  GC_FOR_ROWS(r, rows) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    const double rs = gc_row_rms_scale(xr, n, eps);
    GC_FOR_ROW(j, n) o[j] = (float)((double)xr[j] * rs * (double)gamma[j]);
  }
}

// gc_rmsnorm_grad_x: with r = 1/√(mean(x²) + eps), x̂ = x·r and g = dy·γ,
// dx = r·(g − x̂·mean(g·x̂)); r is recomputed from x. dx may be dy.
extern "C" __global__ void gc_rmsnorm_grad_x(float* dx, const float* x, const float* gamma,
                                             const float* dy, long long rows, long long n,
                                             float eps) {
  GC_FOR_ROWS(r, rows) {
    const float *xr = x + r * n, *gr = dy + r * n;
    float* d = dx + r * n;
    const double rs = gc_row_rms_scale(xr, n, eps);
    double sgx = 0;
    GC_FOR_ROW(j, n) sgx += (double)gr[j] * (double)gamma[j] * (double)xr[j] * rs;
    sgx = gc_block_sum(sgx) / (double)n;
    GC_FOR_ROW(j, n) {
      const double g = (double)gr[j] * (double)gamma[j];
      d[j] = (float)((g - (double)xr[j] * rs * sgx) * rs);
    }
  }
}

// gc_rmsnorm_stats stores each row's 1/√(mean(x²) + eps) as a float pair
// at stats[2·row]: the first step of the γ gradient.
extern "C" __global__ void gc_rmsnorm_stats(float* stats, const float* x, long long rows, long long n,
                                            float eps) {
  GC_FOR_ROWS(r, rows) {
    const double rs = gc_row_rms_scale(x + r * n, n, eps);
    if (threadIdx.x == 0) gc_store_pair(stats + 2 * r, rs);
  }
}

// gc_rmsnorm_grad_gamma: dγ[j] = Σ_rows dy·x̂, one thread per column
// walking the rows in order (the CPU kernel's order), x̂ from the scales
// that gc_rmsnorm_stats left.
extern "C" __global__ void gc_rmsnorm_grad_gamma(float* dgamma, const float* x, const float* dy,
                                                 const float* stats, long long rows, long long n) {
  GC_FOR_EACH(j, n) {
    double acc = 0;
    for (long long r = 0; r < rows; r++) {
      acc += (double)dy[r * n + j] * (double)x[r * n + j] * gc_load_pair(stats + 2 * r);
    }
    dgamma[j] = (float)acc;
  }
}

// gc_rope applies rotary position embeddings in Hugging Face Llama's
// rotate-half layout: x is rows of d = 2·half elements, row r at position
// p = r mod positions, and elements i and i + half of a row turn together
// by p·theta^(−2i/d) (minus that when inverse is not 0, the transpose and
// so the vjp):
//   out[i]      = x[i]·cos − x[i+half]·sin
//   out[i+half] = x[i+half]·cos + x[i]·sin
// The angle (pow, sin, cos) and the products are double, rounded to float
// once, as the CPU kernel; theta arrives as a float and is widened. One
// thread per pair; out must not be x.
extern "C" __global__ void gc_rope(float* out, const float* x, long long rows, long long positions,
                                   long long half, float theta, int inverse) {
  const long long d = 2 * half;
  GC_FOR_EACH(e, rows * half) {
    const long long r = e / half, i = e - r * half, p = r % positions;
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

// gc_embedding_grad: dtable ([rows, dim], the rows [offset, offset+rows)
// of a [total, dim] table: all of it unless the table is split by rows
// across devices) = Σ over positions i with ids[i] = offset+v of dy[i,:]. One block per vocab row scans all ids in chunks
// of blockDim, compacts the chunk's matches in position order (warp
// ballots and a prefix over warps), and adds their dy rows; each column
// belongs to one thread, so every sum runs in increasing position order,
// in float, exactly as the CPU kernel's serial loop: deterministic and
// bit-identical, with no atomics. The price is that every block reads
// all ids (rows·count reads, served from cache); a sort by id would
// avoid it. An id outside [0, total) sets status[0] to 1 (block of row 0
// checks) and is otherwise ignored.
extern "C" __global__ void gc_embedding_grad(float* dtable, int* status, const int* ids,
                                             const float* dy, long long count, long long vocab,
                                             long long dim, long long offset, long long total) {
  __shared__ int hits[32];
  __shared__ int list[1024];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  GC_FOR_ROWS(v, vocab) {
    float* d = dtable + v * dim;
    GC_FOR_ROW(j, dim) d[j] = 0.0f;
    for (long long base = 0; base < count; base += blockDim.x) {
      const long long i = base + threadIdx.x;
      const int id = i < count ? ids[i] : -1;
      if (v == 0 && i < count && (id < 0 || id >= total)) gc_atomic_max_int(status, 1);
      const bool hit = id == offset + v;
      const unsigned ballot = gc_ballot(hit);
      if (lane == 0) hits[warp] = gc_popc(ballot);
      __syncthreads();
      int before = 0, total = 0;
      for (unsigned w = 0; w < warps; w++) {
        before += w < warp ? hits[w] : 0;
        total += hits[w];
      }
      if (hit) list[before + gc_popc(ballot & ((1u << lane) - 1u))] = (int)threadIdx.x;
      __syncthreads();
      for (int k = 0; k < total; k++) {
        const float* g = dy + (base + list[k]) * dim;
        GC_FOR_ROW(j, dim) d[j] += g[j];
      }
      __syncthreads();  // hits and list are rewritten by the next chunk
    }
  }
}

// gc_cross_entropy_rows writes each row's loss, log Σ exp(x) − x[label],
// as a float pair at loss[2·row]; gc_finish_sum with divisor rows then
// gives the mean. A label outside [0, vocab) sets status[0] to 1 and
// gives a zero loss for its row.
extern "C" __global__ void gc_cross_entropy_rows(float* loss, int* status, const float* logits,
                                                 const int* labels, long long rows, long long vocab) {
  GC_FOR_ROWS(r, rows) {
    const float* x = logits + r * vocab;
    const int label = labels[r];
    const double lse = gc_row_logsumexp(x, vocab);
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
// per row; dloss is the upstream gradient in device memory.
extern "C" __global__ void gc_cross_entropy_grad(float* dlogits, int* status, const float* logits,
                                                 const int* labels, const float* dloss,
                                                 long long rows, long long vocab) {
  const double scale = (double)dloss[0] / (double)rows;
  GC_FOR_ROWS(r, rows) {
    const float* x = logits + r * vocab;
    float* d = dlogits + r * vocab;
    const int label = labels[r];
    const double lse = gc_row_logsumexp(x, vocab);
    const bool bad = label < 0 || label >= vocab;
    if (bad && threadIdx.x == 0) gc_atomic_max_int(status, 1);
    GC_FOR_ROW(j, vocab) {
      const double p = (double)expf((float)((double)x[j] - lse));
      d[j] = (float)((j == label ? p - 1.0 : p) * scale);
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
