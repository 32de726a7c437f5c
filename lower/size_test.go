package lower_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
)

// paramsModule is a module of n params of type typ, each negated into a
// temporary, with the sum of the last as the loss: every param is a
// persistent buffer and every negation a temporary.
func paramsModule(t *testing.T, n int, typ string) *ir.Module {
	t.Helper()
	var b strings.Builder
	b.WriteString("gir 1\nmodule \"big\"\n")
	for i := range n {
		fmt.Fprintf(&b, "%%%d = param : %s {name=\"w%d\" init=\"zeros\"} @model.go:%d\n", i, typ, i, 10+i)
	}
	for i := range n {
		fmt.Fprintf(&b, "%%%d = neg %%%d : %s @model.go:%d\n", n+i, i, typ, 20+i)
	}
	fmt.Fprintf(&b, "%%%d = reduce_sum %%%d : f32[] {axes=[0,1]} @model.go:30\n", 2*n, 2*n-1)
	fmt.Fprintf(&b, "output \"loss\" = %%%d\n", 2*n)
	m, err := ir.Parse("big.gir", b.String())
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	return m
}

// The arena's offsets are sums of buffer sizes. Each buffer of a verified
// module fits in an int64, but their sum need not: lowering refuses such
// a plan with the largest buffers named instead of wrapping offsets. Plans
// that fit, however large, are laid out exactly.
func TestArenaArithmeticDoesNotWrap(t *testing.T) {
	tests := []struct {
		name  string
		n     int
		typ   string
		arena int64 // when it fits
		want  string
	}{
		{"one TiB param", 1, "f32[524288,524288]", 3 << 40, ""}, // the param, its negation, and the loss's 8 bytes rounded into alignment
		{"sum past the arena limit", 4, "f32[536870912,536870912]", 0, `program "big": its buffers take more than 4096.00 PiB together, more than an arena can address; largest buffers: %0 param f32[536870912,536870912] 1024.00 PiB (params, layer -1) @model.go:10`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := paramsModule(t, tt.n, tt.typ)
			var p *lower.Program
			var err error
			require.NotPanics(t, func() { p, err = lower.Lower(m) })
			if tt.want != "" {
				require.Error(t, err)
				assert.ErrorContains(t, err, tt.want)
				return
			}
			require.NoError(t, err)
			assert.Positive(t, p.ArenaBytes)
			assert.GreaterOrEqual(t, p.ArenaBytes, int64(2<<40), "the param and its negation")
			assert.Less(t, p.ArenaBytes, tt.arena)
			assert.Equal(t, int64(1)<<40, p.PersistentBytes)
			for _, b := range p.Buffers {
				assert.GreaterOrEqual(t, b.Offset, int64(0))
				assert.LessOrEqual(t, b.Offset+b.Bytes, p.ArenaBytes, "buffer %d", b.ID)
			}
			// The runtime's message helpers name the largest first.
			ids := p.LargestBuffers(2)
			require.Len(t, ids, 2)
			assert.Equal(t, int64(1)<<40, p.Buffers[ids[0]].Bytes)
			assert.Contains(t, lower.DescribeBuffer(p.Buffers[ids[0]]), "%0 param f32[524288,524288] 1.00 TiB (params, layer -1) @model.go:10")
		})
	}
}

// A matmul whose placements give its arguments local shapes that do not
// make its own (a .gir whose place attributes were edited: the weight
// whole where the result is a column shard) is refused at lowering,
// naming it, where the kernel panicked on an operand of the wrong length.
// The same module placed consistently lowers.
func TestLoweringRefusesPlacementsThatDisagree(t *testing.T) {
	module := func(weight string) string {
		return "gir 1\nmodule \"m\"\nmesh tp=2\n" +
			`%0 = input : f32[4,8] {name="x" place=[R]} @model.go:7` + "\n" +
			`%1 = param : f32[8,6] {name="w" init="zeros" place=[` + weight + `]} @model.go:8` + "\n" +
			`%2 = matmul %0, %1 : f32[4,6] {place=[S(1)]} @model.go:9` + "\n" +
			`%3 = reduce_sum %2 : f32[] {axes=[0,1] place=[P]} @model.go:10` + "\n" +
			`output "loss" = %3` + "\n"
	}
	for _, tc := range []struct{ weight, want string }{
		{"S(1)", ""},
		{"R", `%2 matmul @model.go:9 (m.gir:6): placed [S(1)], each device holds a block [4,3], but its operands are %0 [R] (a block [4,8]), %1 [R] (a block [8,6]): they make a block [4,6]`},
	} {
		m, err := ir.Parse("m.gir", module(tc.weight))
		require.NoError(t, err)
		var lerr error
		require.NotPanics(t, func() { _, lerr = lower.Lower(m) })
		if tc.want == "" {
			require.NoError(t, lerr)
			continue
		}
		require.Error(t, lerr)
		assert.Contains(t, lerr.Error(), tc.want)
	}
}
