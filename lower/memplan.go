package lower

import (
	"cmp"
	"math"
	"slices"
	"sort"

	"gcompile/ir"
)

// The static memory planner. Persistent buffers (params, optimizer state,
// inputs, constants) sit at the bottom of the device arena; every temporary
// gets an offset above them that no buffer live at the same time shares.
// A linear scan in program order with first-fit over a tree of free gaps
// places each temporary in O(log gaps), so a pipeline rank of GPT-3 with
// tens of thousands of instructions plans in tens of milliseconds. On
// programs small enough for them, greedy placements in a few orders are
// tried as well and the smallest arena wins. Every tie is broken by buffer
// id, so a program always gets the same plan.

// Align is the byte alignment of every buffer in the arena.
const Align = 64

// alignUp rounds a buffer's size up to its alignment: a cache line for
// buffers that span several, 8 bytes (any element type) for small ones,
// which would otherwise waste most of a line each.
func alignUp(n int64) int64 { return roundTo(n, alignOf(n)) }

// alignOf is the alignment of a buffer of n bytes.
func alignOf(n int64) int64 {
	if n < 4*Align {
		return 8
	}
	return Align
}

// roundTo rounds n up to a multiple of a, a power of two (a mask, not a
// division: the greedy placements call it in their inner loop).
func roundTo(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

// A plan within this factor of the peak of live temporaries ends the
// search for a better one.
const closeEnough = 1.01

// The greedy placements are quadratic and there are ten of them; above
// this many temporaries the linear scan alone is used.
const maxGreedyTemps = 20000

// PlanMemory recomputes p's memory plan (offsets, arena, peak, frees) from
// its instruction order; lowering calls it, benchmarks time it. Calling it
// again on the same program gives the same plan.
func PlanMemory(p *Program) { planMemory(p) }

// planMemory assigns offsets: persistent buffers first, then temporaries
// by a linear scan, or by a greedy order when one packs them tighter.
func planMemory(p *Program) {
	base := placePersistent(p)
	first, last := liveRanges(p)
	setFrees(p, last)
	var temps []int
	for b, f := range first {
		if f >= 0 && p.Buffers[b].Bytes > 0 {
			temps = append(temps, b)
		}
	}
	peak := measurePeak(p, temps, first, last)

	spans := make([]span, len(temps))
	for i, b := range temps {
		n := p.Buffers[b].Bytes
		spans[i] = span{size: alignUp(n), align: alignOf(n), from: first[b], to: last[b]}
	}
	best, top := linearScan(spans, base, len(p.Instrs))
	if len(spans) <= maxGreedyTemps {
		best, top = tryGreedyOrders(p, temps, spans, base, peak, best, top)
	}
	for i, b := range temps {
		p.Buffers[b].Offset = best[i]
	}
	p.ArenaBytes = top
}

// placePersistent lays out the host arena and the persistent part of the
// device arena and returns where the device's temporaries start.
func placePersistent(p *Program) int64 {
	var off, host int64
	p.PersistentBytes = 0
	// The host arena: cache-line-aligned buffers first, then the small
	// ones, so no padding sits between them.
	for _, large := range []bool{true, false} {
		for i := range p.Buffers {
			b := &p.Buffers[i]
			if b.Host && (alignOf(b.Bytes) == Align) == large {
				b.Offset = roundTo(host, alignOf(b.Bytes))
				host = b.Offset + alignUp(b.Bytes)
			}
		}
	}
	for i := range p.Buffers {
		b := &p.Buffers[i]
		if !b.Host && b.Kind.Persistent() {
			b.Offset = roundTo(off, alignOf(b.Bytes))
			off = b.Offset + alignUp(b.Bytes)
			p.PersistentBytes += b.Bytes
		}
	}
	p.HostBytes = host
	return off
}

// isTemp reports whether buffer id is a device temporary; a host buffer is
// never live on the device.
func isTemp(p *Program, id int) bool {
	return !p.Buffers[id].Host && !p.Buffers[id].Kind.Persistent()
}

// liveRanges returns, per buffer id, the instruction that first writes it
// (temporaries only) and the last instruction that reads it, or
// len(p.Instrs) for a program output, which is read after the step; -1
// where there is none. One pass over the instructions, so later stages
// never scan the program per buffer.
func liveRanges(p *Program) (first, last []int) {
	first = make([]int, len(p.Buffers))
	last = make([]int, len(p.Buffers))
	for b := range first {
		first[b], last[b] = -1, -1
	}
	for i, in := range p.Instrs {
		if in.Out >= 0 && first[in.Out] < 0 && isTemp(p, in.Out) {
			first[in.Out], last[in.Out] = i, i
		}
		for _, a := range in.Args {
			last[a] = i
		}
		for _, sc := range in.Scratch {
			first[sc], last[sc] = i, i
		}
	}
	for _, b := range p.Outputs {
		last[b] = len(p.Instrs)
	}
	return first, last
}

// setFrees lists at each instruction the temporaries it reads last, in
// increasing id order. The lists replace any earlier ones, so planning a
// program twice does not free a buffer twice; they share one backing
// array because a large program has tens of thousands of them.
func setFrees(p *Program, last []int) {
	n := len(p.Instrs)
	count := make([]int, n)
	total := 0
	for b, l := range last {
		if l >= 0 && l < n && isTemp(p, b) {
			count[l]++
			total++
		}
	}
	backing := make([]int, total)
	at := 0
	for i := range p.Instrs {
		p.Instrs[i].Frees = nil
		if count[i] > 0 {
			p.Instrs[i].Frees = backing[at : at : at+count[i]]
			at += count[i]
		}
	}
	for b, l := range last {
		if l >= 0 && l < n && isTemp(p, b) {
			p.Instrs[l].Frees = append(p.Instrs[l].Frees, b)
		}
	}
}

// measurePeak sets PeakBytes, PeakAt, Peak and PeakLive, and returns the
// peak of the temporaries alone.
func measurePeak(p *Program, temps, first, last []int) int64 {
	n := len(p.Instrs)
	delta := make([]int64, n+2)
	for _, b := range temps {
		delta[first[b]] += p.Buffers[b].Bytes
		delta[last[b]+1] -= p.Buffers[b].Bytes
	}
	var live, peak int64
	p.PeakAt = 0
	for i := 0; i <= n; i++ {
		live += delta[i]
		if live > peak {
			peak, p.PeakAt = live, min(i, n-1)
		}
	}
	p.PeakBytes = p.PersistentBytes + peak
	p.Peak = Breakdown{}
	for _, b := range p.Buffers {
		if b.Kind.Persistent() && !b.Host {
			p.Peak.add(b.Category(), b.Bytes)
		}
	}
	p.PeakLive = nil
	for _, b := range temps {
		if first[b] <= p.PeakAt && p.PeakAt <= last[b] {
			p.PeakLive = append(p.PeakLive, b)
			p.Peak.add(p.Buffers[b].Category(), p.Buffers[b].Bytes)
		}
	}
	// temps is in id order, so equal sizes stay in id order.
	slices.SortStableFunc(p.PeakLive, func(a, b int) int { return cmp.Compare(p.Buffers[b].Bytes, p.Buffers[a].Bytes) })
	return peak
}

// tryGreedyOrders places the temporaries greedily in the usual orders
// (largest first, earliest first, longest-lived first, latest freed first,
// largest size×lifetime first), each with lowest-offset and best-fit gaps,
// and returns the smallest arena among them and the given plan (best,
// top). Largest first at the lowest offset always runs: on most programs
// it is the best single order and it often beats the linear scan. The
// rest run only while the best arena is more than 1 % above peak, the most
// bytes of temporaries live at once.
func tryGreedyOrders(p *Program, temps []int, spans []span, base, peak int64, best []int64, top int64) ([]int64, int64) {
	bytes := func(i int) int64 { return p.Buffers[temps[i]].Bytes }
	life := func(i int) int64 { return int64(spans[i].to - spans[i].from) }
	keys := []func(i int) int64{ // ascending key = placed earlier
		func(i int) int64 { return -bytes(i) },
		func(i int) int64 { return int64(spans[i].from) },
		func(i int) int64 { return -life(i) },
		func(i int) int64 { return -int64(spans[i].to) },
		func(i int) int64 { return -ir.SatMul(bytes(i), life(i)+1) }, // saturates: a key, not a size
	}
	order := make([]int, len(spans))
	key := make([]int64, len(spans))
	for _, k := range keys {
		for i := range order {
			order[i], key[i] = i, k(i)
		}
		// Ties go to the lower buffer id, so every order is total and
		// the plan does not depend on how temps was gathered.
		slices.SortFunc(order, func(a, b int) int {
			if c := cmp.Compare(key[a], key[b]); c != 0 {
				return c
			}
			return cmp.Compare(temps[a], temps[b])
		})
		for _, bestFit := range []bool{false, true} {
			offsets, t := placeGreedy(spans, order, base, bestFit)
			if t < top {
				top, best = t, offsets
			}
			if float64(top-base) <= closeEnough*float64(peak) {
				return best, top
			}
		}
	}
	return best, top
}

// span is one temporary's claim on the arena: size bytes (already rounded
// to its alignment) from the instruction that writes it to the one that
// last reads it, both included.
type span struct {
	size, align int64
	from, to    int
}

// linearScan allocates spans in program order: at each instruction the
// spans it starts take the lowest free gap that holds them (largest
// first, then in the order given), and spans it ends are returned to the
// free gaps, merged with their neighbours. It returns each span's offset
// and the arena top. Spans start and end within instructions 0..n (a
// program output ends at n, after the last instruction).
func linearScan(spans []span, base int64, n int) ([]int64, int64) {
	born := bucketBy(spans, n, func(s span) int { return s.from })
	dies := bucketBy(spans, n, func(s span) int { return s.to })
	free := newFreeGaps(base)
	offsets := make([]int64, len(spans))
	top := base
	for i := 0; i <= n; i++ {
		bs := born[i]
		slices.SortStableFunc(bs, func(a, b int32) int { return cmp.Compare(spans[b].size, spans[a].size) })
		for _, s := range bs {
			at := free.take(spans[s].size, spans[s].align)
			offsets[s] = at
			top = max(top, at+spans[s].size)
		}
		for _, s := range dies[i] {
			free.give(offsets[s], offsets[s]+spans[s].size)
		}
	}
	return offsets, top
}

// bucketBy groups span indices by instruction 0..n, in increasing index
// order within a group. The groups share one backing array: one
// allocation instead of one per instruction.
func bucketBy(spans []span, n int, at func(span) int) [][]int32 {
	start := make([]int, n+2)
	for _, s := range spans {
		start[at(s)+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	flat := make([]int32, len(spans))
	fill := slices.Clone(start[:n+1])
	for i, s := range spans {
		flat[fill[at(s)]] = int32(i)
		fill[at(s)]++
	}
	out := make([][]int32, n+1)
	for i := range out {
		out[i] = flat[start[i]:start[i+1]:start[i+1]]
	}
	return out
}

// freeGaps is the free space of an arena as disjoint, non-touching gaps
// ordered by offset, the last open to the top. They are kept in a treap
// keyed by offset whose nodes also hold the most room any gap in their
// subtree offers per alignment, so the lowest gap that holds an
// allocation is found in one descent instead of a scan over all gaps.
// Nodes live in one slice and are recycled, so the many small gaps of a
// long program cost no garbage.
type freeGaps struct {
	nodes []gapNode
	spare []int32
	root  int32
	seed  uint64
}

// open is the upper end of the gap at the top of the arena.
const open = math.MaxInt64

// alignments are those alignOf gives; rooms are kept per alignment
// because a gap's usable room depends on where an aligned start falls.
var alignments = [...]int64{8, Align}

const none = int32(-1)

type gapNode struct {
	lo, hi      int64
	left, right int32
	prio        uint64
	// most is the largest room (bytes from the aligned start to hi) any
	// gap in this subtree has, per alignment.
	most [len(alignments)]int64
}

func newFreeGaps(base int64) *freeGaps {
	f := &freeGaps{root: none, seed: 0x9e3779b97f4a7c15}
	f.root = f.node(base, open)
	return f
}

// node makes a one-gap tree. Priorities come from a fixed-seed generator,
// so the tree's shape, and with it the run time, is reproducible.
func (f *freeGaps) node(lo, hi int64) int32 {
	f.seed += 0x9e3779b97f4a7c15
	z := f.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	g := gapNode{lo: lo, hi: hi, left: none, right: none, prio: z ^ z>>31}
	var id int32
	if k := len(f.spare); k > 0 {
		id, f.spare = f.spare[k-1], f.spare[:k-1]
		f.nodes[id] = g
	} else {
		id = int32(len(f.nodes))
		f.nodes = append(f.nodes, g)
	}
	f.pull(id)
	return id
}

// room is how many bytes an allocation aligned to alignments[k] can use in
// gap [lo, hi).
func room(lo, hi int64, k int) int64 { return hi - roundTo(lo, alignments[k]) }

// alignIndex is where alignment a, one alignOf gives, sits in alignments.
func alignIndex(a int64) int {
	if a >= Align {
		return 1
	}
	return 0
}

// pull recomputes t's subtree maxima from its gap and its children.
func (f *freeGaps) pull(t int32) {
	n := &f.nodes[t]
	for k := range alignments {
		m := room(n.lo, n.hi, k)
		if n.left != none {
			m = max(m, f.nodes[n.left].most[k])
		}
		if n.right != none {
			m = max(m, f.nodes[n.right].most[k])
		}
		n.most[k] = m
	}
}

// split cuts t into the gaps below key and those at or above it.
func (f *freeGaps) split(t int32, key int64) (int32, int32) {
	if t == none {
		return none, none
	}
	if f.nodes[t].lo < key {
		l, r := f.split(f.nodes[t].right, key)
		f.nodes[t].right = l
		f.pull(t)
		return t, r
	}
	l, r := f.split(f.nodes[t].left, key)
	f.nodes[t].left = r
	f.pull(t)
	return l, t
}

// merge joins two trees, every gap of a below every gap of b.
func (f *freeGaps) merge(a, b int32) int32 {
	if a == none {
		return b
	}
	if b == none {
		return a
	}
	if f.nodes[a].prio > f.nodes[b].prio {
		f.nodes[a].right = f.merge(f.nodes[a].right, b)
		f.pull(a)
		return a
	}
	f.nodes[b].left = f.merge(a, f.nodes[b].left)
	f.pull(b)
	return b
}

// take allocates size bytes aligned to align at the lowest offset that
// holds them and returns that offset. The open top gap always holds them.
func (f *freeGaps) take(size, align int64) int64 {
	k := alignIndex(align)
	t := f.root
	for {
		n := &f.nodes[t]
		if n.left != none && f.nodes[n.left].most[k] >= size {
			t = n.left
		} else if room(n.lo, n.hi, k) >= size {
			break
		} else {
			t = n.right // the subtree's maximum says it is here
		}
	}
	lo, hi := f.nodes[t].lo, f.nodes[t].hi
	at := roundTo(lo, align)
	below, rest := f.split(f.root, lo)
	gap, above := f.split(rest, lo+1)
	f.spare = append(f.spare, gap)
	if at > lo { // the alignment padding stays free
		below = f.merge(below, f.node(lo, at))
	}
	if at+size < hi {
		below = f.merge(below, f.node(at+size, hi))
	}
	f.root = f.merge(below, above)
	return at
}

// give returns [lo, hi) to the free gaps, joined with the gaps it touches.
func (f *freeGaps) give(lo, hi int64) {
	below, above := f.split(f.root, lo)
	if t := f.last(below); t != none && f.nodes[t].hi == lo {
		lo = f.nodes[t].lo
		below, _ = f.split(below, lo) // t alone is at or above its lo
		f.spare = append(f.spare, t)
	}
	if t := f.first(above); t != none && f.nodes[t].lo == hi {
		hi = f.nodes[t].hi
		_, above = f.split(above, f.nodes[t].lo+1) // t alone is below lo+1
		f.spare = append(f.spare, t)
	}
	f.root = f.merge(f.merge(below, f.node(lo, hi)), above)
}

// first and last are the lowest and highest gaps of tree t.
func (f *freeGaps) first(t int32) int32 {
	for t != none && f.nodes[t].left != none {
		t = f.nodes[t].left
	}
	return t
}

func (f *freeGaps) last(t int32) int32 {
	for t != none && f.nodes[t].right != none {
		t = f.nodes[t].right
	}
	return t
}

// placeGreedy assigns offsets to spans in the given order: each goes to
// the lowest offset that no placed, lifetime-overlapping span occupies, or
// with bestFit to the smallest such hole that holds it (the top of the
// arena if none does). It returns the offsets, indexed like spans, and the
// arena top.
//
// The placed spans are kept in one slice sorted by offset and scanned from
// the bottom, stepping over those live at other times. The scan is
// quadratic in the worst case, but it is a tight loop over contiguous
// memory that first-fit leaves at the first hole; an interval index over
// the lifetimes, which must sort the overlapping spans by offset for every
// placement, measured several times slower on real programs.
func placeGreedy(spans []span, order []int, base int64, bestFit bool) ([]int64, int64) {
	type placed struct {
		lo, hi   int64
		from, to int
	}
	done := make([]placed, 0, len(order))
	offsets := make([]int64, len(spans))
	top := base
	for _, s := range order {
		size, a, from, to := spans[s].size, spans[s].align, spans[s].from, spans[s].to
		at := roundTo(base, a)
		bestAt, bestGap := int64(-1), int64(-1)
		for _, q := range done {
			if q.to < from || to < q.from {
				continue
			}
			if at+size <= q.lo {
				if !bestFit {
					break
				}
				if gap := q.lo - at; bestGap < 0 || gap < bestGap {
					bestAt, bestGap = at, gap
				}
			}
			at = roundTo(max(at, q.hi), a)
		}
		if bestFit && bestAt >= 0 {
			at = bestAt
		}
		offsets[s] = at
		top = max(top, at+size)
		i := sort.Search(len(done), func(i int) bool { return done[i].lo > at })
		done = slices.Insert(done, i, placed{at, at + size, from, to})
	}
	return offsets, top
}
