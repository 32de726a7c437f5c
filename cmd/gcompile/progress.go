package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"gcompile/runtime"
)

// progress draws a bar on a terminal and prints one line per step
// otherwise (CI logs, pipes).
type progress struct {
	w     io.Writer
	total int
	tty   bool
	eval  string
}

func newProgress(w io.Writer, total int) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progress{w: w, total: total, tty: tty}
}

func (p *progress) step(s runtime.StepMetrics, e *runtime.EvalMetrics) {
	if e != nil {
		p.eval = fmt.Sprintf(" eval %.4f", e.Loss)
	}
	line := fmt.Sprintf("step %d/%d loss %.4f", s.Step, p.total, s.Loss)
	for _, name := range slices.Sorted(maps.Keys(s.Outputs)) {
		line += fmt.Sprintf(" %s %.4g", name, s.Outputs[name])
	}
	line += fmt.Sprintf(" lr %.2e |g| %.3f %.0f ms %.0f tok/s", s.LR, s.GradNorm, s.Ms, s.TokensPerS)
	if !p.tty {
		evalNote := ""
		if e != nil {
			evalNote = fmt.Sprintf(" held-out loss %.4f", e.Loss)
		}
		fmt.Fprintln(p.w, line+evalNote)
		return
	}
	const width = 30
	filled := width * s.Step / max(p.total, 1)
	bar := strings.Repeat("█", filled) + strings.Repeat("·", width-filled)
	fmt.Fprintf(p.w, "\r%s %s%s\x1b[K", bar, line, p.eval)
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
