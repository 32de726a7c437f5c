package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// gemm32 is the fp32 product MatMul uses: a GEMM in the style of GotoBLAS
// and BLIS, whose register-blocked micro-kernel is chosen once, at start-up,
// by what the CPU and OS support (sgemmKernels):
//
//   - amd64 with AVX-512F and the OS saving zmm state: 12×32 tiles, zmm FMA.
//   - amd64 with AVX2 and FMA: 6×16 tiles, ymm FMA.
//   - anything else, or the purego build tag: 4×4 tiles in Go.
//
// Operands are packed into panels the kernel reads contiguously (op(b) in
// blocks shared by the workers, op(a) one panel at a time) unless they are
// used too few times to repay the copy; then the kernel reads them in
// place. Either way, and whatever the shape, layout, batch or number of
// goroutines, an element of c is the sum of its k products in the same
// order with the same roundings: its value depends on k and its own row of
// op(a) and column of op(b) alone. A model sharded over the rows or columns
// of a product therefore computes bit for bit what the unsharded model
// does, and a run does not depend on how busy the cores were. The AVX-512
// and AVX2 kernels round identically too; the Go kernel differs from them
// in last bits where the compiler does not fuse its multiply-adds.
//
// gonum's Sgemm, which gemm32 used for some shapes before, stays as the
// benchmarks' baseline (matMulGonum32) and an independent check in tests.
func gemm32(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	sgemm(sgemmKernels[0], true, transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
}

// sgemmKernel is a register-blocked micro-kernel and the cache blocking
// that suits it.
//
// Both functions compute one mr×nr tile of c from kc steps: at step l
// they read A(i, l) for the mr rows i and the nr values of row l of a
// panel of op(b), which starts at b + l·ldb. For every element they sum
// the kc products in l order with one rounding per multiply-add, starting
// from zero, then store the tile into c (row stride ldc) or, with add set,
// add it to what c holds. They write exactly the tile and read nothing
// else of c. unit finds A(i, l) at a + i + l·s (a packed panel, s = mr,
// or a transposed a in place, s = lda); rows at a + i·s + l (a row-major
// a in place, s = lda).
type sgemmKernel struct {
	name       string
	mr, nr     int
	unit, rows sgemmTileFunc
	// nc columns of op(b) (a multiple of nr) make one packed block of
	// kc×nc, shared by the workers, which each panel of op(a) sweeps
	// from L2 while it stays in L1.
	nc int
	// packT4x8, if set, speeds up gather packing (see packPanel).
	packT4x8 func(dst, src *float32, lds, ldd, r4, n8 int)
}

type sgemmTileFunc func(kc int, a *float32, s int, b *float32, ldb int, c *float32, ldc int, add bool)

const (
	// sgemmKC is the largest k block. It is the same for every kernel:
	// with it, the k blocks of a product, and so its rounding, depend on
	// k alone. At 256 a 12×32 kernel's A panel (12 KiB) stays in the
	// 48 KiB L1 beside the 32 KiB of B streaming past it per tile; 192
	// and 384 measured the same within noise, 128 a few percent slower.
	sgemmKC = 256
	// sgemmParallelMin is the m·n·k below which one goroutine runs the
	// whole product: under it the fork and join cost more than the second
	// core saves, and the batched callers get their parallelism from the
	// batch instead.
	sgemmParallelMin = 1 << 21
	// sgemmDirectMax is the largest n (m) for which a (b) is read in
	// place rather than packed: a panel is then used by at most this
	// many columns (rows) of c, too few to repay copying it. On the
	// attention shapes (batches of 128×128×32) that measured 15–20 %
	// faster than packing; at 2048×256×768 the two were even.
	sgemmDirectMax = 256
	// sgemmAliasFloats: leading dimensions that are multiples of this
	// (4 KiB) put every row of a panel in the same L1 set, so such
	// operands are always packed.
	sgemmAliasFloats = 1024
)

// sgemmKBlock is the depth of every k block but possibly the last: blocks
// as even as sgemmKC allows, so no product ends with a sliver of a block.
func sgemmKBlock(k int) int {
	nb := (k + sgemmKC - 1) / sgemmKC
	return (k + nb - 1) / nb
}

// Packing buffers, recycled because the runtime calls MatMul with the same
// shapes every training step: blocks of op(b) (up to sgemmKC·nc floats) and
// single panels of op(a) (up to sgemmKC·mr), apart so that neither size
// keeps replacing the other.
var (
	sgemmBBufs = sync.Pool{New: func() any { return new([]float32) }}
	sgemmABufs = sync.Pool{New: func() any { return new([]float32) }}
)

// sgemmBuf returns n floats from pool, aligned to a 64-byte line so no
// vector load of a packed panel straddles two cache lines. The caller puts
// the first result back when done.
func sgemmBuf(pool *sync.Pool, n int) (*[]float32, []float32) {
	p := pool.Get().(*[]float32)
	const align = 16 // floats in 64 bytes
	if cap(*p) < n+align {
		*p = make([]float32, n+align)
	}
	s := (*p)[:n+align]
	off := int(uintptr(unsafe.Pointer(&s[0]))%64) / 4
	if off != 0 {
		off = align - off
	}
	return p, s[off : off+n]
}

// sgemmProblem is one product and how its operands are read.
type sgemmProblem struct {
	kern             *sgemmKernel
	transA, transB   bool
	m, n, k          int
	a, b, c          []float32
	lda, ldb, ldc    int
	directA, directB bool // read in place where the panel is whole
}

// sgemm overwrites the m×n matrix c with op(a)·op(b) using kern. With par
// set, products of at least sgemmParallelMin are split over goroutines by
// parallelChunks, over rows of c only, never over k.
func sgemm(kern *sgemmKernel, par bool, transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	if m <= 0 || n <= 0 {
		return
	}
	// The kernels read and write through raw pointers, so the bounds Go
	// would check element by element are checked here once.
	checkGemmArgs(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if k == 0 {
		for i := range m {
			clear(c[i*ldc : i*ldc+n])
		}
		return
	}
	p := &sgemmProblem{
		kern: kern, transA: transA, transB: transB, m: m, n: n, k: k,
		a: a, b: b, c: c, lda: lda, ldb: ldb, ldc: ldc,
		directA: n <= sgemmDirectMax && lda%sgemmAliasFloats != 0,
		directB: !transB && m <= sgemmDirectMax && ldb%sgemmAliasFloats != 0,
	}
	mr, nr := kern.mr, kern.nr
	kcMax := sgemmKBlock(k)
	nc := min(kern.nc, roundUp(n, nr))
	mPanels := (m + mr - 1) / mr
	run := func(count, _ int, fn func(lo, hi int)) { fn(0, count) }
	if par && m*n*k >= sgemmParallelMin && mPanels >= 2 {
		run = parallelChunks
	}

	bSize := kcMax * nc
	if p.directB {
		bSize = kcMax * nr // the ragged last panel only
	}
	bHold, bp := sgemmBuf(&sgemmBBufs, bSize)
	defer sgemmBBufs.Put(bHold)
	for jc := 0; jc < n; jc += nc {
		ncb := min(nc, n-jc)
		for pc := 0; pc < k; pc += kcMax {
			kc := min(kcMax, k-pc)
			if p.directB {
				if r := ncb % nr; r != 0 {
					packPanel(kern.packT4x8, bp, b, ldb, false, pc, kc, jc+ncb-r, r, nr)
				}
			} else {
				run((ncb+nr-1)/nr, sgemmChunk, func(lo, hi int) {
					for q := lo; q < hi; q++ {
						j := q * nr
						packPanel(kern.packT4x8, bp[q*kc*nr:(q+1)*kc*nr], b, ldb, transB, pc, kc, jc+j, min(nr, ncb-j), nr)
					}
				})
			}
			run(mPanels, sgemmChunk, func(lo, hi int) {
				p.rows(lo*mr, min(hi*mr, m), jc, ncb, pc, kc, bp)
			})
		}
	}
}

// sgemmChunk is how many panels a worker takes at a time: small enough
// that a worker slowed by other load on its core leaves the rest of the
// panels to the others, large enough that taking one costs nothing.
const sgemmChunk = 4

// parallelChunks calls fn on consecutive chunks of at most chunk (≥ 1)
// from [0, count), on runtime.GOMAXPROCS(0) goroutines that each take the next
// chunk when done with the last. Unlike ParallelFor's fixed halves, this
// keeps both cores busy when one of them is shared with other work (other
// devices of the same process, or other processes). Which goroutine
// computes a chunk changes nothing in its result.
func parallelChunks(count, chunk int, fn func(lo, hi int)) {
	if count <= 0 {
		return
	}
	workers := min(runtime.GOMAXPROCS(0), (count+chunk-1)/chunk)
	if workers < 2 {
		fn(0, count)
		return
	}
	var next atomic.Int64
	work := func() {
		for {
			lo := int(next.Add(int64(chunk))) - chunk
			if lo >= count {
				return
			}
			fn(lo, min(lo+chunk, count))
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// rows computes rows [i0, i1) of the block of c at column jc, ncb wide,
// for the k block at pc, kc deep. bp holds the block's packed panels of
// op(b), or only its ragged last panel when b is read in place. Each panel
// of op(a) is packed (unless read in place) just before it sweeps the
// block, so it is in L1 for the whole sweep.
func (p *sgemmProblem) rows(i0, i1, jc, ncb, pc, kc int, bp []float32) {
	kern := p.kern
	mr, nr := kern.mr, kern.nr
	add := pc > 0
	aHold, ap := sgemmBuf(&sgemmABufs, mr*kc)
	defer sgemmABufs.Put(aHold)
	var tmp [sgemmMaxTile]float32
	for i := i0; i < i1; i += mr {
		rows := min(mr, i1-i)
		fn, apan, as := kern.unit, &ap[0], mr
		switch {
		case p.directA && rows == mr && p.transA:
			apan, as = &p.a[pc*p.lda+i], p.lda
		case p.directA && rows == mr:
			fn, apan, as = kern.rows, &p.a[i*p.lda+pc], p.lda
		default:
			packPanel(kern.packT4x8, ap, p.a, p.lda, !p.transA, pc, kc, i, rows, mr)
		}
		for jr := 0; jr < ncb; jr += nr {
			cols := min(nr, ncb-jr)
			var bpan *float32
			bs := nr
			switch {
			case !p.directB:
				bpan = &bp[jr*kc]
			case cols == nr:
				bpan, bs = &p.b[pc*p.ldb+jc+jr], p.ldb
			default:
				bpan = &bp[0]
			}
			ci := i*p.ldc + jc + jr
			if rows == mr && cols == nr {
				fn(kc, apan, as, bpan, bs, &p.c[ci], p.ldc, add)
				continue
			}
			// An edge tile: the kernel always writes a whole tile, so
			// let it write a scratch one and keep the valid part.
			// Adding here rounds as the kernel's own add does.
			fn(kc, apan, as, bpan, bs, &tmp[0], nr, false)
			for r := range rows {
				dst := p.c[ci+r*p.ldc : ci+r*p.ldc+cols]
				src := tmp[r*nr : r*nr+cols]
				if add {
					for j, v := range src {
						dst[j] += v
					}
				} else {
					copy(dst, src)
				}
			}
		}
	}
}

// sgemmMaxTile bounds mr·nr over all kernels (the scratch edge tile).
const sgemmMaxTile = 12 * 32

// packPanel packs one panel: w consecutive rows (gather set) or columns
// (gather unset) of the stored matrix x, of which the first r exist,
// restricted to the kc entries from l0 along the other axis. dst receives,
// for each l, the w values of that panel at l, zero past r, so edge tiles
// multiply by zeros instead of needing their own kernels.
//
// For op(a) the panel is mr rows of op(a): stored rows when a is not
// transposed (gather), columns when it is. For op(b) it is nr columns of
// op(b): stored columns unless b is transposed (gather).
//
// t4x8, when not nil, transposes 4×8 blocks of a gather (sgemmPackT4x8).
func packPanel(t4x8 func(dst, src *float32, lds, ldd, r4, n8 int), dst, x []float32, ld int, gather bool, l0, kc, x0, r, w int) {
	dst = dst[:kc*w]
	if !gather {
		packCopy(dst, x[l0*ld+x0:], ld, kc, r, w)
		return
	}
	// Rows in fours and columns in eights through t4x8, the rest here.
	j, lv := 0, 0
	if t4x8 != nil && kc >= 8 && r >= 4 {
		j, lv = r&^3, kc&^7
		src := x[x0*ld+l0 : (x0+j-1)*ld+l0+lv]
		t4x8(&dst[0], &src[0], ld, w, j/4, lv/8)
	}
	for jj := range r {
		src := x[(x0+jj)*ld+l0 : (x0+jj)*ld+l0+kc]
		from := lv
		if jj >= j {
			from = 0
		}
		for l := from; l < kc; l++ {
			dst[l*w+jj] = src[l]
		}
	}
	if r < w {
		for l := range kc {
			clear(dst[l*w+r : l*w+w])
		}
	}
}

// packCopy copies kc rows of r floats, row l starting at x[l·ld], into
// rows of w floats of dst, zero past r. The kernels' widths are copied as
// arrays, which the compiler turns into inline vector moves instead of a
// memmove call per row.
func packCopy(dst, x []float32, ld, kc, r, w int) {
	switch {
	case r == 32 && w == 32:
		for l := range kc {
			*(*[32]float32)(dst[l*32:]) = [32]float32(x[l*ld:][:32])
		}
	case r == 16 && w == 16:
		for l := range kc {
			*(*[16]float32)(dst[l*16:]) = [16]float32(x[l*ld:][:16])
		}
	case r == 12 && w == 12:
		for l := range kc {
			*(*[12]float32)(dst[l*12:]) = [12]float32(x[l*ld:][:12])
		}
	default:
		for l := range kc {
			d := dst[l*w : l*w+w]
			copy(d, x[l*ld:l*ld+r])
			clear(d[r:])
		}
	}
}

func roundUp(x, to int) int { return (x + to - 1) / to * to }

// checkGemmArgs panics unless every element the product touches lies in
// its slice.
func checkGemmArgs(transA, transB bool, m, n, k, la, lda, lb, ldb, lc, ldc int) {
	need := func(what string, rows, cols, ld, have int) {
		if rows == 0 || cols == 0 {
			return
		}
		if ld < cols || (rows-1)*ld+cols > have {
			panic(fmt.Sprintf("cpu.gemm32: %s is %d×%d with leading dimension %d but has %d elements", what, rows, cols, ld, have))
		}
	}
	if transA {
		need("a", k, m, lda, la)
	} else {
		need("a", m, k, lda, la)
	}
	if transB {
		need("b", n, k, ldb, lb)
	} else {
		need("b", k, n, ldb, lb)
	}
	need("c", m, n, ldc, lc)
}
