package data

import (
	"strings"
	"testing"
)

// The corpus as a Source gives TrainBatch's and EvalBatch's batches, and
// says why a batch cannot be drawn instead of returning nothing.
func TestCorpusIsASource(t *testing.T) {
	var src Source = &Corpus{Source: "t", Train: []byte(strings.Repeat("abcdefgh", 8)), Eval: []byte(strings.Repeat("xyz", 8))}
	c := src.(*Corpus)
	in, out, err := src.TrainRows(3, 2, 4, 5, func(r int) bool { return r == 0 })
	mustNoErr(t, err)
	wantIn, wantOut := c.TrainBatch(3, 2, 4, 5)
	expectEqual(t, wantIn, in, "training inputs")
	expectEqual(t, wantOut, out, "training targets")
	in, out, err = src.EvalRows(1, 2, 5, nil)
	mustNoErr(t, err)
	wantIn, wantOut = c.EvalBatch(1, 2, 5)
	expectEqual(t, wantIn, in, "held-out inputs")
	expectEqual(t, wantOut, out, "held-out targets")
	expectEqual(t, "t", src.String(), "name")

	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"window longer than the text", second(src.TrainRows(1, 1, 2, 100, nil)), "corpus too small"},
		{"no rows", second(src.TrainRows(1, 1, 0, 5, nil)), "a batch of 0 rows of 5 tokens cannot be drawn"},
		{"negative eval index", second(src.EvalRows(-1, 2, 5, nil)), "the index must not be negative"},
		{"held-out split too short", second(src.EvalRows(0, 2, 30, nil)), "corpus too small"},
	} {
		expect(t, tc.err != nil && strings.Contains(tc.err.Error(), tc.want), "%s: got %v, want an error containing %q", tc.name, tc.err, tc.want)
	}
}

func second(_, _ []int32, err error) error { return err }
