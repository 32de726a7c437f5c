package driver

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/dl/dltest"
)

// fake reads back what the stand-in library received.
type fake struct {
	initFlags      func() uint32
	ctxRefs        func(dev int32) int32
	currentCtx     func() uintptr
	live           func(what int32) int64
	launchDim      func(i int32) uint32
	launchShared   func() uint32
	launchStream   func() uintptr
	lastAsync      func() uintptr
	lastFlags      func(what int32) uint32
	elapsedVariant func() int32
}

const (
	liveAllocs = iota
	liveHostAllocs
	liveStreams
	liveEvents
	liveModules
)

// loadFake compiles testdata/fake_cuda.c, points GCOMPILE_LIBCUDA at it and
// loads it the way the backend does.
func loadFake(t *testing.T, cflags ...string) (*Driver, *fake) {
	t.Helper()
	path := dltest.Build(t, "testdata/fake_cuda.c", "libcuda.so.1", cflags...)
	t.Setenv("GCOMPILE_LIBCUDA", path)
	d, err := Load()
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.Equal(t, path, d.Path())
	f := &fake{}
	require.NoError(t, d.lib.BindAll([]dl.Symbol{
		dl.Sym(&f.initFlags, "fake_init_flags"),
		dl.Sym(&f.ctxRefs, "fake_ctx_refs"),
		dl.Sym(&f.currentCtx, "fake_current_ctx"),
		dl.Sym(&f.live, "fake_live"),
		dl.Sym(&f.launchDim, "fake_launch_dim"),
		dl.Sym(&f.launchShared, "fake_launch_shared"),
		dl.Sym(&f.launchStream, "fake_launch_stream"),
		dl.Sym(&f.lastAsync, "fake_last_async_stream"),
		dl.Sym(&f.lastFlags, "fake_last_flags"),
		dl.Sym(&f.elapsedVariant, "fake_elapsed_variant"),
	}))
	return d, f
}

// withContext initialises the driver and makes device 0's primary context
// current.
func withContext(t *testing.T, d *Driver) Context {
	t.Helper()
	require.NoError(t, d.Init())
	dev, err := d.Device(0)
	require.NoError(t, err)
	ctx, err := d.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	require.NoError(t, d.SetCurrent(ctx))
	return ctx
}

func TestCallsBeforeInitFailWithTheDriversText(t *testing.T) {
	d, f := loadFake(t)
	_, err := d.DeviceCount()
	require.ErrorIs(t, err, ErrorNotInitialized)
	assert.EqualError(t, err, "cuDeviceGetCount: CUDA_ERROR_NOT_INITIALIZED: initialization error")
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "cuDeviceGetCount", e.Func)

	require.NoError(t, d.Init())
	assert.Equal(t, uint32(0), f.initFlags(), "cuInit takes flags 0")
}

func TestDeviceQueries(t *testing.T) {
	d, _ := loadFake(t)
	v, err := d.Version()
	require.NoError(t, err)
	assert.Equal(t, 12080, v)
	require.NoError(t, d.Init())

	n, err := d.DeviceCount()
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	dev, err := d.Device(1)
	require.NoError(t, err)
	assert.Equal(t, Device(1), dev)

	_, err = d.Device(5)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	assert.Contains(t, err.Error(), "device 5")
	assert.Contains(t, err.Error(), "cuDeviceGet: CUDA_ERROR_INVALID_DEVICE: invalid device ordinal")

	props, err := d.Props(dev)
	require.NoError(t, err)
	want := DeviceProps{
		Name:                "Fake H100 #1",
		Major:               9,
		Minor:               0,
		SMs:                 133, // the fake adds the ordinal: the device argument arrived
		MaxThreadsPerBlock:  1024,
		MaxThreadsPerSM:     2048,
		WarpSize:            32,
		SharedPerBlock:      49152,
		SharedPerBlockOptin: 232448,
		SharedPerSM:         233472,
		ClockKHz:            1980000,
		MemClockKHz:         2619000,
		MemBusWidthBits:     5120,
		L2Bytes:             52428800,
		TotalMem:            80<<30 + 1,
	}
	if diff := cmp.Diff(want, props); diff != "" {
		t.Fatalf("props (-want +got):\n%s", diff)
	}
	assert.Equal(t, "sm_90", props.Arch())

	_, err = d.Attribute(dev, DeviceAttribute(12345))
	require.ErrorIs(t, err, ErrorInvalidValue)
	assert.Contains(t, err.Error(), "cuDeviceGetAttribute: CUDA_ERROR_INVALID_VALUE: invalid argument")
}

func TestPrimaryContextLifecycle(t *testing.T) {
	d, f := loadFake(t)
	require.NoError(t, d.Init())
	dev, err := d.Device(1)
	require.NoError(t, err)

	require.ErrorIs(t, d.Synchronize(), ErrorInvalidContext, "no context is current yet")

	ctx, err := d.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	require.NotZero(t, ctx)
	assert.Equal(t, int32(1), f.ctxRefs(1))
	assert.Equal(t, int32(0), f.ctxRefs(0))

	require.NoError(t, d.SetCurrent(ctx))
	assert.Equal(t, uintptr(ctx), f.currentCtx(), "the context handle arrived intact")
	require.NoError(t, d.Synchronize())

	require.NoError(t, d.PrimaryCtxRelease(dev))
	assert.Equal(t, int32(0), f.ctxRefs(1))
	err = d.PrimaryCtxRelease(dev)
	require.ErrorIs(t, err, ErrorInvalidContext)
	assert.EqualError(t, err, "cuDevicePrimaryCtxRelease: CUDA_ERROR_INVALID_CONTEXT: invalid device context")
}

func TestDeviceMemoryRoundTrip(t *testing.T) {
	d, f := loadFake(t)
	withContext(t, d)

	const n = 1 << 20
	src := make([]byte, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	a, err := d.MemAlloc(n)
	require.NoError(t, err)
	b, err := d.MemAlloc(n)
	require.NoError(t, err)
	assert.Equal(t, int64(2), f.live(liveAllocs))

	require.NoError(t, d.MemcpyHtoD(a, src))
	require.NoError(t, d.MemcpyDtoD(b, a, n))
	got := make([]byte, n)
	require.NoError(t, d.MemcpyDtoH(got, b))
	assert.Equal(t, src, got)

	// Offsets are byte offsets into the allocation.
	part := make([]byte, 100)
	require.NoError(t, d.MemcpyDtoH(part, a.Add(1000)))
	assert.Equal(t, src[1000:1100], part)

	require.NoError(t, d.MemsetD8(a, 0xAB, 512))
	require.NoError(t, d.MemcpyDtoH(got[:513], a))
	assert.Equal(t, bytesOf(0xAB, 512), got[:512])
	assert.Equal(t, src[512], got[512], "memset stops at n")

	s, err := d.StreamCreate(StreamDefault)
	require.NoError(t, err)
	require.NoError(t, d.MemsetD32Async(b, 0xDEADBEEF, 256, s))
	assert.Equal(t, uintptr(s), f.lastAsync())
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.MemcpyDtoH(got[:1028], b))
	for i := 0; i < 256; i++ {
		require.Equal(t, uint32(0xDEADBEEF), binary.LittleEndian.Uint32(got[4*i:]), "word %d", i)
	}
	assert.Equal(t, src[1024:1028], got[1024:1028], "memset stops at n words")
	require.NoError(t, d.StreamDestroy(s))

	require.NoError(t, d.MemFree(a))
	require.NoError(t, d.MemFree(b))
	assert.Equal(t, int64(0), f.live(liveAllocs))

	// Zero-length copies do not reach the driver.
	require.NoError(t, d.MemcpyHtoD(a, nil))
	require.NoError(t, d.MemcpyDtoH(nil, a))
}

func TestOutOfMemoryIsATypedError(t *testing.T) {
	d, f := loadFake(t)
	withContext(t, d)
	_, err := d.MemAlloc(2 << 30)
	require.ErrorIs(t, err, ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: out of memory")
	assert.Contains(t, err.Error(), "2147483648 bytes", "the size (a 64-bit size_t) reached the driver")
	assert.Equal(t, int64(0), f.live(liveAllocs))

	_, err = d.MemAllocHost(3 << 30)
	require.ErrorIs(t, err, ErrorOutOfMemory)
	assert.Contains(t, err.Error(), "cuMemAllocHost")
}

func TestPinnedMemoryAndAsyncCopies(t *testing.T) {
	d, f := loadFake(t)
	withContext(t, d)

	h, err := d.MemAllocHost(4096)
	require.NoError(t, err)
	assert.Equal(t, int64(1), f.live(liveHostAllocs))
	require.Equal(t, uint64(4096), h.Size())
	buf := h.Bytes()
	require.Len(t, buf, 4096)
	for i := range buf {
		buf[i] = byte(i * 7)
	}

	dev, err := d.MemAlloc(4096)
	require.NoError(t, err)
	s, err := d.StreamCreate(StreamNonBlocking)
	require.NoError(t, err)
	assert.Equal(t, uint32(StreamNonBlocking), f.lastFlags(0))

	require.NoError(t, d.MemcpyHtoDAsync(dev, h, s))
	assert.Equal(t, uintptr(s), f.lastAsync(), "the stream arrived as the last argument")

	back, err := d.MemAllocHost(4096)
	require.NoError(t, err)
	hi, err := back.Slice(1024, 2048)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyDtoHAsync(hi, dev.Add(1024), s))
	require.NoError(t, d.StreamSynchronize(s))
	assert.Equal(t, buf[1024:3072], back.Bytes()[1024:3072])

	dev2, err := d.MemAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyDtoDAsync(dev2, dev, 4096, s))
	got := make([]byte, 4096)
	require.NoError(t, d.MemcpyDtoH(got, dev2))
	assert.Equal(t, buf, got)

	_, err = h.Slice(4000, 200)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "out of range")

	require.NoError(t, d.MemFreeHost(h))
	require.NoError(t, d.MemFreeHost(back))
	assert.Equal(t, int64(0), f.live(liveHostAllocs))
	require.NoError(t, d.StreamDestroy(s))
	assert.Equal(t, int64(0), f.live(liveStreams))
}

func TestEventsTimeAndOrderStreams(t *testing.T) {
	d, f := loadFake(t)
	withContext(t, d)

	s, err := d.StreamCreate(StreamDefault)
	require.NoError(t, err)
	start, err := d.EventCreate(EventDefault)
	require.NoError(t, err)
	end, err := d.EventCreate(EventBlockingSync)
	require.NoError(t, err)
	assert.Equal(t, uint32(EventBlockingSync), f.lastFlags(1))
	assert.Equal(t, int64(2), f.live(liveEvents))

	_, err = d.EventElapsed(start, end)
	require.ErrorIs(t, err, ErrorNotReady)
	assert.EqualError(t, err, "cuEventElapsedTime: CUDA_ERROR_NOT_READY: device not ready")

	require.NoError(t, d.EventRecord(start, s))
	assert.Equal(t, uintptr(s), f.lastAsync())
	require.NoError(t, d.EventRecord(end, s))
	require.NoError(t, d.EventSynchronize(end))
	ms, err := d.EventElapsed(start, end)
	require.NoError(t, err)
	assert.Equal(t, float32(1.25), ms, "the float written by the driver came back")
	assert.Equal(t, int32(2), f.elapsedVariant(), "the _v2 symbol is preferred")

	other, err := d.StreamCreate(StreamNonBlocking)
	require.NoError(t, err)
	require.NoError(t, d.StreamWaitEvent(other, end))
	assert.Equal(t, uintptr(other), f.lastAsync())
	assert.Equal(t, uint32(0), f.lastFlags(2))

	require.NoError(t, d.EventDestroy(start))
	require.NoError(t, d.EventDestroy(end))
	assert.Equal(t, int64(0), f.live(liveEvents))
	require.ErrorIs(t, d.EventDestroy(0), ErrorInvalidHandle)
	require.NoError(t, d.StreamDestroy(s))
	require.NoError(t, d.StreamDestroy(other))
}

func TestElapsedTimeFallsBackOnOlderDrivers(t *testing.T) {
	d, f := loadFake(t, "-DNO_ELAPSED_V2")
	withContext(t, d)
	a, err := d.EventCreate(EventDefault)
	require.NoError(t, err)
	b, err := d.EventCreate(EventDefault)
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(a, 0))
	require.NoError(t, d.EventRecord(b, 0))
	ms, err := d.EventElapsed(a, b)
	require.NoError(t, err)
	assert.Equal(t, float32(1.25), ms)
	assert.Equal(t, int32(1), f.elapsedVariant())
}

func TestModuleLoadAndKernelLaunch(t *testing.T) {
	d, f := loadFake(t)
	withContext(t, d)

	_, err := d.ModuleLoadData([]byte("\x7fELF not a cubin"))
	require.ErrorIs(t, err, ErrorInvalidImage)
	assert.EqualError(t, err, "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")
	_, err = d.ModuleLoadData(nil)
	require.Error(t, err)

	mod, err := d.ModuleLoadData([]byte("FAKECUBIN:scale:axpy\x00"))
	require.NoError(t, err)
	assert.Equal(t, int64(1), f.live(liveModules))
	_, err = d.ModuleGetFunction(mod, "nope")
	require.ErrorIs(t, err, ErrorNotFound)
	assert.Contains(t, err.Error(), `kernel "nope"`)
	assert.Contains(t, err.Error(), "named symbol not found")
	fn, err := d.ModuleGetFunction(mod, "axpy")
	require.NoError(t, err)

	const n = 1000
	x := make([]float32, n)
	y := make([]float32, n)
	for i := range x {
		x[i] = float32(i)
		y[i] = float32(n - i)
	}
	dx := upload(t, d, x)
	dy := upload(t, d, y)
	s, err := d.StreamCreate(StreamDefault)
	require.NoError(t, err)

	var args Args
	args.Ptr(dy).Ptr(dx).Float32(0.5).Int32(n)
	require.Equal(t, 4, args.Len())
	grid, block := Dim3{4, 2, 1}, Dim3{128, 1, 1}
	require.NoError(t, d.LaunchKernel(fn, grid, block, 4096, s, args.Pointers()))

	var dims [6]uint32
	for i := range dims {
		dims[i] = f.launchDim(int32(i))
	}
	assert.Equal(t, [6]uint32{4, 2, 1, 128, 1, 1}, dims)
	assert.Equal(t, uint32(4096), f.launchShared())
	assert.Equal(t, uintptr(s), f.launchStream())

	got := download(t, d, dy, n)
	for i := range got {
		require.Equal(t, y[i]+0.5*x[i], got[i], "y[%d]", i)
	}

	err = d.LaunchKernel(fn, grid, Dim3{2048, 1, 1}, 0, s, args.Pointers())
	require.ErrorIs(t, err, ErrorInvalidValue)
	assert.Contains(t, err.Error(), "cuLaunchKernel")

	require.NoError(t, d.ModuleUnload(mod))
	assert.Equal(t, int64(0), f.live(liveModules))
}

func TestStatusNamesNotKnownToTheDriver(t *testing.T) {
	d, _ := loadFake(t)
	// The stand-in only names a few codes; for others the driver's lookup
	// fails and the name comes from this package's table or the number.
	err := d.check("cuLaunchKernel", ErrorIllegalAddress)
	assert.EqualError(t, err, "cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS")
	assert.ErrorIs(t, err, ErrorIllegalAddress)
	err = d.check("cuFoo", Result(12345))
	assert.EqualError(t, err, "cuFoo: CUresult(12345)")
	assert.NoError(t, d.check("cuFoo", Success))
}

func TestLoadNamesEveryMissingSymbol(t *testing.T) {
	src := filepath.Join(t.TempDir(), "partial.c")
	require.NoError(t, os.WriteFile(src, []byte("int cuInit(unsigned f) { return f; }\n"), 0o644))
	path := dltest.Build(t, src, "libcuda.so.1")
	t.Setenv("GCOMPILE_LIBCUDA", path)
	_, err := Load()
	require.ErrorIs(t, err, dl.ErrSymbol)
	for _, sym := range []string{"cuMemAlloc_v2", "cuLaunchKernel", "cuDevicePrimaryCtxRelease_v2", "cuStreamDestroy_v2"} {
		assert.Contains(t, err.Error(), sym)
	}
	assert.Contains(t, err.Error(), path)
}

func TestLoadWithoutTheLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	t.Setenv("GCOMPILE_LIBCUDA", missing)
	_, err := Load()
	require.ErrorIs(t, err, dl.ErrNotFound)
	assert.Contains(t, err.Error(), missing)
	assert.Contains(t, err.Error(), "GCOMPILE_LIBCUDA")
}

func TestArgsKeepCTypeWidths(t *testing.T) {
	var a Args
	a.Ptr(0x1122334455667788).Int32(-3).Uint32(7).Int64(-1 << 40).Uint64(1 << 63).Float32(1.5).Float64(-2.25)
	p := a.Pointers()
	require.Len(t, p, 7)
	assert.Equal(t, DevicePtr(0x1122334455667788), *(*DevicePtr)(p[0]))
	assert.Equal(t, int32(-3), *(*int32)(p[1]))
	assert.Equal(t, uint32(7), *(*uint32)(p[2]))
	assert.Equal(t, int64(-1<<40), *(*int64)(p[3]))
	assert.Equal(t, uint64(1<<63), *(*uint64)(p[4]))
	assert.Equal(t, float32(1.5), *(*float32)(p[5]))
	assert.Equal(t, -2.25, *(*float64)(p[6]))
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func upload(t *testing.T, d *Driver, v []float32) DevicePtr {
	t.Helper()
	p, err := d.MemAlloc(uint64(4 * len(v)))
	require.NoError(t, err)
	require.NoError(t, d.MemcpyHtoD(p, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))))
	return p
}

func download(t *testing.T, d *Driver, p DevicePtr, n int) []float32 {
	t.Helper()
	b := make([]byte, 4*n)
	require.NoError(t, d.MemcpyDtoH(b, p))
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
