package main

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"gcompile/lower"
	"gcompile/passes/schedule"
)

// blockProfile accumulates measured kernel time per schedule action kind
// and chunk (receives, which wait for other ranks, are left out), to
// simulate the schedule with the costs this machine actually has.
type blockProfile struct {
	mu    sync.Mutex
	total map[string]float64 // "F c1" → seconds
	count map[string]int     // how many (step, micro) blocks were timed
	seen  map[string]bool    // "F c1 m3 step"
	step  int
	// The time into a block at which its microbatch's send left (the
	// compute before it), as the cost model prices a block's output
	// ready (schedule.SimulateReady): a backward sends its input's
	// gradient before its weight gradients where collectives run in
	// order (lower.Options.SendsFirst).
	sofar  map[string]float64 // "F c1 m3 step" → compute so far
	sentAt map[string]float64 // "F c1 m3 step" → sofar at its last microbatch send
	after  map[string]float64 // "F c1" → compute after the send, summed (ready's, made once)
	afterN map[string]int     // "F c1" → blocks summed in after
}

func newBlockProfile() *blockProfile {
	return &blockProfile{total: map[string]float64{}, count: map[string]int{}, seen: map[string]bool{},
		sofar: map[string]float64{}, sentAt: map[string]float64{}}
}

// hook times device prog's instructions.
func (bp *blockProfile) hook(prog *lower.Program) func(int, time.Time, time.Duration) {
	return func(i int, _ time.Time, d time.Duration) {
		in := prog.Instrs[i]
		// Only compute inside F/B/W actions: receives wait for other ranks.
		if in.Op == "recv" || !strings.HasPrefix(in.Block, "F ") && !strings.HasPrefix(in.Block, "B ") && !strings.HasPrefix(in.Block, "W ") {
			return
		}
		bp.mu.Lock()
		defer bp.mu.Unlock()
		id := fmt.Sprintf("%s %d", in.Block, bp.step)
		if in.Op == "send" {
			// A once-a-step send (a tied embedding's gradient part) is not
			// what the next rank waits for.
			if in.Value != nil && in.Value.Meta.Micro >= 0 {
				bp.sentAt[id] = bp.sofar[id]
			}
			return
		}
		key := blockKey(in.Block)
		bp.total[key] += d.Seconds()
		bp.sofar[id] += d.Seconds()
		if !bp.seen[id] {
			bp.seen[id] = true
			bp.count[key]++
		}
	}
}

// blockKey is the action kind and chunk of a block's name ("F c1 m3",
// or with its step after): "F c1".
func blockKey(block string) string {
	kind, rest, _ := strings.Cut(block, " ")
	chunk, _, _ := strings.Cut(rest, " ")
	return kind + " " + chunk
}

// reset drops what was measured so far.
func (bp *blockProfile) reset() {
	bp.mu.Lock()
	defer bp.mu.Unlock()
	clear(bp.total)
	clear(bp.count)
	clear(bp.seen)
	clear(bp.sofar)
	clear(bp.sentAt)
	bp.after, bp.afterN = nil, nil
}

func (bp *blockProfile) endStep() {
	bp.mu.Lock()
	bp.step++
	bp.mu.Unlock()
}

// cost is the mean measured duration of an action (in milliseconds).
func (bp *blockProfile) cost(a schedule.Action) float64 {
	key := fmt.Sprintf("%v c%d", a.Kind, a.Chunk)
	if bp.count[key] == 0 {
		return 0
	}
	return bp.total[key] / float64(bp.count[key]) * 1000
}

// ready is the mean measured time into an action at which its
// microbatch's send left (in milliseconds): its cost, less the compute
// after the send, averaged over the timed blocks that sent.
func (bp *blockProfile) ready(a schedule.Action) float64 {
	if bp.after == nil {
		// Once, over every timed block: the simulation asks for each of
		// its actions, and a long run timed thousands of blocks a rank.
		bp.after, bp.afterN = map[string]float64{}, map[string]int{}
		for id, at := range bp.sentAt {
			bp.after[blockKey(id)] += bp.sofar[id] - at
			bp.afterN[blockKey(id)]++
		}
	}
	key := fmt.Sprintf("%v c%d", a.Kind, a.Chunk)
	if bp.afterN[key] == 0 {
		return bp.cost(a)
	}
	return max(bp.cost(a)-bp.after[key]/float64(bp.afterN[key])*1000, 0)
}
