// moe.cu — mixture-of-experts routing (ir/moe.go): the top-k mask and the
// comparison routers are written with, the slot assignment, dispatch and
// combine through the slot → token index src[G, E, C] (−1: an empty
// slot), and the gates' gradients. Each mirrors its kernels/cpu/moe.go
// kernel and gives its bits: the selections and moves are exact, and
// combine adds a token's slots in the CPU's order (experts ascending,
// then positions), one float add after another, with no atomics.
// moe_slot_dot sums in double, as the CPU does, in a block's fixed order.
//
// A slot naming a token outside [−1, tokens) is treated as empty and sets
// status[0] to 1 (the CPU kernels refuse such an index), so nothing is
// read out of bounds; the caller zeroes the status word before the step
// and checks it after.

// gc_moe_before reports whether value a at index ia ranks before value b
// at ib in a top-k: larger first, NaN after every number, ties (±0
// included) to the lower index. It is a strict total order on a row, so
// an element's rank — how many elements rank before it — is its place in
// the CPU's sorted row (kernels/cpu's topKey).
static __device__ __forceinline__ bool gc_moe_before(float a, long long ia, float b, long long ib) {
  const bool na = a != a, nb = b != b;
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// gc_moe_bad_slot flags an index that names no token of the group.
static __device__ __forceinline__ void gc_moe_bad_slot(int* status, int t, long long tokens) {
  if (t < -1 || t >= tokens) gc_atomic_max_int(status, 1);
}

// gc_top_k_mask writes 1 at the k elements of each row (rows of n) that
// rank first and 0 elsewhere. An element is chosen when fewer than k
// elements rank before it; counting stops at k, so a row costs at most
// n·k comparisons. Launch: one block per row.
extern "C" __global__ void gc_top_k_mask(float* out, const float* x, long long rows, long long n,
                                         long long k) {
  GC_FOR_ROWS(r, rows) {
    const float* row = x + r * n;
    GC_FOR_ROW(j, n) {
      const float v = row[j];
      long long before = 0;
      for (long long i = 0; i < n && before < k; i++) {
        if (i != j && gc_moe_before(row[i], i, v, j)) before++;
      }
      out[r * n + j] = before < k ? 1.0f : 0.0f;
    }
  }
}

// gc_less is 1 where a < b and 0 elsewhere (a NaN on either side gives 0).
extern "C" __global__ void gc_less(float* out, const float* a, const float* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] < b[i] ? 1.0f : 0.0f;
}

// ---- moe_route --------------------------------------------------------
// The CPU walks each group in one thread: every token's first choice in
// token order, then every second choice, …, a choice whose expert is full
// dropped. An expert's slots depend only on the choices naming it, so
// each expert can fill its own: it takes the tokens that chose it ordered
// by (the rank of that choice, token), the first capacity of them. Two
// launches over a workspace of groups·tokens·experts ints:
//   gc_moe_route_rank  rank[g, t, e] = the place of expert e among token
//                      t's selected experts, best first, or −1 when t did
//                      not select e
//   gc_moe_route_fill  one thread per (g, e): rank 0's tokens in order,
//                      then rank 1's, … until the expert is full or no
//                      token ranks it later; the rest of its slots −1

extern "C" __global__ void gc_moe_route_rank(int* rank, const float* scores, const float* mask,
                                             long long groups, long long tokens,
                                             long long experts) {
  GC_FOR_EACH(i, groups * tokens * experts) {
    const long long row = i / experts, e = i - row * experts;
    const float* s = scores + row * experts;
    const float* m = mask + row * experts;
    if (m[e] == 0.0f) {
      rank[i] = -1;
      continue;
    }
    const float v = s[e];
    int before = 0;
    for (long long o = 0; o < experts; o++) {
      if (o != e && m[o] != 0.0f && gc_moe_before(s[o], o, v, e)) before++;
    }
    rank[i] = before;
  }
}

extern "C" __global__ void gc_moe_route_fill(int* src, const int* rank, long long groups,
                                             long long tokens, long long experts,
                                             long long capacity) {
  GC_FOR_EACH(ge, groups * experts) {
    const long long g = ge / experts, e = ge - g * experts;
    const int* rk = rank + g * tokens * experts + e;
    int* o = src + ge * capacity;
    long long n = 0;
    for (int r = 0; n < capacity; r++) {
      bool later = false;
      for (long long t = 0; t < tokens && n < capacity; t++) {
        const int k = rk[t * experts];
        if (k == r) {
          o[n++] = (int)t;
        } else if (k > r) {
          later = true;
        }
      }
      if (!later) break;
    }
    for (; n < capacity; n++) o[n] = -1;
  }
}

// ---- Dispatch, combine and the gates' gradients -------------------------
// Layouts: x [G, T, M], src and w [G, E, C], the expert buffer y or out
// [E, G, C, M], p [G, T, E]. With weighted 0 the kernels read no weight
// (w may then be any buffer).

// gc_moe_dispatch: out[e, g, c, :] = w[g, e, c]·x[g, src[g, e, c], :], or
// the row itself unweighted (its bits), zeros for an empty slot.
extern "C" __global__ void gc_moe_dispatch(float* out, int* status, const float* x, const int* src,
                                           const float* w, long long groups, long long tokens,
                                           long long hidden, long long experts,
                                           long long capacity, int weighted) {
  GC_FOR_EACH(i, experts * groups * capacity * hidden) {
    const long long slot = i / hidden, m = i - slot * hidden;  // slot = (e·G + g)·C + c
    const long long c = slot % capacity, eg = slot / capacity;
    const long long g = eg % groups, e = eg / groups;
    const long long s = (g * experts + e) * capacity + c;
    const int t = src[s];
    if (t < 0 || t >= tokens) {
      if (m == 0) gc_moe_bad_slot(status, t, tokens);
      out[i] = 0.0f;
      continue;
    }
    const float v = x[(g * tokens + t) * hidden + m];
    out[i] = weighted ? w[s] * v : v;
  }
}

// GC_MOE_LIST is the most slots of one token a combine block holds in
// shared memory before it adds them; a token in more is added in batches,
// the row carrying the partial sums between them (the same additions in
// the same order).
#define GC_MOE_LIST 2048

// gc_moe_combine: out[g, t, :] = Σ w[g, e, c]·y[e, g, c, :] over the slots
// holding t, in slot order (e, then c, ascending), starting from +0 as
// the CPU's cleared row does; a token in no slot gets zeros. One block
// per (g, t): the block reads the group's E·C indices a chunk of
// blockDim at a time, compacts the chunk's matches in slot order
// (ballots and a prefix over the warps, as gc_embedding_grad's long
// rows), then each thread adds its columns' terms in that order. Every
// token's block reads its group's indices, G·T·E·C int reads in all, in
// exchange for no atomics and a fixed order.
extern "C" __global__ void gc_moe_combine(float* out, int* status, const float* y, const int* src,
                                          const float* w, long long groups, long long tokens,
                                          long long hidden, long long experts,
                                          long long capacity, int weighted) {
  __shared__ int list[GC_MOE_LIST];
  __shared__ int hits[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const long long slots = experts * capacity;
  GC_FOR_ROWS(row, groups * tokens) {
    const long long g = row / tokens, t = row - g * tokens;
    const int* s = src + g * slots;
    float* o = out + row * hidden;
    int n = 0;
    bool first = true;
    for (long long base = 0; base < slots; base += blockDim.x) {
      const long long i = base + threadIdx.x;
      const int v = i < slots ? s[i] : -1;
      if (t == 0) gc_moe_bad_slot(status, v, tokens);
      const bool hit = v == t;
      const unsigned ballot = gc_ballot(hit);
      if (lane == 0) hits[warp] = gc_popc(ballot);
      __syncthreads();
      int before = 0, found = 0;
      for (unsigned k = 0; k < warps; k++) {
        before += k < warp ? hits[k] : 0;
        found += hits[k];
      }
      if (hit) list[n + before + gc_popc(ballot & ((1u << lane) - 1u))] = (int)i;
      n += found;
      __syncthreads();  // list is complete; hits is rewritten by the next chunk
      if (n + (long long)blockDim.x <= GC_MOE_LIST && base + blockDim.x < slots) continue;
      GC_FOR_ROW(j, hidden) {
        float acc = first ? 0.0f : o[j];
        for (int k = 0; k < n; k++) {
          const long long sl = list[k], e = sl / capacity, c = sl - e * capacity;
          const float yv = y[((e * groups + g) * capacity + c) * hidden + j];
          acc += weighted ? w[g * slots + sl] * yv : yv;
        }
        o[j] = acc;
      }
      first = false;
      n = 0;
      __syncthreads();  // the list is refilled by the next chunk
    }
    if (first) GC_FOR_ROW(j, hidden) o[j] = 0.0f;  // no slots at all
  }
}

// gc_moe_slot_dot: out[g, e, c] = Σ_m y[e, g, c, m]·x[g, src, m] in double,
// rounded once; 0 for an empty slot. One block per slot, in src's order;
// the double sum's order is fixed by blockDim (gc_block_sum), so it
// repeats run to run and may differ from the CPU's serial one only in
// the double's last bits.
extern "C" __global__ void gc_moe_slot_dot(float* out, int* status, const float* y, const int* src,
                                           const float* x, long long groups, long long tokens,
                                           long long hidden, long long experts,
                                           long long capacity) {
  GC_FOR_ROWS(s, groups * experts * capacity) {
    const long long c = s % capacity, ge = s / capacity;
    const long long e = ge % experts, g = ge / experts;
    const int t = src[s];
    const bool ok = t >= 0 && t < tokens;
    double acc = 0;
    if (ok) {
      const float* yr = y + ((e * groups + g) * capacity + c) * hidden;
      const float* xr = x + (g * tokens + t) * hidden;
      GC_FOR_ROW(j, hidden) acc += (double)yr[j] * (double)xr[j];
    }
    acc = gc_block_sum(acc);
    if (threadIdx.x != 0) continue;
    if (!ok) gc_moe_bad_slot(status, t, tokens);
    out[s] = ok ? (float)acc : 0.0f;
  }
}

// gc_moe_slot_gather: out[g, e, c] = p[g, src[g, e, c], e] (its bits), 0 for
// an empty slot.
extern "C" __global__ void gc_moe_slot_gather(float* out, int* status, const float* p,
                                              const int* src, long long groups, long long tokens,
                                              long long experts, long long capacity) {
  GC_FOR_EACH(s, groups * experts * capacity) {
    const long long e = s / capacity % experts, g = s / (capacity * experts);
    const int t = src[s];
    if (t < 0 || t >= tokens) {
      gc_moe_bad_slot(status, t, tokens);
      out[s] = 0.0f;
      continue;
    }
    out[s] = p[(g * tokens + t) * experts + e];
  }
}

// gc_moe_slot_scatter, the vjp of gc_moe_slot_gather: out[g, t, e] = the
// sum from +0 of w[g, e, c] over the positions c (ascending) of expert e
// that hold t — one at most when src comes from moe_route — so each
// element is written once, without atomics. Threads run over (g, e, t)
// with t fastest, so a warp reads the same index row.
extern "C" __global__ void gc_moe_slot_scatter(float* out, int* status, const float* w,
                                               const int* src, long long groups, long long tokens,
                                               long long experts, long long capacity) {
  GC_FOR_EACH(i, groups * experts * tokens) {
    const long long ge = i / tokens, t = i - ge * tokens;
    const long long g = ge / experts, e = ge - g * experts;
    const int* s = src + ge * capacity;
    const float* ws = w + ge * capacity;
    float acc = 0.0f;
    for (long long c = 0; c < capacity; c++) {
      const int v = s[c];
      if (t == 0) gc_moe_bad_slot(status, v, tokens);
      if (v == t) acc += ws[c];
    }
    out[(g * tokens + t) * experts + e] = acc;
  }
}
