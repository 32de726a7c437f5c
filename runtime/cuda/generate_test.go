package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/frontend"
	"gcompile/generate"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// Generation's programs (prefill and decode with key/value caches) run on
// the CUDA backend as on the CPU backend: the same greedy tokens for
// ragged prompts, and logits within tolerance, on one device and under
// tp2 (the Llama with one k/v head, held whole by each rank).
func TestGenerationMatchesCPU(t *testing.T) {
	rt := openTest(t)
	prompts := [][]int32{{3, 1, 4}, {1, 5, 9, 2, 6}, {5}, {3, 5, 8, 9}}
	const newTokens = 6
	longest, context := 5, 5+newTokens
	for _, m := range []struct {
		name string
		fn   frontend.ModelFunc
		set  map[string]string
	}{
		{"gpt", gpt.Model, map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}},
		{"llama", llama.Model, map[string]string{"layers": "2", "hidden": "32", "heads": "4", "kv_heads": "1", "ffn": "48", "seq": "16", "rope_theta": "100"}},
	} {
		for _, tp := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/tp%d", m.name, tp), func(t *testing.T) {
				c := compile.Config{Model: "model.go", Batch: len(prompts), Devices: tp, TP: tp, Microbatches: 1, Optimizer: "adamw", DPSync: "sync",
					Recompute: "none", Precision: "fp32", BucketMB: 25, Clip: 1, Beta1: 0.9, Beta2: 0.95}
				require.NoError(t, c.Validate())
				build := func(fc frontend.Config) (*ir.Module, error) { fc.Set = m.set; return frontend.Build(m.fn, fc) }
				g, err := compile.CompileGeneration(&c, build, len(prompts), longest, context, passes.Hooks{})
				require.NoError(t, err)

				run := func(pre, dec *cpuOrCUDA) ([][]int32, [][][]float64) {
					logits := make([][][]float64, len(prompts))
					ids, err := pre.engine(t, dec, len(prompts), longest, context).Run(generate.Request{Prompts: prompts, MaxNew: newTokens,
						Sampling: generate.Sampling{TopP: 1}, EOS: -1,
						OnLogits: func(s, _ int, l []float64) { logits[s] = append(logits[s], append([]float64(nil), l...)) }})
					require.NoError(t, err)
					return ids, logits
				}
				cpre, err := cpu.NewCluster(g.Prefill, cpu.Options{})
				require.NoError(t, err)
				cdec, err := cpu.NewCluster(g.Decode, cpu.Options{})
				require.NoError(t, err)
				gpre, err := NewCluster(rt, g.Prefill, Options{})
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, gpre.Close()) })
				gdec, err := NewCluster(rt, g.Decode, Options{})
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, gdec.Close()) })
				// Weights with a spread, the same on both backends.
				require.NoError(t, cpre.InitParams(3))
				for _, name := range generate.Sources(g.Prefill, func(b lower.Buffer) bool { return b.Kind == lower.Param }) {
					x, err := cpre.Global(name)
					require.NoError(t, err)
					for i := range x {
						x[i] += 0.3 * math.Sin(float64(7*i+len(name)))
					}
					require.NoError(t, cpre.SetGlobal(name, x))
					require.NoError(t, gpre.SetGlobal(name, x))
				}
				wantIDs, want := run(&cpuOrCUDA{cpu: cpre}, &cpuOrCUDA{cpu: cdec})
				gotIDs, got := run(&cpuOrCUDA{gpu: gpre}, &cpuOrCUDA{gpu: gdec})
				assert.Equal(t, wantIDs, gotIDs)
				worst := 0.0
				for p := range want {
					for s := range want[p] {
						scale := 0.0
						for _, w := range want[p][s] {
							scale = math.Max(scale, math.Abs(w))
						}
						for i, w := range want[p][s] {
							worst = math.Max(worst, math.Abs(got[p][s][i]-w)/scale)
						}
					}
				}
				t.Logf("largest logit difference: %.2g of the row's largest", worst)
				assert.Less(t, worst, tol(1e-5, 1e-4), "logits relative to the row's largest")
			})
		}
	}
}

// cpuOrCUDA is one program's cluster on either backend.
type cpuOrCUDA struct {
	cpu *cpu.Cluster
	gpu *Cluster
}

// engine joins a prefill cluster (c) and a decode cluster of the same
// backend (NewMeshEngine copies the weights from the first into the
// second).
func (c *cpuOrCUDA) engine(t *testing.T, dec *cpuOrCUDA, batch, prompt, context int) *generate.Engine {
	t.Helper()
	var e *generate.Engine
	var err error
	if c.cpu != nil {
		e, err = generate.NewMeshEngine(&c.cpu.MeshCluster, &dec.cpu.MeshCluster, batch, prompt, context)
	} else {
		e, err = generate.NewMeshEngine(&c.gpu.MeshCluster, &dec.gpu.MeshCluster, batch, prompt, context)
	}
	require.NoError(t, err)
	return e
}
