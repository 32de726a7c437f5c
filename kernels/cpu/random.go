package cpu

import "math"

// Counter-based random numbers: every draw is a pure function of a key,
// a stream and an index, so any device can compute any element of a
// random tensor without a generator's state, and a tensor split over
// devices holds the numbers the whole one would.

// Mix64 is SplitMix64's finaliser (Steele et al. 2014): a bijection of
// uint64 whose outputs pass statistical tests for consecutive inputs.
func Mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}

// RandomBits is draw j of key in stream.
func RandomBits(key int32, stream, j int) uint64 {
	return Mix64(Mix64(uint64(uint32(key))|uint64(uint32(stream))<<32) + uint64(j)*0x9e3779b97f4a7c15)
}

// unit23 maps the low 23 bits m to (m + ½)/2²³ in the open interval
// (0, 1): an odd multiple of 2⁻²⁴ below 1, so a float32 exactly, and
// both float types and the CUDA kernel agree.
func unit23(bits uint64) float64 { return (float64(bits&0x7fffff) + 0.5) / (1 << 23) }

// fillDraws fills out with n values per key: draw of the key's j-th
// 64-bit draw in stream, or centre for key −1 (evaluation: no noise).
func fillDraws[T Float](kernel string, out []T, keys []int32, stream, n int, centre T, draw func(bits uint64) T) {
	checkRows(kernel, len(keys), n, len(out))
	for i, k := range keys {
		o := out[i*n : (i+1)*n]
		for j := range o {
			if k == -1 {
				o[j] = centre
				continue
			}
			o[j] = draw(RandomBits(k, stream, j))
		}
	}
}

// RandomUniform fills out with n draws per key, U(0, 1); key −1 gives
// 0.5 (evaluation: no noise).
func RandomUniform[T Float](out []T, keys []int32, stream, n int) {
	fillDraws("RandomUniform", out, keys, stream, n, 0.5, func(b uint64) T { return T(unit23(b >> 41)) })
}

// RandomNormal fills out with n draws per key, N(0, 1) by Box–Muller from
// two 23-bit uniforms of one 64-bit draw; key −1 gives 0.
func RandomNormal[T Float](out []T, keys []int32, stream, n int) {
	fillDraws("RandomNormal", out, keys, stream, n, 0, func(b uint64) T {
		u1, u2 := unit23(b>>41), unit23(b>>17)
		return T(math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2))
	})
}

// RandomDropout fills out with n inverted-dropout multipliers per key:
// 1/(1−p) where the key's uniform draw (RandomUniform's) is below 1−p,
// else 0; key −1 gives 1 (evaluation: no dropout).
func RandomDropout[T Float](out []T, keys []int32, stream, n int, p float64) {
	keep, scale := 1-p, T(1/(1-p))
	fillDraws("RandomDropout", out, keys, stream, n, 1, func(b uint64) T {
		if unit23(b>>41) < keep {
			return scale
		}
		return 0
	})
}

// NormalCDF sets out[i] = Φ(x[i]) = erfc(−x/√2)/2, the standard normal
// CDF (erfc keeps the lower tail accurate). out may alias x.
func NormalCDF[T Float](out, x []T) {
	checkSame("NormalCDF", len(out), len(x))
	for i, v := range x {
		out[i] = T(0.5 * math.Erfc(-float64(v)/math.Sqrt2))
	}
}
