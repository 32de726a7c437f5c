package nvrtc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/dl/dltest"
)

type fakeLib struct {
	livePrograms func() int32
	compiles     func() int32
	numOptions   func() int32
	option       func(i int32) string
}

func loadFake(t *testing.T) (*NVRTC, *fakeLib) {
	t.Helper()
	path := dltest.Build(t, "testdata/fake_nvrtc.c", "libnvrtc.so.12")
	t.Setenv("GCOMPILE_LIBNVRTC", path)
	n, err := Load()
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	require.Equal(t, path, n.Path())
	f := &fakeLib{}
	require.NoError(t, n.lib.BindAll([]dl.Symbol{
		dl.Sym(&f.livePrograms, "fake_live_programs"),
		dl.Sym(&f.compiles, "fake_compiles"),
		dl.Sym(&f.numOptions, "fake_num_options"),
		dl.Sym(&f.option, "fake_option"),
	}))
	return n, f
}

const twoKernels = `
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {}
extern "C" __global__ void scale(float *y, float a, int n) {}
`

func TestVersion(t *testing.T) {
	n, _ := loadFake(t)
	major, minor, err := n.Version()
	require.NoError(t, err)
	assert.Equal(t, 12, major)
	assert.Equal(t, 8, minor)
}

func TestCompileReturnsTheWholeCubin(t *testing.T) {
	n, f := loadFake(t)
	opts := []string{"--gpu-architecture=sm_90", "-default-device", "--std=c++17"}
	cubin, err := n.Compile(twoKernels, "kernels.cu", opts)
	require.NoError(t, err)
	// The stand-in's CUBIN holds a NUL in the middle and raw bytes at the
	// end: the copy must follow the reported size, not stop at a NUL.
	want := "FAKECUBIN:axpy:scale\x00--gpu-architecture=sm_90 -default-device --std=c++17\n\x00\x01\xff"
	assert.Equal(t, []byte(want), cubin)

	require.Equal(t, int32(3), f.numOptions())
	for i, o := range opts {
		assert.Equal(t, o, f.option(int32(i)), "option %d arrived intact", i)
	}
	assert.Equal(t, int32(0), f.livePrograms(), "the program is destroyed")
}

func TestCompileWithoutOptions(t *testing.T) {
	n, f := loadFake(t)
	cubin, err := n.Compile(twoKernels, "k.cu", nil)
	require.NoError(t, err)
	assert.Equal(t, int32(0), f.numOptions())
	assert.Equal(t, []byte("FAKECUBIN:axpy:scale\x00\x00\x01\xff"), cubin)
}

func TestCompileErrorCarriesTheLog(t *testing.T) {
	n, f := loadFake(t)
	src := "// line 1\n// line 2\n#error tile size must divide 128\nextern \"C\" __global__ void k() {}\n"
	_, err := n.Compile(src, "layernorm.cu", []string{"--gpu-architecture=sm_80"})
	require.Error(t, err)
	require.ErrorIs(t, err, ErrorCompilation)
	assert.True(t, IsCompileError(err))
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "layernorm.cu", ce.Name)
	assert.Contains(t, ce.Log, `layernorm.cu(3): error: #error tile size must divide 128`)
	msg := err.Error()
	assert.Contains(t, msg, "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION")
	assert.Contains(t, msg, "layernorm.cu(3): error: #error tile size must divide 128")
	assert.Contains(t, msg, "--gpu-architecture=sm_80")
	assert.Equal(t, int32(0), f.livePrograms(), "the program is destroyed on failure too")
}

func TestInvalidOptionIsReported(t *testing.T) {
	n, f := loadFake(t)
	_, err := n.Compile(twoKernels, "k.cu", []string{"--gpu-architecture=sm_90", "std=c++17"})
	require.ErrorIs(t, err, ErrorInvalidOption)
	assert.Contains(t, err.Error(), "NVRTC_ERROR_INVALID_OPTION")
	assert.Equal(t, int32(0), f.livePrograms())
}

func TestCacheOverTheRealBindingsSkipsNVRTCOnAHit(t *testing.T) {
	n, f := loadFake(t)
	c := &Cache{Dir: t.TempDir(), Compiler: n, DriverVersion: 12080}
	req := Request{Name: "k.cu", Source: twoKernels, Arch: "sm_90", Options: []string{"-default-device"}}
	first, err := c.Compile(req)
	require.NoError(t, err)
	require.Equal(t, int32(1), f.compiles())
	assert.Equal(t, "--gpu-architecture=sm_90", f.option(0), "the architecture option comes first")
	second, err := c.Compile(req)
	require.NoError(t, err)
	assert.Equal(t, first, second)
	assert.Equal(t, int32(1), f.compiles(), "a hit does not call NVRTC")
}

func TestErrorStringsComeFromTheLibrary(t *testing.T) {
	n, _ := loadFake(t)
	err := n.check("nvrtcFoo", ErrorInternal)
	assert.EqualError(t, err, "nvrtcFoo: NVRTC_ERROR_INTERNAL_ERROR")
	err = n.check("nvrtcFoo", Result(99))
	assert.EqualError(t, err, "nvrtcFoo: NVRTC_ERROR unknown")
	assert.ErrorIs(t, err, Result(99))
}

func TestEnumValuesMatchNvrtcH(t *testing.T) {
	tests := []struct {
		name string
		got  Result
		want int32
	}{
		{"NVRTC_SUCCESS", Success, 0},
		{"NVRTC_ERROR_OUT_OF_MEMORY", ErrorOutOfMemory, 1},
		{"NVRTC_ERROR_PROGRAM_CREATION_FAILURE", ErrorProgramCreationFailure, 2},
		{"NVRTC_ERROR_INVALID_INPUT", ErrorInvalidInput, 3},
		{"NVRTC_ERROR_INVALID_PROGRAM", ErrorInvalidProgram, 4},
		{"NVRTC_ERROR_INVALID_OPTION", ErrorInvalidOption, 5},
		{"NVRTC_ERROR_COMPILATION", ErrorCompilation, 6},
		{"NVRTC_ERROR_BUILTIN_OPERATION_FAILURE", ErrorBuiltinOperation, 7},
		{"NVRTC_ERROR_INTERNAL_ERROR", ErrorInternal, 11},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, int32(tt.got), tt.name)
		assert.Equal(t, tt.name, tt.got.Error())
	}
}
