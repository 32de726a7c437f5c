package generate

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeStep is a Stepper whose logits make the next token (last token +
// its position) mod vocab, and which records what it was fed. With
// lastToken it outputs only the rows its last_token mask marks.
type fakeStep struct {
	vocab                  int
	lastToken              bool
	tokens, position, mask []int32
	fed                    [][2][]int32
}

func (f *fakeStep) SetInt32(name string, x []int32) error {
	switch name {
	case "tokens":
		f.tokens = slices.Clone(x)
	case "positions":
		f.position = slices.Clone(x)
	case "last_token":
		f.mask = slices.Clone(x)
	}
	return nil
}

func (f *fakeStep) Step() error {
	f.fed = append(f.fed, [2][]int32{f.tokens, f.position})
	return nil
}

func (f *fakeStep) Logits() ([]float64, error) {
	var out []float64
	for r, t := range f.tokens {
		if f.lastToken && f.mask[r] == 0 {
			continue
		}
		row := make([]float64, f.vocab)
		row[int(t+f.position[r])%f.vocab] = 1
		out = append(out, row...)
	}
	return out, nil
}

// The engine prefills right-padded prompts, reads each prompt's logits
// at its last token (from a prefill of every row, or of the last tokens
// alone, which it marks), decodes each sequence at its own position,
// stops a sequence at EOS or where StopWhen says, and runs prompts a
// batch at a time.
func TestEngineRunsRaggedPromptsInBatches(t *testing.T) {
	const vocab = 50
	for _, lastToken := range []bool{false, true} {
		pre, dec := &fakeStep{vocab: vocab, lastToken: lastToken}, &fakeStep{vocab: vocab}
		moves := 0
		e := &Engine{Prefill: pre, Decode: dec, MoveCaches: func() error { moves++; return nil }, Batch: 2, Prompt: 4, Context: 10, Vocab: vocab, LastToken: lastToken}
		var streamed []int32
		got, err := e.Run(Request{
			Prompts:  [][]int32{{1, 2, 3}, {7}, {10, 11, 12, 13}},
			MaxNew:   5,
			EOS:      17,
			StopWhen: func(seq int, ids []int32) bool { return seq == 2 && len(ids) == 2 },
			OnToken:  func(seq int, id int32) { streamed = append(streamed, int32(seq*100)+id) },
		})
		require.NoError(t, err)
		// Prompt 0: last token 3 at position 2 → 5; then 5 at 3 → 8, 8 at 4 → 12, 12 at 5 → 17 (EOS).
		// Prompt 1: 7 at 0 → 7, 7 at 1 → 8, 8 at 2 → 10, 10 at 3 → 13, 13 at 4 → 17 (EOS, also the fifth token).
		// Prompt 2: 13 at 3 → 16, 16 at 4 → 20, stopped by StopWhen.
		assert.Equal(t, [][]int32{{5, 8, 12, 17}, {7, 8, 10, 13, 17}, {16, 20}}, got)
		assert.Equal(t, 2, moves, "one cache move per batch")
		assert.Len(t, pre.fed, 2)
		assert.Equal(t, []int32{1, 2, 3, 0, 7, 0, 0, 0}, pre.fed[0][0], "prompts right-padded with 0")
		assert.Equal(t, []int32{0, 1, 2, 3, 0, 1, 2, 3}, pre.fed[0][1])
		assert.Equal(t, []int32{10, 11, 12, 13, 0, 0, 0, 0}, pre.fed[1][0], "a short last batch runs a dummy row")
		if lastToken {
			assert.Equal(t, []int32{0, 0, 0, 1, 1, 0, 0, 0}, pre.mask, "the last batch's last tokens, the dummy row's its first")
		} else {
			assert.Nil(t, pre.mask, "no mask for a prefill of every row")
		}
		assert.Equal(t, [2][]int32{{5, 7}, {3, 1}}, dec.fed[0], "each sequence at its own position")
		assert.Equal(t, []int32{5, 107, 8, 108, 12, 110, 17, 113, 117, 216, 220}, streamed, "tokens stream as they are made, with their prompt")
	}
}

// Prompts the programs cannot run are refused, naming the prompt.
func TestEngineChecksPrompts(t *testing.T) {
	e := &Engine{Batch: 1, Prompt: 4, Context: 6, Vocab: 50}
	for _, tc := range []struct {
		prompts [][]int32
		maxNew  int
		want    string
	}{
		{[][]int32{{}}, 1, "prompt 1 is empty"},
		{[][]int32{{1}, {1, 2, 3, 4, 5}}, 1, "prompt 2 has 5 tokens; the prefill program takes 4"},
		{[][]int32{{1, 2, 3, 4}}, 4, "prompt 1 has 4 tokens and 4 are to be generated: 7 positions (the last new token is not fed back), past the context of 6"},
		{[][]int32{{1, 50}}, 1, "prompt 1's token 2 is id 50, outside the model's vocabulary of 50"},
		{[][]int32{{1}}, 0, "--max-new-tokens 0"},
	} {
		err := e.Check(&Request{Prompts: tc.prompts, MaxNew: tc.maxNew})
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
	// The last new token is sampled, never fed back: a prompt of 4 and 3
	// new tokens fill the 6 positions.
	assert.NoError(t, e.Check(&Request{Prompts: [][]int32{{1, 2, 3, 4}}, MaxNew: 3}))
}

// constStep is a Stepper whose every row of logits is row.
type constStep struct {
	row    []float64
	tokens []int32
}

func (c *constStep) SetInt32(name string, x []int32) error {
	if name == "tokens" {
		c.tokens = slices.Clone(x)
	}
	return nil
}
func (c *constStep) Step() error { return nil }
func (c *constStep) Logits() ([]float64, error) {
	var out []float64
	for range c.tokens {
		out = append(out, c.row...)
	}
	return out, nil
}

// The repetition penalty counts the prompt's tokens and those generated
// so far, and the logits handed to OnLogits are the model's own.
func TestEnginePenalizesRepeats(t *testing.T) {
	row := []float64{-1, 0.3, 0.9, 1, 0.6}
	run := func(penalty float64) ([]int32, [][]float64) {
		s := &constStep{row: row}
		e := &Engine{Prefill: s, Decode: s, MoveCaches: func() error { return nil }, Batch: 1, Prompt: 2, Context: 8, Vocab: len(row)}
		var seen [][]float64
		got, err := e.Run(Request{Prompts: [][]int32{{3}}, MaxNew: 4, EOS: -1, Sampling: Sampling{TopP: 1, RepetitionPenalty: penalty},
			OnLogits: func(_, _ int, l []float64) { seen = append(seen, slices.Clone(l)) }})
		require.NoError(t, err)
		return got[0], seen
	}
	got, _ := run(1)
	assert.Equal(t, []int32{3, 3, 3, 3}, got, "greedy, no penalty")
	got, seen := run(2)
	// 3, the prompt's, falls to 0.5: 2 (0.9) wins, then 4 (0.6), then 3
	// (0.5, against 2's and 4's 0.45 and 0.3) twice: a token is penalised
	// once however often it repeats, as Hugging Face's is.
	assert.Equal(t, []int32{2, 4, 3, 3}, got)
	for _, l := range seen {
		assert.Equal(t, row, l, "OnLogits sees the model's logits")
	}
}
