package cublaslt

import "fmt"

// Status is a cublasStatus_t.
type Status int32

// cublasStatus_t values (cublas_api.h).
const (
	StatusSuccess         Status = 0
	StatusNotInitialized  Status = 1
	StatusAllocFailed     Status = 3
	StatusInvalidValue    Status = 7
	StatusArchMismatch    Status = 8
	StatusMappingError    Status = 11
	StatusExecutionFailed Status = 13
	StatusInternalError   Status = 14
	StatusNotSupported    Status = 15
	StatusLicenseError    Status = 16
)

var statusNames = map[Status]string{
	StatusSuccess:         "CUBLAS_STATUS_SUCCESS",
	StatusNotInitialized:  "CUBLAS_STATUS_NOT_INITIALIZED",
	StatusAllocFailed:     "CUBLAS_STATUS_ALLOC_FAILED",
	StatusInvalidValue:    "CUBLAS_STATUS_INVALID_VALUE",
	StatusArchMismatch:    "CUBLAS_STATUS_ARCH_MISMATCH",
	StatusMappingError:    "CUBLAS_STATUS_MAPPING_ERROR",
	StatusExecutionFailed: "CUBLAS_STATUS_EXECUTION_FAILED",
	StatusInternalError:   "CUBLAS_STATUS_INTERNAL_ERROR",
	StatusNotSupported:    "CUBLAS_STATUS_NOT_SUPPORTED",
	StatusLicenseError:    "CUBLAS_STATUS_LICENSE_ERROR",
}

// Error returns the cublas_api.h name of the status.
func (s Status) Error() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("cublasStatus_t(%d)", int32(s))
}

// Error is a failed cuBLASLt call.
type Error struct {
	Func string
	Code Status
	Name string
	Desc string
}

func (e *Error) Error() string {
	if e.Desc == "" {
		return fmt.Sprintf("%s: %s", e.Func, e.Name)
	}
	return fmt.Sprintf("%s: %s: %s", e.Func, e.Name, e.Desc)
}

// Unwrap exposes the status to errors.Is.
func (e *Error) Unwrap() error { return e.Code }

// cudaDataType values (library_types.h).
type cudaDataType int32

const (
	cudaR32F  cudaDataType = 0
	cudaR64F  cudaDataType = 1
	cudaR16F  cudaDataType = 2
	cudaR16BF cudaDataType = 14
)

// cublasComputeType_t values (cublas_api.h).
type computeType int32

const (
	compute16F         computeType = 64
	compute32F         computeType = 68
	compute32FFastTF32 computeType = 77
	compute64F         computeType = 70
)

// cublasOperation_t values (cublas_api.h).
type operation int32

const (
	opN operation = 0
	opT operation = 1
)

// cublasLtOrder_t values (cublasLt.h).
type order int32

const (
	orderCol order = 0
	orderRow order = 1
)

// cublasLtMatmulDescAttributes_t values used here (cublasLt.h); each is
// followed by the C type of its value.
type descAttr int32

const (
	descComputeType descAttr = 0 // int32_t
	descScaleType   descAttr = 1 // int32_t
	descPointerMode descAttr = 2 // int32_t
	descTransA      descAttr = 3 // int32_t
	descTransB      descAttr = 4 // int32_t
	descTransC      descAttr = 5 // int32_t
	descEpilogue    descAttr = 7 // uint32_t
)

// cublasLtMatrixLayoutAttribute_t values (cublasLt.h).
type layoutAttr int32

const (
	layoutType               layoutAttr = 0 // uint32_t
	layoutOrder              layoutAttr = 1 // int32_t
	layoutRows               layoutAttr = 2 // uint64_t
	layoutCols               layoutAttr = 3 // uint64_t
	layoutLD                 layoutAttr = 4 // int64_t
	layoutBatchCount         layoutAttr = 5 // int32_t
	layoutStridedBatchOffset layoutAttr = 6 // int64_t
)

// cublasLtMatmulPreferenceAttributes_t values (cublasLt.h).
type prefAttr int32

const (
	prefSearchMode        prefAttr = 0 // uint32_t
	prefMaxWorkspaceBytes prefAttr = 1 // uint64_t
	prefMinAlignmentA     prefAttr = 5 // uint32_t, bytes; default 256
	prefMinAlignmentB     prefAttr = 6 // uint32_t
	prefMinAlignmentC     prefAttr = 7 // uint32_t
	prefMinAlignmentD     prefAttr = 8 // uint32_t
)

// algo mirrors cublasLtMatmulAlgo_t: an opaque uint64_t data[8].
type algo struct {
	Data [8]uint64
}

// heuristicResult mirrors cublasLtMatmulHeuristicResult_t.
type heuristicResult struct {
	Algo          algo
	WorkspaceSize uint64 // size_t
	State         Status
	WavesCount    float32
	Reserved      [4]int32
}
