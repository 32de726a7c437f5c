package cuda

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"gcompile/codegen"
	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/nvrtc"
)

// Fused ops (the fuse pass's groups of elementwise ops) run as one
// kernel each, which package codegen writes from the op's body: the
// expression of every op's own kernel, every intermediate rounded to
// float, so the result is the unfused kernels' bit for bit. 16-bit
// buffers go through the emulation like any fp32 kernel (widened, one
// rounding of the result), as the CPU backend runs a fused op on them.
func init() {
	register(onFP32(resultDType, (*compiler).fused), ir.FusedOp)
}

// FusedSourceName is the name NVRTC gives the translation unit of the
// fused kernels in its messages and the cache in its key.
const FusedSourceName = "gcompile_fused.cu"

// fused plans the generated kernel of the instruction's body: a
// grid-stride loop over the result's elements, every argument of the
// same count.
func (c *compiler) fused() (func() error, error) {
	in := c.in
	body, err := ir.ParseFusedBody(in.Attrs.Str("body"), len(in.Args))
	if err != nil {
		return nil, err
	}
	k, err := codegen.CUDA(body, len(in.Args))
	if err != nil {
		return nil, err
	}
	n := numel(c.outShape())
	args := []any{c.out()}
	for i := range in.Args {
		if m := numel(c.shape(i)); m != n {
			return nil, fmt.Errorf("argument %d has %d elements, the result %d", i, m, n)
		}
		args = append(args, c.arg(i))
	}
	args = append(args, n)
	l, err := c.generated(k.Entry(), args...)
	if err != nil {
		return nil, err
	}
	if c.d.generated == nil {
		c.d.generated = map[string]codegen.CUDAKernel{}
	}
	c.d.generated[k.Name] = k
	c.note("body " + body.String())
	return c.runs(l), nil
}

// fusedProgram is the NVRTC unit of fused kernels: the kernel program,
// whose helpers the kernels call (gc_gelu_halves, the grid-stride loop),
// then codegen's prelude and the kernels in name order. Sharing the
// helpers, not copying them, is what keeps each op's arithmetic the
// unfused kernel's.
func fusedProgram(ks []codegen.CUDAKernel) (string, error) {
	prog, err := kcuda.Program()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(prog)
	b.WriteString("\n#line 1 \"" + FusedSourceName + "\"\n")
	b.WriteString(codegen.CUDAPrelude)
	for _, k := range ks {
		b.WriteString(k.Source)
	}
	return b.String(), nil
}

// loadGenerated compiles the kernels of ks the runtime does not have yet
// into one module, through the NVRTC disk cache, and looks them up. A
// kernel is named after its body, so a body met again (in another
// instruction, device or program) reuses the kernel already loaded. The
// context must be current.
func (rt *Runtime) loadGenerated(ks map[string]codegen.CUDAKernel) error {
	if rt.drv == nil || len(ks) == 0 {
		return nil
	}
	rt.genMu.Lock()
	defer rt.genMu.Unlock()
	var missing []codegen.CUDAKernel
	for _, name := range slices.Sorted(maps.Keys(ks)) {
		if _, ok := rt.genFns[name]; !ok {
			missing = append(missing, ks[name])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	src, err := fusedProgram(missing)
	if err != nil {
		return fmt.Errorf("cuda backend: %w", err)
	}
	cache, err := rt.nvrtcCache()
	if err != nil {
		return err
	}
	cubin, err := cache.Compile(nvrtc.Request{Name: FusedSourceName, Source: src, Arch: rt.props.Arch(), Options: kernelOptions})
	if err != nil {
		return fmt.Errorf("cuda backend: compiling %d fused kernels for %s (%s): %w", len(missing), rt.props.Name, rt.props.Arch(), err)
	}
	mod, err := rt.drv.ModuleLoadData(cubin)
	if err != nil {
		return fmt.Errorf("cuda backend: loading the fused kernels for %s: %w", rt.props.Arch(), err)
	}
	rt.genMods = append(rt.genMods, mod)
	rt.genBuilds++
	if rt.genFns == nil {
		rt.genFns = map[string]driver.Function{}
	}
	for _, k := range missing {
		f, err := rt.drv.ModuleGetFunction(mod, k.Name)
		if err != nil {
			return fmt.Errorf("cuda backend: %w", err)
		}
		rt.genFns[k.Name] = f
	}
	return nil
}

// generatedFunction is a kernel loadGenerated has loaded.
func (rt *Runtime) generatedFunction(name string) (driver.Function, error) {
	rt.genMu.Lock()
	defer rt.genMu.Unlock()
	f, ok := rt.genFns[name]
	if !ok {
		return 0, fmt.Errorf("cuda backend: kernel %s was neither in the kernel table nor generated at load", name)
	}
	return f, nil
}
