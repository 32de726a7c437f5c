package cost

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestMorePublishedRuns prices every row of MorePublishedRuns on its own
// hardware, nothing fitted, and prints the predicted step beside the
// published one, the error per row and per source (go test -v -run
// MorePublishedRuns ./cost/). It fails on a prediction that is no
// throughput (above the peak), and on a source whose mean error passes
// its recorded bound: the figures this model reaches today, so that a
// change that loses agreement is seen, and one that gains it can tighten
// them.
func TestMorePublishedRuns(t *testing.T) {
	// The mean errors reached on 2026-12-05, rounded up: MT-NLG's is
	// far over the 15 % the Megatron papers' rows meet (the model predicts
	// it 40 % faster than it ran; see docs/architecture.md).
	bound := map[string]float64{
		"BLOOM-176B (BigScience tr11-176B-ml)":                  12,
		"Smith et al. 2022 (MT-NLG 530B), §2.4":                 45,
		"Llama 3 405B (Llama Team 2024), Table 4":               10,
		"Megatron-LM README, H100 table (Megatron-Core r0.8.0)": 12,
	}
	var sb strings.Builder
	sums, counts := map[string]float64{}, map[string]int{}
	var sources []string
	for _, r := range MorePublishedRuns() {
		h, err := r.HardwareFor()
		if err != nil {
			t.Fatal(err)
		}
		if len(sources) == 0 || sources[len(sources)-1] != r.Source {
			sources = append(sources, r.Source)
			fmt.Fprintf(&sb, "\n%s (on %s)\nassumed: %s\n", r.Source, h.Name, r.Assumed)
			fmt.Fprintf(&sb, "%-20s %5s %-40s %9s %9s %7s %s\n", "model", "GPUs", "plan", "step pred", "step pub", "err %", "MFU pred / pub")
		}
		p := r.Plan()
		e, err := h.Estimate(r.Shape, p)
		if err != nil {
			t.Fatalf("%s %s: %v", r.Source, r.Name, err)
		}
		pub := r.PublishedStep()
		if !(pub > 0) {
			t.Fatalf("%s: no published step", r.Name)
		}
		mfu := e.ModelFLOPs / (e.StepSeconds * float64(r.GPUs) * h.Peak(p.DTypeName()))
		if !(mfu > 0 && mfu < 1) {
			t.Errorf("%s: predicted MFU %g is no throughput", r.Name, mfu)
		}
		rel := (pub/e.StepSeconds - 1) * 100
		sums[r.Source] += math.Abs(rel)
		counts[r.Source]++
		pubMFU := r.MFU
		if pubMFU == 0 {
			pubMFU = r.Shape.ModelFLOPs(r.Batch) / (pub * float64(r.GPUs) * h.Peak(p.DTypeName()))
		}
		fmt.Fprintf(&sb, "%-20s %5d %-40s %9.3f %9.3f %+7.1f %.3f / %.3f\n", r.Name, r.GPUs, p.String(), e.StepSeconds, pub, rel, mfu, pubMFU)
	}
	for _, s := range sources {
		m := sums[s] / float64(counts[s])
		fmt.Fprintf(&sb, "%s: mean absolute error %.1f %% over %d runs\n", s, m, counts[s])
		if b, ok := bound[s]; ok && m > b {
			t.Errorf("%s: mean absolute error %.1f %% over the %.0f %% it reached", s, m, b)
		}
	}
	t.Log(sb.String())
}
