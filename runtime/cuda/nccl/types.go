package nccl

import (
	"fmt"
)

// Result is an ncclResult_t.
type Result int32

// ncclResult_t values (nccl.h).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
)

var resultNames = map[Result]string{
	Success:            "ncclSuccess",
	UnhandledCudaError: "ncclUnhandledCudaError",
	SystemError:        "ncclSystemError",
	InternalError:      "ncclInternalError",
	InvalidArgument:    "ncclInvalidArgument",
	InvalidUsage:       "ncclInvalidUsage",
	RemoteError:        "ncclRemoteError",
	InProgress:         "ncclInProgress",
}

// Error returns the nccl.h name of the code.
func (r Result) Error() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("ncclResult_t(%d)", int32(r))
}

// Error is a failed NCCL call.
type Error struct {
	Func   string
	Code   Result
	Msg    string // ncclGetErrorString
	Detail string // ncclGetLastError, if the library has it
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s: %s", e.Func, e.Code.Error(), e.Msg)
	if e.Detail != "" {
		// NCCL keeps the last error per thread; it may predate this call.
		s += " (last NCCL error: " + e.Detail + ")"
	}
	return s
}

// Unwrap exposes the code to errors.Is.
func (e *Error) Unwrap() error { return e.Code }

// DataType is an ncclDataType_t.
type DataType int32

// ncclDataType_t values (nccl.h). Float8 types need NCCL 2.19 or later.
const (
	Int8       DataType = 0
	Uint8      DataType = 1
	Int32      DataType = 2
	Uint32     DataType = 3
	Int64      DataType = 4
	Uint64     DataType = 5
	Float16    DataType = 6
	Float32    DataType = 7
	Float64    DataType = 8
	Bfloat16   DataType = 9
	Float8e4m3 DataType = 10
	Float8e5m2 DataType = 11
)

// Size is the element size in bytes, 0 for an unknown type.
func (t DataType) Size() uint64 {
	switch t {
	case Int8, Uint8, Float8e4m3, Float8e5m2:
		return 1
	case Float16, Bfloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

// RedOp is an ncclRedOp_t.
type RedOp int32

// ncclRedOp_t values (nccl.h). Avg needs NCCL 2.10 or later.
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
)

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = 128

// UniqueID mirrors ncclUniqueId: 128 opaque bytes that name a communicator.
// One rank creates it; every rank passes the same bytes to CommInitRank.
type UniqueID struct {
	internal [UniqueIDBytes]byte
}

// Bytes returns a copy of the id's bytes, to send to the other ranks.
func (u UniqueID) Bytes() []byte {
	b := make([]byte, UniqueIDBytes)
	copy(b, u.internal[:])
	return b
}

// UniqueIDFromBytes rebuilds an id received from the rank that created it.
func UniqueIDFromBytes(b []byte) (UniqueID, error) {
	var u UniqueID
	if len(b) != UniqueIDBytes {
		return u, fmt.Errorf("nccl: a unique id has %d bytes, got %d", UniqueIDBytes, len(b))
	}
	copy(u.internal[:], b)
	return u, nil
}

// Comm is an ncclComm_t.
type Comm uintptr
