package driver_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/driver"
)

// GPUTestsEnv names the variable that runs the tests against the real
// driver; they need an NVIDIA GPU and are skipped elsewhere.
const gpuTestsEnv = "GCOMPILE_GPU_TESTS"

func TestRealDriver(t *testing.T) {
	if os.Getenv(gpuTestsEnv) != "1" {
		t.Skipf("set %s=1 on a machine with an NVIDIA GPU to test against the real driver", gpuTestsEnv)
	}
	// The context is current per OS thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	d, err := driver.Load()
	require.NoError(t, err)
	require.NoError(t, d.Init())
	v, err := d.Version()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, v, 11000)
	n, err := d.DeviceCount()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	dev, err := d.Device(0)
	require.NoError(t, err)
	p, err := d.Props(dev)
	require.NoError(t, err)
	t.Logf("driver %d (%s), device 0: %+v", v, d.Path(), p)
	assert.GreaterOrEqual(t, p.Major, 5)
	assert.Positive(t, p.SMs)
	assert.Equal(t, 32, p.WarpSize)
	assert.GreaterOrEqual(t, p.SharedPerBlockOptin, p.SharedPerBlock)
	assert.Positive(t, p.TotalMem)

	ctx, err := d.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	defer d.PrimaryCtxRelease(dev)
	require.NoError(t, d.SetCurrent(ctx))

	const size = 1 << 20
	src := make([]byte, size)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	a, err := d.MemAlloc(size)
	require.NoError(t, err)
	defer d.MemFree(a)
	b, err := d.MemAlloc(size)
	require.NoError(t, err)
	defer d.MemFree(b)
	require.NoError(t, d.MemcpyHtoD(a, src))
	require.NoError(t, d.MemcpyDtoD(b, a, size))
	got := make([]byte, size)
	require.NoError(t, d.MemcpyDtoH(got, b))
	require.True(t, bytes.Equal(src, got), "device round trip")

	s, err := d.StreamCreate(driver.StreamNonBlocking)
	require.NoError(t, err)
	defer d.StreamDestroy(s)
	start, err := d.EventCreate(driver.EventDefault)
	require.NoError(t, err)
	defer d.EventDestroy(start)
	end, err := d.EventCreate(driver.EventDefault)
	require.NoError(t, err)
	defer d.EventDestroy(end)

	pinned, err := d.MemAllocHost(size)
	require.NoError(t, err)
	defer d.MemFreeHost(pinned)
	require.NoError(t, d.EventRecord(start, s))
	require.NoError(t, d.MemsetD32Async(a, 0x01020304, size/4, s))
	require.NoError(t, d.MemcpyDtoHAsync(pinned, a, s))
	require.NoError(t, d.EventRecord(end, s))
	require.NoError(t, d.EventSynchronize(end))
	ms, err := d.EventElapsed(start, end)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, float32(0))
	for i := 0; i < size; i += 4 {
		require.Equal(t, uint32(0x01020304), binary.LittleEndian.Uint32(pinned.Bytes()[i:]), "word %d", i/4)
	}

	_, err = d.MemAlloc(1 << 62)
	require.ErrorIs(t, err, driver.ErrorOutOfMemory)
	t.Log(err)
}
