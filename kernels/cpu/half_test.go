package cpu

import (
	"math"
	"testing"
)

func TestBF16Rounding(t *testing.T) {
	cases := []struct {
		in   float32
		want float32
	}{
		{1, 1},
		{-2.5, -2.5},
		{1 + 1.0/256, 1},                      // tie between 1 and 1+2⁻⁷: even (1)
		{1 + 3.0/256, 1 + 4.0/256},            // tie: even mantissa is 1+2⁻⁶
		{1 + 1.0/256 + 1.0/4096, 1 + 1.0/128}, // above the tie: up
	}
	for _, c := range cases {
		if got := F32FromBF16(BF16FromF32(c.in)); got != c.want {
			t.Errorf("bf16(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if got := F32FromBF16(BF16FromF32(3.0e38)); math.Abs(float64(got)-3.0e38) > 3.0e38/256 {
		t.Errorf("bf16(3e38) = %v, want within 2⁻⁷ relative", got)
	}
	if got := F32FromBF16(BF16FromF32(math.MaxFloat32)); !math.IsInf(float64(got), 1) {
		t.Errorf("bf16(MaxFloat32) = %v, want +Inf (rounds up past bf16's max)", got)
	}
	if got := F32FromBF16(BF16FromF32(float32(math.Inf(-1)))); !math.IsInf(float64(got), -1) {
		t.Errorf("bf16(-Inf) = %v", got)
	}
	if got := F32FromBF16(BF16FromF32(float32(math.NaN()))); !math.IsNaN(float64(got)) {
		t.Errorf("bf16(NaN) = %v, want NaN", got)
	}
	// Every bf16 value survives a round trip through float32.
	for h := 0; h < 1<<16; h++ {
		f := F32FromBF16(uint16(h))
		if f != f {
			continue
		}
		if back := BF16FromF32(f); back != uint16(h) {
			t.Fatalf("bf16 %#04x → %v → %#04x", h, f, back)
		}
	}
}

func TestF16Rounding(t *testing.T) {
	cases := []struct{ in, want float32 }{
		{1, 1},
		{65504, 65504},                     // largest finite fp16
		{1 + 1.0/2048, 1},                  // tie between 1 and 1+2⁻¹⁰: even
		{1 + 3.0/2048, 1 + 2.0/1024},       // tie: even is 1+2⁻⁹
		{6.103515625e-05, 6.103515625e-05}, // smallest normal
		{5.960464477539063e-08, 5.960464477539063e-08}, // smallest subnormal
	}
	for _, c := range cases {
		if got := F32FromF16(F16FromF32(c.in)); got != c.want {
			t.Errorf("fp16(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if got := F32FromF16(F16FromF32(70000)); !math.IsInf(float64(got), 1) {
		t.Errorf("fp16(70000) = %v, want +Inf (overflow)", got)
	}
	if got := F32FromF16(F16FromF32(1e-9)); got != 0 {
		t.Errorf("fp16(1e-9) = %v, want 0 (underflow)", got)
	}
	x := []float32{1.5, -3, 1e6, float32(math.NaN())}
	h := make([]uint16, len(x))
	Round16(h, x, false)
	y := make([]float32, len(x))
	Widen16(y, h, false)
	if y[0] != 1.5 || y[1] != -3 || !math.IsInf(float64(y[2]), 1) || !math.IsNaN(float64(y[3])) {
		t.Errorf("Round16/Widen16 fp16: %v", y)
	}
	if n := CountNonFinite(y); n != 2 {
		t.Errorf("CountNonFinite(%v) = %d, want 2", y, n)
	}
}
