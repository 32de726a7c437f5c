package gpt_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// shape is one model size; GPT-3 175B is the one the benchmarks compile.
type shape struct{ layers, hidden, heads, vocab, seq int }

var gpt3 = shape{layers: 96, hidden: 12288, heads: 96, vocab: 51200, seq: 2048}

func (s shape) set() map[string]string {
	return map[string]string{"layers": strconv.Itoa(s.layers), "hidden": strconv.Itoa(s.hidden),
		"heads": strconv.Itoa(s.heads), "vocab": strconv.Itoa(s.vocab), "seq": strconv.Itoa(s.seq)}
}

// Parameters of GPT-2 with a tied head: 12·l·h² + 13·l·h + (V+s)·h + 2h,
// which is REFERENCE.md's P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) plus
// the final LayerNorm's 2h.
func TestParamCountMatchesFormula(t *testing.T) {
	for _, s := range []shape{{2, 128, 4, 256, 64}, {24, 2304, 24, 51200, 2048}, gpt3} {
		m, err := frontend.Build(gpt.Model, frontend.Config{Batch: 1, Set: s.set()})
		require.NoError(t, err)
		var n int64
		for _, p := range m.Params() {
			n += p.Type.Shape.NumElements()
		}
		l, h, v, sq := int64(s.layers), int64(s.hidden), int64(s.vocab), int64(s.seq)
		assert.Equal(t, 12*l*h*h+13*l*h+(v+sq)*h+2*h, n, "shape %+v", s)
	}
	_, err := frontend.Build(gpt.Model, frontend.Config{Batch: 1, Set: map[string]string{"activation": "swish"}})
	assert.ErrorContains(t, err, "--set activation=swish: want one of gelu, relu")
}

// Compiling GPT-3 175B shapes through every pass and the memory plan
// allocates no tensor data: the plan is computed from shapes alone.
func BenchmarkCompileGPT3(b *testing.B) {
	b.ReportAllocs()
	var prog *lower.Program
	for b.Loop() {
		m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt3", Batch: 1, Set: gpt3.set()})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{}); err != nil {
			b.Fatal(err)
		}
		if prog, err = lower.Lower(m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(prog.Instrs)), "instrs")
	b.ReportMetric(float64(prog.PeakBytes)/(1<<30), "peak-GiB")
}

// BenchmarkPassesGPT3 times the pass pipeline alone (no frontend, no lowering).
func BenchmarkPassesGPT3(b *testing.B) {
	b.ReportAllocs()
	src, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt3", Batch: 1, Set: gpt3.set()})
	if err != nil {
		b.Fatal(err)
	}
	text := ir.Print(src)
	for b.Loop() {
		b.StopTimer()
		m, err := ir.Parse("gpt3.gir", text)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStepDemo is one training step of the `make demo` model (2
// layers, h=128, seq 64, batch 16) on one CPU device.
func BenchmarkStepDemo(b *testing.B) {
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 16})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{}); err != nil {
		b.Fatal(err)
	}
	prog, err := lower.Lower(m)
	if err != nil {
		b.Fatal(err)
	}
	dev, err := cpu.Load(prog, cpu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := dev.InitParams(1); err != nil {
		b.Fatal(err)
	}
	tokens := make([]int32, 16*64)
	for i := range tokens {
		tokens[i] = int32(i * 7 % 256)
	}
	for _, in := range []string{"tokens", "targets"} {
		if err := dev.SetInt32(in, tokens); err != nil {
			b.Fatal(err)
		}
	}
	if err := dev.SetScalar("lr", 1e-3); err != nil {
		b.Fatal(err)
	}
	if err := dev.SetScalar("step", 1); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := dev.Step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(16*64)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkCompileGPT3SPMD compiles GPT-3 175B shapes for tp=8 on 8 and on
// 1024 devices (dp=128): the program is SPMD, one for every rank, so the
// compile time must not grow with the device count (dp=2 and dp=128 make
// the same program; dp=1 has no data-parallel collectives).
func BenchmarkCompileGPT3SPMD(b *testing.B) {
	for _, dp := range []int{1, 2, 128} {
		b.Run(fmt.Sprintf("tp8_dp%d", dp), func(b *testing.B) {
			b.ReportAllocs()
			mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: 8}}}
			if dp > 1 {
				mesh.Axes = append([]ir.MeshAxis{{Name: "dp", Size: dp}}, mesh.Axes...)
			}
			var prog *lower.Program
			for b.Loop() {
				m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt3", Batch: 128, Set: gpt3.set()})
				if err != nil {
					b.Fatal(err)
				}
				opts := passes.DefaultOptions()
				opts.Mesh = mesh
				opts.Zero = 1
				if _, err := passes.Run(m, opts, passes.Hooks{}); err != nil {
					b.Fatal(err)
				}
				if prog, err = lower.Lower(m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(prog.Instrs)), "instrs")
			b.ReportMetric(float64(prog.PeakBytes)/(1<<30), "peak-GiB/device")
		})
	}
}

// BenchmarkMemoryPlanGPT3PipelineRank times the memory plan of one
// pipeline rank of GPT-3 175B shapes with p=8, t=8 and m=64 microbatches of
// one sequence: liveness over the rank's scheduled program (1F1B) and
// static offsets for every buffer. The module and programs are built once.
func BenchmarkMemoryPlanGPT3PipelineRank(b *testing.B) {
	const p, t, m = 8, 8, 64
	mod, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt3", Batch: m, Set: gpt3.set()})
	if err != nil {
		b.Fatal(err)
	}
	opts := passes.DefaultOptions()
	opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: p}, {Name: "tp", Size: t}}}
	opts.Microbatches = m
	if _, err := passes.Run(mod, opts, passes.Hooks{}); err != nil {
		b.Fatal(err)
	}
	order := make([][]lower.Block, p)
	for r := range p { // 1F1B
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
	progs, err := lower.LowerPipeline(mod, order)
	if err != nil {
		b.Fatal(err)
	}
	prog := progs[0]
	b.ResetTimer()
	for b.Loop() {
		lower.PlanMemory(prog)
	}
	b.ReportMetric(float64(len(prog.Instrs)), "instrs")
	b.ReportMetric(float64(prog.PeakBytes)/(1<<30), "peak-GiB")
	b.ReportMetric(float64(prog.ArenaBytes)/(1<<30), "arena-GiB")
	b.ReportMetric(float64(prog.Peak.Activations)/(1<<30), "activations-GiB")
}
