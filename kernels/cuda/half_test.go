package cuda_test

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/x448/float16"

	kcpu "gcompile/kernels/cpu"
)

// Every fp16 and bf16 bit pattern widens to the float32 the CPU backend
// gets (x448/float16 for fp16, kernels/cpu/half.go for bf16).
func TestWiden16AllPatterns(t *testing.T) {
	bits := make([]uint16, 1<<16)
	for i := range bits {
		bits[i] = uint16(i)
	}
	for _, block := range []uint32{32, 256} {
		got := out(len(bits))
		launch(t, "gc_f16_to_f32", 40, block, got, bits, len(bits))
		want := make([]float32, len(bits))
		for i, h := range bits {
			want[i] = float16.Frombits(h).Float32()
		}
		requireBitsStrict(t, want, got, "gc_f16_to_f32")

		got = out(len(bits))
		launch(t, "gc_bf16_to_f32", 40, block, got, bits, len(bits))
		for i, h := range bits {
			want[i] = kcpu.F32FromBF16(h)
		}
		requireBitsStrict(t, want, got, "gc_bf16_to_f32")
	}
}

// Adding every fp16 and bf16 bit pattern to an fp32 sum, in place, gives
// the CPU backend's bits (kcpu.AddWiden16): the sum of a mixed-precision
// gradient over the microbatches is the same on both backends.
func TestAddWiden16AllPatterns(t *testing.T) {
	bits := make([]uint16, 1<<16)
	for i := range bits {
		bits[i] = uint16(i)
	}
	r := newRand(7)
	for _, c := range []struct {
		kernel string
		bf16   bool
	}{{"gc_add_widen_f16", false}, {"gc_add_widen_bf16", true}} {
		sum := randVec(r, len(bits), -4, 4)
		want := make([]float32, len(bits))
		kcpu.AddWiden16(want, sum, bits, c.bf16)
		got := out(len(bits))
		copy(got, sum)
		launch(t, c.kernel, 40, 256, got, got, bits, len(bits))
		requireBitsStrict(t, want, got, c.kernel)
		for i, h := range bits {
			w := kcpu.F32FromF16(h)
			if c.bf16 {
				w = kcpu.F32FromBF16(h)
			}
			if w = sum[i] + w; w == w && want[i] != w {
				t.Fatalf("%s: pattern %#x: %v + its widening is %v, want %v", c.kernel, h, sum[i], want[i], w)
			}
		}
	}
}

// gc_add_bf16 and gc_add_f16 are a 16-bit reduction's add
// (--grad-reduce-dtype): every pattern plus a random one, in place, gives
// the CPU backend's rounded add bit for bit (a NaN for a NaN).
func TestAdd16AllPatterns(t *testing.T) {
	r := newRand(11)
	for _, c := range []struct {
		kernel string
		bf16   bool
	}{{"gc_add_f16", false}, {"gc_add_bf16", true}} {
		a := make([]uint16, 1<<16)
		b := make([]uint16, len(a))
		for i := range a {
			a[i], b[i] = uint16(i), uint16(r.Uint32())
		}
		want := make([]uint16, len(a))
		for i := range a {
			if c.bf16 {
				want[i] = kcpu.BF16FromF32(kcpu.F32FromBF16(a[i]) + kcpu.F32FromBF16(b[i]))
			} else {
				want[i] = kcpu.F16FromF32(kcpu.F32FromF16(a[i]) + kcpu.F32FromF16(b[i]))
			}
		}
		in := slices.Clone(a)
		launch(t, c.kernel, 40, 256, a, a, b, len(a))
		nan := func(h uint16) bool {
			if c.bf16 {
				return h&0x7f80 == 0x7f80 && h&0x7f != 0
			}
			return h&0x7c00 == 0x7c00 && h&0x3ff != 0
		}
		for i := range want {
			// Which operand's NaN payload a sum of two NaNs carries is the
			// machine's choice; a NaN stays a NaN.
			if a[i] != want[i] && !(nan(a[i]) && nan(want[i])) {
				t.Fatalf("%s: %#x + %#x gives %#x, want %#x", c.kernel, in[i], b[i], a[i], want[i])
			}
		}
	}
}

// requireBitsStrict compares bit patterns, NaN payloads included: the
// conversions promise the same NaN bits as the Go code.
func requireBitsStrict(t *testing.T, want, got []float32, what string) {
	t.Helper()
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("%s: pattern %d gives %#x, want %#x", what, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
	checkGuard(t, got)
}

// roundingInputs are float32 bit patterns that exercise rounding to the
// 16-bit formats: every fp16 value, the midpoints between neighbours and
// one ulp either side of them (ties to even), a sweep over all exponents,
// random patterns, and the edges (zeros, subnormals, the overflow
// threshold, infinities, NaNs with payloads).
func roundingInputs() []uint32 {
	var in []uint32
	for h := 0; h < 1<<16; h++ {
		f := float16.Frombits(uint16(h)).Float32()
		if f != f || math.IsInf(float64(f), 0) {
			continue
		}
		b := math.Float32bits(f)
		next := float16.Frombits(uint16(h + 1)).Float32()
		in = append(in, b)
		if h&0x7fff != 0x7bff && h&0x7fff != 0x7fff && h != 0x7fff && next == next {
			mid := math.Float32bits(float32((float64(f) + float64(next)) / 2))
			in = append(in, mid, mid+1, mid-1)
		}
	}
	for i := uint64(0); i < 1<<32; i += 4093 { // a sweep over every exponent and sign
		in = append(in, uint32(i))
	}
	r := newRand(99)
	for range 1 << 18 {
		in = append(in, r.Uint32())
	}
	edges := []uint32{0, 0x80000000, 1, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff,
		0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0xffbfffff, 0x7fffffff,
		math.Float32bits(65504), math.Float32bits(65519.99), math.Float32bits(65520), math.Float32bits(-65520),
		math.Float32bits(0x1p-24), math.Float32bits(0x1p-25), math.Float32bits(0x1.000002p-25), math.Float32bits(0x1.8p-24),
		math.Float32bits(0x1p-14), math.Float32bits(0x1.ffcp-15), math.Float32bits(0x1.ffep-15),
		math.Float32bits(3.0e38), math.Float32bits(-0x1.fffep127), math.Float32bits(1 + 0x1p-8), math.Float32bits(1 + 0x3p-8)}
	return append(in, edges...)
}

// Rounding float32 to fp16 and bf16 gives the CPU backend's bits for a
// large random and edge set, and the in-place rounding kernels give the
// widened values of those bits.
func TestRound16(t *testing.T) {
	bits := roundingInputs()
	x := make([]float32, len(bits))
	for i, b := range bits {
		x[i] = math.Float32frombits(b)
	}
	n := len(x)
	t.Logf("%d float32 inputs", n)
	wantF16, wantBF16 := make([]uint16, n), make([]uint16, n)
	kcpu.Round16(wantF16, x, false)
	kcpu.Round16(wantBF16, x, true)
	for _, block := range []uint32{32, 256} {
		for _, c := range []struct {
			kernel, round string
			want          []uint16
			widen         func(uint16) float32
		}{
			{"gc_f32_to_f16", "gc_round_f16", wantF16, kcpu.F32FromF16},
			{"gc_f32_to_bf16", "gc_round_bf16", wantBF16, kcpu.F32FromBF16},
		} {
			got := make([]uint16, n)
			launch(t, c.kernel, 64, block, got, x, n)
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("%s(%#x = %v) = %#04x, want %#04x", c.kernel, bits[i], x[i], got[i], c.want[i])
				}
			}
			vals := out(n)
			launch(t, c.round, 64, block, vals, x, n)
			for i := range vals {
				if w := c.widen(c.want[i]); math.Float32bits(vals[i]) != math.Float32bits(w) {
					t.Fatalf("%s(%#x) = %#x, want %#x", c.round, bits[i], math.Float32bits(vals[i]), math.Float32bits(w))
				}
			}
			checkGuard(t, vals)
		}
	}
}

func TestI32ToF32(t *testing.T) {
	ids := []int32{0, 1, -1, 255, 1 << 24, 1<<24 + 1, 1<<24 + 3, math.MaxInt32, math.MinInt32, 123456789}
	want, got := make([]float32, len(ids)), out(len(ids))
	kcpu.Cast(want, ids)
	launch(t, "gc_i32_to_f32", 1, 32, got, ids, len(ids))
	requireBits(t, want, got, "gc_i32_to_f32")
	require.Equal(t, float32(1<<24), got[5], "ties round to even")
}
