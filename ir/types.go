package ir

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DType is an element type.
type DType uint8

// The element types. F64 exists for float64 gradient checks and reference
// runs; models train in F32 or in the 16-bit formats. U8 holds packed bits
// (a ReLU mask keeps 8 elements' signs in one byte); it is a storage type,
// not a number type, so arithmetic ops refuse it.
const (
	Invalid DType = iota
	F32
	F16
	BF16
	F64
	I32
	I64
	Bool
	U8
)

var dtypeNames = [...]string{Invalid: "invalid", F32: "f32", F16: "f16", BF16: "bf16", F64: "f64", I32: "i32", I64: "i64", Bool: "bool", U8: "u8"}
var dtypeSizes = [...]int64{Invalid: 0, F32: 4, F16: 2, BF16: 2, F64: 8, I32: 4, I64: 8, Bool: 1, U8: 1}

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return "dtype(" + strconv.Itoa(int(d)) + ")"
}

// Size is the number of bytes one element occupies.
func (d DType) Size() int64 {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 || d == F64 }

// IsInt reports whether d is an integer type.
func (d DType) IsInt() bool { return d == I32 || d == I64 }

// Is16 reports whether d is one of the 16-bit float formats, which both
// backends emulate in float32.
func (d DType) Is16() bool { return d == F16 || d == BF16 }

// ParseDType reads a dtype name as printed by DType.String.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if n == s && DType(i) != Invalid {
			return DType(i), nil
		}
	}
	return Invalid, fmt.Errorf("unknown dtype %q (want f32, f16, bf16, f64, i32, i64 or bool)", s)
}

// Shape is a static shape; a scalar has no dims.
type Shape []int

// NumElements is the product of the dims (1 for a scalar), for shapes
// already checked (see size.go). A shape that is not valid — a negative
// dim, a product past int64 — counts math.MaxInt64 rather than wrapping,
// so a missed check shows up as "too large" and never as a small or
// negative size something then allocates. Elements says what is wrong.
func (s Shape) NumElements() int64 {
	n, err := s.Elements()
	if err != nil {
		return math.MaxInt64
	}
	return n
}

// Equal reports whether two shapes have the same dims.
func (s Shape) Equal(t Shape) bool {
	if len(s) != len(t) {
		return false
	}
	for i := range s {
		if s[i] != t[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy that can be changed without touching s.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

func (s Shape) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d))
	}
	b.WriteByte(']')
	return b.String()
}

// Type is a value's element type and static shape.
type Type struct {
	DType DType
	Shape Shape
}

// T builds a Type.
func T(d DType, dims ...int) Type { return Type{DType: d, Shape: Shape(dims)} }

// Rank is the number of dims.
func (t Type) Rank() int { return len(t.Shape) }

// Bytes is the storage size of a value of this type, saturating at
// math.MaxInt64 like NumElements; ByteSize says why a size is invalid.
func (t Type) Bytes() int64 {
	n, err := t.ByteSize()
	if err != nil {
		return math.MaxInt64
	}
	return n
}

// Equal reports whether both dtype and shape agree.
func (t Type) Equal(u Type) bool { return t.DType == u.DType && t.Shape.Equal(u.Shape) }

func (t Type) String() string { return t.DType.String() + t.Shape.String() }

// ParseType reads a type as printed by Type.String, e.g. "f32[4,128]".
func ParseType(s string) (Type, error) {
	open := strings.IndexByte(s, '[')
	if open < 0 || !strings.HasSuffix(s, "]") {
		return Type{}, fmt.Errorf("bad type %q: want dtype[dims], e.g. f32[4,128]", s)
	}
	d, err := ParseDType(s[:open])
	if err != nil {
		return Type{}, err
	}
	body := s[open+1 : len(s)-1]
	t := Type{DType: d, Shape: Shape{}}
	if body == "" {
		return t, nil
	}
	for _, f := range strings.Split(body, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return Type{}, fmt.Errorf("bad dim %q in type %q", f, s)
		}
		t.Shape = append(t.Shape, n)
	}
	// A zero dim is the verifier's to name (it knows the value); a
	// negative one or a size past int64 would be misread by everything
	// before it, so the text is refused here.
	if _, err := t.ByteSize(); err != nil {
		return Type{}, err
	}
	return t, nil
}
