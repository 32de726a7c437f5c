package tests

import (
	"math"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cuda"
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

// The CLI trains with --fuse and prints the same losses as without it;
// --fuse with the CUDA backend is refused before any work, naming why.
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
	assert.Equal(t, losses(), losses("--fuse"))

	out, err = exec.Command(bin, "../examples/gpt/model.go", "--fuse", "--backend", "cuda").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "--backend cuda with --fuse: not yet supported")
}

// The CUDA backend does not build fused kernels yet: preparing a fused
// program for it is an error that names the op, never a silent fallback.
func TestFuseNotYetOnCUDA(t *testing.T) {
	prog := compilePlan(t, plan{dp: 1, fuse: true})
	_, _, err := cuda.Plan([]*lower.Program{prog}, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no kernel for op fused")

	plain := compilePlan(t, plan{dp: 1})
	_, _, err = cuda.Plan([]*lower.Program{plain}, 0)
	require.NoError(t, err, "the same program unfused plans")
}
