package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/cost"
)

// TestRefineTraceFlags: --refine-trace and --save-hardware without what
// they need are named errors from parseArgs, before any work.
func TestRefineTraceFlags(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "trace.json")
	cut := filepath.Join(dir, "cut.json")
	require.NoError(t, os.WriteFile(cut, []byte(`{"traceEvents": [{"name": "matmul"`), 0o644))
	predicted, notTrace := filepath.Join(dir, "predicted.json"), filepath.Join(dir, "metrics.json")
	require.NoError(t, os.WriteFile(predicted, []byte(`{"traceEvents": [{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "predicted kernels"}}, {"name": "matmul", "ph": "X", "pid": 2, "dur": 5}]}`), 0o644))
	require.NoError(t, os.WriteFile(notTrace, []byte(`{"config": {"tp": 1}, "steps": []}`), 0o644))
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no plan", []string{"--hardware", "a100-80g", "--refine-trace", tr}, "--refine-trace refines the --hardware preset for --plan: it needs both"},
		{"no hardware", []string{"--plan", "--refine-trace", tr}, "--refine-trace refines the --hardware preset for --plan: it needs both"},
		{"with run", []string{"--plan", "--run", "--hardware", "cpu", "--refine-trace", tr}, "--refine-trace applies to --plan without --run"},
		{"save alone", []string{"--plan", "--hardware", "cpu", "--save-hardware", filepath.Join(dir, "hw.json")}, "--save-hardware writes the preset --refine-trace or --calibrate refines: it needs one of them"},
		{"save not json", []string{"--plan", "--hardware", "cpu", "--refine-trace", tr, "--save-hardware", filepath.Join(dir, "hw.txt")}, "must end in .json"},
		{"no such trace", []string{"--plan", "--hardware", "cpu", "--refine-trace", tr}, "--refine-trace: trace: open " + tr + ": no such file or directory"},
		{"a cut trace", []string{"--plan", "--hardware", "cpu", "--refine-trace", cut}, "--refine-trace: trace " + cut + ": the JSON ends before it is complete (is the file cut short?)"},
		{"a predicted trace", []string{"--plan", "--hardware", "cpu", "--refine-trace", predicted}, "--refine-trace " + predicted + ": its events are predicted kernels, a prediction (--plan-trace writes it), not a measurement"},
		{"not a trace", []string{"--plan", "--hardware", "cpu", "--refine-trace", notTrace}, "--refine-trace: trace " + notTrace + ": no trace events in it: not a trace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseArgs(append([]string{gptModel}, c.args...))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// Flags that exclude each other, or that a subcommand does not take, are
// one error, not one more for each rule they then also break.
func TestExclusiveHardwareFlagsAreOneError(t *testing.T) {
	dir := t.TempDir()
	tr, cal := filepath.Join(dir, "trace.json"), filepath.Join(dir, "cal.json")
	require.NoError(t, os.WriteFile(tr, []byte(`{"traceEvents": [{"name": "matmul", "ph": "X", "ts": 0, "dur": 1, "pid": 0, "tid": 1}]}`), 0o644))
	require.NoError(t, os.WriteFile(cal, []byte(`[{"tp": 1, "pp": 1, "dp": 4, "step_ms": 9}]`), 0o644))
	w := filepath.Join(dir, "w.safetensors")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{gptModel, "--plan", "--calibrate", cal, "--refine-trace", tr}, "--calibrate and --refine-trace each refine the hardware: give one"},
		{[]string{"eval", gptModel, "--load", w, "--calibrate", cal}, "eval: --calibrate changes only training"},
		{[]string{"eval", gptModel, "--load", w, "--refine-trace", tr}, "eval: --refine-trace changes only training"},
	} {
		err := mainErr(tc.args)
		require.Error(t, err, "%v", tc.args)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), "\n", "one error: %v", err)
	}
}

// TestRefineTraceCLI: a --trace of a short run refines the cpu preset
// for --plan, --save-hardware writes it, and --hardware reads it back;
// a trace of another plan is refused naming the mismatch.
func TestRefineTraceCLI(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "trace.json")
	plan := []string{"--devices", "2", "--tp", "2", "--dp", "1", "--pp", "1"}
	run := append(append(append([]string{}, tinyGPT...), plan...), "--run", "--steps", "3", "--eval-batches", "-1", "--trace", tr)
	require.NoError(t, mainNoPanic(t, run))

	saved := filepath.Join(dir, "refined.json")
	args := append(append(append([]string{}, tinyGPT...), plan...), "--plan", "--plan-top", "1", "--hardware", "cpu", "--refine-trace", tr, "--save-hardware", saved)
	var out string
	log, err := captureStderr(t, func() error {
		var err error
		out = captureStdout(t, func() { err = mainNoPanic(t, args) })
		return err
	})
	require.NoError(t, err, log)
	assert.Contains(t, log, "refine: gemm_efficiency")
	assert.Contains(t, log, "median |log(predicted/measured)|")
	assert.Contains(t, out, "best: tp=2 pp=1 dp=1")
	hw, err := cost.Load(saved)
	require.NoError(t, err)
	assert.Contains(t, hw.Source, "refined")

	again := append(append(append([]string{}, tinyGPT...), plan...), "--plan", "--plan-top", "1", "--hardware", saved)
	out = captureStdout(t, func() { require.NoError(t, mainNoPanic(t, again)) })
	assert.Contains(t, out, "best: tp=2 pp=1 dp=1")

	other := append(append([]string{}, tinyGPT...), "--devices", "2", "--dp", "2", "--tp", "1", "--pp", "1", "--plan", "--hardware", "cpu", "--refine-trace", tr)
	err = mainNoPanic(t, other)
	require.Error(t, err)
	assert.ErrorIs(t, err, cost.ErrTraceMismatch)
}
