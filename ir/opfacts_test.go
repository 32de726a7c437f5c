package ir_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

// TestOpFacts pins the facts passes and the lowering read from the table
// in place of their own lists.
func TestOpFacts(t *testing.T) {
	cases := []struct {
		op        string
		grad      ir.GradKind
		noGrad    []int // arguments no gradient flows to
		update    ir.UpdateRole
		inPlace   bool
		overArg   int // the argument an in-place result overwrites
		precision ir.PrecisionClass
	}{
		{op: "matmul"},
		{op: "cast"},
		{op: "embedding", noGrad: []int{1}},
		{op: "cross_entropy", noGrad: []int{1}, precision: ir.PrecisionF32},
		{op: "cross_entropy_grad", grad: ir.GradNotImplemented, noGrad: []int{1}, precision: ir.PrecisionF32, inPlace: true},
		{op: "embedding_grad", grad: ir.GradNotImplemented, noGrad: []int{0}},
		{op: "relu_mask", grad: ir.NoGrad},
		{op: "nonfinite_count", grad: ir.NoGrad},
		{op: "tanh_grad", grad: ir.GradNotImplemented},
		{op: "all_reduce", grad: ir.GradNotImplemented},
		{op: "adam_m", grad: ir.GradNotImplemented, update: ir.UpdateFromGrad, inPlace: true},
		{op: "sm3_row", grad: ir.GradNotImplemented, update: ir.UpdateFromGrad, inPlace: true},
		{op: "adamw", grad: ir.GradNotImplemented, update: ir.UpdateFromState, inPlace: true},
		{op: "sgd", grad: ir.GradNotImplemented, update: ir.UpdateFromState, inPlace: true},
		{op: "where_finite", grad: ir.GradNotImplemented, noGrad: []int{0}, inPlace: true, overArg: 2},
	}
	for _, c := range cases {
		t.Run(c.op, func(t *testing.T) {
			info, ok := ir.Lookup(c.op)
			require.True(t, ok)
			assert.Equal(t, c.grad, info.Grad, "grad")
			assert.Equal(t, c.update, info.Update, "update role")
			assert.Equal(t, c.inPlace, info.InPlace, "in place")
			assert.Equal(t, c.overArg, info.InPlaceArg, "in-place argument")
			assert.Equal(t, c.precision, info.Precision, "precision class")
			for i := range 3 {
				want := true
				for _, j := range c.noGrad {
					want = want && i != j
				}
				assert.Equal(t, want && c.grad != ir.NoGrad, info.HasGrad(i), "gradient to argument %d", i)
			}
		})
	}
}

// TestOpFactsConsistent checks rules that tie the facts together across
// the whole table.
func TestOpFactsConsistent(t *testing.T) {
	for _, name := range ir.OpNames() {
		info, _ := ir.Lookup(name)
		if info.Update == ir.UpdateFromGrad {
			assert.Greater(t, info.Arity, ir.UpdateGradArg, "%s reads a gradient from argument %d", name, ir.UpdateGradArg)
		}
		if info.Update != ir.NoUpdate {
			// Every update is written over its state when it can be.
			assert.True(t, info.InPlace, "%s updates its first argument, so its kernels must allow it in place", name)
		}
		if info.Source {
			assert.Equal(t, ir.NoUpdate, info.Update, name)
			assert.False(t, info.InPlace, name)
		}
	}
}

// TestRegisterRefuses: Register checks an entry and says which rule it
// breaks, without changing the table.
func TestRegisterRefuses(t *testing.T) {
	cost := func([]ir.Type, ir.Type, ir.Attrs) (int64, int64) { return 0, 0 }
	infer := func(args []ir.Type, _ ir.Attrs) (ir.Type, error) { return args[0], nil }
	cases := []struct {
		name string
		op   *ir.OpInfo
		want string
	}{
		{"nil", nil, "nil op entry"},
		{"empty name", &ir.OpInfo{Arity: 1, Infer: infer, Cost: cost}, "op name"},
		{"bad name", &ir.OpInfo{Name: "Toy op", Arity: 1, Infer: infer, Cost: cost}, "op name"},
		{"taken", &ir.OpInfo{Name: "add", Arity: 2, Infer: infer, Cost: cost}, "op add is already registered"},
		{"reserved attribute", &ir.OpInfo{Name: "toy_attr", Arity: 1, Infer: infer, Cost: cost, Attrs: []ir.AttrSpec{{Name: "place", Kind: ir.AttrString}}}, "reserved attribute name place"},
		{"no cost", &ir.OpInfo{Name: "toy_cost", Arity: 1, Infer: infer}, "has no cost function"},
		{"no type rule", &ir.OpInfo{Name: "toy_infer", Arity: 1, Cost: cost}, "has no type rule"},
		{"no args", &ir.OpInfo{Name: "toy_arity", Infer: infer, Cost: cost}, "arity 0"},
		{"source with a rule", &ir.OpInfo{Name: "toy_source", Source: true, Infer: infer, Cost: cost}, "source op"},
		{"no-gradient argument out of range", &ir.OpInfo{Name: "toy_nograd", Arity: 2, Infer: infer, Cost: cost, NoGradArgs: []int{2}}, "argument 2 is out of range"},
		{"fp32 argument out of range", &ir.OpInfo{Name: "toy_f32", Arity: 2, Infer: infer, Cost: cost, F32Args: []int{2}}, "fp32 argument 2 is out of range"},
		{"gradient argument missing", &ir.OpInfo{Name: "toy_update", Arity: 1, Infer: infer, Cost: cost, Update: ir.UpdateFromGrad}, "reads it from argument 1"},
		{"undefined class", &ir.OpInfo{Name: "toy_class", Arity: 1, Infer: infer, Cost: cost, Precision: 7}, "not defined"},
	}
	before := ir.OpNames()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ir.Register(c.op)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	assert.Equal(t, before, ir.OpNames(), "a refused entry must not reach the table")
	add, _ := ir.Lookup("add")
	assert.Equal(t, 2, add.Arity, "a refused duplicate must not replace the entry")
}
