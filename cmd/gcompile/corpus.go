package main

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"gcompile/data"
	"gcompile/ir"
	"gcompile/runtime"
)

// loadSource is the run's data: the token datasets checkPaths opened, with
// their sample index built or reused for seq, or the byte-level text.
func loadSource(c *config, j *job, m *ir.Module, seq int) (data.Source, error) {
	if c.tokens != nil {
		log := func(string, ...any) {}
		if j.lead() {
			log = func(f string, a ...any) { fmt.Fprintf(j.log, f, a...) }
		}
		return c.tokens.source(c, m, seq, log)
	}
	corpus, err := loadCorpus(c, m, seq)
	if err == nil && j.lead() && c.evalBatches > 0 {
		// An evaluation's windows wrap around a held-out part with fewer
		// offsets, as the token data's samples do (tokenData.source).
		if windows, want := int64(len(corpus.Eval)-seq-1), int64(c.evalBatches)*int64(c.Batch); windows > 0 && want > windows {
			fmt.Fprintf(j.log, "held-out text: %d windows of %d+1 bytes, fewer than the %d an evaluation reads (--eval-batches %d × --batch %d), so it reads some twice or more; --eval-batches %d reads each at most once\n",
				windows, seq, want, c.evalBatches, c.Batch, max(windows/int64(c.Batch), 1))
		}
	}
	return corpus, err
}

// describeSource is the data's line in the log.
func describeSource(src data.Source) string {
	if corpus, ok := src.(*data.Corpus); ok {
		return fmt.Sprintf("%s (%d train / %d held-out bytes)", corpus.Source, len(corpus.Train), len(corpus.Eval))
	}
	return src.String()
}

// dataMetrics is the metrics' account of the data.
func dataMetrics(c *config, src data.Source) *runtime.DataMetrics {
	if corpus, ok := src.(*data.Corpus); ok {
		return &runtime.DataMetrics{Source: corpus.Source, TrainBytes: len(corpus.Train), EvalBytes: len(corpus.Eval)}
	}
	dm := &runtime.DataMetrics{Source: src.String()}
	if td := c.tokens; td != nil {
		for _, ds := range td.sets {
			dm.Tokens += ds.Tokens()
			dm.Documents += int64(ds.NumSequences())
		}
		dm.Identity = td.identity(c)
		dm.Split = c.split
		if td.tok != nil {
			dm.Tokenizer = td.tok.Path()
		}
	}
	return dm
}

// loadCorpus is the training text (read by checkPaths, or now), checked
// against the compiled model before any step: long enough for one window
// of seq tokens, and every byte a token of the model (a byte ≥ the vocab
// would index past the embedding table and the logits). Errors name
// --data and, for the vocab, what to change.
func loadCorpus(c *config, m *ir.Module, seq int) (*data.Corpus, error) {
	corpus := c.corpus
	if corpus == nil {
		var err error
		if corpus, err = data.Load(data.Options{Path: c.data, MaxBytes: int64(c.maxDataMB) << 20}); err != nil {
			return nil, dataErr(c, err)
		}
	}
	if err := runtime.CheckSource(corpus, seq, c.evalBatches >= 0 || c.evalOnly); err != nil {
		if errors.Is(err, data.ErrTooSmall) && cutByCap(corpus, int64(c.maxDataMB)<<20) {
			err = fmt.Errorf("%w; --max-data-mb %d is how much is read", err, c.maxDataMB)
		}
		return nil, dataErr(c, err)
	}
	vocab, where := tokenRange(m)
	if vocab == 0 {
		return corpus, nil // no embedding or cross-entropy reads the batch: nothing to bound
	}
	if err := corpus.CheckVocab(vocab); err != nil {
		fix := fmt.Sprintf("raise the model's vocabulary to 256 or more, one token per byte (the examples read it from --set vocab=256), or give text whose bytes are all below %d", vocab)
		if !strings.HasSuffix(c.Model, ".go") {
			fix = fmt.Sprintf("a .gir dump has its sizes fixed: give text whose bytes are all below %d", vocab)
		}
		return nil, dataErr(c, fmt.Errorf("%w; the model's vocab is %s: %s", err, where, fix))
	}
	return corpus, nil
}

// dataErr names --data in an error about the training text, when the
// flag was given (the default corpus has none to name).
func dataErr(c *config, err error) error {
	if c.data == "" {
		if errors.Is(err, data.ErrNoDefaultCorpus) {
			// A .gir run on a machine without Go: the default text is not
			// there, and the flag that replaces it is named.
			return fmt.Errorf("%w; give --data a text file or folder, or a token dataset", err)
		}
		return err
	}
	if idx := strings.TrimSuffix(c.data, ".bin") + ".idx"; errors.Is(err, data.ErrBinary) && strings.HasSuffix(c.data, ".bin") {
		// Megatron-LM's PREFIX.bin whose PREFIX.idx is missing reads as a
		// binary text file: the pair is named too.
		return fmt.Errorf("--data %s: %w (if it is a token dataset's .bin, its index %s is missing: a dataset is PREFIX.bin and PREFIX.idx)", c.data, err, idx)
	}
	return fmt.Errorf("--data %s: %w", c.data, err)
}

// tokenRange is how many token ids the module takes and, for messages,
// where that is decided: the rows of the embedding table the "tokens" input indexes and
// the classes of the cross-entropy the "targets" input labels, whichever
// is fewer. The ids are followed through integer ops (reshapes, the
// microbatch pass's slices) from the inputs; float values are not ids. It
// is 0 when neither input reaches such an op.
func tokenRange(m *ir.Module) (int, string) {
	from := map[*ir.Value]string{} // integer values computed from an input, by input name
	vocab, where := 0, ""
	bound := func(n int, v *ir.Value, what, unit string) {
		if n > 0 && (vocab == 0 || n < vocab) {
			vocab, where = n, fmt.Sprintf("its %s's %d %s (%s)", what, n, unit, v.Where())
		}
	}
	for _, v := range m.Values {
		if v.Op == "input" && (v.Name() == ir.InputTokens || v.Name() == ir.InputTargets) {
			from[v] = v.Name()
			continue
		}
		switch {
		case v.Op == "embedding" && len(v.Args) == 2 && from[v.Args[1]] == ir.InputTokens && v.Args[0].Type.Rank() == 2:
			bound(v.Args[0].Type.Shape[0], v, "embedding table", "rows")
		case v.Op == "cross_entropy" && len(v.Args) == 2 && from[v.Args[1]] == ir.InputTargets && v.Args[0].Type.Rank() >= 1:
			bound(v.Args[0].Type.Shape[v.Args[0].Type.Rank()-1], v, "cross-entropy", "classes")
		}
		if !v.Type.DType.IsInt() {
			continue
		}
		for _, a := range v.Args {
			if name, ok := from[a]; ok {
				from[v] = name
				break
			}
		}
	}
	return vocab, where
}

// cutByCap says whether --max-data-mb (limit bytes) may have cut corpus
// short, so that a too-small split names it: each split reads up to its
// share of the cap (a folder's held-out files DefaultEvalFraction of it),
// and either may have reached its own while the total stayed below.
func cutByCap(corpus *data.Corpus, limit int64) bool {
	evalShare := int64(math.Round(float64(limit) * data.DefaultEvalFraction))
	train, eval := int64(len(corpus.Train)), int64(len(corpus.Eval))
	return train+eval >= limit-limit/100 || train >= (limit-evalShare)*99/100 || eval >= evalShare*99/100
}
