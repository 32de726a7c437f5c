package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"gcompile/runtime"
)

// progress draws a bar on a terminal and prints one line per step
// otherwise (CI logs, pipes), each with an estimate of the time left.
type progress struct {
	w     io.Writer
	total int
	tty   bool
	eval  string
	// ran and ranMs are the steps this run did and their summed time: a
	// resumed run starts after its checkpoint's step, so the step number
	// does not say how many steps the mean is over.
	ran   int
	ranMs float64
	// trained: some step of this run updated the weights; until one
	// does, overflowEvery steps skipped from the start are said once.
	trained, warned bool
	// every is --log-every: off a terminal, one line each every steps
	// (and at an evaluation and the last step), of the steps since the
	// last line: their mean loss over those that trained, how many were
	// skipped, their mean time (Megatron-LM's --log-interval). 0 and 1
	// are a line a step.
	every int
	span  logSpan
}

// logSpan is the steps since the last line (--log-every).
type logSpan struct {
	steps, skipped, trained int
	loss, ms, tokens        float64
	last                    runtime.StepMetrics
}

// overflowEvery is how many steps skipped in a row from a run's start
// are said as nothing having trained: a loss scale far too large (or
// gradients that are not finite at any scale) otherwise shows only as a
// skipped step a line, on and on, and in the summary at the end.
const overflowEvery = 10

func newProgress(w io.Writer, total, every int) *progress {
	return &progress{w: w, total: total, tty: isTerminal(w), every: every}
}

// isTerminal reports whether w is a terminal, where a line may be redrawn
// in place ("\r"); a log file or a pipe gets whole lines.
func isTerminal(w io.Writer) bool {
	if pw, ok := w.(*pipeWatch); ok {
		w = pw.w // a training run's log, watched for a closed pipe
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (p *progress) step(s runtime.StepMetrics, e *runtime.EvalMetrics) {
	p.ran++
	p.ranMs += s.Ms
	if e != nil {
		p.eval = fmt.Sprintf(" eval %.4f", e.Loss)
	}
	line := fmt.Sprintf("step %d/%d loss %.4f", s.Step, p.total, s.Loss)
	line += outputsLine(s.Outputs)
	if s.Skipped {
		// Nothing was updated: the gradients held an inf or NaN at this
		// loss scale, which the scaler now lowers (its |g| is not a norm).
		line += fmt.Sprintf(" skipped: inf/NaN gradients at loss scale %g", s.LossScale)
	} else {
		line += fmt.Sprintf(" lr %.2e |g| %.3f", s.LR, s.GradNorm)
	}
	line += fmt.Sprintf(" %.0f ms %.0f tok/s", s.Ms, s.TokensPerS)
	if eta, ok := p.eta(s.Step); ok {
		line += " eta " + formatDuration(eta)
	}
	note := ""
	p.trained = p.trained || !s.Skipped
	if !p.trained && !p.warned && p.ran == overflowEvery && p.total-s.Step > 0 {
		p.warned = true
		note = fmt.Sprintf("note: the run's first %d steps all overflowed and were skipped (loss scale now %g): nothing has trained yet; a static --loss-scale that large never will (leave it out for dynamic scaling), and gradients that overflow at every scale need a lower --lr or a look at the model", overflowEvery, s.LossScale)
	}
	if !p.tty {
		if p.every > 1 {
			var ok bool
			if line, ok = p.interval(s, e); !ok {
				if note != "" {
					fmt.Fprintln(p.w, note)
				}
				return
			}
		}
		evalNote := ""
		if e != nil {
			evalNote = fmt.Sprintf(" held-out loss %.4f", e.Loss)
		}
		fmt.Fprintln(p.w, line+evalNote)
		if note != "" {
			fmt.Fprintln(p.w, note)
		}
		return
	}
	if note != "" {
		fmt.Fprintf(p.w, "\r%s\x1b[K\n", note)
	}
	const width = 30
	filled := min(width, width*s.Step/max(p.total, 1))
	bar := strings.Repeat("█", filled) + strings.Repeat("·", width-filled)
	fmt.Fprintf(p.w, "\r%s %s%s\x1b[K", bar, line, p.eval)
}

// interval adds step s to the steps since the last line and, at every
// p.every-th step, an evaluation or the last step, returns their line:
// the mean loss of those that trained, the skipped ones counted, the
// last step's rate and gradient norm, the mean time and throughput.
func (p *progress) interval(s runtime.StepMetrics, e *runtime.EvalMetrics) (string, bool) {
	sp := &p.span
	sp.steps++
	sp.ms += s.Ms
	sp.tokens += s.TokensPerS * s.Ms / 1000
	sp.last = s
	if s.Skipped {
		sp.skipped++
	} else {
		sp.trained++
		sp.loss += s.Loss
	}
	if s.Step%p.every != 0 && e == nil && s.Step < p.total {
		return "", false
	}
	return p.spanLine(), true
}

// spanLine is the line of the steps since the last one, which it
// starts anew.
func (p *progress) spanLine() string {
	sp, s := &p.span, p.span.last
	n := float64(sp.steps)
	line := fmt.Sprintf("step %d/%d", s.Step, p.total)
	if sp.trained > 0 {
		line += fmt.Sprintf(" loss %.4f", sp.loss/float64(sp.trained))
	}
	if sp.steps > 1 {
		line += fmt.Sprintf(" (mean of %d steps)", sp.steps)
	}
	line += outputsLine(s.Outputs)
	if sp.skipped > 0 {
		line += fmt.Sprintf(" skipped %d: inf/NaN gradients (loss scale now %g)", sp.skipped, s.LossScale)
	}
	if !s.Skipped {
		line += fmt.Sprintf(" lr %.2e |g| %.3f", s.LR, s.GradNorm)
	}
	// The tokens over the time, as Megatron-LM's interval takes its
	// elapsed time: not the mean of the steps' rates.
	line += fmt.Sprintf(" %.0f ms %.0f tok/s", sp.ms/n, sp.tokens/math.Max(sp.ms/1000, 1e-9))
	if eta, ok := p.eta(s.Step); ok {
		line += " eta " + formatDuration(eta)
	}
	p.span = logSpan{}
	return line
}

// eta is the time the steps after step should take at this run's mean
// step time; there is none after the last step.
func (p *progress) eta(step int) (time.Duration, bool) {
	left := p.total - step
	if left <= 0 || p.ran == 0 {
		return 0, false
	}
	mean := p.ranMs / float64(p.ran)
	return durationOf(mean * float64(left) * float64(time.Millisecond)), true
}

// durationOf is ns nanoseconds, saturated at the largest Duration (about
// 292 years: more than any run) where the conversion would wrap around
// to a negative time.
func durationOf(ns float64) time.Duration {
	if math.IsNaN(ns) {
		return 0
	}
	if ns >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(max(ns, 0))
}

func (p *progress) done() {
	if !p.tty && p.span.steps > 0 {
		// A run that stopped between two lines (--stop-after, a signal,
		// --stop-after-time) says its last steps.
		fmt.Fprintln(p.w, p.spanLine())
	}
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// maxShownDuration is the longest estimate written out: past it (more
// than a year) the figure says nothing but that the run is too long.
const maxShownDuration = 10000 * time.Hour

// formatDuration writes d as people read it in a log: whole seconds from
// 10 s up (1m23s, 2h5m0s), tenths below, so a short run's estimate is not
// a row of 0s.
func formatDuration(d time.Duration) string {
	if d >= maxShownDuration {
		return "over 10000h"
	}
	if d < 100*time.Millisecond {
		return "<0.1s"
	}
	if d < 10*time.Second {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

// outputsLine is the model's outputs on a step's line: a MoE layer's
// expert loads as their range (name.load lo–hi), and an output every
// layer has (h.N.moe.aux, …) as its range over the layers, named with *
// for the layer (h.*.moe.aux lo–hi): a line per layer and expert ran to
// thousands of characters on a deep model. The metrics keep every value.
func outputsLine(outs map[string]float64) string {
	// key is what a name is shown under: an expert's load under its
	// layer's, and a layer's under the pattern of all of them.
	key := func(name string) string {
		if i := strings.LastIndex(name, ".load.e"); i > 0 && isDigits(name[i+len(".load.e"):]) {
			return name[:i] + ".load"
		}
		return name
	}
	layers := map[string]map[string]bool{} // pattern → the layers' keys
	for name := range outs {
		k := key(name)
		p := layerPattern(k)
		if layers[p] == nil {
			layers[p] = map[string]bool{}
		}
		layers[p][k] = true
	}
	type span struct{ lo, hi float64 }
	spans := map[string]*span{}
	var order []string
	for _, name := range slices.Sorted(maps.Keys(outs)) {
		v, k := outs[name], key(name)
		if p := layerPattern(k); len(layers[p]) > 1 {
			k = p
		}
		if s, ok := spans[k]; ok {
			s.lo, s.hi = min(s.lo, v), max(s.hi, v)
			continue
		}
		spans[k] = &span{v, v}
		order = append(order, k)
	}
	if len(order) == 0 {
		return ""
	}
	var parts []string
	for _, k := range order {
		if s := spans[k]; s.lo == s.hi {
			parts = append(parts, fmt.Sprintf("%s %.4g", k, s.lo))
		} else {
			parts = append(parts, fmt.Sprintf("%s %.3g–%.3g", k, s.lo, s.hi))
		}
	}
	return " " + strings.Join(parts, " ")
}

// layerPattern is name with its all-digit parts (a layer's index) as *.
func layerPattern(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		if isDigits(p) {
			parts[i] = "*"
		}
	}
	return strings.Join(parts, ".")
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
