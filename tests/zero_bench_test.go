package tests

import (
	"fmt"
	"testing"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// BenchmarkDataParallelStep is one training step of the equivalence
// tests' GPT (2 layers, h=32, seq 16, batch 8) on 4 CPU devices of data
// parallelism, under each ZeRO stage, in fp32 and bf16: a model this
// small spends its step mostly in the gradients' reductions and the
// params' gathers.
func BenchmarkDataParallelStep(b *testing.B) {
	for _, precision := range []string{"fp32", "bf16"} {
		for _, zero := range []int{0, 1, 2} {
			b.Run(fmt.Sprintf("%s_zero%d", precision, zero), func(b *testing.B) {
				m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: eqBatch, Set: eqModel})
				if err != nil {
					b.Fatal(err)
				}
				opts := passes.DefaultOptions()
				opts.Mesh = plan{dp: 4}.mesh()
				opts.Zero = zero
				if precision != "fp32" {
					opts.Precision = precision
				}
				if _, err := passes.Run(m, opts, passes.Hooks{}); err != nil {
					b.Fatal(err)
				}
				prog, err := lower.Lower(m)
				if err != nil {
					b.Fatal(err)
				}
				cl, err := cpu.NewCluster(prog, cpu.Options{})
				if err != nil {
					b.Fatal(err)
				}
				if err := cl.InitParams(1); err != nil {
					b.Fatal(err)
				}
				tokens := make([]int32, eqBatch*eqSeq)
				for i := range tokens {
					tokens[i] = int32(i * 7 % 256)
				}
				for _, in := range []string{"tokens", "targets"} {
					if err := cl.SetInt32(in, tokens); err != nil {
						b.Fatal(err)
					}
				}
				for name, x := range map[string]float64{"lr": 1e-3, "step": 1} {
					if err := cl.SetScalar(name, x); err != nil {
						b.Fatal(err)
					}
				}
				for b.Loop() {
					if err := cl.Step(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
