package ir

// Names the passes, the lowering and the runtime agree on. A module's
// inputs and outputs are found by name, and optimizer state is named after
// its param, so these strings are an interface between rooms: each is
// spelled here once and every package reads it from here.
const (
	// OutputLoss is the scalar the model minimises; autodiff
	// differentiates it and evaluation runs the program up to it.
	OutputLoss = "loss"
	// OutputLMLoss is the auxiliary output (b.Output("lm_loss", …)) of a
	// model whose loss adds other terms to its language-modelling
	// cross-entropy (an MoE's balancing loss): held-out evaluation and
	// perplexity report it rather than the loss (runtime.EvalOutput).
	OutputLMLoss = "lm_loss"
	// OutputLogits is what a module built for generation outputs: the
	// logits of every token of the step, [batch·step, vocab], or, where
	// the step reads InputLastToken, of each sequence's last prompt token
	// alone, [batch, vocab].
	OutputLogits = "logits"
	// InputLastToken marks each sequence's last prompt token in a
	// prefill step of more than one token: i32 [batch, step], 1 at the
	// token whose logits the step outputs and 0 elsewhere.
	InputLastToken = "last_token"
	// InputTokens and InputTargets are a language model's per-step batch:
	// i32 token ids [batch, seq] and the ids to predict.
	InputTokens  = "tokens"
	InputTargets = "targets"
	// InputLR is the learning rate of this step, a scalar of the params'
	// dtype the runtime's schedule sets.
	InputLR = "lr"
	// InputStep is the optimizer's 1-based step count, an i64 scalar
	// (Adam's bias correction, Adafactor's decay); a step skipped for
	// overflowed gradients does not advance it.
	InputStep = "step"
	// InputRandomKey is a batch of per-token random keys, i32 [batch,
	// seq], that a model's random ops (MoE router noise, jitter, expert
	// dropout) draw from. The runtime fills it each training step from
	// the seed, the step and each token's global index, so a token's
	// random numbers do not depend on the plan; evaluation feeds −1,
	// which gives each distribution's centre (no noise).
	InputRandomKey = "random_key"
	// InputLossScale is mixed precision's f32 loss scale, which replaces
	// autodiff's seed dloss = 1 (the runtime's LossScaler sets it).
	InputLossScale = "loss_scale"
	// OutputGradNorm is the global L2 norm of the gradients before
	// clipping.
	OutputGradNorm = "grad_norm"
	// OutputNonFinite counts the inf and NaN elements of the unscaled
	// gradients; when it is not 0 the step changed nothing.
	OutputNonFinite = "nonfinite_grads"
)

// Prefixes of derived names: PREFIX + a param's name.
const (
	// GradPrefix names autodiff's outputs: "grad/wte.weight" is the
	// gradient of the loss with respect to param wte.weight.
	GradPrefix = "grad/"
	// AuxPrefix names the model's auxiliary scalar outputs (b.Output):
	// "aux/z_loss". Like the loss they are averaged over microbatches,
	// reduced over data-parallel ranks and reported each step.
	AuxPrefix = "aux/"
	// AdamMPrefix and AdamVPrefix name AdamW's first and second moments.
	AdamMPrefix = "adam.m/"
	AdamVPrefix = "adam.v/"
	// SGDMomentumPrefix names SGD's momentum buffer.
	SGDMomentumPrefix = "sgd.momentum/"
	// AdafactorVPrefix and SM3VPrefix name the unfactored second moments
	// of Adafactor and SM3 (params that are not matrices).
	AdafactorVPrefix = "adafactor.v/"
	SM3VPrefix       = "sm3.v/"
	// PrevPrefix names PipeDream-2BW's previous weight version, which the
	// forward and backward read instead of the param.
	PrevPrefix = "2bw.prev/"
)

// InitCopyPrefix begins a state's "init" attribute when the state starts
// as a copy of a param: "copy:NAME".
const InitCopyPrefix = "copy:"
