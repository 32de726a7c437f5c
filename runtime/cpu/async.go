package cpu

import (
	"fmt"
	"math"
	"sync"
	"time"

	"gcompile/data"
	"gcompile/lower"
	"gcompile/runtime"
)

// Async trains with asynchronous data parallelism in the stale-synchronous
// style: each replica runs the gradient program on its share of the batch
// with whatever weights are newest, and one update program (the parameter
// server) applies step t as soon as every replica's step-t gradients have
// arrived. A replica may start step t on weights of version t−1−K at the
// oldest (K = staleness) and waits otherwise; K = 0 is synchronous training.
// The bound is checked on every step, and the largest staleness seen is
// reported.
//
// Under mixed precision both programs read the loss_scale input: the
// gradient program's backward seed is the scale, and the update program
// unscales the averaged gradients by it. Step t's scale is fixed when the
// first replica starts step t, every replica and the update of step t use
// that one value, and the scaler learns from the update's overflow count
// before the next step may start on the new weights.
type Async struct {
	Workers  []*Device
	Server   *Device
	boundary []string
	params   []string
	k        int
	// scaled: both programs have the loss_scale input (mixed precision).
	scaled bool

	mu       sync.Mutex
	cond     *sync.Cond
	version  int                   // updates applied
	grads    map[int][][][]float64 // step → replica → boundary values
	losses   map[int][]float64
	scales   map[int]float64 // step → the loss scale its gradients were computed with
	scaler   *runtime.LossScaler
	maxStale int
	err      error
}

// NewAsync loads dp replicas of grad and one update program.
func NewAsync(grad, update *lower.Program, boundary []string, dp, staleness int) (*Async, error) {
	if dp < 2 {
		return nil, fmt.Errorf("asynchronous data parallelism needs at least 2 replicas, got %d", dp)
	}
	if staleness < 0 {
		return nil, fmt.Errorf("staleness must be ≥ 0, got %d", staleness)
	}
	a := &Async{boundary: boundary, k: staleness, grads: map[int][][][]float64{}, losses: map[int][]float64{}}
	a.cond = sync.NewCond(&a.mu)
	for r := range dp {
		d, err := Load(grad, Options{})
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", r, err)
		}
		a.Workers = append(a.Workers, d)
	}
	var err error
	if a.Server, err = Load(update, Options{}); err != nil {
		return nil, fmt.Errorf("update program: %w", err)
	}
	for _, b := range grad.Buffers {
		if b.Kind == lower.Param {
			if _, ok := update.Sources[b.Name]; !ok {
				return nil, fmt.Errorf("param %q has no master copy in the update program", b.Name)
			}
			a.params = append(a.params, b.Name)
		}
	}
	_, gradScaled := grad.Sources[runtime.InputLossScale]
	_, updScaled := update.Sources[runtime.InputLossScale]
	if gradScaled != updScaled {
		return nil, fmt.Errorf("%q is an input of only one of the gradient program (%v) and the update program (%v): "+
			"the scale that multiplies the gradients must be the one that divides them", runtime.InputLossScale, gradScaled, updScaled)
	}
	if updScaled {
		if _, ok := update.Outputs[runtime.OutputNonFinite]; !ok {
			return nil, fmt.Errorf("the update program reads %q but has no %q output to detect overflow with", runtime.InputLossScale, runtime.OutputNonFinite)
		}
	}
	a.scaled = updScaled
	return a, nil
}

// InitParams initialises the master weights and optimizer state.
func (a *Async) InitParams(seed uint64) error { return a.Server.InitParams(seed) }

// MaxStaleness is the largest number of updates a replica's weights lagged by.
func (a *Async) MaxStaleness() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxStale
}

// pull copies the master weights into a replica; the caller holds a.mu, so
// no update is half applied.
func (a *Async) pull(w *Device) error {
	for _, name := range a.params {
		raw, _, err := a.Server.Bytes(name)
		if err != nil {
			return err
		}
		if err := w.SetBytes(name, raw); err != nil {
			return err
		}
	}
	return nil
}

func (a *Async) fail(err error) {
	a.mu.Lock()
	if a.err == nil {
		a.err = err
	}
	a.cond.Broadcast()
	a.mu.Unlock()
}

// Train runs cfg.Steps steps; cfg.Batch is the global batch, split evenly
// over the replicas. report sees each step once the update program has
// applied it; the held-out loss is measured once, after the last step.
func (a *Async) Train(corpus *data.Corpus, cfg runtime.TrainConfig, report func(runtime.StepMetrics, *runtime.EvalMetrics)) ([]runtime.StepMetrics, []runtime.EvalMetrics, error) {
	dp := len(a.Workers)
	if cfg.Batch%dp != 0 {
		return nil, nil, fmt.Errorf("global batch %d is not divisible by %d replicas", cfg.Batch, dp)
	}
	if cfg.Steps <= 0 {
		return nil, nil, fmt.Errorf("--steps must be positive, got %d", cfg.Steps)
	}
	if a.scaled && cfg.LossScale == nil {
		return nil, nil, fmt.Errorf("the programs are mixed precision (they read %q): the training config needs a loss scaler", runtime.InputLossScale)
	}
	if !a.scaled && cfg.LossScale != nil {
		return nil, nil, fmt.Errorf("a loss scaler was given but the programs have no %q input (not mixed precision)", runtime.InputLossScale)
	}
	if err := corpus.Check(cfg.Seq); err != nil {
		return nil, nil, err
	}
	local := cfg.Batch / dp
	// Each call is a fresh run of steps 1..cfg.Steps from the current
	// weights; only the largest staleness seen carries over.
	a.mu.Lock()
	a.version, a.err = 0, nil
	a.grads, a.losses, a.scales = map[int][][][]float64{}, map[int][]float64{}, map[int]float64{}
	a.scaler = cfg.LossScale
	a.mu.Unlock()
	var wg sync.WaitGroup
	for r, w := range a.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.replica(r, w, corpus, cfg, local); err != nil {
				a.fail(fmt.Errorf("replica %d: %w", r, err))
			}
		}()
	}
	var steps []runtime.StepMetrics
	var stepErr error
	optStep := 1 // the optimizer's step count: skipped steps do not advance it, as in runtime.Train
	for t := 1; t <= cfg.Steps; t++ {
		start := time.Now()
		sm, err := a.update(t, optStep, cfg)
		if err != nil {
			stepErr = err
			a.fail(err)
			break
		}
		if !sm.Skipped {
			optStep++
		}
		sm.Ms = float64(time.Since(start).Microseconds()) / 1000
		sm.TokensPerS = float64(cfg.Batch*cfg.Seq) / time.Since(start).Seconds()
		steps = append(steps, sm)
		if report != nil && t < cfg.Steps {
			report(sm, nil)
		}
	}
	wg.Wait()
	if stepErr == nil {
		stepErr = a.err
	}
	if stepErr != nil {
		return steps, nil, stepErr
	}
	// Held-out loss of the final weights, on one replica at its batch size.
	w := a.Workers[0]
	a.mu.Lock()
	err := a.pull(w)
	a.mu.Unlock()
	if err != nil {
		return steps, nil, err
	}
	evalCfg := cfg
	evalCfg.Batch = local
	l, err := runtime.Evaluate(w, corpus, evalCfg)
	if err != nil {
		return steps, nil, err
	}
	evals := []runtime.EvalMetrics{{Step: cfg.Steps, Loss: l}}
	if report != nil && len(steps) > 0 {
		report(steps[len(steps)-1], &evals[0])
	}
	return steps, evals, nil
}

// replica is one worker's loop.
func (a *Async) replica(r int, w *Device, corpus *data.Corpus, cfg runtime.TrainConfig, local int) error {
	for t := 1; t <= cfg.Steps; t++ {
		a.mu.Lock()
		for a.err == nil && a.version < t-1-a.k {
			a.cond.Wait()
		}
		if a.err != nil {
			a.mu.Unlock()
			return nil
		}
		stale := t - 1 - a.version
		if stale > a.k || stale < 0 {
			a.mu.Unlock()
			return fmt.Errorf("step %d would use weights %d updates old, beyond the staleness bound %d", t, stale, a.k)
		}
		a.maxStale = max(a.maxStale, stale)
		err := a.pull(w)
		if err == nil && a.scaled {
			// The first replica to start step t fixes its scale from the
			// scaler as it stands: a halving after an overflow reaches
			// only the steps not yet started. Steps already in flight
			// keep their scale, so with staleness K up to K further steps
			// may overflow and be skipped after a halving — the price of
			// not waiting for the update.
			scale, ok := a.scales[t]
			if !ok {
				scale = a.scaler.Scale
				a.scales[t] = scale
			}
			err = w.SetScalar(runtime.InputLossScale, scale)
		}
		a.mu.Unlock()
		if err != nil {
			return err
		}
		tokens, targets := corpus.TrainBatch(cfg.Seed, t, cfg.Batch, cfg.Seq)
		n := local * cfg.Seq
		if err := w.SetInt32("tokens", tokens[r*n:(r+1)*n]); err != nil {
			return err
		}
		if err := w.SetInt32("targets", targets[r*n:(r+1)*n]); err != nil {
			return err
		}
		if err := w.Step(); err != nil {
			return fmt.Errorf("step %d: %w", t, err)
		}
		loss, err := w.Scalar("loss")
		if err != nil {
			return err
		}
		g := make([][]float64, len(a.boundary))
		for i, name := range a.boundary {
			if g[i], err = w.Float64s(name); err != nil {
				return err
			}
		}
		a.mu.Lock()
		if a.grads[t] == nil {
			a.grads[t] = make([][][]float64, len(a.Workers))
			a.losses[t] = make([]float64, len(a.Workers))
		}
		a.grads[t][r], a.losses[t][r] = g, loss
		a.cond.Broadcast()
		a.mu.Unlock()
	}
	return nil
}

// update waits for every replica's step-t gradients, averages them in
// replica order (so a run is reproducible for a given interleaving) and
// applies the optimizer as its optStep-th step. Under mixed precision it
// unscales with the scale the replicas used for step t and lets the scaler
// see the overflow count in the same critical section that publishes the
// new version, so every step started on these weights sees the new scale.
func (a *Async) update(t, optStep int, cfg runtime.TrainConfig) (runtime.StepMetrics, error) {
	a.mu.Lock()
	for a.err == nil && !a.complete(t) {
		a.cond.Wait()
	}
	if a.err != nil {
		a.mu.Unlock()
		return runtime.StepMetrics{}, a.err
	}
	grads, losses, scale := a.grads[t], a.losses[t], a.scales[t]
	delete(a.grads, t)
	delete(a.losses, t)
	delete(a.scales, t)
	a.mu.Unlock()
	dp := float64(len(a.Workers))
	for i, name := range a.boundary {
		avg := make([]float64, len(grads[0][i]))
		for _, g := range grads {
			for j, x := range g[i] {
				avg[j] += x
			}
		}
		for j := range avg {
			avg[j] /= dp
		}
		if err := a.Server.SetFloat64s(name, avg); err != nil {
			return runtime.StepMetrics{}, err
		}
	}
	lr := cfg.Schedule.At(t)
	if err := a.Server.SetScalar("lr", lr); err != nil {
		return runtime.StepMetrics{}, err
	}
	if err := a.Server.SetScalar("step", float64(optStep)); err != nil {
		return runtime.StepMetrics{}, err
	}
	if a.scaled {
		if err := a.Server.SetScalar(runtime.InputLossScale, scale); err != nil {
			return runtime.StepMetrics{}, err
		}
	}
	a.mu.Lock()
	skipped, err := a.apply(t)
	a.cond.Broadcast()
	a.mu.Unlock()
	if err != nil {
		return runtime.StepMetrics{}, err
	}
	gn, err := a.Server.Scalar("grad_norm")
	if err != nil {
		return runtime.StepMetrics{}, err
	}
	if skipped && (math.IsInf(gn, 0) || math.IsNaN(gn)) {
		gn = 0 // the norm of overflowed gradients; JSON has no inf or NaN
	}
	var loss float64
	for _, l := range losses {
		loss += l
	}
	sm := runtime.StepMetrics{Step: t, Loss: loss / dp, LR: lr, GradNorm: gn, Skipped: skipped}
	if a.scaled {
		sm.LossScale = scale
	}
	return sm, nil
}

// apply runs the update program for step t and, under mixed precision,
// feeds its overflow count to the scaler; the caller holds a.mu. The
// program itself gates every param and state write on a finite count, so
// a skipped step changes neither.
func (a *Async) apply(t int) (skipped bool, err error) {
	if err := a.Server.Step(); err != nil {
		return false, fmt.Errorf("update %d: %w", t, err)
	}
	if a.scaled {
		bad, err := a.Server.Scalar(runtime.OutputNonFinite)
		if err != nil {
			return false, fmt.Errorf("update %d: %w", t, err)
		}
		skipped = a.scaler.Update(bad)
	}
	a.version = t
	return skipped, nil
}

func (a *Async) complete(t int) bool {
	g := a.grads[t]
	if g == nil {
		return false
	}
	for _, x := range g {
		if x == nil {
			return false
		}
	}
	return true
}
