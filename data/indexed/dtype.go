package indexed

import (
	"fmt"
	"math"
)

// DType is the element type of a dataset's tokens, numbered as Megatron-LM's
// DType enum numbers it in the .idx header, so a code read from a file is a
// DType as is.
type DType uint8

// The codes of Megatron-LM's DType enum. Code 7 is float32 in current
// Megatron and was np.double (float64) in older versions; either way it is
// a float and is refused.
const (
	Uint8   DType = 1
	Int8    DType = 2
	Int16   DType = 3
	Int32   DType = 4
	Int64   DType = 5
	Float64 DType = 6
	Float32 DType = 7
	Uint16  DType = 8
)

var dtypeNames = [...]string{
	Uint8: "uint8", Int8: "int8", Int16: "int16", Int32: "int32",
	Int64: "int64", Float64: "float64", Float32: "float32", Uint16: "uint16",
}

// String is NumPy's name of the type, as Megatron's enum spells it, so logs
// and metadata read the same in both tools.
func (d DType) String() string {
	if d.known() {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType is the inverse of String, for metadata files and flags.
func ParseDType(s string) (DType, error) {
	for code, name := range dtypeNames {
		if name != "" && name == s {
			return DType(code), nil
		}
	}
	return 0, fmt.Errorf("dtype %q: want one of uint8, int8, int16, int32, int64, uint16: %w", s, ErrDType)
}

// MarshalText writes the type by name, so JSON metadata stays readable.
func (d DType) MarshalText() ([]byte, error) {
	if !d.known() {
		return nil, fmt.Errorf("dtype code %d: %w", uint8(d), ErrDType)
	}
	return []byte(d.String()), nil
}

// UnmarshalText reads a type written by MarshalText.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

func (d DType) known() bool { return d >= Uint8 && d <= Uint16 }

// Size is the number of bytes one token takes in PREFIX.bin (0 for an
// unknown code), which is what turns sequence lengths into byte offsets.
func (d DType) Size() int {
	switch d {
	case Uint8, Int8:
		return 1
	case Int16, Uint16:
		return 2
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 0
}

// Integer says whether the type can hold token ids; only these are read
// and written.
func (d DType) Integer() bool {
	switch d {
	case Uint8, Int8, Int16, Int32, Int64, Uint16:
		return true
	}
	return false
}

// Range is the smallest and largest token id the type can store that is
// also a valid id here (ids are int32 and never negative), so a writer can
// refuse a token before it is silently truncated.
func (d DType) Range() (lo, hi int32) {
	switch d {
	case Uint8:
		return 0, math.MaxUint8
	case Int8:
		return 0, math.MaxInt8
	case Int16:
		return 0, math.MaxInt16
	case Uint16:
		return 0, math.MaxUint16
	case Int32, Int64:
		return 0, math.MaxInt32
	}
	return 0, -1
}

// optimalThreshold is the vocabulary size from which Megatron's
// DType.optimal_dtype switches from uint16 to int32 (cardinality < 65500
// gives uint16). It keeps a margin below 65536 that we keep as well, so that
// both tools pick the same type for the same tokenizer.
const optimalThreshold = 65500

// DTypeFor is the type Megatron-LM's preprocess_data.py would store a
// vocabulary of vocabSize tokens in (DType.optimal_dtype): uint16 below
// 65500 tokens, int32 from there on (and for a size ≤ 0, which Megatron
// treats as unknown). Picking the same type keeps datasets made by either
// tool byte-identical.
func DTypeFor(vocabSize int) DType {
	if vocabSize > 0 && vocabSize < optimalThreshold {
		return Uint16
	}
	return Int32
}
