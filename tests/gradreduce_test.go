package tests

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// --grad-reduce-dtype bf16 (or fp16) reduces the gradients over the data
// axes in 16 bits: every such reduction is 16-bit and rounds each add,
// they move half the bytes of the fp32 plan's, a chain over ep and dp
// stays 16-bit between its reductions, and training stays close to the
// fp32 reduction's (not equal: the sums are rounded).
func TestGradReduceInSixteenBits(t *testing.T) {
	for _, p := range []plan{
		{dp: 2, precision: "bf16"},
		{dp: 2, zero: 2, micro: 2, precision: "bf16"},
		{dp: 2, zero: 1, micro: 2, precision: "fp16", gradReduce: "fp16"},
		{dp: 2, ep: 2, model: "mixtral", precision: "bf16"},
		// The router's balance loss sums an activation's gradient over cp,
		// which the backward reads on: it stays fp32.
		{dp: 2, cp: 2, model: "mixtral", precision: "bf16"},
	} {
		if p.gradReduce == "" {
			p.gradReduce = "bf16"
		}
		t.Run(p.String()+"_"+p.gradReduce, func(t *testing.T) {
			wide := p
			wide.gradReduce = ""
			ref, got := train(t, wide), train(t, p)
			want := ir.BF16
			if p.gradReduce == "fp16" {
				want = ir.F16
			}
			refBytes, refN := dataReductionBytes(ref.prog)
			gotBytes, n := dataReductionBytes(got.prog)
			require.Positive(t, n)
			assert.Equal(t, refN, n, "the same reductions")
			readers := map[*ir.Value][]*ir.Value{}
			for _, in := range got.prog.Instrs {
				for _, a := range in.Value.Args {
					readers[a] = append(readers[a], in.Value)
				}
			}
			var kept int64 // the bytes of the reductions left in fp32
			for _, in := range got.prog.Instrs {
				if !isDataReduction(got.prog, in) {
					continue
				}
				if in.OutType.DType == ir.F32 {
					// Only a gradient the backward reads on stays fp32.
					// (Not the sum of a microbatch's gradient into the
					// step's.)
					assert.True(t, slices.ContainsFunc(readers[in.Value], func(u *ir.Value) bool {
						return u.Meta.Phase == ir.PhaseBwd && !(in.Value.Meta.Micro >= 0 && u.Op == "add" && u.Meta.Micro < 0)
					}), "%s is a param's gradient, left in fp32", in.Value.Where())
					assert.False(t, in.Attrs.Bool("round_each"), "%s", in.Value.Where())
					kept += got.prog.Buffers[in.Args[0]].Bytes
					continue
				}
				assert.Equal(t, want, in.OutType.DType, "%s", in.Value.Where())
				assert.True(t, in.Attrs.Bool("round_each"), "%s rounds each add", in.Value.Where())
				// A reduction over dp after one over ep reads the ep sum
				// in 16 bits, with no fp32 cast between.
				if a := in.Value.Args[0]; a.Op == "cast" {
					assert.False(t, a.Args[0].Attrs.Bool("round_each"), "%s narrows a narrowed sum again", in.Value.Where())
				}
			}
			assert.Equal(t, (refBytes-kept)/2+kept, gotBytes, "half the bytes of what is narrowed")
			if p.cp > 1 {
				assert.Positive(t, kept, "the router's activation gradient over cp stays fp32")
			}
			assert.NotEqual(t, ref.params, got.params, "a 16-bit reduction rounds the sums")
			// Adam moves a param by about the learning rate whatever its
			// gradient's size, so a rounded gradient near zero can move it
			// the other way: the losses, not the params, are compared.
			worst := assertLossesClose(t, ref.losses, got.losses, 2e-3)
			assert.InEpsilon(t, ref.eval, got.eval, 2e-3, "held-out loss")
			t.Logf("worst loss difference %.2g, held-out %.4f vs %.4f", worst, got.eval, ref.eval)
			for i := range ref.peaks {
				assert.LessOrEqual(t, got.peaks[i], ref.peaks[i], "device %d's peak", i)
			}
		})
	}
}

// The bytes the CPU backend's Comm moves in a step, not only the
// program's types, halve: the 16-bit reductions reach it as 16-bit
// buffers, summed there (not widened to fp32 around it).
func TestGradReduceMovesHalfTheBytes(t *testing.T) {
	moved := func(p plan) int64 {
		prog := compilePlan(t, p)
		cl, err := cpu.NewCluster(prog, cpu.Options{})
		require.NoError(t, err)
		require.NoError(t, cl.InitParams(1))
		cfg := runtime.TrainConfig{Steps: 1, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: -1,
			Schedule: runtime.Schedule{LR: 3e-3, Steps: 1}, LossScale: runtime.NewLossScaler(1)}
		_, _, err = runtime.Train(cl, corpus(), cfg, nil)
		require.NoError(t, err)
		return cl.Comm.Stats().Bytes
	}
	p := plan{dp: 2, precision: "bf16"}
	wide := moved(p)
	p.gradReduce = "bf16"
	narrow := moved(p)
	t.Logf("bytes handed to the comm in a step: %d in fp32, %d in bf16", wide, narrow)
	// A few scalars (the loss, the norm, the overflow count) move as
	// they did.
	assert.InDelta(t, 0.5, float64(narrow)/float64(wide), 0.01)
}

// isDataReduction says whether in is a backward reduction over a data
// axis (dp, ep, cp).
func isDataReduction(prog *lower.Program, in lower.Instr) bool {
	ax := in.Attrs.Str("axis")
	return (in.Op == "all_reduce" || in.Op == "reduce_scatter") && in.Value.Meta.Phase == ir.PhaseBwd && (ax == "dp" || ax == "ep" || ax == "cp")
}

// dataReductionBytes is the operand bytes of prog's backward reductions
// over the data axes, and how many there are.
func dataReductionBytes(prog *lower.Program) (bytes int64, n int) {
	for _, in := range prog.Instrs {
		if isDataReduction(prog, in) {
			bytes += prog.Buffers[in.Args[0]].Bytes
			n++
		}
	}
	return bytes, n
}
