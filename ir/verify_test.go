package ir_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

// verifyBase is a small valid module the verifier cases extend; its
// positions mimic the reference model's lines.
const verifyBase = `gir 1
module "m"
%0 = input : f32[4,8] {name="x"} @model.go:29
%1 = param : f32[8,8] {name="w"} @model.go:33
`

// collectiveBase is a placed module on a 2×2 mesh: %0 split over dp, %1
// whole, %2 a partial sum over dp and %3 split over tp, for the collective
// cases to move between placements.
const collectiveBase = `gir 1
module "m"
mesh dp=2,tp=2
%0 = input : f32[4,8] {name="x" place=[S(0),R]} @model.go:29
%1 = param : f32[8,8] {name="w" place=[R,R]} @model.go:33
%2 = state : f32[4,8] {name="g" place=[P,R]} @model.go:34
%3 = state : f32[4,8] {name="h" place=[R,S(1)]} @model.go:35
`

// blockedBase is a placed module on a 2×2 mesh whose %0 is split over tp
// in three fused blocks (each device holds its slice of each block), %1
// is whole and %2 a partial sum over tp, for collectives that must carry
// the block count.
const blockedBase = `gir 1
module "m"
mesh dp=2,tp=2
%0 = state : f32[6,12] {name="qkv" place=[R,S(1)x3]} @model.go:29
%1 = state : f32[6,12] {name="w" place=[R,R]} @model.go:33
%2 = state : f32[6,12] {name="g" place=[R,P]} @model.go:34
`

// verifyCases each break one verifier rule. text must parse; mutate, when
// set, then breaks the in-memory module in ways the parser would refuse.
var verifyCases = []struct {
	name   string
	text   string
	mutate func(m *ir.Module)
	pass   string
	rule   string
	want   string   // the full text of the error with that rule
	others []string // rules of any further errors, in order
}{
	{
		name:   "duplicate id",
		text:   verifyBase + "%2 = matmul %0, %1 : f32[4,8] @model.go:41\n",
		mutate: func(m *ir.Module) { m.Values[2].ID = 1 },
		pass:   "shard",
		rule:   ir.RuleDuplicateID,
		want:   `after pass "shard": %1 matmul @model.go:41: id 1 is used by two values`,
	},
	{
		name:   "ssa order: arg defined after its use",
		text:   verifyBase + "%2 = matmul %0, %1 : f32[4,8] @model.go:41\n",
		mutate: func(m *ir.Module) { m.Values[1], m.Values[2] = m.Values[2], m.Values[1] },
		pass:   "shard",
		rule:   ir.RuleSSAOrder,
		want:   `after pass "shard": %2 matmul @model.go:41: arg 1 (%1) is not defined before its use`,
	},
	{
		name:   "ssa order: missing arg",
		text:   verifyBase + "%2 = matmul %0, %1 : f32[4,8] @model.go:41\n",
		mutate: func(m *ir.Module) { m.Values[2].Args[1] = nil },
		pass:   "fuse",
		rule:   ir.RuleSSAOrder,
		want:   `after pass "fuse": %2 matmul @model.go:41: arg 1 (%?) is not defined before its use`,
	},
	{
		name: "ssa order: arg from another module",
		text: verifyBase + "%2 = matmul %0, %1 : f32[4,8] @model.go:41\n",
		mutate: func(m *ir.Module) {
			m.Values[2].Args[0] = &ir.Value{ID: 0, Op: "input", Type: ir.T(ir.F32, 4, 8), Attrs: ir.Attrs{"name": "x"}, Meta: ir.NoMeta}
		},
		pass: "shard",
		rule: ir.RuleSSAOrder,
		want: `after pass "shard": %2 matmul @model.go:41: arg 0 (%0) is not defined before its use`,
	},
	{
		name:   "unknown op",
		text:   verifyBase + "%2 = matmul %0, %1 : f32[4,8] @model.go:41\n",
		mutate: func(m *ir.Module) { m.Values[2].Op = "frobnicate" },
		pass:   "fuse",
		rule:   ir.RuleUnknownOp,
		want:   `after pass "fuse": %2 frobnicate @model.go:41: unknown op "frobnicate"`,
	},
	{
		name: "op rule: arity",
		text: verifyBase + "%2 = matmul %0 : f32[4,8] @model.go:41\n",
		pass: "shard",
		rule: ir.RuleOpRule,
		want: `after pass "shard": %2 matmul @model.go:41: takes 2 args, got 1`,
	},
	{
		name:   "op rule: variadic op without args",
		text:   verifyBase + "%2 = concat %0 : f32[4,8] {dim=0} @model.go:40\n",
		mutate: func(m *ir.Module) { m.Values[2].Args = nil },
		pass:   "shard",
		rule:   ir.RuleOpRule,
		want:   `after pass "shard": %2 concat @model.go:40: takes at least 1 args, got 0`,
	},
	{
		name:   "op rule: unknown attribute",
		text:   verifyBase + "%2 = matmul %0, %1 : f32[4,8] @model.go:41\n",
		mutate: func(m *ir.Module) { m.Values[2].Attrs = ir.Attrs{"transC": true} },
		pass:   "shard",
		rule:   ir.RuleOpRule,
		want:   `after pass "shard": %2 matmul @model.go:41: unknown attribute "transC" (op matmul takes [transA transB])`,
	},
	{
		name: "op rule: missing attribute",
		text: verifyBase + "%2 = reshape %0 : f32[32] @model.go:40\n",
		pass: "shard",
		rule: ir.RuleOpRule,
		want: `after pass "shard": %2 reshape @model.go:40: missing required attribute shape (ints)`,
	},
	{
		name:   "op rule: wrong attribute kind",
		text:   verifyBase + "%2 = reshape %0 : f32[32] {shape=[32]} @model.go:40\n",
		mutate: func(m *ir.Module) { m.Values[2].Attrs["shape"] = "32" },
		pass:   "shard",
		rule:   ir.RuleOpRule,
		want:   `after pass "shard": %2 reshape @model.go:40: attribute shape must be ints, got string`,
	},
	{
		name:   "op rule: attribute of an unsupported Go type",
		text:   verifyBase + "%2 = reshape %0 : f32[32] {shape=[32]} @model.go:40\n",
		mutate: func(m *ir.Module) { m.Values[2].Attrs["shape"] = []int64{32} },
		pass:   "shard",
		rule:   ir.RuleOpRule,
		want:   `after pass "shard": %2 reshape @model.go:40: attribute shape must be ints, got []int64`,
	},
	{
		name: "op rule: matmul inner dims",
		text: verifyBase + "%2 = matmul %1, %0 : f32[8,8] @model.go:41\n",
		pass: "shard",
		rule: ir.RuleOpRule,
		want: `after pass "shard": %2 matmul @model.go:41: inner dims differ: f32[8,8] · f32[4,8] (k=8 vs 4)`,
	},
	{
		name: "op rule: elementwise shapes",
		text: verifyBase + "%2 = add %0, %1 : f32[4,8] @model.go:34\n",
		pass: "",
		rule: ir.RuleOpRule,
		want: `%2 add @model.go:34: arg 1 is f32[8,8] but arg 0 is f32[4,8]: types must be equal`,
	},
	{
		name:   "op rule: source op with args",
		text:   verifyBase,
		mutate: func(m *ir.Module) { m.Values[1].Args = []*ir.Value{m.Values[0]} },
		pass:   "shard",
		rule:   ir.RuleOpRule,
		want:   `after pass "shard": %1 param @model.go:33: source op param takes no args, got 1`,
	},
	{
		name: "op rule: source with a zero dim",
		text: verifyBase + "%2 = param : f32[0,8] {name=\"z\"} @model.go:35\n",
		pass: "shard",
		rule: ir.RuleOpRule,
		want: `after pass "shard": %2 param @model.go:35: dims must be positive, got f32[0,8]`,
	},
	{
		name:   "op rule: source with an invalid dtype",
		text:   verifyBase,
		mutate: func(m *ir.Module) { m.Values[1].Type.DType = ir.Invalid },
		pass:   "shard",
		rule:   ir.RuleOpRule,
		want:   `after pass "shard": %1 param @model.go:33: invalid dtype in invalid[8,8]`,
	},
	{
		name: "op rule: source without a name",
		text: verifyBase + "%2 = input : i32[] @model.go:30\n",
		pass: "shard",
		rule: ir.RuleOpRule,
		want: `after pass "shard": %2 input @model.go:30: missing required attribute name (string)`,
	},
	{
		name: "type mismatch",
		text: verifyBase + "%2 = matmul %0, %1 : f32[4,9] @model.go:41\n",
		pass: "shard",
		rule: ir.RuleTypeMatch,
		want: `after pass "shard": %2 matmul @model.go:41: declared type f32[4,9] but the matmul rule gives f32[4,8]`,
	},
	{
		// The matmul reading the mistyped value would fail too (inner
		// dims 9 and 8): it follows from the one mistake, and is not said.
		name: "type mismatch: the ops that read it are not checked",
		text: verifyBase + "%2 = neg %0 : f32[4,9] @model.go:34\n%3 = matmul %2, %1 : f32[4,8] @model.go:41\n",
		pass: "shard",
		rule: ir.RuleTypeMatch,
		want: `after pass "shard": %2 neg @model.go:34: declared type f32[4,9] but the neg rule gives f32[4,8]`,
	},
	{
		name: "type mismatch: dtype",
		text: verifyBase + "%2 = neg %0 : bf16[4,8] @model.go:34\n",
		pass: "mixed-precision",
		rule: ir.RuleTypeMatch,
		want: `after pass "mixed-precision": %2 neg @model.go:34: declared type bf16[4,8] but the neg rule gives f32[4,8]`,
	},
	{
		name: "source name used twice",
		text: verifyBase + "%2 = param : f32[8] {name=\"w\"} @model.go:35\n",
		pass: "shard",
		rule: ir.RuleSourceName,
		want: `after pass "shard": %2 param @model.go:35: name "w" is already used by %1 param @model.go:33`,
	},
	{
		name: "source name shared by input and state",
		text: verifyBase + "%2 = state : f32[4,8] {name=\"x\"} @model.go:36\n",
		pass: "optimizer",
		rule: ir.RuleSourceName,
		want: `after pass "optimizer": %2 state @model.go:36: name "x" is already used by %0 input @model.go:29`,
	},
	{
		name: "placement without a mesh",
		text: verifyBase + "%2 = neg %0 : f32[4,8] {place=[S(0)]} @model.go:34\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 neg @model.go:34: placement [S(0)] given but the module has no mesh`,
	},
	{
		name: "placement of the wrong length",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh dp=2,tp=2\n", 1) +
			"%2 = neg %0 : f32[4,8] {place=[R]} @model.go:34\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 neg @model.go:34: placement has 1 entries for mesh dp=2,tp=2`,
	},
	{
		name: "placement shards a dim the value lacks",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh dp=2,tp=2\n", 1) +
			"%2 = neg %0 : f32[4,8] {place=[S(2),R]} @model.go:34\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 neg @model.go:34: S(2) on axis dp: f32[4,8] has no dim 2`,
	},
	{
		name: "placement shards a negative dim",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh dp=2,tp=2\n", 1) +
			"%2 = neg %0 : f32[4,8] {place=[R,S(-1)]} @model.go:34\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 neg @model.go:34: S(-1) on axis tp: f32[4,8] has no dim -1`,
	},
	{
		name: "placement shards an indivisible dim",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh dp=2,tp=3\n", 1) +
			"%2 = neg %0 : f32[4,8] {place=[S(0),S(1)]} @model.go:34\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 neg @model.go:34: S(1) on axis tp: dim size 8 is not divisible by 3`,
	},
	{
		name: "placement on a source",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh tp=3\n", 1) +
			"%2 = param : f32[8] {name=\"b\" place=[S(0)]} @model.go:35\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 param @model.go:35: S(0) on axis tp: dim size 8 is not divisible by 3`,
	},
	{
		// Each device runs the kernels on its blocks: an operand whole
		// where the result is split reaches them with other lengths.
		name: "placements that disagree along an op",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh tp=2\n", 1) +
			"%2 = neg %0 : f32[4,8] {place=[S(1)]} @model.go:34\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %2 neg @model.go:34: placed [S(1)], each device holds a block [4,4], but its operands are %0 [R] (a block [4,8]): they make a block [4,8] (placements edited along the op?)`,
	},
	{
		name: "a reduction whose operand is split where its result says whole",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh tp=2\n", 1) +
			"%2 = param : f32[4,8] {name=\"q\" place=[S(1)]} @model.go:34\n" +
			"%3 = reduce_sum %2 : f32[8] {axes=[0] place=[P]} @model.go:35\n",
		pass: "shard",
		rule: ir.RulePlacement,
		want: `after pass "shard": %3 reduce_sum @model.go:35: placed [P], each device holds a block [8], but its operands are %2 [S(1)] (a block [4,4]): they make a block [4] (placements edited along the op?)`,
	},
	{
		name: "placement on a mesh axis of size 0",
		text: strings.Replace(verifyBase, "module \"m\"\n", "module \"m\"\nmesh dp=2,tp=2\n", 1) +
			"%2 = param : f32[4,8] {name=\"q\" place=[R,S(1)]} @model.go:34\n",
		mutate: func(m *ir.Module) { m.Mesh.Axes[1].Size = 0 },
		pass:   "shard",
		rule:   ir.RulePlacement,
		want:   `after pass "shard": %2 param @model.go:34: S(1) on axis tp: the axis has size 0`,
	},
	{
		name: "collective: all_reduce produces a shard",
		text: collectiveBase + "%4 = all_reduce %2 : f32[4,8] {axis=\"dp\" place=[S(0),R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_reduce @model.go:40: all_reduce on axis dp turns P into R, but the arg is P and the result S(0)`,
	},
	{
		name: "collective: all_reduce of a whole value",
		text: collectiveBase + "%4 = all_reduce %1 : f32[8,8] {axis=\"dp\" place=[R,R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_reduce @model.go:40: all_reduce on axis dp turns P into R, but the arg is R and the result R`,
	},
	{
		name: "collective: changes another axis",
		text: collectiveBase + "%4 = all_reduce %2 : f32[4,8] {axis=\"dp\" place=[R,S(1)]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_reduce @model.go:40: all_reduce on axis dp must leave axis tp as it is (R), got S(1)`,
	},
	{
		name: "collective: axis not in the mesh",
		text: collectiveBase + "%4 = all_reduce %2 : f32[4,8] {axis=\"pp\" place=[R,R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_reduce @model.go:40: axis "pp" is not in mesh dp=2,tp=2`,
	},
	{
		name: "collective: reduce_scatter of a whole value",
		text: collectiveBase + "%4 = reduce_scatter %1 : f32[8,8] {axis=\"dp\" dim=0 place=[S(0),R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 reduce_scatter @model.go:40: reduce_scatter on axis dp turns P into S(0), but the arg is R and the result S(0)`,
	},
	{
		name: "collective: reduce_scatter to another dim than its attr",
		text: collectiveBase + "%4 = reduce_scatter %2 : f32[4,8] {axis=\"dp\" dim=1 place=[S(0),R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 reduce_scatter @model.go:40: reduce_scatter on axis dp turns P into S(1), but the arg is P and the result S(0)`,
	},
	{
		name: "collective: all_gather of the wrong dim",
		text: collectiveBase + "%4 = all_gather %0 : f32[4,8] {axis=\"dp\" dim=1 place=[R,R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_gather @model.go:40: all_gather on axis dp turns S(1) into R, but the arg is S(0) and the result R`,
	},
	{
		name: "collective: shard_slice of a partial value",
		text: collectiveBase + "%4 = shard_slice %2 : f32[4,8] {axis=\"dp\" dim=0 place=[S(0),R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 shard_slice @model.go:40: shard_slice on axis dp turns R into S(0), but the arg is P and the result S(0)`,
	},
	{
		name: "collective: all_to_all from a dim the arg is not split on",
		text: collectiveBase + "%4 = all_to_all %0 : f32[4,8] {axis=\"dp\" from=1 to=0 place=[S(0),R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_to_all @model.go:40: all_to_all on axis dp turns S(1) into S(0), but the arg is S(0) and the result S(0)`,
	},
	{
		name: "collective: all_gather of fused blocks without its blocks",
		text: blockedBase + "%3 = all_gather %0 : f32[6,12] {axis=\"tp\" dim=1 place=[R,R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %3 all_gather @model.go:40: all_gather on axis tp turns S(1) into R, but the arg is S(1)x3 and the result R: its blocks attribute must be 3, as in S(1)x3`,
	},
	{
		name: "collective: all_gather with blocks of a plain split",
		text: collectiveBase + "%4 = all_gather %3 : f32[4,8] {axis=\"tp\" blocks=2 dim=1 place=[R,R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %4 all_gather @model.go:40: all_gather on axis tp turns S(1)x2 into R, but the arg is S(1) and the result R: its blocks attribute must be 1, as in S(1)`,
	},
	{
		name: "collective: shard_slice into fused blocks without its blocks",
		text: blockedBase + "%3 = shard_slice %1 : f32[6,12] {axis=\"tp\" dim=1 place=[R,S(1)x3]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %3 shard_slice @model.go:40: shard_slice on axis tp turns R into S(1), but the arg is R and the result S(1)x3: its blocks attribute must be 3, as in S(1)x3`,
	},
	{
		name: "collective: reduce_scatter with another block count",
		text: blockedBase + "%3 = reduce_scatter %2 : f32[6,12] {axis=\"tp\" blocks=2 dim=1 place=[R,S(1)x3]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %3 reduce_scatter @model.go:40: reduce_scatter on axis tp turns P into S(1)x2, but the arg is P and the result S(1)x3: its blocks attribute must be 3, as in S(1)x3`,
	},
	{
		name: "collective: blocked gather of the wrong dim",
		text: blockedBase + "%3 = all_gather %0 : f32[6,12] {axis=\"tp\" blocks=3 dim=0 place=[R,R]} @model.go:40\n",
		pass: "redistribute",
		rule: ir.RuleCollective,
		want: `after pass "redistribute": %3 all_gather @model.go:40: all_gather on axis tp turns S(0)x3 into R, but the arg is S(1)x3 and the result R`,
	},
	{
		name:   "collective: result placement changed after parsing",
		text:   collectiveBase + "%4 = all_reduce %2 : f32[4,8] {axis=\"dp\" place=[R,R]} @model.go:40\n",
		mutate: func(m *ir.Module) { m.Values[4].Place[0] = ir.Placement{Kind: ir.Partial} },
		pass:   "data-parallel",
		rule:   ir.RuleCollective,
		want:   `after pass "data-parallel": %4 all_reduce @model.go:40: all_reduce on axis dp turns P into R, but the arg is P and the result P`,
	},
	{
		name:   "output refers to a value not in the module",
		text:   verifyBase + "output \"loss\" = %1\n",
		mutate: func(m *ir.Module) { m.Outputs[0].Value = &ir.Value{ID: 99, Op: "neg", Meta: ir.NoMeta} },
		pass:   "shard",
		rule:   ir.RuleOutput,
		want:   `after pass "shard": output "loss" refers to %99, which is not in the module`,
	},
	{
		name:   "output without a value",
		text:   verifyBase + "output \"loss\" = %1\n",
		mutate: func(m *ir.Module) { m.Outputs[0].Value = nil },
		pass:   "",
		rule:   ir.RuleOutput,
		want:   `output "loss" refers to %?, which is not in the module`,
	},
	{
		name: "output defined twice",
		text: verifyBase + "output \"loss\" = %1\noutput \"loss\" = %0\n",
		pass: "shard",
		rule: ir.RuleOutput,
		want: `after pass "shard": output "loss" is defined twice`,
	},
	{
		name: "update of a non-source value",
		text: verifyBase + "%2 = neg %1 : f32[8,8] @model.go:40\nupdate %2 = %1\n",
		pass: "optimizer",
		rule: ir.RuleUpdate,
		want: `after pass "optimizer": %2 neg @model.go:40: only param and state values can be updated`,
	},
	{
		name: "update of an input",
		text: verifyBase + "%2 = neg %0 : f32[4,8] @model.go:40\nupdate %0 = %2\n",
		pass: "optimizer",
		rule: ir.RuleUpdate,
		want: `after pass "optimizer": %0 input @model.go:29: only param and state values can be updated`,
	},
	{
		name: "update with a value of another type",
		text: verifyBase + "update %1 = %0\n",
		pass: "optimizer",
		rule: ir.RuleUpdate,
		want: `after pass "optimizer": %1 param @model.go:33: updated with %0 of type f32[4,8], want f32[8,8]`,
	},
	{
		name: "update twice",
		text: verifyBase + "%2 = neg %1 : f32[8,8] @model.go:40\n%3 = neg %2 : f32[8,8] @model.go:40\nupdate %1 = %2\nupdate %1 = %3\n",
		pass: "optimizer",
		rule: ir.RuleUpdate,
		want: `after pass "optimizer": %1 param @model.go:33: updated twice in one step`,
	},
	{
		name:   "update refers to a value not in the module",
		text:   verifyBase + "%2 = neg %1 : f32[8,8] @model.go:40\nupdate %1 = %2\n",
		mutate: func(m *ir.Module) { m.Updates[0].Value = nil },
		pass:   "optimizer",
		rule:   ir.RuleUpdate,
		want:   `after pass "optimizer": update %1 = %? refers to a value not in the module`,
	},
	{
		name: "id not below the next id",
		text: verifyBase + "%2 = neg %0 : f32[4,8] @model.go:34\n",
		mutate: func(m *ir.Module) {
			x := m.Values[0]
			m.Values = append(m.Values, &ir.Value{ID: m.NextID() + 5, Op: "neg", Args: []*ir.Value{x}, Type: x.Type, Meta: ir.NoMeta, Pos: ir.Pos{File: "model.go", Line: 44}})
		},
		pass: "shard",
		rule: ir.RuleNextID,
		want: `after pass "shard": %8 neg @model.go:44: id 8 is not below the module's next id 3`,
	},
}

// verifyErrors unpacks what Verify returned into its *ir.VerifyError parts.
func verifyErrors(t *testing.T, err error) []*ir.VerifyError {
	t.Helper()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var out []*ir.VerifyError
	for _, e := range errs {
		var ve *ir.VerifyError
		require.ErrorAs(t, e, &ve)
		out = append(out, ve)
	}
	return out
}

func TestVerifyRules(t *testing.T) {
	for _, tt := range verifyCases {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ir.Parse("broken.gir", tt.text)
			require.NoError(t, err, "the broken module must parse: only Verify rejects it")
			// The messages as a module built by the DSL gets them
			// (TestVerifyNamesTheDumpsLine covers the .gir line).
			for _, v := range m.Values {
				v.Read = ir.Pos{}
			}
			if tt.mutate != nil {
				require.NoError(t, ir.Verify(m, ""), "the module is valid before the mutation")
				tt.mutate(m)
			}
			err = ir.Verify(m, tt.pass)
			require.Error(t, err)
			var first *ir.VerifyError
			require.ErrorAs(t, err, &first)
			errs := verifyErrors(t, err)
			var rules []string
			for _, e := range errs {
				rules = append(rules, e.Rule)
				assert.Equal(t, tt.pass, e.Pass)
			}
			assert.Equal(t, append([]string{tt.rule}, tt.others...), rules, "errors: %v", err)
			assert.Equal(t, tt.rule, first.Rule)
			assert.Equal(t, tt.want, first.Error())
			assert.Equal(t, tt.want, err.Error(), "a single error prints as itself")
			if tt.pass != "" {
				assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("after pass %q: ", tt.pass)))
			}
			if first.Value != nil {
				assert.Contains(t, err.Error(), first.Value.Ref()+" "+first.Value.Op+" @model.go:")
			}
		})
	}
}

// TestVerifyGPTPositions breaks the compiled reference GPT and checks that
// the diagnostic points at the user's model.go line, not at the compiler.
func TestVerifyGPTPositions(t *testing.T) {
	m := compileTinyGPT(t)
	require.NoError(t, ir.Verify(m, "optimizer"))
	wte := m.Source("wte.weight")
	require.NotNil(t, wte)
	var head *ir.Value // the tied LM head x·wteᵀ (model.go:41)
	for _, v := range m.Values {
		if v.Op == "matmul" && v.Meta.Phase == ir.PhaseFwd && len(v.Args) == 2 && v.Args[1] == wte {
			head = v
		}
	}
	require.NotNil(t, head)
	require.True(t, head.Attrs.Bool("transB"))
	head.Attrs["transB"] = false

	err := ir.Verify(m, "optimizer")
	var ve *ir.VerifyError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, ir.RuleOpRule, ve.Rule)
	assert.Same(t, head, ve.Value)
	prefix := fmt.Sprintf("after pass \"optimizer\": %s matmul @model.go:41: inner dims differ", head.Ref())
	assert.True(t, strings.HasPrefix(err.Error(), prefix), "got %q, want prefix %q", err, prefix)
}

// TestVerifyReportsAtMostTen checks that a badly broken module gives the
// first ten errors, in program order, not thousands.
func TestVerifyReportsAtMostTen(t *testing.T) {
	var b strings.Builder
	b.WriteString(verifyBase)
	for i := 2; i < 16; i++ {
		fmt.Fprintf(&b, "%%%d = neg %%0 : f32[4,9] @model.go:%d\n", i, 100+i)
	}
	m, err := ir.Parse("many.gir", b.String())
	require.NoError(t, err)
	errs := verifyErrors(t, ir.Verify(m, "shard"))
	require.Len(t, errs, 10)
	for i, e := range errs {
		assert.Equal(t, ir.RuleTypeMatch, e.Rule)
		assert.Equal(t, i+2, e.Value.ID)
		assert.Equal(t, ir.Pos{File: "model.go", Line: 102 + i}, e.Value.Pos)
	}
	// The joined text lists them one per line.
	assert.Len(t, strings.Split(ir.Verify(m, "shard").Error(), "\n"), 10)
}

func TestVerifyErrorText(t *testing.T) {
	v := &ir.Value{ID: 17, Op: "matmul", Pos: ir.Pos{File: "model.go", Line: 41}}
	tests := []struct {
		name string
		err  ir.VerifyError
		want string
	}{
		{"pass and value", ir.VerifyError{Pass: "shard", Value: v, Rule: ir.RuleOpRule, Msg: "boom"}, `after pass "shard": %17 matmul @model.go:41: boom`},
		{"input", ir.VerifyError{Value: v, Rule: ir.RuleOpRule, Msg: "boom"}, `%17 matmul @model.go:41: boom`},
		{"module level", ir.VerifyError{Pass: "shard", Rule: ir.RuleOutput, Msg: "boom"}, `after pass "shard": boom`},
		{"unknown position", ir.VerifyError{Pass: "fuse", Value: &ir.Value{ID: 3, Op: "add"}, Msg: "boom"}, `after pass "fuse": %3 add @?: boom`},
		{"pass name with quotes", ir.VerifyError{Pass: `a"b`, Msg: "boom"}, `after pass "a\"b": boom`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.err.Error())
		})
	}
}

func TestVerifyValid(t *testing.T) {
	// Things the verifier must accept: two consts share no name, a
	// replicated or partial placement of any shape, state updated once.
	m, err := ir.Parse("ok.gir", `gir 1
module "ok"
mesh dp=2,tp=4
%0 = const : f32[] {value=1} @model.go:1
%1 = const : f32[] {value=2} @model.go:2
%2 = param : f32[3,8] {name="w" place=[R,S(1)]} @model.go:3
%3 = state : f32[3,8] {name="m" place=[P,R]} @model.go:4
%4 = scale %2, %0 : f32[3,8] {place=[R,S(1)]} @model.go:5
%5 = add %3, %3 : f32[3,8] @model.go:6
output "loss" = %1
update %3 = %5
update %2 = %4
`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, "shard"))
	require.NoError(t, ir.Verify(ir.NewModule("empty"), ""))
}

// TestVerifyValidCollectives: every collective of the conversion table,
// applied as the redistribute pass applies it, verifies; so does a chain
// of two on different axes.
func TestVerifyValidCollectives(t *testing.T) {
	m, err := ir.Parse("ok.gir", collectiveBase+`%4 = all_reduce %2 : f32[4,8] {axis="dp" bucket=0 place=[R,R]} @model.go:40
%5 = reduce_scatter %2 : f32[4,8] {axis="dp" dim=1 bucket=1 place=[S(1),R]} @model.go:41
%6 = all_gather %0 : f32[4,8] {axis="dp" dim=0 place=[R,R]} @model.go:42
%7 = shard_slice %1 : f32[8,8] {axis="tp" dim=0 place=[R,S(0)]} @model.go:43
%8 = all_to_all %0 : f32[4,8] {axis="dp" from=0 to=1 place=[S(1),R]} @model.go:44
%9 = all_gather %3 : f32[4,8] {axis="tp" dim=1 place=[R,R]} @model.go:45
%10 = shard_slice %9 : f32[4,8] {axis="dp" dim=0 place=[S(0),R]} @model.go:46
`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, "redistribute"))
	text := ir.Print(m)
	again, err := ir.Parse("ok.gir", text)
	require.NoError(t, err)
	assert.Equal(t, text, ir.Print(again))
}

// TestVerifyValidBlockedCollectives: collectives whose blocks match the
// fused split they gather, scatter or slice verify, alone and chained with
// a plain one on the other axis, and print their blocks (only where set)
// so the text round-trips.
func TestVerifyValidBlockedCollectives(t *testing.T) {
	m, err := ir.Parse("ok.gir", blockedBase+`%3 = all_gather %0 : f32[6,12] {axis="tp" blocks=3 dim=1 place=[R,R]} @model.go:40
%4 = shard_slice %1 : f32[6,12] {axis="tp" blocks=3 dim=1 place=[R,S(1)x3]} @model.go:41
%5 = reduce_scatter %2 : f32[6,12] {axis="tp" blocks=3 dim=1 place=[R,S(1)x3]} @model.go:42
%6 = shard_slice %0 : f32[6,12] {axis="dp" dim=0 place=[S(0),S(1)x3]} @model.go:43
%7 = all_gather %6 : f32[6,12] {axis="tp" blocks=3 dim=1 place=[S(0),R]} @model.go:44
%8 = shard_slice %1 : f32[6,12] {axis="tp" blocks=1 dim=1 place=[R,S(1)]} @model.go:45
`)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, "redistribute"))
	text := ir.Print(m)
	assert.Equal(t, 5, strings.Count(text, "blocks="), "blocks are printed where given")
	again, err := ir.Parse("ok.gir", text)
	require.NoError(t, err)
	assert.Equal(t, text, ir.Print(again))
}

// TestVerifyCollectiveWithoutPlacement: a collective is a change of
// placement, so one whose arg or result carries no placement (or that sits
// in a module without a mesh) cannot be right.
func TestVerifyCollectiveWithoutPlacement(t *testing.T) {
	cases := map[string]string{
		"no mesh":         "gir 1\nmodule \"m\"\n%0 = input : f32[4,8] {name=\"x\"} @model.go:1\n%1 = all_reduce %0 : f32[4,8] {axis=\"dp\"} @model.go:2\n",
		"result unplaced": "gir 1\nmodule \"m\"\nmesh dp=2\n%0 = input : f32[4,8] {name=\"x\" place=[R]} @model.go:1\n%1 = all_reduce %0 : f32[4,8] {axis=\"dp\"} @model.go:2\n",
		"arg unplaced":    "gir 1\nmodule \"m\"\nmesh dp=2\n%0 = input : f32[4,8] {name=\"x\"} @model.go:1\n%1 = all_reduce %0 : f32[4,8] {axis=\"dp\" place=[R]} @model.go:2\n",
		"gather unplaced": "gir 1\nmodule \"m\"\nmesh dp=2\n%0 = input : f32[4,8] {name=\"x\"} @model.go:1\n%1 = all_gather %0 : f32[4,8] {axis=\"dp\" dim=0} @model.go:2\n",
	}
	for name, text := range cases {
		t.Run(name, func(t *testing.T) {
			m, err := ir.Parse("broken.gir", text)
			require.NoError(t, err)
			err = ir.Verify(m, "redistribute")
			require.Error(t, err)
			errs := verifyErrors(t, err)
			assert.Equal(t, ir.RuleCollective, errs[0].Rule)
		})
	}
}

// parseErrorCases each trigger one message of the parser.
var parseErrorCases = []struct {
	name string
	text string
	line int
	msg  string
}{
	{"wrong version", "gir 2\nmodule \"m\"\n", 1, `first line must be "gir 1", got "gir 2"`},
	{"version after comments", "# c\n\ngir 0\n", 3, `first line must be "gir 1", got "gir 0"`},
	{"no header", "module \"m\"\n", 1, `first line must be "gir 1", got "module \"m\""`},
	{"empty input", "", 1, `missing "gir 1" header or module line`},
	{"no module line", "gir 1\n", 2, `missing "gir 1" header or module line`},
	{"unquoted module name", "gir 1\nmodule m\n", 2, `invalid syntax`},
	{"mesh axis without size", "gir 1\nmodule \"m\"\nmesh dp\n", 3, `bad mesh axis "dp": want name=size`},
	{"mesh axis with a bad size", "gir 1\nmodule \"m\"\nmesh dp=2,tp=x\n", 3, `bad mesh axis "tp=x": want name=size`},
	{"mesh axis of size 0", "gir 1\nmodule \"m\"\nmesh dp=2,tp=0\n", 3, `bad mesh axis "tp=0": size must be at least 1`},
	{"mesh axis of negative size", "gir 1\nmodule \"m\"\nmesh dp=-2\n", 3, `bad mesh axis "dp=-2": size must be at least 1`},
	{"mesh axis without name", "gir 1\nmodule \"m\"\nmesh =2\n", 3, `bad mesh axis "=2": want name=size`},
	{"unexpected line", "gir 1\nmodule \"m\"\nfrob\n", 3, `unexpected line "frob"`},
	{"indented comment", "gir 1\nmodule \"m\"\n  # c\n", 3, `unexpected line "  # c"`},
	{"value without =", verifyBase + "%2\n", 5, `want %N = op args : type, got "%2"`},
	{"bad value id", verifyBase + "%x = neg %0 : f32[4,8]\n", 5, `bad value id "%x"`},
	{"negative value id", verifyBase + "%-2 = neg %0 : f32[4,8]\n", 5, `bad value id "%-2"`},
	{"value id whose successor overflows", verifyBase + "%9223372036854775807 = neg %0 : f32[4,8]\n", 5, `bad value id "%9223372036854775807"`},
	{"value id out of range", verifyBase + "%99999999999999999999 = neg %0 : f32[4,8]\n", 5, `bad value id "%99999999999999999999"`},
	{"module twice", verifyBase + "module \"other\"\n", 5, `a second module line: a module has one`},
	{"export-config twice", "gir 1\nmodule \"m\"\nexport-config \"{}\"\nexport-config \"{}\"\n", 4, `a second export-config line: a module has one`},
	{"export-config not an object", "gir 1\nmodule \"m\"\nexport-config \"[1]\"\n", 3, `export-config "[1]": want a JSON object`},
	{"value defined twice", verifyBase + "%1 = neg %0 : f32[4,8]\n", 5, `%1 is defined twice`},
	{"value without type", verifyBase + "%2 = neg %0\n", 5, `missing " : type" in "%2 = neg %0"`},
	{"unknown op", verifyBase + "%2 = frob %0 : f32[4,8]\n", 5, `unknown op "frob"`},
	{"arg not a reference", verifyBase + "%2 = neg 0 : f32[4,8]\n", 5, `want a value reference %N, got "0"`},
	{"empty arg", verifyBase + "%2 = add %0, : f32[4,8]\n", 5, `want a value reference %N, got ""`},
	{"bad arg reference", verifyBase + "%2 = neg %y : f32[4,8]\n", 5, `bad value reference "%y"`},
	{"forward reference", verifyBase + "%2 = neg %5 : f32[4,8]\n", 5, `%5 is used before it is defined`},
	{"self reference", verifyBase + "%2 = neg %2 : f32[4,8]\n", 5, `%2 is used before it is defined`},
	{"type without dims", verifyBase + "%2 = neg %0 : f32\n", 5, `bad type "f32": want dtype[dims], e.g. f32[4,128]`},
	{"unknown dtype", verifyBase + "%2 = neg %0 : f33[4,8]\n", 5, `unknown dtype "f33" (want f32, f16, bf16, f64, i32, i64 or bool)`},
	{"invalid dtype", verifyBase + "%2 = neg %0 : invalid[4,8]\n", 5, `unknown dtype "invalid" (want f32, f16, bf16, f64, i32, i64 or bool)`},
	{"bad dim", verifyBase + "%2 = neg %0 : f32[4,x]\n", 5, `bad dim "x" in type "f32[4,x]"`},
	{"unclosed brace", verifyBase + "%2 = neg %0 : f32[4,8] {layer=1\n", 5, `unclosed { in attributes`},
	{"unclosed brace inside a string", verifyBase + "%2 = param : f32[2] {name=\"}\n", 5, `bad quoted string in attributes: invalid syntax`},
	{"junk after type", verifyBase + "%2 = neg %0 : f32[4,8] junk\n", 5, `unexpected "junk" after type`},
	{"junk after attributes", verifyBase + "%2 = neg %0 : f32[4,8] {layer=1} junk\n", 5, `unexpected "junk" after type`},
	{"position without line", verifyBase + "%2 = neg %0 : f32[4,8] @model.go\n", 5, `bad position "@model.go": want @file:line`},
	{"position without file", verifyBase + "%2 = neg %0 : f32[4,8] @:3\n", 5, `bad position "@:3": want @file:line`},
	{"position with a bad line", verifyBase + "%2 = neg %0 : f32[4,8] @model.go:x\n", 5, `bad position "@model.go:x": want @file:line`},
	{"attribute without =", verifyBase + "%2 = neg %0 : f32[4,8] {layer}\n", 5, `want key=value in attributes, got "layer"`},
	{"attribute without key", verifyBase + "%2 = neg %0 : f32[4,8] {=1}\n", 5, `want key=value in attributes, got "=1"`},
	{"attribute key with a space", verifyBase + "%2 = neg %0 : f32[4,8] {layer 1=2}\n", 5, `want key=value in attributes, got "layer 1=2"`},
	{"attribute with a bad quoted string", verifyBase + "%2 = param : f32[2] {name='\"' init=\" x}\n", 5, `attribute init: bad quoted string`},
	{"unclosed list", verifyBase + "%2 = reshape %0 : f32[32] {shape=[32}\n", 5, `attribute shape: unclosed [`},
	{"place not a list", verifyBase + "%2 = neg %0 : f32[4,8] {place=R}\n", 5, `place must be a [list], got "R"`},
	{"bad placement", verifyBase + "%2 = neg %0 : f32[4,8] {place=[R,Q]}\n", 5, `bad placement "Q": want R, P or S(dim)`},
	{"bad shard dim", verifyBase + "%2 = neg %0 : f32[4,8] {place=[S(x)]}\n", 5, `bad shard dim in placement "S(x)"`},
	{"negative layer", verifyBase + "%2 = neg %0 : f32[4,8] {layer=-1}\n", 5, `layer must be a non-negative integer, got "-1"`},
	{"bad stage", verifyBase + "%2 = neg %0 : f32[4,8] {stage=x}\n", 5, `stage must be a non-negative integer, got "x"`},
	{"bad chunk", verifyBase + "%2 = neg %0 : f32[4,8] {chunk=1.5}\n", 5, `chunk must be a non-negative integer, got "1.5"`},
	{"unknown phase", verifyBase + "%2 = neg %0 : f32[4,8] {phase=fwdd}\n", 5, `unknown phase "fwdd" (want fwd, bwd, opt or recompute)`},
	{"unknown attribute", verifyBase + "%2 = neg %0 : f32[4,8] {foo=1}\n", 5, `op neg has no attribute "foo"`},
	{"attribute given twice", verifyBase + "%2 = matmul %0, %1 : f32[4,8] {transB=true transB=false}\n", 5, `attribute transB given twice`},
	{"bad int attribute", verifyBase + "%2 = slice %0 : f32[4,4] {dim=x start=0 end=4}\n", 5, `attribute dim: strconv.Atoi: parsing "x": invalid syntax`},
	{"bad float attribute", verifyBase + "%2 = causal_mask %0 : f32[4,8] {fill=x}\n", 5, `attribute fill: strconv.ParseFloat: parsing "x": invalid syntax`},
	{"float attribute out of range", verifyBase + "%2 = causal_mask %0 : f32[4,8] {fill=1e999}\n", 5, `attribute fill: strconv.ParseFloat: parsing "1e999": value out of range`},
	{"bad bool attribute", verifyBase + "%2 = matmul %0, %1 : f32[4,8] {transB=yes}\n", 5, `attribute transB: strconv.ParseBool: parsing "yes": invalid syntax`},
	{"unquoted string attribute", verifyBase + "%2 = param : f32[2] {name=b}\n", 5, `attribute name: invalid syntax`},
	{"ints attribute not a list", verifyBase + "%2 = reshape %0 : f32[32] {shape=32}\n", 5, `attribute shape: want [ints], got "32"`},
	{"bad int in list", verifyBase + "%2 = reshape %0 : f32[32] {shape=[4,x]}\n", 5, `attribute shape: bad int "x" in list`},
	{"output without =", verifyBase + "output \"loss\"\n", 5, `want output "name" = %N`},
	{"output name unquoted", verifyBase + "output loss = %0\n", 5, `bad output name loss`},
	{"output of a non-reference", verifyBase + "output \"loss\" = 0\n", 5, `want a value reference %N, got "0"`},
	{"output of an undefined value", verifyBase + "output \"loss\" = %7\n", 5, `%7 is used before it is defined`},
	{"update without =", verifyBase + "update %1\n", 5, `want update %STATE = %VALUE`},
	{"update of an undefined state", verifyBase + "update %7 = %1\n", 5, `%7 is used before it is defined`},
	{"update to a non-reference", verifyBase + "update %1 = w\n", 5, `want a value reference %N, got "w"`},
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorCases {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ir.Parse("bad.gir", tt.text)
			require.Error(t, err)
			assert.Nil(t, m)
			var pe *ir.ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "bad.gir", pe.File)
			assert.Equal(t, tt.line, pe.Line)
			assert.Equal(t, tt.msg, pe.Msg)
			assert.Equal(t, fmt.Sprintf("bad.gir:%d: %s", tt.line, tt.msg), err.Error())
		})
	}
}

// A collective that is not placed on both sides cannot say what it moves.
func TestVerifyCollectiveNeedsPlacements(t *testing.T) {
	for _, text := range []string{
		"gir 1\nmodule \"m\"\n%0 = param : f32[4] {name=\"p\"}\n%1 = all_reduce %0 : f32[4] {axis=\"dp\"}\n",
		"gir 1\nmodule \"m\"\nmesh dp=2\n%0 = param : f32[4] {name=\"p\"}\n%1 = all_reduce %0 : f32[4] {axis=\"dp\" place=[R]}\n",
	} {
		m, err := ir.Parse("c.gir", text)
		require.NoError(t, err)
		var ve *ir.VerifyError
		require.ErrorAs(t, ir.Verify(m, "redistribute"), &ve)
		assert.Equal(t, ir.RuleCollective, ve.Rule)
		assert.Contains(t, ve.Error(), `after pass "redistribute": %1 all_reduce`)
	}
}

// A const table reads back exactly what was written (the shortest text of
// each float64, NaN and infinities included), and the verifier refuses a
// table whose count does not match its shape, a number that is not one, or
// a table that also has a fill value.
func TestConstTables(t *testing.T) {
	values := []float64{0.1, -2.5e-300, 1.0 / 3, 0}
	m, err := ir.Parse("t.gir", fmt.Sprintf("gir 1\nmodule \"t\"\n%%0 = const : f64[2,2] {name=\"table\" data=%q}\n", ir.FormatConstData(values)))
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	got, err := ir.ConstData(m.Values[0])
	require.NoError(t, err)
	assert.Equal(t, values, got)

	for _, tc := range []struct{ attrs, want string }{
		{`name="t" data="1 2 3"`, `const "t" f32[2,2] holds 3 numbers, want 4`},
		{`name="t" data="1 2 x 4"`, `const "t": element 2: "x" is not a number`},
		{`name="t" value=1 data="1 2 3 4"`, `const "t" has both a value and data`},
	} {
		m, err := ir.Parse("t.gir", "gir 1\nmodule \"t\"\n%0 = const : f32[2,2] {"+tc.attrs+"}\n")
		require.NoError(t, err)
		assert.ErrorContains(t, ir.Verify(m, ""), tc.want)
	}
}

// An edited dump's error names the line to fix besides the model's.
func TestVerifyNamesTheDumpsLine(t *testing.T) {
	m, err := ir.Parse("edited.gir", "gir 1\nmodule \"m\"\n\n%0 = input : f32[4,8] {name=\"x\"} @model.go:29\n%1 = param : f32[8,8] {name=\"w\"} @model.go:33\nupdate %1 = %0\n")
	require.NoError(t, err)
	err = ir.Verify(m, "")
	require.Error(t, err)
	assert.Equal(t, "%1 param @model.go:33 (edited.gir:5): updated with %0 of type f32[4,8], want f32[8,8]", err.Error())
}
