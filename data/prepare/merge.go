package prepare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"gcompile/data/indexed"
)

// ErrMerge marks token datasets that cannot be merged into one: none
// given, one given twice or as the output, documents of several
// sequences, or records (PREFIX.json) that say they were made with
// different tokenizers.
var ErrMerge = errors.New("cannot merge the datasets")

// MergeSummary is what Merge wrote.
type MergeSummary struct {
	// Prefix is the output prefix, Inputs the number of datasets merged.
	Prefix string
	Inputs int
	// Documents and Tokens are the merged dataset's, MaxToken its largest
	// id and DType how it stores them.
	Documents, Tokens int64
	MaxToken          int32
	DType             indexed.DType
	// Record says whether PREFIX.json was written: only when every input
	// has one and they agree on the tokenizer; NoRecord says why not.
	Record   bool
	NoRecord string
	// BinBytes and IdxBytes are the sizes of PREFIX.bin and PREFIX.idx.
	BinBytes, IdxBytes int64
	Seconds            float64
}

// String is the one-line report the command prints.
func (s MergeSummary) String() string {
	record := s.Prefix + ".json beside them"
	if !s.Record {
		record = "no " + s.Prefix + ".json (" + s.NoRecord + ")"
	}
	return fmt.Sprintf("%d datasets merged: %d documents, %d tokens as %s (largest id %d); .bin %s, .idx %s, %s, in %.1fs",
		s.Inputs, s.Documents, s.Tokens, s.DType, s.MaxToken, megabytes(s.BinBytes), megabytes(s.IdxBytes), record, s.Seconds)
}

// Merge writes the token datasets at inputs (prefixes of PREFIX.bin and
// PREFIX.idx), one after another in the order given, as one dataset at
// out, as Megatron-LM's tools/merge_datasets.py does for a corpus
// prepared in shards: each input's documents, in order, then the next
// input's. The tokens are stored in the inputs' type when they share one,
// else as int32. PREFIX.json, the record training checks the tokenizer
// against, is written when every input has one and they were made with
// the same tokenizer (its fingerprint, vocabulary, end- and
// beginning-of-document ids), with the counts summed; records that
// disagree are an ErrMerge error, and inputs without one give a dataset
// without one (an old record under out is removed).
//
// As Run, Merge checks everything before it writes, holds PREFIX.lock
// while it writes, and leaves nothing under out on an error or when ctx is
// cancelled.
func Merge(ctx context.Context, out string, inputs []string) (MergeSummary, error) {
	start := time.Now()
	sum := MergeSummary{Prefix: out, Inputs: len(inputs)}
	if len(inputs) == 0 {
		return sum, fmt.Errorf("%w: name at least one dataset to merge", ErrMerge)
	}
	if err := indexed.CheckPrefix(out); err != nil {
		return sum, err
	}
	if err := checkMergeInputs(out, inputs); err != nil {
		return sum, err
	}
	datasets := make([]*indexed.Dataset, 0, len(inputs))
	defer func() {
		for _, d := range datasets {
			d.Close()
		}
	}()
	for _, p := range inputs {
		d, err := indexed.Open(p)
		if err != nil {
			return sum, err
		}
		datasets = append(datasets, d)
		if d.NumDocuments() != d.NumSequences() {
			return sum, fmt.Errorf("%w: %s has %d documents in %d sequences (split into sentences): a merged dataset keeps one sequence a document, as gcompile data prepare writes them; prepare it again without splitting",
				ErrMerge, p, d.NumDocuments(), d.NumSequences())
		}
	}
	sum.DType = datasets[0].DType()
	for _, d := range datasets[1:] {
		if d.DType() != sum.DType {
			sum.DType = indexed.Int32 // holds every valid id of every input
		}
	}
	record, why, err := mergeRecords(inputs)
	if err != nil {
		return sum, err
	}
	release, err := lockPrefix(out)
	if err != nil {
		return sum, err
	}
	defer release()
	removeStaleTemps(out)
	w, err := indexed.Create(out, sum.DType)
	if err != nil {
		return sum, err
	}
	committed := false
	defer func() {
		if !committed {
			w.Abort()
		}
	}()
	var doc []int32
	for k, d := range datasets {
		for i := range d.NumSequences() {
			if i%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return sum, err
				}
			}
			n := d.SequenceLen(i)
			if cap(doc) < n {
				doc = make([]int32, n)
			}
			doc = doc[:n]
			if err := d.Read(i, 0, doc); err != nil {
				return sum, fmt.Errorf("merge: input %s: %w", inputs[k], err)
			}
			if err := w.Add(doc); err != nil {
				return sum, fmt.Errorf("merge: input %s, document %d: %w", inputs[k], i, err)
			}
			for _, t := range doc {
				sum.MaxToken = max(sum.MaxToken, t)
				if record != nil && int(t) >= record.VocabSize {
					// The record would claim a vocabulary the ids
					// overflow, and training would refuse the merged
					// dataset for it, blaming the wrong files.
					return sum, fmt.Errorf("%w: %s, document %d, holds token id %d, outside the vocabulary of %d its record %s gives: the record and the files disagree (prepare %s again)",
						ErrMerge, inputs[k], i, t, record.VocabSize, metaPath(inputs[k]), inputs[k])
				}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	sum.Documents, sum.Tokens = w.Documents(), w.Tokens()
	sum.BinBytes, sum.IdxBytes = w.BinBytes(), w.IdxBytes()
	var companions []indexed.Companion
	if record != nil {
		record.Documents, record.Tokens, record.DType, record.MaxToken = sum.Documents, sum.Tokens, sum.DType, sum.MaxToken
		record.BinBytes, record.IdxBytes = sum.BinBytes, sum.IdxBytes
		tmp, err := writeMetaTemp(out, *record)
		if err != nil {
			return sum, err
		}
		defer os.Remove(tmp) // gone already once Commit renamed it
		companions = append(companions, indexed.Companion{Temp: tmp, Path: metaPath(out)})
	}
	if err := w.Commit(companions...); err != nil {
		return sum, err
	}
	committed = true
	if record == nil {
		// An older dataset's record would describe other files (and
		// ReadMeta would refuse the new ones for it). It goes after the
		// commit, not before: a failed commit must leave the old dataset
		// with its record (without it, any tokenizer would train on it),
		// and a crash in between leaves a record ReadMeta refuses by the
		// sizes it gives, naming the fix.
		if err := os.Remove(metaPath(out)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return sum, fmt.Errorf("merge: remove the record of the dataset %s replaced: %w", out, err)
		}
	}
	sum.Record, sum.NoRecord = record != nil, why
	sum.Seconds = time.Since(start).Seconds()
	return sum, nil
}

// checkMergeInputs refuses an input given twice (its documents would be
// written twice) and an output that is an input (writing it would destroy
// what is read).
func checkMergeInputs(out string, inputs []string) error {
	var errs []error
	same := func(a, b string) bool {
		ai, aerr := os.Stat(a)
		bi, berr := os.Stat(b)
		return aerr == nil && berr == nil && os.SameFile(ai, bi)
	}
	for i, p := range inputs {
		for _, q := range inputs[:i] {
			if p == q || same(p+".bin", q+".bin") {
				errs = append(errs, fmt.Errorf("%w: %s is given twice: its documents would be written twice (weigh datasets with a --data blend instead)", ErrMerge, p))
			}
		}
		if p == out || same(p+".bin", out+".bin") || same(p+".idx", out+".idx") {
			errs = append(errs, fmt.Errorf("%w: the output %s is the input %s: writing it would destroy what is read; give the merged dataset another prefix", ErrMerge, out, p))
		}
	}
	return errors.Join(errs...)
}

// mergeRecords is the merged dataset's record, its counts to be filled
// in, when every input has one and they agree on the tokenizer; nil and
// why not when some input has none. The inputs that have one are all
// compared, wherever one without stands among them: shards of two
// tokenizers are refused in any order.
func mergeRecords(inputs []string) (*Meta, string, error) {
	var merged *Meta
	first, without := "", ""
	for _, p := range inputs {
		m, ok, err := ReadMeta(p)
		if err != nil {
			return nil, "", err
		}
		if !ok {
			if without == "" {
				without = p
			}
			continue
		}
		if merged == nil {
			merged, first = &m, p
			continue
		}
		var differ []string
		if m.Tokenizer != merged.Tokenizer {
			differ = append(differ, fmt.Sprintf("tokenizer %s against %s", m.Tokenizer, merged.Tokenizer))
		}
		if m.VocabSize != merged.VocabSize {
			differ = append(differ, fmt.Sprintf("vocabulary %d against %d", m.VocabSize, merged.VocabSize))
		}
		if m.EOS != merged.EOS {
			differ = append(differ, fmt.Sprintf("end-of-document id %d against %d", m.EOS, merged.EOS))
		}
		if (m.BOS == nil) != (merged.BOS == nil) || m.BOS != nil && *m.BOS != *merged.BOS {
			differ = append(differ, fmt.Sprintf("beginning-of-document id %s against %s", idOrNone(m.BOS), idOrNone(merged.BOS)))
		}
		if len(differ) > 0 {
			return nil, "", fmt.Errorf("%w: %s and %s were prepared differently (%v): a model trains on one tokenizer's ids", ErrMerge, p, first, differ)
		}
		if m.JSONKey != merged.JSONKey {
			merged.JSONKey = ""
		}
		merged.EmptyDocuments += m.EmptyDocuments
		merged.SkippedLines += m.SkippedLines
	}
	if without != "" {
		return nil, fmt.Sprintf("%s has none, so the tokenizer is not known", without), nil
	}
	return merged, "", nil
}

func idOrNone(id *int32) string {
	if id == nil {
		return "none"
	}
	return fmt.Sprint(*id)
}
