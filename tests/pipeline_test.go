package tests

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// pipePlan is a pipeline configuration of the equivalence matrix.
type pipePlan struct {
	pp, vpp, micro, dp, tp int
	order                  func(p, v, m int) [][]lower.Block
	name                   string
}

// gpipeOrder: every rank runs all forwards, then all backwards (chunks in
// model order forward, reverse order backward).
func gpipeOrder(p, v, m int) [][]lower.Block {
	out := make([][]lower.Block, p)
	for r := range p {
		for c := r; c < p*v; c += p {
			for k := range m {
				out[r] = append(out[r], lower.Block{Kind: 'F', Chunk: c, Micro: k})
			}
		}
		for c := r + (v-1)*p; c >= 0; c -= p {
			for k := range m {
				out[r] = append(out[r], lower.Block{Kind: 'B', Chunk: c, Micro: k})
			}
		}
	}
	return out
}

// oneFOneBOrder is PipeDream-flush for v = 1: p−1−r warm-up forwards, then
// alternate one forward and one backward, then the remaining backwards.
func oneFOneBOrder(p, _, m int) [][]lower.Block {
	out := make([][]lower.Block, p)
	for r := range p {
		warm := min(p-1-r, m)
		f, b := 0, 0
		for ; f < warm; f++ {
			out[r] = append(out[r], lower.Block{Kind: 'F', Chunk: r, Micro: f})
		}
		for f < m {
			out[r] = append(out[r], lower.Block{Kind: 'F', Chunk: r, Micro: f})
			f++
			out[r] = append(out[r], lower.Block{Kind: 'B', Chunk: r, Micro: b})
			b++
		}
		for ; b < m; b++ {
			out[r] = append(out[r], lower.Block{Kind: 'B', Chunk: r, Micro: b})
		}
	}
	return out
}

func (pl pipePlan) String() string {
	return fmt.Sprintf("%s_pp%d_vpp%d_m%d_dp%d_tp%d", pl.name, pl.pp, max(pl.vpp, 1), pl.micro, max(pl.dp, 1), max(pl.tp, 1))
}

func trainPipeline(t *testing.T, pl pipePlan, layers int) trajectory {
	t.Helper()
	set := map[string]string{}
	for k, v := range eqModel {
		set[k] = v
	}
	set["layers"] = fmt.Sprint(layers)
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: eqBatch, Set: set})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Verify = true
	mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: pl.pp}}}
	if pl.dp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "dp", Size: pl.dp})
	}
	if pl.tp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "tp", Size: pl.tp})
	}
	opts.Mesh = mesh
	opts.VPP = pl.vpp
	opts.Microbatches = pl.micro
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	progs, err := lower.LowerPipeline(m, pl.order(pl.pp, max(pl.vpp, 1), pl.micro))
	require.NoError(t, err)
	cl, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	cfg := runtime.TrainConfig{Steps: eqSteps, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: -1,
		Schedule: runtime.Schedule{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: eqSteps, Decay: "cosine"}}
	steps, _, err := runtime.Train(cl, corpus(), cfg, nil)
	require.NoError(t, err)
	tr := trajectory{params: map[string][]float64{}}
	for _, s := range steps {
		tr.losses = append(tr.losses, s.Loss)
	}
	for _, p := range m.Params() {
		tr.params[p.Name()], err = cl.Global(p.Name())
		require.NoError(t, err)
	}
	for r, d := range cl.Devices {
		assert.Equal(t, d.Program().PeakBytes, d.PeakBytes(), "device %d: measured peak equals predicted", r)
	}
	return tr
}

func trainReference(t *testing.T, layers int) trajectory {
	saved := eqModel
	defer func() { eqModel = saved }()
	eqModel = map[string]string{}
	for k, v := range saved {
		eqModel[k] = v
	}
	eqModel["layers"] = fmt.Sprint(layers)
	return train(t, plan{dp: 1})
}

func assertSameTraining(t *testing.T, ref, got trajectory) {
	t.Helper()
	worst := 0.0
	for i := range ref.losses {
		e := math.Abs(got.losses[i]-ref.losses[i]) / math.Abs(ref.losses[i])
		worst = max(worst, e)
		assert.LessOrEqual(t, e, 1e-5, "step %d", i+1)
	}
	worstParam := 0.0
	for name, want := range ref.params {
		scale := 0.0
		for _, w := range want {
			scale = max(scale, math.Abs(w))
		}
		for i := range want {
			worstParam = max(worstParam, math.Abs(got.params[name][i]-want[i])/scale)
		}
	}
	assert.LessOrEqual(t, worstParam, 1e-4)
	t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
}

func TestPipelineMatchesOneDevice(t *testing.T) {
	ref := trainReference(t, 4)
	for _, pl := range []pipePlan{
		{pp: 2, micro: 4, order: gpipeOrder, name: "gpipe"},
		{pp: 2, micro: 4, order: oneFOneBOrder, name: "1f1b"},
		{pp: 4, micro: 4, order: oneFOneBOrder, name: "1f1b"},
		{pp: 2, vpp: 2, micro: 4, order: gpipeOrder, name: "gpipe"},
		{pp: 2, vpp: 2, micro: 4, dp: 2, tp: 2, order: gpipeOrder, name: "gpipe"},
		{pp: 2, micro: 4, dp: 2, tp: 2, order: oneFOneBOrder, name: "1f1b"},
	} {
		t.Run(pl.String(), func(t *testing.T) {
			assertSameTraining(t, ref, trainPipeline(t, pl, 4))
		})
	}
}
