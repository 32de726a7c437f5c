package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
	"gcompile/lower"
	"gcompile/runtime/cpu"
)

// notHandedToBackends are the non-source ops of the IR that lowering
// never makes an instruction of, so no backend prepares them.
var notHandedToBackends = map[string]string{
	// lower.builder.value lets a reshape share its argument's buffer:
	// the elements do not move, so there is no instruction.
	"reshape": "lowering aliases the argument's buffer",
	// The redistribute pass is Required and expands every redistribute
	// op into the collectives below before lowering runs.
	"redistribute": "the redistribute pass expands it into collectives",
}

// notYet are ops lowering does hand a backend that this backend refuses
// with an error at load. Registering one of them must remove it here.
var notYet = map[string]string{}

// generatedOps run on kernels written at load rather than kernels of the
// table: a fused op's kernel is codegen's, one per body (fused.go).
var generatedOps = map[string]string{
	ir.FusedOp: "codegen.CUDA writes one kernel per body",
}

// loweringOps are the ops lowering adds that are not in the IR's op
// table: pipeline transfers and buffer copies (offload, in-place updates).
var loweringOps = []string{"send", "recv", "copy"}

// The backend runs every op a lowered program can hold: every op of the
// IR except the sources (buffers, not instructions), the ones lowering
// never emits and the ones not supported yet, plus the ops lowering adds.
// It registers nothing else.
func TestHasOpCoversTheIR(t *testing.T) {
	require.NoError(t, registryErr)
	for _, op := range ir.OpNames() {
		info, ok := ir.Lookup(op)
		require.True(t, ok, op)
		switch {
		case info.Source:
			assert.False(t, HasOp(op), "%s is a source: lowering gives it a buffer, not an instruction", op)
		case notHandedToBackends[op] != "":
			assert.False(t, HasOp(op), "%s: %s", op, notHandedToBackends[op])
		case notYet[op] != "":
			assert.False(t, HasOp(op), "%s is registered: remove it from notYet", op)
		default:
			assert.True(t, HasOp(op), "the cuda backend has no preparation for %s", op)
		}
	}
	for _, op := range loweringOps {
		assert.True(t, HasOp(op), op)
	}
	for op := range notHandedToBackends {
		_, ok := ir.Lookup(op)
		assert.True(t, ok, "%s is no longer an IR op", op)
	}
	for _, op := range Ops() {
		_, inIR := ir.Lookup(op)
		assert.True(t, inIR || slices.Contains(loweringOps, op), "%s is registered but neither an IR op nor one lowering adds", op)
	}
	assert.True(t, slices.IsSorted(Ops()))
}

// The exclusions above are real: lowering the test GPT, which reshapes
// its activations and, under tensor parallelism, redistributes them,
// leaves no instruction of an excluded op.
func TestLoweringEmitsNoExcludedOp(t *testing.T) {
	for _, c := range []config{{name: "fp32"}, {name: "tp2", mesh: tp2}, {name: "pp2", mesh: pp2, pp: 2, micro: 2}} {
		for _, p := range programs(t, c) {
			for _, in := range p.Instrs {
				assert.Empty(t, notHandedToBackends[in.Op], "%s: %s holds a %s instruction", c, p.Name, in.Op)
				assert.True(t, HasOp(in.Op), "%s: %s", c, in.Op)
			}
		}
	}
}

// Every registered op runs on kernels of package kernels/cuda's table,
// or on none of them (kcuda.Elsewhere says what runs it instead).
func TestRegisteredOpsHaveKernels(t *testing.T) {
	for _, op := range Ops() {
		if generatedOps[op] != "" {
			_, ok := kcuda.KernelsFor(op)
			assert.False(t, ok, "%s runs on generated kernels but has kernels in the table", op)
			continue
		}
		ks, ok := kcuda.KernelsFor(op)
		_, elsewhere := kcuda.Elsewhere[op]
		if !assert.True(t, ok || elsewhere, "%s has neither kernels in the table nor an entry in Elsewhere", op) {
			continue
		}
		assert.False(t, ok && elsewhere, "%s is both in the kernel table and in Elsewhere", op)
		for _, k := range ks.Kernels {
			_, ok := kcuda.Lookup(k)
			assert.True(t, ok, "%s: kernel %s is not in the kernel table", op, k)
		}
	}
	for _, op := range kcuda.Ops() {
		assert.True(t, HasOp(op), "the kernel table has kernels for %s, which the backend does not run", op)
	}
	for op := range kcuda.Elsewhere {
		assert.True(t, HasOp(op), "Elsewhere names %s, which the backend does not run", op)
	}
}

// launched matches the kernel a launch plan step names.
var launched = regexp.MustCompile(`^(gc_\w+)<<<`)

// piecesKernels cut and join the blocks the flat collectives move.
var piecesKernels = []string{"gc_slice", "gc_concat_piece"}

// strayKernels are the kernels a planned instruction launches that are
// neither ones the kernel table gives its op nor ones every op may add:
// the 16-bit conversions of the emulation and the Scale of a mean over
// device-local rows; collectives also cut and join pieces.
func strayKernels(p InstrPlan) []string {
	own, _ := kcuda.KernelsFor(p.Op)
	collective := ir.Collectives[p.Op] || p.Op == "shard_slice"
	var stray []string
	for _, s := range p.Steps {
		m := launched.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		k := m[1]
		fused := p.Op == ir.FusedOp && strings.HasPrefix(k, "gc_fused_")
		if !slices.Contains(own.Kernels, k) && !slices.Contains(kcuda.Sixteen, k) && k != kcuda.InstrScale &&
			!(collective && slices.Contains(piecesKernels, k)) && !fused {
			stray = append(stray, k)
		}
	}
	return stray
}

func TestStrayKernels(t *testing.T) {
	for _, tc := range []struct {
		plan InstrPlan
		want []string
	}{
		{InstrPlan{Op: "add", Steps: []string{"gc_add<<<4, 32>>>", "gc_scale_by<<<4, 32>>>"}}, nil},
		{InstrPlan{Op: "add", Steps: []string{"gc_bf16_to_f32<<<4, 32>>>", "gc_sub<<<4, 32>>>"}}, []string{"gc_sub"}},
		{InstrPlan{Op: "all_gather", Steps: []string{"all_gather over devices [0 1]", "gc_concat_piece<<<1, 32>>>"}}, nil},
		{InstrPlan{Op: "matmul", Steps: []string{"gc_slice<<<1, 32>>>"}}, []string{"gc_slice"}},
		{InstrPlan{Op: "copy", Steps: []string{"copy 64 bytes device→device"}}, nil},
		{InstrPlan{Op: ir.FusedOp, Steps: []string{"gc_fused_0123456789abcdef<<<4, 32>>>", "body t0=add a0 a1"}}, nil},
		{InstrPlan{Op: "add", Steps: []string{"gc_fused_0123456789abcdef<<<4, 32>>>"}}, []string{"gc_fused_0123456789abcdef"}},
	} {
		assert.Equal(t, tc.want, strayKernels(tc.plan), "%+v", tc.plan)
	}
}

// A second registration of an op is an error, and so is one without a
// name or a preparation; the backend's own registrations made none.
func TestRegisterTwiceIsAnError(t *testing.T) {
	require.NoError(t, registryErr)
	r := newRegistry()
	p := func(*compiler) (func() error, error) { return func() error { return nil }, nil }
	require.NoError(t, r.add("op", p))
	assert.ErrorContains(t, r.add("op", p), "op op registered twice")
	assert.Error(t, r.add("", p))
	assert.Error(t, r.add("other", nil))
	assert.Equal(t, []string{"op"}, r.names())
	_, ok := r.lookup("other")
	assert.False(t, ok)
}

// An instruction whose op has no preparation fails at load with an error
// naming the instruction and the op.
func TestUnregisteredOpFailsAtLoad(t *testing.T) {
	progs := programs(t, config{name: "fp32"})
	for _, op := range []string{"no_such_op", "reshape"} {
		p := *progs[0]
		p.Instrs = slices.Clone(p.Instrs)
		i := slices.IndexFunc(p.Instrs, func(in lower.Instr) bool { return in.Op == "gelu" })
		require.GreaterOrEqual(t, i, 0)
		p.Instrs[i].Op = op
		_, _, err := Plan([]*lower.Program{&p}, 0)
		require.Error(t, err, op)
		assert.Contains(t, err.Error(), where(p.Instrs[i])+": "+op+": the cuda backend has no kernel for op "+op)
		_, err = Load(planningRuntime(), &p, Options{})
		assert.ErrorContains(t, err, "no kernel for op "+op)
	}
}

// llamaProgram lowers the Llama family's ops (SiLU, RMSNorm, RoPE and
// their gradients) over x, gamma and dy of dtype dt, each result written
// to a state of its op's name; theta is the forward RoPE's base.
func llamaProgram(t *testing.T, dt string, theta float64) *lower.Program {
	t.Helper()
	x := dt + "[2,3,5,8]" // batch, heads, positions, head size
	text := fmt.Sprintf(`gir 1
module "llama_ops"
%%0 = state : %[1]s {name="x"}
%%1 = state : %[2]s[8] {name="gamma"}
%%2 = state : %[1]s {name="dy"}
%%3 = state : %[1]s {name="silu"}
%%4 = state : %[1]s {name="silu_grad"}
%%5 = state : %[1]s {name="rmsnorm"}
%%6 = state : %[1]s {name="rmsnorm_grad_x"}
%%7 = state : %[2]s[8] {name="rmsnorm_grad_gamma"}
%%8 = state : %[1]s {name="rope"}
%%9 = state : %[1]s {name="rope_inverse"}
%%10 = silu %%0 : %[1]s
%%11 = silu_grad %%0, %%2 : %[1]s
%%12 = rmsnorm %%0, %%1 : %[1]s {eps=1e-05}
%%13 = rmsnorm_grad_x %%0, %%1, %%2 : %[1]s {eps=1e-05}
%%14 = rmsnorm_grad_gamma %%0, %%2 : %[2]s[8] {eps=1e-05}
%%15 = rope %%0 : %[1]s {theta=%[3]s}
%%16 = rope %%0 : %[1]s {theta=500000 inverse=true}
update %%3 = %%10
update %%4 = %%11
update %%5 = %%12
update %%6 = %%13
update %%7 = %%14
update %%8 = %%15
update %%9 = %%16
`, x, dt, strconv.FormatFloat(theta, 'g', -1, 64))
	m, err := ir.Parse("llama.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// The Llama ops run on the backend as on the CPU's: their registrations
// pass the operands, sizes and attributes in the kernels' order (RoPE's
// positions from shape[-2] with two leading dims, its inverse flag), the
// γ gradient gets its workspace, and 16-bit buffers are widened around
// the fp32 kernels. f32 results are within 1e-6·(1 + |want|) of the CPU
// backend's (the kernels' own bounds, in kernels/cuda's tests, are
// tighter); bf16 within one bf16 ulp (2⁻⁷ relative) where a last-bit
// float32 difference rounds the other way.
func TestLlamaOpsMatchCPU(t *testing.T) {
	rt := openTest(t)
	names := []string{"silu", "silu_grad", "rmsnorm", "rmsnorm_grad_x", "rmsnorm_grad_gamma", "rope", "rope_inverse"}
	for _, dt := range []string{"f32", "bf16"} {
		t.Run(dt, func(t *testing.T) {
			p := llamaProgram(t, dt, 10000)
			plan, _, err := Plan([]*lower.Program{p}, 0)
			require.NoError(t, err)
			for _, ip := range plan {
				assert.Empty(t, strayKernels(ip), "%s launches kernels the kernel table does not give it", ip.Op)
				if ip.Op == "rmsnorm_grad_gamma" {
					steps := strings.Join(ip.Steps, " ")
					assert.Contains(t, steps, "gc_rmsnorm_stats<<<")
					assert.Contains(t, steps, "gc_rmsnorm_grad_gamma<<<")
				}
			}
			ref, err := cpu.Load(p, cpu.Options{})
			require.NoError(t, err)
			d, err := Load(rt, p, Options{})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, d.Close()) })
			r := rand.New(rand.NewPCG(5, 8))
			inputs := map[string]int{"x": 2 * 3 * 5 * 8, "gamma": 8, "dy": 2 * 3 * 5 * 8}
			for name, n := range inputs {
				v := make([]float64, n)
				for i := range v {
					v[i] = r.NormFloat64() * 2
				}
				require.NoError(t, ref.SetFloat64s(name, v))
				require.NoError(t, d.SetFloat64s(name, v))
			}
			require.NoError(t, ref.Step())
			require.NoError(t, d.Step())
			for _, name := range names {
				want, err := ref.Float64s(name)
				require.NoError(t, err)
				got, err := d.Float64s(name)
				require.NoError(t, err)
				require.Len(t, got, len(want))
				require.NotEqual(t, make([]float64, len(want)), want, "%s: the CPU computed nothing", name)
				worst := 0.0
				for i := range want {
					bound := 1e-6 * (1 + math.Abs(want[i]))
					if dt == "bf16" {
						bound = math.Abs(want[i])/(1<<7) + 1e-6
					}
					require.LessOrEqual(t, math.Abs(got[i]-want[i]), bound, "%s[%d]: %v, the CPU's %v", name, i, got[i], want[i])
					worst = max(worst, math.Abs(got[i]-want[i]))
				}
				t.Logf("%s: largest difference %.3g", name, worst)
			}
			rope, err := d.Float64s("rope")
			require.NoError(t, err)
			x, err := d.Float64s("x")
			require.NoError(t, err)
			assert.Equal(t, x[:8], rope[:8], "position 0 is not rotated")
			assert.NotEqual(t, x[8:16], rope[8:16], "position 1 is")
		})
	}
}

// RoPE's kernel takes theta as a float: a base float32 cannot hold is a
// load error, not a rotation by other angles than the CPU backend's.
func TestRoPERefusesThetaInexactInFloat32(t *testing.T) {
	_, _, err := Plan([]*lower.Program{llamaProgram(t, "f32", 10000.1)}, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "theta 10000.1 is not exact in float32")
}
