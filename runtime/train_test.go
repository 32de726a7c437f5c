package runtime

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScheduleWarmupThenCosine(t *testing.T) {
	s := Schedule{LR: 1e-3, MinLR: 1e-4, Warmup: 10, Steps: 110, Decay: "cosine"}
	tests := []struct {
		step int
		want float64
	}{
		{1, 1e-4},    // 1/10 of the way up
		{5, 5e-4},    // linear warm-up
		{10, 1e-3},   // peak at the end of warm-up
		{60, 5.5e-4}, // half way through decay: (max+min)/2
		{110, 1e-4},  // the floor at the last step
		{500, 1e-4},  // stays at the floor
	}
	for _, tt := range tests {
		assert.InDelta(t, tt.want, s.At(tt.step), 1e-12, "step %d", tt.step)
	}
	c := Schedule{LR: 2e-3, Decay: "constant"}
	assert.Equal(t, 2e-3, c.At(1))
	assert.Equal(t, 2e-3, c.At(1000))
	for step := 11; step < 110; step++ {
		assert.LessOrEqual(t, s.At(step+1), s.At(step), "cosine decay is monotone")
	}
	assert.False(t, math.IsNaN(Schedule{LR: 1, Steps: 0, Decay: "cosine"}.At(3)))
	// Without a warm-up the first step is at the peak and the last at the
	// floor.
	n := Schedule{LR: 1e-3, MinLR: 1e-4, Steps: 11, Decay: "cosine"}
	assert.InDelta(t, 1e-3, n.At(1), 1e-12)
	assert.InDelta(t, 5.5e-4, n.At(6), 1e-12)
	assert.InDelta(t, 1e-4, n.At(11), 1e-12)
	assert.Equal(t, 1e-3, Schedule{LR: 1e-3, MinLR: 1e-4, Steps: 1, Decay: "cosine"}.At(1))
}

// TestRandomKeys: a step's keys are a function of (seed, step, token
// index), non-negative (−1 is evaluation's), and differ across steps and
// seeds.
func TestRandomKeys(t *testing.T) {
	a := RandomKeys(3, 7, 1024)
	assert.Equal(t, a, RandomKeys(3, 7, 1024))
	assert.Equal(t, a[:100], RandomKeys(3, 7, 100), "a token's key does not depend on the batch around it")
	assert.NotEqual(t, a, RandomKeys(3, 8, 1024))
	assert.NotEqual(t, a, RandomKeys(4, 7, 1024))
	seen := map[int32]bool{}
	for _, k := range a {
		assert.GreaterOrEqual(t, k, int32(0))
		seen[k] = true
	}
	assert.Len(t, seen, len(a), "1024 distinct keys")
}

// A loss that is not finite before any update is the model's or its
// starting weights', and the message says so rather than "lower --lr";
// later it may be the learning rate's.
func TestCheckStepNamesWhatMadeTheLossNotFinite(t *testing.T) {
	err := CheckStep(1, math.Inf(1), 1, false)
	require.Error(t, err)
	assert.Equal(t, "step 1: loss is +Inf before any update: the model, or the weights it starts from, computes it so (a constant that is not finite, a log of 0?); check the model or --load's weights", err.Error())
	err = CheckStep(3, math.NaN(), 1, false)
	require.Error(t, err)
	assert.Equal(t, "step 3: loss is NaN; lower --lr or check the model", err.Error())
	assert.NoError(t, CheckStep(1, 2.5, 1, false))
}
