package cuda_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/kernels/cuda"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/passes/schedule"
)

// gptPrograms compiles the example GPT for one configuration.
func gptPrograms(t *testing.T, mesh *ir.Mesh, edit func(*passes.Options), attention string) []*lower.Program {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 4, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16", "attention": attention}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Mesh = mesh
	if edit != nil {
		edit(opts)
	}
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	if mesh == nil || mesh.Axis("pp") < 0 {
		p, err := lower.Lower(m)
		require.NoError(t, err)
		return []*lower.Program{p}
	}
	pp := mesh.Axes[mesh.Axis("pp")].Size
	s, err := schedule.New("1f1b", pp, 1, opts.Microbatches)
	require.NoError(t, err)
	order := make([][]lower.Block, pp)
	for r, acts := range s.Actions {
		for _, a := range acts {
			switch a.Kind {
			case schedule.F, schedule.B, schedule.W:
				order[r] = append(order[r], lower.Block{Kind: a.Kind.String()[0], Chunk: a.Chunk, Micro: a.Micro})
			}
		}
	}
	progs, err := lower.LowerPipeline(m, order)
	require.NoError(t, err)
	return progs
}

// checkInstr asserts that an instruction has kernels and that the
// geometry helpers accept its local shapes, as the CUDA backend will
// call them.
func checkInstr(t *testing.T, p *lower.Program, in lower.Instr) {
	t.Helper()
	where := in.Op
	if in.Value != nil {
		where = in.Value.Where()
	}
	for _, b := range append(slices.Clone(in.Args), in.Out) {
		if b < 0 {
			continue
		}
		dt := p.Buffers[b].Type.DType
		assert.NotEqual(t, ir.F64, dt, "%s: the CUDA kernels take no f64", where)
	}
	if _, ok := cuda.Elsewhere[in.Op]; ok {
		return
	}
	_, ok := cuda.KernelsFor(in.Op)
	if !assert.True(t, ok, "%s: op %s has no CUDA kernel", where, in.Op) {
		return
	}
	arg := func(i int) []int { return []int(in.ArgTypes[i].Shape) }
	switch in.Op {
	case "cast":
		from, to := in.ArgTypes[0].DType, in.OutType.DType
		assert.True(t, from == to || from == ir.F32 && to.Is16() || from.Is16() && to == ir.F32 || from == ir.I32 && to == ir.F32,
			"%s: cast %v → %v has no kernel", where, from, to)
	case "reduce_sum", "reduce_mean", "reduce_max", "reduce_max_grad":
		_, _, _, err := cuda.ReduceGeometry(arg(0), in.Attrs.Ints("axes"))
		assert.NoError(t, err, where)
	case "transpose":
		_, err := cuda.TransposeGather(arg(0), in.Attrs.Ints("perm"))
		assert.NoError(t, err, where)
	case "broadcast":
		_, err := cuda.BroadcastGather(arg(0), []int(in.OutType.Shape))
		assert.NoError(t, err, where)
	case "slice":
		_, _, _, err := cuda.SliceGeometry(arg(0), in.Attrs.Int("dim", 0))
		assert.NoError(t, err, where)
	case "slice_grad":
		_, _, _, err := cuda.SliceGeometry([]int(in.OutType.Shape), in.Attrs.Int("dim", 0))
		assert.NoError(t, err, where)
	}
}

// Every instruction of the example GPT's programs — one device, tensor
// parallel (vocab-parallel embedding and loss), sequence parallel with
// data parallelism and ZeRO, pipeline parallel, each optimizer, fp16 and
// bf16 mixed precision, compressed stashes, the fused attention and the
// unfused one — has kernels here or runs
// elsewhere (GEMM, copies, collectives), and its shapes fit the kernels.
func TestGPTProgramsHaveKernels(t *testing.T) {
	tp2 := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: 2}}}
	dp2tp2 := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "tp", Size: 2}}}
	pp2 := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: 2}}}
	configs := []struct {
		name string
		mesh *ir.Mesh
		edit func(*passes.Options)
		// attention is the model's attention core: the fused op, or
		// primitive ops (softmax, the causal mask and their gradients).
		attention string
	}{
		{"1dev", nil, nil, "fused"},
		{"tp2", tp2, nil, "fused"},
		{"dp2_tp2_sp_zero2", dp2tp2, func(o *passes.Options) { o.SequenceParallel = true; o.Zero = 2 }, "fused"},
		{"pp2", pp2, func(o *passes.Options) { o.Microbatches = 2 }, "fused"},
		{"sgd", nil, func(o *passes.Options) { o.Optimizer = "sgd" }, "fused"},
		{"adafactor", nil, func(o *passes.Options) { o.Optimizer = "adafactor" }, "fused"},
		{"sm3", nil, func(o *passes.Options) { o.Optimizer = "sm3" }, "fused"},
		{"fp16", nil, func(o *passes.Options) { o.Precision = "fp16" }, "fused"},
		{"bf16_tp2", tp2, func(o *passes.Options) { o.Precision = "bf16" }, "fused"},
		{"unfused_tp2", tp2, nil, "unfused"},
		{"recompute_lowp", nil, func(o *passes.Options) { o.Recompute = "selective"; o.Compress = "lowp" }, "unfused"},
		{"recompute_full_lowp", nil, func(o *passes.Options) { o.Recompute = "full"; o.Compress = "lowp" }, "fused"},
	}
	seen := map[string]bool{}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range gptPrograms(t, c.mesh, c.edit, c.attention) {
				for _, in := range p.Instrs {
					seen[in.Op] = true
					checkInstr(t, p, in)
				}
			}
		})
	}
	var ops []string
	for op := range seen {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	t.Logf("%d ops seen: %v", len(ops), ops)
	// The walk is only worth something if it met the ops that matter.
	for _, op := range []string{"embedding", "embedding_grad", "layernorm", "layernorm_grad_x", "layernorm_grad_gamma",
		"softmax", "softmax_grad", "causal_mask", "gelu", "gelu_grad", "cross_entropy", "cross_entropy_grad",
		"attention", "attention_stats", "attention_grad_q", "attention_grad_k", "attention_grad_v",
		"transpose", "slice", "reduce_sum", "adamw", "sgd", "adafactor", "sm3", "cast", "nonfinite_count", "where_finite"} {
		assert.True(t, seen[op], "no program had %s", op)
	}
}
