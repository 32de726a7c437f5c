package nn

import (
	"fmt"
	"math"
	"slices"

	"gcompile/frontend"
	"gcompile/ir"
)

// Router kinds of a mixture-of-experts layer.
const (
	RouterSwitch       = "switch"        // top-1 (Fedus et al. 2021)
	RouterGShard       = "gshard"        // top-2 with random second expert (Lepikhin et al. 2020)
	RouterNoisyTopK    = "noisy-topk"    // top-k of noisy logits (Shazeer et al. 2017)
	RouterExpertChoice = "expert-choice" // each expert takes its top tokens (Zhou et al. 2022)
	RouterSoftmaxTopK  = "softmax-topk"  // softmax, top k, renormalised (Mixtral, Jiang et al. 2024)
)

// RouterKinds lists the routers MoE accepts.
var RouterKinds = []string{RouterSwitch, RouterGShard, RouterNoisyTopK, RouterExpertChoice, RouterSoftmaxTopK}

// Param layouts of a mixture-of-experts layer (MoEConfig.Layout).
const (
	// MoELayoutStacked names the router NAME.router.weight [h,E] and the
	// experts NAME.experts.fc [E,h,F] and NAME.experts.proj [E,F,h] (with
	// SwiGLU also NAME.experts.up [E,h,F], fc being the gate), each one
	// tensor in weight files too.
	MoELayoutStacked = ""
	// MoELayoutMixtral is Hugging Face's MixtralSparseMoeBlock: the router
	// NAME.gate.weight [E,h], the SwiGLU experts stacked as
	// NAME.experts.w1 and NAME.experts.w3 [E,h,F] (gate and up) and
	// NAME.experts.w2 [E,F,h] (down), which weight files hold per expert
	// as NAME.experts.I.w1.weight, …w3.weight [F,h] and …w2.weight [h,F],
	// torch's [out,in] (frontend.Builder.SaveEach).
	MoELayoutMixtral = "mixtral"
)

// Activations of the experts (MoEConfig.Activation).
const (
	ActivationGELU   = "gelu"
	ActivationReLU   = "relu"
	ActivationSwiGLU = "swiglu" // proj(silu(x·fc) ⊙ (x·up)), Llama's and Mixtral's
)

// MoEConfig describes a mixture-of-experts layer.
type MoEConfig struct {
	Experts int    // E
	Router  string // one of RouterKinds
	// K is the number of experts per token for noisy-topk and
	// softmax-topk (switch takes 1, gshard 2; expert choice routes by
	// capacity instead).
	K int
	// Dropless gives each expert a slot for every token of its routing
	// group (capacity T), so no choice is ever dropped whatever the
	// routing: with static shapes, E·T slots per group for k·T choices.
	// CapacityFactor is then not read. Expert choice has a capacity by
	// construction and refuses it. Generation is always dropless.
	Dropless bool
	// CapacityFactor sizes each expert's buffer per routing group:
	// C = ⌈k·T·CapacityFactor/E⌉ slots for T tokens (at most T); for
	// expert choice each expert takes T·CapacityFactor/E tokens.
	// EvalCapacityFactor, when positive and different, is evaluation's
	// (Mesh-TF: 1.25 train, 2.0 eval); the compiler then builds the
	// model's evaluation separately (b.Evaluating).
	CapacityFactor, EvalCapacityFactor float64
	// GroupSize is the tokens per routing group (0: one sequence).
	// Capacity and drops are decided per group, so they do not depend on
	// how groups are spread over devices.
	GroupSize int
	// AuxLoss weighs the router's balancing loss (Switch's α·E·Σf·P,
	// GShard's (1/E)·Σ(c_e/S)·m_e, noisy top-k's CV² of importance);
	// expert choice has none. ZLoss weighs ST-MoE's router z-loss.
	AuxLoss, ZLoss float64
	// FFN is each expert's hidden width (0: 4·hidden); Activation one of
	// ActivationGELU (""), ActivationReLU, ActivationSwiGLU.
	FFN        int
	Activation string
	// Layout names the params (MoELayoutStacked or MoELayoutMixtral).
	Layout string
	// Balance, when set, takes this layer's routing statistics into one
	// balancing loss over every layer that shares it (Hugging Face's
	// load_balancing_loss_func over all layers' router logits at once),
	// instead of a balancing loss of the layer's own; for the routers
	// whose loss is E·Σf·P (switch, softmax-topk).
	Balance *Balance
	// ProjStd is the init std of each expert's output projection (0:
	// InitStd).
	ProjStd float64
	// Jitter ε multiplies the router's input by U(1−ε, 1+ε) in training
	// (Switch; 0: none).
	Jitter float64
	// SecondThreshold is GShard's τ: the second expert is kept with
	// probability min(1, g₂/τ) (0: τ = 0.2, Mesh-TF's; negative: always
	// kept).
	SecondThreshold float64
	// ExpertDropout drops each expert's hidden units with this
	// probability in training (Switch fine-tuning: 0.4).
	ExpertDropout float64
}

// MoE replaces a block's MLP on x [batch, seq, hidden] with E expert MLPs
// (stacked weights, no bias: name.experts.fc [E,h,F] and
// name.experts.proj [E,F,h] in the stacked layout) and a router
// (name.router.weight [h,E], or name.gate.weight [E,h] in Mixtral's
// layout, kept in fp32 under mixed precision). It returns the combined
// experts' output, zeros for tokens no expert took (the block's residual
// carries them), and the weighted auxiliary losses to add to the loss.
// Each step it reports, as outputs, name.aux and name.z (the unweighted
// losses; no name.aux with a shared Balance), name.dropped (the fraction
// of routing choices dropped over capacity) and name.load.eI (the
// fraction of the group's tokens expert I processed).
func MoE(x *frontend.Tensor, name string, cfg MoEConfig) (y, aux *frontend.Tensor) {
	b := x.Builder()
	if x.Value() == nil {
		return x, b.Poisoned() // its error is reported
	}
	batch, seq, hidden := x.Dim(0), x.Dim(1), x.Dim(2)
	if b.Generating() {
		// A capacity makes a token's experts depend on the other tokens
		// of its group: in a prefill on the prompt's padding and its
		// batch-mates, and on tokens after it, which a decode step
		// never sees. Generation routes every token to its own top-k
		// experts (dropless), so its output follows from its own
		// sequence alone and the cache gives the prefill's logits.
		// Expert choice has no per-token routing to fall back on.
		if cfg.Router == RouterExpertChoice {
			b.Errorf("MoE %s: the expert-choice router cannot generate: each expert takes the top tokens of a group, so a token's experts depend on the tokens after it, which generation has not made yet; generate from a token-choice router (%s, %s, %s, %s)", name, RouterSwitch, RouterSoftmaxTopK, RouterGShard, RouterNoisyTopK)
			return x, b.Poisoned() // the aux loss poisoned: the loss that adds it says nothing more
		}
		cfg.Dropless, cfg.GroupSize = true, 0
	}
	if err := checkMoE(cfg, batch, seq); err != nil {
		b.Errorf("MoE %s: %v", name, err)
		// x goes on (later layers say their own config's errors, counted
		// as one); the aux loss is poisoned, so the loss that adds it
		// says nothing more.
		return x, b.Poisoned()
	}
	if cfg.EvalCapacityFactor > 0 && cfg.EvalCapacityFactor != cfg.CapacityFactor && b.Evaluating() {
		cfg.CapacityFactor = cfg.EvalCapacityFactor
	}
	group := cfg.GroupSize
	if group == 0 {
		group = seq
	}
	groups, experts := batch*seq/group, cfg.Experts
	xg := x.Reshape(groups, group, hidden)

	var keys *frontend.Tensor
	random := cfg.Jitter > 0 || cfg.Router == RouterNoisyTopK || cfg.Router == RouterGShard && cfg.SecondThreshold >= 0 || cfg.ExpertDropout > 0
	if random {
		keys = b.RandomKeys(batch, seq).Reshape(groups, group)
	}
	var logits, gates, mask *frontend.Tensor
	var capacity, k int
	var auxRaw *frontend.Tensor
	b.KeepFP32(func() {
		std := InitStd
		switch {
		case cfg.Layout == MoELayoutMixtral:
			// Hugging Face initialises the gate as every linear layer.
		case cfg.Router == RouterSwitch:
			std = math.Sqrt(0.1 / float64(hidden))
		case cfg.Router == RouterNoisyTopK:
			std = 0 // Shazeer et al. start both router weights at zero
		}
		init := frontend.Normal(std)
		if std == 0 {
			init = frontend.Zeros
		}
		xr := xg
		if cfg.Jitter > 0 {
			// Multiplicative U(1−ε, 1+ε) on the router's input (Switch,
			// Mesh-TF): 1 + ε·(2u − 1).
			u := keys.Random("uniform", name+"/jitter", hidden)
			xr = xr.Mul(u.Scale(2 * cfg.Jitter).Add(b.Scalar(1 - cfg.Jitter)))
		}
		if cfg.Layout == MoELayoutMixtral {
			logits = xr.MatMulT(b.Param(name+".gate.weight", []int{experts, hidden}, init, frontend.NoParallel))
		} else {
			logits = xr.MatMul(b.Param(name+".router.weight", []int{hidden, experts}, init, frontend.NoParallel))
		}
		switch cfg.Router {
		case RouterSwitch:
			k = 1
			probs := logits.Softmax()
			mask = probs.TopKMask(1)
			gates = probs
			auxRaw = tokenChoiceBalance(b, name, cfg.Balance, probs, mask)
		case RouterSoftmaxTopK:
			// Mixtral: the softmax over all experts, the top k of it, their
			// probabilities renormalised to sum to 1 (norm_topk_prob).
			k = cfg.K
			probs := logits.Softmax()
			mask = probs.TopKMask(k)
			g := probs.Mul(mask)
			gates = g.Div(g.Sum(2).Reshape(groups, group, 1))
			auxRaw = tokenChoiceBalance(b, name, cfg.Balance, probs, mask)
		case RouterGShard:
			k = 2
			probs := logits.Softmax()
			top1 := probs.TopKMask(1)
			top2 := probs.TopKMask(2)
			g := probs.Mul(top2)
			gates = g.Div(g.Sum(2).Reshape(groups, group, 1))
			mask = top2
			if cfg.SecondThreshold >= 0 {
				// The second expert is kept with probability
				// min(1, g₂/τ), g₂ normalised by g₁ + g₂ (Mesh-TF's
				// random routing); the first expert's gate stays g₁.
				tau := cfg.SecondThreshold
				if tau == 0 {
					tau = 0.2
				}
				u := keys.Random("uniform", name+"/second", 1).Scale(tau)
				mask = top1.Add(top2.Sub(top1).Mul(u.Less(gates)))
			}
			auxRaw = balance(probs, top1).Scale(1 / float64(experts))
		case RouterNoisyTopK:
			k = cfg.K
			noisy, clean, noiseStd := noisyLogits(b, xr, keys, logits, name, experts)
			probs := noisy.Softmax()
			mask = noisy.TopKMask(k)
			g := probs.Mul(mask)
			gates = g.Div(g.Sum(2).Reshape(groups, group, 1))
			auxRaw = cvSquared(gates.Sum(1))
			if k < experts {
				auxRaw = auxRaw.Add(cvSquared(smoothLoad(noisy, clean, noiseStd, mask, k).Sum(1)))
			}
		case RouterExpertChoice:
			k = 1
			probs := logits.Softmax()
			mask = probs.Transpose(0, 2, 1).TopKMask(expertChoiceCapacity(group, experts, cfg.CapacityFactor)).Transpose(0, 2, 1)
			gates = probs
		}
	})
	switch {
	case cfg.Router == RouterExpertChoice:
		capacity = expertChoiceCapacity(group, experts, cfg.CapacityFactor)
	case cfg.Dropless:
		capacity = group // a token takes at most one slot of an expert
	default:
		capacity = tokenCapacity(k, group, experts, cfg.CapacityFactor)
	}
	src := frontend.MoERoute(gates, mask, capacity)
	var w *frontend.Tensor
	b.KeepFP32(func() { w = gates.MoESlotGather(src) })

	ffn := cfg.FFN
	if ffn == 0 {
		ffn = 4 * hidden
	}
	projStd := cfg.ProjStd
	if projStd == 0 {
		projStd = InitStd
	}
	buf := xg.MoEDispatch(src, nil).Reshape(experts, groups*capacity, hidden)
	fcName, upName, projName := "fc", "up", "proj"
	if cfg.Layout == MoELayoutMixtral {
		fcName, upName, projName = "w1", "w3", "w2"
	}
	expert := func(suffix string, in, out int, std float64, hint frontend.Parallel) *frontend.Tensor {
		w := b.Param(name+".experts."+suffix, []int{experts, in, out}, frontend.Normal(std), frontend.ExpertParallel(hint))
		if cfg.Layout == MoELayoutMixtral {
			b.SaveEach(w, name+".experts."+ir.SaveEachIndex+"."+suffix+".weight", frontend.PieceOutIn)
		}
		return w
	}
	fc := expert(fcName, hidden, ffn, InitStd, frontend.ColumnParallel)
	var up *frontend.Tensor
	if cfg.Activation == ActivationSwiGLU {
		up = expert(upName, hidden, ffn, InitStd, frontend.ColumnParallel)
	}
	proj := expert(projName, ffn, hidden, projStd, frontend.RowParallel)
	h := buf.MatMul(fc)
	switch cfg.Activation {
	case ActivationReLU:
		h = h.Relu()
	case ActivationSwiGLU:
		h = h.Silu().Mul(buf.MatMul(up))
	default:
		h = h.Gelu()
	}
	if cfg.ExpertDropout > 0 {
		// Each token's mask over the hidden units travels with it to its
		// experts, so it is the same whatever devices the experts are on.
		drop := keys.DropoutMask(name+"/expert-dropout", cfg.ExpertDropout, ffn).MoEDispatch(src, nil)
		h = h.Mul(drop.Reshape(experts, groups*capacity, ffn))
	}
	out := h.MatMul(proj).Reshape(experts, groups, capacity, hidden)
	y = out.MoECombine(src, w, group).Reshape(batch, seq, hidden)

	// Statistics: a slot is filled where the mask holds at its token.
	var z *frontend.Tensor
	b.KeepFP32(func() {
		filled := mask.MoESlotGather(src)                    // [G,E,C]
		perExpert := filled.Sum(2).Scale(1 / float64(group)) // [G,E]
		chosen := mask.Sum(1, 2).Scale(1 / float64(group))   // [G]
		done := perExpert.Sum(1)                             // [G]
		dropped := chosen.Sub(done).Div(chosen).Mean()       // fraction of choices
		load := perExpert.Mean(0)                            // [E]
		z = zLoss(logits, groups, group)
		b.Output(name+".dropped", dropped)
		for e := range experts {
			b.Output(fmt.Sprintf("%s.load.e%d", name, e), load.Slice(0, e, e+1).Reshape())
		}
		b.Output(name+".z", z)
		aux = z.Scale(cfg.ZLoss)
		if cfg.Balance != nil {
			return // the shared loss is the model's to add
		}
		if auxRaw != nil {
			b.Output(name+".aux", auxRaw)
			aux = aux.Add(auxRaw.Scale(cfg.AuxLoss))
		}
	})
	return y, aux
}

// checkMoE names the first rule cfg breaks for a batch of batch×seq
// tokens.
func checkMoE(cfg MoEConfig, batch, seq int) error {
	if !slices.Contains(RouterKinds, cfg.Router) {
		return fmt.Errorf("router %q does not exist: choose one of %v", cfg.Router, RouterKinds)
	}
	if cfg.Experts < 1 {
		return fmt.Errorf("experts must be at least 1, got %d", cfg.Experts)
	}
	if (cfg.Router == RouterNoisyTopK || cfg.Router == RouterSoftmaxTopK) && (cfg.K < 1 || cfg.K > cfg.Experts) {
		return fmt.Errorf("k=%d experts per token must be in 1..%d (the experts)", cfg.K, cfg.Experts)
	}
	if cfg.Router == RouterGShard && cfg.Experts < 2 {
		return fmt.Errorf("gshard routes every token to 2 experts, but there are %d", cfg.Experts)
	}
	if cfg.Dropless && cfg.Router == RouterExpertChoice {
		return fmt.Errorf("expert choice has a capacity by construction; it cannot be dropless")
	}
	if !cfg.Dropless && (!(cfg.CapacityFactor > 0) || math.IsInf(cfg.CapacityFactor, 0)) {
		return fmt.Errorf("capacity factor must be a positive number, got %g", cfg.CapacityFactor)
	}
	if cfg.EvalCapacityFactor < 0 || math.IsNaN(cfg.EvalCapacityFactor) || math.IsInf(cfg.EvalCapacityFactor, 0) {
		return fmt.Errorf("evaluation capacity factor must be a positive number (or 0: the training one), got %g", cfg.EvalCapacityFactor)
	}
	group := cfg.GroupSize
	if group == 0 {
		group = seq
	}
	if group < 1 || (batch*seq)%group != 0 || (group%seq != 0 && seq%group != 0) {
		return fmt.Errorf("group size %d must divide the %d×%d tokens of a batch and divide or be a multiple of seq=%d", group, batch, seq, seq)
	}
	if cfg.Router == RouterExpertChoice && expertChoiceCapacity(group, cfg.Experts, cfg.CapacityFactor) < 1 {
		return fmt.Errorf("expert choice gives each of %d experts %d×%g/%d < 1 tokens of a %d-token group: raise the capacity factor or the group", cfg.Experts, group, cfg.CapacityFactor, cfg.Experts, group)
	}
	for _, w := range []struct {
		name string
		v    float64
	}{{"aux loss weight", cfg.AuxLoss}, {"z-loss weight", cfg.ZLoss}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			return fmt.Errorf("%s must be a finite number ≥ 0, got %g", w.name, w.v)
		}
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"jitter", cfg.Jitter}, {"expert dropout", cfg.ExpertDropout}} {
		if !(p.v >= 0 && p.v < 1) {
			return fmt.Errorf("%s must be in [0, 1), got %g", p.name, p.v)
		}
	}
	if math.IsNaN(cfg.SecondThreshold) || math.IsInf(cfg.SecondThreshold, 0) {
		return fmt.Errorf("gshard's second-expert threshold must be a number, got %g", cfg.SecondThreshold)
	}
	if !slices.Contains([]string{"", ActivationGELU, ActivationReLU, ActivationSwiGLU}, cfg.Activation) {
		return fmt.Errorf("activation %q: want %s, %s or %s", cfg.Activation, ActivationGELU, ActivationReLU, ActivationSwiGLU)
	}
	switch cfg.Layout {
	case MoELayoutStacked:
	case MoELayoutMixtral:
		if cfg.Activation != ActivationSwiGLU {
			return fmt.Errorf("the %s layout names SwiGLU experts (w1, w3, w2), not activation %q", cfg.Layout, cfg.Activation)
		}
		if cfg.Router == RouterNoisyTopK {
			return fmt.Errorf("the %s layout has one router weight (gate); noisy-topk needs two", cfg.Layout)
		}
	default:
		return fmt.Errorf("layout %q: want %q (stacked) or %q", cfg.Layout, MoELayoutStacked, MoELayoutMixtral)
	}
	if cfg.Balance != nil && cfg.Router != RouterSwitch && cfg.Router != RouterSoftmaxTopK {
		return fmt.Errorf("a shared balancing loss is E·Σf·P over its layers' tokens; router %s has a loss of its own", cfg.Router)
	}
	return nil
}

// tokenCapacity is a token-choice router's slots per expert and group:
// ⌈k·T·cf/E⌉ (Megatron's and DeepSpeed's rounding), at most T, since a
// token takes at most one slot of an expert.
func tokenCapacity(k, group, experts int, cf float64) int {
	// Bounded in float64: a factor of 1e19 would overflow the int
	// conversion into the smallest capacity, not the largest.
	c := math.Ceil(float64(k*group) * cf / float64(experts))
	return max(1, int(min(c, float64(group))))
}

// expertChoiceCapacity is the tokens each expert takes from a group:
// T·c/E, rounded down, at most T.
func expertChoiceCapacity(group, experts int, cf float64) int {
	return int(min(float64(group), math.Floor(float64(group)*cf/float64(experts))))
}

// tokenChoiceBalance is a top-k router's balancing loss E·Σ_e f_e·P_e
// (Switch's; Hugging Face's load_balancing_loss_func), f_e the fraction of
// the group's tokens that chose expert e among their k (mask [G,T,E]),
// P_e the mean router probability of e (probs [G,T,E]), per group and
// averaged over groups; with a shared Balance the statistics go there and
// the layer has no loss of its own (nil).
func tokenChoiceBalance(b *frontend.Builder, name string, shared *Balance, probs, mask *frontend.Tensor) *frontend.Tensor {
	if shared == nil {
		return balance(probs, mask).Scale(float64(mask.Dim(2)))
	}
	shared.add(b, name, mask.Mean(1), probs.Mean(1))
	return nil
}

// Balance is one balancing loss over several MoE layers, as Hugging Face's
// load_balancing_loss_func computes Mixtral's from the router logits of
// every layer concatenated: E·Σ_e F_e·P_e, F_e the fraction of the
// tokens' top-k choices that went to expert e (Σ_e F_e = k) and P_e the
// mean router probability of e, both over every layer's tokens. Hugging
// Face takes the means over the whole batch; here they are per routing
// group (one sequence by default) and the loss is averaged over the
// groups, so that it does not depend on how the batch is split over
// devices and microbatches: with one group the two agree. Declare it
// once, set it as MoEConfig.Balance of every layer, and add Loss(),
// weighted, to the loss after the last layer.
type Balance struct {
	choices, probs *frontend.Tensor // Σ over the layers of [G,E]
	layers         int
}

// add takes one layer's f [G,E] and P [G,E].
func (s *Balance) add(b *frontend.Builder, name string, f, p *frontend.Tensor) {
	if s.layers > 0 && !slices.Equal(s.choices.Shape(), f.Shape()) {
		b.Errorf("MoE %s: routing groups and experts %v differ from %v of the other layers sharing its balancing loss", name, f.Shape(), s.choices.Shape())
		return
	}
	if s.layers == 0 {
		s.choices, s.probs = f, p
	} else {
		s.choices, s.probs = s.choices.Add(f), s.probs.Add(p)
	}
	s.layers++
}

// Loss is the unweighted balancing loss of the layers added so far (nil
// before the first), kept in fp32 under mixed precision.
func (s *Balance) Loss() *frontend.Tensor {
	if s.layers == 0 {
		return nil
	}
	var out *frontend.Tensor
	s.choices.Builder().KeepFP32(func() {
		l := 1 / float64(s.layers)
		out = balanceOf(s.choices.Scale(l), s.probs.Scale(l)).Scale(float64(s.choices.Dim(1)))
	})
	return out
}

// balance is Σ_e f_e·P_e per group, averaged over groups: f_e the
// fraction of the group's tokens whose choice (mask [G,T,E]) is expert e,
// P_e the mean router probability of e.
// (The sum over experts is E times the mean over groups and experts
// together: one reduction, whose gradient the microbatch pass can cut.)
func balance(probs, mask *frontend.Tensor) *frontend.Tensor {
	return balanceOf(mask.Mean(1), probs.Mean(1))
}

// balanceOf is Σ_e f_e·P_e of f and P [G,E], averaged over groups.
func balanceOf(f, p *frontend.Tensor) *frontend.Tensor {
	return f.Mul(p).Mean().Scale(float64(f.Dim(1)))
}

// cvSquared is the squared coefficient of variation of each row of v
// [G,E] (population variance over the mean squared, as Shazeer et al.'s
// code computes it), averaged over the rows. The rows here are gate sums,
// whose mean is T/E > 0, so no ε guards the division.
func cvSquared(v *frontend.Tensor) *frontend.Tensor {
	g := v.Dim(0)
	mean := v.Mean(1).Reshape(g, 1)
	dev := v.Sub(mean)
	m := mean.Reshape(g)
	return dev.Mul(dev).Mean(1).Div(m.Mul(m)).Mean()
}

// zLoss is ST-MoE's router z-loss: the mean over tokens of the squared
// log-sum-exp of the router logits [G,T,E].
func zLoss(logits *frontend.Tensor, groups, group int) *frontend.Tensor {
	m := logits.Max(2).Reshape(groups, group, 1)
	lse := logits.Sub(m).Exp().Sum(2).Log().Add(m.Reshape(groups, group))
	return lse.Mul(lse).Mean()
}

// noisyLogits is Shazeer et al.'s H(x) = x·W_g + N(0,1)·(softplus(x·W_noise)
// + 10⁻²) in training (the noise is 0 for evaluation's keys), with the
// clean logits and the noise's std the load estimate needs.
func noisyLogits(b *frontend.Builder, x, keys, clean *frontend.Tensor, name string, experts int) (noisy, _, std *frontend.Tensor) {
	wn := b.Param(name+".router.noise", []int{x.Dim(2), experts}, frontend.Zeros, frontend.NoParallel)
	// softplus(v) = log(exp(v) + 1) overflows to inf once v passes 88.7
	// in float32, and evaluation's zero noise times inf is NaN: past 80
	// it is taken as log(exp(80) + 1) + (v − 80), equal to float
	// precision there, and the same (gradient too, 1/2 at the zero
	// init) below.
	v := x.MatMul(wn)
	over := v.Sub(b.Scalar(80)).Relu()
	std = v.Sub(over).Exp().Add(b.Scalar(1)).Log().Add(over).Add(b.Scalar(1e-2))
	n := keys.Random("normal", name+"/noise", experts)
	return clean.Add(n.Mul(std)), clean, std
}

// smoothLoad is Shazeer et al.'s smooth estimate of each expert's load
// [G,T,E]: the probability that expert e stays in the token's top k if
// only its own noise were drawn again, Φ((clean − threshold)/std), the
// threshold being the k-th largest noisy logit of the others: the
// (k+1)-th largest of all for a selected expert, the k-th for another.
func smoothLoad(noisy, clean, std, topK *frontend.Tensor, k int) *frontend.Tensor {
	b := noisy.Builder()
	g, t := noisy.Dim(0), noisy.Dim(1)
	// The j-th largest of a row is the largest once the top j−1 are
	// pushed far below it.
	kth := func(above *frontend.Tensor) *frontend.Tensor {
		v := noisy
		if above != nil {
			v = v.Sub(above.Scale(1e9))
		}
		return v.Max(2).Reshape(g, t, 1)
	}
	var topKm1 *frontend.Tensor
	if k > 1 {
		topKm1 = noisy.TopKMask(k - 1)
	}
	in := clean.Sub(kth(topK)).Div(std).NormalCDF()
	out := clean.Sub(kth(topKm1)).Div(std).NormalCDF()
	return topK.Mul(in).Add(b.Scalar(1).Sub(topK).Mul(out))
}
