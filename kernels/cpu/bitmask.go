package cpu

import "unsafe"

// MaskRowBytes is the number of bytes one row of n elements takes in a
// packed 1-bit mask: ⌈n/8⌉. Rows start on a byte, so a row's last byte
// may hold fewer than 8 elements; its unused high bits are 0.
func MaskRowBytes(n int) int { return (n + 7) / 8 }

// ReluMask packs the signs of x, a rows×n row-major matrix, into mask:
// bit j of byte k of row r is set when x[r·n+8k+j] > 0. This is all
// ReLU's gradient needs of x (Gist's binarization), in 1/32 of an fp32
// tensor's bytes. NaN is not > 0, so its bit is clear, exactly as
// [ReluGrad] treats a NaN input. mask must hold rows·⌈n/8⌉ bytes.
func ReluMask[T Float](mask []uint8, x []T, rows, n int) {
	checkNonNeg("ReluMask", rows, n)
	w := MaskRowBytes(n)
	checkLen("ReluMask", "x", len(x), rows*n)
	checkLen("ReluMask", "mask", len(mask), rows*w)
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xs, ms := x[r*n:(r+1)*n], mask[r*w:(r+1)*w]
			for k := range ms {
				var b uint8
				for j, v := range xs[8*k : min(8*k+8, n)] {
					// A select, not a branch: signs of activations are
					// close to coin flips, which a branch predictor loses.
					var bit uint8
					if v > 0 {
						bit = 1
					}
					b |= bit << j
				}
				ms[k] = b
			}
		}
	})
}

// ReluGradMask sets dx[i] = dy[i] where mask has element i's bit set and
// 0 elsewhere, for rows×n matrices dx and dy and a mask packed by
// [ReluMask]. With the mask of x it gives exactly [ReluGrad](dx, x, dy),
// bit for bit. dx may alias dy.
func ReluGradMask[T Float](dx []T, mask []uint8, dy []T, rows, n int) {
	checkNonNeg("ReluGradMask", rows, n)
	w := MaskRowBytes(n)
	checkLen("ReluGradMask", "dx", len(dx), rows*n)
	checkLen("ReluGradMask", "dy", len(dy), rows*n)
	checkLen("ReluGradMask", "mask", len(mask), rows*w)
	if rows*n == 0 {
		return
	}
	// The select is done on the bits, so it is branch-free (mask bits are
	// close to coin flips) and copies dy exactly, NaN payloads included; a
	// cleared bit gives +0, as ReluGrad does.
	var zero T
	if unsafe.Sizeof(zero) == 4 {
		gradMaskBits(bitsOf[T, uint32](dx), mask, bitsOf[T, uint32](dy), rows, n, w)
	} else {
		gradMaskBits(bitsOf[T, uint64](dx), mask, bitsOf[T, uint64](dy), rows, n, w)
	}
}

// bitsOf views a float slice as its IEEE bit patterns (U of T's size).
func bitsOf[T Float, U uint32 | uint64](x []T) []U {
	return unsafe.Slice((*U)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

func gradMaskBits[U uint32 | uint64](dx []U, mask []uint8, dy []U, rows, n, w int) {
	ParallelFor(rows, rowGrain(n), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o, g, ms := dx[r*n:(r+1)*n], dy[r*n:(r+1)*n], mask[r*w:(r+1)*w]
			for i := range o {
				keep := U(ms[i>>3] >> (i & 7) & 1)
				o[i] = g[i] & -keep
			}
		}
	})
}
