package cublaslt

import (
	"fmt"
	"runtime"
	"unsafe"

	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/driver"
)

// Handle is a cublasLtHandle_t.
type Handle uintptr

// Opaque descriptor handles.
type (
	matmulDesc   uintptr
	matrixLayout uintptr
	preference   uintptr
)

// Lt is the loaded cuBLASLt library.
type Lt struct {
	lib *dl.Lib

	cublasLtCreate                       func(h *Handle) Status
	cublasLtDestroy                      func(h Handle) Status
	cublasLtGetVersion                   func() uint64
	cublasLtGetStatusName                func(s Status) string // optional
	cublasLtGetStatusString              func(s Status) string // optional
	cublasLtMatmulDescCreate             func(d *matmulDesc, compute computeType, scale cudaDataType) Status
	cublasLtMatmulDescDestroy            func(d matmulDesc) Status
	cublasLtMatmulDescSetAttribute       func(d matmulDesc, attr descAttr, buf unsafe.Pointer, size uintptr) Status
	cublasLtMatrixLayoutCreate           func(l *matrixLayout, t cudaDataType, rows, cols uint64, ld int64) Status
	cublasLtMatrixLayoutDestroy          func(l matrixLayout) Status
	cublasLtMatrixLayoutSetAttribute     func(l matrixLayout, attr layoutAttr, buf unsafe.Pointer, size uintptr) Status
	cublasLtMatmulPreferenceCreate       func(p *preference) Status
	cublasLtMatmulPreferenceDestroy      func(p preference) Status
	cublasLtMatmulPreferenceSetAttribute func(p preference, attr prefAttr, buf unsafe.Pointer, size uintptr) Status
	cublasLtMatmulAlgoGetHeuristic       func(h Handle, d matmulDesc, a, b, c, dd matrixLayout, p preference, requested int32, results *heuristicResult, returned *int32) Status
	cublasLtMatmul                       func(h Handle, d matmulDesc, alpha unsafe.Pointer, A driver.DevicePtr, a matrixLayout, B driver.DevicePtr, b matrixLayout, beta unsafe.Pointer, C driver.DevicePtr, c matrixLayout, D driver.DevicePtr, dd matrixLayout, al *algo, workspace driver.DevicePtr, workspaceSize uintptr, s driver.Stream) Status
}

// Load finds libcublasLt with dl.DefaultSearch and binds it.
func Load() (*Lt, error) { return LoadFrom(dl.DefaultSearch()) }

// LoadFrom finds libcublasLt with s and binds it.
func LoadFrom(s dl.Search) (*Lt, error) {
	lib, err := s.Open(dl.CuBLASLt)
	if err != nil {
		return nil, err
	}
	l := &Lt{lib: lib}
	err = lib.BindAll([]dl.Symbol{
		dl.Sym(&l.cublasLtCreate, "cublasLtCreate"),
		dl.Sym(&l.cublasLtDestroy, "cublasLtDestroy"),
		dl.Sym(&l.cublasLtGetVersion, "cublasLtGetVersion"),
		dl.Optional(&l.cublasLtGetStatusName, "cublasLtGetStatusName"),
		dl.Optional(&l.cublasLtGetStatusString, "cublasLtGetStatusString"),
		dl.Sym(&l.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate"),
		dl.Sym(&l.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy"),
		dl.Sym(&l.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute"),
		dl.Sym(&l.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate"),
		dl.Sym(&l.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy"),
		dl.Sym(&l.cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute"),
		dl.Sym(&l.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate"),
		dl.Sym(&l.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy"),
		dl.Sym(&l.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute"),
		dl.Sym(&l.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"),
		dl.Sym(&l.cublasLtMatmul, "cublasLtMatmul"),
	})
	if err != nil {
		lib.Close()
		return nil, fmt.Errorf("cublaslt: %s is not a usable cuBLASLt: %w", lib.Path, err)
	}
	return l, nil
}

// Path is the file cuBLASLt was loaded from.
func (l *Lt) Path() string { return l.lib.Path }

// Close unloads the library.
func (l *Lt) Close() error { return l.lib.Close() }

// Version is cuBLASLt's version number (major*10000 + minor*100 + patch).
func (l *Lt) Version() uint64 { return l.cublasLtGetVersion() }

func (l *Lt) check(fn string, s Status) error {
	if s == StatusSuccess {
		return nil
	}
	e := &Error{Func: fn, Code: s, Name: s.Error()}
	if l.cublasLtGetStatusName != nil {
		if n := l.cublasLtGetStatusName(s); n != "" {
			e.Name = n
		}
	}
	if l.cublasLtGetStatusString != nil {
		e.Desc = l.cublasLtGetStatusString(s)
	}
	return e
}

// Create makes a cuBLASLt handle. It serves any number of plans.
func (l *Lt) Create() (Handle, error) {
	var h Handle
	if err := l.check("cublasLtCreate", l.cublasLtCreate(&h)); err != nil {
		return 0, err
	}
	return h, nil
}

// Destroy releases a handle.
func (l *Lt) Destroy(h Handle) error { return l.check("cublasLtDestroy", l.cublasLtDestroy(h)) }

// setAttr passes *v with its exact size, which cuBLASLt checks against the
// attribute's C type.
func setAttr[T any, H ~uintptr, A ~int32](l *Lt, fn string, set func(H, A, unsafe.Pointer, uintptr) Status, h H, attr A, v T) error {
	r := set(h, attr, unsafe.Pointer(&v), unsafe.Sizeof(v))
	runtime.KeepAlive(&v)
	if err := l.check(fn, r); err != nil {
		return fmt.Errorf("attribute %d: %w", attr, err)
	}
	return nil
}
