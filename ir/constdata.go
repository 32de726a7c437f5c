package ir

import (
	"fmt"
	"strconv"
	"strings"
)

// ConstData is the contents of a const source: its data attribute (a
// table the model computed, space-separated numbers in row-major order,
// exactly one per element), or nil when it is filled with its value.
func ConstData(v *Value) ([]float64, error) {
	text, ok := v.Attrs["data"].(string)
	if !ok {
		return nil, nil
	}
	if _, filled := v.Attrs["value"]; filled {
		return nil, fmt.Errorf("const %q has both a value and data", v.Name())
	}
	n, err := v.Type.Shape.Elements()
	if err != nil {
		return nil, fmt.Errorf("const %q: %w", v.Name(), err)
	}
	fields := strings.Fields(text)
	if int64(len(fields)) != n {
		return nil, fmt.Errorf("const %q %v holds %d numbers, want %d", v.Name(), v.Type, len(fields), n)
	}
	out := make([]float64, len(fields))
	for i, f := range fields {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("const %q: element %d: %q is not a number", v.Name(), i, f)
		}
		out[i] = x
	}
	return out, nil
}

// FormatConstData writes numbers as a const's data attribute: the shortest
// text that reads back to the same float64.
func FormatConstData(x []float64) string {
	var b strings.Builder
	for i, v := range x {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	}
	return b.String()
}
