package driver

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// The values below are copied from cuda.h (cudaError_enum,
// CUdevice_attribute_enum, CUstream_flags_enum, CUevent_flags_enum). They are
// part of the driver's ABI; a typo here would silently ask for the wrong
// attribute or misreport an error, which no stand-in library could catch.
func TestEnumValuesMatchCudaH(t *testing.T) {
	tests := []struct {
		name string
		got  int64
		want int64
	}{
		{"CUDA_SUCCESS", int64(Success), 0},
		{"CUDA_ERROR_INVALID_VALUE", int64(ErrorInvalidValue), 1},
		{"CUDA_ERROR_OUT_OF_MEMORY", int64(ErrorOutOfMemory), 2},
		{"CUDA_ERROR_NOT_INITIALIZED", int64(ErrorNotInitialized), 3},
		{"CUDA_ERROR_DEINITIALIZED", int64(ErrorDeinitialized), 4},
		{"CUDA_ERROR_STUB_LIBRARY", int64(ErrorStubLibrary), 34},
		{"CUDA_ERROR_NO_DEVICE", int64(ErrorNoDevice), 100},
		{"CUDA_ERROR_INVALID_DEVICE", int64(ErrorInvalidDevice), 101},
		{"CUDA_ERROR_INVALID_IMAGE", int64(ErrorInvalidImage), 200},
		{"CUDA_ERROR_INVALID_CONTEXT", int64(ErrorInvalidContext), 201},
		{"CUDA_ERROR_NO_BINARY_FOR_GPU", int64(ErrorNoBinaryForGPU), 209},
		{"CUDA_ERROR_INVALID_PTX", int64(ErrorInvalidPTX), 218},
		{"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", int64(ErrorUnsupportedPTX), 222},
		{"CUDA_ERROR_INVALID_SOURCE", int64(ErrorInvalidSource), 300},
		{"CUDA_ERROR_FILE_NOT_FOUND", int64(ErrorFileNotFound), 301},
		{"CUDA_ERROR_INVALID_HANDLE", int64(ErrorInvalidHandle), 400},
		{"CUDA_ERROR_NOT_FOUND", int64(ErrorNotFound), 500},
		{"CUDA_ERROR_NOT_READY", int64(ErrorNotReady), 600},
		{"CUDA_ERROR_ILLEGAL_ADDRESS", int64(ErrorIllegalAddress), 700},
		{"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", int64(ErrorLaunchOutOfResources), 701},
		{"CUDA_ERROR_LAUNCH_TIMEOUT", int64(ErrorLaunchTimeout), 702},
		{"CUDA_ERROR_LAUNCH_FAILED", int64(ErrorLaunchFailed), 719},
		{"CUDA_ERROR_UNKNOWN", int64(ErrorUnknown), 999},

		{"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK", int64(AttrMaxThreadsPerBlock), 1},
		{"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK", int64(AttrMaxSharedMemoryPerBlock), 8},
		{"CU_DEVICE_ATTRIBUTE_WARP_SIZE", int64(AttrWarpSize), 10},
		{"CU_DEVICE_ATTRIBUTE_CLOCK_RATE", int64(AttrClockRate), 13},
		{"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", int64(AttrMultiprocessorCount), 16},
		{"CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE", int64(AttrMemoryClockRate), 36},
		{"CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH", int64(AttrGlobalMemoryBusWidth), 37},
		{"CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE", int64(AttrL2CacheSize), 38},
		{"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR", int64(AttrMaxThreadsPerMultiprocessor), 39},
		{"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", int64(AttrComputeCapabilityMajor), 75},
		{"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", int64(AttrComputeCapabilityMinor), 76},
		{"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", int64(AttrMaxSharedMemoryPerMultiproc), 81},
		{"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", int64(AttrMaxSharedMemoryPerBlockOptin), 97},

		{"CU_STREAM_DEFAULT", int64(StreamDefault), 0},
		{"CU_STREAM_NON_BLOCKING", int64(StreamNonBlocking), 1},
		{"CU_EVENT_DEFAULT", int64(EventDefault), 0},
		{"CU_EVENT_BLOCKING_SYNC", int64(EventBlockingSync), 1},
		{"CU_EVENT_DISABLE_TIMING", int64(EventDisableTiming), 2},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.got, tt.name)
	}
}

func TestResultNamesAreTheHeaderNames(t *testing.T) {
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ErrorOutOfMemory.Error())
	assert.Equal(t, "CUDA_ERROR_LAUNCH_FAILED", ErrorLaunchFailed.Error())
	assert.Equal(t, "CUresult(4242)", Result(4242).Error())
}

// The handle types must have the width of the C types they stand for on a
// 64-bit host: CUdevice is int, CUdeviceptr unsigned long long, the others
// pointers.
func TestHandleWidths(t *testing.T) {
	assert.Equal(t, uintptr(4), unsafe.Sizeof(Device(0)))
	assert.Equal(t, uintptr(4), unsafe.Sizeof(Result(0)))
	assert.Equal(t, uintptr(4), unsafe.Sizeof(DeviceAttribute(0)))
	assert.Equal(t, uintptr(8), unsafe.Sizeof(DevicePtr(0)))
	for _, sz := range []uintptr{
		unsafe.Sizeof(Context(0)), unsafe.Sizeof(Stream(0)), unsafe.Sizeof(Event(0)),
		unsafe.Sizeof(Module(0)), unsafe.Sizeof(Function(0)),
	} {
		assert.Equal(t, unsafe.Sizeof(uintptr(0)), sz)
	}
}
