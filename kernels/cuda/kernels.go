package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed common.cuh *.cu
var sources embed.FS

// PreludeFile is the source that is prepended to every kernel file.
const PreludeFile = "common.cuh"

// Prelude returns the shared prelude (conversions, loops, reductions).
func Prelude() string {
	b, err := sources.ReadFile(PreludeFile)
	if err != nil {
		// The file is embedded at build time; a failure here means the
		// binary itself is broken, not that an input was bad.
		panic(fmt.Sprintf("cuda: embedded prelude missing: %v", err))
	}
	return string(b)
}

// Sources returns the kernel files by name (without the prelude), in
// name order.
func Sources() (map[string]string, error) {
	names, err := fs.Glob(sources, "*.cu")
	if err != nil {
		return nil, fmt.Errorf("listing embedded kernel sources: %w", err)
	}
	out := make(map[string]string, len(names))
	for _, n := range names {
		b, err := sources.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("reading embedded %s: %w", n, err)
		}
		out[n] = string(b)
	}
	return out, nil
}

// SourceFiles lists the kernel files in name order.
func SourceFiles() []string {
	names, _ := fs.Glob(sources, "*.cu") // the pattern is valid, so no error
	sort.Strings(names)
	return names
}

// Program returns one compilation unit for NVRTC: the prelude followed
// by every kernel file, each introduced by a #line directive so compiler
// messages name the file and line they come from.
func Program() (string, error) {
	srcs, err := Sources()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("#line 1 \"" + PreludeFile + "\"\n")
	b.WriteString(Prelude())
	for _, name := range SourceFiles() {
		fmt.Fprintf(&b, "#line 1 %q\n", name)
		b.WriteString(srcs[name])
	}
	return b.String(), nil
}

// ParamType is a kernel parameter's C type, spelled as in the sources.
type ParamType string

// The parameter types a kernel may take. Pointers are device memory;
// 16-bit floats travel as their bits in unsigned short and packed ReLU
// masks as bytes; the step number
// is an i64 scalar in device memory; sizes are long long.
const (
	F32Out   ParamType = "float*"
	F32In    ParamType = "const float*"
	I32Out   ParamType = "int*"
	I32In    ParamType = "const int*"
	U8Out    ParamType = "unsigned char*"
	U8In     ParamType = "const unsigned char*"
	U16Out   ParamType = "unsigned short*"
	U16In    ParamType = "const unsigned short*"
	I64In    ParamType = "const long long*"
	Size     ParamType = "long long"
	Int      ParamType = "int"
	F32Value ParamType = "float"
)

// Pointer reports whether the parameter is a device pointer.
func (t ParamType) Pointer() bool { return strings.HasSuffix(string(t), "*") }

// Output reports whether the kernel may write through the parameter.
func (t ParamType) Output() bool { return t.Pointer() && !strings.HasPrefix(string(t), "const ") }

// Param is one kernel parameter.
type Param struct {
	Name string
	Type ParamType
}

// Launch says how a kernel expects to be launched.
type Launch int

const (
	// GridStride: any grid and block; threads stride over Over elements.
	GridStride Launch = iota
	// BlockPerRow: one block per row (Over rows); a smaller grid loops
	// over the remaining rows, a larger one leaves blocks idle. Column
	// reductions launch this way too, one block per tile of up to 32
	// columns: Over (outer·inner, or the columns) bounds the tiles, and
	// blocks beyond them return at once.
	BlockPerRow
	// SingleBlock: one block does all the work (Over elements); extra
	// blocks return at once.
	SingleBlock
)

func (l Launch) String() string {
	switch l {
	case GridStride:
		return "grid-stride"
	case BlockPerRow:
		return "block per row"
	case SingleBlock:
		return "single block"
	}
	return fmt.Sprintf("Launch(%d)", int(l))
}

// Kernel describes one extern "C" __global__ function of the sources.
// Every kernel works for any blockDim.x that is a multiple of 32 up to
// 1024; blockDim.y and .z must be 1.
type Kernel struct {
	Name   string
	Params []Param
	Launch Launch
	// Over is the extent the launch covers, as an expression of size
	// parameters ("n", "rows", "outer*inner").
	Over string
}

// sig turns "float* out, const float* x, long long n" into params. The
// table below is static, so a malformed entry is a programming error;
// TestTableMatchesSources checks every entry against the sources.
func sig(s string) []Param {
	var ps []Param
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		i := strings.LastIndexAny(part, " *")
		ps = append(ps, Param{Name: part[i+1:], Type: ParamType(strings.TrimSpace(part[:i+1]))})
	}
	return ps
}

const (
	// attDims are the sizes every attention kernel takes after its
	// pointers (attention.cu).
	attDims = "long long batch, long long heads, long long kv_heads, long long sq, long long sk, long long hd, long long tiles, " +
		"long long group, long long q_off, long long kv_off, float scale, int causal, " +
		"long long qp0, long long qbrk, long long qp1, long long kp0, long long kbrk, long long kp1"
	unary   = "float* out, const float* x, long long n"
	binary  = "float* out, const float* a, const float* b, long long n"
	actGrad = "float* dx, const float* x, const float* dy, long long n"
	// moeSizes are the routing sizes the dispatch, combine and slot-dot
	// kernels take after their pointers (moe.cu).
	moeSizes = "long long groups, long long tokens, long long hidden, long long experts, long long capacity"
)

var kernels = []Kernel{
	// elementwise.cu
	{"gc_add", sig(binary), GridStride, "n"},
	{"gc_sub", sig(binary), GridStride, "n"},
	{"gc_mul", sig(binary), GridStride, "n"},
	{"gc_div", sig(binary), GridStride, "n"},
	{"gc_neg", sig(unary), GridStride, "n"},
	{"gc_exp", sig(unary), GridStride, "n"},
	{"gc_log", sig(unary), GridStride, "n"},
	{"gc_tanh", sig(unary), GridStride, "n"},
	{"gc_sqrt", sig(unary), GridStride, "n"},
	{"gc_relu", sig(unary), GridStride, "n"},
	{"gc_relu_grad", sig(actGrad), GridStride, "n"},
	{"gc_tanh_grad", sig("float* dx, const float* y, const float* dy, long long n"), GridStride, "n"},
	{"gc_gelu", sig(unary), GridStride, "n"},
	{"gc_gelu_grad", sig(actGrad), GridStride, "n"},
	{"gc_silu", sig(unary), GridStride, "n"},
	{"gc_silu_grad", sig(actGrad), GridStride, "n"},
	{"gc_scale", sig("float* out, const float* x, const float* s, long long n"), GridStride, "n"},
	{"gc_scale_by", sig("float* out, const float* x, long long n, float s"), GridStride, "n"},
	{"gc_f32_to_f16", sig("unsigned short* out, const float* x, long long n"), GridStride, "n"},
	{"gc_f32_to_bf16", sig("unsigned short* out, const float* x, long long n"), GridStride, "n"},
	{"gc_f16_to_f32", sig("float* out, const unsigned short* x, long long n"), GridStride, "n"},
	{"gc_bf16_to_f32", sig("float* out, const unsigned short* x, long long n"), GridStride, "n"},
	{"gc_add_widen_bf16", sig("float* out, const float* a, const unsigned short* b, long long n"), GridStride, "n"},
	{"gc_add_widen_f16", sig("float* out, const float* a, const unsigned short* b, long long n"), GridStride, "n"},
	{"gc_add_bf16", sig("unsigned short* out, const unsigned short* a, const unsigned short* b, long long n"), GridStride, "n"},
	{"gc_add_f16", sig("unsigned short* out, const unsigned short* a, const unsigned short* b, long long n"), GridStride, "n"},
	{"gc_round_f16", sig(unary), GridStride, "n"},
	{"gc_round_bf16", sig(unary), GridStride, "n"},
	{"gc_i32_to_f32", sig("float* out, const int* x, long long n"), GridStride, "n"},
	{"gc_relu_mask", sig("unsigned char* mask, const float* x, long long rows, long long n"), GridStride, "rows*n"},
	{"gc_relu_grad_mask", sig("float* dx, const unsigned char* mask, const float* dy, long long rows, long long n"), GridStride, "rows*n"},

	// shape.cu
	{"gc_gather", sig("float* out, const float* in, long long n, long long d1, long long d2, long long d3, long long d4, long long d5, " +
		"long long s0, long long s1, long long s2, long long s3, long long s4, long long s5"), GridStride, "n"},
	{"gc_slice", sig("float* out, const float* in, long long outer, long long d, long long inner, long long start, long long width"), GridStride, "outer*width*inner"},
	{"gc_slice_grad", sig("float* dx, const float* dy, long long outer, long long d, long long inner, long long start, long long width"), GridStride, "outer*d*inner"},
	{"gc_concat_piece", sig("float* out, const float* in, long long outer, long long total, long long inner, long long start, long long width"), GridStride, "outer*width*inner"},
	{"gc_repeat_interleave", sig("float* out, const float* x, long long outer, long long n, long long inner, long long repeats"), GridStride, "outer*n*repeats*inner"},

	// reduce.cu
	{"gc_reduce_sum_rows", sig("float* out, const float* in, long long rows, long long n, int mean"), BlockPerRow, "rows"},
	{"gc_reduce_sum_cols", sig("float* out, const float* in, long long outer, long long r, long long inner, int mean"), BlockPerRow, "outer*inner"},
	{"gc_reduce_max_rows", sig("float* out, const float* in, long long rows, long long n"), BlockPerRow, "rows"},
	{"gc_reduce_max_cols", sig("float* out, const float* in, long long outer, long long r, long long inner"), BlockPerRow, "outer*inner"},
	{"gc_reduce_max_grad", sig("float* dx, const float* x, const float* y, const float* dy, long long outer, long long r, long long inner"), BlockPerRow, "outer*inner"},
	{"gc_repeat_interleave_grad", sig("float* dx, const float* dy, long long outer, long long n, long long inner, long long repeats"), GridStride, "outer*n*inner"},
	{"gc_sum_squares_partial", sig("float* partial, const float* x, long long n"), GridStride, "n"},
	{"gc_finish_sum", sig("float* out, const float* pairs, long long count, long long divisor"), SingleBlock, "count"},
	{"gc_nonfinite_partial", sig("int* partial, const float* x, long long n"), GridStride, "n"},
	{"gc_finish_count", sig("float* out, const int* partial, long long count"), SingleBlock, "count"},

	// nn.cu
	{"gc_softmax", sig("float* out, const float* x, long long rows, long long n"), BlockPerRow, "rows"},
	{"gc_softmax_grad", sig("float* dx, const float* y, const float* dy, long long rows, long long n"), BlockPerRow, "rows"},
	{"gc_causal_mask", sig("float* out, const float* x, long long rows, long long s, long long t, float fill"), GridStride, "rows*t"},
	{"gc_layernorm", sig("float* out, const float* x, const float* gamma, const float* beta, long long rows, long long n, float eps"), BlockPerRow, "rows"},
	{"gc_layernorm_grad_x", sig("float* dx, const float* x, const float* gamma, const float* dy, long long rows, long long n, float eps"), BlockPerRow, "rows"},
	{"gc_layernorm_stats", sig("float* stats, const float* x, long long rows, long long n, float eps"), BlockPerRow, "rows"},
	{"gc_layernorm_grad_gamma", sig("float* dgamma, const float* x, const float* dy, const float* stats, long long rows, long long n"), BlockPerRow, "n"},
	{"gc_rmsnorm", sig("float* out, const float* x, const float* gamma, long long rows, long long n, float eps"), BlockPerRow, "rows"},
	{"gc_rmsnorm_grad_x", sig("float* dx, const float* x, const float* gamma, const float* dy, long long rows, long long n, float eps"), BlockPerRow, "rows"},
	{"gc_rmsnorm_stats", sig("float* stats, const float* x, long long rows, long long n, float eps"), BlockPerRow, "rows"},
	{"gc_rmsnorm_grad_gamma", sig("float* dgamma, const float* x, const float* dy, const float* stats, long long rows, long long n"), BlockPerRow, "n"},
	{"gc_rope", sig("float* out, const float* x, long long rows, long long positions, long long first, long long brk, long long second, long long half, float theta, int inverse"), GridStride, "rows*half"},
	{"gc_embedding", sig("float* out, int* status, const float* table, const int* ids, long long count, long long vocab, long long dim"), GridStride, "count*dim"},
	{"gc_rope_at", sig("float* out, const float* x, const int* pos, long long batch, long long heads, long long step, long long half, float theta"), GridStride, "batch*heads*step*half"},
	{"gc_kv_write", sig("float* out, int* status, const float* fresh, const int* pos, long long batch, long long kv, long long ctx, long long step, long long hd"), GridStride, "batch*kv*step*hd"},
	{"gc_attention_at", sig("float* out, int* status, const float* q, const float* k, const float* v, const int* pos, long long batch, long long heads, long long kvh, long long sq, long long ctx, long long hd, long long group, long long qoff, long long kvoff, float scale"), GridStride, "batch*heads*sq"},
	{"gc_embedding_range", sig("float* out, const float* table, const int* ids, long long count, long long offset, long long rows, long long dim"), GridStride, "count*dim"},
	{"gc_embedding_grad_clear", sig("int* index, long long vocab"), GridStride, "vocab"},
	{"gc_embedding_grad_count", sig("int* index, int* status, const int* ids, long long count, long long vocab, long long offset, long long total"), GridStride, "count"},
	{"gc_embedding_grad_scan", sig("int* index, long long vocab"), SingleBlock, "vocab"},
	{"gc_embedding_grad_place", sig("int* list, int* index, const int* ids, long long count, long long vocab, long long offset"), GridStride, "count"},
	{"gc_embedding_grad", sig("float* dtable, const int* index, const int* list, const int* ids, const float* dy, long long count, long long vocab, long long dim, long long offset"), BlockPerRow, "vocab"},
	{"gc_cross_entropy_rows", sig("float* loss, int* status, const float* logits, const int* labels, long long rows, long long vocab"), BlockPerRow, "rows"},
	{"gc_cross_entropy_grad", sig("float* dlogits, int* status, const float* logits, const int* labels, const float* dloss, long long rows, long long vocab"), BlockPerRow, "rows"},
	{"gc_vocab_ce_max", sig("float* rowmax, const float* logits, long long rows, long long vocab"), BlockPerRow, "rows"},
	{"gc_vocab_ce_sums", sig("float* sums, float* gmax, const float* logits, const int* labels, const float* maxes, long long rows, long long vocab, long long offset, int parts"), BlockPerRow, "rows"},
	{"gc_vocab_ce_loss", sig("float* out, const float* sums, const float* gmax, long long rows"), SingleBlock, "rows"},
	{"gc_vocab_ce_grad", sig("float* dlogits, const float* logits, const int* labels, const float* gmax, const float* sums, const float* dloss, long long rows, long long vocab, long long offset"), GridStride, "rows*vocab"},

	// attention.cu
	{"gc_attention", sig("float* out, float* lse, const float* q, const float* k, const float* v, " + attDims), BlockPerRow, "batch*heads*tiles"},
	{"gc_attention_stats", sig("float* stats, const float* q, const float* k, const float* out, const float* dout, " + attDims), BlockPerRow, "batch*heads*tiles"},
	{"gc_attention_grad_q", sig("float* dq, const float* q, const float* k, const float* v, const float* dout, const float* stats, " + attDims), BlockPerRow, "batch*heads*tiles"},
	{"gc_attention_grad_k", sig("float* dk, const float* q, const float* k, const float* v, const float* dout, const float* stats, " + attDims), BlockPerRow, "batch*kv_heads*tiles"},
	{"gc_attention_grad_v", sig("float* dv, const float* q, const float* k, const float* dout, const float* stats, " + attDims), BlockPerRow, "batch*kv_heads*tiles"},
	{"gc_att_merge", sig("float* acc, float* lse, const float* part, const float* lsp, long long batch, long long heads, long long sq, long long hd"), GridStride, "batch*heads*sq"},
	{"gc_att_stats_merge", sig("float* stats, const float* part, long long rows"), GridStride, "rows"},

	// optim.cu
	{"gc_adam_m", sig("float* out, const float* m, const float* g, long long n, float beta1"), GridStride, "n"},
	{"gc_adam_v", sig("float* out, const float* v, const float* g, long long n, float beta2"), GridStride, "n"},
	{"gc_adamw", sig("float* out, const float* p, const float* m, const float* v, const float* lr, const long long* step, long long n, float beta1, float beta2, float eps, float wd"), GridStride, "n"},
	{"gc_sgd_buf", sig("float* out, const float* buf, const float* g, const float* p, long long n, float momentum, float wd"), GridStride, "n"},
	{"gc_sgd", sig("float* out, const float* p, const float* buf, const float* lr, long long n"), GridStride, "n"},
	{"gc_adafactor_row", sig("float* out, const float* row, const float* g, const long long* step, long long n, long long m, float eps1, float decay"), BlockPerRow, "n"},
	{"gc_adafactor_col", sig("float* out, const float* col, const float* g, const long long* step, long long n, long long m, float eps1, float decay"), BlockPerRow, "m"},
	{"gc_adafactor_v", sig("float* out, const float* v, const float* g, const long long* step, long long n, float eps1, float decay"), GridStride, "n"},
	{"gc_adafactor_rowsum", sig("float* ws, const float* row, long long n"), SingleBlock, "n"},
	{"gc_adafactor_partial", sig("float* partial, const float* p, const float* g, const float* row, const float* col, const float* ws, long long n, long long m"), GridStride, "n*m"},
	{"gc_adafactor_vec_partial", sig("float* partial, const float* p, const float* g, const float* v, long long n"), GridStride, "n"},
	{"gc_adafactor_finish", sig("float* ws, const float* partial, const long long* step, long long blocks, long long size, float eps2, float clip, float rel_step"), SingleBlock, "blocks"},
	{"gc_adafactor_apply", sig("float* out, const float* p, const float* g, const float* row, const float* col, const float* ws, long long n, long long m"), GridStride, "n*m"},
	{"gc_adafactor_vec_apply", sig("float* out, const float* p, const float* g, const float* v, const float* ws, long long n"), GridStride, "n"},
	{"gc_sm3_row", sig("float* out, const float* row, const float* col, const float* g, long long n, long long m"), BlockPerRow, "n"},
	{"gc_sm3_col", sig("float* out, const float* row, const float* col, const float* g, long long n, long long m"), BlockPerRow, "m"},
	{"gc_sm3", sig("float* out, const float* p, const float* g, const float* row, const float* col, const float* lr, long long n, long long m"), GridStride, "n*m"},
	{"gc_sm3_v", sig("float* out, const float* v, const float* g, long long n"), GridStride, "n"},
	{"gc_sm3_vec", sig("float* out, const float* p, const float* g, const float* v, const float* lr, long long n"), GridStride, "n"},
	{"gc_where_finite", sig("float* out, const float* count, const float* fresh, const float* old, long long n"), GridStride, "n"},
	{"gc_clip_coef", sig("float* out, const float* sumsq, float max_norm"), SingleBlock, "1"},

	// moe.cu
	{"gc_top_k_mask", sig("float* out, const float* x, long long rows, long long n, long long k"), BlockPerRow, "rows"},
	{"gc_less", sig(binary), GridStride, "n"},
	{"gc_moe_route_rank", sig("int* rank, const float* scores, const float* mask, long long groups, long long tokens, long long experts"), GridStride, "groups*tokens*experts"},
	{"gc_moe_route_fill", sig("int* src, const int* rank, long long groups, long long tokens, long long experts, long long capacity"), GridStride, "groups*experts"},
	{"gc_moe_dispatch", sig("float* out, int* status, const float* x, const int* src, const float* w, " + moeSizes + ", int weighted"), GridStride, "experts*groups*capacity*hidden"},
	{"gc_moe_combine", sig("float* out, int* status, const float* y, const int* src, const float* w, " + moeSizes + ", int weighted"), BlockPerRow, "groups*tokens"},
	{"gc_moe_slot_dot", sig("float* out, int* status, const float* y, const int* src, const float* x, " + moeSizes), BlockPerRow, "groups*experts*capacity"},
	{"gc_moe_slot_gather", sig("float* out, int* status, const float* p, const int* src, long long groups, long long tokens, long long experts, long long capacity"), GridStride, "groups*experts*capacity"},
	{"gc_moe_slot_scatter", sig("float* out, int* status, const float* w, const int* src, long long groups, long long tokens, long long experts, long long capacity"), GridStride, "groups*experts*tokens"},

	// random.cu
	{"gc_random_uniform", sig("float* out, const int* key, long long keys, long long n, long long stream"), GridStride, "keys*n"},
	{"gc_random_normal", sig("float* out, const int* key, long long keys, long long n, long long stream"), GridStride, "keys*n"},
	{"gc_random_dropout", sig("float* out, const int* key, long long keys, long long n, long long stream, long long keep, float scale"), GridStride, "keys*n"},
	{"gc_normal_cdf", sig(unary), GridStride, "n"},
}

var byName = func() map[string]*Kernel {
	m := make(map[string]*Kernel, len(kernels))
	for i := range kernels {
		m[kernels[i].Name] = &kernels[i]
	}
	return m
}()

// Kernels returns the table of every kernel in the sources, in source
// order. The slice is a copy; the Params slices are shared and must not
// be modified.
func Kernels() []Kernel { return append([]Kernel(nil), kernels...) }

// Lookup finds a kernel by name.
func Lookup(name string) (Kernel, bool) {
	k, ok := byName[name]
	if !ok {
		return Kernel{}, false
	}
	return *k, true
}
