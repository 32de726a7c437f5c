package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"gcompile/compile"
	"gcompile/lower"
	"gcompile/runtime"
)

// writeReport writes --report: one HTML page a person can open from
// anywhere (a laptop, a CI artifact) — styles inline, charts as inline SVG
// drawn here, no scripts, fonts or links to fetch — with what the metrics
// JSON holds: loss and speed per step, memory per device, the pipeline
// schedule and the passes. runErr, when the run failed, heads the page.
func writeReport(path string, c *config, res *compile.Result, met *runtime.Metrics, runErr error) error {
	page, err := renderReport(c, res, met, runErr)
	if err != nil {
		return err
	}
	// Replaced atomically like the metrics: a browser reloading the page
	// never sees half of it.
	return runtime.WriteFileAtomic(path, page)
}

// compileFailure marks an error of the compile (not of training) for the
// report's heading.
type compileFailure struct{ err error }

func (e *compileFailure) Error() string { return e.err.Error() }
func (e *compileFailure) Unwrap() error { return e.err }

// fact is one labelled line of the page's overview.
type fact struct{ Label, Value string }

// reportPage is what the template draws. Strings are the model's and the
// user's (paths, names, config values): html/template escapes them. The
// SVG fields are drawn by this file, which escapes the text it puts in.
type reportPage struct {
	Title, Generated, Error string
	// Failed is what failed: "run", or "compile" when no program was
	// built to run.
	Failed           string
	Overview, Config []fact
	// CompileOnly: no --run, so nothing of training applies: no training
	// section, no measured memory, no training settings.
	CompileOnly           bool
	Trained               bool
	Loss, Speed, GradNorm template.HTML
	LossNote              string
	// Outputs are charts of what the model reports each step besides its
	// loss: a MoE layer's auxiliary losses, dropped tokens, expert loads.
	Outputs     []template.HTML
	Categories  []string
	Memory      []memoryRow
	MemoryChart template.HTML
	Schedule    []fact
	Timeline    template.HTML
	Passes      []passRow
	Checkpoints []runtime.CheckpointMetrics
	Files       []outputFile
}

type memoryRow struct {
	Rank                                    int
	Predicted, Measured, Match, Arena, Host cell
	Breakdown                               []cell
}

// cell is a byte count for people, with the exact count on hover.
type cell struct{ Text, Exact string }

func bytesCell(n int64) cell {
	return cell{lower.HumanBytes(n), strconv.FormatInt(n, 10) + " B"}
}

type passRow struct {
	Name, Ms, Skipped, Note string
	Changed                 bool
	BarPx                   float64
}

// memoryCategories are lower.Breakdown's fields in the order the table and
// the bars show them, with their JSON names and colours.
var memoryCategories = []struct {
	name, color string
	bytes       func(lower.Breakdown) int64
}{
	{"params", "#4e79a7", func(b lower.Breakdown) int64 { return b.Params }},
	{"gradients", "#59a14f", func(b lower.Breakdown) int64 { return b.Gradients }},
	{"optimizer state", "#f28e2b", func(b lower.Breakdown) int64 { return b.Optimizer }},
	{"activations", "#e15759", func(b lower.Breakdown) int64 { return b.Activations }},
	{"inputs", "#76b7b2", func(b lower.Breakdown) int64 { return b.Inputs }},
	{"workspace", "#b07aa1", func(b lower.Breakdown) int64 { return b.Workspace }},
}

func renderReport(c *config, res *compile.Result, met *runtime.Metrics, runErr error) ([]byte, error) {
	name := c.Model
	if res != nil && res.Module != nil {
		name = res.Module.Name
	}
	p := reportPage{
		Title:       "gcompile: " + name,
		Generated:   time.Now().Format("2006-01-02 15:04:05 MST"),
		CompileOnly: !c.run,
		Trained:     len(met.Steps) > met.Carried,
	}
	if runErr != nil {
		p.Error, p.Failed = runErr.Error(), "run"
		var ce *compileFailure
		if errors.As(runErr, &ce) {
			p.Failed = "compile"
		}
	}
	p.Overview = overview(c, name, met)
	for _, k := range slices.Sorted(maps.Keys(met.Config)) {
		if p.CompileOnly && trainingSettings[k] {
			continue
		}
		p.Config = append(p.Config, fact{k, fmt.Sprint(met.Config[k])})
	}
	if p.Trained {
		p.Loss, p.LossNote = lossChart(met)
		p.Speed = speedChart(met)
		p.GradNorm = gradNormChart(met)
		p.Outputs = outputCharts(met)
	}
	for _, cat := range memoryCategories {
		p.Categories = append(p.Categories, cat.name)
	}
	for _, d := range met.Devices {
		p.Memory = append(p.Memory, memoryRowOf(d, !p.CompileOnly))
	}
	p.MemoryChart = template.HTML(memoryChart(met.Devices))
	if res != nil && res.Schedule != nil && res.Simulated != nil {
		s := met.Schedule
		p.Schedule = []fact{
			{"schedule", fmt.Sprintf("%s: p=%d v=%d m=%d", s.Name, res.Schedule.Ranks, res.Schedule.Chunks, res.Schedule.Micro)},
			{"bubble in theory", fmt.Sprintf("%.4f", s.BubbleTheory)},
			{"bubble simulated (unit costs)", fmt.Sprintf("%.4f", s.BubbleSimulated)},
		}
		if s.BubbleProfiled != nil {
			p.Schedule = append(p.Schedule, fact{"bubble simulated (measured F/B/W times)", fmt.Sprintf("%.4f", *s.BubbleProfiled)})
		}
		if len(s.StashPeak) > 0 {
			p.Schedule = append(p.Schedule, fact{"activations stashed per rank (microbatches)", fmt.Sprint(s.StashPeak)})
		}
		// The drawing --timeline writes. Inline SVG in HTML needs no
		// namespace, and leaving it out keeps every http:// string, which a
		// reader may take for a link, out of the page. The page scales it
		// to its width like the charts.
		svg := timelineSVG(res.Schedule, res.Simulated, compile.UnitCost(res.Schedule))
		p.Timeline = template.HTML(strings.Replace(svg, ` xmlns="http://www.w3.org/2000/svg"`, "", 1))
	}
	var slowest float64
	for _, ps := range met.Passes {
		slowest = max(slowest, ps.Ms)
	}
	for _, ps := range met.Passes {
		r := passRow{Name: ps.Name, Ms: fmt.Sprintf("%.2f", ps.Ms), Changed: ps.Changed, Skipped: ps.Skipped, Note: ps.Note}
		if slowest > 0 {
			r.BarPx = math.Round(160*ps.Ms/slowest*10) / 10
		}
		p.Passes = append(p.Passes, r)
	}
	p.Checkpoints = met.Checkpoints
	if runErr == nil {
		p.Files = outputs(c, met)
	}
	var b bytes.Buffer
	if err := reportTemplate.Execute(&b, p); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// trainingSettings are the metrics' config entries that only a run reads:
// a compile-only report leaves them out, as settings nothing used.
var trainingSettings = map[string]bool{
	"steps": true, "seed": true, "lr": true, "min_lr": true, "warmup": true, "processes": true, "device": true,
	"lr_decay": true, "lr_decay_steps": true, "lr_wsd_decay_steps": true, "lr_wsd_decay_style": true,
}

// overview is the page's first table: the model, the plan and the outcome.
func overview(c *config, name string, met *runtime.Metrics) []fact {
	f := []fact{{"model", c.Model + " (" + name + ")"}, {"params", groupDigits(met.Model.Params)}}
	devices, update := 0, ""
	for _, d := range met.Devices {
		if d.Role == "update" {
			update = " and the update program (asynchronous data parallelism's master weights and optimizer state)"
			continue
		}
		devices++
	}
	if c.run {
		f = append(f, fact{"devices", fmt.Sprintf("%d%s (processes %v)", devices, update, met.Config["processes"])})
	} else {
		f = append(f, fact{"devices", fmt.Sprintf("%d%s", devices, update)})
	}
	f = append(f, fact{"compile", fmt.Sprintf("%.0f ms", met.CompileMs)})
	if met.Data != nil {
		if d := met.Data; d.Tokens > 0 {
			f = append(f, fact{"data", fmt.Sprintf("%s: %s documents, %s tokens, --split %s", d.Source, groupDigits(d.Documents), groupDigits(d.Tokens), d.Split)})
		} else {
			f = append(f, fact{"data", fmt.Sprintf("%s (%s train / %s held-out bytes)", d.Source, groupDigits(int64(d.TrainBytes)), groupDigits(int64(d.EvalBytes)))})
		}
	}
	if met.ResumedFrom != nil {
		f = append(f, fact{"resumed from", fmt.Sprintf("%s (step %d)", met.ResumedFrom.Checkpoint, met.ResumedFrom.Step)})
	}
	t, ok := totals(met)
	if !ok {
		if !c.run {
			f = append(f, fact{"run", "none: the plan was compiled only (add --run to train)"})
		} else {
			f = append(f, fact{"training", "no step ran"})
		}
		return f
	}
	f = append(f, fact{"trained", fmt.Sprintf("%s of %d", t.steps(), c.steps)})
	if met.Stopped != "" {
		f = append(f, fact{"stopped by", met.Stopped})
	}
	f = append(f, fact{"final train loss", fmt.Sprintf("%.4f (step %d)", t.trainLoss, t.last)})
	if t.eval != nil {
		f = append(f, fact{"held-out loss", fmt.Sprintf("%.4f (step %d)", t.eval.Loss, t.eval.Step)})
	}
	if t.tokPerS > 0 && !math.IsInf(t.tokPerS, 0) {
		f = append(f, fact{"mean tokens/s", fmt.Sprintf("%.0f over %s", t.tokPerS, t.tokSteps)})
	}
	if met.Async != nil {
		f = append(f, fact{"staleness", fmt.Sprintf("largest seen %d (bound %d)", met.Async.MaxStalenessSeen, met.Async.Staleness)})
	}
	if met.Checkpoint != "" {
		f = append(f, fact{"last checkpoint", met.Checkpoint})
	}
	return f
}

// memoryRowOf is one device's line of the memory table. A device of a run
// that failed before its end has no measured peak; a compile-only report
// (run false) has no measured columns at all.
func memoryRowOf(d runtime.DeviceMetrics, run bool) memoryRow {
	r := memoryRow{Rank: d.Rank, Predicted: bytesCell(d.PeakBytesPredicted), Arena: bytesCell(d.ArenaBytes), Host: bytesCell(d.HostBytes)}
	switch diff := d.PeakBytesMeasured - d.PeakBytesPredicted; {
	case !run:
	case d.PeakBytesMeasured == 0:
		r.Measured, r.Match = cell{"not measured", ""}, cell{"", ""}
	case diff == 0:
		r.Measured, r.Match = bytesCell(d.PeakBytesMeasured), cell{"to the byte", ""}
	default:
		sign := "+"
		if diff < 0 {
			sign, diff = "−", -diff
		}
		r.Measured, r.Match = bytesCell(d.PeakBytesMeasured), cell{sign + lower.HumanBytes(diff), sign + strconv.FormatInt(diff, 10) + " B"}
	}
	for _, cat := range memoryCategories {
		if d.PeakBreakdown == nil {
			r.Breakdown = append(r.Breakdown, cell{"—", "no breakdown"})
			continue
		}
		r.Breakdown = append(r.Breakdown, bytesCell(cat.bytes(*d.PeakBreakdown)))
	}
	return r
}

// groupDigits writes 1234567 as 1 234 567 (a thin space: no locale's
// decimal mark).
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u2009")
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// series is one line of a chart: points (x, y), finite.
type series struct {
	name, color string
	points      [][2]float64
	dashed      bool
	// markers draws a dot with a tooltip per point: for sparse series
	// (held-out evaluations), where a line alone hides where they are.
	markers bool
}

func lossChart(met *runtime.Metrics) (template.HTML, string) {
	train := series{name: "train loss", color: "#4e79a7"}
	bad := 0
	for _, s := range met.Steps {
		if isFinite(s.Loss) {
			train.points = append(train.points, [2]float64{float64(s.Step), s.Loss})
		} else {
			bad++
		}
	}
	held := series{name: "held-out loss", color: "#e15759", markers: true}
	for _, e := range met.Eval {
		if isFinite(e.Loss) {
			held.points = append(held.points, [2]float64{float64(e.Step), e.Loss})
		}
	}
	note := ""
	if bad > 0 {
		note = fmt.Sprintf("%d step(s) with a non-finite loss are not drawn.", bad)
	}
	return template.HTML(lineChart("loss per step", "step", "loss (nats per token)", []series{train, held})), note
}

func speedChart(met *runtime.Metrics) template.HTML {
	tok := series{name: "tokens/s", color: "#59a14f"}
	for _, s := range met.Steps {
		if isFinite(s.TokensPerS) {
			tok.points = append(tok.points, [2]float64{float64(s.Step), s.TokensPerS})
		}
	}
	ss := []series{tok}
	if t, ok := totals(met); ok && t.tokPerS > 0 && isFinite(t.tokPerS) && t.timedFirst < float64(t.last) {
		// Across the steps the mean is over (this part's, the first left
		// out). A mean over one step is that step's point, with no line.
		first, last := t.timedFirst, float64(t.last)
		ss = append(ss, series{name: "mean over " + t.tokSteps, color: "#333333", dashed: true,
			points: [][2]float64{{first, t.tokPerS}, {last, t.tokPerS}}})
	}
	return template.HTML(lineChart("tokens per second", "step", "tokens/s", ss))
}

func gradNormChart(met *runtime.Metrics) template.HTML {
	g := series{name: "gradient norm (before clipping)", color: "#b07aa1"}
	for _, s := range met.Steps {
		if isFinite(s.GradNorm) {
			g.points = append(g.points, [2]float64{float64(s.Step), s.GradNorm})
		}
	}
	return template.HTML(lineChart("global gradient norm", "step", "‖g‖", []series{g}))
}

// moeStats are the outputs a MoE layer NAME reports each step
// (frontend/nn.MoE), by suffix, each drawn on a chart of its own with a
// line per layer; NAME.load.eI, the experts' loads, get a chart per layer.
var moeStats = []struct{ suffix, title, yLabel string }{
	{".aux", "MoE load-balancing loss (unweighted)", "aux loss"},
	{".z", "MoE router z-loss (unweighted)", "z-loss"},
	{".dropped", "routing choices dropped over capacity", "fraction dropped"},
}

// maxExpertLines is the most experts a load chart draws one line each
// for; beyond it the lines would be a tangle, and the chart draws the
// least, mean and most loaded expert instead.
const maxExpertLines = 8

// outputCharts draws the model's per-step outputs (b.Output): a MoE
// layer's auxiliary and z losses, dropped fraction and expert loads, and
// any other output (a model's loss without its auxiliary terms) on one
// more chart. A layer is a MoE layer when it reports dropped tokens or
// expert loads, which nn.MoE always does, so an unrelated output that
// happens to end in .z stays among the others.
func outputCharts(met *runtime.Metrics) []template.HTML {
	points := map[string][][2]float64{}
	for _, st := range met.Steps {
		for name, v := range st.Outputs {
			if isFinite(v) {
				points[name] = append(points[name], [2]float64{float64(st.Step), v})
			}
		}
	}
	if len(points) == 0 {
		return nil
	}
	type expert struct {
		index int
		name  string
	}
	loads := map[string][]expert{} // layer → its experts' output names
	for name := range points {
		i := strings.LastIndex(name, ".load.e")
		if i > 0 && isDigits(name[i+len(".load.e"):]) {
			k, _ := strconv.Atoi(name[i+len(".load.e"):])
			loads[name[:i]] = append(loads[name[:i]], expert{k, name})
		}
	}
	isMoE := func(layer string) bool {
		_, dropped := points[layer+".dropped"]
		return dropped || len(loads[layer]) > 0
	}
	names := slices.SortedFunc(maps.Keys(points), naturalCompare)
	used := map[string]bool{}
	var charts []template.HTML
	for _, stat := range moeStats {
		var ss []series
		for _, name := range names {
			layer, ok := strings.CutSuffix(name, stat.suffix)
			if !ok || !isMoE(layer) {
				continue
			}
			used[name] = true
			ss = append(ss, series{name: layer, color: palette[len(ss)%len(palette)], points: points[name]})
		}
		if len(ss) > 0 {
			charts = append(charts, template.HTML(lineChart(stat.title, "step", stat.yLabel, ss)))
		}
	}
	for _, layer := range slices.SortedFunc(maps.Keys(loads), naturalCompare) {
		experts := loads[layer]
		slices.SortFunc(experts, func(a, b expert) int { return a.index - b.index })
		var ss []series
		for _, e := range experts {
			used[e.name] = true
		}
		if len(experts) <= maxExpertLines {
			for _, e := range experts {
				ss = append(ss, series{name: fmt.Sprintf("expert %d", e.index), color: palette[len(ss)%len(palette)], points: points[e.name]})
			}
		} else {
			names := make([]string, len(experts))
			for i, e := range experts {
				names[i] = e.name
			}
			ss = expertSpread(points, names)
		}
		charts = append(charts, template.HTML(lineChart("expert load: "+layer, "step", "fraction of the group's tokens", ss)))
	}
	var others []series
	for _, name := range names {
		if !used[name] {
			others = append(others, series{name: name, color: palette[len(others)%len(palette)], points: points[name]})
		}
	}
	if len(others) > 0 {
		charts = append(charts, template.HTML(lineChart("other outputs of the model", "step", "value", others)))
	}
	return charts
}

// naturalCompare orders names with their numbers by value, so layer
// h.2.moe comes before h.10.moe.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

// digitPrefix is how many ASCII digits s starts with.
func digitPrefix(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// expertSpread is the least, mean and most loaded of the experts names at
// each step of the first one's series.
func expertSpread(points map[string][][2]float64, names []string) []series {
	lo := series{name: "least loaded expert", color: "#4e79a7"}
	mean := series{name: "mean", color: "#333333", dashed: true}
	hi := series{name: "most loaded expert", color: "#e15759"}
	at := map[string]map[float64]float64{}
	for _, name := range names {
		at[name] = map[float64]float64{}
		for _, pt := range points[name] {
			at[name][pt[0]] = pt[1]
		}
	}
	for _, pt := range points[names[0]] {
		step := pt[0]
		l, h, sum, n := math.Inf(1), math.Inf(-1), 0.0, 0
		for _, byStep := range at {
			if v, ok := byStep[step]; ok {
				l, h, sum, n = min(l, v), max(h, v), sum+v, n+1
			}
		}
		lo.points = append(lo.points, [2]float64{step, l})
		hi.points = append(hi.points, [2]float64{step, h})
		mean.points = append(mean.points, [2]float64{step, sum / float64(n)})
	}
	return []series{hi, mean, lo}
}

func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// Chart geometry, in SVG pixels. A chart's title is drawn in it (a page of
// several charts needs them told apart at a glance); its legend takes a
// row of legendRowH per line, and its plot starts below the legend.
const (
	chartW, chartH                       = 760.0, 320.0
	chartLeft, chartRight                = 74.0, 20.0
	chartTitleY, chartLegendY            = 18.0, 40.0
	chartTop, chartBottom                = 56.0, 46.0
	plotW, plotH                         = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	legendRowH, chartCharW               = 18.0, 7.5 // chartCharW: an upper bound of a glyph's width at chartFont
	chartFont                            = `font-family="sans-serif" font-size="13"`
	svgOpen                              = `<svg class="chart" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" ` + chartFont + `>`
	axisColor, gridColor                 = "#444444", "#e4e4e4"
	memRowH, memBarH, memLeft, memLegend = 30.0, 18.0, 70.0, 28.0
	memAxisH                             = 48.0
)

// palette colours series that have no colour of their own (a MoE layer, an
// expert): Tableau 10, the colours the rest of the page uses.
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// lineChart draws series on shared axes with ticks at round numbers. Each
// series is one polyline with one point per entry, named by data-series;
// the axis labels carry class axis-label and data-axis x or y, so a test
// finds them. The legend wraps onto more rows rather than running off the
// drawing, where the SVG's edge would cut it.
func lineChart(title, xLabel, yLabel string, ss []series) string {
	var xs, ys []float64
	for _, s := range ss {
		for _, pt := range s.points {
			xs, ys = append(xs, pt[0]), append(ys, pt[1])
		}
	}
	legend := make([]legendItem, len(ss))
	for i, s := range ss {
		legend[i] = legendItem{name: s.name, color: s.color, dashed: s.dashed}
	}
	pos, rows := layoutLegend(legend, chartLeft, chartW-chartRight, 27, chartCharW)
	extra := legendRowH * float64(rows-1)
	top, h := chartTop+extra, chartH+extra
	var b strings.Builder
	fmt.Fprintf(&b, svgOpen, chartW, h, chartW, h)
	fmt.Fprintf(&b, `<title>%s</title>`, esc(title))
	fmt.Fprintf(&b, `<text class="chart-title" x="4" y="%.0f" font-size="15" font-weight="bold">%s</text>`, chartTitleY, esc(title))
	if len(xs) == 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">no finite values to draw</text></svg>`, chartLeft, top+20)
		return b.String()
	}
	xTicks, x0, x1 := niceTicks(slices.Min(xs), slices.Max(xs), 8, true)
	yTicks, y0, y1 := niceTicks(slices.Min(ys), slices.Max(ys), 6, false)
	px := func(x float64) float64 { return chartLeft + (x-x0)/(x1-x0)*plotW }
	py := func(y float64) float64 { return top + plotH - (y-y0)/(y1-y0)*plotH }
	yDigits, xDigits := tickDigits(yTicks), tickDigits(xTicks)
	for _, y := range yTicks {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, chartLeft, py(y), chartLeft+plotW, py(y), gridColor)
		fmt.Fprintf(&b, `<text class="tick" data-axis="y" x="%.1f" y="%.1f" text-anchor="end">%s</text>`, chartLeft-6, py(y)+4, strconv.FormatFloat(y, 'f', yDigits, 64))
	}
	for _, x := range xTicks {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, px(x), top+plotH, px(x), top+plotH+4, axisColor)
		fmt.Fprintf(&b, `<text class="tick" data-axis="x" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px(x), top+plotH+17, strconv.FormatFloat(x, 'f', xDigits, 64))
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="%s"/>`, chartLeft, top, plotW, plotH, axisColor)
	fmt.Fprintf(&b, `<text class="axis-label" data-axis="x" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, chartLeft+plotW/2, h-6, esc(xLabel))
	fmt.Fprintf(&b, `<text class="axis-label" data-axis="y" transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`, top+plotH/2, esc(yLabel))
	for i, s := range ss {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		lx, ly := pos[i][0], chartLegendY+legendRowH*pos[i][1]
		fmt.Fprintf(&b, `<line class="legend" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`, lx, ly, lx+22, ly, s.color, dash)
		fmt.Fprintf(&b, `<text class="legend" x="%.1f" y="%.1f">%s</text>`, lx+27, ly+4, esc(s.name))
		pts := make([]string, len(s.points))
		for i, pt := range s.points {
			pts[i] = fmt.Sprintf("%.1f,%.1f", px(pt[0]), py(pt[1]))
		}
		fmt.Fprintf(&b, `<polyline data-series="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round"%s points="%s"><title>%s</title></polyline>`,
			esc(s.name), s.color, dash, strings.Join(pts, " "), esc(s.name))
		// A lone point draws no line: it gets its dot like sparse series.
		if s.markers || len(s.points) == 1 {
			for _, pt := range s.points {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s</title></circle>`,
					px(pt[0]), py(pt[1]), s.color, esc(fmt.Sprintf("step %.0f: %s %.4g", pt[0], s.name, pt[1])))
			}
		}
	}
	b.WriteString("</svg>")
	return b.String()
}

// niceTicks covers [lo, hi] with about n ticks at 1, 2 or 5 times a power
// of ten, and returns them with the range they span. Integer axes (steps)
// never get fractional ticks.
func niceTicks(lo, hi float64, n int, integer bool) (ticks []float64, t0, t1 float64) {
	if hi <= lo {
		pad := math.Max(math.Abs(lo)*0.05, 1)
		if integer {
			pad = 1
		}
		lo, hi = lo-pad, hi+pad
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	if integer {
		step = math.Max(1, math.Round(step))
	}
	t0, t1 = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	for i := 0; ; i++ {
		t := t0 + float64(i)*step
		if t > t1+step/2 || i > 4*n {
			break
		}
		ticks = append(ticks, t)
	}
	return ticks, t0, t1
}

// tickDigits is how many decimals tell the ticks apart.
func tickDigits(ticks []float64) int {
	if len(ticks) < 2 {
		return 0
	}
	step := ticks[1] - ticks[0]
	return max(0, int(-math.Floor(math.Log10(step)+1e-9)))
}

// memoryChart draws each device's predicted peak as a bar split by what
// the bytes hold, with its measured peak as a black tick, over an axis of
// bytes at round binary multiples (0, 256 KiB, 512 KiB…).
func memoryChart(devs []runtime.DeviceMetrics) string {
	var most int64
	measured := false
	for _, d := range devs {
		most = max(most, d.PeakBytesPredicted, d.PeakBytesMeasured)
		measured = measured || d.PeakBytesMeasured > 0
	}
	legend := make([]legendItem, 0, len(memoryCategories)+1)
	for _, cat := range memoryCategories {
		legend = append(legend, legendItem{name: cat.name, color: cat.color})
	}
	if measured {
		legend = append(legend, legendItem{name: "measured peak", color: "#000000"})
	}
	w := memLeft + plotW + 90
	pos, rows := layoutLegend(legend, memLeft, w-10, 16, chartCharW)
	top := memLegend + legendRowH*float64(rows-1)
	barsH := memRowH * float64(len(devs))
	h := top + barsH + memAxisH
	var b strings.Builder
	fmt.Fprintf(&b, svgOpen, w, h, w, h)
	b.WriteString(`<title>peak memory per device by category</title>`)
	for i, it := range legend {
		x, y := pos[i][0], 6+legendRowH*pos[i][1]
		if it.name == "measured peak" {
			fmt.Fprintf(&b, `<line class="legend" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000000" stroke-width="2"/>`, x+5, y-2, x+5, y+14)
		} else {
			fmt.Fprintf(&b, `<rect class="legend" x="%.1f" y="%.1f" width="12" height="12" fill="%s"/>`, x, y, it.color)
		}
		fmt.Fprintf(&b, `<text class="legend" x="%.1f" y="%.1f">%s</text>`, x+16, y+10, esc(it.name))
	}
	if most == 0 {
		b.WriteString("</svg>")
		return b.String()
	}
	// Ticks at round numbers of the binary unit the largest peak is
	// counted in, so they read 256 KiB rather than 262 144 B.
	unit, unitName := int64(1), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if most < unit<<10 {
			break
		}
		unit, unitName = unit<<10, u
	}
	ticks, _, span := niceTicks(0, float64(most)/float64(unit), 6, false)
	scale := plotW / (span * float64(unit))
	axisY := top + barsH
	digits := tickDigits(ticks)
	for _, t := range ticks {
		x := memLeft + t*float64(unit)*scale
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, x, top-4, x, axisY, gridColor)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, x, axisY, x, axisY+4, axisColor)
		fmt.Fprintf(&b, `<text class="tick" data-axis="x" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x, axisY+17, strconv.FormatFloat(t, 'f', digits, 64)+" "+unitName)
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, memLeft, axisY, memLeft+plotW, axisY, axisColor)
	fmt.Fprintf(&b, `<text class="axis-label" data-axis="x" x="%.1f" y="%.1f" text-anchor="middle">bytes at the predicted peak</text>`, memLeft+plotW/2, h-6)
	fmt.Fprintf(&b, `<text class="axis-label" data-axis="y" transform="translate(12 %.1f) rotate(-90)" text-anchor="middle">device</text>`, top+barsH/2)
	for i, d := range devs {
		y := top + memRowH*float64(i) + (memRowH-memBarH)/2
		fmt.Fprintf(&b, `<g data-rank="%d"><text x="%.1f" y="%.1f" text-anchor="end">rank %d</text>`, d.Rank, memLeft-6, y+memBarH-5, d.Rank)
		x := memLeft
		if d.PeakBreakdown != nil {
			for _, cat := range memoryCategories {
				n := cat.bytes(*d.PeakBreakdown)
				if n <= 0 {
					continue
				}
				fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"><title>%s</title></rect>`,
					x, y, float64(n)*scale, memBarH, cat.color, esc(fmt.Sprintf("rank %d %s: %s", d.Rank, cat.name, lower.HumanBytes(n))))
				x += float64(n) * scale
			}
		} else {
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="#bbbbbb"/>`, x, y, float64(d.PeakBytesPredicted)*scale, memBarH)
		}
		if d.PeakBytesMeasured > 0 {
			mx := memLeft + float64(d.PeakBytesMeasured)*scale
			fmt.Fprintf(&b, `<line x1="%.2f" y1="%.1f" x2="%.2f" y2="%.1f" stroke="#000000" stroke-width="2"><title>%s</title></line>`,
				mx, y-3, mx, y+memBarH+3, esc(fmt.Sprintf("rank %d measured peak %s", d.Rank, lower.HumanBytes(d.PeakBytesMeasured))))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text></g>`, memLeft+float64(d.PeakBytesPredicted)*scale+6, y+memBarH-5, esc(lower.HumanBytes(d.PeakBytesPredicted)))
	}
	b.WriteString("</svg>")
	return b.String()
}

// esc escapes text for the SVG this file writes into the page.
func esc(s string) string { return template.HTMLEscapeString(s) }

// reportTemplate is the page. It stays well-formed XML (closed empty
// elements, no named entities but XML's own) so the tests can parse it
// with encoding/xml, and browsers read it as HTML5.
var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>{{.Title}}</title>
<style>
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1800px; padding: 16px 24px; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; overflow-wrap: anywhere; }
h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 3px 10px; text-align: left; border-bottom: 1px solid #eee; vertical-align: top; overflow-wrap: break-word; }
.facts td { overflow-wrap: anywhere; }
th.n { text-align: right; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.facts th { font-weight: normal; color: #555; white-space: nowrap; }
.muted { color: #777; font-size: 0.9em; }
.error { background: #fdecea; border: 1px solid #e15759; padding: 8px 12px; white-space: pre-wrap; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; }
.bar { display: inline-block; height: 10px; background: #4e79a7; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 600px), 1fr)); gap: 8px 32px; }
svg.chart { width: 100%; max-width: 1000px; height: auto; display: block; margin: 8px 0; }
#memory-chart svg.chart { max-width: 900px; }
#timeline svg.chart { width: auto; max-width: 100%; }
code { font-size: 0.95em; overflow-wrap: anywhere; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="muted">written by gcompile --report at {{.Generated}}; a run's numbers are also in its --metrics JSON</p>
{{if .Error}}<p class="error" id="error">The {{.Failed}} failed: {{.Error}}</p>{{end}}
<div class="scroll">
<table class="facts" id="overview">
{{range .Overview}}<tr><th>{{.Label}}</th><td>{{.Value}}</td></tr>
{{end}}</table>
</div>
{{if not .CompileOnly}}
<h2 id="training">Training</h2>
{{if .Trained}}<div class="charts">
{{.Loss}}
{{.Speed}}
{{.GradNorm}}
</div>
{{if .LossNote}}<p class="muted">{{.LossNote}}</p>{{end}}
{{if .Outputs}}<h3 id="outputs">Outputs of the model per step</h3>
<div class="charts">
{{range .Outputs}}{{.}}
{{end}}</div>
{{end}}
{{else}}<p class="muted">No training step ran.</p>
{{end}}
{{end}}
<h2 id="memory">Memory per device</h2>
<p class="muted">The compile-time plan's peak, split by what the bytes hold{{if .Trained}}, and the peak the runtime measured{{end}}.</p>
<div id="memory-chart">{{.MemoryChart}}</div>
<div class="scroll">
<table id="memory-table">
<thead><tr><th>rank</th><th class="n">predicted peak</th>{{if not .CompileOnly}}<th class="n">measured peak</th><th class="n">measured − predicted</th>{{end}}{{range .Categories}}<th class="n">{{.}}</th>{{end}}<th class="n">arena</th><th class="n">host (offloaded)</th></tr></thead>
<tbody>
{{range .Memory}}<tr data-rank="{{.Rank}}"><td>{{.Rank}}</td><td class="n" title="{{.Predicted.Exact}}">{{.Predicted.Text}}</td>{{if not $.CompileOnly}}<td class="n" title="{{.Measured.Exact}}">{{.Measured.Text}}</td><td class="n" title="{{.Match.Exact}}">{{.Match.Text}}</td>{{end}}{{range .Breakdown}}<td class="n" title="{{.Exact}}">{{.Text}}</td>{{end}}<td class="n" title="{{.Arena.Exact}}">{{.Arena.Text}}</td><td class="n" title="{{.Host.Exact}}">{{.Host.Text}}</td></tr>
{{end}}</tbody>
</table>
</div>
{{if .Schedule}}
<h2 id="schedule">Pipeline schedule</h2>
<table class="facts">
{{range .Schedule}}<tr><th>{{.Label}}</th><td>{{.Value}}</td></tr>
{{end}}</table>
<p class="muted">Simulated with unit costs, as --timeline draws it: each box is one action, labelled chunk, kind and microbatch (0F3: chunk 0's forward of microbatch 3); grey is time a rank waits.</p>
<div id="timeline">{{.Timeline}}</div>
{{end}}
<h2 id="passes">Compiler passes</h2>
<div class="scroll">
<table id="passes-table">
<thead><tr><th>pass</th><th class="n">ms</th><th></th><th>changed the module</th><th>skipped</th><th>note</th></tr></thead>
<tbody>
{{range .Passes}}<tr><td><code>{{.Name}}</code></td><td class="n">{{.Ms}}</td><td><span class="bar" style="width: {{printf "%.1f" .BarPx}}px"></span></td><td>{{if .Changed}}yes{{else}}no{{end}}</td><td>{{.Skipped}}</td><td>{{.Note}}</td></tr>
{{end}}</tbody>
</table>
</div>
{{if .Checkpoints}}
<h2 id="checkpoints">Checkpoints</h2>
<table>
<thead><tr><th class="n">step</th><th>folder</th><th class="n">ms</th></tr></thead>
<tbody>
{{range .Checkpoints}}<tr><td class="n">{{.Step}}</td><td><code>{{.Dir}}</code></td><td class="n">{{printf "%.0f" .Ms}}</td></tr>
{{end}}</tbody>
</table>
{{end}}
{{if .Files}}
<h2 id="files">Files written</h2>
<table class="facts">
{{range .Files}}<tr><th>{{.What}}</th><td><code>{{.Path}}</code></td></tr>
{{end}}</table>
{{end}}
<h2 id="config">Configuration</h2>
<table class="facts" id="config-table">
{{range .Config}}<tr><th>{{.Label}}</th><td><code>{{.Value}}</code></td></tr>
{{end}}</table>
</body>
</html>
`))
