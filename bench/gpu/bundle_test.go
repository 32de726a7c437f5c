// Package gpu holds what a lent GPU machine runs (bundle.sh builds it here,
// run.sh runs it there); its test builds that bundle and checks that it can
// travel: such a machine is sent the working tree and at most 64 MiB of
// carried files, and has no Go toolchain.
package gpu

import (
	"debug/elf"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxBundle leaves room under the 64 MiB a GPU machine is sent, for
// whatever else travels with the bundle.
const maxBundle = 60 << 20

// The bundle bench/gpu/bundle.sh builds is under 60 MiB, is run.sh and one
// archive, and run.sh unpacks it into what it runs: stripped binaries that
// start and hold the tests and benchmarks run.sh names, models that train,
// the corpus and the yardsticks.
func TestBundleTravels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the GPU bundle (seconds with a warm build cache); skipped with -short")
	}
	if os.Getenv("GCOMPILE_FULL_TESTS") != "1" && os.Getenv("GCOMPILE_GPU_TESTS") != "1" {
		// Seven stripped binaries from a cold cache: 40 s of CPU, a
		// tenth of make test's, for a kit only a lent GPU machine runs.
		t.Skip("builds the GPU bundle: make test-full (GCOMPILE_FULL_TESTS=1) or GCOMPILE_GPU_TESTS=1 runs it")
	}
	for _, c := range []string{"bash", "go", "git", "tar", "xz", "find"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("bundle.sh needs %s, which is not on PATH", c)
		}
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "gpu-bundle")
	build := exec.Command("bash", "bench/gpu/bundle.sh", out)
	build.Dir = root
	start := time.Now()
	log, err := build.CombinedOutput()
	require.NoError(t, err, "bundle.sh:\n%s", log)
	t.Logf("bundle.sh took %v:\n%s", time.Since(start).Round(time.Millisecond), log)

	// What travels: run.sh and the archive, nothing else.
	sizes := map[string]int64{}
	var total int64
	require.NoError(t, filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		sizes[rel] = fi.Size()
		total += fi.Size()
		return nil
	}))
	assert.Equal(t, []string{"kit.tar.xz", "run.sh"}, slices.Sorted(maps.Keys(sizes)), "the bundle's files")
	assert.Less(t, total, int64(maxBundle), "the bundle is %d bytes (%.1f MiB), over %d MiB: it would not leave room under the 64 MiB a GPU machine is sent", total, float64(total)/(1<<20), maxBundle>>20)

	// There: run.sh unpacks the archive beside itself.
	unpack := exec.Command("bash", "run.sh", "unpack")
	unpack.Dir = out
	msg, err := unpack.CombinedOutput()
	require.NoError(t, err, "run.sh unpack:\n%s", msg)
	tests := []string{"runtime-cuda", "runtime-cuda-driver", "runtime-cuda-nvrtc", "runtime-cuda-cublaslt", "runtime-cuda-nccl", "tests"}
	bins := []string{"bin/gcompile"}
	for _, name := range tests {
		bins = append(bins, "bin/"+name+".test")
	}
	for _, f := range append(bins, "models/tiny.gir", "models/demo.gir", "models/gpt-1.3b-b4.gir",
		"corpus.txt", "torch_gemm.py", "torch_gpt.py", "REVISION") {
		_, err := os.Stat(filepath.Join(out, f))
		assert.NoError(t, err, "unpacked %s", f)
	}
	if fi, err := os.Stat(filepath.Join(out, "corpus.txt")); assert.NoError(t, err) {
		assert.Equal(t, int64(16<<20), fi.Size(), "corpus.txt")
	}

	// The binaries are stripped: no symbol table, no DWARF.
	for _, b := range bins {
		f, err := elf.Open(filepath.Join(out, b))
		if !assert.NoError(t, err, b) {
			continue
		}
		for _, s := range f.Sections {
			assert.NotRegexp(t, `^\.(symtab|debug_|zdebug_)`, s.Name, "%s is not stripped", b)
		}
		f.Close()
	}

	// The binaries start, and hold the tests and benchmarks run.sh names.
	for bin, want := range map[string][]string{
		"bin/tests.test":                 {"BenchmarkCUDAGPTStep", "TestCUDAMatchesCPUOnGPU"},
		"bin/runtime-cuda-cublaslt.test": {"BenchmarkGEMM"},
	} {
		got, err := exec.Command(filepath.Join(out, bin), "-test.list", "^("+strings.Join(want, "|")+")$").CombinedOutput()
		require.NoError(t, err, "%s -test.list:\n%s", bin, got)
		assert.Equal(t, want, slices.Sorted(slices.Values(strings.Fields(string(got)))), "%s -test.list", bin)
	}

	// The stripped gcompile trains a bundled model on the bundled corpus
	// (on the CPU backend: the same binary, the same .gir).
	train := exec.Command("./bin/gcompile", "models/tiny.gir", "--run", "--steps", "2", "--data", "corpus.txt")
	train.Dir = out
	got, err := train.CombinedOutput()
	require.NoError(t, err, "gcompile:\n%s", got)
	assert.Regexp(t, `step 2/2 loss \d`, string(got))

	// Stripped, a test binary still loads its libraries through purego:
	// the driver bindings' tests against their gcc-built stand-in, run from
	// the package's folder for its testdata.
	driver := exec.Command(filepath.Join(out, "bin/runtime-cuda-driver.test"), "-test.short", "-test.count=1")
	driver.Dir = filepath.Join(root, "runtime", "cuda", "driver")
	got, err = driver.CombinedOutput()
	require.NoError(t, err, "runtime-cuda-driver.test:\n%s", got)
}
