package planner

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/examples/mixtral"
	"gcompile/examples/moe"
	"gcompile/frontend"
	"gcompile/ir"
)

// smallGPT is the reference GPT at test size: 2 layers, h 32, 4 heads,
// seq 16, at a global batch of 8.
func smallGPT(t testing.TB, batch int) *ir.Module {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: batch,
		Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func baseConfig(devices, batch int) compile.Config {
	return compile.Config{Model: "model.go", Batch: batch, Devices: devices, Microbatches: 1,
		Precision: "fp32", Optimizer: "adamw", Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.1, Clip: 1, BucketMB: 25,
		Explicit: map[string]bool{}}
}

func cpuHardware(t testing.TB) *cost.Hardware {
	h, err := cost.Preset("cpu")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestShapeOf(t *testing.T) {
	s, err := ShapeOf(smallGPT(t, 8))
	if err != nil {
		t.Fatal(err)
	}
	// The module's counts are the GPT formulas' own: attention 4h²+8h,
	// MLP 2hf+f+h; outside the blocks (V+s)·h + 2h, the tables split.
	want := cost.Transformer{Layers: 2, Hidden: 32, Heads: 4, Seq: 16, Vocab: 256, FFN: 128, FusedAttention: true,
		LayerParamCount: 4*32*32 + 8*32 + 2*32*128 + 128 + 32, LayerSplit: 12512, OuterParams: (256+16)*32 + 2*32, OuterSplit: 256 * 32}
	if s != want {
		t.Fatalf("shape %+v, want %+v", s, want)
	}
}

// TestShapeOfLlama: grouped-query attention, the SwiGLU MLP and an
// untied head are read from the module, and the shape's parameter count
// and FLOPs are the module's, not the GPT formulas'.
func TestShapeOfLlama(t *testing.T) {
	m, err := frontend.Build(llama.Model, frontend.Config{Name: "llama", Batch: 4,
		Set: map[string]string{"layers": "2", "hidden": "64", "heads": "4", "kv_heads": "2", "ffn": "176", "seq": "16"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ShapeOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if s.KVHeads != 2 || !s.GatedMLP || s.FFN != 176 {
		t.Fatalf("shape %+v: want kv_heads 2, a gated MLP of width 176", s)
	}
	var n int64
	for _, p := range m.Params() {
		n += p.Type.Shape.NumElements()
	}
	if got := s.Params(); got != float64(n) {
		t.Errorf("shape's params %g, the module's %d", got, n)
	}
	// Forward GEMM flops per sequence: q and o h², k and v h·h/2 (2 of 4
	// heads), three h×f matrices, the attention core 4·s²·h, the head.
	h, f, sq, v := 64.0, 176.0, 16.0, 256.0
	want := 2*(2*sq*(2*h*h+2*h*h/2+3*h*f)+4*sq*sq*h) + 2*sq*h*v
	if got := s.ModelFLOPs(1) / 3; math.Abs(got-want) > 1e-6*want {
		t.Errorf("forward flops per sequence %g, want %g", got, want)
	}
}

// TestReportedPeakIsCompiledPeak: every reported plan was compiled, and
// compiling its configuration again from the model gives the same peak.
func TestReportedPeakIsCompiledPeak(t *testing.T) {
	m := smallGPT(t, 8)
	res, err := Plan(Request{Base: baseConfig(4, 8), Hardware: cpuHardware(t), Module: m, TopK: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) == 0 {
		t.Fatal("no plan")
	}
	gir := writeGir(t, m)
	for _, c := range res.Ranked {
		if !c.Compiled || c.Prediction == nil {
			t.Fatalf("%s: reported without compiling", Describe(c.Config))
		}
		cfg := c.Config
		cfg.Model, cfg.Explicit = gir, map[string]bool{}
		r, err := compile.Compile(&cfg, passesHooks())
		if err != nil {
			t.Fatal(err)
		}
		var peak int64
		for d := range r.Devices() {
			peak = max(peak, r.ProgramOf(d).PeakBytes)
		}
		if peak != c.PeakBytes {
			t.Errorf("%s: reported peak %d, compiled %d", Describe(c.Config), c.PeakBytes, peak)
		}
		if c.Estimate.MemoryLowerBound > peak {
			t.Errorf("%s: lower bound %d above the compiled peak %d", Describe(c.Config), c.Estimate.MemoryLowerBound, peak)
		}
	}
	for i := 1; i < len(res.Ranked); i++ {
		// In step order, but for plans within 0.1 % (rankPlans).
		if res.Ranked[i].StepSeconds() < res.Ranked[i-1].StepSeconds()*(1-2e-3) {
			t.Errorf("ranking out of order at %d", i)
		}
	}
}

// The search gives the same plans in the same order, priced to the bit,
// every time: every process of a job plans on its own and must pick the
// same (a device's communication used to be summed in a map's random
// order, and tied plans swapped from run to run).
func TestPlanIsTheSameEveryRun(t *testing.T) {
	m := smallGPT(t, 8)
	base := baseConfig(4, 8)
	base.Zero, base.Explicit["zero"] = 1, true
	var first []string
	for run := range 5 {
		res, err := Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, TopK: 12})
		require.NoError(t, err)
		var got []string
		for _, c := range res.Ranked {
			got = append(got, fmt.Sprintf("%s %x", Describe(c.Config), math.Float64bits(c.StepSeconds())))
		}
		if run == 0 {
			first = got
			require.Greater(t, len(first), 2)
			continue
		}
		require.Equal(t, first, got, "run %d", run+1)
	}
}

// Plans within 0.1 % of one another rank by how little machinery they
// use, so a tie goes to the plan without offload or ZeRO.
func TestRankPlansPrefersLessMachineryOnATie(t *testing.T) {
	plan := func(step float64, zero int, offload string) *Candidate {
		c := baseConfig(4, 8)
		c.Zero, c.Offload = zero, offload
		return &Candidate{Config: c, Estimate: &cost.Estimate{StepSeconds: step}}
	}
	cs := []*Candidate{plan(1.0000001, 1, "optimizer"), plan(1.0000002, 2, ""), plan(1.00000015, 0, ""), plan(0.9, 3, ""), plan(1.5, 0, "")}
	rankPlans(cs)
	var got []string
	for _, c := range cs {
		got = append(got, fmt.Sprintf("%g zero=%d offload=%s", c.StepSeconds(), c.Config.Zero, c.Config.Offload))
	}
	assert.Equal(t, []string{"0.9 zero=3 offload=", "1.00000015 zero=0 offload=", "1.0000002 zero=2 offload=", "1.0000001 zero=1 offload=optimizer", "1.5 zero=0 offload="}, got)
}

// a28BOn8A100s is a 28B model planned in bf16 over 8 A100 40GB with tp 4
// pinned, from its estimates alone: its plans lie below, near and over
// the device's memory.
func a28BOn8A100s(t *testing.T) (*cost.Hardware, cost.Transformer, compile.Config) {
	t.Helper()
	hw, err := cost.Preset("a100-40g")
	require.NoError(t, err)
	base := baseConfig(8, 16)
	base.Precision = "bf16"
	base.TP, base.Explicit["tp"] = 4, true
	return hw, cost.Transformer{Layers: 48, Hidden: 6912, Heads: 48, Seq: 2048, Vocab: 51200, FFN: 27648}, base
}

// Without compiling, the plans whose estimate fits the device rank before
// those over it, whatever their steps: with tp 4 and ZeRO 2 pinned on 8
// A100 40GB, one plan of a 28B model fits, and the top five used to be
// re-sorted by step alone, putting a plan estimated at 200 GiB first.
func TestUncompiledPlansOverMemoryRankLast(t *testing.T) {
	hw, shape, base := a28BOn8A100s(t)
	base.Zero, base.Explicit["zero"] = 2, true
	res, err := Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 5})
	require.NoError(t, err)
	require.NotEmpty(t, res.Ranked)
	over := 0
	for i, c := range res.Ranked {
		fits := c.Estimate.MemoryEstimate <= hw.MemoryBytes()
		assert.Equal(t, !fits, c.OverMemory, "#%d %s", i+1, Describe(c.Config))
		if fits {
			assert.Zero(t, over, "#%d %s fits but ranks after a plan over memory", i+1, Describe(c.Config))
		} else {
			over++
		}
	}
	require.False(t, res.Ranked[0].OverMemory, "the pick fits")
	require.Positive(t, over, "the case has plans over memory among the five")
	var sb strings.Builder
	require.NoError(t, WriteTable(&sb, res, hw))
	assert.Contains(t, sb.String(), "plans marked (over) are over the device's 40.00 GiB by the estimate")
}

// An estimate within EstimateMargin below the device's memory does not
// say the plan fits (the estimate misses compiled plans by about that):
// such plans rank after those further below, marked (near), before those
// over it.
func TestUncompiledPlansNearMemoryRankAfterThoseBelow(t *testing.T) {
	hw, shape, base := a28BOn8A100s(t)
	res, err := Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 40})
	require.NoError(t, err)
	class := func(c *Candidate) int { return memoryClass(c.Estimate.MemoryEstimate, hw.MemoryBytes()) }
	seen := map[int]int{}
	for i, c := range res.Ranked {
		k := class(c)
		assert.Equal(t, k == 1, c.NearMemory, "#%d %s", i+1, Describe(c.Config))
		assert.Equal(t, k == 2, c.OverMemory, "#%d %s", i+1, Describe(c.Config))
		for later := k + 1; later <= 2; later++ {
			assert.Zero(t, seen[later], "#%d %s (class %d) ranks after a plan of class %d", i+1, Describe(c.Config), k, later)
		}
		seen[k]++
	}
	require.Positive(t, seen[0], "plans well below the memory")
	require.Positive(t, seen[1], "the case has plans near the memory")
	var sb strings.Builder
	require.NoError(t, WriteTable(&sb, res, hw))
	assert.Contains(t, sb.String(), " (near)")
	assert.Contains(t, sb.String(), "plans marked (near) are within 10 % of the device's 40.00 GiB by the estimate")
}

// What must fit in the device's memory is the compiled arena, as
// --device-memory checks it, not only the bytes live at the peak: a plan
// whose peak fits but whose arena does not is not picked.
func TestPlannerFitsTheArena(t *testing.T) {
	m := smallGPT(t, 8)
	base := baseConfig(4, 8)
	for k, v := range map[string]int{"tp": 1, "pp": 1, "dp": 4} {
		base.Explicit[k] = true
		switch k {
		case "tp":
			base.TP = v
		case "pp":
			base.PP = v
		case "dp":
			base.DP = v
		}
	}
	base.Explicit["zero"], base.Explicit["offload"], base.Explicit["recompute"], base.Explicit["sequence-parallel"], base.Explicit["microbatches"] = true, true, true, true, true
	base.Offload, base.Recompute = "none", "none"
	res, err := Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, TopK: 1})
	require.NoError(t, err)
	cfg := res.Ranked[0].Config
	cfg.Model, cfg.Explicit = writeGir(t, m), map[string]bool{}
	r, err := compile.Compile(&cfg, passesHooks())
	require.NoError(t, err)
	p := r.ProgramOf(0)
	require.Greater(t, p.ArenaBytes, p.PeakBytes, "the memory plan leaves a gap for this test to mean anything")
	_, err = Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, TopK: 1, MemoryBytes: p.PeakBytes})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the compiled plan's arena is")
}

// TestFixedAxesRespected: an axis given as a flag is the same in every
// reported plan; with every axis fixed the one plan is that plan.
func TestFixedAxesRespected(t *testing.T) {
	m := smallGPT(t, 8)
	base := baseConfig(4, 8)
	base.PP, base.Explicit["pp"] = 2, true
	res, err := Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, TopK: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Ranked {
		if c.Config.PP != 2 || c.Config.DP*c.Config.TP != 2 {
			t.Errorf("pp fixed at 2, got %s", Describe(c.Config))
		}
	}
	all := baseConfig(4, 8)
	all.TP, all.PP, all.DP, all.Microbatches, all.Zero, all.Recompute, all.Offload = 1, 2, 2, 2, 1, "full", ""
	for _, a := range []string{"tp", "pp", "dp", "vpp", "microbatches", "zero", "sequence-parallel", "recompute", "offload", "schedule"} {
		all.Explicit[a] = true
	}
	res, err = Plan(Request{Base: all, Hardware: cpuHardware(t), Module: m, TopK: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) != 1 || res.Considered != 1 {
		t.Fatalf("every axis fixed: %d ranked of %d considered, want exactly that plan", len(res.Ranked), res.Considered)
	}
	got := res.Ranked[0].Config
	if got.TP != 1 || got.PP != 2 || got.DP != 2 || got.Microbatches != 2 || got.Zero != 1 || got.Recompute != "full" || got.Schedule != "1f1b" {
		t.Errorf("fixed plan came back as %s (schedule %s)", Describe(got), got.Schedule)
	}
}

// TestEveryOptionCanBePinned: each axis and option the search chooses,
// given alone (with the pipeline it needs), holds in every plan ranked,
// including the values that turn an option off (sequence parallelism,
// ZeRO stage 0, recompute none), which a flag that can only switch an
// option on could not pin.
func TestEveryOptionCanBePinned(t *testing.T) {
	m := smallGPT(t, 8)
	hw := cpuHardware(t)
	tests := []struct {
		name string
		pin  func(c *compile.Config)
		ok   func(c compile.Config) bool
	}{
		{"sequence parallelism off", func(c *compile.Config) { c.SequenceParallel = false; c.Explicit["sequence-parallel"] = true },
			func(c compile.Config) bool { return !c.SequenceParallel }},
		{"sequence parallelism on", func(c *compile.Config) {
			c.SequenceParallel, c.TP = true, 2
			c.Explicit["sequence-parallel"], c.Explicit["tp"] = true, true
		}, func(c compile.Config) bool { return c.SequenceParallel && c.TP == 2 }},
		{"ZeRO stage 0", func(c *compile.Config) { c.Zero = 0; c.Explicit["zero"] = true },
			func(c compile.Config) bool { return c.Zero == 0 }},
		{"recompute none", func(c *compile.Config) { c.Recompute = "none"; c.Explicit["recompute"] = true },
			func(c compile.Config) bool { return c.Recompute == "none" }},
		{"recompute full", func(c *compile.Config) { c.Recompute = "full"; c.Explicit["recompute"] = true },
			func(c compile.Config) bool { return c.Recompute == "full" }},
		{"microbatches", func(c *compile.Config) { c.Microbatches = 4; c.Explicit["microbatches"] = true },
			func(c compile.Config) bool { return c.Microbatches == 4 }},
		{"microbatch size", func(c *compile.Config) { c.MicroBatchSize = 1; c.Explicit["micro-batch-size"] = true },
			func(c compile.Config) bool { return c.Batch/(c.DP*max(c.EP, 1)*c.Microbatches) == 1 }},
		{"no virtual stages", func(c *compile.Config) {
			c.PP, c.VPP = 2, 1
			c.Explicit["pp"], c.Explicit["vpp"] = true, true
		}, func(c compile.Config) bool { return c.PP == 2 && c.VPP <= 1 && c.Schedule == "1f1b" }},
		{"schedule", func(c *compile.Config) {
			c.PP, c.Schedule = 2, "gpipe"
			c.Explicit["pp"], c.Explicit["schedule"] = true, true
		}, func(c compile.Config) bool { return c.Schedule == "gpipe" }},
		{"offload", func(c *compile.Config) { c.Offload = "optimizer"; c.Explicit["offload"] = true },
			func(c compile.Config) bool { return c.Offload == "optimizer" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := baseConfig(4, 8)
			tc.pin(&base)
			res, err := Plan(Request{Base: base, Hardware: hw, Module: m, TopK: 3, NoCompile: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Ranked) == 0 {
				t.Fatal("no plan ranked")
			}
			for _, c := range res.Ranked {
				if !tc.ok(c.Config) {
					t.Errorf("%s pinned, got %s (schedule %q)", tc.name, Describe(c.Config), c.Config.Schedule)
				}
			}
		})
	}
}

// TestLowerBoundNeverAboveCompiledPeak: over a sweep of plans (every
// layout of 4 devices, ZeRO stages, recompute, offload, microbatches),
// the memory bound the search prunes with never exceeds the compiled
// peak, so a plan that fits is never pruned.
func TestLowerBoundNeverAboveCompiledPeak(t *testing.T) {
	m := smallGPT(t, 8)
	shape, err := ShapeOf(m)
	if err != nil {
		t.Fatal(err)
	}
	gir := writeGir(t, m)
	hw := cpuHardware(t)
	n := 0
	for i, cfg := range enumerate(baseConfig(4, 8), shape, hw, true) {
		if i%5 != 0 || n >= 12 { // a spread of the 200-odd candidates keeps the test short
			continue
		}
		if err := cfg.Validate(); err != nil {
			continue
		}
		e, err := hw.EstimateFast(shape, planOf(cfg))
		if err != nil {
			continue
		}
		cfg.Model, cfg.Explicit = gir, map[string]bool{}
		r, err := compile.Compile(&cfg, passesHooks())
		if err != nil {
			// The planner rejects such a plan with this reason.
			t.Logf("%s does not compile: %v", Describe(cfg), firstLine(err))
			continue
		}
		var peak int64
		for d := range r.Devices() {
			peak = max(peak, r.ProgramOf(d).PeakBytes)
		}
		if e.MemoryLowerBound > peak {
			t.Errorf("%s: lower bound %d > compiled peak %d", Describe(cfg), e.MemoryLowerBound, peak)
		}
		n++
	}
	if n < 8 {
		t.Fatalf("only %d plans checked", n)
	}
	t.Logf("%d plans checked", n)
}

// TestMemoryLimitRejectsWithReason: a memory smaller than any plan's
// params and state leaves no plan, and the error says why.
func TestMemoryLimitRejectsWithReason(t *testing.T) {
	_, err := Plan(Request{Base: baseConfig(2, 8), Hardware: cpuHardware(t), Module: smallGPT(t, 8), MemoryBytes: 1000})
	if err == nil || !strings.Contains(err.Error(), "params and optimizer state alone need") {
		t.Fatalf("want a memory rejection, got %v", err)
	}
}

// smallMoE is the MoE example at test size: 2 layers (the second a MoE
// block of 4 experts of width 32, top-1 at capacity factor 2), h 32, 4
// heads, seq 16, at a global batch of 8.
func smallMoE(t testing.TB) *ir.Module {
	t.Helper()
	m, err := frontend.Build(moe.Model, frontend.Config{Name: "moe", Batch: 8,
		Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16", "experts": "4", "ffn": "32"}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestShapeOfMoE: the planner reads the experts, their width and
// parameters, the router's and the slots per token from the module, and
// the shape's parameter count is the module's.
func TestShapeOfMoE(t *testing.T) {
	m := smallMoE(t)
	s, err := ShapeOf(m)
	if err != nil {
		t.Fatal(err)
	}
	// Capacity ⌈1·16·2/4⌉ = 8 slots per expert for a group of 16 tokens.
	want := cost.Transformer{Layers: 2, Hidden: 32, Heads: 4, Seq: 16, Vocab: 256, FFN: 128, FusedAttention: true,
		Experts: 4, MoELayers: 1, ExpertFFN: 32, RouterParams: 32 * 4, Slots: 4 * 8 / 16.0, Routed: 1, ExpertParams: 2 * 32 * 32,
		LayerParamCount: 4*32*32 + 8*32 + 2*32*128 + 128 + 32, LayerSplit: 12512, OuterParams: (256+16)*32 + 2*32, OuterSplit: 256 * 32}
	if s != want {
		t.Fatalf("shape %+v, want %+v", s, want)
	}
	var n int64
	for _, p := range m.Params() {
		n += p.Type.Shape.NumElements()
	}
	if s.Params() != float64(n) {
		t.Errorf("shape counts %.0f params, the module has %d", s.Params(), n)
	}
}

// A token's model FLOPs (MFU's numerator) go through the experts its
// router picks, k of them; the slots the capacity factor adds, and the
// empty ones a dropless router keeps, are work the devices do (hardware
// FLOPs) but not the model's: Mixtral's MFU counted every token through
// all 8 experts, 3.4 times its k = 2. An expert-choice router fills its
// slots, which are then the count.
func TestModelFLOPsCountTheRoutedExperts(t *testing.T) {
	for _, tc := range []struct {
		router string
		routed float64
	}{{"switch", 1}, {"gshard", 2}, {"softmax-topk", 2}, {"noisy-topk", 2}, {"expert-choice", 0}} {
		t.Run(tc.router, func(t *testing.T) {
			m, err := frontend.Build(moe.Model, frontend.Config{Name: "moe", Batch: 8,
				Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16", "experts": "4", "ffn": "32", "router": tc.router}})
			require.NoError(t, err)
			s, err := ShapeOf(m)
			require.NoError(t, err)
			assert.Equal(t, tc.routed, s.Routed)
			padded := s
			padded.Routed = 0
			if tc.routed > 0 {
				assert.Less(t, s.ModelFLOPs(8), padded.ModelFLOPs(8), "capacity factor 2: more slots than choices")
			} else {
				assert.Equal(t, s.ModelFLOPs(8), padded.ModelFLOPs(8))
			}
		})
	}
	m, err := frontend.Build(mixtral.Model, frontend.Config{Name: "mixtral", Batch: 8,
		Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "kv_heads": "2", "ffn": "48", "experts": "4", "seq": "16"}})
	require.NoError(t, err)
	s, err := ShapeOf(m)
	require.NoError(t, err)
	assert.Equal(t, 2.0, s.Routed, "Mixtral's top 2")
	assert.Equal(t, 4.0, s.Slots, "dropless: a slot for every token at every expert")
}

// Mixtral's experts are SwiGLU MLPs (three matrices an expert), which the
// planner prices with their gate; the MoE GPT's have two (above).
func TestShapeOfGatedExperts(t *testing.T) {
	m, err := frontend.Build(mixtral.Model, frontend.Config{Name: "mixtral", Batch: 8,
		Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "kv_heads": "2", "ffn": "48", "experts": "4", "seq": "16"}})
	require.NoError(t, err)
	s, err := ShapeOf(m)
	require.NoError(t, err)
	assert.True(t, s.GatedExperts)
	assert.Equal(t, 48, s.ExpertFFN)
	assert.Equal(t, 3*32*48, s.ExpertParams)
}

// TestPlannerSearchesExpertParallelism: with ep not given, every ep that
// divides the experts and the devices is a candidate; the reported plans
// are compiled; the estimate's bytes on ep are the compiled plan's,
// and its memory bound stays under the compiled peak.
func TestPlannerSearchesExpertParallelism(t *testing.T) {
	m := smallMoE(t)
	shape, err := ShapeOf(m)
	if err != nil {
		t.Fatal(err)
	}
	hw := cpuHardware(t)
	seen := map[int]bool{}
	for _, c := range enumerate(baseConfig(8, 8), shape, hw, false) {
		seen[c.EP] = true
	}
	if !seen[1] || !seen[2] || !seen[4] || seen[8] || len(seen) != 3 {
		t.Errorf("ep searched over %v, want 1, 2 and 4 (the divisors of 4 experts)", seen)
	}
	res, err := Plan(Request{Base: baseConfig(8, 8), Hardware: hw, Module: m, TopK: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Ranked {
		if !c.Compiled {
			t.Errorf("%s reported without compiling", Describe(c.Config))
		}
	}
	gir := writeGir(t, m)
	for _, layout := range [][3]int{{1, 2, 4}, {1, 4, 2}, {2, 2, 2}, {4, 2, 1}} { // tp, ep, dp
		cfg := baseConfig(8, 8)
		cfg.TP, cfg.EP, cfg.DP, cfg.Model = layout[0], layout[1], layout[2], gir
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		e, err := hw.EstimateFast(shape, planOf(cfg))
		if err != nil {
			t.Fatal(err)
		}
		r, err := compile.Compile(&cfg, passesHooks())
		if err != nil {
			t.Fatal(err)
		}
		pred, err := hw.Predict(r.Programs, r.Schedule)
		if err != nil {
			t.Fatal(err)
		}
		// On ep: the all_to_alls and the shared gradients' reduction; the
		// compiled plan adds the layer's scalar outputs (aux, z, loads:
		// 4 bytes each), which the estimate leaves out.
		if got, want := e.CommBytes["ep"], pred.CommBytes["ep"]; math.Abs(got-want) > 1e-3*want || want == 0 {
			t.Errorf("%s: estimated bytes on ep %.0f, the compiled plan's %.0f", Describe(cfg), got, want)
		}
		var peak int64
		for d := range r.Devices() {
			peak = max(peak, r.ProgramOf(d).PeakBytes)
		}
		if e.MemoryLowerBound > peak {
			t.Errorf("%s: lower bound %d > compiled peak %d", Describe(cfg), e.MemoryLowerBound, peak)
		}
	}
}

// TestFixedExpertParallelism: a fixed ep takes its share of the devices
// in every plan, the batch is split over dp·ep, and the compiled plans
// price the all_to_alls on ep.
func TestFixedExpertParallelism(t *testing.T) {
	m := smallMoE(t)
	base := baseConfig(8, 8)
	base.EP, base.Explicit["ep"] = 2, true
	res, err := Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, TopK: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) == 0 {
		t.Fatal("no plan")
	}
	for _, c := range res.Ranked {
		cfg := c.Config
		if cfg.EP != 2 || cfg.TP*cfg.PP*cfg.DP*cfg.EP != 8 || !strings.Contains(Describe(cfg), "ep=2") {
			t.Errorf("ep fixed at 2 on 8 devices, got %s", Describe(cfg))
		}
		if !c.Compiled || c.Prediction == nil {
			t.Fatalf("%s: reported without compiling", Describe(cfg))
		}
		if c.Prediction.CommSeconds["ep"] <= 0 {
			t.Errorf("%s: no time priced for the all_to_alls on ep: %v", Describe(cfg), c.Prediction.CommSeconds)
		}
	}
}

// The default search finds the plan a search that compiles far more
// does: the estimate ranks one layout's ZeRO and offload variants less
// well than the layouts, so the best compiled layout is compiled again
// with less machinery (on 4 CPU devices the tiny GPT's pp 2·dp 2 without
// ZeRO, which the estimate put below its ZeRO-1 twin).
func TestDefaultSearchFindsTheWideSearchsBest(t *testing.T) {
	m := smallGPT(t, 8)
	narrow, err := Plan(Request{Base: baseConfig(4, 8), Hardware: cpuHardware(t), Module: m, TopK: 5})
	require.NoError(t, err)
	wide, err := Plan(Request{Base: baseConfig(4, 8), Hardware: cpuHardware(t), Module: m, TopK: 40})
	require.NoError(t, err)
	assert.InEpsilon(t, wide.Ranked[0].StepSeconds(), narrow.Ranked[0].StepSeconds(), 1e-3,
		"--plan-top 5 picked %s, 40 picked %s", Describe(narrow.Ranked[0].Config), Describe(wide.Ranked[0].Config))
}

// Every row's MFU has the model's FLOPs of the formula as its numerator
// (PaLM's definition; Narayanan et al.'s eq. 3 without recompute), the
// compiled rows' too, whose ops' count (the optimizer's and the
// elementwise ones) made it 1.3–2.8 % higher and plan-dependent.
func TestMFUCountsTheModelsFLOPs(t *testing.T) {
	m := smallGPT(t, 8)
	hw := cpuHardware(t)
	res, err := Plan(Request{Base: baseConfig(4, 8), Hardware: hw, Module: m, TopK: 3})
	require.NoError(t, err)
	rows := Rows(res, hw)
	require.Len(t, rows, len(res.Ranked))
	for i, c := range res.Ranked {
		require.True(t, c.Compiled, Describe(c.Config))
		want := res.Shape.ModelFLOPs(c.Config.Batch) / (c.StepSeconds() * float64(c.Config.Devices) * hw.Peak(c.Plan.DTypeName()))
		assert.InEpsilon(t, want, rows[i].MFU, 1e-12, Describe(c.Config))
	}
}

// A large --batch over a pipeline has thousands of microbatch counts: the
// search still answers at once (it counted to the batch for its
// divisors), and compiles no plan of more than MaxSearchedMicrobatches,
// saying why it left the others out.
func TestLargeBatchIsSearchedQuickly(t *testing.T) {
	const batch = 1 << 20
	res, err := Plan(Request{Base: baseConfig(2, batch), Hardware: cpuHardware(t), Module: smallGPT(t, batch), TopK: 2})
	require.NoError(t, err)
	require.NotEmpty(t, res.Ranked)
	for _, c := range res.Ranked {
		assert.LessOrEqual(t, c.Config.Microbatches, MaxSearchedMicrobatches, Describe(c.Config))
	}
	left := 0
	for _, c := range res.Rejected {
		if strings.Contains(c.Rejected, "more than 256 microbatches, which the search does not compile") {
			left++
			assert.Greater(t, c.Config.Microbatches, MaxSearchedMicrobatches)
		}
	}
	assert.Positive(t, left, "the plans of more microbatches are named")
	// The table says why most candidates were rejected.
	var table strings.Builder
	require.NoError(t, WriteTable(&table, res, cpuHardware(t)))
	assert.Regexp(t, `rejected in all \(most often: \d+ × more than 256 microbatches`, table.String())
	assert.Equal(t, []int{1, 2, 3, 4, 6, 12}, divisors(12))
	assert.Equal(t, []int{1, 7, 49}, divisors(49))
}

// --microbatches and --micro-batch-size pinned together plan when they
// agree (the same plan given twice, which a plain run accepts), and
// name both when they do not.
func TestMicrobatchesAndTheirSizeTogether(t *testing.T) {
	m := smallGPT(t, 8)
	base := baseConfig(2, 8)
	base.DP, base.Explicit["dp"] = 2, true
	base.Microbatches, base.Explicit["microbatches"] = 2, true
	base.MicroBatchSize, base.Explicit["micro-batch-size"] = 2, true
	res, err := Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, NoCompile: true})
	require.NoError(t, err)
	require.NotEmpty(t, res.Ranked)
	assert.Equal(t, 2, res.Ranked[0].Config.Microbatches)

	base.Microbatches = 3
	_, err = Plan(Request{Base: base, Hardware: cpuHardware(t), Module: m, NoCompile: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--microbatches 3 and --micro-batch-size 2 disagree over dp·ep = 2: their product is 12 sequences a step, --batch is 8")
	// With dp the planner's, the two say it when no dp·ep can agree.
	free := base
	free.Explicit = map[string]bool{"microbatches": true, "micro-batch-size": true}
	_, err = Plan(Request{Base: free, Hardware: cpuHardware(t), Module: m, NoCompile: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--microbatches 3 × --micro-batch-size 2 = 6 sequences a data-parallel rank, and no dp·ep makes --batch 8 of them")
	// With experts and ep not given, dp·ep is the planner's to choose:
	// the two flags may agree over a larger ep, and are not refused here.
	moe := cost.Transformer{Layers: 2, Hidden: 32, Heads: 4, Seq: 16, Vocab: 256, FFN: 128, Experts: 4, MoELayers: 2}
	base.Microbatches = 2
	base.MicroBatchSize = 1
	assert.Empty(t, fixedConflicts(base, moe))
	base.EP, base.Explicit["ep"] = 1, true
	assert.NotEmpty(t, fixedConflicts(base, moe), "ep given: 2·1·2 is not 8")
}

// ZeRO splits every param over dp along a dim dp divides, which a norm's
// weight (hidden) must be: a search that only estimates (a model too
// large to compile) refuses the plans the compiler would, with the
// compiler's reason, rather than ranking one that cannot run.
func TestUncompiledZeROPlansSplitTheHiddenSize(t *testing.T) {
	hw, shape, base := a28BOn8A100s(t) // hidden 6912, not a multiple of 7
	base.Devices, base.Batch = 28, 28
	base.Zero, base.Explicit["zero"] = 1, true
	res, err := Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 5})
	require.ErrorIs(t, err, ErrNoPlan)
	assert.ErrorContains(t, err, "ZeRO-1 splits every param over dp=7 along a dim dp divides, and hidden 6912 (a norm weight's only dim) is not a multiple of 7")
	if res != nil {
		assert.Empty(t, res.Ranked)
	}
	base.Devices, base.Batch = 32, 32 // dp 8 divides it
	res, err = Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 5})
	require.NoError(t, err)
	assert.NotEmpty(t, res.Ranked)
}
