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
}

func newBlockProfile() *blockProfile {
	return &blockProfile{total: map[string]float64{}, count: map[string]int{}, seen: map[string]bool{}}
}

// hook times device prog's instructions.
func (bp *blockProfile) hook(prog *lower.Program) func(int, time.Time, time.Duration) {
	return func(i int, _ time.Time, d time.Duration) {
		in := prog.Instrs[i]
		// Only compute inside F/B/W actions: receives wait for other ranks.
		if in.Op == "recv" || in.Op == "send" || !strings.HasPrefix(in.Block, "F ") && !strings.HasPrefix(in.Block, "B ") && !strings.HasPrefix(in.Block, "W ") {
			return
		}
		kind, rest, _ := strings.Cut(in.Block, " ")
		chunk, _, _ := strings.Cut(rest, " ")
		key := kind + " " + chunk
		bp.mu.Lock()
		bp.total[key] += d.Seconds()
		if id := fmt.Sprintf("%s %d", in.Block, bp.step); !bp.seen[id] {
			bp.seen[id] = true
			bp.count[key]++
		}
		bp.mu.Unlock()
	}
}

// reset drops what was measured so far.
func (bp *blockProfile) reset() {
	bp.mu.Lock()
	defer bp.mu.Unlock()
	clear(bp.total)
	clear(bp.count)
	clear(bp.seen)
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
