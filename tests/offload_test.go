package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/lower"
)

// Offloading the optimizer state moves it to host memory: training is
// bit-identical and the device's peak drops by exactly the state's bytes
// (the peak is in the backward, when no state is on the device).
func TestOffloadOptimizerState(t *testing.T) {
	ref := train(t, plan{dp: 1})
	got := train(t, plan{dp: 1, offload: "optimizer"})
	assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
	assert.Equal(t, ref.params, got.params, "bit-identical params")
	var state int64
	for _, b := range ref.prog.Buffers {
		if b.Kind == lower.State {
			state += b.Bytes
		}
	}
	assert.Positive(t, state)
	assert.Equal(t, ref.prog.PeakBytes-state, got.prog.PeakBytes, "device peak drops by the offloaded bytes")
	assert.Equal(t, int64(0), got.prog.Peak.Optimizer, "no optimizer state on the device at the peak")
	assert.GreaterOrEqual(t, got.prog.HostBytes, state)
	assert.Equal(t, got.prog.PeakBytes, got.peaks[0], "measured peak equals predicted")
	assert.Less(t, got.prog.ArenaBytes, ref.prog.ArenaBytes)
	t.Logf("device peak %d → %d bytes (state %d bytes on the host)", ref.prog.PeakBytes, got.prog.PeakBytes, state)
}
