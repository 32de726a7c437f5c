package cuda_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/kernels/cuda"
	"gcompile/runtime/cpu"
)

var (
	lineComment  = regexp.MustCompile(`//[^\n]*`)
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	externKernel = regexp.MustCompile(`extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)`)
	anyGlobal    = regexp.MustCompile(`__global__`)
	space        = regexp.MustCompile(`\s+`)
)

// parseKernels reads every extern "C" __global__ signature of a source.
func parseKernels(t *testing.T, file, src string) []cuda.Kernel {
	t.Helper()
	src = blockComment.ReplaceAllString(lineComment.ReplaceAllString(src, ""), "")
	matches := externKernel.FindAllStringSubmatch(src, -1)
	require.Len(t, matches, len(anyGlobal.FindAllString(src, -1)), "%s: every __global__ function must be extern \"C\"", file)
	var ks []cuda.Kernel
	for _, m := range matches {
		k := cuda.Kernel{Name: m[1]}
		for _, p := range strings.Split(m[2], ",") {
			p = strings.TrimSpace(space.ReplaceAllString(p, " "))
			i := strings.LastIndexAny(p, " *")
			require.Positive(t, i, "%s: parameter %q of %s", file, p, k.Name)
			k.Params = append(k.Params, cuda.Param{Name: p[i+1:], Type: cuda.ParamType(strings.TrimSpace(p[:i+1]))})
		}
		ks = append(ks, k)
	}
	return ks
}

// The Go table describes every kernel in the sources exactly, and only
// those: names, parameter names and types, in order.
func TestTableMatchesSources(t *testing.T) {
	srcs, err := cuda.Sources()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, file := range cuda.SourceFiles() {
		src := srcs[file]
		assert.NotRegexp(t, `(?m)^\s*#\s*include`, src, "%s: kernels include no headers", file)
		for _, k := range parseKernels(t, file, src) {
			assert.False(t, seen[k.Name], "kernel %s defined twice", k.Name)
			seen[k.Name] = true
			want, ok := cuda.Lookup(k.Name)
			if !assert.True(t, ok, "%s: kernel %s is not in the table", file, k.Name) {
				continue
			}
			assert.Equal(t, k.Params, want.Params, "%s: signature of %s", file, k.Name)
		}
	}
	for _, k := range cuda.Kernels() {
		assert.True(t, seen[k.Name], "table entry %s has no kernel in the sources", k.Name)
	}
	prelude := blockComment.ReplaceAllString(lineComment.ReplaceAllString(cuda.Prelude(), ""), "")
	assert.NotRegexp(t, `(?m)^\s*#\s*include`, prelude, "the prelude includes no headers")
	assert.Empty(t, externKernel.FindAllString(prelude, -1), "the prelude defines no kernels")
}

// Parameter types come from the allowed set, outputs first, then inputs,
// then sizes and scalars; every kernel starts with an output.
func TestTableConventions(t *testing.T) {
	allowed := []cuda.ParamType{cuda.F32Out, cuda.F32In, cuda.I32Out, cuda.I32In, cuda.U8Out, cuda.U8In, cuda.U16Out, cuda.U16In, cuda.I64In, cuda.Size, cuda.Int, cuda.F32Value}
	for _, k := range cuda.Kernels() {
		require.True(t, strings.HasPrefix(k.Name, "gc_"), k.Name)
		require.NotEmpty(t, k.Params, k.Name)
		require.True(t, k.Params[0].Type.Output(), "%s: the first parameter is an output", k.Name)
		rank := func(p cuda.Param) int {
			switch {
			case p.Type.Output():
				return 0
			case p.Type.Pointer():
				return 1
			}
			return 2
		}
		for i, p := range k.Params {
			assert.Contains(t, allowed, p.Type, "%s: parameter %s", k.Name, p.Name)
			if i > 0 {
				assert.LessOrEqual(t, rank(k.Params[i-1]), rank(p), "%s: %s comes after %s", k.Name, p.Name, k.Params[i-1].Name)
			}
		}
		// Over names an extent built from the kernel's own size parameters.
		for _, f := range strings.Split(k.Over, "*") {
			if f == "1" {
				continue
			}
			i := slices.IndexFunc(k.Params, func(p cuda.Param) bool { return p.Name == f })
			if assert.GreaterOrEqual(t, i, 0, "%s: Over %q names %q", k.Name, k.Over, f) {
				assert.Contains(t, []cuda.ParamType{cuda.Size, cuda.Int}, k.Params[i].Type, "%s: %s is a size", k.Name, f)
			}
		}
	}
}

// Every op the CPU backend runs has a kernel here, or is named as run
// elsewhere (GEMM, copies, collectives); every op's kernels exist; and
// every kernel serves some op.
func TestEveryCPUOpHasKernels(t *testing.T) {
	// Fused ops have no kernel in the table: the CUDA backend generates
	// one per body (codegen.CUDA) when it loads a program.
	ops := slices.DeleteFunc(cpu.Kernels(), func(op string) bool { return op == ir.FusedOp })
	for _, op := range ops {
		if _, ok := cuda.Elsewhere[op]; ok {
			continue
		}
		_, ok := cuda.KernelsFor(op)
		assert.True(t, ok, "op %s runs on the CPU backend but has no CUDA kernel", op)
	}
	used := map[string]bool{cuda.InstrScale: true}
	for _, k := range append(cuda.Sixteen, cuda.Sums16...) {
		used[k] = true
	}
	for _, op := range cuda.Ops() {
		ok, _ := cuda.KernelsFor(op)
		require.NotEmpty(t, ok.Kernels, op)
		for _, name := range ok.Kernels {
			_, found := cuda.Lookup(name)
			assert.True(t, found, "op %s names unknown kernel %s", op, name)
			used[name] = true
		}
		assert.Contains(t, ops, op, "op %s has kernels but the CPU backend does not run it", op)
	}
	for _, k := range cuda.Kernels() {
		assert.True(t, used[k.Name], "kernel %s serves no op", k.Name)
	}
}

// Program has the prelude once and every kernel file after it.
func TestProgram(t *testing.T) {
	p, err := cuda.Program()
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(p, "gc_f16_from_f32(float f)"))
	for _, f := range cuda.SourceFiles() {
		assert.Contains(t, p, `#line 1 "`+f+`"`)
	}
	for _, k := range cuda.Kernels() {
		assert.Contains(t, p, " "+k.Name+"(")
	}
}
