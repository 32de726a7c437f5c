package tests

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
	"gcompile/passes"
)

// The Mixtral (top-2 softmax router, renormalised, dropless SwiGLU
// experts, one balancing loss over all layers) trains like one device
// under expert, tensor, context, pipeline and data parallelism: the same
// loss every step (1e-5 relative), the same final params (1e-5 of each
// tensor's largest entry), the same held-out loss and the same per-layer
// loads and shared balancing loss every step. make test runs ep2·tp2,
// cp2·ep2 (the ring, zigzag) and pp2·dp2·ep2·tp2 (1F1B, 16 devices);
// make test-full the rest.
func TestMixtralMatchesOneDevice(t *testing.T) {
	oneF1B := scheduleOrder("1f1b")
	plans := []plan{{ep: 2, tp: 2}, {cp: 2, ep: 2}}
	pipes := []pipePlan{{pp: 2, dp: 2, ep: 2, tp: 2, micro: 2, order: oneF1B, name: "1f1b"}}
	if fullMatrix() {
		plans = append(plans, plan{ep: 4}, plan{dp: 2, ep: 2, zero: 1}, plan{dp: 2, ep: 2, tp: 2, micro: 2, zero: 2},
			plan{ep: 2, micro: 2, recompute: "full"}, plan{dp: 2, ep: 2, offload: "optimizer"})
		pipes = append(pipes, pipePlan{pp: 2, ep: 2, micro: 2, order: oneF1B, name: "1f1b"},
			pipePlan{pp: 2, ep: 2, tp: 2, micro: 4, order: scheduleOrder("gpipe"), name: "gpipe"},
			pipePlan{pp: 2, dp: 2, micro: 2, order: oneF1B, name: "1f1b"})
	}
	ref := train(t, plan{model: "mixtral"})
	require.Less(t, ref.losses[eqSteps-1], ref.losses[0]-0.5, "the reference run must actually learn")
	for step, o := range ref.outputs {
		for l := range 2 {
			name := fmt.Sprintf("model.layers.%d.block_sparse_moe", l)
			require.Zero(t, o[name+".dropped"], "step %d: dropless routing drops nothing", step+1)
			load := 0.0
			for e := range 4 {
				load += o[fmt.Sprintf("%s.load.e%d", name, e)]
			}
			require.InDelta(t, 2, load, 1e-9, "step %d layer %d: every token is processed by its 2 experts", step+1, l)
		}
		require.Contains(t, o, "aux")
		require.Contains(t, o, "lm_loss")
	}
	check := func(t *testing.T, got trajectory) {
		worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
		worstParam := paramError(t, ref.params, got.params, nil)
		assert.LessOrEqual(t, worstParam, 1e-5)
		assert.InDelta(t, ref.eval, got.eval, 1e-5*ref.eval, "held-out loss of the final weights")
		for step := range ref.outputs {
			for name, want := range ref.outputs[step] {
				assert.InDelta(t, want, got.outputs[step][name], 1e-6, "step %d output %s", step+1, name)
			}
		}
		t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
	}
	for _, p := range plans {
		p.model = "mixtral"
		t.Run(p.String(), func(t *testing.T) {
			got := train(t, p)
			check(t, got)
			for d, peak := range got.peaks {
				assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", d)
			}
		})
	}
	for _, pl := range pipes {
		pl.model = "mixtral"
		t.Run(pl.String(), func(t *testing.T) {
			check(t, trainPipeline(t, pl, 2))
		})
	}
}

// Under cp, routing groups that a sequence's chunks hold whole are routed
// where they are: every MoE op stays split over cp (each sequence's
// groups a block, S(0)xbatch), so no cp rank routes or runs another's
// tokens and nothing is gathered over cp, and the Mixtral still trains
// like one device with the same groups, alone and with its experts over
// ep (whose sequences split the blocks: a collective over cp then sees
// batch/ep of them, and the expert buffer's all_to_alls over ep move
// whole sequences without joining cp's split first). Groups the chunks do
// not hold whole (cp4's chunks of 2 tokens) are gathered and routed whole,
// as the default group of a sequence is.
func TestMixtralRoutesItsOwnGroupsUnderCP(t *testing.T) {
	ref := train(t, plan{model: "mixtral-groups"})
	for _, c := range []struct {
		p     plan
		local bool // the groups fit the chunks
	}{{plan{cp: 2}, true}, {plan{cp: 2, ep: 2}, true}, {plan{cp: 4}, false}} {
		p := c.p
		p.model = "mixtral-groups"
		t.Run(p.String(), func(t *testing.T) {
			got := train(t, p)
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			worstParam := paramError(t, ref.params, got.params, nil)
			assert.LessOrEqual(t, worstParam, 1e-5)
			for step := range ref.outputs {
				for name, want := range ref.outputs[step] {
					assert.InDelta(t, want, got.outputs[step][name], 1e-6, "step %d output %s", step+1, name)
				}
			}
			cp := got.prog.Mesh.SequenceAxis()
			n := 0
			for _, in := range got.prog.Instrs {
				if in.Op == "moe_dispatch" || in.Op == "moe_combine" {
					n++
					if c.local {
						assert.Equal(t, ir.Shard, in.Value.Place[cp].Kind, "%s placed %v: its groups stay split over cp", in.Op, in.Value.Place)
					} else {
						assert.Equal(t, ir.Replicate, in.Value.Place[cp].Kind, "%s placed %v: groups of 4 do not fit cp4's chunks of 2", in.Op, in.Value.Place)
					}
				}
			}
			assert.Positive(t, n)
			if c.local {
				// Nothing is gathered over cp, not even around the
				// expert buffer's all_to_alls over ep, which move whole
				// sequences.
				assert.Zero(t, got.prog.CollectiveBytes()["all_gather/cp"], "bytes all-gathered over cp")
			}
			t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
		})
	}
}

// The GPT MoE's Switch router under cp with groups the chunks hold whole:
// its top-1 (a reduce_max over the experts) and the max's gradient keep
// the groups' blocked split over cp (the gradient's placement used to drop
// the blocks, which no collective could then convert), and it trains like
// one device with the same groups, alone and with its experts over ep.
func TestSwitchRoutesItsOwnGroupsUnderCP(t *testing.T) {
	ref := train(t, plan{model: "moe-switch-groups"})
	for _, p := range []plan{{cp: 2}, {cp: 2, ep: 2}} {
		p.model = "moe-switch-groups"
		t.Run(p.String(), func(t *testing.T) {
			got := train(t, p)
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			// The bound of the MoE GPT's other plans (TestMoEMatchesOneDevice):
			// Adam turns the router's float-rounding differences into
			// steps of up to lr. Measured 6e-5 and 7e-5.
			worstParam := paramError(t, ref.params, got.params, isKeyBias)
			assert.LessOrEqual(t, worstParam, 1e-4)
			assert.InDelta(t, ref.eval, got.eval, 1e-5*ref.eval, "held-out loss of the final weights")
			t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
		})
	}
}

// mixtralOracle is the Mixtral MoE block computed here in float64 from its
// weights in Hugging Face's layout: the router's gate [E,h] and each
// expert's w1, w3 [F,h] and w2 [h,F].
type mixtralOracle struct {
	experts, hidden, ffn, k int
	gate                    []float64   // [E,h]
	w1, w3, w2              [][]float64 // per expert: [F,h], [F,h], [h,F]
}

// route is one token's router: the softmax over all experts, the top k
// (ties to the lower expert), their probabilities renormalised.
func (o mixtralOracle) route(x []float64) (probs []float64, chosen []int, gates []float64) {
	logits := make([]float64, o.experts)
	for e := range o.experts {
		for i := range o.hidden {
			logits[e] += x[i] * o.gate[e*o.hidden+i]
		}
	}
	probs = softmax(logits)
	order := make([]int, o.experts)
	for e := range order {
		order[e] = e
	}
	sort.SliceStable(order, func(a, b int) bool { return probs[order[a]] > probs[order[b]] })
	chosen = slices.Clone(order[:o.k])
	sum := 0.0
	for _, e := range chosen {
		sum += probs[e]
	}
	for _, e := range chosen {
		gates = append(gates, probs[e]/sum)
	}
	return probs, chosen, gates
}

// expert is w2·(silu(w1·x) ⊙ (w3·x)).
func (o mixtralOracle) expert(e int, x []float64) []float64 {
	act := make([]float64, o.ffn)
	for j := range o.ffn {
		var g, u float64
		for i := range o.hidden {
			g += o.w1[e][j*o.hidden+i] * x[i]
			u += o.w3[e][j*o.hidden+i] * x[i]
		}
		act[j] = g / (1 + math.Exp(-g)) * u
	}
	y := make([]float64, o.hidden)
	for i := range o.hidden {
		for j := range o.ffn {
			y[i] += o.w2[e][i*o.ffn+j] * act[j]
		}
	}
	return y
}

// hfBalance is Hugging Face's load_balancing_loss_func on the router
// probabilities of the tokens given (every layer's, concatenated):
// tokens_per_expert = mean over tokens of the one-hot [T,k,E] of the
// choices, router_prob_per_expert = mean over tokens of the
// probabilities, loss = E·Σ over k and E of their product.
func hfBalance(probs [][]float64, chosen [][]int, experts, k int) float64 {
	n := float64(len(probs))
	perExpert := make([][]float64, k) // [k][E]
	for j := range k {
		perExpert[j] = make([]float64, experts)
	}
	prob := make([]float64, experts)
	for t := range probs {
		for j, e := range chosen[t] {
			perExpert[j][e] += 1 / n
		}
		for e := range experts {
			prob[e] += probs[t][e] / n
		}
	}
	loss := 0.0
	for j := range k {
		for e := range experts {
			loss += perExpert[j][e] * prob[e]
		}
	}
	return float64(experts) * loss
}

// TestMixtralRouterByHand: two Mixtral MoE blocks sharing one balancing
// loss, on fixed tokens in two routing groups and fixed weights, equal
// the computation here in plain float64: every token's output (so its
// two experts and their renormalised gates), each expert's load, and the
// balancing loss, which is Hugging Face's load_balancing_loss_func over
// both layers' tokens of each group, averaged over the groups; with one
// group it is Hugging Face's over the whole batch.
func TestMixtralRouterByHand(t *testing.T) {
	const experts, hidden, ffn, k, tokens = 4, 3, 2, 2, 8
	val := func(seed, i int) float64 { return math.Sin(float64(seed*131+i)*0.7+0.3) * 0.9 }
	x := make([]float64, tokens*hidden)
	for i := range x {
		x[i] = 2 * val(1, i*i)
	}
	oracles := make([]mixtralOracle, 2)
	for l := range oracles {
		o := mixtralOracle{experts: experts, hidden: hidden, ffn: ffn, k: k, gate: make([]float64, experts*hidden)}
		for i := range o.gate {
			o.gate[i] = 1.5 * val(10+l, i)
		}
		for e := range experts {
			w1, w3, w2 := make([]float64, ffn*hidden), make([]float64, ffn*hidden), make([]float64, hidden*ffn)
			for i := range w1 {
				w1[i], w3[i], w2[i] = val(100*l+3*e, i), val(100*l+3*e+1, i), val(100*l+3*e+2, i)
			}
			o.w1, o.w3, o.w2 = append(o.w1, w1), append(o.w3, w3), append(o.w2, w2)
		}
		oracles[l] = o
	}
	for _, group := range []int{4, tokens} {
		t.Run(fmt.Sprintf("group%d", group), func(t *testing.T) {
			groups := tokens / group
			model := func(b *frontend.Builder) {
				in := b.Constant("x", x, 1, tokens, hidden)
				bal := &nn.Balance{}
				cfg := nn.MoEConfig{Experts: experts, Router: nn.RouterSoftmaxTopK, K: k, Dropless: true, GroupSize: group,
					FFN: ffn, Activation: nn.ActivationSwiGLU, Layout: nn.MoELayoutMixtral, Balance: bal}
				loss := b.Scalar(0)
				for l := range 2 {
					y, _ := nn.MoE(in, fmt.Sprintf("l%d", l), cfg)
					for tok := range tokens {
						for i := range hidden {
							b.Output(fmt.Sprintf("l%d.y.%d.%d", l, tok, i), y.Slice(1, tok, tok+1).Slice(2, i, i+1).Reshape())
						}
					}
					loss = loss.Add(y.Mean())
				}
				b.Output("aux", bal.Loss())
				b.Loss(loss.Add(bal.Loss()))
			}
			m, err := frontend.Build(model, frontend.Config{Name: "router", Batch: 1, Float: ir.F64})
			require.NoError(t, err)
			cl, _ := loadedCluster(t, m, passes.DefaultOptions())
			for l, o := range oracles {
				// The program holds each expert's [in,out] matrix stacked:
				// w1 and w3 [E,h,F], w2 [E,F,h], Hugging Face's transposed.
				stack := func(ws [][]float64, rows, cols int) []float64 {
					var out []float64
					for _, w := range ws {
						for c := range cols {
							for r := range rows {
								out = append(out, w[r*cols+c])
							}
						}
					}
					return out
				}
				name := fmt.Sprintf("l%d", l)
				require.NoError(t, cl.SetGlobal(name+".gate.weight", o.gate))
				require.NoError(t, cl.SetGlobal(name+".experts.w1", stack(o.w1, ffn, hidden)))
				require.NoError(t, cl.SetGlobal(name+".experts.w3", stack(o.w3, ffn, hidden)))
				require.NoError(t, cl.SetGlobal(name+".experts.w2", stack(o.w2, hidden, ffn)))
			}
			require.NoError(t, cl.Devices[0].Forward())
			got := func(name string) float64 {
				v, err := cl.Scalar(ir.AuxPrefix + name)
				require.NoError(t, err)
				return v
			}
			aux := 0.0
			allProbs, allChosen := make([][][]float64, groups), make([][][]int, groups)
			for l, o := range oracles {
				load := make([]float64, experts)
				seen := map[int]bool{}
				for tok := range tokens {
					xt := x[tok*hidden : (tok+1)*hidden]
					probs, chosen, gates := o.route(xt)
					g := tok / group
					allProbs[g], allChosen[g] = append(allProbs[g], probs), append(allChosen[g], chosen)
					want := make([]float64, hidden)
					for j, e := range chosen {
						seen[e] = true
						load[e] += 1 / float64(group) / float64(groups)
						for i, v := range o.expert(e, xt) {
							want[i] += gates[j] * v
						}
					}
					for i := range hidden {
						assert.InDelta(t, want[i], got(fmt.Sprintf("l%d.y.%d.%d", l, tok, i)), 1e-12, "layer %d token %d dim %d (experts %v)", l, tok, i, chosen)
					}
				}
				require.Greater(t, len(seen), 2, "layer %d: the tokens choose more than two experts", l)
				name := fmt.Sprintf("l%d", l)
				for e := range experts {
					assert.InDelta(t, load[e], got(fmt.Sprintf("%s.load.e%d", name, e)), 1e-12, "layer %d expert %d load", l, e)
				}
				assert.Zero(t, got(name+".dropped"))
			}
			for g := range groups {
				aux += hfBalance(allProbs[g], allChosen[g], experts, k) / float64(groups)
			}
			assert.InDelta(t, aux, got("aux"), 1e-12, "the balancing loss over both layers")
			if groups == 1 {
				t.Logf("one group: Hugging Face's loss over the batch %.12f", aux)
			} else {
				// Per group it is not the loss over the whole batch: the
				// product of means is taken per group.
				var probs [][]float64
				var chosen [][]int
				for g := range groups {
					probs, chosen = append(probs, allProbs[g]...), append(chosen, allChosen[g]...)
				}
				assert.NotEqual(t, hfBalance(probs, chosen, experts, k), got("aux"))

			}
		})
	}
}

// A Mixtral layer's settings that cannot work are named before anything
// is compiled, with the model's line.
func TestMixtralMoEBadConfigs(t *testing.T) {
	good := nn.MoEConfig{Experts: 4, Router: nn.RouterSoftmaxTopK, K: 2, Dropless: true, FFN: 8,
		Activation: nn.ActivationSwiGLU, Layout: nn.MoELayoutMixtral}
	for _, c := range []struct {
		edit func(*nn.MoEConfig)
		want string
	}{
		{func(c *nn.MoEConfig) { c.K = 5 }, "k=5 experts per token must be in 1..4 (the experts)"},
		{func(c *nn.MoEConfig) { c.K = 0 }, "k=0 experts per token must be in 1..4"},
		{func(c *nn.MoEConfig) { c.Experts = 0 }, "experts must be at least 1, got 0"},
		{func(c *nn.MoEConfig) { c.Activation = nn.ActivationGELU }, `the mixtral layout names SwiGLU experts (w1, w3, w2), not activation "gelu"`},
		{func(c *nn.MoEConfig) { c.Router = nn.RouterNoisyTopK }, "noisy-topk needs two"},
		{func(c *nn.MoEConfig) { c.Router, c.Balance = nn.RouterGShard, &nn.Balance{} }, "router gshard has a loss of its own"},
		{func(c *nn.MoEConfig) { c.Router = nn.RouterExpertChoice }, "expert choice has a capacity by construction; it cannot be dropless"},
		{func(c *nn.MoEConfig) { c.Dropless = false }, "capacity factor must be a positive number, got 0"},
		{func(c *nn.MoEConfig) { c.Layout = "deepseek" }, `layout "deepseek"`},
	} {
		t.Run(c.want, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			model := func(b *frontend.Builder) {
				in := b.Constant("x", make([]float64, 16*8), 1, 16, 8)
				y, _ := nn.MoE(in, "moe", cfg)
				b.Loss(y.Mean())
			}
			_, err := frontend.Build(model, frontend.Config{Name: "bad", Batch: 1})
			require.Error(t, err)
			assert.ErrorContains(t, err, c.want)
			assert.Contains(t, err.Error(), "mixtral_test.go:", "the error names the model's line")
		})
	}
	t.Run("the balancing loss shared by layers of other groups", func(t *testing.T) {
		model := func(b *frontend.Builder) {
			in := b.Constant("x", make([]float64, 16*8), 1, 16, 8)
			cfg := good
			cfg.Balance = &nn.Balance{}
			y, _ := nn.MoE(in, "a", cfg)
			cfg.GroupSize = 8
			z, _ := nn.MoE(in, "b", cfg)
			b.Loss(y.Add(z).Mean().Add(cfg.Balance.Loss()))
		}
		_, err := frontend.Build(model, frontend.Config{Name: "bad", Batch: 1})
		assert.ErrorContains(t, err, "MoE b: routing groups and experts [2 4] differ from [1 4] of the other layers sharing its balancing loss")
	})
}
