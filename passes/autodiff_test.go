package passes_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// tolerance says how a finite-difference check is taken and judged: central
// differences with step h, and |autodiff − fd| ≤ atol + rtol·|fd|.
type tolerance struct {
	h, atol, rtol float64
}

// defaultTol suits float64 end to end: with h = 1e-6 the rounding error of
// a central difference is about 1e-16·|loss|/h ≈ 1e-9 and the truncation
// error about h²·f‴ ≈ 1e-12, both far below 1e-6.
var defaultTol = tolerance{h: 1e-6, atol: 1e-6, rtol: 1e-6}

// dist draws n initial values for a param or input.
type dist func(r *rand.Rand, n int) []float64

func normal(std float64) dist {
	return func(r *rand.Rand, n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = r.NormFloat64() * std
		}
		return x
	}
}

func uniform(lo, hi float64) dist {
	return func(r *rand.Rand, n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = lo + (hi-lo)*r.Float64()
		}
		return x
	}
}

// awayFromZero draws ±[lo, hi): relu's kink and division by ~0 stay out of reach.
func awayFromZero(lo, hi float64) dist {
	return func(r *rand.Rand, n int) []float64 {
		x := uniform(lo, hi)(r, n)
		for i := range x {
			if r.IntN(2) == 0 {
				x[i] = -x[i]
			}
		}
		return x
	}
}

// distinct draws values at least 0.06 apart, so no perturbation by h can
// create or break a tie of reduce_max.
func distinct(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i, p := range r.Perm(n) {
		x[i] = float64(p-n/2)*0.1 + 0.02*(r.Float64()-0.5)
	}
	return x
}

// around shifts a distribution: LayerNorm gains near 1.
func around(c float64, d dist) dist {
	return func(r *rand.Rand, n int) []float64 {
		x := d(r, n)
		for i := range x {
			x[i] += c
		}
		return x
	}
}

// graph records a module straight in IR, so every op (also those the DSL
// does not expose, like slice_grad or a param as scale factor) can be
// placed between params and the loss.
type graph struct {
	t      *testing.T
	m      *ir.Module
	rng    *rand.Rand
	floats map[string][]float64 // initial values of params and float inputs
	ints   map[string][]int32
	params []string
}

var fwdMeta = ir.Meta{Layer: -1, Phase: ir.PhaseFwd, Stage: -1, Chunk: -1, Micro: -1}

func newGraph(t *testing.T, seed uint64) *graph {
	return &graph{
		t:      t,
		m:      ir.NewModule("gradcheck"),
		rng:    rand.New(rand.NewPCG(seed, 0x5eed)),
		floats: map[string][]float64{},
		ints:   map[string][]int32{},
	}
}

func (g *graph) pos() ir.Pos { return ir.Pos{File: "autodiff_test.go", Line: len(g.m.Values) + 1} }

func (g *graph) source(op, name string, t ir.Type) *ir.Value {
	v, err := g.m.AddSource(op, t, ir.Attrs{"name": name}, fwdMeta, g.pos())
	require.NoError(g.t, err)
	return v
}

// param declares an f64 param drawn from d.
func (g *graph) param(name string, d dist, shape ...int) *ir.Value {
	v := g.source("param", name, ir.T(ir.F64, shape...))
	g.floats[name] = d(g.rng, int(v.Type.Shape.NumElements()))
	g.params = append(g.params, name)
	return v
}

// input declares an f64 input drawn from d (not differentiated).
func (g *graph) input(name string, d dist, shape ...int) *ir.Value {
	v := g.source("input", name, ir.T(ir.F64, shape...))
	g.floats[name] = d(g.rng, int(v.Type.Shape.NumElements()))
	return v
}

// ids declares an i32 input holding ids.
func (g *graph) ids(name string, ids []int32, shape ...int) *ir.Value {
	v := g.source("input", name, ir.T(ir.I32, shape...))
	require.Len(g.t, ids, int(v.Type.Shape.NumElements()))
	g.ints[name] = ids
	return v
}

func (g *graph) op(op string, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
	v, err := g.m.Add(op, args, attrs, fwdMeta, g.pos())
	require.NoError(g.t, err)
	return v
}

func allAxes(rank int) []int {
	axes := make([]int, rank)
	for i := range axes {
		axes[i] = i
	}
	return axes
}

// weightedLoss makes the loss Σ out ⊙ R with R a fixed random input, so
// the gradient reaching out is dense and different in every element.
func (g *graph) weightedLoss(out *ir.Value) {
	require.Equal(g.t, ir.F64, out.Type.DType, "the checked value must be f64")
	r := g.input("fd.r", normal(1), out.Type.Shape...)
	loss := g.op("mul", nil, out, r)
	if out.Type.Rank() > 0 {
		loss = g.op("reduce_sum", ir.Attrs{"axes": allAxes(out.Type.Rank())}, loss)
	}
	g.m.SetOutput("loss", loss)
}

// device differentiates the module (the pipeline up to autodiff, verifying
// after every pass), lowers it and loads it with the recorded values.
func (g *graph) device() *cpu.Device {
	return loadGradDevice(g.t, g.m, g.floats, g.ints)
}

func loadGradDevice(t *testing.T, m *ir.Module, floats map[string][]float64, ints map[string][]int32) *cpu.Device {
	t.Helper()
	opts := passes.DefaultOptions()
	opts.Verify = true
	opts.StopAfter = "autodiff"
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	dev, err := cpu.Load(prog, cpu.Options{})
	require.NoError(t, err)
	for name, x := range floats {
		require.NoError(t, dev.SetFloat64s(name, x))
	}
	for name, x := range ints {
		require.NoError(t, dev.SetInt32(name, x))
	}
	return dev
}

// checkGradients runs one step and compares every grad/<param> with
// central differences of the loss, perturbing one element at a time and
// re-running only the forward. pick chooses the elements of a param (nil:
// all). It returns the autodiff gradients.
func checkGradients(t *testing.T, dev *cpu.Device, params []string, pick func(name string, n int) []int, tol tolerance) map[string][]float64 {
	t.Helper()
	require.NoError(t, dev.Step())
	loss0, err := dev.Scalar("loss")
	require.NoError(t, err)
	require.False(t, math.IsNaN(loss0) || math.IsInf(loss0, 0), "loss is %v", loss0)

	lossAt := func(name string, x []float64) float64 {
		require.NoError(t, dev.SetFloat64s(name, x))
		require.NoError(t, dev.Forward())
		l, err := dev.Scalar("loss")
		require.NoError(t, err)
		return l
	}
	// Read every gradient before any Forward: the forward's temporaries
	// may reuse the bytes of the gradient outputs.
	grads := map[string][]float64{}
	for _, name := range params {
		grad, err := dev.Float64s(passes.GradPrefix + name)
		require.NoError(t, err)
		grads[name] = grad
	}
	for _, name := range params {
		grad := grads[name]
		x, err := dev.Float64s(name)
		require.NoError(t, err)
		require.Len(t, grad, len(x), "grad/%s", name)

		idx := allAxes(len(x)) // 0…n−1: every element
		if pick != nil {
			idx = pick(name, len(x))
		}
		var bad []string
		for _, i := range idx {
			orig := x[i]
			x[i] = orig + tol.h
			lp := lossAt(name, x)
			x[i] = orig - tol.h
			lm := lossAt(name, x)
			x[i] = orig
			fd := (lp - lm) / (2 * tol.h)
			if d := math.Abs(grad[i] - fd); !(d <= tol.atol+tol.rtol*math.Abs(fd)) {
				bad = append(bad, fmt.Sprintf("[%d]: autodiff %.12g, finite difference %.12g (|diff| %.3g)", i, grad[i], fd, d))
			}
		}
		require.NoError(t, dev.SetFloat64s(name, x))
		assert.Emptyf(t, bad[:min(len(bad), 8)], "%d of %d checked elements of grad/%s disagree", len(bad), len(idx), name)
	}
	// Back at the unperturbed point, the forward alone reproduces the loss.
	require.NoError(t, dev.Forward())
	loss1, err := dev.Scalar("loss")
	require.NoError(t, err)
	assert.Equal(t, loss0, loss1, "Forward and Step disagree on the loss")
	return grads
}

func maxAbs(x []float64) float64 {
	m := 0.0
	for _, v := range x {
		m = math.Max(m, math.Abs(v))
	}
	return m
}

// gradCase checks the VJP of op: build records params, then op (and maybe
// ops around it) and returns the value whose weighted sum is the loss.
type gradCase struct {
	name  string
	op    string
	build func(g *graph) *ir.Value
	tol   tolerance // zero: defaultTol
}

func unary(op string, d dist) gradCase {
	return gradCase{name: op, op: op, build: func(g *graph) *ir.Value {
		return g.op(op, nil, g.param("x", d, 3, 4))
	}}
}

func binary(op string, da, db dist) gradCase {
	return gradCase{name: op, op: op, build: func(g *graph) *ir.Value {
		return g.op(op, nil, g.param("a", da, 3, 4), g.param("b", db, 3, 4))
	}}
}

// matmulCases covers every transA/transB combination for plain, batched
// (batched B) and shared-B (batched A with a 2-D B) products.
func matmulCases() []gradCase {
	const m, k, n = 3, 4, 5
	layouts := []struct {
		name           string
		aBatch, bBatch []int
	}{
		{"2d", nil, nil},
		{"batched", []int{2}, []int{2}},
		{"batched-rank4", []int{2, 3}, []int{2, 3}},
		{"sharedB", []int{2}, nil},
		{"sharedB-rank4", []int{3, 2}, nil},
	}
	var cases []gradCase
	for _, l := range layouts {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				aShape := append(slices.Clone(l.aBatch), m, k)
				if ta {
					aShape = append(slices.Clone(l.aBatch), k, m)
				}
				bShape := append(slices.Clone(l.bBatch), k, n)
				if tb {
					bShape = append(slices.Clone(l.bBatch), n, k)
				}
				attrs := ir.Attrs{}
				if ta {
					attrs["transA"] = true
				}
				if tb {
					attrs["transB"] = true
				}
				cases = append(cases, gradCase{
					name: fmt.Sprintf("matmul/%s/transA=%v,transB=%v", l.name, ta, tb),
					op:   "matmul",
					build: func(g *graph) *ir.Value {
						return g.op("matmul", attrs.Clone(), g.param("a", normal(1), aShape...), g.param("b", normal(1), bShape...))
					},
				})
			}
		}
	}
	return cases
}

func reduceCases(op string) []gradCase {
	d := normal(1)
	if op == "reduce_max" {
		d = distinct
	}
	var cases []gradCase
	for _, c := range []struct {
		axes     []int
		keepdims bool
	}{
		{[]int{1}, false},
		{[]int{1}, true},
		{[]int{0, 2}, false},
		{[]int{0, 2}, true},
		{[]int{2}, true},
		{[]int{0, 1, 2}, false},
		{[]int{0, 1, 2}, true},
	} {
		cases = append(cases, gradCase{
			name: fmt.Sprintf("%s/axes=%v,keepdims=%v", op, c.axes, c.keepdims),
			op:   op,
			build: func(g *graph) *ir.Value {
				attrs := ir.Attrs{"axes": slices.Clone(c.axes)}
				if c.keepdims {
					attrs["keepdims"] = true
				}
				return g.op(op, attrs, g.param("x", d, 2, 3, 4))
			},
		})
	}
	return cases
}

func gradCases() []gradCase {
	cases := []gradCase{
		binary("add", normal(1), normal(1)),
		binary("sub", normal(1), normal(1)),
		binary("mul", normal(1), normal(1)),
		binary("div", normal(1), awayFromZero(0.5, 2)),
		unary("neg", normal(1)),
		unary("exp", normal(1)),
		unary("log", uniform(0.3, 3)),
		unary("sqrt", uniform(0.3, 3)),
		unary("tanh", normal(1.5)),
		unary("gelu", normal(2)),
		unary("relu", awayFromZero(0.05, 2)),
		{name: "scale", op: "scale", build: func(g *graph) *ir.Value {
			// Both the tensor and the scalar factor are params.
			return g.op("scale", nil, g.param("x", normal(1), 3, 4), g.param("s", normal(1)))
		}},
		{name: "scale/const-factor", op: "scale", build: func(g *graph) *ir.Value {
			x := g.param("x", normal(1), 2, 3)
			s, err := g.m.AddSource("const", ir.T(ir.F64), ir.Attrs{"value": -1.75}, fwdMeta, g.pos())
			require.NoError(g.t, err)
			return g.op("scale", nil, x, s)
		}},
		{name: "reshape", op: "reshape", build: func(g *graph) *ir.Value {
			return g.op("reshape", ir.Attrs{"shape": []int{4, 6}}, g.param("x", normal(1), 2, 3, 4))
		}},
		{name: "reshape/then-op", op: "reshape", build: func(g *graph) *ir.Value {
			// A reshape is a view in lowering; make sure its gradient
			// flows through an op that reads the view.
			x := g.param("x", normal(1), 2, 6)
			return g.op("tanh", nil, g.op("reshape", ir.Attrs{"shape": []int{3, 2, 2}}, x))
		}},
		{name: "transpose/2d", op: "transpose", build: func(g *graph) *ir.Value {
			return g.op("transpose", ir.Attrs{"perm": []int{1, 0}}, g.param("x", normal(1), 3, 4))
		}},
		{name: "transpose/3d", op: "transpose", build: func(g *graph) *ir.Value {
			return g.op("transpose", ir.Attrs{"perm": []int{2, 0, 1}}, g.param("x", normal(1), 2, 3, 4))
		}},
		{name: "transpose/4d-heads", op: "transpose", build: func(g *graph) *ir.Value {
			return g.op("transpose", ir.Attrs{"perm": []int{0, 2, 1, 3}}, g.param("x", normal(1), 2, 3, 2, 2))
		}},
		{name: "slice/dim0", op: "slice", build: func(g *graph) *ir.Value {
			return g.op("slice", ir.Attrs{"dim": 0, "start": 1, "end": 3}, g.param("x", normal(1), 4, 3))
		}},
		{name: "slice/middle-dim", op: "slice", build: func(g *graph) *ir.Value {
			return g.op("slice", ir.Attrs{"dim": 1, "start": 1, "end": 4}, g.param("x", normal(1), 2, 5, 3))
		}},
		{name: "slice/last-dim", op: "slice", build: func(g *graph) *ir.Value {
			return g.op("slice", ir.Attrs{"dim": 2, "start": 2, "end": 3}, g.param("x", normal(1), 2, 2, 4))
		}},
		{name: "slice_grad", op: "slice_grad", build: func(g *graph) *ir.Value {
			return g.op("slice_grad", ir.Attrs{"dim": 1, "start": 1, "size": 5}, g.param("x", normal(1), 2, 3, 2))
		}},
		{name: "slice_grad/at-start", op: "slice_grad", build: func(g *graph) *ir.Value {
			return g.op("slice_grad", ir.Attrs{"dim": 0, "start": 0, "size": 4}, g.param("x", normal(1), 2, 3))
		}},
		{name: "concat/dim1", op: "concat", build: func(g *graph) *ir.Value {
			return g.op("concat", ir.Attrs{"dim": 1},
				g.param("a", normal(1), 2, 1, 3), g.param("b", normal(1), 2, 3, 3), g.param("c", normal(1), 2, 2, 3))
		}},
		{name: "concat/dim0", op: "concat", build: func(g *graph) *ir.Value {
			return g.op("concat", ir.Attrs{"dim": 0}, g.param("a", normal(1), 1, 4), g.param("b", normal(1), 2, 4))
		}},
		{name: "concat/same-arg-twice", op: "concat", build: func(g *graph) *ir.Value {
			a := g.param("a", normal(1), 2, 3)
			return g.op("concat", ir.Attrs{"dim": 1}, a, g.param("b", normal(1), 2, 1), a)
		}},
	}
	for _, c := range []struct {
		name     string
		from, to []int
	}{
		{"leading", []int{3}, []int{2, 3}},
		{"leading2", []int{3, 4}, []int{2, 2, 3, 4}},
		{"size1-inner", []int{3, 1}, []int{3, 4}},
		{"size1-outer", []int{1, 4}, []int{3, 4}},
		{"size1-and-leading", []int{3, 1}, []int{2, 3, 4}},
		{"size1-middle", []int{2, 1, 4}, []int{2, 3, 4}},
		{"all-size1", []int{1, 1}, []int{2, 3}},
		{"scalar", nil, []int{2, 3}},
		{"identity", []int{2, 3}, []int{2, 3}},
	} {
		cases = append(cases, gradCase{
			name: "broadcast/" + c.name,
			op:   "broadcast",
			build: func(g *graph) *ir.Value {
				return g.op("broadcast", ir.Attrs{"shape": slices.Clone(c.to)}, g.param("x", normal(1), c.from...))
			},
		})
	}
	cases = append(cases, matmulCases()...)
	cases = append(cases, reduceCases("reduce_sum")...)
	cases = append(cases, reduceCases("reduce_mean")...)
	cases = append(cases, reduceCases("reduce_max")...)
	cases = append(cases, []gradCase{
		{name: "softmax/2d", op: "softmax", build: func(g *graph) *ir.Value {
			return g.op("softmax", nil, g.param("x", normal(1.5), 3, 5))
		}},
		{name: "softmax/3d", op: "softmax", build: func(g *graph) *ir.Value {
			return g.op("softmax", nil, g.param("x", normal(1.5), 2, 2, 4))
		}},
		{name: "causal_mask/square-then-softmax", op: "causal_mask", build: func(g *graph) *ir.Value {
			// The default −Inf fill only makes sense before a softmax.
			return g.op("softmax", nil, g.op("causal_mask", nil, g.param("x", normal(1), 2, 4, 4)))
		}},
		{name: "causal_mask/fewer-queries-then-softmax", op: "causal_mask", build: func(g *graph) *ir.Value {
			return g.op("softmax", nil, g.op("causal_mask", nil, g.param("x", normal(1), 2, 3, 5)))
		}},
		{name: "causal_mask/finite-fill", op: "causal_mask", build: func(g *graph) *ir.Value {
			return g.op("causal_mask", ir.Attrs{"fill": -2.5}, g.param("x", normal(1), 4, 4))
		}},
		{name: "causal_mask/fewer-queries-finite-fill", op: "causal_mask", build: func(g *graph) *ir.Value {
			return g.op("causal_mask", ir.Attrs{"fill": 0.5}, g.param("x", normal(1), 2, 2, 5))
		}},
		{name: "layernorm/3d", op: "layernorm", build: func(g *graph) *ir.Value {
			return g.op("layernorm", ir.Attrs{"eps": 1e-5},
				g.param("x", normal(1), 2, 3, 6), g.param("gamma", around(1, normal(0.3)), 6), g.param("beta", normal(0.5), 6))
		}},
		{name: "layernorm/2d-large-eps", op: "layernorm", build: func(g *graph) *ir.Value {
			return g.op("layernorm", ir.Attrs{"eps": 0.1},
				g.param("x", around(3, normal(1)), 4, 5), g.param("gamma", around(1, normal(0.3)), 5), g.param("beta", normal(0.5), 5))
		}},
		{name: "rmsnorm/3d", op: "rmsnorm", build: func(g *graph) *ir.Value {
			return g.op("rmsnorm", ir.Attrs{"eps": 1e-6}, g.param("x", normal(1), 2, 3, 6), g.param("gamma", around(1, normal(0.3)), 6))
		}},
		{name: "rmsnorm/2d-large-eps", op: "rmsnorm", build: func(g *graph) *ir.Value {
			return g.op("rmsnorm", ir.Attrs{"eps": 0.5}, g.param("x", around(2, normal(1)), 4, 5), g.param("gamma", around(1, normal(0.3)), 5))
		}},
		{name: "rope/heads", op: "rope", build: func(g *graph) *ir.Value {
			return g.op("rope", ir.Attrs{"theta": 10000.0}, g.param("x", normal(1), 2, 2, 5, 8))
		}},
		{name: "rope/small-base-inverse", op: "rope", build: func(g *graph) *ir.Value {
			// A small base turns every pair by a visible angle.
			return g.op("rope", ir.Attrs{"theta": 3.0, "inverse": true}, g.param("x", normal(1), 6, 4))
		}},
		// Fused attention: q, k and v all params, so the one case checks
		// attention_stats and the three gradient ops together.
		{name: "attention/causal-grouped", op: "attention", build: func(g *graph) *ir.Value {
			return g.op("attention", ir.Attrs{"scale": 1 / math.Sqrt(3), "causal": true},
				g.param("q", normal(1), 1, 4, 5, 3), g.param("k", normal(1), 1, 2, 5, 3), g.param("v", normal(1), 1, 2, 5, 3))
		}},
		{name: "attention/fewer-queries", op: "attention", build: func(g *graph) *ir.Value {
			return g.op("attention", ir.Attrs{"scale": 0.5},
				g.param("q", normal(1), 2, 2, 3, 4), g.param("k", normal(1), 2, 2, 5, 4), g.param("v", normal(1), 2, 2, 5, 4))
		}},
		{name: "attention/causal-one-kv-head", op: "attention", build: func(g *graph) *ir.Value {
			return g.op("attention", ir.Attrs{"scale": 0.7, "causal": true},
				g.param("q", normal(1), 1, 4, 6, 2), g.param("k", normal(1), 1, 1, 6, 2), g.param("v", normal(1), 1, 1, 6, 2))
		}},
		{name: "repeat_interleave/heads", op: "repeat_interleave", build: func(g *graph) *ir.Value {
			return g.op("repeat_interleave", ir.Attrs{"dim": 1, "repeats": 3}, g.param("kv", normal(1), 2, 2, 3, 4))
		}},
		{name: "repeat_interleave/last-dim", op: "repeat_interleave", build: func(g *graph) *ir.Value {
			return g.op("repeat_interleave", ir.Attrs{"dim": 1, "repeats": 2}, g.param("x", normal(1), 3, 5))
		}},
		{name: "silu", op: "silu", build: func(g *graph) *ir.Value {
			return g.op("silu", nil, g.param("x", normal(3), 3, 7))
		}},
		{name: "silu/swiglu", op: "silu", build: func(g *graph) *ir.Value {
			return g.op("mul", nil, g.op("silu", nil, g.param("gate", normal(2), 4, 6)), g.param("up", normal(1), 4, 6))
		}},
		// Mixture of experts: groups G=2 of T=3 tokens, E=2 experts of C=2
		// slots, hidden 3. Token 0 of group 0 sits in both experts, token
		// 1 of group 1 in none (dropped), and some slots are empty.
		{name: "moe_dispatch/weighted", op: "moe_dispatch", build: func(g *graph) *ir.Value {
			return g.op("moe_dispatch", nil, g.param("x", normal(1), 2, 3, 3), moeSrc(g), g.param("w", normal(1), 2, 2, 2))
		}},
		{name: "moe_dispatch/plain", op: "moe_dispatch", build: func(g *graph) *ir.Value {
			return g.op("moe_dispatch", nil, g.param("x", normal(1), 2, 3, 3), moeSrc(g))
		}},
		{name: "moe_combine/weighted", op: "moe_combine", build: func(g *graph) *ir.Value {
			return g.op("moe_combine", ir.Attrs{"tokens": 3}, g.param("y", normal(1), 2, 2, 2, 3), moeSrc(g), g.param("w", normal(1), 2, 2, 2))
		}},
		{name: "moe_combine/plain", op: "moe_combine", build: func(g *graph) *ir.Value {
			return g.op("moe_combine", ir.Attrs{"tokens": 3}, g.param("y", normal(1), 2, 2, 2, 3), moeSrc(g))
		}},
		{name: "moe_slot_gather", op: "moe_slot_gather", build: func(g *graph) *ir.Value {
			return g.op("moe_slot_gather", nil, g.param("p", normal(1), 2, 3, 2), moeSrc(g))
		}},
		{name: "normal_cdf", op: "normal_cdf", build: func(g *graph) *ir.Value {
			return g.op("normal_cdf", nil, g.param("x", normal(1.5), 3, 4))
		}},
		{name: "moe_slot_scatter", op: "moe_slot_scatter", build: func(g *graph) *ir.Value {
			return g.op("moe_slot_scatter", ir.Attrs{"tokens": 3}, g.param("w", normal(1), 2, 2, 2), moeSrc(g))
		}},
		{
			// A whole Switch layer: the router's gradient reaches its
			// weight only through the gate values; routing (top_k_mask,
			// moe_route) is a constant, and the scores are far enough
			// apart that no difference step changes it.
			name: "moe_slot_gather/switch-layer", op: "moe_slot_gather",
			build: func(g *graph) *ir.Value {
				x := g.param("x", normal(1), 2, 4, 3)
				probs := g.op("softmax", nil, g.op("matmul", nil, x, g.param("router", normal(1), 3, 3)))
				src := g.op("moe_route", ir.Attrs{"capacity": 2}, probs, g.op("top_k_mask", ir.Attrs{"k": 1}, probs))
				buf := g.op("moe_dispatch", nil, x, src)
				h := g.op("tanh", nil, g.op("matmul", nil, g.op("reshape", ir.Attrs{"shape": []int{3, 4, 3}}, buf), g.param("experts", normal(1), 3, 3, 3)))
				y := g.op("reshape", ir.Attrs{"shape": []int{3, 2, 2, 3}}, h)
				return g.op("moe_combine", ir.Attrs{"tokens": 4}, y, src, g.op("moe_slot_gather", nil, probs, src))
			},
		},
		{name: "embedding/repeated-ids", op: "embedding", build: func(g *graph) *ir.Value {
			ids := g.ids("ids", []int32{0, 3, 3, 1, 4, 3, 0, 0}, 2, 4)
			return g.op("embedding", nil, g.param("table", normal(1), 5, 3), ids)
		}},
		{name: "embedding/1d-ids", op: "embedding", build: func(g *graph) *ir.Value {
			ids := g.ids("ids", []int32{2, 2, 5, 0, 2}, 5)
			return g.op("embedding", nil, g.param("table", normal(1), 6, 4), ids)
		}},
		{name: "cross_entropy", op: "cross_entropy", build: func(g *graph) *ir.Value {
			labels := g.ids("labels", []int32{1, 5, 1, 0}, 4)
			return g.op("cross_entropy", nil, g.param("logits", normal(2), 4, 6), labels)
		}},
		{name: "cross_entropy/after-matmul", op: "cross_entropy", build: func(g *graph) *ir.Value {
			labels := g.ids("labels", []int32{2, 0, 2}, 3)
			logits := g.op("matmul", nil, g.param("h", normal(1), 3, 4), g.param("w", normal(1), 4, 3))
			return g.op("cross_entropy", nil, logits, labels)
		}},
		{name: "cast/f64-f64", op: "cast", build: func(g *graph) *ir.Value {
			return g.op("cast", ir.Attrs{"to": "f64"}, g.param("x", normal(1), 3, 4))
		}},
		{
			// f64→f32→f64 rounds to 24 bits. The function is linear, so a
			// large step has no truncation error and keeps the f32 rounding
			// (≈6e-8 relative) small against h.
			name: "cast/f64-f32-f64", op: "cast",
			build: func(g *graph) *ir.Value {
				x32 := g.op("cast", ir.Attrs{"to": "f32"}, g.param("x", normal(1), 3, 4))
				return g.op("cast", ir.Attrs{"to": "f64"}, x32)
			},
			tol: tolerance{h: 1e-2, atol: 1e-4, rtol: 1e-4},
		},
	}...)
	return cases
}

// TestVJPFiniteDifferences checks every VJP rule against central
// differences of loss = Σ op(params) ⊙ R in float64.
func TestVJPFiniteDifferences(t *testing.T) {
	for i, c := range gradCases() {
		t.Run(c.name, func(t *testing.T) {
			g := newGraph(t, uint64(i+1))
			out := c.build(g)
			require.True(t, slices.ContainsFunc(g.m.Values, func(v *ir.Value) bool { return v.Op == c.op }),
				"case %s records no %s op", c.name, c.op)
			g.weightedLoss(out)
			dev := g.device()
			tol := c.tol
			if tol == (tolerance{}) {
				tol = defaultTol
			}
			grads := checkGradients(t, dev, g.params, nil, tol)
			for _, p := range g.params {
				assert.NotZero(t, maxAbs(grads[p]), "grad/%s is all zeros: the check proves nothing", p)
			}
		})
	}
}

// TestVJPTableCovered asserts that the finite-difference table has a case
// for every op with a VJP, so a new rule cannot go unchecked.
func TestVJPTableCovered(t *testing.T) {
	covered := map[string]bool{}
	for _, c := range gradCases() {
		covered[c.op] = true
	}
	ops := passes.VJPOps()
	require.NotEmpty(t, ops)
	var missing []string
	for _, op := range ops {
		if !covered[op] {
			missing = append(missing, op)
		}
	}
	assert.Empty(t, missing, "ops with a VJP but no finite-difference case")
	for op := range covered {
		assert.Contains(t, ops, op, "a case claims to check %s, which has no VJP", op)
	}
}

// TestAutodiffAccumulatesReusedValues: a value with several uses gets the
// sum of the gradients from each.
func TestAutodiffAccumulatesReusedValues(t *testing.T) {
	cases := []struct {
		name  string
		build func(g *graph) *ir.Value
	}{
		{"x·x", func(g *graph) *ir.Value {
			x := g.param("x", normal(1), 3, 4)
			return g.op("mul", nil, x, x)
		}},
		{"x+x", func(g *graph) *ir.Value {
			x := g.param("x", normal(1), 3, 4)
			return g.op("add", nil, x, x)
		}},
		{"exp(x)/x", func(g *graph) *ir.Value {
			x := g.param("x", awayFromZero(0.5, 2), 3, 4)
			return g.op("div", nil, g.op("exp", nil, x), x)
		}},
		{"diamond", func(g *graph) *ir.Value {
			// y feeds three ops on different paths to the loss.
			x := g.param("x", normal(1), 2, 3)
			w := g.param("w", normal(1), 3, 3)
			y := g.op("tanh", nil, g.op("matmul", nil, x, w))
			z := g.op("mul", nil, y, g.op("exp", nil, y))
			return g.op("add", nil, g.op("sub", nil, z, y), g.op("matmul", nil, y, w))
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGraph(t, uint64(100+i))
			g.weightedLoss(c.build(g))
			grads := checkGradients(t, g.device(), g.params, nil, defaultTol)
			if c.name == "x·x" {
				// Exactly 2·x⊙R: both uses contribute.
				x, r := g.floats["x"], g.floats["fd.r"]
				for j := range x {
					assert.InDelta(t, 2*x[j]*r[j], grads["x"][j], 1e-12)
				}
			}
		})
	}
}

// TestAutodiffUnusedParamGetsZeroGradient: params the loss does not depend
// on (not used at all, or used only off the loss's path) get a zero
// gradient of their own shape, and the others are unaffected.
func TestAutodiffUnusedParamGetsZeroGradient(t *testing.T) {
	g := newGraph(t, 7)
	x := g.param("x", normal(1), 3, 4)
	g.param("unused", normal(1), 2, 5)
	offPath := g.param("off_path", normal(1), 3, 4)
	g.op("mul", nil, x, offPath) // computed, but not on the loss's path
	g.weightedLoss(g.op("tanh", nil, x))
	dev := g.device()
	grads := checkGradients(t, dev, g.params, nil, defaultTol)
	assert.NotZero(t, maxAbs(grads["x"]))
	for _, name := range []string{"unused", "off_path"} {
		want := make([]float64, len(g.floats[name]))
		assert.Equal(t, want, grads[name], "grad/%s", name)
		out := g.m.Output(passes.GradPrefix + name)
		require.NotNil(t, out)
		assert.True(t, out.Type.Equal(g.m.Source(name).Type), "grad/%s has type %v", name, out.Type)
	}
}

// What the loss does not reach is named in the pass's note: params, which
// keep their initial values, and inputs nothing reads (a loss that reads
// the tokens as its labels leaves the targets fed for nothing), with
// their lines.
func TestAutodiffNotesWhatTheLossDoesNotReach(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(g *graph) *ir.Value
		note  string
	}{
		{"a param", func(g *graph) *ir.Value {
			g.param("unused", normal(1), 2, 5)
			return g.param("x", normal(1), 3, 4)
		}, `^the loss does not reach 1 of 2 params, which keep their initial values: unused$`},
		{"an input", func(g *graph) *ir.Value {
			g.ids("targets", []int32{0, 1, 2}, 3)
			return g.param("x", normal(1), 3, 4)
		}, `^nothing reads input "targets" \(autodiff_test\.go:\d+\), which is fed every step`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGraph(t, 8)
			g.weightedLoss(g.op("tanh", nil, tc.build(g)))
			opts := passes.DefaultOptions()
			opts.StopAfter = "autodiff"
			res, err := passes.Run(g.m, opts, passes.Hooks{})
			require.NoError(t, err)
			i := slices.IndexFunc(res, func(r passes.Result) bool { return r.Name == "autodiff" })
			require.GreaterOrEqual(t, i, 0)
			assert.Regexp(t, tc.note, res[i].Note)
		})
	}
}

// TestAutodiffErrors: what autodiff refuses, and that it says why.
func TestAutodiffErrors(t *testing.T) {
	cases := []struct {
		name  string
		build func(g *graph)
		want  string
	}{
		{"no VJP", func(g *graph) {
			x := g.param("x", normal(1), 3)
			// tanh_grad is a backward op without a VJP of its own.
			g.weightedLoss(g.op("tanh_grad", nil, x, x))
		}, "has no VJP"},
		{"loss not scalar", func(g *graph) {
			g.m.SetOutput("loss", g.op("exp", nil, g.param("x", normal(1), 3)))
		}, "loss must be a float scalar"},
		{"loss reaches no param", func(g *graph) {
			x := g.param("x", normal(1), 3)
			// A comparison's 0/1 has no gradient: the loss is a float, but
			// training it would change nothing.
			g.weightedLoss(g.op("less", nil, x, g.param("y", normal(1), 3)))
		}, "the loss depends on no param through a differentiable op"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGraph(t, uint64(200+i))
			c.build(g)
			opts := passes.DefaultOptions()
			opts.StopAfter = "autodiff"
			_, err := passes.Run(g.m, opts, passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), `pass "autodiff"`)
			assert.False(t, g.m.HasRun("autodiff"))
		})
	}
}

// TestGPTGradientCheck differentiates the reference GPT in float64 and
// checks about 200 randomly chosen parameter elements, at least four from
// every param, against central differences.
func TestGPTGradientCheck(t *testing.T) {
	const batch, seq, vocab = 2, 8, 32
	m, err := frontend.Build(gpt.Model, frontend.Config{
		Name:  "gpt-gradcheck",
		Float: ir.F64,
		Batch: batch,
		Set:   map[string]string{"layers": "1", "hidden": "16", "heads": "2", "seq": "8", "vocab": "32"},
	})
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(42, 43))
	ints := map[string][]int32{}
	for _, name := range []string{"tokens", "targets"} {
		ids := make([]int32, batch*seq)
		for i := range ids {
			ids[i] = int32(rng.IntN(vocab))
		}
		ints[name] = ids
	}
	dev := loadGradDevice(t, m, nil, ints)
	require.NoError(t, dev.InitParams(1))

	// Move every param off its initialiser (zero biases, unit gains) so
	// each one's gradient is generic.
	var names []string
	sizes := map[string]int{}
	total := 0
	for _, p := range m.Params() {
		x, err := dev.Float64s(p.Name())
		require.NoError(t, err)
		for i := range x {
			x[i] += 0.1 * rng.NormFloat64()
		}
		require.NoError(t, dev.SetFloat64s(p.Name(), x))
		names = append(names, p.Name())
		sizes[p.Name()] = len(x)
		total += len(x)
	}
	require.Len(t, names, 16, "params of a one-layer GPT")

	const samples = 200
	picked := map[string]map[int]bool{}
	count := 0
	add := func(name string, i int) {
		if !picked[name][i] {
			picked[name][i] = true
			count++
		}
	}
	for _, name := range names {
		picked[name] = map[int]bool{}
		for len(picked[name]) < min(4, sizes[name]) {
			add(name, rng.IntN(sizes[name]))
		}
	}
	for count < samples {
		// Uniform over all parameter elements.
		flat := rng.IntN(total)
		for _, name := range names {
			if flat < sizes[name] {
				add(name, flat)
				break
			}
			flat -= sizes[name]
		}
	}
	pick := func(name string, _ int) []int {
		var idx []int
		for i := range picked[name] {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		return idx
	}
	grads := checkGradients(t, dev, names, pick, defaultTol)
	for _, name := range names {
		assert.NotZero(t, maxAbs(grads[name]), "grad/%s", name)
	}
}

// moeSrc is a fixed slot → token index [G=2, E=2, C=2] over groups of 3
// tokens.
func moeSrc(g *graph) *ir.Value {
	return g.ids("src", []int32{2, 0, 1, 0, -1, -1, 0, 2}, 2, 2, 2)
}
