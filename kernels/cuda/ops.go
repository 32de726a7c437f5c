package cuda

import "sort"

// OpKernels says which kernels run one IR op (as lower.Instr.Op names
// it) and how they combine.
type OpKernels struct {
	Op      string
	Kernels []string
	How     string
}

// opTable covers every op that runs on a kernel of this package. Ops
// that run elsewhere are listed in elsewhere.
var opTable = []OpKernels{
	{"add", []string{"gc_add", "gc_add_widen_bf16", "gc_add_widen_f16"}, "same-shape operands; an fp32 sum and a 16-bit gradient widen the latter as they read it"},
	{"sub", []string{"gc_sub"}, "same-shape operands"},
	{"mul", []string{"gc_mul"}, "same-shape operands"},
	{"div", []string{"gc_div"}, "same-shape operands"},
	{"neg", []string{"gc_neg"}, ""},
	{"exp", []string{"gc_exp"}, ""},
	{"log", []string{"gc_log"}, ""},
	{"tanh", []string{"gc_tanh"}, ""},
	{"sqrt", []string{"gc_sqrt"}, ""},
	{"gelu", []string{"gc_gelu"}, ""},
	{"relu", []string{"gc_relu"}, ""},
	{"silu", []string{"gc_silu"}, ""},
	{"gelu_grad", []string{"gc_gelu_grad"}, "args (x, dy)"},
	{"relu_grad", []string{"gc_relu_grad"}, "args (x, dy)"},
	{"silu_grad", []string{"gc_silu_grad"}, "args (x, dy)"},
	{"tanh_grad", []string{"gc_tanh_grad"}, "args (y, dy)"},
	{"relu_mask", []string{"gc_relu_mask"}, "rows × n over the local last dim; u8 output of ⌈n/8⌉ bytes per row"},
	{"relu_grad_mask", []string{"gc_relu_grad_mask"}, "args (mask, dy)"},
	{"softmax_grad", []string{"gc_softmax_grad"}, "rows over the last dim"},
	{"scale", []string{"gc_scale"}, "the scalar is arg 1, in device memory"},
	{"transpose", []string{"gc_gather"}, "TransposeGather builds the arguments"},
	{"broadcast", []string{"gc_gather"}, "BroadcastGather builds the arguments"},
	{"slice", []string{"gc_slice"}, "SliceGeometry; bounds in local coordinates as compile.go computes them"},
	{"slice_grad", []string{"gc_slice_grad"}, "SliceGeometry of the output"},
	{"concat", []string{"gc_concat_piece"}, "one launch per input"},
	{"repeat_interleave", []string{"gc_repeat_interleave"}, "SliceGeometry of the local input shape around dim; moves bits"},
	{"repeat_interleave_grad", []string{"gc_repeat_interleave_grad"}, "SliceGeometry of the local output shape around dim; sums in order in double"},
	{"reduce_sum", []string{"gc_reduce_sum_rows", "gc_reduce_sum_cols"}, "ReduceGeometry: rows when inner = 1, else cols; mean = 0"},
	{"reduce_mean", []string{"gc_reduce_sum_rows", "gc_reduce_sum_cols"}, "as reduce_sum with mean = 1"},
	{"reduce_max", []string{"gc_reduce_max_rows", "gc_reduce_max_cols"}, "ReduceGeometry"},
	{"reduce_max_grad", []string{"gc_reduce_max_grad"}, "ReduceGeometry"},
	{"softmax", []string{"gc_softmax"}, "rows over the last dim"},
	{"causal_mask", []string{"gc_causal_mask"}, "fill from the attribute (−Inf by default)"},
	{"layernorm", []string{"gc_layernorm"}, "rows over the last dim"},
	{"layernorm_grad_x", []string{"gc_layernorm_grad_x"}, "rows over the last dim"},
	{"layernorm_grad_gamma", []string{"gc_layernorm_stats", "gc_layernorm_grad_gamma"}, "stats (4 floats per row of workspace), then the column sums"},
	{"rmsnorm", []string{"gc_rmsnorm"}, "rows over the last dim"},
	{"rmsnorm_grad_x", []string{"gc_rmsnorm_grad_x"}, "rows over the last dim"},
	{"rmsnorm_grad_gamma", []string{"gc_rmsnorm_stats", "gc_rmsnorm_grad_gamma"}, "stats (2 floats per row of workspace), then the column sums"},
	{"rope", []string{"gc_rope"}, "rows of the last dim d = 2·half, positions = shape[-2], at global positions first…, second… from brk (a context-parallel chunk); theta as a float (must be exact in float32), inverse as 0 or 1"},
	{"embedding", []string{"gc_embedding", "gc_embedding_range"}, "range when the table is split by vocabulary (offset = rank·rows)"},
	{"embedding_grad", []string{"gc_embedding_grad_clear", "gc_embedding_grad_count", "gc_embedding_grad_scan", "gc_embedding_grad_place", "gc_embedding_grad"},
		"a counting sort of the positions by row in vocab + count ints of workspace (index, list), then one block per row; offset and total as for the vocab-parallel lookup"},
	{"cross_entropy", []string{"gc_cross_entropy_rows", "gc_finish_sum", "gc_vocab_ce_max", "gc_vocab_ce_sums", "gc_vocab_ce_loss"},
		"rows (2 floats per row of workspace) then finish with divisor rows; vocab-parallel: max, all-gather, sums, all-reduce, loss"},
	{"cross_entropy_grad", []string{"gc_cross_entropy_grad", "gc_vocab_ce_max", "gc_vocab_ce_sums", "gc_vocab_ce_grad"},
		"one kernel; vocab-parallel: max, all-gather, sums, all-reduce, grad"},
	{"sum_squares", []string{"gc_sum_squares_partial", "gc_finish_sum"}, "one partial launch per argument into consecutive pairs, then finish"},
	{"nonfinite_count", []string{"gc_nonfinite_partial", "gc_finish_count"}, "one partial launch per argument, then finish"},
	{"where_finite", []string{"gc_where_finite"}, "args (count, new, old)"},
	{"clip_coef", []string{"gc_clip_coef"}, ""},
	{"adam_m", []string{"gc_adam_m"}, ""},
	{"adam_v", []string{"gc_adam_v"}, ""},
	{"adamw", []string{"gc_adamw"}, "lr and step read from device memory"},
	{"sgd_buf", []string{"gc_sgd_buf"}, ""},
	{"sgd", []string{"gc_sgd"}, ""},
	{"adafactor_row", []string{"gc_adafactor_row"}, ""},
	{"adafactor_col", []string{"gc_adafactor_col"}, ""},
	{"adafactor_v", []string{"gc_adafactor_v"}, ""},
	{"adafactor", []string{"gc_adafactor_rowsum", "gc_adafactor_partial", "gc_adafactor_finish", "gc_adafactor_apply"}, "four launches; 4 floats of ws, 4 per partial block"},
	{"adafactor_vec", []string{"gc_adafactor_vec_partial", "gc_adafactor_finish", "gc_adafactor_vec_apply"}, "three launches"},
	{"sm3_row", []string{"gc_sm3_row"}, "args (row, g, col)"},
	{"sm3_col", []string{"gc_sm3_col"}, "args (col, g, row): pass row and col in kernel order"},
	{"sm3", []string{"gc_sm3"}, ""},
	{"sm3_v", []string{"gc_sm3_v"}, ""},
	{"sm3_vec", []string{"gc_sm3_vec"}, ""},
	{"rope_at", []string{"gc_rope_at"}, "x [batch, heads, step, d], positions [batch, step]; theta as a float (must be exact in float32)"},
	{"kv_write", []string{"gc_kv_write"}, "in place on the cache (the lowering's usual case); otherwise a device copy of the cache first"},
	{"attention_at", []string{"gc_attention_at"}, "one thread per query row over its visible keys; head offsets from runtime.AttentionDims; head dim ≤ 256"},
	{"attention", []string{"gc_attention", "gc_att_merge"}, "one block per (batch·head, query tile); tiles = ⌈sq/rows⌉, rows = min(32, 2048/hd); head offsets from runtime.AttentionDims; as ring attention (q split on its sequence over cp) one call per ring step with the rows' positions, merged by their log-sum-exp"},
	{"attention_stats", []string{"gc_attention_stats", "gc_att_stats_merge"}, "as attention; f32 [b,h,sq,2] result even for 16-bit operands; a ring's steps merge their log-sum-exps"},
	{"attention_grad_q", []string{"gc_attention_grad_q"}, "as attention"},
	{"attention_grad_k", []string{"gc_attention_grad_k"}, "one block per (batch·k/v head, key tile); tiles = ⌈sk/rows⌉"},
	{"attention_grad_v", []string{"gc_attention_grad_v"}, "as attention_grad_k"},
	{"cast", []string{"gc_f32_to_f16", "gc_f32_to_bf16", "gc_f16_to_f32", "gc_bf16_to_f32", "gc_i32_to_f32"}, "same-type casts are copies"},
	{"top_k_mask", []string{"gc_top_k_mask"}, "rows over the last dim"},
	{"less", []string{"gc_less"}, "same-shape operands"},
	{"moe_route", []string{"gc_moe_route_rank", "gc_moe_route_fill"}, "ranks (groups·tokens·experts ints of workspace), then one thread per (group, expert) fills its slots"},
	{"moe_dispatch", []string{"gc_moe_dispatch"}, "sizes from the local x and src; weighted = 0 without w"},
	{"moe_combine", []string{"gc_moe_combine"}, "one block per (group, token); weighted = 0 without w"},
	{"moe_slot_dot", []string{"gc_moe_slot_dot"}, "one block per slot; f32 result for 16-bit operands"},
	{"moe_slot_gather", []string{"gc_moe_slot_gather"}, ""},
	{"moe_slot_scatter", []string{"gc_moe_slot_scatter"}, "one thread per result element"},
	{"random", []string{"gc_random_uniform", "gc_random_normal", "gc_random_dropout"},
		"one kernel by dist; keys = the local key's elements, n = the product of dims (whole on every device), stream from the attribute; dropout's keep and scale from DropoutArgs(p)"},
	{"normal_cdf", []string{"gc_normal_cdf"}, "in double; not fused (not marked Elementwise)"},
}

// Elsewhere lists the ops that need no kernel of this package, and why.
var Elsewhere = map[string]string{
	"matmul":         "cuBLASLt",
	"send":           "device-to-device copy or NCCL",
	"recv":           "device-to-device copy or NCCL",
	"copy":           "memcpy",
	"all_reduce":     "NCCL",
	"reduce_scatter": "NCCL",
	"all_gather":     "NCCL",
	"shard_slice":    "a strided copy of the local block (gc_slice)",
	"all_to_all":     "NCCL",
}

// Sixteen lists the kernels that emulate an op on fp16/bf16 buffers as
// the CPU backend does: widen the 16-bit arguments to float32 scratch,
// run the float32 kernels, round the result back (or round float32 in
// place to the format's precision).
var Sixteen = []string{"gc_f16_to_f32", "gc_bf16_to_f32", "gc_f32_to_f16", "gc_f32_to_bf16", "gc_round_f16", "gc_round_bf16"}

// Sums16 are the kernels the CUDA backend's in-process fabric sums a
// 16-bit reduction with, each add rounded to the format
// (--grad-reduce-dtype); fp32's sums are gc_add's.
var Sums16 = []string{"gc_add_bf16", "gc_add_f16"}

// InstrScale is the kernel that applies lower.Instr.Scale to an op's result.
const InstrScale = "gc_scale_by"

var opIndex = func() map[string]*OpKernels {
	m := make(map[string]*OpKernels, len(opTable))
	for i := range opTable {
		m[opTable[i].Op] = &opTable[i]
	}
	return m
}()

// KernelsFor returns the kernels that may run op; ok is false when no
// kernel of this package does (see Elsewhere).
func KernelsFor(op string) (OpKernels, bool) {
	k, ok := opIndex[op]
	if !ok {
		return OpKernels{}, false
	}
	return *k, true
}

// Ops lists the ops that have kernels, sorted by name.
func Ops() []string {
	out := make([]string, 0, len(opTable))
	for _, o := range opTable {
		out = append(out, o.Op)
	}
	sort.Strings(out)
	return out
}
