package planner

import (
	"os"
	"strings"
	"testing"

	"gcompile/cost"
)

// benchPlan plans a model of Narayanan et al.'s shapes (V 51,200, s 2048)
// on the a100-80g preset from its shape alone, as --plan does for models
// too large to compile quickly.
func benchPlan(b *testing.B, shape cost.Transformer, devices, batch int) {
	hw, err := cost.Preset("a100-80g")
	if err != nil {
		b.Fatal(err)
	}
	base := baseConfig(devices, batch)
	base.Precision = "bf16"
	for b.Loop() {
		res, err := Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 5})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(res.Considered), "candidates")
		b.ReportMetric(res.Ranked[0].StepSeconds(), "step-s")
	}
}

// BenchmarkPlanGPT3OnA100x1024: GPT-3 175B (96 layers, h 12288, 96
// heads), global batch 1536, 1024 devices.
func BenchmarkPlanGPT3OnA100x1024(b *testing.B) {
	benchPlan(b, cost.Transformer{Layers: 96, Hidden: 12288, Heads: 96, Seq: 2048, Vocab: 51200, FFN: 4 * 12288}, 1024, 1536)
}

// BenchmarkPlan1TOnA100x3072: the 1T model of Narayanan et al. (128
// layers, h 25600, 160 heads), global batch 3072, 3072 devices.
func BenchmarkPlan1TOnA100x3072(b *testing.B) {
	benchPlan(b, cost.Transformer{Layers: 128, Hidden: 25600, Heads: 160, Seq: 2048, Vocab: 51200, FFN: 4 * 25600}, 3072, 3072)
}

// TestPlanGPT3Table prints the plan table for GPT-3 175B on 1024 A100s
// (behind GCOMPILE_FULL_TESTS: about a second of search).
func TestPlanGPT3Table(t *testing.T) {
	if os.Getenv("GCOMPILE_FULL_TESTS") != "1" {
		t.Skip("GCOMPILE_FULL_TESTS=1 prints the GPT-3 175B plan table")
	}
	hw, _ := cost.Preset("a100-80g")
	base := baseConfig(1024, 1536)
	base.Precision = "bf16"
	shape := cost.Transformer{Layers: 96, Hidden: 12288, Heads: 96, Seq: 2048, Vocab: 51200, FFN: 4 * 12288}
	res, err := Plan(Request{Base: base, Hardware: hw, Shape: &shape, NoCompile: true, TopK: 5})
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := WriteTable(&sb, res, hw); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
}
