package driver

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"gcompile/runtime/cuda/dl"
)

// Driver is the loaded CUDA driver library with its entry points bound.
type Driver struct {
	lib *dl.Lib

	cuInit                    func(flags uint32) Result
	cuDriverGetVersion        func(v *int32) Result
	cuDeviceGetCount          func(n *int32) Result
	cuDeviceGet               func(d *Device, ordinal int32) Result
	cuDeviceGetName           func(name *byte, n int32, d Device) Result
	cuDeviceGetAttribute      func(v *int32, attr DeviceAttribute, d Device) Result
	cuDeviceTotalMem          func(bytes *uint64, d Device) Result
	cuDevicePrimaryCtxRetain  func(ctx *Context, d Device) Result
	cuDevicePrimaryCtxRelease func(d Device) Result
	cuCtxSetCurrent           func(ctx Context) Result
	cuCtxSynchronize          func() Result
	cuStreamCreate            func(s *Stream, flags StreamFlags) Result
	cuStreamDestroy           func(s Stream) Result
	cuStreamSynchronize       func(s Stream) Result
	cuStreamWaitEvent         func(s Stream, e Event, flags uint32) Result
	cuEventCreate             func(e *Event, flags EventFlags) Result
	cuEventRecord             func(e Event, s Stream) Result
	cuEventSynchronize        func(e Event) Result
	cuEventElapsedTime        func(ms *float32, start, end Event) Result
	cuEventDestroy            func(e Event) Result
	cuMemAlloc                func(p *DevicePtr, n uintptr) Result
	cuMemFree                 func(p DevicePtr) Result
	cuMemAllocHost            func(p *unsafe.Pointer, n uintptr) Result
	cuMemFreeHost             func(p unsafe.Pointer) Result
	cuMemcpyHtoD              func(dst DevicePtr, src unsafe.Pointer, n uintptr) Result
	cuMemcpyDtoH              func(dst unsafe.Pointer, src DevicePtr, n uintptr) Result
	cuMemcpyDtoD              func(dst, src DevicePtr, n uintptr) Result
	cuMemcpyHtoDAsync         func(dst DevicePtr, src unsafe.Pointer, n uintptr, s Stream) Result
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src DevicePtr, n uintptr, s Stream) Result
	cuMemcpyDtoDAsync         func(dst, src DevicePtr, n uintptr, s Stream) Result
	cuMemsetD8                func(dst DevicePtr, v uint8, n uintptr) Result
	cuMemsetD32Async          func(dst DevicePtr, v uint32, n uintptr, s Stream) Result
	cuModuleLoadData          func(m *Module, image unsafe.Pointer) Result
	cuModuleGetFunction       func(f *Function, m Module, name *byte) Result
	cuModuleUnload            func(m Module) Result
	cuLaunchKernel            func(f Function, gx, gy, gz, bx, by, bz, shared uint32, s Stream, params *unsafe.Pointer, extra *unsafe.Pointer) Result
	cuGetErrorName            func(r Result, s **byte) Result
	cuGetErrorString          func(r Result, s **byte) Result
}

// Load finds libcuda with dl.DefaultSearch and binds it.
func Load() (*Driver, error) { return LoadFrom(dl.DefaultSearch()) }

// LoadFrom finds libcuda with s and binds it. Every missing symbol is
// reported in the one error.
func LoadFrom(s dl.Search) (*Driver, error) {
	lib, err := s.Open(dl.CUDA)
	if err != nil {
		return nil, err
	}
	d := &Driver{lib: lib}
	if err := d.bind(); err != nil {
		lib.Close()
		return nil, fmt.Errorf("driver: %s is not a usable CUDA driver: %w", lib.Path, err)
	}
	return d, nil
}

func (d *Driver) bind() error {
	// Symbol names are those cuda.h maps the API names to; see doc.go.
	return d.lib.BindAll([]dl.Symbol{
		dl.Sym(&d.cuInit, "cuInit"),
		dl.Sym(&d.cuDriverGetVersion, "cuDriverGetVersion"),
		dl.Sym(&d.cuDeviceGetCount, "cuDeviceGetCount"),
		dl.Sym(&d.cuDeviceGet, "cuDeviceGet"),
		dl.Sym(&d.cuDeviceGetName, "cuDeviceGetName"),
		dl.Sym(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
		dl.Sym(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
		dl.Sym(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
		dl.Sym(&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
		dl.Sym(&d.cuCtxSetCurrent, "cuCtxSetCurrent"),
		dl.Sym(&d.cuCtxSynchronize, "cuCtxSynchronize"),
		dl.Sym(&d.cuStreamCreate, "cuStreamCreate"),
		dl.Sym(&d.cuStreamDestroy, "cuStreamDestroy_v2"),
		dl.Sym(&d.cuStreamSynchronize, "cuStreamSynchronize"),
		dl.Sym(&d.cuStreamWaitEvent, "cuStreamWaitEvent"),
		dl.Sym(&d.cuEventCreate, "cuEventCreate"),
		dl.Sym(&d.cuEventRecord, "cuEventRecord"),
		dl.Sym(&d.cuEventSynchronize, "cuEventSynchronize"),
		dl.FirstOf(&d.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
		dl.Sym(&d.cuEventDestroy, "cuEventDestroy_v2"),
		dl.Sym(&d.cuMemAlloc, "cuMemAlloc_v2"),
		dl.Sym(&d.cuMemFree, "cuMemFree_v2"),
		dl.Sym(&d.cuMemAllocHost, "cuMemAllocHost_v2"),
		dl.Sym(&d.cuMemFreeHost, "cuMemFreeHost"),
		dl.Sym(&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
		dl.Sym(&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
		dl.Sym(&d.cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
		dl.Sym(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
		dl.Sym(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
		dl.Sym(&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
		dl.Sym(&d.cuMemsetD8, "cuMemsetD8_v2"),
		dl.Sym(&d.cuMemsetD32Async, "cuMemsetD32Async"),
		dl.Sym(&d.cuModuleLoadData, "cuModuleLoadData"),
		dl.Sym(&d.cuModuleGetFunction, "cuModuleGetFunction"),
		dl.Sym(&d.cuModuleUnload, "cuModuleUnload"),
		dl.Sym(&d.cuLaunchKernel, "cuLaunchKernel"),
		dl.Sym(&d.cuGetErrorName, "cuGetErrorName"),
		dl.Sym(&d.cuGetErrorString, "cuGetErrorString"),
	})
}

// Path is the file the driver was loaded from.
func (d *Driver) Path() string { return d.lib.Path }

// Close unloads the library. Nothing bound from it may be called afterwards.
func (d *Driver) Close() error { return d.lib.Close() }

// check turns a status into an error carrying the driver's name and text.
func (d *Driver) check(fn string, r Result) error {
	if r == Success {
		return nil
	}
	e := &Error{Func: fn, Code: r, Name: r.Error()}
	var s *byte
	if d.cuGetErrorName(r, &s) == Success && s != nil {
		e.Name = dl.GoString(s)
	}
	s = nil
	if d.cuGetErrorString(r, &s) == Success && s != nil {
		e.Desc = dl.GoString(s)
	}
	return e
}

// Init initialises the driver (cuInit(0)); it must precede every other call
// except Version.
func (d *Driver) Init() error { return d.check("cuInit", d.cuInit(0)) }

// Version is the driver's CUDA version as major*1000 + minor*10 (12080 is 12.8).
func (d *Driver) Version() (int, error) {
	var v int32
	if err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount is the number of visible devices.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device returns the handle of the device with the given ordinal.
func (d *Driver) Device(ordinal int) (Device, error) {
	var dev Device
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return 0, fmt.Errorf("device %d: %w", ordinal, err)
	}
	return dev, nil
}

// DeviceName is the device's marketing name.
func (d *Driver) DeviceName(dev Device) (string, error) {
	var buf [256]byte
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&buf[0], int32(len(buf)), dev)); err != nil {
		return "", err
	}
	return dl.GoString(&buf[0]), nil
}

// Attribute reads one device attribute.
func (d *Driver) Attribute(dev Device, attr DeviceAttribute) (int, error) {
	var v int32
	if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, attr, dev)); err != nil {
		return 0, fmt.Errorf("attribute %d of device %d: %w", attr, dev, err)
	}
	return int(v), nil
}

// TotalMem is the device's memory in bytes.
func (d *Driver) TotalMem(dev Device) (uint64, error) {
	var n uint64
	if err := d.check("cuDeviceTotalMem", d.cuDeviceTotalMem(&n, dev)); err != nil {
		return 0, err
	}
	return n, nil
}

// Props reads the properties the backend plans kernels with.
func (d *Driver) Props(dev Device) (DeviceProps, error) {
	var p DeviceProps
	var err error
	if p.Name, err = d.DeviceName(dev); err != nil {
		return p, err
	}
	if p.TotalMem, err = d.TotalMem(dev); err != nil {
		return p, err
	}
	for _, a := range []struct {
		attr DeviceAttribute
		dst  *int
	}{
		{AttrComputeCapabilityMajor, &p.Major},
		{AttrComputeCapabilityMinor, &p.Minor},
		{AttrMultiprocessorCount, &p.SMs},
		{AttrMaxThreadsPerBlock, &p.MaxThreadsPerBlock},
		{AttrMaxThreadsPerMultiprocessor, &p.MaxThreadsPerSM},
		{AttrWarpSize, &p.WarpSize},
		{AttrMaxSharedMemoryPerBlock, &p.SharedPerBlock},
		{AttrMaxSharedMemoryPerBlockOptin, &p.SharedPerBlockOptin},
		{AttrMaxSharedMemoryPerMultiproc, &p.SharedPerSM},
		{AttrClockRate, &p.ClockKHz},
		{AttrMemoryClockRate, &p.MemClockKHz},
		{AttrGlobalMemoryBusWidth, &p.MemBusWidthBits},
		{AttrL2CacheSize, &p.L2Bytes},
	} {
		if *a.dst, err = d.Attribute(dev, a.attr); err != nil {
			return p, err
		}
	}
	return p, nil
}

// PrimaryCtxRetain retains the device's primary context (the one the CUDA
// runtime, cuBLASLt and NCCL also use) and returns it.
func (d *Driver) PrimaryCtxRetain(dev Device) (Context, error) {
	var c Context
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&c, dev)); err != nil {
		return 0, err
	}
	return c, nil
}

// PrimaryCtxRelease releases one retain of the device's primary context.
func (d *Driver) PrimaryCtxRelease(dev Device) error {
	return d.check("cuDevicePrimaryCtxRelease", d.cuDevicePrimaryCtxRelease(dev))
}

// SetCurrent makes ctx current on the calling OS thread (see the package
// documentation on threads).
func (d *Driver) SetCurrent(ctx Context) error {
	return d.check("cuCtxSetCurrent", d.cuCtxSetCurrent(ctx))
}

// Synchronize waits for all work in the current context.
func (d *Driver) Synchronize() error { return d.check("cuCtxSynchronize", d.cuCtxSynchronize()) }

// StreamCreate creates a stream in the current context.
func (d *Driver) StreamCreate(flags StreamFlags) (Stream, error) {
	var s Stream
	if err := d.check("cuStreamCreate", d.cuStreamCreate(&s, flags)); err != nil {
		return 0, err
	}
	return s, nil
}

// StreamDestroy destroys s once its work is done.
func (d *Driver) StreamDestroy(s Stream) error {
	return d.check("cuStreamDestroy", d.cuStreamDestroy(s))
}

// StreamSynchronize waits for the work queued on s.
func (d *Driver) StreamSynchronize(s Stream) error {
	return d.check("cuStreamSynchronize", d.cuStreamSynchronize(s))
}

// StreamWaitEvent makes later work on s wait for e.
func (d *Driver) StreamWaitEvent(s Stream, e Event) error {
	return d.check("cuStreamWaitEvent", d.cuStreamWaitEvent(s, e, 0))
}

// EventCreate creates an event in the current context.
func (d *Driver) EventCreate(flags EventFlags) (Event, error) {
	var e Event
	if err := d.check("cuEventCreate", d.cuEventCreate(&e, flags)); err != nil {
		return 0, err
	}
	return e, nil
}

// EventRecord records e on s.
func (d *Driver) EventRecord(e Event, s Stream) error {
	return d.check("cuEventRecord", d.cuEventRecord(e, s))
}

// EventSynchronize waits until e has completed.
func (d *Driver) EventSynchronize(e Event) error {
	return d.check("cuEventSynchronize", d.cuEventSynchronize(e))
}

// EventElapsed is the time between two completed events, in milliseconds.
func (d *Driver) EventElapsed(start, end Event) (float32, error) {
	var ms float32
	if err := d.check("cuEventElapsedTime", d.cuEventElapsedTime(&ms, start, end)); err != nil {
		return 0, err
	}
	return ms, nil
}

// EventDestroy destroys e.
func (d *Driver) EventDestroy(e Event) error {
	return d.check("cuEventDestroy", d.cuEventDestroy(e))
}

// MemAlloc allocates n bytes of device memory.
func (d *Driver) MemAlloc(n uint64) (DevicePtr, error) {
	var p DevicePtr
	if err := d.check("cuMemAlloc", d.cuMemAlloc(&p, uintptr(n))); err != nil {
		return 0, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	return p, nil
}

// MemFree frees device memory from MemAlloc.
func (d *Driver) MemFree(p DevicePtr) error { return d.check("cuMemFree", d.cuMemFree(p)) }

// MemAllocHost allocates n bytes of page-locked host memory, which the device
// can copy to and from asynchronously (used for offloaded tensors).
func (d *Driver) MemAllocHost(n uint64) (HostMem, error) {
	var p unsafe.Pointer
	if err := d.check("cuMemAllocHost", d.cuMemAllocHost(&p, uintptr(n))); err != nil {
		return HostMem{}, fmt.Errorf("allocating %d pinned bytes: %w", n, err)
	}
	return HostMem{ptr: p, size: n}, nil
}

// MemFreeHost frees memory from MemAllocHost (not a Slice of it).
func (d *Driver) MemFreeHost(h HostMem) error {
	return d.check("cuMemFreeHost", d.cuMemFreeHost(h.ptr))
}

// MemcpyHtoD copies src to device memory at dst and returns when done.
func (d *Driver) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	r := d.cuMemcpyHtoD(dst, unsafe.Pointer(unsafe.SliceData(src)), uintptr(len(src)))
	runtime.KeepAlive(src)
	return d.check("cuMemcpyHtoD", r)
}

// MemcpyDtoH copies len(dst) bytes from device memory at src into dst and
// returns when done.
func (d *Driver) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	r := d.cuMemcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), src, uintptr(len(dst)))
	runtime.KeepAlive(dst)
	return d.check("cuMemcpyDtoH", r)
}

// MemcpyDtoD copies n bytes between device buffers.
func (d *Driver) MemcpyDtoD(dst, src DevicePtr, n uint64) error {
	return d.check("cuMemcpyDtoD", d.cuMemcpyDtoD(dst, src, uintptr(n)))
}

// MemcpyHtoDAsync queues a copy of the pinned src to dst on s.
func (d *Driver) MemcpyHtoDAsync(dst DevicePtr, src HostMem, s Stream) error {
	if src.size == 0 {
		return nil
	}
	return d.check("cuMemcpyHtoDAsync", d.cuMemcpyHtoDAsync(dst, src.ptr, uintptr(src.size), s))
}

// MemcpyDtoHAsync queues a copy of dst.Size() bytes from src into the pinned
// dst on s.
func (d *Driver) MemcpyDtoHAsync(dst HostMem, src DevicePtr, s Stream) error {
	if dst.size == 0 {
		return nil
	}
	return d.check("cuMemcpyDtoHAsync", d.cuMemcpyDtoHAsync(dst.ptr, src, uintptr(dst.size), s))
}

// MemcpyDtoDAsync queues a device-to-device copy of n bytes on s (how
// virtual devices sharing one GPU exchange tensors).
func (d *Driver) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return d.check("cuMemcpyDtoDAsync", d.cuMemcpyDtoDAsync(dst, src, uintptr(n), s))
}

// MemsetD8 sets n bytes at dst to v.
func (d *Driver) MemsetD8(dst DevicePtr, v uint8, n uint64) error {
	return d.check("cuMemsetD8", d.cuMemsetD8(dst, v, uintptr(n)))
}

// MemsetD32Async queues setting n 32-bit words at dst (4-byte aligned) to v.
func (d *Driver) MemsetD32Async(dst DevicePtr, v uint32, n uint64, s Stream) error {
	return d.check("cuMemsetD32Async", d.cuMemsetD32Async(dst, v, uintptr(n), s))
}

// ModuleLoadData loads a module from a CUBIN (or PTX) image in memory.
func (d *Driver) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, errors.New("cuModuleLoadData: empty image")
	}
	var m Module
	r := d.cuModuleLoadData(&m, unsafe.Pointer(unsafe.SliceData(image)))
	runtime.KeepAlive(image)
	if err := d.check("cuModuleLoadData", r); err != nil {
		return 0, err
	}
	return m, nil
}

// ModuleGetFunction finds a kernel by its (extern "C") name.
func (d *Driver) ModuleGetFunction(m Module, name string) (Function, error) {
	var f Function
	cname := dl.CString(name)
	r := d.cuModuleGetFunction(&f, m, &cname[0])
	runtime.KeepAlive(cname)
	if err := d.check("cuModuleGetFunction", r); err != nil {
		return 0, fmt.Errorf("kernel %q: %w", name, err)
	}
	return f, nil
}

// ModuleUnload unloads m; its functions become invalid.
func (d *Driver) ModuleUnload(m Module) error {
	return d.check("cuModuleUnload", d.cuModuleUnload(m))
}

// LaunchKernel queues f on s. params holds one pointer per kernel parameter,
// each to a value of the parameter's exact C type (see Args); the driver
// copies the values before returning.
func (d *Driver) LaunchKernel(f Function, grid, block Dim3, sharedBytes uint32, s Stream, params []unsafe.Pointer) error {
	var pp *unsafe.Pointer
	if len(params) > 0 {
		pp = &params[0]
	}
	r := d.cuLaunchKernel(f, grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, sharedBytes, s, pp, nil)
	runtime.KeepAlive(params)
	return d.check("cuLaunchKernel", r)
}
