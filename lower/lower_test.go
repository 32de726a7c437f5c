package lower_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/examples/moe"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

func compileGPT(t *testing.T, optimizer string) *lower.Program {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 2, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Optimizer = optimizer
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// liveRanges returns each temp buffer's [first write, last read] instruction.
func liveRanges(p *lower.Program) map[int][2]int {
	r := map[int][2]int{}
	touch := func(b, i int) {
		if p.Buffers[b].Kind.Persistent() {
			return
		}
		if x, ok := r[b]; ok {
			r[b] = [2]int{x[0], i}
		} else {
			r[b] = [2]int{i, i}
		}
	}
	for i, in := range p.Instrs {
		for _, a := range in.Args {
			touch(a, i)
		}
		touch(in.Out, i)
	}
	for _, b := range p.Outputs {
		if x, ok := r[b]; ok {
			r[b] = [2]int{x[0], len(p.Instrs)}
		}
	}
	return r
}

func TestMemoryPlanNeverOverlapsLiveBuffers(t *testing.T) {
	for _, opt := range []string{"adamw", "sgd"} {
		p := compileGPT(t, opt)
		ranges := liveRanges(p)
		var ids []int
		for b := range ranges {
			ids = append(ids, b)
		}
		for i, a := range ids {
			for _, b := range ids[i+1:] {
				ra, rb := ranges[a], ranges[b]
				if ra[1] < rb[0] || rb[1] < ra[0] {
					continue // lifetimes disjoint: sharing bytes is fine
				}
				ba, bb := p.Buffers[a], p.Buffers[b]
				overlap := ba.Offset < bb.Offset+bb.Bytes && bb.Offset < ba.Offset+ba.Bytes
				assert.False(t, overlap, "%s: live buffers %d (%v) and %d (%v) share bytes", opt, a, ba.Value.Where(), b, bb.Value.Where())
			}
		}
		var persistent int64
		for _, b := range p.Buffers {
			align := int64(8)
			if b.Bytes >= 4*lower.Align {
				align = lower.Align // large buffers start on a cache line
			}
			assert.Zero(t, b.Offset%align, "buffer %d (%d bytes) is not aligned", b.ID, b.Bytes)
			assert.LessOrEqual(t, b.Offset+b.Bytes, p.ArenaBytes)
			if b.Kind.Persistent() {
				persistent += b.Bytes
			}
		}
		assert.Equal(t, persistent, p.PersistentBytes)
		assert.LessOrEqual(t, p.PeakBytes, p.ArenaBytes)
		assert.Greater(t, p.PeakBytes, p.PersistentBytes)
	}
}

func TestUpdatesAreInPlaceAndForwardEndsAtLoss(t *testing.T) {
	p := compileGPT(t, "adamw")
	for _, in := range p.Instrs {
		assert.NotEqual(t, "copy", in.Op, "every AdamW update is elementwise at the state's last read, so none needs a copy")
		if in.Op == "adamw" || in.Op == "adam_m" || in.Op == "adam_v" {
			assert.Equal(t, in.Args[0], in.Out, "%s writes its state in place", in.Value.Where())
		}
	}
	loss := p.Outputs["loss"]
	assert.Equal(t, loss, p.Instrs[p.ForwardEnd-1].Out)
	for _, in := range p.Instrs[:p.ForwardEnd] {
		assert.Equal(t, ir.PhaseFwd, in.Value.Meta.Phase, "%s is needed for the loss", in.Value.Where())
	}
}

// The loss's gradient is written over the logits it reads last (in
// bf16, their fp32 copy), as Megatron-LM's cross-entropy writes its
// gradient over its softmax: both were live at most plans' peak.
func TestLossGradientOverwritesTheLogits(t *testing.T) {
	for _, precision := range []string{"fp32", "bf16"} {
		m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 2, Set: map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16"}})
		require.NoError(t, err)
		opts := passes.DefaultOptions()
		opts.Precision = precision
		_, err = passes.Run(m, opts, passes.Hooks{})
		require.NoError(t, err)
		p, err := lower.Lower(m)
		require.NoError(t, err)
		n := 0
		for _, in := range p.Instrs {
			if in.Op == "cross_entropy_grad" {
				n++
				assert.Equal(t, in.Args[0], in.Out, "%s: %s writes over its logits", precision, in.Value.Where())
			}
		}
		assert.Equal(t, 1, n, precision)
	}
}

// Under mixed precision each microbatch's 16-bit gradient is added to its
// fp32 sum as it is, not through an fp32 copy made for the add alone
// (which held 4 more bytes an element of the largest gradient at its
// add), and the sum is still written over the one before it.
func TestSumsReadTheSixteenBitGradients(t *testing.T) {
	for _, precision := range []string{"bf16", "fp16"} {
		m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 6, Set: map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16"}})
		require.NoError(t, err)
		opts := passes.DefaultOptions()
		opts.Precision, opts.Microbatches = precision, 3
		_, err = passes.Run(m, opts, passes.Hooks{})
		require.NoError(t, err)
		p, err := lower.Lower(m)
		require.NoError(t, err)
		producer, readers := map[int]lower.Instr{}, map[int]int{}
		for _, in := range p.Instrs {
			producer[in.Out] = in
			for _, a := range in.Args {
				readers[a]++
			}
		}
		widened := 0
		for _, in := range p.Instrs {
			v := in.Value
			if in.Op != "add" || v.Meta.Phase != ir.PhaseBwd {
				continue
			}
			copies := 0
			for _, a := range in.Args {
				if c, ok := producer[a]; ok && c.Op == "cast" && readers[a] == 1 {
					copies++
				}
			}
			// The tied table's two parts: one is widened, the other's
			// copy is where the sum is made.
			if v.Meta.Micro >= 0 {
				copies--
			}
			assert.LessOrEqual(t, copies, 0, "%s: %s adds an fp32 copy made for it alone", precision, v.Where())
			if in.OutType.DType == ir.F32 && p.Buffers[in.Args[1]].Type.DType != ir.F32 {
				widened++
				assert.Equal(t, ir.F32, p.Buffers[in.Args[0]].Type.DType, precision)
				if v.Meta.Micro < 0 {
					assert.Equal(t, in.Args[0], in.Out, "%s: %s writes over the sum before it", precision, v.Where())
				}
			}
		}
		// Two sums a param, of microbatches 1 and 2 into the one
		// microbatch 0's gradient starts, but for the tied table, whose
		// microbatch gradient is an fp32 sum itself, of the embedding's
		// part and the head's: one a microbatch.
		assert.Equal(t, 2*(len(m.Params())-1)+3, widened, precision)
	}
}

// Elementwise arithmetic writes its result over its first argument where
// that is the argument's last read: the tied table's gradient, the sum of
// the head's part and the embedding's, takes the head's part's buffer
// (before, both parts and their sum were live at once). And no
// instruction reads or writes a buffer the lowering dropped when it
// merged two, where one pass's in-place sums meet another's (a router's
// gradient, summed over the first of its parts, then summed again: the
// second sum wrote a buffer already gone).
func TestAddsWriteOverTheirFirstArgument(t *testing.T) {
	for _, c := range []struct {
		name  string
		fn    frontend.ModelFunc
		set   map[string]string
		micro int
	}{
		{"gpt", gpt.Model, map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16"}, 1},
		{"gpt_micro2", gpt.Model, map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16"}, 2},
		{"moe_gshard", moe.Model, map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16", "experts": "4", "router": "gshard"}, 1},
	} {
		m, err := frontend.Build(c.fn, frontend.Config{Name: c.name, Batch: 4, Set: c.set})
		require.NoError(t, err)
		opts := passes.DefaultOptions()
		opts.Microbatches = c.micro
		_, err = passes.Run(m, opts, passes.Hooks{})
		require.NoError(t, err)
		p, err := lower.Lower(m)
		require.NoError(t, err)
		var table ir.Type
		for name, b := range p.Sources {
			if strings.HasPrefix(name, "wte") {
				table = p.Buffers[b].Type
			}
		}
		tied := 0
		for _, in := range p.Instrs {
			for _, b := range append([]int{in.Out}, in.Args...) {
				if b >= 0 {
					assert.Positive(t, p.Buffers[b].Bytes, "%s: %s %s uses buffer %d, which the lowering dropped", c.name, in.Op, in.Value.Where(), b)
				}
			}
			if in.Op == "add" && in.Value.Meta.Phase == ir.PhaseBwd && in.Value.Meta.Micro == 0 && in.OutType.Equal(table) {
				tied++
				assert.Equal(t, in.Args[0], in.Out, "%s: the tied table's gradient is summed over its first part", c.name)
			}
		}
		if c.micro > 1 {
			assert.Equal(t, 1, tied, c.name)
		}
	}
}

// What a device sends per step is the ring algorithms' share of each
// collective's operand: 2(n−1)/n of an all-reduce, (n−1)/n of a
// reduce-scatter, n−1 shards of an all-gather.
func TestCollectiveSendBytes(t *testing.T) {
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 8, Set: map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 4}}}
	opts.Zero = 1
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	p, err := lower.Lower(m)
	require.NoError(t, err)
	operands, sent := p.CollectiveBytes(), p.CollectiveSendBytes()
	require.Positive(t, operands["reduce_scatter/dp"])
	require.Positive(t, operands["all_gather/dp"])
	assert.Equal(t, 3*operands["reduce_scatter/dp"]/4, sent["reduce_scatter/dp"])
	assert.Equal(t, 3*operands["all_gather/dp"], sent["all_gather/dp"])
	if b := operands["all_reduce/dp"]; b > 0 {
		assert.Equal(t, 2*3*b/4, sent["all_reduce/dp"])
	}
	assert.Len(t, sent, len(operands))
}

// An update whose new value is read after the state is overwritten cannot
// be in place; it becomes a copy at the end of the step.
func TestUpdateFallsBackToCopy(t *testing.T) {
	m := ir.NewModule("t")
	p, err := m.AddSource("param", ir.T(ir.F32, 4), ir.Attrs{"name": "p"}, ir.NoMeta, ir.Pos{})
	require.NoError(t, err)
	double, err := m.Add("add", []*ir.Value{p, p}, nil, ir.NoMeta, ir.Pos{})
	require.NoError(t, err)
	loss, err := m.Add("reduce_sum", []*ir.Value{p}, ir.Attrs{"axes": []int{0}}, ir.NoMeta, ir.Pos{})
	require.NoError(t, err)
	m.SetOutput("loss", loss)
	m.Updates = append(m.Updates, ir.Update{State: p, Value: double})
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	last := prog.Instrs[len(prog.Instrs)-1]
	assert.Equal(t, "copy", last.Op)
	assert.Equal(t, prog.Sources["p"], last.Out)
}

func TestLowerRejectsInvalidModule(t *testing.T) {
	m := ir.NewModule("t")
	p, _ := m.AddSource("param", ir.T(ir.F32, 4), ir.Attrs{"name": "p"}, ir.NoMeta, ir.Pos{})
	v, _ := m.Add("neg", []*ir.Value{p}, nil, ir.NoMeta, ir.Pos{File: "model.go", Line: 7})
	v.Type = ir.T(ir.F32, 5)
	_, err := lower.Lower(m)
	assert.ErrorContains(t, err, `after pass "lower": %1 neg @model.go:7: declared type f32[5] but the neg rule gives f32[4]`)
}

// The peak breakdown accounts for every byte live at the peak.
func TestPeakBreakdownSumsToPeak(t *testing.T) {
	for _, opt := range []string{"adamw", "sgd"} {
		p := compileGPT(t, opt)
		bd := p.Peak
		assert.Equal(t, p.PeakBytes, bd.Params+bd.Gradients+bd.Optimizer+bd.Activations+bd.Inputs+bd.Workspace, opt)
		assert.Positive(t, bd.Activations)
		var params int64
		for _, b := range p.Buffers {
			if b.Kind == lower.Param {
				params += b.Bytes
			}
		}
		assert.Equal(t, params, bd.Params)
		require.NotEmpty(t, p.PeakLive)
		for i := 1; i < len(p.PeakLive); i++ {
			assert.GreaterOrEqual(t, p.Buffers[p.PeakLive[i-1]].Bytes, p.Buffers[p.PeakLive[i]].Bytes, "largest first")
		}
	}
}
