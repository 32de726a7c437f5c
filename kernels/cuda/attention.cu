// attention.cu — fused attention, FlashAttention-2's algorithm (Dao
// 2023): softmax(scale·q·kᵀ [causal-masked])·v without an [sq, sk]
// buffer. q is [batch, heads, sq, hd], k and v [batch, kv_heads, sk, hd],
// the output and its gradient [batch, sq, heads, hd];
// local query head h reads local k/v head (q_off + h)/group − kv_off, so
// grouped-query attention needs no repeated k/v, and a device holding a
// block of the query heads finds its k/v heads whether k and v are split
// with them or whole. Under causal, query i sees key j when j's position is
// at or before i's. Positions come in at most two runs (a device's chunks
// of a sequence split over a context-parallel axis, runtime.Ring): query
// i < qbrk is at qp0 + i, a later one at qp1 + i − qbrk, keys likewise
// (kp0, kbrk, kp1), and they rise, so the keys a query sees are a prefix
// and the queries that see a key a suffix. One device's whole sequence is
// qp0 = sk − sq, qbrk = sq, kp0 = 0, kbrk = sk: key j ≤ i + sk − sq.
//
// Each block takes one tile of rows at a time (GC_FOR_ROWS over
// batch·heads·tiles, or batch·kv_heads·tiles for dk and dv): q, k, v
// tiles of GC_ATT_TILE floats (rows = gc_att_rows(hd) ≤ GC_ATT_ROWS) are
// staged in shared memory, scores of one query tile against one key tile
// live in shared memory, and the running max, sum and output accumulator
// of the online softmax are per row. Every result element is accumulated
// by one thread in a fixed order, so results are bit-reproducible for a
// given block size: no atomics, unlike FlashAttention-2's dq, because dk
// and dv are made by their own kernels walking the query tiles. Sums run
// in float; the CPU kernels' float64 differ from them by roundings.

#define GC_ATT_TILE 2048  // floats of one staged q, k, v, dout or accumulator tile
#define GC_ATT_ROWS 32    // most rows (queries or keys) of a tile

// gc_att_rows is the rows of a tile for head dim hd: as many as fit in
// GC_ATT_TILE floats, at most GC_ATT_ROWS. The Go side refuses hd above
// GC_ATT_TILE.
static __device__ __forceinline__ long long gc_att_rows(long long hd) {
  const long long r = GC_ATT_TILE / hd;
  return r < GC_ATT_ROWS ? r : GC_ATT_ROWS;
}

// GC_ATT_RUNS passes on the position runs every attention kernel takes
// after causal (qp0, qbrk, qp1, kp0, kbrk, kp1).
#define GC_ATT_RUNS qp0, qbrk, qp1, kp0, kbrk, kp1

// gc_att_visible is the end of the keys query i sees: every key at or
// before its position.
static __device__ __forceinline__ long long gc_att_visible(long long i, long long sq, long long sk, int causal,
                                                           long long qp0, long long qbrk, long long qp1,
                                                           long long kp0, long long kbrk, long long kp1) {
  if (!causal) return sk;
  const long long p = i < qbrk ? qp0 + i : qp1 + i - qbrk;
  const long long n1 = p - kp1 + 1;  // keys of the second run at or before p
  if (kbrk < sk && n1 > 0) return kbrk + (n1 < sk - kbrk ? n1 : sk - kbrk);
  const long long n0 = p - kp0 + 1;
  return n0 < 0 ? 0 : (n0 < kbrk ? n0 : kbrk);
}

// gc_att_first is the first query that sees key j: the first at or after
// its position.
static __device__ __forceinline__ long long gc_att_first(long long j, long long sq, int causal,
                                                         long long qp0, long long qbrk, long long qp1,
                                                         long long kp0, long long kbrk, long long kp1) {
  if (!causal) return 0;
  const long long p = j < kbrk ? kp0 + j : kp1 + j - kbrk;
  if (p <= qp0 + qbrk - 1) return p - qp0 < 0 ? 0 : p - qp0;
  const long long f = p - qp1 < 0 ? 0 : p - qp1;
  return qbrk + (f < sq - qbrk ? f : sq - qbrk);
}

// gc_att_stage copies n consecutive floats into shared memory.
static __device__ __forceinline__ void gc_att_stage(float* dst, const float* src, long long n) {
  for (long long x = threadIdx.x; x < n; x += blockDim.x) dst[x] = src[x];
}

// gc_att_orow is where query row i of head h of batch b starts in the
// output (or dout), [batch, sq, heads, hd].
static __device__ __forceinline__ long long gc_att_orow(long long b, long long h, long long i, long long sq,
                                                        long long heads, long long hd) {
  return ((b * sq + i) * heads + h) * hd;
}

// gc_att_stage_rows stages rows rows of hd floats of dout for query rows
// i0… of head h: consecutive queries of one head are heads·hd apart.
static __device__ __forceinline__ void gc_att_stage_rows(float* dst, const float* dout, long long b, long long h,
                                                         long long i0, long long rows, long long sq,
                                                         long long heads, long long hd) {
  for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) {
    dst[x] = dout[gc_att_orow(b, h, i0 + x / hd, sq, heads, hd) + x % hd];
  }
}

static __device__ __forceinline__ float gc_att_dot(const float* a, const float* b, long long n) {
  float s = 0.0f;
  for (long long x = 0; x < n; x++) s += a[x] * b[x];
  return s;
}

// gc_attention: out = softmax(scale·q·kᵀ)·v, one query tile per block
// step, and, where lse is not null, each query row's log-sum-exp of its
// visible scaled scores ([batch, heads, sq]): what a ring merges steps by.
// tiles is ⌈sq / gc_att_rows(hd)⌉.
extern "C" __global__ void gc_attention(float* out, float* lse, const float* q, const float* k, const float* v,
                                        long long batch, long long heads, long long kv_heads, long long sq, long long sk,
                                        long long hd, long long tiles, long long group, long long q_off, long long kv_off,
                                        float scale, int causal, long long qp0, long long qbrk, long long qp1,
                                        long long kp0, long long kbrk, long long kp1) {
  __shared__ float qs[GC_ATT_TILE], ks[GC_ATT_TILE], vs[GC_ATT_TILE], acc[GC_ATT_TILE];
  __shared__ float ss[GC_ATT_ROWS * GC_ATT_ROWS];
  __shared__ float m[GC_ATT_ROWS], l[GC_ATT_ROWS], alpha[GC_ATT_ROWS];
  const long long T = gc_att_rows(hd);
  const float lo = gc_neg_inf();
  GC_FOR_ROWS(w, batch * heads * tiles) {
    const long long bh = w / tiles, i0 = (w % tiles) * T;
    const long long b = bh / heads, h = bh % heads, g = (q_off + h) / group - kv_off;
    const long long rows = sq - i0 < T ? sq - i0 : T;
    const float* qb = q + (bh * sq + i0) * hd;
    const float* kb = k + (b * kv_heads + g) * sk * hd;
    const float* vb = v + (b * kv_heads + g) * sk * hd;
    __syncthreads();  // the previous tile's readers are done with shared memory
    gc_att_stage(qs, qb, rows * hd);
    for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) acc[x] = 0.0f;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
      m[r] = lo;
      l[r] = 0.0f;
    }
    const long long end = gc_att_visible(i0 + rows - 1, sq, sk, causal, GC_ATT_RUNS);
    for (long long j0 = 0; j0 < end; j0 += T) {
      const long long keys = end - j0 < T ? end - j0 : T;
      __syncthreads();
      gc_att_stage(ks, kb + j0 * hd, keys * hd);
      gc_att_stage(vs, vb + j0 * hd, keys * hd);
      __syncthreads();
      for (long long x = threadIdx.x; x < rows * keys; x += blockDim.x) {
        const long long r = x / keys, c = x % keys;
        ss[r * GC_ATT_ROWS + c] =
            j0 + c < gc_att_visible(i0 + r, sq, sk, causal, GC_ATT_RUNS)
                ? scale * gc_att_dot(qs + r * hd, ks + c * hd, hd)
                : lo;
      }
      __syncthreads();
      for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        float* sr = ss + r * GC_ATT_ROWS;
        float mb = lo;
        for (long long c = 0; c < keys; c++) mb = gc_max(mb, sr[c]);
        const float mn = gc_max(m[r], mb);
        const float a = mn == lo ? 1.0f : expf(m[r] - mn);
        float sum = 0.0f;
        for (long long c = 0; c < keys; c++) {
          const float p = sr[c] == lo ? 0.0f : expf(sr[c] - mn);
          sr[c] = p;
          sum += p;
        }
        l[r] = l[r] * a + sum;
        m[r] = mn;
        alpha[r] = a;
      }
      __syncthreads();
      for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) {
        const long long r = x / hd, d = x % hd;
        const float* pr = ss + r * GC_ATT_ROWS;
        float a = acc[x] * alpha[r];
        for (long long c = 0; c < keys; c++) a += pr[c] * vs[c * hd + d];
        acc[x] = a;
      }
    }
    __syncthreads();
    // A row that sees no key (a chunk of keys after it) has l = 0: its
    // output is 0 and its log-sum-exp −inf, which a merge skips.
    for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) {
      const float lr = l[x / hd];
      out[gc_att_orow(b, h, i0 + x / hd, sq, heads, hd) + x % hd] = lr > 0.0f ? acc[x] / lr : 0.0f;
    }
    if (lse) {
      for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        lse[bh * sq + i0 + r] = l[r] > 0.0f ? m[r] + logf(l[r]) : lo;
      }
    }
  }
}

// gc_attention_stats: per query row, stats[2·row] = log Σ exp(scale·q·k)
// over the keys it sees and stats[2·row + 1] = D = Σ dout·out.
extern "C" __global__ void gc_attention_stats(float* stats, const float* q, const float* k, const float* out,
                                              const float* dout, long long batch, long long heads, long long kv_heads,
                                              long long sq, long long sk, long long hd, long long tiles, long long group,
                                              long long q_off, long long kv_off, float scale, int causal,
                                              long long qp0, long long qbrk, long long qp1,
                                              long long kp0, long long kbrk, long long kp1) {
  __shared__ float qs[GC_ATT_TILE], ks[GC_ATT_TILE];
  __shared__ float ss[GC_ATT_ROWS * GC_ATT_ROWS];
  __shared__ float m[GC_ATT_ROWS], l[GC_ATT_ROWS];
  const long long T = gc_att_rows(hd);
  const float lo = gc_neg_inf();
  GC_FOR_ROWS(w, batch * heads * tiles) {
    const long long bh = w / tiles, i0 = (w % tiles) * T;
    const long long b = bh / heads, h = bh % heads, g = (q_off + h) / group - kv_off;
    const long long rows = sq - i0 < T ? sq - i0 : T;
    const float* kb = k + (b * kv_heads + g) * sk * hd;
    __syncthreads();
    gc_att_stage(qs, q + (bh * sq + i0) * hd, rows * hd);
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
      m[r] = lo;
      l[r] = 0.0f;
    }
    const long long end = gc_att_visible(i0 + rows - 1, sq, sk, causal, GC_ATT_RUNS);
    for (long long j0 = 0; j0 < end; j0 += T) {
      const long long keys = end - j0 < T ? end - j0 : T;
      __syncthreads();
      gc_att_stage(ks, kb + j0 * hd, keys * hd);
      __syncthreads();
      for (long long x = threadIdx.x; x < rows * keys; x += blockDim.x) {
        const long long r = x / keys, c = x % keys;
        ss[r * GC_ATT_ROWS + c] =
            j0 + c < gc_att_visible(i0 + r, sq, sk, causal, GC_ATT_RUNS)
                ? scale * gc_att_dot(qs + r * hd, ks + c * hd, hd)
                : lo;
      }
      __syncthreads();
      for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        const float* sr = ss + r * GC_ATT_ROWS;
        float mb = lo;
        for (long long c = 0; c < keys; c++) mb = gc_max(mb, sr[c]);
        const float mn = gc_max(m[r], mb);
        float sum = 0.0f;
        for (long long c = 0; c < keys; c++) sum += sr[c] == lo ? 0.0f : expf(sr[c] - mn);
        l[r] = l[r] * (mn == lo ? 1.0f : expf(m[r] - mn)) + sum;
        m[r] = mn;
      }
    }
    __syncthreads();
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
      const long long row = bh * sq + i0 + r, o = gc_att_orow(b, h, i0 + r, sq, heads, hd);
      stats[2 * row] = l[r] > 0.0f ? m[r] + logf(l[r]) : lo;
      stats[2 * row + 1] = gc_att_dot(dout + o, out + o, hd);
    }
  }
}

// gc_attention_grad_q: dq = scale·Σⱼ p·(dout·vⱼ − D)·kⱼ, p = exp(scale·q·k −
// lse) recomputed tile by tile.
extern "C" __global__ void gc_attention_grad_q(float* dq, const float* q, const float* k, const float* v,
                                               const float* dout, const float* stats, long long batch, long long heads,
                                               long long kv_heads, long long sq, long long sk, long long hd,
                                               long long tiles, long long group, long long q_off, long long kv_off,
                                               float scale, int causal,
                                               long long qp0, long long qbrk, long long qp1,
                                               long long kp0, long long kbrk, long long kp1) {
  __shared__ float qs[GC_ATT_TILE], gs[GC_ATT_TILE], ks[GC_ATT_TILE], vs[GC_ATT_TILE], acc[GC_ATT_TILE];
  __shared__ float ss[GC_ATT_ROWS * GC_ATT_ROWS];
  __shared__ float lse[GC_ATT_ROWS], dsum[GC_ATT_ROWS];
  const long long T = gc_att_rows(hd);
  GC_FOR_ROWS(w, batch * heads * tiles) {
    const long long bh = w / tiles, i0 = (w % tiles) * T;
    const long long b = bh / heads, h = bh % heads, g = (q_off + h) / group - kv_off;
    const long long rows = sq - i0 < T ? sq - i0 : T;
    const float* kb = k + (b * kv_heads + g) * sk * hd;
    const float* vb = v + (b * kv_heads + g) * sk * hd;
    __syncthreads();
    gc_att_stage(qs, q + (bh * sq + i0) * hd, rows * hd);
    gc_att_stage_rows(gs, dout, b, h, i0, rows, sq, heads, hd);
    for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) acc[x] = 0.0f;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
      lse[r] = stats[2 * (bh * sq + i0 + r)];
      dsum[r] = stats[2 * (bh * sq + i0 + r) + 1];
    }
    const long long end = gc_att_visible(i0 + rows - 1, sq, sk, causal, GC_ATT_RUNS);
    for (long long j0 = 0; j0 < end; j0 += T) {
      const long long keys = end - j0 < T ? end - j0 : T;
      __syncthreads();
      gc_att_stage(ks, kb + j0 * hd, keys * hd);
      gc_att_stage(vs, vb + j0 * hd, keys * hd);
      __syncthreads();
      for (long long x = threadIdx.x; x < rows * keys; x += blockDim.x) {
        const long long r = x / keys, c = x % keys;
        float ds = 0.0f;
        if (j0 + c < gc_att_visible(i0 + r, sq, sk, causal, GC_ATT_RUNS)) {
          const float p = expf(scale * gc_att_dot(qs + r * hd, ks + c * hd, hd) - lse[r]);
          ds = p * (gc_att_dot(gs + r * hd, vs + c * hd, hd) - dsum[r]);
        }
        ss[r * GC_ATT_ROWS + c] = ds;
      }
      __syncthreads();
      for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) {
        const long long r = x / hd, d = x % hd;
        const float* sr = ss + r * GC_ATT_ROWS;
        float a = acc[x];
        for (long long c = 0; c < keys; c++) a += sr[c] * ks[c * hd + d];
        acc[x] = a;
      }
    }
    __syncthreads();
    float* ob = dq + (bh * sq + i0) * hd;
    for (long long x = threadIdx.x; x < rows * hd; x += blockDim.x) ob[x] = scale * acc[x];
  }
}

// gc_att_grad_kv is dk (v given: Σ p·(dout·v − D)·q, times scale) or dv
// (v null: Σ p·dout) for one key tile per block step, summed over every
// query head of the device that reads the k/v head and every query tile
// that sees the key tile, in that order.
static __device__ __forceinline__ void gc_att_grad_kv(float* dkv, const float* q, const float* k, const float* v,
                                                      const float* dout, const float* stats, long long batch,
                                                      long long heads, long long kv_heads, long long sq, long long sk,
                                                      long long hd, long long tiles, long long group, long long q_off,
                                                      long long kv_off, float scale, int causal,
                                                      long long qp0, long long qbrk, long long qp1,
                                                      long long kp0, long long kbrk, long long kp1) {
  __shared__ float ks[GC_ATT_TILE], vs[GC_ATT_TILE], qs[GC_ATT_TILE], gs[GC_ATT_TILE], acc[GC_ATT_TILE];
  __shared__ float ss[GC_ATT_ROWS * GC_ATT_ROWS];
  __shared__ float lse[GC_ATT_ROWS], dsum[GC_ATT_ROWS];
  const long long T = gc_att_rows(hd);
  GC_FOR_ROWS(w, batch * kv_heads * tiles) {
    const long long bg = w / tiles, j0 = (w % tiles) * T;
    const long long b = bg / kv_heads, g = bg % kv_heads;
    const long long keys = sk - j0 < T ? sk - j0 : T;
    long long hlo = (kv_off + g) * group - q_off, hhi = hlo + group;
    hlo = hlo < 0 ? 0 : hlo;
    hhi = hhi > heads ? heads : hhi;
    __syncthreads();
    gc_att_stage(ks, k + (bg * sk + j0) * hd, keys * hd);
    if (v) gc_att_stage(vs, v + (bg * sk + j0) * hd, keys * hd);
    for (long long x = threadIdx.x; x < keys * hd; x += blockDim.x) acc[x] = 0.0f;
    const long long first = gc_att_first(j0, sq, causal, GC_ATT_RUNS);
    for (long long h = hlo; h < hhi; h++) {
      const long long qh = b * heads + h;
      for (long long i0 = (first / T) * T; i0 < sq; i0 += T) {
        const long long rows = sq - i0 < T ? sq - i0 : T;
        __syncthreads();
        gc_att_stage(qs, q + (qh * sq + i0) * hd, rows * hd);
        gc_att_stage_rows(gs, dout, b, h, i0, rows, sq, heads, hd);
        for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
          lse[r] = stats[2 * (qh * sq + i0 + r)];
          dsum[r] = stats[2 * (qh * sq + i0 + r) + 1];
        }
        __syncthreads();
        for (long long x = threadIdx.x; x < rows * keys; x += blockDim.x) {
          const long long r = x / keys, c = x % keys;
          float e = 0.0f;
          if (j0 + c < gc_att_visible(i0 + r, sq, sk, causal, GC_ATT_RUNS)) {
            e = expf(scale * gc_att_dot(qs + r * hd, ks + c * hd, hd) - lse[r]);
            if (v) e *= gc_att_dot(gs + r * hd, vs + c * hd, hd) - dsum[r];
          }
          ss[r * GC_ATT_ROWS + c] = e;
        }
        __syncthreads();
        const float* src = v ? qs : gs;
        for (long long x = threadIdx.x; x < keys * hd; x += blockDim.x) {
          const long long c = x / hd, d = x % hd;
          float a = acc[x];
          for (long long r = 0; r < rows; r++) a += ss[r * GC_ATT_ROWS + c] * src[r * hd + d];
          acc[x] = a;
        }
      }
    }
    __syncthreads();
    const float f = v ? scale : 1.0f;
    float* ob = dkv + (bg * sk + j0) * hd;
    for (long long x = threadIdx.x; x < keys * hd; x += blockDim.x) ob[x] = f * acc[x];
  }
}

// gc_attention_grad_k: dk = scale·Σᵢ p·(dout·v − D)·qᵢ over the query heads
// sharing the k/v head. tiles is ⌈sk / gc_att_rows(hd)⌉.
extern "C" __global__ void gc_attention_grad_k(float* dk, const float* q, const float* k, const float* v,
                                               const float* dout, const float* stats, long long batch, long long heads,
                                               long long kv_heads, long long sq, long long sk, long long hd,
                                               long long tiles, long long group, long long q_off, long long kv_off,
                                               float scale, int causal,
                                               long long qp0, long long qbrk, long long qp1,
                                               long long kp0, long long kbrk, long long kp1) {
  gc_att_grad_kv(dk, q, k, v, dout, stats, batch, heads, kv_heads, sq, sk, hd, tiles, group, q_off, kv_off, scale,
                 causal, GC_ATT_RUNS);
}

// gc_attention_grad_v: dv = Σᵢ pᵀ·doutᵢ over the query heads sharing the
// k/v head. tiles is ⌈sk / gc_att_rows(hd)⌉.
extern "C" __global__ void gc_attention_grad_v(float* dv, const float* q, const float* k, const float* dout,
                                               const float* stats, long long batch, long long heads, long long kv_heads,
                                               long long sq, long long sk, long long hd, long long tiles, long long group,
                                               long long q_off, long long kv_off, float scale, int causal,
                                               long long qp0, long long qbrk, long long qp1,
                                               long long kp0, long long kbrk, long long kp1) {
  gc_att_grad_kv(dv, q, k, nullptr, dout, stats, batch, heads, kv_heads, sq, sk, hd, tiles, group, q_off, kv_off,
                 scale, causal, GC_ATT_RUNS);
}

// gc_att_add_exp is log(e^a + e^b), either of them possibly −inf.
static __device__ __forceinline__ float gc_att_add_exp(float a, float b) {
  const float hi = a > b ? a : b;
  if (hi == gc_neg_inf()) return hi;
  return hi + logf(expf(a - hi) + expf(b - hi));
}

// gc_att_merge folds one ring step's partial output part (each row
// normalised over that step's keys, log-sum-exp lsp) into the running
// output acc and log-sum-exp lse: acc = e^(lse−new)·acc + e^(lsp−new)·part,
// new = log(e^lse + e^lsp). A row the step's keys are all hidden from
// (lsp −inf) is left as it is. Rows are [batch, heads, sq] for the
// log-sum-exps and [batch, sq, heads, hd] for the outputs.
extern "C" __global__ void gc_att_merge(float* acc, float* lse, const float* part, const float* lsp, long long batch,
                                        long long heads, long long sq, long long hd) {
  GC_FOR_EACH(row, batch * heads * sq) {
    const float l2 = lsp[row];
    if (l2 == gc_neg_inf()) continue;
    const float l1 = lse[row];
    const float merged = gc_att_add_exp(l1, l2);
    const float a = expf(l1 - merged), c = expf(l2 - merged);
    const long long bh = row / sq, i = row % sq;
    const long long o = gc_att_orow(bh / heads, bh % heads, i, sq, heads, hd);
    for (long long x = 0; x < hd; x++) acc[o + x] = acc[o + x] * a + part[o + x] * c;
    lse[row] = merged;
  }
}

// gc_att_stats_merge folds one ring step's statistics part into stats:
// the log-sum-exps add (in the exp domain); D, the second of each row's
// pair, is the first step's.
extern "C" __global__ void gc_att_stats_merge(float* stats, const float* part, long long rows) {
  GC_FOR_EACH(r, rows) { stats[2 * r] = gc_att_add_exp(stats[2 * r], part[2 * r]); }
}
