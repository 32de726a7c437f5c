// reduce.cu — reductions over axes, and the global sums that gradient
// clipping and the overflow check need. A reduction over any axes is
// first merged (kernels.go's ReduceGeometry) into [outer, r, inner] with
// r reduced: inner = 1 is a row reduction (one block per row), otherwise
// a column reduction over tiles of columns (common.cuh's gc_cols: the
// block's warps split the rows of a tile, reads coalesce along the
// columns, partials combine in a fixed order). Sums accumulate in double,
// as the CPU kernels do; max is exact. The gradient of repeat_interleave
// is a sum of the same kind, over the copies of each slice, and lives here
// too.

// gc_reduce_sum_rows sums each of rows rows of n elements; with mean set
// the sum is multiplied by 1/n (as ReduceMean: NaN when n is 0).
extern "C" __global__ void gc_reduce_sum_rows(float* out, const float* in, long long rows,
                                              long long n, int mean) {
  GC_FOR_ROWS(r, rows) {
    const float* x = in + r * n;
    double s = 0;
    GC_FOR_ROW(j, n) s += (double)x[j];
    s = gc_block_sum(s);
    if (threadIdx.x == 0) out[r] = (float)(mean ? s * (1.0 / (double)n) : s);
  }
}

// gc_reduce_sum_cols sums in ([outer, r, inner]) over r into out
// ([outer, inner]). Shaped as column tiles (gc_cols) rather than a thread
// per output: the bytes read are the same, 4 per input element, but all
// the block's warps load rows of a tile at once instead of one thread
// walking r rows alone. Launch: blocks over tiles (Over outer·inner bounds
// them; extra blocks find no tile and return). The order of the double
// sum is fixed by blockDim, so results repeat run to run; they may differ
// from the CPU's serial order in the last bit of the float.
extern "C" __global__ void gc_reduce_sum_cols(float* out, const float* in, long long outer,
                                              long long r, long long inner, int mean) {
  const gc_cols g = gc_cols_of(outer, r, inner);
  GC_FOR_ROWS(t, g.tiles) {
    long long o;
    const long long k = gc_cols_column(g, t, &o);
    const float* x = in + o * r * inner + k;
    double s = gc_cols_walk(
        g, k < inner, 0.0, [&](long long j) { return (double)x[j * inner]; }, gc_add_op());
    s = gc_cols_combine(g, s, gc_add_op());
    if (threadIdx.x < (unsigned)g.cw && k < inner) {
      out[o * inner + k] = (float)(mean ? s * (1.0 / (double)r) : s);
    }
  }
}

// gc_reduce_max_rows takes each row's maximum; a NaN wins, an empty row
// gives −Inf.
extern "C" __global__ void gc_reduce_max_rows(float* out, const float* in, long long rows,
                                              long long n) {
  GC_FOR_ROWS(r, rows) {
    const float m = gc_row_max(in + r * n, n);
    if (threadIdx.x == 0) out[r] = m;
  }
}

// gc_reduce_max_cols: the column maxima, tiled as gc_reduce_sum_cols
// (same 4 bytes per element, more loads in flight; a max is exact, so any
// order gives the CPU's result; a NaN wins).
extern "C" __global__ void gc_reduce_max_cols(float* out, const float* in, long long outer,
                                              long long r, long long inner) {
  const gc_cols g = gc_cols_of(outer, r, inner);
  GC_FOR_ROWS(t, g.tiles) {
    long long o;
    const long long k = gc_cols_column(g, t, &o);
    const float* x = in + o * r * inner + k;
    float m = gc_cols_walk(
        g, k < inner, gc_neg_inf(), [&](long long j) { return x[j * inner]; }, gc_max_op());
    m = gc_cols_combine(g, m, gc_max_op());
    if (threadIdx.x < (unsigned)g.cw && k < inner) out[o * inner + k] = m;
  }
}

// gc_reduce_max_grad splits each group's dy evenly among the elements
// equal to the group's max y, zero elsewhere ([outer, r, inner] as
// above). Column tiles again: the block counts each column's ties (an
// integer sum, exact), then the same threads write their rows. Where a
// thread per output walked r strided elements twice (for inner = 1 a
// whole row per thread, uncoalesced), each warp now reads and writes
// adjacent elements; x is still read twice, dx written once.
extern "C" __global__ void gc_reduce_max_grad(float* dx, const float* x, const float* y,
                                              const float* dy, long long outer, long long r,
                                              long long inner) {
  const gc_cols g = gc_cols_of(outer, r, inner);
  GC_FOR_ROWS(t, g.tiles) {
    long long o;
    const long long k = gc_cols_column(g, t, &o);
    const bool active = k < inner;
    const long long base = o * r * inner + k;
    const float m = active ? y[o * inner + k] : 0.0f;
    long long count = gc_cols_walk(
        g, active, 0LL, [&](long long j) { return (long long)(x[base + j * inner] == m); },
        gc_add_op());
    count = gc_cols_combine(g, count, gc_add_op());
    if (!active) continue;
    const float share = dy[o * inner + k] / (float)count;
    for (long long j = g.row0; j < r; j += g.step) {
      dx[base + j * inner] = x[base + j * inner] == m ? share : 0.0f;
    }
  }
}

// gc_repeat_interleave_grad is the vjp of gc_repeat_interleave: dx
// ([outer, n, inner]) at [o, i, :] is the sum over k of dy ([outer,
// n·repeats, inner]) at [o, i·repeats+k, :], added in order of k in
// double and rounded once, so the result is the CPU kernel's to the last
// bit. One thread per element of dx.
extern "C" __global__ void gc_repeat_interleave_grad(float* dx, const float* dy, long long outer,
                                                     long long n, long long inner,
                                                     long long repeats) {
  GC_FOR_EACH(i, outer * n * inner) {
    const long long row = i / inner, k = i - row * inner;
    const float* y = dy + row * repeats * inner + k;
    double s = 0;
    for (long long j = 0; j < repeats; j++) s += (double)y[j * inner];
    dx[i] = (float)s;
  }
}

// gc_sum_squares_partial adds x² over this block's share of the
// grid-stride loop and stores the block's sum, a double as a float pair,
// at partial[2·blockIdx.x]. A sum over several tensors (the global
// gradient norm) launches once per tensor with partial advanced by
// 2·gridDim.x each time, then gc_finish_sum adds the pairs.
extern "C" __global__ void gc_sum_squares_partial(float* partial, const float* x, long long n) {
  double s = 0;
  GC_FOR_EACH(i, n) s += (double)x[i] * (double)x[i];
  s = gc_block_sum(s);
  if (threadIdx.x == 0) gc_store_pair(partial + 2 * blockIdx.x, s);
}

// gc_finish_sum adds count float pairs in one block and writes
// sum/divisor (divisor 1 for a plain sum).
extern "C" __global__ void gc_finish_sum(float* out, const float* pairs, long long count,
                                         long long divisor) {
  if (blockIdx.x != 0) return;  // one block does it all; others have nothing to add
  double s = 0;
  GC_FOR_ROW(k, count) s += gc_load_pair(pairs + 2 * k);
  s = gc_block_sum(s);
  if (threadIdx.x == 0) out[0] = (float)(s / (double)divisor);
}

// gc_nonfinite_partial counts infinities and NaNs over this block's share
// into partial[blockIdx.x]; like the sum of squares, several tensors use
// consecutive ranges of partial and gc_finish_count adds them up.
extern "C" __global__ void gc_nonfinite_partial(int* partial, const float* x, long long n) {
  int c = 0;
  GC_FOR_EACH(i, n) c += gc_nonfinite(x[i]);
  c = gc_block_sum(c);
  if (threadIdx.x == 0) partial[blockIdx.x] = c;
}

extern "C" __global__ void gc_finish_count(float* out, const int* partial, long long count) {
  if (blockIdx.x != 0) return;
  long long c = 0;
  GC_FOR_ROW(k, count) c += partial[k];
  c = gc_block_sum(c);
  if (threadIdx.x == 0) out[0] = (float)c;
}
