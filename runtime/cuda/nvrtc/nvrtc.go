package nvrtc

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"gcompile/runtime/cuda/dl"
)

// Result is an nvrtcResult status code.
type Result int32

// nvrtcResult values (nvrtc.h).
const (
	Success                     Result = 0
	ErrorOutOfMemory            Result = 1
	ErrorProgramCreationFailure Result = 2
	ErrorInvalidInput           Result = 3
	ErrorInvalidProgram         Result = 4
	ErrorInvalidOption          Result = 5
	ErrorCompilation            Result = 6
	ErrorBuiltinOperation       Result = 7
	ErrorInternal               Result = 11
)

var resultNames = map[Result]string{
	Success:                     "NVRTC_SUCCESS",
	ErrorOutOfMemory:            "NVRTC_ERROR_OUT_OF_MEMORY",
	ErrorProgramCreationFailure: "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
	ErrorInvalidInput:           "NVRTC_ERROR_INVALID_INPUT",
	ErrorInvalidProgram:         "NVRTC_ERROR_INVALID_PROGRAM",
	ErrorInvalidOption:          "NVRTC_ERROR_INVALID_OPTION",
	ErrorCompilation:            "NVRTC_ERROR_COMPILATION",
	ErrorBuiltinOperation:       "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
	ErrorInternal:               "NVRTC_ERROR_INTERNAL_ERROR",
}

// Error returns the nvrtc.h name of the code.
func (r Result) Error() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("nvrtcResult(%d)", int32(r))
}

// Error is a failed NVRTC call with NVRTC's own text for the status.
type Error struct {
	Func string
	Code Result
	Msg  string // from nvrtcGetErrorString
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Func, e.Msg) }

// Unwrap exposes the status code to errors.Is.
func (e *Error) Unwrap() error { return e.Code }

// CompileError is a program NVRTC rejected, with the compiler's log.
type CompileError struct {
	Name    string
	Options []string
	Log     string
	Err     error // the failed nvrtcCompileProgram call
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("nvrtc: compiling %s with %s: %v\n%s",
		e.Name, strings.Join(e.Options, " "), e.Err, strings.TrimRight(e.Log, "\n"))
}

func (e *CompileError) Unwrap() error { return e.Err }

// Compiler turns CUDA C++ source into a CUBIN. *NVRTC is the real one; Cache
// accepts any, so tests can count compilations.
type Compiler interface {
	Compile(src, name string, options []string) ([]byte, error)
	Version() (major, minor int, err error)
}

// NVRTC is the loaded NVRTC library.
type NVRTC struct {
	lib *dl.Lib

	nvrtcVersion           func(major, minor *int32) Result
	nvrtcCreateProgram     func(p *uintptr, src, name *byte, nHeaders int32, headers, includeNames **byte) Result
	nvrtcCompileProgram    func(p uintptr, nOpts int32, opts **byte) Result
	nvrtcGetProgramLogSize func(p uintptr, n *uintptr) Result
	nvrtcGetProgramLog     func(p uintptr, log *byte) Result
	nvrtcGetCUBINSize      func(p uintptr, n *uintptr) Result
	nvrtcGetCUBIN          func(p uintptr, out *byte) Result
	nvrtcDestroyProgram    func(p *uintptr) Result
	nvrtcGetErrorString    func(r Result) string
}

var _ Compiler = (*NVRTC)(nil)

// Load finds libnvrtc with dl.DefaultSearch and binds it.
func Load() (*NVRTC, error) { return LoadFrom(dl.DefaultSearch()) }

// LoadFrom finds libnvrtc with s and binds it.
func LoadFrom(s dl.Search) (*NVRTC, error) {
	lib, err := s.Open(dl.NVRTC)
	if err != nil {
		return nil, err
	}
	n := &NVRTC{lib: lib}
	err = lib.BindAll([]dl.Symbol{
		dl.Sym(&n.nvrtcVersion, "nvrtcVersion"),
		dl.Sym(&n.nvrtcCreateProgram, "nvrtcCreateProgram"),
		dl.Sym(&n.nvrtcCompileProgram, "nvrtcCompileProgram"),
		dl.Sym(&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
		dl.Sym(&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"),
		dl.Sym(&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
		dl.Sym(&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"),
		dl.Sym(&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"),
		dl.Sym(&n.nvrtcGetErrorString, "nvrtcGetErrorString"),
	})
	if err != nil {
		lib.Close()
		return nil, fmt.Errorf("nvrtc: %s is not a usable NVRTC: %w", lib.Path, err)
	}
	return n, nil
}

// Path is the file NVRTC was loaded from.
func (n *NVRTC) Path() string { return n.lib.Path }

// Close unloads the library.
func (n *NVRTC) Close() error { return n.lib.Close() }

func (n *NVRTC) check(fn string, r Result) error {
	if r == Success {
		return nil
	}
	msg := n.nvrtcGetErrorString(r)
	if msg == "" {
		msg = r.Error()
	}
	return &Error{Func: fn, Code: r, Msg: msg}
}

// Version is NVRTC's CUDA version.
func (n *NVRTC) Version() (major, minor int, err error) {
	var ma, mi int32
	if err := n.check("nvrtcVersion", n.nvrtcVersion(&ma, &mi)); err != nil {
		return 0, 0, err
	}
	return int(ma), int(mi), nil
}

// Compile compiles src (named name in messages) with options and returns the
// CUBIN. Options must select a real architecture (--gpu-architecture=sm_XY)
// for NVRTC to produce a CUBIN. A rejected program is a *CompileError
// carrying the log.
func (n *NVRTC) Compile(src, name string, options []string) (cubin []byte, err error) {
	csrc, cname := dl.CString(src), dl.CString(name)
	var prog uintptr
	r := n.nvrtcCreateProgram(&prog, &csrc[0], &cname[0], 0, nil, nil)
	runtime.KeepAlive(csrc)
	runtime.KeepAlive(cname)
	if err := n.check("nvrtcCreateProgram", r); err != nil {
		return nil, fmt.Errorf("nvrtc: %s: %w", name, err)
	}
	defer func() {
		if derr := n.check("nvrtcDestroyProgram", n.nvrtcDestroyProgram(&prog)); derr != nil && err == nil {
			err = derr
		}
	}()

	copts := make([][]byte, len(options))
	ptrs := make([]*byte, len(options))
	for i, o := range options {
		copts[i] = dl.CString(o)
		ptrs[i] = &copts[i][0]
	}
	var optv **byte
	if len(ptrs) > 0 {
		optv = &ptrs[0]
	}
	r = n.nvrtcCompileProgram(prog, int32(len(ptrs)), optv)
	runtime.KeepAlive(copts)
	runtime.KeepAlive(ptrs)
	if cerr := n.check("nvrtcCompileProgram", r); cerr != nil {
		log, lerr := n.log(prog)
		if lerr != nil {
			log = fmt.Sprintf("(no log: %v)", lerr)
		}
		return nil, &CompileError{Name: name, Options: options, Log: log, Err: cerr}
	}

	var size uintptr
	if err := n.check("nvrtcGetCUBINSize", n.nvrtcGetCUBINSize(prog, &size)); err != nil {
		return nil, fmt.Errorf("nvrtc: %s: %w", name, err)
	}
	if size == 0 {
		return nil, fmt.Errorf("nvrtc: %s: empty CUBIN (does %q name a real architecture?)", name, options)
	}
	cubin = make([]byte, size)
	if err := n.check("nvrtcGetCUBIN", n.nvrtcGetCUBIN(prog, &cubin[0])); err != nil {
		return nil, fmt.Errorf("nvrtc: %s: %w", name, err)
	}
	return cubin, nil
}

// log reads the program's compiler log.
func (n *NVRTC) log(prog uintptr) (string, error) {
	var size uintptr
	if err := n.check("nvrtcGetProgramLogSize", n.nvrtcGetProgramLogSize(prog, &size)); err != nil {
		return "", err
	}
	if size <= 1 {
		return "", nil
	}
	buf := make([]byte, size)
	if err := n.check("nvrtcGetProgramLog", n.nvrtcGetProgramLog(prog, &buf[0])); err != nil {
		return "", err
	}
	return dl.GoString(&buf[0]), nil
}

// IsCompileError reports whether err is a program NVRTC rejected (as
// opposed to a failure to run NVRTC at all).
func IsCompileError(err error) bool {
	var ce *CompileError
	return errors.As(err, &ce)
}
