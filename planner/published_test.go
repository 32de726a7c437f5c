package planner

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"gcompile/cost"
)

// TestPlannerBeatsPublished plans every published run (cost.PublishedRuns:
// the model, its GPUs and global batch, fp16, on the a100-80g preset) and
// checks that the planner's pick is predicted at least as fast as the
// authors' own configuration priced by the same model: the search must
// find that configuration or a better one. It prints both plans, and
// whether the authors' configuration fits the memory estimate. About a
// second of search per run: behind GCOMPILE_FULL_TESTS.
func TestPlannerBeatsPublished(t *testing.T) {
	if os.Getenv("GCOMPILE_FULL_TESTS") != "1" {
		t.Skip("GCOMPILE_FULL_TESTS=1 plans each published run (tens of seconds)")
	}
	hw, err := cost.Preset("a100-80g")
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-22s %-36s %9s %-40s %9s %7s %s\n", "run", "paper's plan", "step s", "planner's pick", "step s", "gain %", "search")
	for _, r := range cost.PublishedRuns() {
		shape := r.Shape
		paper, err := hw.Estimate(shape, r.Plan())
		if err != nil {
			t.Fatalf("%s: %v", r.Name, err)
		}
		base := baseConfig(r.GPUs, r.Batch)
		base.Precision = "fp16"
		start := time.Now()
		res, err := Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 5})
		if err != nil {
			t.Fatalf("%s: %v", r.Name, err)
		}
		best := res.Ranked[0]
		fits := ""
		if paper.MemoryEstimate > hw.MemoryBytes() {
			fits = fmt.Sprintf(" (est. %s: over memory)", gib(paper.MemoryEstimate))
		}
		gain := (paper.StepSeconds/best.StepSeconds() - 1) * 100
		fmt.Fprintf(&sb, "%-22s %-36s %9.3f %-40s %9.3f %+7.1f %d plans, %.1fs\n", r.Name, r.Plan().String()+fits, paper.StepSeconds,
			Describe(best.Config), best.StepSeconds(), gain, res.Considered, time.Since(start).Seconds())
		if best.StepSeconds() > paper.StepSeconds*(1+1e-9) {
			t.Errorf("%s: the planner's pick %s (%.3f s) is predicted slower than the paper's %s (%.3f s)",
				r.Name, Describe(best.Config), best.StepSeconds(), r.Plan().String(), paper.StepSeconds)
		}
	}
	t.Log("\n" + sb.String())
}
