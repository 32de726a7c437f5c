package tests

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// Mixture-of-experts plans train like one device: losses (1e-5
// relative), final params (1e-4), and the per-expert loads and dropped
// fractions every step, for Switch and GShard routers, with and without
// tokens dropped over capacity. Routing is decided per group, so which
// tokens drop does not depend on the plan.
func TestMoEMatchesOneDevice(t *testing.T) {
	type moeCase struct {
		family   string
		capacity int // slots per expert and group of 16 tokens
		moves    int // all_to_alls of an [E, G, C, 32] buffer per step: 0 means 4
		plans    []plan
		pipes    []pipePlan
	}
	oneF1B := scheduleOrder("1f1b")
	cases := []moeCase{
		{family: "moe-switch", capacity: 16,
			plans: []plan{{ep: 2}, {dp: 2, ep: 2, zero: 1}, {tp: 2, ep: 2}, {ep: 2, micro: 2}, {cp: 2, ep: 2}},
			pipes: []pipePlan{{pp: 2, ep: 2, micro: 2, order: oneF1B, name: "1f1b"}}},
		{family: "moe-gshard", capacity: 16, plans: []plan{{ep: 4}, {dp: 2, ep: 2}}},
		{family: "moe-switch-drop", capacity: 4, plans: []plan{{dp: 2, ep: 2}}},
		{family: "moe-noisy-topk", capacity: 16, moves: 5, plans: []plan{{dp: 2, ep: 2, micro: 2}}},
		{family: "moe-expert-choice", capacity: 8, plans: []plan{{dp: 2, ep: 2}}},
	}
	if fullMatrix() {
		all := []plan{{ep: 2}, {ep: 4}, {dp: 2, ep: 2}, {tp: 2, ep: 2}, {dp: 2, ep: 2, zero: 1}, {dp: 2, ep: 2, zero: 3}, {dp: 2, ep: 2, tp: 2, zero: 2, micro: 2},
			{dp: 2, ep: 2, recompute: "full"}, {dp: 2, ep: 2, offload: "optimizer"}}
		pipes := []pipePlan{{pp: 2, ep: 2, micro: 2, order: oneF1B, name: "1f1b"}, {pp: 2, ep: 2, micro: 4, order: scheduleOrder("gpipe"), name: "gpipe"}}
		for i := range cases {
			cases[i].plans, cases[i].pipes = all, pipes
		}
	}
	for _, c := range cases {
		ref := train(t, plan{model: c.family})
		require.Less(t, ref.losses[eqSteps-1], ref.losses[0]-0.5, "%s: the reference run must actually learn", c.family)
		dropped := 0.0
		for _, o := range ref.outputs {
			dropped += o["h.1.moe.dropped"]
		}
		if strings.HasSuffix(c.family, "drop") {
			require.Positive(t, dropped, "capacity factor 1 must drop tokens for the check to mean anything")
		} else {
			require.Zero(t, dropped, "the capacity factor must leave room for every token")
		}
		if c.family == "moe-expert-choice" {
			// Each expert takes its capacity of every group's tokens: the
			// load is equal by construction, C/T of the tokens each.
			for step, o := range ref.outputs {
				for e := range 4 {
					assert.InDelta(t, float64(c.capacity)/16, o[fmt.Sprintf("h.1.moe.load.e%d", e)], 1e-12, "step %d expert %d", step+1, e)
				}
			}
		}
		check := func(t *testing.T, got trajectory) {
			// The key biases' gradient is zero in exact arithmetic, so
			// Adam's steps there follow each plan's rounding (as in
			// TestDataParallelMatchesOneDevice).
			worst := assertLossesClose(t, ref.losses, got.losses, 1e-5)
			worstParam := paramError(t, ref.params, got.params, isKeyBias)
			assert.LessOrEqual(t, worstParam, 1e-4)
			assert.InDelta(t, ref.eval, got.eval, 1e-5*ref.eval, "held-out loss of the final weights")
			t.Logf("worst loss rel err %.2g, worst param err %.2g (of max |w|)", worst, worstParam)
			for step := range ref.outputs {
				for name, want := range ref.outputs[step] {
					assert.InDelta(t, want, got.outputs[step][name], 1e-6, "step %d output %s", step+1, name)
				}
			}
		}
		for _, p := range c.plans {
			p.model = c.family
			t.Run(c.family+"/"+p.String(), func(t *testing.T) {
				got := train(t, p)
				check(t, got)
				for d, peak := range got.peaks {
					assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", d)
				}
				if p.ep > 1 {
					// Four all_to_alls of the [E, G, C, M] buffer per MoE
					// layer and step (dispatch and combine, forward and
					// backward), each device holding 1/(dp·ep) of it; a
					// fifth moves the expert-dropout mask (ffn = M here).
					const experts, groups, hidden = 4, eqBatch, 32
					moves := c.moves
					if moves == 0 {
						moves = 4
					}
					if p.recompute == "full" {
						// The replayed forward moves again what the
						// forward moved: all but the backward's two.
						moves += moves - 2
					}
					want := int64(moves * experts * groups * c.capacity * hidden * 4 / (max(p.dp, 1) * p.ep))
					assert.Equal(t, want, got.prog.CollectiveBytes()["all_to_all/ep"], "all_to_all bytes per device and step")
				}
			})
		}
		for _, pl := range c.pipes {
			pl.model = c.family
			t.Run(c.family+"/"+pl.String(), func(t *testing.T) {
				check(t, trainPipeline(t, pl, 2))
			})
		}
	}
}

// TestMoEExpertGradientsReduceOverDataOnly: under dp×ep an expert's
// weights live on one ep rank, so their gradients are summed over dp
// alone; every other gradient over dp and ep.
func TestMoEExpertGradientsReduceOverDataOnly(t *testing.T) {
	m, err := frontend.Build(moeFamily(t), frontend.Config{Name: "moe", Batch: eqBatch, Set: familyOf("moe-switch", 0).set})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "ep", Size: 2}}}
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	axes := map[string][]string{} // param name → axes its gradient is reduced over
	for _, u := range m.Updates {
		if u.State.Op != "param" {
			continue
		}
		name := u.State.Name()
		seen := map[*ir.Value]bool{}
		var walk func(v *ir.Value)
		walk = func(v *ir.Value) {
			// The global norm reads every gradient: stop there.
			if seen[v] || v.Meta.Phase == ir.PhaseFwd || v.Op == "clip_coef" {
				return
			}
			seen[v] = true
			if v.Op == "all_reduce" || v.Op == "reduce_scatter" {
				axes[name] = append(axes[name], v.Attrs.Str("axis"))
			}
			for _, a := range v.Args {
				walk(a)
			}
		}
		walk(u.Value)
	}
	require.NotEmpty(t, axes)
	for name, got := range axes {
		slices.Sort(got)
		got = slices.Compact(got)
		want := []string{"dp", "ep"}
		if strings.Contains(name, ".experts.") {
			want = []string{"dp"}
		}
		assert.Equal(t, want, got, "%s", name)
	}
	for _, p := range m.Params() {
		if strings.Contains(p.Name(), ".experts.") {
			assert.Equal(t, ir.Placement{Kind: ir.Shard, Dim: 0}, p.Place[1], "%s is split by expert over ep", p.Name())
		}
	}
}

// TestMoESharedGradientsBucketed: under expert parallelism the shared
// gradients, reduced over ep and then over dp, are bucketed on both axes:
// every backward reduction over ep is in a bucket; with dp, each ep
// bucket holds exactly the ep sums one dp bucket reads, so the lowered
// program issues one ep call per dp bucket, before it.
func TestMoESharedGradientsBucketed(t *testing.T) {
	for _, c := range []struct {
		name string
		axes []ir.MeshAxis
	}{
		{"dp2 ep2", []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "ep", Size: 2}}},
		{"ep2", []ir.MeshAxis{{Name: "ep", Size: 2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := frontend.Build(moeFamily(t), frontend.Config{Name: "moe", Batch: eqBatch, Set: familyOf("moe-switch", 0).set})
			require.NoError(t, err)
			opts := passes.DefaultOptions()
			opts.BucketMB = 4.0 / 1024 // several buckets
			opts.Mesh = &ir.Mesh{Axes: c.axes}
			_, err = passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)
			uses := m.Uses()
			readers := map[int]map[int]bool{} // ep bucket → the dp buckets reading it
			epCalls := 0
			for _, v := range m.Values {
				if v.Op != "all_reduce" || v.Attrs.Str("axis") != "ep" || v.Meta.Phase != ir.PhaseBwd {
					continue
				}
				epCalls++
				b, ok := v.Attrs["bucket"].(int)
				require.True(t, ok, "%s: an ep gradient reduction outside any bucket", v.Where())
				if len(c.axes) == 1 {
					continue
				}
				require.Len(t, uses[v], 1, v.Where())
				u := uses[v][0]
				require.Equal(t, "dp", u.Attrs.Str("axis"), "%s is read by %s", v.Where(), u.Where())
				if readers[b] == nil {
					readers[b] = map[int]bool{}
				}
				readers[b][u.Attrs.Int("bucket", -1)] = true
			}
			require.Positive(t, epCalls)
			for b, dps := range readers {
				assert.Len(t, dps, 1, "ep bucket %d is read by dp buckets %v", b, dps)
			}
			prog, err := lower.LowerWith(m, lower.Options{})
			require.NoError(t, err)
			epDone := map[int]int{} // ep bucket → its last instruction
			for i, in := range prog.Instrs {
				if in.Bucket > 0 && in.Attrs.Str("axis") == "ep" {
					epDone[in.Bucket] = i
				}
			}
			assert.Less(t, len(epDone), epCalls, "fewer ep calls than tensors")
			for i, in := range prog.Instrs {
				if in.Bucket == 0 || in.Attrs.Str("axis") != "dp" {
					continue
				}
				for _, a := range in.Args {
					for j := range i {
						if prog.Instrs[j].Out == a && prog.Instrs[j].Bucket > 0 && prog.Instrs[j].Attrs.Str("axis") == "ep" {
							assert.Greater(t, i, epDone[prog.Instrs[j].Bucket], "a dp bucket issued before the ep bucket it reads")
						}
					}
				}
			}
		})
	}
}

func moeFamily(t *testing.T) frontend.ModelFunc {
	t.Helper()
	return familyOf("moe-switch", 0).fn
}

// Noisy top-k's noise scale softplus(x·W_noise) stays finite past
// float32's exp range (x·W_noise > 88.7): evaluation's zero noise times
// an infinite scale used to make the loss NaN.
func TestNoisyTopKNoiseScaleStaysFinite(t *testing.T) {
	x := []float64{1, 0, 0, 1, 1, 1, -1, 2, 0.5, -0.5, 2, 1}
	model := func(b *frontend.Builder) {
		in := b.Constant("x", x, 1, 6, 2)
		y, aux := nn.MoE(in, "moe", nn.MoEConfig{Experts: 3, Router: nn.RouterNoisyTopK, K: 2, CapacityFactor: 4, GroupSize: 3, AuxLoss: 1, ZLoss: 1})
		b.Loss(y.Mean().Add(aux))
	}
	m, err := frontend.Build(model, frontend.Config{Name: "noisy", Batch: 1})
	require.NoError(t, err)
	cl, _ := loadedCluster(t, m, passes.DefaultOptions())
	require.NoError(t, cl.SetGlobal("moe.router.noise", []float64{60, -60, 60, 60, 60, -60}))
	require.NoError(t, cl.SetInt32(ir.InputRandomKey, []int32{-1, -1, -1, -1, -1, -1}))
	require.NoError(t, cl.Devices[0].Forward())
	loss, err := cl.Scalar(ir.OutputLoss)
	require.NoError(t, err)
	assert.False(t, math.IsNaN(loss) || math.IsInf(loss, 0), "loss %v with x·W_noise up to 180", loss)
}

// TestMoEAuxLossesByHand: each router's losses on a fixed input equal
// the formulas computed here: Switch's α·E·Σf·P, GShard's
// (1/E)·Σ(c_e/S)·m_e (top-1 counts), the z-loss, noisy top-k's CV² of
// the gate sums plus the CV² of Shazeer et al.'s smooth load estimate,
// and softmax top-2's E·Σf·P with f counting both choices (Hugging Face's
// load_balancing_loss_func; TestMixtralRouterByHand checks the rest of
// that router).
func TestMoEAuxLossesByHand(t *testing.T) {
	const groups, tokens, hidden, experts = 2, 3, 2, 3
	x := []float64{1, 0, 0, 1, 1, 1, -1, 2, 0.5, -0.5, 2, 1}
	w := []float64{0.3, -0.2, 0.1, 0.5, 0.4, -0.6}
	// logits[g,t,e] = Σ_h x[g,t,h]·w[h,e]; probabilities by softmax.
	logits := make([][]float64, groups*tokens)
	probs := make([][]float64, groups*tokens)
	for i := range logits {
		logits[i] = make([]float64, experts)
		for e := range experts {
			for h := range hidden {
				logits[i][e] += x[i*hidden+h] * w[h*experts+e]
			}
		}
		probs[i] = softmax(logits[i])
	}
	argmax := func(p []float64) int { return slices.Index(p, slices.Max(p)) }
	var switchAux, gshardAux, topKAux, z, cv float64
	for g := range groups {
		f, f2, P := make([]float64, experts), make([]float64, experts), make([]float64, experts)
		imp, load := make([]float64, experts), make([]float64, experts)
		for tok := range tokens {
			p := probs[g*tokens+tok]
			f[argmax(p)] += 1.0 / tokens
			for e := range experts {
				P[e] += p[e] / tokens
			}
			// Noisy top-k with k=2 and no noise: gates are the top two
			// probabilities renormalised.
			top := slices.Clone(p)
			slices.Sort(top)
			for e := range experts {
				if p[e] >= top[experts-2] {
					imp[e] += p[e] / (top[experts-1] + top[experts-2])
					f2[e] += 1.0 / tokens // one of the token's top 2
				}
			}
			// Its smooth load estimate: W_noise starts at zero, so the
			// noise std is softplus(0) + 10⁻²; the threshold of a selected
			// expert is the third logit, of the other the second.
			l := logits[g*tokens+tok]
			sorted := slices.Clone(l)
			slices.Sort(sorted)
			std := math.Log(2) + 1e-2
			for e := range experts {
				thr := sorted[experts-2]
				if l[e] >= sorted[experts-2] {
					thr = sorted[experts-3]
				}
				load[e] += 0.5 * math.Erfc(-(l[e]-thr)/std/math.Sqrt2)
			}
			lse := 0.0
			for _, l := range logits[g*tokens+tok] {
				lse += math.Exp(l)
			}
			lse = math.Log(lse)
			z += lse * lse / (groups * tokens)
		}
		for e := range experts {
			switchAux += experts * f[e] * P[e] / groups
			gshardAux += f[e] * P[e] / experts / groups
			topKAux += experts * f2[e] * P[e] / groups
		}
		cv += (cvSquared(imp) + cvSquared(load)) / groups
	}
	for _, c := range []struct {
		router string
		aux    float64
	}{{nn.RouterSwitch, switchAux}, {nn.RouterGShard, gshardAux}, {nn.RouterNoisyTopK, cv}, {nn.RouterSoftmaxTopK, topKAux}} {
		t.Run(c.router, func(t *testing.T) {
			model := func(b *frontend.Builder) {
				in := b.Constant("x", x, 1, groups*tokens, hidden)
				y, aux := nn.MoE(in, "moe", nn.MoEConfig{Experts: experts, Router: c.router, K: 2, CapacityFactor: 4, GroupSize: tokens, AuxLoss: 1, ZLoss: 1, SecondThreshold: -1})
				b.Loss(y.Mean().Add(aux))
			}
			m, err := frontend.Build(model, frontend.Config{Name: "aux", Batch: 1, Float: ir.F64})
			require.NoError(t, err)
			cl, _ := loadedCluster(t, m, passes.DefaultOptions())
			require.NoError(t, cl.SetGlobal("moe.router.weight", w))
			if c.router == nn.RouterNoisyTopK {
				// Evaluation's keys: no noise.
				require.NoError(t, cl.SetInt32(ir.InputRandomKey, []int32{-1, -1, -1, -1, -1, -1}))
			}
			require.NoError(t, cl.Devices[0].Forward())
			got := func(name string) float64 {
				v, err := cl.Scalar(ir.AuxPrefix + name)
				require.NoError(t, err)
				return v
			}
			assert.InDelta(t, c.aux, got("moe.aux"), 1e-12, "balancing loss")
			assert.InDelta(t, z, got("moe.z"), 1e-12, "z-loss")
			assert.InDelta(t, 0, got("moe.dropped"), 1e-12)
			load := 0.0
			for e := range experts {
				load += got(fmt.Sprintf("moe.load.e%d", e))
			}
			k := 1.0
			if c.router != nn.RouterSwitch {
				k = 2
			}
			assert.InDelta(t, k, load, 1e-12, "every token's k choices are processed")
		})
	}
}

// TestMoEBadConfigs: each rule a config can break is named before any
// work, with the user's line.
func TestMoEBadConfigs(t *testing.T) {
	cases := []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"router": "noisy-topk", "k": "5"}, "k=5 experts per token must be in 1..4"},
		{map[string]string{"capacity": "0"}, "capacity factor must be a positive number, got 0"},
		{map[string]string{"capacity": "Inf"}, "capacity factor must be a positive number, got +Inf"},
		{map[string]string{"capacity": "NaN"}, "--set capacity=NaN: want a number"},
		{map[string]string{"group": "12"}, "group size 12 must divide"},
		{map[string]string{"router": "sinkhorn"}, "router"},
		{map[string]string{"experts": "0"}, "--set experts=0"},
		{map[string]string{"jitter": "-0.1"}, "jitter must be in [0, 1), got -0.1"},
		{map[string]string{"expert_dropout": "1"}, "expert dropout must be in [0, 1), got 1"},
		{map[string]string{"aux": "Inf"}, "aux loss weight must be a finite number ≥ 0"},
		{map[string]string{"zloss": "-1"}, "z-loss weight must be a finite number ≥ 0, got -1"},
		{map[string]string{"eval_capacity": "-2"}, "evaluation capacity factor must be a positive number"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			set := familyOf("moe-switch", 0).set
			for k, v := range c.set {
				set[k] = v
			}
			_, err := frontend.Build(moeFamily(t), frontend.Config{Name: "moe", Batch: eqBatch, Set: set})
			require.Error(t, err)
			assert.ErrorContains(t, err, c.want)
			assert.Contains(t, err.Error(), "model.go:", "the error names the model's line")
		})
	}
	t.Run("experts not divisible by ep", func(t *testing.T) {
		set := familyOf("moe-switch", 0).set
		set["experts"] = "3"
		m, err := frontend.Build(moeFamily(t), frontend.Config{Name: "moe", Batch: eqBatch, Set: set})
		require.NoError(t, err)
		opts := passes.DefaultOptions()
		opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 2}}}
		_, err = passes.Run(m, opts, passes.Hooks{})
		assert.ErrorContains(t, err, "expert parallelism ep=2 must divide the 3 experts")
	})
}

func softmax(x []float64) []float64 {
	m := slices.Max(x)
	out := make([]float64, len(x))
	sum := 0.0
	for i, v := range x {
		out[i] = math.Exp(v - m)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// cvSquared is the population variance of v over its mean squared.
func cvSquared(v []float64) float64 {
	mean := 0.0
	for _, x := range v {
		mean += x / float64(len(v))
	}
	d := 0.0
	for _, x := range v {
		d += (x - mean) * (x - mean) / float64(len(v))
	}
	return d / (mean * mean)
}

// roundTripModel embeds the tokens (x [batch, 16, 8]), routes each token
// to its top-1 of 4 experts with room for all (capacity = the group),
// dispatches, applies each expert's weight [8, 8], combines without gate
// weights and trains on Σ y⊙R for a fixed R. With identity expert
// weights y is x, bit for bit; with direct, the same model without the
// experts (y = x).
func roundTripModel(direct bool) frontend.ModelFunc {
	return func(b *frontend.Builder) {
		const seq, hidden, experts = 16, 8, 4
		batch := b.Batch()
		tokens := b.Input(ir.InputTokens, ir.I32, batch, seq)
		b.Input(ir.InputTargets, ir.I32, batch, seq)
		x, _ := nn.Embedding(tokens, "wte", 256, hidden)
		r := make([]float64, seq*hidden)
		for i := range r {
			r[i] = math.Sin(float64(i) + 0.5)
		}
		weights := b.Constant("r", r, 1, seq, hidden)
		y := x
		if !direct {
			probs := x.MatMul(b.Param("router", []int{hidden, experts}, frontend.Normal(1), frontend.NoParallel)).Softmax()
			src := frontend.MoERoute(probs, probs.TopKMask(1), seq)
			buf := x.MoEDispatch(src, nil).Reshape(experts, batch*seq, hidden)
			eye := b.Param("experts.eye", []int{experts, hidden, hidden}, frontend.Zeros, frontend.ExpertParallel(frontend.NoParallel))
			y = buf.MatMul(eye).Reshape(experts, batch, seq, hidden).MoECombine(src, nil, seq)
			d := y.Sub(x)
			b.Output("roundtrip_err", d.Mul(d).Sum())
		}
		b.Loss(y.Mul(weights).Mean())
	}
}

// TestMoEDispatchCombineRoundTrip: dispatch then combine with identity
// experts and no drops returns the input exactly, under every plan (the
// tokens cross devices by all_to_all both ways), and so does its
// gradient: one SGD step leaves the embedding bit for bit where the model
// without experts leaves it.
func TestMoEDispatchCombineRoundTrip(t *testing.T) {
	eye := make([]float64, 4*8*8)
	for e := range 4 {
		for i := range 8 {
			eye[e*64+i*8+i] = 1
		}
	}
	step := func(t *testing.T, direct bool, mesh *ir.Mesh, micro int) (wte []float64, roundTrip float64) {
		m, err := frontend.Build(roundTripModel(direct), frontend.Config{Name: "roundtrip", Batch: eqBatch})
		require.NoError(t, err)
		opts := passes.DefaultOptions()
		opts.Verify = true
		opts.Optimizer, opts.ClipNorm, opts.WeightDecay = "sgd", 0, 0
		opts.Mesh, opts.Microbatches = mesh, micro
		cl, _ := loadedCluster(t, m, opts)
		if !direct {
			require.NoError(t, cl.SetGlobal("experts.eye", eye))
		}
		cfg := runtime.TrainConfig{Steps: 1, Batch: eqBatch, Seq: 16, Seed: 3, EvalBatches: -1, Schedule: runtime.Schedule{LR: 0.5}}
		_, _, err = runtime.Train(cl, corpus(), cfg, nil)
		require.NoError(t, err)
		wte, err = cl.Global("wte.weight")
		require.NoError(t, err)
		if !direct {
			roundTrip, err = cl.Scalar(ir.AuxPrefix + "roundtrip_err")
			require.NoError(t, err)
		}
		return wte, roundTrip
	}
	meshes := []struct {
		name  string
		mesh  *ir.Mesh
		micro int
	}{
		{"one device", nil, 1},
		{"ep2", &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 2}}}, 1},
		{"ep4", &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 4}}}, 1},
		{"dp2_ep2", &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "ep", Size: 2}}}, 1},
		{"ep2_tp2", &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 2}, {Name: "tp", Size: 2}}}, 1},
		{"ep2_micro2", &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 2}}}, 2},
	}
	ref, _ := step(t, true, nil, 1)
	for _, c := range meshes {
		t.Run(c.name, func(t *testing.T) {
			want, _ := step(t, true, c.mesh, c.micro)
			got, err := step(t, false, c.mesh, c.micro)
			assert.Zero(t, err, "Σ(combine(dispatch(x)) − x)² is exactly 0")
			assert.Equal(t, want, got, "the embedding's gradient through the round trip is the direct one, bit for bit")
			// And the plan's step is one device's (a mean over the
			// batch's gradient, microbatched included).
			for i := range ref {
				require.InDelta(t, ref[i], want[i], 1e-6, "wte[%d]", i)
			}
		})
	}
}

// TestMoEEvalCapacity: with an evaluation capacity factor of its own the
// model is built a second time for evaluation, and the held-out loss is
// that of the training run's weights in a model of the evaluation
// capacity, bit for bit; training is unchanged.
func TestMoEEvalCapacity(t *testing.T) {
	build := func(eval bool, kv ...string) (*ir.Module, *cpu.Cluster, *lower.Program) {
		s := familyOf("moe-switch", 0).set
		for i := 0; i < len(kv); i += 2 {
			s[kv[i]] = kv[i+1]
		}
		m, err := frontend.Build(moeFamily(t), frontend.Config{Name: "moe", Batch: eqBatch, Set: s, Eval: eval})
		require.NoError(t, err)
		opts := passes.DefaultOptions()
		opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "ep", Size: 2}}}
		cl, prog := loadedCluster(t, m, opts)
		return m, cl, prog
	}
	cfg := runtime.TrainConfig{Steps: 5, Batch: eqBatch, Seq: eqSeq, Seed: 3, EvalBatches: 2,
		Schedule: runtime.Schedule{LR: 3e-3, Warmup: 2, Steps: 5, Decay: "constant"}}

	train, cl, _ := build(false, "capacity", "1", "eval_capacity", "4")
	require.True(t, train.EvalDiffers, "the model asked b.Evaluating()")
	_, _, evalProg := build(true, "capacity", "1", "eval_capacity", "4")
	require.NoError(t, cl.SetEvalPrograms([]*lower.Program{evalProg}))
	steps, evals, err := runtime.Train(cl, corpus(), cfg, nil)
	require.NoError(t, err)

	// Training is capacity 1's.
	_, pc, _ := build(false, "capacity", "1")
	plainSteps, plainEvals, err := runtime.Train(pc, corpus(), cfg, nil)
	require.NoError(t, err)
	for i := range steps {
		require.Equal(t, plainSteps[i].Loss, steps[i].Loss, "step %d", i+1)
	}

	// Evaluation is capacity 4's on the trained weights.
	_, wc, _ := build(false, "capacity", "4")
	for _, p := range train.Params() {
		w, err := cl.Global(p.Name())
		require.NoError(t, err)
		require.NoError(t, wc.SetGlobal(p.Name(), w))
	}
	want, err := runtime.Evaluate(wc, corpus(), cfg)
	require.NoError(t, err)
	got := evals[len(evals)-1].Loss
	assert.Equal(t, want, got, "held-out loss at the evaluation capacity")
	assert.NotEqual(t, plainEvals[len(plainEvals)-1].Loss, got, "capacity 1 drops tokens at evaluation, capacity 4 does not")
}

// TestMoERouterStaysFP32: under bf16 the router (its matmul, softmax,
// top-k and the gates) runs in fp32 and the experts in bf16, the gates
// reaching the combine as fp32 weights.
func TestMoERouterStaysFP32(t *testing.T) {
	m, err := frontend.Build(moeFamily(t), frontend.Config{Name: "moe", Batch: eqBatch, Set: familyOf("moe-switch", 0).set})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Precision = "bf16"
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, v := range m.Values {
		if v.Meta.Phase != ir.PhaseFwd {
			continue
		}
		switch {
		case v.Op == "matmul" && len(v.Args) == 2 && v.Args[1].Op == "cast" && v.Args[1].Args[0].Op == "param" && v.Args[1].Args[0].Name() == "h.1.moe.router.weight":
			t.Errorf("%s: the router weight is cast down", v.Where())
		case v.Op == "softmax" && v.Type.Rank() == 3 && v.Type.Shape[2] == 4:
			assert.Equal(t, ir.F32, v.Type.DType, "router softmax %s", v.Where())
			seen["softmax"] = true
		case v.Op == "top_k_mask", v.Op == "moe_slot_gather":
			assert.Equal(t, ir.F32, v.Type.DType, "%s %s", v.Op, v.Where())
			seen[v.Op] = true
		case v.Op == "moe_dispatch":
			assert.Equal(t, ir.BF16, v.Type.DType, "the experts run in bf16: %s", v.Where())
			seen[v.Op] = true
		case v.Op == "moe_combine":
			assert.Equal(t, ir.BF16, v.Type.DType)
			require.Len(t, v.Args, 3)
			assert.Equal(t, ir.F32, v.Args[2].Type.DType, "the gates stay fp32 (F32Args)")
			seen[v.Op] = true
		}
	}
	assert.Len(t, seen, 5, "found %v", seen)
}

// loadedCluster runs the passes on m with opts, lowers it and loads it on
// CPU devices with params initialised from seed 1.
func loadedCluster(t *testing.T, m *ir.Module, opts *passes.Options) (*cpu.Cluster, *lower.Program) {
	t.Helper()
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	cl, err := cpu.NewCluster(prog, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	return cl, prog
}
