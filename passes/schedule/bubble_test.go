package schedule

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// microCounts is the m grid of the bubble tests: m = p, 2p, 4p and the
// non-multiple 3p+1 (which also exercises m not divisible by p).
func microCounts(p int) []int {
	return []int{p, 2 * p, 4 * p, 3*p + 1}
}

func simulate(t *testing.T, s *Schedule, cost Cost) *Result {
	t.Helper()
	res, err := Simulate(s, cost)
	require.NoError(t, err, "schedule:\n%s", s)
	return res
}

// GPipe, 1F1B and 2BW (same order as 1F1B) have the textbook bubble
// (p−1)/m with F=1, B=2: (m+p−1)(F+B) step time against m(F+B) of work.
func TestBubbleGPipe1F1B2BW(t *testing.T) {
	for _, name := range []string{"gpipe", "1f1b", "2bw"} {
		for _, p := range []int{1, 2, 3, 4, 8} {
			for _, m := range microCounts(p) {
				t.Run(fmt.Sprintf("%s/p=%d/m=%d", name, p, m), func(t *testing.T) {
					s, err := New(name, p, 1, m)
					require.NoError(t, err)
					res := simulate(t, s, UnitCost)
					want := float64(p-1) / float64(m)
					assert.InDelta(t, want, res.Bubble, 1e-12)
					assert.InDelta(t, float64(3*(m+p-1)), res.StepTime, 1e-12)
					assert.InDelta(t, float64(3*m), res.Ideal, 1e-12)
					for r := 0; r < p; r++ {
						assert.InDelta(t, float64(3*m), res.Busy[r], 1e-12, "rank %d", r)
					}
				})
			}
		}
	}
}

// Interleaved 1F1B divides the bubble by v: (p−1)/(v·m) with per-chunk
// costs F=1, B=2.
func TestBubbleInterleaved(t *testing.T) {
	for _, p := range []int{2, 4} {
		for _, v := range []int{2, 3} {
			for _, m := range []int{p, 2 * p, 4 * p} {
				t.Run(fmt.Sprintf("p=%d/v=%d/m=%d", p, v, m), func(t *testing.T) {
					s, err := Interleaved(p, v, m)
					require.NoError(t, err)
					res := simulate(t, s, UnitCost)
					assert.InDelta(t, float64(p-1)/float64(v*m), res.Bubble, 1e-12)
					assert.InDelta(t, float64(3*v*m), res.Ideal, 1e-12)
				})
			}
		}
	}
}

// With everything on one rank the interleaved chunks pass data locally and
// there is nothing to wait for.
func TestInterleavedSingleRank(t *testing.T) {
	s, err := Interleaved(1, 3, 4)
	require.NoError(t, err)
	res := simulate(t, s, UnitCost)
	assert.Zero(t, res.Bubble)
}

// ZB-H1 with F=B=W=1 must beat 1F1B with the same per-microbatch work
// (F=1, B+W=2). The paper's figure, bubble time (p−1)(F+B−W) against 1F1B's
// (p−1)(F+B+W), makes it exactly a third: (p−1)/(3m).
func TestBubbleZeroBubble(t *testing.T) {
	for _, p := range []int{2, 4, 8} {
		for _, m := range []int{p, 2 * p, 4 * p} {
			t.Run(fmt.Sprintf("p=%d/m=%d", p, m), func(t *testing.T) {
				zb, err := ZeroBubble(p, m)
				require.NoError(t, err)
				ofob, err := OneFOneB(p, m)
				require.NoError(t, err)
				rz := simulate(t, zb, UnitCostZB)
				ro := simulate(t, ofob, UnitCost)
				assert.InDelta(t, ro.Ideal, rz.Ideal, 1e-12, "same work per rank")
				assert.Less(t, rz.Bubble, ro.Bubble)
				assert.Less(t, rz.StepTime, ro.StepTime)
				assert.InDelta(t, float64(p-1)/float64(3*m), rz.Bubble, 1e-12)
				// ZB-H1 keeps 1F1B's bound, p microbatches, but on every
				// rank: a W runs after the B that 1F1B ends with.
				assert.Equal(t, slices.Max(ro.StashPeak), slices.Max(rz.StashPeak))
				for r := range p {
					assert.Equal(t, min(p, m), rz.StashPeak[r], "rank %d", r)
				}
			})
		}
	}
}

func TestStashPeak(t *testing.T) {
	for _, p := range []int{1, 2, 4, 8} {
		for _, m := range microCounts(p) {
			ofob, err := OneFOneB(p, m)
			require.NoError(t, err)
			gp, err := GPipe(p, m)
			require.NoError(t, err)
			ro := simulate(t, ofob, UnitCost)
			rg := simulate(t, gp, UnitCost)
			for r := 0; r < p; r++ {
				assert.LessOrEqual(t, ro.StashPeak[r], p-r, "1f1b p=%d m=%d rank %d", p, m, r)
				assert.Equal(t, min(p-r, m), ro.StashPeak[r], "1f1b p=%d m=%d rank %d", p, m, r)
				assert.Equal(t, m, rg.StashPeak[r], "gpipe p=%d m=%d rank %d", p, m, r)
			}
		}
	}
}

// Megatron's interleaved warm-up of 2(p−1−r) + (v−1)·p forwards bounds the
// chunks stashed on rank r by that plus one; on rank 0 it is p·v + p − 1
// chunks, i.e. (1 + (p−1)/(p·v))·p stages' worth, the paper's figure.
func TestStashPeakInterleaved(t *testing.T) {
	for _, p := range []int{1, 2, 4, 8} {
		for _, v := range []int{2, 3, 4} {
			for _, m := range []int{p, 2 * p, 4 * p} {
				s, err := Interleaved(p, v, m)
				require.NoError(t, err)
				res := simulate(t, s, UnitCost)
				for r := 0; r < p; r++ {
					bound := min(v*m, 2*(p-1-r)+(v-1)*p+1)
					assert.LessOrEqual(t, res.StashPeak[r], bound, "p=%d v=%d m=%d rank %d", p, v, m, r)
					assert.LessOrEqual(t, res.StashPeak[r], p*v+p-1, "p=%d v=%d m=%d rank %d", p, v, m, r)
				}
			}
		}
	}
}

// Whether a schedule deadlocks depends only on the order, never on the
// costs: every generator must also run under lopsided, fractional costs and
// non-free transfers.
func TestGeneratorsRunUnderOtherCosts(t *testing.T) {
	cost := func(a Action) float64 {
		switch a.Kind {
		case F:
			return 1.3 + 0.1*float64(a.Chunk%3)
		case B:
			return 2.9
		case W:
			return 0.7
		case SendF, SendB:
			return 0.25
		case GradSync:
			return 5
		}
		return 0
	}
	for _, c := range generatorCases() {
		t.Run(c.String(), func(t *testing.T) {
			s, err := New(c.name, c.p, c.v, c.m)
			require.NoError(t, err)
			res := simulate(t, s, cost)
			assert.Greater(t, res.StepTime, res.Ideal)
			assert.GreaterOrEqual(t, res.Bubble, 0.0)
		})
	}
}

// A hand-checked timeline: 1F1B, p=2, m=2, F=1, B=2.
func TestStartTimes1F1B(t *testing.T) {
	s, err := OneFOneB(2, 2)
	require.NoError(t, err)
	res := simulate(t, s, UnitCost)
	starts := map[string]float64{}
	for r, acts := range s.Actions {
		for i, a := range acts {
			starts[fmt.Sprintf("r%d %s", r, a)] = res.Start[r][i]
		}
	}
	want := map[string]float64{
		"r0 0F0": 0, "r0 0F1": 1, "r0 0rb0<r1": 4, "r0 0B0": 4, "r0 0B1": 7, "r0 sync": 9,
		"r1 1rf0<r0": 1, "r1 1F0": 1, "r1 1B0": 2, "r1 1F1": 4, "r1 1B1": 5, "r1 1sb1>r0": 7,
	}
	for k, v := range want {
		assert.Equal(t, v, starts[k], k)
	}
	assert.Equal(t, 9.0, res.StepTime)
	assert.Equal(t, []int{2, 1}, res.StashPeak)
}

func TestNilCostIsUnitCost(t *testing.T) {
	s, err := OneFOneB(4, 8)
	require.NoError(t, err)
	a := simulate(t, s, nil)
	b := simulate(t, s, UnitCost)
	assert.Equal(t, b, a)
}

func TestBadCost(t *testing.T) {
	s, err := OneFOneB(2, 2)
	require.NoError(t, err)
	_, err = Simulate(s, func(a Action) float64 {
		if a.Kind == B {
			return -1
		}
		return 1
	})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "finite and ≥ 0")
}

// A backward whose input gradient leaves halfway (its weight gradient,
// or its data-parallel reductions, after the send) lets the rank before
// start its backward then: on two ranks and one microbatch (F = 1, B =
// 2, ready after 1), rank 0's backward starts at 3, not 4, and the step
// ends at 5. A ready time of the whole cost is Simulate.
func TestSimulateReadySendsWhenTheValueIsMade(t *testing.T) {
	s, err := New("gpipe", 2, 1, 1)
	require.NoError(t, err)
	backStart := func(res *Result, r int) float64 {
		i := slices.IndexFunc(s.Actions[r], func(a Action) bool { return a.Kind == B })
		return res.Start[r][i]
	}
	half := func(a Action) float64 {
		if a.Kind == B {
			return 1
		}
		return UnitCost(a)
	}
	res, err := SimulateReady(s, UnitCost, half)
	require.NoError(t, err)
	assert.InDelta(t, 3, backStart(res, 0), 1e-12)
	assert.InDelta(t, 5, res.StepTime, 1e-12)
	assert.InDelta(t, 2, backStart(res, 1), 1e-12)
	whole, err := SimulateReady(s, UnitCost, UnitCost)
	require.NoError(t, err)
	plain := simulate(t, s, UnitCost)
	assert.Equal(t, plain.Start, whole.Start)
	assert.InDelta(t, 6, whole.StepTime, 1e-12)
}
