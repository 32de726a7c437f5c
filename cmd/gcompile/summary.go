package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gcompile/compile"
	"gcompile/runtime"
)

// finishRun tells the person who started the command what happened, once
// the metrics are written: process 0 writes --report (also after a failed
// run, whose curves are what one wants to look at) and, after a training
// run that ended without error, prints the summary on the job log.
func finishRun(c *config, j *job, res *compile.Result, met *runtime.Metrics, runErr error) error {
	if !j.lead() {
		return runErr
	}
	if c.report != "" {
		if err := writeReport(c.report, c, res, met, runErr); err != nil {
			return errors.Join(runErr, fmt.Errorf("--report: %w", err))
		}
	}
	switch {
	case !c.run && c.report != "":
		// Compile only: the report is the one thing to point at.
		fmt.Fprintf(j.log, "report of the compiled plan: %s\n", c.report)
	case runErr != nil && c.report != "":
		// The error follows; the page shows the steps before it.
		fmt.Fprintf(j.log, "report of the failed run: %s\n", c.report)
	}
	if runErr == nil && c.run {
		wall := time.Duration(0)
		if !c.started.IsZero() {
			wall = time.Since(c.started)
		}
		writeSummary(j.log, c, met, wall)
	}
	return runErr
}

// reportCompileFailure writes --report after a compile that failed: the
// page is headed by the error and shows what the compile got to: the
// passes that ran and, when the plan was lowered (a plan refused by
// --device-memory is), each device's predicted memory. res may be nil
// (the model did not load).
func reportCompileFailure(c *config, j *job, res *compile.Result, compileErr error) error {
	var ms float64
	if !c.started.IsZero() {
		ms = float64(time.Since(c.started).Microseconds()) / 1000
	}
	met := newMetrics(c, j, res, ms)
	if res != nil && len(res.Programs) > 0 {
		for r := range res.Devices() {
			met.Devices = append(met.Devices, deviceMetrics(res.ProgramOf(r), r))
		}
	}
	err := writeOutput("report", c.report, func(p string) error { return writeReport(p, c, res, met, &compileFailure{compileErr}) })
	if err == nil {
		// The error follows; the page shows what the compile got to.
		fmt.Fprintf(j.log, "report of the failed compile: %s\n", c.report)
	}
	return err
}

// skippedLine says how many of the steps skipped their update because
// their gradients overflowed under mixed precision ("" when none did): a
// static --loss-scale too large for the 16-bit gradients skips every
// step, and the run then trained nothing, which only the metrics said.
func skippedLine(c *config, steps []runtime.StepMetrics) string {
	n, scale := 0, 0.0
	for _, s := range steps {
		if s.Skipped {
			n++
			scale = s.LossScale
		}
	}
	switch {
	case n == 0:
		return ""
	case n == len(steps) && c.LossScale > 0:
		return fmt.Sprintf("every step's update (%d): the gradients overflowed at the static --loss-scale %g, so nothing was trained; lower it, or leave it out for dynamic scaling", n, c.LossScale)
	case n == len(steps):
		return fmt.Sprintf("every step's update (%d): the gradients overflowed (last at loss scale %g), so nothing was trained", n, scale)
	}
	return fmt.Sprintf("%d of %d steps' updates: their gradients overflowed (last at loss scale %g)", n, len(steps), scale)
}

// runTotals are the figures the summary and the report both lead with.
type runTotals struct {
	first, last int // the steps this run did (Steps' first and last)
	trainLoss   float64
	eval        *runtime.EvalMetrics // the last held-out evaluation
	// tokPerS is tokens over time for the steps after the first, which
	// warms caches up and compiles kernels; with one step, that one.
	tokPerS    float64
	tokSteps   string  // which steps tokPerS covers, e.g. "steps 2–250"
	timedFirst float64 // the first of them
}

func totals(met *runtime.Metrics) (runTotals, bool) {
	// This part of the run's: the steps carried from its earlier parts
	// ran in other processes, perhaps under another plan.
	steps := met.Steps[min(met.Carried, len(met.Steps)):]
	if len(steps) == 0 {
		return runTotals{}, false
	}
	first, last := steps[0], steps[len(steps)-1]
	t := runTotals{first: first.Step, last: last.Step, trainLoss: last.Loss}
	if len(met.Eval) > 0 {
		t.eval = &met.Eval[len(met.Eval)-1]
	}
	timed := steps
	if len(timed) > 1 {
		timed = timed[1:]
	}
	// Tokens over seconds rather than the mean of per-step rates, so a
	// slow step weighs by the time it took.
	var tokens, secs float64
	for _, s := range timed {
		tokens += s.TokensPerS * s.Ms / 1000
		secs += s.Ms / 1000
	}
	if secs > 0 {
		t.tokPerS = tokens / secs
	}
	t.timedFirst = float64(timed[0].Step)
	t.tokSteps = fmt.Sprintf("step %d", timed[0].Step)
	if len(timed) > 1 {
		t.tokSteps = fmt.Sprintf("steps %d–%d", timed[0].Step, timed[len(timed)-1].Step)
	}
	return t, true
}

// steps names the steps this run did: "step 7" or "steps 1–250".
func (t runTotals) steps() string {
	if t.first == t.last {
		return fmt.Sprintf("step %d", t.first)
	}
	return fmt.Sprintf("steps %d–%d", t.first, t.last)
}

// outputFile is one file or folder the command wrote.
type outputFile struct{ What, Path string }

// outputs lists what the run wrote, in the order a person looks for it:
// the outputs asked for that are there now and were written since the
// command started. An output whose write failed (reported with the run's
// error) is left out, as is a file an earlier run left at its path.
func outputs(c *config, met *runtime.Metrics) []outputFile {
	var out []outputFile
	add := func(what, path string) {
		if path == "" {
			return
		}
		st, err := os.Stat(path)
		// Two seconds' grace for file systems with coarse modification times.
		if err != nil || !c.started.IsZero() && st.ModTime().Before(c.started.Add(-2*time.Second)) {
			return
		}
		out = append(out, outputFile{what, path})
	}
	add("metrics", c.metrics)
	add("report", c.report)
	if c.run {
		add("weights", c.save)
		add("checkpoint", met.Checkpoint)
		add("trace", c.trace)
	}
	add("timeline", c.timeline)
	if c.dump != "" {
		add("dumps", filepath.Join(c.dump, "index.html"))
	}
	return out
}

// notWritten is the outputs the command line asked for that outputs did
// not find written (a write that failed), as flag and path: the summary
// comes before the run's error, and must not read as if none was asked.
func notWritten(c *config, written []outputFile) []string {
	var lost []string
	for _, o := range []struct{ flag, path string }{{"--metrics", c.metrics}, {"--report", c.report}, {"--save", c.save}, {"--timeline", c.timeline}} {
		if o.path == "" || o.flag == "--save" && !c.run || slices.ContainsFunc(written, func(f outputFile) bool { return f.Path == o.path }) {
			continue
		}
		lost = append(lost, o.flag+" "+o.path)
	}
	return lost
}

// writeSummary prints the closing block of a training run: how far it
// got, the losses, the speed, the wall time and where its outputs are.
func writeSummary(w io.Writer, c *config, met *runtime.Metrics, wall time.Duration) {
	var b strings.Builder
	t, ok := totals(met)
	if !ok {
		fmt.Fprintf(&b, "summary: no training step ran (--steps %d)", c.steps)
		if met.ResumedFrom != nil {
			fmt.Fprintf(&b, "; %s is already at step %d", met.ResumedFrom.Checkpoint, met.ResumedFrom.Step)
		}
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "summary: %s of %d", t.steps(), c.steps)
		if met.ResumedFrom != nil {
			fmt.Fprintf(&b, " (resumed from %s)", met.ResumedFrom.Checkpoint)
		}
		if met.Stopped != "" {
			fmt.Fprintf(&b, ", stopped by %s", met.Stopped)
		}
		if wall > 0 {
			fmt.Fprintf(&b, " in %s wall time", formatDuration(wall))
		}
		fmt.Fprintf(&b, "\n  loss      train %.4f at step %d", t.trainLoss, t.last)
		if t.eval != nil {
			fmt.Fprintf(&b, ", held-out %.4f at step %d", t.eval.Loss, t.eval.Step)
		} else {
			b.WriteString(", no held-out evaluation")
		}
		if t.tokPerS > 0 && !math.IsInf(t.tokPerS, 0) {
			fmt.Fprintf(&b, "\n  speed     %.0f tokens/s mean over %s", t.tokPerS, t.tokSteps)
			if t.first != t.last {
				b.WriteString(" (the first step warms up)")
			}
		}
		if line := skippedLine(c, met.Steps[min(met.Carried, len(met.Steps)):]); line != "" {
			b.WriteString("\n  skipped   " + line)
		}
		if n, dirs := c.tokens.rebuilt(); n > 0 {
			fmt.Fprintf(&b, "\n  data      %d cached sample index file(s) in %s were damaged or stale and were built again", n, strings.Join(dirs, ", "))
		}
		b.WriteString("\n")
	}
	files := outputs(c, met)
	lost := notWritten(c, files)
	switch {
	case len(files) == 0 && len(lost) == 0:
		b.WriteString("  wrote     nothing (--metrics FILE or --report FILE.html keep these numbers)\n")
	case len(files) == 0:
		b.WriteString("  wrote     nothing\n")
	default:
		parts := make([]string, len(files))
		for i, f := range files {
			parts[i] = f.What + " " + f.Path
		}
		fmt.Fprintf(&b, "  wrote     %s\n", strings.Join(parts, ", "))
	}
	if len(lost) > 0 {
		fmt.Fprintf(&b, "  failed    %s (the error follows)\n", strings.Join(lost, ", "))
	}
	io.WriteString(w, b.String())
}
