package runtime

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sampleMetrics fills every kind of field the metrics have: nested
// structs, pointers, maps, lists, omitempty fields both set and empty.
func sampleMetrics() *Metrics {
	return &Metrics{
		Config:      map[string]any{"tp": 2, "model": "m.go", "lr": 0.003, "zero": nil},
		CompileMs:   12.5,
		Passes:      []PassMetrics{{Name: "shard", Ms: 0.25, Changed: true}},
		Devices:     []DeviceMetrics{{}},
		Schedule:    ScheduleMetrics{Name: "1f1b", BubbleTheory: 0.25},
		Data:        &DataMetrics{Source: "d", Tokens: 10, Split: "98,2"},
		Steps:       []StepMetrics{{Step: 1, Loss: 5.5, Ms: 3, LR: 1e-3, GradNorm: 1.5, Outputs: map[string]float64{"b": 2, "a": 1}}},
		Eval:        []EvalMetrics{{Step: 1, Loss: 5.25}},
		ResumedFrom: &ResumeMetrics{Checkpoint: "ck", Step: 3},
	}
}

// With finite figures the fallback writes the same bytes encoding/json
// does, so a diverged run's file differs only where a figure is not finite.
func TestFiniteJSONMatchesEncodingJSON(t *testing.T) {
	m := sampleMetrics()
	want, err := json.MarshalIndent(m, "", "  ")
	require.NoError(t, err)
	got, err := finiteJSON(m)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
}

// A diverged run's metrics are written, its non-finite figures as null;
// a run that failed before its first step writes empty lists, not null.
func TestMetricsFileSurvivesDivergence(t *testing.T) {
	dir := t.TempDir()
	m := sampleMetrics()
	m.Steps = append(m.Steps, StepMetrics{Step: 2, Loss: math.Inf(1), GradNorm: math.NaN(), Outputs: map[string]float64{"aux": math.Inf(-1)}})
	path := filepath.Join(dir, "m.json")
	require.NoError(t, m.WriteFile(path))
	var back struct {
		Steps []map[string]any `json:"steps"`
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Len(t, back.Steps, 2)
	assert.Equal(t, 5.5, back.Steps[0]["loss"])
	assert.Contains(t, back.Steps[1], "loss")
	assert.Nil(t, back.Steps[1]["loss"], "+Inf is null")
	assert.Nil(t, back.Steps[1]["grad_norm"], "NaN is null")
	assert.Equal(t, map[string]any{"aux": nil}, back.Steps[1]["outputs"])

	empty := &Metrics{Config: map[string]any{}}
	require.NoError(t, empty.WriteFile(path))
	raw, err = os.ReadFile(path)
	require.NoError(t, err)
	var lists map[string]any
	require.NoError(t, json.Unmarshal(raw, &lists))
	for _, k := range []string{"steps", "eval", "passes", "devices"} {
		assert.Equal(t, []any{}, lists[k], "%s is a list", k)
	}
}
