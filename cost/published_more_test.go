package cost

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	// The mean errors reached on 2026-12-06, rounded up. Five are over
	// the 15 % the Megatron papers' rows meet (see docs/architecture.md):
	// MT-NLG's (the model predicts it 40 % faster than it ran), Cisco's
	// (its tp 2 run of the 8B as much), MLPerf v3.0's two (the same plans
	// as v3.1's, in an older container, 9 % slower) and Oracle's (RoCE).
	bound := map[string]float64{
		"BLOOM-176B (BigScience tr11-176B-ml)":                                   9,
		"Smith et al. 2022 (MT-NLG 530B), §2.4":                                  40,
		"Llama 3 405B (Llama Team 2024), Table 4":                                11,
		"Megatron-LM README, H100 table (Megatron-Core r0.8.0)":                  14,
		"MLPerf Training v3.1, NVIDIA Eos, GPT-3 175B (FP8)":                     10,
		"Megatron-Bridge performance summary, NeMo 25.11, DGX-H100 (FP8)":        6,
		"MLPerf Training v5.1, HPE Cray XD670 (H200), Llama 3.1 8B (FP8)":        3,
		"MLPerf Training v5.1, Nebius (H200), Llama 3.1 405B (FP8)":              10,
		"MLPerf Training v5.1, Cisco (H100), Llama 3.1 8B (FP8)":                 24,
		"MLPerf Training v3.0, NVIDIA (DGX H100), GPT-3 175B (FP8)":              28,
		"MLPerf Training v3.0, CoreWeave (HGX H100), GPT-3 175B (FP8)":           29,
		"MLPerf Training v3.1, Azure ND H100 v5, GPT-3 175B (FP8)":               5,
		"MLPerf Training v4.0, Sustainable Metal Cloud (H100), GPT-3 175B (FP8)": 16,
		"MLPerf Training v4.1, Oracle (H100), GPT-3 175B (FP8)":                  17,
		"MLPerf Training v4.1, NVIDIA Eos, GPT-3 175B (FP8)":                     6,
		"MLPerf Training v5.0, NVIDIA Eos (H100), Llama 3.1 405B (FP8)":          4,
		"NeMo performance summary, NeMo 24.07, DGX-H100 (FP8)":                   11,
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

// TestPublishedRunsRankAlike: within each source, the runs of one model
// (its shape) rank alike predicted and published: Spearman's rank
// correlation of predicted and published step times is at least 0.9 (for
// two runs: the same order). Plans of one model are what a planner
// chooses between, so their order is what its pick rests on.
func TestPublishedRunsRankAlike(t *testing.T) {
	// A model is its whole shape: two models of one depth and width
	// (Llama 2 7B and Llama 3 8B) are not plans of one model.
	type key struct {
		source string
		shape  Transformer
		gpus   int
	}
	runs := append(PublishedRuns(), MorePublishedRuns()...)
	steps := make([]float64, len(runs))
	for i, r := range runs {
		h, err := r.HardwareFor()
		if err != nil {
			t.Fatal(err)
		}
		e, err := h.Estimate(r.Shape, r.Plan())
		if err != nil {
			t.Fatal(err)
		}
		steps[i] = e.StepSeconds
	}
	// group is the predicted and published steps of the runs by key, in
	// the keys' first-seen order.
	group := func(of func(PublishedRun) key) ([]key, map[key][2][]float64) {
		var keys []key
		g := map[key][2][]float64{}
		for i, r := range runs {
			k := of(r)
			v, ok := g[k]
			if !ok {
				keys = append(keys, k)
			}
			v[0], v[1] = append(v[0], steps[i]), append(v[1], r.PublishedStep())
			g[k] = v
		}
		return keys, g
	}
	keys, models := group(func(r PublishedRun) key { return key{r.Source, r.Shape, 0} })
	groups := 0
	for _, k := range keys {
		pred, pub := models[k][0], models[k][1]
		if len(pred) < 2 {
			continue
		}
		groups++
		rho := spearman(pred, pub)
		t.Logf("%s, %d layers × %d: %d runs, Spearman %.2f", k.source, k.shape.Layers, k.shape.Hidden, len(pred), rho)
		if rho < 0.9 {
			t.Errorf("%s, %d layers × %d: predicted %v and published %v rank differently (Spearman %.2f)", k.source, k.shape.Layers, k.shape.Hidden, pred, pub, rho)
		}
	}
	if groups < 3 {
		t.Fatalf("only %d groups of runs of one model", groups)
	}
	// On the same GPUs, the run predicted fastest is within 3 % of the
	// fastest published: what a planner that picked by the model would
	// have lost.
	sameKeys, same := group(func(r PublishedRun) key { return key{r.Source, r.Shape, r.GPUs} })
	picks := 0
	for _, k := range sameKeys {
		g := same[k]
		if len(g[0]) < 2 {
			continue
		}
		picks++
		best, pick := 0, 0
		for i := range g[0] {
			if g[1][i] < g[1][best] {
				best = i
			}
			if g[0][i] < g[0][pick] {
				pick = i
			}
		}
		loss := g[1][pick]/g[1][best] - 1
		t.Logf("%s, %d layers × %d on %d GPUs: the pick is %.1f %% slower than the fastest published", k.source, k.shape.Layers, k.shape.Hidden, k.gpus, 100*loss)
		if loss > 0.03 {
			t.Errorf("%s, %d layers on %d GPUs: the predicted fastest ran %.1f %% slower than the fastest published", k.source, k.shape.Layers, k.gpus, 100*loss)
		}
	}
	if picks == 0 {
		t.Fatal("no source publishes two plans of one model on the same GPUs")
	}
}

// spearman is the rank correlation of xs and ys (no ties expected).
func spearman(xs, ys []float64) float64 {
	rank := func(v []float64) []float64 {
		r := make([]float64, len(v))
		for i := range v {
			for j := range v {
				if v[j] < v[i] {
					r[i]++
				}
			}
		}
		return r
	}
	rx, ry := rank(xs), rank(ys)
	n := float64(len(xs))
	var d2 float64
	for i := range rx {
		d := rx[i] - ry[i]
		d2 += d * d
	}
	return 1 - 6*d2/(n*(n*n-1))
}

// NeMo's table gives each run's model TFLOP/s beside its tokens/s: their
// ratio is the FLOPs a token its model has, so the shapes the rows are
// priced with are checked against the table itself (within 0.2 %), not
// only against the models' configurations.
func TestNeMoShapesMatchTheirFLOPs(t *testing.T) {
	rows := nemo2407H100Rows()
	require.Len(t, rows, 12)
	for _, r := range rows {
		ours := r.shape.ModelFLOPs(1) / float64(r.shape.Seq)
		theirs := r.tflops * 1e12 / r.tokens
		assert.InEpsilon(t, theirs, ours, 0.002, "%s ×%d: FLOPs a token", r.name, r.gpus)
	}
}

// MLPerf's Llama 3.1 8B config states the model's FLOPs a sample
// (MODEL_TFLOP_PER_SAMPLE=421.59), counting half of attention's s² terms
// (the causal mask's): the shape priced for the H200 row matches it.
func TestMLPerfLlama8BShapeMatchesItsFLOPs(t *testing.T) {
	r := mlperfV51()[0]
	require.Equal(t, "Llama 3.1 8B ×64", r.Name)
	sh := r.Shape
	attn := 12 * float64(sh.Layers) * float64(sh.Hidden) * float64(sh.Seq) * float64(sh.Seq) // QKᵀ and PV, forward and backward
	assert.InEpsilon(t, 421.59e12, sh.ModelFLOPs(1)-attn/2, 0.001)
}
