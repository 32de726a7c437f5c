// Package extension_test adds an op from outside packages ir and passes,
// through their registration functions alone, and compiles a model that
// uses it: the op table, autodiff and shard find everything by the op's
// name.
package extension_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// toy_square is x², elementwise; toy_floor rounds a float tensor down to
// i32 and is registered without a VJP: autodiff must stop at its integer
// result rather than ask for one.
var registerToys = sync.OnceValue(func() error {
	sameFloat := func(args []ir.Type, _ ir.Attrs) (ir.Type, error) {
		if !args[0].DType.IsFloat() {
			return ir.Type{}, fmt.Errorf("needs a float tensor, got %v", args[0])
		}
		return args[0], nil
	}
	square := &ir.OpInfo{
		Name:  "toy_square",
		Arity: 1,
		Infer: sameFloat,
		Cost: func(args []ir.Type, out ir.Type, _ ir.Attrs) (int64, int64) {
			return out.Shape.NumElements(), args[0].Bytes() + out.Bytes()
		},
		Doc: "x², a test op",
	}
	floor := &ir.OpInfo{
		Name:  "toy_floor",
		Arity: 1,
		Infer: func(args []ir.Type, a ir.Attrs) (ir.Type, error) {
			t, err := sameFloat(args, a)
			return ir.Type{DType: ir.I32, Shape: t.Shape}, err
		},
		Cost: func(args []ir.Type, out ir.Type, _ ir.Attrs) (int64, int64) {
			return out.Shape.NumElements(), args[0].Bytes() + out.Bytes()
		},
		Doc: "⌊x⌋ as i32, a test op",
	}
	for _, o := range []*ir.OpInfo{square, floor} {
		if err := ir.Register(o); err != nil {
			return err
		}
	}
	// d(x²) = 2x·dy.
	err := passes.RegisterVJP("toy_square", func(ad *passes.VJPBuilder, v, dy *ir.Value) []*ir.Value {
		two := ad.Scalar(2, v.Type.DType)
		return []*ir.Value{ad.Op("mul", nil, dy, ad.Op("scale", nil, v.Args[0], two))}
	})
	if err != nil {
		return err
	}
	for _, op := range []string{"toy_square", "toy_floor"} {
		if err := passes.RegisterShardRule(op, passes.ElementwiseRule); err != nil {
			return err
		}
	}
	return nil
})

var fwd = ir.Meta{Layer: -1, Phase: ir.PhaseFwd, Stage: -1, Chunk: -1, Micro: -1}

// toyModel is loss = Σ toy_square(x ⊙ a) ⊙ f32(toy_floor(x)), with x a
// param [4,8] and a a batch input [4,8].
func toyModel(t *testing.T) *ir.Module {
	t.Helper()
	require.NoError(t, registerToys())
	m := ir.NewModule("toy")
	pos := ir.Pos{File: "toy.go", Line: 1}
	add := func(op string, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
		pos.Line++
		v, err := m.Add(op, args, attrs, fwd, pos)
		require.NoError(t, err)
		return v
	}
	x, err := m.AddSource("param", ir.T(ir.F32, 4, 8), ir.Attrs{"name": "x"}, fwd, pos)
	require.NoError(t, err)
	a, err := m.AddSource("input", ir.T(ir.F32, 4, 8), ir.Attrs{"name": "a"}, fwd, pos)
	require.NoError(t, err)
	sq := add("toy_square", nil, add("mul", nil, x, a))
	floor := add("cast", ir.Attrs{"to": "f32"}, add("toy_floor", nil, x))
	m.SetOutput(ir.OutputLoss, add("reduce_sum", ir.Attrs{"axes": []int{0, 1}}, add("mul", nil, sq, floor)))
	return m
}

func TestToyOpInTable(t *testing.T) {
	require.NoError(t, registerToys())
	info, ok := ir.Lookup("toy_square")
	require.True(t, ok)
	assert.Contains(t, ir.OpNames(), "toy_square")
	flops, bytes := info.Cost([]ir.Type{ir.T(ir.F32, 4, 8)}, ir.T(ir.F32, 4, 8), nil)
	assert.Equal(t, int64(32), flops)
	assert.Equal(t, int64(256), bytes)

	// A second registration of any of them is refused.
	assert.ErrorContains(t, ir.Register(info), "already registered")
	assert.ErrorContains(t, passes.RegisterVJP("toy_square", func(*passes.VJPBuilder, *ir.Value, *ir.Value) []*ir.Value { return nil }), "already has a VJP")
	assert.ErrorContains(t, passes.RegisterShardRule("toy_square", passes.WholeRule), "already has a sharding rule")
}

// TestToyOpDifferentiated: autodiff uses the registered VJP and stops at
// toy_floor's integer result, which has none.
func TestToyOpDifferentiated(t *testing.T) {
	m := toyModel(t)
	opts := passes.DefaultOptions()
	opts.Verify = true
	opts.StopAfter = "autodiff"
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	grad := m.Output(passes.GradPrefix + "x")
	require.NotNil(t, grad)
	var backward []string
	for _, v := range m.Values {
		if v.Meta.Phase == ir.PhaseBwd {
			backward = append(backward, v.Op)
			assert.NotEqual(t, ir.I32, v.Type.DType, "backward value %s %s", v.Ref(), v.Op)
		}
	}
	assert.Contains(t, backward, "scale", "toy_square's VJP scales x by 2")
}

// TestToyOpSharded: shard places the toy ops by their registered rule:
// split over dp like the batch input they read.
func TestToyOpSharded(t *testing.T) {
	m := toyModel(t)
	opts := passes.DefaultOptions()
	opts.Verify = true
	opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}}}
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	split := ir.Placement{Kind: ir.Shard, Dim: 0}
	seen := 0
	for _, v := range m.Values {
		if v.Op == "toy_square" && v.Meta.Phase == ir.PhaseFwd {
			seen++
			require.Len(t, v.Place, 1)
			assert.Equal(t, split, v.Place[0], "toy_square reads the batch split over dp")
		}
	}
	assert.Equal(t, 1, seen)
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	lowered := 0
	for _, in := range prog.Instrs {
		if in.Op != "toy_square" {
			continue
		}
		lowered++
		info, _ := ir.Lookup(in.Op)
		flops, _ := info.Cost(in.ArgTypes, in.OutType, in.Attrs)
		assert.Equal(t, int64(16), flops, "each device squares its half of [4,8]")
	}
	assert.Equal(t, 1, lowered)
}
