package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gcompile/compile"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
)

// checkCheckpointPaths runs before any compile: the folder checkpoints go
// to must be writable and the checkpoint to resume from must exist, so
// neither is found out after the work is done. It returns the resolved
// checkpoint to resume from.
func checkCheckpointPaths(c *config) (string, error) {
	if c.ckptDir != "" {
		if err := checkOutputDir("checkpoint-dir", c.ckptDir); err != nil {
			return "", err
		}
	}
	var dir string
	step := -1
	if c.resume != "" {
		var err error
		if dir, err = checkpoint.Find(c.resume); err != nil {
			if firstAttempt(c, err) {
				// A requeue loop's command (--resume of its own
				// --checkpoint-dir) on its first attempt, or after a kill in
				// the first save: as Megatron-LM's --load of a folder
				// without a checkpoint, the run starts afresh.
				fmt.Fprintf(os.Stderr, "note: --resume %s holds no complete checkpoint yet: the run starts at step 0, saving into it as --checkpoint-dir\n", c.resume)
				c.resume = ""
				return "", checkCheckpointDir(c, "", -1)
			}
			return "", fmt.Errorf("--resume: %w", err)
		}
		m, err := checkpoint.ReadManifest(dir)
		if err == nil {
			// Before the compile, which can be long: a shard missing or cut
			// short. The checksums are checked as the blocks load.
			err = checkpoint.CheckFiles(dir, m)
		}
		if err != nil {
			return "", fmt.Errorf("--resume: %w%s", err, intactHint(dir))
		}
		step = m.State.Step
		if c.stopAfter > 0 && c.stopAfter <= step {
			return "", fmt.Errorf("--stop-after %d: the run resumes after step %d (%s), past it", c.stopAfter, step, dir)
		}
		if c.run && !c.evalOnly {
			if err := checkResume(c, dir, m); err != nil {
				return "", err
			}
		}
	}
	return dir, checkCheckpointDir(c, dir, step)
}

// firstAttempt says whether a training run's --resume that found no
// checkpoint (err, from checkpoint.Find) names its own --checkpoint-dir,
// missing or holding no complete checkpoint and nothing else unknown:
// the first attempt of a command a requeue loop runs unchanged. A
// --resume of another folder stays refused: a mistyped path would train
// from scratch.
func firstAttempt(c *config, err error) bool {
	if !c.run || c.evalOnly || c.ckptDir == "" || !samePath(filepath.Clean(c.resume), filepath.Clean(c.ckptDir)) {
		return false
	}
	if _, serr := os.Stat(c.resume); errors.Is(serr, fs.ErrNotExist) {
		return true
	}
	return errors.Is(err, checkpoint.ErrNoCheckpoint) && !errors.Is(err, checkpoint.ErrUnrecognised)
}

// enclosingCheckpoint is the checkpoint (a folder holding a manifest
// gcompile wrote) that dir is, or lies inside, or "".
func enclosingCheckpoint(dir string) string {
	d := realPath(dir)
	for {
		if _, err := os.Stat(filepath.Join(d, checkpoint.ManifestName)); err == nil {
			if _, err := checkpoint.ReadManifest(d); err == nil {
				return d
			}
		}
		up := filepath.Dir(d)
		if up == d {
			return ""
		}
		d = up
	}
}

// checkCheckpointDir refuses a --checkpoint-dir that holds checkpoints
// this run does not continue: a new run there would write over them (its
// step 2 over theirs) and --keep-last, which keeps the newest steps,
// would delete its own; a run resumed from an older step than the
// folder's newest would branch into it, and --resume of the folder would
// then pick the other branch. resumed is the checkpoint resumed from
// ("" for none), at step.
func checkCheckpointDir(c *config, resumed string, step int) error {
	if c.ckptDir == "" {
		return nil
	}
	// A step folder gcompile did not complete (a user's files in it, a
	// link) at a step this run may save would stop it there: said now,
	// before training. One at or below the step resumed from is never
	// written to.
	l, err := checkpoint.List(c.ckptDir)
	if err != nil {
		return nil // missing: checkOutputDir has checked it can be written
	}
	for _, u := range l.Unrecognised {
		if u.Step > step && u.Step <= c.steps {
			return fmt.Errorf("--checkpoint-dir %s: %s: it is named as a checkpoint of step %d but is not one gcompile completed, and a save there would not replace it; move it out of the folder, or give this run another --checkpoint-dir", c.ckptDir, u, u.Step)
		}
	}
	steps := l.Steps
	if len(steps) == 0 {
		return nil
	}
	newest := steps[len(steps)-1]
	held := fmt.Sprintf("--checkpoint-dir %s holds checkpoints of steps %d to %d", c.ckptDir, steps[0], newest)
	if resumed != "" && step < newest && samePath(filepath.Dir(resumed), c.ckptDir) {
		// Newer checkpoints that cannot be resumed (a shard cut short or
		// gone) are no branch to keep, but are not this run's to delete.
		var damaged []string
		intact := step
		for _, s := range steps {
			if s <= step {
				continue
			}
			if intactCheckpoint(checkpoint.StepDir(c.ckptDir, s)) {
				intact = s
			} else {
				damaged = append(damaged, checkpoint.StepDir(c.ckptDir, s))
			}
		}
		if intact == step {
			return fmt.Errorf("%s, and this run resumes from step %d (%s); the newer ones are damaged (%s; gcompile inspect names what): move them out of the folder, then resume from step %d again",
				held, step, resumed, strings.Join(damaged, ", "), step)
		}
		newest = intact
	}
	switch {
	case resumed == "":
		return fmt.Errorf("%s: a new run there would write over them, and --keep-last would keep theirs; continue that run with --resume %s, or give this one another --checkpoint-dir", held, c.ckptDir)
	case !samePath(filepath.Dir(resumed), c.ckptDir):
		return fmt.Errorf("%s, and this run continues %s from elsewhere: the two runs' checkpoints would mix; give this one another --checkpoint-dir", held, resumed)
	case step < newest:
		return fmt.Errorf("%s, and this run resumes from step %d (%s): it would branch into the folder of the newer steps, and --resume %s would then take the other branch; give this run another --checkpoint-dir, or resume from step %d",
			held, step, resumed, c.ckptDir, newest)
	}
	return nil
}

// checkpointBytes is what one checkpoint of m over devices takes on
// disk: every param and optimizer state whole, once (the shards write
// each block once), and a bound on the rest, the manifest's entry and the
// shards' header lines of every tensor's blocks (checkpointOverhead).
func checkpointBytes(m *ir.Module, devices int) int64 {
	var n, tensors int64
	for _, v := range m.Values {
		if v.Op == "param" || v.Op == "state" {
			n += v.Type.Bytes()
			tensors++
		}
	}
	return n + checkpointOverhead(tensors, devices)
}

// checkpointOverhead bounds what a checkpoint of tensors over devices
// holds besides their bytes: 64 KiB, and 1 KiB a tensor a device for its
// blocks in the manifest and the headers (some 300 bytes each measured;
// counting the tensor bytes alone, a folder 9 % short passed the check
// and the first save failed).
func checkpointOverhead(tensors int64, devices int) int64 {
	return 64<<10 + tensors*int64(max(devices, 1))<<10
}

// savedBytes bounds what --save writes for m: its params, and their
// header lines and the metadata.
func savedBytes(m *ir.Module) int64 {
	var n, tensors int64
	for _, v := range m.Values {
		if v.Op == "param" {
			n += v.Type.Bytes()
			tensors++
		}
	}
	return n + checkpointOverhead(tensors, 1)
}

// freeSpace is freeBytes; tests give a folder a full disk's.
var freeSpace = freeBytes

// checkCheckpointRoom refuses a run whose --checkpoint-dir has less free
// space than one checkpoint takes, before it trains: the first save would
// fail after the steps up to it were spent. Less than the --keep-last
// checkpoints plus the one being written is a warning, since the run gets
// that far.
func checkCheckpointRoom(c *config, j *job, m *ir.Module, resumeDir string) error {
	if !j.lead() {
		return nil
	}
	// A run resumed at its last step writes no checkpoint, only the
	// outputs it owes (often on a disk nearly full).
	saves := c.ckptDir != ""
	if resumeDir != "" {
		if saved, err := checkpoint.ReadManifest(resumeDir); err == nil && saved.State.Step >= c.steps {
			saves = false
		}
	}
	if c.save != "" {
		// The weights are written after the training: a folder without
		// room for them lost it all when no checkpoint was kept.
		if free, ok := freeSpace(filepath.Dir(c.save)); ok {
			weights, need, beside := savedBytes(m), savedBytes(m), ""
			if saves && sameFileSystem(filepath.Dir(c.save), c.ckptDir) {
				need += checkpointBytes(m, c.Devices)
				beside = fmt.Sprintf(", %s with the checkpoint the run writes on the same file system", lower.HumanBytes(need))
			}
			if free < need {
				return fmt.Errorf("--save %s: %s free where it is written, and the weights take %s%s: they would fail to be written after the training; free some space or save them elsewhere",
					c.save, lower.HumanBytes(free), lower.HumanBytes(weights), beside)
			}
		}
	}
	if !saves {
		return nil
	}
	log := j.log
	free, ok := freeSpace(c.ckptDir)
	if !ok {
		return nil
	}
	one := checkpointBytes(m, c.Devices)
	if free < one {
		return fmt.Errorf("--checkpoint-dir %s: %s free, and one checkpoint of this model takes up to %s (its params and optimizer state, with room for headers and the manifest): the first save would fail after training to it; free some space or give another folder",
			c.ckptDir, lower.HumanBytes(free), lower.HumanBytes(one))
	}
	if keep := int64(c.keepLast) + 1; c.keepLast > 0 && free < keep*one {
		fmt.Fprintf(log, "warning: --checkpoint-dir %s has %s free; --keep-last %d and the save being written need %s (%s each)\n",
			c.ckptDir, lower.HumanBytes(free), c.keepLast, lower.HumanBytes(keep*one), lower.HumanBytes(one))
	}
	return nil
}

// dataIdentity names the run's data by its contents (checkpoint
// Plan.Data): a resumed run and every process of a job must read the
// same. "" before the data is read.
func (c *config) dataIdentity() string {
	switch {
	case c.tokens != nil:
		return c.tokens.identity(c)
	case c.corpus != nil:
		if c.textID == "" {
			c.textID = checkpoint.TextIdentity(c.corpus.Train, c.corpus.Eval)
		}
		return c.textID
	}
	return ""
}

// exportConfigOf is the model's declared configuration with the special
// token ids of the data it trains on: the tokenizer's BOS and EOS, or none
// for bytes and for token data without a tokenizer. Left out, Hugging
// Face's classes fill their own (LlamaConfig: bos 1, eos 2), and its
// generate would stop at a token the model never learned to end with.
func exportConfigOf(c *config) json.RawMessage {
	if c.exportConfig == "" {
		return nil
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(c.exportConfig), &cfg); err != nil {
		return json.RawMessage(c.exportConfig) // checked when the module was read; kept as declared
	}
	cfg["bos_token_id"], cfg["eos_token_id"] = nil, nil
	if c.tokens != nil && c.tokens.tok != nil {
		if id, ok := c.tokens.tok.BOS(); ok {
			cfg["bos_token_id"] = id
		}
		if id, ok := c.tokens.tok.EOS(); ok {
			cfg["eos_token_id"] = id
		}
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return json.RawMessage(c.exportConfig)
	}
	return raw
}

// tokenizerFiles are the files of the tokenizer the run reads its token
// data with, absolute (--tokenizer, then --merges), or none.
func (c *config) tokenizerFiles() []string {
	if c.tokens == nil || c.tokens.tok == nil {
		return nil
	}
	var files []string
	for _, f := range []string{c.tokenizer, c.merges} {
		if f == "" {
			continue
		}
		if abs, err := filepath.Abs(f); err == nil {
			f = abs
		}
		files = append(files, f)
	}
	return files
}

// checkpointPlan is what a manifest records of this run's plan.
func checkpointPlan(c *config, progs []*lower.Program, batch, seq int, procs int) checkpoint.Plan {
	p := checkpoint.Plan{Devices: c.Devices, Precision: c.Precision, Optimizer: c.Optimizer, Batch: batch, Seq: seq, DPSync: c.DPSync,
		Flags: c.metricsConfig(procs)}
	p.Data = c.dataIdentity()
	p.Tokenizer = c.tokenizerFiles()
	p.VocabTables = c.vocabTables
	p.ExportConfig = exportConfigOf(c)
	// Checked when the weights are saved or loaded; a model's own
	// declarations are checked when it is built.
	p.SaveEach, _ = saveEach(params(progs))
	if m := progs[0].Mesh; m != nil {
		p.Mesh = m.String()
	}
	return p
}

// checkpointer writes the run's checkpoints at step boundaries and stops
// the run when a signal asks to.
type checkpointer struct {
	c     *config
	j     *job
	dev   checkpoint.Cluster
	progs []*lower.Program
	opts  checkpoint.SaveOptions
	stop  *preemption
	// saved is the latest checkpoint written, for the closing message;
	// saves every one, for the metrics.
	saved string
	saves []runtime.CheckpointMetrics
	// stoppedBy says what ended the run early ("" when nothing did);
	// stopStatus is the exit status that says so (exitStatus: 0 for
	// --stop-after, which the user asked for).
	stoppedBy  string
	stopStatus int
	// finalErr is the failure of the last step's checkpoint, which ends
	// the run with an error after its other outputs are written.
	finalErr error
	// record writes the --metrics of the run so far after each save
	// (nil: no --metrics, or not process 0).
	record func() error
}

func (k *checkpointer) boundary(st runtime.State) (bool, error) {
	c := k.c
	signalled, err := k.dev.AnyOf(k.stop.requested())
	if err != nil {
		return false, err
	}
	// Every process decides on its own clock, and the job stops where
	// any one's time is up: all of them at the same step.
	timeUp := false
	if c.stopAfterTime > 0 {
		if timeUp, err = k.dev.AnyOf(time.Since(processStart) >= c.stopAfterTime); err != nil {
			return false, err
		}
	}
	asked := c.stopAfter > 0 && st.Step == c.stopAfter
	stop := signalled || timeUp || asked
	if stop && st.Step == c.steps {
		// A signal during the last step came too late to stop anything:
		// the run is finished, and its status must say so, or a requeue
		// loop would run it again.
		stop = false
		if k.j.lead() {
			fmt.Fprintf(k.j.log, "the stop was asked for during the last step (%d): the run finishes\n", st.Step)
		}
	}
	if c.ckptDir != "" && (stop || st.Step == c.steps || c.ckptEvery > 0 && st.Step%c.ckptEvery == 0) {
		start := time.Now()
		opts := k.opts
		opts.State = st
		k.j.setPhase(fmt.Sprintf("saving the checkpoint of step %d", st.Step))
		dir, err := checkpoint.SaveState(k.dev, k.progs, opts)
		k.j.setPhase("training")
		if err != nil && st.Step == c.steps && !stop {
			// The training is done and its weights are whole: the end's
			// checkpoint failing (a full disk) must not cost the --save
			// weights and the metrics too. The failure is reported beside
			// the outputs written (train).
			k.finalErr = fmt.Errorf("the checkpoint of the last step (%d): %w", st.Step, err)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ms := float64(time.Since(start).Microseconds()) / 1000
		k.saved = dir
		k.stop.last.Store(dir)
		save := runtime.CheckpointMetrics{Step: st.Step, Dir: dir, Ms: ms}
		if m, err := checkpoint.ReadManifest(dir); err == nil {
			save.ID = m.ID()
		}
		k.saves = append(k.saves, save)
		if k.record != nil {
			if err := k.record(); err != nil {
				// The run goes on: its end writes the file again, and says
				// so if it fails then too.
				fmt.Fprintf(k.j.log, "note: --metrics %s: the record up to this checkpoint was not written: %v\n", k.c.metrics, err)
			}
		}
		if k.j.lead() {
			fmt.Fprintf(k.j.log, "checkpoint of step %d saved to %s in %.0f ms\n", st.Step, dir, ms)
		}
	}
	if stop {
		switch {
		case asked:
			k.note(st, "--stop-after")
		case !signalled:
			k.note(st, "--stop-after-time "+c.stopAfterTime.String())
		default:
			k.note(st, "")
		}
	}
	return stop, nil
}

// note records why the run stopped early and says how to continue it:
// asked names the flag that asked for the stop (exit status 0), "" a
// signal.
func (k *checkpointer) note(st runtime.State, asked string) {
	// A signal to another process of the job stops this one too, with
	// SIGTERM's status: the job was terminated.
	why, status := "a signal to another process", signalStatus(syscall.SIGTERM)
	if s := k.stop.signal(); s != nil {
		why, status = signalName(s), signalStatus(s)
	}
	if asked != "" {
		why, status = asked, 0
	}
	k.stoppedBy, k.stopStatus = why, status
	if !k.j.lead() {
		return
	}
	how := "no --checkpoint-dir was given, so only the outputs asked for are written"
	if k.saved != "" {
		how = "continue with --resume " + k.saved
	}
	fmt.Fprintf(k.j.log, "stopped by %s after step %d of %d: %s\n", why, st.Step, k.c.steps, how)
}

// preemption catches stopSignals and SIGPIPE during training: the first asks
// the run to stop at the next step boundary (after a checkpoint); a
// second exits at once. A checkpoint being written then stays partial and
// is never loaded; the previous one is intact.
type preemption struct {
	got  atomic.Value // os.Signal
	ch   chan os.Signal
	done chan struct{}
	// last is the newest complete checkpoint of the run (a string: the
	// one it resumed from, then each it saved), for what a second signal
	// says.
	last atomic.Value
}

// watchSignals watches for stopSignals, saying what it does to log (the
// job's log: a rank past 0 prefixes its lines with its rank). It also
// takes SIGPIPE from the runtime, so that a write to a closed pipe fails
// with EPIPE rather than ending the process at once: watchLog tells a
// log whose reader went away from a peer's socket that closed, which
// raises SIGPIPE too.
func watchSignals(log io.Writer) *preemption {
	p := &preemption{ch: make(chan os.Signal, 2), done: make(chan struct{})}
	signal.Notify(p.ch, append(slices.Clone(stopSignals), syscall.SIGPIPE)...)
	go func() {
		for {
			select {
			case s := <-p.ch:
				if s == syscall.SIGPIPE {
					continue // the write that raised it fails with EPIPE; watchLog reads that
				}
				if p.got.Load() != nil {
					if last, _ := p.last.Load().(string); last != "" {
						fmt.Fprintf(log, "gcompile: second %v: exiting now; the last complete checkpoint, %s, is intact (a save cut short is never loaded)\n", s, last)
					} else {
						fmt.Fprintf(log, "gcompile: second %v: exiting now; this run has no complete checkpoint (a save cut short is never loaded, and the next run on its --checkpoint-dir removes it)\n", s)
					}
					hardExit(128 + int(s.(syscall.Signal)))
				}
				p.got.Store(s)
				fmt.Fprintf(log, "gcompile: %v: stopping after this step (again to exit now)\n", s)
			case <-p.done:
				return
			}
		}
	}()
	return p
}

// watchLog wraps the run's log: a write to it that fails with EPIPE (its
// reader went away: a pipe to head, a killed tee or launcher) stops the
// run at the step boundary as SIGPIPE would have, with its checkpoint and
// outputs, rather than ending it at its next line; SIGPIPE is ignored
// from then on, for the writes still to come (the summary, after the
// watch ends).
func (p *preemption) watchLog(log io.Writer) io.Writer {
	return &pipeWatch{w: log, broken: func() {
		signal.Ignore(syscall.SIGPIPE)
		p.got.CompareAndSwap(nil, os.Signal(syscall.SIGPIPE))
	}}
}

// pipeWatch is a writer that calls broken once a write fails with EPIPE.
type pipeWatch struct {
	w      io.Writer
	once   sync.Once
	broken func()
}

func (w *pipeWatch) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		w.once.Do(w.broken)
	}
	return n, err
}

func (p *preemption) requested() bool { return p != nil && p.got.Load() != nil }

func (p *preemption) signal() os.Signal {
	if s, ok := p.got.Load().(os.Signal); ok {
		return s
	}
	return nil
}

// release restores the default handling of the signals.
func (p *preemption) release() {
	signal.Stop(p.ch)
	close(p.done)
}

// checkResume checks, before the compile, what the manifest of the
// checkpoint a training run resumes says against this run's flags; what
// needs the compiled model (its fingerprint, the tensors) is checked when
// the state is restored (resumeState).
func checkResume(c *config, dir string, saved *checkpoint.Manifest) error {
	// An asynchronous run's model is one replica's, built at its share of
	// the batch: its checkpoint resumes at the dp it ran, or the model's
	// fingerprint differs for a reason that fingerprint cannot name.
	if dp, ok := saved.Plan.Flags["dp"].(float64); ok && saved.Plan.DPSync == "async" && c.DPSync == "async" && int(dp) != c.DP {
		return fmt.Errorf("--resume %s: the checkpoint is of asynchronous data parallelism over %d replicas, whose model is one replica's share of the batch: resume it with --dp %d (another dp builds another replica): %w",
			dir, int(dp), int(dp), checkpoint.ErrMismatch)
	}
	// PipeDream-2BW keeps a second version of the weights, which no
	// other schedule has or makes: named here, before the tensors'
	// difference says it less directly.
	if was, _ := saved.Plan.Flags["schedule"].(string); (was == "2bw") != (c.Schedule == "2bw") {
		fix := "resume with --schedule 2bw"
		if was != "2bw" {
			fix = "resume without --schedule 2bw"
		}
		return fmt.Errorf("--resume %s: the checkpoint was saved with --schedule %s and this run has --schedule %s; PipeDream-2BW's second weight version (2bw.prev/…) has no place in another schedule: %s: %w",
			dir, orNone(was), orNone(c.Schedule), fix, checkpoint.ErrMismatch)
	}
	// What the manifest says of the training, before the compile (the
	// load checks it again, with what needs the programs).
	diff := []error{checkpoint.TrainingDiffers("--precision", saved.Plan.Precision, c.Precision), checkpoint.TrainingDiffers("--optimizer", saved.Plan.Optimizer, c.Optimizer),
		checkpoint.TrainingDiffers("--dp-sync", saved.Plan.DPSync, c.DPSync)}
	if saved.Plan.DPSync == c.DPSync && c.DPSync != "async" && saved.Plan.Batch > 0 {
		// An asynchronous run's batch is counted after the compile.
		diff = append(diff, checkpoint.TrainingDiffers("--batch", saved.Plan.Batch, c.Batch))
	}
	for _, err := range diff {
		if err != nil {
			return fmt.Errorf("--resume %s: %w", dir, err)
		}
	}
	st := saved.State
	if c.explicit["seed"] && c.seed != st.Seed {
		return fmt.Errorf("--resume %s: the run was seeded with %d, not --seed %d; the data order follows the seed (leave --seed out)", dir, st.Seed, c.seed)
	}
	if st.Step > c.steps {
		return fmt.Errorf("--resume %s: the checkpoint is at step %d, past --steps %d (--steps is the run's total)", dir, st.Step, c.steps)
	}
	return nil
}

// warnDamagedState says, for a command that reads only a checkpoint's
// params (export, generate), that its other files (an optimizer state's
// shard) are missing or cut short: the params it read are whole, but a
// --resume from the checkpoint would be refused.
func warnDamagedState(cmd, dir string, m *checkpoint.Manifest) {
	if err := checkpoint.CheckFiles(dir, m); err != nil {
		fmt.Fprintf(os.Stderr, "note: %s: checkpoint %s is damaged beyond its params, which were read whole: %v; a --resume from it would be refused\n", cmd, dir, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
}

// goModelName is the name a model.go's folder gives its model, which a
// refused --resume names beside the checkpoint's; "" for a .gir, whose
// name is its module line's.
func goModelName(c *config, res *compile.Result) string {
	if strings.HasSuffix(c.Model, ".gir") {
		return ""
	}
	return res.Module.Name
}

// resumeState loads the checkpoint into the devices and returns where the
// run continues from.
func resumeState(c *config, dev checkpoint.Cluster, progs []*lower.Program, model, fingerprint, dir string, plan checkpoint.Plan) (runtime.State, error) {
	// Another model's checkpoint is named with both --set lists, after
	// the data (another dataset pads another vocabulary).
	ex := checkpoint.Expect{Model: model, ModelFingerprint: fingerprint, Plan: plan, Set: c.Set}
	if c.tokens != nil {
		ex.DataAlso = c.tokens.legacyIdentities(c)
	}
	if m, err := checkpoint.ReadManifest(dir); err == nil && fingerprint != "" && m.ModelFingerprint != fingerprint && m.Plan.Batch == c.Batch {
		// The same model computed another way (a fused attention op or
		// its primitive ops) resumes, as Megatron-LM resumes with or
		// without flash attention: the params and their state are the
		// same, the rounding is not.
		set, _ := m.Plan.Flags["set"].(string)
		if how, ok := implementationOnly(c.Config, set, m.ModelFingerprint); ok {
			ex.ModelFingerprint = ""
			if c.Progress != io.Discard {
				fmt.Fprintf(os.Stderr, "resume: the checkpoint computed %s (how the model computes, not what: the steps from here round differently from the run that saved it)\n", how)
			}
		}
	}
	m, err := checkpoint.RestoreState(dev, progs, dir, ex)
	if err != nil {
		hint := ""
		if errors.Is(err, checkpoint.ErrCorrupt) {
			hint = intactHint(dir) // a checksum the load found wrong
		}
		return runtime.State{}, fmt.Errorf("--resume %s: %w%s", dir, err, hint)
	}
	st := m.State
	if notes := scheduleChanges(m.Plan.Flags, c); len(notes) > 0 && c.Progress != io.Discard {
		// Allowed, as Megatron-LM allows it, but no longer the run that
		// was checkpointed: say so, once, in the log.
		fmt.Fprintf(os.Stderr, "resume: %s; the learning-rate schedule and the update follow this run's flags\n", strings.Join(notes, ", "))
	}
	return st, nil
}

// scheduleChanges names the learning-rate and optimizer flags whose
// values differ from those the checkpointed run recorded (saved: its
// metrics config, numbers as JSON reads them).
func scheduleChanges(saved map[string]any, c *config) []string {
	var notes []string
	for _, f := range []struct {
		key, flag string
		now       float64
	}{{"lr", "--lr", c.lr}, {"min_lr", "--min-lr", c.minLR}, {"warmup", "--warmup", float64(c.warmup)}, {"steps", "--steps", float64(c.steps)},
		{"lr_decay_steps", "--lr-decay-steps", float64(c.decaySteps)}, {"lr_wsd_decay_steps", "--lr-wsd-decay-steps", float64(c.wsdDecaySteps)},
		{"weight_decay", "--weight-decay", c.WeightDecay}, {"clip", "--clip", c.Clip}, {"beta1", "--beta1", c.Beta1}, {"beta2", "--beta2", c.Beta2},
		{"adam_eps", "--adam-eps", c.AdamEps}, {"loss_scale_window", "--loss-scale-window", float64(c.lossScaleWindow)},
		{"hysteresis", "--hysteresis", float64(c.hysteresis)}, {"min_loss_scale", "--min-loss-scale", c.minLossScale}} {
		if was, ok := saved[f.key].(float64); ok && was != f.now {
			notes = append(notes, fmt.Sprintf("%s %g (the checkpoint's run: %g)", f.flag, f.now, was))
		}
	}
	if was, ok := saved["lr_decay"].(string); ok && was != c.decay {
		notes = append(notes, fmt.Sprintf("--lr-decay %s (the checkpoint's run: %s)", c.decay, was))
	}
	if was, ok := saved["lr_wsd_decay_style"].(string); ok && was != c.wsdStyle && c.decay == "wsd" {
		notes = append(notes, fmt.Sprintf("--lr-wsd-decay-style %s (the checkpoint's run: %s)", c.wsdStyle, was))
	}
	if was, ok := saved["grad_reduce_dtype"].(string); ok && was != c.gradReduceRan() {
		notes = append(notes, fmt.Sprintf("--grad-reduce-dtype %s (the checkpoint's run: %s)", c.gradReduceRan(), was))
	}
	if was, ok := saved["staleness"].(float64); ok && c.DPSync == "async" && int(was) != c.Staleness {
		notes = append(notes, fmt.Sprintf("--staleness %d (the checkpoint's run: %d)", c.Staleness, int(was)))
	}
	// A static loss scale is the run's own (runtime.LossScaler.Restore);
	// fp16's 0 is the dynamic scaler, whose state the checkpoint carries
	// (and a switch between the two is refused).
	if was, ok := saved["loss_scale"].(float64); ok && was != c.LossScale && !(c.Precision == "fp16" && (was == 0 || c.LossScale == 0)) {
		scale := func(v float64) string {
			if v == 0 {
				return "none"
			}
			return strconv.FormatFloat(v, 'g', -1, 64)
		}
		notes = append(notes, fmt.Sprintf("--loss-scale %s (the checkpoint's run: %s)", scale(c.LossScale), scale(was)))
	}
	return notes
}

// checkShardNames checks, before anything is written, the names export
// writes when the weights go above limit in shards: NAME-00001-of-N and
// NAME.safetensors.index.json, longer than --out's own name, which
// checkOutputFile checked.
func checkShardNames(out string, ts []checkpoint.Tensor, limit int64) error {
	var total int64
	for _, t := range ts {
		total += int64(len(t.Data))
	}
	if limit <= 0 || total <= limit {
		return nil
	}
	base := strings.TrimSuffix(out, ".safetensors")
	// The first shard's name, of the fewest shards the weights take: any
	// shard's is as long.
	first := fmt.Sprintf("%s-%05d-of-%05d.safetensors", base, 1, (total+limit-1)/limit)
	for _, name := range []string{first, base + ".safetensors.index.json"} {
		if err := checkOutputFile("out", name); err != nil {
			return fmt.Errorf("%d bytes of weights go above --max-shard-size %d in shards named after --out: %w", total, limit, err)
		}
	}
	return nil
}

// exportMain is `gcompile export CHECKPOINT --out FILE`: the params of a
// checkpoint, consolidated under the model's names (Hugging Face's for
// the example models), as one safetensors file or, above
// --max-shard-size, as shards with an index as Hugging Face writes them.
func exportMain(args []string) error {
	fs := newSubcommandFlags("export", "CHECKPOINT --out model.safetensors")
	out := fs.String("out", "", "write the consolidated weights here (.safetensors), and the model's config.json beside them when it declares one (replacing one there)")
	maxShard := fs.String("max-shard-size", "5GB", "largest shard: a model above it is written as NAME-00001-of-0000N.safetensors and NAME.safetensors.index.json instead of --out itself")
	tokPath := fs.String("tokenizer", "", "the run's tokenizer (as training took it: a tokenizer.json, a folder holding one, or GPT-2's vocab.json with --merges): checked against the checkpoint's record and written beside the weights as AutoTokenizer reads it, its end and start ids in config.json")
	tokMerges := fs.String("merges", "", "with --tokenizer vocab.json: GPT-2's merges.txt")
	path, err := parseSubcommand(fs, args)
	if err != nil {
		return err
	}
	if *out == "" {
		return errors.New("export: --out FILE is required")
	}
	if !strings.HasSuffix(*out, ".safetensors") {
		// Shards and their index are named after it (NAME-00001-of-…).
		return fmt.Errorf("export: --out %s: the weights are a safetensors file; give a FILE.safetensors", *out)
	}
	limit, err := parseBytes(*maxShard)
	if err != nil {
		return fmt.Errorf("export: --max-shard-size %q: %w", *maxShard, err)
	}
	dir, err := checkpoint.Find(path)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if within(dir, *out) {
		return fmt.Errorf("export: --out %s is inside the checkpoint %s it exports: it would write over the checkpoint's files; give a path outside", *out, dir)
	}
	if ck := enclosingCheckpoint(filepath.Dir(realPath(*out))); ck != "" {
		return fmt.Errorf("export: --out %s is inside checkpoint %s: it would write over or beside that checkpoint's files; give a path outside", *out, ck)
	}
	// Probed as --save is: a device, a pipe or a folder under that name is
	// refused, never renamed over; a folder that cannot be made is named.
	if err := checkOutputFile("out", *out); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	m, ts, err := checkpoint.Consolidate(dir, lower.Param)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	warnDamagedState("export", dir, m)
	var exportCfg map[string]any
	if len(m.Plan.ExportConfig) > 0 {
		// Found out before the weights are written, not after.
		if err := json.Unmarshal(m.Plan.ExportConfig, &exportCfg); err != nil || exportCfg == nil {
			return fmt.Errorf("export: %s: the manifest's export_config is not a JSON object (%v): the checkpoint was edited; nothing was written", dir, err)
		}
	}
	if note := defaultTokenizer(tokPath, tokMerges, dir, ""); note != "" {
		fmt.Fprintln(os.Stderr, note)
	}
	tok, err := exportTokenizer(m, *tokPath, *tokMerges, exportCfg)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	trimVocab(ts, m.Plan.VocabTables) // as --save writes them
	params := len(ts)
	if ts, err = checkpoint.SplitEach(ts, m.Plan.SaveEach); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return fmt.Errorf("export: --out %s: %w", *out, err)
	}
	if err := checkShardNames(*out, ts, limit); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if exportCfg != nil {
		// config.json goes beside the weights: found out before they are written.
		if err := checkOutputFile("out", filepath.Join(filepath.Dir(*out), "config.json")); err != nil {
			return fmt.Errorf("export: the model's config.json beside the weights: %w", err)
		}
	}
	for _, f := range tok.files {
		if err := checkOutputFile("out", filepath.Join(filepath.Dir(*out), f.Name)); err != nil {
			return fmt.Errorf("export: the tokenizer's %s beside the weights: %w", f.Name, err)
		}
	}
	if tok.files != nil {
		if err := tok.checkFolder(filepath.Dir(*out)); err != nil {
			return fmt.Errorf("export: --tokenizer: %w", err)
		}
	}
	stop := removeTempsOnSignal(*out)
	meta := map[string]string{"format": "pt", "producer": "gcompile", "model": m.Model, "step": fmt.Sprint(m.State.Step)}
	if m.Plan.Data != "" {
		// The data's identity, its tokenizer's with it, as --save keeps
		// it: a load of the file checks the tokenizer given against it.
		meta["data"] = m.Plan.Data
	}
	files, err := checkpoint.SaveSharded(*out, ts, meta, limit)
	stop()
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	fmt.Fprintf(os.Stderr, "exported %d params of %s (step %d) to %s\n", params, m.Model, m.State.Step, strings.Join(files, ", "))
	if err := tok.write(filepath.Dir(*out)); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if exportCfg != nil {
		cfg, err := writeExportConfig(filepath.Dir(*out), exportCfg, m.Plan.VocabTables)
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		fmt.Fprintf(os.Stderr, "wrote %s (the model's configuration as it declares it, b.ExportConfig)\n", cfg)
		if tok.files == nil && !trainedOnBytes(m) {
			// Byte-level text has no tokenizer to copy: its ids are bytes.
			gone := ""
			if len(m.Plan.Tokenizer) > 0 {
				gone = fmt.Sprintf(" (it read %s, which is not there now)", strings.Join(m.Plan.Tokenizer, " with --merges "))
			}
			fmt.Fprintf(os.Stderr, "note: no tokenizer written: give export the run's --tokenizer%s to write it beside the weights, for AutoTokenizer.from_pretrained\n", gone)
		}
		return nil
	}
	note := "no config.json written: the checkpoint's model declares no configuration (b.ExportConfig)"
	if _, err := os.Stat(filepath.Join(filepath.Dir(*out), "config.json")); err == nil {
		note += "; the config.json already in " + filepath.Dir(*out) + " is another export's and was left as it was"
	}
	fmt.Fprintln(os.Stderr, note)
	return nil
}

// removeTempsOnSignal makes a signal during an export's writes remove the
// temporary files they leave (.NAME*.tmp beside out: the file's and its
// shards') and exit with 128 + the signal, as a stopped run does; each
// interrupted export left tens of MB of them. stop ends the watch.
func removeTempsOnSignal(out string) (stop func()) {
	pattern := filepath.Join(filepath.Dir(out), "."+strings.TrimSuffix(filepath.Base(out), ".safetensors")+"*.tmp")
	return cleanUpOnSignal("export", func() string {
		tmps, _ := filepath.Glob(pattern)
		for _, t := range tmps {
			os.Remove(t)
		}
		return fmt.Sprintf("removed its %d temporary files, and what --out held is as it was", len(tmps))
	})
}

// cleanUpOnSignal makes a SIGINT or SIGTERM run clean, say what it did
// (what names the work stopped) and exit with 128 + the signal, as a
// stopped run does: for work that watches for no signal itself and
// leaves files a plain exit would not remove. stop ends the watch.
func cleanUpOnSignal(what string, clean func() string) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "gcompile: %s: stopped by %s; %s\n", what, signalName(s), clean())
			hardExit(signalStatus(s))
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

// writeExportConfig writes a model's declared configuration as
// dir/config.json, where Hugging Face's from_pretrained looks for it:
// vocab_size is the rows export wrote when the vocabulary was padded for
// the data (tables), and torch_dtype the weights' (export writes the
// fp32 master weights).
func writeExportConfig(dir string, cfg map[string]any, tables map[string]int) (string, error) {
	if _, ok := cfg["vocab_size"]; ok {
		for _, rows := range tables {
			cfg["vocab_size"] = rows
		}
	}
	cfg["torch_dtype"] = "float32"
	text, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "config.json")
	if err := runtime.WriteFileAtomic(path, append(text, '\n')); err != nil {
		return "", err
	}
	return path, nil
}

// inspectMain is `gcompile inspect CHECKPOINT`: the manifest, the plan
// that saved it and the bytes each rank wrote.
func inspectMain(args []string) error {
	fs := newSubcommandFlags("inspect", "CHECKPOINT")
	path, err := parseSubcommand(fs, args)
	if err != nil {
		return err
	}
	dir, err := checkpoint.Find(path)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	fmt.Print(checkpoint.Describe(dir, m))
	// The shards are checked as --resume checks them: a damaged checkpoint
	// is an error (rc 1), not a description.
	if err := checkpoint.Verify(dir, m); err != nil {
		return fmt.Errorf("inspect: %s cannot be resumed: %w", dir, err)
	}
	fmt.Printf("every shard's size and CRC-32C match the manifest (%d files)\n", len(m.Files))
	return nil
}

func newSubcommandFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("gcompile "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: gcompile %s %s\n", name, usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseSubcommand parses flags around the one positional argument.
func parseSubcommand(fs *flag.FlagSet, args []string) (string, error) {
	positional, err := parsePositional(fs, args)
	if err != nil {
		return "", err
	}
	if len(positional) != 1 {
		// The error is printed after "gcompile: ": the subcommand alone.
		name := strings.TrimPrefix(fs.Name(), "gcompile ")
		return "", fmt.Errorf("%s: want one checkpoint folder, got %d arguments (see gcompile %s -h)", name, len(positional), name)
	}
	return filepath.Clean(positional[0]), nil
}

// orNone is s, or "none" for an empty flag.
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// intactCheckpoint says whether the checkpoint in dir can be resumed as
// far as its manifest and its files' sizes tell (checkpoint.CheckFiles).
func intactCheckpoint(dir string) bool {
	m, err := checkpoint.ReadManifest(dir)
	return err == nil && checkpoint.CheckFiles(dir, m) == nil
}

// intactHint names, for a damaged checkpoint dir in a folder of steps,
// the newest older one that is intact, as the one to resume from.
func intactHint(dir string) string {
	step, ok := checkpoint.StepOf(filepath.Base(filepath.Clean(dir)))
	if !ok {
		return ""
	}
	root := filepath.Dir(filepath.Clean(dir))
	l, err := checkpoint.List(root)
	if err != nil {
		return ""
	}
	for i := len(l.Steps) - 1; i >= 0; i-- {
		if s := l.Steps[i]; s < step && intactCheckpoint(checkpoint.StepDir(root, s)) {
			return fmt.Sprintf("; the newest intact checkpoint before it is %s (its files all there, at their sizes; their checksums are checked as it loads): move %s out of %s, then resume from it", checkpoint.StepDir(root, s), dir, root)
		}
	}
	return ""
}
