package fakegpu

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/kernels/cpu"
	"gcompile/kernels/cuda"
	"gcompile/runtime/cuda/cublaslt"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/nccl"
	"gcompile/runtime/cuda/nvrtc"
)

// session is the fake GPU as the backend sees it: the driver loaded
// through GCOMPILE_LIBCUDA and device 0's primary context current on the
// test's (locked) thread.
type session struct {
	libs Libs
	drv  *driver.Driver
	dev  driver.Device
	ctx  driver.Context
}

// open installs the fake GPU and starts a session. Variables the driver
// reads at cuInit must be set before.
func open(t *testing.T) *session {
	t.Helper()
	libs := Install(t)
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	drv, err := driver.Load()
	require.NoError(t, err)
	t.Cleanup(func() { drv.Close() })
	require.Equal(t, libs.CUDA, drv.Path())
	require.NoError(t, drv.Init())
	dev, err := drv.Device(0)
	require.NoError(t, err)
	ctx, err := drv.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, drv.PrimaryCtxRelease(dev)) })
	require.NoError(t, drv.SetCurrent(ctx))
	return &session{libs: libs, drv: drv, dev: dev, ctx: ctx}
}

// enter makes the session's context current for a subtest, which runs on
// a goroutine (and so a thread) of its own.
func (s *session) enter(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	require.NoError(t, s.drv.SetCurrent(s.ctx))
}

// lastError is the fake driver's message for its latest failure.
func (s *session) lastError(t *testing.T) string {
	t.Helper()
	msg, err := s.libs.LastError()
	require.NoError(t, err)
	return msg
}

func (s *session) alloc(t *testing.T, n int) driver.DevicePtr {
	t.Helper()
	p, err := s.drv.MemAlloc(uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { s.drv.MemFree(p) })
	return p
}

func (s *session) upload(t *testing.T, x []float32) driver.DevicePtr {
	t.Helper()
	p := s.alloc(t, 4*len(x))
	require.NoError(t, s.drv.MemcpyHtoD(p, f32Bytes(x)))
	return p
}

func (s *session) download(t *testing.T, p driver.DevicePtr, n int) []float32 {
	t.Helper()
	b := make([]byte, 4*n)
	require.NoError(t, s.drv.MemcpyDtoH(b, p))
	return bytesF32(b)
}

func f32Bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

func u16Bytes(x []uint16) []byte {
	b := make([]byte, 2*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}

func bytesU16(b []byte) []uint16 {
	x := make([]uint16, len(b)/2)
	for i := range x {
		x[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return x
}

func requireCode(t *testing.T, err error, code driver.Result) {
	t.Helper()
	require.Error(t, err)
	require.Truef(t, errors.Is(err, code), "want %v, got %v", code, err)
}

func TestInstallPointsTheBindingsAtTheFake(t *testing.T) {
	libs := Install(t)
	env := libs.Env()
	require.Len(t, env, 5)
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, kv)
		assert.Equal(t, v, os.Getenv(k), k)
		_, err := os.Stat(v)
		assert.NoError(t, err, "%s points at a missing file", k)
	}
	assert.Equal(t, "libcuda.so.1", filepath.Base(libs.CUDA))
	assert.Equal(t, "libnccl.so.2", filepath.Base(libs.NCCL))
}

// Build into a folder built from the same inputs reuses the libraries
// instead of compiling them again, and rebuilds them when the folder's
// stamp does not match.
func TestBuildReusesAFolderBuiltFromTheSameInputs(t *testing.T) {
	if testing.Short() {
		t.Skip("rebuilds the fake GPU's libraries")
	}
	installed := Install(t) // skips without compilers
	// A copy of the folder Install built: a fresh build of its own would
	// compile the kernel emulator again, the suite's slowest C++ build.
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(installed.Dir)))
	before, err := os.Stat(filepath.Join(dir, "libcuda.so.1"))
	require.NoError(t, err)
	first, err := Build(dir)
	require.NoError(t, err)
	second, err := Build(dir)
	require.NoError(t, err)
	assert.Equal(t, first, second)
	after, err := os.Stat(second.CUDA)
	require.NoError(t, err)
	assert.Equal(t, before.ModTime(), after.ModTime(), "libcuda.so.1 was rebuilt")

	// A damaged stamp means a rebuild.
	require.NoError(t, os.WriteFile(filepath.Join(dir, stampFile), []byte("stale"), 0o644))
	_, err = Build(dir)
	require.NoError(t, err)
	stamp, err := os.ReadFile(filepath.Join(dir, stampFile))
	require.NoError(t, err)
	assert.NotEqual(t, "stale", string(stamp))
}

func TestDeviceLooksLikeAnH100(t *testing.T) {
	s := open(t)
	v, err := s.drv.Version()
	require.NoError(t, err)
	assert.Equal(t, 12080, v)
	n, err := s.drv.DeviceCount()
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	p, err := s.drv.Props(s.dev)
	require.NoError(t, err)
	assert.Equal(t, "gcompile fake GPU (CPU emulation)", p.Name)
	assert.Equal(t, "sm_90", p.Arch())
	assert.Equal(t, 132, p.SMs)
	assert.Equal(t, 1024, p.MaxThreadsPerBlock)
	assert.Equal(t, 2048, p.MaxThreadsPerSM)
	assert.Equal(t, 32, p.WarpSize)
	assert.Equal(t, 48*1024, p.SharedPerBlock)
	assert.Equal(t, 227*1024, p.SharedPerBlockOptin)
	assert.Equal(t, uint64(8)<<30, p.TotalMem)
	_, err = s.drv.Attribute(s.dev, driver.DeviceAttribute(100000))
	requireCode(t, err, driver.ErrorInvalidValue)
}

func TestConfigurationFromEnvironment(t *testing.T) {
	t.Run("devices and memory", func(t *testing.T) {
		t.Setenv(DevicesEnv, "3")
		t.Setenv(MemoryEnv, "64M")
		s := open(t)
		n, err := s.drv.DeviceCount()
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		total, err := s.drv.TotalMem(2)
		require.NoError(t, err)
		assert.Equal(t, uint64(64<<20), total)
		_, err = s.drv.Device(3)
		requireCode(t, err, driver.ErrorInvalidDevice)
	})
	for _, c := range []struct {
		name, devices, memory string
		code                  driver.Result
		msg                   string
	}{
		{"no devices", "0", "", driver.ErrorNoDevice, "GCOMPILE_FAKEGPU_DEVICES=0"},
		{"bad count", "two", "", driver.ErrorInvalidValue, "GCOMPILE_FAKEGPU_DEVICES=two is not a device count"},
		{"too many", "65", "", driver.ErrorInvalidValue, "from 0 to 64"},
		{"bad memory", "1", "lots", driver.ErrorInvalidValue, "GCOMPILE_FAKEGPU_MEMORY=lots is not a positive byte count"},
	} {
		t.Run(c.name, func(t *testing.T) {
			libs := Install(t)
			t.Setenv(DevicesEnv, c.devices)
			t.Setenv(MemoryEnv, c.memory)
			drv, err := driver.Load()
			require.NoError(t, err)
			defer drv.Close()
			requireCode(t, drv.Init(), c.code)
			msg, err := libs.LastError()
			require.NoError(t, err)
			assert.Contains(t, msg, c.msg)
			_, err = drv.DeviceCount()
			requireCode(t, err, driver.ErrorNotInitialized)
		})
	}
}

func TestMemoryRoundTrips(t *testing.T) {
	s := open(t)
	const n = 1000
	a := s.alloc(t, 4*n)
	b := s.alloc(t, 4*n+3)
	assert.Zero(t, uint64(a)%256, "cuMemAlloc aligns to 256 bytes")
	assert.Zero(t, uint64(b)%256)

	// Fresh memory is poisoned with 0xff bytes: NaN as a float.
	fresh := s.download(t, b, 4)
	for _, v := range fresh {
		assert.Equal(t, uint32(0xffffffff), math.Float32bits(v))
	}

	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i)*0.5 - 7
	}
	require.NoError(t, s.drv.MemcpyHtoD(a, f32Bytes(x)))
	require.NoError(t, s.drv.MemcpyDtoD(b, a, 4*n))
	assert.Equal(t, x, s.download(t, b, n))

	// Offsets inside an allocation are fine.
	require.NoError(t, s.drv.MemsetD8(b.Add(8), 0, 8))
	got := s.download(t, b, 4)
	assert.Equal(t, []float32{x[0], x[1], 0, 0}, got)

	st, err := s.drv.StreamCreate(driver.StreamNonBlocking)
	require.NoError(t, err)
	defer s.drv.StreamDestroy(st)
	require.NoError(t, s.drv.MemsetD32Async(a, math.Float32bits(2.5), n, st))
	pinned, err := s.drv.MemAllocHost(4 * n)
	require.NoError(t, err)
	defer s.drv.MemFreeHost(pinned)
	require.NoError(t, s.drv.MemcpyDtoHAsync(pinned, a, st))
	require.NoError(t, s.drv.StreamSynchronize(st))
	for _, v := range bytesF32(pinned.Bytes()) {
		require.Equal(t, float32(2.5), v)
	}
	copy(pinned.Bytes(), f32Bytes(x))
	require.NoError(t, s.drv.MemcpyHtoDAsync(b, pinned, st))
	require.NoError(t, s.drv.MemcpyDtoDAsync(a, b, 4*n, st))
	require.NoError(t, s.drv.Synchronize())
	assert.Equal(t, x, s.download(t, a, n))
}

func TestCopiesMustStayInsideAnAllocation(t *testing.T) {
	s := open(t)
	p := s.alloc(t, 256)
	for _, c := range []struct {
		name string
		call func() error
		msg  string
	}{
		{"past the end", func() error { return s.drv.MemcpyHtoD(p.Add(200), make([]byte, 100)) },
			"runs 44 bytes past the end of its 256-byte allocation"},
		{"not allocated", func() error { return s.drv.MemcpyDtoH(make([]byte, 4), 16) },
			"source 0x10 is not in any live device allocation"},
		{"memset past the end", func() error { return s.drv.MemsetD8(p, 1, 257) }, "runs 1 bytes past the end"},
		{"misaligned memset", func() error { return s.drv.MemsetD32Async(p.Add(2), 0, 1, 0) }, "not 4-byte aligned"},
		{"free inside", func() error { return s.drv.MemFree(p.Add(16)) }, "is not the start of a live device allocation"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.enter(t)
			requireCode(t, c.call(), driver.ErrorInvalidValue)
			assert.Contains(t, s.lastError(t), c.msg)
		})
	}
}

func TestOutOfMemory(t *testing.T) {
	t.Setenv(MemoryEnv, "1M")
	s := open(t)
	a, err := s.drv.MemAlloc(768 << 10)
	require.NoError(t, err)
	used, err := s.libs.MemUsed(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(768<<10), used)

	_, err = s.drv.MemAlloc(512 << 10)
	requireCode(t, err, driver.ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: out of memory")
	assert.Contains(t, s.lastError(t), "524288 bytes requested on device 0: 786432 of 1048576 bytes are in use in 1 allocation(s)")

	// Freed memory can be allocated again, up to the last byte (counted in
	// 256-byte units).
	require.NoError(t, s.drv.MemFree(a))
	b, err := s.drv.MemAlloc(1<<20 - 255)
	require.NoError(t, err)
	_, err = s.drv.MemAlloc(1)
	requireCode(t, err, driver.ErrorOutOfMemory)
	require.NoError(t, s.drv.MemFree(b))
	used, err = s.libs.MemUsed(0)
	require.NoError(t, err)
	assert.Zero(t, used)
}

// Releasing a primary context's last retain frees what was made in it, as
// the driver does; its handle stops working until it is retained again.
func TestPrimaryContextRefcount(t *testing.T) {
	s := open(t)
	ctx2, err := s.drv.PrimaryCtxRetain(s.dev)
	require.NoError(t, err)
	assert.Equal(t, s.ctx, ctx2, "the primary context is one context")
	_, err = s.drv.MemAlloc(4096)
	require.NoError(t, err)
	_, err = s.drv.StreamCreate(driver.StreamDefault)
	require.NoError(t, err)

	require.NoError(t, s.drv.PrimaryCtxRelease(s.dev))
	used, err := s.libs.MemUsed(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), used, "one retain is left")

	require.NoError(t, s.drv.PrimaryCtxRelease(s.dev))
	used, err = s.libs.MemUsed(0)
	require.NoError(t, err)
	assert.Zero(t, used, "the last release frees the context's memory")
	_, err = s.drv.MemAlloc(16)
	requireCode(t, err, driver.ErrorInvalidContext)
	assert.Contains(t, s.lastError(t), "has been released")
	requireCode(t, s.drv.PrimaryCtxRelease(s.dev), driver.ErrorInvalidContext)

	// Retain again for the session's own release.
	_, err = s.drv.PrimaryCtxRetain(s.dev)
	require.NoError(t, err)
	_, err = s.drv.MemAlloc(16)
	require.NoError(t, err, "the context is current again once retained")
}

// The current context belongs to an OS thread, as on a real driver:
// clearing it on one thread leaves another thread's alone.
func TestContextIsPerThread(t *testing.T) {
	s := open(t)
	errs := make(chan error)
	proceed := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// The thread may have run other goroutines that set a context.
		if err := s.drv.SetCurrent(0); err != nil {
			errs <- err
			return
		}
		_, err := s.drv.MemAlloc(64)
		errs <- err
		<-proceed
		if err := s.drv.SetCurrent(s.ctx); err != nil {
			errs <- err
			return
		}
		p, err := s.drv.MemAlloc(64)
		if err == nil {
			err = s.drv.MemFree(p)
		}
		errs <- err
	}()
	requireCode(t, <-errs, driver.ErrorInvalidContext)
	assert.Contains(t, s.lastError(t), "no context is current on this thread")
	p, err := s.drv.MemAlloc(64)
	require.NoError(t, err, "this thread's context is still current")
	require.NoError(t, s.drv.MemFree(p))
	close(proceed)
	require.NoError(t, <-errs)
}

func TestStreamsAndEvents(t *testing.T) {
	s := open(t)
	st, err := s.drv.StreamCreate(driver.StreamDefault)
	require.NoError(t, err)
	start, err := s.drv.EventCreate(driver.EventDefault)
	require.NoError(t, err)
	defer s.drv.EventDestroy(start)
	end, err := s.drv.EventCreate(driver.EventBlockingSync)
	require.NoError(t, err)
	defer s.drv.EventDestroy(end)

	_, err = s.drv.EventElapsed(start, end)
	requireCode(t, err, driver.ErrorInvalidHandle)
	assert.Contains(t, s.lastError(t), "has not been recorded")

	require.NoError(t, s.drv.EventRecord(start, st))
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, s.drv.EventRecord(end, 0))
	require.NoError(t, s.drv.EventSynchronize(end))
	require.NoError(t, s.drv.StreamWaitEvent(st, end))
	ms, err := s.drv.EventElapsed(start, end)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, float32(20), "events read a monotonic clock")

	untimed, err := s.drv.EventCreate(driver.EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, s.drv.EventRecord(untimed, st))
	_, err = s.drv.EventElapsed(start, untimed)
	requireCode(t, err, driver.ErrorInvalidHandle)
	require.NoError(t, s.drv.EventDestroy(untimed))
	requireCode(t, s.drv.EventRecord(untimed, st), driver.ErrorInvalidHandle)

	require.NoError(t, s.drv.StreamDestroy(st))
	requireCode(t, s.drv.StreamSynchronize(st), driver.ErrorInvalidHandle)
	assert.Contains(t, s.lastError(t), "is not a live stream")
}

// loadKernels compiles the whole kernels/cuda program with the fake NVRTC
// for the device's architecture and loads it.
func loadKernels(t *testing.T, s *session) driver.Module {
	t.Helper()
	src, err := cuda.Program()
	require.NoError(t, err)
	return s.compileAndLoad(t, src, "gcompile_kernels.cu")
}

func (s *session) compileAndLoad(t *testing.T, src, name string) driver.Module {
	t.Helper()
	cc, err := nvrtc.Load()
	require.NoError(t, err)
	defer cc.Close()
	props, err := s.drv.Props(s.dev)
	require.NoError(t, err)
	cubin, err := cc.Compile(src, name, []string{"--gpu-architecture=" + props.Arch(), "-default-device", "--std=c++17"})
	require.NoError(t, err)
	mod, err := s.drv.ModuleLoadData(cubin)
	require.NoError(t, err)
	t.Cleanup(func() { s.drv.ModuleUnload(mod) })
	return mod
}

// Every kernel of the table is found in the module the fake NVRTC makes of
// the real program, so the backend can load any of them.
func TestModuleHasEveryKernelOfTheTable(t *testing.T) {
	s := open(t)
	mod := loadKernels(t, s)
	ks := cuda.Kernels()
	require.NotEmpty(t, ks)
	for _, k := range ks {
		_, err := s.drv.ModuleGetFunction(mod, k.Name)
		assert.NoError(t, err, k.Name)
	}
}

func TestKernelsComputeThroughTheEmulator(t *testing.T) {
	s := open(t)
	mod := loadKernels(t, s)
	rng := rand.New(rand.NewPCG(1, 2))

	t.Run("gc_add", func(t *testing.T) {
		s.enter(t)
		const n = 1000
		a, b := make([]float32, n), make([]float32, n)
		for i := range a {
			a[i], b[i] = rng.Float32()*4-2, rng.Float32()*4-2
		}
		pa, pb, out := s.upload(t, a), s.upload(t, b), s.alloc(t, 4*n)
		f, err := s.drv.ModuleGetFunction(mod, "gc_add")
		require.NoError(t, err)
		var args driver.Args
		args.Ptr(out).Ptr(pa).Ptr(pb).Int64(n)
		// A grid smaller than the extent: the kernel strides.
		require.NoError(t, s.drv.LaunchKernel(f, driver.Dim3{X: 3, Y: 1, Z: 1}, driver.Dim3{X: 128, Y: 1, Z: 1}, 0, 0, args.Pointers()))
		got := s.download(t, out, n)
		for i := range got {
			require.Equal(t, a[i]+b[i], got[i], "element %d", i)
		}
	})

	t.Run("gc_softmax", func(t *testing.T) {
		s.enter(t)
		const rows, n = 7, 300
		x := make([]float32, rows*n)
		for i := range x {
			x[i] = rng.Float32()*20 - 10
		}
		for j := 0; j < n; j++ { // a fully masked row becomes zeros
			x[3*n+j] = float32(math.Inf(-1))
		}
		px, out := s.upload(t, x), s.alloc(t, 4*rows*n)
		f, err := s.drv.ModuleGetFunction(mod, "gc_softmax")
		require.NoError(t, err)
		st, err := s.drv.StreamCreate(driver.StreamNonBlocking)
		require.NoError(t, err)
		defer s.drv.StreamDestroy(st)
		for _, grid := range []uint32{rows, 3} { // one block per row, and fewer blocks than rows
			require.NoError(t, s.drv.MemsetD8(out, 0xff, 4*rows*n))
			var args driver.Args
			args.Ptr(out).Ptr(px).Int64(rows).Int64(n)
			require.NoError(t, s.drv.LaunchKernel(f, driver.Dim3{X: grid, Y: 1, Z: 1}, driver.Dim3{X: 128, Y: 1, Z: 1}, 0, st, args.Pointers()))
			require.NoError(t, s.drv.StreamSynchronize(st))
			got := s.download(t, out, rows*n)
			want := softmaxRows(x, rows, n)
			for i := range got {
				require.InDelta(t, want[i], float64(got[i]), 1e-6, "grid %d, row %d, column %d", grid, i/n, i%n)
			}
		}
	})
}

// softmaxRows is the softmax of each row in float64.
func softmaxRows(x []float32, rows, n int) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		row := x[r*n : (r+1)*n]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, float64(v))
		}
		if math.IsInf(m, -1) {
			continue
		}
		var sum float64
		for j, v := range row {
			out[r*n+j] = math.Exp(float64(v) - m)
			sum += out[r*n+j]
		}
		for j := range row {
			out[r*n+j] /= sum
		}
	}
	return out
}

func TestUnknownKernelIsNotFound(t *testing.T) {
	s := open(t)
	mod := loadKernels(t, s)
	_, err := s.drv.ModuleGetFunction(mod, "gc_no_such_kernel")
	requireCode(t, err, driver.ErrorNotFound)
	assert.Contains(t, err.Error(), `kernel "gc_no_such_kernel": cuModuleGetFunction: CUDA_ERROR_NOT_FOUND: named symbol not found`)
	assert.Contains(t, s.lastError(t), `has no kernel "gc_no_such_kernel"`)
}

// The fake NVRTC lists exactly the extern "C" __global__ functions, as a
// real module exposes them by those names only.
func TestModuleListsExternCKernelsOnly(t *testing.T) {
	s := open(t)
	src := `
// extern "C" __global__ void in_line_comment(float* x) {}
/* extern "C" __global__ void in_block_comment(float* x) {} */
const char* text = "extern \"C\" __global__ void in_string(float* x) {}";
extern "C" __global__ void __launch_bounds__(256) bounded(float* x) {}
extern "C" {
__global__ void in_block(float* x) { if (x) { x[0] = 1; } }
__device__ float helper(float x) { return x; }
__global__ void
    in_block_split(float* x) {}
}
extern "C" __device__ float device_only(float x) { return x; }
template <typename T> __global__ void templated(T* x) {}
__global__ void mangled(float* x) {}
`
	mod := s.compileAndLoad(t, src, "names.cu")
	for _, name := range []string{"bounded", "in_block", "in_block_split"} {
		_, err := s.drv.ModuleGetFunction(mod, name)
		assert.NoError(t, err, name)
	}
	for _, name := range []string{"in_line_comment", "in_block_comment", "in_string", "helper", "device_only", "templated", "mangled"} {
		_, err := s.drv.ModuleGetFunction(mod, name)
		assert.Truef(t, errors.Is(err, driver.ErrorNotFound), "%s: want CUDA_ERROR_NOT_FOUND, got %v", name, err)
	}
}

func TestLaunchFailures(t *testing.T) {
	s := open(t)
	mod := s.compileAndLoad(t, mustProgram(t), "k.cu")
	// __nanosleep is CUDA's, not the emulator shim's: a GPU runs the kernel,
	// the emulator cannot build it.
	bad := s.compileAndLoad(t, `extern "C" __global__ void not_emulated(float* x) { __nanosleep(100); }`, "bad.cu")
	add, err := s.drv.ModuleGetFunction(mod, "gc_add")
	require.NoError(t, err)
	p := s.alloc(t, 64)
	var args driver.Args
	args.Ptr(p).Ptr(p).Ptr(p).Int64(16)
	one, block := driver.Dim3{X: 1, Y: 1, Z: 1}, driver.Dim3{X: 32, Y: 1, Z: 1}

	t.Run("no emulation", func(t *testing.T) {
		s.enter(t)
		f, err := s.drv.ModuleGetFunction(bad, "not_emulated")
		require.NoError(t, err)
		var a driver.Args
		a.Ptr(p)
		requireCode(t, s.drv.LaunchKernel(f, one, block, 0, 0, a.Pointers()), driver.ErrorLaunchFailed)
		assert.Contains(t, s.lastError(t), "not_emulated has no CPU emulation: building it from the module's source")
		assert.Contains(t, s.lastError(t), "__nanosleep")
		// The build is tried once per module: the next launch fails alike
		// without compiling again.
		requireCode(t, s.drv.LaunchKernel(f, one, block, 0, 0, a.Pointers()), driver.ErrorLaunchFailed)
		assert.Contains(t, s.lastError(t), "not_emulated has no CPU emulation")
	})
	t.Run("too many threads", func(t *testing.T) {
		s.enter(t)
		requireCode(t, s.drv.LaunchKernel(add, one, driver.Dim3{X: 64, Y: 32, Z: 1}, 0, 0, args.Pointers()), driver.ErrorInvalidValue)
		assert.Contains(t, s.lastError(t), "exceeds 1024 threads")
	})
	t.Run("zero grid", func(t *testing.T) {
		s.enter(t)
		requireCode(t, s.drv.LaunchKernel(add, driver.Dim3{X: 0, Y: 1, Z: 1}, block, 0, 0, args.Pointers()), driver.ErrorInvalidValue)
	})
	t.Run("shared memory without opt-in", func(t *testing.T) {
		s.enter(t)
		requireCode(t, s.drv.LaunchKernel(add, one, block, 48*1024+1, 0, args.Pointers()), driver.ErrorInvalidValue)
		assert.Contains(t, s.lastError(t), "dynamic shared memory")
	})
	t.Run("no parameters", func(t *testing.T) {
		s.enter(t)
		requireCode(t, s.drv.LaunchKernel(add, one, block, 0, 0, nil), driver.ErrorInvalidValue)
	})
	t.Run("dead stream", func(t *testing.T) {
		s.enter(t)
		st, err := s.drv.StreamCreate(driver.StreamDefault)
		require.NoError(t, err)
		require.NoError(t, s.drv.StreamDestroy(st))
		requireCode(t, s.drv.LaunchKernel(add, one, block, 0, st, args.Pointers()), driver.ErrorInvalidHandle)
	})
	t.Run("unloaded module", func(t *testing.T) {
		s.enter(t)
		other := s.compileAndLoad(t, mustProgram(t), "again.cu")
		f, err := s.drv.ModuleGetFunction(other, "gc_add")
		require.NoError(t, err)
		require.NoError(t, s.drv.ModuleUnload(other))
		requireCode(t, s.drv.LaunchKernel(f, one, block, 0, 0, args.Pointers()), driver.ErrorInvalidHandle)
	})
	t.Run("no emulator", func(t *testing.T) {
		s.enter(t)
		t.Setenv(EmulatorEnv, "")
		requireCode(t, s.drv.LaunchKernel(add, one, block, 0, 0, args.Pointers()), driver.ErrorLaunchFailed)
		assert.Contains(t, s.lastError(t), "GCOMPILE_FAKEGPU_EMU is not set")
		t.Setenv(EmulatorEnv, filepath.Join(t.TempDir(), "missing.so"))
		requireCode(t, s.drv.LaunchKernel(add, one, block, 0, 0, args.Pointers()), driver.ErrorLaunchFailed)
		assert.Contains(t, s.lastError(t), "loading the kernel emulator")
	})
}

// A kernel the emulator's table does not hold (one a backend generates at
// run time) runs all the same: its module's image carries the source, and
// the first launch builds an emulator of it, which may call what the
// source defines before it and leaves the table's kernels to the table.
func TestGeneratedKernelsRun(t *testing.T) {
	s := open(t)
	src := `static __device__ float twice(float v) { return 2.0f * v; }
extern "C" __global__ void gen_fill(float* x, const float* __restrict__ v, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) {
    x[i] = twice(v[0]) + (float)i;
  }
}
extern "C" __global__ void gen_none() {}
`
	mod := s.compileAndLoad(t, src, "generated.cu")
	fill, err := s.drv.ModuleGetFunction(mod, "gen_fill")
	require.NoError(t, err)
	const n = 1000
	out, v := s.alloc(t, 4*n), s.upload(t, []float32{1.5})
	var args driver.Args
	args.Ptr(out).Ptr(v).Int64(n)
	require.NoError(t, s.drv.LaunchKernel(fill, driver.Dim3{X: 3, Y: 1, Z: 1}, driver.Dim3{X: 64, Y: 1, Z: 1}, 0, 0, args.Pointers()))
	got := s.download(t, out, n)
	for i := range got {
		require.Equal(t, 3+float32(i), got[i], "element %d", i)
	}
	_, err = s.drv.ModuleGetFunction(mod, "gen_none")
	require.NoError(t, err, "a kernel without parameters is listed (and dispatched) too")
}

// A stream that waits for an event nobody recorded would wait for nothing
// on a GPU: almost always an ordering edge whose other end is missing. The
// fake refuses it.
func TestWaitOnUnrecordedEventFails(t *testing.T) {
	s := open(t)
	st, err := s.drv.StreamCreate(driver.StreamDefault)
	require.NoError(t, err)
	defer s.drv.StreamDestroy(st)
	e, err := s.drv.EventCreate(driver.EventDisableTiming)
	require.NoError(t, err)
	defer s.drv.EventDestroy(e)
	requireCode(t, s.drv.StreamWaitEvent(st, e), driver.ErrorInvalidValue)
	assert.Contains(t, s.lastError(t), "has never been recorded")
	require.NoError(t, s.drv.EventRecord(e, 0))
	require.NoError(t, s.drv.StreamWaitEvent(st, e))
}

// The trace lists the calls that queue work or order streams, with their
// streams and events, in order, and the marks a caller adds between them.
func TestTraceRecordsStreamsAndEvents(t *testing.T) {
	s := open(t)
	mod := loadKernels(t, s)
	add, err := s.drv.ModuleGetFunction(mod, "gc_add")
	require.NoError(t, err)
	st, err := s.drv.StreamCreate(driver.StreamDefault)
	require.NoError(t, err)
	defer s.drv.StreamDestroy(st)
	e, err := s.drv.EventCreate(driver.EventDisableTiming)
	require.NoError(t, err)
	defer s.drv.EventDestroy(e)
	p := s.alloc(t, 64)
	var args driver.Args
	args.Ptr(p).Ptr(p).Ptr(p).Int64(16)

	require.NoError(t, s.libs.StartTrace())
	require.NoError(t, s.drv.LaunchKernel(add, driver.Dim3{X: 1, Y: 1, Z: 1}, driver.Dim3{X: 32, Y: 1, Z: 1}, 0, st, args.Pointers()))
	require.NoError(t, s.drv.EventRecord(e, st))
	require.NoError(t, s.libs.TraceMark("between"))
	require.NoError(t, s.drv.StreamWaitEvent(0, e))
	require.NoError(t, s.drv.MemcpyDtoDAsync(p, p.Add(32), 32, st))
	calls, err := s.libs.StopTrace()
	require.NoError(t, err)
	require.NoError(t, s.drv.StreamSynchronize(st)) // not recorded: the trace stopped
	require.Len(t, calls, 5, "%v", calls)
	assert.Equal(t, TraceCall{Op: "launch", Name: "gc_add", Stream: uintptr(st), Line: calls[0].Line}, calls[0])
	assert.Equal(t, TraceCall{Op: "record", Stream: uintptr(st), Event: uintptr(e), Line: calls[1].Line}, calls[1])
	assert.Equal(t, TraceCall{Op: "mark", Name: "between", Line: "mark between"}, calls[2])
	assert.Equal(t, TraceCall{Op: "wait", Stream: 0, Event: uintptr(e), Line: calls[3].Line}, calls[3])
	assert.Equal(t, "copy", calls[4].Op)
	assert.Equal(t, "cuMemcpyDtoDAsync", calls[4].Name)
	assert.Equal(t, uintptr(st), calls[4].Stream)
}

func mustProgram(t *testing.T) string {
	t.Helper()
	src, err := cuda.Program()
	require.NoError(t, err)
	return src
}

func TestNVRTCErrors(t *testing.T) {
	Install(t)
	cc, err := nvrtc.Load()
	require.NoError(t, err)
	defer cc.Close()
	arch := []string{"--gpu-architecture=sm_90"}

	t.Run("#error names the line", func(t *testing.T) {
		src := "extern \"C\" __global__ void k(float* x) {}\n\n#error the kernel is broken\n"
		_, err := cc.Compile(src, "bad.cu", arch)
		require.True(t, nvrtc.IsCompileError(err), "%v", err)
		require.True(t, errors.Is(err, nvrtc.ErrorCompilation), "%v", err)
		var ce *nvrtc.CompileError
		require.True(t, errors.As(err, &ce))
		assert.Contains(t, ce.Log, "bad.cu(3): error: #error directive: the kernel is broken")
		assert.Contains(t, ce.Log, `1 error detected in the compilation of "bad.cu".`)
	})
	t.Run("#line directives", func(t *testing.T) {
		src := "#line 1 \"common.cuh\"\nint a;\n#line 40 \"nn.cu\"\nint b;\n#error here\n"
		_, err := cc.Compile(src, "program.cu", arch)
		var ce *nvrtc.CompileError
		require.True(t, errors.As(err, &ce), "%v", err)
		assert.Contains(t, ce.Log, "nn.cu(41): error: #error directive: here")
	})
	t.Run("#error inside a conditional is not taken", func(t *testing.T) {
		src := "#if defined(SOMETHING_ELSE)\n#error not for NVRTC\n#endif\nextern \"C\" __global__ void k(float* x) {}\n"
		cubin, err := cc.Compile(src, "cond.cu", arch)
		require.NoError(t, err)
		assert.Contains(t, string(cubin), "kernel k\tfloat*\n")
	})
	t.Run("duplicate kernel", func(t *testing.T) {
		src := "extern \"C\" __global__ void k(float* x) {}\n\nextern \"C\" __global__ void k(float* y) {}\n"
		_, err := cc.Compile(src, "dup.cu", arch)
		var ce *nvrtc.CompileError
		require.True(t, errors.As(err, &ce), "%v", err)
		assert.Contains(t, ce.Log, `dup.cu(3): error: function "k" has already been defined`)
	})
	t.Run("virtual or missing architecture gives no CUBIN", func(t *testing.T) {
		for _, opts := range [][]string{nil, {"--gpu-architecture=compute_90"}, {"-default-device"}} {
			_, err := cc.Compile("extern \"C\" __global__ void k() {}\n", "v.cu", opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "empty CUBIN", "%q", opts)
		}
	})
	t.Run("architecture as a separate option", func(t *testing.T) {
		cubin, err := cc.Compile("extern \"C\" __global__ void k() {}\n", "sep.cu", []string{"-arch", "sm_90a"})
		require.NoError(t, err)
		assert.Contains(t, string(cubin), "arch sm_90a\n")
	})
	t.Run("bad options", func(t *testing.T) {
		for _, opts := range [][]string{{"--gpu-architecture=sm_9"}, {"-arch=gfx90a"}, {"sm_90"}, {"-arch"}} {
			_, err := cc.Compile("int a;\n", "o.cu", opts)
			require.Truef(t, errors.Is(err, nvrtc.ErrorInvalidOption), "%q: %v", opts, err)
		}
	})
}

func TestModuleLoadChecksTheImage(t *testing.T) {
	s := open(t)
	cc, err := nvrtc.Load()
	require.NoError(t, err)
	defer cc.Close()
	for _, c := range []struct {
		arch string
		code driver.Result
	}{
		{"sm_90", driver.Success},
		{"sm_90a", driver.Success},
		{"sm_80", driver.ErrorNoBinaryForGPU},
		{"sm_100", driver.ErrorNoBinaryForGPU},
		{"sm_91", driver.ErrorNoBinaryForGPU},
	} {
		cubin, err := cc.Compile("extern \"C\" __global__ void k() {}\n", "a.cu", []string{"-arch=" + c.arch})
		require.NoError(t, err)
		mod, err := s.drv.ModuleLoadData(cubin)
		if c.code == driver.Success {
			require.NoError(t, err, c.arch)
			require.NoError(t, s.drv.ModuleUnload(mod))
			continue
		}
		requireCode(t, err, c.code)
		assert.Contains(t, s.lastError(t), "the image was built for "+c.arch)
	}
	_, err = s.drv.ModuleLoadData([]byte("\x7fELF not ours"))
	requireCode(t, err, driver.ErrorInvalidImage)
	_, err = s.drv.ModuleLoadData([]byte("GCFAKECUBIN 1\narch sm_90\nkernel k\n\x00"))
	requireCode(t, err, driver.ErrorInvalidImage)
	assert.Contains(t, s.lastError(t), "truncated")
}

// matmulCase is one GEMM through the cublaslt package's row-major plan.
type matmulCase struct {
	name        string
	spec        cublaslt.MatmulSpec
	alpha, beta float32
}

// storedShape gives rows, cols and leading dimension of A, B or C as the spec
// lays them out in memory, and each matrix's batch stride.
func storedShape(s cublaslt.MatmulSpec, which byte) (rows, cols, ld, stride int) {
	switch which {
	case 'A':
		rows, cols, ld, stride = s.M, s.K, int(s.LDA), int(s.StrideA)
		if s.TransA {
			rows, cols = s.K, s.M
		}
	case 'B':
		rows, cols, ld, stride = s.K, s.N, int(s.LDB), int(s.StrideB)
		if s.TransB {
			rows, cols = s.N, s.K
		}
	default:
		rows, cols, ld, stride = s.M, s.N, int(s.LDC), int(s.StrideC)
	}
	if ld == 0 {
		ld = cols
	}
	if stride == 0 {
		stride = rows * ld
	}
	return rows, cols, ld, stride
}

func batchOf(s cublaslt.MatmulSpec) int { return max(s.Batch, 1) }

// elems is the element count of a matrix's buffer over the batch.
func elems(s cublaslt.MatmulSpec, which byte) int {
	rows, _, ld, stride := storedShape(s, which)
	return (batchOf(s)-1)*stride + rows*ld
}

// matmulRef computes alpha·op(A)·op(B) + beta·C in float64 over the values
// as stored (already rounded to the element type).
func matmulRef(s cublaslt.MatmulSpec, a, b, c []float64, alpha, beta float32) []float64 {
	out := append([]float64(nil), c...)
	_, _, lda, sa := storedShape(s, 'A')
	_, _, ldb, sb := storedShape(s, 'B')
	_, _, ldc, sc := storedShape(s, 'C')
	for bt := 0; bt < batchOf(s); bt++ {
		for i := 0; i < s.M; i++ {
			for j := 0; j < s.N; j++ {
				var acc float64
				for p := 0; p < s.K; p++ {
					ai := bt*sa + i*lda + p
					if s.TransA {
						ai = bt*sa + p*lda + i
					}
					bi := bt*sb + p*ldb + j
					if s.TransB {
						bi = bt*sb + j*ldb + p
					}
					acc += a[ai] * b[bi]
				}
				ci := bt*sc + i*ldc + j
				out[ci] = float64(alpha)*acc + float64(beta)*c[ci]
			}
		}
	}
	return out
}

// deviceMatrix uploads n random values of type t and returns them widened.
func (s *session) deviceMatrix(t *testing.T, rng *rand.Rand, typ cublaslt.DType, n int) (driver.DevicePtr, []float64) {
	t.Helper()
	vals := make([]float64, n)
	switch typ {
	case cublaslt.F32:
		x := make([]float32, n)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
			vals[i] = float64(x[i])
		}
		return s.upload(t, x), vals
	default:
		h := make([]uint16, n)
		for i := range h {
			v := rng.Float32()*2 - 1
			if typ == cublaslt.BF16 {
				h[i] = cpu.BF16FromF32(v)
				vals[i] = float64(cpu.F32FromBF16(h[i]))
			} else {
				h[i] = cpu.F16FromF32(v)
				vals[i] = float64(cpu.F32FromF16(h[i]))
			}
		}
		p := s.alloc(t, 2*n)
		require.NoError(t, s.drv.MemcpyHtoD(p, u16Bytes(h)))
		return p, vals
	}
}

func (s *session) readMatrix(t *testing.T, typ cublaslt.DType, p driver.DevicePtr, n int) []float64 {
	t.Helper()
	out := make([]float64, n)
	if typ == cublaslt.F32 {
		for i, v := range s.download(t, p, n) {
			out[i] = float64(v)
		}
		return out
	}
	b := make([]byte, 2*n)
	require.NoError(t, s.drv.MemcpyDtoH(b, p))
	for i, h := range bytesU16(b) {
		if typ == cublaslt.BF16 {
			out[i] = float64(cpu.F32FromBF16(h))
		} else {
			out[i] = float64(cpu.F32FromF16(h))
		}
	}
	return out
}

func TestCuBLASLtMatmulMatchesGo(t *testing.T) {
	s := open(t)
	lt, err := cublaslt.Load()
	require.NoError(t, err)
	defer lt.Close()
	h, err := lt.Create()
	require.NoError(t, err)
	defer lt.Destroy(h)

	cases := []matmulCase{
		{"f32", cublaslt.MatmulSpec{M: 5, N: 7, K: 3, Type: cublaslt.F32}, 1, 0},
		{"f32 Aᵀ", cublaslt.MatmulSpec{M: 6, N: 4, K: 9, TransA: true, Type: cublaslt.F32}, 0.5, 0},
		{"f32 Bᵀ with beta", cublaslt.MatmulSpec{M: 3, N: 8, K: 5, TransB: true, Type: cublaslt.F32}, 1, 0.75},
		{"f32 AᵀBᵀ padded", cublaslt.MatmulSpec{M: 4, N: 5, K: 6, TransA: true, TransB: true, Type: cublaslt.F32,
			LDA: 7, LDB: 9, LDC: 8}, -1.5, 0.25},
		// Batches at element strides: the operands are only 4-byte aligned.
		{"f32 strided batch", cublaslt.MatmulSpec{M: 3, N: 4, K: 5, Type: cublaslt.F32, Batch: 3,
			StrideA: 20, StrideB: 25, StrideC: 13, AlignA: 4, AlignB: 4, AlignC: 4}, 1, 0.5},
		{"bf16", cublaslt.MatmulSpec{M: 8, N: 6, K: 16, Type: cublaslt.BF16}, 1, 0},
		{"bf16 Bᵀ into f32", cublaslt.MatmulSpec{M: 5, N: 7, K: 12, TransB: true, Type: cublaslt.BF16, CType: cublaslt.F32}, 1, 1},
		{"bf16 batched Aᵀ", cublaslt.MatmulSpec{M: 4, N: 3, K: 8, TransA: true, Type: cublaslt.BF16, Batch: 2, AlignA: 64, AlignB: 16, AlignC: 8}, 2, 0},
		{"f16 with beta", cublaslt.MatmulSpec{M: 6, N: 6, K: 10, Type: cublaslt.F16}, 0.5, 0.5},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.enter(t)
			plan, err := lt.NewMatmul(h, c.spec)
			require.NoError(t, err)
			defer plan.Close()
			spec := plan.Spec()
			pa, a := s.deviceMatrix(t, rng, spec.Type, elems(spec, 'A'))
			pb, b := s.deviceMatrix(t, rng, spec.Type, elems(spec, 'B'))
			pc, cv := s.deviceMatrix(t, rng, spec.CType, elems(spec, 'C'))
			var ws driver.DevicePtr
			if plan.Workspace() > 0 {
				ws = s.alloc(t, int(plan.Workspace()))
			}
			require.NoError(t, plan.Run(pa, pb, pc, c.alpha, c.beta, ws, plan.Workspace(), 0))
			got := s.readMatrix(t, spec.CType, pc, len(cv))
			want := matmulRef(spec, a, b, cv, c.alpha, c.beta)
			// fp32 accumulation of K terms of magnitude ≤ 1, then rounding
			// to the output type: half an ulp, relative.
			rel := 0.0
			switch spec.CType {
			case cublaslt.BF16:
				rel = 0x1p-8
			case cublaslt.F16:
				rel = 0x1p-11
			}
			_, _, ldc, sc := storedShape(spec, 'C')
			for bt := 0; bt < batchOf(spec); bt++ {
				for i := 0; i < spec.M; i++ {
					for j := 0; j < spec.N; j++ {
						k := bt*sc + i*ldc + j
						tol := 1e-5*float64(spec.K) + rel*math.Abs(want[k])
						require.InDeltaf(t, want[k], got[k], tol, "batch %d C[%d][%d]", bt, i, j)
					}
				}
			}
			// Padding between rows and matrices is left alone.
			for k := range got {
				if k%sc < spec.M*ldc && k%sc%ldc < spec.N && k/sc < batchOf(spec) {
					continue
				}
				require.Equalf(t, cv[k], got[k], "C padding element %d was written", k)
			}
		})
	}
}

// The cuBLASLt stand-in rounds its f16 and bf16 outputs to nearest, ties
// to even, exactly as the CPU backend does (kernels/cpu), so the same
// GEMM gives the same bits on both.
func TestCuBLASLt16BitOutputRounding(t *testing.T) {
	s := open(t)
	lt, err := cublaslt.Load()
	require.NoError(t, err)
	defer lt.Close()
	h, err := lt.Create()
	require.NoError(t, err)
	defer lt.Destroy(h)

	for _, typ := range []cublaslt.DType{cublaslt.BF16, cublaslt.F16} {
		t.Run(typ.String(), func(t *testing.T) {
			s.enter(t)
			round, widen := cpu.F16FromF32, cpu.F32FromF16
			mantissa := 10
			if typ == cublaslt.BF16 {
				round, widen, mantissa = cpu.BF16FromF32, cpu.F32FromBF16, 7
			}
			// C[j] = alpha·(x[j]·1 + y[j]·1): the float32 sum x+y, scaled
			// by alpha, rounded once to the output type.
			rng := rand.New(rand.NewPCG(5, uint64(typ)))
			var xs, ys []uint16
			add := func(x, y float32) { xs, ys = append(xs, round(x)), append(ys, round(y)) }
			for i := 0; i < 4000; i++ {
				// Ties: y is half an ulp of x times an odd number.
				e := rng.IntN(20) - 10
				x := float32(math.Ldexp(1+float64(rng.IntN(1<<mantissa))/float64(int(1)<<mantissa), e))
				y := float32(math.Ldexp(float64(2*rng.IntN(4)+1), e-mantissa-1))
				if rng.IntN(2) == 0 {
					y = -y
				}
				add(x, y)
			}
			for i := 0; i < 20000; i++ { // anything finite
				add(widen(finite16(rng, typ)), widen(finite16(rng, typ)))
			}
			inf := float32(math.Inf(1))
			nan := float32(math.NaN())
			add(65504, 16) // f16: a tie at the top rounds up to infinity
			add(65504, 8)  // below the tie: stays finite
			add(-65504, -24)
			add(3.3895e38, 3.3895e38)
			add(inf, 1)
			add(inf, -inf)
			add(nan, 1)
			add(0x1p-24, 0x1p-25) // subnormal f16, a tie
			add(0x1p-126, 0x1p-127)
			n := len(xs)

			spec := cublaslt.MatmulSpec{M: 1, N: n, K: 2, Type: typ}
			plan, err := lt.NewMatmul(h, spec)
			require.NoError(t, err)
			defer plan.Close()
			one := round(1)
			pa := s.alloc(t, 4)
			require.NoError(t, s.drv.MemcpyHtoD(pa, u16Bytes([]uint16{one, one})))
			pb := s.alloc(t, 4*n)
			require.NoError(t, s.drv.MemcpyHtoD(pb, u16Bytes(append(append([]uint16(nil), xs...), ys...))))
			pc := s.alloc(t, 2*n)
			var ws driver.DevicePtr
			if plan.Workspace() > 0 {
				ws = s.alloc(t, int(plan.Workspace()))
			}
			for _, alpha := range []float32{1, 0.3, -1.7e3, 3.1e-5} {
				require.NoError(t, plan.Run(pa, pb, pc, alpha, 0, ws, plan.Workspace(), 0))
				b := make([]byte, 2*n)
				require.NoError(t, s.drv.MemcpyDtoH(b, pc))
				got := bytesU16(b)
				for j := range got {
					// The stand-in's order: acc = 0; acc += x·1; acc += y·1;
					// then alpha·acc + beta·old with beta = 0.
					acc := float32(0) + float32(widen(xs[j])*widen(one))
					acc += float32(widen(ys[j]) * widen(one))
					var beta, old float32
					want := round(float32(alpha*acc) + float32(beta*old))
					if math.IsNaN(float64(widen(want))) {
						require.Truef(t, math.IsNaN(float64(widen(got[j]))), "alpha %g: %#04x + %#04x gave %#04x, want NaN", alpha, xs[j], ys[j], got[j])
						continue
					}
					require.Equalf(t, want, got[j], "alpha %g: %#04x + %#04x (%g)", alpha, xs[j], ys[j], alpha*acc)
				}
			}
		})
	}
}

// finite16 draws the bits of a random finite f16 or bf16 value.
func finite16(rng *rand.Rand, typ cublaslt.DType) uint16 {
	exp := uint16(0x7c00) // f16
	if typ == cublaslt.BF16 {
		exp = 0x7f80
	}
	for {
		if h := uint16(rng.Uint32()); h&exp != exp {
			return h
		}
	}
}

func TestNCCLOneRank(t *testing.T) {
	s := open(t)
	lib, err := nccl.Load()
	require.NoError(t, err)
	defer lib.Close()
	id, err := lib.GetUniqueID()
	require.NoError(t, err)
	comm, err := lib.CommInitRank(1, id, 0)
	require.NoError(t, err)
	defer lib.CommDestroy(comm)
	n, err := lib.CommCount(comm)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	r, err := lib.CommUserRank(comm)
	require.NoError(t, err)
	assert.Equal(t, 0, r)
	require.True(t, lib.HasAllToAll())

	const count = 96
	x := make([]float32, count)
	for i := range x {
		x[i] = float32(i) - 40.25
	}
	send := s.upload(t, x)
	fresh := func(t *testing.T) driver.DevicePtr {
		p := s.alloc(t, 4*count)
		require.NoError(t, s.drv.MemsetD8(p, 0, 4*count))
		return p
	}
	for _, c := range []struct {
		name string
		call func(recv driver.DevicePtr) error
	}{
		{"all-reduce sum", func(recv driver.DevicePtr) error {
			return lib.AllReduce(send, recv, count, nccl.Float32, nccl.Sum, comm, 0)
		}},
		{"all-reduce avg", func(recv driver.DevicePtr) error {
			return lib.AllReduce(send, recv, count, nccl.Float32, nccl.Avg, comm, 0)
		}},
		{"reduce-scatter", func(recv driver.DevicePtr) error {
			return lib.ReduceScatter(send, recv, count, nccl.Float32, nccl.Max, comm, 0)
		}},
		{"all-gather", func(recv driver.DevicePtr) error { return lib.AllGather(send, recv, count, nccl.Float32, comm, 0) }},
		{"broadcast", func(recv driver.DevicePtr) error { return lib.Broadcast(send, recv, count, nccl.Float32, 0, comm, 0) }},
		{"all-to-all", func(recv driver.DevicePtr) error { return lib.AllToAll(send, recv, count, nccl.Float32, comm, 0) }},
		{"send and receive to self", func(recv driver.DevicePtr) error {
			require.NoError(t, lib.GroupStart())
			require.NoError(t, lib.Recv(recv, count, nccl.Float32, 0, comm, 0))
			require.NoError(t, lib.Send(send, count, nccl.Float32, 0, comm, 0))
			return lib.GroupEnd()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.enter(t)
			recv := fresh(t)
			require.NoError(t, c.call(recv))
			assert.Equal(t, x, s.download(t, recv, count))
		})
	}
	t.Run("in place", func(t *testing.T) {
		s.enter(t)
		buf := s.upload(t, x)
		require.NoError(t, lib.AllReduce(buf, buf, count, nccl.Float32, nccl.Sum, comm, 0))
		assert.Equal(t, x, s.download(t, buf, count))
	})

	t.Run("buffer past its allocation", func(t *testing.T) {
		s.enter(t)
		err := lib.AllReduce(send, send.Add(4), count, nccl.Float32, nccl.Sum, comm, 0)
		var ne *nccl.Error
		require.True(t, errors.As(err, &ne), "%v", err)
		assert.Equal(t, nccl.InvalidArgument, ne.Code)
		assert.Contains(t, ne.Detail, "receive buffer 0x")
		assert.Contains(t, ne.Detail, "runs 4 bytes past the end of its 384-byte allocation")
	})
	t.Run("foreign id", func(t *testing.T) {
		foreign, err := nccl.UniqueIDFromBytes(make([]byte, nccl.UniqueIDBytes))
		require.NoError(t, err)
		_, err = lib.CommInitRank(1, foreign, 0)
		require.True(t, errors.Is(err, nccl.InvalidArgument), "%v", err)
	})
	t.Run("send outside a group", func(t *testing.T) {
		s.enter(t)
		err := lib.Send(send, count, nccl.Float32, 0, comm, 0)
		require.True(t, errors.Is(err, nccl.InvalidUsage), "%v", err)
		assert.Contains(t, err.Error(), "outside ncclGroupStart/ncclGroupEnd never completes")
	})
	t.Run("unmatched send in a group", func(t *testing.T) {
		s.enter(t)
		require.NoError(t, lib.GroupStart())
		require.NoError(t, lib.Send(send, count, nccl.Float32, 0, comm, 0))
		err := lib.GroupEnd()
		require.True(t, errors.Is(err, nccl.InvalidUsage), "%v", err)
		assert.Contains(t, err.Error(), "1 send(s) to rank 0 and 0 receive(s)")
	})
	t.Run("other peer or root", func(t *testing.T) {
		s.enter(t)
		err := lib.Broadcast(send, fresh(t), count, nccl.Float32, 1, comm, 0)
		require.True(t, errors.Is(err, nccl.InvalidArgument), "%v", err)
		require.NoError(t, lib.GroupStart())
		err = lib.Recv(fresh(t), count, nccl.Float32, 1, comm, 0)
		require.NoError(t, lib.GroupEnd())
		require.True(t, errors.Is(err, nccl.InvalidArgument), "%v", err)
	})
	t.Run("bad type and op", func(t *testing.T) {
		s.enter(t)
		err := lib.AllReduce(send, fresh(t), count, nccl.DataType(42), nccl.Sum, comm, 0)
		require.True(t, errors.Is(err, nccl.InvalidArgument), "%v", err)
		err = lib.AllReduce(send, fresh(t), count, nccl.Float32, nccl.RedOp(9), comm, 0)
		require.True(t, errors.Is(err, nccl.InvalidArgument), "%v", err)
	})
}

// Two devices driven from two threads at once: each thread's current
// context routes its allocations, and launches from both threads are
// serialized by the emulator without mixing up their arguments.
func TestTwoDevicesFromTwoThreads(t *testing.T) {
	t.Setenv(DevicesEnv, "2")
	s := open(t)
	src := mustProgram(t)
	cc, err := nvrtc.Load()
	require.NoError(t, err)
	defer cc.Close()
	cubin, err := cc.Compile(src, "k.cu", []string{"--gpu-architecture=sm_90"})
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 2)
	results := make([][]float32, 2)
	const n, rounds = 4096, 20
	for d := 0; d < 2; d++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[d] = func() error {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				dev, err := s.drv.Device(d)
				if err != nil {
					return err
				}
				ctx, err := s.drv.PrimaryCtxRetain(dev)
				if err != nil {
					return err
				}
				defer s.drv.PrimaryCtxRelease(dev)
				if err := s.drv.SetCurrent(ctx); err != nil {
					return err
				}
				mod, err := s.drv.ModuleLoadData(cubin)
				if err != nil {
					return err
				}
				f, err := s.drv.ModuleGetFunction(mod, "gc_scale_by")
				if err != nil {
					return err
				}
				p, err := s.drv.MemAlloc(4 * n)
				if err != nil {
					return err
				}
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(i)
				}
				if err := s.drv.MemcpyHtoD(p, f32Bytes(x)); err != nil {
					return err
				}
				for r := 0; r < rounds; r++ {
					var a driver.Args
					a.Ptr(p).Ptr(p).Int64(n).Float32(float32(d + 2))
					if err := s.drv.LaunchKernel(f, driver.Dim3{X: 8, Y: 1, Z: 1}, driver.Dim3{X: 64, Y: 1, Z: 1}, 0, 0, a.Pointers()); err != nil {
						return err
					}
				}
				b := make([]byte, 4*n)
				if err := s.drv.MemcpyDtoH(b, p); err != nil {
					return err
				}
				results[d] = bytesF32(b)
				return s.drv.MemFree(p)
			}()
		}()
	}
	wg.Wait()
	for d := 0; d < 2; d++ {
		require.NoError(t, errs[d], "device %d", d)
		scale := math.Pow(float64(d+2), rounds)
		for i, v := range results[d] {
			want := float32(float64(i) * scale)
			require.InDeltaf(t, want, v, 1e-5*math.Abs(float64(want)), "device %d element %d", d, i)
		}
		used, err := s.libs.MemUsed(d)
		require.NoError(t, err)
		assert.Zero(t, used, "device %d", d)
	}
}
