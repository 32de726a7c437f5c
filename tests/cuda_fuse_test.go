package tests

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda"
	"gcompile/runtime/cuda/fakegpu"
)

// The CUDA backend trains with --fuse exactly as without it, on the fake
// GPU: each fused kernel computes what the unfused kernels compute one
// after another, bit for bit, so the losses, the held-out loss and every
// weight are identical; against the CPU backend's fused run the CUDA run
// keeps the tolerances of cudaCases (fp32). make test runs a one-layer
// GPT under full recompute (bias + residual adds and bias + GELU fuse);
// the full matrix the equivalence GPT and the Llama (SiLU · up
// projection under full recompute, residual adds under tp2).
func TestCUDAFuseMatchesUnfusedOnFakeGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the GPT in the kernel emulator; skipped with -short")
	}
	fakegpu.Install(t)
	rt, err := cuda.Open(cuda.Config{CacheDir: t.TempDir(), Launch: cuda.Launch{Threads: 32, Blocks: 4}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, rt.Close()) }()
	type fuseCase struct {
		name  string
		p     plan
		steps int
	}
	cases := []fuseCase{{"gpt_1layer_recompute", plan{layers: 1, recompute: "full"}, 1}}
	if fullMatrix() {
		cases = append(cases,
			fuseCase{"gpt_recompute", plan{recompute: "full"}, 2},
			fuseCase{"llama_recompute", plan{model: "llama", recompute: "full"}, 2},
			fuseCase{"llama_tp2", plan{model: "llama", tp: 2}, 2},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plain := compilePlan(t, c.p)
			fp := c.p
			fp.fuse = true
			fused := compilePlan(t, fp)
			groups := 0
			for _, in := range fused.Instrs {
				if in.Op == ir.FusedOp {
					groups++
				}
			}
			require.Positive(t, groups, "the plan has elementwise groups to fuse")
			run := func(prog *lower.Program) backendRun {
				cl, err := cuda.NewCluster(rt, prog, cuda.Options{})
				require.NoError(t, err)
				defer func() { assert.NoError(t, cl.Close()) }()
				r := trainCluster(t, cl, []*lower.Program{prog}, nil, c.steps, "")
				for i, d := range cl.Devices {
					assert.Equal(t, prog.PeakBytes, d.PeakBytes(), "device %d: measured peak equals predicted", i)
				}
				return r
			}
			unfused, got := run(plain), run(fused)
			assert.Equal(t, unfused.losses, got.losses, "losses bit for bit")
			assert.Equal(t, math.Float64bits(unfused.eval), math.Float64bits(got.eval), "held-out loss bit for bit")
			requireBitIdentical(t, unfused.params, got.params, "fused vs unfused on the GPU")

			ref, err := cpu.NewCluster(fused, cpu.Options{})
			require.NoError(t, err)
			want := trainCluster(t, ref, []*lower.Program{fused}, nil, c.steps, "")
			worst := lossDiff(got.eval, want.eval)
			for i := range want.losses {
				worst = max(worst, lossDiff(got.losses[i], want.losses[i]))
			}
			param := paramError(t, want.params, got.params, isKeyBias)
			t.Logf("%s: %d fused groups; against the CPU backend over %d steps: worst loss difference %.3g, worst weight difference %.3g",
				c.name, groups, c.steps, worst, param)
			assert.LessOrEqual(t, worst, 1e-6)
			assert.LessOrEqual(t, param, 2e-5)
		})
	}
}

// lossDiff is got's difference from want relative to want.
func lossDiff(got, want float64) float64 { return math.Abs(got-want) / math.Abs(want) }
