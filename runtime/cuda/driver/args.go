package driver

import "unsafe"

// Args builds the parameter list of a kernel launch. cuLaunchKernel takes an
// array of pointers, one per parameter, each to a value laid out as the
// kernel's C parameter type; Args keeps each value in its own allocation of
// exactly that width so an int stays 4 bytes and a pointer 8.
//
//	var a driver.Args
//	a.Ptr(y).Ptr(x).Float32(alpha).Int32(n)
//	err := drv.LaunchKernel(f, grid, block, 0, stream, a.Pointers())
type Args struct {
	ptrs []unsafe.Pointer
}

func add[T any](a *Args, v T) *Args {
	p := new(T)
	*p = v
	a.ptrs = append(a.ptrs, unsafe.Pointer(p))
	return a
}

// Ptr appends a device pointer (a T* parameter).
func (a *Args) Ptr(p DevicePtr) *Args { return add(a, p) }

// Int32 appends an int parameter.
func (a *Args) Int32(v int32) *Args { return add(a, v) }

// Uint32 appends an unsigned int parameter.
func (a *Args) Uint32(v uint32) *Args { return add(a, v) }

// Int64 appends a long long (or int64_t) parameter.
func (a *Args) Int64(v int64) *Args { return add(a, v) }

// Uint64 appends an unsigned long long (or size_t) parameter.
func (a *Args) Uint64(v uint64) *Args { return add(a, v) }

// Float32 appends a float parameter.
func (a *Args) Float32(v float32) *Args { return add(a, v) }

// Float64 appends a double parameter.
func (a *Args) Float64(v float64) *Args { return add(a, v) }

// Len is the number of parameters.
func (a *Args) Len() int { return len(a.ptrs) }

// Pointers is the parameter array for LaunchKernel.
func (a *Args) Pointers() []unsafe.Pointer { return a.ptrs }
