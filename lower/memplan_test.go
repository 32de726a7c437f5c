package lower

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/passes"
)

// randomSpans makes m lifetimes over n instructions with sizes that mix
// small (8-byte aligned) and large (cache-line aligned) buffers, and that
// repeat often, as layers do, so exact fits and merges happen.
func randomSpans(r *rand.Rand, n, m, maxLife int) []span {
	common := []int64{8, 24, 200, 256, 1000, 4096, 12288, 65536, 1 << 20}
	spans := make([]span, m)
	for i := range spans {
		raw := common[r.IntN(len(common))]
		if r.IntN(3) == 0 {
			raw = 1 + r.Int64N(1<<16)
		}
		from := r.IntN(n)
		to := min(n, from+r.IntN(maxLife+1))
		spans[i] = span{size: alignUp(raw), align: alignOf(raw), from: from, to: to}
	}
	return spans
}

// naiveGap is a free range of the reference allocator.
type naiveGap struct{ lo, hi int64 }

// naiveTake is first-fit over a sorted slice of gaps: the lowest gap
// whose aligned start leaves room for size; -1 if none has room, which the
// open top gap rules out.
func naiveTake(free []naiveGap, size, align int64) ([]naiveGap, int64) {
	for g, x := range free {
		at := roundTo(x.lo, align)
		if at+size > x.hi {
			continue
		}
		var pieces []naiveGap
		if at > x.lo {
			pieces = append(pieces, naiveGap{x.lo, at})
		}
		if at+size < x.hi {
			pieces = append(pieces, naiveGap{at + size, x.hi})
		}
		return slices.Replace(free, g, g+1, pieces...), at
	}
	return free, -1
}

// naiveGive adds [lo, hi) and coalesces touching gaps by sorting them all.
func naiveGive(free []naiveGap, lo, hi int64) []naiveGap {
	free = append(free, naiveGap{lo, hi})
	slices.SortFunc(free, func(a, b naiveGap) int { return cmp.Compare(a.lo, b.lo) })
	out := free[:1]
	for _, g := range free[1:] {
		if last := &out[len(out)-1]; last.hi == g.lo {
			last.hi = g.hi
		} else {
			out = append(out, g)
		}
	}
	return out
}

// naiveLinearScan is linearScan's specification written as plainly as
// possible: quadratic, but obviously first-fit in program order.
func naiveLinearScan(spans []span, base int64, n int) ([]int64, int64) {
	free := []naiveGap{{base, math.MaxInt64}}
	offsets := make([]int64, len(spans))
	top := base
	for i := 0; i <= n; i++ {
		var born []int
		for s := range spans {
			if spans[s].from == i {
				born = append(born, s)
			}
		}
		slices.SortStableFunc(born, func(a, b int) int { return cmp.Compare(spans[b].size, spans[a].size) })
		for _, s := range born {
			free, offsets[s] = naiveTake(free, spans[s].size, spans[s].align)
			top = max(top, offsets[s]+spans[s].size)
		}
		for s := range spans {
			if spans[s].to == i {
				free = naiveGive(free, offsets[s], offsets[s]+spans[s].size)
			}
		}
	}
	return offsets, top
}

// naivePlace is the greedy placement by a scan over every placed span in
// offset order, skipping those whose lifetimes do not overlap.
func naivePlace(spans []span, order []int, base int64, bestFit bool) ([]int64, int64) {
	offsets := make([]int64, len(spans))
	var placed []int
	top := base
	for _, s := range order {
		size, a := spans[s].size, spans[s].align
		at := roundTo(base, a)
		bestAt, bestGap := int64(-1), int64(-1)
		for _, q := range placed {
			if spans[q].to < spans[s].from || spans[s].to < spans[q].from {
				continue
			}
			if at+size <= offsets[q] {
				if !bestFit {
					break
				}
				if gap := offsets[q] - at; bestGap < 0 || gap < bestGap {
					bestAt, bestGap = at, gap
				}
			}
			at = roundTo(max(at, offsets[q]+spans[q].size), a)
		}
		if bestFit && bestAt >= 0 {
			at = bestAt
		}
		offsets[s] = at
		top = max(top, at+size)
		placed = append(placed, s)
		slices.SortStableFunc(placed, func(x, y int) int { return cmp.Compare(offsets[x], offsets[y]) })
	}
	return offsets, top
}

// requireValidPlan checks what any plan must satisfy: aligned offsets at
// or above base, a top that covers every span, and no two spans live at
// the same instruction sharing a byte.
func requireValidPlan(t *testing.T, spans []span, offsets []int64, base, top int64) {
	t.Helper()
	for i, s := range spans {
		require.Zero(t, offsets[i]%s.align, "span %d at %d is not aligned to %d", i, offsets[i], s.align)
		require.GreaterOrEqual(t, offsets[i], base, "span %d below the temporaries", i)
		require.LessOrEqual(t, offsets[i]+s.size, top, "span %d above the arena top", i)
		for j := range i {
			q := spans[j]
			if s.to < q.from || q.to < s.from {
				continue
			}
			overlap := offsets[i] < offsets[j]+q.size && offsets[j] < offsets[i]+s.size
			require.False(t, overlap, "spans %d %+v at %d and %d %+v at %d are live together and share bytes", i, s, offsets[i], j, q, offsets[j])
		}
	}
	require.GreaterOrEqual(t, top-base, livePeak(spans, maxTo(spans)), "the arena holds less than is live at once")
}

// livePeak is the most bytes of spans live at one instruction: no
// placement fits them in less.
func livePeak(spans []span, n int) int64 {
	delta := make([]int64, n+2)
	for _, s := range spans {
		delta[s.from] += s.size
		delta[s.to+1] -= s.size
	}
	var live, peak int64
	for _, d := range delta {
		live += d
		peak = max(peak, live)
	}
	return peak
}

func maxTo(spans []span) int {
	n := 0
	for _, s := range spans {
		n = max(n, s.to)
	}
	return n
}

var spanShapes = []struct {
	n, m, maxLife int
	base          int64
}{
	{n: 1, m: 5, maxLife: 0, base: 0},
	{n: 20, m: 40, maxLife: 3, base: 8},
	{n: 50, m: 200, maxLife: 10, base: 72},
	{n: 200, m: 300, maxLife: 200, base: 4104},
	{n: 400, m: 800, maxLife: 25, base: 0},
}

func TestLinearScanIsFirstFitInProgramOrder(t *testing.T) {
	for _, sh := range spanShapes {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("n%d_m%d_life%d_seed%d", sh.n, sh.m, sh.maxLife, seed), func(t *testing.T) {
				spans := randomSpans(rand.New(rand.NewPCG(seed, uint64(sh.n))), sh.n, sh.m, sh.maxLife)
				got, top := linearScan(spans, sh.base, sh.n)
				want, wantTop := naiveLinearScan(spans, sh.base, sh.n)
				require.Equal(t, want, got, "offsets")
				require.Equal(t, wantTop, top, "arena top")
				requireValidPlan(t, spans, got, sh.base, top)
			})
		}
	}
}

func TestGreedyPlaceMatchesAScanOverEveryPlacedBuffer(t *testing.T) {
	for _, sh := range spanShapes {
		for seed := range uint64(10) {
			r := rand.New(rand.NewPCG(seed, uint64(sh.m)))
			spans := randomSpans(r, sh.n, sh.m, sh.maxLife)
			order := r.Perm(len(spans))
			for _, bestFit := range []bool{false, true} {
				t.Run(fmt.Sprintf("n%d_m%d_seed%d_bestfit=%v", sh.n, sh.m, seed, bestFit), func(t *testing.T) {
					got, top := placeGreedy(spans, order, sh.base, bestFit)
					want, wantTop := naivePlace(spans, order, sh.base, bestFit)
					require.Equal(t, want, got, "offsets")
					require.Equal(t, wantTop, top, "arena top")
					requireValidPlan(t, spans, got, sh.base, top)
				})
			}
		}
	}
}

// First-fit, stated without any scan: each span sits at the lowest aligned
// offset at or above base where it overlaps no span placed before it that
// is live at the same time. The lowest such offset is base rounded up, or
// the aligned end of one of those spans.
func TestGreedyFirstFitTakesTheLowestFreeOffset(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 5))
		const n, base = 60, 24
		spans := randomSpans(r, n, 150, 15)
		order := r.Perm(len(spans))
		offsets, _ := placeGreedy(spans, order, base, false)
		for j, s := range order {
			var live []int
			for _, q := range order[:j] {
				if spans[q].from <= spans[s].to && spans[s].from <= spans[q].to {
					live = append(live, q)
				}
			}
			a, size := spans[s].align, spans[s].size
			free := func(x int64) bool {
				for _, q := range live {
					if x < offsets[q]+spans[q].size && offsets[q] < x+size {
						return false
					}
				}
				return true
			}
			require.True(t, free(offsets[s]), "seed %d: span %d overlaps a live span", seed, s)
			candidates := []int64{roundTo(base, a)}
			for _, q := range live {
				candidates = append(candidates, roundTo(offsets[q]+spans[q].size, a))
			}
			for _, c := range candidates {
				if c < offsets[s] {
					require.False(t, free(c), "seed %d: span %d placed at %d though %d was free", seed, s, offsets[s], c)
				}
			}
		}
	}
}

// checkGaps walks the treap and checks its invariants: gaps in offset
// order, disjoint and never touching (merged), heap-ordered priorities and
// subtree maxima that match the gaps below.
func checkGaps(t *testing.T, f *freeGaps) []naiveGap {
	t.Helper()
	var out []naiveGap
	var walk func(v int32) [len(alignments)]int64
	walk = func(v int32) [len(alignments)]int64 {
		var most [len(alignments)]int64
		for k := range most {
			most[k] = math.MinInt64
		}
		if v == none {
			return most
		}
		n := f.nodes[v]
		for _, c := range []int32{n.left, n.right} {
			if c != none {
				require.LessOrEqual(t, f.nodes[c].prio, n.prio, "heap order")
			}
		}
		l := walk(n.left)
		out = append(out, naiveGap{n.lo, n.hi})
		r := walk(n.right)
		for k := range most {
			most[k] = max(l[k], r[k], room(n.lo, n.hi, k))
			require.Equal(t, most[k], n.most[k], "subtree maximum at gap [%d, %d)", n.lo, n.hi)
		}
		return most
	}
	walk(f.root)
	for i := 1; i < len(out); i++ {
		require.Less(t, out[i-1].hi, out[i].lo, "gaps %v and %v overlap or touch", out[i-1], out[i])
	}
	require.Equal(t, int64(open), out[len(out)-1].hi, "the top gap is open")
	return out
}

func TestFreeGapsTakeAndGiveLikeASortedList(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	const base = 40
	f := newFreeGaps(base)
	ref := []naiveGap{{base, math.MaxInt64}}
	type alloc struct{ lo, hi int64 }
	var held []alloc
	for step := range 3000 {
		if len(held) == 0 || r.IntN(5) < 3 {
			raw := 1 + r.Int64N(1000)
			size, a := alignUp(raw), alignOf(raw)
			at := f.take(size, a)
			var want int64
			ref, want = naiveTake(ref, size, a)
			require.Equal(t, want, at, "step %d: take(%d, %d)", step, size, a)
			held = append(held, alloc{at, at + size})
		} else {
			k := r.IntN(len(held))
			h := held[k]
			held = slices.Delete(held, k, k+1)
			f.give(h.lo, h.hi)
			ref = naiveGive(ref, h.lo, h.hi)
		}
		require.Equal(t, ref, checkGaps(t, f), "step %d", step)
	}
	for _, h := range held {
		f.give(h.lo, h.hi)
	}
	assert.Equal(t, []naiveGap{{base, math.MaxInt64}}, checkGaps(t, f), "everything given back is one gap again")
	assert.LessOrEqual(t, len(f.nodes), 3000, "nodes are recycled")
}

func TestGreedyOrdersNeverLoseToTheLinearScan(t *testing.T) {
	for seed := range uint64(10) {
		r := rand.New(rand.NewPCG(seed, 99))
		const n = 120
		spans := randomSpans(r, n, 400, 60)
		p := &Program{Instrs: make([]Instr, n), Buffers: make([]Buffer, len(spans))}
		temps := make([]int, len(spans))
		for i := range spans {
			temps[i] = i
			p.Buffers[i].Bytes = spans[i].size
		}
		lin, linTop := linearScan(spans, 0, n)
		got, top := tryGreedyOrders(p, temps, spans, 0, livePeak(spans, n), lin, linTop)
		requireValidPlan(t, spans, got, 0, top)
		assert.LessOrEqual(t, top, linTop, "seed %d", seed)
	}
}

// The memory plan is a function of the program: planning again gives the
// same offsets, the same arena and the same frees, each temporary freed
// once, at its last read.
func TestPlanMemoryIsRepeatable(t *testing.T) {
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 2, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Microbatches = 2
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	for _, offload := range []string{"", "optimizer,params"} {
		p, err := LowerWith(m, Options{Offload: offload})
		require.NoError(t, err)
		snapshot := func() (offsets []int64, frees [][]int) {
			for _, b := range p.Buffers {
				offsets = append(offsets, b.Offset)
			}
			for _, in := range p.Instrs {
				frees = append(frees, slices.Clone(in.Frees))
			}
			return offsets, frees
		}
		offsets, frees := snapshot()
		arena, peak, at := p.ArenaBytes, p.PeakBytes, p.PeakAt
		PlanMemory(p)
		offsets2, frees2 := snapshot()
		assert.Equal(t, offsets, offsets2, "offload %q: offsets", offload)
		assert.Equal(t, frees, frees2, "offload %q: frees", offload)
		assert.Equal(t, arena, p.ArenaBytes, "offload %q: arena", offload)
		assert.Equal(t, peak, p.PeakBytes)
		assert.Equal(t, at, p.PeakAt)

		lastRead := map[int]int{}
		for i, in := range p.Instrs {
			for _, a := range in.Args {
				lastRead[a] = i
			}
		}
		freedAt := map[int]int{}
		for i, in := range p.Instrs {
			for _, b := range in.Frees {
				_, twice := freedAt[b]
				require.False(t, twice, "offload %q: buffer %d freed twice", offload, b)
				freedAt[b] = i
				assert.True(t, isTemp(p, b), "offload %q: buffer %d freed but not a device temporary", offload, b)
			}
		}
		for b, i := range lastRead {
			if isTemp(p, b) && !isOutput(p, b) {
				assert.Equal(t, i, freedAt[b], "offload %q: buffer %d is freed at its last read", offload, b)
			}
		}
	}
}
