package sample

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data"
)

// splitGPTs is the training and held-out samples of one fake dataset.
func splitGPTs(t *testing.T, f *fakeTokens, seq int, dir string) (train, eval *GPT) {
	t.Helper()
	w, err := ParseSplit("9,1")
	require.NoError(t, err)
	r := SplitRanges(f.NumSequences(), w)
	train, err = NewGPT(f, Config{Seq: seq, Range: r[0], CacheDir: dir, Identity: "ds", Shuffle: true})
	require.NoError(t, err)
	eval, err = NewGPT(f, Config{Seq: seq, Range: r[1], CacheDir: dir, Identity: "ds"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = train.Close(); _ = eval.Close() })
	return train, eval
}

func TestDatasetRows(t *testing.T) {
	const seq, batch = 8, 4
	f := newFake(lengths(100, 1, 30, 7))
	train, eval := splitGPTs(t, f, seq, t.TempDir())
	var src data.Source = New(train, eval, "fake data")
	require.NoError(t, src.Check(seq))
	assert.Equal(t, "fake data", src.String())

	for _, step := range []int{1, 2, 50} {
		in, out, err := src.TrainRows(3, step, batch, seq, nil)
		require.NoError(t, err)
		for r := range batch {
			want := make([]int32, seq+1)
			require.NoError(t, train.Sample(3, int64((step-1)*batch+r), want))
			assert.Equal(t, want[:seq], in[r*seq:(r+1)*seq], "step %d row %d inputs", step, r)
			assert.Equal(t, want[1:], out[r*seq:(r+1)*seq], "step %d row %d targets", step, r)
		}
	}

	n := eval.SamplesPerEpoch()
	for _, index := range []int{0, 1, int(n)} {
		a, _, err := src.EvalRows(index, batch, seq, nil)
		require.NoError(t, err)
		b, _, err := New(train, eval, "").EvalRows(index, batch, seq, nil)
		require.NoError(t, err)
		assert.Equal(t, a, b)
		for r := range batch {
			want := make([]int32, seq+1)
			require.NoError(t, eval.Sample(99, (int64(index*batch+r))%n, want))
			assert.Equal(t, want[:seq], a[r*seq:(r+1)*seq], "eval batch %d row %d", index, r)
		}
	}
}

// TestDatasetReadsOnlyWantedRows is a process holding rows 0..3 of a batch
// of 8: it reads exactly the tokens of those four samples and leaves the
// other rows zero.
func TestDatasetReadsOnlyWantedRows(t *testing.T) {
	const seq, batch = 8, 8
	lens := lengths(100, 1, 30, 8)
	dir := t.TempDir()
	mine := func(r int) bool { return r < 4 }

	f := newFake(lens)
	train, eval := splitGPTs(t, f, seq, dir)
	f.record = true
	in, out, err := New(train, eval, "").TrainRows(5, 3, batch, seq, mine)
	require.NoError(t, err)
	got := slices.Clone(f.log)

	ref := newFake(lens)
	rtrain, _ := splitGPTs(t, ref, seq, dir)
	ref.record = true
	for r := range 4 {
		require.NoError(t, rtrain.Sample(5, int64(2*batch+r), make([]int32, seq+1)))
	}
	assert.Equal(t, ref.log, got, "the same reads as drawing samples 16..19 alone")
	assert.Equal(t, make([]int32, 4*seq), in[4*seq:], "rows not held stay zero")
	assert.Equal(t, make([]int32, 4*seq), out[4*seq:])
	assert.NotEqual(t, make([]int32, seq), in[:seq])

	f.log = nil
	_, _, err = New(train, eval, "").EvalRows(0, batch, seq, func(int) bool { return false })
	require.NoError(t, err)
	assert.Empty(t, f.log, "no rows wanted, nothing read")
}

func TestDatasetErrors(t *testing.T) {
	f := newFake(lengths(100, 1, 30, 9))
	train, eval := splitGPTs(t, f, 8, t.TempDir())
	d := New(train, eval, "x")

	assert.ErrorIs(t, d.Check(7), ErrSeq)
	_, _, err := d.TrainRows(1, 1, 2, 7, nil)
	assert.ErrorIs(t, err, ErrSeq)
	_, _, err = d.EvalRows(0, 2, 9, nil)
	assert.ErrorIs(t, err, ErrSeq)
	_, _, err = d.TrainRows(1, 0, 2, 8, nil)
	assert.ErrorIs(t, err, ErrBatch)
	_, _, err = d.TrainRows(1, 1, 0, 8, nil)
	assert.ErrorIs(t, err, ErrBatch)
	_, _, err = d.TrainRows(1, int(^uint(0)>>1), 2, 8, nil)
	assert.ErrorIs(t, err, ErrBatch)
	_, _, err = d.EvalRows(-1, 2, 8, nil)
	assert.ErrorIs(t, err, ErrBatch)

	// Ids past the data's description (the fake's ids are doc<<16 | off).
	_, _, err = New(train, eval, "x").LimitIDs(1<<30, "a loose bound").TrainRows(1, 1, 4, 8, nil)
	require.NoError(t, err)
	_, _, err = New(train, eval, "x").LimitIDs(1<<16, "the recorded largest id").TrainRows(1, 1, 4, 8, nil)
	assert.ErrorIs(t, err, ErrTokenID)
	assert.Contains(t, err.Error(), "is past the recorded largest id")
	assert.Contains(t, err.Error(), "training sample")

	noEval := New(train, nil, "x")
	require.NoError(t, noEval.Check(8), "training without a held-out split is allowed")
	_, _, err = noEval.EvalRows(0, 2, 8, nil)
	assert.ErrorIs(t, err, ErrNoHeldOut)
	assert.Contains(t, err.Error(), "--split")

	var typedNil *GPT
	assert.ErrorIs(t, New(typedNil, nil, "").Check(8), ErrDataset)
	assert.ErrorIs(t, New(nil, nil, "").Check(8), ErrDataset)
	_, _, err = New(nil, nil, "").TrainRows(1, 1, 1, 8, nil)
	assert.ErrorIs(t, err, ErrDataset)
	var nilD *Dataset
	assert.Error(t, nilD.Check(8))
	assert.Equal(t, "no token data", nilD.String())

	// A blend as the training samples.
	b, err := NewBlend([]float64{1, 3}, []Sampler{train, eval})
	require.NoError(t, err)
	bd := New(b, eval, "")
	require.NoError(t, bd.Check(8))
	_, _, err = bd.TrainRows(1, 1, 4, 8, nil)
	require.NoError(t, err)
	assert.Contains(t, bd.String(), "training samples per epoch")
}
