package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// planConfigs are the programs whose every instruction must have a launch
// plan: the end-to-end configurations and the features around them.
var planConfigs = []config{
	{name: "fp32"},
	{name: "tp2", mesh: tp2},
	{name: "pp2", mesh: pp2, pp: 2, micro: 2},
	{name: "dp2_zero1", mesh: dp2, edit: func(o *passes.Options) { o.Zero = 1 }},
	{name: "bf16", edit: func(o *passes.Options) { o.Precision = "bf16" }},
	{name: "fp16_tp2", mesh: tp2, edit: func(o *passes.Options) { o.Precision = "fp16" }},
	{name: "dp2_tp2_sp_zero2", mesh: dp2tp2, edit: func(o *passes.Options) { o.SequenceParallel = true; o.Zero = 2 }},
	{name: "dp2_zero3_bucket", mesh: dp2, edit: func(o *passes.Options) { o.Zero = 3; o.BucketMB = 0.01 }},
	{name: "dp2_bucket", mesh: dp2, edit: func(o *passes.Options) { o.BucketMB = 0.01 }},
	{name: "micro4", micro: 4},
	{name: "sgd", edit: func(o *passes.Options) { o.Optimizer = "sgd" }},
	{name: "adafactor", edit: func(o *passes.Options) { o.Optimizer = "adafactor" }},
	{name: "sm3", edit: func(o *passes.Options) { o.Optimizer = "sm3" }},
	{name: "recompute_compress", set: map[string]string{"activation": "relu", "attention": "unfused"}, edit: func(o *passes.Options) { o.Recompute = "selective"; o.Compress = "relu,lowp" }},
	{name: "offload", lower: lower.Options{Offload: "optimizer,params"}},
	{name: "pp2_tp2_bf16", mesh: []ir.MeshAxis{{Name: "pp", Size: 2}, {Name: "tp", Size: 2}}, pp: 2, micro: 2, edit: func(o *passes.Options) { o.Precision = "bf16" }},
	{name: "fuse_recompute_dp2_tp2", mesh: dp2tp2, edit: func(o *passes.Options) { o.Fuse = true; o.Recompute = "full"; o.BucketMB = 0.01 }},
}

// Every instruction of every device's program gets a launch plan: kernels
// that exist in the kernel table with matching parameter types, GEMMs,
// copies or collectives. Nothing fails with "no kernel for op X" at load,
// and each instruction launches only the kernels the kernel table gives
// its op.
func TestEveryInstructionHasALaunchPlan(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range planConfigs {
		t.Run(c.String(), func(t *testing.T) {
			progs := programs(t, c)
			for r := range devices(progs) {
				plan, ws, err := Plan(progs, r)
				require.NoError(t, err, "device %d", r)
				prog := programOf(progs, r)
				require.Len(t, plan, len(prog.Instrs))
				for i, p := range plan {
					seen[p.Op] = true
					assert.Empty(t, strayKernels(p), "device %d: %s (%s) launches kernels the kernel table does not give it", r, p.Op, p.Where)
					in := prog.Instrs[i]
					if noWork(prog, i) {
						continue
					}
					if !assert.NotEmpty(t, p.Steps, "device %d: %s (%s) has an empty plan", r, p.Op, p.Where) {
						continue
					}
					switch {
					case in.Op == "matmul":
						assert.Contains(t, p.Steps[0], "cuBLASLt", p.Where)
					case ir.Collectives[in.Op]:
						assert.Contains(t, strings.Join(p.Steps, " "), "over devices", p.Where)
					case in.Op == "send" || in.Op == "recv" || in.Op == "copy":
					default:
						assert.Contains(t, p.Steps[0], "gc_", "%s: %s", p.Where, p.Op)
					}
				}
				assert.GreaterOrEqual(t, ws.Scratch, int64(0))
			}
		})
	}
	for _, op := range []string{"matmul", "embedding", "embedding_grad", "layernorm_grad_gamma", "cross_entropy", "adamw", "sgd", "adafactor",
		"sm3", "cast", "where_finite", "nonfinite_count", "all_reduce", "reduce_scatter", "all_gather", "shard_slice", "send", "recv", "copy", "relu_mask", ir.FusedOp} {
		assert.True(t, seen[op], "no program had %s", op)
	}
}

// noWork reports the instructions that legitimately queue nothing: the
// later members of a gradient bucket (the first reduces them all) and
// copies of a buffer onto itself.
func noWork(p *lower.Program, i int) bool {
	in := p.Instrs[i]
	if in.Op == "all_reduce" && in.Bucket > 0 && i > 0 && p.Instrs[i-1].Bucket == in.Bucket && p.Instrs[i-1].Op == "all_reduce" {
		return true
	}
	return false
}

// The launch plan follows the kernel table: a GEMM with a batch of
// shared B folds the batch into M, LayerNorm's γ gradient is two
// launches (statistics, then column sums), the global norm one partial
// launch per gradient and one finishing block, row kernels get blocks
// sized to the row (hidden 32: one warp).
func TestLaunchPlanShapes(t *testing.T) {
	progs := programs(t, config{name: "fp32"})
	plan, ws, err := Plan(progs, 0)
	require.NoError(t, err)
	prog := progs[0]
	for i, p := range plan {
		in := prog.Instrs[i]
		switch in.Op {
		case "layernorm":
			require.Len(t, p.Steps, 1)
			assert.Equal(t, "gc_layernorm<<<128, 32>>>", p.Steps[0], "8×16 rows of 32: one block of one warp per row")
		case "layernorm_grad_gamma":
			require.Len(t, p.Steps, 2)
			assert.True(t, strings.HasPrefix(p.Steps[0], "gc_layernorm_stats<<<"), p.Steps[0])
			assert.True(t, strings.HasPrefix(p.Steps[1], "gc_layernorm_grad_gamma<<<"), p.Steps[1])
		case "sum_squares":
			require.Len(t, p.Steps, len(in.Args)+1)
			assert.True(t, strings.HasPrefix(p.Steps[len(in.Args)], "gc_finish_sum<<<1,"), p.Steps[len(in.Args)])
		case "matmul":
			if len(in.ArgTypes[0].Shape) == 3 && len(in.ArgTypes[1].Shape) == 2 && !in.Attrs.Bool("transA") {
				// [8,16,k] by a shared [k,n]: one GEMM of M = 128.
				assert.Contains(t, p.Steps[0], "M=128", p.Steps[0])
				assert.Contains(t, p.Steps[0], "batch=1 ×1", p.Steps[0])
			}
			if len(in.ArgTypes[0].Shape) == 4 {
				// Attention: [8,4,16,·] batches of 32 independent products.
				assert.Contains(t, p.Steps[0], "batch=32 ×1", p.Steps[0])
			}
		}
	}
	assert.Positive(t, ws.Scratch, "layernorm statistics and partial sums need scratch")
	assert.Equal(t, int64(0), ws.GEMM, "planning asks cuBLASLt for nothing")
}

// f64 programs are for the CPU backend's reference runs; loading one is a
// clear error, not a failure deep in a kernel.
func TestRejectsF64Programs(t *testing.T) {
	progs := programs(t, config{name: "f64", float: ir.F64})
	_, _, err := Plan(progs, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the cuda backend runs f32/f16/bf16 programs; f64 is for CPU reference runs")
	_, err = Load(planningRuntime(), progs[0], Options{})
	assert.ErrorContains(t, err, "f64 is for CPU reference runs")
}

// A program needing more arena than the cap is refused before anything
// is allocated.
func TestMemoryCap(t *testing.T) {
	progs := programs(t, config{name: "fp32"})
	_, err := Load(planningRuntime(), progs[0], Options{MemoryCap: progs[0].ArenaBytes - 1})
	assert.ErrorContains(t, err, "more than the device cap")
}

// Under tensor parallelism the embedding and the loss are vocab-parallel:
// the lookup takes the device's rows, and the cross-entropy exchanges
// row maxima and sums between the kernels instead of logits.
func TestVocabParallelPlan(t *testing.T) {
	progs := programs(t, config{name: "tp2", mesh: tp2})
	plan, _, err := Plan(progs, 1)
	require.NoError(t, err)
	found := map[string]string{}
	for _, p := range plan {
		found[p.Op] = strings.Join(p.Steps, " ")
	}
	assert.Contains(t, found["embedding"], "gc_embedding_range")
	for _, op := range []string{"cross_entropy", "cross_entropy_grad"} {
		assert.Contains(t, found[op], "gc_vocab_ce_max", op)
		assert.Contains(t, found[op], "gc_vocab_ce_sums", op)
		assert.Contains(t, found[op], "vocab-parallel exchange over devices [0 1]", op)
	}
}

// A malformed instruction is an error that names it, not a crash.
func TestMalformedInstruction(t *testing.T) {
	progs := programs(t, config{name: "fp32"})
	p := *progs[0]
	p.Instrs = slices.Clone(p.Instrs)
	for i, in := range p.Instrs {
		if in.Op == "adamw" {
			in.Args = in.Args[:2]
			p.Instrs[i] = in
			break
		}
	}
	_, _, err := Plan([]*lower.Program{&p}, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "adamw: malformed instruction (2 args")
}

// A GEMM operand's declared alignment is the largest power of two (at
// most 256, cudaMalloc's) dividing its offset and every step a run adds.
func TestGEMMAlignment(t *testing.T) {
	for _, tc := range []struct {
		offsets []int64
		want    uint32
	}{
		{[]int64{0}, 256},
		{[]int64{0, 4096}, 256},
		{[]int64{64}, 64},
		{[]int64{512, 60}, 4},
		{[]int64{1024, 2048, 96}, 32},
		{[]int64{2}, 2},
	} {
		assert.Equal(t, tc.want, alignment(tc.offsets...), "%v", tc.offsets)
	}
}
