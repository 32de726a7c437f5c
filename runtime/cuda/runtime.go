package cuda

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"

	kcuda "gcompile/kernels/cuda"
	"gcompile/runtime/cuda/cublaslt"
	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/nccl"
	"gcompile/runtime/cuda/nvrtc"
)

// Config chooses the GPU a Runtime drives and where it finds its
// libraries and keeps compiled kernels.
type Config struct {
	// Ordinal is the GPU (0 is the first visible one).
	Ordinal int
	// CacheDir holds compiled kernels; "" is nvrtc.DefaultDir()
	// ($GCOMPILE_CACHE, else the user cache folder).
	CacheDir string
	// Search finds the libraries; nil is dl.DefaultSearch(), which
	// honours GCOMPILE_LIBCUDA, GCOMPILE_LIBNVRTC, GCOMPILE_LIBCUBLASLT
	// and GCOMPILE_LIBNCCL.
	Search *dl.Search
	// Launch bounds kernel launch geometry; the zero value suits a GPU.
	Launch Launch
}

// Launch bounds the geometry of kernel launches. Every kernel works for
// any block size that is a multiple of 32 and any grid (grid-stride and
// row loops cover the rest), so these trade parallelism for per-block
// overhead: on a GPU the defaults keep every SM busy; the CPU emulator of
// the kernels runs each thread of a block on an OS thread, and is fastest
// with one warp per block and a few blocks.
type Launch struct {
	// Threads is the most threads per block (a multiple of 32, at most
	// 1024); 0 means 256.
	Threads int
	// Blocks is the most blocks per launch; 0 means a few per SM.
	Blocks int
}

// LaunchEnv, when Config.Launch is left zero, bounds the launch geometry
// as "THREADSxBLOCKS" (e.g. 32x4): what suits the kernel emulator of the
// stand-in GPU, for runs started by a command line rather than a test.
const LaunchEnv = "GCOMPILE_CUDA_LAUNCH"

// launchFromEnv reads LaunchEnv's value; "" is the zero Launch.
func launchFromEnv(v string) (Launch, error) {
	if v == "" {
		return Launch{}, nil
	}
	t, b, ok := strings.Cut(v, "x")
	threads, err1 := strconv.Atoi(t)
	blocks, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || threads <= 0 || blocks <= 0 {
		return Launch{}, fmt.Errorf("%s=%q: want THREADSxBLOCKS, e.g. 32x4", LaunchEnv, v)
	}
	return Launch{Threads: threads, Blocks: blocks}, nil
}

// KernelSourceName is the name NVRTC gives the kernels' translation unit
// in its messages and the cache in its key.
const KernelSourceName = "gcompile_kernels.cu"

// kernelOptions are the NVRTC options the kernels are compiled with:
// no fast-math, IEEE division and square roots (NVRTC's defaults), which
// the kernels' precision notes assume. NVRTC contracts a·b + c into one
// FMA by default (--fmad=true), a single rounding where the CPU kernels
// and the emulator (-ffp-contract=off) round twice: the kernels that
// mirror a CPU kernel's float32 arithmetic would then differ from it in
// the last bit, so contraction is turned off.
var kernelOptions = []string{"--std=c++17", "--fmad=false"}

// Runtime is one GPU made ready to run programs: the driver, its primary
// context, the kernels compiled for its architecture and loaded as a
// module, and cuBLASLt. NCCL is loaded only when a cluster asks for it.
// Devices (virtual devices on this GPU) are loaded onto a Runtime.
//
// A planning Runtime (see Plan) has no driver: it plans programs exactly
// as a real one does, which is how launch plans are checked without a GPU.
type Runtime struct {
	cfg    Config
	search dl.Search
	drv    *driver.Driver
	nv     *nvrtc.NVRTC
	lt     *cublaslt.Lt
	dev    driver.Device
	ctx    driver.Context
	props  driver.DeviceProps
	mod    driver.Module
	fns    map[string]driver.Function

	// Kernels generated at load (fused ops' bodies), by name, the modules
	// they were loaded in, and how many compilations made them.
	genMu     sync.Mutex
	genFns    map[string]driver.Function
	genMods   []driver.Module
	genBuilds int

	ncclOnce sync.Once
	nccl     *nccl.NCCL
	ncclErr  error
}

// Open loads the driver, NVRTC and cuBLASLt, retains the primary context
// of the configured GPU, compiles the kernels of package kernels/cuda for
// its architecture (through the NVRTC disk cache) and looks up every
// kernel. A missing library is the bindings' error, which names every
// place that was searched and the variable that overrides the search.
func Open(cfg Config) (rt *Runtime, err error) {
	s := dl.DefaultSearch()
	if cfg.Search != nil {
		s = *cfg.Search
	}
	if t := cfg.Launch.Threads; t < 0 || t > 1024 || t%32 != 0 {
		return nil, fmt.Errorf("cuda backend: %d threads per block: want a multiple of 32 up to 1024", t)
	}
	if cfg.Launch.Blocks < 0 {
		return nil, fmt.Errorf("cuda backend: at most %d blocks per launch: want a positive bound", cfg.Launch.Blocks)
	}
	if cfg.Launch == (Launch{}) {
		if cfg.Launch, err = launchFromEnv(os.Getenv(LaunchEnv)); err != nil {
			return nil, fmt.Errorf("cuda backend: %w", err)
		}
	}
	rt = &Runtime{cfg: cfg, search: s}
	if rt.drv, err = driver.LoadFrom(s); err != nil {
		return nil, fmt.Errorf("cuda backend: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, rt.Close())
			rt = nil
		}
	}()
	if rt.nv, err = nvrtc.LoadFrom(s); err != nil {
		return rt, fmt.Errorf("cuda backend: %w", err)
	}
	if rt.lt, err = cublaslt.LoadFrom(s); err != nil {
		return rt, fmt.Errorf("cuda backend: %w", err)
	}
	if err := rt.drv.Init(); err != nil {
		return rt, fmt.Errorf("cuda backend: %w", err)
	}
	n, err := rt.drv.DeviceCount()
	if err != nil {
		return rt, fmt.Errorf("cuda backend: %w", err)
	}
	if cfg.Ordinal < 0 || cfg.Ordinal >= n {
		return rt, fmt.Errorf("cuda backend: GPU %d asked for, %d visible", cfg.Ordinal, n)
	}
	if rt.dev, err = rt.drv.Device(cfg.Ordinal); err != nil {
		return rt, fmt.Errorf("cuda backend: %w", err)
	}
	if rt.props, err = rt.drv.Props(rt.dev); err != nil {
		return rt, fmt.Errorf("cuda backend: GPU %d: %w", cfg.Ordinal, err)
	}
	ctx, err := rt.drv.PrimaryCtxRetain(rt.dev)
	if err != nil {
		return rt, fmt.Errorf("cuda backend: GPU %d: %w", cfg.Ordinal, err)
	}
	rt.ctx = ctx
	leave, err := rt.enter()
	if err != nil {
		return rt, err
	}
	defer leave()
	if err := rt.loadKernels(); err != nil {
		return rt, err
	}
	return rt, nil
}

// VisibleGPUs is the number of GPUs the driver shows this process
// (CUDA_VISIBLE_DEVICES, or a launcher's binding of GPUs to tasks,
// applies). A missing driver is the bindings' error, naming every place
// searched.
func VisibleGPUs(cfg Config) (int, error) {
	s := dl.DefaultSearch()
	if cfg.Search != nil {
		s = *cfg.Search
	}
	drv, err := driver.LoadFrom(s)
	if err != nil {
		return 0, fmt.Errorf("cuda backend: %w", err)
	}
	if err := drv.Init(); err != nil {
		return 0, fmt.Errorf("cuda backend: %w", err)
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return 0, fmt.Errorf("cuda backend: %w", err)
	}
	return n, nil
}

// GPUName is the name the driver gives GPU ordinal ("NVIDIA H100 80GB
// HBM3"), read without creating a context: the planner picks the cost
// model's preset by it before any GPU is opened.
func GPUName(cfg Config, ordinal int) (string, error) {
	s := dl.DefaultSearch()
	if cfg.Search != nil {
		s = *cfg.Search
	}
	drv, err := driver.LoadFrom(s)
	if err != nil {
		return "", fmt.Errorf("cuda backend: %w", err)
	}
	if err := drv.Init(); err != nil {
		return "", fmt.Errorf("cuda backend: %w", err)
	}
	dev, err := drv.Device(ordinal)
	if err != nil {
		return "", fmt.Errorf("cuda backend: %w", err)
	}
	name, err := drv.DeviceName(dev)
	if err != nil {
		return "", fmt.Errorf("cuda backend: %w", err)
	}
	return name, nil
}

// loadKernels compiles the kernel unit for the GPU's architecture (or
// takes it from the cache), loads it and finds every kernel of the table.
func (rt *Runtime) loadKernels() error {
	src, err := kcuda.Program()
	if err != nil {
		return fmt.Errorf("cuda backend: %w", err)
	}
	cache, err := rt.nvrtcCache()
	if err != nil {
		return err
	}
	cubin, err := cache.Compile(nvrtc.Request{Name: KernelSourceName, Source: src, Arch: rt.props.Arch(), Options: kernelOptions})
	if err != nil {
		return fmt.Errorf("cuda backend: compiling the kernels for %s (%s): %w", rt.props.Name, rt.props.Arch(), err)
	}
	if rt.mod, err = rt.drv.ModuleLoadData(cubin); err != nil {
		return fmt.Errorf("cuda backend: loading the kernels for %s: %w", rt.props.Arch(), err)
	}
	rt.fns = map[string]driver.Function{}
	for _, k := range kcuda.Kernels() {
		f, err := rt.drv.ModuleGetFunction(rt.mod, k.Name)
		if err != nil {
			return fmt.Errorf("cuda backend: %w", err)
		}
		rt.fns[k.Name] = f
	}
	return nil
}

// nvrtcCache is the NVRTC disk cache the runtime compiles through.
func (rt *Runtime) nvrtcCache() (*nvrtc.Cache, error) {
	version, err := rt.drv.Version()
	if err != nil {
		return nil, fmt.Errorf("cuda backend: %w", err)
	}
	dir := rt.cfg.CacheDir
	if dir == "" {
		if dir, err = nvrtc.DefaultDir(); err != nil {
			return nil, fmt.Errorf("cuda backend: %w", err)
		}
	}
	return &nvrtc.Cache{Dir: dir, Compiler: rt.nv, DriverVersion: version}, nil
}

// enter locks the calling goroutine to its OS thread and makes the
// runtime's context current there: the context is per thread, and a
// goroutine may otherwise move between calls. The returned function
// unlocks the thread.
func (rt *Runtime) enter() (func(), error) {
	if rt.drv == nil {
		return func() {}, nil
	}
	goruntime.LockOSThread()
	if err := rt.drv.SetCurrent(rt.ctx); err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("cuda backend: GPU %d: %w", rt.cfg.Ordinal, err)
	}
	return goruntime.UnlockOSThread, nil
}

// Name is the GPU's name, e.g. "NVIDIA H100 80GB HBM3".
func (rt *Runtime) Name() string { return rt.props.Name }

// Props are the GPU's properties.
func (rt *Runtime) Props() driver.DeviceProps { return rt.props }

// Ordinal is the GPU the runtime drives.
func (rt *Runtime) Ordinal() int { return rt.cfg.Ordinal }

// NCCL loads the NCCL library on first use.
func (rt *Runtime) NCCL() (*nccl.NCCL, error) {
	rt.ncclOnce.Do(func() {
		rt.nccl, rt.ncclErr = nccl.LoadFrom(rt.search)
		if rt.ncclErr != nil {
			rt.ncclErr = fmt.Errorf("cuda backend: %w", rt.ncclErr)
		}
	})
	return rt.nccl, rt.ncclErr
}

// Close unloads the kernels (the generated ones too), releases the
// context and closes the libraries. Devices loaded on the runtime must be closed first.
func (rt *Runtime) Close() error {
	if rt == nil || rt.drv == nil {
		return nil
	}
	var errs []error
	if rt.mod != 0 || len(rt.genMods) > 0 || rt.ctx != 0 {
		if leave, err := rt.enter(); err != nil {
			errs = append(errs, err)
		} else {
			for _, m := range rt.genMods {
				errs = append(errs, rt.drv.ModuleUnload(m))
			}
			rt.genMods, rt.genFns = nil, nil
			if rt.mod != 0 {
				errs = append(errs, rt.drv.ModuleUnload(rt.mod))
				rt.mod = 0
			}
			leave()
		}
	}
	if rt.ctx != 0 {
		errs = append(errs, rt.drv.PrimaryCtxRelease(rt.dev))
		rt.ctx = 0
	}
	// The libraries stay mapped: purego may keep references to their
	// symbols, and unloading a library that still has threads running
	// (NCCL's proxies, the driver's) is unsafe. dlclose is skipped on
	// purpose.
	return errors.Join(errs...)
}

// planningProps are the properties a zero-GPU runtime plans with: those
// of an H100 (SXM), which only the launch geometry depends on.
var planningProps = driver.DeviceProps{Name: "planning only (no GPU)", Major: 9, Minor: 0, SMs: 132, MaxThreadsPerBlock: 1024, WarpSize: 32}

// planningRuntime is a Runtime without a GPU: Load plans every
// instruction (kernels, launch geometry, GEMM shapes, collectives,
// workspace) and allocates nothing.
func planningRuntime() *Runtime { return &Runtime{props: planningProps} }
