package planner

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/cost"
)

// ReadMeasured takes the three forms a user has at hand and names, for
// anything else, the entry and the rule it breaks: a misspelt axis or a
// negative one must not calibrate a plan that did not run.
func TestReadMeasured(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []MeasuredPlan
		err        string
	}{
		{"list", `[{"tp": 2, "pp": 1, "dp": 4, "microbatches": 2, "step_ms": 10}]`,
			[]MeasuredPlan{{PlanFields: PlanFields{TP: 2, PP: 1, DP: 4, Microbatches: 2}, StepMs: 10}}, ""},
		{"metrics rows with step_ms", `{"plans": [{"rank": 1, "plan": "tp=2", "tp": 2, "predicted_step_ms": 9, "comm_ms": {"tp": 1}, "step_ms": 12, "cp_impl": "ring", "batch": 8}]}`,
			[]MeasuredPlan{{PlanFields: PlanFields{TP: 2, CPImpl: "ring"}, StepMs: 12, Batch: 8}}, ""},
		{"a run's metrics", `{"config": {"tp": 1, "pp": 1, "dp": 2, "seed": 7, "precision": "bf16", "set": "layers=2"}, "model": {"params": 1000}, "steps": [{"ms": 90}, {"ms": 12}, {"ms": 10}, {"ms": 11}]}`,
			[]MeasuredPlan{{PlanFields: PlanFields{TP: 1, PP: 1, DP: 2}, StepMs: 11, Run: &MeasuredRun{Params: 1000, Precision: "bf16", Set: "layers=2"}}}, ""},
		// A resumed run's earlier parts ran under their own plans: only
		// the last part's steps (after its warm-up) are timed.
		{"a resumed run's metrics", `{"config": {"tp": 1, "pp": 1, "dp": 2}, "carried_steps": 3, "steps": [{"ms": 30}, {"ms": 31}, {"ms": 32}, {"ms": 90}, {"ms": 12}, {"ms": 10}, {"ms": 11}]}`,
			[]MeasuredPlan{{PlanFields: PlanFields{TP: 1, PP: 1, DP: 2}, StepMs: 11, Run: &MeasuredRun{}}}, ""},
		{"a resumed run's one step", `{"config": {"tp": 1, "pp": 1, "dp": 2}, "carried_steps": 3, "steps": [{"ms": 30}, {"ms": 31}, {"ms": 32}, {"ms": 90}]}`, nil, "1 steps of its config's plan: at least 2"},
		{"carried past the steps", `{"config": {"tp": 1, "pp": 1, "dp": 2}, "carried_steps": 5, "steps": [{"ms": 30}, {"ms": 31}]}`, nil, "carried_steps 5 of 2 steps"},
		{"a run's metrics with no plan", `{"config": {}, "steps": [{"ms": 90}, {"ms": 12}]}`, nil, "config gives no tp"},
		{"a run's step without its time", `{"config": {"tp": 1, "pp": 1, "dp": 2}, "steps": [{"ms": 90}, {"loss": 2}]}`, nil, "steps[1] has no ms"},
		// A table's row whose description and fields disagree (an axis
		// left out, taken as 1) is not the plan that ran.
		{"a row without the axis its plan names", `{"plans": [{"plan": "tp=2 pp=2 dp=1 mb=4×2", "pp": 2, "dp": 1, "step_ms": 12}]}`, nil,
			`plan 1: its plan "tp=2 pp=2 dp=1 mb=4×2" says tp=2 and its tp field 1: give the fields of the plan that ran`},
		{"misspelt axis", `[{"tp": 1, "step_ms": 5}, {"tp": 1, "micro_batch_size": 2, "step_ms": 5}]`, nil,
			`plan 2: unknown key "micro_batch_size"`},
		{"negative axis", `[{"tp": -1, "step_ms": 5}]`, nil, "plan 1: tp must not be negative, got -1"},
		{"negative batch", `{"plans": [{"tp": 1, "batch": -8, "step_ms": 5}]}`, nil, "plan 1: batch must not be negative, got -8"},
		{"a time with no plan", `[{"tp": 1, "step_ms": 5}, {"rank": 2, "step_ms": 5}]`, nil, "plan 2: a step_ms with no plan: give the tp, pp and dp it ran with"},
		{"a plan of defaults", `[{"microbatches": 4, "step_ms": 7}]`, []MeasuredPlan{{PlanFields: PlanFields{Microbatches: 4}, StepMs: 7}}, ""},
		{"a key twice", `[{"tp": 1, "tp": 2, "step_ms": 5}]`, nil, `plan 1: key "tp" given twice`},
		{"axes past any machine", `[{"tp": 1048576, "dp": 1048576, "step_ms": 5}]`, nil, "plan 1: dp = 1048576 makes more than 1048576 devices"},
		{"microbatches past a program", `[{"dp": 4, "microbatches": 4611686018427387904, "step_ms": 12}]`, nil, "plan 1: microbatches 4611686018427387904: past the 16384"},
		{"a batch that overflows", `[{"dp": 4, "microbatch_size": 4611686018427387904, "microbatches": 1, "step_ms": 12}]`, nil, "plan 1: microbatch_size × microbatches × dp·ep is past 1073741824 sequences"},
		{"time as a string", `[{"tp": 1, "step_ms": 5}, {"tp": 1, "step_ms": "NaN"}]`, nil, "plan 2: step_ms is a JSON string, want a number"},
		{"an axis as a string", `[{"tp": "2", "step_ms": 5}]`, nil, "plan 1: tp is a JSON string, want a whole number"},
		{"a number for a plan", `[1, 2]`, nil, "plan 1: not a JSON object but 1"},
		{"a run's negative step", `{"config": {"tp": 1, "pp": 1, "dp": 2}, "steps": [{"ms": 90}, {"ms": -5}]}`, nil, "steps[1].ms must be a positive time, got -5"},
		{"a model that is a string", `{"plans": [{"tp": 1, "step_ms": 5}], "model": "x"}`, nil, "model is a JSON string, want a JSON object"},
		{"a fraction of an axis", `[{"tp": 2.5, "step_ms": 5}]`, nil, "plan 1: tp is 2.5, want a whole number"},
		{"an axis past int64", `[{"tp": 99999999999999999999, "step_ms": 5}]`, nil, "plan 1: tp: 99999999999999999999 is out of range of a whole number"},
		{"a flag as a number", `[{"tp": 2, "sequence_parallel": 1, "step_ms": 5}]`, nil, "plan 1: sequence_parallel is a JSON number, want true or false"},
		{"a run's axis as a string", `{"config": {"tp": "1", "pp": 1, "dp": 2}, "steps": [{"ms": 90}, {"ms": 12}]}`, nil, "config: tp is a JSON string, want a whole number"},
		{"time out of range", `[{"tp": 1, "step_ms": 1e400}]`, nil, "plan 1: step_ms: 1e400 is out of range of a number"},
		{"negative time", `[{"tp": 1, "step_ms": -3}]`, nil, "plan 1: step_ms must be a positive time, got -3"},
		{"null time", `[{"tp": 1, "step_ms": null}]`, nil, "plan 1: step_ms is null: give the step time you measured"},
		{"no time", `{"plans": [{"tp": 1}]}`, nil, "no plan in it has a step_ms: add the step time you measured"},
		{"rows not run", `{"plans": [{"tp": 1, "predicted_step_ms": 9}, {"tp": 2, "predicted_step_ms": 8, "step_ms": 12}, {"tp": 4}]}`,
			[]MeasuredPlan{{PlanFields: PlanFields{TP: 2}, StepMs: 12}}, ""},
		{"a bad time names its row", `[{"tp": 1}, {"tp": 2, "step_ms": 0}]`, nil, "plan 2: step_ms must be a positive time, got 0"},
		{"a negative axis names its row", `[{"tp": 1}, {"tp": -2, "step_ms": 4}]`, nil, "plan 2: tp must not be negative"},
		{"batch and microbatches disagree", `[{"dp": 4, "microbatch_size": 3, "microbatches": 1, "batch": 8, "step_ms": 100}]`, nil, "plan 1: microbatch_size 3 × microbatches 1 × dp·ep 4 is 12 sequences a step, and its batch 8: give the fields of the plan that ran"},
		{"entry not an object", `[5]`, nil, "plan 1: not a JSON object"},
		{"empty list", `[]`, nil, "no measured plans"},
		{"empty object", `{}`, nil, "no measured plans (want a list"},
		{"one warm-up step", `{"config": {"tp": 1, "pp": 1, "dp": 1}, "steps": [{"ms": 90}]}`, nil, "at least 2 are needed"},
		{"not JSON", `NaN`, nil, "not a JSON list or object"},
		{"empty", "", nil, "the file is empty"},
		{"white space", " \n\t", nil, "the file is empty"},
		{"byte-order mark", "\xef\xbb\xbf[]", nil, "the file starts with a UTF-8 byte-order mark"},
		{"a run's config of another type", `{"config": [1], "steps": [{"ms": 1}, {"ms": 2}]}`, nil, "config is a JSON array, want a JSON object"},
		{"a run's precision of another type", `{"config": {"tp": 1, "pp": 1, "dp": 1, "precision": 5}, "steps": [{"ms": 1}, {"ms": 2}]}`, nil, "config.precision is a JSON number, want a string"},
		{"truncated", `[{"tp": 1,`, nil, "the JSON ends before it is complete (is the file cut short?)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "m.json")
			require.NoError(t, os.WriteFile(f, []byte(tc.body), 0o644))
			got, err := ReadMeasured(f)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				assert.Contains(t, err.Error(), f, "the error names the file")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// FuzzReadMeasured feeds arbitrary files to ReadMeasured. Properties: it
// never panics, every error names the file, and every plan it accepts has
// a positive, finite step time and no negative axis.
func FuzzReadMeasured(f *testing.F) {
	for _, seed := range []string{
		`[{"tp": 2, "pp": 1, "dp": 4, "microbatches": 2, "step_ms": 10}]`,
		`{"plans": [{"rank": 1, "tp": 2, "comm_ms": {"tp": 1}, "step_ms": 12, "batch": 8}]}`,
		`{"config": {"tp": 1, "pp": 1, "dp": 2}, "steps": [{"ms": 90}, {"ms": 12}, {"ms": 10}]}`,
		`[{"tp": -1, "step_ms": 5}]`, `[{"step_ms": 1e308}]`, `[null]`, `{"plans": null}`, ` [] `, `{"config": {}, "steps": [{}, {}]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		path := filepath.Join(t.TempDir(), "m.json")
		require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
		ps, err := ReadMeasured(path)
		if err != nil {
			require.Contains(t, err.Error(), path)
			return
		}
		require.NotEmpty(t, ps)
		for i, p := range ps {
			require.Truef(t, p.StepMs > 0 && !math.IsInf(p.StepMs, 0), "plan %d: step_ms %g", i+1, p.StepMs)
			for _, v := range []int{p.TP, p.PP, p.DP, p.EP, p.CP, p.VPP, p.MicroBatch, p.Microbatches, p.Zero, p.Batch} {
				require.GreaterOrEqual(t, v, 0, "plan %d: %+v", i+1, p)
			}
		}
	})
}

// A run's metrics calibrate only the model that ran: the same parameter
// count is not enough (a Llama at seq 64 and at seq 32 has the same), so
// its --set must be this command's, key by key.
func TestMeasuredRunIsThisModel(t *testing.T) {
	run := &MeasuredRun{Params: 1000, Precision: "bf16", Set: "layers=2,hidden=32"}
	require.NoError(t, run.Check(1000, "bf16", "hidden=32, layers=2"))
	for _, c := range []struct{ set, want string }{
		{"layers=2,hidden=32,seq=32", "seq=32 here, not given to the run"},
		{"layers=2,hidden=64", "hidden=32 ran, hidden=64 here"},
		{"layers=2", "hidden=32 ran, not given here"},
	} {
		err := run.Check(1000, "bf16", c.set)
		require.Error(t, err, c.set)
		assert.Contains(t, err.Error(), c.want)
		assert.Contains(t, err.Error(), `calibrate with the --set that ran, "layers=2,hidden=32"`)
	}
	err := run.Check(999, "bf16", "layers=2,hidden=32")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a model of 1000 parameters")
}

// A measured row that gives its microbatch size and not the count is
// named by the plan it prices: 8 sequences over dp 4 in microbatches of
// 1 is mb=1×2 (it was named mb=2×1, the count before the size applied).
func TestMeasuredPlanIsNamedAsPriced(t *testing.T) {
	base := baseConfig(4, 8)
	base.Model = "model.go"
	pts, err := stepPoints(base, []MeasuredPlan{{PlanFields: PlanFields{TP: 1, PP: 1, DP: 4, MicroBatch: 1}, StepMs: 10}},
		func(compile.Config) (func(*cost.Hardware) (float64, error), error) {
			return func(*cost.Hardware) (float64, error) { return 0.01, nil }, nil
		})
	require.NoError(t, err)
	require.Len(t, pts, 1)
	assert.Contains(t, pts[0].Name, "mb=1×2")
}

// A measured plan's context-parallel layout is its own: a row of the
// --plan --metrics table gives it (cp_layout), and the plan priced for
// it is in that layout, not in the command line's default.
func TestMeasuredPlanKeepsItsCPLayout(t *testing.T) {
	base := baseConfig(4, 8)
	p := MeasuredPlan{PlanFields: PlanFields{TP: 1, PP: 2, DP: 1, CP: 2, CPImpl: "ring", CPLayout: "contiguous", MicroBatch: 4, Microbatches: 2}, StepMs: 10}
	c := p.Config(base)
	require.NoError(t, c.Validate())
	assert.Equal(t, "contiguous", c.CPLayout)
	row := fieldsOf(&Candidate{Config: c})
	assert.Equal(t, "contiguous", row.CPLayout, "a --plan --metrics row says the layout")
	raw, err := json.Marshal(row)
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"cp_layout":"contiguous"`)
}

// A measured plan's gradient reductions are its own too: a DeepSpeed run
// under fp16 reduced its fp16 gradients (grad_reduce_dtype), and the plan
// priced for it moves half the data-parallel bytes.
func TestMeasuredPlanKeepsItsGradReduceDType(t *testing.T) {
	base := baseConfig(2, 8)
	base.Precision = "fp16"
	p := MeasuredPlan{PlanFields: PlanFields{TP: 1, PP: 1, DP: 2, MicroBatch: 4, Microbatches: 1, GradReduceDType: "fp16"}, StepMs: 10}
	c := p.Config(base)
	require.NoError(t, c.Validate())
	assert.Equal(t, "fp16", c.GradReduceDType)
	assert.Equal(t, 2.0, planOf(c).GradReduceBytes)
	assert.Equal(t, "fp16", fieldsOf(&Candidate{Config: c}).GradReduceDType)
	p.GradReduceDType = ""
	assert.Equal(t, "fp32", fieldsOf(&Candidate{Config: p.Config(base)}).GradReduceDType, "left out: the command line's")
}
