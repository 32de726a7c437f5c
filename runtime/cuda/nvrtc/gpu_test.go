package nvrtc_test

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/driver/drivertest"
	"gcompile/runtime/cuda/nvrtc"
)

const axpySource = `
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) y[i] += a * x[i];
}
`

// counting wraps the real NVRTC to count compilations.
type counting struct {
	*nvrtc.NVRTC
	calls int
}

func (c *counting) Compile(src, name string, opts []string) ([]byte, error) {
	c.calls++
	return c.NVRTC.Compile(src, name, opts)
}

func TestRealNVRTCCompilesAndRuns(t *testing.T) {
	g := drivertest.Open(t, "test against the real NVRTC and driver")
	d, props := g.Driver, g.Props
	dv, err := d.Version()
	require.NoError(t, err)

	n, err := nvrtc.Load()
	require.NoError(t, err)
	major, minor, err := n.Version()
	require.NoError(t, err)
	t.Logf("NVRTC %d.%d from %s, arch %s", major, minor, n.Path(), props.Arch())

	cc := &counting{NVRTC: n}
	cache := &nvrtc.Cache{Dir: t.TempDir(), Compiler: cc, DriverVersion: dv}
	req := nvrtc.Request{Name: "axpy.cu", Source: axpySource, Arch: props.Arch(), Options: []string{"-default-device", "--std=c++17"}}
	cubin, err := cache.Compile(req)
	require.NoError(t, err)
	require.Greater(t, len(cubin), 4)
	assert.Equal(t, "\x7fELF", string(cubin[:4]), "a CUBIN is an ELF image")
	again, err := cache.Compile(req)
	require.NoError(t, err)
	assert.Equal(t, cubin, again)
	assert.Equal(t, 1, cc.calls)

	mod, err := d.ModuleLoadData(cubin)
	require.NoError(t, err)
	defer d.ModuleUnload(mod)
	fn, err := d.ModuleGetFunction(mod, "axpy")
	require.NoError(t, err)

	const count = 10000
	x, y := make([]float32, count), make([]float32, count)
	for i := range x {
		x[i], y[i] = float32(i), float32(count-i)
	}
	bytesOf := func(v []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)) }
	dx, err := d.MemAlloc(4 * count)
	require.NoError(t, err)
	defer d.MemFree(dx)
	dy, err := d.MemAlloc(4 * count)
	require.NoError(t, err)
	defer d.MemFree(dy)
	require.NoError(t, d.MemcpyHtoD(dx, bytesOf(x)))
	require.NoError(t, d.MemcpyHtoD(dy, bytesOf(y)))
	var args driver.Args
	args.Ptr(dy).Ptr(dx).Float32(0.5).Int32(count)
	require.NoError(t, d.LaunchKernel(fn, driver.Dim3{X: (count + 255) / 256, Y: 1, Z: 1}, driver.Dim3{X: 256, Y: 1, Z: 1}, 0, 0, args.Pointers()))
	require.NoError(t, d.Synchronize())
	out := make([]byte, 4*count)
	require.NoError(t, d.MemcpyDtoH(out, dy))
	for i := range y {
		got := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
		require.Equal(t, y[i]+0.5*x[i], got, "y[%d]", i)
	}

	_, err = n.Compile("extern \"C\" __global__ void k() { int x = ; }", "broken.cu", []string{"--gpu-architecture=" + props.Arch()})
	require.ErrorIs(t, err, nvrtc.ErrorCompilation)
	assert.True(t, nvrtc.IsCompileError(err))
	assert.Contains(t, err.Error(), "broken.cu")
	t.Log(err)
}
