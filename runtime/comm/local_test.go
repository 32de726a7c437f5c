package comm

// Internal tests: a few need to see that a member is really blocked (an
// arrival registered, a Send queued) before acting, which the public API
// cannot tell without sleeping.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"gcompile/runtime"
	"github.com/stretchr/testify/require"
)

// hangAfter is how long a test waits before calling a collective hung.
const hangAfter = 5 * time.Second

// within runs f and fails the test if it has not returned after hangAfter,
// so a deadlock is a failure naming the test, not a stuck test binary.
func within(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(hangAfter):
		t.Fatalf("still blocked after %v", hangAfter)
	}
}

// runMembers calls f for every member of g, each on its own goroutine, and
// returns the errors by position.
func runMembers(t *testing.T, g runtime.Group, f func(pos, rank int) error) []error {
	t.Helper()
	errs := make([]error, g.Size())
	within(t, func() {
		var wg sync.WaitGroup
		for p, r := range g.Ranks {
			wg.Go(func() { errs[p] = f(p, r) })
		}
		wg.Wait()
	})
	return errs
}

// waitUntil polls cond and reports whether it held before hangAfter. It
// only marks the test failed (never stops it), so goroutines may call it.
func waitUntil(t *testing.T, what string, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(hangAfter)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("%s never happened", what)
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	return true
}

// waiting is the number of members registered in g's open meetings.
func (c *Local) waiting(g runtime.Group) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	gs := c.groups[string(g.Key())]
	if gs == nil {
		return 0
	}
	n := 0
	for _, m := range gs.meetings {
		n += m.arrived
	}
	return n
}

// queued is the number of Sends and Recvs waiting on one key.
func (c *Local) queued(from, to, tag int) (sends, recvs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := p2pKey{from, to, tag}
	return len(c.mail[k]), len(c.waits[k])
}

func randSlice[T Float](rng *rand.Rand, n int) []T {
	x := make([]T, n)
	for i := range x {
		x[i] = T(rng.NormFloat64())
	}
	return x
}

// bitsOf makes float comparisons exact: -0 differs from 0 and every last
// bit counts. float32 to float64 is exact, so one form serves both.
func bitsOf[T Float](x []T) []uint64 {
	b := make([]uint64, len(x))
	for i, v := range x {
		b[i] = math.Float64bits(float64(v))
	}
	return b
}

// posSum is the reference reduction: ((x0 + x1) + x2) + ... in T.
func posSum[T Float](xs [][]T) []T {
	out := slices.Clone(xs[0])
	for _, x := range xs[1:] {
		for i := range out {
			out[i] += x[i]
		}
	}
	return out
}

func cloneAll[T any](xs [][]T) [][]T {
	out := make([][]T, len(xs))
	for i, x := range xs {
		out[i] = slices.Clone(x)
	}
	return out
}

// groupCases are groups of 1 to 4 members out of 4 to 8 devices, including
// non-contiguous ranks and position orders that differ from rank order.
var groupCases = []struct {
	name    string
	devices int
	ranks   []int
}{
	{"one", 4, []int{2}},
	{"pair", 4, []int{0, 1}},
	{"pair 1,3", 4, []int{1, 3}},
	{"triple 0,2,5", 6, []int{0, 2, 5}},
	{"triple 4,1,3", 5, []int{4, 1, 3}},
	{"four of 4", 4, []int{0, 1, 2, 3}},
	{"four of 8", 8, []int{7, 0, 5, 2}},
}

func TestGroup(t *testing.T) {
	g := runtime.Group{Ranks: []int{5, 0, 3}}
	assert.Equal(t, 3, g.Size())
	assert.Equal(t, 0, g.Pos(5))
	assert.Equal(t, 2, g.Pos(3))
	assert.Equal(t, -1, g.Pos(1))
	assert.Equal(t, 0, runtime.Group{}.Size())
	assert.Equal(t, -1, runtime.Group{}.Pos(0))
	assert.Equal(t, "[5 0 3]", g.String())
	assert.Equal(t, 6, NewLocal(6).Size())
}

// A comm without devices has no valid rank; every call says so.
func TestCommWithoutDevicesFailsEveryCall(t *testing.T) {
	for _, devices := range []int{0, -2} {
		c := NewLocal(devices)
		err := AllReduce(c, runtime.Group{Ranks: []int{0}}, 0, make([]float32, 1))
		assert.ErrorIs(t, err, runtime.ErrGroup)
		assert.ErrorContains(t, err, fmt.Sprintf("rank 0 at position 0 is outside [0,%d)", devices))
		err = Send(c, 0, 1, 0, make([]float32, 1))
		assert.ErrorIs(t, err, runtime.ErrGroup)
		assert.ErrorContains(t, err, fmt.Sprintf("rank 0 is outside [0,%d)", devices))
	}
}

func TestAllReduce(t *testing.T) {
	t.Run("float32", testAllReduce[float32])
	t.Run("float64", testAllReduce[float64])
}

func testAllReduce[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buckets := [][]int{{}, {0}, {1}, {7}, {1001}, {3, 0, 17, 1}, {0, 0}, {2, 5}}
	for _, gc := range groupCases {
		for _, lens := range buckets {
			t.Run(fmt.Sprintf("%s/%v", gc.name, lens), func(t *testing.T) {
				c := NewLocal(gc.devices)
				g := runtime.Group{Ranks: gc.ranks}
				in := make([][][]T, g.Size()) // [position][buffer]
				for p := range in {
					for _, n := range lens {
						in[p] = append(in[p], randSlice[T](rng, n))
					}
				}
				want := make([][]uint64, len(lens))
				for i := range lens {
					col := make([][]T, g.Size())
					for p := range col {
						col[p] = in[p][i]
					}
					want[i] = bitsOf(posSum(col))
				}
				bufs := make([][][]T, g.Size())
				for p := range bufs {
					bufs[p] = cloneAll(in[p])
				}
				errs := runMembers(t, g, func(p, r int) error { return AllReduce(c, g, r, bufs[p]...) })
				for p, err := range errs {
					require.NoError(t, err)
					for i := range lens {
						assert.Equal(t, want[i], bitsOf(bufs[p][i]), "position %d buffer %d", p, i)
					}
				}
			})
		}
	}
}

func TestReduceScatter(t *testing.T) {
	t.Run("float32", testReduceScatter[float32])
	t.Run("float64", testReduceScatter[float64])
}

func testReduceScatter[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, gc := range groupCases {
		for _, k := range []int{0, 1, 7, 100} {
			for _, inPlace := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/chunk %d/in place %v", gc.name, k, inPlace), func(t *testing.T) {
					c := NewLocal(gc.devices)
					g := runtime.Group{Ranks: gc.ranks}
					n := g.Size()
					in := make([][]T, n)
					for p := range in {
						in[p] = randSlice[T](rng, n*k)
					}
					want := bitsOf(posSum(in))
					ins, outs := cloneAll(in), make([][]T, n)
					for p := range outs {
						outs[p] = make([]T, k)
						if inPlace {
							outs[p] = ins[p][p*k : (p+1)*k]
						}
					}
					errs := runMembers(t, g, func(p, r int) error { return ReduceScatter(c, g, r, ins[p], outs[p]) })
					for p, err := range errs {
						require.NoError(t, err)
						assert.Equal(t, want[p*k:(p+1)*k], bitsOf(outs[p]), "position %d", p)
						if !inPlace {
							assert.Equal(t, bitsOf(in[p]), bitsOf(ins[p]), "position %d: in is left alone", p)
						}
					}
				})
			}
		}
	}
}

func TestAllGather(t *testing.T) {
	t.Run("float32", testAllGather[float32])
	t.Run("float64", testAllGather[float64])
}

func testAllGather[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, gc := range groupCases {
		for _, k := range []int{0, 1, 7, 100} {
			for _, inPlace := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/chunk %d/in place %v", gc.name, k, inPlace), func(t *testing.T) {
					c := NewLocal(gc.devices)
					g := runtime.Group{Ranks: gc.ranks}
					n := g.Size()
					in := make([][]T, n)
					var want []T
					for p := range in {
						in[p] = randSlice[T](rng, k)
						want = append(want, in[p]...)
					}
					ins, outs := make([][]T, n), make([][]T, n)
					for p := range outs {
						outs[p] = make([]T, n*k)
						ins[p] = slices.Clone(in[p])
						if inPlace {
							ins[p] = outs[p][p*k : (p+1)*k]
							copy(ins[p], in[p])
						}
					}
					errs := runMembers(t, g, func(p, r int) error { return AllGather(c, g, r, ins[p], outs[p]) })
					for p, err := range errs {
						require.NoError(t, err)
						assert.Equal(t, bitsOf(want), bitsOf(outs[p]), "position %d", p)
					}
				})
			}
		}
	}
}

func TestAllToAll(t *testing.T) {
	t.Run("float32", testAllToAll[float32])
	t.Run("float64", testAllToAll[float64])
}

func testAllToAll[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, gc := range groupCases {
		for _, k := range []int{0, 1, 5, 64} {
			t.Run(fmt.Sprintf("%s/chunk %d", gc.name, k), func(t *testing.T) {
				c := NewLocal(gc.devices)
				g := runtime.Group{Ranks: gc.ranks}
				n := g.Size()
				in, outs := make([][]T, n), make([][]T, n)
				for p := range in {
					in[p] = randSlice[T](rng, n*k)
					outs[p] = make([]T, n*k)
				}
				ins := cloneAll(in)
				errs := runMembers(t, g, func(p, r int) error { return AllToAll(c, g, r, ins[p], outs[p]) })
				for p, err := range errs {
					require.NoError(t, err)
					var want []T
					for q := range n {
						want = append(want, in[q][p*k:(p+1)*k]...)
					}
					assert.Equal(t, bitsOf(want), bitsOf(outs[p]), "position %d", p)
				}
			})
		}
	}
}

func TestBroadcast(t *testing.T) {
	t.Run("float32", testBroadcast[float32])
	t.Run("float64", testBroadcast[float64])
}

func testBroadcast[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, gc := range groupCases {
		for _, k := range []int{0, 1, 33} {
			for root := range gc.ranks {
				t.Run(fmt.Sprintf("%s/len %d/root %d", gc.name, k, root), func(t *testing.T) {
					c := NewLocal(gc.devices)
					g := runtime.Group{Ranks: gc.ranks}
					bufs := make([][]T, g.Size())
					for p := range bufs {
						bufs[p] = randSlice[T](rng, k)
					}
					want := bitsOf(bufs[root])
					errs := runMembers(t, g, func(p, r int) error { return Broadcast(c, g, r, root, bufs[p]) })
					for p, err := range errs {
						require.NoError(t, err)
						assert.Equal(t, want, bitsOf(bufs[p]), "position %d", p)
					}
				})
			}
		}
	}
}

func TestBarrierHoldsEveryoneUntilAllArrive(t *testing.T) {
	for _, gc := range groupCases {
		t.Run(gc.name, func(t *testing.T) {
			c := NewLocal(gc.devices)
			g := runtime.Group{Ranks: gc.ranks}
			for round := range 5 {
				var arrived atomic.Int64
				seen := make([]int64, g.Size())
				errs := runMembers(t, g, func(p, r int) error {
					time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
					arrived.Add(1)
					err := c.Barrier(g, r)
					seen[p] = arrived.Load()
					return err
				})
				for p, err := range errs {
					require.NoError(t, err)
					assert.Equal(t, int64(g.Size()), seen[p], "round %d position %d left before everyone arrived", round, p)
				}
			}
		})
	}
}

// Tensor-parallel groups {0,1},{2,3} and data-parallel groups {0,2},{1,3}
// share devices and run at the same time; each device makes 50 rounds of
// calls whose sizes change every round, so a collective matched with the
// wrong call of another member would fail with a mismatch or a wrong sum.
func TestIndependentGroupsRunConcurrentlyOver50Rounds(t *testing.T) {
	const rounds = 50
	c := NewLocal(4)
	tp := []runtime.Group{{Ranks: []int{0, 1}}, {Ranks: []int{2, 3}}}
	dp := []runtime.Group{{Ranks: []int{0, 2}}, {Ranks: []int{1, 3}}}
	val := func(rank, round, i int) float64 { return float64(rank*10000 + round*100 + i) }
	device := func(rank int) error {
		rng := rand.New(rand.NewPCG(uint64(rank), 99))
		tg, dg := tp[rank/2], dp[rank%2]
		for round := range rounds {
			if rng.IntN(4) == 0 {
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
			}
			n := round%5 + 1
			buf := make([]float64, n)
			for i := range buf {
				buf[i] = val(rank, round, i)
			}
			if err := AllReduce(c, tg, rank, buf); err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
			for i, x := range buf {
				if want := val(tg.Ranks[0], round, i) + val(tg.Ranks[1], round, i); x != want {
					return fmt.Errorf("round %d: tp all-reduce element %d is %v, want %v", round, i, x, want)
				}
			}
			k := round % 3
			in, out := make([]float32, k), make([]float32, 2*k)
			for i := range in {
				in[i] = float32(val(rank, round, i))
			}
			if err := AllGather(c, dg, rank, in, out); err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
			for p, r := range dg.Ranks {
				for i := range k {
					if got, want := out[p*k+i], float32(val(r, round, i)); got != want {
						return fmt.Errorf("round %d: dp all-gather chunk %d element %d is %v, want %v", round, p, i, got, want)
					}
				}
			}
			rsIn, rsOut := make([]float32, 2*n), make([]float32, n)
			for i := range rsIn {
				rsIn[i] = float32(val(rank, round, i))
			}
			if err := ReduceScatter(c, tg, rank, rsIn, rsOut); err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
			pos := tg.Pos(rank)
			for i, x := range rsOut {
				j := pos*n + i
				if want := float32(val(tg.Ranks[0], round, j)) + float32(val(tg.Ranks[1], round, j)); x != want {
					return fmt.Errorf("round %d: tp reduce-scatter element %d is %v, want %v", round, i, x, want)
				}
			}
		}
		return nil
	}
	errs := make([]error, 4)
	within(t, func() {
		var wg sync.WaitGroup
		for r := range 4 {
			wg.Go(func() { errs[r] = device(r) })
		}
		wg.Wait()
	})
	for r, err := range errs {
		assert.NoError(t, err, "device %d", r)
	}
	st := c.Stats()
	assert.Equal(t, int64(2*rounds), st.AllReduce, "one per tp group per round")
	assert.Equal(t, int64(2*rounds), st.AllGather, "one per dp group per round")
	assert.Equal(t, int64(2*rounds), st.ReduceScatter)
}

func TestAllReduceIsBitReproducible(t *testing.T) {
	t.Run("float32", testBitReproducible[float32])
	t.Run("float64", testBitReproducible[float64])
}

// The inputs span many orders of magnitude so that any other summation
// order would change low bits; the positions deliberately differ from rank
// order, and members start in random orders after random sleeps.
func testBitReproducible[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	g := runtime.Group{Ranks: []int{2, 0, 3, 1}}
	c := NewLocal(4)
	in := make([][]T, g.Size())
	for p := range in {
		in[p] = randSlice[T](rng, 257)
		for i := range in[p] {
			in[p][i] *= T(math.Pow(10, float64(rng.IntN(13)-6)))
		}
	}
	want := bitsOf(posSum(in))
	byRank := make([][]T, g.Size())
	for p, r := range g.Ranks {
		byRank[r] = in[p]
	}
	require.NotEqual(t, want, bitsOf(posSum(byRank)), "the inputs must make summation order visible")
	reversed := slices.Clone(in)
	slices.Reverse(reversed)
	require.NotEqual(t, want, bitsOf(posSum(reversed)), "the inputs must make summation order visible")

	for run := range 20 {
		bufs := cloneAll(in)
		order := rng.Perm(g.Size())
		sleeps := make([]time.Duration, g.Size())
		for p := range sleeps {
			sleeps[p] = time.Duration(rng.IntN(500)) * time.Microsecond
		}
		errs := make([]error, g.Size())
		within(t, func() {
			var wg sync.WaitGroup
			for _, p := range order {
				wg.Go(func() {
					time.Sleep(sleeps[p])
					errs[p] = AllReduce(c, g, g.Ranks[p], bufs[p][:100], bufs[p][100:])
				})
			}
			wg.Wait()
		})
		for p, err := range errs {
			require.NoError(t, err)
			require.Equal(t, want, bitsOf(bufs[p]), "run %d position %d", run, p)
		}
	}
}

// A two-member float32 all-reduce is exactly the rounded float32 sum: no
// wider accumulator sneaks in. (Rounding the exact float64 sum to float32
// is the correctly rounded float32 sum, since float64 has over twice the
// precision.)
func TestFloat32PairSumIsRoundedOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	c := NewLocal(2)
	g := runtime.Group{Ranks: []int{0, 1}}
	a, b := randSlice[float32](rng, 1000), randSlice[float32](rng, 1000)
	for i := range a {
		a[i] *= float32(math.Pow(2, float64(rng.IntN(40)-20)))
	}
	want := make([]float32, len(a))
	for i := range a {
		want[i] = float32(float64(a[i]) + float64(b[i]))
	}
	bufs := [][]float32{slices.Clone(a), slices.Clone(b)}
	errs := runMembers(t, g, func(p, r int) error { return AllReduce(c, g, r, bufs[p]) })
	for p, err := range errs {
		require.NoError(t, err)
		assert.Equal(t, bitsOf(want), bitsOf(bufs[p]), "position %d", p)
	}
}

func TestErrorsNameTheCallGroupRankAndRule(t *testing.T) {
	f32 := func(n int) []float32 { return make([]float32, n) }
	f64 := func(n int) []float64 { return make([]float64, n) }
	pair := runtime.Group{Ranks: []int{0, 1}}
	triple := runtime.Group{Ranks: []int{0, 1, 2}}
	cases := []struct {
		name    string
		devices int
		callers []int
		call    func(c *Local, rank int) error
		is      error
		want    []string
		// same: every caller gets the identical error.
		same bool
		// then: a group that must still work afterwards.
		then []int
	}{
		{
			name: "caller not a member", devices: 4, callers: []int{2},
			call: func(c *Local, r int) error { return AllReduce(c, pair, r, f32(3)) },
			is:   runtime.ErrGroup, want: []string{"AllReduce on group [0 1] by rank 2", "rank 2 is not a member of the group"},
			then: pair.Ranks,
		},
		{
			name: "caller rank out of range", devices: 4, callers: []int{7},
			call: func(c *Local, r int) error { return c.Barrier(pair, r) },
			is:   runtime.ErrGroup, want: []string{"Barrier on group [0 1] by rank 7", "rank 7 is outside [0,4)"},
		},
		{
			name: "duplicate ranks", devices: 4, callers: []int{1},
			call: func(c *Local, r int) error {
				return AllGather(c, runtime.Group{Ranks: []int{1, 2, 1}}, r, f32(1), f32(3))
			},
			is: runtime.ErrGroup, want: []string{"AllGather on group [1 2 1] by rank 1", "rank 1 appears twice, at positions 0 and 2"},
		},
		{
			name: "group rank beyond the devices", devices: 4, callers: []int{0},
			call: func(c *Local, r int) error { return Broadcast(c, runtime.Group{Ranks: []int{0, 4}}, r, 0, f32(1)) },
			is:   runtime.ErrGroup, want: []string{"Broadcast on group [0 4] by rank 0", "rank 4 at position 1 is outside [0,4)"},
		},
		{
			name: "negative group rank", devices: 4, callers: []int{0},
			call: func(c *Local, r int) error {
				return ReduceScatter(c, runtime.Group{Ranks: []int{-1, 0}}, r, f32(2), f32(1))
			},
			is: runtime.ErrGroup, want: []string{"ReduceScatter on group [-1 0] by rank 0", "rank -1 at position 0 is outside [0,4)"},
		},
		{
			name: "empty group", devices: 4, callers: []int{0},
			call: func(c *Local, r int) error { return AllToAll(c, runtime.Group{}, r, f32(0), f32(0)) },
			is:   runtime.ErrGroup, want: []string{"AllToAll on group [] by rank 0", "the group has no members"},
		},
		{
			name: "members disagree on len(out)", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { k := 2 + r; return ReduceScatter(c, pair, r, f32(2*k), f32(k)) },
			is:   runtime.ErrMismatch, same: true, then: pair.Ranks,
			want: []string{"ReduceScatter on group [0 1] (collective #0)", "members disagree on len(out): rank 0 (position 0) passes 2 elements but rank 1 (position 1) passes 3"},
		},
		{
			name: "members disagree on len(in)", devices: 3, callers: []int{0, 1, 2},
			call: func(c *Local, r int) error { k := 1 + r/2; return AllGather(c, triple, r, f64(k), f64(3*k)) },
			is:   runtime.ErrMismatch, same: true, then: triple.Ranks,
			want: []string{"AllGather on group [0 1 2] (collective #0)", "len(in): rank 0 (position 0) passes 1 elements but rank 2 (position 2) passes 2"},
		},
		{
			name: "members disagree on the bucket", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error {
				if r == 0 {
					return AllReduce(c, pair, r, f32(2), f32(3))
				}
				return AllReduce(c, pair, r, f32(5))
			},
			is: runtime.ErrMismatch, same: true, then: pair.Ranks,
			want: []string{"AllReduce on group [0 1]", "on the bucket: rank 0 (position 0) passes 2 buffers but rank 1 (position 1) passes 1"},
		},
		{
			name: "members disagree on a bucket buffer", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return AllReduce(c, pair, r, f32(2), f32(3+r)) },
			is:   runtime.ErrMismatch, same: true, then: pair.Ranks,
			want: []string{"AllReduce on group [0 1]", "len(bufs[1]): rank 0 (position 0) passes 3 elements but rank 1 (position 1) passes 4"},
		},
		{
			name: "members disagree on the element type", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error {
				if r == 0 {
					return AllReduce(c, pair, r, f32(2))
				}
				return AllReduce(c, pair, r, f64(2))
			},
			is: runtime.ErrMismatch, same: true, then: pair.Ranks,
			want: []string{"AllReduce on group [0 1]", "on the element type: rank 0 (position 0) passes f32 but rank 1 (position 1) passes f64"},
		},
		{
			name: "members call different collectives", devices: 3, callers: []int{0, 1, 2},
			call: func(c *Local, r int) error {
				if r == 1 {
					return AllGather(c, triple, r, f32(1), f32(3))
				}
				return AllReduce(c, triple, r, f32(3))
			},
			is: runtime.ErrMismatch, same: true, then: triple.Ranks,
			want: []string{"collective #0 on group [0 1 2]", "rank 0 (position 0) called AllReduce but rank 1 (position 1) called AllGather"},
		},
		{
			name: "one member's bad len(out) fails all", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return AllGather(c, pair, r, f32(2), f32(4+r)) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"AllGather on group [0 1] by rank 1", "len(out) is 5, want group size 2 × len(in) 2 = 4"},
		},
		{
			name: "reduce-scatter len(in) not size × len(out)", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return ReduceScatter(c, pair, r, f32(5), f32(2)) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"ReduceScatter on group [0 1] by rank 0", "len(in) is 5, want group size 2 × len(out) 2 = 4"},
		},
		{
			name: "all-to-all length not a multiple of the group", devices: 3, callers: []int{0, 1, 2},
			call: func(c *Local, r int) error { return AllToAll(c, triple, r, f64(4), f64(4)) },
			is:   runtime.ErrArgs, same: true, then: triple.Ranks,
			want: []string{"AllToAll on group [0 1 2] by rank 0", "len(in) 4 is not a multiple of the group size 3"},
		},
		{
			name: "all-to-all lengths differ", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return AllToAll(c, pair, r, f64(4), f64(4+2*r)) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"AllToAll on group [0 1] by rank 1", "len(in) is 4 but len(out) is 6"},
		},
		{
			name: "all-to-all in and out overlap", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { b := f32(6); return AllToAll(c, pair, r, b[:4], b[2:]) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"AllToAll on group [0 1] by rank 0", "in and out overlap"},
		},
		{
			name: "reduce-scatter out overlaps in elsewhere than its chunk", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { b := f32(4); return ReduceScatter(c, pair, r, b, b[:2]) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"ReduceScatter on group [0 1] by rank 1", "out overlaps in other than as in's own chunk [2:4]"},
		},
		{
			name: "all-gather in overlaps out elsewhere than its chunk", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { b := f32(4); return AllGather(c, pair, r, b[1:3], b) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"AllGather on group [0 1] by rank 0", "in overlaps out other than as out's own chunk [0:2]"},
		},
		{
			name: "broadcast root outside the group", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return Broadcast(c, pair, r, 2, f32(3)) },
			is:   runtime.ErrArgs, same: true, then: pair.Ranks,
			want: []string{"Broadcast on group [0 1] by rank 0", "root position 2 is outside the group's [0,2)"},
		},
		{
			name: "members disagree on the root", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return Broadcast(c, pair, r, r, f32(3)) },
			is:   runtime.ErrMismatch, same: true, then: pair.Ranks,
			want: []string{"Broadcast on group [0 1]", "on the root: rank 0 (position 0) names position 0 but rank 1 (position 1) names position 1"},
		},
		{
			name: "members disagree on len(buf)", devices: 2, callers: []int{0, 1},
			call: func(c *Local, r int) error { return Broadcast(c, pair, r, 0, f32(3+r)) },
			is:   runtime.ErrMismatch, same: true, then: pair.Ranks,
			want: []string{"Broadcast on group [0 1]", "len(buf): rank 0 (position 0) passes 3 elements but rank 1 (position 1) passes 4"},
		},
		{
			name: "send to self", devices: 2, callers: []int{1},
			call: func(c *Local, r int) error { return Send(c, r, r, 0, f32(1)) },
			is:   runtime.ErrArgs, want: []string{"Send from rank 1 to rank 1 (tag 0)", "cannot send to itself"},
		},
		{
			name: "recv from a rank outside the comm", devices: 2, callers: []int{0},
			call: func(c *Local, r int) error { return Recv(c, 5, r, 0, f32(1)) },
			is:   runtime.ErrGroup, want: []string{"Recv from rank 5 to rank 0 (tag 0)", "rank 5 is outside [0,2)"},
		},
		{
			// Sends are buffered: the sender is gone when the mismatch
			// shows, so the receiver is the one told.
			name: "send and recv disagree on the length", devices: 2, callers: []int{1},
			call: func(c *Local, r int) error {
				if err := Send(c, 0, 1, 3, f64(3)); err != nil {
					return err
				}
				return Recv(c, 0, 1, 3, f64(4))
			},
			is:   runtime.ErrMismatch,
			want: []string{"Send/Recv from rank 0 to rank 1 (tag 3)", "on the length: Send passes 3 elements but Recv expects 4"},
		},
		{
			name: "send and recv disagree on the element type", devices: 2, callers: []int{1},
			call: func(c *Local, r int) error {
				if err := Send(c, 0, 1, 3, f64(3)); err != nil {
					return err
				}
				return Recv(c, 0, 1, 3, f32(3))
			},
			is:   runtime.ErrMismatch,
			want: []string{"Send/Recv from rank 0 to rank 1 (tag 3)", "on the element type: Send passes f64 but Recv expects f32"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := NewLocal(tc.devices)
			errs := runMembers(t, runtime.Group{Ranks: tc.callers}, func(_, r int) error { return tc.call(c, r) })
			for i, err := range errs {
				require.Error(t, err, "caller rank %d", tc.callers[i])
				assert.ErrorIs(t, err, tc.is)
				for _, w := range tc.want {
					assert.ErrorContains(t, err, w, "caller rank %d", tc.callers[i])
				}
				if tc.same {
					assert.Equal(t, errs[0].Error(), err.Error(), "every member gets the same error")
				}
			}
			if tc.then == nil {
				return
			}
			g := runtime.Group{Ranks: tc.then}
			bufs := make([][]float64, g.Size())
			for p := range bufs {
				bufs[p] = []float64{float64(p + 1)}
			}
			errs = runMembers(t, g, func(p, r int) error { return AllReduce(c, g, r, bufs[p]) })
			for p, err := range errs {
				require.NoError(t, err, "the group keeps working after the error")
				assert.Equal(t, float64(g.Size()*(g.Size()+1)/2), bufs[p][0])
			}
		})
	}
}

func TestAbortWakesBlockedMembers(t *testing.T) {
	c := NewLocal(6)
	g := runtime.Group{Ranks: []int{0, 1, 2}}
	cause := errors.New("device 2: step failed")
	type result struct {
		call string
		err  error
	}
	results := make(chan result, 3)
	go func() { results <- result{"AllReduce", AllReduce(c, g, 0, make([]float32, 4))} }()
	go func() { results <- result{"AllReduce", AllReduce(c, g, 1, make([]float32, 4))} }()
	go func() { results <- result{"Recv", Recv(c, 3, 4, 7, make([]float64, 2))} }()
	// A send never blocks: it is posted before the abort and stays
	// receivable after it, so a receiver that was already owed a message
	// gets it rather than a spurious failure.
	require.NoError(t, Send(c, 5, 3, 1, []float64{1, 2}))
	require.True(t, waitUntil(t, "two members blocking in AllReduce", func() bool { return c.waiting(g) == 2 }))
	require.True(t, waitUntil(t, "a Recv blocking", func() bool { _, r := c.queued(3, 4, 7); return r == 1 }))
	c.Abort(cause)
	within(t, func() {
		for range 3 {
			r := <-results
			assert.ErrorIs(t, r.err, runtime.ErrAborted, r.call)
			assert.ErrorIs(t, r.err, cause, r.call)
			assert.ErrorContains(t, r.err, r.call)
			assert.ErrorContains(t, r.err, "comm aborted: device 2: step failed")
		}
	})
	_, r := c.queued(3, 4, 7)
	assert.Zero(t, r, "a woken Recv leaves the queue")
	got := make([]float64, 2)
	require.NoError(t, Recv(c, 5, 3, 1, got), "a message sent before the abort")
	assert.Equal(t, []float64{1, 2}, got)

	c.Abort(errors.New("a later report of the same failure"))
	calls := map[string]func() error{
		"AllReduce":     func() error { return AllReduce(c, g, 0, make([]float64, 1)) },
		"ReduceScatter": func() error { return ReduceScatter(c, g, 0, make([]float64, 3), make([]float64, 1)) },
		"AllGather":     func() error { return AllGather(c, g, 0, make([]float32, 1), make([]float32, 3)) },
		"AllToAll":      func() error { return AllToAll(c, g, 0, make([]float32, 3), make([]float32, 3)) },
		"Broadcast":     func() error { return Broadcast(c, g, 0, 0, make([]float32, 3)) },
		"Barrier":       func() error { return c.Barrier(g, 0) },
		"Send":          func() error { return Send(c, 0, 1, 0, make([]float32, 3)) },
		"Recv":          func() error { return Recv(c, 0, 1, 0, make([]float32, 3)) },
	}
	for name, call := range calls {
		t.Run("after abort/"+name, func(t *testing.T) {
			var err error
			within(t, func() { err = call() })
			assert.ErrorIs(t, err, cause, "the first cause is kept")
			assert.ErrorContains(t, err, name)
			assert.NotContains(t, err.Error(), "later report")
		})
	}
}

func TestAbortWithNilErrorStillFails(t *testing.T) {
	c := NewLocal(2)
	c.Abort(nil)
	err := c.Barrier(runtime.Group{Ranks: []int{0, 1}}, 0)
	assert.ErrorIs(t, err, runtime.ErrAborted)
	assert.ErrorContains(t, err, "nil error")
}

// Abort at a random moment while devices loop over collectives: every
// device returns, and fails only with the abort.
func TestAbortRacingCollectivesNeverHangs(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for trial := range 10 {
		c := NewLocal(3)
		g := runtime.Group{Ranks: []int{0, 1, 2}}
		delay := time.Duration(rng.IntN(2000)) * time.Microsecond
		errs := make([]error, 3)
		within(t, func() {
			var wg sync.WaitGroup
			for r := range 3 {
				wg.Go(func() {
					buf := make([]float64, 16)
					for range 100000 {
						if err := AllReduce(c, g, r, buf); err != nil {
							errs[r] = err
							return
						}
					}
				})
			}
			wg.Go(func() {
				time.Sleep(delay)
				c.Abort(fmt.Errorf("trial %d", trial))
			})
			wg.Wait()
		})
		for r, err := range errs {
			assert.ErrorIs(t, err, runtime.ErrAborted, "trial %d device %d", trial, r)
		}
	}
}

func TestSendRecv(t *testing.T) {
	t.Run("float32", testSendRecv[float32])
	t.Run("float64", testSendRecv[float64])
}

func testSendRecv[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, n := range []int{0, 1, 7, 1000} {
		for _, sendFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("len %d/send first %v", n, sendFirst), func(t *testing.T) {
				c := NewLocal(4)
				src, dst := randSlice[T](rng, n), make([]T, n)
				want := bitsOf(src)
				var sendErr, recvErr error
				within(t, func() {
					var wg sync.WaitGroup
					wg.Go(func() {
						if !sendFirst && !waitUntil(t, "the Recv queued", func() bool { _, r := c.queued(3, 1, 9); return r == 1 }) {
							return
						}
						sendErr = Send(c, 3, 1, 9, src)
					})
					wg.Go(func() {
						if sendFirst && !waitUntil(t, "the Send queued", func() bool { s, _ := c.queued(3, 1, 9); return s == 1 }) {
							return
						}
						recvErr = Recv(c, 3, 1, 9, dst)
					})
					wg.Wait()
				})
				require.NoError(t, sendErr)
				require.NoError(t, recvErr)
				assert.Equal(t, want, bitsOf(dst))
				assert.Equal(t, want, bitsOf(src), "the sender's buffer is untouched")
			})
		}
	}
}

// Sends with different tags are matched by tag, not by arrival order.
func TestSendRecvMatchesByTag(t *testing.T) {
	c := NewLocal(2)
	const tags = 5
	got := make([][]float32, tags)
	errs := make([]error, 2*tags)
	within(t, func() {
		var wg sync.WaitGroup
		for tag := range tags {
			wg.Go(func() { errs[tag] = Send(c, 0, 1, tag, []float32{float32(tag), float32(10 * tag)}) })
		}
		wg.Go(func() {
			for tag := tags - 1; tag >= 0; tag-- {
				got[tag] = make([]float32, 2)
				errs[tags+tag] = Recv(c, 0, 1, tag, got[tag])
			}
		})
		wg.Wait()
	})
	for i, err := range errs {
		require.NoError(t, err, "call %d", i)
	}
	for tag := range tags {
		assert.Equal(t, []float32{float32(tag), float32(10 * tag)}, got[tag])
	}
}

// Several Sends (or Recvs) waiting on one key are matched in the order
// they arrived.
func TestSendRecvIsFIFOPerKey(t *testing.T) {
	const k = 6
	t.Run("queued sends", func(t *testing.T) {
		c := NewLocal(2)
		errs := make([]error, 2*k)
		got := make([]float64, k)
		within(t, func() {
			var wg sync.WaitGroup
			for i := range k {
				wg.Go(func() { errs[i] = Send(c, 1, 0, 4, []float64{float64(i)}) })
				waitUntil(t, "the Send queued", func() bool { s, _ := c.queued(1, 0, 4); return s == i+1 })
			}
			for i := range k {
				buf := make([]float64, 1)
				errs[k+i] = Recv(c, 1, 0, 4, buf)
				got[i] = buf[0]
			}
			wg.Wait()
		})
		for i, err := range errs {
			require.NoError(t, err, "call %d", i)
		}
		assert.Equal(t, []float64{0, 1, 2, 3, 4, 5}, got)
	})
	t.Run("queued recvs", func(t *testing.T) {
		c := NewLocal(2)
		errs := make([]error, 2*k)
		got := make([][]float64, k)
		within(t, func() {
			var wg sync.WaitGroup
			for i := range k {
				got[i] = make([]float64, 1)
				wg.Go(func() { errs[i] = Recv(c, 1, 0, 4, got[i]) })
				waitUntil(t, "the Recv queued", func() bool { _, r := c.queued(1, 0, 4); return r == i+1 })
			}
			for i := range k {
				errs[k+i] = Send(c, 1, 0, 4, []float64{float64(i)})
			}
			wg.Wait()
		})
		for i, err := range errs {
			require.NoError(t, err, "call %d", i)
		}
		for i := range k {
			assert.Equal(t, []float64{float64(i)}, got[i], "recv %d", i)
		}
	})
	t.Run("ping-pong", func(t *testing.T) {
		c := NewLocal(2)
		var errA, errB error
		within(t, func() {
			var wg sync.WaitGroup
			wg.Go(func() {
				buf := []float32{0}
				for range 50 {
					if errA = Send(c, 0, 1, 0, buf); errA != nil {
						return
					}
					if errA = Recv(c, 1, 0, 0, buf); errA != nil {
						return
					}
				}
				if buf[0] != 100 {
					errA = fmt.Errorf("after 50 round trips the value is %v, want 100", buf[0])
				}
			})
			wg.Go(func() {
				buf := []float32{0}
				for range 50 {
					if errB = Recv(c, 0, 1, 0, buf); errB != nil {
						return
					}
					buf[0] += 2
					if errB = Send(c, 1, 0, 0, buf); errB != nil {
						return
					}
				}
			})
			wg.Wait()
		})
		require.NoError(t, errA)
		require.NoError(t, errB)
		assert.Equal(t, int64(100), c.Stats().SendRecv)
	})
}

func TestStats(t *testing.T) {
	c := NewLocal(4)
	pair := runtime.Group{Ranks: []int{0, 1}}
	triple := runtime.Group{Ranks: []int{1, 2, 3}}
	run := func(g runtime.Group, f func(p, r int) error) {
		t.Helper()
		for _, err := range runMembers(t, g, f) {
			require.NoError(t, err)
		}
	}
	run(pair, func(_, r int) error { return AllReduce(c, pair, r, make([]float32, 3), make([]float32, 5)) }) // 2×8×4 = 64
	run(pair, func(_, r int) error { return ReduceScatter(c, pair, r, make([]float64, 6), make([]float64, 3)) })
	// 2×6×8 = 96
	run(triple, func(_, r int) error { return AllGather(c, triple, r, make([]float32, 2), make([]float32, 6)) }) // 3×2×4 = 24
	run(pair, func(_, r int) error { return AllToAll(c, pair, r, make([]float64, 4), make([]float64, 4)) })      // 2×4×8 = 64
	run(triple, func(_, r int) error { return Broadcast(c, triple, r, 1, make([]float32, 5)) })                  // 5×4 = 20
	run(triple, func(_, r int) error { return c.Barrier(triple, r) })
	run(pair, func(p, _ int) error {
		if p == 0 {
			return Send(c, 0, 1, 0, make([]float64, 7)) // 7×8 = 56
		}
		return Recv(c, 0, 1, 0, make([]float64, 7))
	})
	// A failed collective does not count.
	for _, err := range runMembers(t, pair, func(_, r int) error { return AllReduce(c, pair, r, make([]float32, 1+r)) }) {
		require.Error(t, err)
	}
	assert.Equal(t, runtime.CommStats{
		AllReduce: 1, ReduceScatter: 1, AllGather: 1, AllToAll: 1, Broadcast: 1, Barrier: 1, SendRecv: 1,
		Bytes: 64 + 96 + 24 + 64 + 20 + 56,
	}, c.Stats())
}

// A member may overwrite its inputs as soon as its call returns: no call
// returns while another member still reads them. Each round rewrites the
// same buffers, and random pauses let fast members race ahead.
func TestInputsAreFreeOnReturn(t *testing.T) {
	const rounds = 100
	g := runtime.Group{Ranks: []int{3, 1, 2}}
	n, k := g.Size(), 4
	val := func(rank, round, i int) float64 { return float64(rank*100000 + round*100 + i) }
	c := NewLocal(4)
	errs := runMembers(t, g, func(pos, rank int) error {
		rng := rand.New(rand.NewPCG(uint64(rank), 7))
		in, out, small := make([]float64, n*k), make([]float64, n*k), make([]float64, k)
		for round := range rounds {
			if rng.IntN(3) == 0 {
				time.Sleep(time.Duration(rng.IntN(100)) * time.Microsecond)
			}
			fill := func(x []float64) {
				for i := range x {
					x[i] = val(rank, round, i)
				}
			}
			fill(small)
			if err := AllGather(c, g, rank, small, out); err != nil {
				return err
			}
			clear(small)
			for p, r := range g.Ranks {
				for i := range k {
					if got, want := out[p*k+i], val(r, round, i); got != want {
						return fmt.Errorf("round %d: all-gather chunk %d element %d is %v, want %v", round, p, i, got, want)
					}
				}
			}
			fill(in)
			if err := AllToAll(c, g, rank, in, out); err != nil {
				return err
			}
			clear(in)
			for p, r := range g.Ranks {
				for i := range k {
					if got, want := out[p*k+i], val(r, round, pos*k+i); got != want {
						return fmt.Errorf("round %d: all-to-all chunk %d element %d is %v, want %v", round, p, i, got, want)
					}
				}
			}
			fill(in)
			if err := ReduceScatter(c, g, rank, in, small); err != nil {
				return err
			}
			clear(in)
			for i, got := range small {
				j := pos*k + i
				if want := val(g.Ranks[0], round, j) + val(g.Ranks[1], round, j) + val(g.Ranks[2], round, j); got != want {
					return fmt.Errorf("round %d: reduce-scatter element %d is %v, want %v", round, i, got, want)
				}
			}
			fill(small)
			if err := Broadcast(c, g, rank, round%n, small); err != nil {
				return err
			}
			for i, got := range small {
				if want := val(g.Ranks[round%n], round, i); got != want {
					return fmt.Errorf("round %d: broadcast element %d is %v, want %v", round, i, got, want)
				}
			}
			clear(small)
		}
		return nil
	})
	for p, err := range errs {
		assert.NoError(t, err, "position %d", p)
	}
}
