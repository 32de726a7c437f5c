package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/passes"
)

// Context parallelism trains like one device: every activation's
// sequence split over cp, attention by the ring (K/V chunks passed
// around, partial results merged by their log-sum-exp) or by Ulysses'
// all_to_alls, alone and with tensor and sequence parallelism, data
// parallelism with ZeRO, and a 1F1B pipeline; on the GPT (learned
// positions) and the Llama (rotary positions, grouped-query attention):
// the same loss at every step (1e-5 relative), the same final weights
// (1e-5 of each tensor's largest entry, the key biases aside as in
// TestDataParallelMatchesOneDevice), the same held-out loss, and every
// device's measured peak equal to the planned one.
func TestContextParallelMatchesOneDevice(t *testing.T) {
	plans := []plan{{cp: 2}, {cp: 4}, {cp: 2, cpImpl: "all2all"}, {cp: 2, tp: 2, sp: true}, {cp: 2, dp: 2, zero: 1}}
	for _, model := range families {
		ref := train(t, plan{model: model})
		check := func(t *testing.T, got trajectory) {
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			worstParam := paramError(t, ref.params, got.params, isKeyBias)
			assert.LessOrEqual(t, worstParam, 1e-5)
			assert.InDelta(t, ref.eval, got.eval, 1e-5*ref.eval, "held-out loss of the final weights")
			t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
		}
		for _, p := range plans {
			p.model = model
			t.Run(p.String(), func(t *testing.T) {
				got := train(t, p)
				check(t, got)
				for d, peak := range got.peaks {
					assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", d)
				}
				assertAttentionOverCP(t, got, p.cpImpl)
			})
		}
		pl := pipePlan{pp: 2, cp: 2, micro: 2, order: scheduleOrder("1f1b"), name: "1f1b", model: model}
		t.Run(pl.String(), func(t *testing.T) { check(t, trainPipeline(t, pl, 2)) })
	}
}

// A plan context parallelism cannot run is refused before anything is
// built, naming the rule: cp must divide the sequence, and Ulysses
// (all2all) must divide the heads and the k/v heads each device has.
func TestContextParallelBadPlans(t *testing.T) {
	cases := []struct {
		name  string
		model string
		mesh  []ir.MeshAxis
		impl  string
		want  string
	}{
		{"cp does not divide the sequence", "gpt", []ir.MeshAxis{{Name: "cp", Size: 3}}, "", "context parallelism splits \"tokens\" i32[8,16] along its sequence (dim 1) over cp=3, which does not divide it"},
		{"all2all, k/v heads not divisible", "llama", []ir.MeshAxis{{Name: "cp", Size: 4}}, "all2all", "--cp-impl all2all splits the key/value heads over cp=4, and the device's 2 of the model's 2 are not divisible by it"},
		{"all2all, heads left by tp not divisible", "gpt", []ir.MeshAxis{{Name: "cp", Size: 4}, {Name: "tp", Size: 2}}, "all2all", "the device's 2 of the model's 4 are not divisible by it"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := build(t, c.model, 0)
			opts := passes.DefaultOptions()
			opts.Mesh = &ir.Mesh{Axes: c.mesh}
			opts.CPImpl = c.impl
			_, err := passes.Run(m, opts, passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "model.go:", "the error names the user's line")
		})
	}
}

// assertAttentionOverCP checks that attention ran split over cp as the
// strategy says, not on gathered sequences: under the ring every
// attention op's q is split on its sequence (dim 2) over cp and nothing
// moves by all_to_all over cp; under all2all q is split on its heads
// (dim 1) and all_to_alls over cp move it.
func assertAttentionOverCP(t *testing.T, got trajectory, impl string) {
	t.Helper()
	mesh := got.prog.Mesh
	cp := mesh.SequenceAxis()
	require.GreaterOrEqual(t, cp, 0)
	dim := 2
	if impl == "all2all" {
		dim = 1
		assert.Positive(t, got.prog.CollectiveBytes()["all_to_all/cp"], "Ulysses moves q, k, v and the output by all_to_all over cp")
	} else {
		assert.Zero(t, got.prog.CollectiveBytes()["all_to_all/cp"])
	}
	n := 0
	for _, in := range got.prog.Instrs {
		if in.Op == "attention" || in.Op == "attention_grad_k" {
			n++
			assert.True(t, in.Value.Args[0].Place[cp].Placed(dim), "%s: q placed %v on cp", in.Op, in.Value.Args[0].Place)
		}
	}
	assert.Positive(t, n, "the program has attention instructions")
}
