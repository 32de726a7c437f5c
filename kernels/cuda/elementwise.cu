// elementwise.cu — one output element per index: arithmetic, activations
// and their gradients, scaling, and the conversions between float32 and
// the 16-bit formats. Launch: any grid over n (grid-stride loops). The
// output may be the very buffer of an input (updates in place).

extern "C" __global__ void gc_add(float* out, const float* a, const float* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] + b[i];
}

extern "C" __global__ void gc_sub(float* out, const float* a, const float* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] - b[i];
}

extern "C" __global__ void gc_mul(float* out, const float* a, const float* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] * b[i];
}

extern "C" __global__ void gc_div(float* out, const float* a, const float* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] / b[i];
}

extern "C" __global__ void gc_neg(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = -x[i];
}

extern "C" __global__ void gc_exp(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = expf(x[i]);
}

extern "C" __global__ void gc_log(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = logf(x[i]);
}

extern "C" __global__ void gc_tanh(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = tanhf(x[i]);
}

extern "C" __global__ void gc_sqrt(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = sqrtf(x[i]);
}

extern "C" __global__ void gc_relu(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = x[i] > 0 ? x[i] : 0.0f;  // NaN → 0, as the CPU kernel
}

extern "C" __global__ void gc_relu_grad(float* dx, const float* x, const float* dy, long long n) {
  GC_FOR_EACH(i, n) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
}

extern "C" __global__ void gc_tanh_grad(float* dx, const float* y, const float* dy, long long n) {
  GC_FOR_EACH(i, n) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// gc_gelu_halves returns σ(2u) = ½(1 + tanh u) in *s and σ(−2u) =
// ½(1 − tanh u) in *sc for GELU's inner argument u. Written through one
// exp of a non-positive number, neither half loses digits to the
// cancellation that 1 + tanh u suffers for negative u.
static __device__ __forceinline__ void gc_gelu_halves(float z, float* s, float* sc) {
  const float u = GC_GELU_C * (z + GC_GELU_A * z * z * z);
  const float e = expf(-2.0f * fabsf(u));
  const float big = 1.0f / (1.0f + e), small = e / (1.0f + e);
  *s = u >= 0 ? big : small;
  *sc = u >= 0 ? small : big;
}

// gc_gelu is the tanh approximation used by GPT-2: ½·x·(1 + tanh u).
extern "C" __global__ void gc_gelu(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) {
    float s, sc;
    gc_gelu_halves(x[i], &s, &sc);
    out[i] = x[i] * s;
  }
}

// gc_gelu_grad differentiates the same approximation:
// ½(1 + tanh u) + ½·x·(1 − tanh² u)·u′, with 1 − tanh² u = 4·σ(2u)·σ(−2u).
extern "C" __global__ void gc_gelu_grad(float* dx, const float* x, const float* dy, long long n) {
  GC_FOR_EACH(i, n) {
    const float z = x[i];
    float s, sc;
    gc_gelu_halves(z, &s, &sc);
    const float du = GC_GELU_C * (1.0f + 3.0f * GC_GELU_A * z * z);
    dx[i] = (s + 2.0f * s * sc * z * du) * dy[i];
  }
}

// gc_sigmoid_halves returns σ(z) in *s and σ(−z) = 1 − σ(z) in *sc, both
// through one exp of a non-positive number, as gc_gelu_halves: neither
// overflows, and σ(−z) keeps the digits that 1 − σ(z) would lose for
// large z. A NaN gives NaNs.
static __device__ __forceinline__ void gc_sigmoid_halves(float z, float* s, float* sc) {
  const float e = expf(-fabsf(z));
  const float big = 1.0f / (1.0f + e), small = e / (1.0f + e);
  *s = z >= 0 ? big : small;
  *sc = z >= 0 ? small : big;
}

// gc_silu is SiLU (swish), x·σ(x): the gate of Llama's SwiGLU.
extern "C" __global__ void gc_silu(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) {
    float s, sc;
    gc_sigmoid_halves(x[i], &s, &sc);
    out[i] = x[i] * s;
  }
}

// gc_silu_grad differentiates it: dy·σ(x)·(1 + x·(1 − σ(x))), with
// 1 − σ(x) taken as σ(−x).
extern "C" __global__ void gc_silu_grad(float* dx, const float* x, const float* dy, long long n) {
  GC_FOR_EACH(i, n) {
    const float z = x[i];
    float s, sc;
    gc_sigmoid_halves(z, &s, &sc);
    dx[i] = s * (1.0f + z * sc) * dy[i];
  }
}

// gc_scale multiplies by a scalar that lives in device memory (the IR's
// scale op: clip coefficients, 1/loss_scale).
extern "C" __global__ void gc_scale(float* out, const float* x, const float* s, long long n) {
  const float k = s[0];
  GC_FOR_EACH(i, n) out[i] = x[i] * k;
}

// gc_scale_by multiplies by a constant known when the program is loaded
// (lower.Instr.Scale: a mean over rows split across devices).
extern "C" __global__ void gc_scale_by(float* out, const float* x, long long n, float s) {
  GC_FOR_EACH(i, n) out[i] = x[i] * s;
}

extern "C" __global__ void gc_f32_to_f16(unsigned short* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_f16_from_f32(x[i]);
}

extern "C" __global__ void gc_f32_to_bf16(unsigned short* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_bf16_from_f32(x[i]);
}

extern "C" __global__ void gc_f16_to_f32(float* out, const unsigned short* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_f32_from_f16(x[i]);
}

extern "C" __global__ void gc_bf16_to_f32(float* out, const unsigned short* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_f32_from_bf16(x[i]);
}

// gc_add_widen_bf16 and gc_add_widen_f16 add a 16-bit operand, widened
// exactly as it is read, to a float32 one: the sums of mixed-precision
// gradients over the microbatches, with no float32 copy of the 16-bit
// gradient. out may be a.
extern "C" __global__ void gc_add_widen_bf16(float* out, const float* a, const unsigned short* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] + gc_f32_from_bf16(b[i]);
}

extern "C" __global__ void gc_add_widen_f16(float* out, const float* a, const unsigned short* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = a[i] + gc_f32_from_f16(b[i]);
}

// gc_add_bf16 and gc_add_f16 add two 16-bit operands into a 16-bit
// result, the add made in float32 and rounded to the format: one step of
// a 16-bit reduction that rounds each add (--grad-reduce-dtype), the
// CPU backend's add16 bit for bit. out may be a.
extern "C" __global__ void gc_add_bf16(unsigned short* out, const unsigned short* a, const unsigned short* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_bf16_from_f32(gc_f32_from_bf16(a[i]) + gc_f32_from_bf16(b[i]));
}

extern "C" __global__ void gc_add_f16(unsigned short* out, const unsigned short* a, const unsigned short* b, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_f16_from_f32(gc_f32_from_f16(a[i]) + gc_f32_from_f16(b[i]));
}

// gc_round_f16 leaves float32 values that an fp16 buffer could hold: the
// result of an op emulated in float32 rounded as the CPU backend rounds
// it. out may be x.
extern "C" __global__ void gc_round_f16(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_f32_from_f16(gc_f16_from_f32(x[i]));
}

extern "C" __global__ void gc_round_bf16(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = gc_f32_from_bf16(gc_bf16_from_f32(x[i]));
}

// gc_i32_to_f32 converts token ids or counts, rounding to nearest even.
extern "C" __global__ void gc_i32_to_f32(float* out, const int* x, long long n) {
  GC_FOR_EACH(i, n) out[i] = (float)x[i];
}

// gc_relu_mask packs the signs of x (rows × n) into bits: bit j of byte k
// of row r is set when x[r·n + 8k + j] > 0 (NaN is not), each row
// starting on a byte with unused high bits 0 — all ReLU's gradient needs
// of x, in 1/32 of its bytes. One thread per byte. Launch: grid over
// rows·⌈n/8⌉.
extern "C" __global__ void gc_relu_mask(unsigned char* mask, const float* x, long long rows,
                                        long long n) {
  const long long w = (n + 7) / 8;
  GC_FOR_EACH(b, rows * w) {
    const long long r = b / w, k = b - r * w;
    const float* xr = x + r * n + 8 * k;
    const long long m = n - 8 * k < 8 ? n - 8 * k : 8;
    unsigned bits = 0;
    for (long long j = 0; j < m; j++) bits |= (xr[j] > 0 ? 1u : 0u) << j;
    mask[b] = (unsigned char)bits;
  }
}

// gc_relu_grad_mask: dx = dy where the element's bit is set, +0 elsewhere
// (ReLU's gradient from the packed mask); dy is copied as it is. dx may
// be dy.
extern "C" __global__ void gc_relu_grad_mask(float* dx, const unsigned char* mask, const float* dy,
                                             long long rows, long long n) {
  const long long w = (n + 7) / 8;
  GC_FOR_EACH(i, rows * n) {
    const long long r = i / n, j = i - r * n;
    dx[i] = (mask[r * w + j / 8] >> (j % 8)) & 1u ? dy[i] : 0.0f;
  }
}
