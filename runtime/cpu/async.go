package cpu

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"gcompile/data"
	"gcompile/ir"
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
//
// A job may span several processes (NewAsyncJob): replica r runs in the
// process holding device rank r, and the server runs in process 0 beside
// its replicas. Every replica, here or there, takes its weights and hands
// in its gradients as the same messages (see async_wire.go); those of
// other processes travel over the job's Comm, so the server's arithmetic,
// and with K = 0 every bit of the result, is the same however the
// replicas are spread. With K ≥ 1 which version a replica starts from
// depends on timing, in one process as across several.
type Async struct {
	// Workers are the replicas this process holds and Replicas their
	// indices, which are their device ranks in a job: every replica in
	// one process, the process's block of ranks in a job of several.
	Workers  []*Device
	Replicas []int
	// Server runs the update program and holds the master weights and
	// the optimizer state; it lives in process 0 only (nil elsewhere).
	Server *Device

	boundary []string
	params   []string
	dp, k    int
	// scaled: both programs have the loss_scale input (mixed precision).
	scaled bool
	job    runtime.Job // Comm nil: every replica is in this process
	wire   asyncWire

	mu       sync.Mutex
	cond     *sync.Cond
	version  int              // updates applied (on the server)
	end      int              // the last step of the run: cfg.Steps, lowered when the run stops early
	grads    map[int][][]byte // step → replica → its gradients message
	scales   map[int]float64  // step → the loss scale its gradients were computed with
	pending  []int            // by replica: the step whose weights another process's replica awaits (0: none)
	peaks    []int64          // by replica: the peak another process's replica reported last
	scaler   *runtime.LossScaler
	maxStale int
	err      error
}

// NewAsync loads dp replicas of grad and one update program, all in this
// process.
func NewAsync(grad, update *lower.Program, boundary []string, dp, staleness int) (*Async, error) {
	return NewAsyncJob(grad, update, boundary, staleness, &runtime.Job{Layout: runtime.SingleProcess(dp)})
}

// NewAsyncJob loads this process's share of an asynchronous job of
// job.Layout.Devices replicas: the replicas of the ranks it holds and, in
// process 0, the update program. With several processes job.Comm carries
// the replicas' requests, weights and gradients; every process of the job
// calls NewAsyncJob and then Train.
func NewAsyncJob(grad, update *lower.Program, boundary []string, staleness int, job *runtime.Job) (*Async, error) {
	return newAsyncJob(grad, update, boundary, staleness, job, Options{})
}

// newAsyncJob is NewAsyncJob loading its programs with opts (tests give
// it a memory source of their own).
func newAsyncJob(grad, update *lower.Program, boundary []string, staleness int, job *runtime.Job, opts Options) (*Async, error) {
	l := job.Layout
	dp := l.Devices
	if dp < 2 {
		return nil, fmt.Errorf("asynchronous data parallelism needs at least 2 replicas, got %d", dp)
	}
	if staleness < 0 {
		return nil, fmt.Errorf("staleness must be ≥ 0, got %d", staleness)
	}
	if err := l.Check(); err != nil {
		return nil, fmt.Errorf("asynchronous data parallelism over processes: %w", err)
	}
	if l.Procs > 1 && (job.Comm == nil || job.Comm.Size() != dp) {
		return nil, fmt.Errorf("a job of %d processes needs a Comm connecting its %d replicas", l.Procs, dp)
	}
	a := &Async{boundary: boundary, dp: dp, k: staleness, job: *job, grads: map[int][][]byte{}, peaks: make([]int64, dp)}
	a.cond = sync.NewCond(&a.mu)
	// The replicas and the server share the machine's memory, as a
	// cluster's devices do: their arenas must fit together.
	var progs []*lower.Program
	var names []string
	for _, r := range l.Local() {
		progs, names = append(progs, grad), append(names, fmt.Sprintf("replica %d", r))
	}
	if l.Proc == 0 {
		progs, names = append(progs, update), append(names, "the update program")
	}
	if err := checkMemory(progs, names, opts); err != nil {
		return nil, err
	}
	for _, r := range l.Local() {
		d, err := loadChecked(grad, opts)
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", r, err)
		}
		a.Workers = append(a.Workers, d)
		a.Replicas = append(a.Replicas, r)
	}
	if l.Proc == 0 {
		var err error
		if a.Server, err = loadChecked(update, opts); err != nil {
			return nil, fmt.Errorf("update program: %w", err)
		}
	}
	for _, b := range grad.Buffers {
		if b.Kind == lower.Param {
			id, ok := update.Sources[b.Name]
			if !ok {
				return nil, fmt.Errorf("param %q has no master copy in the update program", b.Name)
			}
			if m := update.Buffers[id]; m.Bytes != b.Bytes {
				return nil, fmt.Errorf("param %q is %v (%d bytes) in the gradient program but its master copy is %v (%d bytes)", b.Name, b.Type, b.Bytes, m.Type, m.Bytes)
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
	var err error
	if a.wire, err = newAsyncWire(grad, a.params, boundary); err != nil {
		return nil, err
	}
	return a, nil
}

// InitParams initialises the master weights and optimizer state. They
// live on the server: a process without it has nothing to initialise,
// its replicas take every step's weights from the server.
func (a *Async) InitParams(seed uint64) error {
	if a.Server == nil {
		return nil
	}
	return a.Server.InitParams(seed)
}

// MaxStaleness is the largest number of updates a replica's weights lagged
// by: of every replica on the server's process, of this process's
// replicas elsewhere.
func (a *Async) MaxStaleness() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxStale
}

// Peaks are the replicas' measured peak bytes, by replica, then the
// server's: on the server's process, after Train, where the other
// processes' replicas report theirs with their gradients. Elsewhere it is
// nil.
func (a *Async) Peaks() []int64 {
	if a.Server == nil {
		return nil
	}
	a.mu.Lock()
	out := append([]int64(nil), a.peaks...)
	a.mu.Unlock()
	for i, w := range a.Workers {
		out[a.Replicas[i]] = w.PeakBytes()
	}
	return append(out, a.Server.PeakBytes())
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

// fail records the first error, wakes every wait of this process and, in
// a job of several, aborts the comm so that every other process's waits
// end too instead of running into their timeouts.
func (a *Async) fail(err error) {
	a.mu.Lock()
	first := a.err == nil
	if first {
		a.err = err
	}
	a.cond.Broadcast()
	a.mu.Unlock()
	if first && a.job.Comm != nil {
		a.job.Comm.Abort(err)
	}
}

// errStopped ends a replica's loop quietly: another part of the run has
// failed and recorded why, or the run stopped early (stopAfter).
var errStopped = errors.New("stopped after another failure")

// stopVersion is the version of the weights message that tells a replica
// of another process the run stopped before the step it asked for.
const stopVersion = -1

// stopAfter ends the run after step t (a preemption's checkpoint): replicas
// that ask for a later step's weights, here or in another process, are
// told to stop, and gradients they hand in for later steps are dropped.
// Their in-flight work is not part of the state: resuming starts every
// replica afresh from the server's version-t weights, which is an
// execution the staleness bound allows.
func (a *Async) stopAfter(t int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.end = t
	if a.job.Comm != nil {
		if err := a.answerLocked(); err != nil && a.err == nil {
			a.err = err
		}
	}
	a.cond.Broadcast()
}

// Train runs cfg.Steps steps; cfg.Batch is the global batch, split evenly
// over the replicas. report sees each step once the update program has
// applied it; the held-out loss is measured once, after the last step, on
// replica 0. In a job of several processes every process calls Train;
// only the server's (process 0) returns the steps and the held-out loss,
// and calls report.
func (a *Async) Train(corpus data.Source, cfg runtime.TrainConfig, report func(runtime.StepMetrics, *runtime.EvalMetrics)) ([]runtime.StepMetrics, []runtime.EvalMetrics, error) {
	dp := a.dp
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
	if err := runtime.CheckSource(corpus, cfg.Seq, cfg.EvalBatches >= 0); err != nil {
		return nil, nil, err
	}
	local := cfg.Batch / dp
	start := cfg.Start
	if start.Step < 0 || start.OptStep < 0 || start.OptStep > start.Step || start.Step >= cfg.Steps {
		return nil, nil, fmt.Errorf("cannot start at step %d (optimizer step %d) of a %d-step run", start.Step, start.OptStep, cfg.Steps)
	}
	if start.LossScale != nil && cfg.LossScale != nil {
		if err := cfg.LossScale.Restore(*start.LossScale); err != nil {
			return nil, nil, err
		}
	}
	// Each call is a run of steps start.Step+1..cfg.Steps from the
	// current weights (version start.Step); only the largest staleness
	// seen carries over.
	a.mu.Lock()
	a.version, a.end, a.err = start.Step, cfg.Steps, nil
	a.grads, a.scales = map[int][][]byte{}, map[int]float64{}
	a.pending = make([]int, dp)
	a.scaler = cfg.LossScale
	a.mu.Unlock()
	var wg sync.WaitGroup
	for i, w := range a.Workers {
		r := a.Replicas[i]
		wg.Go(func() {
			if err := a.replica(r, w, corpus, cfg, local); err != nil {
				a.fail(fmt.Errorf("replica %d: %w", r, err))
			}
		})
	}
	if a.Server == nil {
		wg.Wait()
		a.mu.Lock()
		defer a.mu.Unlock()
		return nil, nil, a.err
	}
	for r := range dp {
		if !a.job.Layout.Holds(r) {
			wg.Go(func() {
				if err := a.serve(r, start.Step+1, cfg.Steps); err != nil {
					a.fail(fmt.Errorf("replica %d (%s): %w", r, a.where(r), err))
				}
			})
		}
	}
	var steps []runtime.StepMetrics
	var stepErr error
	st := start
	st.Seed = cfg.Seed
	stopped := false
	for t := start.Step + 1; t <= cfg.Steps && !stopped; t++ {
		begin := time.Now()
		sm, err := a.update(t, st.OptStep+1, cfg) // skipped steps do not advance the optimizer's count, as in runtime.Train
		if err != nil {
			stepErr = err
			a.fail(err)
			break
		}
		if !sm.Skipped {
			st.OptStep++
		}
		sm.Ms = float64(time.Since(begin).Microseconds()) / 1000
		sm.TokensPerS = float64(cfg.Batch*cfg.Seq) / time.Since(begin).Seconds()
		steps = append(steps, sm)
		st.Step, st.Samples = t, int64(t)*int64(cfg.Batch)
		if cfg.LossScale != nil {
			st.LossScale = cfg.LossScale.State()
		}
		if t == cfg.Steps {
			break // the last step is reported, and its boundary called, once every replica is done
		}
		if report != nil {
			report(sm, nil)
		}
		if cfg.Boundary != nil {
			stop, err := cfg.Boundary(st)
			if err != nil {
				stepErr = err
				a.fail(err)
				break
			}
			if stop {
				stopped = true
				a.stopAfter(t)
			}
		}
	}
	wg.Wait()
	if stepErr == nil {
		a.mu.Lock()
		stepErr = a.err
		a.mu.Unlock()
	}
	if stepErr != nil {
		return steps, nil, stepErr
	}
	if stopped {
		return steps, nil, nil
	}
	if cfg.Boundary != nil && len(steps) > 0 {
		// The last step's boundary (its checkpoint) once every replica
		// has finished.
		if _, err := cfg.Boundary(st); err != nil {
			return steps, nil, err
		}
	}
	if cfg.EvalBatches < 0 {
		return steps, nil, nil // no held-out evaluation asked for
	}
	// Held-out loss of the final weights, on replica 0 (always on the
	// server's process) at its batch size: dp times as many batches of
	// a dp-th of the rows, which are the rows of the synchronous
	// evaluation's batches in their order (a held-out batch i of b rows
	// is rows i·b … i·b+b−1), so the figure is one device's.
	w := a.Workers[0]
	a.mu.Lock()
	err := a.pull(w)
	a.mu.Unlock()
	if err != nil {
		return steps, nil, err
	}
	evalCfg := cfg
	evalCfg.Batch = local
	evalCfg.EvalBatches = max(cfg.EvalBatches, 1) * dp
	l, err := runtime.Evaluate(w, corpus, evalCfg)
	if err != nil {
		return steps, nil, err
	}
	evals := []runtime.EvalMetrics{{Step: cfg.Steps, Loss: l}}
	if report != nil && len(steps) > 0 {
		report(steps[len(steps)-1], &evals[0])
	}
	return steps, evals, runtime.CheckEval(cfg.Steps, l)
}

// replica is one worker's loop: take weights, compute its share of the
// step's gradients, hand them in. Replicas on the server's process do it
// by calls, the others by messages (fetch and push).
func (a *Async) replica(r int, w *Device, corpus data.Source, cfg runtime.TrainConfig, local int) error {
	msg := make([]byte, a.wire.weightsLen)
	for t := cfg.Start.Step + 1; t <= cfg.Steps; t++ {
		err := a.fetch(r, t, msg)
		if errors.Is(err, errStopped) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("step %d: %w", t, err)
		}
		version, scale := a.wire.weightsHeader(msg)
		if version == stopVersion {
			return a.stopped(r, t) // the run stopped before step t
		}
		stale := t - 1 - version
		if stale > a.k || stale < 0 {
			return fmt.Errorf("step %d would use weights of version %d, %d updates old, beyond the staleness bound %d", t, version, stale, a.k)
		}
		a.mu.Lock()
		a.maxStale = max(a.maxStale, stale)
		a.mu.Unlock()
		for i, name := range a.params {
			if err := w.SetBytes(name, a.wire.param(msg, i)); err != nil {
				return err
			}
		}
		if a.scaled {
			if err := w.SetScalar(runtime.InputLossScale, scale); err != nil {
				return err
			}
		}
		mine := func(row int) bool { return row/local == r }
		tokens, targets, err := corpus.TrainRows(cfg.Seed, t, cfg.Batch, cfg.Seq, mine)
		if err != nil {
			return fmt.Errorf("step %d: the data: %w", t, err)
		}
		n := local * cfg.Seq
		if err := w.SetInt32(ir.InputTokens, tokens[r*n:(r+1)*n]); err != nil {
			return err
		}
		if err := w.SetInt32(ir.InputTargets, targets[r*n:(r+1)*n]); err != nil {
			return err
		}
		if cfg.RandomKey {
			// The global batch's keys of the replica's rows: each token
			// draws what it draws under synchronous data parallelism.
			if err := w.SetInt32(ir.InputRandomKey, runtime.RandomKeysFrom(cfg.Seed, t, r*n, n)); err != nil {
				return err
			}
		}
		if err := w.Step(); err != nil {
			return fmt.Errorf("step %d: %w", t, err)
		}
		loss, err := w.Scalar(ir.OutputLoss)
		if err != nil {
			return err
		}
		// A fresh message each step: the server keeps it until it applies
		// step t.
		grads := a.wire.gradients(w, loss)
		if err := a.push(r, t, grads); errors.Is(err, errStopped) {
			return nil
		} else if err != nil {
			return fmt.Errorf("step %d: %w", t, err)
		}
	}
	return nil
}

// weightsLocked writes into msg the answer to replica r's request for
// step t's weights: the newest version, which must be at least t−1−K, and
// step t's loss scale, fixed here if r is the first replica to start step
// t. The caller holds a.mu, so no update is half applied.
func (a *Async) weightsLocked(r, t int, msg []byte) error {
	stale := t - 1 - a.version
	if stale > a.k || stale < 0 {
		return fmt.Errorf("replica %d's step %d would use weights %d updates old, beyond the staleness bound %d", r, t, stale, a.k)
	}
	a.maxStale = max(a.maxStale, stale)
	var scale float64
	if a.scaled {
		// The first replica to start step t fixes its scale from the
		// scaler as it stands: a halving after an overflow reaches only
		// the steps not yet started. Steps already in flight keep their
		// scale, so with staleness K up to K further steps may overflow
		// and be skipped after a halving — the price of not waiting for
		// the update.
		var ok bool
		if scale, ok = a.scales[t]; !ok {
			scale = a.scaler.Scale
			a.scales[t] = scale
		}
	}
	return a.wire.weights(msg, a.Server, a.params, a.version, scale)
}

// deposit files replica r's step-t gradients message for the update.
func (a *Async) deposit(r, t int, msg []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.grads[t] == nil {
		a.grads[t] = make([][]byte, a.dp)
	}
	if a.grads[t][r] != nil {
		return fmt.Errorf("replica %d handed in step %d's gradients twice", r, t)
	}
	a.grads[t][r] = msg
	a.peaks[r] = a.wire.gradientsPeak(msg)
	a.cond.Broadcast()
	return nil
}

// update waits for every replica's step-t gradients, averages them in
// replica order (so a run is reproducible for a given interleaving, and
// the same wherever the replicas run) and applies the optimizer as its
// optStep-th step. Under mixed precision it unscales with the scale the
// replicas used for step t and lets the scaler see the overflow count in
// the same critical section that publishes the new version, so every step
// started on these weights sees the new scale.
//
// Its wait has no timeout of its own: it ends when a replica of this
// process computes, or when a call on the comm — each other process's
// replica always has one outstanding here (serve) — delivers or fails.
func (a *Async) update(t, optStep int, cfg runtime.TrainConfig) (runtime.StepMetrics, error) {
	a.mu.Lock()
	for a.err == nil && !a.complete(t) {
		a.cond.Wait()
	}
	if a.err != nil {
		defer a.mu.Unlock()
		return runtime.StepMetrics{}, a.err
	}
	msgs, scale := a.grads[t], a.scales[t]
	delete(a.grads, t)
	delete(a.scales, t)
	a.mu.Unlock()
	dp := float64(a.dp)
	for i, name := range a.boundary {
		avg := make([]float64, a.wire.grads[i].buf.Type.Shape.NumElements())
		for r, msg := range msgs {
			g, err := a.wire.gradient(msg, i)
			if err != nil {
				return runtime.StepMetrics{}, fmt.Errorf("update %d: replica %d's %q: %w", t, r, name, err)
			}
			for j, x := range g {
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
	if err := a.Server.SetScalar(ir.InputLR, lr); err != nil {
		return runtime.StepMetrics{}, err
	}
	if err := a.Server.SetScalar(ir.InputStep, float64(optStep)); err != nil {
		return runtime.StepMetrics{}, err
	}
	if a.scaled {
		if err := a.Server.SetScalar(runtime.InputLossScale, scale); err != nil {
			return runtime.StepMetrics{}, err
		}
	}
	a.mu.Lock()
	skipped, err := a.apply(t)
	if err == nil {
		err = a.answerLocked()
	}
	a.cond.Broadcast()
	a.mu.Unlock()
	if err != nil {
		return runtime.StepMetrics{}, err
	}
	gn, err := a.Server.Scalar(ir.OutputGradNorm)
	if err != nil {
		return runtime.StepMetrics{}, err
	}
	if skipped && (math.IsInf(gn, 0) || math.IsNaN(gn)) {
		gn = 0 // the norm of overflowed gradients; JSON has no inf or NaN
	}
	var loss float64
	for _, msg := range msgs {
		loss += a.wire.gradientsLoss(msg)
	}
	if err := runtime.CheckStep(t, loss/dp, gn, skipped); err != nil {
		return runtime.StepMetrics{}, err
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
