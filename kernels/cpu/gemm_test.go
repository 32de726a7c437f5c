package cpu

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// gemmOperands is one fp32 GEMM problem with its stored operands.
type gemmOperands struct {
	transA, transB bool
	m, n, k        int
	a, b           []float32
	lda, ldb       int
}

// newGemmOperands fills op(a) and op(b) with values in [-1, 1) stored with
// leading dimensions padA and padB wider than needed. The padding holds
// NaN, so a packer that reads outside the matrix poisons the result.
func newGemmOperands(seed uint64, transA, transB bool, m, n, k, padA, padB int) gemmOperands {
	r := newRand(seed)
	fill := func(rows, cols, pad int) ([]float32, int) {
		ld := cols + pad
		x := make([]float32, max(0, (rows-1)*ld+cols))
		for i := range x {
			if i%ld < cols {
				x[i] = float32(2*r.Float64() - 1)
			} else {
				x[i] = float32(math.NaN())
			}
		}
		return x, ld
	}
	g := gemmOperands{transA: transA, transB: transB, m: m, n: n, k: k}
	if transA {
		g.a, g.lda = fill(k, m, padA)
	} else {
		g.a, g.lda = fill(m, k, padA)
	}
	if transB {
		g.b, g.ldb = fill(n, k, padB)
	} else {
		g.b, g.ldb = fill(k, n, padB)
	}
	return g
}

// reference returns op(a)·op(b) in float64 and, per element, Σ|x·y|, the
// scale of the rounding error any summation order can make.
func (g gemmOperands) reference() (want, scale []float64) {
	// Rows of op(a) and columns of op(b), contiguous.
	x := make([]float64, g.m*g.k)
	y := make([]float64, g.n*g.k)
	for l := range g.k {
		for i := range g.m {
			if g.transA {
				x[i*g.k+l] = float64(g.a[l*g.lda+i])
			} else {
				x[i*g.k+l] = float64(g.a[i*g.lda+l])
			}
		}
		for j := range g.n {
			if g.transB {
				y[j*g.k+l] = float64(g.b[j*g.ldb+l])
			} else {
				y[j*g.k+l] = float64(g.b[l*g.ldb+j])
			}
		}
	}
	want = make([]float64, g.m*g.n)
	scale = make([]float64, g.m*g.n)
	for i := range g.m {
		xi := x[i*g.k : (i+1)*g.k]
		for j := range g.n {
			yj := y[j*g.k : (j+1)*g.k]
			var s, t float64
			for l, v := range xi {
				p := v * yj[l]
				s += p
				t += math.Abs(p)
			}
			want[i*g.n+j], scale[i*g.n+j] = s, t
		}
	}
	return want, scale
}

// guardBits marks the floats of c that a GEMM must not write.
const guardBits = 0x7fc0dead

// guardedC returns a buffer holding an m×n matrix with leading dimension
// ldc, guard floats before and after, every float set to the guard value,
// and the slice a GEMM gets: exactly the floats from c[0][0] to
// c[m-1][n-1], so a kernel writing past it stays inside the buffer.
func guardedC(m, n, ldc int) (buf, c []float32) {
	const guard = 64
	size := (m-1)*ldc + n
	buf = make([]float32, guard+size+guard)
	for i := range buf {
		buf[i] = math.Float32frombits(guardBits)
	}
	return buf, buf[guard : guard+size]
}

// checkGuarded checks every element of c against the reference within
// k·ε·Σ|x·y| (a bound on the error of any summation order), and that no
// float outside the matrix changed.
func checkGuarded(t *testing.T, g gemmOperands, buf []float32, ldc int, want, scale []float64, what string) {
	t.Helper()
	const guard = 64
	eps := math.Pow(2, -24)
	for p, v := range buf {
		i, j := (p-guard)/ldc, (p-guard)%ldc
		inside := p >= guard && i < g.m && j < g.n
		if !inside {
			if math.Float32bits(v) != guardBits {
				require.Failf(t, "write outside c", "%s: float %d (row %d, col %d of ldc %d) changed to %v", what, p-guard, i, j, ldc, v)
			}
			continue
		}
		w, s := want[i*g.n+j], scale[i*g.n+j]
		if tol := float64(g.k+2) * eps * s; !(math.Abs(float64(v)-w) <= tol) {
			require.Failf(t, "mismatch", "%s: c[%d][%d] = %v, want %v (tol %g)", what, i, j, v, w, tol)
		}
	}
}

// gemmSizes cross the tile edges of every kernel (mr, nr ∈ {4, 6, 12, 16,
// 32}) from both sides.
var gemmSizes = []int{1, 2, 3, 7, 15, 17, 31, 33, 63, 65, 127, 129, 257}

// gemmShapes is m, n, k for the kernel tests: cubes, each dimension alone
// over gemmSizes, the k and nc block edges, and both sides of
// sgemmDirectMax (operands read in place or packed).
func gemmShapes() [][3]int {
	var s [][3]int
	for _, d := range gemmSizes {
		s = append(s, [3]int{d, d, d}, [3]int{d, 33, 19}, [3]int{19, d, 33}, [3]int{33, 19, d})
	}
	for _, k := range []int{sgemmKC - 1, sgemmKC, sgemmKC + 1, 2*sgemmKC + 1, 3*sgemmKC + 1} {
		s = append(s, [3]int{13, 35, k})
	}
	for _, d := range []int{sgemmDirectMax, sgemmDirectMax + 1} {
		s = append(s, [3]int{d, 45, 9}, [3]int{45, d, 9})
	}
	for _, kern := range sgemmKernels {
		for _, n := range []int{kern.nc - 1, kern.nc + 1} {
			s = append(s, [3]int{5, n, 7}, [3]int{sgemmDirectMax + 3, n, 5})
		}
	}
	return s
}

// TestSgemmKernels runs every micro-kernel this machine supports, the
// portable one included, over every layout and gemmShapes, with leading
// dimensions wider than the matrices.
func TestSgemmKernels(t *testing.T) {
	for _, kern := range sgemmKernels {
		require.LessOrEqual(t, kern.mr*kern.nr, sgemmMaxTile, kern.name)
		require.Zero(t, kern.nc%kern.nr, kern.name)
	}
	for si, s := range gemmShapes() {
		for _, tA := range []bool{false, true} {
			for _, tB := range []bool{false, true} {
				m, n, k := s[0], s[1], s[2]
				g := newGemmOperands(uint64(si), tA, tB, m, n, k, 3, 5)
				want, scale := g.reference()
				ldc := n + 7
				for _, kern := range sgemmKernels {
					what := fmt.Sprintf("%s m=%d n=%d k=%d transA=%v transB=%v", kern.name, m, n, k, tA, tB)
					buf, c := guardedC(m, n, ldc)
					sgemm(kern, true, tA, tB, m, n, k, g.a, g.lda, g.b, g.ldb, c, ldc)
					checkGuarded(t, g, buf, ldc, want, scale, what)
				}
			}
		}
	}
}

// TestSgemmAliasedLeadingDimension: operands whose rows are 4 KiB apart
// are packed even where they would otherwise be read in place.
func TestSgemmAliasedLeadingDimension(t *testing.T) {
	const m, n, k = 40, 70, 50
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			wa, wb := k, n
			if tA {
				wa = m
			}
			if tB {
				wb = k
			}
			g := newGemmOperands(9, tA, tB, m, n, k, sgemmAliasFloats-wa, sgemmAliasFloats-wb)
			want, scale := g.reference()
			for _, kern := range sgemmKernels {
				buf, c := guardedC(m, n, sgemmAliasFloats)
				sgemm(kern, true, tA, tB, m, n, k, g.a, g.lda, g.b, g.ldb, c, sgemmAliasFloats)
				checkGuarded(t, g, buf, sgemmAliasFloats, want, scale, fmt.Sprintf("%s transA=%v transB=%v", kern.name, tA, tB))
			}
		}
	}
}

// TestSgemmKernelsBitIdentical: the assembly kernels round identically, so
// the result does not depend on which one the CPU allows.
func TestSgemmKernelsBitIdentical(t *testing.T) {
	var asm []*sgemmKernel
	for _, kern := range sgemmKernels {
		if kern != sgemmGeneric {
			asm = append(asm, kern)
		}
	}
	if len(asm) < 2 {
		t.Skipf("only %d assembly kernel(s) run on this CPU", len(asm))
	}
	for si, s := range [][3]int{{37, 70, 600}, {129, 33, 257}, {5, 3, 1}} {
		for _, tA := range []bool{false, true} {
			for _, tB := range []bool{false, true} {
				m, n, k := s[0], s[1], s[2]
				g := newGemmOperands(uint64(100+si), tA, tB, m, n, k, 0, 0)
				var first []float32
				for _, kern := range asm {
					c := make([]float32, m*n)
					sgemm(kern, true, tA, tB, m, n, k, g.a, g.lda, g.b, g.ldb, c, n)
					if first == nil {
						first = c
						continue
					}
					require.Equal(t, f32Bits(first), f32Bits(c), "%s vs %s, %v transA=%v transB=%v", asm[0].name, kern.name, s, tA, tB)
				}
			}
		}
	}
}

func f32Bits(x []float32) []uint32 {
	o := make([]uint32, len(x))
	for i, v := range x {
		o[i] = math.Float32bits(v)
	}
	return o
}

// TestSgemmDeterministic: the bits of an element do not depend on the
// number of goroutines, nor on which other rows and columns are computed
// in the same call, which is what a model sharded over either dimension
// of a product relies on to match the unsharded one.
func TestSgemmDeterministic(t *testing.T) {
	const m, n, k = 301, 203, 530 // above sgemmParallelMin
	require.GreaterOrEqual(t, m*n*k, sgemmParallelMin)
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			g := newGemmOperands(7, tA, tB, m, n, k, 0, 0)
			what := fmt.Sprintf("transA=%v transB=%v", tA, tB)
			run := func(procs int) []float32 {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				c := make([]float32, m*n)
				gemm32(tA, tB, m, n, k, g.a, g.lda, g.b, g.ldb, c, n)
				return c
			}
			full := run(2)
			require.Equal(t, f32Bits(full), f32Bits(run(1)), "GOMAXPROCS 1 vs 2, %s", what)

			// Rows [r0, r1) and columns [c0, c1) on their own.
			const r0, r1, c0, c1 = 13, 190, 29, 171
			aOff := r0 * g.lda
			if tA {
				aOff = r0
			}
			bOff := c0
			if tB {
				bOff = c0 * g.ldb
			}
			part := make([]float32, (r1-r0)*(c1-c0))
			gemm32(tA, tB, r1-r0, c1-c0, k, g.a[aOff:], g.lda, g.b[bOff:], g.ldb, part, c1-c0)
			for i := r0; i < r1; i++ {
				require.Equal(t, f32Bits(full[i*n+c0:i*n+c1]), f32Bits(part[(i-r0)*(c1-c0):(i-r0+1)*(c1-c0)]), "row %d of a sub-block, %s", i, what)
			}
		}
	}
}

// TestMatMulBatchDeterministic: batched products, run over the batch or
// one after another, give the same bits with one goroutine or two.
func TestMatMulBatchDeterministic(t *testing.T) {
	r := newRand(3)
	for _, s := range [][4]int{{6, 40, 24, 16}, {3, 130, 129, 131}} {
		batch, m, n, k := s[0], s[1], s[2], s[3]
		a := randVec[float32](r, batch*m*k, -1, 1)
		b := randVec[float32](r, batch*k*n, -1, 1)
		run := func(procs int) []float32 {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			c := make([]float32, batch*m*n)
			MatMul(c, a, b, batch, m, n, k, false, true, false)
			return c
		}
		require.Equal(t, f32Bits(run(2)), f32Bits(run(1)), "%v", s)
	}
}

func TestParallelChunks(t *testing.T) {
	for _, c := range []struct{ count, chunk int }{{0, 1}, {1, 1}, {1, 4}, {5, 4}, {8, 4}, {9, 4}, {100, 1}, {101, 7}} {
		var mu sync.Mutex
		hits := make([]int, c.count)
		parallelChunks(c.count, c.chunk, func(lo, hi int) {
			require.LessOrEqual(t, hi-lo, c.chunk)
			mu.Lock()
			defer mu.Unlock()
			for i := lo; i < hi; i++ {
				hits[i]++
			}
		})
		for i, h := range hits {
			require.Equal(t, 1, h, "count=%d chunk=%d index %d", c.count, c.chunk, i)
		}
	}
}

func TestSgemmKBlock(t *testing.T) {
	for k := 1; k <= 5*sgemmKC; k++ {
		kc := sgemmKBlock(k)
		require.LessOrEqual(t, kc, sgemmKC, "k=%d", k)
		nb := (k + kc - 1) / kc
		require.Equal(t, (k+sgemmKC-1)/sgemmKC, nb, "k=%d: no more blocks than needed", k)
		require.Greater(t, k-(nb-1)*kc, kc/2-1, "k=%d: the last block is not a sliver", k)
	}
}

func TestSgemmBadArgs(t *testing.T) {
	c := make([]float32, 6)
	require.PanicsWithValue(t, "cpu.gemm32: a is 2×3 with leading dimension 3 but has 5 elements", func() {
		gemm32(false, false, 2, 3, 3, make([]float32, 5), 3, make([]float32, 9), 3, c, 3)
	})
	require.Panics(t, func() { gemm32(false, true, 2, 3, 3, make([]float32, 6), 3, make([]float32, 8), 3, c, 3) })
	require.Panics(t, func() { gemm32(false, false, 2, 3, 3, make([]float32, 6), 3, make([]float32, 9), 3, c, 2) })
	require.Panics(t, func() { gemm32(false, false, 2, 3, 3, make([]float32, 6), 3, make([]float32, 9), 3, c[:5], 3) })
}
