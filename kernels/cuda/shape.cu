// shape.cu — kernels that only move elements: strided gathers (transpose
// and broadcast), slices, their gradient, concatenation and repeats
// (repeat_interleave; its gradient sums, so it is in reduce.cu). They copy
// float bits without arithmetic, so the same kernels move i32 token ids
// (pass the i32 buffer as float*; built without fast-math, loads and
// stores keep every bit pattern). Launch: any grid over the output.

// gc_gather fills the contiguous out (n elements) from in. out is viewed
// with up to six dims d0…d5 (d0 implied by n; unused leading dims are 1)
// and stepping along out dim k moves sk elements in in; a stride of 0
// repeats (broadcast). A transpose is a gather whose strides are the
// input's, permuted. kernels.go's TransposeGather and BroadcastGather
// build the arguments.
extern "C" __global__ void gc_gather(float* out, const float* in, long long n, long long d1,
                                     long long d2, long long d3, long long d4, long long d5,
                                     long long s0, long long s1, long long s2, long long s3,
                                     long long s4, long long s5) {
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
