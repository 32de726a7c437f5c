package passes_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/passes"
)

// TestAutodiffStopsWithoutGradient: a value with no gradient (an integer,
// a count) is a constant to autodiff, even when it is computed from a
// param: no VJP is asked of the ops on its path, no backward value of an
// integer dtype is made, and a param reaching the loss only through such
// a value gets a zero gradient.
func TestAutodiffStopsWithoutGradient(t *testing.T) {
	cases := []struct {
		name string
		// build returns the loss, after recording params x (and maybe
		// others) in order.
		build func(g *graph) *ir.Value
		// zero names the params whose gradient is the constant 0.
		zero []string
	}{
		{"int cast", func(g *graph) *ir.Value {
			// tanh(x)·f64(i32(x)): the rounded copy of x is a constant
			// factor, so the gradient is (1−tanh²x)·i32(x) alone; a
			// gradient through the casts would add tanh(x).
			x := g.param("x", normal(1), 3, 4)
			rounded := g.op("cast", ir.Attrs{"to": "f64"}, g.op("cast", ir.Attrs{"to": "i32"}, x))
			return sum(g, g.op("mul", nil, g.op("tanh", nil, x), rounded))
		}, nil},
		{"embedding of ids computed from a param", func(g *graph) *ir.Value {
			table := g.param("table", normal(1), 5, 4)
			x := g.param("x", uniform(0, 5), 3)
			_ = table
			return sum(g, g.op("embedding", nil, table, g.op("cast", ir.Attrs{"to": "i32"}, x)))
		}, []string{"x"}},
		{"count", func(g *graph) *ir.Value {
			// nonfinite_count has no VJP; it needs none.
			x := g.param("x", normal(1), 3, 4)
			return g.op("add", nil, sum(g, g.op("tanh", nil, x)), g.op("nonfinite_count", nil, x))
		}, nil},
		{"integer result of an op without a VJP", func(g *graph) *ir.Value {
			// embedding_grad is made after autodiff and has no VJP, but
			// its ids carry no gradient and its dy is not from a param.
			x := g.param("x", uniform(0, 5), 3)
			w := g.param("w", normal(1), 5, 4)
			dy := g.input("dy", normal(1), 3, 4)
			ids := g.op("cast", ir.Attrs{"to": "i32"}, x)
			return g.op("add", nil, sum(g, g.op("embedding_grad", ir.Attrs{"vocab": 5}, ids, dy)), sum(g, w))
		}, []string{"x"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGraph(t, uint64(300+i))
			g.m.SetOutput(ir.OutputLoss, c.build(g))
			opts := passes.DefaultOptions()
			opts.Verify = true
			opts.StopAfter = "autodiff"
			_, err := passes.Run(g.m, opts, passes.Hooks{})
			require.NoError(t, err)
			for _, v := range g.m.Values {
				if v.Meta.Phase == ir.PhaseBwd {
					assert.True(t, v.Type.DType.IsFloat(), "backward value %s %s is %v", v.Ref(), v.Op, v.Type)
				}
			}
			for _, name := range g.params {
				grad := g.m.Output(passes.GradPrefix + name)
				require.NotNil(t, grad, "grad/%s", name)
				isZero := grad.Op == "const" && grad.Attrs.Float("value", 1) == 0
				assert.Equal(t, contains(c.zero, name), isZero, "grad/%s is %s", name, grad.Op)
			}
		})
	}
}

// TestAutodiffRefusesOpMadeLater: an op that has a derivative but no VJP
// (one the passes make after autodiff) is an error on the loss's path,
// not a constant, and the error says why there is no VJP.
func TestAutodiffRefusesOpMadeLater(t *testing.T) {
	g := newGraph(t, 400)
	x := g.param("x", normal(1), 3)
	g.m.SetOutput(ir.OutputLoss, g.op("sum_squares", nil, x))
	opts := passes.DefaultOptions()
	opts.StopAfter = "autodiff"
	_, err := passes.Run(g.m, opts, passes.Hooks{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "op sum_squares has no VJP")
	assert.Contains(t, err.Error(), "after autodiff")
}

// sum reduces every dim of v.
func sum(g *graph, v *ir.Value) *ir.Value {
	return g.op("reduce_sum", ir.Attrs{"axes": allAxes(v.Type.Rank())}, v)
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}
