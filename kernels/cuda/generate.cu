// Generation's kernels (ir/generate.go): each token's position comes from
// a positions tensor [batch, step] instead of its row, so a decode step
// at position t rotates, stores and attends as row t of one long sequence
// would. Positions outside the cache set status[0] (the runtime names the
// op) instead of writing or reading out of bounds.

// gc_rope_at is gc_rope with row (b, h, i) of x [batch, heads, step, d]
// at position pos[b·step + i]: the same angles, in double, rounded once.
// One thread per pair; out must not be x.
extern "C" __global__ void gc_rope_at(float* out, const float* x, const int* pos, long long batch, long long heads,
                                      long long step, long long half, float theta) {
  const long long d = 2 * half;
  GC_FOR_EACH(e, batch * heads * step * half) {
    const long long r = e / half, i = e - r * half;
    const long long b = r / (heads * step), t = r % step;
    const double angle = (double)pos[b * step + t] * pow((double)theta, -2.0 * (double)i / (double)d);
    const double cs = cos(angle), sn = sin(angle);
    const float* xr = x + r * d;
    float* o = out + r * d;
    const double a = (double)xr[i], c = (double)xr[i + half];
    o[i] = (float)(a * cs - c * sn);
    o[i + half] = (float)(c * cs + a * sn);
  }
}

// gc_kv_write stores the step's keys or values fresh [batch, kv, step, hd]
// into cache [batch, kv, ctx, hd], which out is (the lowering writes in
// place; otherwise the runtime copies the cache into out first): row i of
// sequence b goes to row pos[b·step + i].
extern "C" __global__ void gc_kv_write(float* out, int* status, const float* fresh, const int* pos, long long batch,
                                       long long kv, long long ctx, long long step, long long hd) {
  GC_FOR_EACH(e, batch * kv * step * hd) {
    const long long x = e % hd, r = e / hd;
    const long long t = r % step, bg = r / step, b = bg / kv;
    const int p = pos[b * step + t];
    if (p < 0 || p >= ctx) {
      if (x == 0) gc_atomic_max_int(status, 1);
      continue;
    }
    out[(bg * ctx + p) * hd + x] = fresh[e];
  }
}

// gc_attention_at is attention of q [batch, heads, sq, hd] over a cache
// k, v [batch, kv, ctx, hd] in which query (b, i) sees the keys at
// positions 0…pos[b·sq + i], with out [batch, sq, heads, hd]. One thread
// per query row, an online softmax in double over the visible keys, the
// row's accumulator in local memory (hd ≤ GC_ATT_AT_HD): simple rather
// than fast, a decode step's rows being few.
#define GC_ATT_AT_HD 256
extern "C" __global__ void gc_attention_at(float* out, int* status, const float* q, const float* k, const float* v,
                                           const int* pos, long long batch, long long heads, long long kvh, long long sq,
                                           long long ctx, long long hd, long long group, long long qoff, long long kvoff,
                                           float scale) {
  GC_FOR_EACH(row, batch * heads * sq) {
    const long long i = row % sq, bh = row / sq, h = bh % heads, b = bh / heads;
    const long long g = (qoff + h) / group - kvoff;
    const int p = pos[b * sq + i];
    float* o = out + ((b * sq + i) * heads + h) * hd;
    if (p < 0 || p >= ctx || g < 0 || g >= kvh) {
      gc_atomic_max_int(status, 1);
      for (long long x = 0; x < hd; x++) o[x] = 0.0f;
      continue;
    }
    const float* qr = q + ((b * heads + h) * sq + i) * hd;
    const float* kb = k + (b * kvh + g) * ctx * hd;
    const float* vb = v + (b * kvh + g) * ctx * hd;
    // Key 0 (always visible) starts the running max, so no −∞ is needed.
    double acc[GC_ATT_AT_HD];
    double m = 0.0, l = 0.0;
    for (long long j = 0; j <= p; j++) {
      double s = 0.0;
      for (long long x = 0; x < hd; x++) s += (double)qr[x] * (double)kb[j * hd + x];
      s *= (double)scale;
      if (j == 0) {
        m = s;
        for (long long x = 0; x < hd; x++) acc[x] = 0.0;
      } else if (s > m) {
        const double alpha = exp(m - s);
        l *= alpha;
        for (long long x = 0; x < hd; x++) acc[x] *= alpha;
        m = s;
      }
      const double w = exp(s - m);
      l += w;
      for (long long x = 0; x < hd; x++) acc[x] += w * (double)vb[j * hd + x];
    }
    for (long long x = 0; x < hd; x++) o[x] = (float)(acc[x] / l);
  }
}
