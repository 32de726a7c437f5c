package cublaslt

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/dl/dltest"
	"gcompile/runtime/cuda/driver"
)

type fakeLib struct {
	live              func() int64
	lastStream        func() uintptr
	lastWorkspace     func() uintptr
	lastWorkspaceSize func() uint64
	lastAlpha         func() float32
	lastBeta          func() float32
	matmuls           func() int32
	heuristicSize     func() uint64
	heuristicOffset   func(field int32) uint64
	misaligned        func() int32
}

func loadFake(t *testing.T, cflags ...string) (*Lt, *fakeLib) {
	t.Helper()
	path := dltest.Build(t, "testdata/fake_cublaslt.c", "libcublasLt.so.12", append(cflags, "-lm")...)
	t.Setenv("GCOMPILE_LIBCUBLASLT", path)
	l, err := Load()
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	require.Equal(t, path, l.Path())
	f := &fakeLib{}
	require.NoError(t, l.lib.BindAll([]dl.Symbol{
		dl.Sym(&f.live, "fake_live"),
		dl.Sym(&f.lastStream, "fake_last_stream"),
		dl.Sym(&f.lastWorkspace, "fake_last_workspace"),
		dl.Sym(&f.lastWorkspaceSize, "fake_last_workspace_size"),
		dl.Sym(&f.lastAlpha, "fake_last_alpha"),
		dl.Sym(&f.lastBeta, "fake_last_beta"),
		dl.Sym(&f.matmuls, "fake_matmuls"),
		dl.Sym(&f.heuristicSize, "fake_heuristic_size"),
		dl.Sym(&f.heuristicOffset, "fake_heuristic_offset"),
		dl.Sym(&f.misaligned, "fake_misaligned"),
	}))
	return l, f
}

// buffer is host memory standing in for device memory: the stand-in
// library dereferences "device" pointers directly.
type buffer struct {
	t    DType
	data []byte
}

// newBuffer is n elements at a 256-byte-aligned address, as cuMemAlloc
// returns them.
func newBuffer(t DType, n int64) *buffer {
	raw := make([]byte, n*int64(t.Size())+256)
	off := (256 - int(uintptr(unsafe.Pointer(&raw[0]))%256)) % 256
	return &buffer{t: t, data: raw[off : off+int(n)*t.Size()]}
}

func (b *buffer) ptr() driver.DevicePtr {
	return driver.DevicePtr(uintptr(unsafe.Pointer(&b.data[0])))
}

func (b *buffer) set(i int64, v float32) {
	switch b.t {
	case F32:
		*(*float32)(unsafe.Pointer(&b.data[4*i])) = v
	case F16:
		*(*uint16)(unsafe.Pointer(&b.data[2*i])) = kcpu.F16FromF32(v)
	case BF16:
		*(*uint16)(unsafe.Pointer(&b.data[2*i])) = kcpu.BF16FromF32(v)
	}
}

func (b *buffer) get(i int64) float32 {
	switch b.t {
	case F32:
		return *(*float32)(unsafe.Pointer(&b.data[4*i]))
	case F16:
		return kcpu.F32FromF16(*(*uint16)(unsafe.Pointer(&b.data[2*i])))
	default:
		return kcpu.F32FromBF16(*(*uint16)(unsafe.Pointer(&b.data[2*i])))
	}
}

// fill writes random values to every element the matrices of st cover.
func fill(rng *rand.Rand, b *buffer, st stored, batch int) {
	for bt := int64(0); bt < int64(batch); bt++ {
		for r := int64(0); r < st.rows; r++ {
			for c := int64(0); c < st.cols; c++ {
				b.set(bt*st.stride+r*st.ld+c, float32(rng.IntN(17)-8)/4)
			}
		}
	}
}

// reference computes the row-major product in float64 from the (already
// rounded) stored values.
func reference(s MatmulSpec, a, b, c *buffer, sa, sb, sc stored, alpha, beta float32) []float64 {
	out := make([]float64, int64(max(s.Batch, 1))*sc.stride)
	for bt := int64(0); bt < int64(max(s.Batch, 1)); bt++ {
		for i := int64(0); i < int64(s.M); i++ {
			for j := int64(0); j < int64(s.N); j++ {
				var acc float64
				for p := int64(0); p < int64(s.K); p++ {
					ai := bt*sa.stride + i*sa.ld + p
					if s.TransA {
						ai = bt*sa.stride + p*sa.ld + i
					}
					bi := bt*sb.stride + p*sb.ld + j
					if s.TransB {
						bi = bt*sb.stride + j*sb.ld + p
					}
					acc += float64(a.get(ai)) * float64(b.get(bi))
				}
				ci := bt*sc.stride + i*sc.ld + j
				out[ci] = float64(alpha)*acc + float64(beta)*float64(c.get(ci))
			}
		}
	}
	return out
}

func TestMatmulMatchesARowMajorReference(t *testing.T) {
	l, f := loadFake(t)
	h, err := l.Create()
	require.NoError(t, err)
	defer l.Destroy(h)

	type variant struct {
		name       string
		typ, ctype DType
		ta, tb     bool
		batch      int
		padded     bool // leading dimensions and batch strides larger than packed
	}
	var variants []variant
	for _, ty := range []struct{ a, c DType }{{F32, F32}, {F16, F16}, {BF16, BF16}, {BF16, F32}, {F16, F32}} {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			for _, batch := range []int{1, 3} {
				for _, padded := range []bool{false, true} {
					variants = append(variants, variant{
						name: fmt.Sprintf("%v->%v/ta=%v,tb=%v/batch=%d/padded=%v", ty.a, ty.c, tr[0], tr[1], batch, padded),
						typ:  ty.a, ctype: ty.c, ta: tr[0], tb: tr[1], batch: batch, padded: padded,
					})
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(7, 11))
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			// M, N and K all differ, so any mix-up of dimensions or
			// transposes changes the shape cuBLASLt sees or the numbers.
			// The batches of these small matrices start at any element.
			s := MatmulSpec{AlignA: 2, AlignB: 2, AlignC: 2, M: 5, N: 7, K: 3, TransA: v.ta, TransB: v.tb, Type: v.typ, CType: v.ctype, Batch: v.batch, MaxWorkspace: 1 << 20}
			if v.padded {
				s.LDA, s.LDB, s.LDC = 9, 10, 11
				s.StrideA, s.StrideB, s.StrideC = 101, 103, 107
			}
			sa, sb, sc, err := s.storedLayouts()
			require.NoError(t, err)
			a := newBuffer(v.typ, int64(v.batch)*sa.stride+sa.rows*sa.ld)
			b := newBuffer(v.typ, int64(v.batch)*sb.stride+sb.rows*sb.ld)
			c := newBuffer(v.ctype, int64(v.batch)*sc.stride+sc.rows*sc.ld)
			fill(rng, a, sa, v.batch)
			fill(rng, b, sb, v.batch)
			fill(rng, c, sc, v.batch)
			const alpha, beta = 1.5, -0.5
			want := reference(s, a, b, c, sa, sb, sc, alpha, beta)

			p, err := l.NewMatmul(h, s)
			require.NoError(t, err)
			defer p.Close()
			ws := newBuffer(F32, int64(p.Workspace()/4)+1)
			require.NoError(t, p.Run(a.ptr(), b.ptr(), c.ptr(), alpha, beta, ws.ptr(), p.Workspace(), driver.Stream(0x5151)))
			runtime.KeepAlive(a)
			runtime.KeepAlive(b)

			tol := 1e-5
			if v.ctype != F32 {
				tol = 1e-2 // one rounding of the output to 8 or 11 bits of mantissa
			}
			for bt := int64(0); bt < int64(v.batch); bt++ {
				for i := int64(0); i < sc.rows; i++ {
					for j := int64(0); j < sc.cols; j++ {
						ci := bt*sc.stride + i*sc.ld + j
						require.InDelta(t, want[ci], float64(c.get(ci)), tol*(1+math.Abs(want[ci])),
							"batch %d C[%d][%d]", bt, i, j)
					}
				}
			}
			assert.Equal(t, float32(alpha), f.lastAlpha())
			assert.Equal(t, float32(beta), f.lastBeta())
			assert.Equal(t, uintptr(0x5151), f.lastStream(), "the 16th argument (stream) arrived")
		})
	}
}

func TestMatmulLeavesPaddingAlone(t *testing.T) {
	l, _ := loadFake(t)
	h, err := l.Create()
	require.NoError(t, err)
	defer l.Destroy(h)
	s := MatmulSpec{M: 2, N: 3, K: 2, Type: F32, LDC: 5, Batch: 2, StrideC: 13, AlignA: 4, AlignB: 4, AlignC: 4}
	p, err := l.NewMatmul(h, s)
	require.NoError(t, err)
	defer p.Close()
	a, b := newBuffer(F32, 8), newBuffer(F32, 12)
	for i := int64(0); i < 8; i++ {
		a.set(i, 1)
	}
	for i := int64(0); i < 12; i++ {
		b.set(i, 1)
	}
	c := newBuffer(F32, 2*13)
	for i := int64(0); i < 26; i++ {
		c.set(i, -7)
	}
	require.NoError(t, p.Run(a.ptr(), b.ptr(), c.ptr(), 1, 0, 0, 0, 0))
	for i := int64(0); i < 26; i++ {
		bt, r := i/13, i%13
		inside := r/5 < 2 && r%5 < 3
		if inside {
			assert.Equal(t, float32(2), c.get(i), "batch %d element %d", bt, r)
		} else {
			assert.Equal(t, float32(-7), c.get(i), "padding at batch %d element %d was written", bt, r)
		}
	}
}

func TestWorkspaceIsChosenAndChecked(t *testing.T) {
	l, f := loadFake(t)
	h, err := l.Create()
	require.NoError(t, err)
	defer l.Destroy(h)

	s := MatmulSpec{M: 4, N: 4, K: 4, Type: BF16, MaxWorkspace: 1 << 20}
	p, err := l.NewMatmul(h, s)
	require.NoError(t, err)
	defer p.Close()
	require.Equal(t, uint64(4096), p.Workspace(), "the heuristic result's workspaceSize field was read at its offset")

	a, b, c := newBuffer(BF16, 16), newBuffer(BF16, 16), newBuffer(BF16, 16)
	err = p.Run(a.ptr(), b.ptr(), c.ptr(), 1, 0, 0, 1024, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "needs 4096")
	assert.Equal(t, int32(0), f.matmuls(), "refused before calling cuBLASLt")

	ws := newBuffer(F32, 1024)
	require.NoError(t, p.Run(a.ptr(), b.ptr(), c.ptr(), 1, 0, ws.ptr(), 4096, 0))
	assert.Equal(t, uintptr(ws.ptr()), f.lastWorkspace())
	assert.Equal(t, uint64(4096), f.lastWorkspaceSize())

	s.MaxWorkspace = 0
	p0, err := l.NewMatmul(h, s)
	require.NoError(t, err)
	defer p0.Close()
	assert.Equal(t, uint64(0), p0.Workspace())
	require.NoError(t, p0.Run(a.ptr(), b.ptr(), c.ptr(), 1, 0, 0, 0, 0))
}

func TestBadSpecsAreRejectedBeforeTheLibrary(t *testing.T) {
	l, f := loadFake(t)
	h, err := l.Create()
	require.NoError(t, err)
	defer l.Destroy(h)
	base := MatmulSpec{M: 4, N: 5, K: 6, Type: F16}
	tests := []struct {
		name   string
		mutate func(*MatmulSpec)
		want   string
	}{
		{"zero M", func(s *MatmulSpec) { s.M = 0 }, "must be positive"},
		{"negative batch", func(s *MatmulSpec) { s.Batch = -1 }, "negative"},
		{"short lda", func(s *MatmulSpec) { s.LDA = 5 }, "leading dimension of A is 5, less than its 6 columns"},
		{"short ldb transposed", func(s *MatmulSpec) { s.TransB = true; s.LDB = 5 }, "leading dimension of B is 5, less than its 6 columns"},
		{"overlapping batch", func(s *MatmulSpec) { s.Batch = 2; s.StrideC = 19 }, "batch stride of C is 19"},
		{"no type", func(s *MatmulSpec) { s.Type = 0 }, "unsupported element type"},
		{"f32 into f16", func(s *MatmulSpec) { s.Type = F32; s.CType = F16 }, "f32 inputs need an f32 C"},
		{"alignment not a power of two", func(s *MatmulSpec) { s.AlignC = 48 }, "C: alignment 48 bytes is not a power of two"},
	}
	before := f.live()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			tt.mutate(&s)
			p, err := l.NewMatmul(h, s)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, before, f.live(), "nothing was created")
		})
	}
}

func TestLibraryErrorsCleanUpAndCarryTheStatusText(t *testing.T) {
	l, f := loadFake(t)
	before := f.live()
	// The stand-in rejects an uninitialised handle in the heuristic, after
	// the descriptors exist: they must all be destroyed.
	_, err := l.NewMatmul(Handle(0), MatmulSpec{M: 2, N: 2, K: 2, Type: F32, Batch: 2})
	require.ErrorIs(t, err, StatusNotInitialized)
	assert.Contains(t, err.Error(), "cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_NOT_INITIALIZED: the library was not initialized")
	assert.Contains(t, err.Error(), "f32 A·B [M=2 N=2 K=2 batch=2]")
	assert.Equal(t, before, f.live())
}

func TestStatusTextFallsBackToTheHeaderNames(t *testing.T) {
	l, _ := loadFake(t, "-DNO_STATUS_STRINGS")
	_, err := l.NewMatmul(Handle(0), MatmulSpec{M: 2, N: 2, K: 2, Type: F32})
	require.ErrorIs(t, err, StatusNotInitialized)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_NOT_INITIALIZED", e.Error())
}

func TestPlanLifecycle(t *testing.T) {
	l, f := loadFake(t)
	assert.Equal(t, uint64(120902), l.Version())
	h, err := l.Create()
	require.NoError(t, err)
	base := f.live()
	p, err := l.NewMatmul(h, MatmulSpec{M: 3, N: 3, K: 3, Type: F32, Batch: 4})
	require.NoError(t, err)
	assert.Equal(t, base+5, f.live(), "desc, three layouts and a preference")
	assert.Equal(t, 4, p.Spec().Batch)
	assert.Equal(t, F32, p.Spec().CType, "CType defaults to Type")
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	assert.Equal(t, base, f.live())
	err = p.Run(0, 0, 0, 1, 0, 0, 0, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "closed plan")
	require.NoError(t, l.Destroy(h))
	assert.Equal(t, int64(0), f.live())
}

// The mirrored structs must match cublasLt.h; the stand-in's C compiler
// reports the header's layout.
func TestMirroredStructsMatchTheCLayout(t *testing.T) {
	l, f := loadFake(t)
	_ = l
	assert.Equal(t, uintptr(64), unsafe.Sizeof(algo{}))
	var r heuristicResult
	assert.Equal(t, uintptr(96), unsafe.Sizeof(r))
	assert.Equal(t, uint64(unsafe.Sizeof(r)), f.heuristicSize())
	offsets := []uintptr{
		unsafe.Offsetof(r.Algo), unsafe.Offsetof(r.WorkspaceSize), unsafe.Offsetof(r.State),
		unsafe.Offsetof(r.WavesCount), unsafe.Offsetof(r.Reserved),
	}
	assert.Equal(t, []uintptr{0, 64, 72, 76, 80}, offsets)
	for i, off := range offsets {
		assert.Equal(t, uint64(off), f.heuristicOffset(int32(i)), "field %d", i)
	}
}

// Values from library_types.h, cublas_api.h and cublasLt.h. They cross the
// ABI as plain integers: a wrong one would select the wrong type or
// attribute without any error a stand-in could report.
func TestEnumValuesMatchTheHeaders(t *testing.T) {
	tests := []struct {
		name string
		got  int64
		want int64
	}{
		{"CUDA_R_32F", int64(cudaR32F), 0},
		{"CUDA_R_64F", int64(cudaR64F), 1},
		{"CUDA_R_16F", int64(cudaR16F), 2},
		{"CUDA_R_16BF", int64(cudaR16BF), 14},
		{"CUBLAS_COMPUTE_16F", int64(compute16F), 64},
		{"CUBLAS_COMPUTE_32F", int64(compute32F), 68},
		{"CUBLAS_COMPUTE_64F", int64(compute64F), 70},
		{"CUBLAS_COMPUTE_32F_FAST_TF32", int64(compute32FFastTF32), 77},
		{"CUBLAS_OP_N", int64(opN), 0},
		{"CUBLAS_OP_T", int64(opT), 1},
		{"CUBLASLT_ORDER_COL", int64(orderCol), 0},
		{"CUBLASLT_ORDER_ROW", int64(orderRow), 1},
		{"CUBLASLT_MATMUL_DESC_COMPUTE_TYPE", int64(descComputeType), 0},
		{"CUBLASLT_MATMUL_DESC_SCALE_TYPE", int64(descScaleType), 1},
		{"CUBLASLT_MATMUL_DESC_POINTER_MODE", int64(descPointerMode), 2},
		{"CUBLASLT_MATMUL_DESC_TRANSA", int64(descTransA), 3},
		{"CUBLASLT_MATMUL_DESC_TRANSB", int64(descTransB), 4},
		{"CUBLASLT_MATMUL_DESC_TRANSC", int64(descTransC), 5},
		{"CUBLASLT_MATMUL_DESC_EPILOGUE", int64(descEpilogue), 7},
		{"CUBLASLT_MATRIX_LAYOUT_TYPE", int64(layoutType), 0},
		{"CUBLASLT_MATRIX_LAYOUT_ORDER", int64(layoutOrder), 1},
		{"CUBLASLT_MATRIX_LAYOUT_ROWS", int64(layoutRows), 2},
		{"CUBLASLT_MATRIX_LAYOUT_COLS", int64(layoutCols), 3},
		{"CUBLASLT_MATRIX_LAYOUT_LD", int64(layoutLD), 4},
		{"CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT", int64(layoutBatchCount), 5},
		{"CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET", int64(layoutStridedBatchOffset), 6},
		{"CUBLASLT_MATMUL_PREF_SEARCH_MODE", int64(prefSearchMode), 0},
		{"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES", int64(prefMaxWorkspaceBytes), 1},
		{"CUBLAS_STATUS_SUCCESS", int64(StatusSuccess), 0},
		{"CUBLAS_STATUS_NOT_INITIALIZED", int64(StatusNotInitialized), 1},
		{"CUBLAS_STATUS_ALLOC_FAILED", int64(StatusAllocFailed), 3},
		{"CUBLAS_STATUS_INVALID_VALUE", int64(StatusInvalidValue), 7},
		{"CUBLAS_STATUS_ARCH_MISMATCH", int64(StatusArchMismatch), 8},
		{"CUBLAS_STATUS_MAPPING_ERROR", int64(StatusMappingError), 11},
		{"CUBLAS_STATUS_EXECUTION_FAILED", int64(StatusExecutionFailed), 13},
		{"CUBLAS_STATUS_INTERNAL_ERROR", int64(StatusInternalError), 14},
		{"CUBLAS_STATUS_NOT_SUPPORTED", int64(StatusNotSupported), 15},
		{"CUBLAS_STATUS_LICENSE_ERROR", int64(StatusLicenseError), 16},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.got, tt.name)
	}
	assert.Equal(t, "CUBLAS_STATUS_INVALID_VALUE", StatusInvalidValue.Error())
	assert.Equal(t, "cublasStatus_t(42)", Status(42).Error())
}

// cuBLASLt picks algorithms for 256-byte-aligned operands unless the
// preference says less; a matrix at a smaller alignment is refused by such
// an algorithm. The alignments declared in the spec reach cuBLASLt's
// preference for the right operand (its A is our B), and a misaligned
// operand without them is an error, not a wrong result.
func TestAlignmentsReachThePreference(t *testing.T) {
	l, f := loadFake(t)
	h, err := l.Create()
	require.NoError(t, err)
	defer l.Destroy(h)
	a, b, c := newBuffer(F32, 8), newBuffer(F32, 8), newBuffer(F32, 8)
	a64 := a.ptr() + 64 // our A 64 bytes past an aligned address
	run := func(s MatmulSpec, pa, pb, pc driver.DevicePtr) error {
		p, err := l.NewMatmul(h, s)
		require.NoError(t, err)
		defer p.Close()
		return p.Run(pa, pb, pc, 1, 0, 0, 0, 0)
	}
	base := MatmulSpec{M: 1, N: 2, K: 2, Type: F32}
	require.NoError(t, run(base, a.ptr(), b.ptr(), c.ptr()), "aligned operands need no declaration")
	err = run(base, a64, b.ptr(), c.ptr())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CUBLAS_STATUS_NOT_SUPPORTED")
	assert.Equal(t, int32(1), f.misaligned())
	withA := base
	withA.AlignA = 64
	require.NoError(t, run(withA, a64, b.ptr(), c.ptr()), "our A's alignment is cuBLASLt's B preference")
	withB := base
	withB.AlignB = 64
	require.Error(t, run(withB, a64, b.ptr(), c.ptr()), "declaring B's alignment does not cover A")
	bad := base
	bad.AlignC = 48
	_, err = l.NewMatmul(h, bad)
	require.ErrorContains(t, err, "alignment 48 bytes is not a power of two")
}
