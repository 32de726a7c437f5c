package sample

import (
	"fmt"
	"math"
	"math/bits"

	"gcompile/data"
)

// Dataset is a training Sampler and an optional held-out one as a
// data.Source, so the training loop draws token datasets exactly as it
// draws the byte corpus.
type Dataset struct {
	train, eval Sampler
	name        string
	// limit, when above 0, bounds every id drawn (LimitIDs); limitWhy
	// says where it comes from.
	limit    int32
	limitWhy string
}

var _ data.Source = (*Dataset)(nil)

// New adapts train (drawn with the run's seed) and eval (drawn without
// one; nil when the split has no held-out part) to data.Source; name is
// the String for logs.
func New(train, eval Sampler, name string) *Dataset {
	return &Dataset{train: train, eval: eval, name: name}
}

// LimitIDs makes every batch check that its ids lie below n, the ids
// the data was described with (why says by what: a dataset's recorded
// largest id, its tokenizer's vocabulary), and fail naming the sample
// otherwise: the description sized the model's vocabulary, and an id
// past it would index a padding row or past the table. It returns d.
func (d *Dataset) LimitIDs(n int32, why string) *Dataset {
	d.limit, d.limitWhy = n, why
	return d
}

// Check refuses a sequence length other than the one the samples were
// built for, before any step runs. Splits too small for one sample never
// get this far (NewGPT refuses them), but a Sampler from elsewhere is
// checked too. Data without a held-out split passes: only EvalRows fails.
func (d *Dataset) Check(seq int) error {
	if d == nil || isNil(d.train) {
		return fmt.Errorf("%w: no training samples", ErrDataset)
	}
	for _, s := range []struct {
		what string
		s    Sampler
	}{{"training", d.train}, {"held-out", d.eval}} {
		if isNil(s.s) {
			continue
		}
		if err := seqErr(s.what, s.s, seq); err != nil {
			return err
		}
		if s.s.SamplesPerEpoch() <= 0 {
			return fmt.Errorf("%w: the %s split holds no sample of %d+1 tokens; give it more documents (--split) or shorten the sequence", ErrTooSmall, s.what, seq)
		}
	}
	return nil
}

// seqErr is the error for a seq other than the samples'.
func seqErr(what string, s Sampler, seq int) error {
	if seq != s.Seq() {
		return fmt.Errorf("%w: the %s samples were built for seq %d, the batch asks for %d; build them with the model's sequence length", ErrSeq, what, s.Seq(), seq)
	}
	return nil
}

// isNil is whether a Sampler is missing, including a typed nil pointer.
func isNil(s Sampler) bool {
	switch v := s.(type) {
	case nil:
		return true
	case *GPT:
		return v == nil
	case *Blend:
		return v == nil
	}
	return false
}

// TrainRows is step step's batch: row r is training sample
// (step-1)*batch + r, so a run's samples are consumed in order, once per
// epoch, whatever the plan. Rows want leaves out stay zero and their
// tokens are never read.
func (d *Dataset) TrainRows(seed int64, step, batch, seq int, want func(row int) bool) ([]int32, []int32, error) {
	if err := d.shape(d.train, "training", batch, seq); err != nil {
		return nil, nil, err
	}
	if step < 1 {
		return nil, nil, fmt.Errorf("%w: step %d; steps count from 1", ErrBatch, step)
	}
	if int64(step-1) > (math.MaxInt64-int64(batch))/int64(batch) {
		return nil, nil, fmt.Errorf("%w: step %d of %d rows numbers samples past 2^63", ErrBatch, step, batch)
	}
	first := int64(step-1) * int64(batch)
	return d.rows(d.train, seed, batch, seq, want, func(r int) int64 { return first + int64(r) }, "training")
}

// EvalRows is the index-th held-out batch: row r is held-out sample
// (index*batch + r) modulo the held-out samples, drawn without a seed, so
// every run evaluates on the same windows.
func (d *Dataset) EvalRows(index, batch, seq int, want func(row int) bool) ([]int32, []int32, error) {
	if d == nil || isNil(d.eval) {
		return nil, nil, fmt.Errorf("%w: the data has no held-out documents; give --split a held-out part, e.g. 98,2", ErrNoHeldOut)
	}
	if err := d.shape(d.eval, "held-out", batch, seq); err != nil {
		return nil, nil, err
	}
	if index < 0 {
		return nil, nil, fmt.Errorf("%w: evaluation batch %d; the index must not be negative", ErrBatch, index)
	}
	n := uint64(d.eval.SamplesPerEpoch())
	hi, lo := bits.Mul64(uint64(index)%n, uint64(batch)%n)
	base := bits.Rem64(hi, lo, n)
	return d.rows(d.eval, 0, batch, seq, want, func(r int) int64 { return int64((base + uint64(r)%n) % n) }, "held-out")
}

// shape checks a batch's sizes against the samples.
func (d *Dataset) shape(s Sampler, what string, batch, seq int) error {
	if d == nil || isNil(s) {
		return fmt.Errorf("%w: no %s samples", ErrDataset, what)
	}
	if err := seqErr(what, s, seq); err != nil {
		return err
	}
	if batch < 1 || batch > math.MaxInt/max(seq, 1) {
		return fmt.Errorf("%w: a batch of %d rows of %d tokens cannot be drawn", ErrBatch, batch, seq)
	}
	if s.SamplesPerEpoch() <= 0 {
		return fmt.Errorf("%w: the %s split holds no sample", ErrTooSmall, what)
	}
	return nil
}

// rows draws the wanted rows of a batch into next-token pairs.
func (d *Dataset) rows(s Sampler, seed int64, batch, seq int, want func(int) bool, sample func(r int) int64, what string) ([]int32, []int32, error) {
	inputs := make([]int32, batch*seq)
	targets := make([]int32, batch*seq)
	buf := make([]int32, seq+1)
	for r := range batch {
		if want != nil && !want(r) {
			continue
		}
		k := sample(r)
		if err := s.Sample(seed, k, buf); err != nil {
			return nil, nil, fmt.Errorf("%s sample %d (row %d): %w", what, k, r, err)
		}
		if d.limit > 0 {
			for i, id := range buf {
				if id < 0 || id >= d.limit {
					return nil, nil, fmt.Errorf("%s sample %d (row %d): token id %d at position %d is past %s: %w", what, k, r, id, i, d.limitWhy, ErrTokenID)
				}
			}
		}
		copy(inputs[r*seq:(r+1)*seq], buf[:seq])
		copy(targets[r*seq:(r+1)*seq], buf[1:])
	}
	return inputs, targets, nil
}

// String names the data for logs and run reports.
func (d *Dataset) String() string {
	switch {
	case d == nil:
		return "no token data"
	case d.name != "":
		return d.name
	}
	return fmt.Sprintf("token data (%d training samples per epoch)", d.train.SamplesPerEpoch())
}

// HeldOutSamples is how many distinct samples the held-out split holds
// (0 without one): EvalRows' batches visit them in order and wrap.
func (d *Dataset) HeldOutSamples() int64 {
	if d == nil || isNil(d.eval) {
		return 0
	}
	return d.eval.SamplesPerEpoch()
}
