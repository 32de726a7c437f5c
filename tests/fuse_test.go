package tests

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cuda"
	"gcompile/runtime/cuda/fakegpu"
)

// The GPT trains bit-identically with and without --fuse: the fused
// closures run the same kernels per element. Fusion removes instructions
// (each group's inner values) and never raises the predicted peak, and
// every device measures the peak the plan predicts.
func TestFuseTrainsBitIdentically(t *testing.T) {
	for _, p := range []plan{{dp: 1}, {tp: 2}, {dp: 2, zero: 1}, {micro: 4}, {dp: 1, recompute: "full"}, {model: "llama", tp: 2}} {
		name := p.String()
		if p.recompute != "" {
			name += "_recompute_" + p.recompute
		}
		t.Run(name, func(t *testing.T) {
			plain := train(t, p)
			p.fuse = true
			fused := train(t, p)

			groups, inner := 0, 0
			for _, in := range fused.prog.Instrs {
				if in.Op == ir.FusedOp {
					groups++
					body, err := ir.ParseFusedBody(in.Attrs.Str("body"), len(in.Args))
					require.NoError(t, err)
					inner += len(body) - 1
				}
			}
			require.Positive(t, groups, "the model has elementwise groups to fuse")
			assert.Equal(t, len(plain.prog.Instrs)-inner, len(fused.prog.Instrs), "each group saves its inner instructions")
			t.Logf("%d fused groups; instructions %d → %d; predicted peak %d → %d bytes",
				groups, len(plain.prog.Instrs), len(fused.prog.Instrs), plain.prog.PeakBytes, fused.prog.PeakBytes)

			assert.Equal(t, plain.losses, fused.losses, "losses bit for bit")
			assert.Equal(t, math.Float64bits(plain.eval), math.Float64bits(fused.eval), "held-out loss bit for bit")
			requireBitIdentical(t, plain.params, fused.params, "fused vs unfused")
			assert.LessOrEqual(t, fused.prog.PeakBytes, plain.prog.PeakBytes, "fusion never raises the peak")
			for r, peak := range fused.peaks {
				assert.Equal(t, fused.prog.PeakBytes, peak, "device %d: measured peak equals predicted", r)
			}
		})
	}
}

// On pipelines too: every rank's program trains bit-identically with
// fusion, has fewer instructions and no higher a predicted peak, which
// each device measures (runPipeline checks that).
func TestFusePipelineBitIdentical(t *testing.T) {
	for _, pl := range []pipePlan{{pp: 2, micro: 4, name: "1f1b"}, {pp: 2, micro: 4, name: "zb"}, {pp: 2, vpp: 2, micro: 4, name: "interleaved"}} {
		pl.order = scheduleOrder(pl.name)
		t.Run(pl.String(), func(t *testing.T) {
			m, progs, evals := compilePipeline(t, pl, 4, pipeSetup{})
			plain := runPipeline(t, m, progs, evals)
			fm, fprogs, fevals := compilePipeline(t, pl, 4, pipeSetup{edit: func(o *passes.Options) { o.Fuse = true }})
			fused := runPipeline(t, fm, fprogs, fevals)

			assert.Equal(t, plain.losses, fused.losses, "losses bit for bit")
			assert.Equal(t, math.Float64bits(plain.eval), math.Float64bits(fused.eval), "held-out loss bit for bit")
			requireBitIdentical(t, plain.params, fused.params, "fused vs unfused")
			require.Len(t, fprogs, len(progs))
			fewer := false
			for r := range progs {
				assert.LessOrEqual(t, fprogs[r].PeakBytes, progs[r].PeakBytes, "rank %d: fusion never raises the peak", r)
				assert.LessOrEqual(t, len(fprogs[r].Instrs), len(progs[r].Instrs), "rank %d", r)
				fewer = fewer || len(fprogs[r].Instrs) < len(progs[r].Instrs)
				t.Logf("rank %d: instructions %d → %d, predicted peak %d → %d bytes", r, len(progs[r].Instrs), len(fprogs[r].Instrs), progs[r].PeakBytes, fprogs[r].PeakBytes)
			}
			assert.True(t, fewer, "some rank has fused groups")
		})
	}
}

// The CLI trains with --fuse and prints the same losses as without it,
// on the CPU backend and on the CUDA backend (the fake GPU).
func TestFuseCLI(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: the go command is not on PATH to build the CLI")
	}
	bin := filepath.Join(t.TempDir(), "gcompile")
	build := exec.Command(goTool, "build", "-o", bin, "./cmd/gcompile")
	build.Dir = ".."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	args := []string{"../examples/gpt/model.go", "--run", "--steps", "3", "--batch", "8", "--set", "layers=1,hidden=32,heads=4,seq=16"}
	losses := func(extra ...string) []string {
		out, err := exec.Command(bin, append(slices.Clone(args), extra...)...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		var ls []string
		for _, m := range regexp.MustCompile(`step \d+/3 loss (\S+)`).FindAllStringSubmatch(string(out), -1) {
			ls = append(ls, m[1])
		}
		require.Len(t, ls, 3, "%s", out)
		return ls
	}
	plain := losses()
	assert.Equal(t, plain, losses("--fuse"))

	if testing.Short() {
		return
	}
	// One step on the fake GPU (seconds in the kernel emulator).
	libs := fakegpu.Install(t)
	gpuArgs := slices.Clone(args)
	gpuArgs[slices.Index(gpuArgs, "--steps")+1] = "1"
	cmd := exec.Command(bin, append(gpuArgs, "--fuse", "--backend", "cuda")...)
	cmd.Env = append(append(os.Environ(), libs.Env()...), cuda.LaunchEnv+"=32x4", "GCOMPILE_CACHE="+t.TempDir())
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	m := regexp.MustCompile(`step 1/1 loss (\S+)`).FindStringSubmatch(string(out))
	require.NotNil(t, m, "%s", out)
	want, err1 := strconv.ParseFloat(plain[0], 64)
	got, err2 := strconv.ParseFloat(m[1], 64)
	require.NoError(t, errors.Join(err1, err2))
	assert.InDelta(t, want, got, 1e-3, "--fuse on the fake GPU, the CPU backend unfused")
}

// The CUDA backend prepares a fused program as it prepares the unfused
// one: every fused instruction launches the kernel codegen writes for its
// body (no silent fallback to the ops one by one).
func TestFuseOnCUDAPlans(t *testing.T) {
	prog := compilePlan(t, plan{dp: 1, fuse: true})
	plan, _, err := cuda.Plan([]*lower.Program{prog}, 0)
	require.NoError(t, err)
	fused := 0
	for i, in := range prog.Instrs {
		if in.Op == ir.FusedOp {
			fused++
			require.NotEmpty(t, plan[i].Steps)
			assert.Regexp(t, `^gc_fused_[0-9a-f]{16}<<<`, plan[i].Steps[0])
		}
	}
	assert.Positive(t, fused)
}
