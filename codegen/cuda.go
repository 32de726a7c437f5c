package codegen

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"

	"gcompile/ir"
	"gcompile/kernels/cuda"
)

// CUDAPrelude goes once before any fused kernel, after the kernels/cuda
// program (whose prelude and elementwise.cu define the gc_ helpers the
// fused kernels call, gc_gelu_halves and gc_sigmoid_halves among them).
//
// gc_fused_keep hands a value through an empty asm statement, which the
// compiler cannot see into: a temp is rounded to float once, as it is
// when an unfused kernel stores it, and never contracted into an FMA with
// the next op. The emulator builds with -ffp-contract=off, so there it is
// the identity.
const CUDAPrelude = `// Fused kernels (gcompile/codegen).
static __device__ __forceinline__ float gc_fused_keep(float x) {
#if !defined(GC_EMU)
  asm volatile("" : "+f"(x));
#endif
  return x;
}
`

// CUDAKernel is the generated kernel of one fused body.
type CUDAKernel struct {
	// Name is the kernel's symbol, gc_fused_<hash of the body>, so equal
	// bodies share one kernel.
	Name string
	// Args is the number of input pointers.
	Args int
	// Source is the kernel's CUDA C: extern "C" __global__ void
	// Name(float* out, const float* a0, …, long long n), a grid-stride
	// loop over n elements as kernels/cuda's elementwise kernels. out may
	// be an input's buffer.
	Source string
}

// Signature is the kernel's parameter list, in kernels/cuda's notation.
func (k CUDAKernel) Signature() string {
	var b strings.Builder
	b.WriteString("float* out")
	for i := 0; i < k.Args; i++ {
		fmt.Fprintf(&b, ", const float* a%d", i)
	}
	b.WriteString(", long long n")
	return b.String()
}

// Entry is the kernel's entry in kernels/cuda's notation, for a launcher
// (or the emulator) that checks arguments against it: a grid-stride
// launch over n.
func (k CUDAKernel) Entry() cuda.Kernel {
	ps := []cuda.Param{{Name: "out", Type: cuda.F32Out}}
	for i := 0; i < k.Args; i++ {
		ps = append(ps, cuda.Param{Name: fmt.Sprintf("a%d", i), Type: cuda.F32In})
	}
	ps = append(ps, cuda.Param{Name: "n", Type: cuda.Size})
	return cuda.Kernel{Name: k.Name, Params: ps, Launch: cuda.GridStride, Over: "n"}
}

// CUDAName is the symbol of the kernel for a body over nargs args.
func CUDAName(body ir.FusedBody, nargs int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%d\x00%s", nargs, body)))
	return "gc_fused_" + hex.EncodeToString(sum[:])[:16]
}

// CUDA writes the kernel of a fused body over nargs args. Each op is the
// expression of its kernels/cuda kernel (elementwise.cu, optim.cu), with
// attributes as float constants written by their bits.
func CUDA(body ir.FusedBody, nargs int) (CUDAKernel, error) {
	if len(body) == 0 {
		return CUDAKernel{}, fmt.Errorf("fused body is empty")
	}
	k := CUDAKernel{Name: CUDAName(body, nargs), Args: nargs}
	var b strings.Builder
	fmt.Fprintf(&b, "// %s\nextern \"C\" __global__ void %s(%s) {\n", body, k.Name, k.Signature())
	b.WriteString("  GC_FOR_EACH(i, n) {\n")
	for i := 0; i < nargs; i++ {
		fmt.Fprintf(&b, "    const float x%d = a%d[i];\n", i, i)
	}
	for i, st := range body {
		if err := checkRefs(i, st, nargs); err != nil {
			return CUDAKernel{}, err
		}
		ops := make([]string, len(st.Args))
		for j, r := range st.Args {
			if r.Arg {
				ops[j] = fmt.Sprintf("x%d", r.Index)
			} else {
				ops[j] = fmt.Sprintf("t%d", r.Index)
			}
		}
		lines, err := cudaStep(st, ops, fmt.Sprintf("t%d", i))
		if err != nil {
			return CUDAKernel{}, fmt.Errorf("fused body step t%d: %w", i, err)
		}
		for _, l := range lines {
			b.WriteString("    " + l + "\n")
		}
	}
	fmt.Fprintf(&b, "    out[i] = t%d;\n  }\n}\n", len(body)-1)
	k.Source = b.String()
	return k, nil
}

// cudaStep writes the statements that set dst from the operand
// expressions ops, ending with dst rounded and kept (gc_fused_keep).
func cudaStep(st ir.FusedStep, ops []string, dst string) ([]string, error) {
	arity := map[string]int{"add": 2, "sub": 2, "mul": 2, "div": 2, "neg": 1, "exp": 1, "log": 1, "tanh": 1, "sqrt": 1,
		"relu": 1, "gelu": 1, "silu": 1, "relu_grad": 2, "tanh_grad": 2, "gelu_grad": 2, "silu_grad": 2, "adam_m": 2, "adam_v": 2,
		"sgd_buf": 3, "sm3_v": 2}
	want, ok := arity[st.Op]
	if !ok {
		return nil, fmt.Errorf("no CUDA expression for %s in a fused body", st.Op)
	}
	if len(ops) != want {
		return nil, fmt.Errorf("%s takes %d operands, got %d", st.Op, want, len(ops))
	}
	attr := func(name string) (string, error) {
		v, err := floatAttr(st, name)
		if err != nil {
			return "", err
		}
		// The unfused kernel receives the attribute as a float argument.
		// Here it has the same bits, hidden behind gc_fused_keep so the
		// compiler treats it as an unknown too and contracts the op's
		// expression as it does in the unfused kernel, not around a
		// folded constant.
		return fmt.Sprintf("gc_fused_keep(gc_bits_float(0x%08xu))", math.Float32bits(float32(v))), nil
	}
	var x, y, z string
	x = ops[0]
	if want > 1 {
		y = ops[1]
	}
	if want > 2 {
		z = ops[2]
	}
	var pre []string
	var e string
	switch st.Op {
	case "add":
		e = x + " + " + y
	case "sub":
		e = x + " - " + y
	case "mul":
		e = x + " * " + y
	case "div":
		e = x + " / " + y
	case "neg":
		e = "-" + x
	case "exp", "log", "tanh", "sqrt":
		e = st.Op + "f(" + x + ")"
	case "relu":
		e = x + " > 0 ? " + x + " : 0.0f"
	case "relu_grad":
		e = x + " > 0 ? " + y + " : 0.0f"
	case "tanh_grad":
		e = y + " * (1.0f - " + x + " * " + x + ")"
	case "gelu":
		pre = []string{fmt.Sprintf("float %[1]s_s, %[1]s_sc;", dst), fmt.Sprintf("gc_gelu_halves(%[2]s, &%[1]s_s, &%[1]s_sc);", dst, x)}
		e = fmt.Sprintf("%s * %s_s", x, dst)
	case "gelu_grad":
		pre = []string{
			fmt.Sprintf("float %[1]s_s, %[1]s_sc;", dst),
			fmt.Sprintf("gc_gelu_halves(%[2]s, &%[1]s_s, &%[1]s_sc);", dst, x),
			fmt.Sprintf("const float %[1]s_du = GC_GELU_C * (1.0f + 3.0f * GC_GELU_A * %[2]s * %[2]s);", dst, x),
		}
		e = fmt.Sprintf("(%[1]s_s + 2.0f * %[1]s_s * %[1]s_sc * %[2]s * %[1]s_du) * %[3]s", dst, x, y)
	case "silu", "silu_grad":
		pre = []string{fmt.Sprintf("float %[1]s_s, %[1]s_sc;", dst), fmt.Sprintf("gc_sigmoid_halves(%[2]s, &%[1]s_s, &%[1]s_sc);", dst, x)}
		if st.Op == "silu" {
			e = fmt.Sprintf("%s * %s_s", x, dst)
		} else {
			e = fmt.Sprintf("%[1]s_s * (1.0f + %[2]s * %[1]s_sc) * %[3]s", dst, x, y)
		}
	case "adam_m", "adam_v":
		name := map[string]string{"adam_m": "beta1", "adam_v": "beta2"}[st.Op]
		beta, err := attr(name)
		if err != nil {
			return nil, err
		}
		pre = []string{fmt.Sprintf("const float %s_%s = %s;", dst, name, beta)}
		if st.Op == "adam_m" {
			e = fmt.Sprintf("%[1]s_%[2]s * %[3]s + (1.0f - %[1]s_%[2]s) * %[4]s", dst, name, x, y)
		} else {
			e = fmt.Sprintf("%[1]s_%[2]s * %[3]s + (1.0f - %[1]s_%[2]s) * %[4]s * %[4]s", dst, name, x, y)
		}
	case "sgd_buf":
		mom, err := attr("momentum")
		if err != nil {
			return nil, err
		}
		wd, err := attr("wd")
		if err != nil {
			return nil, err
		}
		pre = []string{fmt.Sprintf("const float %s_momentum = %s, %s_wd = %s;", dst, mom, dst, wd)}
		e = fmt.Sprintf("%[1]s_momentum * %[2]s + (%[3]s + %[1]s_wd * %[4]s)", dst, x, y, z)
	case "sm3_v":
		e = fmt.Sprintf("(float)((double)%s + (double)%s * (double)%s)", x, y, y)
	}
	return append(pre, fmt.Sprintf("const float %s = gc_fused_keep(%s);", dst, e)), nil
}
