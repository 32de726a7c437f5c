package lower_test

import (
	"testing"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// BenchmarkPlanMemoryTestSized times the memory plan of programs the size
// the test suites compile (a few hundred to a few thousand buffers), where
// the greedy orders run besides the linear scan. GPT-3's pipeline rank,
// where only the linear scan runs, is BenchmarkMemoryPlanGPT3PipelineRank
// in examples/gpt.
func BenchmarkPlanMemoryTestSized(b *testing.B) {
	small := map[string]string{"layers": "4", "hidden": "32", "heads": "4", "seq": "16"}
	mid := map[string]string{"layers": "8", "hidden": "256", "heads": "4", "seq": "64"}
	cases := []struct {
		name    string
		set     map[string]string
		batch   int
		opts    func(*passes.Options)
		offload string
		pp      int
	}{
		{name: "gpt4_fp32", set: small, batch: 2, opts: func(*passes.Options) {}},
		{name: "gpt4_bf16_offload", set: small, batch: 2, opts: func(o *passes.Options) { o.Precision = "bf16" }, offload: "optimizer,params"},
		{name: "gpt8_1f1b_pp2_m4_rank0", set: map[string]string{"layers": "8", "hidden": "32", "heads": "4", "seq": "16"}, batch: 8, pp: 2,
			opts: func(o *passes.Options) {
				o.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: 2}}}
				o.Microbatches = 4
			}},
		{name: "mid8_m4", set: mid, batch: 8, opts: func(o *passes.Options) { o.Microbatches = 4 }},
	}
	for _, c := range cases {
		m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: c.batch, Set: c.set})
		if err != nil {
			b.Fatal(err)
		}
		opts := passes.DefaultOptions()
		c.opts(opts)
		if _, err := passes.Run(m, opts, passes.Hooks{}); err != nil {
			b.Fatal(err)
		}
		var prog *lower.Program
		if c.pp > 1 {
			progs, err := lower.LowerPipeline(m, oneFOneB(c.pp, opts.Microbatches))
			if err != nil {
				b.Fatal(err)
			}
			prog = progs[0]
		} else if prog, err = lower.LowerWith(m, lower.Options{Offload: c.offload}); err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				lower.PlanMemory(prog)
			}
			b.ReportMetric(float64(len(prog.Instrs)), "instrs")
			b.ReportMetric(float64(prog.ArenaBytes), "arena-B")
			b.ReportMetric(float64(prog.PeakBytes), "peak-B")
		})
	}
}

// oneFOneB is the 1F1B compute order of p pipeline ranks over m
// microbatches.
func oneFOneB(p, m int) [][]lower.Block {
	order := make([][]lower.Block, p)
	for r := range p {
		warm, f, bw := min(p-1-r, m), 0, 0
		for ; f < warm; f++ {
			order[r] = append(order[r], lower.Block{Kind: 'F', Chunk: r, Micro: f})
		}
		for ; f < m; f, bw = f+1, bw+1 {
			order[r] = append(order[r], lower.Block{Kind: 'F', Chunk: r, Micro: f}, lower.Block{Kind: 'B', Chunk: r, Micro: bw})
		}
		for ; bw < m; bw++ {
			order[r] = append(order[r], lower.Block{Kind: 'B', Chunk: r, Micro: bw})
		}
	}
	return order
}
