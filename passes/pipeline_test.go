package passes_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/passes"
)

// tableNames is the pass table's names in order. Tests build the lists of
// passes they expect from it (through, passesBefore, passesAfter, between, without) and find
// results by name (indexOf), so a new pass needs no edits beyond what it
// really changes.
var tableNames = passNames(passes.Table())

// knownOrder is the relative order of the passes these tests know; the
// table may hold others between them.
var knownOrder = []string{"verify-input", "pipeline-split", "autodiff", "microbatch", "optimizer", "shard", "redistribute", "data-parallel"}

func passNames(ps []passes.Pass) []string {
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	return names
}

// tableIndex is the position of pass name in the table; it panics on a
// name the table lacks, so a typo fails loudly.
func tableIndex(name string) int {
	i := slices.Index(tableNames, name)
	if i < 0 {
		panic(fmt.Sprintf("pass %q is not in the table %v", name, tableNames))
	}
	return i
}

// through is the table's names up to and including name.
func through(name string) []string { return slices.Clone(tableNames[:tableIndex(name)+1]) }

// passesBefore is the table's names up to name, without it.
func passesBefore(name string) []string { return slices.Clone(tableNames[:tableIndex(name)]) }

// passesAfter is the table's names after name.
func passesAfter(name string) []string { return slices.Clone(tableNames[tableIndex(name)+1:]) }

// between is the table's names after from, up to and including to.
func between(from, to string) []string {
	return slices.Clone(tableNames[tableIndex(from)+1 : tableIndex(to)+1])
}

// without is names less the ones given.
func without(names []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(drop, n) })
}

// indexOf is the position of pass name in the results of a Run; it fails
// the test when the pass has no result.
func indexOf(t testing.TB, res []passes.Result, name string) int {
	t.Helper()
	i := slices.IndexFunc(res, func(r passes.Result) bool { return r.Name == name })
	require.GreaterOrEqual(t, i, 0, "no result for pass %q in %v", name, resultNames(res))
	return i
}

// changedOnOneDevice is which passes change a module compiled for one
// device: autodiff and the optimizer add to the graph; every other pass
// (verify-input only checks; pipeline-split, shard, redistribute and
// data-parallel have nothing to cut or place) leaves it as it is.
func changedOnOneDevice() map[string]bool {
	want := map[string]bool{}
	for _, n := range tableNames {
		want[n] = false
	}
	want["autodiff"] = true
	want["optimizer"] = true
	return want
}

// optionalPasses may be disabled: nothing later depends on what they add.
var optionalPasses = map[string]bool{"data-parallel": true}

func tinyGPT(t *testing.T) *ir.Module {
	m, err := frontend.Build(gpt.Model, frontend.Config{
		Name:  "gpt",
		Batch: 2,
		Set:   map[string]string{"layers": "2", "hidden": "8", "heads": "2", "seq": "4", "vocab": "16"},
	})
	require.NoError(t, err)
	return m
}

func resultNames(rs []passes.Result) []string {
	var names []string
	for _, r := range rs {
		names = append(names, r.Name)
	}
	return names
}

func TestTable(t *testing.T) {
	table := passes.Table()
	names := passNames(table)
	require.Equal(t, "verify-input", names[0], "the input is checked before anything else")
	seen := map[string]bool{}
	for _, n := range names {
		assert.False(t, seen[n], "%s appears twice", n)
		seen[n] = true
	}
	var known []string
	for _, n := range names {
		if slices.Contains(knownOrder, n) {
			known = append(known, n)
		}
	}
	require.Equal(t, knownOrder, known, "every known pass is in the table, in this order")
	assert.Less(t, tableIndex("verify-input"), tableIndex("pipeline-split"))
	assert.Less(t, tableIndex("pipeline-split"), tableIndex("autodiff"), "backward values take the chunk of the forward value")
	for _, p := range table {
		assert.NotNil(t, p.Fn, p.Name)
		assert.NotEmpty(t, p.Doc, p.Name)
		if optionalPasses[p.Name] {
			assert.False(t, p.Required, "%s is optional", p.Name)
		} else {
			assert.True(t, p.Required, "%s is required by the later passes or the runtime", p.Name)
		}
	}
	// Table hands out a copy.
	table[0].Name = "changed"
	assert.Equal(t, "verify-input", passes.Table()[0].Name)
}

func TestRunRejectsBadOptions(t *testing.T) {
	cases := []struct {
		name     string
		set      func(o *passes.Options)
		is       error
		contains string
	}{
		{"disable verify-input", func(o *passes.Options) { o.Disable = []string{"verify-input"} }, passes.ErrDisabledRequired, `"verify-input"`},
		{"disable pipeline-split", func(o *passes.Options) { o.Disable = []string{"pipeline-split"} }, passes.ErrDisabledRequired, `"pipeline-split"`},
		{"disable autodiff", func(o *passes.Options) { o.Disable = []string{"autodiff"} }, passes.ErrDisabledRequired, `"autodiff"`},
		{"disable optimizer", func(o *passes.Options) { o.Disable = []string{"optimizer"} }, passes.ErrDisabledRequired, `"optimizer"`},
		{"disable shard", func(o *passes.Options) { o.Disable = []string{"shard"} }, passes.ErrDisabledRequired, `"shard"`},
		{"disable redistribute", func(o *passes.Options) { o.Disable = []string{"data-parallel", "redistribute"} }, passes.ErrDisabledRequired, `"redistribute"`},
		{"disable unknown", func(o *passes.Options) { o.Disable = []string{"fuse-everything"} }, nil, `unknown pass "fuse-everything"`},
		{"stop after unknown", func(o *passes.Options) { o.StopAfter = "autodif" }, nil, `unknown pass "autodif"`},
		{"unknown optimizer", func(o *passes.Options) { o.Optimizer = "lion" }, nil, `"lion"`},
		{"beta1 = 1", func(o *passes.Options) { o.Beta1 = 1 }, nil, "betas"},
		{"negative beta2", func(o *passes.Options) { o.Beta2 = -0.1 }, nil, "betas"},
		{"zero eps", func(o *passes.Options) { o.Eps = 0 }, nil, "eps"},
		{"negative clip", func(o *passes.Options) { o.ClipNorm = -1 }, nil, "clip"},
		{"negative weight decay", func(o *passes.Options) { o.WeightDecay = -0.1 }, nil, "weight decay"},
		{"unknown reduction format", func(o *passes.Options) { o.GradReduceDType = "fp8" }, nil, `--grad-reduce-dtype "fp8"`},
		{"16-bit reductions without data-parallel", func(o *passes.Options) {
			o.GradReduceDType, o.Disable = "bf16", []string{"data-parallel"}
		}, nil, "--grad-reduce-dtype bf16: the data-parallel pass narrows the reductions, and it is disabled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := passes.DefaultOptions()
			c.set(opts)
			m := buildOptModel(t)
			before := ir.Print(m)
			res, err := passes.Run(m, opts, passes.Hooks{Before: func(*ir.Module) { t.Error("Before hook called for rejected options") }})
			require.Error(t, err)
			if c.is != nil {
				assert.ErrorIs(t, err, c.is)
			} else {
				assert.NotErrorIs(t, err, passes.ErrDisabledRequired)
			}
			assert.Contains(t, err.Error(), c.contains)
			assert.Empty(t, res)
			assert.Equal(t, before, ir.Print(m), "rejected options must leave the module alone")
		})
	}
	require.NoError(t, passes.DefaultOptions().Validate())
}

func TestRunResults(t *testing.T) {
	m := buildOptModel(t)
	opts := passes.DefaultOptions()
	opts.Verify = true
	var before int
	var after []passes.Result
	hooks := passes.Hooks{
		Before: func(*ir.Module) { before++ },
		After:  func(r passes.Result, m *ir.Module) { after = append(after, r); assert.True(t, m.HasRun(r.Name)) },
	}
	res, err := passes.Run(m, opts, hooks)
	require.NoError(t, err)
	assert.Equal(t, tableNames, resultNames(res))
	assert.Equal(t, tableNames, m.Passes)
	assert.Equal(t, 1, before)
	assert.Equal(t, res, after, "After sees every pass that ran")
	changed := map[string]bool{}
	for _, r := range res {
		assert.Empty(t, r.Skipped, r.Name)
		assert.GreaterOrEqual(t, r.Ms, 0.0)
		changed[r.Name] = r.Changed
	}
	// verify-input only checks; autodiff and the optimizer add to the graph;
	// on one device (no mesh) pipeline-split, shard, redistribute and
	// data-parallel do nothing.
	assert.Equal(t, changedOnOneDevice(), changed)
	assert.Nil(t, m.Mesh, "one device: shard leaves the module without a mesh")
	for _, v := range m.Values {
		assert.Nil(t, v.Place, "one device: %s is not placed", v.Where())
	}

	// Running a finished module again does nothing.
	text := ir.Print(m)
	after = nil
	res, err = passes.Run(m, opts, hooks)
	require.NoError(t, err)
	assert.Equal(t, tableNames, resultNames(res))
	for _, r := range res {
		assert.Equal(t, "already applied", r.Skipped, r.Name)
		assert.False(t, r.Changed, r.Name)
	}
	assert.Empty(t, after)
	assert.Equal(t, text, ir.Print(m))
}

func TestRunStopAfter(t *testing.T) {
	cases := []struct {
		stopAfter string
		applied   []string // passes already recorded in the module
		wantRun   []string // passes that run
	}{
		{"", nil, tableNames},
		{tableNames[len(tableNames)-1], nil, tableNames},
		{"data-parallel", nil, through("data-parallel")},
		{"optimizer", nil, through("optimizer")},
		{"autodiff", nil, through("autodiff")},
		{"pipeline-split", nil, through("pipeline-split")},
		{"verify-input", nil, []string{"verify-input"}},
		{"", through("verify-input"), passesAfter("verify-input")},
		{"autodiff", through("verify-input"), between("verify-input", "autodiff")},
		{"autodiff", through("pipeline-split"), between("pipeline-split", "autodiff")},
		{"redistribute", through("optimizer"), between("optimizer", "redistribute")},
		{"", through("shard"), passesAfter("shard")},
		// Stopping after a pass the module already has runs nothing more.
		{"autodiff", through("autodiff"), nil},
		{"verify-input", through("autodiff"), nil},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("stop=%q/applied=%v", c.stopAfter, c.applied), func(t *testing.T) {
			m := buildOptModel(t)
			if len(c.applied) > 0 {
				opts := passes.DefaultOptions()
				opts.StopAfter = c.applied[len(c.applied)-1]
				_, err := passes.Run(m, opts, passes.Hooks{})
				require.NoError(t, err)
				require.Equal(t, c.applied, m.Passes)
			}
			opts := passes.DefaultOptions()
			opts.Verify = true
			opts.StopAfter = c.stopAfter
			res, err := passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)
			var ran []string
			for _, r := range res {
				if r.Skipped == "" {
					ran = append(ran, r.Name)
				}
			}
			assert.Equal(t, c.wantRun, ran)
			assert.Equal(t, append(append([]string{}, c.applied...), c.wantRun...), m.Passes)
		})
	}
}

// TestRunResume: a module printed after autodiff and parsed back resumes
// with the optimizer alone and ends exactly where a straight run does.
func TestRunResume(t *testing.T) {
	models := []struct {
		name  string
		build func(t *testing.T) *ir.Module
	}{
		{"opt-f64", buildOptModel},
		{"gpt-f32", tinyGPT},
	}
	for _, mc := range models {
		t.Run(mc.name, func(t *testing.T) {
			opts := passes.DefaultOptions()
			opts.Verify = true

			straight := mc.build(t)
			_, err := passes.Run(straight, opts, passes.Hooks{})
			require.NoError(t, err)

			m := mc.build(t)
			stop := *opts
			stop.StopAfter = "autodiff"
			_, err = passes.Run(m, &stop, passes.Hooks{})
			require.NoError(t, err)
			text := ir.Print(m)
			resumed, err := ir.Parse(mc.name+".gir", text)
			require.NoError(t, err)
			require.Equal(t, text, ir.Print(resumed), "print/parse round trip")
			require.Equal(t, through("autodiff"), resumed.Passes)

			res, err := passes.Run(resumed, opts, passes.Hooks{})
			require.NoError(t, err)
			require.Equal(t, tableNames, resultNames(res))
			ad := indexOf(t, res, "autodiff")
			for _, r := range res[:ad+1] {
				assert.Equal(t, passes.Result{Name: r.Name, Skipped: "already applied"}, r)
			}
			mb := res[indexOf(t, res, "microbatch")]
			assert.Equal(t, passes.Result{Name: "microbatch", Ms: mb.Ms}, mb, "one microbatch: nothing to unroll")
			opt := indexOf(t, res, "optimizer")
			assert.Empty(t, res[opt].Skipped)
			assert.True(t, res[opt].Changed)
			changed := changedOnOneDevice()
			for _, r := range res[ad+1:] {
				assert.Empty(t, r.Skipped, r.Name)
				assert.Equal(t, changed[r.Name], r.Changed, "%s on one device", r.Name)
			}
			assert.Equal(t, tableNames, resumed.Passes)
			assert.Equal(t, ir.Print(straight), ir.Print(resumed))
			assert.Equal(t, straight.NextID(), resumed.NextID())
		})
	}
}

func TestRunRejectsForeignPassHistory(t *testing.T) {
	cases := []struct {
		name   string
		passes []string
	}{
		{"skips verify-input", []string{"autodiff"}},
		{"skips autodiff", without(through("optimizer"), "autodiff")},
		{"skips pipeline-split (a dump of a compiler without it)", without(through("autodiff"), "pipeline-split")},
		{"out of order", []string{"autodiff", "verify-input"}},
		{"unknown pass", []string{"verify-input", "fuse"}},
		{"skips to shard", []string{"verify-input", "shard"}},
		{"skips redistribute", without(tableNames, "redistribute")},
		{"skips microbatch", without(through("optimizer"), "microbatch")},
		{"longer than the table", append(append([]string{}, tableNames...), "fuse")},
		{"repeated", []string{"verify-input", "verify-input"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := buildOptModel(t)
			m.Passes = c.passes
			before := ir.Print(m)
			res, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "not a prefix")
			assert.Empty(t, res)
			assert.Equal(t, before, ir.Print(m))
		})
	}
}

func TestRunVerifyInput(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(m *ir.Module)
		rule    string
		want    string
	}{
		{"no loss", func(m *ir.Module) { m.Outputs = nil }, "", `no "loss" output`},
		{"wrong declared type", func(m *ir.Module) {
			for _, v := range m.Values {
				if v.Op == "matmul" {
					v.Type = ir.T(v.Type.DType, 7)
					return
				}
			}
		}, ir.RuleTypeMatch, "declared type"},
		{"unknown op", func(m *ir.Module) {
			for _, v := range m.Values {
				if v.Op == "tanh" {
					v.Op = "tanhh"
					return
				}
			}
		}, ir.RuleUnknownOp, "tanhh"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := buildOptModel(t)
			c.corrupt(m)
			res, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), `pass "verify-input"`)
			assert.Contains(t, err.Error(), c.want)
			if c.rule != "" {
				var ve *ir.VerifyError
				require.True(t, errors.As(err, &ve), "%v", err)
				assert.Equal(t, c.rule, ve.Rule)
			}
			assert.Equal(t, []string{"verify-input"}, resultNames(res))
			assert.Empty(t, m.Passes, "a failed pass is not recorded")
		})
	}
}
