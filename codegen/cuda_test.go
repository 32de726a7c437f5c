package codegen_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/codegen"
	"gcompile/ir"
	"gcompile/kernels/cuda"
)

func TestCUDAKernelText(t *testing.T) {
	body := parse(t, "t0=mul a1 a0; t1=gelu t0; t2=adam_m t1 a2 beta1=0.9", 3)
	k, err := codegen.CUDA(body, 3)
	require.NoError(t, err)
	assert.Regexp(t, `^gc_fused_[0-9a-f]{16}$`, k.Name)
	assert.Equal(t, "float* out, const float* a0, const float* a1, const float* a2, long long n", k.Signature())
	assert.Contains(t, k.Source, `extern "C" __global__ void `+k.Name+"("+k.Signature()+")")
	assert.Contains(t, k.Source, "gc_gelu_halves(t0, &t1_s, &t1_sc);", "GELU through the per-op kernel's helper")
	assert.Contains(t, k.Source, "gc_fused_keep(gc_bits_float(0x3f666666u))", "beta1 = 0.9 as the float the unfused kernel gets")
	assert.Contains(t, k.Source, "out[i] = t2;")

	again, err := codegen.CUDA(parse(t, body.String(), 3), 3)
	require.NoError(t, err)
	assert.Equal(t, k, again, "the name and text depend only on the body")
	other, err := codegen.CUDA(parse(t, "t0=mul a0 a1; t1=gelu t0; t2=adam_m t1 a2 beta1=0.9", 3), 3)
	require.NoError(t, err)
	assert.NotEqual(t, k.Name, other.Name)

	_, err = codegen.CUDA(ir.FusedBody{{Op: "softmax", Args: []ir.FusedRef{{Arg: true}}}}, 1)
	require.ErrorContains(t, err, "no CUDA expression for softmax")
	_, err = codegen.CUDA(parse(t, "t0=add a0 a1", 2), 1)
	require.ErrorContains(t, err, "does not exist")
}

// requireClang finds clang, or skips (fails with GCOMPILE_REQUIRE_CLANG=1).
func requireClang(t *testing.T) string {
	t.Helper()
	clang, err := exec.LookPath("clang")
	if err != nil {
		if os.Getenv("GCOMPILE_REQUIRE_CLANG") == "1" {
			t.Fatalf("GCOMPILE_REQUIRE_CLANG=1 but clang is not on PATH: %v", err)
		}
		t.Skip("skipping: clang is not on PATH (set GCOMPILE_REQUIRE_CLANG=1 to make this a failure)")
	}
	return clang
}

// Every test body's kernel compiles to PTX after the kernels/cuda program
// with clang in CUDA mode (the invocation of kernels/cuda's own test), and
// a multiply followed by an add of the next op is not contracted into an
// FMA the unfused kernels would not have formed.
func TestCUDACompilesToPTX(t *testing.T) {
	clang := requireClang(t)
	prog, err := cuda.Program()
	require.NoError(t, err)
	var src strings.Builder
	src.WriteString(prog + "\n" + codegen.CUDAPrelude)
	var names []string
	for _, c := range append(bodies, struct {
		text  string
		nargs int
	}{"t0=mul a0 a1; t1=add t0 a2", 3}) {
		k, err := codegen.CUDA(parse(t, c.text, c.nargs), c.nargs)
		require.NoError(t, err)
		src.WriteString(k.Source)
		names = append(names, k.Name)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "fused.cu")
	require.NoError(t, os.WriteFile(file, []byte(src.String()), 0o644))
	cmd := exec.Command(clang, "-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib",
		"--cuda-gpu-arch=sm_80", "-Xclang", "-target-feature", "-Xclang", "+ptx70",
		"-O2", "-Wall", "-Werror", "-S", "-o", "-", file)
	cmd.Dir = dir
	ptx, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("clang: %v\n%s", err, stderr)
	}
	entries := map[string]string{}
	re := regexp.MustCompile(`(?s)\.entry\s+(\w+)\((.*?)\n}`)
	for _, m := range re.FindAllSubmatch(ptx, -1) {
		entries[string(m[1])] = string(m[2])
	}
	for _, n := range names {
		assert.Contains(t, entries, n, "no PTX entry for %s", n)
	}
	// The compiler does contract inside one op's expression (adam_m's
	// β1·m + (1−β1)·g, as in gc_adam_m), so the missing FMA below is the
	// barrier's doing.
	adam := entries[names[8]]
	require.Contains(t, bodies[8].text, "adam_m")
	assert.Contains(t, adam, "fma.rn.f32")
	mulAdd := entries[names[len(names)-1]]
	require.NotEmpty(t, mulAdd)
	assert.Contains(t, mulAdd, "mul.f32", "the product is rounded on its own")
	assert.Contains(t, mulAdd, "add.f32")
	assert.NotContains(t, mulAdd, "fma.rn.f32", "mul then add of two ops must stay two roundings")
}
