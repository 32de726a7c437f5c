package codegen_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/codegen"
	"gcompile/ir"
	"gcompile/kernels/cuda/emu"
)

// launchOp runs one body step with its own kernels/cuda kernel, the way
// the unfused program would on a GPU.
func launchOp(t *testing.T, e *emu.Emu, st ir.FusedStep, out []float32, in [][]float32) {
	t.Helper()
	n := len(out)
	args := []any{out}
	for _, x := range in {
		args = append(args, x)
	}
	args = append(args, n)
	for _, name := range map[string][]string{"adam_m": {"beta1"}, "adam_v": {"beta2"}, "sgd_buf": {"momentum", "wd"}}[st.Op] {
		args = append(args, float32(st.Attrs[name].(float64)))
	}
	require.NoError(t, e.Launch("gc_"+st.Op, [3]uint32{3, 1, 1}, [3]uint32{64, 1, 1}, 0, args...))
}

// Under the emulator each fused kernel computes bit for bit what the
// per-op kernels compute one launch after another, and it agrees with
// the CPU closure to float32 rounding of the math library (glibc's expf,
// logf, tanhf there, Go's float64 math on the CPU). Skipped without g++
// unless GCOMPILE_REQUIRE_GCC=1.
func TestCUDAKernelsMatchPerOpKernelsInEmulator(t *testing.T) {
	var src strings.Builder
	src.WriteString(codegen.CUDAPrelude)
	var extra emu.Extra
	kernels := make([]codegen.CUDAKernel, len(bodies))
	for i, c := range bodies {
		k, err := codegen.CUDA(parse(t, c.text, c.nargs), c.nargs)
		require.NoError(t, err)
		kernels[i] = k
		src.WriteString(k.Source)
		extra.Kernels = append(extra.Kernels, k.Entry())
	}
	extra.Source = src.String()
	e, err := emu.BuildWith(t.TempDir(), extra)
	if errors.Is(err, emu.ErrNoCompiler) && os.Getenv("GCOMPILE_REQUIRE_GCC") != "1" {
		t.Skipf("skipping: %v (set GCOMPILE_REQUIRE_GCC=1 to make this a failure)", err)
	}
	require.NoError(t, err)

	const n = 3001 // more than the 3×64 threads launched: every thread loops
	for i, c := range bodies {
		body := parse(t, c.text, c.nargs)
		r := rand.New(rand.NewPCG(7, uint64(i)))
		args := make([][]float32, c.nargs)
		for a := range args {
			args[a] = make([]float32, n)
			for j := range args[a] {
				args[a][j] = float32(r.NormFloat64() * 3)
			}
		}
		fused := make([]float32, n)
		launch := []any{fused}
		for _, a := range args {
			launch = append(launch, a)
		}
		require.NoError(t, e.Launch(kernels[i].Name, [3]uint32{3, 1, 1}, [3]uint32{64, 1, 1}, 0, append(launch, n)...), c.text)

		temps := make([][]float32, len(body))
		for s, st := range body {
			in := stepInputs(st, args, temps)
			temps[s] = make([]float32, n)
			launchOp(t, e, st, temps[s], in)
		}
		want := temps[len(temps)-1]
		for j := range want {
			if math.Float32bits(want[j]) != math.Float32bits(fused[j]) {
				t.Fatalf("%s: element %d is %v fused, %v op by op", c.text, j, fused[j], want[j])
			}
		}

		cpuOut := make([]float32, n)
		run, err := codegen.CPU(body, cpuOut, args)
		require.NoError(t, err)
		run()
		worst := 0.0
		for j := range want {
			if cpuOut[j] == want[j] {
				continue // infinities included
			}
			if math.IsNaN(float64(want[j])) {
				assert.True(t, math.IsNaN(float64(cpuOut[j])), "%s: element %d NaN on one side only", c.text, j)
				continue
			}
			d := math.Abs(float64(cpuOut[j]-want[j])) / math.Max(1, math.Abs(float64(want[j])))
			worst = math.Max(worst, d)
		}
		assert.Less(t, worst, 1e-5, "%s: CPU closure vs CUDA kernel", c.text)
	}
}
