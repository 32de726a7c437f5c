package tests

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
	"gcompile/lower"
)

// Recompute changes memory, not arithmetic: the same kernels run on the
// same inputs, so the losses are bit-identical, while the plan's peak of
// activations drops. Selective recompute runs on the unfused attention,
// whose scores and probabilities it drops (the fused op has none:
// TestSelectiveRecomputeOfFusedAttentionIsANote).
func TestRecomputeIsExactAndSavesActivations(t *testing.T) {
	refs := map[string]trajectory{}
	refProgs := map[string]*lower.Program{}
	for _, p := range []plan{{recompute: "full"}, {recompute: "selective", attention: "unfused"}, {recompute: "every=2"}, {recompute: "every=sqrt"}, {recompute: "block=1"},
		{recompute: "full", dp: 2, tp: 2, micro: 2}} {
		if _, ok := refs[p.attention]; !ok {
			refs[p.attention] = train(t, plan{dp: 1, attention: p.attention})
			refProgs[p.attention] = compilePlan(t, plan{dp: 1, attention: p.attention})
		}
		ref, refProg := refs[p.attention], refProgs[p.attention]
		t.Run(p.recompute+"_"+p.String(), func(t *testing.T) {
			got := train(t, p)
			if p.dp <= 1 && p.tp <= 1 && p.micro <= 1 {
				assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
				assert.Equal(t, ref.params, got.params, "bit-identical params")
				assert.Less(t, got.prog.Peak.Activations, refProg.Peak.Activations, "fewer activation bytes live at the peak")
				assert.Less(t, got.prog.PeakBytes, refProg.PeakBytes)
			} else {
				assertSameTraining(t, ref, got)
			}
			replayed := 0
			for _, in := range got.prog.Instrs {
				if in.Value.Meta.Phase == ir.PhaseRecompute {
					replayed++
				}
			}
			assert.Positive(t, replayed, "replayed ops are in the program, phase recompute")
			t.Logf("%s: peak %d → %d bytes, activations at the peak %d → %d", p.recompute, refProg.PeakBytes, got.prog.PeakBytes, refProg.Peak.Activations, got.prog.Peak.Activations)
		})
	}
}

// Under gradient accumulation a weight's 16-bit copy, made once a step
// for every microbatch's forward, is not replayed: it lives until the last
// forward anyway, past the first backwards, and its replay held the
// weights' copies twice at the peak (Llama 7B at pp 8 · dp 8, full
// recompute, bf16: the first rank's arena 11.2 → 9.7 GiB). The backward
// reads the forward's copy, as Megatron-LM's replays read its one bf16
// set; activations are still replayed.
func TestRecomputeKeepsOneCopyOfTheWeights(t *testing.T) {
	p := plan{dp: 1, micro: 4, recompute: "full", precision: "bf16"}
	prog := compilePlan(t, p)
	params := map[int]bool{}
	for i, b := range prog.Buffers {
		params[i] = b.Kind == lower.Param
	}
	replayed := 0
	for _, in := range prog.Instrs {
		if in.Value.Meta.Phase != ir.PhaseRecompute {
			continue
		}
		replayed++
		for _, a := range in.Args {
			assert.False(t, params[a], "%s replays a param's copy", in.Value.Where())
		}
	}
	assert.Positive(t, replayed, "activations replayed")
	assert.LessOrEqual(t, prog.Peak.Params-paramBytes(prog), paramBytes(prog)/2, "16-bit copies of the weights at the peak, beside the fp32 params")
}

// paramBytes is the bytes of a program's params.
func paramBytes(prog *lower.Program) int64 {
	var n int64
	for _, b := range prog.Buffers {
		if b.Kind == lower.Param {
			n += b.Bytes
		}
	}
	return n
}

// stashedPerLayer is the planner's accounting of activations kept for the
// backward: for each layer, the bytes of the forward buffers of that layer
// that a backward or replayed instruction reads.
func stashedPerLayer(prog *lower.Program) map[int]int64 {
	seen := map[int]bool{}
	out := map[int]int64{}
	for _, in := range prog.Instrs {
		if in.Value == nil || (in.Value.Meta.Phase != ir.PhaseBwd && in.Value.Meta.Phase != ir.PhaseRecompute) {
			continue
		}
		for _, a := range in.Args {
			b := prog.Buffers[a]
			if b.Kind != lower.Temp || b.Value.Meta.Phase != ir.PhaseFwd || b.Value.Meta.Layer < 0 || seen[a] {
				continue
			}
			seen[a] = true
			out[b.Value.Meta.Layer] += b.Bytes
		}
	}
	return out
}

// The activation bytes a transformer layer keeps for the backward, derived
// for this GPT as Korthikanti et al. do for Megatron's: in fp32 and without
// dropout, per layer 4·(16·s·b·h + a·b·s²) bytes with the unfused attention
// — the two LayerNorm outputs, q, k, v, the attention output, the residual
// after attention and the layer output (8·sbh), the MLP's pre- and
// post-GELU (4·sbh each), and the softmax probabilities (a·b·s²).
// Selective recompute drops the a·b·s² term. The fused attention keeps no
// probabilities, and its output, which its backward reads, is written in
// the [b, s, a, hd] layout c_proj reads, so it is the attention output
// counted above: 4·16·sbh, what selective recompute keeps, with nothing
// left for it to drop (FlashAttention's 34·sbh of Korthikanti's 16-bit
// formula).
// Full recompute keeps each layer's input (s·b·h): the output of the
// layer before, so layers 0…L−2 keep their output and the last keeps
// nothing (its output is replayed for the final LayerNorm's backward; the
// first layer's input is the embedding's).
func TestActivationBytesMatchTheFormula(t *testing.T) {
	const b, s, h, a, layers = eqBatch, eqSeq, 32, 4, 2
	sbh := int64(s * b * h)
	tests := []struct {
		recompute, attention string
		want                 int64
	}{
		{"none", "unfused", 4 * (16*sbh + int64(a*b*s*s))},
		{"selective", "unfused", 4 * 16 * sbh},
		{"full", "unfused", 4 * sbh},
		{"none", "fused", 4 * 16 * sbh},
		{"selective", "fused", 4 * 16 * sbh},
		{"full", "fused", 4 * sbh},
	}
	for _, tt := range tests {
		t.Run(tt.recompute+"_"+tt.attention, func(t *testing.T) {
			got := stashedPerLayer(compilePlan(t, plan{dp: 1, recompute: tt.recompute, attention: tt.attention}))
			for l := range layers {
				want := tt.want
				if tt.recompute == "full" && l == layers-1 {
					want = 0
				}
				assert.Equal(t, want, got[l], "layer %d", l)
			}
		})
	}
}

// Stashing activations in bf16 for the backward halves every layer's
// stash, on every family (lossy: the losses stay within 1e-4 relative of
// fp32 over 20 steps; measured 7.8e-6 on the GPT).
func TestCompressActivationsLowp(t *testing.T) {
	const b, s, h = eqBatch, eqSeq, 32
	sbh := int64(s * b * h)
	for _, model := range families {
		t.Run(model, func(t *testing.T) {
			full := stashedPerLayer(compilePlan(t, plan{dp: 1, model: model}))
			got := stashedPerLayer(compilePlan(t, plan{dp: 1, model: model, compress: "lowp"}))
			for l := range 2 {
				assert.Equal(t, full[l]/2, got[l], "layer %d: half the fp32 stash", l)
				if model == "gpt" {
					// The fused attention's formula (TestActivationBytesMatchTheFormula).
					assert.Equal(t, 2*16*sbh, got[l], "layer %d: half the formula's fp32 stash", l)
				}
			}
			ref := train(t, plan{dp: 1, model: model})
			low := train(t, plan{dp: 1, model: model, compress: "lowp"})
			worst := 0.0
			for i := range ref.losses {
				worst = max(worst, math.Abs(low.losses[i]-ref.losses[i])/ref.losses[i])
			}
			assert.Less(t, worst, 1e-4)
			assert.Less(t, low.prog.PeakBytes, ref.prog.PeakBytes)
			t.Logf("%s lowp: worst loss rel err %.2g, peak %d → %d bytes", model, worst, ref.prog.PeakBytes, low.prog.PeakBytes)
		})
	}
}
