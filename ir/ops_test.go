package ir_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

// Short type constructors for the tables.
func f32(dims ...int) ir.Type   { return ir.T(ir.F32, dims...) }
func f64(dims ...int) ir.Type   { return ir.T(ir.F64, dims...) }
func bf16(dims ...int) ir.Type  { return ir.T(ir.BF16, dims...) }
func i32(dims ...int) ir.Type   { return ir.T(ir.I32, dims...) }
func i64(dims ...int) ir.Type   { return ir.T(ir.I64, dims...) }
func boolT(dims ...int) ir.Type { return ir.T(ir.Bool, dims...) }
func u8(dims ...int) ir.Type    { return ir.T(ir.U8, dims...) }

func types(ts ...ir.Type) []ir.Type { return ts }

// argValues wraps types as values, as a pass would hand them to InferType.
func argValues(ts []ir.Type) []*ir.Value {
	vs := make([]*ir.Value, len(ts))
	for i, t := range ts {
		vs[i] = &ir.Value{ID: i, Op: "input", Type: t, Attrs: ir.Attrs{"name": fmt.Sprint("a", i)}, Meta: ir.NoMeta}
	}
	return vs
}

// validOps are well-typed uses of every op in the table, with the type the
// op's rule must infer (for source ops: the declared type).
var validOps = []struct {
	op    string
	args  []ir.Type
	attrs ir.Attrs
	want  ir.Type
}{
	{"param", nil, ir.Attrs{"name": "w", "init": "normal(0.02)", "parallel": "column"}, f32(4, 8)},
	{"param", nil, ir.Attrs{"name": "b"}, f64(8)},
	{"state", nil, ir.Attrs{"name": "m", "init": "zeros"}, f32(4, 8)},
	{"input", nil, ir.Attrs{"name": "tokens"}, i32(2, 16)},
	{"input", nil, ir.Attrs{"name": "lr"}, f32()},
	{"const", nil, ir.Attrs{"value": -0.5}, f32()},

	{"add", types(f32(4, 8), f32(4, 8)), nil, f32(4, 8)},
	{"add", types(i32(3), i32(3)), nil, i32(3)},
	{"sub", types(bf16(2), bf16(2)), nil, bf16(2)},
	{"mul", types(f32(), f32()), nil, f32()},
	{"div", types(f64(2, 2), f64(2, 2)), nil, f64(2, 2)},
	{"neg", types(f64(5)), nil, f64(5)},
	{"neg", types(bf16(4, 8)), nil, bf16(4, 8)},
	{"exp", types(f32(4, 8)), nil, f32(4, 8)},
	{"log", types(f32(4)), nil, f32(4)},
	{"tanh", types(f64()), nil, f64()},
	{"sqrt", types(f32(1, 1)), nil, f32(1, 1)},
	{"gelu", types(f32(2, 16, 128)), nil, f32(2, 16, 128)},
	{"relu", types(bf16(2, 16, 128)), nil, bf16(2, 16, 128)},
	{"gelu_grad", types(f32(2, 8), f32(2, 8)), nil, f32(2, 8)},
	{"relu_grad", types(f32(2, 8), f32(2, 8)), nil, f32(2, 8)},
	{"tanh_grad", types(f32(3), f32(3)), nil, f32(3)},
	{"fused", types(f32(2, 8), f32(2, 8), f32(2, 8)), ir.Attrs{"body": "t0=add a0 a1; t1=gelu t0; t2=adam_m t1 a2 beta1=0.9"}, f32(2, 8)},
	{"relu_mask", types(f32(2, 16, 128)), nil, u8(2, 16, 16)},
	{"relu_mask", types(bf16(4, 13)), nil, u8(4, 2)}, // a partial last byte
	{"relu_mask", types(f64(1)), nil, u8(1)},
	{"relu_grad_mask", types(u8(2, 16, 16), f32(2, 16, 128)), nil, f32(2, 16, 128)},
	{"relu_grad_mask", types(u8(4, 2), bf16(4, 13)), nil, bf16(4, 13)},
	{"scale", types(f32(4, 8), f32()), nil, f32(4, 8)},
	{"scale", types(f64(), f64()), nil, f64()},

	{"matmul", types(f32(4, 8), f32(8, 16)), nil, f32(4, 16)},
	{"matmul", types(f32(2, 4, 8), f32(8, 16)), nil, f32(2, 4, 16)},
	{"matmul", types(f32(2, 4, 8), f32(16, 8)), ir.Attrs{"transB": true}, f32(2, 4, 16)},
	{"matmul", types(f32(8, 4), f32(8, 16)), ir.Attrs{"transA": true}, f32(4, 16)},
	{"matmul", types(f32(8, 4), f32(16, 8)), ir.Attrs{"transA": true, "transB": true}, f32(4, 16)},
	{"matmul", types(bf16(3, 4, 8), bf16(3, 8, 5)), ir.Attrs{"transA": false}, bf16(3, 4, 5)},
	{"reshape", types(f32(2, 3, 4)), ir.Attrs{"shape": []int{6, 4}}, f32(6, 4)},
	{"reshape", types(f32(1, 1)), ir.Attrs{"shape": []int{}}, f32()},
	{"transpose", types(f32(2, 3, 4)), ir.Attrs{"perm": []int{2, 0, 1}}, f32(4, 2, 3)},
	{"transpose", types(i32()), ir.Attrs{"perm": []int{}}, i32()},
	{"slice", types(f32(4, 8)), ir.Attrs{"dim": 1, "start": 2, "end": 6}, f32(4, 4)},
	{"slice", types(f32(4, 8)), ir.Attrs{"dim": 0, "start": 0, "end": 4}, f32(4, 8)},
	{"slice_grad", types(f32(4, 4)), ir.Attrs{"dim": 1, "start": 4, "size": 8}, f32(4, 8)},
	{"concat", types(f32(4, 2), f32(4, 3), f32(4, 1)), ir.Attrs{"dim": 1}, f32(4, 6)},
	{"concat", types(f32(4, 2)), ir.Attrs{"dim": 0}, f32(4, 2)},
	{"broadcast", types(f32(8)), ir.Attrs{"shape": []int{4, 8}}, f32(4, 8)},
	{"broadcast", types(f32(4, 1)), ir.Attrs{"shape": []int{2, 4, 8}}, f32(2, 4, 8)},
	{"broadcast", types(f32()), ir.Attrs{"shape": []int{3}}, f32(3)},
	{"reduce_sum", types(f32(4, 8)), ir.Attrs{"axes": []int{1}}, f32(4)},
	{"reduce_sum", types(f32(4, 8)), ir.Attrs{"axes": []int{}}, f32(4, 8)},
	{"reduce_mean", types(f32(4, 8)), ir.Attrs{"axes": []int{0, 1}, "keepdims": true}, f32(1, 1)},
	{"reduce_mean", types(f32(4, 8)), ir.Attrs{"axes": []int{0, 1}}, f32()},
	{"reduce_max", types(f32(2, 4, 8)), ir.Attrs{"axes": []int{2}, "keepdims": true}, f32(2, 4, 1)},
	{"reduce_max_grad", types(f32(4, 8), f32(4), f32(4)), ir.Attrs{"axes": []int{1}}, f32(4, 8)},
	{"reduce_max_grad", types(f32(4, 8), f32(4, 1), f32(4, 1)), ir.Attrs{"axes": []int{1}, "keepdims": true}, f32(4, 8)},
	{"softmax", types(f32(2, 4, 8)), nil, f32(2, 4, 8)},
	{"softmax", types(bf16(8)), nil, bf16(8)},
	{"softmax_grad", types(f32(2, 8), f32(2, 8)), nil, f32(2, 8)},
	{"causal_mask", types(f32(8, 4, 4)), nil, f32(8, 4, 4)},
	{"causal_mask", types(f32(2, 6)), ir.Attrs{"fill": -1e9}, f32(2, 6)},
	{"layernorm", types(f32(2, 4, 8), f32(8), f32(8)), ir.Attrs{"eps": 1e-5}, f32(2, 4, 8)},
	{"layernorm_grad_x", types(f32(2, 4, 8), f32(8), f32(2, 4, 8)), ir.Attrs{"eps": 1e-5}, f32(2, 4, 8)},
	{"layernorm_grad_gamma", types(f32(2, 4, 8), f32(2, 4, 8)), ir.Attrs{"eps": 1e-5}, f32(8)},
	{"rmsnorm", types(f32(2, 4, 8), f32(8)), ir.Attrs{"eps": 1e-6}, f32(2, 4, 8)},
	{"rmsnorm_grad_x", types(f64(2, 8), f64(8), f64(2, 8)), ir.Attrs{"eps": 1e-6}, f64(2, 8)},
	{"rmsnorm_grad_gamma", types(f32(2, 4, 8), f32(2, 4, 8)), ir.Attrs{"eps": 1e-6}, f32(8)},
	{"rope", types(f32(2, 4, 16, 8)), ir.Attrs{"theta": 10000.0}, f32(2, 4, 16, 8)},
	{"rope_at", types(f32(2, 4, 1, 8), i32(2, 1)), ir.Attrs{"theta": 10000.0}, f32(2, 4, 1, 8)},
	{"kv_write", types(f32(2, 2, 32, 8), f32(2, 2, 5, 8), i32(2, 5)), nil, f32(2, 2, 32, 8)},
	{"attention_at", types(f32(2, 4, 1, 8), f32(2, 2, 32, 8), f32(2, 2, 32, 8), i32(2, 1)), ir.Attrs{"scale": 0.35}, f32(2, 1, 4, 8)},
	{"rope", types(bf16(16, 8)), ir.Attrs{"theta": 500000.0, "inverse": true}, bf16(16, 8)},
	{"silu", types(f32(2, 16)), nil, f32(2, 16)},
	{"repeat_interleave", types(f32(2, 2, 5, 4)), ir.Attrs{"dim": 1, "repeats": 3}, f32(2, 6, 5, 4)},
	{"repeat_interleave", types(i32(3)), ir.Attrs{"dim": 0, "repeats": 1}, i32(3)},
	{"repeat_interleave_grad", types(f32(2, 6, 5, 4)), ir.Attrs{"dim": 1, "repeats": 3}, f32(2, 2, 5, 4)},
	{"silu_grad", types(f32(2, 8), f32(2, 8)), nil, f32(2, 8)},
	{"embedding", types(f32(256, 32), i32(2, 16)), nil, f32(2, 16, 32)},
	{"embedding", types(bf16(10, 4), i64()), nil, bf16(4)},
	{"embedding_grad", types(i32(2, 16), f32(2, 16, 32)), ir.Attrs{"vocab": 256}, f32(256, 32)},
	{"attention", types(f32(2, 4, 16, 8), f32(2, 2, 16, 8), f32(2, 2, 16, 8)), attn(true), f32(2, 16, 4, 8)},
	{"attention", types(bf16(1, 2, 3, 4), bf16(1, 2, 5, 4), bf16(1, 2, 5, 4)), attn(false), bf16(1, 3, 2, 4)},
	{"attention_stats", types(bf16(2, 4, 16, 8), bf16(2, 1, 16, 8), bf16(2, 16, 4, 8), bf16(2, 16, 4, 8)), attn(true), f32(2, 4, 16, 2)},
	{"attention_stats", types(f64(1, 2, 3, 4), f64(1, 2, 3, 4), f64(1, 3, 2, 4), f64(1, 3, 2, 4)), attn(false), f64(1, 2, 3, 2)},
	{"attention_grad_q", types(bf16(2, 4, 16, 8), bf16(2, 2, 16, 8), bf16(2, 2, 16, 8), bf16(2, 16, 4, 8), f32(2, 4, 16, 2)), attn(true), bf16(2, 4, 16, 8)},
	{"attention_grad_k", types(f32(2, 4, 16, 8), f32(2, 2, 16, 8), f32(2, 2, 16, 8), f32(2, 16, 4, 8), f32(2, 4, 16, 2)), attn(true), f32(2, 2, 16, 8)},
	{"attention_grad_v", types(f32(2, 4, 16, 8), f32(2, 2, 16, 8), f32(2, 16, 4, 8), f32(2, 4, 16, 2)), attn(true), f32(2, 2, 16, 8)},
	{"cross_entropy", types(f32(32, 256), i32(32)), nil, f32()},
	{"cross_entropy_grad", types(f32(32, 256), i64(32), f32()), nil, f32(32, 256)},
	{"cast", types(f32(4, 8)), ir.Attrs{"to": "bf16"}, bf16(4, 8)},
	{"cast", types(i32(3)), ir.Attrs{"to": "f64"}, f64(3)},
	{"redistribute", types(f32(4, 8)), nil, f32(4, 8)},
	{"all_reduce", types(f32(4, 8)), ir.Attrs{"axis": "dp", "bucket": 2}, f32(4, 8)},
	{"reduce_scatter", types(f32(4, 8)), ir.Attrs{"axis": "dp", "dim": 0}, f32(4, 8)},
	{"all_gather", types(f32(4, 8)), ir.Attrs{"axis": "tp", "dim": 1}, f32(4, 8)},
	{"shard_slice", types(f32(4, 8)), ir.Attrs{"axis": "tp", "dim": 1}, f32(4, 8)},
	{"all_gather", types(f32(4, 12)), ir.Attrs{"axis": "tp", "dim": 1, "blocks": 3}, f32(4, 12)},
	{"reduce_scatter", types(f32(4, 12)), ir.Attrs{"axis": "tp", "dim": 1, "blocks": 3}, f32(4, 12)},
	{"shard_slice", types(f32(6, 4)), ir.Attrs{"axis": "tp", "dim": 0, "blocks": 3}, f32(6, 4)},
	{"all_to_all", types(f32(4, 8)), ir.Attrs{"axis": "ep", "from": 0, "to": 1}, f32(4, 8)},
	// Mixture of experts: groups 2 of 6 tokens, 4 experts of 3 slots, hidden 8.
	{"top_k_mask", types(f32(2, 6, 4)), ir.Attrs{"k": 2}, f32(2, 6, 4)},
	{"less", types(f32(2, 3), f32(2, 3)), nil, f32(2, 3)},
	{"moe_route", types(f32(2, 6, 4), f32(2, 6, 4)), ir.Attrs{"capacity": 3}, i32(2, 4, 3)},
	{"moe_dispatch", types(f32(2, 6, 8), i32(2, 4, 3)), nil, f32(4, 2, 3, 8)},
	{"moe_dispatch", types(bf16(2, 6, 8), i32(2, 4, 3), f32(2, 4, 3)), nil, bf16(4, 2, 3, 8)},
	{"moe_combine", types(f32(4, 2, 3, 8), i32(2, 4, 3), f32(2, 4, 3)), ir.Attrs{"tokens": 6}, f32(2, 6, 8)},
	{"moe_slot_dot", types(bf16(4, 2, 3, 8), i32(2, 4, 3), bf16(2, 6, 8)), nil, f32(2, 4, 3)},
	{"moe_slot_gather", types(f32(2, 6, 4), i32(2, 4, 3)), nil, f32(2, 4, 3)},
	{"moe_slot_scatter", types(f32(2, 4, 3), i32(2, 4, 3)), ir.Attrs{"tokens": 6}, f32(2, 6, 4)},
	{"random", types(i32(2, 6)), ir.Attrs{"dist": "normal", "stream": 7, "dims": []int{4}}, f32(2, 6, 4)},
	{"random", types(i32(2, 6)), ir.Attrs{"dist": "dropout", "stream": 1, "p": 0.1, "dtype": "f64"}, f64(2, 6)},
	{"normal_cdf", types(f32(3)), nil, f32(3)},
	{"sum_squares", types(f32(4, 8), f32(8), f32()), nil, f32()},
	{"clip_coef", types(f32()), ir.Attrs{"max_norm": 1.0}, f32()},
	{"nonfinite_count", types(f32(4, 8), f32(8)), nil, f32()},
	{"where_finite", types(f32(), f32(4, 8), f32(4, 8)), nil, f32(4, 8)},
	{"adam_m", types(f32(4, 8), f32(4, 8)), ir.Attrs{"beta1": 0.9}, f32(4, 8)},
	{"adam_v", types(f32(4, 8), f32(4, 8)), ir.Attrs{"beta2": 0.95}, f32(4, 8)},
	{"adamw", types(f32(4, 8), f32(4, 8), f32(4, 8), f32(), i32()), ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "wd": 0.1}, f32(4, 8)},
	{"sgd_buf", types(f32(8), f32(8), f32(8)), ir.Attrs{"momentum": 0.9, "wd": 0.0}, f32(8)},
	{"sgd", types(f32(4, 8), f32(4, 8), f32()), nil, f32(4, 8)},
	{"adafactor_row", types(f32(4), f32(4, 8), i64()), adafactorAcc, f32(4)},
	{"adafactor_col", types(f32(8), f32(4, 8), i32()), adafactorAcc, f32(8)},
	{"adafactor_v", types(f32(8), f32(8), i64()), adafactorAcc, f32(8)},
	{"adafactor_v", types(f64(), f64(), i64()), adafactorAcc, f64()},
	{"adafactor", types(f32(4, 8), f32(4, 8), f32(4), f32(8), i64()), adafactorUpd, f32(4, 8)},
	{"adafactor_vec", types(f64(2, 2, 2), f64(2, 2, 2), f64(2, 2, 2), i64()), adafactorUpd, f64(2, 2, 2)},
	{"sm3_row", types(f32(4), f32(4, 8), f32(8)), nil, f32(4)},
	{"sm3_col", types(f32(8), f32(4, 8), f32(4)), nil, f32(8)},
	{"sm3_v", types(f32(8), f32(8)), nil, f32(8)},
	{"sm3", types(f32(4, 8), f32(4, 8), f32(4), f32(8), f32()), nil, f32(4, 8)},
	{"sm3_vec", types(f32(8), f32(8), f32(8), f32()), nil, f32(8)},
}

// The attributes the optimizer pass gives Adafactor's ops.
var (
	adafactorAcc = ir.Attrs{"eps1": 1e-30, "decay": 0.8}
	adafactorUpd = ir.Attrs{"eps2": 1e-3, "clip": 1.0, "rel_step": 1e-2}
)

// invalidOps break one rule each; rule is a phrase the error must contain,
// naming the rule that was broken.
var invalidOps = []struct {
	op    string
	args  []ir.Type
	attrs ir.Attrs
	rule  string
}{
	// Checks InferType makes for every op.
	{"add", types(f32(4)), nil, "takes 2 args, got 1"},
	{"layernorm", types(f32(4), f32(4)), ir.Attrs{"eps": 1e-5}, "takes 3 args, got 2"},
	{"concat", nil, ir.Attrs{"dim": 0}, "takes at least 1 args, got 0"},
	{"add", types(f32(4), f32(4)), ir.Attrs{"alpha": 1.0}, `unknown attribute "alpha" (op add takes [])`},
	{"matmul", types(f32(4, 4), f32(4, 4)), ir.Attrs{"transC": true}, `unknown attribute "transC" (op matmul takes [transA transB])`},
	{"reshape", types(f32(4)), nil, "missing required attribute shape (ints)"},
	{"adamw", types(f32(4), f32(4), f32(4), f32(), i32()), ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8}, "missing required attribute wd (float)"},
	{"reshape", types(f32(4)), ir.Attrs{"shape": "4"}, "attribute shape must be ints, got string"},
	{"slice", types(f32(4)), ir.Attrs{"dim": 0.0, "start": 0, "end": 2}, "attribute dim must be int, got float64"},
	{"clip_coef", types(f32()), ir.Attrs{"max_norm": 1}, "attribute max_norm must be float, got int"},
	{"matmul", types(f32(4, 4), f32(4, 4)), ir.Attrs{"transB": "true"}, "attribute transB must be bool, got string"},
	{"cast", types(f32(4)), ir.Attrs{"to": ir.BF16}, "attribute to must be string, got ir.DType"},

	// The type rules.
	{"add", types(f32(4, 8), f32(8, 4)), nil, "arg 1 is f32[8,4] but arg 0 is f32[4,8]: types must be equal"},
	{"sub", types(f32(4), f64(4)), nil, "types must be equal"},
	{"mul", types(boolT(2), boolT(2)), nil, "needs a numeric type, got bool[2]"},
	{"div", types(i32(2), f32(2)), nil, "types must be equal"},
	{"neg", types(i64(5)), nil, "needs a float type, got i64[5]"},
	{"neg", types(boolT()), nil, "needs a float type"},
	{"exp", types(i32(2)), nil, "needs a float type, got i32[2]"},
	{"log", types(i64()), nil, "needs a float type"},
	{"tanh", types(boolT(3)), nil, "needs a float type"},
	{"sqrt", types(i32(3)), nil, "needs a float type"},
	{"gelu", types(i32(3)), nil, "needs a float type"},
	{"relu", types(i64(3)), nil, "needs a float type"},
	{"gelu_grad", types(f32(2), f32(3)), nil, "types must be equal"},
	{"relu_grad", types(i32(2), i32(2)), nil, "needs a float type"},
	{"tanh_grad", types(f32(2), bf16(2)), nil, "types must be equal"},
	{"fused", types(f32(2), f32(3)), ir.Attrs{"body": "t0=add a0 a1"}, "types must be equal"},
	{"fused", types(f32(2), f32(2)), ir.Attrs{"body": "t0=matmul a0 a1"}, "not an elementwise op"},
	{"add", types(u8(4), u8(4)), nil, "needs a numeric type, got u8[4]"},
	{"cast", types(f32(4)), ir.Attrs{"to": "u8"}, "cannot cast f32[4] to u8: u8 holds packed bits, not numbers"},
	{"cast", types(u8(4)), ir.Attrs{"to": "f32"}, "cannot cast u8[4] to f32"},
	{"relu_mask", types(i32(4)), nil, "needs a float tensor of rank ≥ 1 to pack, got i32[4]"},
	{"relu_mask", types(f32()), nil, "needs a float tensor of rank ≥ 1 to pack, got f32[]"},
	{"relu_mask", types(f32(2), f32(2)), nil, "takes 1 args, got 2"},
	{"relu_grad_mask", types(u8(2, 3), f32(2, 16)), nil, "mask must be u8[2,2] (one bit per element of dy f32[2,16]), got u8[2,3]"},
	{"relu_grad_mask", types(u8(3, 2), f32(2, 16)), nil, "mask must be u8[2,2]"},
	{"relu_grad_mask", types(f32(2, 16), f32(2, 16)), nil, "mask must be u8[2,2] (one bit per element of dy f32[2,16]), got f32[2,16]"},
	{"relu_grad_mask", types(u8(2, 2), i32(2, 16)), nil, "dy must be a float tensor of rank ≥ 1, got i32[2,16]"},
	{"relu_grad_mask", types(u8(), f32()), nil, "dy must be a float tensor of rank ≥ 1, got f32[]"},
	{"scale", types(i32(4), i32()), nil, "needs a float tensor, got i32[4]"},
	{"scale", types(f32(4), f32(4)), nil, "scale factor must be a f32 scalar, got f32[4]"},
	{"scale", types(f32(4), f64()), nil, "scale factor must be a f32 scalar, got f64[]"},
	{"matmul", types(f32(8), f32(8, 4)), nil, "operands must have rank ≥ 2, got f32[8] and f32[8,4]"},
	{"matmul", types(f32(4, 8), bf16(8, 4)), nil, "operands must share one float dtype"},
	{"matmul", types(i32(4, 8), i32(8, 4)), nil, "operands must share one float dtype"},
	{"matmul", types(f32(4, 8), f32(4, 8)), nil, "inner dims differ: f32[4,8] · f32[4,8] (k=8 vs 4)"},
	{"matmul", types(f32(4, 8), f32(8, 4)), ir.Attrs{"transB": true}, "inner dims differ"},
	{"matmul", types(f32(4, 8), f32(8, 4)), ir.Attrs{"transA": true}, "inner dims differ: f32[4,8] · f32[8,4] (k=4 vs 8)"},
	{"matmul", types(f32(2, 4, 8), f32(3, 8, 4)), nil, "batch dims differ: f32[2,4,8] · f32[3,8,4]"},
	{"matmul", types(f32(4, 8), f32(2, 8, 4)), nil, "batch dims differ"},
	{"reshape", types(f32(2, 3)), ir.Attrs{"shape": []int{5}}, "reshape f32[2,3] to [5] changes the element count"},
	{"reshape", types(f32(2, 3)), ir.Attrs{"shape": []int{-1, 6}}, "reshape to [-1,6]: dims must be positive"},
	{"transpose", types(f32(2, 3, 4)), ir.Attrs{"perm": []int{1, 0}}, "perm [1 0] has 2 entries for rank 3"},
	{"transpose", types(f32(2, 3, 4)), ir.Attrs{"perm": []int{0, 0, 1}}, "perm [0 0 1] is not a permutation of 0..2"},
	{"transpose", types(f32(2, 3)), ir.Attrs{"perm": []int{0, 2}}, "is not a permutation of 0..1"},
	{"slice", types(f32(4, 8)), ir.Attrs{"dim": 2, "start": 0, "end": 1}, "dim 2 out of range for f32[4,8]"},
	{"slice", types(f32(4, 8)), ir.Attrs{"dim": 1, "start": 4, "end": 4}, "slice [4,4) of dim 1 (size 8) is empty or out of range"},
	{"slice", types(f32(4, 8)), ir.Attrs{"dim": 1, "start": 4, "end": 9}, "is empty or out of range"},
	{"slice", types(f32(4, 8)), ir.Attrs{"dim": 0, "start": -1, "end": 2}, "is empty or out of range"},
	{"slice_grad", types(f32(4, 4)), ir.Attrs{"dim": -1, "start": 0, "size": 8}, "dim -1 out of range"},
	{"slice_grad", types(f32(4, 4)), ir.Attrs{"dim": 1, "start": 6, "size": 8}, "slice_grad places 4 rows at 6 in a dim of size 8"},
	{"concat", types(f32(4, 2), f32(4, 3)), ir.Attrs{"dim": 2}, "dim 2 out of range"},
	{"concat", types(f32(4, 2), bf16(4, 3)), ir.Attrs{"dim": 1}, "arg 1 is bf16[4,3], arg 0 is f32[4,2]: dtype and rank must agree"},
	{"concat", types(f32(4, 2), f32(4)), ir.Attrs{"dim": 0}, "dtype and rank must agree"},
	{"concat", types(f32(4, 2), f32(5, 3)), ir.Attrs{"dim": 1}, "dims other than 1 must agree"},
	{"broadcast", types(f32(3)), ir.Attrs{"shape": []int{4, 8}}, "cannot broadcast f32[3] to [4,8]"},
	{"broadcast", types(f32(2, 8)), ir.Attrs{"shape": []int{8}}, "cannot broadcast"},
	{"reduce_sum", types(f32(4, 8)), ir.Attrs{"axes": []int{1, 0}}, "axes [1 0] must be increasing dims of f32[4,8]"},
	{"reduce_mean", types(f32(4, 8)), ir.Attrs{"axes": []int{2}}, "must be increasing dims"},
	{"reduce_max", types(f32(4, 8)), ir.Attrs{"axes": []int{0, 0}}, "must be increasing dims"},
	{"reduce_sum", types(i32(4, 8)), ir.Attrs{"axes": []int{0}}, "needs a float tensor, got i32[4,8]"},
	{"reduce_max_grad", types(f32(4, 8), f32(8), f32(4)), ir.Attrs{"axes": []int{1}}, "y and dy must be f32[4], got f32[8] and f32[4]"},
	{"reduce_max_grad", types(f32(4, 8), f32(4), f32(4)), ir.Attrs{"axes": []int{3}}, "must be increasing dims"},
	{"softmax", types(f32()), nil, "needs a float tensor of rank ≥ 1, got f32[]"},
	{"softmax", types(i32(4)), nil, "needs a float tensor of rank ≥ 1"},
	{"softmax_grad", types(f32(2, 8), f32(8, 2)), nil, "types must be equal"},
	{"causal_mask", types(f32(4)), nil, "needs a float tensor [...,s,t], got f32[4]"},
	{"causal_mask", types(f32(6, 2)), nil, "more queries than keys in f32[6,2]"},
	{"layernorm", types(f32(2, 8), f32(4), f32(8)), ir.Attrs{"eps": 1e-5}, "gamma must be f32[8] to match f32[2,8], got f32[4]"},
	{"layernorm", types(f32(2, 8), f32(8), bf16(8)), ir.Attrs{"eps": 1e-5}, "beta must be f32[8] to match f32[2,8], got bf16[8]"},
	{"layernorm", types(f32(), f32(), f32()), ir.Attrs{"eps": 1e-5}, "needs a float tensor of rank ≥ 1"},
	{"layernorm_grad_x", types(f32(2, 8), f32(8), f32(2, 4)), ir.Attrs{"eps": 1e-5}, "dy must be f32[2,8], got f32[2,4]"},
	{"layernorm_grad_x", types(f32(2, 8), f32(8, 1), f32(2, 8)), ir.Attrs{"eps": 1e-5}, "gamma must be f32[8]"},
	{"layernorm_grad_gamma", types(f32(2, 8), f32(2, 4)), ir.Attrs{"eps": 1e-5}, "dy must be f32[2,8], got f32[2,4]"},
	{"rmsnorm", types(f32(2, 8), f32(4)), ir.Attrs{"eps": 1e-6}, "gamma must be f32[8] to match f32[2,8], got f32[4]"},
	{"rmsnorm", types(i32(2, 8), i32(8)), ir.Attrs{"eps": 1e-6}, "needs a float tensor of rank ≥ 1"},
	{"rmsnorm_grad_x", types(f32(2, 8), f32(8), f32(2, 4)), ir.Attrs{"eps": 1e-6}, "dy must be f32[2,8], got f32[2,4]"},
	{"rmsnorm_grad_gamma", types(f32(2, 8), f32(8)), ir.Attrs{"eps": 1e-6}, "dy must be f32[2,8], got f32[8]"},
	{"rope", types(f32(4, 7)), ir.Attrs{"theta": 10000.0}, "with d even"},
	{"rope_at", types(f32(2, 4, 3, 8), i32(2, 1)), ir.Attrs{"theta": 10000.0}, "positions must be i32[2, 3]"},
	{"rope_at", types(f32(4, 8), i32(4)), ir.Attrs{"theta": 10000.0}, "needs x [batch, heads, step, d]"},
	{"kv_write", types(f32(2, 2, 4, 8), f32(2, 2, 5, 8), i32(2, 5)), nil, "new keys must be f32[2, 2, ≤4, 8]"},
	{"kv_write", types(f32(2, 2, 32, 8), f32(2, 2, 5, 8), f32(2, 5)), nil, "positions must be i32[2, 5]"},
	{"attention_at", types(f32(2, 4, 1, 8), f32(2, 2, 32, 8), f32(2, 2, 32, 8), i32(1, 1)), ir.Attrs{"scale": 0.35}, "positions must be i32[2, 1]"},
	{"attention_at", types(f32(2, 4, 1, 8), f32(2, 3, 32, 8), f32(2, 3, 32, 8), i32(2, 1)), ir.Attrs{"scale": 0.35}, "4 query heads cannot share 3 k/v heads evenly"},
	{"rope", types(f32(8)), ir.Attrs{"theta": 10000.0}, "[...,positions,d]"},
	{"rope", types(f32(4, 8)), ir.Attrs{"theta": 1.0}, "theta must be a finite base > 1"},
	{"silu", types(i32(3)), nil, "needs a float type"},
	{"repeat_interleave", types(f32(2, 3)), ir.Attrs{"dim": 2, "repeats": 2}, "dim 2"},
	{"repeat_interleave", types(f32(2, 3)), ir.Attrs{"dim": 1, "repeats": 0}, "repeats must be ≥ 1"},
	{"repeat_interleave_grad", types(f32(2, 5)), ir.Attrs{"dim": 1, "repeats": 2}, "multiple of repeats 2"},
	{"silu_grad", types(f32(2), f32(3)), nil, "types must be equal"},
	{"embedding", types(f32(256), i32(2)), nil, "table must be a float matrix [vocab,dim], got f32[256]"},
	{"embedding", types(f32(256, 4), f32(2)), nil, "ids must be i32 or i64, got f32[2]"},
	{"embedding_grad", types(i32(2, 16), f32(2, 8, 32)), ir.Attrs{"vocab": 256}, "dy must be float[[2,16]…,dim] for ids i32[2,16], got f32[2,8,32]"},
	{"embedding_grad", types(f32(2), f32(2, 4)), ir.Attrs{"vocab": 256}, "dy must be float"},
	{"embedding_grad", types(i32(2), f32(2, 4)), ir.Attrs{"vocab": 0}, "vocab must be positive, got 0"},
	{"cross_entropy", types(f32(2, 3, 4), i32(2)), nil, "logits must be a float matrix [N,V], got f32[2,3,4]"},
	{"cross_entropy", types(f32(32, 256), i32(16)), nil, "labels must be int[32] for logits f32[32,256], got i32[16]"},
	{"cross_entropy", types(f32(32, 256), f32(32)), nil, "labels must be int[32]"},
	{"cross_entropy_grad", types(f32(32, 256), i32(32), f32(1)), nil, "dloss must be a f32 scalar, got f32[1]"},
	{"cross_entropy_grad", types(i32(32, 256), i32(32), f32()), nil, "logits must be a float matrix"},
	{"cast", types(f32(4)), ir.Attrs{"to": "f8"}, `unknown dtype "f8"`},
	{"redistribute", types(f32(4), f32(4)), nil, "takes 1 args, got 2"},
	{"all_reduce", types(f32(4)), nil, "missing required attribute axis"},
	{"reduce_scatter", types(f32(4)), ir.Attrs{"axis": "dp"}, "missing required attribute dim"},
	{"all_gather", types(f32(4)), ir.Attrs{"axis": 1, "dim": 0}, "attribute axis must be string"},
	{"shard_slice", types(f32(4)), ir.Attrs{"axis": "dp"}, "missing required attribute dim"},
	{"shard_slice", types(f32(4, 12)), ir.Attrs{"axis": "tp", "dim": 1, "blocks": 0}, "blocks must be at least 1, got 0"},
	{"all_gather", types(f32(4, 12)), ir.Attrs{"axis": "tp", "dim": 1, "blocks": 5}, "dim 1 of f32[4,12] does not divide into 5 blocks"},
	{"reduce_scatter", types(f32(4, 12)), ir.Attrs{"axis": "tp", "dim": 0, "blocks": -2}, "blocks must be at least 1, got -2"},
	{"all_gather", types(f32(4, 12)), ir.Attrs{"axis": "tp", "dim": 1, "blocks": 3.0}, "attribute blocks must be int"},
	{"all_to_all", types(f32(4)), ir.Attrs{"axis": "ep", "from": 0}, "missing required attribute to"},
	{"top_k_mask", types(f32(2, 4)), ir.Attrs{"k": 5}, "k must be in 1..4 (the last dim of f32[2,4]), got 5"},
	{"less", types(f32(2), f32(3)), nil, "types must be equal"},
	{"moe_route", types(f32(2, 6, 4), f32(2, 6, 4)), ir.Attrs{"capacity": 0}, "capacity must be at least 1, got 0"},
	{"moe_dispatch", types(f32(2, 6, 8), f32(2, 4, 3)), nil, "src must be i32[groups,experts,capacity], got f32[2,4,3]"},
	{"moe_combine", types(f32(4, 3, 3, 8), i32(2, 4, 3)), ir.Attrs{"tokens": 6}, "y must be a float [experts=4,groups=2,capacity=3,hidden]"},
	{"moe_slot_dot", types(f32(4, 2, 3, 8), i32(2, 4, 3), f32(2, 6, 7)), nil, "x must be f32 [groups=2,tokens,hidden=8]"},
	{"moe_slot_gather", types(f32(2, 6, 5), i32(2, 4, 3)), nil, "p must be a float [groups=2,tokens,experts=4]"},
	{"moe_slot_scatter", types(f32(2, 4, 3), i32(2, 4, 3)), ir.Attrs{"tokens": 0}, "tokens must be at least 1, got 0"},
	{"random", types(f32(2, 6)), ir.Attrs{"dist": "normal", "stream": 1}, "key must be i32"},
	{"random", types(i32(2)), ir.Attrs{"dist": "dropout", "stream": 1, "p": 1.0}, "dropout probability p=1 must be in [0, 1)"},
	{"random", types(i32(2)), ir.Attrs{"dist": "cauchy", "stream": 1}, `dist "cauchy": want one of`},
	{"normal_cdf", types(i32(3)), nil, "needs a float tensor"},
	{"cast", types(f32(4)), ir.Attrs{"to": "invalid"}, `unknown dtype "invalid"`},
	{"sum_squares", types(f32(4), bf16(4)), nil, "arg 1 is bf16[4]: all args must share one float dtype (arg 0 is f32[4])"},
	{"sum_squares", types(i32(4)), nil, "arg 0 is i32[4]: all args must share one float dtype"},
	{"clip_coef", types(f32(2)), ir.Attrs{"max_norm": 1.0}, "arg 0 must be a float scalar, got f32[2]"},
	{"nonfinite_count", types(f32(4), bf16(4)), nil, "all args must share one float dtype"},
	{"where_finite", types(f32(2), f32(4), f32(4)), nil, "count must be a float scalar, got f32[2]"},
	{"where_finite", types(f32(), f32(4), f32(8)), nil, "new f32[4] and old f32[8] must have one type"},
	{"clip_coef", types(i32()), ir.Attrs{"max_norm": 1.0}, "arg 0 must be a float scalar"},
	{"adam_m", types(f32(4), f32(8)), ir.Attrs{"beta1": 0.9}, "types must be equal"},
	{"adam_v", types(i32(4), i32(4)), ir.Attrs{"beta2": 0.9}, "needs a float type"},
	{"adamw", types(i32(4), i32(4), i32(4), f32(), i32()), ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "wd": 0.1}, "parameter must be float, got i32[4]"},
	{"adamw", types(f32(4), f32(4), f32(8), f32(), i32()), ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "wd": 0.1}, "arg 2 is f32[8], must match parameter f32[4]"},
	{"adamw", types(f32(4), f32(4), f32(4), f32(1), i32()), ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "wd": 0.1}, "learning rate must be a float scalar, got f32[1]"},
	{"adamw", types(f32(4), f32(4), f32(4), f32(), f32()), ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "wd": 0.1}, "step must be an int scalar, got f32[]"},
	{"sgd_buf", types(f32(8), f32(8), f32(4)), ir.Attrs{"momentum": 0.9, "wd": 0.0}, "arg 2 is f32[4] but arg 0 is f32[8]: types must be equal"},
	{"sgd", types(f32(4), f32(5), f32()), nil, "arg 1 is f32[5], must match parameter f32[4]"},
	{"sgd", types(f32(4), f32(4), i32()), nil, "learning rate must be a float scalar, got i32[]"},
	{"adafactor_row", types(f32(8), f32(4, 8), i64()), adafactorAcc, "accumulator must be f32[4] for f32[4,8], got f32[8]"},
	{"adafactor_row", types(f32(4), f32(4, 8), f32()), adafactorAcc, "step must be an int scalar, got f32[]"},
	{"adafactor_col", types(f32(8), f32(8), i64()), adafactorAcc, "factored state needs a float matrix, got f32[8]"},
	{"adafactor_col", types(f32(8), f32(4, 8), i64()), ir.Attrs{"eps1": 1e-30}, "missing required attribute decay (float)"},
	{"adafactor_v", types(f32(8), f32(4), i64()), adafactorAcc, "types must be equal"},
	{"adafactor_v", types(f32(8), f32(8), i64(1)), adafactorAcc, "step must be an int scalar, got i64[1]"},
	{"adafactor", types(f32(8), f32(8), f32(8), f32(1), i64()), adafactorUpd, "parameter must be a float matrix, got f32[8]"},
	{"adafactor", types(f32(4, 8), f32(8, 4), f32(4), f32(8), i64()), adafactorUpd, "gradient f32[8,4] must match parameter f32[4,8]"},
	{"adafactor", types(f32(4, 8), f32(4, 8), f32(8), f32(8), i64()), adafactorUpd, "row accumulator must be f32[4] for f32[4,8], got f32[8]"},
	{"adafactor", types(f32(4, 8), f32(4, 8), f32(4), f32(8), f32()), adafactorUpd, "step must be an int scalar, got f32[]"},
	{"adafactor_vec", types(f32(8), f32(8), f32(4), i64()), adafactorUpd, "arg 2 is f32[4], must match parameter f32[8]"},
	{"adafactor_vec", types(i32(8), i32(8), i32(8), i64()), adafactorUpd, "parameter must be float, got i32[8]"},
	{"sm3_row", types(f32(4), f32(4, 8), f32(4)), nil, "column accumulator must be f32[8] for f32[4,8], got f32[4]"},
	{"sm3_col", types(f32(8), f32(4, 8), f64(4)), nil, "row accumulator must be f32[4] for f32[4,8], got f64[4]"},
	{"sm3_v", types(i32(4), i32(4)), nil, "needs a float type"},
	{"sm3", types(f32(4, 8), f32(4, 8), f32(4), f32(8), i64()), nil, "learning rate must be a float scalar, got i64[]"},
	{"sm3", types(f32(2, 4, 8), f32(2, 4, 8), f32(4), f32(8), f32()), nil, "parameter must be a float matrix, got f32[2,4,8]"},
	{"sm3_vec", types(f32(8), f32(8), f32(8), f32(1)), nil, "learning rate must be a float scalar, got f32[1]"},
	{"attention", types(f32(2, 16, 8), f32(2, 16, 8), f32(2, 16, 8)), attn(false), "q must be a float tensor [batch, heads, seq, head_dim]"},
	{"attention", types(f32(2, 4, 16, 8), f32(2, 3, 16, 8), f32(2, 3, 16, 8)), attn(false), "4 query heads cannot share 3 k/v heads evenly"},
	{"attention", types(f32(2, 4, 16, 8), f32(2, 2, 16, 4), f32(2, 2, 16, 4)), attn(false), "k must be f32[2, kv_heads, seq, 8]"},
	{"attention", types(f32(2, 4, 16, 8), f32(2, 2, 16, 8), f32(2, 2, 12, 8)), attn(false), "v must be f32[2,2,16,8] like k"},
	{"attention", types(f32(1, 2, 8, 4), f32(1, 2, 4, 4), f32(1, 2, 4, 4)), attn(true), "causal attention of 8 queries over 4 keys"},
	{"attention", types(f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 2, 8, 4)), ir.Attrs{"scale": -1.0}, "scale must be a finite positive number"},
	{"attention", types(f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 2, 8, 4)), ir.Attrs{"causal": true}, "missing required attribute scale"},
	{"attention_stats", types(f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 8, 2, 4), f32(1, 2, 8, 4)), attn(false), "dout must be f32[1,8,2,4] (attention's output for q f32[1,2,8,4])"},
	{"attention_grad_q", types(bf16(1, 2, 8, 4), bf16(1, 2, 8, 4), bf16(1, 2, 8, 4), bf16(1, 8, 2, 4), bf16(1, 2, 8, 2)), attn(false), "stats must be f32[1,2,8,2]"},
	{"attention_grad_k", types(f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 8, 2, 4), f32(1, 2, 8, 1)), attn(false), "stats must be f32[1,2,8,2]"},
	{"attention_grad_v", types(f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 2, 8, 4), f32(1, 2, 8, 2)), attn(false), "dout must be f32[1,8,2,4]"},
}

// attn is the attributes of an attention op over head dim 8.
func attn(causal bool) ir.Attrs { return ir.Attrs{"scale": 0.125, "causal": causal} }

func TestOpTypeRulesValid(t *testing.T) {
	for i, tt := range validOps {
		t.Run(fmt.Sprintf("%s/%d", tt.op, i), func(t *testing.T) {
			info, ok := ir.Lookup(tt.op)
			require.True(t, ok, "op %s is not in the table", tt.op)
			m := ir.NewModule("ops")
			pos := ir.Pos{File: "model.go", Line: 10}
			if info.Source {
				require.Empty(t, tt.args)
				v, err := m.AddSource(tt.op, tt.want, tt.attrs, ir.NoMeta, pos)
				require.NoError(t, err)
				assert.Equal(t, tt.want.String(), v.Type.String())
				require.NoError(t, ir.Verify(m, ""))
				return
			}
			got, err := ir.InferType(info, argValues(tt.args), tt.attrs)
			require.NoError(t, err)
			assert.Equal(t, tt.want.String(), got.String())
			assert.True(t, tt.want.Equal(got))
			if info.Elementwise {
				assert.True(t, got.Equal(tt.args[0]), "elementwise ops keep their operands' type")
			}

			// The same op recorded through Module.Add must verify, and its
			// text must round-trip.
			var args []*ir.Value
			for j, at := range tt.args {
				a, err := m.AddSource("input", at, ir.Attrs{"name": fmt.Sprint("a", j)}, ir.NoMeta, pos)
				require.NoError(t, err)
				args = append(args, a)
			}
			v, err := m.Add(tt.op, args, tt.attrs, ir.NoMeta, pos)
			require.NoError(t, err)
			assert.True(t, tt.want.Equal(v.Type))
			if ir.Collectives[tt.op] || tt.op == "shard_slice" {
				// A collective changes a placement on a mesh axis: give it
				// one, from what its kind consumes to what it produces.
				m.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: v.Attrs.Str("axis"), Size: 2}}}
				from, to := collectivePlaces(tt.op, v.Attrs)
				for _, a := range args {
					a.Place = []ir.Placement{from}
				}
				v.Place = []ir.Placement{to}
			}
			require.NoError(t, ir.Verify(m, ""))
			p := reparse(t, "ops.gir", ir.Print(m))
			require.NoError(t, ir.Verify(p, ""))
		})
	}
}

func TestOpTypeRulesInvalid(t *testing.T) {
	for i, tt := range invalidOps {
		t.Run(fmt.Sprintf("%s/%d", tt.op, i), func(t *testing.T) {
			info, ok := ir.Lookup(tt.op)
			require.True(t, ok, "op %s is not in the table", tt.op)
			_, err := ir.InferType(info, argValues(tt.args), tt.attrs)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.rule)

			// Module.Add prefixes the position and the op.
			m := ir.NewModule("ops")
			_, err = m.Add(tt.op, argValues(tt.args), tt.attrs, ir.NoMeta, ir.Pos{File: "model.go", Line: 12})
			require.Error(t, err)
			assert.Regexp(t, "^model.go:12: "+tt.op+": ", err.Error())
			assert.Contains(t, err.Error(), tt.rule)
			assert.Empty(t, m.Values, "a rejected op records nothing")
		})
	}
}

// TestOpTableCoverage makes a new op fail until it has type-rule tests.
func TestOpTableCoverage(t *testing.T) {
	valid, invalid := map[string]bool{}, map[string]bool{}
	for _, c := range validOps {
		valid[c.op] = true
	}
	for _, c := range invalidOps {
		invalid[c.op] = true
	}
	for _, name := range ir.OpNames() {
		assert.True(t, valid[name], "op %s has no case in validOps", name)
		info, _ := ir.Lookup(name)
		if !info.Source {
			assert.True(t, invalid[name], "op %s has no case in invalidOps", name)
		}
	}
	for name := range valid {
		_, ok := ir.Lookup(name)
		assert.True(t, ok, "validOps names %s, which is not in the op table", name)
	}
}

func TestOpTable(t *testing.T) {
	names := ir.OpNames()
	require.NotEmpty(t, names)
	assert.True(t, slices.IsSorted(names), "OpNames must be sorted")
	assert.Equal(t, len(names), len(slices.Compact(slices.Clone(names))), "OpNames must be unique")
	reserved := []string{"place", "layer", "phase", "stage", "chunk"}
	for _, name := range names {
		info, ok := ir.Lookup(name)
		require.True(t, ok)
		assert.Equal(t, name, info.Name)
		if info.Source {
			assert.Zero(t, info.Arity, "%s: source ops take no args", name)
			assert.Nil(t, info.Infer, "%s: source types are declared", name)
			assert.False(t, info.Elementwise, name)
		} else {
			assert.NotNil(t, info.Infer, "%s needs a type rule", name)
			assert.True(t, info.Arity >= 1 || info.Arity == ir.Variadic, "%s: arity %d", name, info.Arity)
		}
		for _, s := range info.Attrs {
			assert.NotContains(t, reserved, s.Name, "%s: attribute name collides with placement/meta", name)
			got, ok := info.Spec(s.Name)
			assert.True(t, ok)
			assert.Equal(t, s, got)
		}
		_, ok = info.Spec("no-such-attribute")
		assert.False(t, ok)
	}
	_, ok := ir.Lookup("frobnicate")
	assert.False(t, ok)
	for k, want := range map[ir.AttrKind]string{ir.AttrInt: "int", ir.AttrInts: "ints", ir.AttrFloat: "float", ir.AttrString: "string", ir.AttrBool: "bool"} {
		assert.Equal(t, want, k.String())
	}
}

func TestModuleAddErrors(t *testing.T) {
	m := ir.NewModule("m")
	pos := ir.Pos{File: "model.go", Line: 7}
	x, err := m.AddSource("input", f32(4), ir.Attrs{"name": "x"}, ir.NoMeta, pos)
	require.NoError(t, err)
	tests := []struct {
		name string
		add  func() error
		want string
	}{
		{"unknown op", func() error { _, err := m.Add("frob", []*ir.Value{x}, nil, ir.NoMeta, pos); return err }, `model.go:7: unknown op "frob"`},
		{"source through Add", func() error { _, err := m.Add("param", nil, ir.Attrs{"name": "w"}, ir.NoMeta, pos); return err }, "model.go:7: param is a source op; use AddSource"},
		{"nil arg", func() error { _, err := m.Add("add", []*ir.Value{x, nil}, nil, ir.NoMeta, pos); return err }, "model.go:7: add: arg 1 is missing"},
		{"non-source through AddSource", func() error { _, err := m.AddSource("add", f32(4), nil, ir.NoMeta, pos); return err }, `model.go:7: "add" is not a source op`},
		{"unknown source", func() error { _, err := m.AddSource("frob", f32(4), nil, ir.NoMeta, pos); return err }, `model.go:7: "frob" is not a source op`},
		{"zero dim", func() error {
			_, err := m.AddSource("param", f32(0, 4), ir.Attrs{"name": "w"}, ir.NoMeta, pos)
			return err
		}, "model.go:7: param: dims must be positive, got f32[0,4]"},
		{"invalid dtype", func() error {
			_, err := m.AddSource("param", ir.T(ir.Invalid, 4), ir.Attrs{"name": "w"}, ir.NoMeta, pos)
			return err
		}, "model.go:7: param: invalid dtype in invalid[4]"},
		{"source without name", func() error { _, err := m.AddSource("state", f32(4), nil, ir.NoMeta, pos); return err }, "model.go:7: state: missing required attribute name (string)"},
		{"const of the wrong kind", func() error {
			_, err := m.AddSource("const", f32(), ir.Attrs{"value": 1}, ir.NoMeta, pos)
			return err
		}, "model.go:7: const: attribute value must be float, got int"},
		{"InferType on a source op", func() error {
			info, _ := ir.Lookup("param")
			_, err := ir.InferType(info, nil, ir.Attrs{"name": "w"})
			return err
		}, "param is a source op: its type is declared, not inferred"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.add()
			require.Error(t, err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
	assert.Len(t, m.Values, 1, "failed adds record nothing")
	assert.Equal(t, 1, m.NextID())
}

// collectivePlaces is the placement a collective consumes and produces.
func collectivePlaces(op string, a ir.Attrs) (from, to ir.Placement) {
	sh := func(d int) ir.Placement { return ir.Placement{Kind: ir.Shard, Dim: d, Blocks: a.Int("blocks", 0)} }
	switch op {
	case "all_reduce":
		return ir.Placement{Kind: ir.Partial}, ir.Placement{}
	case "reduce_scatter":
		return ir.Placement{Kind: ir.Partial}, sh(a.Int("dim", 0))
	case "all_gather":
		return sh(a.Int("dim", 0)), ir.Placement{}
	case "shard_slice":
		return ir.Placement{}, sh(a.Int("dim", 0))
	}
	return sh(a.Int("from", 0)), sh(a.Int("to", 0))
}

// u8 is the storage of packed bit masks: one byte per element, printed
// and parsed like any dtype, neither a float nor an integer to the type
// rules.
func TestU8IsAStorageType(t *testing.T) {
	assert.Equal(t, int64(1), ir.U8.Size())
	assert.Equal(t, "u8", ir.U8.String())
	assert.False(t, ir.U8.IsFloat())
	assert.False(t, ir.U8.IsInt())
	typ, err := ir.ParseType("u8[8,16,16]")
	require.NoError(t, err)
	assert.True(t, u8(8, 16, 16).Equal(typ))
	assert.Equal(t, int64(8*16*16), typ.Bytes())
	for n, want := range map[int]int{1: 1, 7: 1, 8: 1, 9: 2, 128: 16, 129: 17} {
		assert.Equal(t, want, ir.MaskBytes(n), "n=%d", n)
	}
}
