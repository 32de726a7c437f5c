package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// refMatMul is the textbook triple loop over the stored layouts.
func refMatMul(a, b []float64, batch, m, n, k int, transA, transB, bShared bool) []float64 {
	c := make([]float64, batch*m*n)
	for p := range batch {
		ab := a[p*m*k:]
		bb := b
		if !bShared {
			bb = b[p*k*n:]
		}
		for i := range m {
			for j := range n {
				s := 0.0
				for l := range k {
					var x, y float64
					if transA {
						x = ab[l*m+i]
					} else {
						x = ab[i*k+l]
					}
					if transB {
						y = bb[j*k+l]
					} else {
						y = bb[l*n+j]
					}
					s += x * y
				}
				c[p*m*n+i*n+j] = s
			}
		}
	}
	return c
}

type mmCase struct {
	batch, m, n, k          int
	transA, transB, bShared bool
}

func mmCases() []mmCase {
	var cs []mmCase
	shapes := [][4]int{
		{1, 1, 1, 1}, {1, 3, 5, 7}, {1, 1, 9, 4}, {1, 8, 1, 6}, {1, 5, 4, 1},
		{3, 6, 5, 4}, {2, 17, 13, 11},
		// Ragged edges for every kernel's tile, more than one k block,
		// more than one nc block of the portable kernel.
		{1, 70, 45, 300}, {2, 40, 33, 64}, {1, 33, 1030, 20},
		{1, 4, 3, 0}, {0, 4, 3, 2}, {2, 0, 3, 2},
	}
	for _, s := range shapes {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, sh := range []bool{false, true} {
					cs = append(cs, mmCase{s[0], s[1], s[2], s[3], ta, tb, sh})
				}
			}
		}
	}
	return cs
}

func testMatMul[T Float](t *testing.T) {
	r := newRand(1)
	for _, c := range mmCases() {
		nb := c.batch
		if c.bShared {
			nb = 1
		}
		a := randVec[T](r, c.batch*c.m*c.k, -1, 1)
		b := randVec[T](r, nb*c.k*c.n, -1, 1)
		got := randVec[T](r, c.batch*c.m*c.n, -1, 1) // must be overwritten
		MatMul(got, a, b, c.batch, c.m, c.n, c.k, c.transA, c.transB, c.bShared)
		want := refMatMul(to64(a), to64(b), c.batch, c.m, c.n, c.k, c.transA, c.transB, c.bShared)
		// Dot products of length k lose about √k ulps.
		requireClose(t, want, got, tolOf[T]()*math.Sqrt(float64(c.k)+1), fmt.Sprintf("%+v", c))
	}
}

func TestMatMul(t *testing.T) { both(t, testMatMul[float32], testMatMul[float64]) }

// TestMatMulKernelsAgree checks the packed GEMM against gonum's Sgemm, the
// benchmarks' baseline, as an independent fp32 implementation.
func TestMatMulKernelsAgree(t *testing.T) {
	r := newRand(2)
	for _, c := range mmCases() {
		if c.batch != 1 || c.m*c.n*c.k == 0 {
			continue
		}
		lda, ldb := c.k, c.n
		if c.transA {
			lda = c.m
		}
		if c.transB {
			ldb = c.k
		}
		a := randVec[float32](r, c.m*c.k, -1, 1)
		b := randVec[float32](r, c.k*c.n, -1, 1)
		x := make([]float32, c.m*c.n)
		y := make([]float32, c.m*c.n)
		gemm32Gonum(c.transA, c.transB, c.m, c.n, c.k, a, lda, b, ldb, x, c.n)
		gemm32(c.transA, c.transB, c.m, c.n, c.k, a, lda, b, ldb, y, c.n)
		requireClose(t, to64(x), y, 1e-5*math.Sqrt(float64(c.k)), fmt.Sprintf("%+v", c))
	}
}

type myFloat32 float32

func TestMatMulNamedType(t *testing.T) {
	a := []myFloat32{1, 2, 3, 4, 5, 6} // 2×3
	b := []myFloat32{1, 0, 0, 1, 1, 1} // 3×2
	c := make([]myFloat32, 4)
	MatMul(c, a, b, 1, 2, 2, 3, false, false, false)
	require.Equal(t, []myFloat32{4, 5, 10, 11}, c)
}

func TestMatMulBadLength(t *testing.T) {
	require.Panics(t, func() {
		MatMul(make([]float32, 3), make([]float32, 4), make([]float32, 4), 1, 2, 2, 2, false, false, false)
	})
}
