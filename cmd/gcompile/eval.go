package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"gcompile/compile"
	"gcompile/data/sample"
	"gcompile/data/tokenizer"
	"gcompile/ir"
	"gcompile/runtime"
	"gcompile/runtime/cuda"
)

// evalMain is `gcompile eval MODEL --load W|--resume CKPT [flags]`: the
// model compiled under the plan the flags give (any plan), the weights
// loaded, and the mean loss and perplexity over held-out batches, the
// ones a training run's evaluation reads (the same --data, --split,
// --batch and --eval-batches give the same figure). Progress goes to
// stderr, the result as one JSON object to stdout.
func evalMain(args []string) error {
	c, err := parseArgsWith(args, "eval", func(c *config) {
		c.run, c.evalOnly = true, true
		c.tokenizerNote = defaultTokenizer(&c.tokenizer, &c.merges, c.resume, c.load)
		if !c.explicit["eval-batches"] {
			c.evalBatches = 8 // training's default, so the figures compare
		}
	})
	if err != nil {
		return labelFromLauncher(c, err)
	}
	if c.helpModel {
		return helpModel(c)
	}
	j, err := startJob(c)
	if err != nil {
		return labelFromLauncher(c, err)
	}
	defer func() { err = errors.Join(err, j.close()) }()
	if c.tokenizerNote != "" && j.lead() {
		fmt.Fprintln(j.log, c.tokenizerNote)
	}
	return compileAndRun(c, j)
}

// evalResult is gcompile eval's JSON.
// A non-finite loss (diverged weights) has no JSON number and is null.
type evalResult struct {
	Loss       *float64 `json:"loss"`
	Perplexity *float64 `json:"perplexity"`
	Batches    int      `json:"batches"`
	Batch      int      `json:"batch"`
	Seq        int      `json:"seq"`
	Tokens     int64    `json:"tokens"`
	Data       string   `json:"data"`
	Weights    string   `json:"weights"`
	Devices    int      `json:"devices"`
	Mesh       string   `json:"mesh,omitempty"`
	Seconds    float64  `json:"seconds"`
}

// evaluateOnly loads the weights into the compiled plan and runs the
// held-out batches.
func evaluateOnly(c *config, j *job, gpus []*cuda.Runtime, res *compile.Result, resumeDir string) (err error) {
	progs := res.Programs
	batch, seq, err := inputShape(progs)
	if err != nil {
		return err
	}
	src, err := loadSource(c, j, res.Module, seq)
	if err != nil {
		return err
	}
	dev, _, closeDev, err := newCluster(c, j, gpus, progs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDev()) }()
	if err := dev.InitParams(uint64(c.seed)); err != nil {
		return err
	}
	if res.EvalPrograms != nil {
		// Pipelines and models with evaluation shapes evaluate with
		// forward-only programs of their own, as training does.
		if err := dev.SetEvalPrograms(res.EvalPrograms); err != nil {
			return err
		}
	}
	weights := c.load
	var tok *tokenizer.Tokenizer
	if c.tokens != nil {
		tok = c.tokens.tok
	}
	if c.load != "" {
		if err := loadedTokenizer(c.load, tok, c.tokenizer); err != nil {
			return err
		}
	}
	if c.load != "" && j.lead() {
		note, err := savedModel(c.Config, c.load)
		if err != nil {
			return err
		}
		if note != "" {
			fmt.Fprintln(j.log, note)
		}
	}
	if c.load == "" {
		if err := resumedTokenizer(resumeDir, tok, c.tokenizer); err != nil {
			return err
		}
		m, err := checkpointModel(c.Config, resumeDir, res.ModelFingerprint)
		if err != nil {
			return err
		}
		// Evaluating on other data than the training's is allowed (another
		// corpus, another split), but said: the figure is not the run's.
		if data := c.dataIdentity(); j.lead() && m.Plan.Data != "" && data != "" && m.Plan.Data != data && !c.tokens.legacyOf(c, m.Plan.Data) {
			fmt.Fprintf(j.log, "note: the checkpoint was trained on %s; this evaluation reads %s\n", m.Plan.Data, data)
		}
	}
	if c.load != "" {
		err = loadWeights(dev, progs, c.load, c.ignoredOnLoad(res.Module.IgnoreOnLoad), c.Classes)
	} else {
		weights = resumeDir
		err = loadCheckpointParams(dev, progs, resumeDir, c.ignoredOnLoad(res.Module.IgnoreOnLoad), c.Classes)
	}
	if err != nil {
		return err
	}
	n := c.evalBatches
	if n == 0 {
		ds, ok := src.(*sample.Dataset)
		if !ok {
			return fmt.Errorf("eval: --eval-batches 0 (the whole held-out split) needs a token dataset (--data PREFIX); %s is evaluated on windows at every offset, so give a number of batches", describeSource(src))
		}
		held := ds.HeldOutSamples()
		if n = int(held / int64(batch)); n == 0 {
			return fmt.Errorf("eval: the held-out split has %d samples, fewer than one batch of %d", held, batch)
		}
		if left := held - int64(n*batch); left > 0 && j.lead() {
			fmt.Fprintf(j.log, "the whole held-out split: %d batches of %d samples (the last %d samples make no whole batch and are left out)\n", n, batch, left)
		}
	}
	cfg := runtime.TrainConfig{Batch: batch, Seq: seq, Seed: c.seed, EvalBatches: n, EvalOutput: runtime.EvalOutput(outputNames(res.Module))}
	cfg.RandomKey = res.Module.Source(ir.InputRandomKey) != nil
	ev, err := runtime.NewEvaluator(dev, src, cfg)
	if err != nil {
		return err
	}
	j.setPhase("evaluating")
	start := time.Now()
	var sum float64
	// Redrawn in place on a terminal; a log or a pipe gets a line a batch,
	// as training's steps (one line of carriage returns otherwise).
	tty := isTerminal(j.log)
	for i := range n {
		l, err := ev.Batch(i)
		if err != nil {
			return err
		}
		sum += l
		if j.lead() {
			el := time.Since(start)
			eta := durationOf(float64(el) / float64(i+1) * float64(n-i-1))
			line := fmt.Sprintf("eval batch %d/%d  loss %.4f (mean %.4f)  ETA %s", i+1, n, l, sum/float64(i+1), formatDuration(eta))
			if tty {
				fmt.Fprintf(j.log, "\r%s\x1b[K", line)
			} else {
				fmt.Fprintln(j.log, line)
			}
		}
	}
	if j.lead() && tty {
		fmt.Fprintln(j.log)
	}
	mean := sum / float64(n)
	r := evalResult{Loss: finiteOrNil(mean), Perplexity: finiteOrNil(math.Exp(mean)), Batches: n, Batch: batch, Seq: seq, Tokens: int64(n) * int64(batch) * int64(seq),
		Data: describeSource(src), Weights: weights, Devices: res.Devices(), Seconds: time.Since(start).Seconds()}
	if m := res.Mesh(); m != nil {
		r.Mesh = m.String()
	}
	if !j.lead() {
		return nil
	}
	fmt.Fprintf(j.log, "held-out loss %.4f, perplexity %.3f over %d batches of %d × %d tokens\n", mean, math.Exp(mean), n, batch, seq)
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

// finiteOrNil is x, or nil (JSON null) when it is not finite.
func finiteOrNil(x float64) *float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return nil
	}
	return &x
}
