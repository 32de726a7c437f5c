package cpu

import "unsafe"

// sgemmGeneric is the portable micro-kernel: what non-amd64 builds run and
// the reference the assembly kernels are tested against. Sixteen scalar
// accumulators fit the register file of arm64 and most other targets.
var sgemmGeneric = &sgemmKernel{
	name: "generic-4x4", mr: 4, nr: 4, nc: 1024,
	unit: func(kc int, a *float32, s int, b *float32, ldb int, c *float32, ldc int, add bool) {
		sgemm4x4Go(kc, a, 1, s, b, ldb, c, ldc, add)
	},
	rows: func(kc int, a *float32, s int, b *float32, ldb int, c *float32, ldc int, add bool) {
		sgemm4x4Go(kc, a, s, 1, b, ldb, c, ldc, add)
	},
}

// sgemm4x4Go follows the micro-kernel contract in Go, with A(i, l) at
// a + i·rs + l·cs. Targets that fuse x*y + z (arm64, GOAMD64=v3) round it
// like the assembly kernels; others round the product first, so its last
// bits may differ from theirs.
func sgemm4x4Go(kc int, a *float32, rs, cs int, b *float32, ldb int, c *float32, ldc int, add bool) {
	ap := unsafe.Slice(a, 3*rs+(kc-1)*cs+1)
	bp := unsafe.Slice(b, (kc-1)*ldb+4)
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	for l := range kc {
		al := ap[l*cs:]
		bv := bp[l*ldb : l*ldb+4 : l*ldb+4]
		a0, a1, a2, a3 := al[0], al[rs], al[2*rs], al[3*rs]
		b0, b1, b2, b3 := bv[0], bv[1], bv[2], bv[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	cs4 := unsafe.Slice(c, 3*ldc+4)
	tile := [4][4]float32{
		{c00, c01, c02, c03},
		{c10, c11, c12, c13},
		{c20, c21, c22, c23},
		{c30, c31, c32, c33},
	}
	for i, row := range tile {
		ci := cs4[i*ldc : i*ldc+4 : i*ldc+4]
		if add {
			for j, v := range row {
				ci[j] += v
			}
		} else {
			copy(ci, row[:])
		}
	}
}
