package passes

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
)

// placedWithoutRule are the ops that never meet a sharding rule, because
// they are made with their placement: redistribute by shard itself, the
// collectives by redistribute (from a placement change), fused by fuse
// (from ops placed alike).
var placedWithoutRule = map[string]string{
	"redistribute":   "made by shard",
	"all_reduce":     "made by redistribute",
	"reduce_scatter": "made by redistribute",
	"all_gather":     "made by redistribute",
	"shard_slice":    "made by redistribute",
	"all_to_all":     "made by redistribute",
	ir.FusedOp:       "made by fuse, after shard",
}

// TestOpTableComplete walks the ir op table: every op that computes has a
// VJP exactly when the table says it is differentiated by one, and a
// sharding rule unless it is made already placed; the VJP and rule tables
// name no op the ir table lacks.
func TestOpTableComplete(t *testing.T) {
	for _, name := range ir.OpNames() {
		info, _ := ir.Lookup(name)
		_, hasVJP := vjps[name]
		_, hasRule := shardRules[name]
		if info.Source {
			assert.False(t, hasVJP, "source %s has no arguments to differentiate", name)
			assert.False(t, hasRule, "source %s is placed from the plan", name)
			continue
		}
		if info.Grad == ir.GradVJP {
			assert.True(t, hasVJP, "op %s is differentiated by a VJP, and none is registered", name)
		} else {
			assert.False(t, hasVJP, "op %s is marked grad %q, yet has a VJP", name, info.Grad)
		}
		if why, ok := placedWithoutRule[name]; ok {
			assert.False(t, hasRule, "op %s is %s; a rule would never run", name, why)
		} else {
			assert.True(t, hasRule, "op %s has no sharding rule", name)
		}
	}
	for name := range vjps {
		_, ok := ir.Lookup(name)
		assert.True(t, ok, "VJP for %s, which is not in the op table", name)
	}
	for name := range shardRules {
		_, ok := ir.Lookup(name)
		assert.True(t, ok, "sharding rule for %s, which is not in the op table", name)
	}
	for name := range placedWithoutRule {
		_, ok := ir.Lookup(name)
		assert.True(t, ok, "placedWithoutRule names %s, which is not in the op table", name)
	}
}

// TestRegisterRulesRefuse: a VJP or sharding rule needs a known op that
// takes one, and at most one per op; a refused rule leaves the tables as
// they were.
func TestRegisterRulesRefuse(t *testing.T) {
	vjp := func(*VJPBuilder, *ir.Value, *ir.Value) []*ir.Value { return nil }
	rule := func(AxisRule) ([]ir.Placement, ir.Placement, error) { return nil, rep, nil }
	cases := []struct {
		name string
		err  func() error
		want string
	}{
		{"VJP for an unknown op", func() error { return RegisterVJP("frobnicate", vjp) }, "not in the ir op table"},
		{"nil VJP", func() error { return RegisterVJP("add", nil) }, "nil VJP"},
		{"second VJP", func() error { return RegisterVJP("add", vjp) }, "already has a VJP"},
		{"VJP for a source", func() error { return RegisterVJP("param", vjp) }, "is a source"},
		{"VJP for an op without gradient", func() error { return RegisterVJP("nonfinite_count", vjp) }, `marked grad "none"`},
		{"VJP for an op made after autodiff", func() error { return RegisterVJP("tanh_grad", vjp) }, `marked grad "not implemented"`},
		{"rule for an unknown op", func() error { return RegisterShardRule("frobnicate", rule) }, "not in the ir op table"},
		{"nil rule", func() error { return RegisterShardRule("add", nil) }, "nil sharding rule"},
		{"second rule", func() error { return RegisterShardRule("matmul", rule) }, "already has a sharding rule"},
		{"rule for a source", func() error { return RegisterShardRule("input", rule) }, "is a source"},
	}
	nVJP, nRules := len(vjps), len(shardRules)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.err()
			if assert.Error(t, err) {
				assert.Contains(t, err.Error(), c.want)
			}
		})
	}
	assert.Len(t, vjps, nVJP)
	assert.Len(t, shardRules, nRules)
}
