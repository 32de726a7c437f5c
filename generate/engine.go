package generate

import (
	"errors"
	"fmt"
	"slices"

	"gcompile/ir"
)

// Stepper is one compiled generation step loaded on a backend: its
// tokens and positions are set, it runs, and its logits [batch·step,
// vocab] are read whole.
type Stepper interface {
	SetInt32(name string, x []int32) error
	Step() error
	Logits() ([]float64, error)
}

// Engine runs prompts through a prefill program and a decode program of
// one plan (compile.Generation): a batch of prompts at a time, each
// prompt's tokens at once, then one token per sequence per step.
type Engine struct {
	Prefill, Decode Stepper
	// MoveCaches copies the key/value caches from the prefill program to
	// the decode program (runtime.CopySources).
	MoveCaches func() error
	// Batch is the sequences of one step, Prompt the prefill's tokens per
	// sequence, Context the positions a cache holds, Vocab the logits of a
	// token.
	Batch, Prompt, Context, Vocab int
	// LastToken says the prefill reads ir.InputLastToken and outputs the
	// logits of each sequence's last prompt token alone, [batch, vocab];
	// without it, those of every token, [batch·Prompt, vocab].
	LastToken bool
	// RandomKeys says the programs read per-token random keys
	// (ir.InputRandomKey: a MoE router's noise, dropout): generation
	// feeds −1, evaluation's "no noise", as the training loop's
	// evaluation does.
	RandomKeys bool
}

// Request is what to generate for a set of prompts.
type Request struct {
	Prompts  [][]int32
	MaxNew   int
	Sampling Sampling
	EOS      int32 // −1: none
	StopWhen func(seq int, ids []int32) bool
	OnToken  func(seq int, id int32)
	OnLogits func(seq, step int, logits []float64) // for checks: the model's logits each new token was chosen from, before the repetition penalty
	FirstSeq int                                   // the index of Prompts[0] among all prompts (sampling keys on it)
}

// ErrBadPrompt marks a prompt the engine cannot run.
var ErrBadPrompt = errors.New("bad prompt")

// Positions is how many positions a prompt of n tokens and max new
// tokens occupy: the prompt and every new token but the last, which is
// sampled and never fed back (Hugging Face generates one token from a
// prompt that fills the position table, too).
func Positions(n, max int) int { return n + max - 1 }

// Check refuses prompts the programs cannot run, naming the prompt: empty,
// longer than the prefill, ids outside the vocabulary, or more tokens than
// the cache holds.
func (e *Engine) Check(r *Request) error {
	if r.MaxNew < 1 {
		return fmt.Errorf("--max-new-tokens %d: want at least 1", r.MaxNew)
	}
	for i, p := range r.Prompts {
		switch {
		case len(p) == 0:
			return fmt.Errorf("%w: prompt %d is empty: there is no token to continue from", ErrBadPrompt, i+1)
		case len(p) > e.Prompt:
			return fmt.Errorf("%w: prompt %d has %d tokens; the prefill program takes %d", ErrBadPrompt, i+1, len(p), e.Prompt)
		case Positions(len(p), r.MaxNew) > e.Context:
			return fmt.Errorf("%w: prompt %d has %d tokens and %d are to be generated: %d positions (the last new token is not fed back), past the context of %d", ErrBadPrompt, i+1, len(p), r.MaxNew, Positions(len(p), r.MaxNew), e.Context)
		}
		for j, id := range p {
			if id < 0 || int(id) >= e.Vocab {
				return fmt.Errorf("%w: prompt %d's token %d is id %d, outside the model's vocabulary of %d", ErrBadPrompt, i+1, j+1, id, e.Vocab)
			}
		}
	}
	return nil
}

// Run generates for every prompt, e.Batch prompts at a time, and returns
// each prompt's new tokens (ending at EOS, which is included, or where
// StopWhen said, or after MaxNew).
func (e *Engine) Run(r Request) ([][]int32, error) {
	if err := e.Check(&r); err != nil {
		return nil, err
	}
	out := make([][]int32, 0, len(r.Prompts))
	for lo := 0; lo < len(r.Prompts); lo += e.Batch {
		hi := min(lo+e.Batch, len(r.Prompts))
		got, err := e.batch(r, lo, r.Prompts[lo:hi])
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// batch runs up to e.Batch prompts together. Prompts are right-padded to
// the prefill's length: a padding token at position p writes the caches
// at p, and the sequence's own token at p overwrites it before any query
// can see it (a query sees only the positions up to its own), so padding
// never leaks into a sequence. Rows past the prompts (a short last batch)
// run a one-token prompt whose results are dropped.
func (e *Engine) batch(r Request, first int, prompts [][]int32) ([][]int32, error) {
	B, P := e.Batch, e.Prompt
	tokens := make([]int32, B*P)
	positions := make([]int32, B*P)
	lens := make([]int, B)
	for b := range B {
		lens[b] = 1
		if b < len(prompts) {
			lens[b] = len(prompts[b])
			copy(tokens[b*P:], prompts[b])
		}
		for i := range P {
			positions[b*P+i] = int32(i)
		}
	}
	// Each prompt's row of the prefill's logits: its last token's among
	// every token's, or the one row the last-token head gives it.
	n, row := B*P, func(b int) int { return b*P + lens[b] - 1 }
	if e.LastToken {
		mask := make([]int32, B*P)
		for b := range B {
			mask[row(b)] = 1
		}
		if err := e.Prefill.SetInt32(ir.InputLastToken, mask); err != nil {
			return nil, fmt.Errorf("prefill: %w", err)
		}
		n, row = B, func(b int) int { return b }
	}
	logits, err := e.run(e.Prefill, tokens, positions, n)
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	rows := make([][]float64, B)
	for b := range B {
		rows[b] = logits[row(b)*e.Vocab:][:e.Vocab]
	}
	if err := e.MoveCaches(); err != nil {
		return nil, fmt.Errorf("moving the key/value caches to the decode program: %w", err)
	}
	out := make([][]int32, len(prompts))
	done := make([]bool, B)
	for b := len(prompts); b < B; b++ {
		done[b] = true
	}
	last := make([]int32, B)
	pos := make([]int32, B)
	for step := 0; step < r.MaxNew; step++ {
		for b := range prompts {
			if done[b] {
				continue
			}
			if r.OnLogits != nil {
				r.OnLogits(r.FirstSeq+first+b, step, rows[b])
			}
			logits := rows[b]
			if p := r.Sampling.RepetitionPenalty; p != 0 && p != 1 {
				logits = r.Sampling.Penalize(logits, slices.Concat(prompts[b], out[b]))
			}
			id := int32(r.Sampling.Pick(logits, r.FirstSeq+first+b, step))
			out[b] = append(out[b], id)
			last[b] = id
			if r.OnToken != nil {
				r.OnToken(r.FirstSeq+first+b, id)
			}
			if id == r.EOS || r.StopWhen != nil && r.StopWhen(r.FirstSeq+first+b, out[b]) {
				done[b] = true
			}
		}
		if step == r.MaxNew-1 || !slices.Contains(done, false) {
			break
		}
		for b := range B {
			// A finished sequence keeps feeding its last token at its
			// next position (the batch's shape is fixed); nothing reads
			// what it makes, and it never runs past the context (Check).
			pos[b] = int32(lens[b] + step)
		}
		logits, err := e.run(e.Decode, last, pos, B)
		if err != nil {
			return nil, fmt.Errorf("decode step %d: %w", step+1, err)
		}
		for b := range B {
			rows[b] = logits[b*e.Vocab:][:e.Vocab]
		}
	}
	return out, nil
}

// run feeds one step its tokens and positions and returns its logits,
// rows of them.
func (e *Engine) run(s Stepper, tokens, positions []int32, rows int) ([]float64, error) {
	if err := s.SetInt32("tokens", tokens); err != nil {
		return nil, err
	}
	if err := s.SetInt32(ir.PositionsInput, positions); err != nil {
		return nil, err
	}
	if e.RandomKeys {
		keys := make([]int32, len(tokens))
		for i := range keys {
			keys[i] = -1
		}
		if err := s.SetInt32(ir.InputRandomKey, keys); err != nil {
			return nil, err
		}
	}
	if err := s.Step(); err != nil {
		return nil, err
	}
	logits, err := s.Logits()
	if err != nil {
		return nil, err
	}
	if want := rows * e.Vocab; len(logits) != want {
		return nil, fmt.Errorf("logits: %d values, want %d tokens × %d", len(logits), rows, e.Vocab)
	}
	return logits, nil
}
