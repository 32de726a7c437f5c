package emu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/kernels/cuda"
)

var (
	built    *Emu
	buildErr error
	buildDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gcompile-emu-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "emulator build directory:", err)
		os.Exit(1)
	}
	buildDir = dir
	built, buildErr = Build(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// emulator skips without g++ unless GCOMPILE_REQUIRE_GCC=1 (CI).
func emulator(t *testing.T) *Emu {
	t.Helper()
	if buildErr != nil {
		if errors.Is(buildErr, ErrNoCompiler) && os.Getenv("GCOMPILE_REQUIRE_GCC") != "1" {
			t.Skipf("skipping: %v (set GCOMPILE_REQUIRE_GCC=1 to make this a failure)", buildErr)
		}
		t.Fatalf("building the emulator: %v", buildErr)
	}
	return built
}

// A stand-in libcuda calls the C entry point with cuLaunchKernel's
// parameter array; do exactly that through purego.
func TestCEntryPoint(t *testing.T) {
	e := emulator(t)
	h, err := purego.Dlopen(e.Path(), purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	var launch func(name string, gx, gy, gz, bx, by, bz, shmem uint32, params unsafe.Pointer) int32
	purego.RegisterLibFunc(&launch, h, LaunchSymbol)

	n := int64(100)
	a, b, c := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range a {
		a[i], b[i] = float32(i), float32(2*i)
	}
	pOut, pA, pB := unsafe.Pointer(&c[0]), unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0])
	params := []unsafe.Pointer{unsafe.Pointer(&pOut), unsafe.Pointer(&pA), unsafe.Pointer(&pB), unsafe.Pointer(&n)}
	var pin runtime.Pinner
	for _, p := range []any{&c[0], &a[0], &b[0], &pOut, &pA, &pB, &n, &params[0]} {
		pin.Pin(p)
	}
	defer pin.Unpin()

	require.Equal(t, int32(0), launch("gc_add", 2, 1, 1, 32, 1, 1, 0, unsafe.Pointer(&params[0])))
	for i := range c {
		require.Equal(t, float32(3*i), c[i])
	}
	assert.Equal(t, int32(StatusUnknownKernel), launch("gc_missing", 1, 1, 1, 32, 1, 1, 0, unsafe.Pointer(&params[0])))
	assert.Equal(t, int32(StatusBadParams), launch("gc_add", 1, 1, 1, 32, 1, 1, 0, nil))
	assert.Equal(t, int32(StatusBadDims), launch("gc_add", 1, 1, 1, 1025, 1, 1, 0, unsafe.Pointer(&params[0])))
	assert.Equal(t, int32(StatusBadDims), launch("gc_add", 1, 0, 1, 32, 1, 1, 0, unsafe.Pointer(&params[0])))
	// A null entry in the array is refused, not dereferenced.
	params[1] = nil
	assert.Equal(t, int32(StatusBadParams), launch("gc_add", 1, 1, 1, 32, 1, 1, 0, unsafe.Pointer(&params[0])))
}

// Block-wide barriers and warp shuffles: a block reduction gives the
// same sum for every block size from one warp to the largest block, over
// a row longer than the block (each thread adds several elements).
func TestBlockReductionAllBlockSizes(t *testing.T) {
	e := emulator(t)
	const n = 3000
	x := make([]float32, 2*n)
	want := [2]float64{}
	for i := range x {
		x[i] = float32(i%17) - 8
		want[i/n] += float64(x[i])
	}
	for b := uint32(32); b <= 1024; b += 32 {
		got := make([]float32, 2)
		require.NoError(t, e.Launch("gc_reduce_sum_rows", [3]uint32{2, 1, 1}, [3]uint32{b, 1, 1}, 0, got, x, 2, int64(n), 0))
		require.Equal(t, []float32{float32(want[0]), float32(want[1])}, got, "block %d", b)
	}
}

// The emulator serialises launches from several goroutines; each gets
// its own correct result.
func TestConcurrentLaunches(t *testing.T) {
	e := emulator(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	outs := make([][]float32, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]float32, 5000)
			for i := range x {
				x[i] = float32(g)
			}
			outs[g] = make([]float32, 1)
			errs[g] = e.Launch("gc_reduce_max_rows", [3]uint32{1, 1, 1}, [3]uint32{64 * uint32(g%4+1), 1, 1}, 0, outs[g], x, 1, 5000)
		}()
	}
	wg.Wait()
	for g := range 8 {
		require.NoError(t, errs[g])
		require.Equal(t, float32(g), outs[g][0])
	}
}

// Build reuses a library whose sources have not changed, and loading the
// same file twice gives the same emulator.
func TestBuildReuses(t *testing.T) {
	e := emulator(t)
	again, err := Build(buildDir)
	require.NoError(t, err)
	assert.Same(t, e, again)
	info, err := os.Stat(e.Path())
	require.NoError(t, err)
	assert.Positive(t, info.Size())
}

func TestDispatchRejectsUntypedParams(t *testing.T) {
	_, err := Dispatch([]cuda.Kernel{{Name: "gc_x", Params: []cuda.Param{{Name: "a"}}}})
	require.ErrorContains(t, err, "parameter 0 has no type")
	src, err := Dispatch(cuda.Kernels())
	require.NoError(t, err)
	for _, k := range cuda.Kernels() {
		assert.Contains(t, src, fmt.Sprintf("{%q, unpack_%s}", k.Name, k.Name))
	}
}

// Scalars arrive with their exact bits: a float attribute and a long long
// size as the kernel sees them.
func TestScalarArguments(t *testing.T) {
	e := emulator(t)
	x := []float32{1, 2, 3}
	out := make([]float32, 3)
	s := float32(math.Pi)
	require.NoError(t, e.Launch("gc_scale_by", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, out, x, int64(3), s))
	assert.Equal(t, []float32{s, 2 * s, 3 * s}, out)
	err := e.Launch("gc_reduce_sum_rows", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, out, x, 1, 3, 1<<40)
	require.ErrorContains(t, err, "does not fit an int")
}

// Threads are fibers: a barrier some thread of the block never reaches
// is reported, not waited on, and the emulator runs the next launch as
// before; a block of 1024 threads meets at every barrier of a kernel that
// reverses its row through shared memory (each thread reads what another
// wrote before the barrier).
func TestBarriersAcrossFibers(t *testing.T) {
	emulator(t)
	extra := Extra{Source: `
extern "C" __global__ void gc_test_stuck(float* out, long long n) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  if (threadIdx.x < n) out[threadIdx.x] = 1.0f;
}
extern "C" __global__ void gc_test_reverse(float* out, const float* x, long long n) {
  __shared__ float row[1024];
  const unsigned t = threadIdx.x;
  row[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  const float mine = row[blockDim.x - 1 - t];
  __syncthreads();
  row[t] = mine * 2.0f;
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = row[t];
}
`, Kernels: []cuda.Kernel{
		{Name: "gc_test_stuck", Params: []cuda.Param{{Name: "out", Type: cuda.F32Out}, {Name: "n", Type: cuda.Size}}, Launch: cuda.GridStride, Over: "n"},
		{Name: "gc_test_reverse", Params: []cuda.Param{{Name: "out", Type: cuda.F32Out}, {Name: "x", Type: cuda.F32In}, {Name: "n", Type: cuda.Size}}, Launch: cuda.GridStride, Over: "n"},
	}}
	e, err := BuildWith(t.TempDir(), extra)
	require.NoError(t, err)
	out := make([]float32, 64)
	err = e.Launch("gc_test_stuck", [3]uint32{1, 1, 1}, [3]uint32{64, 1, 1}, 0, out, int64(64))
	require.ErrorIs(t, err, StatusStuck)
	assert.Contains(t, err.Error(), "not every thread of the block reached")

	const block, blocks = 1024, 3
	x := make([]float32, block*blocks)
	for i := range x {
		x[i] = float32(i)
	}
	got := make([]float32, len(x))
	require.NoError(t, e.Launch("gc_test_reverse", [3]uint32{blocks, 1, 1}, [3]uint32{block, 1, 1}, 0, got, x, int64(len(x))))
	for b := range blocks {
		for i := range block {
			require.Equal(t, 2*x[b*block+block-1-i], got[b*block+i], "block %d thread %d", b, i)
		}
	}
}
