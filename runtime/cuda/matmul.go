package cuda

import (
	"fmt"

	"gcompile/ir"
	"gcompile/runtime/cuda/cublaslt"
)

// A matmul whose operands are all of one 16-bit format runs as a native
// GEMM in that format; any other is an fp32 GEMM, on fp32 copies of its
// 16-bit operands when it has some.
func init() {
	emulatedGemm := onFP32(resultDType, (*compiler).matmul)
	register(func(c *compiler) (func() error, error) {
		if c.nativeGemm() {
			return c.matmul()
		}
		return emulatedGemm(c)
	}, "matmul")
}

// maxGemmWorkspace caps the workspace cuBLASLt's algorithms may ask for;
// the device allocates the most any of its plans needs, once.
const maxGemmWorkspace = 32 << 20

// nativeGemm reports whether a matmul runs as one cuBLASLt GEMM in its
// 16-bit format (A, B and C all fp16 or all bf16): products of 16-bit
// values are exact in fp32, cuBLASLt accumulates in fp32 and rounds C to
// nearest even once, which is what widening, an fp32 GEMM and rounding
// back (the CPU backend's emulation) computes, up to the order of the
// fp32 sums. Mixed operands are emulated through fp32 copies instead.
func (c *compiler) nativeGemm() bool {
	if len(c.in.Args) != 2 || c.in.Scale != 0 {
		return false // the emulated path applies a scale, and reports bad arity
	}
	a, b, o := c.buf(c.in.Args[0]).Type.DType, c.buf(c.in.Args[1]).Type.DType, c.buf(c.in.Out).Type.DType
	return a.Is16() && a == b && b == o
}

func ltType(dt ir.DType) (cublaslt.DType, error) {
	switch dt {
	case ir.F32:
		return cublaslt.F32, nil
	case ir.F16:
		return cublaslt.F16, nil
	case ir.BF16:
		return cublaslt.BF16, nil
	}
	return 0, fmt.Errorf("cuBLASLt takes f32, f16 or bf16, not %v", dt)
}

// matmul maps the IR's matmul forms (ir.MatMulGEMM) onto cuBLASLt as the
// CPU backend maps them onto its batched GEMM: A is [..., m, k] (stored k×m when
// transA), B is [k, n] shared by every batch or [..., k, n] (n×k when
// transB), and the leading dims of A are the batch.
func (c *compiler) matmul() (func() error, error) {
	in := c.in
	ta, tb := in.Attrs.Bool("transA"), in.Attrs.Bool("transB")
	g, err := ir.MatMulGEMM(c.shape(0), c.shape(1), ta, tb)
	if err != nil {
		return nil, err
	}
	batch, m, n, k, shared := g.Batch, g.M, g.N, g.K, g.SharedB
	dA, dB, dC := c.dtype(in.Args[0]), c.dtype(in.Args[1]), c.dtype(in.Out)
	if dA != dB || dC != dA {
		return nil, fmt.Errorf("matmul of %v and %v into %v: the operands must share one dtype", dA, dB, dC)
	}
	t, err := ltType(dA)
	if err != nil {
		return nil, err
	}
	if m == 0 || n == 0 || batch == 0 {
		return func() error { return nil }, nil // an empty product writes nothing
	}
	if k == 0 {
		return nil, fmt.Errorf("matmul with an inner dim of 0 (%v, %v) is not supported by the cuda backend", in.ArgTypes[0], in.ArgTypes[1])
	}
	spec := cublaslt.MatmulSpec{M: m, N: n, K: k, TransA: ta, TransB: tb, Type: t, CType: t, Batch: batch, MaxWorkspace: maxGemmWorkspace}
	a, b, out := c.loc(in.Args[0]), c.loc(in.Args[1]), c.loc(in.Out)
	for _, l := range []loc{a, b, out} {
		if l.sp == inHost {
			return nil, fmt.Errorf("a matmul operand is offloaded to host memory; only a copy may read it")
		}
	}
	// Calls: (A offset, C offset) in elements per GEMM of the plan.
	type gemm struct{ aOff, cOff int64 }
	calls := []gemm{{0, 0}}
	switch {
	case !shared:
		// A strided batch: every operand packed, one matrix after another.
	case !ta:
		// B is shared and A's rows are contiguous across the batch: one
		// GEMM of (batch·m)×k by k×n.
		spec.M, spec.Batch = batch*m, 1
	default:
		// B is shared but each Aᵀ is its own stored k×m: one GEMM per batch.
		spec.Batch = 1
		calls = calls[:0]
		for i := range batch {
			calls = append(calls, gemm{int64(i * m * k), int64(i * m * n)})
		}
	}
	// Operands sit at arena and workspace offsets (allocations start
	// 256-byte aligned); tell cuBLASLt how aligned every pointer it will
	// see is, or it may pick an algorithm that needs 256 bytes.
	size := int64(t.Size())
	stepsA, stepsC := []int64{a.off}, []int64{out.off}
	for _, g := range calls {
		stepsA, stepsC = append(stepsA, g.aOff*size), append(stepsC, g.cOff*size)
	}
	stepsB := []int64{b.off}
	if spec.Batch > 1 {
		stepsA = append(stepsA, int64(m*k)*size)
		stepsB = append(stepsB, int64(k*n)*size)
		stepsC = append(stepsC, int64(m*n)*size)
	}
	spec.AlignA, spec.AlignB, spec.AlignC = alignment(stepsA...), alignment(stepsB...), alignment(stepsC...)
	plan, err := c.d.gemmPlan(spec)
	if err != nil {
		return nil, err
	}
	c.note(fmt.Sprintf("cuBLASLt %v A%s·B%s M=%d N=%d K=%d batch=%d ×%d", t, tr(ta), tr(tb), spec.M, spec.N, spec.K, spec.Batch, len(calls)))
	d := c.d
	return func() error {
		pa, pb, pc := d.ptr(a), d.ptr(b), d.ptr(out)
		for _, g := range calls {
			if err := plan.Run(pa.Add(uint64(g.aOff*size)), pb, pc.Add(uint64(g.cOff*size)), 1, 0, d.mem.gemm, d.gemmBytes, d.compute); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// alignment is the largest power of two, at most 256, dividing every byte
// offset given: a pointer at an allocation's start plus any sum of them is
// aligned to it.
func alignment(offsets ...int64) uint32 {
	var x int64
	for _, o := range offsets {
		x |= o
	}
	if x == 0 {
		return 256
	}
	return uint32(min(x&-x, 256))
}

func tr(t bool) string {
	if t {
		return "ᵀ"
	}
	return ""
}

// gemmPlan asks cuBLASLt for an algorithm once, at load, and records the
// workspace it needs.
func (d *Device) gemmPlan(spec cublaslt.MatmulSpec) (*cublaslt.Plan, error) {
	if d.rt.lt == nil {
		return nil, nil // planning only
	}
	p, err := d.rt.lt.NewMatmul(d.lt, spec)
	if err != nil {
		return nil, err
	}
	d.plans = append(d.plans, p)
	d.gemmBytes = max(d.gemmBytes, p.Workspace())
	return p, nil
}
