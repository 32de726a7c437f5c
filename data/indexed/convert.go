package indexed

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// nativeLE says whether this machine stores integers little-endian, as the
// files do; then aligned file bytes can be used as token arrays in place.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// token is every integer type a dataset stores.
type token interface {
	~uint8 | ~int8 | ~uint16 | ~int16 | ~int32 | ~int64
}

// view is b as a []T without copying, when the machine is little-endian
// and b is aligned for T; ok is false otherwise and the caller decodes.
func view[T token](b []byte) (s []T, ok bool) {
	var z T
	size := int(unsafe.Sizeof(z))
	if len(b) == 0 {
		return nil, true
	}
	if size > 1 && (!nativeLE || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(size) != 0) {
		return nil, false
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/size), true
}

func unsafeBytes(w []uint64) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), 8*len(w))
}

// convert copies src into dst, returning the index of the first value that
// is not a valid id (negative or above 2^31-1), or -1.
func convert[T token](dst []int32, src []T) int {
	dst = dst[:len(src)]
	for i, v := range src {
		if v < 0 || int64(v) > math.MaxInt32 {
			return i
		}
		dst[i] = int32(v)
	}
	return -1
}

// decode fills dst from b, len(dst) tokens of type dt, and returns the
// index of the first invalid id, or -1.
func decode(dst []int32, b []byte, dt DType) int {
	switch dt {
	case Uint8:
		s, _ := view[uint8](b)
		return convert(dst, s)
	case Int8:
		s, _ := view[int8](b)
		return convert(dst, s)
	case Uint16:
		if s, ok := view[uint16](b); ok {
			return convert(dst, s)
		}
	case Int16:
		if s, ok := view[int16](b); ok {
			return convert(dst, s)
		}
	case Int32:
		if s, ok := view[int32](b); ok {
			return convert(dst, s)
		}
	case Int64:
		if s, ok := view[int64](b); ok {
			return convert(dst, s)
		}
	}
	for i := range dst {
		v := tokenAt(b, i, dt)
		if v < 0 || v > math.MaxInt32 {
			return i
		}
		dst[i] = int32(v)
	}
	return -1
}

// tokenAt is token i of b, stored as dt.
func tokenAt(b []byte, i int, dt DType) int64 {
	switch dt {
	case Uint8:
		return int64(b[i])
	case Int8:
		return int64(int8(b[i]))
	case Uint16:
		return int64(binary.LittleEndian.Uint16(b[2*i:]))
	case Int16:
		return int64(int16(binary.LittleEndian.Uint16(b[2*i:])))
	case Int32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case Int64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return 0
}

// maxOr is the largest value of s and the bitwise OR of all of them
// (zeros when s is empty): for a signed type the OR is negative exactly
// when some value is, which costs less than tracking the minimum. Four
// independent accumulators let the loop run without waiting on each
// comparison, which is what makes a full-dataset scan memory-bound.
func maxOr[T token](s []T) (hi, or T) {
	if len(s) == 0 {
		return 0, 0
	}
	h0, h1, h2, h3 := s[0], s[0], s[0], s[0]
	var o0, o1, o2, o3 T
	i := 0
	for ; i+4 <= len(s); i += 4 {
		a, b, c, d := s[i], s[i+1], s[i+2], s[i+3]
		h0, h1, h2, h3 = max(h0, a), max(h1, b), max(h2, c), max(h3, d)
		o0, o1, o2, o3 = o0|a, o1|b, o2|c, o3|d
	}
	for ; i < len(s); i++ {
		h0, o0 = max(h0, s[i]), o0|s[i]
	}
	return max(h0, h1, h2, h3), o0 | o1 | o2 | o3
}

func minMaxOf[T token](b []byte) (lo, hi int64, ok bool) {
	s, ok := view[T](b)
	if !ok {
		return 0, 0, false
	}
	h, or := maxOr(s)
	if or < 0 {
		lo = -1 // some value is negative; which one, badToken finds
	}
	return lo, int64(h), true
}

// bytesMinMax is the largest token of b, stored as dt, and a lo that is
// negative when some token is (0 otherwise; not the minimum itself).
func bytesMinMax(b []byte, dt DType) (lo, hi int64) {
	var ok bool
	switch dt {
	case Uint8:
		lo, hi, ok = minMaxOf[uint8](b)
	case Int8:
		lo, hi, ok = minMaxOf[int8](b)
	case Uint16:
		lo, hi, ok = minMaxOf[uint16](b)
	case Int16:
		lo, hi, ok = minMaxOf[int16](b)
	case Int32:
		lo, hi, ok = minMaxOf[int32](b)
	case Int64:
		lo, hi, ok = minMaxOf[int64](b)
	}
	if ok {
		return lo, hi
	}
	n := len(b) / dt.Size()
	if n == 0 {
		return 0, 0
	}
	lo, hi = 0, tokenAt(b, 0, dt)
	for i := range n {
		v := tokenAt(b, i, dt)
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// encodeTokens writes t, already checked to fit, into b as dt
// little-endian.
func encodeTokens(b []byte, t []int32, dt DType) {
	switch dt {
	case Uint8, Int8:
		for i, v := range t {
			b[i] = byte(v)
		}
	case Uint16, Int16:
		if s, ok := view[uint16](b); ok {
			s = s[:len(t)]
			for i, v := range t {
				s[i] = uint16(v)
			}
			return
		}
		for i, v := range t {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
		}
	case Int32:
		if s, ok := view[int32](b); ok {
			copy(s, t)
			return
		}
		for i, v := range t {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
	case Int64:
		for i, v := range t {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(v)))
		}
	}
}
