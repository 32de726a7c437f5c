package ir_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

const tera = 1 << 40 // a --set size that fits an int but not squared in an int64

func TestShapeElementsAreCheckedAndNeverWrap(t *testing.T) {
	tests := []struct {
		name  string
		shape ir.Shape
		want  int64
		err   string // "" when Elements succeeds
	}{
		{"scalar", ir.Shape{}, 1, ""},
		{"matrix", ir.Shape{4, 128}, 512, ""},
		{"largest", ir.Shape{math.MaxInt64}, math.MaxInt64, ""},
		{"zero dim", ir.Shape{0, tera, tera}, 0, ""},
		{"overflow", ir.Shape{tera, tera}, 0, "shape [1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds"},
		{"overflow that wraps to a small positive", ir.Shape{1 << 32, 1 << 32, 3}, 0, "has 5.53e+19 elements"},
		{"wraps to exactly zero", ir.Shape{1 << 32, 1 << 32}, 0, "has 1.84e+19 elements"},
		{"negative", ir.Shape{4, -2}, 0, "dims cannot be negative, got shape [4,-2] (dim 1 is -2)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := tt.shape.Elements()
			if tt.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, n)
				assert.Equal(t, tt.want, tt.shape.NumElements())
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tt.err)
			var se *ir.SizeError
			assert.True(t, errors.As(err, &se), "a *ir.SizeError: %T", err)
			assert.Equal(t, int64(math.MaxInt64), tt.shape.NumElements(), "the unchecked count saturates, never wraps")
		})
	}
}

func TestTypeByteSizeIsCheckedAndBytesSaturate(t *testing.T) {
	tests := []struct {
		name string
		typ  ir.Type
		want int64
		err  string
	}{
		{"f32", ir.T(ir.F32, 4, 128), 2048, ""},
		{"bf16", ir.T(ir.BF16, 3), 6, ""},
		{"elements fit, bytes do not", ir.T(ir.F32, 1<<31, 1<<31), 0, "f32[2147483648,2147483648] takes 1.84e+19 bytes (4 per element), more than int64 holds"},
		{"elements overflow", ir.T(ir.F64, tera, tera), 0, "f64[1099511627776,1099511627776] has 1.21e+24 elements"},
		{"negative", ir.T(ir.F32, -1), 0, "dims cannot be negative, got f32[-1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := tt.typ.ByteSize()
			if tt.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, n)
				assert.Equal(t, tt.want, tt.typ.Bytes())
				return
			}
			assert.ErrorContains(t, err, tt.err)
			assert.Equal(t, int64(math.MaxInt64), tt.typ.Bytes())
		})
	}
}

func TestCheckedArithmetic(t *testing.T) {
	tests := []struct {
		name     string
		a, b     int64
		mul, add int64
		mulOK    bool
		addOK    bool
	}{
		{"small", 3, 4, 12, 7, true, true},
		{"mul overflows", 1 << 32, 1 << 31, 0, 1<<32 + 1<<31, false, true},
		{"add overflows", math.MaxInt64, 1, math.MaxInt64, 0, true, false},
		{"negative is refused", -1, 2, 0, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := ir.MulInt64(tt.a, tt.b)
			assert.Equal(t, tt.mulOK, ok)
			if ok {
				assert.Equal(t, tt.mul, m)
				assert.Equal(t, m, ir.SatMul(tt.a, tt.b))
			} else {
				assert.Equal(t, int64(math.MaxInt64), ir.SatMul(tt.a, tt.b))
			}
			s, ok := ir.AddInt64(tt.a, tt.b)
			assert.Equal(t, tt.addOK, ok)
			if ok {
				assert.Equal(t, tt.add, s)
			} else {
				assert.Equal(t, int64(math.MaxInt64), ir.SatAdd(tt.a, tt.b))
			}
		})
	}
}

// Sizes in .gir text are untrusted: a dim whose product overflows, or a
// negative one, is refused with the file and line.
func TestParseRejectsSizesThatDoNotFit(t *testing.T) {
	tests := []struct {
		name, decl, want string
	}{
		{"elements", `%0 = param : f32[1099511627776,1099511627776] {name="w" init="zeros"}`, "big.gir:3: f32[1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds"},
		{"bytes", `%0 = param : f64[4294967296,1073741824] {name="w" init="zeros"}`, "big.gir:3: f64[4294967296,1073741824] takes 3.69e+19 bytes (8 per element), more than int64 holds"},
		{"wraps to zero", `%0 = param : f32[4294967296,4294967296] {name="w" init="zeros"}`, "big.gir:3: f32[4294967296,4294967296] has 1.84e+19 elements, more than int64 holds"},
		{"negative", `%0 = param : f32[-4,8] {name="w" init="zeros"}`, "big.gir:3: dims cannot be negative, got f32[-4,8] (dim 0 is -4)"},
		{"mesh", "mesh dp=4294967296,tp=4294967296", "big.gir:3: mesh dp=4294967296,tp=4294967296 spans more devices than an int holds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ir.Parse("big.gir", "gir 1\nmodule \"m\"\n"+tt.decl+"\n")
			require.Error(t, err)
			var pe *ir.ParseError
			require.True(t, errors.As(err, &pe), "%T", err)
			assert.Equal(t, 3, pe.Line)
			assert.EqualError(t, err, tt.want)
		})
	}
}

// The type rules multiply and add dims from attributes; a result too large
// for an int64 is an error of the op, at the user's line, whatever the
// arguments.
func TestTypeRulesRefuseResultsThatDoNotFit(t *testing.T) {
	m := ir.NewModule("m")
	pos := ir.Pos{File: "model.go", Line: 9}
	x, err := m.AddSource("input", ir.T(ir.F32, tera, 1), ir.Attrs{"name": "x"}, ir.NoMeta, pos)
	require.NoError(t, err)
	y, err := m.AddSource("input", ir.T(ir.F32, 1, tera), ir.Attrs{"name": "y"}, ir.NoMeta, pos)
	require.NoError(t, err)
	big, err := m.AddSource("input", ir.T(ir.F32, 1<<62), ir.Attrs{"name": "big"}, ir.NoMeta, pos)
	require.Error(t, err, "4·2^62 bytes do not fit")
	require.Nil(t, big)
	v, err := m.AddSource("input", ir.T(ir.F32, 1<<60), ir.Attrs{"name": "v"}, ir.NoMeta, pos)
	require.NoError(t, err)
	tests := []struct {
		name  string
		op    string
		args  []*ir.Value
		attrs ir.Attrs
		want  string
	}{
		{"matmul", "matmul", []*ir.Value{x, y}, nil, "model.go:9: matmul: f32[1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds"},
		{"broadcast", "broadcast", []*ir.Value{x}, ir.Attrs{"shape": []int{tera, tera}}, "model.go:9: broadcast: f32[1099511627776,1099511627776] has 1.21e+24 elements"},
		{"broadcast to a zero dim", "broadcast", []*ir.Value{x}, ir.Attrs{"shape": []int{tera, 0}}, "broadcast to [1099511627776,0]: dims must be positive"},
		{"reshape", "reshape", []*ir.Value{x}, ir.Attrs{"shape": []int{tera, tera}}, "model.go:9: reshape: reshape to [1099511627776,1099511627776]: shape [1099511627776,1099511627776] has 1.21e+24 elements"},
		{"repeat", "repeat_interleave", []*ir.Value{v}, ir.Attrs{"dim": 0, "repeats": 1 << 4}, "model.go:9: repeat_interleave: repeating dim 0 of f32[1152921504606846976] 16 times gives more than an int holds"},
		{"repeat past bytes", "repeat_interleave", []*ir.Value{v}, ir.Attrs{"dim": 0, "repeats": 4}, "takes 1.84e+19 bytes"},
		{"concat", "concat", []*ir.Value{v, v, v, v, v, v, v, v}, ir.Attrs{"dim": 0}, "model.go:9: concat: concatenating 8 args on dim 0 gives more than an int holds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := m.Add(tt.op, tt.args, tt.attrs, ir.NoMeta, pos)
			require.Error(t, err)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// A module built by hand (or mutated by a pass) with sizes no parser
// would accept is still refused by the verifier, and a block count that
// would wrap the divisor to 0 is an error, not a division panic.
func TestVerifyNamesSizesThatDoNotFit(t *testing.T) {
	t.Run("source too large", func(t *testing.T) {
		m := ir.NewModule("m")
		p, err := m.AddSource("param", ir.T(ir.F32, 4), ir.Attrs{"name": "w", "init": "zeros"}, ir.NoMeta, ir.Pos{File: "model.go", Line: 3})
		require.NoError(t, err)
		p.Type = ir.T(ir.F32, tera, tera)
		err = ir.Verify(m, "shard")
		require.Error(t, err)
		assert.ErrorContains(t, err, `after pass "shard": %0 param @model.go:3: f32[1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds`)
	})
	t.Run("blocks that wrap the divisor", func(t *testing.T) {
		text := "gir 1\nmodule \"m\"\nmesh tp=4\n" +
			`%0 = param : f32[8] {name="w" init="zeros" place=[S(0)x4611686018427387904]} @model.go:3` + "\n"
		m, err := ir.Parse("m.gir", text)
		require.NoError(t, err)
		var verr error
		require.NotPanics(t, func() { verr = ir.Verify(m, "") })
		assert.ErrorContains(t, verr, "S(0)x4611686018427387904 on axis tp: 4 parts of 4611686018427387904 blocks are more than an int64 holds")
	})
}

// Costs of valid but huge tensors saturate instead of wrapping negative
// (a wrapped cost reads as free to a cost model).
func TestCostsSaturate(t *testing.T) {
	info, ok := ir.Lookup("matmul")
	require.True(t, ok)
	a, b := ir.T(ir.F32, 1<<30, 1<<30), ir.T(ir.F32, 1<<30, 1<<30)
	flops, bytes := info.Cost([]ir.Type{a, b}, ir.T(ir.F32, 1<<30, 1<<30), nil)
	assert.Equal(t, int64(math.MaxInt64), flops, "2·2^60·2^30 flops")
	assert.Equal(t, int64(math.MaxInt64), bytes, "three tensors of 2^62 bytes")
}
