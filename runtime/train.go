package runtime

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"gcompile/data"
	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// Device is what the training loop needs from a backend's device.
type Device interface {
	SetInt32(name string, data []int32) error
	SetScalar(name string, x float64) error
	Scalar(name string) (float64, error)
	// Step runs forward, backward and the optimizer; Forward only the loss.
	Step() error
	Forward() error
	PeakBytes() int64
}

// Schedule is a learning-rate schedule of Megatron-LM's
// OptimizerParamScheduler: linear warm-up to LR over Warmup steps, then
// one of its decay styles to MinLR at step DecaySteps (Steps when 0) and
// MinLR after it:
//   - "cosine": MinLR + (LR − MinLR)·(1 + cos(π·r))/2, r the share of the
//     decay done;
//   - "linear": MinLR + (LR − MinLR)·(1 − r);
//   - "constant": LR throughout (no MinLR);
//   - "inverse-square-root": LR·√peak/√step, never below MinLR;
//   - "wsd" (warm-up, stable, decay): LR until the last WSDDecaySteps of
//     the decay, then down to MinLR in WSDStyle: "exponential"
//     (2·0.5^r − 1, Megatron-LM's default), "linear", "cosine" or
//     "minus_sqrt" (1 − √r), r the share of those steps done.
//
// Steps count from 1, so the first step runs at LR/Warmup rather than 0
// (Megatron-LM evaluates the same formula at the steps already done, its
// first at 0) and the last of the decay at MinLR. Without a warm-up the
// first step runs at LR, as Megatron-LM's does: the decay starts from the
// step at the peak, the warm-up's last or else the first.
type Schedule struct {
	LR, MinLR float64
	Warmup    int
	Steps     int
	Decay     string // cosine, linear, constant, inverse-square-root or wsd
	// DecaySteps is the step the decay ends at (--lr-decay-steps,
	// Megatron-LM's --lr-decay-iters); 0: Steps.
	DecaySteps int
	// WSDDecaySteps and WSDStyle are wsd's annealing: its steps, at the
	// end of the decay, and its shape.
	WSDDecaySteps int
	WSDStyle      string
}

// DecayStyles are the Schedule's decay styles, and WSDStyles wsd's
// annealing shapes.
var (
	DecayStyles = []string{"cosine", "linear", "constant", "inverse-square-root", "wsd"}
	WSDStyles   = []string{"exponential", "linear", "cosine", "minus_sqrt"}
)

// At is the learning rate of 1-based step.
func (s Schedule) At(step int) float64 {
	if s.Warmup > 0 && step <= s.Warmup {
		return s.LR * float64(step) / float64(s.Warmup)
	}
	peak := max(s.Warmup, 1)
	end := s.DecaySteps
	if end <= 0 {
		end = s.Steps
	}
	switch {
	case s.Decay == "constant" || s.Decay == "":
		return s.LR
	case step > end:
		return s.MinLR
	case s.Decay == "inverse-square-root":
		return max(s.MinLR, s.LR*math.Sqrt(float64(peak))/math.Sqrt(float64(max(step, 1))))
	case end <= peak:
		// No step to decay over: the rate stays at its peak.
		return s.LR
	}
	r := float64(step-peak) / float64(end-peak)
	coeff := 1.0
	switch s.Decay {
	case "cosine":
		coeff = 0.5 * (1 + math.Cos(math.Pi*r))
	case "linear":
		coeff = 1 - r
	case "wsd":
		// The anneal starts no earlier than the peak, so that without a
		// warm-up the first step too runs at LR, and an anneal over the
		// whole decay is the linear decay's in wsd's linear shape.
		anneal := max(end-s.WSDDecaySteps, peak)
		if s.WSDDecaySteps <= 0 || step <= anneal {
			return s.LR
		}
		w := float64(step-anneal) / float64(end-anneal)
		switch s.WSDStyle {
		case "linear":
			coeff = 1 - w
		case "cosine":
			coeff = 0.5 * (1 + math.Cos(math.Pi*w))
		case "minus_sqrt":
			coeff = 1 - math.Sqrt(w)
		default: // exponential
			coeff = 2*math.Pow(0.5, w) - 1
		}
	}
	return s.MinLR + coeff*(s.LR-s.MinLR)
}

// TrainConfig is one training run.
type TrainConfig struct {
	Steps       int
	Batch, Seq  int
	Seed        int64
	Schedule    Schedule
	EvalEvery   int // evaluate held-out loss every N steps and after the last; 0: only after the last
	EvalBatches int // batches averaged per evaluation; negative: no evaluation
	// LossScale, for a mixed-precision program (one with a loss_scale
	// input), sets that input each step and learns from the overflow
	// check; nil for fp32 programs.
	LossScale *LossScaler
	// Outputs are the model's auxiliary outputs (b.Output, without the
	// ir.AuxPrefix) read and reported each step.
	Outputs []string
	// EvalOutput is the output evaluation averages (EvalOutput; ""
	// reads the loss).
	EvalOutput string
	// RandomKey, for a program with an ir.InputRandomKey input (a model
	// with random ops: MoE router noise, jitter, expert dropout), fills
	// it each training step with RandomKeys and with −1 (no noise) for
	// evaluation.
	RandomKey bool
	// Start is where training resumes: the zero State starts a run at
	// step 1; a checkpoint's state continues one, so that the steps after
	// it are those of a run that never stopped. Train restores
	// LossScale from it.
	Start State
	// Interrupted, when set, says whether the run was asked to stop (a
	// signal); held-out evaluation asks it between batches, so a long
	// evaluation does not hold up the stop: the step's evaluation is then
	// dropped and Boundary ends the run. In a job of several processes it
	// is collective: every process asks at the same points.
	Interrupted func() (bool, error)
	// Boundary, when set, is called after every step (after report) with
	// the state the run has reached: checkpoints are written there. It
	// returns stop to end the run at that step (preemption) or an error.
	Boundary func(State) (stop bool, err error)
}

// State is where a training run stands between two steps: everything
// besides the devices' params and optimizer state that the rest of the
// run depends on. The learning-rate schedule's position and the data
// cursor follow from Step, since batch k is drawn from (Seed, k) alone
// (data.Corpus.TrainBatch) and the schedule is a function of the step;
// Samples records the cursor as a global sample index for readers. No
// other randomness exists at run time: params are initialised from
// (Seed, name), whatever the plan, and a model's random ops draw from
// per-token keys that are a function of (Seed, Step, token index).
type State struct {
	Step    int   `json:"step"`     // steps completed
	OptStep int   `json:"opt_step"` // optimizer updates applied: a skipped step does not count
	Samples int64 `json:"samples"`  // global samples consumed (Step × global batch)
	Seed    int64 `json:"seed"`
	// LossScale is the mixed-precision loss scaler's state; nil without one.
	LossScale *ScalerState `json:"loss_scale,omitempty"`
}

// ScalerState is a LossScaler's state between steps.
type ScalerState struct {
	Scale   float64 `json:"scale"`
	Dynamic bool    `json:"dynamic"`
	Clean   int     `json:"clean"` // clean steps in a row since the last change
	// Overflows are the overflowed steps since the scale last grew
	// (LossScaler.Hysteresis); absent, 0, in older checkpoints.
	Overflows int `json:"overflows,omitempty"`
}

// CheckStep stops a run at a step whose loss is not finite, or whose
// gradient norm is not finite although no loss scaler skipped the step
// (fp32, bf16): that update was made from an overflowed or NaN gradient,
// so clipping zeroed it or it wrote NaN into the weights, and every later
// step would repeat it while the run reported success (Megatron-LM stops
// on a NaN norm the same way). Each gradient can be finite while the sum
// of their squares overflows float32, so the norm is checked as well as
// the loss.
func CheckStep(step int, loss, gradNorm float64, skipped bool) error {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		if step == 1 {
			// Before any update: the learning rate has not acted yet.
			return fmt.Errorf("step 1: loss is %v before any update: the model, or the weights it starts from, computes it so (a constant that is not finite, a log of 0?); check the model or --load's weights", loss)
		}
		return fmt.Errorf("step %d: loss is %v; lower --lr or check the model", step, loss)
	}
	if !skipped && (math.IsNaN(gradNorm) || math.IsInf(gradNorm, 0)) {
		return fmt.Errorf("step %d: the gradient norm is %v (a gradient, or the sum of their squares, overflowed float32 or is NaN), so the step's update is lost; lower --lr, check the loaded weights or the model, or train in fp16 with a loss scale, which skips such steps", step, gradNorm)
	}
	return nil
}

// CheckEval stops a run whose held-out loss after step is not finite:
// the step's loss and gradient norm were finite, but its update left
// weights that are not (a learning rate far too large), and the run
// would otherwise end, or checkpoint them, as a success.
func CheckEval(step int, loss float64) error {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fmt.Errorf("step %d: the held-out loss is %v: the update of step %d left weights that are not finite; lower --lr or check the model", step, loss, step)
	}
	return nil
}

// EvalOutput is the output a held-out evaluation of a module with these
// outputs averages: the language model's cross-entropy alone
// (ir.OutputLMLoss) where the model reports it beside a loss that adds
// other terms (an MoE's balancing and z losses), as Megatron-LM's
// validation reports its "lm loss"; else the loss. Perplexity is exp of
// it, so a perplexity compares with any other implementation's.
func EvalOutput(outputs []string) string {
	if slices.Contains(outputs, ir.AuxPrefix+ir.OutputLMLoss) {
		return ir.AuxPrefix + ir.OutputLMLoss
	}
	return ir.OutputLoss
}

// AuxOutputs lists the auxiliary outputs of modules' outputs (b.Output in
// the DSL) by the name the model gave, sorted.
func AuxOutputs(names []string) []string {
	var out []string
	for _, n := range names {
		if a, ok := strings.CutPrefix(n, ir.AuxPrefix); ok {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// The mixed-precision pass's names for the loss scale input and the
// overflow count output, as ir spells them; every trainer sets and reads
// them by these.
const (
	InputLossScale  = ir.InputLossScale
	OutputNonFinite = ir.OutputNonFinite
)

// LossScaler is mixed precision's loss scale. Dynamic (Micikevicius et al.
// 2018, PyTorch's GradScaler defaults): start at 2^16, halve and skip the
// step when a gradient holds an inf or NaN, double after 2000 clean steps
// in a row. Static: a fixed scale; a step with non-finite gradients is
// still skipped (the program gates the update).
type LossScaler struct {
	Scale    float64
	Dynamic  bool
	Growth   float64 // ×Growth after Interval clean steps (2)
	Backoff  float64 // ×Backoff on overflow (0.5)
	Interval int     // clean steps before growing (2000)
	// Hysteresis is how many overflowed steps back the scale off once:
	// each skips its update, and the Hysteresis-th since the scale last
	// grew (or since the start) backs off, and so does each one after it
	// until the scale grows again (Megatron-LM's --hysteresis, 2 there;
	// 0 and 1 are PyTorch's GradScaler, which backs off at every one).
	Hysteresis int
	// MinScale is the least the scale backs off to (Megatron-LM's
	// --min-loss-scale, 1 there; 0: none, as PyTorch's).
	MinScale float64
	clean    int
	// overflows counts the overflowed steps since the scale last grew,
	// for Hysteresis.
	overflows int
}

// NewLossScaler is PyTorch's dynamic scaler for scale 0, else a static one.
func NewLossScaler(scale float64) *LossScaler {
	if scale > 0 {
		return &LossScaler{Scale: scale}
	}
	return &LossScaler{Scale: 65536, Dynamic: true, Growth: 2, Backoff: 0.5, Interval: 2000}
}

// State is the scaler's state, for a checkpoint.
func (s *LossScaler) State() *ScalerState {
	return &ScalerState{Scale: s.Scale, Dynamic: s.Dynamic, Clean: s.clean, Overflows: s.overflows}
}

// Restore continues from a checkpoint's state; the growth policy is the
// run's own, and so is a static scale: it is a flag, not state (as
// Megatron-LM's constant scaler keeps none), so a resume with another
// --loss-scale trains at the new one.
func (s *LossScaler) Restore(st ScalerState) error {
	if st.Dynamic != s.Dynamic {
		return fmt.Errorf("the checkpoint's loss scale is %s and this run's is %s: keep --loss-scale as it was", scaleKind(st.Dynamic), scaleKind(s.Dynamic))
	}
	if !(st.Scale > 0) || math.IsInf(st.Scale, 0) || st.Clean < 0 || st.Overflows < 0 {
		return fmt.Errorf("the checkpoint's loss scale %v (after %d clean steps, %d overflows) is not a valid state", st.Scale, st.Clean, st.Overflows)
	}
	if s.Dynamic {
		s.Scale = st.Scale
	}
	s.clean, s.overflows = st.Clean, st.Overflows
	return nil
}

func scaleKind(dynamic bool) string {
	if dynamic {
		return "dynamic"
	}
	return "static"
}

// Update takes one step's overflow check and reports whether the step was
// skipped (its gradients were not finite).
func (s *LossScaler) Update(nonfinite float64) (skipped bool) {
	if nonfinite != 0 {
		s.clean = 0
		s.overflows++
		if s.Dynamic && s.overflows >= s.Hysteresis {
			s.Scale = max(s.Scale*s.Backoff, s.MinScale)
		}
		return true
	}
	s.clean++
	if s.Dynamic && s.clean >= s.Interval {
		s.Scale *= s.Growth
		s.clean, s.overflows = 0, 0
	}
	return false
}

// StepMetrics is one training step in the metrics JSON.
type StepMetrics struct {
	Step       int     `json:"step"`
	Loss       float64 `json:"loss"`
	Ms         float64 `json:"ms"`
	LR         float64 `json:"lr"`
	GradNorm   float64 `json:"grad_norm"`
	TokensPerS float64 `json:"tokens_per_s"`
	// Mixed precision: the loss scale the step ran with, and whether its
	// gradients overflowed so the update was skipped.
	LossScale float64 `json:"loss_scale,omitempty"`
	// On a skipped step grad_norm is 0 when the norm was not finite.
	Skipped bool `json:"skipped,omitempty"`
	// Outputs are the model's auxiliary outputs (b.Output) by name.
	Outputs map[string]float64 `json:"outputs,omitempty"`
}

// EvalMetrics is one held-out evaluation.
type EvalMetrics struct {
	Step int     `json:"step"`
	Loss float64 `json:"loss"`
}

// RowHolder is a device that knows which rows (the first dim) of its
// batch inputs it holds: a MeshCluster of a job of several processes, or
// of a pipeline whose later stages take no tokens. The training loop asks
// its data source for those rows only.
type RowHolder interface {
	HeldRows(names ...string) (func(row int) bool, error)
}

// heldRows is which rows of the tokens and targets dev holds; nil (every
// row) for a device that does not say.
func heldRows(dev Device) (func(row int) bool, error) {
	h, ok := dev.(RowHolder)
	if !ok {
		return nil, nil
	}
	return h.HeldRows(ir.InputTokens, ir.InputTargets)
}

// CheckSource checks that src holds a window of seq tokens to train on,
// and a held-out one when the run evaluates (a source that can check its
// training split alone, as text can, is not asked for a held-out split it
// will never read).
func CheckSource(src data.Source, seq int, eval bool) error {
	if t, ok := src.(interface{ CheckTrain(int) error }); ok && !eval {
		return t.CheckTrain(seq)
	}
	return src.Check(seq)
}

// Train runs the steps after cfg.Start up to cfg.Steps on dev, feeding
// tokens from src, and calls report after each step (eval is non-nil when
// one ran).
func Train(dev Device, src data.Source, cfg TrainConfig, report func(StepMetrics, *EvalMetrics)) ([]StepMetrics, []EvalMetrics, error) {
	if cfg.Steps <= 0 {
		return nil, nil, fmt.Errorf("--steps must be positive, got %d", cfg.Steps)
	}
	if err := CheckSource(src, cfg.Seq, cfg.EvalBatches >= 0); err != nil {
		return nil, nil, err
	}
	want, err := heldRows(dev)
	if err != nil {
		return nil, nil, err
	}
	if cfg.LossScale == nil {
		// A mixed-precision program multiplies the loss by its loss_scale
		// input: never set, it stays 0, every gradient is NaN and the
		// program's own gate skips every update.
		if _, err := dev.Scalar(OutputNonFinite); err == nil {
			return nil, nil, errors.New("the program is mixed precision (it has a loss_scale input and an overflow count): TrainConfig.LossScale must set its scale (1 for bf16)")
		}
	}
	st := cfg.Start
	if st.Step < 0 || st.OptStep < 0 || st.OptStep > st.Step {
		return nil, nil, fmt.Errorf("a training state at step %d with %d optimizer steps is not valid", st.Step, st.OptStep)
	}
	if st.Step >= cfg.Steps {
		return nil, nil, fmt.Errorf("the run is already at step %d: --steps %d leaves no step to run", st.Step, cfg.Steps)
	}
	if (st.LossScale != nil) != (cfg.LossScale != nil) && st.Step > 0 {
		return nil, nil, errors.New("the checkpoint and this run disagree on loss scaling: resume with the --precision it was saved under")
	}
	if st.LossScale != nil {
		if err := cfg.LossScale.Restore(*st.LossScale); err != nil {
			return nil, nil, err
		}
	}
	st.Seed = cfg.Seed
	var steps []StepMetrics
	var evals []EvalMetrics
	for step := st.Step + 1; step <= cfg.Steps; step++ {
		optStep := st.OptStep + 1 // the update's 1-based count, as in PyTorch: skipped steps do not advance it
		tokens, targets, err := src.TrainRows(cfg.Seed, step, cfg.Batch, cfg.Seq, want)
		if err != nil {
			return steps, evals, fmt.Errorf("step %d: the data: %w", step, err)
		}
		lr := cfg.Schedule.At(step)
		if err := feed(dev, tokens, targets); err != nil {
			return steps, evals, err
		}
		if cfg.RandomKey {
			if err := dev.SetInt32(ir.InputRandomKey, RandomKeys(cfg.Seed, step, len(tokens))); err != nil {
				return steps, evals, err
			}
		}
		if err := dev.SetScalar(ir.InputLR, lr); err != nil {
			return steps, evals, err
		}
		if err := dev.SetScalar(ir.InputStep, float64(optStep)); err != nil {
			return steps, evals, err
		}
		var scale float64
		if cfg.LossScale != nil {
			scale = cfg.LossScale.Scale
			if err := dev.SetScalar(InputLossScale, scale); err != nil {
				return steps, evals, err
			}
		}
		start := time.Now()
		if err := dev.Step(); err != nil {
			return steps, evals, fmt.Errorf("step %d: %w", step, err)
		}
		elapsed := time.Since(start)
		loss, err := dev.Scalar(ir.OutputLoss)
		if err != nil {
			return steps, evals, err
		}
		gn, err := dev.Scalar(ir.OutputGradNorm)
		if err != nil {
			return steps, evals, err
		}
		skipped := false
		if cfg.LossScale != nil {
			bad, err := dev.Scalar(OutputNonFinite)
			if err != nil {
				return steps, evals, err
			}
			skipped = cfg.LossScale.Update(bad)
		}
		if !skipped {
			st.OptStep++
		} else if math.IsInf(gn, 0) || math.IsNaN(gn) {
			gn = 0 // the norm of overflowed gradients; JSON has no inf or NaN
		}
		if err := CheckStep(step, loss, gn, skipped); err != nil {
			return steps, evals, err
		}
		sm := StepMetrics{Step: step, Loss: loss, Ms: float64(elapsed.Microseconds()) / 1000, LR: lr, GradNorm: gn,
			TokensPerS: float64(cfg.Batch*cfg.Seq) / elapsed.Seconds(), LossScale: scale, Skipped: skipped}
		for _, name := range cfg.Outputs {
			x, err := dev.Scalar(ir.AuxPrefix + name)
			if err != nil {
				return steps, evals, err
			}
			if sm.Outputs == nil {
				sm.Outputs = map[string]float64{}
			}
			sm.Outputs[name] = x
		}
		steps = append(steps, sm)
		var ev *EvalMetrics
		if cfg.EvalBatches >= 0 && (step == cfg.Steps || (cfg.EvalEvery > 0 && step%cfg.EvalEvery == 0)) {
			l, interrupted, err := evaluate(dev, src, cfg, want)
			if err != nil {
				return steps, evals, err
			}
			if !interrupted {
				evals = append(evals, EvalMetrics{Step: step, Loss: l})
				ev = &evals[len(evals)-1]
			}
			if err := CheckEval(step, l); err != nil {
				if report != nil {
					report(sm, ev)
				}
				return steps, evals, err
			}
		}
		if report != nil {
			report(sm, ev)
		}
		st.Step = step
		st.Samples = int64(step) * int64(cfg.Batch)
		if cfg.LossScale != nil {
			st.LossScale = cfg.LossScale.State()
		}
		if cfg.Boundary != nil {
			stop, err := cfg.Boundary(st)
			if err != nil {
				return steps, evals, err
			}
			if stop {
				break
			}
		}
	}
	return steps, evals, nil
}

// Evaluate averages the loss over the first cfg.EvalBatches held-out batches.
func Evaluate(dev Device, src data.Source, cfg TrainConfig) (float64, error) {
	want, err := heldRows(dev)
	if err != nil {
		return 0, err
	}
	// Its caller wants the figure: nothing ends it early.
	cfg.Interrupted = nil
	l, _, err := evaluate(dev, src, cfg, want)
	return l, err
}

// evaluate is Evaluate, which stops early when cfg.Interrupted says so.
func evaluate(dev Device, src data.Source, cfg TrainConfig, want func(int) bool) (loss float64, interrupted bool, err error) {
	n := max(cfg.EvalBatches, 1)
	var sum float64
	for i := range n {
		if i > 0 && cfg.Interrupted != nil {
			if stop, err := cfg.Interrupted(); err != nil || stop {
				return 0, stop, err
			}
		}
		l, err := evalBatch(dev, src, cfg, want, i)
		if err != nil {
			return 0, false, err
		}
		sum += l
	}
	return sum / float64(n), false, nil
}

// Evaluator runs held-out batches one at a time (gcompile eval, which
// shows its progress), each as Evaluate runs it.
type Evaluator struct {
	dev  Device
	src  data.Source
	cfg  TrainConfig
	want func(int) bool
}

// NewEvaluator finds the rows dev's devices hold, once.
func NewEvaluator(dev Device, src data.Source, cfg TrainConfig) (*Evaluator, error) {
	want, err := heldRows(dev)
	if err != nil {
		return nil, err
	}
	return &Evaluator{dev: dev, src: src, cfg: cfg, want: want}, nil
}

// Batch is the mean loss of held-out batch index: the mean of Batch(0)…
// Batch(n−1) is Evaluate's figure with EvalBatches n.
func (e *Evaluator) Batch(index int) (float64, error) {
	return evalBatch(e.dev, e.src, e.cfg, e.want, index)
}

func evalBatch(dev Device, src data.Source, cfg TrainConfig, want func(int) bool, i int) (float64, error) {
	tokens, targets, err := src.EvalRows(i, cfg.Batch, cfg.Seq, want)
	if err != nil {
		return 0, fmt.Errorf("eval batch %d: the data: %w", i, err)
	}
	if err := feed(dev, tokens, targets); err != nil {
		return 0, err
	}
	if cfg.RandomKey {
		if err := dev.SetInt32(ir.InputRandomKey, evalKeys(len(tokens))); err != nil {
			return 0, err
		}
	}
	if err := dev.Forward(); err != nil {
		return 0, fmt.Errorf("eval: %w", err)
	}
	name := cfg.EvalOutput
	if name == "" {
		name = ir.OutputLoss
	}
	return dev.Scalar(name)
}

func feed(dev Device, tokens, targets []int32) error {
	if err := dev.SetInt32(ir.InputTokens, tokens); err != nil {
		return err
	}
	return dev.SetInt32(ir.InputTargets, targets)
}

// RandomKeys are the per-token random keys of training step step: key i
// (the i-th token of the global batch, row-major) is a hash of (seed,
// step, i), non-negative, so each token's draws are the same whatever
// device holds it.
func RandomKeys(seed int64, step, n int) []int32 { return RandomKeysFrom(seed, step, 0, n) }

// RandomKeysFrom are keys first … first+n−1 of RandomKeys: an
// asynchronous replica's rows of the global batch.
func RandomKeysFrom(seed int64, step, first, n int) []int32 {
	keys := make([]int32, n)
	base := kcpu.Mix64(uint64(seed)*0x9e3779b97f4a7c15 ^ kcpu.Mix64(uint64(step)))
	for i := range keys {
		keys[i] = int32(kcpu.Mix64(base+uint64(first+i)) >> 33)
	}
	return keys
}

// evalKeys are evaluation's keys: −1, which random ops read as "no
// noise".
func evalKeys(n int) []int32 {
	keys := make([]int32, n)
	for i := range keys {
		keys[i] = -1
	}
	return keys
}
