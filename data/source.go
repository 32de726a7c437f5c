package data

import "fmt"

// Source is where the training loop takes its batches from: the byte-level
// Corpus, or a token dataset (package data/sample). A batch is batch rows
// of seq+1 consecutive tokens, returned as next-token pairs flattened
// row-major to batch*seq ids: inputs[r*seq+i] is token i of row r and
// targets[r*seq+i] is token i+1.
//
// Which tokens row r of a step holds is a pure function of (seed, step,
// batch, r), never of the plan or of the process asking, so resumed runs,
// runs under another plan and jobs of several processes see the same data.
// want says which rows the caller's devices hold: a source may leave the
// others zero and never read them, so each process touches only its own
// ranks' samples. A nil want means every row.
type Source interface {
	// Check says whether windows of seq tokens can be drawn, before any
	// training starts.
	Check(seq int) error
	// TrainRows is the global batch of training step step (1-based).
	TrainRows(seed int64, step, batch, seq int, want func(row int) bool) (inputs, targets []int32, err error)
	// EvalRows is the index-th fixed held-out batch: the same for every seed,
	// so evaluation losses compare across runs.
	EvalRows(index, batch, seq int, want func(row int) bool) (inputs, targets []int32, err error)
	// String names the data for logs and run reports.
	String() string
}

// TrainRows is TrainBatch as a Source: the whole corpus is in memory, so rows
// no device here holds cost nothing worth skipping.
func (c *Corpus) TrainRows(seed int64, step, batch, seq int, _ func(row int) bool) ([]int32, []int32, error) {
	in, out := c.TrainBatch(seed, step, batch, seq)
	if in == nil {
		return nil, nil, c.shapeErr(c.Check(seq), batch, seq)
	}
	return in, out, nil
}

// EvalRows is EvalBatch as a Source.
func (c *Corpus) EvalRows(index, batch, seq int, _ func(row int) bool) ([]int32, []int32, error) {
	in, out := c.EvalBatch(index, batch, seq)
	if in == nil {
		if index < 0 {
			return nil, nil, fmt.Errorf("evaluation batch %d: the index must not be negative", index)
		}
		if err := c.Check(seq); err != nil {
			return nil, nil, err
		}
		return nil, nil, c.shapeErr(fmt.Errorf("the held-out split has %d bytes: too few for a window of %d", len(c.Eval), seq+1), batch, seq)
	}
	return in, out, nil
}

// String is the corpus's Source line.
func (c *Corpus) String() string {
	if c == nil {
		return "no corpus"
	}
	return c.Source
}

// shapeErr is why a batch came back empty: the corpus check's error, or a
// batch shape no slice can hold.
func (c *Corpus) shapeErr(err error, batch, seq int) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("a batch of %d rows of %d tokens cannot be drawn", batch, seq)
}
