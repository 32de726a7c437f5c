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

// Megatron-LM's other decay styles, and a decay that ends before the run
// does (--lr-decay-steps).
func TestScheduleDecayStyles(t *testing.T) {
	base := Schedule{LR: 1e-3, MinLR: 1e-4, Warmup: 10, Steps: 110}
	with := func(edit func(*Schedule)) Schedule {
		s := base
		edit(&s)
		return s
	}
	wsd := func(style string) Schedule {
		return with(func(s *Schedule) { s.Decay, s.MinLR, s.WSDDecaySteps, s.WSDStyle = "wsd", 0, 20, style })
	}
	tests := []struct {
		name string
		s    Schedule
		step int
		want float64
	}{
		{"linear, a quarter down", with(func(s *Schedule) { s.Decay = "linear" }), 35, 7.75e-4},
		{"linear, half way", with(func(s *Schedule) { s.Decay = "linear" }), 60, 5.5e-4},
		{"linear, the end", with(func(s *Schedule) { s.Decay = "linear" }), 110, 1e-4},
		{"cosine ending at 60, half way", with(func(s *Schedule) { s.Decay, s.DecaySteps = "cosine", 60 }), 35, 5.5e-4},
		{"cosine ending at 60, after it", with(func(s *Schedule) { s.Decay, s.DecaySteps = "cosine", 60 }), 80, 1e-4},
		{"linear ending at 210, the run's end", with(func(s *Schedule) { s.Decay, s.DecaySteps = "linear", 210 }), 110, 5.5e-4},
		{"inverse square root, peak", with(func(s *Schedule) { s.Decay, s.Warmup, s.Steps = "inverse-square-root", 4, 10000 }), 4, 1e-3},
		{"inverse square root, 16", with(func(s *Schedule) { s.Decay, s.Warmup, s.Steps = "inverse-square-root", 4, 10000 }), 16, 5e-4},
		{"inverse square root, the floor", with(func(s *Schedule) { s.Decay, s.Warmup, s.Steps = "inverse-square-root", 4, 10000 }), 1600, 1e-4},
		{"inverse square root, the last step", with(func(s *Schedule) { s.Decay, s.Warmup, s.Steps, s.MinLR = "inverse-square-root", 4, 64, 0 }), 64, 2.5e-4},
		{"wsd, stable", wsd("exponential"), 90, 1e-3},
		{"wsd exponential, half the anneal", wsd("exponential"), 100, 1e-3 * (2*math.Sqrt(0.5) - 1)},
		{"wsd linear, half the anneal", wsd("linear"), 100, 5e-4},
		{"wsd cosine, half the anneal", wsd("cosine"), 100, 5e-4},
		{"wsd minus_sqrt, half the anneal", wsd("minus_sqrt"), 100, 1e-3 * (1 - math.Sqrt(0.5))},
		{"wsd exponential, the end", wsd("exponential"), 110, 0},
		{"wsd minus_sqrt, the end", wsd("minus_sqrt"), 110, 0},
		// Without a warm-up the first step is the peak, whatever the style.
		{"wsd over the whole run, no warm-up, the first step", with(func(s *Schedule) {
			s.Decay, s.Warmup, s.WSDDecaySteps, s.WSDStyle = "wsd", 0, 110, "linear"
		}), 1, 1e-3},
		{"wsd over the whole run is linear", with(func(s *Schedule) { s.Decay, s.Warmup, s.WSDDecaySteps, s.WSDStyle = "wsd", 0, 110, "linear" }), 56,
			with(func(s *Schedule) { s.Decay, s.Warmup = "linear", 0 }).At(56)},
		// A decay that ends at the first step: the floor from the second.
		{"a decay of one step, no warm-up, the first step", with(func(s *Schedule) { s.Decay, s.Warmup, s.DecaySteps = "linear", 0, 1 }), 1, 1e-3},
		{"a decay of one step, no warm-up, the second step", with(func(s *Schedule) { s.Decay, s.Warmup, s.DecaySteps = "linear", 0, 1 }), 2, 1e-4},
		{"inverse square root past its decay steps", with(func(s *Schedule) { s.Decay, s.DecaySteps = "inverse-square-root", 40 }), 41, 1e-4},
	}
	for _, tt := range tests {
		assert.InDelta(t, tt.want, tt.s.At(tt.step), 1e-15, "%s: step %d", tt.name, tt.step)
	}
	for _, s := range []Schedule{with(func(s *Schedule) { s.Decay = "linear" }), wsd("exponential"), wsd("minus_sqrt"),
		with(func(s *Schedule) { s.Decay = "inverse-square-root" })} {
		for step := 11; step < 130; step++ {
			assert.LessOrEqual(t, s.At(step+1), s.At(step), "%s decays monotonically: step %d", s.Decay, step)
		}
	}
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

// Megatron-LM's dynamic scaler: Hysteresis overflowed steps since the
// scale last grew before it backs off (each of them skipped), then every
// one until it grows again; never below MinScale.
func TestLossScalerHysteresisAndFloor(t *testing.T) {
	s := &LossScaler{Scale: 8, Dynamic: true, Growth: 2, Backoff: 0.5, Interval: 2, Hysteresis: 2, MinScale: 2}
	var scales []float64
	var skipped []bool
	for _, overflow := range []bool{true, true, true, true, true, false, false, true, false, false, true} {
		nonfinite := 0.0
		if overflow {
			nonfinite = 1
		}
		skipped = append(skipped, s.Update(nonfinite))
		scales = append(scales, s.Scale)
	}
	// 8: the first overflow is tolerated, the second halves, the next two
	// halve to the floor, 2; two clean steps double it and reset the
	// count, so the next overflow is tolerated again.
	assert.Equal(t, []float64{8, 4, 2, 2, 2, 2, 4, 4, 4, 8, 8}, scales)
	assert.Equal(t, []bool{true, true, true, true, true, false, false, true, false, false, true}, skipped)
	st := s.State()
	assert.Equal(t, 1, st.Overflows)
	r := &LossScaler{Dynamic: true, Growth: 2, Backoff: 0.5, Interval: 2, Hysteresis: 2}
	require.NoError(t, r.Restore(*st))
	r.Update(1)
	assert.Equal(t, 4.0, r.Scale, "the restored count: the second overflow since the growth halves")
	p := NewLossScaler(0)
	p.Update(1)
	assert.Equal(t, 32768.0, p.Scale, "PyTorch's: every overflow halves")
}
