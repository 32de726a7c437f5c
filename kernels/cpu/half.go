package cpu

import (
	"math"

	"github.com/x448/float16"
)

// The 16-bit float formats, stored as their bit patterns in uint16. The
// CPU backend emulates fp16 and bf16 arithmetic: kernels compute in
// float32 and each result is rounded to the format.

// BF16FromF32 rounds x to bfloat16 (round to nearest, ties to even);
// overflow gives ±Inf and a NaN stays a (quiet) NaN.
func BF16FromF32(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep the sign, set the quiet bit
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F32FromBF16 widens a bfloat16 exactly.
func F32FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromF32 rounds x to IEEE binary16 (round to nearest, ties to even;
// overflow gives ±Inf, tiny values become subnormals or zero).
func F16FromF32(x float32) uint16 { return uint16(float16.Fromfloat32(x)) }

// F32FromF16 widens an IEEE binary16 exactly.
func F32FromF16(h uint16) float32 { return float16.Frombits(h).Float32() }

// Widen16 converts 16-bit floats (bf16 when bf16 is true, else fp16) to float32.
func Widen16(out []float32, in []uint16, bf16 bool) {
	checkSame("Widen16", len(out), len(in))
	forElems(len(out), func(lo, hi int) {
		o, x := out[lo:hi], in[lo:hi]
		if bf16 {
			for i := range o {
				o[i] = F32FromBF16(x[i])
			}
			return
		}
		for i := range o {
			o[i] = F32FromF16(x[i])
		}
	})
}

// AddWiden16 sets out[i] = a[i] + b[i] with b 16-bit (bf16 when bf16 is
// true, else fp16) widened exactly as it is read: Add of a and Widen16(b)
// without the float32 copy of b. out may alias a.
func AddWiden16(out, a []float32, b []uint16, bf16 bool) {
	checkSame("AddWiden16", len(out), len(a), len(b))
	forElems(len(out), func(lo, hi int) {
		o, x, y := out[lo:hi], a[lo:hi], b[lo:hi]
		if bf16 {
			for i := range o {
				o[i] = x[i] + F32FromBF16(y[i])
			}
			return
		}
		for i := range o {
			o[i] = x[i] + F32FromF16(y[i])
		}
	})
}

// Round16 rounds float32s to 16-bit floats (bf16 when bf16 is true, else fp16).
func Round16(out []uint16, in []float32, bf16 bool) {
	checkSame("Round16", len(out), len(in))
	forElems(len(out), func(lo, hi int) {
		o, x := out[lo:hi], in[lo:hi]
		if bf16 {
			for i := range o {
				o[i] = BF16FromF32(x[i])
			}
			return
		}
		for i := range o {
			o[i] = F16FromF32(x[i])
		}
	})
}

// CountNonFinite is the number of infinities and NaNs in x.
func CountNonFinite[T Float](x []T) int {
	n := 0
	for _, v := range x {
		f := float64(v)
		if math.IsInf(f, 0) || math.IsNaN(f) {
			n++
		}
	}
	return n
}
