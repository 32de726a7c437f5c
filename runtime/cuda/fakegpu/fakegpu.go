package fakegpu

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"gcompile/kernels/cuda"
	"gcompile/kernels/cuda/emu"
	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/dl/dltest"
)

// Variables the fake driver reads (see the package documentation).
const (
	DevicesEnv  = "GCOMPILE_FAKEGPU_DEVICES"
	MemoryEnv   = "GCOMPILE_FAKEGPU_MEMORY"
	EmulatorEnv = "GCOMPILE_FAKEGPU_EMU"
	VerboseEnv  = "GCOMPILE_FAKEGPU_VERBOSE"
	// NCCLTimeoutEnv bounds, in seconds, how long a fake NCCL call waits
	// for other ranks (default 120).
	NCCLTimeoutEnv = "GCOMPILE_FAKEGPU_NCCL_TIMEOUT"
)

// ErrNoCompiler reports that g++ or gcc is missing.
var ErrNoCompiler = errors.New("the fake GPU is built with g++ and gcc")

//go:embed csrc/*.cpp
var csrc embed.FS

// Libs are the built libraries' paths.
type Libs struct {
	Dir      string // the folder holding them
	CUDA     string // libcuda.so.1
	NVRTC    string // libnvrtc.so.12
	CuBLASLt string // libcublasLt.so.12
	NCCL     string // libnccl.so.2
	Emulator string // the kernel emulator (kernels/cuda/emu)
}

// Env lists the variables that make the runtime/cuda bindings load the
// fake, as NAME=value, for a child process's environment.
func (l Libs) Env() []string {
	return []string{
		dl.CUDA.EnvVar + "=" + l.CUDA,
		dl.NVRTC.EnvVar + "=" + l.NVRTC,
		dl.CuBLASLt.EnvVar + "=" + l.CuBLASLt,
		dl.NCCL.EnvVar + "=" + l.NCCL,
		EmulatorEnv + "=" + l.Emulator,
	}
}

// Setenv sets Env's variables for the duration of t.
func (l Libs) Setenv(t testing.TB) {
	t.Helper()
	for _, kv := range l.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// LastError is the fake driver's sentence about its most recent failed
// call, "" if none failed since the library was loaded.
func (l Libs) LastError() (string, error) {
	var fn func() string
	if err := l.bindDriver(&fn, "gcFakeGPULastError"); err != nil {
		return "", err
	}
	return fn(), nil
}

// MemUsed is the device memory in use on device, in bytes (allocations
// rounded up to 256 bytes), as the fake driver counts it against the
// configured size.
func (l Libs) MemUsed(device int) (uint64, error) {
	var fn func(d int32) int64
	if err := l.bindDriver(&fn, "gcFakeGPUMemUsed"); err != nil {
		return 0, err
	}
	n := fn(int32(device))
	if n < 0 {
		return 0, fmt.Errorf("fakegpu: no device %d", device)
	}
	return uint64(n), nil
}

// TraceCall is one call the fake driver recorded while tracing: what it
// did (launch, copy, memset, record, wait, sync, or nccl for the fake
// NCCL's collectives and transfers, or a mark a caller added), the kernel
// or function, and the stream and event handles involved (0 where none;
// the legacy default stream is 1).
type TraceCall struct {
	Op     string
	Name   string
	Stream uintptr
	Event  uintptr
	// Line is the call as recorded.
	Line string
}

// StartTrace empties the fake driver's call trace and starts recording
// every call that queues work on a stream or orders streams: the fake GPU
// runs everything when it is queued, so a test checks the order a
// backend asks for rather than the order work ran in.
func (l Libs) StartTrace() error {
	var fn func()
	if err := l.bindDriver(&fn, "gcFakeGPUTraceStart"); err != nil {
		return err
	}
	fn()
	return nil
}

// TraceMark adds text to the trace between the calls around it.
func (l Libs) TraceMark(text string) error {
	var fn func(string)
	if err := l.bindDriver(&fn, "gcFakeGPUTraceAppend"); err != nil {
		return err
	}
	fn("mark " + text)
	return nil
}

// StopTrace stops recording and returns the calls recorded since
// StartTrace, in the order they were made (calls of several threads
// interleave). An error says if the trace overflowed.
func (l Libs) StopTrace() ([]TraceCall, error) {
	var stop func()
	var read func() string
	if err := l.bindDriver(&stop, "gcFakeGPUTraceStop"); err != nil {
		return nil, err
	}
	if err := l.bindDriver(&read, "gcFakeGPUTraceRead"); err != nil {
		return nil, err
	}
	stop()
	var calls []TraceCall
	for _, line := range strings.Split(strings.TrimSuffix(read(), "\n"), "\n") {
		if line == "" {
			continue
		}
		if line == "truncated" {
			return calls, errors.New("fakegpu: the call trace overflowed; calls were dropped")
		}
		calls = append(calls, parseTraceLine(line))
	}
	return calls, nil
}

// parseTraceLine reads "OP [NAME] key=value …".
func parseTraceLine(line string) TraceCall {
	c := TraceCall{Line: line}
	if rest, ok := strings.CutPrefix(line, "mark "); ok {
		c.Op, c.Name = "mark", rest
		return c
	}
	for i, f := range strings.Fields(line) {
		k, v, kv := strings.Cut(f, "=")
		switch {
		case i == 0:
			c.Op = f
		case !kv && c.Name == "":
			c.Name = f
		case k == "stream" || k == "event":
			n, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 64)
			if err != nil {
				continue
			}
			if k == "stream" {
				c.Stream = uintptr(n)
			} else {
				c.Event = uintptr(n)
			}
		}
	}
	return c
}

var (
	driverMu   sync.Mutex
	driverLibs = map[string]*dl.Lib{}
)

// bindDriver binds symbol of the fake driver at l.CUDA into fnptr. Opening
// a library that is already loaded returns the loaded instance, so the
// call sees the state of the driver the bindings use. The library is kept
// open for later calls.
func (l Libs) bindDriver(fnptr any, symbol string) error {
	driverMu.Lock()
	defer driverMu.Unlock()
	lib, ok := driverLibs[l.CUDA]
	if !ok {
		var err error
		if lib, err = dl.OpenFile("fake CUDA driver", l.CUDA); err != nil {
			return fmt.Errorf("fakegpu: %w", err)
		}
		driverLibs[l.CUDA] = lib
	}
	if err := lib.Bind(fnptr, symbol); err != nil {
		return fmt.Errorf("fakegpu: %w", err)
	}
	return nil
}

var (
	installOnce sync.Once
	installed   Libs
	installErr  error
)

// Install builds the fake GPU once per test binary (see Build and the
// package documentation on builds) and points the bindings at it for the
// duration of t. Without g++ or gcc it skips t, or fails it when
// GCOMPILE_REQUIRE_GCC=1.
func Install(t testing.TB) Libs {
	t.Helper()
	installOnce.Do(func() { installed, installErr = buildCached() })
	if installErr != nil {
		if errors.Is(installErr, ErrNoCompiler) && os.Getenv(dltest.RequireGCCEnv) != "1" {
			t.Skipf("skipping: %v (set %s=1 to make this a failure)", installErr, dltest.RequireGCCEnv)
		}
		t.Fatalf("building the fake GPU: %v", installErr)
	}
	installed.Setenv(t)
	return installed
}

// buildCached builds into the folder for the current inputs under the
// user's cache, or into a new temporary folder when the cache cannot be
// written.
func buildCached() (Libs, error) {
	tc, err := findTools()
	if err != nil {
		return Libs{}, err
	}
	in, err := gatherInputs(tc)
	if err != nil {
		return Libs{}, err
	}
	if root, err := os.UserCacheDir(); err == nil {
		dir := filepath.Join(root, "gcompile", "fakegpu", in.hash[:16])
		if err := os.MkdirAll(dir, 0o755); err == nil {
			return build(dir, tc, in)
		}
	}
	// No usable cache: a private folder, built afresh by this binary.
	dir, err := os.MkdirTemp("", "gcompile-fakegpu-")
	if err != nil {
		return Libs{}, fmt.Errorf("fakegpu: no folder to build in: %w", err)
	}
	return build(dir, tc, in)
}

// Compiler flags. -Werror keeps the stand-ins free of the slips warnings
// catch; they are small enough that a new compiler's warnings are cheap to
// fix.
var (
	cxxFlags = []string{"-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-Wall", "-Werror"}
	ccFlags  = []string{"-std=gnu11", "-O1", "-fPIC", "-shared", "-Wall", "-Werror"}
)

type toolchain struct {
	gxx, gcc string
	version  string // both compilers' --version output
}

func findTools() (toolchain, error) {
	var tc toolchain
	var err error
	if tc.gxx, err = exec.LookPath("g++"); err != nil {
		return tc, fmt.Errorf("%w: g++ is not on PATH", ErrNoCompiler)
	}
	if tc.gcc, err = exec.LookPath("gcc"); err != nil {
		return tc, fmt.Errorf("%w: gcc is not on PATH", ErrNoCompiler)
	}
	for _, c := range []string{tc.gxx, tc.gcc} {
		out, err := exec.Command(c, "--version").Output()
		if err != nil {
			return tc, fmt.Errorf("fakegpu: %s --version: %w", c, err)
		}
		first, _, _ := strings.Cut(string(out), "\n")
		tc.version += first + "\n"
	}
	return tc, nil
}

// library is one shared object to build.
type library struct {
	file   string // the soname, also the file name
	source string // path of the source file, for messages
	text   []byte
	cxx    bool
	defs   []string // -D flags before the source
	libs   []string // linker flags after the source
}

type inputs struct {
	libs []library
	hash string
}

func gatherInputs(tc toolchain) (inputs, error) {
	var in inputs
	for _, l := range []struct {
		file, src string
		libs      []string
	}{
		{"libcuda.so.1", "csrc/fake_cuda.cpp", []string{"-ldl"}},
		{"libnvrtc.so.12", "csrc/fake_nvrtc.cpp", []string{"-ldl"}},
		// The NCCL stand-in runs threads of its own (the hub of a
		// communicator outlives the rank that hosts it), so it must stay
		// mapped after the bindings close it: -z nodelete.
		{"libnccl.so.2", "csrc/fake_nccl.cpp", []string{"-ldl", "-Wl,-z,nodelete"}},
	} {
		b, err := csrc.ReadFile(l.src)
		if err != nil {
			return in, fmt.Errorf("fakegpu: embedded %s: %w", l.src, err)
		}
		lib := library{file: l.file, source: l.src, text: b, cxx: true, libs: l.libs}
		if l.file == "libcuda.so.1" {
			// The driver builds the emulator of kernels generated at run
			// time with the compiler and flags of the table's.
			lib.defs = []string{
				fmt.Sprintf("-DGC_FAKE_EMU_CXX=%q", tc.gxx),
				fmt.Sprintf("-DGC_FAKE_EMU_FLAGS=%q", strings.Join(emu.CompilerFlags, " ")),
			}
		}
		in.libs = append(in.libs, lib)
	}
	lt, err := cublasLtSource()
	if err != nil {
		return in, err
	}
	b, err := os.ReadFile(lt)
	if err != nil {
		return in, fmt.Errorf("fakegpu: reading the cuBLASLt stand-in: %w", err)
	}
	in.libs = append(in.libs, library{file: "libcublasLt.so.12", source: lt, text: b, libs: []string{"-lm"}})

	prog, err := cuda.Program()
	if err != nil {
		return in, fmt.Errorf("fakegpu: kernel sources: %w", err)
	}
	dispatch, err := emu.Dispatch(cuda.Kernels())
	if err != nil {
		return in, fmt.Errorf("fakegpu: emulator dispatch: %w", err)
	}
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field("gcompile fakegpu v1")
	for _, l := range in.libs {
		field(l.file)
		field(string(l.text))
		field(strings.Join(l.defs, " "))
		field(strings.Join(l.libs, " "))
	}
	field(strings.Join(cxxFlags, " "))
	field(strings.Join(ccFlags, " "))
	field(tc.gxx)
	field(tc.gcc)
	field(tc.version)
	field(prog)
	field(dispatch)
	field(strings.Join(emu.CompilerFlags, " "))
	in.hash = hex.EncodeToString(h.Sum(nil))
	return in, nil
}

// cublasLtSource finds runtime/cuda/cublaslt/testdata/fake_cublaslt.c: next
// to this package's source when that is on disk, else from the module root
// above the working directory (a test always runs inside the module).
func cublasLtSource() (string, error) {
	rel := filepath.Join("cublaslt", "testdata", "fake_cublaslt.c")
	var tried []string
	if _, file, _, ok := runtime.Caller(0); ok {
		p := filepath.Join(filepath.Dir(file), "..", rel)
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
		tried = append(tried, p)
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if isModuleRoot(d) {
				p := filepath.Join(d, "runtime", "cuda", rel)
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
				tried = append(tried, p)
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", fmt.Errorf("fakegpu: the cuBLASLt stand-in source is not on disk (tried %s)", strings.Join(tried, ", "))
}

func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == "gcompile"
		}
	}
	return false
}

// stampFile records the hash of the inputs a folder was built from.
const stampFile = "fakegpu.sum"

// Build compiles the fake GPU into dir and returns the libraries' paths. A
// folder already built from the same inputs is reused; a file lock in dir
// serializes builds by concurrent processes.
func Build(dir string) (Libs, error) {
	tc, err := findTools()
	if err != nil {
		return Libs{}, err
	}
	in, err := gatherInputs(tc)
	if err != nil {
		return Libs{}, err
	}
	return build(dir, tc, in)
}

// build is Build with the toolchain found and the inputs hashed.
func build(dir string, tc toolchain, in inputs) (Libs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Libs{}, fmt.Errorf("fakegpu: build folder: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Libs{}, fmt.Errorf("fakegpu: build folder: %w", err)
	}
	dir = abs
	unlock, err := lockDir(dir)
	if err != nil {
		return Libs{}, err
	}
	defer unlock()

	libs := Libs{Dir: dir}
	paths := map[string]*string{
		"libcuda.so.1":      &libs.CUDA,
		"libnvrtc.so.12":    &libs.NVRTC,
		"libcublasLt.so.12": &libs.CuBLASLt,
		"libnccl.so.2":      &libs.NCCL,
	}
	for f, p := range paths {
		*p = filepath.Join(dir, f)
	}
	fresh := upToDate(dir, in.hash, in.libs)

	// The emulator (self-caching, in its own folder) and the four
	// libraries build at the same time.
	var wg sync.WaitGroup
	errs := make([]error, len(in.libs)+1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		e, err := emu.Build(filepath.Join(dir, "emu"))
		if err != nil {
			errs[0] = fmt.Errorf("fakegpu: kernel emulator: %w", err)
			return
		}
		libs.Emulator = e.Path()
	}()
	if !fresh {
		for i, l := range in.libs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i+1] = compile(tc, dir, l)
			}()
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Libs{}, err
	}
	if !fresh {
		if err := os.WriteFile(filepath.Join(dir, stampFile), []byte(in.hash), 0o644); err != nil {
			return Libs{}, fmt.Errorf("fakegpu: build stamp: %w", err)
		}
	}
	return libs, nil
}

func upToDate(dir, hash string, libs []library) bool {
	got, err := os.ReadFile(filepath.Join(dir, stampFile))
	if err != nil || string(got) != hash {
		return false
	}
	for _, l := range libs {
		if _, err := os.Stat(filepath.Join(dir, l.file)); err != nil {
			return false
		}
	}
	return true
}

// compile writes l's source into dir/src and builds dir/<soname> through a
// temporary file, so a reader never sees half a library.
func compile(tc toolchain, dir string, l library) error {
	srcDir := filepath.Join(dir, "src")
	if err := os.MkdirAll(srcDir, 0o755); err != nil {
		return fmt.Errorf("fakegpu: %w", err)
	}
	src := filepath.Join(srcDir, filepath.Base(l.source))
	if err := os.WriteFile(src, l.text, 0o644); err != nil {
		return fmt.Errorf("fakegpu: %w", err)
	}
	tmp, err := os.CreateTemp(dir, l.file+".*.tmp")
	if err != nil {
		return fmt.Errorf("fakegpu: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cc, flags := tc.gcc, ccFlags
	if l.cxx {
		cc, flags = tc.gxx, cxxFlags
	}
	args := append(append(append(append([]string(nil), flags...), l.defs...), "-o", tmp.Name(), src), l.libs...)
	cmd := exec.Command(cc, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("fakegpu: building %s from %s: %s %s: %w\n%s", l.file, l.source, cc,
			strings.Join(args, " "), err, out.String())
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, l.file)); err != nil {
		return fmt.Errorf("fakegpu: %w", err)
	}
	return nil
}

// lockDir takes an exclusive lock on dir/.lock, waiting for another
// process's build to finish.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("fakegpu: build lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fakegpu: build lock: %w", err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
