package cost

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestPublishedRuns prints the a100-80g preset's prediction for each
// published run (PublishedRuns: Narayanan et al. 2021 Table 1, Korthikanti
// et al. 2022 Tables 3 and 5) beside the measured figure, and the mean
// absolute error per paper. Nothing is fitted to these runs: the test
// fails only on a prediction above the peak or a mean error above 15 %, a
// guard against a model change that loses the agreement, and logs the
// table (go test -v -run PublishedRuns ./cost/).
func TestPublishedRuns(t *testing.T) {
	h, err := Preset("a100-80g")
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	sums, counts := map[string]float64{}, map[string]int{}
	var sources []string
	for _, r := range PublishedRuns() {
		if len(sources) == 0 || sources[len(sources)-1] != r.Source {
			sources = append(sources, r.Source)
			fmt.Fprintf(&sb, "\n%s\n", r.Source)
			if r.Assumed != "" {
				fmt.Fprintf(&sb, "assumed: %s\n", r.Assumed)
			}
			fmt.Fprintf(&sb, "%-20s %5s %-34s %9s %9s %7s  %s\n", "model", "GPUs", "plan", "step pred", "step pub", "err %", "TFLOP/s or MFU pred / pub")
		}
		p := r.Plan()
		e, err := h.Estimate(r.Shape, p)
		if err != nil {
			t.Fatalf("%s %s: %v", r.Source, r.Name, err)
		}
		pub := r.PublishedStep()
		tflops := r.PaperFLOPs() / (e.StepSeconds * float64(r.GPUs))
		if !(tflops > 0 && tflops < h.Peak("fp16")) {
			t.Errorf("%s: predicted %g TFLOP/s per GPU is no throughput", r.Name, tflops/1e12)
		}
		// The error of the throughput (the papers' figure of merit, the
		// same whatever FLOPs convention divides it): predicted over
		// measured, minus one; positive when the prediction is faster.
		rel := (pub/e.StepSeconds - 1) * 100
		sums[r.Source] += math.Abs(rel)
		counts[r.Source]++
		figure := ""
		switch {
		case r.TFLOPSPerGPU > 0: // equation 3's convention, as published
			figure = fmt.Sprintf("%.1f / %.0f", tflops/1e12, r.TFLOPSPerGPU)
		case r.MFU > 0:
			figure = fmt.Sprintf("%.3f / %.3f", e.ModelFLOPs/(e.StepSeconds*float64(r.GPUs)*h.Peak("fp16")), r.MFU)
		}
		fmt.Fprintf(&sb, "%-20s %5d %-34s %9.3f %9.3f %+7.1f  %s\n", r.Name, r.GPUs, p.String(), e.StepSeconds, pub, rel, figure)
	}
	var all float64
	var n int
	for _, s := range sources {
		m := sums[s] / float64(counts[s])
		fmt.Fprintf(&sb, "%s: mean absolute error %.1f %% over %d runs\n", s, m, counts[s])
		all += sums[s]
		n += counts[s]
		if m > 15 {
			t.Errorf("%s: mean absolute error %.1f %%", s, m)
		}
	}
	fmt.Fprintf(&sb, "all: mean absolute error %.1f %% over %d runs", all/float64(n), n)
	t.Log(sb.String())
}
