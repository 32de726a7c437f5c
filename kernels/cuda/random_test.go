package cuda_test

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/kernels/cuda"
)

// randomKeys are keys for the random kernels: −1 (no noise) at either
// end and in the middle, other negative keys (whose uint32 differs from
// −1's only in low bits, and the extremes), 0, and arbitrary ones.
func randomKeys(n int) []int32 {
	fixed := []int32{-1, 0, 1, -2, math.MinInt32, math.MaxInt32, -1, 12345, -987654}
	keys := make([]int32, n)
	r := newRand(uint64(n) + 3)
	for i := range keys {
		if i < len(fixed) {
			keys[i] = fixed[i]
		} else {
			keys[i] = int32(r.Uint32())
		}
	}
	if n > 1 {
		keys[n-1] = -1
	}
	return keys
}

// randomStreams include a negative one and one beyond 32 bits, of which
// only the low 32 bits count (uint32(stream) on the CPU).
var randomStreams = []int{0, 1, 7, -3, 1<<33 + 5}

// ulpBound is the error allowed for a normal draw or a CDF value: the
// double's log, cos and erfc may differ from Go's in the last few places
// (glibc's here, CUDA's on a GPU), which shows after rounding to float
// as one unit in its last place at most, 2⁻²³ relative, plus abs: a
// subnormal's unit (2⁻¹⁴⁹) for Φ, and for a normal draw the double's
// absolute error near a zero of cos (|√(−2 ln u1)| < 6 times a few units
// of 2π·u2's last place), far below 2⁻⁴⁵.
func ulpBound(want []float32, abs float64) []float64 {
	b := make([]float64, len(want))
	for i, w := range want {
		b[i] = math.Abs(float64(w))*0x1p-23 + abs
	}
	return b
}

// Uniform draws give the CPU's bits and normal ones its values to a
// float's last place, for every key (−1 gives the centre), stream, count
// per key (more than a block, so one key's draws span blocks), block and
// grid; a grid that loops draws the same numbers.
func TestRandomMatchesCPU(t *testing.T) {
	for _, keys := range []int{1, 10, 37} {
		for _, n := range []int{1, 5, 300, 1031} {
			if keys*n > 10000 && os.Getenv("GCOMPILE_FULL_TESTS") != "1" {
				continue // 38k draws: most of the emulator's time, in the full run
			}
			key := randomKeys(keys)
			for _, stream := range randomStreams {
				for _, block := range blockSizes {
					t.Run(fmt.Sprintf("k%d_n%d_s%d_b%d", keys, n, stream, block), func(t *testing.T) {
						want := make([]float32, keys*n)
						kcpu.RandomUniform(want, key, stream, n)
						for _, grid := range grids(keys*n, block) {
							got := out(keys * n)
							launch(t, "gc_random_uniform", grid, block, got, key, keys, n, stream)
							requireBits(t, want, got, "gc_random_uniform")
						}
						kcpu.RandomNormal(want, key, stream, n)
						for _, grid := range grids(keys*n, block) {
							got := out(keys * n)
							launch(t, "gc_random_normal", grid, block, got, key, keys, n, stream)
							requireWithin(t, want, got, ulpBound(want, 0x1p-45), "gc_random_normal")
						}
					})
				}
			}
		}
	}
}

// dropoutProbs are drop probabilities for the dropout kernel: none, the
// usual ones, ones whose 1 − p falls on or beside a uniform's value
// (m + ½)/2²³ (the comparison's edge), and ones next to 1.
var dropoutProbs = []float64{0, 0.1, 0.5, 0.9, 1 - 100.5/(1<<23), math.Nextafter(1-100.5/(1<<23), 0),
	math.Nextafter(1-100.5/(1<<23), 1), 0.5 - 0.5/(1<<23), 1 - 0x1p-30, math.Nextafter(1, 0)}

// DropoutArgs keeps exactly the draws the CPU's comparison keeps: keep
// counts the 23-bit values m with (m + ½)/2²³ < 1 − p.
func TestDropoutArgs(t *testing.T) {
	for _, p := range dropoutProbs {
		keep, scale := cuda.DropoutArgs(p)
		require.Equal(t, float32(1/(1-p)), scale, "p=%v", p)
		require.True(t, keep >= 0 && keep <= 1<<23, "p=%v: keep %d", p, keep)
		for _, m := range []int64{keep - 1, keep} {
			if m < 0 || m >= 1<<23 {
				continue
			}
			require.Equal(t, m < keep, (float64(m)+0.5)/(1<<23) < 1-p, "p=%v, m=%d, keep=%d", p, m, keep)
		}
	}
	keep, _ := cuda.DropoutArgs(0)
	require.Equal(t, int64(1<<23), keep, "p=0 keeps every draw")
	keep, _ = cuda.DropoutArgs(1 - 100.5/(1<<23))
	require.Equal(t, int64(100), keep, "1 − p on a uniform's value: that one is dropped")
}

// Dropout gives the CPU's multipliers to the bit, for every key (−1
// keeps everything, as 1), stream, probability, block and grid.
func TestRandomDropoutMatchesCPU(t *testing.T) {
	const keys, n = 10, 300
	key := randomKeys(keys)
	for _, p := range dropoutProbs {
		for _, stream := range randomStreams {
			for _, block := range blockSizes {
				t.Run(fmt.Sprintf("p%v_s%d_b%d", p, stream, block), func(t *testing.T) {
					want := make([]float32, keys*n)
					kcpu.RandomDropout(want, key, stream, n, p)
					keep, scale := cuda.DropoutArgs(p)
					for _, grid := range grids(keys*n, block) {
						got := out(keys * n)
						launch(t, "gc_random_dropout", grid, block, got, key, keys, n, stream, keep, scale)
						requireBits(t, want, got, "gc_random_dropout")
					}
				})
			}
		}
	}
	// Over many draws about 1 − p are kept.
	const m = 1 << 14
	keep, scale := cuda.DropoutArgs(0.25)
	got := out(m)
	launch(t, "gc_random_dropout", 4, 256, got, []int32{77}, 1, m, 3, keep, scale)
	kept := 0
	for _, v := range got {
		if v != 0 {
			require.Equal(t, scale, v)
			kept++
		}
	}
	require.InDelta(t, 0.75, float64(kept)/m, 0.02)
}

// Key −1 gives 0.5 and 0 everywhere; the other keys and streams give
// numbers of their own (the kernels read the key and the stream).
func TestRandomKeysAndStreams(t *testing.T) {
	const n = 300
	key := []int32{-1, 5, -5, 5}
	draw := func(name string, stream int) []float32 {
		got := out(len(key) * n)
		launch(t, name, 3, 96, got, key, len(key), n, stream)
		return got
	}
	for _, name := range []string{"gc_random_uniform", "gc_random_normal"} {
		a, b := draw(name, 0), draw(name, 1)
		centre := float32(0.5)
		if name == "gc_random_normal" {
			centre = 0
		}
		for j := range n {
			require.Equal(t, centre, a[j], "%s: key -1, draw %d", name, j)
			require.Equal(t, centre, b[j], "%s: key -1, draw %d, stream 1", name, j)
		}
		require.Equal(t, a[3*n:], a[n:2*n], "%s: one key, one stream: the same numbers", name)
		require.NotEqual(t, a[n:2*n], a[2*n:3*n], "%s: keys 5 and -5", name)
		require.NotEqual(t, a[n:2*n], b[n:2*n], "%s: streams 0 and 1", name)
		require.Equal(t, a[n:2*n], draw(name, 1<<32)[n:2*n], "%s: only the stream's low 32 bits count", name)
	}
	// The uniform draws lie in [0, 1] and look uniform: their mean over
	// many draws is near ½.
	const m = 1 << 14
	got := out(m)
	launch(t, "gc_random_uniform", 4, 256, got, []int32{77}, 1, m, 3)
	sum := 0.0
	for _, v := range got {
		require.True(t, v >= 0 && v <= 1, "%v outside [0, 1]", v)
		sum += float64(v)
	}
	require.InDelta(t, 0.5, sum/m, 0.01)
}

// Φ is computed in double like the CPU's NormalCDF, so the two agree to a
// float's last place, over the whole range: both tails (subnormal and
// zero below −13), ±0, ±Inf and NaN; in place too.
func TestNormalCDF(t *testing.T) {
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		-13, -13.5, -14, -20, -40, 8, 9, 38, 1e-30, -1e-30}
	forShapes(t, func(t *testing.T, n int, grid, block uint32) {
		r := newRand(uint64(n)*5 + uint64(block))
		x := randNorm(r, n, 4)
		copy(x, special)
		want := make([]float32, n)
		kcpu.NormalCDF(want, x)
		got := out(n)
		launch(t, "gc_normal_cdf", grid, block, got, x, n)
		requireWithin(t, want, got, ulpBound(want, 0x1p-149), "gc_normal_cdf")
		launch(t, "gc_normal_cdf", grid, block, x, x, n)
		requireWithin(t, want, x, ulpBound(want, 0x1p-149), "gc_normal_cdf in place")
	})
	// A NaN of either sign gives the CPU's NaN, bit for bit.
	x := []float32{float32(math.NaN()), float32frombits(0xffc00000), float32frombits(0x7f800001), float32frombits(0xffa5a5a5)}
	want := make([]float32, len(x))
	kcpu.NormalCDF(want, x)
	got := out(len(x))
	launch(t, "gc_normal_cdf", 1, 32, got, x, len(x))
	requireBitsStrict(t, want, got, "gc_normal_cdf of NaNs")
}
