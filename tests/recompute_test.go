package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
)

// Recompute changes memory, not arithmetic: the same kernels run on the
// same inputs, so the losses are bit-identical, while the plan's peak of
// activations drops.
func TestRecomputeIsExactAndSavesActivations(t *testing.T) {
	ref := train(t, plan{dp: 1})
	refProg := compilePlan(t, plan{dp: 1})
	for _, p := range []plan{{recompute: "full"}, {recompute: "selective"}, {recompute: "every=2"}, {recompute: "every=sqrt"},
		{recompute: "full", dp: 2, tp: 2, micro: 2}} {
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
