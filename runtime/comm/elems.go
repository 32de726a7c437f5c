package comm

import (
	"fmt"
	"unsafe"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime"
)

// Float is an element type collectives can sum.
type Float interface{ float32 | float64 }

// Elem is an element type collectives can move.
type Elem interface {
	float32 | float64 | int32 | int64 | uint8
}

// DTypeOf is the IR dtype whose elements are T's.
func DTypeOf[T Elem]() ir.DType {
	var z T
	switch any(z).(type) {
	case float32:
		return ir.F32
	case float64:
		return ir.F64
	case int32:
		return ir.I32
	case int64:
		return ir.I64
	}
	return ir.U8
}

// Bytes is x's memory as bytes, shared, not copied.
func Bytes[T Elem](x []T) []byte {
	if len(x) == 0 {
		return []byte{}
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(z)))
}

// view is b's memory as elements of T; len(b) must be a multiple of T's
// size and b aligned for T (arena views and Go allocations are). T may be
// uint16, a 16-bit float's pattern.
func view[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// AllReduce is Comm.AllReduce on typed buffers.
func AllReduce[T Float](c runtime.Comm, g runtime.Group, rank int, bufs ...[]T) error {
	raw := make([][]byte, len(bufs))
	for i, b := range bufs {
		raw[i] = Bytes(b)
	}
	return c.AllReduce(g, rank, DTypeOf[T](), raw...)
}

// ReduceScatter is Comm.ReduceScatter on typed buffers.
func ReduceScatter[T Float](c runtime.Comm, g runtime.Group, rank int, in, out []T) error {
	return c.ReduceScatter(g, rank, DTypeOf[T](), Bytes(in), Bytes(out))
}

// AllGather is Comm.AllGather on typed buffers.
func AllGather[T Elem](c runtime.Comm, g runtime.Group, rank int, in, out []T) error {
	return c.AllGather(g, rank, DTypeOf[T](), Bytes(in), Bytes(out))
}

// AllToAll is Comm.AllToAll on typed buffers.
func AllToAll[T Elem](c runtime.Comm, g runtime.Group, rank int, in, out []T) error {
	return c.AllToAll(g, rank, DTypeOf[T](), Bytes(in), Bytes(out))
}

// Broadcast is Comm.Broadcast on a typed buffer.
func Broadcast[T Elem](c runtime.Comm, g runtime.Group, rank, root int, buf []T) error {
	return c.Broadcast(g, rank, root, DTypeOf[T](), Bytes(buf))
}

// Send is Comm.Send of a typed buffer.
func Send[T Elem](c runtime.Comm, from, to, tag int, buf []T) error {
	return c.Send(from, to, tag, DTypeOf[T](), Bytes(buf))
}

// Recv is Comm.Recv into a typed buffer.
func Recv[T Elem](c runtime.Comm, from, to, tag int, buf []T) error {
	return c.Recv(from, to, tag, DTypeOf[T](), Bytes(buf))
}

// checkSummable reports a dtype the transports cannot add.
func checkSummable(dt ir.DType) error {
	switch dt {
	case ir.F32, ir.F64, ir.BF16, ir.F16:
		return nil
	}
	return fmt.Errorf("%w: cannot sum %v elements (f32, f64, bf16 and f16 only)", runtime.ErrArgs, dt)
}

// checkElems reports a buffer that is not whole elements of dt.
func checkElems(dt ir.DType, what string, n int) error {
	size := int(dt.Size())
	if size <= 0 {
		return fmt.Errorf("%w: %v has no element size", runtime.ErrArgs, dt)
	}
	if n%size != 0 {
		return fmt.Errorf("%w: %s is %d bytes, not a whole number of %d-byte %v elements", runtime.ErrArgs, what, n, size, dt)
	}
	return nil
}

// accumulate adds src into dst (or, for first, copies it), elementwise in
// dt: repeated calls build ((x0 + x1) + x2) + … with one rounding per add,
// the order every transport sums in.
func accumulate(dt ir.DType, dst, src []byte, first bool) {
	src = src[:len(dst)]
	if first {
		copy(dst, src)
		return
	}
	switch dt {
	case ir.F32:
		addTo(view[float32](dst), view[float32](src))
	case ir.F64:
		addTo(view[float64](dst), view[float64](src))
	case ir.BF16, ir.F16:
		add16(view[uint16](dst), view[uint16](src), dt == ir.BF16)
	}
}

// add16 adds src into dst, bf16 or fp16 patterns: each add is made in
// float32 and rounded to the format, one rounding per add in the element
// type, as a 16-bit NCCL reduction rounds each step. (Where float32 must
// round a sum of two 16-bit values, the smaller is far below half the
// format's last place, so the second rounding gives the correctly
// rounded 16-bit sum.)
func add16(dst, src []uint16, bf16 bool) {
	src = src[:len(dst)]
	if bf16 {
		for i, s := range src {
			dst[i] = kcpu.BF16FromF32(kcpu.F32FromBF16(dst[i]) + kcpu.F32FromBF16(s))
		}
		return
	}
	for i, s := range src {
		dst[i] = kcpu.F16FromF32(kcpu.F32FromF16(dst[i]) + kcpu.F32FromF16(s))
	}
}

// addTo adds src into dst elementwise. The loop is unrolled by 8 on
// fixed-size windows, which drops the bounds checks and the loop overhead:
// about three times the plain loop's speed. Every element still gets
// exactly one add of the same two operands, so the bits are the plain
// loop's.
func addTo[T Float](dst, src []T) {
	src = src[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d, s := (*[8]T)(dst[i:i+8]), (*[8]T)(src[i:i+8])
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// overlap reports whether a and b share any byte.
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// same reports whether a and b are the very same bytes.
func same(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}
