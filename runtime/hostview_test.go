package runtime_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

func lowerText(t *testing.T, text string) *lower.Program {
	t.Helper()
	m, err := ir.Parse("t.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

func TestEncodeDecode(t *testing.T) {
	bf16 := func(x float64) float64 { return float64(kcpu.F32FromBF16(kcpu.BF16FromF32(float32(x)))) }
	f16 := func(x float64) float64 { return float64(kcpu.F32FromF16(kcpu.F16FromF32(float32(x)))) }
	cases := []struct {
		dt   ir.DType
		in   []float64
		want []float64
	}{
		{ir.F64, []float64{math.Pi, -1e300, 0}, []float64{math.Pi, -1e300, 0}},
		{ir.F32, []float64{math.Pi, 0.5, -3}, []float64{float64(float32(math.Pi)), 0.5, -3}},
		{ir.I32, []float64{2.7, -2.7, -7}, []float64{2, -2, -7}},
		{ir.I64, []float64{1 << 40, -3.9}, []float64{1 << 40, -3}},
		// 1+2⁻⁸ lies halfway between two bf16 values: ties go to the even one.
		{ir.BF16, []float64{1 + 1.0/256, 1 + 3.0/256, math.Pi}, []float64{1, 1 + 4.0/256, bf16(math.Pi)}},
		{ir.F16, []float64{1 + 1.0/2048, 65504, math.Pi}, []float64{1, 65504, f16(math.Pi)}},
	}
	for _, c := range cases {
		t.Run(c.dt.String(), func(t *testing.T) {
			raw, err := runtime.Encode(c.dt, c.in)
			require.NoError(t, err)
			assert.Len(t, raw, len(c.in)*int(c.dt.Size()))
			got, err := runtime.Decode(ir.Type{DType: c.dt, Shape: ir.Shape{len(c.in)}}, raw)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
	_, err := runtime.Encode(ir.U8, []float64{1})
	assert.ErrorContains(t, err, "cannot write u8 values")
	_, err = runtime.Decode(ir.Type{DType: ir.Bool, Shape: ir.Shape{1}}, []byte{1})
	assert.ErrorContains(t, err, "cannot read bool")
	_, err = runtime.Decode(ir.Type{DType: ir.F32, Shape: ir.Shape{2}}, make([]byte, 7))
	assert.ErrorContains(t, err, "needs 8 bytes; got 7", "a short read is an error, not a panic")
	raw, err := runtime.EncodeFilled(ir.Type{DType: ir.F32, Shape: ir.Shape{2, 2}}, 1.5)
	require.NoError(t, err)
	got, err := runtime.Decode(ir.Type{DType: ir.F32, Shape: ir.Shape{4}}, raw)
	require.NoError(t, err)
	assert.Equal(t, []float64{1.5, 1.5, 1.5, 1.5}, got)
}

// copyMemory keeps each buffer apart and hands out copies, as a GPU's
// memory does; it counts writes and can be made to fail.
type copyMemory struct {
	bufs   map[int][]byte
	writes int
	fail   error
}

func (m *copyMemory) ReadBuffer(b lower.Buffer) ([]byte, error) {
	if m.fail != nil {
		return nil, m.fail
	}
	out := make([]byte, b.Bytes)
	copy(out, m.bufs[b.ID])
	return out, nil
}

func (m *copyMemory) WriteBuffer(b lower.Buffer, data []byte) error {
	if m.fail != nil {
		return m.fail
	}
	m.writes++
	m.bufs[b.ID] = append([]byte(nil), data...)
	return nil
}

const paramsText = `gir 1
module "params"
%0 = param : f32[2,3] {init="normal(0.5)" name="w"} @model.go:1
%1 = param : f32[3] {init="ones" name="b"} @model.go:2
%2 = state : f32[2,3] {init="copy:w" name="prev/w"} @model.go:3
%3 = state : f32[3] {name="m"} @model.go:4
%4 = input : i32[4] {name="ids"} @model.go:5
%5 = input : f32[] {name="lr"} @model.go:6
%6 = add %3, %1 : f32[3] @model.go:7
update %3 = %6
`

// A HostView gives a device whose memory the host cannot share (copies
// in and out) exactly what the CPU device, which shares it, holds.
func TestHostViewOverCopiedMemoryMatchesTheCPUDevice(t *testing.T) {
	p := lowerText(t, paramsText)
	mem := &copyMemory{bufs: map[int][]byte{}}
	v := runtime.NewHostView(p, nil, mem)
	d, err := cpu.Load(p, cpu.Options{})
	require.NoError(t, err)
	for _, h := range []interface {
		InitParams(uint64) error
		SetScalar(string, float64) error
		SetInt32(string, []int32) error
	}{v, d} {
		require.NoError(t, h.InitParams(3))
		require.NoError(t, h.SetScalar("lr", 0.25))
		require.NoError(t, h.SetInt32("ids", []int32{3, -1, 0, 7}))
	}
	for _, name := range []string{"w", "b", "prev/w", "m", "ids", "lr"} {
		want, wt, err := d.Bytes(name)
		require.NoError(t, err)
		got, gt, err := v.Bytes(name)
		require.NoError(t, err)
		assert.Equal(t, wt, gt, name)
		assert.Equal(t, want, got, name)
	}
	w, err := v.Float64s("w")
	require.NoError(t, err)
	prev, err := v.Float64s("prev/w")
	require.NoError(t, err)
	assert.Equal(t, w, prev, "copy: state takes the param's initial value")
	assert.NotEqual(t, make([]float64, 6), w)
	b, err := v.Float64s("b")
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 1, 1}, b)
	lr, err := v.Scalar("lr")
	require.NoError(t, err)
	assert.Equal(t, 0.25, lr)
	ids, err := v.Float64s("ids")
	require.NoError(t, err)
	assert.Equal(t, []float64{3, -1, 0, 7}, ids)

	require.NoError(t, v.SetFloat64s("w", []float64{1, 2, 3, 4, 5, 6}))
	raw, _, err := v.Bytes("w")
	require.NoError(t, err)
	require.NoError(t, d.SetBytes("w", raw))
	got, err := d.Float64s("w")
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 2, 3, 4, 5, 6}, got)
}

func TestHostViewRefusesBadWritesBeforeTouchingMemory(t *testing.T) {
	p := lowerText(t, paramsText)
	mem := &copyMemory{bufs: map[int][]byte{}}
	v := runtime.NewHostView(p, nil, mem)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"short ids", v.SetInt32("ids", []int32{1, 2}), `input "ids" is i32[4]; got 2 int32 values`},
		{"ids into a float", v.SetInt32("lr", []int32{1}), `input "lr" is f32[]; got 1 int32 values`},
		{"vector as scalar", v.SetScalar("b", 1), `input "b" is f32[3], not a scalar`},
		{"unknown source", v.SetScalar("nope", 1), `program "params" has no param, state or input named "nope"`},
		{"short floats", v.SetFloat64s("w", []float64{1}), `"w" is f32[2,3]; got 1 values`},
		{"floats into ints", v.SetFloat64s("ids", []float64{1, 2, 3, 4}), `"ids" is i32[4], not a float tensor`},
		{"short bytes", v.SetBytes("b", make([]byte, 11)), `"b" is f32[3] (12 bytes); got 11 bytes`},
	}
	for _, c := range cases {
		assert.ErrorContains(t, c.err, c.want, c.name)
	}
	assert.Zero(t, mem.writes, "nothing reached memory")
	_, err := v.Float64s("nope")
	assert.ErrorContains(t, err, `no output or source named "nope"`)

	mem.fail = errors.New("device lost")
	assert.ErrorIs(t, v.InitParams(1), mem.fail)
	_, err = v.Scalar("lr")
	assert.ErrorIs(t, err, mem.fail)
}
