package ir_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

// TestOpCostByHand checks costs worked out by hand from the conventions
// in cost.go: flops per element from the kernel's formula, bytes as every
// argument read once plus the result written once.
func TestOpCostByHand(t *testing.T) {
	const tr = ir.TranscendentalFlops
	cases := []struct {
		name         string
		op           string
		args         []ir.Type
		out          ir.Type
		attrs        ir.Attrs
		flops, bytes int64
	}{
		// 2·m·n·k: 2·4·16·8; (4·8 + 8·16 + 4·16)·4 bytes.
		{"matmul", "matmul", types(f32(4, 8), f32(8, 16)), f32(4, 16), nil, 2 * 4 * 16 * 8, (32 + 128 + 64) * 4},
		// Per batch: 3 batches of 2·4·5·8.
		{"batched matmul", "matmul", types(f32(3, 4, 8), f32(3, 8, 5)), f32(3, 4, 5), nil, 3 * 2 * 4 * 5 * 8, (96 + 120 + 60) * 4},
		// transA reads a as [k,m]: k = 8.
		{"matmul transA", "matmul", types(f32(8, 4), f32(8, 16)), f32(4, 16), ir.Attrs{"transA": true}, 2 * 4 * 16 * 8, (32 + 128 + 64) * 4},
		{"bf16 matmul", "matmul", types(bf16(4, 8), bf16(8, 16)), bf16(4, 16), nil, 2 * 4 * 16 * 8, (32 + 128 + 64) * 2},
		// 7 per element (mean, centre, square, sum, normalise, γ, β).
		{"layernorm", "layernorm", types(f32(2, 8), f32(8), f32(8)), f32(2, 8), ir.Attrs{"eps": 1e-5}, 7 * 16, (16 + 8 + 8 + 16) * 4},
		{"add", "add", types(f32(4, 8), f32(4, 8)), f32(4, 8), nil, 32, 3 * 32 * 4},
		{"exp", "exp", types(f64(10)), f64(10), nil, 10 * tr, 2 * 10 * 8},
		// 0.5·x·(1+tanh(c·(x+a·x³))): 8 and one tanh per element.
		{"gelu", "gelu", types(f32(2, 3)), f32(2, 3), nil, 6 * (8 + tr), 2 * 6 * 4},
		{"silu", "silu", types(f32(2, 3)), f32(2, 3), nil, 6 * (3 + tr), 2 * 6 * 4},
		{"rmsnorm", "rmsnorm", types(f32(2, 8), f32(8)), f32(2, 8), ir.Attrs{"eps": 1e-6}, 4 * 16, (16 + 8 + 16) * 4},
		{"rope", "rope", types(f32(2, 8)), f32(2, 8), ir.Attrs{"theta": 1e4}, 16 * (3 + tr), 2 * 16 * 4},
		{"reduce_sum", "reduce_sum", types(f32(4, 8)), f32(4), ir.Attrs{"axes": []int{1}}, 32, (32 + 4) * 4},
		{"reduce_mean", "reduce_mean", types(f32(4, 8)), f32(4), ir.Attrs{"axes": []int{1}}, 32 + 4, (32 + 4) * 4},
		{"softmax", "softmax", types(f32(4, 8)), f32(4, 8), nil, 32 * (4 + tr), 2 * 32 * 4},
		// A reshape is a view.
		{"reshape", "reshape", types(f32(4, 8)), f32(32), ir.Attrs{"shape": []int{32}}, 0, 0},
		{"transpose", "transpose", types(f32(4, 8)), f32(8, 4), ir.Attrs{"perm": []int{1, 0}}, 0, 2 * 32 * 4},
		// A slice reads only what it keeps.
		{"slice", "slice", types(f32(4, 8)), f32(4, 2), ir.Attrs{"dim": 1, "start": 0, "end": 2}, 0, 2 * 8 * 4},
		// A gather: the ids, and each id's row in and out.
		{"embedding", "embedding", types(f32(100, 16), i32(2, 3)), f32(2, 3, 16), nil, 0, 6*4 + 2*96*4},
		// Zero the table, read-add-write one row per id.
		{"embedding_grad", "embedding_grad", types(i32(2, 3), f32(2, 3, 16)), f32(10, 16), ir.Attrs{"vocab": 10}, 96, 6*4 + 96*4 + 160*4 + 2*96*4},
		{"cross_entropy", "cross_entropy", types(f32(4, 10), i32(4)), f32(), nil, 40 * (3 + tr), 40*4 + 4*4 + 4},
		// Collectives: no flops, the local argument and result.
		{"all_reduce", "all_reduce", types(f32(4, 8)), f32(4, 8), ir.Attrs{"axis": "dp"}, 0, 2 * 32 * 4},
		{"reduce_scatter", "reduce_scatter", types(f32(8, 4)), f32(4, 4), ir.Attrs{"axis": "dp", "dim": 0}, 0, (32 + 16) * 4},
		{"all_gather", "all_gather", types(f32(4, 4)), f32(8, 4), ir.Attrs{"axis": "tp", "dim": 0}, 0, (16 + 32) * 4},
		{"sum_squares", "sum_squares", types(f32(4, 8), f32(3)), f32(), nil, 2 * 35, (32 + 3 + 1) * 4},
		// β1·m + (1−β1)·g.
		{"adam_m", "adam_m", types(f32(4, 8), f32(4, 8)), f32(4, 8), ir.Attrs{"beta1": 0.9}, 3 * 32, 3 * 32 * 4},
		// p, m, v, lr (f32 scalar), step (i64 scalar), result p.
		{"adamw", "adamw", types(f32(4, 8), f32(4, 8), f32(4, 8), f32(), i64()), f32(4, 8), nil, (8 + tr) * 32, 4*32*4 + 4 + 8},
		// g² + ε₁ summed over g [4,8], then the blend of row [4].
		{"adafactor_row", "adafactor_row", types(f32(4), f32(4, 8), i64()), f32(4), nil, 3*32 + 3*4, (4+32+4)*4 + 8},
		// The body's steps at their own cost; only the fused op's traffic.
		{"fused", "fused", types(f32(2, 8), f32(2, 8)), f32(2, 8), ir.Attrs{"body": "t0=add a0 a1; t1=gelu t0"}, 16 * (1 + 8 + tr), 3 * 16 * 4},
		{"const", "const", nil, f32(4, 8), ir.Attrs{"value": 1.0}, 0, 0},
		// b·h = 2·4 heads of 16·16 pairs, (4·8 + 4 + exp) each; q, k, v
		// (k/v with 2 heads), out.
		{"attention", "attention", types(f32(2, 4, 16, 8), f32(2, 2, 16, 8), f32(2, 2, 16, 8)), f32(2, 16, 4, 8), attn(false),
			8 * 256 * (4*8 + 4 + tr), (1024 + 512 + 512 + 1024) * 4},
		// Causal: 16·17/2 = 136 pairs a head.
		{"causal attention", "attention", types(f32(2, 4, 16, 8), f32(2, 2, 16, 8), f32(2, 2, 16, 8)), f32(2, 16, 4, 8), attn(true),
			8 * 136 * (4*8 + 4 + tr), (1024 + 512 + 512 + 1024) * 4},
		// 4 queries aligned to the end of 6 keys: 3+4+5+6 = 18 pairs.
		{"causal attention over a longer key", "attention", types(f32(1, 1, 4, 2), f32(1, 1, 6, 2), f32(1, 1, 6, 2)), f32(1, 4, 1, 2), attn(true),
			18 * (4*2 + 4 + tr), (8 + 12 + 12 + 8) * 4},
		// The sweep plus D's 2 per element of dout; fp32 stats from bf16.
		{"attention_stats", "attention_stats", types(bf16(1, 2, 4, 2), bf16(1, 2, 4, 2), bf16(1, 4, 2, 2), bf16(1, 4, 2, 2)), f32(1, 2, 4, 2), attn(false),
			2*16*(2*2+4+tr) + 2*16, 4*16*2 + 16*4},
		{"attention_grad_q", "attention_grad_q", types(f32(1, 2, 4, 2), f32(1, 1, 4, 2), f32(1, 1, 4, 2), f32(1, 4, 2, 2), f32(1, 2, 4, 2)), f32(1, 2, 4, 2), attn(true),
			2 * 10 * (6*2 + 4 + tr), (16 + 8 + 8 + 16 + 16 + 16) * 4},
		{"attention_grad_v", "attention_grad_v", types(f32(1, 2, 4, 2), f32(1, 1, 4, 2), f32(1, 4, 2, 2), f32(1, 2, 4, 2)), f32(1, 1, 4, 2), attn(false),
			2 * 16 * (4*2 + 2 + tr), (16 + 8 + 16 + 16 + 8) * 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			info, ok := ir.Lookup(c.op)
			require.True(t, ok)
			require.NotNil(t, info.Cost)
			flops, bytes := info.Cost(c.args, c.out, c.attrs)
			assert.Equal(t, c.flops, flops, "flops")
			assert.Equal(t, c.bytes, bytes, "bytes")
		})
	}
}

// TestEveryOpHasACost walks the table: every op has a cost function, and
// on every well-typed use in validOps it gives no negative count, and some
// traffic for every op that computes (all but the sources and the
// reshape view).
func TestEveryOpHasACost(t *testing.T) {
	for _, name := range ir.OpNames() {
		info, _ := ir.Lookup(name)
		assert.NotNil(t, info.Cost, "op %s has no cost function", name)
	}
	for i, c := range validOps {
		t.Run(fmt.Sprintf("%s/%d", c.op, i), func(t *testing.T) {
			info, ok := ir.Lookup(c.op)
			require.True(t, ok)
			require.NotNil(t, info.Cost)
			flops, bytes := info.Cost(c.args, c.want, c.attrs)
			assert.GreaterOrEqual(t, flops, int64(0))
			if info.Source || c.op == "reshape" {
				assert.Zero(t, bytes, "%s costs nothing per step", c.op)
				return
			}
			assert.Positive(t, bytes, "%s moves data", c.op)
		})
	}
}
