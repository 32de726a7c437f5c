package tests

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data"
	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/examples/mixtral"
	"gcompile/examples/moe"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// plan is one parallel configuration of the equivalence matrix.
type plan struct {
	dp, tp, zero, micro int
	ep                  int    // expert parallelism (the moe families)
	cp                  int    // context parallelism
	cpImpl              string // "" (ring) or "all2all"
	cpLayout            string // the ring's: "" (zigzag) or "contiguous"
	bucketMB            float64
	sp                  bool
	twoBW               bool // PipeDream-2BW's 1-stale weight update
	recompute           string
	precision           string // "fp16" or "bf16": mixed precision ("" is fp32)
	offload             string // "optimizer": optimizer state in host memory
	compress            string // "lowp": bf16 stashes for the backward
	optimizer           string // "" (AdamW), "sgd", "adafactor" or "sm3"
	fuse                bool   // the fuse pass: elementwise groups as fused ops
	model               string // the model family: "" (gpt), "llama", "mixtral", … (familyOf)
	layers              int    // layers, when not the family's default
	attention           string // the family's attention core: "" (fused) or "unfused"
	gradReduce          string // --grad-reduce-dtype: "" (fp32), "bf16" or "fp16"
}

func (p plan) String() string {
	s := fmt.Sprintf("dp%d_tp%d_zero%d_micro%d_bucket%g_sp%v", max(p.dp, 1), max(p.tp, 1), p.zero, max(p.micro, 1), p.bucketMB, p.sp)
	if p.ep > 1 {
		s = fmt.Sprintf("ep%d_", p.ep) + s
	}
	if p.cp > 1 {
		s = fmt.Sprintf("cp%d%s%s_", p.cp, p.cpImpl, p.cpLayout) + s
	}
	if p.model != "" {
		s = p.model + "_" + s
	}
	if p.attention != "" {
		s += "_" + p.attention
	}
	for _, o := range []string{p.recompute, p.offload} {
		if o != "" {
			s += "_" + o
		}
	}
	return s
}

// family is a model the matrices run on: its model function and --set
// values at equivalence size.
type family struct {
	name string
	fn   frontend.ModelFunc
	set  map[string]string
}

// eqLlama is the Llama at equivalence size: grouped-query attention with
// 2 k/v heads for 4 query heads, so tp=2 splits k/v heads and tp=4
// replicates them.
var eqLlama = map[string]string{"layers": "2", "hidden": "32", "heads": "4", "kv_heads": "2", "ffn": "64", "seq": "16"}

// families are the model families every matrix runs on. The Mixtral
// (familyOf("mixtral")) has matrices of its own, in TestMixtralMatchesOneDevice:
// several of these tests assert dense-model facts (bf16 stashes halve
// every layer's) that its i32 routing indices do not share.
var families = []string{"gpt", "llama"}

// eqMixtral is the Mixtral at equivalence size: the Llama's attention,
// 4 SwiGLU experts per layer, top-2, dropless.
var eqMixtral = map[string]string{"layers": "2", "hidden": "32", "heads": "4", "kv_heads": "2", "ffn": "32", "experts": "4", "k": "2", "seq": "16"}

// familyOf is the named family (gpt for ""), its settings with layers
// overridden when layers > 0.
func familyOf(name string, layers int) family {
	f := family{name: "gpt", fn: gpt.Model, set: eqModel}
	switch name {
	case "llama":
		f = family{name: "llama", fn: llama.Model, set: eqLlama}
	case "mixtral":
		f = family{name: "mixtral", fn: mixtral.Model, set: eqMixtral}
	case "mixtral-groups":
		// Routing groups of 4 tokens: under cp2 each of the zigzag
		// layout's 4 chunks of a sequence holds whole groups.
		f = family{name: name, fn: mixtral.Model, set: maps.Clone(eqMixtral)}
		f.set["group"] = "4"
	case "aux":
		f = family{name: "aux", fn: auxModel, set: map[string]string{"layers": "2"}}
	case "seqfold-2", "seqfold-4":
		f = family{name: "seqfold", fn: seqFoldModel, set: map[string]string{"fold": strings.TrimPrefix(name, "seqfold-")}}
	case "wholeinput":
		f = family{name: "wholeinput", fn: wholeInputModel, set: map[string]string{}}
	case "sumsplit":
		f = family{name: "sumsplit", fn: sumOverSplitModel, set: map[string]string{}}
	case "ropetable":
		f = family{name: "ropetable", fn: ropeTableModel, set: map[string]string{}}
	case "moe-switch", "moe-gshard", "moe-switch-drop", "moe-noisy-topk", "moe-expert-choice", "moe-switch-groups":
		router, capacity := strings.TrimPrefix(name, "moe-"), "4"
		groups := router == "switch-groups"
		if groups {
			router = "switch"
		}
		switch router {
		case "switch-drop":
			router, capacity = "switch", "1"
		case "expert-choice":
			capacity = "2" // each expert takes 16·2/4 = 8 of a group's 16 tokens
		}
		f = family{name: name, fn: moe.Model, set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16",
			"experts": "4", "ffn": "32", "router": router, "capacity": capacity}}
		if groups {
			// Routing groups of 4 tokens, which cp2's chunks hold whole.
			f.set["group"] = "4"
		}
		if router == "noisy-topk" {
			// Every source of randomness: router noise, jitter and
			// dropout inside the experts.
			f.set["jitter"], f.set["expert_dropout"] = "0.01", "0.1"
		}
	}
	set := map[string]string{}
	for k, v := range f.set {
		set[k] = v
	}
	if layers > 0 {
		set["layers"] = fmt.Sprint(layers)
	}
	f.set = set
	return f
}

// matrixFor is what a family runs of a test's matrix: all of it for the
// GPT, the reference model, and in the full matrix (make test-full); the
// subset for another family otherwise, to keep make test short.
func matrixFor[P any](model string, all, subset []P) []P {
	if model == "gpt" || fullMatrix() {
		return all
	}
	return subset
}

// build records family name at equivalence size.
func build(t testing.TB, name string, layers int) *ir.Module {
	t.Helper()
	return buildAttention(t, name, layers, "")
}

// buildAttention records family name at equivalence size with the given
// attention core (--set attention=…; "" keeps the family's default, the
// fused op).
func buildAttention(t testing.TB, name string, layers int, attention string) *ir.Module {
	t.Helper()
	f := familyOf(name, layers)
	if attention != "" {
		f.set["attention"] = attention
	}
	m, err := frontend.Build(f.fn, frontend.Config{Name: f.name, Batch: eqBatch, Set: f.set})
	require.NoError(t, err)
	return m
}

// mesh has the axes of size > 1, tp last (fastest), cp next to it, as in
// Megatron-LM and compile.Config.Mesh.
func (p plan) mesh() *ir.Mesh {
	m := &ir.Mesh{}
	if p.dp > 1 {
		m.Axes = append(m.Axes, ir.MeshAxis{Name: "dp", Size: p.dp})
	}
	if p.ep > 1 {
		m.Axes = append(m.Axes, ir.MeshAxis{Name: "ep", Size: p.ep})
	}
	if p.cp > 1 {
		// The ring splits the sequence before tp, Ulysses after (as
		// compile.Config.Mesh lays them out).
		m.Axes = append(m.Axes, ir.MeshAxis{Name: "cp", Size: p.cp, Zigzag: p.cpImpl == "" && p.cpLayout == "", Outer: p.cpImpl != "all2all"})
	}
	if p.tp > 1 {
		m.Axes = append(m.Axes, ir.MeshAxis{Name: "tp", Size: p.tp})
	}
	if len(m.Axes) == 0 {
		return nil
	}
	return m
}

const (
	eqSteps = 20
	eqBatch = 8
	eqSeq   = 16
)

var eqModel = map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}

// corpus is deterministic text with structure a model can learn.
func corpus() *data.Corpus {
	var b strings.Builder
	for i := 0; b.Len() < 1<<16; i++ {
		fmt.Fprintf(&b, "func f%d(x int) int { return x*%d + %d }\n", i, i%7, i%13)
	}
	text := []byte(b.String())
	cut := len(text) * 9 / 10
	return &data.Corpus{Source: "synthetic", Train: text[:cut], Eval: text[cut:]}
}

func compilePlan(t testing.TB, p plan) *lower.Program {
	t.Helper()
	m := buildAttention(t, p.model, p.layers, p.attention)
	opts := passes.DefaultOptions()
	opts.Verify = true
	opts.Zero = p.zero
	opts.Microbatches = max(p.micro, 1)
	opts.SequenceParallel = p.sp
	opts.CPImpl = p.cpImpl
	opts.TwoBW = p.twoBW
	opts.Recompute = p.recompute
	opts.Compress = p.compress
	opts.Precision = p.precision
	opts.Fuse = p.fuse
	opts.GradReduceDType = p.gradReduce
	if p.optimizer != "" {
		opts.Optimizer = p.optimizer
	}
	if p.bucketMB > 0 {
		opts.BucketMB = p.bucketMB
	}
	opts.Mesh = p.mesh()
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	prog, err := lower.LowerWith(m, lower.Options{Offload: p.offload})
	require.NoError(t, err)
	return prog
}

type trajectory struct {
	losses  []float64
	outputs []map[string]float64 // the model's auxiliary outputs, per step
	eval    float64              // held-out loss after the last step
	params  map[string][]float64
	peaks   []int64
	prog    *lower.Program
}

// train trains the tiny GPT under plan p; params holds the final params,
// whole.
func train(t testing.TB, p plan) trajectory { return trainKeeping(t, p, lower.Param) }

// trainKeeping trains the tiny GPT under plan p and keeps, whole, the
// final value of every buffer of the given kinds.
func trainKeeping(t testing.TB, p plan, kinds ...lower.BufferKind) trajectory {
	t.Helper()
	prog := compilePlan(t, p)
	cl, err := cpu.NewCluster(prog, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	cfg := runtime.TrainConfig{Steps: eqSteps, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: 1,
		Schedule: runtime.Schedule{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: eqSteps, Decay: "cosine"},
		Outputs:  runtime.AuxOutputs(slices.Collect(maps.Keys(prog.Outputs)))}
	_, cfg.RandomKey = prog.Sources[ir.InputRandomKey]
	switch p.precision {
	case "bf16":
		cfg.LossScale = runtime.NewLossScaler(1) // as the CLI runs bf16
	case "fp16":
		cfg.LossScale = runtime.NewLossScaler(0) // dynamic
	}
	steps, evals, err := runtime.Train(cl, corpus(), cfg, nil)
	require.NoError(t, err)
	tr := trajectory{prog: prog, eval: evals[len(evals)-1].Loss}
	for _, s := range steps {
		tr.losses = append(tr.losses, s.Loss)
		tr.outputs = append(tr.outputs, s.Outputs)
	}
	tr.params = globals(t, cl, prog, kinds...)
	for _, d := range cl.Devices {
		tr.peaks = append(tr.peaks, d.PeakBytes())
	}
	return tr
}

// globals reads from cl, whole, every buffer of prog of the given kinds.
func globals(t testing.TB, cl *cpu.Cluster, prog *lower.Program, kinds ...lower.BufferKind) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	for _, b := range prog.Buffers {
		if slices.Contains(kinds, b.Kind) {
			x, err := cl.Global(b.Name)
			require.NoError(t, err)
			out[b.Name] = x
		}
	}
	return out
}

// Every data- and tensor-parallel configuration trains like one device: the same loss
// at every step (1e-5 relative) and the same final parameters (1e-4
// relative to the tensor's largest entry), in fp32, on every model family.
// The GPT's key biases are left out of the weights (isKeyBias): their
// gradient is zero in exact arithmetic, so Adam's steps there follow the
// rounding noise of each plan's summation order (measured up to 1.2e-4
// with the fused attention, 7e-5 with the unfused one).
func TestDataParallelMatchesOneDevice(t *testing.T) {
	gptPlans := []plan{{dp: 2}, {dp: 4}, {dp: 4, zero: 1}, {dp: 4, zero: 2}, {dp: 4, zero: 3}, {dp: 2, zero: 3}, {dp: 2, bucketMB: 0.01},
		{tp: 2}, {tp: 4}, {dp: 2, tp: 2, zero: 1}, {micro: 4}, {dp: 2, tp: 2, micro: 4}, {dp: 2, micro: 2, zero: 2},
		{tp: 2, sp: true}, {dp: 2, tp: 2, sp: true}, {dp: 2, tp: 2, sp: true, zero: 1}, {dp: 2, tp: 2, sp: true, zero: 2}, {dp: 2, tp: 2, zero: 3}}
	// Llama: tp=2 splits its k/v heads, tp=4 replicates them.
	llamaPlans := []plan{{tp: 4, sp: true}, {dp: 4, zero: 3}, {dp: 2, tp: 2, micro: 4, zero: 1}, {dp: 2, tp: 2, sp: true, zero: 2}}
	for _, model := range families {
		plans := matrixFor(model, gptPlans, llamaPlans)
		ref := train(t, plan{dp: 1, model: model})
		require.Less(t, ref.losses[eqSteps-1], ref.losses[0]-0.5, "%s: the reference run must actually learn", model)
		for _, p := range plans {
			p.model = model
			t.Run(p.String(), func(t *testing.T) {
				got := train(t, p)
				worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
				worstParam := paramError(t, ref.params, got.params, isKeyBias)
				assert.LessOrEqual(t, worstParam, 1e-4)
				for r, peak := range got.peaks {
					assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", r)
				}
				assert.LessOrEqual(t, float64(got.prog.ArenaBytes), 1.05*float64(got.prog.PeakBytes), "the arena is within 5%% of the peak of live bytes")
				t.Logf("%v: worst loss rel err %.2g, worst param err %.2g (of max |w|)", p, worst, worstParam)
			})
		}
	}
}

// Per-device memory of the fp32 model follows the ZeRO formulas exactly:
// with Ψ parameters and N = dp, params 4Ψ (stage 3: 4Ψ/N), gradients 4Ψ
// (stages 2–3: 4Ψ/N), Adam state 8Ψ (stages 1–3: 8Ψ/N). In bf16 the
// params are the fp32 master weights, which ZeRO splits from stage 1 on
// with the rest of the optimizer state (the 16-bit copies are made from
// the shards and gathered for the step), and the gradients stay fp32:
// Megatron-LM's distributed optimizer's 4Ψ + 12Ψ/N beside the 16-bit
// weights. From stage 1 on the optimizer reads its shard of the
// gradients, reduce-scattered; stage 1 sums the microbatches' gradients
// whole (4Ψ), stages 2–3 their shards (4Ψ/N).
func TestZeROMemoryFormulas(t *testing.T) {
	psi := paramCount(compilePlan(t, plan{dp: 1}))
	const n = 4
	for _, precision := range []string{"", "bf16"} {
		for stage := range 4 {
			t.Run(fmt.Sprintf("zero%d_%s", stage, cmp.Or(precision, "fp32")), func(t *testing.T) {
				prog := compilePlan(t, plan{dp: n, zero: stage, precision: precision})
				params, states, grads := zeroBytes(prog)
				sums := gradientSumBytes(compilePlan(t, plan{dp: n, zero: stage, precision: precision, micro: 2}))
				wantParams, wantGrads, wantStates, wantSums := 4*psi, 4*psi, 8*psi, 4*psi
				if stage >= 1 {
					wantStates /= n
					wantGrads /= n
				}
				if stage >= 2 {
					wantSums /= n
				}
				if stage >= 3 || stage >= 1 && precision != "" {
					wantParams /= n
				}
				assert.Equal(t, wantParams, params, "param bytes")
				assert.Equal(t, wantGrads, grads, "gradient bytes the optimizer reads")
				assert.Equal(t, wantSums, sums, "bytes of the microbatches' gradient sums")
				assert.Equal(t, wantStates, states, "optimizer state bytes")
				if stage >= 1 {
					assert.Zero(t, allReducedTensors(prog), "ZeRO reduce-scatters its gradients: no tensor is all-reduced")
				}
			})
		}
	}
}

// paramCount is the number of the model's parameters, whole, in prog.
func paramCount(prog *lower.Program) (n int64) {
	for _, b := range prog.Buffers {
		if b.Kind == lower.Param {
			n += b.Global.Shape.NumElements()
		}
	}
	return n
}

// zeroBytes is one device's bytes of params, optimizer state and
// gradients in prog. The gradients are what the global-norm reduction
// reads: whole after an all-reduce, a shard after a reduce-scatter.
func zeroBytes(prog *lower.Program) (params, states, grads int64) {
	for _, b := range prog.Buffers {
		switch b.Kind {
		case lower.Param:
			params += b.Bytes
		case lower.State:
			states += b.Bytes
		}
	}
	for _, in := range prog.Instrs {
		if in.Op == "sum_squares" {
			for _, t := range in.ArgTypes {
				grads += t.Bytes()
			}
		}
	}
	return params, states, grads
}

// A bucket of ZeRO's reduce-scatters is one call on the CPU backend, as
// a bucket of all-reduces is: the call's meeting of the devices, not its
// bytes, is what a call costs there.
func TestZeROReduceScattersABucketInOneCall(t *testing.T) {
	for _, p := range []plan{{dp: 2, zero: 1, bucketMB: 0.01}, {dp: 2, zero: 2, micro: 2, bucketMB: 0.01}, {dp: 2, zero: 1, precision: "bf16"}} {
		t.Run(fmt.Sprintf("%v_%s", p, cmp.Or(p.precision, "fp32")), func(t *testing.T) {
			prog := compilePlan(t, p)
			calls, members := 0, 0
			for i, in := range prog.Instrs {
				if in.Op != "reduce_scatter" {
					continue
				}
				members++
				if _, leads := prog.BucketRun(i); leads || in.Bucket == 0 {
					calls++
				}
			}
			require.Greater(t, members, calls, "buckets of several gradients")
			if p.bucketMB > 0 {
				require.Greater(t, calls, 1, "several buckets")
			}
			cl, err := cpu.NewCluster(prog, cpu.Options{})
			require.NoError(t, err)
			require.NoError(t, cl.InitParams(1))
			tokens := make([]int32, eqBatch*eqSeq)
			for i := range tokens {
				tokens[i] = int32(i * 7 % 256)
			}
			for _, in := range []string{"tokens", "targets"} {
				require.NoError(t, cl.SetInt32(in, tokens))
			}
			for _, name := range []string{"lr", "step", runtime.InputLossScale} {
				if _, ok := prog.Sources[name]; ok {
					require.NoError(t, cl.SetScalar(name, 1))
				}
			}
			before := cl.Comm.Stats().ReduceScatter
			require.NoError(t, cl.Step())
			assert.Equal(t, int64(calls), cl.Comm.Stats().ReduceScatter-before, "one call a bucket (the comm counts a call of the group once)")
		})
	}
}

// gradientSumBytes is one device's bytes of the gradients summed over
// the microbatches: the buffers the once-a-step adds write.
func gradientSumBytes(prog *lower.Program) (n int64) {
	seen := map[int]bool{}
	for _, in := range prog.Instrs {
		if v := in.Value; in.Op == "add" && v != nil && v.Meta.Phase == ir.PhaseBwd && v.Meta.Micro < 0 && !seen[in.Out] {
			seen[in.Out] = true
			n += prog.Buffers[in.Out].Bytes
		}
	}
	return n
}

// allReducedTensors counts prog's all-reduces of more than a scalar.
func allReducedTensors(prog *lower.Program) (n int) {
	for _, in := range prog.Instrs {
		if in.Op == "all_reduce" && len(in.ArgTypes) > 0 && in.ArgTypes[0].Rank() > 0 {
			n++
		}
	}
	return n
}

// Under tensor parallelism ZeRO splits over dp what tp leaves of each
// param, vectors included: a column-parallel bias is split inside each tp
// block, so with dp=2 and tp=2 each device holds a quarter of every
// tp-split param and half of every other, except q, k, v's fused bias,
// which stays whole over dp. Checked for ZeRO-3's params, the gradients
// of ZeRO-2 and 3 and the optimizer state of every stage. (ZeRO-3 gathers
// a param over dp only: gathering it over tp as well, as it once did,
// left its gradient whole on tp, at twice these bytes.)
func TestZeROMemoryUnderTensorParallelism(t *testing.T) {
	const d, tp = 2, 2
	var params, grads, states int64 // expected bytes on one device
	for _, p := range build(t, "gpt", 0).Params() {
		n := 4 * p.Type.Shape.NumElements()
		hint := p.Attrs.Str("parallel")
		if hint != "" {
			n /= tp
		}
		if !(strings.HasPrefix(hint, "column:") && p.Type.Rank() == 1) {
			n /= d
		}
		params += n
		grads += n
		states += 2 * n
	}
	for stage := 1; stage <= 3; stage++ {
		gotParams, gotStates, gotGrads := zeroBytes(compilePlan(t, plan{dp: d, tp: tp, zero: stage}))
		assert.Equal(t, states, gotStates, "ZeRO-%d: optimizer state bytes", stage)
		if stage >= 2 {
			assert.Equal(t, grads, gotGrads, "ZeRO-%d: gradient bytes", stage)
		}
		if stage == 3 {
			assert.Equal(t, params, gotParams, "ZeRO-3: param bytes")
		}
	}
}

// assertLossesClose checks every step's loss against the reference within
// tol relative and returns the worst relative error.
func assertLossesClose(t *testing.T, ref, got []float64, tol float64) float64 {
	t.Helper()
	require.Len(t, got, len(ref))
	worst := 0.0
	for i := range ref {
		e := math.Abs(got[i]-ref[i]) / math.Abs(ref[i])
		worst = max(worst, e)
		assert.LessOrEqual(t, e, tol, "step %d: loss %.9g vs reference %.9g", i+1, got[i], ref[i])
	}
	return worst
}

// paramError is the worst difference between the parameters, each
// measured against the largest entry of its tensor (elementwise relative
// error is meaningless for entries near zero). skip, when set, leaves out
// entries no run can agree on.
func paramError(t *testing.T, ref, got map[string][]float64, skip func(name string, i int) bool) float64 {
	t.Helper()
	worst := 0.0
	for name, want := range ref {
		have := got[name]
		require.Len(t, have, len(want), name)
		scale := 0.0
		for _, w := range want {
			scale = max(scale, math.Abs(w))
		}
		for i := range want {
			if skip == nil || !skip(name, i) {
				worst = max(worst, math.Abs(have[i]-want[i])/scale)
			}
		}
	}
	return worst
}

// The optimizer step writes every new param and optimizer state over the
// old one: no step ends copying them back, which would hold a second copy
// of each at the peak. ZeRO's updated shards are gathered straight into
// the params, and mixed precision's overflow gate (where_finite) writes
// over the state it guards, right after its update. Under mixed precision
// the arena then needs no more than fp32's plus the 16-bit copy of the
// weights (its activations are half as large): gated after every update,
// it needed 1.7 times fp32's.
func TestUpdatesWriteOverTheirState(t *testing.T) {
	psi := paramCount(compilePlan(t, plan{dp: 1}))
	fp32 := map[int]int64{}
	for _, p := range []plan{{dp: 4}, {dp: 4, zero: 1}, {dp: 4, zero: 2, bucketMB: 1}, {dp: 4, zero: 3},
		{dp: 4, precision: "fp16"}, {dp: 4, zero: 1, precision: "bf16"}, {dp: 2, tp: 2, zero: 2, precision: "fp16"}} {
		t.Run(fmt.Sprintf("%v_%s", p, cmp.Or(p.precision, "fp32")), func(t *testing.T) {
			prog := compilePlan(t, p)
			for _, in := range prog.Instrs {
				if in.Op == "copy" {
					kind := prog.Buffers[in.Out].Kind
					assert.False(t, kind == lower.Param || kind == lower.State, "%s %q copied back at the step's end", kind, prog.Buffers[in.Out].Name)
				}
			}
			if p.precision == "" {
				fp32[p.zero] = prog.ArenaBytes
				return
			}
			if want, ok := fp32[p.zero]; ok && p.tp == 0 {
				assert.LessOrEqual(t, prog.ArenaBytes, want+2*psi/int64(p.dp), "%s arena against fp32's %d B", p.precision, want)
			}
		})
	}
}

// A vocab-parallel table's gradient is made as the device's rows, as
// Megatron-LM's VocabParallelEmbedding makes it: made whole, every tp rank
// held the whole table's gradient and its fp32 sum (V·h·4 bytes where its
// rows are V·h·4/t) until the optimizer took its rows. The Llama's
// embedding is untied; with sequence parallelism dy is gathered first.
func TestVocabParallelEmbeddingGradientIsTheDevicesRows(t *testing.T) {
	for _, p := range []plan{{model: "llama", tp: 2, micro: 2}, {model: "llama", tp: 2, sp: true}, {tp: 2}} {
		t.Run(p.String()+p.model, func(t *testing.T) {
			prog := compilePlan(t, p)
			n := 0
			for _, in := range prog.Instrs {
				if in.Op != "embedding_grad" {
					continue
				}
				n++
				vocab := in.Value.Type.Shape[0]
				assert.Equal(t, vocab/2, in.OutType.Shape[0], "%s: the device's rows of the %d", in.Value.Where(), vocab)
			}
			assert.Positive(t, n)
		})
	}
}

// Gradient accumulation holds one set of gradients, not one per
// microbatch: each microbatch's gradients are added to the sum as soon as
// they exist, so with 4 microbatches the peak is at most one more set of
// gradients above one microbatch's (whose activations are larger). Added
// after the last microbatch, as they were, they held 4 sets (1.7 times
// the peak). Under ZeRO-2 and 3 the sum is of each microbatch's shards.
// Under ZeRO-3 each microbatch's forward and backward gather
// the params they use and drop them after, as DeepSpeed's stage 3 does;
// gathered once a phase, every layer's params stayed whole all step. A
// broadcast along the batch (a bias's) is made for each microbatch's
// rows; on one device it was made for the whole batch and sliced, and
// every layer's stayed whole all step.
func TestGradientAccumulationHoldsOneSetOfGradients(t *testing.T) {
	for _, p := range []plan{{dp: 1}, {dp: 2}, {dp: 2, zero: 2}, {dp: 2, zero: 3}, {dp: 2, zero: 3, precision: "bf16"}} {
		t.Run(fmt.Sprintf("%v_%s", p, cmp.Or(p.precision, "fp32")), func(t *testing.T) {
			one := compilePlan(t, p)
			p.micro = 4
			four := compilePlan(t, p)
			grads := 4 * paramCount(one) // one device's fp32 gradients, whole
			sum := grads
			if p.zero >= 2 {
				// Each microbatch's gradients are reduce-scattered as they
				// come, and the shards summed (DeepSpeed's accumulation).
				sum /= int64(p.dp)
			}
			assert.LessOrEqual(t, four.PeakBytes, one.PeakBytes+sum, "4 microbatches' peak against one's %d B", one.PeakBytes)
			// Each partial sum is written over the one before it
			// (lower.accumulateInPlace), as Megatron-LM's main_grad
			// accumulates: the old and the new sum are never both live.
			adds, inPlace := 0, 0
			for _, in := range four.Instrs {
				if v := in.Value; in.Op == "add" && v.Meta.Phase == ir.PhaseBwd && v.Meta.Micro < 0 {
					adds++
					if in.Out == in.Args[0] {
						inPlace++
					}
				}
			}
			assert.Positive(t, adds)
			assert.Equal(t, adds, inPlace, "partial sums written over the sum before them")
			each := func(op string) {
				perMicro := make([]int, 4)
				for _, in := range four.Instrs {
					if k := in.Value.Meta.Micro; in.Op == op && k >= 0 {
						perMicro[k]++
					}
				}
				assert.Positive(t, perMicro[0], op)
				assert.Equal(t, []int{perMicro[0], perMicro[0], perMicro[0], perMicro[0]}, perMicro, "%s in each microbatch", op)
			}
			if p.zero >= 2 {
				each("reduce_scatter")
				// Each as soon as its gradient is made: before the next
				// microbatch starts (under mixed precision microbatch 0's
				// fp32 copies were made at the first sum, after microbatch
				// 1's backward).
				start := map[int]int{}
				for i, in := range four.Instrs {
					if k := in.Value.Meta.Micro; k >= 0 {
						if _, ok := start[k]; !ok {
							start[k] = i
						}
					}
				}
				for i, in := range four.Instrs {
					if k := in.Value.Meta.Micro; in.Op == "reduce_scatter" && k >= 0 && k < 3 {
						assert.Less(t, i, start[k+1], "microbatch %d's %s after microbatch %d started", k, in.Value.Where(), k+1)
					}
				}
				// In buckets, as DeepSpeed's: each bucket's reduce-scatters
				// one microbatch's, issued together.
				micro, at := map[int]int{}, map[int]int{}
				for i, in := range four.Instrs {
					if in.Op != "reduce_scatter" || in.Value.Meta.Micro < 0 {
						continue
					}
					if !assert.Positive(t, in.Bucket, "%s is not bucketed", in.Value.Where()) {
						continue
					}
					if k, ok := micro[in.Bucket]; ok {
						assert.Equal(t, k, in.Value.Meta.Micro, "bucket %d spans microbatches", in.Bucket)
						assert.Equal(t, at[in.Bucket]+1, i, "bucket %d's reductions apart", in.Bucket)
					}
					micro[in.Bucket], at[in.Bucket] = in.Value.Meta.Micro, i
				}
			}
			if p.zero == 3 {
				each("all_gather")
			}
			t.Logf("peak %d B with one microbatch, %d B with 4 (gradients %d B)", one.PeakBytes, four.PeakBytes, grads)
		})
	}
}
