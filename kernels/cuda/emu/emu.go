package emu

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"

	"gcompile/kernels/cuda"
)

//go:embed csrc/emu.h
var shimHeader string

//go:embed csrc/emu.cpp
var shimRuntime string

// LaunchSymbol is the C entry point of the built library:
//
//	int gc_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz,
//	                  unsigned bx, unsigned by, unsigned bz, unsigned shmem,
//	                  void** params);
//
// params[i] points at the value of the kernel's i-th argument, exactly as
// cuLaunchKernel's kernelParams, so a stand-in libcuda can forward its
// launches here. It returns 0, or one of the Status codes.
const LaunchSymbol = "gc_emu_launch"

// LibraryName is the file Build writes inside its directory.
const LibraryName = "libgcemu.so"

// Status is a non-zero return of LaunchSymbol.
type Status int32

// The codes LaunchSymbol returns (GC_EMU_* in emu.h).
const (
	StatusUnknownKernel Status = 1
	StatusBadDims       Status = 2
	StatusBadParams     Status = 3
	StatusNoThreads     Status = 4
	StatusStuck         Status = 5
)

func (s Status) Error() string {
	switch s {
	case StatusUnknownKernel:
		return "unknown kernel"
	case StatusBadDims:
		return "launch dimensions out of range (grid ≥ 1, 1 ≤ block threads ≤ 1024)"
	case StatusBadParams:
		return "missing kernel parameters"
	case StatusNoThreads:
		return "could not make the emulator's threads (their stacks)"
	case StatusStuck:
		return "a barrier (__syncthreads or a warp shuffle) that not every thread of the block reached"
	}
	return fmt.Sprintf("emulator status %d", int32(s))
}

// CompilerFlags are the g++ flags of the emulator build. -ffp-contract=off
// keeps a·b + c two roundings, as Go computes it on amd64, so that where a
// kernel mirrors a CPU kernel's float32 arithmetic the emulator agrees
// bit for bit.
var CompilerFlags = []string{"-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-ffp-contract=off",
	"-fno-fast-math", "-Wall", "-Wno-unused-function", "-Werror"}

// ErrNoCompiler reports that g++ is not on PATH.
var ErrNoCompiler = errors.New("g++ not found on PATH: the emulator compiles the kernels with it")

// Emu is a loaded emulator library.
type Emu struct {
	path   string
	launch func(name string, gx, gy, gz, bx, by, bz, shmem uint32, params unsafe.Pointer) int32
	// extra holds the kernels built from an Extra, by name; a new map
	// replaces the old one, so Launch reads it without a lock.
	extra atomic.Pointer[map[string]cuda.Kernel]
}

// Extra is CUDA C built into the emulator after the kernel files, with
// the table entries of the kernels it defines: generated kernels (the
// fused ones of package codegen) that the kernel table does not list.
// Source may call everything the kernel files define.
type Extra struct {
	Source  string
	Kernels []cuda.Kernel
}

// Path is the built shared library, for a stand-in libcuda to dlopen.
func (e *Emu) Path() string { return e.path }

var (
	loadMu sync.Mutex
	loaded = map[string]*Emu{}
)

// Build compiles the embedded kernels, the shim and the generated
// dispatch with g++ into dir/libgcemu.so and loads it. The library is
// named after a hash of everything that goes into it, so a later Build
// with the same sources reuses it (a fresh directory always compiles),
// and loading the same file twice returns the same Emu.
func Build(dir string) (*Emu, error) { return BuildWith(dir, Extra{}) }

// BuildWith is Build with extra kernels after the kernel files; Launch
// runs them like the table's. Their names must not clash with the table.
// Give each set of extras a directory of its own: a library loaded in
// this process stays loaded, so a rebuild in the same directory would
// not replace it.
func BuildWith(dir string, extra Extra) (*Emu, error) {
	gxx, err := exec.LookPath("g++")
	if err != nil {
		return nil, ErrNoCompiler
	}
	for _, k := range extra.Kernels {
		if _, clash := cuda.Lookup(k.Name); clash {
			return nil, fmt.Errorf("extra kernel %s has the name of a kernel in the table", k.Name)
		}
	}
	files, err := buildFiles(extra)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	names := slices.Sorted(maps.Keys(files))
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%s\x00", n, files[n])
	}
	fmt.Fprintf(h, "%s\x00%s", strings.Join(CompilerFlags, " "), gxx)
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("emulator build directory: %w", err)
	}
	lib := filepath.Join(dir, LibraryName)
	stamp := filepath.Join(dir, LibraryName+".sum")
	got, err := os.ReadFile(stamp)
	if _, statErr := os.Stat(lib); err != nil || statErr != nil || string(got) != sum {
		if err := compile(gxx, dir, files, names, lib); err != nil {
			return nil, err
		}
		if err := os.WriteFile(stamp, []byte(sum), 0o644); err != nil {
			return nil, fmt.Errorf("emulator build stamp: %w", err)
		}
	}
	e, err := Load(lib)
	if err != nil || len(extra.Kernels) == 0 {
		return e, err
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	m := map[string]cuda.Kernel{}
	if old := e.extra.Load(); old != nil {
		maps.Copy(m, *old)
	}
	for _, k := range extra.Kernels {
		m[k.Name] = k
	}
	e.extra.Store(&m)
	return e, nil
}

// buildFiles are the sources of the emulator library: the shim, the
// prelude, the kernel files and the dispatch with a unit that includes
// them in order.
func buildFiles(extra Extra) (map[string]string, error) {
	srcs, err := cuda.Sources()
	if err != nil {
		return nil, err
	}
	dispatch, err := Dispatch(append(cuda.Kernels(), extra.Kernels...))
	if err != nil {
		return nil, err
	}
	files := map[string]string{"emu.h": shimHeader, "emu.cpp": shimRuntime, cuda.PreludeFile: cuda.Prelude()}
	var unit strings.Builder
	unit.WriteString("// The emulator's kernel unit: shim, prelude, kernels, dispatch.\n")
	unit.WriteString("#include \"emu.h\"\n#include \"" + cuda.PreludeFile + "\"\n")
	for _, n := range cuda.SourceFiles() {
		files[n] = srcs[n]
		fmt.Fprintf(&unit, "#include %q\n", n)
	}
	if extra.Source != "" {
		files["extra.cu"] = extra.Source
		unit.WriteString("#include \"extra.cu\"\n")
	}
	files["dispatch.inc"] = dispatch
	unit.WriteString("#include \"dispatch.inc\"\n")
	files["kernels_emu.cpp"] = unit.String()
	return files, nil
}

// compile writes the sources into dir and runs g++, writing the library
// under a temporary name first so a concurrent loader never sees half of
// it.
func compile(gxx, dir string, files map[string]string, names []string, lib string) error {
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(files[n]), 0o644); err != nil {
			return fmt.Errorf("writing emulator source %s: %w", n, err)
		}
	}
	tmp, err := os.CreateTemp(dir, LibraryName+".*.tmp")
	if err != nil {
		return fmt.Errorf("emulator build: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	args := append(append([]string(nil), CompilerFlags...), "-o", tmp.Name(), "emu.cpp", "kernels_emu.cpp")
	cmd := exec.Command(gxx, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("compiling the kernels with g++ in %s: %w\n%s", dir, err, out)
	}
	if err := os.Rename(tmp.Name(), lib); err != nil {
		return fmt.Errorf("emulator build: %w", err)
	}
	return nil
}

// Load opens a library built by Build.
func Load(lib string) (*Emu, error) {
	abs, err := filepath.Abs(lib)
	if err != nil {
		return nil, fmt.Errorf("emulator library path: %w", err)
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	if e, ok := loaded[abs]; ok {
		return e, nil
	}
	h, err := purego.Dlopen(abs, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("loading the emulator %s: %w", abs, err)
	}
	e := &Emu{path: abs}
	sym, err := purego.Dlsym(h, LaunchSymbol)
	if err != nil {
		return nil, fmt.Errorf("emulator %s has no %s: %w", abs, LaunchSymbol, err)
	}
	purego.RegisterFunc(&e.launch, sym)
	loaded[abs] = e
	return e, nil
}

// Launch runs a kernel of the table under emulation. args follow the
// kernel's parameters: a pointer parameter takes a slice of the matching
// element type ([]float32, []int32, []uint8, []uint16, or []int64 for const long
// long*), a long long takes int or int64, an int takes int or int32, a
// float takes float32. Slices are pinned for the call; the kernel may
// touch only len(slice) elements of each, so pass exact lengths.
func (e *Emu) Launch(name string, grid, block [3]uint32, shmem uint32, args ...any) error {
	k, ok := cuda.Lookup(name)
	if extra := e.extra.Load(); !ok && extra != nil {
		k, ok = (*extra)[name]
	}
	if !ok {
		return fmt.Errorf("launch %s: %w", name, StatusUnknownKernel)
	}
	if len(args) != len(k.Params) {
		return fmt.Errorf("launch %s: %d arguments for %d parameters", name, len(args), len(k.Params))
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	// One 8-byte cell per argument holds its value; params point at the
	// cells, as cuLaunchKernel's kernelParams point at each value.
	cells := make([]uint64, max(len(args), 1))
	params := make([]unsafe.Pointer, max(len(args), 1))
	pin.Pin(&cells[0])
	pin.Pin(&params[0])
	for i, a := range args {
		p := k.Params[i]
		v, err := cell(p, a, &pin)
		if err != nil {
			return fmt.Errorf("launch %s: argument %d (%s %s): %w", name, i, p.Type, p.Name, err)
		}
		cells[i] = v
		params[i] = unsafe.Pointer(&cells[i])
	}
	rc := e.launch(name, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, unsafe.Pointer(&params[0]))
	runtime.KeepAlive(args)
	if rc != 0 {
		return fmt.Errorf("launch %s grid %v block %v: %w", name, grid, block, Status(rc))
	}
	return nil
}

// cell encodes one argument as the bytes the kernel's parameter holds.
func cell(p cuda.Param, a any, pin *runtime.Pinner) (uint64, error) {
	ptr := func(base unsafe.Pointer, n int) uint64 {
		if n == 0 {
			return 0
		}
		pin.Pin(base)
		return uint64(uintptr(base))
	}
	switch p.Type {
	case cuda.F32Out, cuda.F32In:
		if s, ok := a.([]float32); ok {
			return ptr(unsafe.Pointer(unsafe.SliceData(s)), len(s)), nil
		}
	case cuda.I32Out, cuda.I32In:
		if s, ok := a.([]int32); ok {
			return ptr(unsafe.Pointer(unsafe.SliceData(s)), len(s)), nil
		}
	case cuda.U8Out, cuda.U8In:
		if s, ok := a.([]uint8); ok {
			return ptr(unsafe.Pointer(unsafe.SliceData(s)), len(s)), nil
		}
	case cuda.U16Out, cuda.U16In:
		if s, ok := a.([]uint16); ok {
			return ptr(unsafe.Pointer(unsafe.SliceData(s)), len(s)), nil
		}
	case cuda.I64In:
		if s, ok := a.([]int64); ok {
			return ptr(unsafe.Pointer(unsafe.SliceData(s)), len(s)), nil
		}
	case cuda.Size:
		switch v := a.(type) {
		case int:
			return uint64(int64(v)), nil
		case int64:
			return uint64(v), nil
		}
	case cuda.Int:
		switch v := a.(type) {
		case int:
			if v < math.MinInt32 || v > math.MaxInt32 {
				return 0, fmt.Errorf("%d does not fit an int", v)
			}
			return uint64(uint32(int32(v))), nil
		case int32:
			return uint64(uint32(v)), nil
		}
	case cuda.F32Value:
		if v, ok := a.(float32); ok {
			return uint64(math.Float32bits(v)), nil
		}
	default:
		return 0, fmt.Errorf("parameter type %q is not supported", p.Type)
	}
	return 0, fmt.Errorf("got %T", a)
}
