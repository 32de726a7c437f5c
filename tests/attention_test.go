package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// The fused attention op against the composition of primitive ops it
// replaces (--set attention=unfused): the models' losses and every
// gradient, in float64 and float32, on the oracles' GPT and Llama (the
// Llama's 4 query heads share 2 k/v heads) with their spread weights, so
// attention is far from uniform.

// unfusedModel is an oracle model with the unfused attention core.
type unfusedModel struct{ oracleModel }

func (u unfusedModel) model(dtype ir.DType) (frontend.ModelFunc, frontend.Config) {
	fn, cfg := u.oracleModel.model(dtype)
	set := map[string]string{"attention": "unfused"}
	for k, v := range cfg.Set {
		set[k] = v
	}
	cfg.Set = set
	return fn, cfg
}

// TestFusedAttentionMatchesUnfused: one forward and backward step of each
// family with both attention cores on the same weights and tokens. The
// loss and every parameter's gradient agree to float64 rounding (1e-10
// relative to the tensor's largest entry) and in float32 within 1e-6 (the
// loss) and 1e-5 (each gradient, relative to its largest entry); the
// gradient of GPT's key bias, zero in exact arithmetic, is rounding noise
// in both.
func TestFusedAttentionMatchesUnfused(t *testing.T) {
	models := []oracleModel{oracleSizes[1], llamaOracleSizes[0]}
	for _, s := range models {
		for _, tc := range []struct {
			dtype          ir.DType
			loss, grad, eq float64
		}{{ir.F64, 1e-12, 1e-10, 1e-12}, {ir.F32, 1e-6, 1e-5, 1e-5}} {
			t.Run(fmt.Sprintf("%s_%v", s, tc.dtype), func(t *testing.T) {
				fused := loadOracle(t, s, tc.dtype)
				ref := loadOracle(t, unfusedModel{s}, tc.dtype)
				dev64 := loadOracle(t, s, ir.F64)
				w := initOracleWeights(t, dev64, s)
				setWeights(t, fused, s.params(), w)
				setWeights(t, ref, s.params(), w)
				toks, tgts := randomTokens(s, 3)
				loss, grads := stepOracle(t, fused, s.params(), toks, tgts)
				refLoss, refGrads := stepOracle(t, ref, s.params(), toks, tgts)
				require.LessOrEqual(t, lossErr(loss, refLoss), tc.loss, "loss: fused %v, unfused %v", loss, refLoss)
				worst := 0.0
				for _, p := range s.params() {
					g, gz := s.splitZeros(p.name, grads[p.name])
					r, rz := s.splitZeros(p.name, refGrads[p.name])
					require.Positive(t, maxAbs(r), "the unfused gradient of %s is zero: the check would prove nothing", p.name)
					if gz != nil {
						assert.LessOrEqual(t, maxAbs(gz), tc.eq*maxAbs(r), "fused key-bias gradient of %s is not ~0", p.name)
						assert.LessOrEqual(t, maxAbs(rz), tc.eq*maxAbs(r), "unfused key-bias gradient of %s is not ~0", p.name)
					}
					e := scaleErr(g, r)
					worst = max(worst, e)
					assert.LessOrEqual(t, e, tc.grad, "gradient of %s: max|Δ|/max|g| = %g", p.name, e)
				}
				t.Logf("%s %v: loss %.10g (unfused %.10g, rel err %.2g), worst gradient max|Δ|/max|g| %.2g", s, tc.dtype, loss, refLoss, lossErr(loss, refLoss), worst)
			})
		}
	}
}

// Training with the fused attention follows the unfused composition:
// over the equivalence run's 20 AdamW steps in fp32, the losses agree to
// 1e-5 relative at every step on both families, and so do the final
// weights to 1e-4 of each tensor's largest entry, except GPT's key bias,
// whose gradient is zero in exact arithmetic so that Adam turns either
// core's rounding noise into steps of its own.
func TestFusedAttentionTrainsLikeUnfused(t *testing.T) {
	for _, model := range families {
		t.Run(model, func(t *testing.T) {
			ref := train(t, plan{dp: 1, model: model, attention: "unfused"})
			got := train(t, plan{dp: 1, model: model})
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			assert.InEpsilon(t, ref.eval, got.eval, 1e-5, "held-out loss")
			worstParam := paramError(t, ref.params, got.params, isKeyBias)
			assert.LessOrEqual(t, worstParam, 1e-4)
			t.Logf("%s: worst loss rel err %.2g, worst param err %.2g", model, worst, worstParam)
		})
	}
}

// gpt2Small is GPT-2 small's widths and vocabulary at sequence 1024.
const gpt2Small = "layers=12,hidden=768,heads=12,seq=1024,vocab=50257"

// The fused attention makes no [b, a, s, s] tensor, so at sequence 1024
// GPT-2 small's peak drops by exactly the bytes of those the unfused plan
// holds at its peak. With the tied LM head over 50257 tokens the peak of
// both plans without full recompute is in the head's backward (the logits,
// their fp32 copy with the gradient written over it, and the gradient's
// product with the head, outweigh any layer's backward), where every
// layer's stash is live. The unfused attention stashes one [b, a, s, s]
// tensor per layer, the softmax probabilities its backward reads (the
// scores and the masked scores are gone by then); the fused op stashes its
// output in the [b, s, a, hd] layout the output projection reads, the very
// buffer the unfused plan keeps for the projection (after its transpose),
// so nothing else differs but the unfused plan's 4-byte 1/√hd scalar.
// Hence, at b = 2:
//
//	none:       Δpeak = L·b·a·s²·4 + 4 = 12·100,663,296 + 4 = 1,207,959,556 B
//	selective:  Δpeak = 4 (no plan holds a [b, a, s, s] tensor at the peak:
//	            the unfused plan replays its probabilities in the backward)
//
// and the fused plan under no recompute equals the unfused one under
// selective recompute but for those 4 bytes: the fused op keeps what
// selective recompute keeps, and replays nothing. Under full recompute the
// stash is one tensor a layer, and the unfused plan's peak moves into a
// layer's backward, where its replayed [b, a, s, s] tensors are live.
func TestFusedAttentionPeakAtSeq1024(t *testing.T) {
	const b, a, s, layers = 2, 12, 1024, 12
	probs := int64(b * a * s * s * 4)
	peaks := map[string]int64{}
	for _, tc := range []struct {
		recompute string
		drop      int64
	}{{"none", layers*probs + 4}, {"selective", 4}, {"full", -1}} {
		t.Run(tc.recompute, func(t *testing.T) {
			var peak [2]int64
			for i, attention := range []string{"unfused", "fused"} {
				res := compileExample(t, "gpt", gpt2Small+",attention="+attention, b, compile.Config{Recompute: tc.recompute})
				prog := lower.ProgramOf(res.Programs, 0)
				peak[i] = prog.PeakBytes
				at := prog.Instrs[prog.PeakAt].Value
				if tc.drop >= 0 {
					assert.True(t, at.Meta.Phase == ir.PhaseBwd && at.Meta.Layer < 0, "%s, %s: the peak is in the head's backward, at %s", attention, tc.recompute, at.Where())
				}
				var square int64
				for _, id := range prog.PeakLive {
					if sh := prog.Buffers[id].Type.Shape; len(sh) == 4 && sh[2] == s && sh[3] == s {
						square += prog.Buffers[id].Bytes
					}
				}
				if attention == "fused" {
					for _, buf := range prog.Buffers {
						sh := buf.Type.Shape
						assert.False(t, len(sh) >= 2 && sh[len(sh)-2] == s && sh[len(sh)-1] == s, "the fused plan holds %s %v", buf.Name, buf.Type)
					}
				} else if tc.recompute == "none" {
					assert.Equal(t, layers*probs, square, "the unfused peak holds one [b,a,s,s] tensor per layer")
				}
				peaks[attention+"/"+tc.recompute] = prog.PeakBytes
				t.Logf("%s, recompute %s: peak %d B at %s; [b,a,s,s] tensors live there %d B", attention, tc.recompute, prog.PeakBytes, at.Op, square)
			}
			if tc.drop >= 0 {
				assert.Equal(t, tc.drop, peak[0]-peak[1], "peak drop: unfused %d B, fused %d B", peak[0], peak[1])
			} else {
				assert.Greater(t, peak[0], peak[1], "the unfused plan's replayed scores at its peak")
			}
		})
	}
	assert.Equal(t, peaks["unfused/selective"]-4, peaks["fused/none"], "the fused attention keeps what selective recompute keeps")
}

// --recompute selective on a model whose attention is the fused op is not
// an error and not silent: there is nothing [b, a, s, s] to drop, the pass
// says so in its note (which the CLI prints and the metrics, report and
// dump show), nothing is replayed and the plan is the one without
// recompute. Full recompute replays the fused op like any forward op.
func TestSelectiveRecomputeOfFusedAttentionIsANote(t *testing.T) {
	for _, model := range families {
		t.Run(model, func(t *testing.T) {
			m := build(t, model, 0)
			opts := passes.DefaultOptions()
			opts.Recompute = "selective"
			results, err := passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)
			var note string
			for _, r := range results {
				if r.Name == "recompute" {
					note = r.Note
				} else {
					assert.Empty(t, r.Note, "pass %s", r.Name)
				}
			}
			assert.Contains(t, note, "2 fused attention op(s) keep no [batch, heads, seq, seq] scores or probabilities")
			assert.Contains(t, note, "nothing is replayed")
			for _, v := range m.Values {
				assert.NotEqual(t, ir.PhaseRecompute, v.Meta.Phase, "%s is replayed", v.Where())
			}
			assert.Equal(t, compilePlan(t, plan{dp: 1, model: model}).PeakBytes, compilePlan(t, plan{dp: 1, model: model, recompute: "selective"}).PeakBytes)

			full := compilePlan(t, plan{dp: 1, model: model, recompute: "full"})
			replayed := 0
			for _, in := range full.Instrs {
				if in.Op == "attention" && in.Value.Meta.Phase == ir.PhaseRecompute {
					replayed++
				}
			}
			assert.Equal(t, 2, replayed, "full recompute replays each layer's attention")
		})
	}
}

// Under tensor parallelism the fused op splits heads: q, the output and
// its gradient on their heads; k and v on theirs when tp divides them
// (GPT at tp=2, the Llama's 2 k/v heads at tp=2), else whole (the Llama at
// tp=4), each device reading its query heads' k/v heads, with the k/v
// gradients partial sums reduced across the devices. No attention operand
// is gathered or sliced out of a whole the device made.
func TestFusedAttentionSplitsHeads(t *testing.T) {
	for _, tc := range []struct {
		model   string
		tp      int
		kvSplit bool
	}{{"gpt", 2, true}, {"llama", 2, true}, {"llama", 4, false}} {
		t.Run(fmt.Sprintf("%s_tp%d", tc.model, tc.tp), func(t *testing.T) {
			m := build(t, tc.model, 0)
			opts := passes.DefaultOptions()
			opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: tc.tp}}}
			_, err := passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)
			kv := ir.Placement{Kind: ir.Replicate}
			if tc.kvSplit {
				kv = ir.Placement{Kind: ir.Shard, Dim: 1}
			}
			seen := map[string]int{}
			for _, v := range m.Values {
				if !strings.HasPrefix(v.Op, "attention") {
					continue
				}
				seen[v.Op]++
				assert.Equal(t, ir.Placement{Kind: ir.Shard, Dim: 1}, v.Args[0].Place[0], "%s: q split by heads", v.Where())
				assert.Equal(t, kv, v.Args[1].Place[0], "%s: k", v.Where())
				switch v.Op {
				case "attention":
					assert.Equal(t, ir.Placement{Kind: ir.Shard, Dim: 2}, v.Place[0], "the output [b, s, heads, hd] split by heads")
				case "attention_grad_k", "attention_grad_v":
					want := kv
					if !tc.kvSplit {
						want = ir.Placement{Kind: ir.Partial}
					}
					assert.Equal(t, want, v.Place[0], "%s", v.Where())
				}
			}
			assert.Equal(t, map[string]int{"attention": 2, "attention_stats": 2, "attention_grad_q": 2, "attention_grad_k": 2, "attention_grad_v": 2}, seen)
			assert.Empty(t, passes.Oversized(m), "nothing made larger than its uses need")
		})
	}
}

// The fused attention's work, from the op table's cost (counted over the
// score pairs a query may see): per layer and head 4·s²·hd for the two
// products, halved and a little more under causal, s(s+1)/2 pairs.
func TestFusedAttentionCost(t *testing.T) {
	info, ok := ir.Lookup("attention")
	require.True(t, ok)
	const b, h, s, hd = 2, 12, 1024, 64
	q, kv := ir.T(ir.BF16, b, h, s, hd), ir.T(ir.BF16, b, h, s, hd)
	out := ir.AttentionOutType(q)
	full, bytes := info.Cost([]ir.Type{q, kv, kv}, out, ir.Attrs{"scale": 0.125})
	causal, _ := info.Cost([]ir.Type{q, kv, kv}, out, ir.Attrs{"scale": 0.125, "causal": true})
	perPair := int64(4*hd + 4 + ir.TranscendentalFlops)
	assert.Equal(t, int64(b*h*s*s)*perPair, full)
	assert.Equal(t, int64(b*h*s*(s+1)/2)*perPair, causal)
	assert.InDelta(t, 0.5, float64(causal)/float64(full), 1e-3)
	assert.Equal(t, int64(4*b*h*s*hd*2), bytes, "q, k, v read, out written, 2 bytes each")
}
