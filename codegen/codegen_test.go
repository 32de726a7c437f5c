package codegen_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/codegen"
	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// bodies between them hold every elementwise op of the op table (checked
// by TestBodiesCoverElementwiseOps), with temps read twice, args read by
// several steps and optimizer attributes.
var bodies = []struct {
	text  string
	nargs int
}{
	{"t0=add a0 a1; t1=gelu t0", 2},
	{"t0=mul a1 a0; t1=gelu t0; t2=add t1 a2", 3},
	{"t0=add a0 a1; t1=add a2 t0", 3},
	{"t0=sub a0 a1; t1=div t0 a1; t2=neg t1; t3=exp t2", 2},
	{"t0=mul a0 a0; t1=log t0; t2=sqrt t0; t3=tanh t1; t4=mul t3 t2", 1},
	{"t0=relu a0; t1=relu_grad a0 a1; t2=add t0 t1", 2},
	{"t0=tanh a0; t1=tanh_grad t0 a1; t2=gelu_grad a0 t1", 2},
	{"t0=gelu_grad a0 a1", 2}, // a single op, the degenerate group
	{"t0=adam_m a0 a1 beta1=0.9; t1=adam_v a2 a1 beta2=0.95; t2=div t0 t1", 3},
	{"t0=sgd_buf a0 a1 a2 momentum=0.9 wd=0.1; t1=sm3_v t0 a1; t2=sub t1 a2", 3},
	{"t0=silu a0; t1=mul t0 a1; t2=silu_grad a0 a2; t3=add t1 t2", 3}, // SwiGLU and its gradient
}

func parse(t *testing.T, text string, nargs int) ir.FusedBody {
	t.Helper()
	b, err := ir.ParseFusedBody(text, nargs)
	require.NoError(t, err)
	return b
}

func TestBodiesCoverElementwiseOps(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range bodies {
		for _, st := range parse(t, c.text, c.nargs) {
			seen[st.Op] = true
		}
	}
	for _, name := range ir.OpNames() {
		info, _ := ir.Lookup(name)
		if info.Elementwise && name != ir.FusedOp {
			assert.True(t, seen[name], "no test body uses %s", name)
		}
	}
}

// opByOp runs a body the way the unfused program does: each op over the
// whole arrays with the kernels/cpu function the CPU backend calls.
func opByOp[T kcpu.Float](t testing.TB, body ir.FusedBody, args [][]T) []T {
	temps := make([][]T, len(body))
	for i := range temps {
		temps[i] = make([]T, len(args[0]))
	}
	return opByOpInto(t, body, args, temps)
}

// opByOpInto is opByOp with a buffer per step given, as the unfused
// program has one in its arena.
func opByOpInto[T kcpu.Float](t testing.TB, body ir.FusedBody, args, temps [][]T) []T {
	for i, st := range body {
		in := stepInputs(st, args, temps)
		o := temps[i]
		f := func(name string) T { return T(st.Attrs[name].(float64)) }
		switch st.Op {
		case "add":
			kcpu.Add(o, in[0], in[1])
		case "sub":
			kcpu.Sub(o, in[0], in[1])
		case "mul":
			kcpu.Mul(o, in[0], in[1])
		case "div":
			kcpu.Div(o, in[0], in[1])
		case "neg":
			kcpu.Neg(o, in[0])
		case "exp":
			kcpu.Exp(o, in[0])
		case "log":
			kcpu.Log(o, in[0])
		case "tanh":
			kcpu.Tanh(o, in[0])
		case "sqrt":
			kcpu.Sqrt(o, in[0])
		case "gelu":
			kcpu.Gelu(o, in[0])
		case "relu":
			kcpu.Relu(o, in[0])
		case "gelu_grad":
			kcpu.GeluGrad(o, in[0], in[1])
		case "silu":
			kcpu.Silu(o, in[0])
		case "silu_grad":
			kcpu.SiluGrad(o, in[0], in[1])
		case "relu_grad":
			kcpu.ReluGrad(o, in[0], in[1])
		case "tanh_grad":
			kcpu.TanhGrad(o, in[0], in[1])
		case "adam_m":
			kcpu.AdamMoment1(o, in[0], in[1], f("beta1"))
		case "adam_v":
			kcpu.AdamMoment2(o, in[0], in[1], f("beta2"))
		case "sgd_buf":
			kcpu.SGDMomentum(o, in[0], in[1], in[2], f("momentum"), f("wd"))
		case "sm3_v":
			kcpu.SM3Accumulate(o, in[0], in[1])
		default:
			t.Fatalf("test has no reference for %s", st.Op)
		}
	}
	return temps[len(temps)-1]
}

// stepInputs are the operands of one body step: args, and the temps of
// the steps before it.
func stepInputs[T any](st ir.FusedStep, args, temps [][]T) [][]T {
	in := make([][]T, len(st.Args))
	for j, r := range st.Args {
		if r.Arg {
			in[j] = args[r.Index]
		} else {
			in[j] = temps[r.Index]
		}
	}
	return in
}

func bits[T kcpu.Float](x T) uint64 {
	if v, ok := any(x).(float32); ok {
		return uint64(math.Float32bits(v))
	}
	return math.Float64bits(float64(x))
}

func checkBitIdentical[T kcpu.Float](t *testing.T, inPlace bool) {
	// Sizes around the tile (2048) and the parallel grain (16384).
	for _, n := range []int{1, 7, 2047, 2048, 2049, 16384, 40001} {
		for _, c := range bodies {
			body := parse(t, c.text, c.nargs)
			r := rand.New(rand.NewPCG(uint64(n), uint64(len(c.text))))
			args := make([][]T, c.nargs)
			for i := range args {
				args[i] = make([]T, n)
				for j := range args[i] {
					// Mostly moderate values, some zeros and negatives so
					// log, sqrt and the ReLUs meet their edge cases.
					switch r.IntN(20) {
					case 0:
						args[i][j] = 0
					default:
						args[i][j] = T(r.NormFloat64() * 3)
					}
				}
			}
			want := opByOp(t, body, args)
			out := make([]T, n)
			if inPlace {
				// The result overwrites its first arg, as an update in place.
				out = args[0]
			}
			run, err := codegen.CPU(body, out, args)
			require.NoError(t, err)
			run()
			for i := range want {
				if bits(out[i]) != bits(want[i]) {
					t.Fatalf("%s n=%d: element %d is %v, op by op %v", c.text, n, i, out[i], want[i])
				}
			}
		}
	}
}

// The fused closure computes bit for bit what the ops compute one by one,
// in float32 and float64, also when the result overwrites an arg.
func TestCPUBitIdentical(t *testing.T) {
	t.Run("f32", func(t *testing.T) { checkBitIdentical[float32](t, false) })
	t.Run("f64", func(t *testing.T) { checkBitIdentical[float64](t, false) })
	t.Run("f32_in_place", func(t *testing.T) { checkBitIdentical[float32](t, true) })
}

func TestCPURejects(t *testing.T) {
	body := parse(t, "t0=add a0 a1", 2)
	_, err := codegen.CPU(body, make([]float32, 4), [][]float32{make([]float32, 4), make([]float32, 3)})
	require.ErrorContains(t, err, "a1 has 3 elements")
	_, err = codegen.CPU(body, make([]float32, 4), [][]float32{make([]float32, 4)})
	require.ErrorContains(t, err, "does not exist")
	_, err = codegen.CPU(ir.FusedBody{{Op: "softmax", Args: []ir.FusedRef{{Arg: true}}}}, make([]float32, 4), [][]float32{make([]float32, 4)})
	require.ErrorContains(t, err, "no CPU kernel for softmax")
	_, err = codegen.CPU(ir.FusedBody{{Op: "adam_m", Args: []ir.FusedRef{{Arg: true}, {Arg: true}}}}, make([]float32, 4), [][]float32{make([]float32, 4)})
	require.ErrorContains(t, err, "needs float attribute beta1")
}

// BenchmarkCPU compares a fused closure with the same ops run one by one
// over whole arrays (the unfused program), on 2^20 float32 elements.
func BenchmarkCPU(b *testing.B) {
	const n = 1 << 20
	for _, c := range []struct {
		text  string
		nargs int
	}{
		{"t0=add a0 a1; t1=add a2 t0", 3},
		{"t0=mul a1 a0; t1=gelu t0; t2=add t1 a2", 3},
		{"t0=sub a0 a1; t1=mul t0 t0; t2=add t1 a1; t3=mul t2 a0; t4=relu t3", 2},
	} {
		body, err := ir.ParseFusedBody(c.text, c.nargs)
		require.NoError(b, err)
		args := make([][]float32, c.nargs)
		for i := range args {
			args[i] = make([]float32, n)
			for j := range args[i] {
				args[i][j] = float32(j%97) / 97
			}
		}
		out := make([]float32, n)
		run, err := codegen.CPU(body, out, args)
		require.NoError(b, err)
		b.Run("fused/"+c.text, func(b *testing.B) {
			b.SetBytes(int64(4 * n * (c.nargs + 1)))
			for b.Loop() {
				run()
			}
		})
		b.Run("op_by_op/"+c.text, func(b *testing.B) {
			b.SetBytes(int64(4 * n * (c.nargs + 1)))
			temps := make([][]float32, len(body))
			for i := range temps {
				temps[i] = make([]float32, n)
			}
			for b.Loop() {
				opByOpInto(b, body, args, temps)
			}
		})
	}
}
