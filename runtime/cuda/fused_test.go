package cuda

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/codegen"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// withFuse is c compiled with the fuse pass on.
func withFuse(c config) config {
	edit := c.edit
	c.edit = func(o *passes.Options) {
		if edit != nil {
			edit(o)
		}
		o.Fuse = true
	}
	c.name += "_fuse"
	return c
}

// tinyRecompute is the tiny GPT under full recompute, where the fuse pass
// finds two bodies: bias add + residual add, and bias add + GELU.
var tinyRecompute = config{name: "tiny_recompute", set: tiny.set, batch: tiny.batch, edit: func(o *passes.Options) { o.Recompute = "full" }}

// Every fused instruction launches the kernel codegen names after its
// body, and the device keeps one kernel per distinct body however many
// instructions share it.
func TestFusedInstructionsLaunchTheirBodysKernel(t *testing.T) {
	progs := programs(t, withFuse(tinyRecompute))
	plan, _, err := Plan(progs, 0)
	require.NoError(t, err)
	bodies := map[string]bool{}
	fused := 0
	for i, in := range progs[0].Instrs {
		if in.Op != ir.FusedOp {
			continue
		}
		fused++
		body, err := ir.ParseFusedBody(in.Attrs.Str("body"), len(in.Args))
		require.NoError(t, err)
		bodies[codegen.CUDAName(body, len(in.Args))] = true
		require.NotEmpty(t, plan[i].Steps)
		assert.True(t, strings.HasPrefix(plan[i].Steps[0], codegen.CUDAName(body, len(in.Args))+"<<<"), "%v", plan[i].Steps)
		assert.Empty(t, strayKernels(plan[i]))
	}
	require.Len(t, bodies, 2, "the test model has two bodies")
	assert.Greater(t, fused, len(bodies), "some body is shared by several instructions")
	d := planDevice(t, progs)
	assert.Len(t, d.generated, len(bodies), "one kernel per distinct body")
	for name := range bodies {
		assert.Contains(t, d.generated, name)
	}
}

// A fused instruction the backend cannot run is an error at load naming
// the instruction: bodies that do not parse (an op that cannot be fused,
// an attribute missing, an argument that does not exist) and arguments of
// another size than the result.
func TestFusedInstructionErrors(t *testing.T) {
	progs := programs(t, withFuse(config{name: "tiny", set: tiny.set, batch: tiny.batch}))
	i := slices.IndexFunc(progs[0].Instrs, func(in lower.Instr) bool { return in.Op == ir.FusedOp })
	require.GreaterOrEqual(t, i, 0)
	edit := func(f func(in *lower.Instr)) error {
		p := *progs[0]
		p.Instrs = slices.Clone(p.Instrs)
		in := p.Instrs[i]
		in.Attrs = ir.Attrs{"body": in.Attrs.Str("body")}
		in.ArgTypes = slices.Clone(in.ArgTypes)
		f(&in)
		p.Instrs[i] = in
		_, _, err := Plan([]*lower.Program{&p}, 0)
		if err != nil {
			assert.Contains(t, err.Error(), where(in)+": fused: ")
		}
		return err
	}
	require.NoError(t, edit(func(*lower.Instr) {}))
	assert.ErrorContains(t, edit(func(in *lower.Instr) { in.Attrs["body"] = "t0=scale a0 a1; t1=add t0 a2" }), "scale is not an elementwise op that can be fused")
	assert.ErrorContains(t, edit(func(in *lower.Instr) { in.Attrs["body"] = "t0=adam_m a0 a1; t1=add t0 a2" }), "adam_m needs attribute beta1")
	assert.ErrorContains(t, edit(func(in *lower.Instr) { in.Attrs["body"] = "t0=add a0 a5" }), "a5")
	assert.ErrorContains(t, edit(func(in *lower.Instr) {
		in.ArgTypes[1] = ir.Type{DType: ir.F32, Shape: ir.Shape{3}}
	}), "argument 1 has 3 elements")
}

// The GPT trains with fused kernels on the GPU exactly as without them:
// each fused kernel computes what its ops' kernels compute one after
// another, bit for bit, so losses, the held-out loss and every weight are
// identical; against the CPU backend the run differs only as the unfused
// one does. Loading the fused program again compiles nothing: its
// kernels are the runtime's already.
func TestFusedTrainsBitIdenticallyOnGPU(t *testing.T) {
	slow(t)
	rt := openTest(t)
	const steps = 1 // a step and an evaluation after its update
	plainProgs, fusedProgs := programs(t, tinyRecompute), programs(t, withFuse(tinyRecompute))
	require.Less(t, len(fusedProgs[0].Instrs), len(plainProgs[0].Instrs))
	train := func(progs []*lower.Program) (run, *Cluster) {
		cl, err := NewPipelineCluster(rt, progs, Options{})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, cl.Close()) })
		return trainOn(t, cl, progs, steps, tiny.batch), cl
	}
	plain, _ := train(plainProgs)
	builds := rt.genBuilds
	fused, cl := train(fusedProgs)
	assert.Equal(t, builds+1, rt.genBuilds, "one compilation for the program's fused kernels")
	assert.Equal(t, plain.losses, fused.losses, "losses bit for bit")
	assert.Equal(t, math.Float64bits(plain.eval), math.Float64bits(fused.eval), "held-out loss bit for bit")
	for name, w := range plain.params {
		require.Equal(t, len(w), len(fused.params[name]), name)
		for i := range w {
			require.Equal(t, math.Float64bits(w[i]), math.Float64bits(fused.params[name][i]), "%s[%d]: %v unfused, %v fused", name, i, w[i], fused.params[name][i])
		}
	}
	assert.Equal(t, fusedProgs[0].PeakBytes, cl.Devices[0].PeakBytes(), "measured peak equals predicted")

	ref, err := cpu.NewPipelineCluster(fusedProgs, cpu.Options{})
	require.NoError(t, err)
	want := trainOn(t, ref, fusedProgs, steps, tiny.batch)
	loss := relDiff(fused.eval, want.eval)
	for i := range want.losses {
		loss = max(loss, relDiff(fused.losses[i], want.losses[i]))
	}
	t.Logf("fused on the GPU vs the CPU backend's fused closures, %d steps: worst loss difference %.3g", steps, loss)
	assert.LessOrEqual(t, loss, tol(1e-6, 1e-4))

	again, err := NewPipelineCluster(rt, fusedProgs, Options{})
	require.NoError(t, err)
	assert.NoError(t, again.Close())
	assert.Equal(t, builds+1, rt.genBuilds, "the same bodies load from the runtime's kernels")
}

// fused16Program is one fused op over three dt values of 4×33 elements,
// its result written to the state "out".
func fused16Program(t *testing.T, dt, body string) *lower.Program {
	t.Helper()
	text := fmt.Sprintf(`gir 1
module "fused16"
%%0 = state : %[1]s[4,33] {name="a"}
%%1 = state : %[1]s[4,33] {name="b"}
%%2 = state : %[1]s[4,33] {name="c"}
%%3 = state : %[1]s[4,33] {name="out"}
%%4 = fused %%0, %%1, %%2 : %[1]s[4,33] {body=%[2]q}
update %%3 = %%4
`, dt, body)
	m, err := ir.Parse("fused16.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// A fused op on fp16 or bf16 buffers runs as the CPU backend runs it:
// operands widened to fp32, the body's kernel, one rounding of the result
// to nearest even. For a body of exactly rounded ops the bits match the
// CPU's; fp32 is checked too.
func TestFused16BitMatchesCPU(t *testing.T) {
	rt := openTest(t)
	const body = "t0=mul a0 a1; t1=add t0 a2; t2=relu t1; t3=sub t2 a0"
	for _, dt := range []string{"f32", "bf16", "f16"} {
		t.Run(dt, func(t *testing.T) {
			p := fused16Program(t, dt, body)
			plan, _, err := Plan([]*lower.Program{p}, 0)
			require.NoError(t, err)
			steps := strings.Join(plan[slices.IndexFunc(p.Instrs, func(in lower.Instr) bool { return in.Op == ir.FusedOp })].Steps, " ")
			assert.Contains(t, steps, "gc_fused_")
			if dt != "f32" {
				assert.Contains(t, steps, "_to_f32<<<", "16-bit operands are widened")
			}
			ref, err := cpu.Load(p, cpu.Options{})
			require.NoError(t, err)
			d, err := Load(rt, p, Options{})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, d.Close()) })
			r := rand.New(rand.NewPCG(3, 9))
			for _, name := range []string{"a", "b", "c"} {
				v := make([]float64, 4*33)
				for i := range v {
					v[i] = r.NormFloat64() * 3
				}
				require.NoError(t, ref.SetFloat64s(name, v))
				require.NoError(t, d.SetFloat64s(name, v))
			}
			require.NoError(t, ref.Step())
			require.NoError(t, d.Step())
			want, _, err := ref.Bytes("out")
			require.NoError(t, err)
			got, _, err := d.Bytes("out")
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, got), "the result's bits differ from the CPU backend's")
			assert.NotEqual(t, make([]byte, len(want)), want)
		})
	}
}
