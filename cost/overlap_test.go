package cost_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/cost"
)

// TestOverlapBucketsHidesReductions: with OverlapBuckets (the GPU presets,
// as the CUDA backend runs them) a gradient bucket's all-reduce (or
// ZeRO-1's reduce-scatter) runs while the backward goes on: the step is
// shorter than with the reductions in program order, by no more than
// their time, and nothing that reads a bucket's sums starts before that
// bucket is done; a program that reduces its buckets in order
// (lower.Program.SerialBuckets) hides none.
func TestOverlapBucketsHidesReductions(t *testing.T) {
	for _, zero := range []int{0, 1} {
		t.Run(fmt.Sprintf("zero%d", zero), func(t *testing.T) {
			// dp 4, buckets of 4 KiB: several.
			overlapBucketsHidesReductions(t, compileGPTWith(t, func(c *compile.Config) { c.BucketMB, c.Zero = 0.004, zero }))
		})
	}
	// 16-bit reductions too: their fp32 casts are read where the
	// optimizer reads them, not right after each bucket, where the
	// compute stream would wait for the reduction.
	t.Run("bf16 reductions", func(t *testing.T) {
		overlapBucketsHidesReductions(t, compileGPTWith(t, func(c *compile.Config) {
			c.BucketMB, c.Precision, c.GradReduceDType = 0.004, "bf16", "bf16"
		}))
	})
}

func overlapBucketsHidesReductions(t *testing.T, res *compile.Result) {
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
		if (in.Op == "all_reduce" || in.Op == "reduce_scatter") && in.Bucket > 0 {
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

	// A program compiled with --overlap-grad-reduce=false reduces its
	// buckets in order on any hardware.
	for _, p := range res.Programs {
		p.SerialBuckets = true
	}
	inOrder, err := hw.Predict(res.Programs, res.Schedule)
	require.NoError(t, err)
	assert.InDelta(t, s.StepSeconds, inOrder.StepSeconds, 1e-15)
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
	// In order (--overlap-grad-reduce=false) the same buckets take as
	// long; one bucket of everything pays one latency.
	assert.InDelta(t, o.CommSeconds["dp"], s.CommSeconds["dp"], 1e-12)
	p.BucketBytes = 1 << 50
	one, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	assert.Greater(t, s.CommSeconds["dp"], one.CommSeconds["dp"], "264 collectives pay 264 latencies")

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

	// ZeRO-1's reduce-scatter hides as the all-reduce does, at most all
	// but its last bucket; its gather after the update does not. ZeRO-2's
	// per-microbatch reduce-scatters hide behind the next microbatch, all
	// but the last microbatch's. ZeRO-3's, waited for by its gathers,
	// are left unhidden.
	hiddenUnder := func(zero int) (hidden, comm float64) {
		p := cost.Plan{TP: 1, PP: 1, DP: 32, MicroBatch: 1, Microbatches: 16, Precision: "fp16", Optimizer: "adamw", Zero: zero}
		o, err := hw.Estimate(shape, p)
		require.NoError(t, err)
		p.SerialReductions = true
		s, err := hw.Estimate(shape, p)
		require.NoError(t, err)
		return s.StepSeconds - o.StepSeconds, s.CommSeconds["dp"]
	}
	h1, c1 := hiddenUnder(1)
	assert.Positive(t, h1, "ZeRO-1's reduce-scatter hides")
	assert.Less(t, h1, c1)
	h2, c2 := hiddenUnder(2)
	assert.Positive(t, h2, "ZeRO-2's reduce-scatters hide behind the next microbatch")
	assert.LessOrEqual(t, h2, c2*15/16*(1+1e-9), "all but the last microbatch's")
	h3, _ := hiddenUnder(3)
	assert.InDelta(t, 0, h3, 1e-12, "ZeRO-3 hides nothing")
	// A reduce-scatter pays a latency a bucket, as an all-reduce does.
	p = cost.Plan{TP: 1, PP: 1, DP: 32, MicroBatch: 1, Microbatches: 16, Precision: "fp16", Optimizer: "adamw", Zero: 1, SerialReductions: true, BucketBytes: 1 << 50}
	oneBucket, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	p.BucketBytes = 10 << 10
	tiny, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	assert.Greater(t, tiny.CommSeconds["dp"], oneBucket.CommSeconds["dp"], "10 KiB buckets: a latency per 10 KiB")
}

// TestEstimateOverlapsTheDistributedOptimizer: a framework's ZeRO-1 or 2
// (Plan.OverlapShards) hides all but the last bucket of the gradients'
// reduce-scatter behind the last microbatch's backward and all but the
// first of the weights' all-gather behind the first forward; the
// collectives themselves are unchanged, and a plan of gcompile's own
// (without it) or under ZeRO 0 or 3 hides nothing of them. GatherBytes
// prices the gather in the weights' dtype.
func TestEstimateOverlapsTheDistributedOptimizer(t *testing.T) {
	hw, err := cost.Preset("h100-sxm")
	require.NoError(t, err)
	shape := cost.Transformer{Layers: 24, Hidden: 2304, Heads: 24, Seq: 2048, Vocab: 51200, FFN: 4 * 2304, FusedAttention: true}
	est := func(p cost.Plan) *cost.Estimate {
		e, err := hw.Estimate(shape, p)
		require.NoError(t, err)
		return e
	}
	for _, tc := range []struct {
		name      string
		zero, mbs int
		hides     bool
	}{
		{"zero 1, one microbatch", 1, 1, true},
		{"zero 2, eight microbatches", 2, 8, true},
		{"zero 0", 0, 8, false},
		{"zero 3", 3, 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := cost.Plan{TP: 1, PP: 1, DP: 64, MicroBatch: 1, Microbatches: tc.mbs, Precision: "bf16", Optimizer: "adamw",
				Zero: tc.zero, SerialReductions: true}
			own := est(p)
			p.OverlapShards = true
			fw := est(p)
			assert.InDelta(t, own.CommSeconds["dp"], fw.CommSeconds["dp"], 1e-12, "the collectives are the same")
			hidden := own.StepSeconds - fw.StepSeconds
			if !tc.hides {
				assert.InDelta(t, 0, hidden, 1e-12)
				return
			}
			assert.Positive(t, hidden)
			assert.Less(t, hidden, own.CommSeconds["dp"], "no more hidden than the collectives take")
		})
	}

	// The gather in the weights' dtype: gcompile gathers the 16-bit
	// copies it makes from the master shards (2 bytes a param in bf16, 4
	// in fp32), fp8 params 1.
	p := cost.Plan{TP: 1, PP: 1, DP: 64, MicroBatch: 1, Microbatches: 8, Precision: "bf16", Optimizer: "adamw", Zero: 1}
	bf16 := est(p)
	p.GatherBytes = 1
	fp8 := est(p)
	assert.InEpsilon(t, shape.Params()*63/64, bf16.CommBytes["dp"]-fp8.CommBytes["dp"], 0.01, "1 byte a param fewer")
	assert.Less(t, fp8.CommSeconds["dp"], bf16.CommSeconds["dp"])
	p.Precision, p.GatherBytes = "fp32", 0
	fp32 := est(p)
	assert.InEpsilon(t, 2*shape.Params()*63/64, fp32.CommBytes["dp"]-bf16.CommBytes["dp"], 0.01, "2 bytes a param more")
}

// --compress-activations lowp and --offload-prefetch are priced. lowp in
// fp32 halves the stashed bytes (a 1.3B GPT's 17 + 12 hidden-sized values
// a layer per token, and the logits) and pays a cast and a widening of
// each stash, 1.5 bytes moved per stashed byte, ten kernels each way; it
// changes nothing in bf16, and relu nothing on a GELU MLP. Params
// offloaded with a prefetch distance copy them for the forward and the
// backward beside the compute: the step is shorter by those copies (two
// of the three passes over the params), all of them hidden here.
func TestEstimatePricesCompressionAndPrefetch(t *testing.T) {
	hw, err := cost.Preset("a100-80g")
	require.NoError(t, err)
	const layers, hidden, seq, vocab, micro = 24, 2048, 2048, 51200, 4
	shape := cost.Transformer{Layers: layers, Hidden: hidden, Heads: 16, Seq: seq, Vocab: vocab, FFN: 4 * hidden, FusedAttention: true}
	base := cost.Plan{TP: 1, PP: 1, DP: 1, MicroBatch: 1, Microbatches: micro, Precision: "fp32", Optimizer: "adamw"}
	est := func(p cost.Plan) *cost.Estimate {
		e, err := hw.Estimate(shape, p)
		require.NoError(t, err)
		return e
	}
	none := est(base)
	lowp := base
	lowp.Compress = "lowp"
	got := est(lowp)
	stash := float64(seq * hidden * 4 * (5 + 12)) // a layer's, per microbatch: Korthikanti's 34·sbh in 16 bits
	bw := hw.MemoryGBps * 1e9
	cast := (1.5*stash+bw*hw.MemHalfUS*1e-6)/(bw*hw.MemEfficiency) + 10*hw.LaunchUS*1e-6
	assert.InEpsilon(t, 2*micro*layers*cast, got.StepSeconds-none.StepSeconds, 1e-9, "a cast and a widening per layer and microbatch")
	logits := float64(4 * seq * vocab) // fp32, the loss's gradient written over them
	// One microbatch in flight without a pipeline: half the stash, and
	// at the loss the logits' bf16 copy beside them (6 bytes a logit).
	assert.InDelta(t, stash*layers/2-logits/2, float64(none.MemoryEstimate-got.MemoryEstimate), 2, "half the stash")
	for _, p := range []cost.Plan{{Compress: "lowp", Precision: "bf16"}, {Compress: "relu", Precision: "fp32"}} {
		q, plain := base, base
		q.Compress, q.Precision, plain.Precision = p.Compress, p.Precision, p.Precision
		assert.Equal(t, est(plain).StepSeconds, est(q).StepSeconds, "%s in %s", p.Compress, p.Precision)
		assert.Equal(t, est(plain).MemoryEstimate, est(q).MemoryEstimate, "%s in %s", p.Compress, p.Precision)
	}

	off := base
	off.Offload = "params"
	before := est(off)
	off.OffloadPrefetch = 1
	ahead := est(off)
	copies := 2.0 / 3 * before.CommBytes["host"] / (hw.HostGBps * 1e9)
	assert.InEpsilon(t, copies, before.StepSeconds-ahead.StepSeconds, 1e-9, "the forward's and backward's copies hide behind the compute")
	assert.Equal(t, before.CommBytes["host"], ahead.CommBytes["host"], "the same bytes cross")
	t.Logf("lowp: step %.1f → %.1f ms, memory %.2f → %.2f GiB; params offloaded: step %.1f ms, prefetched %.1f ms",
		1e3*none.StepSeconds, 1e3*got.StepSeconds, float64(none.MemoryEstimate)/(1<<30), float64(got.MemoryEstimate)/(1<<30),
		1e3*before.StepSeconds, 1e3*ahead.StepSeconds)
}

// TestHostFloorBoundsEveryKernel: with host_op_us every instruction of a
// compiled program takes at least the host's time to issue it, in the
// timeline Predict builds as in OpTime, and the analytic estimate of a
// small model grows with the floor while that of a model whose kernels
// are all longer than it does not.
func TestHostFloorBoundsEveryKernel(t *testing.T) {
	res := compileGPTBuckets(t, 1, 1, 1, 0.004)
	hw, err := cost.Preset("a100-80g")
	require.NoError(t, err)
	floored := *hw
	floored.HostOpUS = 40
	p, err := floored.Predict(res.Programs, res.Schedule)
	require.NoError(t, err)
	kernels := 0
	for i, ev := range p.Timeline.Instrs[0] {
		in := res.ProgramOf(0).Instrs[i]
		if ev.Seconds == 0 {
			// Not a kernel of its own: a bucket's later members (the
			// bucket is one collective, priced at its first).
			require.Positive(t, in.Bucket, "instruction %d (%s) takes no time", i, in.Op)
			continue
		}
		kernels++
		require.GreaterOrEqual(t, ev.Seconds, 40e-6-1e-15, "instruction %d (%s)", i, in.Op)
	}
	require.Greater(t, kernels, 100)
	plain, err := hw.Predict(res.Programs, res.Schedule)
	require.NoError(t, err)
	assert.Greater(t, p.StepSeconds, plain.StepSeconds)

	small := cost.Transformer{Layers: 12, Hidden: 1024, Heads: 16, Seq: 1024, Vocab: 50304, FFN: 4096}
	big := cost.Transformer{Layers: 8, Hidden: 12288, Heads: 96, Seq: 2048, Vocab: 51200, FFN: 4 * 12288}
	plan := cost.Plan{TP: 8, PP: 1, DP: 1, MicroBatch: 1, Microbatches: 4, Recompute: "full", Precision: "fp16", Optimizer: "adamw"}
	for _, c := range []struct {
		shape cost.Transformer
		grows bool
	}{{small, true}, {big, false}} {
		a, err := hw.Estimate(c.shape, plan)
		require.NoError(t, err)
		b, err := floored.Estimate(c.shape, plan)
		require.NoError(t, err)
		if c.grows {
			assert.Greater(t, b.StepSeconds, 1.5*a.StepSeconds, "h %d", c.shape.Hidden)
		} else {
			assert.InDelta(t, a.StepSeconds, b.StepSeconds, 0.01*a.StepSeconds, "h %d", c.shape.Hidden)
		}
	}
}

// 16-bit reductions (Plan.GradReduceBytes 2) move half the bytes in as
// many buckets as fp32's (--bucket-mb counts fp32 gradients, whatever
// format they move in), so each bucket's latency stays: the reductions
// take more than half their fp32 time.
func TestSixteenBitReductionsKeepTheirBuckets(t *testing.T) {
	hw, err := cost.Preset("h100-sxm")
	require.NoError(t, err)
	shape := cost.Transformer{Layers: 8, Hidden: 256, Heads: 4, Seq: 256, Vocab: 1024, FFN: 1024}
	p := cost.Plan{TP: 1, PP: 1, DP: 64, MicroBatch: 1, Microbatches: 1, Precision: "bf16", Optimizer: "adamw", SerialReductions: true, BucketBytes: 64 << 10}
	wide, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	p.GradReduceBytes = 2
	narrow, err := hw.Estimate(shape, p)
	require.NoError(t, err)
	assert.InDelta(t, wide.CommBytes["dp"]/2, narrow.CommBytes["dp"], 1e-6*wide.CommBytes["dp"])
	assert.Less(t, narrow.CommSeconds["dp"], wide.CommSeconds["dp"])
	assert.Greater(t, narrow.CommSeconds["dp"], wide.CommSeconds["dp"]/2, "half as many buckets priced: their latency halved too")
}

// A pipeline's ranks wait for each other's sends, not for the gradient
// buckets after them: compiled for a runtime that reduces in program
// order (the CPU backend: sends first), the pp 2 · dp 2 GPT's step is
// shorter than with its buckets before the last backward's send, where
// each rank waited for the next one's reductions; and with a comm stream
// (OverlapBuckets) a send does not wait for the buckets before it in
// program order.
//
// Under ZeRO-2 the tied embedding's gradient is sent after its bucket,
// once a step: what the next rank waits for is the microbatch's send.
func TestPipelineRanksWaitForSendsNotBuckets(t *testing.T) {
	for _, zero := range []int{0, 2} {
		t.Run(fmt.Sprintf("zero%d", zero), func(t *testing.T) {
			compileFor := func(commStream bool) *compile.Result {
				return compileGPTWith(t, func(c *compile.Config) {
					c.PP, c.DP, c.Microbatches, c.Schedule, c.BucketMB, c.CommStream, c.Zero = 2, 2, 2, "1f1b", 0.004, commStream, zero
					c.Explicit = map[string]bool{"pp": true, "dp": true}
				})
			}
			first, kept := compileFor(false), compileFor(true)
			hw, err := cost.Preset("a100-80g")
			require.NoError(t, err)
			step := func(h *cost.Hardware, res *compile.Result) float64 {
				p, err := h.Predict(res.Programs, res.Schedule)
				require.NoError(t, err)
				return p.StepSeconds
			}
			inOrder := *hw
			inOrder.OverlapBuckets = false
			assert.Less(t, step(&inOrder, first), step(&inOrder, kept), "in program order, the sends first")
			assert.Less(t, step(hw, kept), step(&inOrder, kept), "with a comm stream")
		})
	}
}
