package cuda

import (
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
	"gcompile/lower"
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
var notYet = map[string]string{
	// The CUDA program does not build the fused kernels codegen writes;
	// the CLI refuses --fuse with --backend cuda (tests/fuse_test.go).
	ir.FusedOp: "fused kernels are not compiled into the CUDA program",
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
		if !slices.Contains(own.Kernels, k) && !slices.Contains(kcuda.Sixteen, k) && k != kcuda.InstrScale &&
			!(collective && slices.Contains(piecesKernels, k)) {
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
	for _, op := range []string{"no_such_op", ir.FusedOp, "reshape"} {
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
