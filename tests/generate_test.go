package tests

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/examples/moe"
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/frontend/nn/gpt2"
	"gcompile/generate"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// genModel is a small model of each family for the generation tests:
// GPT-2 with a learned position table longer than its training sequence,
// and the Llama with fewer k/v heads than tp2 can split evenly across
// query heads (kv_heads 1: each tp rank holds the one k/v head whole).
var genModels = []struct {
	name string
	fn   frontend.ModelFunc
	set  string
}{
	{"gpt", gpt.Model, "layers=2,hidden=32,heads=4,seq=16,ctx=40"},
	{"llama", llama.Model, "layers=2,hidden=32,heads=4,kv_heads=1,ffn=48,seq=16,rope_theta=100"},
	// A capacity that drops tokens in training and evaluation, and
	// groups that do not divide a prefill: generation routes dropless,
	// each token to its own experts, so neither the padding past a
	// prompt nor the tokens after a position change its logits.
	{"moe", moe.Model, "layers=2,hidden=32,heads=4,seq=16,experts=4,router=gshard,capacity=0.5,group=8"},
}

// Expert choice cannot generate (an expert takes the top tokens of a
// group, later ones included): compiling it for generation names the
// router and the routers that can.
func TestExpertChoiceCannotGenerate(t *testing.T) {
	sizes, err := frontend.ParseSet("layers=2,hidden=32,heads=4,seq=16,experts=4,router=expert-choice")
	require.NoError(t, err)
	build := func(fc frontend.Config) (*ir.Module, error) {
		fc.Set = sizes
		return frontend.Build(moe.Model, fc)
	}
	c := compile.Config{Model: "model.go", Batch: 1, Devices: 1, Microbatches: 1, Optimizer: "adamw", DPSync: "sync",
		Recompute: "none", Precision: "fp32", BucketMB: 25, Clip: 1, Beta1: 0.9, Beta2: 0.95}
	require.NoError(t, c.Validate())
	_, err = compile.CompileGeneration(&c, build, 1, 8, 8, passes.Hooks{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the expert-choice router cannot generate")
}

// genCompile compiles a model's prefill and decode programs for plan
// (dp, tp) and loads each on CPU devices, with the same random weights.
// everyRow keeps the prefill's logits of every token
// (frontend.Generation.EveryRow).
func genCompile(t testing.TB, fn frontend.ModelFunc, set string, dp, tp, batch, prompt, context int, everyRow bool) (*compile.Generation, *cpu.Cluster, *cpu.Cluster) {
	t.Helper()
	sizes, err := frontend.ParseSet(set)
	require.NoError(t, err)
	build := func(fc frontend.Config) (*ir.Module, error) {
		fc.Set = sizes
		if fc.Generate != nil {
			fc.Generate.EveryRow = everyRow
		}
		return frontend.Build(fn, fc)
	}
	c := compile.Config{Model: "model.go", Batch: batch, Devices: dp * tp, DP: dp, TP: tp, Microbatches: 1, Optimizer: "adamw", DPSync: "sync",
		Recompute: "none", Precision: "fp32", BucketMB: 25, Clip: 1, Beta1: 0.9, Beta2: 0.95, Verify: true}
	require.NoError(t, c.Validate())
	require.NoError(t, compile.CheckGenerationPlan(&c))
	g, err := compile.CompileGeneration(&c, build, batch, prompt, context, passes.Hooks{})
	require.NoError(t, err)
	pre, err := cpu.NewCluster(g.Prefill, cpu.Options{})
	require.NoError(t, err)
	dec, err := cpu.NewCluster(g.Decode, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, pre.InitParams(7))
	spreadWeights(t, pre, 7)
	require.NoError(t, generate.ShareWeights(&dec.MeshCluster, &pre.MeshCluster))
	return g, pre, dec
}

// spreadWeights adds N(0, 0.2²) noise to every param: with GPT-2's init
// (std 0.02) the logits are near 0 and attention near uniform, which would
// hide a key at a wrong position.
func spreadWeights(t testing.TB, c *cpu.Cluster, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	for _, name := range generate.Sources(c.Devices[0].Program(), func(b lower.Buffer) bool { return b.Kind == lower.Param }) {
		x, err := c.Global(name)
		require.NoError(t, err)
		for i := range x {
			x[i] += 0.2 * r.NormFloat64()
		}
		require.NoError(t, c.SetGlobal(name, x))
	}
}

// step feeds one program tokens at positions and returns its logits.
func genStep(t testing.TB, c *cpu.Cluster, tokens, positions []int32) []float64 {
	t.Helper()
	require.NoError(t, c.SetInt32("tokens", tokens))
	require.NoError(t, c.SetInt32(ir.PositionsInput, positions))
	require.NoError(t, c.Step())
	l, err := c.WholeOutput(ir.OutputLogits)
	require.NoError(t, err)
	return l
}

// relClose asserts |a−b| ≤ tol·max|want| element by element: relative to
// the row's largest logit, so small logits are held to the same absolute
// bound as the large ones that decide the token.
func relClose(t testing.TB, want, got []float64, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	for i := range want {
		if d := math.Abs(want[i] - got[i]); !(d <= tol*scale) {
			require.Failf(t, "logits differ", "%s: element %d: %v vs %v (|Δ| %.3g > %.3g)", what, i, want[i], got[i], d, tol*scale)
		}
	}
}

// A prefill computes the logits of each prompt's last token alone: its
// logits output is [batch, vocab], and each row is, to the bit, the row
// at that prompt's last token of the prefill that keeps every row, with
// ragged prompts padded on the right, on one device, under dp2 (the
// mask split with the batch) and under tp2 (a vocabulary-parallel head).
// With a vocabulary of 2048 the logits are the prefill's largest
// buffer, and its peak memory is lower.
func TestPrefillComputesTheLastTokensLogits(t *testing.T) {
	const batch, total = 4, 8
	lens := []int{3, 8, 1, 5}
	tokens, positions, last := make([]int32, batch*total), make([]int32, batch*total), make([]int32, batch*total)
	for i := range tokens {
		tokens[i], positions[i] = int32((i*37+11)%256), int32(i%total)
	}
	for b, n := range lens {
		last[b*total+n-1] = 1
	}
	models := append(genModels[:len(genModels):len(genModels)], struct {
		name string
		fn   frontend.ModelFunc
		set  string
	}{"softcap", headModel(func(l *frontend.Tensor) *frontend.Tensor {
		// Gemma's soft cap and a mask row over the vocabulary: the ops
		// after the head are recorded again on the last tokens' rows.
		b := l.Builder()
		mask := make([]float64, l.Dim(1))
		mask[len(mask)-1] = -1e4
		return l.Scale(1.0 / 30).Tanh().Scale(30).Add(b.Constant("mask", mask, 1, len(mask)))
	}), "layers=1"})
	for _, m := range models {
		for _, plan := range []struct{ dp, tp int }{{1, 1}, {2, 1}, {1, 2}} {
			t.Run(fmt.Sprintf("%s/dp%d/tp%d", m.name, plan.dp, plan.tp), func(t *testing.T) {
				set := m.set + ",vocab=2048"
				all, pall, _ := genCompile(t, m.fn, set, plan.dp, plan.tp, batch, total, total, true)
				every := genStep(t, pall, tokens, positions)
				g, pre, _ := genCompile(t, m.fn, set, plan.dp, plan.tp, batch, total, total, false)
				id, ok := g.Prefill.Outputs[ir.OutputLogits]
				require.True(t, ok)
				vocab := len(every) / (batch * total)
				assert.Equal(t, []int{batch, vocab}, []int(g.Prefill.Buffers[id].Global.Shape), "the prefill's logits")
				require.NoError(t, pre.SetInt32(ir.InputLastToken, last))
				got := genStep(t, pre, tokens, positions)
				require.Len(t, got, batch*vocab)
				for b, n := range lens {
					row := (b*total + n - 1) * vocab
					assert.Equal(t, every[row:row+vocab], got[b*vocab:(b+1)*vocab], "prompt %d's last token (%d)", b, n)
				}
				assert.Less(t, g.Prefill.PeakBytes, all.Prefill.PeakBytes, "the prefill's peak memory")
			})
		}
	}
}

// A head the prefill cannot narrow (an op after it that mixes a row's
// logits, here a softmax, or one whose operand does not broadcast to
// the narrowed rows) keeps every row, as the engine reads.
func TestPrefillKeepsEveryRowOfAnotherHead(t *testing.T) {
	// A mask of rank 3 ([1, 1, vocab] over [batch, step, vocab] logits)
	// does not broadcast to the narrowed [batch, vocab]: kept too.
	mask3 := func(l *frontend.Tensor) *frontend.Tensor {
		b := l.Builder()
		rows, vocab := l.Dim(0), l.Dim(1)
		return l.Reshape(2, rows/2, vocab).Add(b.Constant("mask", make([]float64, vocab), 1, 1, vocab)).Reshape(rows, vocab)
	}
	for name, after := range map[string]func(*frontend.Tensor) *frontend.Tensor{"softmax": (*frontend.Tensor).Softmax, "a rank-3 mask": mask3} {
		g, _, _ := genCompile(t, headModel(after), "", 1, 1, 2, 8, 8, false)
		_, ok := g.Prefill.Sources[ir.InputLastToken]
		assert.False(t, ok, name)
		id := g.Prefill.Outputs[ir.OutputLogits]
		assert.EqualValues(t, 2*8*256, g.Prefill.Buffers[id].Global.Shape.NumElements(), "%s: every token's logits", name)
	}
}

// headModel is a one-block GPT whose head's logits go through after
// before the loss.
func headModel(after func(*frontend.Tensor) *frontend.Tensor) frontend.ModelFunc {
	return func(b *frontend.Builder) {
		layers := b.Int("layers", 1, "blocks")
		vocab := b.Int("vocab", 256, "vocabulary")
		seq, batch := b.Sequence(16), b.Batch()
		tokens := b.Input("tokens", ir.I32, batch, seq)
		targets := b.Input("targets", ir.I32, batch, seq)
		x, wte := nn.Embedding(tokens, "wte", vocab, 32)
		for i := range layers {
			x = gpt2.Block(x, fmt.Sprintf("h.%d", i), gpt2.BlockConfig{Heads: 4, Layers: layers, Activation: "gelu"})
		}
		x = nn.LayerNorm(x, "ln_f", gpt2.LayerNormEps)
		b.Loss(nn.CrossEntropy(after(x.Reshape(batch*seq, 32).MatMulT(wte)), targets))
	}
}

// Decoding token by token against the key/value cache gives, at every
// position, the logits one prefill over the whole sequence gives: the
// cache holds exactly the keys and values of the earlier tokens, and
// positions (learned rows, rotary angles) follow the cache; the measured
// peak of every device is the one the memory plan predicts. Two sequences
// of different prompt lengths share each step (ragged prompts, padded on
// the right), on one device and under tp2.
func TestDecodeMatchesPrefill(t *testing.T) {
	const batch, total = 2, 12
	prompts := []int{3, 7}
	for _, m := range genModels {
		for _, tp := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/tp%d", m.name, tp), func(t *testing.T) {
				g, pre, dec := genCompile(t, m.fn, m.set, 1, tp, batch, total, total, true)
				seqs := make([]int32, batch*total)
				for i := range seqs {
					seqs[i] = int32((i*37 + 11) % 256)
				}
				positions := make([]int32, batch*total)
				for i := range positions {
					positions[i] = int32(i % total)
				}
				full := genStep(t, pre, seqs, positions)
				vocab := len(full) / (batch * total)

				// The prompts, padded with other tokens past their ends.
				padded := make([]int32, len(seqs))
				for i := range padded {
					padded[i] = 5
				}
				for b, n := range prompts {
					copy(padded[b*total:b*total+n], seqs[b*total:b*total+n])
				}
				got := genStep(t, pre, padded, positions)
				for b, n := range prompts {
					for i := range n {
						row := (b*total + i) * vocab
						relClose(t, full[row:row+vocab], got[row:row+vocab], 1e-5, fmt.Sprintf("prefill seq %d pos %d", b, i))
					}
				}
				require.NoError(t, runtime.CopySources(&dec.MeshCluster, &pre.MeshCluster, generate.Sources(dec.Devices[0].Program(), lower.Buffer.KVCache)))
				// Each sequence decodes its own next token at its own position.
				for k := 0; ; k++ {
					tok, pos := make([]int32, batch), make([]int32, batch)
					left := false
					for b, n := range prompts {
						p := min(n+k, total-1)
						left = left || n+k < total
						tok[b], pos[b] = seqs[b*total+p], int32(p)
					}
					if !left {
						break
					}
					out := genStep(t, dec, tok, pos)
					for b, n := range prompts {
						if p := n + k; p < total {
							row := (b*total + p) * vocab
							relClose(t, full[row:row+vocab], out[b*vocab:(b+1)*vocab], 1e-5, fmt.Sprintf("decode seq %d pos %d", b, p))
						}
					}
				}
				// The memory plan holds the caches: each device's measured peak
				// is the program's predicted one.
				for _, c := range []struct {
					cl   *cpu.Cluster
					want int64
				}{{pre, g.Prefill.PeakBytes}, {dec, g.Decode.PeakBytes}} {
					peaks, err := c.cl.Peaks()
					require.NoError(t, err)
					for r, p := range peaks {
						assert.Equal(t, c.want, p, "device %d: measured peak = predicted", r)
					}
				}
				assert.Positive(t, g.Decode.Peak.KVCache, "the caches are in the plan")
			})
		}
	}
}
