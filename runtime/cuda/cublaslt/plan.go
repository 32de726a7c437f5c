package cublaslt

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"gcompile/runtime/cuda/driver"
)

// DType is an element type a plan accepts.
type DType int

// The element types: float, __half and __nv_bfloat16.
const (
	F32 DType = iota + 1
	F16
	BF16
)

func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("DType(%d)", int(t))
}

// Size is the element size in bytes.
func (t DType) Size() int {
	if t == F32 {
		return 4
	}
	return 2
}

func (t DType) cuda() (cudaDataType, error) {
	switch t {
	case F32:
		return cudaR32F, nil
	case F16:
		return cudaR16F, nil
	case BF16:
		return cudaR16BF, nil
	}
	return 0, fmt.Errorf("unsupported element type %v", t)
}

// MatmulSpec describes C = alpha·op(A)·op(B) + beta·C on row-major
// matrices: op(A) is M×K, op(B) is K×N, C is M×N. With TransA, A is stored
// K×M (op(A) = Aᵀ); with TransB, B is stored N×K.
type MatmulSpec struct {
	M, N, K        int
	TransA, TransB bool

	// Type is the element type of A and B; CType that of C, Type if unset
	// (bf16 or f16 inputs may write an f32 C). Accumulation and alpha/beta
	// are always f32.
	Type, CType DType

	// LDA, LDB, LDC are the row strides of the stored matrices in
	// elements; 0 means packed (the stored column count).
	LDA, LDB, LDC int64

	// Batch is the number of matrix products (1 if 0). StrideA, StrideB,
	// StrideC are the elements between consecutive matrices of a batch; 0
	// means packed (stored rows × leading dimension).
	Batch                     int
	StrideA, StrideB, StrideC int64

	// MaxWorkspace caps the workspace (bytes) the chosen algorithm may use;
	// Plan.Workspace says how much it does use.
	MaxWorkspace uint64

	// AlignA, AlignB, AlignC are byte alignments (powers of two) that every
	// pointer a run passes for that matrix, and every batch's matrix, is
	// known to have; 0 keeps cuBLASLt's assumption of 256. cuBLASLt picks
	// algorithms for 256-byte-aligned operands unless told otherwise, and
	// such an algorithm fails on a matrix at a 64-byte arena offset.
	AlignA, AlignB, AlignC uint32
}

// stored is a row-major matrix as it sits in memory.
type stored struct {
	rows, cols int64
	ld         int64
	stride     int64
}

// storedLayouts resolves defaults and checks the spec. Returns the stored
// shapes of A, B and C.
func (s *MatmulSpec) storedLayouts() (a, b, c stored, err error) {
	if s.M <= 0 || s.N <= 0 || s.K <= 0 {
		return a, b, c, fmt.Errorf("dimensions M=%d N=%d K=%d must be positive", s.M, s.N, s.K)
	}
	if s.Batch < 0 {
		return a, b, c, fmt.Errorf("batch %d is negative", s.Batch)
	}
	for _, al := range []struct {
		name  string
		bytes uint32
	}{{"A", s.AlignA}, {"B", s.AlignB}, {"C", s.AlignC}} {
		if al.bytes&(al.bytes-1) != 0 {
			return a, b, c, fmt.Errorf("%s: alignment %d bytes is not a power of two", al.name, al.bytes)
		}
	}
	m, n, k := int64(s.M), int64(s.N), int64(s.K)
	a = stored{rows: m, cols: k}
	if s.TransA {
		a = stored{rows: k, cols: m}
	}
	b = stored{rows: k, cols: n}
	if s.TransB {
		b = stored{rows: n, cols: k}
	}
	c = stored{rows: m, cols: n}
	for _, x := range []struct {
		name       string
		st         *stored
		ld, stride int64
	}{{"A", &a, s.LDA, s.StrideA}, {"B", &b, s.LDB, s.StrideB}, {"C", &c, s.LDC, s.StrideC}} {
		x.st.ld = x.ld
		if x.st.ld == 0 {
			x.st.ld = x.st.cols
		}
		if x.st.ld < x.st.cols {
			return a, b, c, fmt.Errorf("leading dimension of %s is %d, less than its %d columns", x.name, x.st.ld, x.st.cols)
		}
		x.st.stride = x.stride
		if x.st.stride == 0 {
			x.st.stride = x.st.rows * x.st.ld
		}
		if s.Batch > 1 && x.st.stride < x.st.rows*x.st.ld {
			return a, b, c, fmt.Errorf("batch stride of %s is %d, less than one %d×%d matrix with leading dimension %d",
				x.name, x.st.stride, x.st.rows, x.st.cols, x.st.ld)
		}
	}
	return a, b, c, nil
}

// Plan is a prepared matmul: descriptors and the algorithm cuBLASLt's
// heuristic chose. Not safe for concurrent use.
type Plan struct {
	lt        *Lt
	h         Handle
	spec      MatmulSpec
	desc      matmulDesc
	la, lb    matrixLayout // our A and B, in column-major view
	lc        matrixLayout // C and D
	pref      preference
	algo      algo
	workspace uint64
}

// NewMatmul prepares the product described by s on handle h.
func (l *Lt) NewMatmul(h Handle, s MatmulSpec) (p *Plan, err error) {
	if s.CType == 0 {
		s.CType = s.Type
	}
	if s.Batch == 0 {
		s.Batch = 1
	}
	a, b, c, err := s.storedLayouts()
	if err != nil {
		return nil, fmt.Errorf("cublaslt: matmul %s: %w", s.describe(), err)
	}
	abType, err := s.Type.cuda()
	if err != nil {
		return nil, fmt.Errorf("cublaslt: matmul %s: A and B: %w", s.describe(), err)
	}
	cType, err := s.CType.cuda()
	if err != nil {
		return nil, fmt.Errorf("cublaslt: matmul %s: C: %w", s.describe(), err)
	}
	if s.Type == F32 && s.CType != F32 {
		return nil, fmt.Errorf("cublaslt: matmul %s: f32 inputs need an f32 C", s.describe())
	}

	p = &Plan{lt: l, h: h, spec: s}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("cublaslt: matmul %s: %w", s.describe(), err), p.Close())
			p = nil
		}
	}()

	if err := l.check("cublasLtMatmulDescCreate", l.cublasLtMatmulDescCreate(&p.desc, compute32F, cudaR32F)); err != nil {
		return p, err
	}
	// The product is computed transposed (see doc.go): cuBLASLt's A is our
	// B and its B is our A, each with its own transpose flag.
	if err := setAttr(l, "cublasLtMatmulDescSetAttribute", l.cublasLtMatmulDescSetAttribute, p.desc, descTransA, int32(opFor(s.TransB))); err != nil {
		return p, err
	}
	if err := setAttr(l, "cublasLtMatmulDescSetAttribute", l.cublasLtMatmulDescSetAttribute, p.desc, descTransB, int32(opFor(s.TransA))); err != nil {
		return p, err
	}
	if p.la, err = l.layout(abType, a, s.Batch); err != nil {
		return p, err
	}
	if p.lb, err = l.layout(abType, b, s.Batch); err != nil {
		return p, err
	}
	if p.lc, err = l.layout(cType, c, s.Batch); err != nil {
		return p, err
	}
	if err := l.check("cublasLtMatmulPreferenceCreate", l.cublasLtMatmulPreferenceCreate(&p.pref)); err != nil {
		return p, err
	}
	if err := setAttr(l, "cublasLtMatmulPreferenceSetAttribute", l.cublasLtMatmulPreferenceSetAttribute, p.pref, prefMaxWorkspaceBytes, s.MaxWorkspace); err != nil {
		return p, err
	}
	// cuBLASLt's A/B are our B/A (see above); D is written where C is.
	for _, al := range []struct {
		attr prefAttr
		v    uint32
	}{{prefMinAlignmentA, s.AlignB}, {prefMinAlignmentB, s.AlignA}, {prefMinAlignmentC, s.AlignC}, {prefMinAlignmentD, s.AlignC}} {
		if al.v == 0 {
			continue
		}
		if err := setAttr(l, "cublasLtMatmulPreferenceSetAttribute", l.cublasLtMatmulPreferenceSetAttribute, p.pref, al.attr, al.v); err != nil {
			return p, err
		}
	}
	var res heuristicResult
	var n int32
	// cuBLASLt's A/B are our B/A (see above).
	r := l.cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.lb, p.la, p.lc, p.lc, p.pref, 1, &res, &n)
	if err := l.check("cublasLtMatmulAlgoGetHeuristic", r); err != nil {
		return p, err
	}
	if n < 1 {
		return p, fmt.Errorf("cublasLtMatmulAlgoGetHeuristic: no algorithm within %d bytes of workspace: %w", s.MaxWorkspace, StatusNotSupported)
	}
	if err := l.check("cublasLtMatmulAlgoGetHeuristic (result)", res.State); err != nil {
		return p, err
	}
	p.algo = res.Algo
	p.workspace = res.WorkspaceSize
	return p, nil
}

func opFor(trans bool) operation {
	if trans {
		return opT
	}
	return opN
}

// layout creates the column-major view of a stored row-major matrix: its
// transpose, cols × rows with the same leading dimension.
func (l *Lt) layout(t cudaDataType, st stored, batch int) (matrixLayout, error) {
	var ml matrixLayout
	r := l.cublasLtMatrixLayoutCreate(&ml, t, uint64(st.cols), uint64(st.rows), st.ld)
	if err := l.check("cublasLtMatrixLayoutCreate", r); err != nil {
		return 0, err
	}
	if batch > 1 {
		set := l.cublasLtMatrixLayoutSetAttribute
		err := setAttr(l, "cublasLtMatrixLayoutSetAttribute", set, ml, layoutBatchCount, int32(batch))
		if err == nil {
			err = setAttr(l, "cublasLtMatrixLayoutSetAttribute", set, ml, layoutStridedBatchOffset, st.stride)
		}
		if err != nil {
			return 0, errors.Join(err, l.check("cublasLtMatrixLayoutDestroy", l.cublasLtMatrixLayoutDestroy(ml)))
		}
	}
	return ml, nil
}

func (s *MatmulSpec) describe() string {
	ta, tb := "", ""
	if s.TransA {
		ta = "ᵀ"
	}
	if s.TransB {
		tb = "ᵀ"
	}
	return fmt.Sprintf("%v A%s·B%s [M=%d N=%d K=%d batch=%d]", s.Type, ta, tb, s.M, s.N, s.K, max(s.Batch, 1))
}

// Spec is the plan's matmul, with defaults resolved.
func (p *Plan) Spec() MatmulSpec { return p.spec }

// Workspace is the workspace the chosen algorithm needs, in bytes.
func (p *Plan) Workspace() uint64 { return p.workspace }

// Run queues C = alpha·op(A)·op(B) + beta·C on stream s. workspace must hold
// at least Workspace() bytes (it may be 0 when Workspace() is 0).
func (p *Plan) Run(a, b, c driver.DevicePtr, alpha, beta float32, workspace driver.DevicePtr, workspaceBytes uint64, s driver.Stream) error {
	if p.desc == 0 {
		return errors.New("cublaslt: Run on a closed plan")
	}
	if workspaceBytes < p.workspace {
		return fmt.Errorf("cublaslt: matmul %s: workspace of %d bytes, the algorithm needs %d", p.spec.describe(), workspaceBytes, p.workspace)
	}
	l := p.lt
	r := l.cublasLtMatmul(p.h, p.desc,
		unsafe.Pointer(&alpha), b, p.lb, a, p.la,
		unsafe.Pointer(&beta), c, p.lc, c, p.lc,
		&p.algo, workspace, uintptr(workspaceBytes), s)
	runtime.KeepAlive(&alpha)
	runtime.KeepAlive(&beta)
	if err := l.check("cublasLtMatmul", r); err != nil {
		return fmt.Errorf("cublaslt: matmul %s: %w", p.spec.describe(), err)
	}
	return nil
}

// Close destroys the plan's descriptors. Closing twice is harmless.
func (p *Plan) Close() error {
	if p == nil {
		return nil
	}
	l := p.lt
	var errs []error
	if p.pref != 0 {
		errs = append(errs, l.check("cublasLtMatmulPreferenceDestroy", l.cublasLtMatmulPreferenceDestroy(p.pref)))
		p.pref = 0
	}
	for _, ml := range []*matrixLayout{&p.la, &p.lb, &p.lc} {
		if *ml != 0 {
			errs = append(errs, l.check("cublasLtMatrixLayoutDestroy", l.cublasLtMatrixLayoutDestroy(*ml)))
			*ml = 0
		}
	}
	if p.desc != 0 {
		errs = append(errs, l.check("cublasLtMatmulDescDestroy", l.cublasLtMatmulDescDestroy(p.desc)))
		p.desc = 0
	}
	return errors.Join(errs...)
}
