package prepare

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data/indexed"
)

// prepared makes a dataset at dir/name from texts, one document each.
func prepared(t *testing.T, dir, name string, enc byteEncoder, tokenizer string, texts ...string) string {
	t.Helper()
	files := map[string]string{}
	var inputs []string
	for i, s := range texts {
		rel := filepath.Join(name+"-in", string(rune('a'+i))+".txt")
		files[rel] = s
		inputs = append(inputs, filepath.Join(dir, rel))
	}
	writeTree(t, dir, files)
	prefix := filepath.Join(dir, name)
	_, err := Run(context.Background(), enc, Options{Inputs: inputs, OutputPrefix: prefix, AppendEOS: true, Tokenizer: tokenizer})
	require.NoError(t, err)
	return prefix
}

// Merging datasets writes their documents in the order given, one after
// another, and a record with the counts summed when the inputs were
// prepared alike.
func TestMergeConcatenatesInOrder(t *testing.T) {
	dir := t.TempDir()
	enc := byteEncoder{}
	a := prepared(t, dir, "a", enc, "tok", "first", "second")
	b := prepared(t, dir, "b", enc, "tok", "third")
	c := prepared(t, dir, "c", enc, "tok", "fourth", "fifth", "sixth")
	out := filepath.Join(dir, "merged")
	sum, err := Merge(context.Background(), out, []string{c, a, b})
	require.NoError(t, err)
	want := slices.Concat(enc.want("fourth", "fifth", "sixth"), enc.want("first", "second"), enc.want("third"))
	assert.Equal(t, want, readDataset(t, out))
	var tokens int64
	for _, d := range want {
		tokens += int64(len(d))
	}
	assert.Equal(t, int64(6), sum.Documents)
	assert.Equal(t, tokens, sum.Tokens)
	assert.Equal(t, int32(256), sum.MaxToken, "the end-of-document id")
	assert.True(t, sum.Record)
	m, ok, err := ReadMeta(out)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(6), m.Documents)
	assert.Equal(t, tokens, m.Tokens)
	assert.Equal(t, "tok", m.Tokenizer)
	assert.Equal(t, sum.DType, m.DType)
	assert.ElementsMatch(t, []string{"merged.bin", "merged.idx", "merged.json"}, outputs(t, dir, "merged"), "no lock or temporary file left")
}

// Inputs of different stored types merge as int32; an input without a
// record gives a merged dataset without one, replacing an older record.
func TestMergeWidensAndDropsARecordItCannotKnow(t *testing.T) {
	dir := t.TempDir()
	small := prepared(t, dir, "small", byteEncoder{}, "tok", "abc")
	d, err := indexed.Open(small)
	require.NoError(t, err)
	assert.Equal(t, indexed.Uint16, d.DType())
	require.NoError(t, d.Close())
	wide := filepath.Join(dir, "wide")
	w, err := indexed.Create(wide, indexed.Int32)
	require.NoError(t, err)
	require.NoError(t, w.Add([]int32{70000, 1, 2}))
	require.NoError(t, w.Commit())

	out := filepath.Join(dir, "out")
	prepared(t, dir, "out", byteEncoder{}, "old", "an older dataset")
	sum, err := Merge(context.Background(), out, []string{small, wide})
	require.NoError(t, err)
	assert.Equal(t, indexed.Int32, sum.DType)
	assert.Equal(t, int32(70000), sum.MaxToken)
	assert.Equal(t, slices.Concat(byteEncoder{}.want("abc"), [][]int32{{70000, 1, 2}}), readDataset(t, out))
	assert.False(t, sum.Record)
	assert.Contains(t, sum.NoRecord, wide+" has none")
	_, ok, err := ReadMeta(out)
	require.NoError(t, err)
	assert.False(t, ok, "the older dataset's record is gone")
}

// What cannot be merged is refused, naming the cause, before anything is
// written.
func TestMergeRefuses(t *testing.T) {
	dir := t.TempDir()
	a := prepared(t, dir, "a", byteEncoder{}, "tok", "one")
	other := prepared(t, dir, "other", byteEncoder{}, "another", "two")
	multi := filepath.Join(dir, "multi")
	writeMultiSequence(t, multi)
	bare := filepath.Join(dir, "bare") // Megatron-LM's own: no record
	w, err := indexed.Create(bare, indexed.Uint16)
	require.NoError(t, err)
	require.NoError(t, w.Add([]int32{1, 2}))
	require.NoError(t, w.Commit())
	// A record whose vocabulary the files' ids overflow ('t' is 116).
	lying := prepared(t, dir, "lying", byteEncoder{}, "tok", "two")
	raw, err := os.ReadFile(lying + ".json")
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(raw, &rec))
	rec["vocab_size"], rec["max_token"] = 100, 99
	raw, err = json.Marshal(rec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(lying+".json", raw, 0o644))
	for _, c := range []struct {
		name   string
		inputs []string
		out    string
		want   string
	}{
		{"nothing", nil, "m", "name at least one dataset to merge"},
		{"twice", []string{a, a}, "m", a + " is given twice"},
		{"into an input", []string{a}, "a", "the output " + a + " is the input " + a},
		{"other tokenizer", []string{a, other}, "m", other + " and " + a + " were prepared differently ([tokenizer another against tok])"},
		{"other tokenizer past a shard without a record", []string{a, bare, other}, "m", other + " and " + a + " were prepared differently ([tokenizer another against tok])"},
		{"sentences", []string{a, multi}, "m", multi + " has 2 documents in 3 sequences"},
		{"missing", []string{a, filepath.Join(dir, "nope")}, "m", "nope"},
		{"a record the ids overflow", []string{lying}, "m", lying + ", document 0, holds token id 116, outside the vocabulary of 100 its record " + lying + ".json gives"},
	} {
		out := filepath.Join(dir, c.out)
		before := outputs(t, dir, "")
		_, err := Merge(context.Background(), out, c.inputs)
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		if c.name != "missing" {
			assert.ErrorIs(t, err, ErrMerge, c.name)
		}
		assert.Equal(t, before, outputs(t, dir, ""), "%s: nothing written", c.name)
	}
	// A cancelled merge leaves nothing either.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Merge(ctx, filepath.Join(dir, "m"), []string{a})
	assert.ErrorIs(t, err, context.Canceled)
	_, statErr := os.Stat(filepath.Join(dir, "m.bin"))
	assert.ErrorIs(t, statErr, os.ErrNotExist)
}

// writeMultiSequence writes, in Megatron-LM's format, a dataset whose first
// document holds two sequences (sentences) and whose second holds one.
func writeMultiSequence(t *testing.T, prefix string) {
	t.Helper()
	w, err := indexed.Create(prefix, indexed.Uint16)
	require.NoError(t, err)
	for _, s := range [][]int32{{1, 2}, {3}, {4, 5}} {
		require.NoError(t, w.Add(s))
	}
	require.NoError(t, w.Commit())
	// Rewrite the document index: [0, 2, 3] (documents of 2 and 1
	// sequences) where the writer put [0, 1, 2, 3].
	raw, err := os.ReadFile(prefix + ".idx")
	require.NoError(t, err)
	// The header is 34 bytes: magic 9, version 8, dtype 1, sequences 8,
	// documents 8; then lengths (4 each) and pointers (8 each), then the
	// document index (8 each).
	docs := raw[34+3*4+3*8:]
	require.Len(t, docs, 4*8)
	put := func(b []byte, v uint64) {
		for i := range 8 {
			b[i] = byte(v >> (8 * i))
		}
	}
	put(raw[26:34], 3)
	put(docs[8:16], 2)
	put(docs[16:24], 3)
	require.NoError(t, os.WriteFile(prefix+".idx", raw[:len(raw)-8], 0o644))
}
