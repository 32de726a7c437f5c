package driver

import (
	"fmt"
	"unsafe"
)

// Handles of driver objects. Each is the C handle's value, kept in a distinct
// type so a stream cannot be passed where an event is expected.
type (
	Device    int32   // CUdevice: a device ordinal
	Context   uintptr // CUcontext
	Stream    uintptr // CUstream; the zero Stream is the legacy default stream
	Event     uintptr // CUevent
	Module    uintptr // CUmodule
	Function  uintptr // CUfunction
	DevicePtr uint64  // CUdeviceptr: an address in device memory
)

// Add returns p offset by n bytes.
func (p DevicePtr) Add(n uint64) DevicePtr { return p + DevicePtr(n) }

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// Result is a CUresult status code. It is an error so that
// errors.Is(err, ErrorOutOfMemory) works on the *Error the API returns.
type Result int32

// The CUresult values the backend tells apart (cuda.h, cudaError_enum).
const (
	Success                   Result = 0
	ErrorInvalidValue         Result = 1
	ErrorOutOfMemory          Result = 2
	ErrorNotInitialized       Result = 3
	ErrorDeinitialized        Result = 4
	ErrorStubLibrary          Result = 34
	ErrorNoDevice             Result = 100
	ErrorInvalidDevice        Result = 101
	ErrorInvalidImage         Result = 200
	ErrorInvalidContext       Result = 201
	ErrorNoBinaryForGPU       Result = 209
	ErrorInvalidPTX           Result = 218
	ErrorUnsupportedPTX       Result = 222
	ErrorInvalidSource        Result = 300
	ErrorFileNotFound         Result = 301
	ErrorInvalidHandle        Result = 400
	ErrorNotFound             Result = 500
	ErrorNotReady             Result = 600
	ErrorIllegalAddress       Result = 700
	ErrorLaunchOutOfResources Result = 701
	ErrorLaunchTimeout        Result = 702
	ErrorLaunchFailed         Result = 719
	ErrorUnknown              Result = 999
)

var resultNames = map[Result]string{
	Success:                   "CUDA_SUCCESS",
	ErrorInvalidValue:         "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory:          "CUDA_ERROR_OUT_OF_MEMORY",
	ErrorNotInitialized:       "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized:        "CUDA_ERROR_DEINITIALIZED",
	ErrorStubLibrary:          "CUDA_ERROR_STUB_LIBRARY",
	ErrorNoDevice:             "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice:        "CUDA_ERROR_INVALID_DEVICE",
	ErrorInvalidImage:         "CUDA_ERROR_INVALID_IMAGE",
	ErrorInvalidContext:       "CUDA_ERROR_INVALID_CONTEXT",
	ErrorNoBinaryForGPU:       "CUDA_ERROR_NO_BINARY_FOR_GPU",
	ErrorInvalidPTX:           "CUDA_ERROR_INVALID_PTX",
	ErrorUnsupportedPTX:       "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	ErrorInvalidSource:        "CUDA_ERROR_INVALID_SOURCE",
	ErrorFileNotFound:         "CUDA_ERROR_FILE_NOT_FOUND",
	ErrorInvalidHandle:        "CUDA_ERROR_INVALID_HANDLE",
	ErrorNotFound:             "CUDA_ERROR_NOT_FOUND",
	ErrorNotReady:             "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress:       "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrorLaunchOutOfResources: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	ErrorLaunchTimeout:        "CUDA_ERROR_LAUNCH_TIMEOUT",
	ErrorLaunchFailed:         "CUDA_ERROR_LAUNCH_FAILED",
	ErrorUnknown:              "CUDA_ERROR_UNKNOWN",
}

// Error returns the code's cuda.h name, or the number for codes this package
// does not list (the *Error from a call carries the driver's own name).
func (r Result) Error() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int32(r))
}

// Error is a failed driver call: the API name and the driver's name and
// description of the status.
type Error struct {
	Func string // API name without version suffix, e.g. "cuMemAlloc"
	Code Result
	Name string // from cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc string // from cuGetErrorString, e.g. "out of memory"
}

func (e *Error) Error() string {
	if e.Desc == "" {
		return fmt.Sprintf("%s: %s", e.Func, e.Name)
	}
	return fmt.Sprintf("%s: %s: %s", e.Func, e.Name, e.Desc)
}

// Unwrap exposes the status code to errors.Is.
func (e *Error) Unwrap() error { return e.Code }

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// The attributes DeviceProps reads (cuda.h, CUdevice_attribute_enum).
const (
	AttrMaxThreadsPerBlock           DeviceAttribute = 1
	AttrMaxSharedMemoryPerBlock      DeviceAttribute = 8
	AttrWarpSize                     DeviceAttribute = 10
	AttrClockRate                    DeviceAttribute = 13
	AttrMultiprocessorCount          DeviceAttribute = 16
	AttrMemoryClockRate              DeviceAttribute = 36
	AttrGlobalMemoryBusWidth         DeviceAttribute = 37
	AttrL2CacheSize                  DeviceAttribute = 38
	AttrMaxThreadsPerMultiprocessor  DeviceAttribute = 39
	AttrComputeCapabilityMajor       DeviceAttribute = 75
	AttrComputeCapabilityMinor       DeviceAttribute = 76
	AttrMaxSharedMemoryPerMultiproc  DeviceAttribute = 81
	AttrMaxSharedMemoryPerBlockOptin DeviceAttribute = 97
)

// StreamFlags are CUstream_flags.
type StreamFlags uint32

const (
	StreamDefault     StreamFlags = 0x0
	StreamNonBlocking StreamFlags = 0x1 // does not synchronize with the legacy default stream
)

// EventFlags are CUevent_flags.
type EventFlags uint32

const (
	EventDefault       EventFlags = 0x0
	EventBlockingSync  EventFlags = 0x1
	EventDisableTiming EventFlags = 0x2
)

// DeviceProps are the properties the backend plans kernels with.
type DeviceProps struct {
	Name                string
	Major, Minor        int // compute capability
	SMs                 int
	MaxThreadsPerBlock  int
	MaxThreadsPerSM     int
	WarpSize            int
	SharedPerBlock      int // bytes without opt-in
	SharedPerBlockOptin int // bytes with cuFuncSetAttribute opt-in
	SharedPerSM         int
	ClockKHz            int
	MemClockKHz         int
	MemBusWidthBits     int
	L2Bytes             int
	TotalMem            uint64
}

// Arch is the NVRTC architecture name for the device, e.g. "sm_90".
func (p DeviceProps) Arch() string { return fmt.Sprintf("sm_%d%d", p.Major, p.Minor) }

// HostMem is page-locked host memory from MemAllocHost: the only host memory
// asynchronous copies may read from or write to.
type HostMem struct {
	ptr  unsafe.Pointer
	size uint64
}

// Size is the length in bytes.
func (h HostMem) Size() uint64 { return h.size }

// Bytes views the memory as a byte slice, valid until MemFreeHost.
func (h HostMem) Bytes() []byte {
	if h.ptr == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.ptr), h.size)
}

// Slice returns the n bytes at offset off.
func (h HostMem) Slice(off, n uint64) (HostMem, error) {
	if off > h.size || n > h.size-off {
		return HostMem{}, fmt.Errorf("driver: host memory slice [%d:%d] out of range of %d bytes", off, off+n, h.size)
	}
	return HostMem{ptr: unsafe.Add(h.ptr, off), size: n}, nil
}
