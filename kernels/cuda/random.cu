// random.cu — counter-based random numbers and the standard normal CDF
// (ir/moe.go's random, one kernel per dist, and normal_cdf). Each mirrors
// kernels/cpu/random.go: a draw is a pure function of (key, stream,
// index), computed in 64-bit integers as the CPU does, so any grid gives
// the same tensor. The uniform's double is rounded once to float and
// dropout decides on integers, both giving the CPU's bits; the normal and
// the CDF are computed in double with the CPU's formulas, the math
// library's log, cos and erfc differing from Go's at most in the double's
// last places, which the rounding to float almost always hides. Launch:
// any grid over the elements (grid-stride loops).

// gc_mix64 is SplitMix64's finaliser (kernels/cpu's Mix64).
static __device__ __forceinline__ unsigned long long gc_mix64(unsigned long long z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// gc_random_bits is draw j of key in stream (kernels/cpu's RandomBits):
// the key's and the stream's low 32 bits, as unsigned, make the seed.
static __device__ __forceinline__ unsigned long long gc_random_bits(int key, long long stream,
                                                                    long long j) {
  const unsigned long long seed =
      (unsigned long long)(unsigned)key | ((unsigned long long)(unsigned)stream << 32);
  return gc_mix64(gc_mix64(seed) + (unsigned long long)j * 0x9e3779b97f4a7c15ull);
}

// gc_unit23 maps the low 23 bits to (0, 1) in double, exactly (unit23).
static __device__ __forceinline__ double gc_unit23(unsigned long long bits) {
  return ((double)(bits & 0x7fffffull) + 0.5) / 8388608.0;
}

// gc_random_uniform: out[k·n + j] = U(0, 1) from the top 24 bits of draw
// j of key[k], rounded once to float as the CPU rounds it (a value above
// ½ may round to even; the top one, 1 − 2⁻²⁵, to 1); 0.5 for key −1.
// keys·n elements.
extern "C" __global__ void gc_random_uniform(float* out, const int* key, long long keys,
                                             long long n, long long stream) {
  GC_FOR_EACH(i, keys * n) {
    const long long k = i / n, j = i - k * n;
    const int kv = key[k];
    out[i] = kv == -1 ? 0.5f : (float)gc_unit23(gc_random_bits(kv, stream, j) >> 41);
  }
}

// gc_random_normal: out[k·n + j] = N(0, 1) by Box–Muller in double,
// √(−2 ln u1)·cos(2π u2), u1 from bits 40..63 and u2 from bits 16..39 of
// draw j of key[k], rounded once to float; 0 for key −1.
extern "C" __global__ void gc_random_normal(float* out, const int* key, long long keys,
                                            long long n, long long stream) {
  GC_FOR_EACH(i, keys * n) {
    const long long k = i / n, j = i - k * n;
    const int kv = key[k];
    if (kv == -1) {
      out[i] = 0.0f;
      continue;
    }
    const unsigned long long b = gc_random_bits(kv, stream, j);
    const double u1 = gc_unit23(b >> 41), u2 = gc_unit23(b >> 17);
    // 2π rounded to double, as Go's 2*math.Pi is.
    out[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

// gc_random_dropout: out[k·n + j] = inverted dropout's multiplier, scale
// where draw j of key[k] is kept and 0 where it is dropped; 1 for key −1.
// The CPU keeps a draw whose uniform (m + ½)/2²³, m its top 23 bits, is
// below 1 − p: that is m < keep, the count the host works out from p with
// the CPU's own double arithmetic (DropoutArgs), so no double crosses
// the launch and the decision is the CPU's exactly. scale is the CPU's
// float32(1/(1 − p)).
extern "C" __global__ void gc_random_dropout(float* out, const int* key, long long keys,
                                             long long n, long long stream, long long keep,
                                             float scale) {
  GC_FOR_EACH(i, keys * n) {
    const long long k = i / n, j = i - k * n;
    const int kv = key[k];
    if (kv == -1) {
      out[i] = 1.0f;
      continue;
    }
    const long long m = (long long)(gc_random_bits(kv, stream, j) >> 41);
    out[i] = m < keep ? scale : 0.0f;
  }
}

// gc_normal_cdf: out[i] = Φ(x[i]) = ½·erfc(−x/√2) in double (erfc keeps
// the lower tail accurate), rounded once to float; a NaN gives the
// positive quiet NaN Go's Erfc returns whatever the input's sign (a math
// library may pass the negated input through). out may be x.
extern "C" __global__ void gc_normal_cdf(float* out, const float* x, long long n) {
  GC_FOR_EACH(i, n) {
    const float v = x[i];
    out[i] = v != v ? gc_bits_float(0x7fc00000u) : (float)(0.5 * erfc(-(double)v / 1.4142135623730951));
  }
}
