package runtime

import "gcompile/ir"

// block copies out the sub-tensor of x (shape s) at corner lo of the given size.
func block[T any](x []T, s ir.Shape, lo, size []int) []T {
	out := make([]T, ir.Shape(size).NumElements())
	if len(s) == 0 {
		copy(out, x)
		return out
	}
	idx := make([]int, len(s))
	for i := range out {
		off := 0
		for d := range s {
			off = off*s[d] + lo[d] + idx[d]
		}
		out[i] = x[off]
		for d := len(s) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < size[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out
}

// unblock writes a device's block back into the whole tensor.
func unblock[T any](x []T, s ir.Shape, lo, size []int, blk []T) {
	if len(s) == 0 {
		copy(x, blk)
		return
	}
	idx := make([]int, len(s))
	for i := range blk {
		off := 0
		for d := range s {
			off = off*s[d] + lo[d] + idx[d]
		}
		x[off] = blk[i]
		for d := len(s) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < size[d] {
				break
			}
			idx[d] = 0
		}
	}
}
