// shape.cu — kernels that only move elements: strided gathers (transpose
// and broadcast), slices, their gradient, concatenation and repeats
// (repeat_interleave; its gradient sums, so it is in reduce.cu). They copy
// float bits without arithmetic, so the same kernels move i32 token ids
// (pass the i32 buffer as float*; built without fast-math, loads and
// stores keep every bit pattern). Launch: any grid over the output.

// gc_gather_tiled moves a gather that reads along one out dim a and
// writes along out's last dim: in is contiguous along a (stride 1) but
// not along dim 5 (stride s5 ≠ 1), as in a transpose that moves the last
// dim. Elementwise, each warp's reads would then be 32 elements s5 apart,
// a 32-byte sector fetched for every 4 bytes used. Instead a block takes a
// 32×32 tile of (a, 5) at a time, one batch index of the other dims: warps
// read rows of 32 adjacent input elements into shared memory and write
// rows of 32 adjacent output elements back, so both sides coalesce (4
// bytes read and 4 written per element, against up to 32 + 4). The tile
// is 32×33 so that reading a column of it hits 32 different banks. Only
// bits move. Returns false (having done nothing) when the gather is not
// of that form or a tile side would be under half used.
static __device__ __forceinline__ bool gc_gather_tiled(float* out, const float* in, long long n,
                                                       const long long (&dims)[6],
                                                       const long long (&st)[6]) {
  if (n == 0 || st[5] == 1 || dims[5] < 16) return false;
  int a = -1;
  for (int i = 4; i >= 0; i--) {
    if (st[i] == 1 && dims[i] >= 16) {
      a = i;
      break;
    }
  }
  if (a < 0) return false;
  __shared__ float tile[32][33];
  long long d[6], os[6];
  d[0] = n / (dims[1] * dims[2] * dims[3] * dims[4] * dims[5]);
  for (int i = 1; i < 6; i++) d[i] = dims[i];
  os[5] = 1;
  for (int i = 4; i >= 0; i--) os[i] = os[i + 1] * d[i + 1];
  const long long A = d[a], B = d[5], ta = (A + 31) / 32, tb = (B + 31) / 32;
  const long long tiles = n / (A * B) * ta * tb, s5 = st[5], oa = os[a];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    long long q = t / (ta * tb);
    const long long rest = t - q * (ta * tb), a0 = rest / tb * 32, b0 = rest % tb * 32;
    long long ib = 0, ob = 0;  // the batch index's offsets in in and out
    for (int i = 4; i >= 0; i--) {
      if (i == a) continue;
      const long long c = q % d[i];
      q /= d[i];
      ib += c * st[i];
      ob += c * os[i];
    }
    for (unsigned rr = warp; rr < 32; rr += warps) {
      const long long ai = a0 + lane, bi = b0 + rr;
      if (ai < A && bi < B) tile[rr][lane] = in[ib + ai + bi * s5];
    }
    __syncthreads();
    for (unsigned rr = warp; rr < 32; rr += warps) {
      const long long ai = a0 + rr, bi = b0 + lane;
      if (ai < A && bi < B) out[ob + ai * oa + bi] = tile[lane][rr];
    }
    __syncthreads();  // the tile is refilled for the next one
  }
  return true;
}

// gc_gather fills the contiguous out (n elements) from in. out is viewed
// with up to six dims d0…d5 (d0 implied by n; unused leading dims are 1)
// and stepping along out dim k moves sk elements in in; a stride of 0
// repeats (broadcast). A transpose is a gather whose strides are the
// input's, permuted. kernels.go's TransposeGather and BroadcastGather
// build the arguments. A transpose that moves the input's last dim away
// from out's last goes through shared-memory tiles (gc_gather_tiled);
// the rest (broadcasts, permutes that keep the last dim, small dims) read
// as they write, element by element.
extern "C" __global__ void gc_gather(float* out, const float* in, long long n, long long d1,
                                     long long d2, long long d3, long long d4, long long d5,
                                     long long s0, long long s1, long long s2, long long s3,
                                     long long s4, long long s5) {
  const long long dims[6] = {1, d1, d2, d3, d4, d5}, st[6] = {s0, s1, s2, s3, s4, s5};
  if (gc_gather_tiled(out, in, n, dims, st)) return;
  GC_FOR_EACH(i, n) {
    long long r = i, off = 0;
    off += (r % d5) * s5;
    r /= d5;
    off += (r % d4) * s4;
    r /= d4;
    off += (r % d3) * s3;
    r /= d3;
    off += (r % d2) * s2;
    r /= d2;
    off += (r % d1) * s1;
    r /= d1;
    off += r * s0;
    out[i] = in[off];
  }
}

// gc_slice copies [start, start+width) along a dim of size d: in is
// viewed as [outer, d, inner] and out as [outer, width, inner].
extern "C" __global__ void gc_slice(float* out, const float* in, long long outer, long long d,
                                    long long inner, long long start, long long width) {
  const long long w = width * inner;
  GC_FOR_EACH(i, outer * w) {
    const long long o = i / w, k = i - o * w;
    out[i] = in[(o * d + start) * inner + k];
  }
}

// gc_slice_grad is the gradient of gc_slice: dx ([outer, d, inner]) holds
// dy ([outer, width, inner]) at [start, start+width) and zeros elsewhere.
// Every element of dx is written once, so no clearing pass is needed.
extern "C" __global__ void gc_slice_grad(float* dx, const float* dy, long long outer, long long d,
                                         long long inner, long long start, long long width) {
  const long long row = d * inner;
  GC_FOR_EACH(i, outer * row) {
    const long long o = i / row, k = i - o * row, at = k / inner - start;
    dx[i] = (at >= 0 && at < width) ? dy[(o * width + at) * inner + k % inner] : 0.0f;
  }
}

// gc_concat_piece writes one input of a concatenation into its place:
// in ([outer, width, inner]) lands at [start, start+width) of out
// ([outer, total, inner]). A concat of k inputs is k launches that write
// disjoint parts of out.
extern "C" __global__ void gc_concat_piece(float* out, const float* in, long long outer,
                                           long long total, long long inner, long long start,
                                           long long width) {
  const long long w = width * inner;
  GC_FOR_EACH(i, outer * w) {
    const long long o = i / w, k = i - o * w;
    out[(o * total + start) * inner + k] = in[i];
  }
}

// gc_repeat_interleave repeats each of the n slices of x ([outer, n,
// inner]) repeats times in place: out ([outer, n·repeats, inner]) holds
// x[o, i, :] at i·repeats … i·repeats+repeats−1 of its middle dim (the k and
// v heads of grouped-query attention shared among query heads). Sizes
// are the device's local ones: a device holding some of the n slices
// repeats its own.
extern "C" __global__ void gc_repeat_interleave(float* out, const float* x, long long outer,
                                                long long n, long long inner,
                                                long long repeats) {
  const long long w = repeats * inner;  // out elements made from one slice of x
  GC_FOR_EACH(i, outer * n * w) {
    const long long row = i / w;  // o·n + the slice's index
    out[i] = x[row * inner + i % inner];
  }
}
