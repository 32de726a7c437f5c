package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/llama"
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// Context parallelism trains like one device: every activation's
// sequence split over cp, attention by the ring (K/V chunks passed
// around, partial results merged by their log-sum-exp; the sequence in
// the zigzag layout, rank i holding chunks i and 2·cp−1−i, or in
// contiguous chunks) or by Ulysses' all_to_alls, alone and with tensor
// and sequence parallelism (the ring's cp the coarser split of the
// sequence, so sp gathers nothing more over cp), data parallelism with
// ZeRO, and a 1F1B pipeline; on the GPT (learned
// positions) and the Llama (rotary positions, grouped-query attention):
// the same loss at every step (1e-5 relative), the same final weights
// (1e-5 of each tensor's largest entry, the key biases aside as in
// TestDataParallelMatchesOneDevice), the same held-out loss, and every
// device's measured peak equal to the planned one.
func TestContextParallelMatchesOneDevice(t *testing.T) {
	plans := []plan{{cp: 2}, {cp: 4}, {cp: 4, cpLayout: "contiguous"}, {cp: 2, cpImpl: "all2all"}, {cp: 2, tp: 2, sp: true}, {cp: 2, dp: 2, zero: 1}}
	// Ulysses under tp splits the heads each tp rank holds over cp (tp the
	// coarser split of the heads); the GPT's 4 heads and 4 k/v heads allow
	// it at tp2·cp2, the Llama's 2 k/v heads do not (refused, below).
	gptPlans := []plan{{cp: 2, tp: 2, cpImpl: "all2all"}}
	for _, model := range families {
		plans := plans
		if model == "gpt" {
			plans = append(slices.Clone(plans), gptPlans...)
		}
		ref := train(t, plan{model: model})
		check := func(t *testing.T, got trajectory) {
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			worstParam := paramError(t, ref.params, got.params, isKeyBias)
			assert.LessOrEqual(t, worstParam, 1e-5)
			assert.InDelta(t, ref.eval, got.eval, 1e-5*ref.eval, "held-out loss of the final weights")
			t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
		}
		ringGathered := int64(-1)
		for _, p := range plans {
			p.model = model
			t.Run(p.String(), func(t *testing.T) {
				got := train(t, p)
				check(t, got)
				for d, peak := range got.peaks {
					assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", d)
				}
				assertAttentionOverCP(t, got, p.cpImpl)
				// The ring splits the sequence over cp before tp, so sp's
				// collectives over tp move a cp rank's tokens: nothing is
				// gathered over cp that the plan without tp does not.
				gathered := got.prog.CollectiveBytes()["all_gather/cp"]
				switch {
				case p.cpImpl == "" && p.tp <= 1 && p.dp <= 1 && p.cp == 2:
					ringGathered = gathered
				case p.cpImpl == "" && p.tp > 1 && p.sp && p.cp == 2:
					require.GreaterOrEqual(t, ringGathered, int64(0), "the plan without tp runs first")
					assert.Equal(t, ringGathered, gathered, "bytes gathered over cp with tp and sp, and without tp")
				}
			})
		}
		pl := pipePlan{pp: 2, cp: 2, micro: 2, order: scheduleOrder("1f1b"), name: "1f1b", model: model}
		t.Run(pl.String(), func(t *testing.T) { check(t, trainPipeline(t, pl, 2)) })
	}
}

// The bytes ring attention sends count in the program's collective bytes
// ("ring/cp", as --metrics reports them; they were left out, so the ring
// looked free beside Ulysses' all_to_alls): per layer and device, the
// forward passes K and V on at each of the cp−1 steps, the backward K for
// the statistics, K and V for dq, K, V and dk for dk, K and dv for dv,
// and dk and dv go home: (10·(cp−1) + 2) chunks, as the cost model
// prices them.
func TestRingBytesAreCounted(t *testing.T) {
	for _, cp := range []int{2, 4} {
		prog := compilePlan(t, plan{model: "gpt", cp: cp})
		var layers, chunk int64
		for _, in := range prog.Instrs {
			if in.Op == "attention" {
				layers++
				chunk = in.ArgTypes[1].Bytes()
			}
		}
		require.Positive(t, layers)
		assert.Equal(t, layers*(10*int64(cp-1)+2)*chunk, prog.CollectiveBytes()["ring/cp"], "cp %d", cp)
	}
}

// seqFoldModel folds the sequence into fold pieces and sums them
// (position t meets t + seq/fold): a reshape that cuts the dim cp splits
// into an outer dim, as chunked or windowed layers do.
func seqFoldModel(b *frontend.Builder) {
	const hidden, vocab = 16, 256
	fold := b.Int("fold", 2, "pieces the sequence is folded into")
	batch := b.Batch()
	tokens := b.Input("tokens", ir.I32, batch, eqSeq)
	targets := b.Input("targets", ir.I32, batch, eqSeq)
	x, wte := nn.Embedding(tokens, "embed", vocab, hidden)
	y := x.Reshape(batch, fold, eqSeq/fold, hidden).Sum(1).Tanh()
	pen := y.Mul(y).Mean(0, 1, 2)
	b.Output("pen", pen)
	logits := x.Reshape(batch*eqSeq, hidden).MatMulT(wte)
	b.Loss(nn.CrossEntropy(logits, targets).Add(pen.Scale(100)))
}

// A reshape that cuts the sequence into an outer dim keeps cp's split
// only when that dim cuts into as many pieces as the layout does: 2·cp
// under zigzag. [seq] → [2, seq/2] under zigzag cp2 was placed split, so
// rank 0 took itself for the first half where it holds the first and
// last quarters, and trained 7e-4 off one device with no error; it is
// now gathered. Folds into 2·cp pieces stay split.
func TestContextParallelFoldsTheSequence(t *testing.T) {
	for _, c := range []struct {
		fold, cp int
		layout   string
	}{{2, 2, ""}, {4, 4, ""}, {4, 2, ""}, {2, 2, "contiguous"}} {
		t.Run(fmt.Sprintf("fold%d-cp%d%s", c.fold, c.cp, c.layout), func(t *testing.T) {
			model := fmt.Sprintf("seqfold-%d", c.fold)
			ref := train(t, plan{model: model})
			got := train(t, plan{model: model, cp: c.cp, cpLayout: c.layout})
			assertLossesClose(t, ref.losses, got.losses, 1e-5)
			for i := range ref.outputs {
				assert.InDelta(t, ref.outputs[i]["pen"], got.outputs[i]["pen"], 1e-5*ref.outputs[i]["pen"], "step %d", i+1)
			}
			// The forward fold stays split where its outer dim cuts into
			// the layout's pieces (2·cp zigzag, cp contiguous), and is
			// gathered where it does not.
			pieces := 2 * c.cp
			if c.layout == "contiguous" {
				pieces = c.cp
			}
			folds := 0
			for _, in := range got.prog.Instrs {
				// The fold is a view (no instruction of its own): the sum
				// over its pieces reads it.
				if in.Op == "reduce_sum" && in.Value.Meta.Phase == ir.PhaseFwd && len(in.ArgTypes) == 1 && in.ArgTypes[0].Rank() == 4 {
					folds++
					fold := in.Value.Args[0]
					split := fold.Place[0].Kind == ir.Shard
					assert.Equal(t, c.fold%pieces == 0, split, "the fold into %d over cp %d (%s) placed %v", c.fold, c.cp, c.layout, fold.Place)
				}
			}
			assert.Equal(t, 1, folds, "the model's one fold")
		})
	}
}

// A plan context parallelism cannot run is refused before anything is
// built, naming the rule: cp must divide the sequence, and Ulysses
// (all2all) must divide the heads and the k/v heads each device has.
func TestContextParallelBadPlans(t *testing.T) {
	cases := []struct {
		name  string
		model string
		mesh  []ir.MeshAxis
		impl  string
		want  string
	}{
		{"cp does not divide the sequence", "gpt", []ir.MeshAxis{{Name: "cp", Size: 3}}, "", "context parallelism splits \"tokens\" i32[8,16] along its sequence (dim 1) over cp=3, which does not divide it"},
		{"2·cp does not divide the sequence (zigzag)", "gpt", []ir.MeshAxis{{Name: "cp", Size: 16, Zigzag: true}}, "", "into 2·cp = 32 chunks, which do not divide it (give a --cp that does, or --cp-layout contiguous)"},
		{"cp past the sequence (zigzag)", "gpt", []ir.MeshAxis{{Name: "cp", Size: 32, Zigzag: true}}, "", "(cp=32 is more than its 16 positions: give a --cp that divides half of them)"},
		{"cp does not divide the sequence (zigzag)", "gpt", []ir.MeshAxis{{Name: "cp", Size: 3, Zigzag: true}}, "", "(cp=3 does not divide the 16 positions either: give a --cp whose double divides them)"},
		{"all2all in the zigzag layout", "gpt", []ir.MeshAxis{{Name: "cp", Size: 2, Zigzag: true}}, "all2all", "use --cp-layout contiguous"},
		{"all2all, k/v heads not divisible", "llama", []ir.MeshAxis{{Name: "cp", Size: 4}}, "all2all", "--cp-impl all2all splits the key/value heads over cp=4, and the device's 2 of the model's 2 are not divisible by it"},
		{"all2all, heads left by tp not divisible", "gpt", []ir.MeshAxis{{Name: "cp", Size: 4}, {Name: "tp", Size: 2}}, "all2all", "the device's 2 of the model's 4 are not divisible by it: tp·cp must divide the model's 4: give a smaller --tp or --cp"},
		{"unfused attention", "llama-unfused", []ir.MeshAxis{{Name: "cp", Size: 2, Zigzag: true}}, "", "runs attention as the fused op, by the ring or Ulysses; this is the causal mask of attention composed of primitive ops"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model, attention, _ := strings.Cut(c.model, "-")
			m := buildAttention(t, model, 0, attention)
			opts := passes.DefaultOptions()
			opts.Mesh = &ir.Mesh{Axes: c.mesh}
			opts.CPImpl = c.impl
			_, err := passes.Run(m, opts, passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "model.go:", "the error names the user's line")
		})
	}
}

// assertAttentionOverCP checks that attention ran split over cp as the
// strategy says, not on gathered sequences: under the ring every
// attention op's q is split on its sequence (dim 2) over cp and nothing
// moves by all_to_all over cp; under all2all q is split on its heads
// (dim 1) and all_to_alls over cp move it.
func assertAttentionOverCP(t *testing.T, got trajectory, impl string) {
	t.Helper()
	mesh := got.prog.Mesh
	cp := mesh.SequenceAxis()
	require.GreaterOrEqual(t, cp, 0)
	dim := 2
	if impl == "all2all" {
		dim = 1
		assert.Positive(t, got.prog.CollectiveBytes()["all_to_all/cp"], "Ulysses moves q, k, v and the output by all_to_all over cp")
	} else {
		assert.Zero(t, got.prog.CollectiveBytes()["all_to_all/cp"])
	}
	n := 0
	for _, in := range got.prog.Instrs {
		if in.Op == "attention" || in.Op == "attention_grad_k" {
			n++
			assert.True(t, in.Value.Args[0].Place[cp].Placed(dim), "%s: q placed %v on cp", in.Op, in.Value.Args[0].Place)
		}
	}
	assert.Positive(t, n, "the program has attention instructions")
}

// compileCP compiles the Llama at the given sizes for one device's
// program under the mesh (nil: one device).
func compileCP(t testing.TB, set map[string]string, batch int, mesh *ir.Mesh, edit func(*passes.Options)) *lower.Program {
	t.Helper()
	m, err := frontend.Build(llama.Model, frontend.Config{Name: "llama", Batch: batch, Set: set})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Mesh = mesh
	if edit != nil {
		edit(opts)
	}
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// Context parallelism divides activation memory by cp at a fixed
// sequence length: the Llama at 32768 tokens stashes 640 MiB of
// activations for its backward on one device (40 tensors of 32768×128
// floats, and the 4-byte loss) and exactly an eighth of that on each of
// 8 devices under cp8, the loss aside; the ring's chunks and running
// results are scratch each attention instruction holds only while it
// runs, sized exactly (here the forward's: K and V chunks held and
// received, the running output in float64, two log-sum-exps, one step's
// output), and the device's peak is at most its eighth plus that scratch.
func TestContextParallelMemory(t *testing.T) {
	set := map[string]string{"seq": "32768"}
	one := compileCP(t, set, 1, nil, nil)
	cp8 := compileCP(t, set, 1, &ir.Mesh{Axes: []ir.MeshAxis{{Name: "cp", Size: 8}}}, nil)
	const loss = 4
	assert.Equal(t, int64(40*32768*128*4+loss), one.Peak.Activations, "one device: activations at the peak")
	assert.Equal(t, (one.Peak.Activations-loss)/8+loss, cp8.Peak.Activations, "cp8: an eighth of the activations at the peak")

	// Scratch of the forward ring instruction on one device: batch 1,
	// 4 heads, 2 k/v heads, 32768/8 = 4096 rows, head dim 32, float32.
	const rows, hd = 4 * 4096, 32
	const kv = 2 * 4096 * hd * 4
	wantFwd := int64(4*kv + rows*hd*8 + 2*rows*8 + rows*hd*4)
	var scratch []int64
	for _, in := range cp8.Instrs {
		if len(in.Scratch) > 0 {
			b := cp8.Buffers[in.Scratch[0]]
			assert.True(t, b.Scratch)
			assert.Equal(t, "workspace", b.Category())
			if in.Op == "attention" {
				assert.Equal(t, wantFwd, b.Bytes, "the forward's ring scratch")
			}
			scratch = append(scratch, b.Bytes)
		}
	}
	require.Len(t, scratch, 2*5, "two layers of five ring attention instructions each")
	most := slices.Max(scratch)
	assert.LessOrEqual(t, cp8.PeakBytes-cp8.PersistentBytes, (one.PeakBytes-one.PersistentBytes)/8+most,
		"cp8's live bytes at its peak are at most an eighth of one device's plus the largest ring scratch")
	t.Logf("one device: peak %d B (activations %d); cp8: peak %d B (activations %d), ring scratch %d–%d B per instruction",
		one.PeakBytes, one.Peak.Activations, cp8.PeakBytes, cp8.Peak.Activations, slices.Min(scratch), most)
}

// llama3At128K is Llama 3 8B at 131072 tokens of context.
var llama3At128K = map[string]string{"layers": "32", "hidden": "4096", "heads": "32", "kv_heads": "8", "ffn": "14336",
	"vocab": "128256", "seq": "131072", "rope_theta": "500000"}

// llama3At128KMesh is 64 devices: tp8 (with sequence parallelism) × cp8.
var llama3At128KMesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "cp", Size: 8}, {Name: "tp", Size: 8}}}

// Llama 3 8B trained at 131072 tokens of context on 64 GPUs, tp8 × cp8,
// bf16 with fp32 master weights: each device's program fits an 80 GB
// H100 (BenchmarkCompileLlama3At128K times the compile).
func TestContextParallelLlama3At128KFits(t *testing.T) {
	p := compileCP(t, llama3At128K, 1, llama3At128KMesh, func(o *passes.Options) {
		o.SequenceParallel, o.Precision = true, "bf16"
	})
	assert.Less(t, p.PeakBytes, int64(80e9), "fits an 80 GB H100")
	t.Logf("Llama 3 8B at seq 131072, tp8·cp8: predicted peak %.1f GB per device (%.1f GB persistent)", float64(p.PeakBytes)/1e9, float64(p.PersistentBytes)/1e9)
}

// BenchmarkCompileLlama3At128K times building, passing and lowering
// Llama 3 8B at 131072 tokens for 64 devices (tp8 × cp8).
func BenchmarkCompileLlama3At128K(b *testing.B) {
	for b.Loop() {
		compileCP(b, llama3At128K, 1, llama3At128KMesh, func(o *passes.Options) { o.SequenceParallel, o.Precision = true, "bf16" })
	}
}

// BenchmarkRingAttentionStep is one training step of the Llama at a 4096-
// token context (batch 1) on cp virtual CPU devices, the ring in the
// zigzag layout, against cp1: what splitting the sequence costs or saves
// on the host's cores (the devices share them), tokens per second.
func BenchmarkRingAttentionStep(b *testing.B) {
	const seq = 4096
	for _, cp := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("cp%d", cp), func(b *testing.B) {
			var mesh *ir.Mesh
			if cp > 1 {
				mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "cp", Size: cp, Zigzag: true, Outer: true}}}
			}
			benchStep(b, compileCP(b, map[string]string{"seq": fmt.Sprint(seq)}, 1, mesh, nil), seq)
		})
	}
}

// BenchmarkSequenceParallelUnderCP is a training step of the Llama at a
// 4096-token context on cp2·tp2 with sequence parallelism, the sequence
// split over cp first (outer, the ring's layout) or over tp first: what
// the split order saves, in step time and in bytes moved over cp.
func BenchmarkSequenceParallelUnderCP(b *testing.B) {
	const seq = 4096
	sp := func(o *passes.Options) { o.SequenceParallel = true }
	for _, outer := range []bool{true, false} {
		name := map[bool]string{true: "cp_first", false: "tp_first"}[outer]
		b.Run(name, func(b *testing.B) {
			mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "cp", Size: 2, Zigzag: true, Outer: outer}, {Name: "tp", Size: 2}}}
			prog := compileCP(b, map[string]string{"seq": fmt.Sprint(seq)}, 1, mesh, sp)
			bytes := prog.CollectiveBytes()
			var cp int64
			for k, v := range bytes {
				if strings.HasSuffix(k, "/cp") {
					cp += v
				}
			}
			benchStep(b, prog, seq)
			b.ReportMetric(float64(cp), "cp-bytes/step")
		})
	}
}

// benchStep times training steps of prog (batch 1, seq tokens) on
// virtual CPU devices, reporting tokens per second.
func benchStep(b *testing.B, prog *lower.Program, seq int) {
	cl, err := cpu.NewCluster(prog, cpu.Options{})
	require.NoError(b, err)
	require.NoError(b, cl.InitParams(1))
	tokens := make([]int32, seq)
	for i := range tokens {
		tokens[i] = int32(i * 7 % 256)
	}
	for _, in := range []string{"tokens", "targets"} {
		require.NoError(b, cl.SetInt32(in, tokens))
	}
	require.NoError(b, cl.SetScalar("lr", 1e-3))
	require.NoError(b, cl.SetScalar("step", 1))
	for b.Loop() {
		require.NoError(b, cl.Step())
	}
	b.ReportMetric(float64(seq)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
