package planner

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/examples/mixtral"
	"gcompile/frontend"
	"gcompile/ir"
)

// The memory estimate, what the planner ranks plans it does not compile
// by, is within 15 % of the arena the compile gives, for a GPT and a Llama
// over the axes, schedules, ZeRO stages, recompute and precisions. It was
// 22 % under to 36 % over when both vocabulary tables and the logits were
// counted on every pipeline rank, and 23–53 % under for GPipe and
// zero-bubble when the last rank's waiting logits were not counted, and
// 13–28 % off for Mixtral's experts, lowp's logits, the ring's scratch and
// offloaded params, and 47 % over for ZeRO-2 and 3 with microbatches,
// when a microbatch's bucket of gradients was priced beside the
// activations its backward frees.
func TestMemoryEstimateIsNearTheCompiledArena(t *testing.T) {
	hw, err := cost.Preset("h100-sxm")
	require.NoError(t, err)
	type spec struct {
		model         string
		tp, pp, dp, v int
		micro, zero   int
		sp            bool
		rc, precision string
		schedule      string
		edit          func(*compile.Config) // cp, ep, offload, compression
	}
	specs := []spec{
		{"llama", 1, 1, 1, 1, 1, 0, false, "none", "fp32", "", nil},
		{"gpt", 1, 1, 1, 1, 1, 0, false, "none", "bf16", "", nil},
		{"llama", 1, 1, 4, 1, 2, 1, false, "none", "bf16", "", nil},
		{"llama", 2, 1, 1, 1, 2, 0, true, "none", "bf16", "", nil},
		{"gpt", 2, 1, 1, 1, 2, 0, false, "full", "fp16", "", nil},
		{"llama", 1, 2, 1, 1, 4, 0, false, "none", "bf16", "", nil},
		{"llama", 1, 2, 1, 2, 4, 0, false, "none", "bf16", "", nil},
		{"gpt", 2, 2, 2, 1, 4, 1, false, "none", "fp32", "gpipe", nil},
		{"llama", 1, 2, 2, 1, 4, 1, false, "selective", "bf16", "zb", nil},
		{"llama", 1, 1, 1, 1, 2, 0, false, "none", "bf16", "", func(c *compile.Config) { c.CP = 2 }},
		{"mixtral", 1, 1, 1, 1, 2, 0, false, "none", "bf16", "", func(c *compile.Config) { c.EP = 2 }},
		{"gpt", 1, 1, 1, 1, 2, 0, false, "none", "bf16", "", func(c *compile.Config) { c.Offload, c.OffloadPrefetch = "optimizer,params", 1 }},
		{"gpt", 1, 1, 1, 1, 2, 0, false, "none", "fp32", "", func(c *compile.Config) { c.Compress = "lowp" }},
		{"llama", 1, 1, 4, 1, 2, 2, false, "none", "bf16", "", nil},
		{"llama", 1, 1, 4, 1, 2, 3, false, "none", "bf16", "", nil},
		{"gpt", 1, 1, 4, 1, 2, 2, false, "none", "fp32", "", nil},
		{"llama", 1, 2, 1, 1, 4, 0, false, "block=1", "bf16", "", nil},
		{"gpt", 2, 1, 1, 1, 2, 0, false, "block=2", "fp16", "", nil},
	}
	models := map[string]*ir.Module{}
	var worst float64
	for i, s := range specs {
		name := fmt.Sprintf("%d_%s_tp%d_pp%d_dp%d_v%d_m%d_z%d_sp%v_%s_%s_%s", i, s.model, s.tp, s.pp, s.dp, s.v, s.micro, s.zero, s.sp, s.rc, s.precision, s.schedule)
		if s.edit != nil {
			name += "_edited"
		}
		t.Run(name, func(t *testing.T) {
			m := models[s.model]
			if m == nil {
				build, set := gpt.Model, map[string]string{"layers": "4", "hidden": "256", "heads": "4", "seq": "256", "vocab": "8192"}
				switch s.model {
				case "llama":
					build, set = llama.Model, map[string]string{"layers": "4", "hidden": "256", "heads": "4", "kv_heads": "2", "ffn": "704", "seq": "256", "vocab": "8192"}
				case "mixtral":
					build, set = mixtral.Model, map[string]string{"layers": "4", "hidden": "256", "heads": "4", "kv_heads": "2", "ffn": "704", "experts": "4", "seq": "256", "vocab": "8192"}
				}
				m, err = frontend.Build(build, frontend.Config{Name: s.model, Batch: 8, Set: set})
				require.NoError(t, err)
				models[s.model] = m
			}
			shape, err := ShapeOf(m)
			require.NoError(t, err)
			cfg := baseConfig(s.tp*s.pp*s.dp, 8)
			cfg.TP, cfg.PP, cfg.DP, cfg.VPP, cfg.Microbatches, cfg.Zero = s.tp, s.pp, s.dp, s.v, s.micro, s.zero
			cfg.SequenceParallel, cfg.Recompute, cfg.Precision, cfg.Schedule = s.sp, s.rc, s.precision, s.schedule
			if s.edit != nil {
				s.edit(&cfg)
				cfg.Devices = cfg.TP * cfg.PP * cfg.DP * max(cfg.CP, 1) * max(cfg.EP, 1)
			}
			cfg.Model = writeGir(t, m)
			require.NoError(t, cfg.Validate())
			e, err := hw.EstimateFast(shape, planOf(cfg))
			require.NoError(t, err)
			res, err := compile.Compile(&cfg, passesHooks())
			require.NoError(t, err)
			var arena int64
			for d := range res.Devices() {
				arena = max(arena, res.ProgramOf(d).ArenaBytes)
			}
			ratio := float64(e.MemoryEstimate) / float64(arena)
			worst = max(worst, math.Abs(ratio-1))
			assert.InDelta(t, 1, ratio, 0.15, "estimate %d B, compiled arena %d B", e.MemoryEstimate, arena)
		})
	}
	t.Logf("worst |estimate/arena − 1| %.1f %%", 100*worst)
}
