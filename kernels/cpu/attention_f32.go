package cpu

import (
	"math"
	"sync"
	"unsafe"
)

// The float32 attention kernels, which the exported ones in attention.go
// run for heads of at least attFastMin work (attPlan). The float64
// staging there widens every block and multiplies with gonum's dgemm;
// here the blocks stay in float32 and go straight to the packed GEMM's
// micro-kernel (gemm32.go), tile by tile, so that:
//
//   - nothing is converted or copied beyond what the micro-kernel wants
//     (kᵀ and vᵀ in nr-wide panels, q and dout rows padded to whole
//     tiles), and no product pays sgemm's set-up for a 64×64 block;
//   - under the causal mask the tiles wholly above the diagonal are
//     skipped, and the products over keys (p·v, ds·k) stop at the last
//     key a row panel sees, those over queries (pᵀ·dout, dsᵀ·q) start at
//     the first query that sees a key panel;
//   - the exponentials, one per visible score in every pass, use exp2N,
//     a few times faster than math.Exp.
//
// Scratch is one set of blocks per worker (a [bq, bk] tile of scores and
// one of dout·vᵀ, padded blocks of q, k, v and dout, one accumulator),
// from attPool, so memory stays O(block), whatever the sequence.
//
// Work is split finer than in attention.go, over (batch, head, query
// block) for the forward, the statistics and dq, and over (batch, k/v
// head, key block) for dk and dv: every element of a result is still
// summed by one task in one order, so the bits do not depend on the
// workers, and a short batch of long sequences still fills the cores.
// The tasks go to the workers one at a time (parallelChunks), so a core
// slowed by other load leaves the rest of the work to the others, heavy
// tasks (late query blocks, early key blocks under causal) first.

// exp2N is 2^(y/64) for the exponents of the softmax, about 0 at most in the
// backward and expSlack·expK in the forward, which the row loops reach as
// x·(scale·64/ln2) − m·(64/ln2), folding the change of base into the
// scale they multiply by anyway: 2^(i/64) from a table times a quadratic
// in the remainder f ∈ [−½, ½], relative error below 3e-8 (under half of
// float32's rounding, which p gets next). Below float32's range it
// returns 0, and NaN stays NaN. It is a few times faster than math.Exp,
// which matters: the backward takes one exponential per visible score in
// each of four passes.
func exp2N(y float64) float64 {
	if y < expMinY {
		return 0
	}
	t, f := exp2Parts(y)
	return t + t*f*(expC1+f*expC2)
}

// exp2Parts splits 2^(y/64) into the table's 2^(n/64), n the integer
// nearest y, and the remainder f = y − n ∈ [−½, ½] a polynomial in f
// finishes. Adding 1.5·2⁵² rounds y to n held in the low bits of kd:
// n mod 64 picks the table entry, and n shifted up to the exponent field
// adds n/64 (floor) to the entry's exponent; the table has n mod 64's
// own share of that shift taken out already.
func exp2Parts(y float64) (t, f float64) {
	kd := y + 0x1.8p52
	ki := math.Float64bits(kd)
	return math.Float64frombits(expTab[ki%expTabN] + ki<<(52-expTabBits)), y - (kd - 0x1.8p52)
}

const (
	expTabBits = 6
	expTabN    = 1 << expTabBits
	// expK turns a natural exponent into exp2N's units.
	expK    = expTabN / math.Ln2
	expMinY = -104 * expK
	expC1   = math.Ln2 / expTabN
	expC2   = expC1 * expC1 / 2
)

// expTab holds the bits of 2^(i/64) less i shifted to the exponent.
var expTab = func() (t [expTabN]uint64) {
	for i := range t {
		t[i] = math.Float64bits(math.Exp2(float64(i)/expTabN)) - uint64(i)<<(52-expTabBits)
	}
	return t
}()

// as32 views s as float32 when T is 4 bytes wide (float32 or a type
// derived from it).
func as32[T Float](s []T) ([]float32, bool) {
	var z T
	if unsafe.Sizeof(z) != 4 {
		return nil, false
	}
	if s == nil {
		return nil, true
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(s))), len(s)), true
}

// att32 is one float32 attention problem with its blocking.
type att32 struct {
	d        AttentionDims
	kern     *sgemmKernel
	mr, nr   int
	bq, bk   int
	bqp, bkp int // bq and bk rounded up to whole tiles: mr rows, nr columns
	hdp      int // row length of the blocks copied into scratch
	accRows  int
	nqb, nkb int // query blocks per head, key blocks per k/v head
	scale    float64
	// inPlace: rows of q, k, v and dout can be read by the micro-kernel
	// where they lie, whole tiles of hd wide.
	inPlace bool
}

func newAtt32(kern *sgemmKernel, d AttentionDims, bq, bk int) *att32 {
	mr, nr := kern.mr, kern.nr
	a := &att32{d: d, kern: kern, mr: mr, nr: nr, bq: bq, bk: bk, scale: d.Scale}
	a.bqp, a.bkp = roundUp(bq, mr), roundUp(bk, nr)
	a.hdp = roundUp(d.HeadDim, nr)
	if a.hdp%sgemmAliasFloats == 0 {
		// Rows 4 KiB apart all map to one L1 set (see sgemmAliasFloats).
		a.hdp += nr
	}
	// dk and dv tiles run over keys in panels of mr, the last one past
	// the block's keys: those rows of the accumulator are never read.
	a.accRows = max(a.bqp, roundUp(bk, mr))
	a.nqb = (d.SQ + bq - 1) / bq
	a.nkb = (d.SK + bk - 1) / bk
	a.inPlace = d.HeadDim%nr == 0 && d.HeadDim%sgemmAliasFloats != 0 && d.Heads*d.HeadDim%sgemmAliasFloats != 0
	return a
}

// attScratch32 is one worker's blocks.
type attScratch32 struct {
	q, do  []float32 // bqp × hdp: rows of q and dout, when not read in place
	kt, vt []float32 // kᵀ and vᵀ of the key block in nr-key panels of hd × nr
	kb     []float32 // bk (padded to mr) × hdp: k or v rows, when not read in place
	s, dp  []float32 // bqp × bkp (+ slack): scores, then p or ds; dout·vᵀ
	acc    []float32 // accRows × hdp
	m, l   []float64 // per query row: running max and sum, or lse and D
	// mx is each row's reference score before the scale: m is mx·scale
	// (softmaxRows).
	mx []float32
}

var attPool = sync.Pool{New: func() any { return new(attScratch32) }}

func grow32(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func (a *att32) scratch() *attScratch32 {
	sc := attPool.Get().(*attScratch32)
	hd, hdp := a.d.HeadDim, a.hdp
	sc.q, sc.do = grow32(sc.q, a.bqp*hdp), grow32(sc.do, a.bqp*hdp)
	sc.kt, sc.vt = grow32(sc.kt, a.bkp*hd), grow32(sc.vt, a.bkp*hd)
	sc.kb = grow32(sc.kb, roundUp(a.bk, a.mr)*hdp)
	// The transposed reads of a score tile for dk and dv run up to mr−1
	// columns past its last row.
	sc.s, sc.dp = grow32(sc.s, a.bqp*a.bkp+a.mr), grow32(sc.dp, a.bqp*a.bkp+a.mr)
	sc.acc = grow32(sc.acc, a.accRows*hdp)
	if cap(sc.m) < a.bqp {
		sc.m, sc.l = make([]float64, a.bqp), make([]float64, a.bqp)
	}
	sc.m, sc.l = sc.m[:a.bqp], sc.l[:a.bqp]
	sc.mx = grow32(sc.mx, a.bqp)
	return sc
}

// run calls task(sc, t) for t in [0, n) over the workers.
func (a *att32) run(n int, task func(sc *attScratch32, t int)) {
	parallelChunks(n, 1, func(lo, hi int) {
		sc := a.scratch()
		defer attPool.Put(sc)
		for t := lo; t < hi; t++ {
			task(sc, t)
		}
	})
}

// mat is a row-major operand of the micro-kernel: row i < split at
// s[off+i·ld:], row i ≥ split at t[(i−split)·tld:]. split is a multiple
// of mr, so a panel of rows lies in one or the other.
type mat struct {
	s, t         []float32
	off, ld, tld int
	split        int
}

func (m mat) at(i, j int) *float32 {
	if i >= m.split {
		return &m.t[(i-m.split)*m.tld+j]
	}
	return &m.s[m.off+i*m.ld+j]
}

func (m mat) ldAt(i int) int {
	if i >= m.split {
		return m.tld
	}
	return m.ld
}

// rowsOf is rows rows of hd floats of src, the first at off and each
// stride after the one before, as an operand. The kernel reads whole
// panels of mr rows and tiles of nr columns, so the rows are read where
// they lie up to the last whole panel (if hd is whole tiles) and the rest
// is copied into buf with row length hdp and zero padding up to a whole
// panel. The padding only meets parts of tiles that are thrown away, but
// stale values there could be denormals, which slow some CPUs down.
func (a *att32) rowsOf(buf, src []float32, off, stride, rows int) mat {
	split := 0
	if a.inPlace {
		split = rows - rows%a.mr
	}
	hd, hdp := a.d.HeadDim, a.hdp
	for r := range rows - split {
		copy(buf[r*hdp:r*hdp+hd], src[off+(split+r)*stride:][:hd])
		clear(buf[r*hdp+hd : (r+1)*hdp])
	}
	clear(buf[(rows-split)*hdp : roundUp(rows-split, a.mr)*hdp])
	return mat{s: src, t: buf, off: off, ld: stride, tld: hdp, split: split}
}

// panelsT packs the transpose of keys rows of k (or v), from off, into
// nr-key panels of hd × nr, zero past the last key, the layout in which
// the micro-kernel reads B.
func (a *att32) panelsT(dst, src []float32, off, keys int) {
	hd, nr := a.d.HeadDim, a.nr
	for j := 0; j < keys; j += nr {
		packPanel(a.kern.packT4x8, dst[j*hd:(j+nr)*hd], src[off:], hd, true, 0, hd, j, min(nr, keys-j), nr)
	}
}

// visibleIn is how many of the block's keys [j0, j0+keys) query i sees.
func (a *att32) visibleIn(i, j0, keys int) int {
	return min(max(a.d.visible(i)-j0, 0), keys)
}

// panelKeys is how many of the block's keys the row panel starting at
// block row rp sees: those its last real row sees, the most of any.
func (a *att32) panelKeys(i0, rows, rp, j0, keys int) int {
	return a.visibleIn(i0+min(rp+a.mr, rows)-1, j0, keys)
}

// scores sets dst (bqp × bkp) to x·yᵀ for the block's row panels, x the
// block's rows and yᵀ the panels in yt, leaving the tiles no row of a
// panel sees unwritten.
func (a *att32) scores(dst []float32, x mat, yt []float32, i0, rows, j0, keys int) {
	hd, bkp, mr, nr := a.d.HeadDim, a.bkp, a.mr, a.nr
	for rp := 0; rp < rows; rp += mr {
		nv := a.panelKeys(i0, rows, rp, j0, keys)
		for jt := 0; jt < nv; jt += nr {
			a.kern.rows(hd, x.at(rp, 0), x.ldAt(rp), &yt[jt*hd], nr, &dst[rp*bkp+jt], bkp, false)
		}
	}
}

// mulAdd adds p·y to acc (bqp × hdp) for the row panels: p the block's
// bqp × bkp tile (zero past each row's keys), y the block's key rows.
// Each panel stops at the last key it sees: the rest of its tile is zero.
func (a *att32) mulAdd(acc, p []float32, y mat, i0, rows, j0, keys int) {
	hdp, bkp, mr, nr := a.hdp, a.bkp, a.mr, a.nr
	for rp := 0; rp < rows; rp += mr {
		nv := a.panelKeys(i0, rows, rp, j0, keys)
		if nv == 0 {
			continue
		}
		for jt := 0; jt < a.d.HeadDim; jt += nr {
			a.kern.rows(nv, &p[rp*bkp], bkp, y.at(0, jt), y.ldAt(0), &acc[rp*hdp+jt], hdp, true)
		}
	}
}

// mulTAdd adds pᵀ·y to acc (keys, in panels of mr, × hdp): p the block's
// tile, y the block's query rows. Each key panel starts at the first
// query row that sees any of its keys. The sum over rows is split where
// y's rows move from in place to the copy: two k blocks, as sgemm makes
// of a long k, always at the same row for the same block.
func (a *att32) mulTAdd(acc, p []float32, y mat, i0, rows, j0, keys int) {
	hdp, bkp, mr, nr := a.hdp, a.bkp, a.mr, a.nr
	for kp := 0; kp < keys; kp += mr {
		r0 := min(max(a.d.firstQuery(j0+kp)-i0, 0), rows)
		for _, seg := range [2][2]int{{r0, min(y.split, rows)}, {max(r0, y.split), rows}} {
			if seg[0] >= seg[1] {
				continue
			}
			for jt := 0; jt < a.d.HeadDim; jt += nr {
				a.kern.unit(seg[1]-seg[0], &p[seg[0]*bkp+kp], bkp, y.at(seg[0], jt), y.ldAt(seg[0]), &acc[kp*hdp+jt], hdp, true)
			}
		}
	}
}

// Task order: under causal the last query blocks see the most keys and
// the first key blocks are seen by the most queries, so they go first,
// and the light ones fill in at the end.
func (a *att32) queryTask(t int) (b, h, i0 int) {
	nbh := a.d.Batch * a.d.Heads
	qb, bh := t/nbh, t%nbh
	if a.d.Causal {
		qb = a.nqb - 1 - qb
	}
	return bh / a.d.Heads, bh % a.d.Heads, qb * a.bq
}

func (a *att32) keyTask(t int) (b, g, j0 int) {
	nbg := a.d.Batch * a.d.KVHeads
	kb, bg := t/nbg, t%nbg
	return bg / a.d.KVHeads, bg % a.d.KVHeads, kb * a.bk
}

// expSlack is how far, in natural units, a score may exceed the running
// reference of its row before the reference moves up to it. The forward
// and the statistics need no max pass over the scores: the reference is
// the row's first score and moves only when a later one is e¹⁶ times
// more likely, which in float32 (p) and float64 (the sums) costs nothing
// in range or precision. It never sits above every score of its row
// (it is one of them), so a row's sum is at least 1.
const expSlack = 16

// softmaxRows turns the block's scores into probabilities relative to
// each row's reference m (setting m at a row's first key), adds their
// sums to l, and rescales l and the row of acc (when not nil) whenever m
// moves; p is zero past each row's keys across the padded tile. With
// store unset only the sums are taken.
func (a *att32) softmaxRows(sc *attScratch32, acc []float32, store bool, i0, rows, j0, keys int) {
	bkp, hdp, hd := a.bkp, a.hdp, a.d.HeadDim
	m, l := sc.m, sc.l
	ka := a.scale * expK
	for r := range rows {
		row := sc.s[r*bkp : (r+1)*bkp]
		n := a.visibleIn(i0+r, j0, keys)
		if n == 0 {
			if store {
				clear(row)
			}
			continue
		}
		if math.IsInf(m[r], -1) {
			sc.mx[r] = row[0]
			m[r] = float64(row[0]) * a.scale
			if math.IsInf(m[r], 0) || m[r] != m[r] {
				// A reference that is not finite would make NaNs of
				// finite scores: take the max, as the float64 kernel does.
				sc.mx[r] = rowMax32(row[:n])
				m[r] = float64(sc.mx[r]) * a.scale
			}
		}
		sum := 0.0
		moved := false
		for c := 0; ; {
			var part float64
			var stop int
			if b := m[r] * expK; math.Abs(b) < hugeExponent {
				part, stop = expRowBounded(row[c:n], ka, 0, b, store)
			} else {
				part, stop = expRowBounded(row[c:n], ka, float64(sc.mx[r]), 0, store)
			}
			sum += part
			if c += stop; c == n {
				break
			}
			if moved {
				// The reference is already the largest score left, so
				// none lies e¹⁶ above it but by rounding: at a scale near
				// float64's range (1e20 times the scores) x·ka − m·expK
				// is off by more than that. row[c] is at the reference.
				// Moving again would find the same reference, and looped
				// for ever.
				if store {
					row[c] = 1
				}
				sum++
				if c++; c == n {
					break
				}
				continue
			}
			// row[c] is far above the reference: move it to the largest
			// score left, and rescale what was summed (and stored) so far.
			sc.mx[r] = rowMax32(row[c:n])
			mNew := float64(sc.mx[r]) * a.scale
			alpha := math.Exp(m[r] - mNew)
			sum *= alpha
			l[r] *= alpha
			if store {
				scaleRow(row[:c], float32(alpha))
			}
			if acc != nil {
				scaleRow(acc[r*hdp:r*hdp+hd], float32(alpha))
			}
			m[r] = mNew
			moved = true
		}
		l[r] += sum
		if store {
			clear(row[n:])
		}
	}
}

func scaleRow(x []float32, f float32) {
	for i := range x {
		x[i] *= f
	}
}

// expRowBounded sets row[c] = e^(row[c]·scale − m), given ka = scale·expK
// and the reference m as mx·scale + b/expK (exp2N's units): y = (x − mx)·ka
// − b. It stores them when store is set and returns their sum, stopping at
// the first c whose exponent exceeds expSlack. Callers give mx = 0 and
// b = m·expK, or, where m·expK is huge (hugeExponent), m's score before the
// scale as mx and b = 0.
func expRowBounded(row []float32, ka, mx, b float64, store bool) (sum float64, stop int) {
	const lim = expSlack * expK
	for c, x := range row {
		y := (float64(x)-mx)*ka - b
		if y > lim {
			return sum, c
		}
		p := float32(exp2N(y))
		if store {
			row[c] = p
		}
		sum += float64(p)
	}
	return sum, len(row)
}

// hugeExponent is the size of m·expK past which x·ka − m·expK, a
// difference of two products that large, is off by more than the
// exponent's own resolution (2⁴⁰'s ulp is 2⁻¹²): the scores times a
// scale near float64's range, as a diverging run makes them. Past it the
// reference is subtracted before the scale ((x − mx)·ka, a difference of
// two float32 values, exact in float64), so that it is at exactly e⁰.
const hugeExponent = 1 << 40

// expRow sets row[c] = e^(row[c]·scale − shift).
func expRow(row []float32, scale, shift float64) {
	a, b := scale*expK, shift*expK
	for c, x := range row {
		row[c] = float32(exp2N(float64(x)*a - b))
	}
}

// dsRow sets s[c] = scale·p·(dp[c] − D) with p = e^(s[c]·scale − lse):
// the gradients' factor scale rides in the exponent, for free, rather
// than costing dq and dk a rounding of their own at the end.
func dsRow(s, dp []float32, scale, lse, dsum float64) {
	a, b := scale*expK, (lse-math.Log(scale))*expK
	dp = dp[:len(s)]
	for c, x := range s {
		s[c] = float32(exp2N(float64(x)*a-b) * (float64(dp[c]) - dsum))
	}
}

// rowMax32 is the largest of row (not empty), NaNs passed over.
func rowMax32(row []float32) float32 {
	m := row[0]
	for _, x := range row[1:] {
		if x > m {
			m = x
		}
	}
	return m
}

// dot32 is Σ a·b in float64, in four interleaved sums (a fixed order).
func dot32(a, b []float32) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += float64(a[i]) * float64(b[i])
		s1 += float64(a[i+1]) * float64(b[i+1])
		s2 += float64(a[i+2]) * float64(b[i+2])
		s3 += float64(a[i+3]) * float64(b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += float64(a[i]) * float64(b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func attentionForward32(kern *sgemmKernel, out []float32, lse []float64, q, k, v []float32, d AttentionDims, bq, bk int) {
	a := newAtt32(kern, d, bq, bk)
	hd, hdp := d.HeadDim, a.hdp
	a.run(d.Batch*d.Heads*a.nqb, func(sc *attScratch32, t int) {
		b, h, i0 := a.queryTask(t)
		g := d.kvHead(h)
		rows := min(bq, d.SQ-i0)
		qm := a.rowsOf(sc.q, q, d.qRow(b, h, i0), hd, rows)
		clear(sc.acc[:roundUp(rows, a.mr)*hdp])
		for r := range rows {
			sc.m[r], sc.l[r] = math.Inf(-1), 0
		}
		end := d.visible(i0 + rows - 1)
		for j0 := 0; j0 < end; j0 += bk {
			keys := min(bk, end-j0)
			a.panelsT(sc.kt, k, d.kvRow(b, g, j0), keys)
			a.scores(sc.s, qm, sc.kt, i0, rows, j0, keys)
			a.softmaxRows(sc, sc.acc, true, i0, rows, j0, keys)
			a.mulAdd(sc.acc, sc.s, a.kvRows(sc.kb, v, b, g, j0, keys), i0, rows, j0, keys)
		}
		for r := range rows {
			finishRow(out[d.oRow(b, h, i0+r):][:hd], sc.acc[r*hdp:r*hdp+hd], sc.m[r], sc.l[r], lse, (b*d.Heads+h)*d.SQ+i0+r)
		}
	})
}

// kvRows is k or v rows [j0, j0+keys) of k/v head g as an operand.
func (a *att32) kvRows(buf, src []float32, b, g, j0, keys int) mat {
	if a.inPlace {
		// As B the rows are read one at a time, only those that exist.
		return mat{s: src, off: a.d.kvRow(b, g, j0), ld: a.d.HeadDim, split: keys}
	}
	return a.rowsOf(buf, src, a.d.kvRow(b, g, j0), a.d.HeadDim, keys)
}

func attentionStats32(kern *sgemmKernel, stats, q, k, out, dout []float32, d AttentionDims, bq, bk int) {
	a := newAtt32(kern, d, bq, bk)
	hd := d.HeadDim
	a.run(d.Batch*d.Heads*a.nqb, func(sc *attScratch32, t int) {
		b, h, i0 := a.queryTask(t)
		g := d.kvHead(h)
		rows := min(bq, d.SQ-i0)
		qm := a.rowsOf(sc.q, q, d.qRow(b, h, i0), hd, rows)
		for r := range rows {
			sc.m[r], sc.l[r] = math.Inf(-1), 0
		}
		end := d.visible(i0 + rows - 1)
		for j0 := 0; j0 < end; j0 += bk {
			keys := min(bk, end-j0)
			a.panelsT(sc.kt, k, d.kvRow(b, g, j0), keys)
			a.scores(sc.s, qm, sc.kt, i0, rows, j0, keys)
			a.softmaxRows(sc, nil, false, i0, rows, j0, keys)
		}
		for r := range rows {
			i := i0 + r
			row := (b*d.Heads+h)*d.SQ + i
			stats[2*row] = float32(sc.m[r] + math.Log(sc.l[r]))
			stats[2*row+1] = float32(dot32(out[d.oRow(b, h, i):][:hd], dout[d.oRow(b, h, i):][:hd]))
		}
	})
}

// loadStats reads lse and D of the block's rows into sc.m and sc.l.
func (a *att32) loadStats(sc *attScratch32, stats []float32, b, h, i0, rows int) {
	base := (b*a.d.Heads+h)*a.d.SQ + i0
	for r := range rows {
		sc.m[r], sc.l[r] = float64(stats[2*(base+r)]), float64(stats[2*(base+r)+1])
	}
}

// dsTile turns the block's scores into scale·ds = scale·p·(dp − D), the
// factor dq and dk share, or into p when withDP is unset, zero past each
// row's keys across the whole padded tile (the transposed products of dk
// and dv read past the keys a row sees).
func (a *att32) dsTile(sc *attScratch32, withDP bool, i0, rows, j0, keys int) {
	bkp := a.bkp
	for r := range rows {
		row := sc.s[r*bkp : (r+1)*bkp]
		n := a.visibleIn(i0+r, j0, keys)
		if withDP {
			dsRow(row[:n], sc.dp[r*bkp:], a.scale, sc.m[r], sc.l[r])
		} else {
			expRow(row[:n], a.scale, sc.m[r])
		}
		clear(row[n:])
	}
}

func attentionGradQ32(kern *sgemmKernel, dq, q, k, v, dout, stats []float32, d AttentionDims, bq, bk int) {
	a := newAtt32(kern, d, bq, bk)
	hd, hdp := d.HeadDim, a.hdp
	a.run(d.Batch*d.Heads*a.nqb, func(sc *attScratch32, t int) {
		b, h, i0 := a.queryTask(t)
		g := d.kvHead(h)
		rows := min(bq, d.SQ-i0)
		qm := a.rowsOf(sc.q, q, d.qRow(b, h, i0), hd, rows)
		dom := a.rowsOf(sc.do, dout, d.oRow(b, h, i0), d.Heads*hd, rows)
		a.loadStats(sc, stats, b, h, i0, rows)
		clear(sc.acc[:roundUp(rows, a.mr)*hdp])
		end := d.visible(i0 + rows - 1)
		for j0 := 0; j0 < end; j0 += bk {
			keys := min(bk, end-j0)
			a.panelsT(sc.kt, k, d.kvRow(b, g, j0), keys)
			a.panelsT(sc.vt, v, d.kvRow(b, g, j0), keys)
			a.scores(sc.s, qm, sc.kt, i0, rows, j0, keys)
			a.scores(sc.dp, dom, sc.vt, i0, rows, j0, keys)
			a.dsTile(sc, true, i0, rows, j0, keys)
			a.mulAdd(sc.acc, sc.s, a.kvRows(sc.kb, k, b, g, j0, keys), i0, rows, j0, keys)
		}
		for r := range rows {
			copy(dq[d.qRow(b, h, i0+r):][:hd], sc.acc[r*hdp:r*hdp+hd])
		}
	})
}

// attentionGradKV32 is dk (grad set) or dv: one task per (batch, k/v
// head, key block), visiting every query block of every query head that
// reads the k/v head and sees the block, in one fixed order.
func attentionGradKV32(kern *sgemmKernel, dkv, q, k, v, dout, stats []float32, d AttentionDims, bq, bk int, grad bool) {
	a := newAtt32(kern, d, bq, bk)
	hd, hdp := d.HeadDim, a.hdp
	a.run(d.Batch*d.KVHeads*a.nkb, func(sc *attScratch32, t int) {
		b, g, j0 := a.keyTask(t)
		keys := min(bk, d.SK-j0)
		a.panelsT(sc.kt, k, d.kvRow(b, g, j0), keys)
		if grad {
			a.panelsT(sc.vt, v, d.kvRow(b, g, j0), keys)
		}
		clear(sc.acc[:roundUp(keys, a.mr)*hdp])
		hLo, hHi := d.queryHeads(g)
		for h := hLo; h < hHi; h++ {
			for i0 := d.firstQuery(j0); i0 < d.SQ; i0 += bq {
				rows := min(bq, d.SQ-i0)
				qm := a.rowsOf(sc.q, q, d.qRow(b, h, i0), hd, rows)
				dom := a.rowsOf(sc.do, dout, d.oRow(b, h, i0), d.Heads*hd, rows)
				a.loadStats(sc, stats, b, h, i0, rows)
				a.scores(sc.s, qm, sc.kt, i0, rows, j0, keys)
				if !grad {
					// dv += pᵀ·dout
					a.dsTile(sc, false, i0, rows, j0, keys)
					a.mulTAdd(sc.acc, sc.s, dom, i0, rows, j0, keys)
					continue
				}
				// dk += dsᵀ·q
				a.scores(sc.dp, dom, sc.vt, i0, rows, j0, keys)
				a.dsTile(sc, true, i0, rows, j0, keys)
				a.mulTAdd(sc.acc, sc.s, qm, i0, rows, j0, keys)
			}
		}
		for c := range keys {
			copy(dkv[d.kvRow(b, g, j0+c):][:hd], sc.acc[c*hdp:c*hdp+hd])
		}
	})
}
