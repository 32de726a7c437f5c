package cost

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An fp8 plan prices the blocks' linear GEMMs at the fp8 peak and casts
// their operands through memory; everything else stays bf16. So on
// h100-sxm it is faster than bf16 but by less than half (the attention
// core, the head and the elementwise ops do not change); on a Hopper
// whose fp8 peak were no faster than bf16, only the casts remain and it
// is slower; on an A100 it is a named error, as is a precision nobody
// has.
func TestFP8Priced(t *testing.T) {
	h100, err := Preset("h100-sxm")
	require.NoError(t, err)
	m := mlperfGPT3()
	plan := func(prec string) Plan {
		return Plan{TP: 4, PP: 8, DP: 16, VPP: 12, MicroBatch: 1, Microbatches: 16, SequenceParallel: true, Recompute: "none",
			Precision: prec, Optimizer: "adamw", Zero: 1, Schedule: "interleaved"}
	}
	bf16, err := h100.Estimate(m, plan("bf16"))
	require.NoError(t, err)
	fp8, err := h100.Estimate(m, plan("fp8"))
	require.NoError(t, err)
	assert.Less(t, fp8.ComputeSeconds, bf16.ComputeSeconds, "fp8 GEMMs run at twice the bf16 peak")
	assert.Greater(t, fp8.ComputeSeconds, bf16.ComputeSeconds/2, "only the blocks' linear GEMMs are fp8")
	assert.Equal(t, bf16.ModelFLOPs, fp8.ModelFLOPs, "the same work")
	assert.Greater(t, fp8.MemoryEstimate, bf16.MemoryEstimate, "fp8 copies of the weights beside the bf16 ones")
	assert.Equal(t, "fp8", plan("fp8").DTypeName(), "MFU is measured against the fp8 peak")

	flat := h100.clone()
	flat.PeakTFLOPS["fp8"] = flat.PeakTFLOPS["bf16"]
	castsOnly, err := flat.Estimate(m, plan("fp8"))
	require.NoError(t, err)
	assert.Greater(t, castsOnly.ComputeSeconds, bf16.ComputeSeconds, "at the bf16 peak, fp8 pays its casts for nothing")

	for _, tc := range []struct {
		hw, prec, want string
	}{
		{"a100-80g", "fp8", "precision fp8: a100-80g has no FP8 matrix peak"},
		{"h100-sxm", "fp4", `precision "fp4": want fp32, fp16, bf16 or fp8`},
	} {
		h, err := Preset(tc.hw)
		require.NoError(t, err)
		_, err = h.Estimate(m, plan(tc.prec))
		require.Error(t, err, tc.hw+" "+tc.prec)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// Under cp with sequence parallelism, the ring's layout (the sequence
// split over cp first, each cp rank's share over tp, as Megatron-Core lays
// it out) runs every tp collective on a cp rank's tokens: exactly what
// the same plan moves without cp on a sequence cp times shorter. Ulysses'
// layout (tp the coarser split) joins cp's split around each, which costs
// more and puts bytes on cp besides its all_to_alls.
func TestRingSplitsTheSequenceOverCPFirst(t *testing.T) {
	h100, err := Preset("h100-sxm")
	require.NoError(t, err)
	long, short := llama3_8B(16384), llama3_8B(8192)
	p := Plan{TP: 4, PP: 1, DP: 2, CP: 2, MicroBatch: 1, Microbatches: 4, SequenceParallel: true, Recompute: "none",
		Precision: "bf16", Optimizer: "adamw", Zero: 1}
	ring, err := h100.EstimateFast(long, p)
	require.NoError(t, err)
	p.CPImpl = "all2all"
	ulysses, err := h100.EstimateFast(long, p)
	require.NoError(t, err)
	p.CP, p.CPImpl = 1, ""
	halved, err := h100.EstimateFast(short, p)
	require.NoError(t, err)
	assert.InDelta(t, halved.CommSeconds["tp"], ring.CommSeconds["tp"], 1e-12, "tp collectives on a cp rank's tokens")
	assert.InDelta(t, halved.CommBytes["tp"], ring.CommBytes["tp"], 1e-3)
	assert.Greater(t, ulysses.CommSeconds["tp"], ring.CommSeconds["tp"], "tp first joins cp's split around every collective")
}
