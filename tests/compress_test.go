package tests

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// withReLU switches the equivalence model to ReLU MLPs for one test.
func withReLU(t *testing.T) {
	saved := eqModel
	eqModel = map[string]string{}
	for k, v := range saved {
		eqModel[k] = v
	}
	eqModel["activation"] = "relu"
	t.Cleanup(func() { eqModel = saved })
}

// countOps counts the program's instructions running op.
func countOps(prog *lower.Program, op string) int {
	n := 0
	for _, in := range prog.Instrs {
		if in.Op == op {
			n++
		}
	}
	return n
}

// 1-bit ReLU masks are lossless: relu_grad_mask passes dy exactly where
// relu_grad does, so every plan trains bit for bit as it does without
// them (fp32 losses, held-out loss and final parameters), and each
// device's measured peak is the predicted one.
func TestCompressReluTrainsBitIdentically(t *testing.T) {
	withReLU(t)
	for _, p := range []plan{{dp: 1}, {tp: 2}, {micro: 2}, {recompute: "selective"}, {recompute: "full"},
		{dp: 2, tp: 2, sp: true}, {dp: 2, tp: 2, micro: 2, zero: 1, recompute: "selective"}, {precision: "bf16"}} {
		t.Run(p.String()+"_"+p.recompute+p.precision, func(t *testing.T) {
			ref := train(t, p)
			q := p
			q.compress = "relu"
			got := train(t, q)
			assert.Equal(t, 2*max(p.micro, 1), countOps(got.prog, "relu_mask"), "one mask per layer and microbatch")
			assert.Zero(t, countOps(got.prog, "relu_grad"))
			assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
			assert.Equal(t, ref.params, got.params, "bit-identical params")
			assert.Equal(t, ref.eval, got.eval, "bit-identical held-out loss")
			for r, peak := range got.peaks {
				assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", r)
			}
			t.Logf("peak %d → %d bytes per device", ref.prog.PeakBytes, got.prog.PeakBytes)
		})
	}
}

// liveBytes is the bytes live during each instruction, persistent ones
// included, accounted as the CPU device measures them.
func liveBytes(prog *lower.Program) []int64 {
	out := make([]int64, len(prog.Instrs))
	live := prog.PersistentBytes
	written := map[int]bool{}
	for i, in := range prog.Instrs {
		// An op working in place writes a buffer already live.
		if in.Out >= 0 && prog.Buffers[in.Out].Kind == lower.Temp && !written[in.Out] {
			written[in.Out] = true
			live += prog.Buffers[in.Out].Bytes
		}
		out[i] = live
		for _, b := range in.Frees {
			live -= prog.Buffers[b].Bytes
		}
	}
	return out
}

// The masks save exactly what the shapes say. Per layer a device stashes
// the MLP pre-activation x, b·s·c elements (b its rows of the microbatch,
// c its columns of 4h), and with masks b·s·⌈c/8⌉ bytes instead. The
// reference peak is at the head, after the last layer's forward and
// before the first layer's backward (the logits, the loss's gradient or
// the LM head's), where all L layers of that microbatch hold their stash,
// so the bytes live there drop by L·(size(x) − size(mask)).
//
// The peak stays at that instruction, where only forward (activation)
// buffers differ, so Program.PeakBytes and Program.Peak.Activations both
// drop by exactly that amount and the other categories do not move. (With
// dp=2 and 2 microbatches the peak once moved to a later backward
// instruction, where the microbatches' gradients waited to be summed
// after the last; they are summed as they come now, and that case's
// buckets hold one gradient each, so a bucket's whole-size gradients
// waiting for its reduce-scatter are not the peak.) Against lowp the
// stashed x is a bf16 copy (2 bytes per element), which the mask replaces.
func TestCompressReluSavesTheMaskedBytes(t *testing.T) {
	withReLU(t)
	const layers, h = 2, 32
	tests := []struct {
		base plan
		with string // compress mode with masks
		elt  int64  // bytes per stashed element of x without masks
	}{
		{plan{dp: 1}, "relu", 4},
		{plan{tp: 2}, "relu", 4},
		{plan{micro: 2}, "relu", 4},
		{plan{recompute: "selective"}, "relu", 4},
		{plan{dp: 2, tp: 2, sp: true}, "relu", 4},
		{plan{compress: "lowp"}, "relu,lowp", 2},
		{plan{dp: 2, micro: 2, zero: 2, bucketMB: 1e-4}, "relu", 4},
	}
	for _, tt := range tests {
		t.Run(tt.base.String()+"_"+tt.base.recompute+tt.base.compress, func(t *testing.T) {
			p := tt.base
			ref := compilePlan(t, p)
			p.compress = tt.with
			got := compilePlan(t, p)

			rows := int64(eqBatch / max(p.dp, 1) / max(p.micro, 1))
			cols := int64(4 * h / max(p.tp, 1))
			x, mask := tt.elt*rows*eqSeq*cols, rows*eqSeq*((cols+7)/8)
			want := layers * (x - mask)

			refLive, gotLive := liveBytes(ref), liveBytes(got)
			require.Equal(t, ref.PeakBytes, slices.Max(refLive), "the predicted peak is the most bytes ever live")
			require.Equal(t, got.PeakBytes, slices.Max(gotLive), "the predicted peak is the most bytes ever live")
			at := ref.Instrs[ref.PeakAt].Value
			require.Equal(t, -1, at.Meta.Layer, "the reference peak is at the head, between the last layer's forward and the first layer's backward: %s", at.Where())
			i := slices.IndexFunc(got.Instrs, func(in lower.Instr) bool { return in.Value.ID == at.ID })
			require.GreaterOrEqual(t, i, 0, "the compressed program runs %s too", at.Where())
			assert.Equal(t, want, refLive[ref.PeakAt]-gotLive[i], "at %s the live bytes drop by L·(x − mask)", at.Where())

			assert.Equal(t, at.ID, got.Instrs[got.PeakAt].Value.ID, "the peak stays at %s", at.Where())
			assert.Equal(t, want, ref.PeakBytes-got.PeakBytes, "PeakBytes drops by L·(x − mask)")
			assert.Equal(t, want, ref.Peak.Activations-got.Peak.Activations, "activations at the peak drop by L·(x − mask)")
			r, g := ref.Peak, got.Peak
			r.Activations, g.Activations = 0, 0
			assert.Equal(t, r, g, "nothing but activations changes at the peak")

			// Over the whole step each layer's stash, summed over the
			// microbatches, loses x and gains the mask.
			before, after := stashedPerLayer(ref), stashedPerLayer(got)
			for l := range layers {
				assert.Equal(t, int64(max(p.micro, 1))*(x-mask), before[l]-after[l], "layer %d", l)
			}
			t.Logf("per layer %d − %d bytes; L·(x − mask) = %d; peak %d → %d (−%d)", x, mask, want, ref.PeakBytes, got.PeakBytes, ref.PeakBytes-got.PeakBytes)
		})
	}
}

// With lowp, the masks replace the bf16 copies of the pre-activations;
// the backward's view of everything else is still rounded, so the losses
// stay within lowp's 1e-4 of fp32.
func TestCompressReluWithLowp(t *testing.T) {
	withReLU(t)
	ref := train(t, plan{dp: 1})
	got := train(t, plan{dp: 1, compress: "relu,lowp"})
	assertLossesClose(t, ref.losses, got.losses, 1e-4)
	assert.Equal(t, got.prog.PeakBytes, got.peaks[0], "measured peak equals predicted")
	assert.Positive(t, countOps(got.prog, "relu_mask"))
}

// compressedPipeline trains the ReLU GPT on a pipeline with the given
// compression, checking every rank's measured peak against the plan.
func compressedPipeline(t *testing.T, pl pipePlan, layers int, compress string) (trajectory, []*lower.Program) {
	t.Helper()
	m, progs, evals := compilePipeline(t, pl, layers, pipeSetup{edit: func(o *passes.Options) { o.Compress = compress }})
	run := runPipeline(t, m, progs, evals)
	return run.trajectory, progs
}

// On a pipeline each rank masks its own layers' ReLUs (a mask never
// crosses stages), trains bit for bit as without masks, and every rank's
// peak drops.
func TestCompressReluOnPipelines(t *testing.T) {
	withReLU(t)
	for _, pl := range []pipePlan{{pp: 2, micro: 4, name: "1f1b"}, {pp: 2, micro: 2, tp: 2, name: "gpipe"}} {
		pl.order = scheduleOrder(pl.name)
		t.Run(pl.String(), func(t *testing.T) {
			ref, refProgs := compressedPipeline(t, pl, 4, "")
			got, progs := compressedPipeline(t, pl, 4, "relu")
			assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
			assert.Equal(t, ref.params, got.params, "bit-identical params")
			for r, prog := range progs {
				assert.Equal(t, 2*pl.micro, countOps(prog, "relu_mask"), "rank %d masks its 2 layers for every microbatch", r)
				for _, in := range prog.Instrs {
					if in.Op == "send" || in.Op == "recv" {
						assert.NotEqual(t, ir.U8, in.Value.Type.DType, "rank %d: %s moves a mask", r, in.Value.Where())
					}
				}
				assert.Less(t, prog.PeakBytes, refProgs[r].PeakBytes, "rank %d", r)
				t.Logf("rank %d: peak %d → %d bytes", r, refProgs[r].PeakBytes, prog.PeakBytes)
			}
		})
	}
}
