package ir

import (
	"fmt"
	"math"
	"math/bits"
)

// Sizes reach the compiler from people (--set, --batch, a model's
// literals) and from .gir text, and Go's integer arithmetic wraps without
// a word: a product of dims past int64 comes out negative or, worse,
// small and positive, and a runtime then sizes an arena by it and indexes
// past its end. So sizes are checked where they enter — AddSource and
// InferType (every value a frontend or a pass records), ParseType (every
// type of a .gir file) and Verify — and code behind those boundaries may
// use NumElements and Bytes, which saturate rather than wrap should a
// check ever be missed.

// SizeError is a shape with a dim that is not allowed (negative, or zero
// where a size must be positive) or whose element count or byte size does
// not fit in an int64. Callers wrap it with the value it belongs to.
type SizeError struct {
	// Type is what was checked; its DType is Invalid when only a shape was.
	Type Type
	// Dim is the index of the dim that is not allowed, or -1 when the size
	// overflows.
	Dim int
	// Size is the true element count (or byte count, with Bytes) as a
	// float64, which has the range to print it.
	Size  float64
	Bytes bool
}

func (e *SizeError) Error() string {
	what := "shape " + e.Type.Shape.String()
	if e.Type.DType != Invalid {
		what = e.Type.String()
	}
	switch {
	case e.Dim >= 0 && e.Type.Shape[e.Dim] < 0:
		return fmt.Sprintf("dims cannot be negative, got %s (dim %d is %d)", what, e.Dim, e.Type.Shape[e.Dim])
	case e.Dim >= 0:
		// The wording predates SizeError; tests and users match on it.
		return fmt.Sprintf("dims must be positive, got %s", what)
	case e.Bytes:
		return fmt.Sprintf("%s takes %.3g bytes (%d per element), more than int64 holds", what, e.Size, e.Type.DType.Size())
	}
	return fmt.Sprintf("%s has %.3g elements, more than int64 holds", what, e.Size)
}

// Elements is the product of the dims (1 for a scalar, 0 when a dim is 0),
// or a *SizeError when a dim is negative or the product does not fit in
// an int64.
func (s Shape) Elements() (int64, error) {
	for i, d := range s {
		if d < 0 {
			return 0, &SizeError{Type: Type{Shape: s}, Dim: i}
		}
		if d == 0 {
			return 0, nil // whatever the other dims, nothing to overflow
		}
	}
	n := int64(1)
	for _, d := range s {
		var ok bool
		if n, ok = MulInt64(n, int64(d)); !ok {
			return 0, &SizeError{Type: Type{Shape: s}, Dim: -1, Size: floatProduct(s)}
		}
	}
	return n, nil
}

// ByteSize is the storage size of a value of type t, or a *SizeError when
// a dim is negative or the element count or byte size does not fit in an
// int64.
func (t Type) ByteSize() (int64, error) {
	n, err := t.Shape.Elements()
	if err != nil {
		if se, ok := err.(*SizeError); ok {
			se.Type.DType = t.DType
		}
		return 0, err
	}
	b, ok := MulInt64(n, t.DType.Size())
	if !ok {
		return 0, &SizeError{Type: t, Dim: -1, Size: float64(n) * float64(t.DType.Size()), Bytes: true}
	}
	return b, nil
}

// CheckType is the check at the boundaries where types enter the IR: a
// known dtype, every dim positive, and a byte size that fits in an int64.
// A bad dim or size is a *SizeError.
func CheckType(t Type) error {
	if t.DType == Invalid || t.DType.Size() == 0 {
		return fmt.Errorf("invalid dtype in %v", t)
	}
	return checkDims(t)
}

// checkDims is CheckType without the dtype: every dim positive and the
// byte size within int64.
func checkDims(t Type) error {
	for i, d := range t.Shape {
		if d <= 0 {
			return &SizeError{Type: t, Dim: i}
		}
	}
	_, err := t.ByteSize()
	return err
}

// MulInt64 is a·b for a, b ≥ 0, and whether it fits in an int64.
func MulInt64(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// AddInt64 is a+b for a, b ≥ 0, and whether it fits in an int64.
func AddInt64(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}

// SatMul is a·b for a, b ≥ 0, or math.MaxInt64 when that does not fit:
// for figures (costs, sort keys) where "too large" is the honest answer.
func SatMul(a, b int64) int64 {
	if n, ok := MulInt64(a, b); ok {
		return n
	}
	return math.MaxInt64
}

// SatAdd is a+b for a, b ≥ 0, or math.MaxInt64 when that does not fit.
func SatAdd(a, b int64) int64 {
	if n, ok := AddInt64(a, b); ok {
		return n
	}
	return math.MaxInt64
}

func floatProduct(s Shape) float64 {
	f := 1.0
	for _, d := range s {
		f *= float64(d)
	}
	return f
}
