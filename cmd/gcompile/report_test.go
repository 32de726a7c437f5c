package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/lower"
	"gcompile/runtime"
)

// captureStderr runs f with os.Stderr going to a pipe (a single process
// logs there: startJob sets the job log to os.Stderr) and returns what f
// wrote, echoed to the real stderr so a failing test still shows it.
func captureStderr(t *testing.T, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stderr
	os.Stderr = w
	var out bytes.Buffer
	done := make(chan struct{})
	go func() {
		io.Copy(io.MultiWriter(&out, saved), r)
		close(done)
	}()
	ferr := f()
	os.Stderr = saved
	w.Close()
	<-done
	r.Close()
	return out.String(), ferr
}

// xmlNode is an element of the report, parsed as XML: the page is kept
// well-formed so a strict XML parser checks it (golang.org/x/net/html is
// not among the module's dependencies).
type xmlNode struct {
	name string
	attr map[string]string
	kids []*xmlNode
	text string // all text inside, children's included
}

func parsePage(t *testing.T, page []byte) *xmlNode {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(page))
	d.Strict = true
	root := &xmlNode{name: "#document"}
	stack := []*xmlNode{root}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the report must be well-formed")
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &xmlNode{name: tok.Name.Local, attr: map[string]string{}}
			for _, a := range tok.Attr {
				n.attr[a.Name.Local] = a.Value
			}
			top := stack[len(stack)-1]
			top.kids = append(top.kids, n)
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			for _, n := range stack {
				n.text += string(tok)
			}
		}
	}
	require.Len(t, stack, 1, "every element is closed")
	return root
}

// find returns the elements under n (n included) that match.
func (n *xmlNode) find(match func(*xmlNode) bool) []*xmlNode {
	var out []*xmlNode
	if match(n) {
		out = append(out, n)
	}
	for _, k := range n.kids {
		out = append(out, k.find(match)...)
	}
	return out
}

func byName(name string) func(*xmlNode) bool {
	return func(n *xmlNode) bool { return n.name == name }
}

func byAttr(key, value string) func(*xmlNode) bool {
	return func(n *xmlNode) bool { return n.attr != nil && n.attr[key] == value }
}

// seriesPoints is how many points the chart line named name has.
func seriesPoints(t *testing.T, page *xmlNode, name string) int {
	t.Helper()
	lines := page.find(func(n *xmlNode) bool { return n.name == "polyline" && n.attr["data-series"] == name })
	require.Len(t, lines, 1, "one %q line", name)
	return len(strings.Fields(lines[0].attr["points"]))
}

// assertSelfContained checks the page fetches nothing: no scripts, no
// http(s) URL anywhere, no element pointing at another file.
func assertSelfContained(t *testing.T, raw []byte, page *xmlNode) {
	t.Helper()
	assert.NotRegexp(t, `(?i)https?:`, string(raw))
	assert.Empty(t, page.find(byName("script")))
	assert.Empty(t, page.find(byName("link")))
	for _, n := range page.find(func(*xmlNode) bool { return true }) {
		for _, k := range []string{"src", "href"} {
			if v, ok := n.attr[k]; ok {
				assert.True(t, strings.HasPrefix(v, "#"), "<%s %s=%q> points outside the page", n.name, k, v)
			}
		}
	}
	assert.NotContains(t, string(raw), "@import")
	assert.NotContains(t, string(raw), "url(")
}

// A training run ends with a summary on the log, and --report draws the
// run: a point per step on the loss and speed curves, every device's
// memory by category, the pass times.
func TestRunWritesSummaryAndReport(t *testing.T) {
	dir := t.TempDir()
	metrics, report := filepath.Join(dir, "m.json"), filepath.Join(dir, "run.html")
	weights, trace, dumps := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "t.json"), filepath.Join(dir, "d")
	ck := filepath.Join(dir, "ck")
	const steps = 6
	log, err := captureStderr(t, func() error {
		return mainErr(append(slices.Clone(tinyGPT), "--run", "--steps", fmt.Sprint(steps), "--eval-every", "2", "--eval-batches", "1",
			"--metrics", metrics, "--report", report, "--save", weights, "--trace", trace, "--dump", dumps, "--checkpoint-dir", ck))
	})
	require.NoError(t, err)
	m := readMetrics(t, metrics)
	require.Len(t, m.Steps, steps)
	require.Len(t, m.Eval, 3)

	// The progress lines estimate the time left, except on the last step.
	for i := 1; i < steps; i++ {
		assert.Regexp(t, fmt.Sprintf(`(?m)^step %d/%d .* eta (<0\.1s|\d+\.\ds|[0-9hms]+)( held-out loss [0-9.]+)?$`, i, steps), log)
	}
	assert.Regexp(t, fmt.Sprintf(`(?m)^step %d/%d .* tok/s held-out loss [0-9.]+$`, steps, steps), log)

	// The summary: one block at the end, with the metrics' own figures.
	i := strings.Index(log, "summary: ")
	require.GreaterOrEqual(t, i, 0, "no summary in the log:\n%s", log)
	summary := log[i:]
	assert.LessOrEqual(t, strings.Count(summary, "\n"), 5, "a compact block:\n%s", summary)
	assert.Regexp(t, fmt.Sprintf(`^summary: steps 1–%d of %d in [0-9.ms]+ wall time\n`, steps, steps), summary)
	last, eval := m.Steps[steps-1], m.Eval[len(m.Eval)-1]
	assert.Contains(t, summary, fmt.Sprintf("train %.4f at step %d, held-out %.4f at step %d", last.Loss, steps, eval.Loss, eval.Step))
	var tokens, secs float64
	for _, s := range m.Steps[1:] {
		tokens += s.TokensPerS * s.Ms / 1000
		secs += s.Ms / 1000
	}
	assert.Contains(t, summary, fmt.Sprintf("%.0f tokens/s mean over steps 2–%d", tokens/secs, steps))
	require.NotEmpty(t, m.Checkpoint)
	for _, f := range []string{"metrics " + metrics, "report " + report, "weights " + weights, "checkpoint " + m.Checkpoint,
		"trace " + trace, "dumps " + filepath.Join(dumps, "index.html")} {
		assert.Contains(t, summary, f)
	}

	raw, err := os.ReadFile(report)
	require.NoError(t, err)
	page := parsePage(t, raw)
	assertSelfContained(t, raw, page)
	assert.Equal(t, steps, seriesPoints(t, page, "train loss"), "one point per step")
	assert.Equal(t, len(m.Eval), seriesPoints(t, page, "held-out loss"), "one point per evaluation")
	assert.Equal(t, steps, seriesPoints(t, page, "tokens/s"), "one point per step")
	assert.Equal(t, steps, seriesPoints(t, page, "gradient norm (before clipping)"))
	overview := page.find(byAttr("id", "overview"))
	require.Len(t, overview, 1)
	assert.Contains(t, overview[0].text, fmt.Sprintf("%.4f (step %d)", last.Loss, steps))
	assert.Contains(t, overview[0].text, fmt.Sprintf("%.4f (step %d)", eval.Loss, eval.Step))

	rows := page.find(func(n *xmlNode) bool { return n.name == "tr" && n.attr["data-rank"] != "" })
	require.Len(t, rows, len(m.Devices))
	cells := rows[0].find(byName("td"))
	require.Len(t, cells, 4+len(memoryCategories)+2)
	assert.Equal(t, fmt.Sprintf("%d B", m.Devices[0].PeakBytesPredicted), cells[1].attr["title"])
	assert.Equal(t, fmt.Sprintf("%d B", m.Devices[0].PeakBytesMeasured), cells[2].attr["title"])
	assert.Equal(t, "to the byte", cells[3].text, "measured equals predicted on the CPU backend")
	b := m.Devices[0].PeakBreakdown
	require.NotNil(t, b)
	for k, want := range []int64{b.Params, b.Gradients, b.Optimizer, b.Activations, b.Inputs, b.Workspace} {
		assert.Equal(t, fmt.Sprintf("%d B", want), cells[4+k].attr["title"], memoryCategories[k].name)
	}
	header := page.find(byAttr("id", "memory-table"))[0].find(byName("th"))
	var heads []string
	for _, h := range header {
		heads = append(heads, h.text)
	}
	assert.Subset(t, heads, []string{"params", "gradients", "optimizer state", "activations", "inputs", "workspace"})

	passRows := page.find(byAttr("id", "passes-table"))[0].find(byName("tr"))
	require.Len(t, passRows, len(m.Passes)+1, "a header and one row per pass")
	for k, p := range m.Passes {
		assert.Contains(t, passRows[k+1].text, p.Name)
	}
	assert.Empty(t, page.find(byAttr("id", "timeline")), "no pipeline, no schedule")
}

// --report without --run draws the compiled plan: every device's predicted
// memory, and the pipeline schedule --timeline would draw.
func TestReportOfACompiledPipelinePlan(t *testing.T) {
	report := filepath.Join(t.TempDir(), "plan.html")
	log, err := captureStderr(t, func() error {
		return mainErr([]string{gptModel, "--set", "layers=4,hidden=32,heads=2,seq=16", "--batch", "8",
			"--devices", "4", "--pp", "2", "--dp", "2", "--microbatches", "4", "--report", report})
	})
	require.NoError(t, err)
	assert.Contains(t, log, "report of the compiled plan: "+report)
	assert.NotContains(t, log, "summary:", "nothing trained")
	raw, err := os.ReadFile(report)
	require.NoError(t, err)
	page := parsePage(t, raw)
	assertSelfContained(t, raw, page)
	assert.Empty(t, page.find(byName("polyline")), "no curves without training")
	assert.Contains(t, page.text, "compiled only")
	// Only what applies to a compile: no training section, no measured
	// memory, none of the settings only a run reads.
	assert.Empty(t, page.find(byAttr("id", "training")))
	assert.NotContains(t, page.text, "measured")
	config := page.find(byAttr("id", "config-table"))
	require.Len(t, config, 1)
	var settings []string
	for _, th := range config[0].find(byName("th")) {
		settings = append(settings, th.text)
	}
	assert.Subset(t, settings, []string{"optimizer", "precision", "microbatches", "pp", "batch"})
	for _, s := range []string{"steps", "seed", "lr", "min_lr", "warmup", "processes"} {
		assert.NotContains(t, settings, s, "a compile does not use it")
	}
	rows := page.find(func(n *xmlNode) bool { return n.name == "tr" && n.attr["data-rank"] != "" })
	require.Len(t, rows, 4, "every device")
	for r, row := range rows {
		assert.Equal(t, fmt.Sprint(r), row.attr["data-rank"])
		assert.Len(t, row.find(byName("td")), 2+len(memoryCategories)+2, "rank, predicted, the categories, arena, host")
	}
	bars := page.find(func(n *xmlNode) bool { return n.name == "g" && n.attr["data-rank"] != "" })
	assert.Len(t, bars, 4, "a memory bar per device")
	timeline := page.find(byAttr("id", "timeline"))
	require.Len(t, timeline, 1)
	assert.Contains(t, timeline[0].text, "1f1b: p=2 v=1 m=4")
	assert.Contains(t, timeline[0].text, "rank 1")
	assert.Len(t, timeline[0].find(func(n *xmlNode) bool { return n.name == "rect" && n.attr["data-kind"] != "" }), 2*2*4, "forward and backward of 4 microbatches on 2 ranks")
	assert.Contains(t, page.text, "bubble in theory")
}

// Strings from the model and the user reach the page as text, never as
// markup: the page stays well-formed and holds no element they spelled.
func TestReportEscapesUserStrings(t *testing.T) {
	evil := `<script>alert("x")</script>&amp;'`
	c := &config{run: true, steps: 2, metrics: "m" + evil + ".json"}
	c.Model = "model" + evil + ".go"
	met := &runtime.Metrics{
		Config:      map[string]any{"set": evil, "model": c.Model},
		Passes:      []runtime.PassMetrics{{Name: "pass" + evil, Ms: 1, Skipped: evil}},
		Devices:     []runtime.DeviceMetrics{{Rank: 0, PeakBytesPredicted: 100, PeakBytesMeasured: 90, PeakBreakdown: &lower.Breakdown{Params: 60, Activations: 40}}},
		Steps:       []runtime.StepMetrics{{Step: 5, Loss: 2, Ms: 10, TokensPerS: 100}, {Step: 6, Loss: 1.5, Ms: 10, TokensPerS: 120}},
		Eval:        []runtime.EvalMetrics{{Step: 6, Loss: 1.75}},
		ResumedFrom: &runtime.ResumeMetrics{Checkpoint: "ck" + evil, Step: 4},
		Checkpoint:  "ck" + evil + "/step-6",
		Checkpoints: []runtime.CheckpointMetrics{{Step: 6, Dir: "ck" + evil + "/step-6", Ms: 3}},
		Stopped:     "sig" + evil,
		Data:        &runtime.DataMetrics{Source: "data" + evil},
	}
	for _, runErr := range []error{nil, errors.New("boom" + evil)} {
		raw, err := renderReport(c, nil, met, runErr)
		require.NoError(t, err)
		page := parsePage(t, raw)
		assertSelfContained(t, raw, page)
		assert.NotContains(t, string(raw), "<script")
		for _, want := range []string{c.Model, "pass" + evil, "ck" + evil + "/step-6", "sig" + evil, "data" + evil} {
			assert.Contains(t, page.text, want, "the text reaches the reader unchanged")
		}
		assert.Equal(t, 2, seriesPoints(t, page, "train loss"))
		assert.Contains(t, page.text, "−10 B", "a measured peak below the prediction")
		if runErr != nil {
			errs := page.find(byAttr("id", "error"))
			require.Len(t, errs, 1)
			assert.Contains(t, errs[0].text, "boom"+evil)
		}
	}
}

// A MoE run's report plots what its layers report each step: a line per
// layer of the aux loss, z-loss and dropped fraction, a chart of expert
// loads per layer (the least, mean and most loaded once experts are too
// many for a line each), and the model's other outputs on one more chart.
func TestReportPlotsMoEOutputs(t *testing.T) {
	met := &runtime.Metrics{Devices: []runtime.DeviceMetrics{{Rank: 0, PeakBytesPredicted: 100}}}
	for step := 1; step <= 3; step++ {
		out := map[string]float64{"lm_loss": 5, "emb.z": 1, "h.2.moe.aux": 1.1, "h.2.moe.z": 2, "h.2.moe.dropped": 0.1,
			"h.10.moe.aux": 1.2, "h.10.moe.z": 2.2, "h.10.moe.dropped": 0.3}
		for e := range 4 {
			out[fmt.Sprintf("h.2.moe.load.e%d", e)] = 0.25
		}
		for e := range 12 {
			out[fmt.Sprintf("h.10.moe.load.e%d", e)] = float64(e) / 66 * float64(step)
		}
		met.Steps = append(met.Steps, runtime.StepMetrics{Step: step, Loss: 3, Ms: 1, TokensPerS: 10, Outputs: out})
	}
	raw, err := renderReport(&config{run: true, steps: 3}, nil, met, nil)
	require.NoError(t, err)
	page := parsePage(t, raw)
	charts := map[string][]string{}
	for _, svg := range page.find(byName("svg")) {
		title := svg.find(byName("title"))[0].text
		for _, line := range svg.find(byName("polyline")) {
			charts[title] = append(charts[title], line.attr["data-series"])
		}
	}
	for title, want := range map[string][]string{
		"MoE load-balancing loss (unweighted)":  {"h.2.moe", "h.10.moe"},
		"MoE router z-loss (unweighted)":        {"h.2.moe", "h.10.moe"},
		"routing choices dropped over capacity": {"h.2.moe", "h.10.moe"},
		"expert load: h.2.moe":                  {"expert 0", "expert 1", "expert 2", "expert 3"},
		"expert load: h.10.moe":                 {"most loaded expert", "mean", "least loaded expert"},
		"other outputs of the model":            {"emb.z", "lm_loss"},
	} {
		assert.Equal(t, want, charts[title], title)
	}
	assert.Equal(t, 3, seriesPoints(t, page, "lm_loss"), "a point per step")
	spread := page.find(func(n *xmlNode) bool { return n.name == "svg" && strings.Contains(n.text, "expert load: h.10.moe") })
	require.Len(t, spread, 1)
	assert.Contains(t, spread[0].text, "fraction of the group's tokens", "the y axis is labelled")
	ss := expertSpread(map[string][][2]float64{"e0": {{1, 0.1}, {2, 0.4}}, "e1": {{1, 0.3}, {2, 0.2}}, "e2": {{1, 0.5}, {2, 0.3}}}, []string{"e0", "e1", "e2"})
	require.Len(t, ss, 3)
	assert.Equal(t, [][2]float64{{1, 0.5}, {2, 0.4}}, ss[0].points, "most loaded")
	assert.InDeltaSlice(t, []float64{0.3, 0.3}, []float64{ss[1].points[0][1], ss[1].points[1][1]}, 1e-12, "mean")
	assert.Equal(t, [][2]float64{{1, 0.1}, {2, 0.2}}, ss[2].points, "least loaded")

	// A dense run has no outputs and no such charts.
	for i := range met.Steps {
		met.Steps[i].Outputs = nil
	}
	raw, err = renderReport(&config{run: true, steps: 3}, nil, met, nil)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "expert load")
	assert.NotContains(t, string(raw), `id="outputs"`)
}

func TestReportFlagWantsAnHTMLFile(t *testing.T) {
	_, err := parseArgs([]string{gptModel, "--report", "r.json"})
	assert.ErrorContains(t, err, `--report "r.json": the report is an HTML page; give a FILE.html`)
	c, err := parseArgs([]string{gptModel, "--report", "out/R.HTML"})
	require.NoError(t, err)
	assert.Equal(t, "out/R.HTML", c.report)
}

// The estimate is the mean step time of the steps this run did times the
// steps left: a resumed run counts from its checkpoint's step.
func TestProgressETA(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, total: 10}
	for i, ms := range []float64{1000, 2000, 3000} {
		p.step(runtime.StepMetrics{Step: i + 1, Loss: 3, Ms: ms}, nil)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 3)
	assert.True(t, strings.HasSuffix(lines[0], " eta 9.0s"), lines[0]) // 1 s × 9 left
	assert.True(t, strings.HasSuffix(lines[1], " eta 12s"), lines[1])  // 1.5 s × 8
	assert.True(t, strings.HasSuffix(lines[2], " eta 14s"), lines[2])  // 2 s × 7
	assert.Equal(t, "1m23s", formatDuration(83*time.Second+200*time.Millisecond))
	assert.Equal(t, "<0.1s", formatDuration(20*time.Millisecond))

	// Resumed at step 150 of 200: after its first step, 49 steps left at
	// 0.4 s each. Dividing by the step number would promise 0.1 s.
	b.Reset()
	p = &progress{w: &b, total: 200}
	p.step(runtime.StepMetrics{Step: 151, Loss: 3, Ms: 400}, nil)
	assert.Contains(t, b.String(), "step 151/200 ")
	assert.True(t, strings.HasSuffix(strings.TrimSpace(b.String()), " eta 20s"), b.String())
	p.step(runtime.StepMetrics{Step: 152, Loss: 3, Ms: 800}, &runtime.EvalMetrics{Step: 152, Loss: 2.5})
	assert.True(t, strings.HasSuffix(strings.TrimSpace(b.String()), " eta 29s held-out loss 2.5000"), b.String()) // 0.6 s × 48

	// A step count past what a time.Duration holds does not wrap round to
	// a short estimate.
	b.Reset()
	huge := &progress{w: &b, total: 1e15}
	huge.step(runtime.StepMetrics{Step: 1, Loss: 3, Ms: 30}, nil)
	assert.NotContains(t, b.String(), "eta <0.1s")
	assert.Contains(t, b.String(), "eta over 10000h")
	// Nor does evaluation's, whose product wrapped to -2562047h.
	assert.Equal(t, "over 10000h", formatDuration(durationOf(1e18*float64(time.Second))))
	assert.Equal(t, "<0.1s", formatDuration(durationOf(math.NaN())))

	// The last step has nothing left to estimate.
	b.Reset()
	p.step(runtime.StepMetrics{Step: 200, Loss: 3, Ms: 400}, nil)
	assert.NotContains(t, b.String(), "eta")

	// On a terminal the bar carries it too.
	b.Reset()
	p = &progress{w: &b, total: 100, tty: true}
	p.step(runtime.StepMetrics{Step: 1, Loss: 3, Ms: 1000}, nil)
	assert.Regexp(t, `^\r█*·+ step 1/100 .* eta 1m39s\x1b\[K$`, b.String())
}

// --log-every N writes, off a terminal, a line every N steps, at an
// evaluation and at the last step, each of the steps since the line
// before: the mean loss of those that trained, the skipped ones counted,
// the mean time.
func TestProgressLogsEveryNSteps(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, total: 8, every: 3}
	for s := 1; s <= 8; s++ {
		m := runtime.StepMetrics{Step: s, Loss: float64(s), Ms: 10 * float64(s), TokensPerS: 100, LR: 1e-3, GradNorm: 1, LossScale: 512}
		if s == 2 {
			m.Skipped = true
		}
		var e *runtime.EvalMetrics
		if s == 5 {
			e = &runtime.EvalMetrics{Step: 5, Loss: 2.5}
		}
		p.step(m, e)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 4, b.String())
	assert.True(t, strings.HasPrefix(lines[0], "step 3/8 loss 2.0000 (mean of 3 steps) skipped 1: inf/NaN gradients (loss scale now 512) lr 1.00e-03 |g| 1.000 20 ms 100 tok/s eta"), lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "step 5/8 loss 4.5000 (mean of 2 steps) lr"), lines[1])
	assert.True(t, strings.HasSuffix(lines[1], "held-out loss 2.5000"), lines[1])
	assert.True(t, strings.HasPrefix(lines[2], "step 6/8 loss 6.0000 lr"), lines[2])
	assert.True(t, strings.HasPrefix(lines[3], "step 8/8 loss 7.5000 (mean of 2 steps) lr 1.00e-03 |g| 1.000 75 ms 100 tok/s"), lines[3])

	// A run that stops between two lines says its last steps when it
	// ends; the rate is the tokens over the time.
	b.Reset()
	p = &progress{w: &b, total: 10, every: 5}
	p.step(runtime.StepMetrics{Step: 1, Loss: 4, Ms: 100, TokensPerS: 1000}, nil)
	p.step(runtime.StepMetrics{Step: 2, Loss: 2, Ms: 300, TokensPerS: 2000}, nil)
	assert.Empty(t, b.String())
	p.done()
	assert.True(t, strings.HasPrefix(b.String(), "step 2/10 loss 3.0000 (mean of 2 steps) lr 0.00e+00 |g| 0.000 200 ms 1750 tok/s"), b.String())
}

// The flag reaches a run's log.
func TestLogEveryReachesTheRun(t *testing.T) {
	log, err := captureStderr(t, func() error {
		return mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--max-data-mb", "1",
			"--run", "--steps", "5", "--log-every", "2", "--eval-batches", "-1"})
	})
	require.NoError(t, err)
	assert.Equal(t, 3, strings.Count(log, "\nstep "), log)
	assert.Contains(t, log, "step 2/5 loss")
	assert.Contains(t, log, "step 5/5 loss")
	assert.NotContains(t, log, "step 3/5")
}

// A run whose first steps all overflow is told so once, after the tenth,
// not only a skipped step a line; one that has trained a step, or has
// no step left, is not.
func TestProgressSaysNothingHasTrained(t *testing.T) {
	skipped := func(p *progress, steps ...int) {
		for _, s := range steps {
			p.step(runtime.StepMetrics{Step: s, Loss: 3, Ms: 1, Skipped: true, LossScale: 1e30}, nil)
		}
	}
	var b bytes.Buffer
	p := &progress{w: &b, total: 30}
	skipped(p, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	assert.NotContains(t, b.String(), "nothing has trained")
	skipped(p, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21)
	assert.Equal(t, 1, strings.Count(b.String(), "note: the run's first 10 steps all overflowed and were skipped (loss scale now 1e+30): nothing has trained yet"))
	assert.Contains(t, strings.Split(b.String(), "\n")[10], "note: the run's first 10 steps", "after step 10's line")

	b.Reset()
	p = &progress{w: &b, total: 30}
	p.step(runtime.StepMetrics{Step: 1, Loss: 3, Ms: 1}, nil)
	skipped(p, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	assert.NotContains(t, b.String(), "nothing has trained")

	b.Reset()
	p = &progress{w: &b, total: 10}
	skipped(p, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	assert.NotContains(t, b.String(), "nothing has trained", "the summary says it of a run that has ended")
}

// A resumed run's progress and summary count the steps it did, after its
// checkpoint's.
func TestProgressAndSummaryOfAResumedRun(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	args := append(slices.Clone(tinyGPT), "--run", "--steps", "6", "--eval-batches", "1", "--checkpoint-dir", ck)
	first, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(args), "--stop-after", "3")) })
	require.NoError(t, err)
	assert.Contains(t, first, "summary: steps 1–3 of 6, stopped by --stop-after in ")
	log, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(args), "--resume", ck)) })
	require.NoError(t, err)
	assert.NotRegexp(t, `(?m)^step [1-3]/6 `, log)
	assert.Regexp(t, `(?m)^step 4/6 .* eta `, log)
	assert.Regexp(t, `(?m)^step 5/6 .* eta `, log)
	assert.Regexp(t, `summary: steps 4–6 of 6 \(resumed from [^)]*step-0*3\) in `, log)
	assert.Contains(t, log, "tokens/s mean over steps 5–6")
}

// The summary of a run that wrote nothing says how to keep its numbers,
// and one whose outputs failed says which.
func TestProgressSummaryWithoutOutputs(t *testing.T) {
	var b bytes.Buffer
	c := &config{run: true, steps: 1}
	writeSummary(&b, c, &runtime.Metrics{Steps: []runtime.StepMetrics{{Step: 1, Loss: 2, Ms: 100, TokensPerS: 640}}}, 0)
	assert.Equal(t, "summary: step 1 of 1\n  loss      train 2.0000 at step 1, no held-out evaluation\n  speed     640 tokens/s mean over step 1\n"+
		"  wrote     nothing (--metrics FILE or --report FILE.html keep these numbers)\n", b.String())

	// Only what this command wrote is listed: not a file an earlier run
	// left where a write failed, nor one that is not there at all.
	dir := t.TempDir()
	c = &config{run: true, steps: 1, started: time.Now(), metrics: filepath.Join(dir, "m.json"), save: filepath.Join(dir, "missing.safetensors"),
		report: filepath.Join(dir, "r.html")}
	require.NoError(t, os.WriteFile(c.metrics, nil, 0o644))
	require.NoError(t, os.Chtimes(c.metrics, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)))
	require.NoError(t, os.WriteFile(c.report, nil, 0o644))
	assert.Equal(t, []outputFile{{"report", c.report}}, outputs(c, &runtime.Metrics{}))
	// What was asked and not written is said, not "nothing was asked":
	// the error that says why follows the summary.
	b.Reset()
	writeSummary(&b, c, &runtime.Metrics{Steps: []runtime.StepMetrics{{Step: 1, Loss: 2, Ms: 100, TokensPerS: 640}}}, 0)
	assert.Contains(t, b.String(), "  wrote     report "+c.report+"\n  failed    --metrics "+c.metrics+", --save "+c.save+" (the error follows)\n")
	c = &config{run: true, steps: 1, started: time.Now(), metrics: filepath.Join(dir, "none", "m.json")}
	b.Reset()
	writeSummary(&b, c, &runtime.Metrics{Steps: []runtime.StepMetrics{{Step: 1, Loss: 2, Ms: 100, TokensPerS: 640}}}, 0)
	assert.Contains(t, b.String(), "  wrote     nothing\n  failed    --metrics "+c.metrics+" (the error follows)\n")
	assert.NotContains(t, b.String(), "keep these numbers")
}

// The summary says when steps skipped their update: all of them under a
// static loss scale the gradients overflow (nothing was trained), some
// under dynamic scaling, none otherwise.
func TestSkippedLine(t *testing.T) {
	steps := func(skipped ...bool) []runtime.StepMetrics {
		var out []runtime.StepMetrics
		for i, s := range skipped {
			out = append(out, runtime.StepMetrics{Step: i + 1, Skipped: s, LossScale: 65536})
		}
		return out
	}
	static := &config{}
	static.LossScale = 1e6
	assert.Equal(t, "", skippedLine(&config{}, steps(false, false)))
	assert.Contains(t, skippedLine(static, steps(true, true, true)), "every step's update (3): the gradients overflowed at the static --loss-scale 1e+06, so nothing was trained")
	assert.Contains(t, skippedLine(&config{}, steps(true, true)), "every step's update (2): the gradients overflowed (last at loss scale 65536)")
	assert.Equal(t, "1 of 3 steps' updates: their gradients overflowed (last at loss scale 65536)", skippedLine(&config{}, steps(true, false, false)))
}

// A character device (a terminal) gets the redrawn bar, through the
// training run's watch of its log too; a pipe gets lines. The watch hid
// the terminal, so a run's bar was never drawn.
func TestProgressSeesTheTerminalThroughTheLogWatch(t *testing.T) {
	dev, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer dev.Close()
	assert.True(t, isTerminal(dev))
	assert.True(t, isTerminal(&pipeWatch{w: dev}))
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.False(t, isTerminal(&pipeWatch{w: w}))
	assert.False(t, isTerminal(&bytes.Buffer{}))
}

// A step's line shows an expert's loads as their range and an output of
// every layer as its range over the layers (h.*.…), so a deep MoE model's
// line stays short; an output of one layer keeps its name.
func TestOutputsLineFoldsLayersAndExperts(t *testing.T) {
	outs := map[string]float64{"balance": 0.5}
	for _, l := range []string{"1", "3", "10"} {
		outs["h."+l+".moe.dropped"] = 0
		outs["h."+l+".moe.aux"] = 1 + 0.01*float64(len(l))
		for e := range 8 {
			outs["h."+l+".moe.load.e"+strconv.Itoa(e)] = 0.125 * float64(e%3)
		}
	}
	assert.Equal(t, " balance 0.5 h.*.moe.aux 1.01–1.02 h.*.moe.dropped 0 h.*.moe.load 0–0.25", outputsLine(outs))
	one := map[string]float64{"h.1.moe.aux": 1.5, "h.1.moe.load.e0": 0.25, "h.1.moe.load.e1": 0.75}
	assert.Equal(t, " h.1.moe.aux 1.5 h.1.moe.load 0.25–0.75", outputsLine(one))
	assert.Empty(t, outputsLine(nil))
}
