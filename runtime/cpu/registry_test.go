package cpu_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime/cpu"
)

// notEmitted are the table's non-source ops that lowering never hands to
// a backend, so they need no kernel:
//   - reshape: lower.Lower gives a reshape its argument's buffer (the
//     element order is unchanged), so no instruction is emitted for it;
//   - redistribute: the required redistribute pass replaces every one of
//     them with the collectives of its placement change (all_reduce,
//     reduce_scatter, all_gather, shard_slice, all_to_all) before
//     lowering.
var notEmitted = []string{"reshape", "redistribute"}

// lowerOnly are the ops lowering adds to programs that are not in the IR
// op table: buffer copies (offload, pipeline stashes) and pipeline
// transfers.
var lowerOnly = []string{"copy", "send", "recv"}

// The test's own ops, added to the op table as any package adds an op:
// toy_square (x², with a cpu kernel) and toy_cube (x³, without one).
const (
	toySquare = "toy_square"
	toyCube   = "toy_cube"
)

var toyOps = []string{toySquare, toyCube}

func toyOp(name string) *ir.OpInfo {
	return &ir.OpInfo{
		Name: name, Arity: 1, Elementwise: true, Grad: ir.GradNotImplemented, Doc: "a test's elementwise op",
		Infer: func(args []ir.Type, _ ir.Attrs) (ir.Type, error) {
			if !args[0].DType.IsFloat() {
				return ir.Type{}, fmt.Errorf("needs a float type, got %v", args[0])
			}
			return args[0], nil
		},
		Cost: func(args []ir.Type, out ir.Type, _ ir.Attrs) (int64, int64) {
			return out.Shape.NumElements(), args[0].Bytes() + out.Bytes()
		},
	}
}

func square[T kcpu.Float](c *cpu.Call[T]) (func() error, error) {
	out, x := c.Out(), c.Arg(0)
	if len(out) != len(x) {
		return nil, fmt.Errorf("%s: %d elements in, %d out", c.Instr.Op, len(x), len(out))
	}
	return func() error { kcpu.Mul(out, x, x); return nil }, nil
}

// toyErr is the toy ops' registration, made once per test binary: both
// tables refuse a second one, and -count reruns tests in one process.
var toyErr = errors.Join(
	ir.Register(toyOp(toySquare)),
	ir.Register(toyOp(toyCube)),
	cpu.RegisterKernel(toySquare, cpu.Kernel{F32: square[float32], F64: square[float64]}),
)

// Every op the IR can hand the backend has a kernel: the table's ops but
// its sources (param, state, input and const are buffers, not
// instructions) and notEmitted, plus lowerOnly.
func TestEveryLoweredOpHasAKernel(t *testing.T) {
	require.NoError(t, toyErr)
	var want []string
	for _, op := range ir.OpNames() {
		info, found := ir.Lookup(op)
		require.True(t, found, op)
		if info.Source || slices.Contains(notEmitted, op) || slices.Contains(toyOps, op) {
			continue
		}
		want = append(want, op)
	}
	want = append(want, lowerOnly...)
	var missing []string
	for _, op := range want {
		if !cpu.HasKernel(op) {
			missing = append(missing, op)
		}
	}
	assert.Empty(t, missing, "ops lowering can emit that the cpu backend has no kernel for")
	for _, op := range notEmitted {
		_, found := ir.Lookup(op)
		assert.True(t, found, "%s is excluded but no longer in the op table", op)
		assert.False(t, cpu.HasKernel(op), "%s has a kernel but lowering never emits it: drop it from notEmitted or the kernel", op)
	}
}

// Every registered kernel runs an op the IR or lowering can emit: a
// misspelt registration would leave the real op without a kernel.
func TestEveryKernelIsALoweredOp(t *testing.T) {
	ops := cpu.Kernels()
	assert.True(t, slices.IsSorted(ops))
	for _, op := range ops {
		_, inTable := ir.Lookup(op)
		assert.True(t, inTable || slices.Contains(lowerOnly, op), "kernel for %s, which neither the op table nor lowering has", op)
	}
}

func TestRegisterKernelRefusesDuplicatesAndHalfKernels(t *testing.T) {
	k := cpu.Kernel{F32: square[float32], F64: square[float64]}
	require.NoError(t, toyErr)
	err := cpu.RegisterKernel(toySquare, k)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "op toy_square registered twice")
	err = cpu.RegisterKernel("add", k)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "op add registered twice")

	for name, tt := range map[string]struct {
		op string
		k  cpu.Kernel
	}{
		"no name":     {"", k},
		"no F64":      {"toy_half", cpu.Kernel{F32: square[float32]}},
		"no F32":      {"toy_half", cpu.Kernel{F64: square[float64]}},
		"bad operand": {"toy_half", cpu.Kernel{F32: square[float32], F64: square[float64], TypeOf: cpu.Arg(-2)}},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Error(t, cpu.RegisterKernel(tt.op, tt.k))
		})
	}
	assert.False(t, cpu.HasKernel("toy_half"), "a refused kernel is not registered")
}

// toyProgram lowers x → op(x) → y on dtype dt.
func toyProgram(t *testing.T, dt, op string) *lower.Program {
	t.Helper()
	require.NoError(t, toyErr)
	text := fmt.Sprintf(`gir 1
module "toy"
%%0 = state : %[1]s[2,3] {name="x"} @toy.go:1
%%1 = state : %[1]s[2,3] {name="y"} @toy.go:2
%%2 = %[2]s %%0 : %[1]s[2,3] @toy.go:3
update %%1 = %%2
`, dt, op)
	m, err := ir.Parse("toy.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// An op added to the op table and given a kernel runs like a built-in
// one, on both float types and on 16-bit buffers (which the backend
// widens around the float32 kernel).
func TestRegisteredKernelRuns(t *testing.T) {
	require.True(t, cpu.HasKernel(toySquare))
	x := []float64{-3, -1.5, 0, 0.5, 2, 4}
	want := []float64{9, 2.25, 0, 0.25, 4, 16}
	for _, dt := range []string{"f32", "f64", "bf16", "f16"} {
		t.Run(dt, func(t *testing.T) {
			d, err := cpu.Load(toyProgram(t, dt, toySquare), cpu.Options{})
			require.NoError(t, err)
			require.NoError(t, d.SetFloat64s("x", x))
			require.NoError(t, d.Step())
			got, err := d.Float64s("y")
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

// An instruction of an op the IR knows but the backend has no kernel for
// fails at load, naming the op and the instruction.
func TestOpWithoutKernelFailsAtLoad(t *testing.T) {
	require.False(t, cpu.HasKernel(toyCube))
	for _, dt := range []string{"f32", "bf16"} {
		t.Run(dt, func(t *testing.T) {
			_, err := cpu.Load(toyProgram(t, dt, toyCube), cpu.Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "the cpu backend has no kernel for op toy_cube")
			assert.Contains(t, err.Error(), "@toy.go:3")
		})
	}
}

// A registered op on a dtype its kernel cannot take is a load error, not
// a reinterpretation of the bits: square is not marked Bits. (The type
// rule refuses i32, so the lowered buffers are retyped by hand.)
func TestRegisteredKernelRefusesOtherDTypes(t *testing.T) {
	p := toyProgram(t, "f32", toySquare)
	for i := range p.Buffers {
		p.Buffers[i].Type.DType = ir.I32
	}
	_, err := cpu.Load(p, cpu.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the cpu backend cannot run toy_square on i32")
}

// cast converts between f32, f64, i32, i64 and bool both ways: floats to
// integers truncate toward zero, and bool is 1 or 0 from any value other
// than zero (NaN included), as in NumPy and JAX.
func TestCastBetweenEveryWideDType(t *testing.T) {
	// The 16-bit formats too: a cast in a model run under --precision
	// bf16 or fp16 is one of them.
	nan := math.NaN()
	x := []float64{-2.75, -0.5, 0, 0.5, 3.9, 7}
	for _, tc := range []struct {
		via     []string
		x, want []float64
	}{
		{[]string{"f64"}, []float64{-2.75, 0, nan}, []float64{-2.75, 0, nan}},
		{[]string{"i32"}, x, []float64{-2, 0, 0, 0, 3, 7}},
		{[]string{"i64"}, x, []float64{-2, 0, 0, 0, 3, 7}},
		{[]string{"bool"}, []float64{-2.75, -0.5, 0, 0.5, 3.9, nan}, []float64{1, 1, 0, 1, 1, 1}},
		{[]string{"bool", "i32"}, x, []float64{1, 1, 0, 1, 1, 1}},
		{[]string{"bool", "bool", "f64"}, x, []float64{1, 1, 0, 1, 1, 1}},
		{[]string{"i32", "bool"}, x, []float64{1, 0, 0, 0, 1, 1}},
		{[]string{"i64", "f64", "i32"}, x, []float64{-2, 0, 0, 0, 3, 7}},
		{[]string{"i32", "i64", "bool", "i64"}, x, []float64{1, 0, 0, 0, 1, 1}},
		// 16-bit floats to and from the others, through f32.
		{[]string{"bf16", "i32"}, x, []float64{-2, 0, 0, 0, 3, 7}},
		{[]string{"f16", "i64"}, x, []float64{-2, 0, 0, 0, 3, 7}},
		{[]string{"bf16", "bool"}, []float64{-2.75, -0.5, 0, 0.5, 3.9, nan}, []float64{1, 1, 0, 1, 1, 1}},
		{[]string{"i32", "bf16"}, x, []float64{-2, 0, 0, 0, 3, 7}},
		{[]string{"bool", "f16", "f64"}, x, []float64{1, 1, 0, 1, 1, 1}},
		{[]string{"f64", "bf16", "f16"}, []float64{-2.75, 0.5, 3.9}, []float64{-2.75, 0.5, 3.90625}},
	} {
		t.Run(strings.Join(tc.via, "-"), func(t *testing.T) {
			n := len(tc.x)
			text := fmt.Sprintf("gir 1\nmodule \"cast\"\n%%0 = state : f32[%d] {name=\"x\"} @c.go:1\n%%1 = state : f32[%[1]d] {name=\"y\"} @c.go:2\n", n)
			from := 0
			for i, d := range append(slices.Clone(tc.via), "f32") {
				text += fmt.Sprintf("%%%d = cast %%%d : %s[%d] {to=\"%[3]s\"} @c.go:3\n", i+2, from, d, n)
				from = i + 2
			}
			text += fmt.Sprintf("update %%1 = %%%d\n", from)
			m, err := ir.Parse("cast.gir", text)
			require.NoError(t, err)
			require.NoError(t, ir.Verify(m, ""))
			p, err := lower.Lower(m)
			require.NoError(t, err)
			d, err := cpu.Load(p, cpu.Options{})
			require.NoError(t, err)
			require.NoError(t, d.SetFloat64s("x", tc.x))
			require.NoError(t, d.Step())
			got, err := d.Float64s("y")
			require.NoError(t, err)
			require.Len(t, got, n)
			for i := range got {
				if math.IsNaN(tc.want[i]) {
					assert.True(t, math.IsNaN(got[i]), "element %d", i)
					continue
				}
				assert.InDelta(t, tc.want[i], got[i], 1e-6, "element %d of %v", i, tc.x)
			}
		})
	}
}

// A kernel's own check failing at run time (operands of other lengths
// than its result, as a .gir whose placements were edited after the
// shard pass makes them) is an error naming the instruction, wrapping
// ErrMalformed, not a panic of the device's goroutine.
func TestMalformedInstructionIsAnError(t *testing.T) {
	m, err := ir.Parse("bad.gir", `gir 1
module "bad"
%0 = state : f32[2,3] {name="x"} @bad.go:1
%1 = state : f32[2,3] {name="y"} @bad.go:2
%2 = add %0, %1 : f32[2,3] @bad.go:3
update %1 = %2
`)
	require.NoError(t, err)
	p, err := lower.Lower(m)
	require.NoError(t, err)
	var add *lower.Instr
	for i := range p.Instrs {
		if p.Instrs[i].Op == "add" {
			add = &p.Instrs[i]
		}
	}
	require.NotNil(t, add)
	// The operand x is read as 3 elements where the result has 6.
	x := &p.Buffers[add.Args[0]]
	x.Bytes /= 2
	x.Type.Shape = ir.Shape{3}
	d, err := cpu.Load(p, cpu.Options{})
	require.NoError(t, err)
	assert.NotPanics(t, func() { err = d.Step() })
	require.ErrorIs(t, err, cpu.ErrMalformed)
	assert.Contains(t, err.Error(), "%2 add @bad.go:3")
}
