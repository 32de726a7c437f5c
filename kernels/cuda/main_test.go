package cuda_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"gcompile/kernels/cuda/emu"
)

// The emulator is built once per test binary, in a temporary directory.
var (
	theEmu   *emu.Emu
	emuError error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gcompile-emu-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "emulator build directory:", err)
		os.Exit(1)
	}
	theEmu, emuError = emu.Build(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// emulator returns the built emulator. Without g++ the test is skipped,
// unless GCOMPILE_REQUIRE_GCC=1 (CI) makes that a failure.
func emulator(t *testing.T) *emu.Emu {
	t.Helper()
	if emuError != nil {
		if errors.Is(emuError, emu.ErrNoCompiler) && os.Getenv("GCOMPILE_REQUIRE_GCC") != "1" {
			t.Skipf("skipping: %v (set GCOMPILE_REQUIRE_GCC=1 to make this a failure)", emuError)
		}
		t.Fatalf("building the emulator: %v", emuError)
	}
	return theEmu
}

// blockSizes are the block sizes every kernel runs with: one warp, an
// odd number of warps, and a large block.
var blockSizes = []uint32{32, 96, 256}

// launch runs a kernel with a 1-D grid and block.
func launch(t *testing.T, name string, grid, block uint32, args ...any) {
	t.Helper()
	require.NoError(t, emulator(t).Launch(name, [3]uint32{grid, 1, 1}, [3]uint32{block, 1, 1}, 0, args...))
}

// grids returns a grid that covers n in one pass and one that must loop.
func grids(n int, block uint32) []uint32 {
	full := uint32((n + int(block) - 1) / int(block))
	return []uint32{max(full, 1), 3}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

func randVec(r *rand.Rand, n int, lo, hi float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(lo + (hi-lo)*r.Float64())
	}
	return v
}

func randNorm(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// guardLen is how many sentinel elements follow every output buffer.
const guardLen = 17

var sentinel = math.Float32frombits(0x7fa5a5a5) // a NaN no kernel produces

// out returns a float32 output buffer of n elements filled with junk,
// followed (beyond its length) by sentinels that checkGuard verifies.
func out(n int) []float32 {
	b := make([]float32, n+guardLen)
	for i := range b {
		b[i] = sentinel
	}
	return b[:n]
}

// checkGuard fails if a kernel wrote past the end of buf.
func checkGuard(t *testing.T, buf []float32) {
	t.Helper()
	tail := buf[len(buf):cap(buf)]
	for i, v := range tail {
		if math.Float32bits(v) != math.Float32bits(sentinel) {
			t.Fatalf("kernel wrote past the end of its output: element %d after the last is %v", i, v)
		}
	}
}

// requireBits checks got equals want bit for bit (NaNs included).
func requireBits(t *testing.T, want, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			// Any NaN matches any NaN: payloads are not part of the contract.
			if want[i] != want[i] && got[i] != got[i] {
				continue
			}
			t.Fatalf("%s: element %d = %v (%#x), want %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
	checkGuard(t, got)
}

// requireClose checks |got−want| ≤ atol + rtol·|want| element by element;
// infinities and NaNs must match. It returns the largest relative error
// seen over elements with |want| > atol, for the record.
func requireClose(t *testing.T, want, got []float32, rtol, atol float64, what string) float64 {
	t.Helper()
	bound := make([]float64, len(want))
	for i, w := range want {
		bound[i] = atol + rtol*math.Abs(float64(w))
	}
	requireWithin(t, want, got, bound, what)
	worst := 0.0
	for i := range want {
		w := float64(want[i])
		if !math.IsNaN(w) && !math.IsInf(w, 0) && math.Abs(w) > atol {
			worst = max(worst, math.Abs(float64(got[i])-w)/math.Abs(w))
		}
	}
	return worst
}

func float32bits(f float32) uint32     { return math.Float32bits(f) }
func float32frombits(b uint32) float32 { return math.Float32frombits(b) }
