package cuda_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/kernels/cuda"
)

// The kernels are CUDA device code, not only C++ the emulator accepts:
// clang compiles the unit NVRTC would get, with no CUDA headers or
// libraries, to PTX, and every kernel of the table is an entry point.
// Skipped without clang, unless GCOMPILE_REQUIRE_CLANG=1.
func TestClangCompilesToPTX(t *testing.T) {
	clang, err := exec.LookPath("clang")
	if err != nil {
		if os.Getenv("GCOMPILE_REQUIRE_CLANG") == "1" {
			t.Fatalf("GCOMPILE_REQUIRE_CLANG=1 but clang is not on PATH: %v", err)
		}
		t.Skip("skipping: clang is not on PATH (set GCOMPILE_REQUIRE_CLANG=1 to make this a failure)")
	}
	src, err := cuda.Program()
	require.NoError(t, err)
	dir := t.TempDir()
	file := filepath.Join(dir, "kernels.cu")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
	cmd := exec.Command(clang, "-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib",
		"--cuda-gpu-arch=sm_80", "-Xclang", "-target-feature", "-Xclang", "+ptx70", // no CUDA install says which PTX
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
	entries := map[string]bool{}
	for _, m := range regexp.MustCompile(`\.entry\s+(\w+)\(`).FindAllSubmatch(ptx, -1) {
		entries[string(m[1])] = true
	}
	for _, k := range cuda.Kernels() {
		assert.True(t, entries[k.Name], "no PTX entry for %s", k.Name)
	}
	assert.Len(t, entries, len(cuda.Kernels()), "PTX entries")
}
