package main

import (
	"fmt"
	"html"
	"os"
	"strings"
	"sync"
	"time"

	"gcompile/lower"
	"gcompile/passes/schedule"
)

// writeTimeline draws the simulated schedule to path as an SVG file.
func writeTimeline(path string, s *schedule.Schedule, res *schedule.Result, cost schedule.Cost) error {
	return os.WriteFile(path, []byte(timelineSVG(s, res, cost)), 0o644)
}

// timelineSVG draws the simulated schedule: one row per pipeline rank,
// one box per action (forward blue, backward green, weight gradient
// orange), labelled chunk·microbatch, so the interleaving can be seen.
// --report embeds the same drawing in its page.
func timelineSVG(s *schedule.Schedule, res *schedule.Result, cost schedule.Cost) string {
	const unit, row, left = 28.0, 34.0, 70.0
	width := left + res.StepTime*unit + 20
	height := row*float64(len(s.Actions)) + 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="monospace" font-size="10">`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="4" y="16" font-size="13">%s</text>`+"\n",
		html.EscapeString(fmt.Sprintf("%s: p=%d v=%d m=%d, simulated bubble %.3f", s.Name, s.Ranks, s.Chunks, s.Micro, res.Bubble)))
	colors := map[schedule.Kind]string{schedule.F: "#8ab4f8", schedule.B: "#81c995", schedule.W: "#fdd663"}
	for r, acts := range s.Actions {
		y := 30 + row*float64(r)
		fmt.Fprintf(&b, `<text x="4" y="%.0f">rank %d</text>`+"\n", y+row/2, r)
		for i, a := range acts {
			col, ok := colors[a.Kind]
			if !ok {
				continue
			}
			x, w := left+res.Start[r][i]*unit, cost(a)*unit
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="#333" stroke-width="0.5"/>`+"\n", x, y, w, row-6, col)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x+2, y+row/2, html.EscapeString(a.String()))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

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
