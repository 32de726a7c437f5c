package schedule

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Cost gives the duration of an action on its rank. Transfers, sync and opt
// may cost 0; the simulator then measures pure compute imbalance, which is
// what the bubble formulas in the literature describe.
type Cost func(Action) float64

// UnitCost is the textbook cost model for schedules without a W split: a
// backward costs twice a forward. W is free because those schedules fold the
// weight gradient into B.
func UnitCost(a Action) float64 {
	switch a.Kind {
	case F:
		return 1
	case B:
		return 2
	}
	return 0
}

// UnitCostZB is UnitCost with the backward split in two equal halves, the
// setting in which the zero-bubble paper states its ZB-H1 bubble.
func UnitCostZB(a Action) float64 {
	switch a.Kind {
	case F, B, W:
		return 1
	}
	return 0
}

// Result is what one simulated step tells the planner and the dumps.
type Result struct {
	// StepTime is when the last action on any rank finishes.
	StepTime float64
	// Ideal is the largest per-rank sum of F/B/W costs: the step time of a
	// pipeline with no waiting at all.
	Ideal float64
	// Bubble is (StepTime − Ideal)/Ideal, the fraction of the ideal step
	// spent waiting; 0 when Ideal is 0.
	Bubble float64
	// Busy is the total cost of every action on each rank.
	Busy []float64
	// StashPeak is, per rank, the most (chunk, micro) pairs whose F has run
	// and whose backward has not finished (its W where the schedule splits
	// the backward, which reads the layer inputs and output gradients the
	// B kept for it; else its B): the activations the rank holds at once.
	StashPeak []int
	// Start is the start time of every action, indexed like Actions, for
	// timelines and traces.
	Start [][]float64
}

// Simulate executes every rank's list together and reports timing and
// memory, or the first rule the schedule breaks. Semantics: a rank runs its
// list in order; an action starts once the rank is free and its inputs exist.
// Sends are buffered (they never wait for the receiver); a receive waits for
// its send. F(j) needs its input (the receive, or F(j−1) when chunk j−1 shares
// the rank); B(j) needs F(j) and its output gradient (the receive, or B(j+1)
// on the same rank); W(j) needs B(j). A nil cost means UnitCost.
//
// The run is event-driven: each rank advances until it blocks, registers on
// the one action it waits for, and is woken only when that action's rank has
// moved on, so the cost is linear in the number of actions. If no rank can
// move and work remains, the error names every stuck rank, its next action
// and what that action waits for.
func Simulate(s *Schedule, cost Cost) (*Result, error) { return SimulateReady(s, cost, nil) }

// SimulateReady is Simulate where an F, B or W action's outputs exist
// before the rank is done with it: ready(a) after its start (at most
// its cost), as a block that sends its result and then goes on with
// work no other action waits for (weight gradients, data-parallel
// reductions). A send then leaves at its value's ready time, whatever
// the rank does meanwhile (sends are buffered and issued where the value
// is made); the rank itself is free only after the whole cost. A nil
// ready is Simulate: ready at the end.
func SimulateReady(s *Schedule, cost, ready Cost) (*Result, error) {
	if _, err := s.index(); err != nil {
		return nil, err
	}
	if cost == nil {
		cost = UnitCost
	}
	p, m, nc := s.Ranks, s.Micro, s.numChunks()
	e := &engine{s: s, m: m, nc: nc, plane: nc * m}
	e.rank = make([]int32, nc)
	for j := range e.rank {
		e.rank[j] = int32(s.RankOf(j))
	}
	// W is tracked too although nothing waits on it within a step: one flat
	// array is simpler than skipping a plane.
	e.done = make([]float64, int(GradSync)*e.plane)
	for i := range e.done {
		e.done[i] = -1
	}
	res := &Result{
		Busy:      make([]float64, p),
		StashPeak: make([]int, p),
		Start:     make([][]float64, p),
	}
	for r, acts := range s.Actions {
		res.Start[r] = make([]float64, len(acts))
	}
	e.res = res
	e.ready = ready
	e.ptr = make([]int, p)
	e.free = make([]float64, p)
	e.waitKey = make([]int, p)
	e.waiters = make([][]int, p)
	queue := make([]int, 0, p)
	for r := p - 1; r >= 0; r-- {
		queue = append(queue, r)
	}
	for len(queue) > 0 {
		r := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		e.run(r, cost)
		ws := e.waiters[r]
		keep := ws[:0]
		for _, w := range ws {
			if e.done[e.waitKey[w]] >= 0 {
				queue = append(queue, w)
			} else {
				keep = append(keep, w)
			}
		}
		e.waiters[r] = keep
	}
	if e.badCost != nil {
		return nil, e.badCost
	}
	if err := e.deadlock(); err != nil {
		return nil, err
	}

	for r, acts := range s.Actions {
		var compute float64
		stash := 0
		split := slices.ContainsFunc(acts, func(a Action) bool { return a.Kind == W })
		for _, a := range acts {
			c := cost(a)
			res.Busy[r] += c
			if a.Kind == F || a.Kind == B || a.Kind == W {
				compute += c
			}
			switch {
			case a.Kind == F:
				stash++
				res.StashPeak[r] = max(res.StashPeak[r], stash)
			case a.Kind == W || a.Kind == B && !split:
				stash--
			}
		}
		res.Ideal = max(res.Ideal, compute)
		res.StepTime = max(res.StepTime, e.free[r])
	}
	if res.Ideal > 0 {
		res.Bubble = (res.StepTime - res.Ideal) / res.Ideal
	}
	return res, nil
}

// engine holds the simulation state. done[key] is the finish time of an
// action, or −1 while it has not run; key = (chunk·m + micro)·7 + kind
// flattens (kind, chunk, micro) so a dependency is one slice load, and keeps
// an F next to its transfers so a rank's consecutive actions share cache
// lines.
type engine struct {
	s       *Schedule
	m, nc   int
	plane   int     // p·v·m, the number of (chunk, micro) pairs
	rank    []int32 // rank of each chunk, precomputed to keep % off the hot path
	res     *Result
	done    []float64
	ptr     []int     // next action per rank
	free    []float64 // when each rank finishes its last action
	waitKey []int     // the key a blocked rank is registered on
	waiters [][]int   // ranks blocked on an action that lives on this rank
	badCost error     // first action whose cost is negative or not finite
	ready   Cost      // SimulateReady's, or nil
}

func (e *engine) key(k Kind, chunk, micro int) int {
	return (chunk*e.m+micro)*int(GradSync) + int(k)
}

// deps gives the keys action a on rank r must wait for (at most two). The
// rules mirror the builder: an input comes from a receive when the
// neighbouring chunk lives on another rank, else from that chunk directly.
func (e *engine) deps(r int, a Action) (d [2]int, n int) {
	j, k := a.Chunk, a.Micro
	switch a.Kind {
	case F:
		if j > 0 {
			if int(e.rank[j-1]) != r {
				d[0] = e.key(RecvF, j, k)
			} else {
				d[0] = e.key(F, j-1, k)
			}
			n = 1
		}
	case B:
		d[0] = e.key(F, j, k)
		n = 1
		if j+1 < e.nc {
			if int(e.rank[j+1]) != r {
				d[1] = e.key(RecvB, j, k)
			} else {
				d[1] = e.key(B, j+1, k)
			}
			n = 2
		}
	case W, SendB:
		d[0] = e.key(B, j, k)
		n = 1
	case SendF:
		d[0] = e.key(F, j, k)
		n = 1
	case RecvF:
		d[0] = e.key(SendF, j-1, k)
		n = 1
	case RecvB:
		d[0] = e.key(SendB, j+1, k)
		n = 1
	}
	return d, n
}

// action turns a key back into the action it names (for messages); the
// peer of a transfer is recovered from the placement rule.
func (e *engine) action(key int) (Action, int) {
	kind := Kind(key % int(GradSync))
	rest := key / int(GradSync)
	a := Action{Kind: kind, Chunk: rest / e.m, Micro: rest % e.m}
	switch kind {
	case SendF, RecvB:
		a.Peer = int(e.rank[a.Chunk+1])
	case RecvF, SendB:
		a.Peer = int(e.rank[a.Chunk-1])
	}
	return a, int(e.rank[a.Chunk])
}

// run advances rank r until it finishes or blocks; when it blocks it
// registers on the rank that owns the missing action.
func (e *engine) run(r int, cost Cost) {
	acts := e.s.Actions[r]
	start := e.res.Start[r]
	t := e.free[r]
	for i := e.ptr[r]; i < len(acts); i++ {
		a := acts[i]
		d, n := e.deps(r, a)
		for _, key := range d[:n] {
			fin := e.done[key]
			if fin < 0 {
				e.ptr[r] = i
				e.free[r] = t
				e.waitKey[r] = key
				owner := e.rank[key/int(GradSync)/e.m]
				e.waiters[owner] = append(e.waiters[owner], r)
				return
			}
			t = max(t, fin)
		}
		c := cost(a)
		if !(c >= 0 && c <= math.MaxFloat64) && e.badCost == nil {
			e.badCost = fmt.Errorf("%w: cost of %s on rank %d is %v (costs must be finite and ≥ 0)", ErrInvalid, a, r, c)
		}
		if e.ready != nil && (a.Kind == SendF || a.Kind == SendB) {
			// Issued when its value was ready, not when the rank is free.
			at := e.done[d[0]]
			start[i] = at
			e.done[e.key(a.Kind, a.Chunk, a.Micro)] = at + c
			continue
		}
		start[i] = t
		done := t + c
		if e.ready != nil && a.Kind <= W {
			done = t + min(max(e.ready(a), 0), c)
		}
		t += c
		if a.Kind < GradSync {
			e.done[e.key(a.Kind, a.Chunk, a.Micro)] = done
		}
	}
	e.ptr[r] = len(acts)
	e.free[r] = t
}

// deadlock reports every rank that still has work once nothing can move.
func (e *engine) deadlock() error {
	var stuck []string
	for r, acts := range e.s.Actions {
		i := e.ptr[r]
		if i >= len(acts) {
			continue
		}
		a := acts[i]
		dep, owner := e.action(e.waitKey[r])
		where := fmt.Sprintf("on rank %d", owner)
		if owner == r {
			where = fmt.Sprintf("later in rank %d's own list", r)
		}
		stuck = append(stuck, fmt.Sprintf("rank %d waits at %s (position %d; needs %s %s)", r, a, i, dep, where))
	}
	if len(stuck) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrDeadlock, strings.Join(stuck, "; "))
}
