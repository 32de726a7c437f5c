package cost

import (
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the cost model's generated tables in README.md and docs/architecture.md")

// TestDocsFiguresAreCurrent: every cost-model figure the README and
// docs/architecture.md print in a table is computed here, between
// <!-- generated: NAME --> and <!-- end generated --> markers, so a change
// to the model that moves a figure fails until the tables are written
// again: go test ./cost -run TestDocsFiguresAreCurrent -update-docs, which
// `make cost-tables` runs.
func TestDocsFiguresAreCurrent(t *testing.T) {
	blocks := map[string]string{
		"cost-published": publishedRunsTable(t),
		"cost-sources":   sourcesTable(t),
	}
	for _, file := range []string{"../README.md", "../docs/architecture.md"} {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		text := string(data)
		re := regexp.MustCompile(`(?s)(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end generated -->)`)
		var missing []string
		out := re.ReplaceAllStringFunc(text, func(m string) string {
			parts := re.FindStringSubmatch(m)
			body, ok := blocks[parts[2]]
			if !ok {
				missing = append(missing, parts[2])
				return m
			}
			return parts[1] + body + parts[4]
		})
		require.Empty(t, missing, "%s: blocks no test generates", file)
		if out == text {
			continue
		}
		if *updateDocs {
			require.NoError(t, os.WriteFile(file, []byte(out), 0o644))
			continue
		}
		t.Errorf("%s: a generated table is out of date (run make cost-tables, or go test ./cost -run TestDocsFiguresAreCurrent -update-docs)", file)
	}
}

// publishedRunsTable is Megatron-LM's papers' runs on a100-80g, one row
// each, and each paper's mean error.
func publishedRunsTable(t *testing.T) string {
	var sb strings.Builder
	sb.WriteString("| source | run | GPUs | plan | predicted s | measured s | error |\n|---|---|---|---|---|---|---|\n")
	sums, counts := map[string]float64{}, map[string]int{}
	var order []string
	for _, r := range PublishedRuns() {
		pred := predictRun(t, r)
		pub := r.PublishedStep()
		rel := pub/pred - 1
		if counts[r.Source] == 0 {
			order = append(order, r.Source)
		}
		sums[r.Source] += math.Abs(rel)
		counts[r.Source]++
		fmt.Fprintf(&sb, "| %s | %s | %d | %s | %.3f | %.3f | %+.1f %% |\n", shortSource(r.Source), r.Name, r.GPUs, r.Plan(), pred, pub, 100*rel)
	}
	sb.WriteString("\n")
	for _, s := range order {
		fmt.Fprintf(&sb, "Mean absolute error over %s: %.1f %% (%d runs).\n", s, 100*sums[s]/float64(counts[s]), counts[s])
	}
	return sb.String()
}

// sourcesTable is every source's mean error: as priced (nothing fitted),
// and calibrated on its first row, predicting the others.
func sourcesTable(t *testing.T) string {
	type source struct {
		name, hardware string
		runs           []PublishedRun
		on             *Hardware // nil: each run's own
	}
	var sources []source
	add := func(name string, runs []PublishedRun, on *Hardware, hardware string) {
		sources = append(sources, source{name, hardware, runs, on})
	}
	order, bySource := groupBySource(append(PublishedRuns(), MorePublishedRuns()...))
	for _, s := range order {
		h, err := bySource[s][0].HardwareFor()
		require.NoError(t, err)
		label := h.Name
		if r := bySource[s][0]; r.InterGBps > 0 {
			label += fmt.Sprintf(":inter_node_gbps=%g", r.InterGBps)
		}
		add(s, bySource[s], nil, label)
	}
	multi := vtrainRuns(t, "ground_truth_multi.csv")
	single := vtrainRuns(t, "ground_truth_single.csv")
	preset, err := Preset("a100-80g")
	require.NoError(t, err)
	own := fmt.Sprintf("a100-80g:inter_node_gbps=%g,host_op_us=%d", vtrainInterGBps, vtrainHostOpUS)
	add("vTrain, 109 runs on 64–512 GPUs", multi, nil, own)
	add("vTrain, 109 runs on 64–512 GPUs", multi, preset, "a100-80g")
	add("vTrain, 1,344 runs on one node (host_op_us fitted here)", single, nil, own)

	var sb strings.Builder
	sb.WriteString("| source | priced on | runs | mean error | calibrated on its first run: the others' error |\n|---|---|---|---|---|\n")
	for _, s := range sources {
		var runs []PublishedRun
		for _, r := range s.runs {
			if r.priceable() {
				runs = append(runs, r)
			}
		}
		before, _, _ := meanError(t, runs, s.on)
		after := "–"
		if len(runs) > 1 {
			from := s.on
			if from == nil {
				from, err = runs[0].HardwareFor()
				require.NoError(t, err)
			}
			cal, _, err := from.CalibrateSteps(stepPoints(runs[:1], nil))
			require.NoError(t, err)
			var m float64
			for _, r := range runs[1:] {
				m += math.Abs(r.PublishedStep()/predictOn(t, r, cal)-1) / float64(len(runs)-1)
			}
			after = fmt.Sprintf("%.1f %%", 100*m)
		}
		fmt.Fprintf(&sb, "| %s | `%s` | %d | %.1f %% | %s |\n", s.name, s.hardware, len(runs), 100*before, after)
	}
	return sb.String()
}

// predictRun is r's predicted step on its own hardware (Estimate, as the
// published-run tests price it).
func predictRun(t *testing.T, r PublishedRun) float64 {
	h, err := r.HardwareFor()
	require.NoError(t, err)
	e, err := h.Estimate(r.Shape, r.Plan())
	require.NoError(t, err, r.Name)
	return e.StepSeconds
}

// predictOn is r's step on h (nil: its own hardware) by EstimateFast, as
// the calibration prices it.
func predictOn(t *testing.T, r PublishedRun, h *Hardware) float64 {
	if h == nil {
		var err error
		h, err = r.HardwareFor()
		require.NoError(t, err)
	}
	e, err := h.EstimateFast(r.Shape, r.Plan())
	require.NoError(t, err, r.Name)
	return e.StepSeconds
}

// shortSource is a source's citation without its table.
func shortSource(s string) string {
	before, _, _ := strings.Cut(s, ",")
	return before
}
