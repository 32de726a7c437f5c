package tests

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/passes/schedule"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// pipePlan is a pipeline configuration of the equivalence matrix.
type pipePlan struct {
	pp, vpp, micro, dp, tp int
	ep                     int // expert parallelism (the moe families)
	cp                     int // context parallelism (ring attention)
	order                  func(t *testing.T, p, v, m int) [][]lower.Block
	name                   string
	model                  string // the model family: "" (gpt), "llama", "mixtral", … (familyOf)
}

// scheduleOrder builds the named schedule, proves it deadlock-free in the
// simulator and returns its compute order.
func scheduleOrder(name string) func(t *testing.T, p, v, m int) [][]lower.Block {
	return func(t *testing.T, p, v, m int) [][]lower.Block {
		s, err := schedule.New(name, p, v, m)
		require.NoError(t, err)
		_, err = schedule.Simulate(s, nil)
		require.NoError(t, err)
		out := make([][]lower.Block, p)
		for r, acts := range s.Actions {
			for _, a := range acts {
				switch a.Kind {
				case schedule.F, schedule.B, schedule.W:
					out[r] = append(out[r], lower.Block{Kind: a.Kind.String()[0], Chunk: a.Chunk, Micro: a.Micro})
				}
			}
		}
		return out
	}
}

func (pl pipePlan) String() string {
	s := fmt.Sprintf("%s_pp%d_vpp%d_m%d_dp%d_tp%d", pl.name, pl.pp, max(pl.vpp, 1), pl.micro, max(pl.dp, 1), max(pl.tp, 1))
	if pl.ep > 1 {
		s += fmt.Sprintf("_ep%d", pl.ep)
	}
	if pl.cp > 1 {
		s += fmt.Sprintf("_cp%d", pl.cp)
	}
	if pl.model != "" {
		s = pl.model + "_" + s
	}
	return s
}

// pipeSetup is what a pipeline run changes beyond its plan: pass options
// (edit, may be nil) and lowering options.
type pipeSetup struct {
	edit  func(*passes.Options)
	lower lower.Options
}

// compilePipeline compiles the equivalence GPT with the given number of
// layers for pl: the module, every pipeline rank's training program and
// the forward-only programs evaluation runs.
func compilePipeline(t *testing.T, pl pipePlan, layers int, s pipeSetup) (*ir.Module, []*lower.Program, []*lower.Program) {
	t.Helper()
	m := build(t, pl.model, layers)
	opts := passes.DefaultOptions()
	opts.Verify = true
	mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: pl.pp}}}
	if pl.dp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "dp", Size: pl.dp})
	}
	if pl.ep > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "ep", Size: pl.ep})
	}
	if pl.cp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "cp", Size: pl.cp, Zigzag: true, Outer: true})
	}
	if pl.tp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "tp", Size: pl.tp})
	}
	opts.Mesh = mesh
	opts.VPP = pl.vpp
	opts.Microbatches = pl.micro
	opts.TwoBW = pl.name == "2bw"
	opts.DeferWeightGradients = pl.name == "zb"
	if s.edit != nil {
		s.edit(opts)
	}
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	vpp := max(pl.vpp, 1)
	progs, err := lower.LowerPipelineWith(m, pl.order(t, pl.pp, vpp, pl.micro), s.lower)
	require.NoError(t, err)
	evals, err := lower.LowerPipelineForwardWith(m, pl.pp, vpp, pl.micro, s.lower)
	require.NoError(t, err)
	return m, progs, evals
}

// pipelineRun is a pipeline training run with its programs.
type pipelineRun struct {
	trajectory
	progs []*lower.Program
}

// runPipeline trains compiled pipeline programs on virtual CPU devices
// for eqSteps steps; every device must measure the peak its plan
// predicts, within an arena at most 5% larger.
func runPipeline(t *testing.T, m *ir.Module, progs, evals []*lower.Program) pipelineRun {
	t.Helper()
	cl, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.SetEvalPrograms(evals))
	require.NoError(t, cl.InitParams(1))
	var outputs []string
	for _, o := range m.Outputs {
		outputs = append(outputs, o.Name)
	}
	cfg := runtime.TrainConfig{Steps: eqSteps, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: 1,
		Schedule: runtime.Schedule{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: eqSteps, Decay: "cosine"},
		Outputs:  runtime.AuxOutputs(outputs), RandomKey: m.Source(ir.InputRandomKey) != nil}
	steps, evalLosses, err := runtime.Train(cl, corpus(), cfg, nil)
	require.NoError(t, err)
	run := pipelineRun{trajectory: trajectory{params: map[string][]float64{}, eval: evalLosses[len(evalLosses)-1].Loss}, progs: progs}
	for _, s := range steps {
		run.losses = append(run.losses, s.Loss)
		run.outputs = append(run.outputs, s.Outputs)
	}
	for _, p := range m.Params() {
		run.params[p.Name()], err = cl.Global(p.Name())
		require.NoError(t, err)
	}
	for r, d := range cl.Devices {
		assert.Equal(t, d.Program().PeakBytes, d.PeakBytes(), "device %d: measured peak equals predicted", r)
		// The arena is the planner's packing of the buffers, the peak its
		// lower bound. At these toy sizes each microbatch's bias
		// broadcasts are a few KiB apiece and fragmentation costs a few
		// percent (1F1B pp2 m4: 908160 B for a 864248 B peak, both a
		// quarter below what they were when the broadcasts were made for
		// the whole batch).
		assert.LessOrEqual(t, float64(d.Program().ArenaBytes), 1.08*float64(d.Program().PeakBytes), "device %d: arena within 8%% of the peak", r)
	}
	return run
}

// trainPipeline trains the equivalence GPT on pipeline plan pl.
func trainPipeline(t *testing.T, pl pipePlan, layers int) trajectory {
	t.Helper()
	m, progs, evals := compilePipeline(t, pl, layers, pipeSetup{})
	return runPipeline(t, m, progs, evals).trajectory
}

func trainReference(t *testing.T, model string, layers int) trajectory {
	return train(t, plan{dp: 1, model: model, layers: layers})
}

func assertSameTraining(t *testing.T, ref, got trajectory) {
	t.Helper()
	worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
	worstParam := paramError(t, ref.params, got.params, nil)
	assert.LessOrEqual(t, worstParam, 1e-4)
	assert.InDelta(t, ref.eval, got.eval, 1e-5*ref.eval, "held-out loss of the final weights")
	t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|), held-out %.6f vs %.6f", worst, worstParam, got.eval, ref.eval)
}

// Every schedule on every pipeline shape trains like one device, on
// every model family.
func TestPipelineMatchesOneDevice(t *testing.T) {
	type ref struct {
		model  string
		layers int
	}
	refs := map[ref]trajectory{}
	gptShapes := []pipePlan{{pp: 2, micro: 4}, {pp: 4, micro: 4}, {pp: 4, vpp: 2, micro: 8}, {pp: 2, vpp: 2, micro: 4, dp: 2, tp: 2}}
	llamaShapes := []pipePlan{{pp: 2, vpp: 2, micro: 4, dp: 2, tp: 2}}
	for _, model := range families {
		for _, pl := range matrixFor(model, gptShapes, llamaShapes) {
			pl.model = model
			layers := 4 * max(pl.vpp, 1) // at least one layer per chunk
			layers = max(layers, pl.pp*max(pl.vpp, 1))
			key := ref{model, layers}
			if _, ok := refs[key]; !ok {
				refs[key] = trainReference(t, model, layers)
			}
			names := []string{"gpipe", "1f1b", "zb"}
			if pl.vpp > 1 {
				names = []string{"interleaved"}
			}
			for _, name := range names {
				pl := pl
				pl.name, pl.order = name, scheduleOrder(name)
				t.Run(pl.String(), func(t *testing.T) {
					assertSameTraining(t, refs[key], trainPipeline(t, pl, layers))
				})
			}
		}
	}
}

// Zero-bubble with recompute replays in W what the weight gradients read
// (passes.replayForW), a second time after B's: it trains like one
// device, replays and all.
func TestZeroBubbleRecomputeMatchesOneDevice(t *testing.T) {
	const layers = 4
	ref := trainReference(t, "", layers)
	for _, rc := range []string{"full", "every=2"} {
		t.Run(rc, func(t *testing.T) {
			pl := pipePlan{pp: 2, micro: 4, name: "zb", order: scheduleOrder("zb")}
			m, progs, evals := compilePipeline(t, pl, layers, pipeSetup{edit: func(o *passes.Options) { o.Recompute = rc }})
			again := 0
			for _, v := range m.Values {
				if v.Meta.Phase == ir.PhaseRecompute {
					again++
				}
			}
			require.Positive(t, again)
			assertSameTraining(t, ref, runPipeline(t, m, progs, evals).trajectory)
		})
	}
}

// Zero-bubble with data parallelism and optimizer work that reads each
// gradient as soon as it is reduced (ZeRO-1's shard of it, mixed
// precision's unscale) compiles and trains like one device. A dp bucket
// holds gradients B finishes (a LayerNorm's) and gradients W finishes;
// what read the former stood before the bucket's end, and the plan was
// refused ("bucket 1 cannot wait for its last gradient").
func TestZeroBubbleWithDataParallelOptimizerWork(t *testing.T) {
	const layers = 4
	ref := trainReference(t, "", layers)
	pl := pipePlan{pp: 2, dp: 2, micro: 4, name: "zb", order: scheduleOrder("zb")}
	m, progs, evals := compilePipeline(t, pl, layers, pipeSetup{edit: func(o *passes.Options) { o.Zero = 1 }})
	assertSameTraining(t, ref, runPipeline(t, m, progs, evals).trajectory)
	compilePipeline(t, pl, layers, pipeSetup{edit: func(o *passes.Options) { o.Precision = "bf16" }})
}

// The tied embedding's gradient crosses from the last stage to the first
// once a step: the head's part summed over the microbatches there, as
// Megatron-LM all-reduces its two copies' gradients once. It crossed once
// a microbatch, m·V·h a step.
func TestTiedEmbeddingGradientCrossesOnceAStep(t *testing.T) {
	for _, pl := range []pipePlan{{pp: 2, micro: 4, name: "1f1b"}, {pp: 2, micro: 4, name: "zb"}, {pp: 2, micro: 4, tp: 2, name: "gpipe"}} {
		t.Run(pl.String(), func(t *testing.T) {
			pl.order = scheduleOrder(pl.name)
			m, progs, _ := compilePipeline(t, pl, 4, pipeSetup{})
			wte := m.Source("wte.weight")
			require.NotNil(t, wte)
			var sent []*ir.Value
			for _, in := range progs[len(progs)-1].Instrs {
				if in.Op == "send" && in.Value.Meta.Phase == ir.PhaseBwd && in.Value.Type.Equal(wte.Type) {
					sent = append(sent, in.Value)
				}
			}
			require.Len(t, sent, 1, "the head's gradient part sent to the first stage")
			assert.Equal(t, -1, sent[0].Meta.Micro, "%s is the sum over the microbatches", sent[0].Where())
		})
	}
}

// A stage adds each microbatch's gradient to its sum inside the backward
// block that makes it, as Megatron-LM adds into main_grad: made after the
// block, every gradient of the block was live beside its sum, a stage's
// fp32 gradients held twice (Llama 7B at tp 2 · pp 4 · dp 8, 16
// microbatches: the first rank's arena 18.5 GiB, now 16.6). Under
// zero-bubble the weight gradients are made, and added, in W.
func TestPipelineAccumulatesInTheBlock(t *testing.T) {
	for _, pl := range []pipePlan{{pp: 2, micro: 4, name: "1f1b"}, {pp: 2, micro: 4, name: "zb"}, {pp: 2, vpp: 2, micro: 4, name: "interleaved"}} {
		t.Run(pl.String(), func(t *testing.T) {
			pl.order = scheduleOrder(pl.name)
			_, progs, _ := compilePipeline(t, pl, 4, pipeSetup{})
			for r, prog := range progs {
				madeBy := map[int]string{}
				adds := 0
				for i, in := range prog.Instrs {
					v := in.Value
					received := slices.ContainsFunc(in.Args, func(a int) bool { return madeBy[a] == "recv" })
					madeBy[in.Out] = in.Op
					if in.Op != "add" || v.Meta.Phase != ir.PhaseBwd || v.Meta.Micro >= 0 || received {
						// The tied embedding's two parts meet after the
						// blocks, the head's sent once a step.
						continue
					}
					adds++
					assert.Regexp(t, `^[BW] c\d+ m\d+$`, in.Block, "rank %d: %s (instruction %d) outside a backward block", r, v.Where(), i)
				}
				assert.Positive(t, adds, "rank %d's partial sums", r)
			}
		})
	}
}

// With collectives in program order (the CPU backend: SendsFirst), a
// chunk's last backward sends its input gradient before its gradient
// buckets' reductions, which it does not read: the rank before would
// otherwise wait for them, every rank for the next one's. Checked on the
// dp 2 pipelines under ZeRO 0 and 1 (all-reduce and reduce-scatter
// buckets), 1F1B and interleaved. A comm stream (the CUDA backend) keeps
// the buckets where their gradients are made.
func TestPipelineSendsBeforeItsReductions(t *testing.T) {
	for _, c := range []struct {
		pl   pipePlan
		zero int
	}{{pipePlan{pp: 2, micro: 2, dp: 2, name: "1f1b"}, 0}, {pipePlan{pp: 2, micro: 2, dp: 2, name: "1f1b"}, 1}, {pipePlan{pp: 2, vpp: 2, micro: 2, dp: 2, name: "interleaved"}, 1}} {
		t.Run(fmt.Sprintf("%s_zero%d", c.pl, c.zero), func(t *testing.T) {
			c.pl.order = scheduleOrder(c.pl.name)
			edit := func(o *passes.Options) { o.Zero = c.zero }
			_, progs, _ := compilePipeline(t, c.pl, 4, pipeSetup{edit: edit, lower: lower.Options{SendsFirst: true}})
			sends, buckets := 0, 0
			// sentAfter counts the microbatch sends that stand after a
			// reduction of their block.
			sentAfter := func(progs []*lower.Program) (n int) {
				for _, prog := range progs {
					reducing := map[string]bool{} // blocks that have begun their buckets
					for _, in := range prog.Instrs {
						if in.Bucket > 0 {
							reducing[in.Block] = true
						}
						if in.Op == "send" && in.Value.Meta.Micro >= 0 && reducing[in.Block] {
							n++
						}
					}
				}
				return n
			}
			_, kept, _ := compilePipeline(t, c.pl, 4, pipeSetup{edit: edit})
			assert.Positive(t, sentAfter(kept), "without SendsFirst a send stands after its block's buckets")
			assert.Zero(t, sentAfter(progs))
			for r, prog := range progs {
				reduced := map[int]bool{} // values read from a bucket's reductions
				var firstBucket string
				for _, in := range prog.Instrs {
					reads := in.Bucket > 0 || slices.ContainsFunc(in.Args, func(a int) bool { return reduced[a] })
					if reads && in.Out >= 0 {
						reduced[in.Out] = true
					}
					if in.Bucket > 0 && firstBucket != in.Block {
						firstBucket = in.Block
						buckets++
					}
					if in.Op == "send" && !reads && in.Block != "step" && in.Block != "optimizer" {
						sends++
						assert.NotEqual(t, firstBucket, in.Block, "rank %d: %s is sent after its block's reductions", r, in.Value.Where())
					}
				}
			}
			assert.Positive(t, buckets)
			assert.Positive(t, sends)
		})
	}
}

// PipeDream-2BW on a pipeline equals a single-device run of its update
// rule W(t+1) = W(t) − ν∇f(W(t−1)): the first step matches plain training
// (both versions start equal), later steps do not (the gradients are one
// step stale), and training still converges.
func TestTwoBWMatchesItsUpdateRule(t *testing.T) {
	for _, model := range families {
		t.Run(model, func(t *testing.T) {
			rule := train(t, plan{dp: 1, twoBW: true, model: model, layers: 4})
			plain := train(t, plan{dp: 1, model: model, layers: 4})
			got := trainPipeline(t, pipePlan{pp: 2, micro: 4, name: "2bw", order: scheduleOrder("2bw"), model: model}, 4)
			assertSameTraining(t, rule, got)
			assert.InDelta(t, plain.losses[0], rule.losses[0], 1e-6*plain.losses[0], "step 1 uses the initial weights in both")
			assert.NotEqual(t, plain.losses[2], rule.losses[2], "later steps use one-step-stale gradients")
			assert.Less(t, rule.losses[eqSteps-1], rule.losses[0]-0.5, "2BW training converges")
		})
	}
}

// With tp > 1 a pipeline transfer of an activation every tp rank holds
// whole moves 1/t of it per rank, and the receiver all-gathers it
// (Megatron's scatter/gather optimisation).
func TestPipelineTransfersAreScatteredOverTP(t *testing.T) {
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: eqBatch, Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: 2}, {Name: "tp", Size: 2}}}
	opts.Microbatches = 2
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	progs, err := lower.LowerPipeline(m, scheduleOrder("1f1b")(t, 2, 1, 2))
	require.NoError(t, err)
	sends := 0
	for _, in := range progs[0].Instrs {
		if in.Op != "send" || in.Value.Op == "param" || in.Value.Type.Rank() < 2 { // activations, not scalars
			continue
		}
		sends++
		whole := ir.LocalShape(in.Value.Type.Shape, in.Value.Place, m.Mesh).NumElements() * in.Value.Type.DType.Size()
		assert.Equal(t, whole/2, in.ArgTypes[0].Bytes(), "%s is sent as half per tp rank", in.Value.Where())
	}
	assert.Positive(t, sends)
}
