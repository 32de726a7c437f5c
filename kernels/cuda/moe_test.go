package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
)

// moeCases cover capacities that drop tokens (T·k > E·C) and ones that
// leave slots empty, groups of one token, and rows and index runs longer
// than a warp; GCOMPILE_FULL_TESTS=1 adds a wider one (two groups of 40
// tokens, 9 slots), which is most of the emulator's time.
var moeCases = append([]kcpu.MoEDims{
	{G: 1, T: 8, E: 4, C: 2, M: 3},
	{G: 3, T: 7, E: 5, C: 6, M: 5},
	{G: 1, T: 40, E: 8, C: 6, M: 33},
	{G: 2, T: 5, E: 3, C: 1, M: 1},
	{G: 1, T: 1, E: 1, C: 1, M: 2},
	{G: 2, T: 12, E: 6, C: 7, M: 70},
}, widerMoECases()...)

func widerMoECases() []kcpu.MoEDims {
	if os.Getenv("GCOMPILE_FULL_TESTS") != "1" {
		return nil
	}
	return []kcpu.MoEDims{{G: 2, T: 40, E: 8, C: 9, M: 33}}
}

func (c moeCase) String() string {
	d := c.d
	return fmt.Sprintf("G%d_T%d_E%d_C%d_M%d_%s", d.G, d.T, d.E, d.C, d.M, c.mask)
}

type moeCase struct {
	d    kcpu.MoEDims
	mask string
}

// routerScores draws n scores from a few values so that rows tie, with
// a NaN, and ±0 (equal, so tied) sprinkled in.
func routerScores(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		switch r.IntN(12) {
		case 0:
			v[i] = float32(math.NaN())
		case 1:
			v[i] = float32(math.Copysign(0, -1))
		default:
			v[i] = float32(r.IntN(5)-2) * 0.25
		}
	}
	return v
}

// routerMask is a selection over scores [G·T, E]: the top k of each row
// (k = 1, 2 or all), or an arbitrary one in which some tokens choose
// nothing and a NaN and a −0 stand for 1 and 0.
func routerMask(r *rand.Rand, kind string, scores []float32, d kcpu.MoEDims) []float32 {
	m := make([]float32, len(scores))
	switch kind {
	case "top1":
		kcpu.TopKMask(m, scores, d.G*d.T, d.E, 1)
	case "top2":
		kcpu.TopKMask(m, scores, d.G*d.T, d.E, min(2, d.E))
	case "all":
		kcpu.TopKMask(m, scores, d.G*d.T, d.E, d.E)
	default:
		for i := range m {
			switch r.IntN(7) {
			case 0:
				m[i] = float32(math.NaN())
			case 1:
				m[i] = float32(math.Copysign(0, -1))
			case 2, 3, 4:
				m[i] = 1
			}
		}
	}
	return m
}

func filled(n int, v int32) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// moeRoute runs the two routing launches into a fresh src.
func moeRoute(t *testing.T, grid, block uint32, d kcpu.MoEDims, scores, mask []float32) []int32 {
	t.Helper()
	rank, src := filled(d.G*d.T*d.E, -7), filled(d.G*d.E*d.C, -7)
	launch(t, "gc_moe_route_rank", grid, block, rank, scores, mask, d.G, d.T, d.E)
	launch(t, "gc_moe_route_fill", grid, block, src, rank, d.G, d.T, d.E, d.C)
	return src
}

// The top-k mask picks what the CPU's sort picks: ties to the lower
// index, NaN last, ±0 tied; and less is a plain comparison.
func TestTopKMaskAndLess(t *testing.T) {
	for _, n := range []int{1, 5, 8, 33, 100} {
		ks := []int{1, min(2, n), max(n/2, 1), max(n-1, 1), n}
		slices.Sort(ks)
		for _, k := range slices.Compact(ks) {
			for _, block := range blockSizes {
				t.Run(fmt.Sprintf("n%d_k%d_b%d", n, k, block), func(t *testing.T) {
					const rows = 6
					x := routerScores(newRand(uint64(n*31+k)), rows*n)
					want := make([]float32, rows*n)
					kcpu.TopKMask(want, x, rows, n, k)
					for _, grid := range []uint32{rows, 2} {
						got := out(rows * n)
						launch(t, "gc_top_k_mask", grid, block, got, x, rows, n, k)
						requireBits(t, want, got, "gc_top_k_mask")
					}
				})
			}
		}
	}
	r := newRand(5)
	a, b := routerScores(r, 300), routerScores(r, 300)
	a[0], b[0] = float32(math.Inf(-1)), float32(math.Inf(1))
	want, got := make([]float32, len(a)), out(len(a))
	kcpu.Less(want, a, b)
	launch(t, "gc_less", 3, 32, got, a, b, len(a))
	requireBits(t, want, got, "gc_less")
}

// Routing fills every expert's slots as the CPU's sequential walk does,
// for top-k masks and arbitrary ones, dropping and leaving slots empty.
func TestMoERoute(t *testing.T) {
	for _, d := range moeCases {
		for _, kind := range []string{"top1", "top2", "all", "any"} {
			for _, block := range blockSizes {
				c := moeCase{d, kind}
				t.Run(fmt.Sprintf("%v_b%d", c, block), func(t *testing.T) {
					r := newRand(uint64(d.G*1000 + d.T*10 + d.E))
					scores := routerScores(r, d.G*d.T*d.E)
					mask := routerMask(r, kind, scores, d)
					want := make([]int32, d.G*d.E*d.C)
					kcpu.MoERoute(want, scores, mask, d)
					for _, grid := range grids(d.G*d.T*d.E, block) {
						require.Equal(t, want, moeRoute(t, grid, block, d, scores, mask))
					}
				})
			}
		}
	}
}

// slotIndexes are the indices the slot kernels are tested on: moe_route's
// for a top-2 selection, and an arbitrary one in which a token sits in
// several slots of one expert and slots are empty anywhere.
func slotIndexes(t *testing.T, d kcpu.MoEDims) map[string][]int32 {
	t.Helper()
	r := newRand(uint64(d.G*7 + d.T*3 + d.C))
	scores := routerScores(r, d.G*d.T*d.E)
	routed := make([]int32, d.G*d.E*d.C)
	kcpu.MoERoute(routed, scores, routerMask(r, "top2", scores, d), d)
	anyIdx := make([]int32, d.G*d.E*d.C)
	for i := range anyIdx {
		anyIdx[i] = int32(r.IntN(d.T+1)) - 1
	}
	return map[string][]int32{"routed": routed, "any": anyIdx}
}

// Dispatch and combine, with and without weights, give the CPU's bits:
// dispatch moves or scales each row, combine adds a token's slots in the
// CPU's order from +0. The weights hold a −0 and a NaN.
func TestMoEDispatchCombine(t *testing.T) {
	for _, d := range moeCases {
		for name, src := range slotIndexes(t, d) {
			for _, weighted := range []bool{false, true} {
				for _, block := range blockSizes {
					t.Run(fmt.Sprintf("G%d_T%d_E%d_C%d_M%d_%s_w%v_b%d", d.G, d.T, d.E, d.C, d.M, name, weighted, block), func(t *testing.T) {
						r := newRand(uint64(d.M*13 + d.C))
						x := randNorm(r, d.G*d.T*d.M, 1)
						y := randNorm(r, d.E*d.G*d.C*d.M, 1)
						var w []float32
						if weighted {
							w = randNorm(r, d.G*d.E*d.C, 1)
							w[0] = float32(math.Copysign(0, -1))
							if len(w) > 3 {
								w[3] = float32(math.NaN())
							}
						}
						moeDispatchCombine(t, d, src, x, y, w, block)
					})
				}
			}
		}
	}
}

func moeDispatchCombine(t *testing.T, d kcpu.MoEDims, src []int32, x, y, w []float32, block uint32) {
	t.Helper()
	weighted, wArg := 0, x // the kernels read no weight when weighted is 0
	if w != nil {
		weighted, wArg = 1, w
	}
	status := []int32{0}
	want := make([]float32, d.E*d.G*d.C*d.M)
	require.NoError(t, kcpu.MoEDispatch(want, x, src, w, d))
	for _, grid := range grids(len(want), block) {
		got := out(len(want))
		launch(t, "gc_moe_dispatch", grid, block, got, status, x, src, wArg, d.G, d.T, d.M, d.E, d.C, weighted)
		requireBits(t, want, got, "gc_moe_dispatch")
	}
	want = make([]float32, d.G*d.T*d.M)
	require.NoError(t, kcpu.MoECombine(want, y, src, w, d))
	for _, grid := range []uint32{uint32(d.G * d.T), 2} {
		got := out(len(want))
		launch(t, "gc_moe_combine", grid, block, got, status, y, src, wArg, d.G, d.T, d.M, d.E, d.C, weighted)
		requireBits(t, want, got, "gc_moe_combine")
	}
	require.Zero(t, status[0])
}

// A token in more slots than a combine block lists at once (2048) is
// added in batches, in the same order: the bits do not change. The other
// token of the group sits in a few slots between them.
func TestMoECombineLongList(t *testing.T) {
	d := kcpu.MoEDims{G: 1, T: 2, E: 4, C: 600, M: 3}
	src := make([]int32, d.E*d.C)
	for i := range src {
		switch i % 97 {
		case 5:
			src[i] = 1
		case 6:
			src[i] = -1
		}
	}
	r := newRand(11)
	x, y, w := randNorm(r, d.G*d.T*d.M, 1), randNorm(r, d.E*d.G*d.C*d.M, 1), randNorm(r, d.E*d.C, 1)
	for _, block := range blockSizes {
		moeDispatchCombine(t, d, src, x, y, w, block)
		moeDispatchCombine(t, d, src, x, y, nil, block)
	}
}

// The gates' gradient sums in double like the CPU's, in another order:
// the results may differ by the double's rounding, far below a float's.
// Gather and scatter move bits (scatter adds the repeats of a token in
// one expert in the CPU's order, from +0).
func TestMoESlotKernels(t *testing.T) {
	for _, d := range moeCases {
		for name, src := range slotIndexes(t, d) {
			for _, block := range blockSizes {
				t.Run(fmt.Sprintf("G%d_T%d_E%d_C%d_M%d_%s_b%d", d.G, d.T, d.E, d.C, d.M, name, block), func(t *testing.T) {
					r := newRand(uint64(d.T*17 + d.M))
					x := randNorm(r, d.G*d.T*d.M, 1)
					y := randNorm(r, d.E*d.G*d.C*d.M, 1)
					status := []int32{0}
					slots := d.G * d.E * d.C

					want := make([]float32, slots)
					require.NoError(t, kcpu.MoESlotDot(want, y, x, src, d))
					bound := make([]float64, slots)
					for s := range bound {
						g, e, c := s/(d.E*d.C), s/d.C%d.E, s%d.C
						if tk := src[s]; tk >= 0 {
							for m := range d.M {
								bound[s] += math.Abs(float64(y[((e*d.G+g)*d.C+c)*d.M+m]) * float64(x[(g*d.T+int(tk))*d.M+m]))
							}
						}
						bound[s] = bound[s]*0x1p-45 + math.Abs(float64(want[s]))*0x1p-24
					}
					// One block per slot: at 256 threads the emulator
					// runs mostly idle lanes, so the widest block takes
					// only the looping grid.
					dotGrids := []uint32{uint32(slots), 2}
					if block > 96 {
						dotGrids = dotGrids[1:]
					}
					for _, grid := range dotGrids {
						got := out(slots)
						launch(t, "gc_moe_slot_dot", grid, block, got, status, y, src, x, d.G, d.T, d.M, d.E, d.C)
						requireWithin(t, want, got, bound, "gc_moe_slot_dot")
					}

					p := routerScores(r, d.G*d.T*d.E)
					want = make([]float32, slots)
					require.NoError(t, kcpu.MoESlotGather(want, p, src, d))
					for _, grid := range grids(slots, block) {
						got := out(slots)
						launch(t, "gc_moe_slot_gather", grid, block, got, status, p, src, d.G, d.T, d.E, d.C)
						requireBits(t, want, got, "gc_moe_slot_gather")
					}

					w := randNorm(r, slots, 1)
					w[0] = float32(math.Copysign(0, -1))
					want = make([]float32, d.G*d.T*d.E)
					require.NoError(t, kcpu.MoESlotScatter(want, w, src, d))
					for _, grid := range grids(len(want), block) {
						got := out(len(want))
						launch(t, "gc_moe_slot_scatter", grid, block, got, status, w, src, d.G, d.T, d.E, d.C)
						requireBits(t, want, got, "gc_moe_slot_scatter")
					}
					require.Zero(t, status[0])
				})
			}
		}
	}
}

// A slot naming no token of its group (the CPU kernels refuse it) reads
// nothing, counts as empty and sets the status word, in every kernel
// that reads src.
func TestMoEBadSlotSetsStatus(t *testing.T) {
	d := kcpu.MoEDims{G: 2, T: 3, E: 2, C: 2, M: 4}
	r := newRand(2)
	x, y := randNorm(r, d.G*d.T*d.M, 1), randNorm(r, d.E*d.G*d.C*d.M, 1)
	w, p := randNorm(r, d.G*d.E*d.C, 1), randNorm(r, d.G*d.T*d.E, 1)
	for _, bad := range []int32{3, -2, math.MaxInt32, math.MinInt32} {
		src := []int32{0, 1, -1, 2, 2, bad, 1, 0}
		good := slices.Clone(src)
		good[5] = -1 // what the kernels make of the bad slot
		for _, k := range []struct {
			name string
			n    int
			args func(got []float32, status []int32, src []int32) []any
		}{
			{"gc_moe_dispatch", d.E * d.G * d.C * d.M, func(got []float32, status, src []int32) []any {
				return []any{got, status, x, src, w, d.G, d.T, d.M, d.E, d.C, 1}
			}},
			{"gc_moe_combine", d.G * d.T * d.M, func(got []float32, status, src []int32) []any {
				return []any{got, status, y, src, w, d.G, d.T, d.M, d.E, d.C, 1}
			}},
			{"gc_moe_slot_dot", d.G * d.E * d.C, func(got []float32, status, src []int32) []any {
				return []any{got, status, y, src, x, d.G, d.T, d.M, d.E, d.C}
			}},
			{"gc_moe_slot_gather", d.G * d.E * d.C, func(got []float32, status, src []int32) []any {
				return []any{got, status, p, src, d.G, d.T, d.E, d.C}
			}},
			{"gc_moe_slot_scatter", d.G * d.T * d.E, func(got []float32, status, src []int32) []any {
				return []any{got, status, w, src, d.G, d.T, d.E, d.C}
			}},
		} {
			status := []int32{0}
			want := out(k.n)
			launch(t, k.name, 4, 32, k.args(want, status, good)...)
			require.Zero(t, status[0], k.name)
			got := out(k.n)
			launch(t, k.name, 4, 32, k.args(got, status, src)...)
			require.Equal(t, int32(1), status[0], "%s with slot %d", k.name, bad)
			requireBits(t, want, got, k.name+" with a bad slot")
		}
	}
}
