package passes

import (
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

func TestCheckOrder(t *testing.T) {
	noop := func(*ir.Module, *Options) error { return nil }
	table := func(names ...string) []Pass {
		var ps []Pass
		for _, n := range names {
			ps = append(ps, Pass{Name: n, Fn: noop})
		}
		return ps
	}
	cases := []struct {
		name  string
		table []Pass
		rules []constraint
		want  string // "" means valid
	}{
		{"the compiler's table", passes[:], passOrder[:], ""},
		{"no rules", table("a", "b"), nil, ""},
		{"reversed", table("optimizer", "autodiff", "verify-input"), passOrder[:1],
			`"verify-input" must run before "autodiff" (autodiff assumes a well-typed forward graph)`},
		{"last two swapped", table("verify-input", "optimizer", "autodiff"), []constraint{{"autodiff", "optimizer", "the optimizer reads gradients"}},
			`"autodiff" must run before "optimizer" (the optimizer reads gradients)`},
		{"duplicate pass", table("verify-input", "autodiff", "verify-input", "optimizer"), passOrder[:],
			`"verify-input" appears twice`},
		{"rule names a missing pass", slices.DeleteFunc(slices.Clone(passes[:]), func(p Pass) bool { return p.Name == "microbatch" }), passOrder[:],
			`ordering rule "autodiff" before "microbatch" names a pass not in the table`},
		{"rule orders a pass before itself", table("a"), []constraint{{"a", "a", "never satisfiable"}},
			`"a" must run before "a" (never satisfiable)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := checkOrder(c.table, c.rules)
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// tableIndex is the position of pass name in the compiler's table.
func tableIndex(t testing.TB, name string) int {
	t.Helper()
	i := slices.IndexFunc(passes[:], func(p Pass) bool { return p.Name == name })
	require.GreaterOrEqual(t, i, 0, name)
	return i
}

// namesBefore is the table's pass names before name.
func namesBefore(t testing.TB, name string) []string {
	var names []string
	for _, p := range passes[:tableIndex(t, name)] {
		names = append(names, p.Name)
	}
	return names
}

// replacePass swaps the function of a pass in the compiler's table for the
// rest of the test.
func replacePass(t *testing.T, name string, fn func(*ir.Module, *Options) error) {
	i := tableIndex(t, name)
	saved := passes[i]
	passes[i].Fn = fn
	t.Cleanup(func() { passes[i] = saved })
}

// smallModule is loss = Σ tanh(x).
func smallModule(t *testing.T) *ir.Module {
	m := ir.NewModule("small")
	meta := ir.Meta{Layer: -1, Phase: ir.PhaseFwd, Stage: -1, Chunk: -1, Micro: -1}
	pos := ir.Pos{File: "small.go", Line: 1}
	x, err := m.AddSource("param", ir.T(ir.F32, 3), ir.Attrs{"name": "x", "init": "ones"}, meta, pos)
	require.NoError(t, err)
	y, err := m.Add("tanh", []*ir.Value{x}, nil, meta, pos)
	require.NoError(t, err)
	loss, err := m.Add("reduce_sum", []*ir.Value{y}, ir.Attrs{"axes": []int{0}}, meta, pos)
	require.NoError(t, err)
	m.SetOutput("loss", loss)
	return m
}

func TestRunReportsPanics(t *testing.T) {
	cases := []struct {
		pass  string
		fn    func(*ir.Module, *Options) error
		wants []string
	}{
		{"autodiff", func(*ir.Module, *Options) error { panic("boom") },
			[]string{`panic during pass "autodiff"`, `compiling "small"`, "boom"}},
		{"optimizer", func(m *ir.Module, _ *Options) error {
			_ = m.Values[len(m.Values)+1] // index out of range
			return nil
		}, []string{`panic during pass "optimizer"`, "index out of range"}},
		{"verify-input", func(*ir.Module, *Options) error {
			var m map[string]int
			m["x"] = 1 // nil map write
			return nil
		}, []string{`panic during pass "verify-input"`, "nil map"}},
	}
	for _, c := range cases {
		t.Run(c.pass, func(t *testing.T) {
			replacePass(t, c.pass, c.fn)
			m := smallModule(t)
			var seen []Result
			res, err := Run(m, DefaultOptions(), Hooks{After: func(r Result, _ *ir.Module) { seen = append(seen, r) }})
			require.Error(t, err)
			for _, w := range c.wants {
				assert.Contains(t, err.Error(), w)
			}
			require.NotEmpty(t, res)
			assert.Equal(t, c.pass, res[len(res)-1].Name, "the panicking pass is the last result")
			assert.Equal(t, res, seen, "After still sees the failed pass, for dumping")
			assert.False(t, m.HasRun(c.pass), "a pass that panicked is not recorded as applied")
		})
	}
}

func TestRunWrapsPassErrors(t *testing.T) {
	sentinel := errors.New("no can do")
	replacePass(t, "autodiff", func(*ir.Module, *Options) error { return sentinel })
	m := smallModule(t)
	res, err := Run(m, DefaultOptions(), Hooks{})
	require.Error(t, err)
	assert.ErrorIs(t, err, sentinel)
	assert.Contains(t, err.Error(), `pass "autodiff": no can do`)
	var names []string
	for _, r := range res {
		names = append(names, r.Name)
	}
	assert.Equal(t, append(namesBefore(t, "autodiff"), "autodiff"), names, "the pipeline stops at the failing pass")
	assert.Equal(t, namesBefore(t, "autodiff"), m.Passes, "the failing pass is not recorded")
}

// TestRunVerifiesAfterEachPass: with Verify set, a pass that leaves broken
// IR is caught right after it, naming it; without Verify it is not.
func TestRunVerifiesAfterEachPass(t *testing.T) {
	corrupt := func(m *ir.Module, _ *Options) error {
		for _, v := range m.Values {
			if v.Op == "tanh" {
				v.Type = ir.T(ir.F32, 4) // declared type no longer follows from the arg
			}
		}
		return nil
	}
	for _, verify := range []bool{true, false} {
		t.Run(map[bool]string{true: "verify", false: "no-verify"}[verify], func(t *testing.T) {
			replacePass(t, "autodiff", corrupt)
			replacePass(t, "optimizer", func(*ir.Module, *Options) error { return nil })
			m := smallModule(t)
			opts := DefaultOptions()
			opts.Verify = verify
			res, err := Run(m, opts, Hooks{})
			if !verify {
				require.NoError(t, err)
				assert.Len(t, res, len(passes))
				return
			}
			require.Error(t, err)
			var ve *ir.VerifyError
			require.True(t, errors.As(err, &ve), "%v", err)
			assert.Equal(t, "autodiff", ve.Pass)
			assert.Equal(t, ir.RuleTypeMatch, ve.Rule)
			assert.Contains(t, err.Error(), `after pass "autodiff"`)
			assert.Len(t, res, tableIndex(t, "autodiff")+1, "the pipeline stops at the pass that broke the module")
			assert.Equal(t, "autodiff", res[len(res)-1].Name)
		})
	}
}
