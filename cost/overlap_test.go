package cost_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/cost"
)

// TestOverlapBucketsHidesReductions: with OverlapBuckets (the GPU presets,
// as the CUDA backend runs them) a gradient bucket's all-reduce runs while
// the backward goes on: the step is shorter than with the reductions in
// program order, by no more than their time, and nothing that reads a
// bucket's sums starts before that bucket is done.
func TestOverlapBucketsHidesReductions(t *testing.T) {
	res := compileGPTBuckets(t, 1, 1, 1, 0.004) // dp 4, buckets of 4 KiB: several
	hw, err := cost.Preset("a100-80g")
	require.NoError(t, err)
	require.True(t, hw.OverlapBuckets, "the GPU presets price the CUDA backend's comm stream")
	hw.IntraGBps = 2 // slow enough for the reductions to matter
	serial := *hw
	serial.OverlapBuckets = false
	s, err := serial.Predict(res.Programs, res.Schedule)
	require.NoError(t, err)
	o, err := hw.Predict(res.Programs, res.Schedule)
	require.NoError(t, err)
	assert.Less(t, o.StepSeconds, s.StepSeconds, "no reduction hidden")
	assert.GreaterOrEqual(t, o.StepSeconds, s.StepSeconds-s.CommSeconds["dp"]-1e-12, "more hidden than the reductions take")

	prog := res.ProgramOf(0)
	tl := o.Timeline.Instrs[0]
	done := map[int]float64{} // bucket result buffer → its bucket's end
	buckets := 0
	for i, in := range prog.Instrs {
		if in.Op == "all_reduce" && in.Bucket > 0 {
			if i == 0 || prog.Instrs[i-1].Bucket != in.Bucket {
				buckets++
			}
			end := tl[i].Start + tl[i].Seconds
			for j := i; j < len(prog.Instrs) && prog.Instrs[j].Bucket == in.Bucket; j++ {
				end = max(end, tl[j].Start+tl[j].Seconds)
			}
			done[in.Out] = end
			continue
		}
		for _, a := range in.Args {
			if end, ok := done[a]; ok {
				assert.GreaterOrEqual(t, tl[i].Start, end-1e-15, "%s reads a bucket's sums before they are done", in.Op)
			}
		}
	}
	assert.Greater(t, buckets, 1, "the test needs several buckets")
}

// TestEstimateOverlapsBuckets: the analytic estimate hides all but the
// last bucket's reduction behind the last microbatch's backward where the
// runtime overlaps them, and none where the plan says the reduction
// follows the backward (the published Megatron runs).
func TestEstimateOverlapsBuckets(t *testing.T) {
	hw, err := cost.Preset("a100-80g")
	require.NoError(t, err)
	shape := cost.Transformer{Layers: 24, Hidden: 2304, Heads: 24, Seq: 2048, Vocab: 51200, FFN: 4 * 2304, FusedAttention: true}
	p := cost.Plan{TP: 1, PP: 1, DP: 32, MicroBatch: 1, Microbatches: 16, Precision: "fp16", Optimizer: "adamw"}
	o, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	p.SerialReductions = true
	s, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	hidden := s.StepSeconds - o.StepSeconds
	assert.Positive(t, hidden)
	assert.Less(t, hidden, s.CommSeconds["dp"])
	// 1.7B params' fp32 gradients are 264 buckets of 25 MiB, each its own
	// all-reduce (paying its latency); at most all but the last hide, as
	// much of them as the last microbatch's backward lasts.
	buckets := math.Ceil(4 * shape.Params() / (25 << 20))
	assert.LessOrEqual(t, hidden, (s.CommSeconds["dp"]-o.CommSeconds["dp"]/buckets)*(1+1e-9))
	assert.Greater(t, o.CommSeconds["dp"], s.CommSeconds["dp"], "264 collectives pay 264 latencies")

	// --bucket-mb is priced: tiny buckets pay a latency each, huge ones
	// hide nothing.
	step := func(mb float64) float64 {
		p.SerialReductions, p.BucketBytes = false, mb*(1<<20)
		e, err := hw.Estimate(shape, p)
		require.NoError(t, err)
		return e.StepSeconds
	}
	assert.Greater(t, step(0.01), step(25), "10 KiB buckets: a latency per 10 KiB")
	assert.Greater(t, step(1<<14), step(25), "one bucket of everything hides nothing")
}
