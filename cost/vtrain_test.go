package cost

import (
	"encoding/csv"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The vTrain measurements (Bang et al., "vTrain: A Simulation Framework
// for Evaluating Cost-effective and Compute-optimal Large Language Model
// Training", MICRO 2024; github.com/VIA-Research/vTrain, data/, MIT
// licence): iteration times of GPT models trained with the
// Megatron-DeepSpeed code base on A100 SXM nodes of 8 GPUs, every run with
// activation recomputation, fp16, 1F1B, and the data-parallel reduction
// after the backward (the configs' use_checkpoint true and
// use_gradient_bucket false). testdata/vtrain holds the two files as
// published: 1,440 runs on one node (models of 0.3–1.2 B parameters) and
// 109 runs on 64–512 GPUs (3.6 B to 175 B, most mixes of tp, pp, dp and
// microbatch size).
const (
	vtrainSource = "Bang et al. 2024 (vTrain), Megatron-DeepSpeed on A100"
	// vtrainInterGBps is the source's cluster: 800 Gb/s of InfiniBand a
	// node (its configs' inter_node_bandwidth), 12.5 GB/s a GPU, half a
	// DGX A100's.
	vtrainInterGBps = 800.0 / 8 / 8
	// vtrainHostOpUS is the framework's host time a kernel
	// (Hardware.HostOpUS), fitted on the single-node runs alone
	// (TestVTrainSingleNodeFitsTheHostFloor) and then used unchanged on
	// the multi-node runs.
	vtrainHostOpUS = 45
)

// vtrainRuns reads one of the files: each row a PublishedRun priced on
// a100-80g with the source's network and host floor. Megatron pads the
// vocabulary (GPT-2's 50,257) to a multiple of 128·tp. DeepSpeed's engine
// under fp16 all-reduces the fp16 gradients themselves (its
// communication_data_type is the model's dtype unless set), 2 bytes a
// param.
func vtrainRuns(t *testing.T, file string) []PublishedRun {
	t.Helper()
	f, err := os.Open("testdata/vtrain/" + file)
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	col := map[string]int{}
	for i, name := range recs[0] {
		col[strings.TrimSpace(name)] = i
	}
	get := func(rec []string, name string) float64 {
		i, ok := col[name]
		require.True(t, ok, "%s: no column %q", file, name)
		v, err := strconv.ParseFloat(rec[i], 64)
		require.NoError(t, err, "%s: column %q", file, name)
		return v
	}
	var runs []PublishedRun
	for _, rec := range recs[1:] {
		hd, tp := int(get(rec, "hidden size")), int(get(rec, "tensor parallelism"))
		name := fmt.Sprintf("h%d L%d", hd, int(get(rec, "# layers")))
		if _, ok := col["Parameters (billion)"]; ok {
			name = fmt.Sprintf("%gB", get(rec, "Parameters (billion)"))
		}
		r := PublishedRun{Source: vtrainSource, Name: name,
			Shape: Transformer{Layers: int(get(rec, "# layers")), Hidden: hd, Heads: int(get(rec, "attention heads")),
				Seq: int(get(rec, "sequence length")), Vocab: padVocab(50257, tp), FFN: 4 * hd},
			GPUs: int(get(rec, "# GPUs")), TP: tp, PP: int(get(rec, "pipeline parallelism")), VPP: 1,
			Batch: int(get(rec, "global batch")), MicroBatch: int(get(rec, "micro batch")), Recompute: "full",
			StepSeconds: get(rec, "iteration time (ms)") / 1e3, InterGBps: vtrainInterGBps, HostOpUS: vtrainHostOpUS,
			GradReduceBytes: 2}
		if dp := int(get(rec, "data parallelism")); dp*r.TP*r.PP != r.GPUs {
			t.Fatalf("%s: tp·pp·dp = %d on %d GPUs", file, dp*r.TP*r.PP, r.GPUs)
		}
		runs = append(runs, r)
	}
	return runs
}

// priceable says whether the estimate prices r's plan: it refuses 1F1B
// with fewer microbatches than stages, which DeepSpeed's engine runs.
func (r PublishedRun) priceable() bool {
	p := r.Plan()
	return p.PP == 1 || p.Microbatches >= p.PP
}

// meanError prices runs on hardware h (nil: each run's own) and returns
// the mean of |measured/predicted − 1| (the throughput's error, as the
// other published-run tables count it) over the runs it can price, with
// each run's prediction (NaN for one it cannot) and how many it could
// not (priceable).
func meanError(t *testing.T, runs []PublishedRun, h *Hardware) (mean float64, pred []float64, skipped int) {
	t.Helper()
	n := 0
	for _, r := range runs {
		if !r.priceable() {
			pred = append(pred, math.NaN())
			skipped++
			continue
		}
		hw := h
		if hw == nil {
			var err error
			hw, err = r.HardwareFor()
			require.NoError(t, err)
		}
		e, err := hw.Estimate(r.Shape, r.Plan())
		require.NoError(t, err, "%s %s", r.Name, r.Plan())
		pred = append(pred, e.StepSeconds)
		mean += math.Abs(r.PublishedStep()/e.StepSeconds - 1)
		n++
	}
	return mean / float64(n), pred, skipped
}

// The host floor is fitted on the 1,440 single-node runs, small models
// whose kernels are short: the grid's best figure is vtrainHostOpUS, and
// without the floor the same runs are predicted far too fast.
func TestVTrainSingleNodeFitsTheHostFloor(t *testing.T) {
	runs := vtrainRuns(t, "ground_truth_single.csv")
	require.Len(t, runs, 1440)
	h, err := runs[0].HardwareFor()
	require.NoError(t, err)
	var sb strings.Builder
	best, bestErr := 0.0, math.Inf(1)
	var skipped int
	for us := 0.0; us <= 80; us += 5 {
		h.HostOpUS = us
		m, _, sk := meanError(t, runs, h)
		skipped = sk
		fmt.Fprintf(&sb, "host_op_us %3.0f: mean error %5.1f %%\n", us, 100*m)
		if m < bestErr {
			best, bestErr = us, m
		}
	}
	fmt.Fprintf(&sb, "%d runs priced (%d with fewer microbatches than stages left out)", len(runs)-skipped, skipped)
	t.Log("\n" + sb.String())
	// The grid's step is 5 µs (40 and 45 differ by 0.7 points), so a
	// change elsewhere in the model may move the best by one step.
	assert.InDelta(t, float64(vtrainHostOpUS), best, 5, "the grid's best host floor")
	assert.Less(t, bestErr, 0.12)
	h.HostOpUS = 0
	none, _, _ := meanError(t, runs, h)
	assert.Greater(t, none, 0.4, "without the floor")
}

// The 109 multi-node runs, nothing fitted to them: on the source's own
// cluster (its network, the host floor fitted on one node) and on the
// a100-80g preset as it is (a DGX A100 network, no floor). Within each
// model size the predicted order of the plans agrees with the measured
// one (Spearman), and the plan predicted fastest is within a few percent
// of the fastest measured. Calibrating the preset on one run of the set
// predicts the rest within 10 %. The bounds are the figures reached on
// 2026-12-07, rounded up.
func TestVTrainMultiNode(t *testing.T) {
	runs := vtrainRuns(t, "ground_truth_multi.csv")
	require.Len(t, runs, 109)
	own, pred, skipped := meanError(t, runs, nil)
	require.Zero(t, skipped)
	preset, err := Preset("a100-80g")
	require.NoError(t, err)
	plain, _, _ := meanError(t, runs, preset)

	var sb strings.Builder
	fmt.Fprintf(&sb, "%-12s %5s %-30s %10s %10s %7s\n", "model", "GPUs", "plan", "pred ms", "meas ms", "err %")
	sizes := map[string][]int{}
	var order []string
	for i, r := range runs {
		if sizes[r.Name] == nil {
			order = append(order, r.Name)
		}
		sizes[r.Name] = append(sizes[r.Name], i)
		fmt.Fprintf(&sb, "%-12s %5d %-30s %10.1f %10.1f %+7.1f\n", r.Name, r.GPUs, r.Plan(), 1e3*pred[i], 1e3*r.StepSeconds, 100*(r.StepSeconds/pred[i]-1))
	}
	for _, name := range order {
		idx := sizes[name]
		var ps, ms []float64
		fastP, fastM := idx[0], idx[0]
		for _, i := range idx {
			ps, ms = append(ps, pred[i]), append(ms, runs[i].StepSeconds)
			if pred[i] < pred[fastP] {
				fastP = i
			}
			if runs[i].StepSeconds < runs[fastM].StepSeconds {
				fastM = i
			}
		}
		rho := spearman(ps, ms)
		lost := runs[fastP].StepSeconds/runs[fastM].StepSeconds - 1
		fmt.Fprintf(&sb, "%s: %d runs, Spearman %.2f, the pick (%s) %.1f %% slower than the fastest measured (%s)\n",
			name, len(idx), rho, runs[fastP].Plan(), 100*lost, runs[fastM].Plan())
		assert.Greater(t, rho, vtrainRhoBound[name], name)
		assert.Less(t, lost, 0.05, name)
	}
	// Calibrated on one run, each in turn: the description fitted to it
	// predicts the other 108. From the preset as it is, one run cannot
	// tell the network from the GEMMs (the first parameter fitted);
	// from the source's cluster it only refines.
	oneRun := func(from func(PublishedRun) *Hardware) (median, best, worst float64) {
		var after []float64
		points := stepPoints(runs, nil)
		for i, r := range runs {
			cal, _, err := from(r).CalibrateSteps(points[i : i+1])
			require.NoError(t, err)
			m := 0.0
			for j, p := range points {
				if j != i {
					a, err := p.Price(cal)
					require.NoError(t, err)
					m += math.Abs(p.Measured/a-1) / float64(len(points)-1)
				}
			}
			after = append(after, m)
		}
		slices.Sort(after)
		return after[len(after)/2], after[0], after[len(after)-1]
	}
	pm, pb, pw := oneRun(func(PublishedRun) *Hardware { return preset })
	om, ob, ow := oneRun(func(r PublishedRun) *Hardware {
		h, err := r.HardwareFor()
		require.NoError(t, err)
		return h
	})
	oracle := layoutOracle(runs, pred)
	for _, name := range order {
		var ms, best []float64
		for _, i := range sizes[name] {
			ms, best = append(ms, runs[i].StepSeconds), append(best, oracle[i])
		}
		fmt.Fprintf(&sb, "%s ceiling: Spearman %.2f with a factor a layout and one a (tp, microbatch) fitted to the measured times; a model off by a random 2 / 3 / 5 %% reaches %.2f / %.2f / %.2f\n",
			name, spearman(best, ms), noisyRank(ms, 0.02), noisyRank(ms, 0.03), noisyRank(ms, 0.05))
		if name == "18.4B" {
			// Were this to pass 0.9, the 18.4 B misses would be ones a
			// smooth term could fix, and the docs' account of them wrong.
			assert.Less(t, spearman(best, ms), 0.9, "18.4B: the layout and microbatch oracle")
		}
	}
	fmt.Fprintf(&sb, "mean error: %.1f %% on the source's cluster, %.1f %% on a100-80g as it is\n", 100*own, 100*plain)
	fmt.Fprintf(&sb, "calibrated on one run, predicting the other 108 (median, best, worst over the 109 choices): from a100-80g %.1f / %.1f / %.1f %%, from the source's cluster %.1f / %.1f / %.1f %%",
		100*pm, 100*pb, 100*pw, 100*om, 100*ob, 100*ow)
	t.Log("\n" + sb.String())
	assert.Less(t, own, 0.10)
	assert.Less(t, plain, 0.15)
	assert.Less(t, om, 0.10)
}

// layoutOracle bounds what a better model of the usual kind could reach:
// it multiplies each prediction by one factor per model size and layout
// (tp, pp, dp) and one per (tp, microbatch size), the factors fitted by
// least squares in log space to the measured times themselves
// (alternating, to convergence). A term in tp, pp, dp or microbatch size,
// or a GEMM efficiency that varies with the microbatch's shape, fits no
// better than these.
func layoutOracle(runs []PublishedRun, pred []float64) []float64 {
	layout := func(r PublishedRun) string { return fmt.Sprintf("%s %d %d %d", r.Name, r.TP, r.PP, r.GPUs/(r.TP*r.PP)) }
	shape := func(r PublishedRun) string { return fmt.Sprintf("%d %d", r.TP, r.MicroBatch) }
	a, b := map[string]float64{}, map[string]float64{}
	fit := func(key func(PublishedRun) string, into, other map[string]float64, otherKey func(PublishedRun) string) {
		sum, n := map[string]float64{}, map[string]float64{}
		for i, r := range runs {
			sum[key(r)] += math.Log(r.StepSeconds/pred[i]) - other[otherKey(r)]
			n[key(r)]++
		}
		for k := range sum {
			into[k] = sum[k] / n[k]
		}
	}
	for range 200 {
		fit(layout, a, b, shape)
		fit(shape, b, a, layout)
	}
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = pred[i] * math.Exp(a[layout(r)]+b[shape(r)])
	}
	return out
}

// noisyRank is the mean Spearman correlation, over 2,000 draws, between
// the measured times and the same times each off by a random factor
// e^N(0, sigma): what a model whose every figure is that far off at
// random reaches, however right its terms, when the runs of a size lie
// close together.
func noisyRank(ms []float64, sigma float64) float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	const draws = 2000
	total := 0.0
	noisy := make([]float64, len(ms))
	for range draws {
		for i, m := range ms {
			noisy[i] = m * math.Exp(sigma*rng.NormFloat64())
		}
		total += spearman(noisy, ms)
	}
	return total / draws
}

// vtrainRhoBound is each model size's rank correlation reached on
// 2026-12-07, rounded down.
var vtrainRhoBound = map[string]float64{"3.6B": 0.95, "18.4B": 0.75, "39.1B": 0.65, "175B": 0.9}

// Calibrating the preset on a handful of the one-node runs finds the host
// floor by itself: eight runs spread over the set (every 168th), and the
// fit predicts the other runs far better than the preset did.
func TestCalibrateFindsTheHostFloor(t *testing.T) {
	var runs []PublishedRun
	for _, r := range vtrainRuns(t, "ground_truth_single.csv") {
		if r.priceable() {
			runs = append(runs, r)
		}
	}
	var some, rest []PublishedRun
	for i, r := range runs {
		if i%168 == 0 {
			some = append(some, r)
		} else {
			rest = append(rest, r)
		}
	}
	preset, err := Preset("a100-80g")
	require.NoError(t, err)
	cal, rep, err := preset.CalibrateSteps(stepPoints(some, nil))
	require.NoError(t, err)
	before, _, _ := meanError(t, rest, preset)
	after, _, _ := meanError(t, rest, cal)
	var sb strings.Builder
	for _, p := range rep.Params {
		fmt.Fprintf(&sb, "%s: %.4g → %.4g %s\n", p.Key, p.Before, p.After, p.Why)
	}
	fmt.Fprintf(&sb, "calibrated on %d runs, the other %d: mean error %.1f %% → %.1f %% (leave-one-out %.1f %%)", len(some), len(rest), 100*before, 100*after, 100*rep.LeaveOneOut)
	t.Log("\n" + sb.String())
	assert.InDelta(t, float64(vtrainHostOpUS), cal.HostOpUS, 15, "the fitted host floor")
	assert.Less(t, after, 0.2)
	assert.Greater(t, before, 0.4)
}
