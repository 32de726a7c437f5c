package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/data/indexed"
	"gcompile/data/sample"
	"gcompile/data/tokenizer"
	"gcompile/internal/fifotest"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
)

// tokenDataset writes a token dataset of docs documents of 1..2·mean ids
// below vocab (seeded, so the same call writes the same files) and returns
// its prefix.
func tokenDataset(t testing.TB, dir string, docs, mean, vocab int, seed uint64) string {
	t.Helper()
	prefix := filepath.Join(dir, fmt.Sprintf("tokens-%d-%d-%d-%d", docs, mean, vocab, seed))
	w, err := indexed.Create(prefix, indexed.DTypeFor(vocab))
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 7))
	for range docs {
		doc := make([]int32, 1+rng.IntN(2*mean))
		for i := range doc {
			doc[i] = int32(rng.IntN(vocab))
		}
		doc[len(doc)-1] = int32(vocab - 1) // the largest id, at the end of every document as an EOS is
		require.NoError(t, w.Add(doc))
	}
	require.NoError(t, w.Commit())
	return prefix
}

// tokenGPT is the checkpoint tests' model on a token dataset of ids below
// 256 (the .gir's vocabulary), small enough that 20 steps of batch 4 × 17
// tokens cross several epochs of its training split.
func tokenGPT(t testing.TB, prefix string, extra ...string) []string {
	args := append(slices.Clone(ckptGPT), "--data", prefix, "--data-cache-dir", filepath.Join(filepath.Dir(prefix), "cache"))
	return gir(t, append(args, extra...))
}

// A run on a token dataset stopped at step 10 and resumed is the run that
// never stopped, bit for bit, across epoch boundaries; resuming on other
// data is refused, naming both.
func TestTokenDatasetResumeIsBitIdentical(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 40, 12, 250, 1) // about 500 tokens: an epoch is about 30 samples
	run := func(extra ...string) (string, error) {
		path := filepath.Join(t.TempDir(), "m.json")
		err := mainErr(tokenGPT(t, prefix, append([]string{"--steps", "20", "--split", "80,20", "--metrics", path}, extra...)...))
		return path, err
	}
	wholeMetrics, err := run("--checkpoint-dir", filepath.Join(dir, "whole"))
	require.NoError(t, err)
	whole := readMetrics(t, wholeMetrics)
	require.NotNil(t, whole.Data)
	assert.Positive(t, whole.Data.Tokens)
	assert.Equal(t, "80,20", whole.Data.Split)
	assert.Contains(t, whole.Data.Source, prefix)
	_, err = run("--checkpoint-dir", filepath.Join(dir, "cut"), "--stop-after", "10")
	require.NoError(t, err)
	restMetrics, err := run("--checkpoint-dir", filepath.Join(dir, "cut"), "--resume", filepath.Join(dir, "cut"))
	require.NoError(t, err)
	rest := readMetrics(t, restMetrics)
	require.Len(t, rest.Steps, 10)
	assert.Equal(t, losses(whole)[10:], losses(rest), "losses of steps 11–20")
	assert.Equal(t, whole.Eval[len(whole.Eval)-1], rest.Eval[len(rest.Eval)-1], "held-out loss at the end")
	assert.Equal(t, stateSums(t, checkpoint.StepDir(filepath.Join(dir, "whole"), 20)), stateSums(t, checkpoint.StepDir(filepath.Join(dir, "cut"), 20)))

	// Under another plan (dp2 over two devices: each reads half the rows)
	// the resumed steps see the same tokens: the losses agree to float
	// rounding (the mean is summed in another order), where other batches
	// would differ in the second decimal.
	otherMetrics, err := run("--checkpoint-dir", filepath.Join(dir, "other"), "--resume", checkpoint.StepDir(filepath.Join(dir, "cut"), 10), "--devices", "2", "--dp", "2")
	require.NoError(t, err)
	other := losses(readMetrics(t, otherMetrics))
	require.Len(t, other, 10)
	for k, want := range losses(whole)[10:] {
		assert.InEpsilon(t, want, other[k], 1e-6, "step %d resumed under dp2", 11+k)
	}

	// The data is known by its contents, not its name: a renamed copy
	// resumes, and so does a checkpoint whose record of the data still
	// names the dataset (as identities did before they left names out).
	renamed := filepath.Join(t.TempDir(), "moved")
	for _, ext := range []string{".bin", ".idx"} {
		raw, err := os.ReadFile(prefix + ext)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(renamed+ext, raw, 0o644))
	}
	_, err = run("--checkpoint-dir", filepath.Join(dir, "renamed"), "--resume", checkpoint.StepDir(filepath.Join(dir, "cut"), 10), "--data", renamed)
	require.NoError(t, err, "the dataset renamed")
	named := filepath.Join(dir, "named")
	require.NoError(t, os.CopyFS(named, os.DirFS(checkpoint.StepDir(filepath.Join(dir, "cut"), 10))))
	manifest := filepath.Join(named, checkpoint.ManifestName)
	raw, err := os.ReadFile(manifest)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	plan := m["plan"].(map[string]any)
	identity := plan["data"].(string)
	weight, fp, ok := strings.Cut(identity, " ")
	require.True(t, ok, "the identity %q", identity)
	require.True(t, strings.HasSuffix(fp, ";split 0.8,0.2,0"), "the split as its fractions: %q", identity)
	fp = strings.TrimSuffix(fp, "0.8,0.2,0") + "80,20" // as typed, as identities had it before
	for _, legacy := range []string{weight + " " + filepath.Base(prefix) + " " + fp, weight + " " + fp} {
		plan["data"] = legacy
		delete(m, "checksum") // as a checkpoint saved before manifests had one
		raw, err = json.Marshal(m)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(manifest, raw, 0o644))
		_, err = run("--checkpoint-dir", filepath.Join(t.TempDir(), "named-resumed"), "--resume", named)
		require.NoError(t, err, "a checkpoint whose identity is %q", legacy)
	}

	// The split is its fractions, however typed.
	for _, split := range []string{"80/20", "4,1", " 80, 20,0"} {
		_, err = run("--checkpoint-dir", filepath.Join(t.TempDir(), "same-split"), "--resume", checkpoint.StepDir(filepath.Join(dir, "cut"), 10), "--split", split)
		require.NoError(t, err, "--split %q", split)
	}
	_, err = run("--checkpoint-dir", filepath.Join(dir, "cut2"), "--resume", filepath.Join(dir, "cut"), "--split", "70,30")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the checkpoint was trained on other data")
	assert.Contains(t, err.Error(), "split 0.8,0.2,0")
	assert.Contains(t, err.Error(), "split 0.7,0.3,0")
	assert.Contains(t, err.Error(), ": they differ in the split (0.8,0.2,0, this run's 0.7,0.3,0): ", "the part that differs is named")
}

// A job of two processes (dp2·tp2) on a token dataset trains bit for bit as
// one process does.
func TestTokenDatasetJobMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	t.Setenv(asMainEnv, "1")
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 200, 30, 256, 2)
	plan := []string{"--devices", "4", "--dp", "2", "--tp", "2", "--data", prefix, "--data-cache-dir", filepath.Join(dir, "cache")}
	require.NoError(t, mainErr(append([]string{"launch", "--nproc", "2", "--"}, jobArgs(t, dir, plan...)...)))
	got := assertMatchesOneProcess(t, plan, 2, dir)
	require.NotNil(t, got.Data)
	assert.Contains(t, got.Data.Source, prefix)
}

// A model.go takes its vocabulary from the data, padded as Megatron-LM
// pads it; a --set vocab too small for the data is refused before the
// build.
func TestVocabFollowsTheData(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 30, 20, 300, 3)
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "2", "--eval-batches", "1",
		"--data", prefix, "--devices", "2", "--tp", "2", "--make-vocab-size-divisible-by", "64"}
	m := runMetrics(t, args...)
	assert.Equal(t, "layers=1,hidden=32,heads=2,seq=16,vocab=384", m.Config["set"], "300 ids padded to a multiple of 64·tp2")
	require.Len(t, m.Steps, 2)

	bad := slices.Clone(args)
	bad[2] = "layers=1,hidden=32,heads=2,seq=16,vocab=256"
	err := mainErr(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--set vocab=256 is smaller than the data's largest token id (299) + 1")

	// The planner builds the model before it picks tp: its pin flags
	// carry the vocabulary it padded, which a run with their --tp would
	// pad otherwise.
	c := &config{vocabPadded: true, tokens: &tokenData{need: 300}, vocabDivisible: 64, Config: compile.Config{Set: "layers=1,vocab=320,seq=16"}}
	assert.Equal(t, " --set vocab=320", c.pinVocab(4), "tp 4 would pad 300 ids to 512")
	assert.Empty(t, c.pinVocab(1), "tp 1 pads them to 320 itself")
	c.vocabPadded = false
	assert.Empty(t, c.pinVocab(4), "a vocab the user set is on the command line already")

	// End to end: the planner's pick on the data, and its pin flags,
	// train the same model (the same parameters and losses).
	// (Batch 2 on 8 devices: dp takes at most 2, so tp is 2 or 4.)
	planned := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16", "--batch", "2", "--run", "--steps", "2", "--eval-batches", "1",
		"--data", prefix, "--devices", "8", "--make-vocab-size-divisible-by", "64"}
	path := filepath.Join(dir, "planned.json")
	log, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(planned), "--metrics", path)) })
	require.NoError(t, err)
	pin := regexp.MustCompile(`pin it with (.*) \(--plan lists the alternatives\)`).FindStringSubmatch(log)
	require.Len(t, pin, 2, log)
	byPlanner := readMetrics(t, path)
	pinned := runMetrics(t, append(slices.Clone(planned), strings.Fields(pin[1])...)...)
	assert.Contains(t, pin[1], "--set vocab=320", "the tp chosen would pad the 300 ids to 384 or 512")
	assert.Equal(t, byPlanner.Model.Params, pinned.Model.Params, "pinned with %s", pin[1])
	require.Len(t, pinned.Steps, 2)
	assert.Equal(t, byPlanner.Steps[1].Loss, pinned.Steps[1].Loss)
}

// Bad token data is a named error before any work: nothing is written.
func TestBadTokenDataIsNamed(t *testing.T) {
	dir := t.TempDir()
	good := tokenDataset(t, dir, 30, 20, 200, 4)
	wide := tokenDataset(t, dir, 30, 20, 300, 5) // ids up to 299: past the .gir's 256
	truncated := filepath.Join(dir, "truncated")
	for _, ext := range []string{".bin", ".idx"} {
		raw, err := os.ReadFile(good + ext)
		require.NoError(t, err)
		if ext == ".bin" {
			raw = raw[:len(raw)-10]
		}
		require.NoError(t, os.WriteFile(truncated+ext, raw, 0o644))
	}
	noIndex := filepath.Join(dir, "noindex")
	raw, err := os.ReadFile(good + ".bin")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(noIndex+".bin", raw, 0o644))
	// A record of the data that says its largest id is 150, where the
	// .bin (of the recorded size) holds ids up to 199: the .bin changed
	// after the record was written.
	stale := filepath.Join(dir, "stale")
	var binBytes, idxBytes int64
	for _, ext := range []string{".bin", ".idx"} {
		raw, err := os.ReadFile(good + ext)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(stale+ext, raw, 0o644))
		if ext == ".bin" {
			binBytes = int64(len(raw))
		} else {
			idxBytes = int64(len(raw))
		}
	}
	require.NoError(t, os.WriteFile(stale+".json", fmt.Appendf(nil, `{"format": "gcompile indexed dataset", "version": 1, "max_token": 150, "eos": -1, "bin_bytes": %d, "idx_bytes": %d}`, binBytes, idxBytes), 0o644))
	// A dataset of one empty document: no tokens at all.
	empty := filepath.Join(t.TempDir(), "empty")
	idx := append([]byte("MMIDIDX\x00\x00"), 1, 0, 0, 0, 0, 0, 0, 0, 8)
	idx = binary.LittleEndian.AppendUint64(idx, 1) // one sequence
	idx = binary.LittleEndian.AppendUint64(idx, 2) // one document
	idx = binary.LittleEndian.AppendUint32(idx, 0) // of no tokens
	idx = binary.LittleEndian.AppendUint64(idx, 0)
	idx = binary.LittleEndian.AppendUint64(idx, 0)
	idx = binary.LittleEndian.AppendUint64(idx, 1)
	require.NoError(t, os.WriteFile(empty+".idx", idx, 0o644))
	require.NoError(t, os.WriteFile(empty+".bin", nil, 0o644))
	textFile := filepath.Join(dir, "text.txt")
	require.NoError(t, os.WriteFile(textFile, []byte(text(4096)), 0o644))
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"tokenizer on text", []string{"--data", textFile, "--tokenizer", filepath.Join(dir, "tokenizer.json")}, []string{"--data " + strconv.Quote(textFile) + " is text", "gcompile data prepare --tokenizer"}},
		{"split on text", []string{"--data", textFile, "--split", "90,10"}, []string{"--split applies to a token dataset"}},
		{"a dataset without tokens", []string{"--data", empty}, []string{"--data " + empty + " holds no tokens (1 documents, every one empty)"}},
		{"negative blend weight", []string{"--data", "-0.5 " + good + " 1.5 " + good}, []string{"--data", "negative"}},
		{"blend weight not a number", []string{"--data", "half " + good + " 0.5 " + good}, []string{"--data", `"half"`}},
		{"truncated .bin", []string{"--data", truncated}, []string{"--data " + truncated, "truncated.bin"}},
		{"missing dataset", []string{"--data", filepath.Join(dir, "nothing.idx")}, []string{"--data " + filepath.Join(dir, "nothing")}},
		{"id past the model's vocab", []string{"--data", wide}, []string{"token id 299", "the model takes 256"}},
		{"bad split", []string{"--data", good, "--split", "98,-2"}, []string{"--split", "98,-2"}},
		{"merges without a tokenizer", []string{"--data", good, "--merges", filepath.Join(dir, "merges.txt")}, []string{"--merges", "no --tokenizer was given"}},
		{"tokenizer that does not exist", []string{"--data", good, "--tokenizer", filepath.Join(dir, "nothing.json")}, []string{"--tokenizer " + filepath.Join(dir, "nothing.json")}},
		{"no held-out documents", []string{"--data", good, "--split", "100,0"}, []string{"--split 100,0 leaves no held-out documents", "--eval-batches -1"}},
		{"a cache folder that is a file", []string{"--data", good, "--data-cache-dir", textFile}, []string{"--data-cache-dir " + textFile + " is a file; it wants a folder"}},
		{"a cache folder under a file", []string{"--data", good, "--data-cache-dir", filepath.Join(textFile, "cache")},
			[]string{"--data-cache-dir " + filepath.Join(textFile, "cache") + ": " + textFile + " is a file, not a folder"}},
		{"divisible-by zero", []string{"--data", good, "--make-vocab-size-divisible-by", "0"}, []string{"--make-vocab-size-divisible-by 0: want 1 to 65536"}},
		{"divisible-by a billion", []string{"--data", good, "--make-vocab-size-divisible-by", "1000000000"}, []string{"--make-vocab-size-divisible-by 1000000000: want 1 to 65536"}},
		{"a folder of datasets", []string{"--data", dir}, []string{"--data " + dir + " is a folder of token datasets (stale, " + filepath.Base(good) + ", ", "name one, --data " + stale}},
		{"a folder of datasets, with a tokenizer", []string{"--data", dir, "--tokenizer", filepath.Join(dir, "tokenizer.json")}, []string{"--data " + dir + " is a folder of token datasets (stale, "}},
		{"a .bin without its .idx", []string{"--data", noIndex}, []string{"--data " + noIndex, "noindex.idx"}},
		{"a .bin without its .idx, named by the .bin", []string{"--data", noIndex + ".bin"}, []string{"--data " + noIndex + ".bin", "looks binary", "its index " + noIndex + ".idx is missing"}},
		{"a .bin without its .idx, with a tokenizer", []string{"--data", noIndex + ".bin", "--tokenizer", filepath.Join(dir, "tokenizer.json")}, []string{"--data " + noIndex + ".bin: no " + noIndex + ".idx beside it"}},
		{"a path that is not there, with a tokenizer", []string{"--data", filepath.Join(dir, "nothing"), "--tokenizer", filepath.Join(dir, "tokenizer.json")},
			[]string{"--data " + filepath.Join(dir, "nothing") + ": no such text file or folder, and no dataset"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.json")
			err := mainErr(tokenGPT(t, good, append([]string{"--steps", "2", "--metrics", out}, tc.args...)...))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NoFileExists(t, out, "nothing is written")
		})
	}
	// An index that is there but cannot be read (a loop of links) is
	// named with its error, not as missing.
	loops := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(loops, "b"), filepath.Join(loops, "a")))
	require.NoError(t, os.Symlink(filepath.Join(loops, "a"), filepath.Join(loops, "b")))
	for _, ext := range []string{".bin", ".idx"} {
		require.NoError(t, os.Symlink(filepath.Join(loops, "a"), filepath.Join(loops, "L"+ext)))
	}
	err = mainErr(tokenGPT(t, good, "--steps", "2", "--data", filepath.Join(loops, "L")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--data "+filepath.Join(loops, "L")+": the dataset's index: ")
	assert.Contains(t, err.Error(), "too many levels of symbolic links")
	// A path that is not there is named alone, not as text that a token
	// dataset's flag does not apply to.
	err = mainErr(tokenGPT(t, good, "--steps", "2", "--data", filepath.Join(dir, "nothing"), "--data-cache-dir", dir))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--data "+filepath.Join(dir, "nothing")+": no such text file or folder, and no dataset")
	assert.NotContains(t, err.Error(), "--data-cache-dir applies to a token dataset")

	// Without --data, the default text is named as such, not as --data "".
	err = mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "1", "--tokenizer", filepath.Join(dir, "tokenizer.json")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--tokenizer "+filepath.Join(dir, "tokenizer.json")+": the default data (no --data: the Go sources, ")

	// The record is believed until a batch draws an id past it: the first
	// step fails, naming the sample and the record, instead of training on
	// a padding row's loss.
	err = mainErr(tokenGPT(t, stale, "--steps", "2"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is past the largest id "+stale+".json records (150): the .bin changed after the record was written")
}

// gcompile data merge writes shards prepared one by one as one dataset,
// whose record lets training check the tokenizer, and which trains; a
// merge into one of its inputs, or of shards of two tokenizers, is refused
// before anything is written.
func TestDataMergeThenTrain(t *testing.T) {
	dir := t.TempDir()
	gpt2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	tok := []string{"--tokenizer", filepath.Join(gpt2, "encoder.json.gz"), "--merges", filepath.Join(gpt2, "vocab.bpe.gz")}
	var shards []string
	docs := 0
	for i := range 3 {
		in := filepath.Join(dir, fmt.Sprintf("shard%d.jsonl", i))
		var b strings.Builder
		for j := range i + 2 {
			fmt.Fprintf(&b, "{\"text\": %q}\n", strings.Repeat(fmt.Sprintf("Shard %d, document %d. ", i, j), 12))
			docs++
		}
		require.NoError(t, os.WriteFile(in, []byte(b.String()), 0o644))
		prefix := filepath.Join(dir, fmt.Sprintf("shard%d", i))
		require.NoError(t, prepareMain(append(append(slices.Clone(tok), "--output-prefix", prefix, "--quiet"), in), io.Discard, io.Discard))
		shards = append(shards, prefix)
	}
	merged := filepath.Join(dir, "all", "merged")
	var stdout strings.Builder
	require.NoError(t, mergeMain(append([]string{"--output-prefix", merged}, shards...), &stdout, io.Discard))
	assert.Contains(t, stdout.String(), fmt.Sprintf("3 datasets merged: %d documents", docs))
	assert.Contains(t, stdout.String(), merged+".json beside them")
	ds, err := indexed.Open(merged)
	require.NoError(t, err)
	assert.Equal(t, docs, ds.NumSequences())
	require.NoError(t, ds.Close())
	m := runMetrics(t, append([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "2", "--eval-batches", "1",
		"--data", merged, "--split", "60,40"}, tok...)...)
	assert.Equal(t, "layers=1,hidden=32,heads=2,seq=16,vocab=50304", m.Config["set"], "the merged record's vocabulary")

	err = mergeMain([]string{"--output-prefix", shards[0], shards[0], shards[1]}, io.Discard, io.Discard)
	assert.ErrorContains(t, err, "data merge: cannot merge the datasets: the output "+shards[0]+" is the input "+shards[0])
	llama2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2")
	other := filepath.Join(dir, "llama")
	require.NoError(t, prepareMain([]string{"--tokenizer", llama2, "--output-prefix", other, "--quiet", filepath.Join(dir, "shard0.jsonl")}, io.Discard, io.Discard))
	err = mergeMain([]string{"--output-prefix", filepath.Join(dir, "mixed"), shards[0], other}, io.Discard, io.Discard)
	assert.ErrorContains(t, err, "were prepared differently")
	assert.NoFileExists(t, filepath.Join(dir, "mixed.bin"))
	assert.ErrorContains(t, dataMain([]string{"split"}), `data: unknown subcommand "split" (want prepare or merge`)
	assert.ErrorContains(t, mergeMain([]string{"--output-prefix", filepath.Join(dir, "x")}, io.Discard, io.Discard), "data merge: name at least one DATASET prefix to merge")
}

// gcompile data prepare tokenizes a folder and JSON Lines with a real
// tokenizer into a dataset that trains, and names a bad JSON Lines line.
func TestDataPrepareThenTrain(t *testing.T) {
	dir := t.TempDir()
	gpt2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	docs := filepath.Join(dir, "docs")
	require.NoError(t, os.MkdirAll(docs, 0o755))
	for i := range 6 {
		require.NoError(t, os.WriteFile(filepath.Join(docs, fmt.Sprintf("%d.txt", i)), []byte(strings.Repeat(fmt.Sprintf("Document %d says hello to the world. ", i), 20)), 0o644))
	}
	jsonl := filepath.Join(dir, "more.jsonl")
	require.NoError(t, os.WriteFile(jsonl, []byte("{\"text\": \"one more document\"}\n{\"text\": \"and another, with ünïcode\"}\n"), 0o644))
	prefix := filepath.Join(dir, "prepared")
	tok := []string{"--tokenizer", filepath.Join(gpt2, "encoder.json.gz"), "--merges", filepath.Join(gpt2, "vocab.bpe.gz")}
	var stdout, stderr strings.Builder
	require.NoError(t, prepareMain(append(append(slices.Clone(tok), "--output-prefix", prefix, "--quiet"), docs, jsonl), &stdout, &stderr))
	assert.Contains(t, stdout.String(), "8 documents")
	err := prepareMain(append(slices.Clone(tok), "--output-prefix", filepath.Join(dir, "many"), "--workers", "1000000", jsonl), io.Discard, io.Discard)
	assert.ErrorContains(t, err, "--workers 1000000: at most 4096")
	ds, err := indexed.Open(prefix)
	require.NoError(t, err)
	assert.Equal(t, 8, ds.NumSequences())
	require.NoError(t, ds.Close())

	m := runMetrics(t, append([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "2", "--eval-batches", "1",
		"--data", prefix, "--split", "60,40"}, tok...)...)
	assert.Equal(t, "layers=1,hidden=32,heads=2,seq=16,vocab=50304", m.Config["set"], "GPT-2's 50257 tokens padded to a multiple of 128")
	assert.Contains(t, m.Data.Tokenizer, "encoder.json.gz")

	// Llama 2's tokenizer has 32000 tokens: GPT-2's ids reach 50256.
	llama2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2")
	err = mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "2",
		"--data", prefix, "--split", "60,40", "--tokenizer", llama2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was prepared with the tokenizer")
	assert.ErrorIs(t, err, errDataMismatch)

	// A tokenizer kind not built, and an input that is not there: named
	// before any work.
	wordpiece := filepath.Join(dir, "wordpiece.json")
	require.NoError(t, os.WriteFile(wordpiece, []byte(`{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`), 0o644))
	err = prepareMain([]string{"--tokenizer", wordpiece, "--output-prefix", filepath.Join(dir, "wp"), "--quiet", jsonl}, &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), wordpiece)
	assert.Contains(t, err.Error(), "WordPiece")
	err = prepareMain(append(append(slices.Clone(tok), "--output-prefix", filepath.Join(dir, "gone"), "--quiet"), filepath.Join(dir, "missing.txt")), &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "missing.txt"))
	assert.NoFileExists(t, filepath.Join(dir, "gone.bin"))

	pipe := filepath.Join(dir, "piped")
	require.NoError(t, syscall.Mkfifo(pipe+".idx", 0o644))
	err = prepareMain(append(append(slices.Clone(tok), "--output-prefix", pipe, "--quiet"), jsonl), &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--output-prefix "+pipe+".idx is not a regular file")

	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"text\": \"fine\"}\nnot json\n"), 0o644))
	err = prepareMain(append(append(slices.Clone(tok), "--output-prefix", filepath.Join(dir, "bad"), "--quiet"), bad), &stdout, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), bad+":2")
	assert.NoFileExists(t, filepath.Join(dir, "bad.bin"))
	assert.NoFileExists(t, filepath.Join(dir, "bad.idx"))
}

// A blend of two datasets trains, and its record names both with their
// weights; a resumed run must give the same blend. A part of weight 0
// draws nothing, but keeps its place in the blend.
func TestTrainsOnABlend(t *testing.T) {
	dir := t.TempDir()
	a := tokenDataset(t, dir, 60, 20, 200, 6)
	b := tokenDataset(t, dir, 60, 20, 256, 7)
	path, page := filepath.Join(dir, "m.json"), filepath.Join(dir, "r.html")
	require.NoError(t, mainErr(tokenGPT(t, a, "--steps", "2", "--split", "80,20", "--data", "0.3 "+a+" 0.7 "+b, "--metrics", path, "--report", page, "--checkpoint-dir", filepath.Join(dir, "ck"))))
	m := readMetrics(t, path)
	html, err := os.ReadFile(page)
	require.NoError(t, err)
	assert.Contains(t, string(html), "120 documents, "+groupDigits(m.Data.Tokens)+" tokens, --split 80,20", "the report's data line")
	assert.EqualValues(t, 120, m.Data.Documents)
	require.Len(t, m.Steps, 2)
	assert.Contains(t, m.Data.Source, "0.3 × "+a)
	assert.Contains(t, m.Data.Source, "0.7 × "+b)
	err = mainErr(tokenGPT(t, a, "--steps", "4", "--split", "80,20", "--data", "0.5 "+a+" 0.5 "+b, "--resume", filepath.Join(dir, "ck")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the checkpoint was trained on other data")
	assert.Contains(t, err.Error(), ": they differ in the datasets or their blend: ")

	// A held-out split too small for a window is no obstacle when nothing
	// is evaluated.
	small := tokenDataset(t, dir, 40, 12, 250, 1)
	require.Error(t, mainErr(tokenGPT(t, small, "--steps", "1")), "98,2 leaves 15 held-out tokens for windows of 17")
	require.NoError(t, mainErr(tokenGPT(t, small, "--steps", "1", "--eval-batches", "-1")))

	// A part of weight 0 draws no sample: the run is the run on the
	// other part alone.
	only := filepath.Join(dir, "only.json")
	require.NoError(t, mainErr(tokenGPT(t, a, "--steps", "2", "--split", "80,20", "--data", a, "--metrics", only)))
	zero := filepath.Join(dir, "zero.json")
	require.NoError(t, mainErr(tokenGPT(t, a, "--steps", "2", "--split", "80,20", "--data", "0 "+small+" 1 "+a, "--metrics", zero)))
	assert.Equal(t, losses(readMetrics(t, only)), losses(readMetrics(t, zero)))
	// It stays in the blend's order, so its splits must hold a sample:
	// the refusal says so.
	tiny := tokenDataset(t, dir, 3, 3, 250, 2) // too few tokens for a sample in either split
	err = mainErr(tokenGPT(t, a, "--steps", "2", "--split", "80,20", "--data", "0 "+tiny+" 1 "+a))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "its weight is 0, so it gives no sample, but it is part of the blend's order; leave it out of --data if it cannot hold one")
}

// The padding rows of a vocabulary padded past the data's ids are masked
// out of the loss: the tied embedding's padding rows take no gradient, so
// with no weight decay they are the same bytes after 1 and after 3 steps,
// while the real rows train; under tp2 (vocab-parallel) too.
func TestPaddingClassesTakeNoGradient(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 60, 20, 200, 8) // 200 classes, padded to 256
	for _, plan := range [][]string{nil, {"--devices", "2", "--tp", "2", "--make-vocab-size-divisible-by", "64"}} {
		t.Run(fmt.Sprint(plan), func(t *testing.T) {
			rows := map[int][]byte{}
			for _, steps := range []int{1, 3} {
				// The checkpoint keeps the padding rows (--save trims them).
				ck := filepath.Join(t.TempDir(), "ck")
				args := append([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", strconv.Itoa(steps),
					"--eval-batches", "1", "--split", "80,20", "--weight-decay", "0", "--warmup", "0", "--data", prefix, "--checkpoint-dir", ck}, plan...)
				require.NoError(t, mainErr(args))
				_, tensors, err := checkpoint.Consolidate(checkpoint.StepDir(ck, steps), lower.Param)
				require.NoError(t, err)
				for _, tn := range tensors {
					if tn.Name == "wte.weight" || tn.Name == "wte" {
						require.Equal(t, []int{256, 32}, tn.Shape)
						rows[steps] = tn.Data
					}
				}
				require.Contains(t, rows, steps, "the saved weights hold the embedding")
			}
			row := 32 * 4 // bytes of one f32 row
			assert.Equal(t, rows[1][200*row:], rows[3][200*row:], "padding rows 200..255 never change")
			assert.NotEqual(t, rows[1][:200*row], rows[3][:200*row], "the real rows train")
		})
	}
}

// Weights of a model whose vocabulary is exactly the data's classes (as
// Hugging Face files are: GPT-2's 50257 rows) load into the padded model,
// which then gives the same loss: the padding is masked out of it.
func TestLoadIntoAPaddedVocabulary(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 60, 20, 200, 9)
	base := []string{gptModel, "--batch", "4", "--run", "--steps", "1", "--eval-batches", "1", "--split", "80,20", "--data", prefix}
	exact := filepath.Join(dir, "exact.safetensors")
	require.NoError(t, mainErr(append(slices.Clone(base), "--set", "layers=1,hidden=32,heads=2,seq=16,vocab=200", "--save", exact)))
	unpadded := runMetrics(t, append(slices.Clone(base), "--set", "layers=1,hidden=32,heads=2,seq=16,vocab=200", "--load", exact)...)
	padded := runMetrics(t, append(slices.Clone(base), "--set", "layers=1,hidden=32,heads=2,seq=16", "--load", exact)...)
	assert.Equal(t, "layers=1,hidden=32,heads=2,seq=16,vocab=256", padded.Config["set"])
	t.Logf("step 1 loss %.17g unpadded, %.17g padded; held-out %.17g, %.17g", unpadded.Steps[0].Loss, padded.Steps[0].Loss, unpadded.Eval[0].Loss, padded.Eval[0].Loss)
	assert.Equal(t, unpadded.Steps[0].Loss, padded.Steps[0].Loss, "the same loss with 56 padding classes, to the bit")
	assert.Equal(t, unpadded.Eval[0].Loss, padded.Eval[0].Loss, "the same held-out loss after one step, to the bit")
}

// --save and export write a padded vocabulary's tables at the data's
// classes (Hugging Face's vocab_size) and every other param whole, even
// one whose first dim happens to equal the padded vocabulary (the MLP's
// c_proj [4·64, 64] beside 256 padded classes); the file loads back.
func TestSaveAndExportTrimTheVocabulary(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 60, 20, 200, 10)
	args := []string{gptModel, "--set", "layers=1,hidden=64,heads=2,seq=16", "--batch", "4", "--run", "--steps", "2", "--eval-batches", "1",
		"--split", "80,20", "--data", prefix}
	saved, ck, exported := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "ck"), filepath.Join(dir, "x.safetensors")
	log, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(args), "--save", saved, "--checkpoint-dir", ck)) })
	require.NoError(t, err)
	assert.Contains(t, log, "note: no tokenizer and no record of one (PREFIX.json) gives the vocabulary: it follows the data's largest token id (199) + 1, padded to 256; give the data's --tokenizer")
	log, err = captureStderr(t, func() error { return mainErr([]string{"export", ck, "--out", exported}) })
	require.NoError(t, err)
	assert.Contains(t, log, "note: no tokenizer written: give export the run's --tokenizer to write it", "token data: its tokenizer is to be written beside the weights")
	man, err := checkpoint.ReadManifest(checkpoint.StepDir(ck, 2))
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"wte.weight": 200}, man.Plan.VocabTables)
	assert.Contains(t, man.Plan.Data, "split 0.8,0.2,0")
	assert.Contains(t, checkpoint.Describe(ck, man), "vocabulary table wte.weight: rows past 200 are padding")
	for _, file := range []string{saved, exported} {
		tensors, _, err := checkpoint.Load(file)
		require.NoError(t, err)
		shapes := map[string][]int{}
		for _, tn := range tensors {
			shapes[tn.Name] = tn.Shape
		}
		assert.Equal(t, []int{200, 64}, shapes["wte.weight"], "%s: the tied embedding at the data's 200 classes", file)
		assert.Equal(t, []int{256, 64}, shapes["h.0.mlp.c_proj.weight"], "%s: a [256, 64] param that is no vocabulary table", file)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	assert.Equal(t, 200.0, cfg["vocab_size"], "config.json counts the rows export wrote, not the padded table's")
	assert.Nil(t, cfg["eos_token_id"], "token data without a tokenizer has no end token to name")
	// A tokenizer given to export then is not checked against a record,
	// but its ids must have rows in the padded table; the export keeps a
	// row for each of them, past the data's classes.
	gpt2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	err = mainErr([]string{"export", ck, "--out", filepath.Join(dir, "t", "x.safetensors"), "--tokenizer", gpt2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--tokenizer "+gpt2+" has 50257 ids, and the model's vocabulary table wte.weight only 256 rows: its run read the data without --tokenizer")
	assert.NoDirExists(t, filepath.Join(dir, "t"))
	bytesTok := byteLevelTokenizer(t, dir)
	hf := filepath.Join(dir, "hf", "x.safetensors")
	log, err = captureStderr(t, func() error { return mainErr([]string{"export", ck, "--out", hf, "--tokenizer", bytesTok}) })
	require.NoError(t, err)
	assert.Contains(t, log, "note: export keeps 256 rows of wte.weight, one for each of the tokenizer's ids; the data's ids are below 200")
	tensors, _, err := checkpoint.Load(hf)
	require.NoError(t, err)
	for _, tn := range tensors {
		if tn.Name == "wte.weight" {
			assert.Equal(t, []int{256, 64}, tn.Shape, "a row for each of the tokenizer's ids")
		}
	}
	var hfCfg map[string]any
	require.NoError(t, json.Unmarshal(readBytes(t, filepath.Join(dir, "hf", "config.json")), &hfCfg))
	assert.EqualValues(t, 256, hfCfg["vocab_size"])
	// Another tokenizer's file left in the folder would be read beside
	// the ones written: refused, naming it.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "hf", "vocab.json"), []byte("{}"), 0o644))
	err = mainErr([]string{"export", ck, "--out", hf, "--tokenizer", bytesTok})
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, "hf")+" holds vocab.json, which is not this tokenizer's: AutoTokenizer would read it beside the files written")
	m := runMetrics(t, append(slices.Clone(args), "--load", saved)...)
	require.Len(t, m.Steps, 2)

	// A config.json that cannot be written beside the weights is found
	// out before they are written.
	blocked := filepath.Join(dir, "blocked")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "config.json"), 0o755))
	err = mainErr([]string{"export", ck, "--out", filepath.Join(blocked, "x.safetensors")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "config.json is a folder")
	assert.NoFileExists(t, filepath.Join(blocked, "x.safetensors"))

	// A target that is no regular file (a pipe here; /dev/full as root
	// was replaced once) is refused, never renamed over.
	fifo := filepath.Join(dir, "pipe.safetensors")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	err = mainErr([]string{"export", ck, "--out", fifo})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--out "+fifo+" is not a regular file")
	fi, err := os.Stat(fifo)
	require.NoError(t, err)
	assert.Equal(t, os.ModeNamedPipe, fi.Mode().Type(), "the pipe is still there")
}

// data prepare stopped by a signal writes nothing and ends with the exit
// status a stopped training run has (128 + the signal), naming it.
func TestDataPrepareStoppedBySignal(t *testing.T) {
	dir := t.TempDir()
	gpt2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	// Text enough to take seconds, stopped at its start.
	input := filepath.Join(dir, "long.txt")
	require.NoError(t, os.WriteFile(input, []byte(strings.Repeat("A long document that takes a while to tokenize. ", 1<<19)), 0o644))
	// The test's own registration keeps a SIGINT that arrives after the
	// run has ended from ending the test binary.
	absorb := make(chan os.Signal, 1)
	signal.Notify(absorb, os.Interrupt)
	defer signal.Stop(absorb)
	prefix := filepath.Join(dir, "stopped")
	started := make(chan struct{})
	stderr := &signalWhen{marker: "tokenizing with", reached: started}
	done := make(chan error, 1)
	go func() {
		done <- prepareMain([]string{"--tokenizer", filepath.Join(gpt2, "encoder.json.gz"), "--merges", filepath.Join(gpt2, "vocab.bpe.gz"),
			"--output-prefix", prefix, "--quiet", input}, io.Discard, stderr)
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("data prepare ended before its signal: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("data prepare did not start")
	}
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("data prepare did not stop on SIGINT")
	}
	var st *exitStatus
	require.ErrorAs(t, err, &st)
	assert.Equal(t, 130, st.code)
	assert.Contains(t, err.Error(), "data prepare: stopped by interrupt (nothing was written under "+prefix+")")
	for _, ext := range []string{".bin", ".idx", ".json"} {
		assert.NoFileExists(t, prefix+ext)
	}
}

// signalWhen is a writer that closes reached once marker has been written.
type signalWhen struct {
	mu      sync.Mutex
	seen    strings.Builder
	marker  string
	reached chan struct{}
}

func (w *signalWhen) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := strings.Contains(w.seen.String(), w.marker)
	w.seen.Write(p)
	if !before && strings.Contains(w.seen.String(), w.marker) {
		close(w.reached)
	}
	return len(p), nil
}

// Without a held-out evaluation (--eval-batches -1) a text too small to
// hold out a window trains: only the training split must hold one.
func TestNoEvaluationNeedsNoHeldOutText(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "one")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte(text(4096)), 0o644))
	args := append(slices.Clone(tinyGPT), "--data", dir, "--run", "--steps", "1")
	err := mainErr(args)
	require.Error(t, err, "one file: no held-out split")
	assert.Contains(t, err.Error(), "evaluation split has 0 bytes")
	require.NoError(t, mainErr(append(args, "--eval-batches", "-1")))
}

// An evaluation that reads more held-out samples than the split holds
// wraps around it, as Megatron's validation sampler does; the log says so
// and how many batches read each sample at most once. Training past an
// epoch is said, with how many epochs.
func TestEvalBatchesPastTheHeldOutSplitAreNoted(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 40, 20, 200, 6)
	base := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "1",
		"--split", "90,10", "--data", prefix, "--data-cache-dir", filepath.Join(dir, "cache")}
	log, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(base), "--eval-batches", "1")) })
	require.NoError(t, err)
	assert.NotContains(t, log, "reads some twice")
	assert.NotContains(t, log, "epochs", "one step is not past an epoch")
	log, err = captureStderr(t, func() error { return mainErr(append(slices.Clone(base), "--eval-batches", "50")) })
	require.NoError(t, err)
	assert.Regexp(t, `held-out split: \d+ samples, fewer than the 200 an evaluation reads \(--eval-batches 50 × --batch 4\), so it reads some twice or more; --eval-batches \d+ reads each at most once`, log)
	// A batch larger than the split: fewer batches would not help, a
	// smaller --batch would.
	log, err = captureStderr(t, func() error {
		return mainErr(append(slices.Clone(base), "--eval-batches", "1", "--batch", "64"))
	})
	require.NoError(t, err)
	assert.Regexp(t, `held-out split: (\d+) samples, fewer than the 64 an evaluation reads \(--eval-batches 1 × --batch 64\), so it reads some twice or more; one batch is more than the split: --batch \d+ or less reads each at most once`, log)
	// Training past an epoch is said too.
	log, err = captureStderr(t, func() error {
		return mainErr(append(slices.Clone(base), "--eval-batches", "-1", "--steps", "30"))
	})
	require.NoError(t, err)
	assert.Regexp(t, `training: --steps 30 × --batch 4 read 120 samples, \d\.\d+ epochs of the training split's \d+ \(each epoch shuffled anew\)`, log)

	// Byte text too: its last 5 % (100 bytes) holds 83 windows of 16+1.
	text := filepath.Join(dir, "small.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat("hello world, a short text for the held-out part. ", 41)[:2000]), 0o644))
	log, err = captureStderr(t, func() error {
		return mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--data", text, "--run", "--steps", "1", "--eval-batches", "30"})
	})
	require.NoError(t, err)
	assert.Contains(t, log, "held-out text: 83 windows of 16+1 bytes, fewer than the 120 an evaluation reads (--eval-batches 30 × --batch 4), so it reads some twice or more; --eval-batches 20 reads each at most once")
}

// The exported config names the special tokens of the data the model
// trained on (GPT-2's <|endoftext|> for both), and none for bytes, so a
// Hugging Face generate stops where gcompile generate does rather than
// at LlamaConfig's default eos 2.
func TestExportConfigNamesTheTokenizersSpecialTokens(t *testing.T) {
	gpt2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	tok, err := tokenizer.Load(filepath.Join(gpt2, "encoder.json.gz"), filepath.Join(gpt2, "vocab.bpe.gz"))
	require.NoError(t, err)
	read := func(c *config) map[string]any {
		var cfg map[string]any
		require.NoError(t, json.Unmarshal(exportConfigOf(c), &cfg))
		return cfg
	}
	declared := `{"model_type":"llama","vocab_size":50304}`
	cfg := read(&config{exportConfig: declared, tokens: &tokenData{tok: tok}})
	assert.Equal(t, 50256.0, cfg["eos_token_id"])
	assert.Equal(t, 50256.0, cfg["bos_token_id"])
	assert.Equal(t, "llama", cfg["model_type"])
	cfg = read(&config{exportConfig: declared})
	assert.Contains(t, cfg, "eos_token_id")
	assert.Nil(t, cfg["eos_token_id"], "bytes have no end token")
	assert.Nil(t, exportConfigOf(&config{}), "a model that declares none")
}

// Compiled without --run, a model is sized for the token dataset --data
// names as a run's is: the plan, its memory and its dumps are the run's,
// not a byte-level model's.
func TestCompileWithoutRunIsSizedForTheData(t *testing.T) {
	prefix := tokenDataset(t, t.TempDir(), 40, 20, 300, 11)
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--data", prefix, "--split", "80,20"}
	compiled := runMetrics(t, args...)
	ran := runMetrics(t, append(slices.Clone(args), "--run", "--steps", "1", "--eval-batches", "1")...)
	require.Len(t, compiled.Devices, 1)
	assert.Equal(t, ran.Devices[0].ParamBytes, compiled.Devices[0].ParamBytes, "the 300 classes padded to 384 rows, as in the run")
	assert.Equal(t, ran.Devices[0].PeakBytesPredicted, compiled.Devices[0].PeakBytesPredicted)
	bytes := runMetrics(t, gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4")
	assert.Greater(t, compiled.Devices[0].ParamBytes, bytes.Devices[0].ParamBytes)
}

// No output may be written over a file the run reads: a token dataset's
// .bin, .idx and .json (named by a prefix, or in a blend), a file of a
// tokenizer's folder or of a text corpus's folder. Each is refused before
// anything trains, and the input is left whole.
func TestOutputsNeverOverwriteTheData(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 40, 20, 200, 12)
	other := tokenDataset(t, dir, 40, 20, 200, 13)
	text := filepath.Join(dir, "text")
	require.NoError(t, os.MkdirAll(text, 0o755))
	writeFile(t, filepath.Join(text, "a.go"), strings.Repeat("package a // some Go text to train on\n", 200))
	gpt2 := filepath.Join(dir, "gpt2")
	require.NoError(t, os.CopyFS(gpt2, os.DirFS(filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2"))))
	llama3 := filepath.Join(dir, "llama3")
	require.NoError(t, os.CopyFS(llama3, os.DirFS(filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama3"))))
	index, shard := filepath.Join(dir, "w.safetensors.index.json"), filepath.Join(dir, "w-00002-of-00002.safetensors")
	writeFile(t, index, `{"weight_map": {"a": "w-00001-of-00002.safetensors", "b": "w-00002-of-00002.safetensors"}}`)
	writeFile(t, shard, "a shard")
	base := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "1", "--eval-batches", "1"}
	for _, tc := range []struct {
		name   string
		args   []string
		output string
		input  string
	}{
		{"a dataset's index", []string{"--data", prefix, "--split", "80,20"}, prefix + ".idx", "--data"},
		{"a dataset named by its .bin", []string{"--data", prefix + ".bin", "--split", "80,20"}, prefix + ".idx", "--data"},
		{"a dataset named by its .idx", []string{"--data", prefix + ".idx", "--split", "80,20"}, prefix + ".bin", "--data"},
		{"a dataset's tokens", []string{"--data", prefix, "--split", "80,20"}, prefix + ".bin", "--data"},
		{"a blend member's file", []string{"--data", "0.5 " + prefix + " 0.5 " + other, "--split", "80,20"}, other + ".bin", "--data"},
		{"a tokenizer folder's file", []string{"--data", filepath.Join(text, "a.go"), "--tokenizer", gpt2}, filepath.Join(gpt2, "encoder.json.gz"), "--tokenizer"},
		{"a text folder's file", []string{"--data", text}, filepath.Join(text, "a.go"), "--data"},
		{"the config beside a tokenizer file", []string{"--data", prefix, "--split", "80,20", "--tokenizer", filepath.Join(llama3, "tokenizer.json.gz")},
			filepath.Join(llama3, "tokenizer_config.json"), "--tokenizer"},
		{"a shard of a --load index", []string{"--load", index}, shard, "--load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := os.ReadFile(tc.output)
			require.NoError(t, err)
			err = mainErr(append(append(slices.Clone(base), tc.args...), "--metrics", tc.output))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "--metrics "+tc.output+" is also "+tc.input+"'s input")
			after, err := os.ReadFile(tc.output)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the input is whole")
		})
	}

	// Files of those folders the run does not read may be written: binary
	// weights or a file under a hidden folder of the corpus, a file
	// beside a tokenizer's own. (A text output anywhere else in the
	// corpus would be read by the next run: TestOutputsInsideTheTextDataAreRefused.)
	writeFile(t, filepath.Join(text, "w.safetensors"), "\x00binary")
	require.NoError(t, mainErr(append(append(slices.Clone(base), "--data", text, "--eval-batches", "-1"), "--save", filepath.Join(text, "w.safetensors"))))
	require.NoError(t, mainErr(append(append(slices.Clone(base), "--data", text, "--eval-batches", "-1"), "--metrics", filepath.Join(text, ".runs", "m.json"))))
	require.NoError(t, mainErr(append(append(slices.Clone(base), "--data", prefix, "--split", "80,20", "--tokenizer", gpt2), "--metrics", filepath.Join(gpt2, "m.json"))))
}

// Without --data a run trains on the Go sources, wherever it starts: token
// datasets in the working folder are not taken for a --data "" folder of
// them.
func TestDefaultDataIgnoresTheWorkingFolder(t *testing.T) {
	model, err := filepath.Abs(gptModel)
	require.NoError(t, err)
	dir := t.TempDir()
	tokenDataset(t, dir, 10, 20, 200, 14)
	t.Chdir(dir)
	require.NoError(t, mainErr([]string{model, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--max-data-mb", "1",
		"--run", "--steps", "1", "--eval-batches", "1"}))
}

// maxTokenCache is a dataset of ids up to 199, opened (closed when the
// test ends), a cache folder for it, and the file there its largest id
// is cached in.
func maxTokenCache(t *testing.T) (ds *indexed.Dataset, prefix, cache, file string) {
	t.Helper()
	dir := t.TempDir()
	prefix = tokenDataset(t, dir, 20, 20, 200, 15)
	ds, err := indexed.Open(prefix)
	require.NoError(t, err)
	t.Cleanup(func() { ds.Close() })
	cache = filepath.Join(dir, "cache")
	require.NoError(t, os.MkdirAll(cache, 0o755))
	return ds, prefix, cache, filepath.Join(cache, "maxtoken-"+ds.Fingerprint())
}

// A pipe where the cached largest id of a dataset belongs is not read (it
// would hang the run): the id is scanned again and the pipe replaced.
func TestMaxTokenCacheThatIsAPipeIsReplaced(t *testing.T) {
	ds, prefix, cache, fifo := maxTokenCache(t)
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	var n int32
	require.NoError(t, fifotest.OpenWithin(t, fifo, func() (err error) {
		n, _, err = cachedMaxToken(ds, prefix, cache)
		return err
	}))
	assert.Equal(t, int32(199), n)
}

// A cached largest id that the dataset's dtype cannot store (a damaged or
// edited cache) is scanned again, not taken: it would size the model's
// vocabulary.
func TestMaxTokenCachePastItsDTypeIsScannedAgain(t *testing.T) {
	ds, prefix, cache, file := maxTokenCache(t)
	require.Equal(t, indexed.Uint16, ds.DType())
	for _, bad := range []string{"99999\n", "-1\n", "x\n"} {
		require.NoError(t, os.WriteFile(file, []byte(bad), 0o644))
		n, from, err := cachedMaxToken(ds, prefix, cache)
		require.NoError(t, err)
		assert.Equal(t, int32(199), n, "cache %q", bad)
		assert.Empty(t, from, "scanned, not read from the cache")
	}
	n, from, err := cachedMaxToken(ds, prefix, cache)
	require.NoError(t, err)
	assert.Equal(t, int32(199), n)
	assert.Equal(t, file, from, "the scan cached again")
}

// --data takes a path whole when it names one: a dataset or a text file
// whose path has spaces is not a blend, and PREFIX.json (the dataset's
// record) is the dataset, as PREFIX.bin and PREFIX.idx are, not a text
// file to train on. A blend naming one dataset twice is refused.
func TestDataPathsAreTakenWhole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a folder")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	prefix := tokenDataset(t, dir, 40, 12, 250, 1)
	for _, data := range []string{prefix, prefix + ".json", prefix + ".bin"} {
		if data == prefix+".json" {
			writeFile(t, data, `{"format": "not gcompile's"}`) // another tool's record: the dataset reads without one
		}
		path := filepath.Join(t.TempDir(), "m.json")
		require.NoError(t, mainErr(tokenGPT(t, data, "--steps", "1", "--split", "80,20", "--metrics", path)), "--data %q", data)
		m := readMetrics(t, path)
		require.NotNil(t, m.Data)
		assert.Positive(t, m.Data.Tokens, "--data %q: the token dataset", data)
	}
	text := filepath.Join(dir, "some text.txt")
	writeFile(t, text, strings.Repeat("a text file whose name has a space. ", 40))
	path := filepath.Join(t.TempDir(), "m.json")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(ckptGPT), "--data", text, "--steps", "1", "--metrics", path))))
	m := readMetrics(t, path)
	require.NotNil(t, m.Data)
	assert.Positive(t, m.Data.TrainBytes, "read as text")

	plain := tokenDataset(t, t.TempDir(), 40, 12, 250, 1) // a blend's words are split at spaces
	err := mainErr(tokenGPT(t, fmt.Sprintf("0.5 %s 0.5 %s/./%s", plain, filepath.Dir(plain), filepath.Base(plain)), "--steps", "1"))
	require.ErrorIs(t, err, sample.ErrBlendTwice)
	assert.Contains(t, err.Error(), "blend names a dataset twice: ")
	assert.Contains(t, err.Error(), "tokens-40-12-250-1 (parts 1 and 2, weights 0.5 and 0.5)")
	// Through a link too.
	linked := filepath.Join(t.TempDir(), "linked")
	for _, ext := range []string{".bin", ".idx"} {
		require.NoError(t, os.Symlink(plain+ext, linked+ext))
	}
	err = mainErr(tokenGPT(t, fmt.Sprintf("0.3 %s 0.7 %s", plain, linked), "--steps", "1"))
	require.ErrorIs(t, err, sample.ErrBlendTwice)
	assert.Contains(t, err.Error(), "(parts 1 and 2, weights 0.3 and 0.7)")
}

// data prepare --bos begins each document with the tokenizer's BOS, as
// Hugging Face's Llama tokenizer adds it; without it a document starts
// with its text.
func TestDataPrepareBeginsDocumentsWithBOS(t *testing.T) {
	dir := t.TempDir()
	llama2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2")
	text := filepath.Join(dir, "a.txt")
	writeFile(t, text, "hello world")
	first := func(extra ...string) []int32 {
		prefix := filepath.Join(dir, fmt.Sprint("p", len(extra)))
		require.NoError(t, prepareMain(append([]string{"--tokenizer", llama2, "--output-prefix", prefix, "--quiet", text}, extra...), io.Discard, io.Discard))
		ds, err := indexed.Open(prefix)
		require.NoError(t, err)
		defer ds.Close()
		doc := make([]int32, ds.SequenceLen(0))
		require.NoError(t, ds.Read(0, 0, doc))
		return doc
	}
	plain, with := first(), first("--bos")
	assert.Equal(t, int32(1), with[0], "<s>")
	assert.Equal(t, plain, with[1:])
	assert.Equal(t, int32(2), with[len(with)-1], "</s>")
}

// eval of a checkpoint trained on token data, given no --data: the
// vocabulary came from the data, so the error says to give the data and
// its tokenizer, not to set the vocabulary by hand (which would evaluate
// the model on bytes).
func TestEvalOfATokenCheckpointWithoutItsDataNamesIt(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 40, 20, 300, 16)
	ck := filepath.Join(dir, "ck")
	set := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4"}
	require.NoError(t, mainErr(append(slices.Clone(set), "--data", prefix, "--split", "80,20", "--run", "--steps", "1", "--eval-batches", "1", "--checkpoint-dir", ck)))
	err := mainErr(append(append([]string{"eval"}, set...), "--resume", ck, "--max-data-mb", "1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "its vocab=384 came from the token data it trained on: give the run's --tokenizer (eval: and its --data PREFIX and --split), not --set vocab")
}

// A cached sample index found damaged is built again, and the summary
// says so: the run's batches are those of an intact index either way.
func TestSummaryNamesARebuiltSampleIndex(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 40, 20, 200, 17)
	cache := filepath.Join(dir, "cache")
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--data", prefix, "--split", "80,20",
		"--data-cache-dir", cache, "--run", "--steps", "1", "--eval-batches", "1"}
	first := runMetrics(t, args...)
	idx, err := filepath.Glob(filepath.Join(cache, "gpt-e0-*.idx"))
	require.NoError(t, err)
	require.NotEmpty(t, idx)
	for _, f := range idx {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		raw[len(raw)-1] ^= 0xff // the body's last byte: its checksum no longer holds
		require.NoError(t, os.WriteFile(f, raw, 0o644))
	}
	var again runtime.Metrics
	log, err := captureStderr(t, func() error {
		again = runMetrics(t, args...)
		return nil
	})
	require.NoError(t, err)
	assert.Contains(t, log, "cached sample index file(s) in "+cache+" were damaged or stale and were built again")
	assert.Equal(t, first.Steps[0].Loss, again.Steps[0].Loss, "the same batches")
}

// A dataset whose largest id would make a vocabulary past any tokenizer's
// (one stray id) is refused before the model is built: the embedding of
// that many rows was built first, and the run was killed for memory
// minutes later. The largest id, scanned once, is cached readable by the
// other users of the data (the umask's mode), who would scan again.
// --max-data-mb, which bounds text only, is said to be unused.
func TestStrayTokenIDIsRefusedAndTheScanIsShared(t *testing.T) {
	dir := t.TempDir()
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
	stray := tokenDataset(t, dir, 3, 4, maxDataVocab+1, 16)
	log, err := captureStderr(t, func() error {
		return mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=4", "--batch", "2", "--run", "--steps", "1", "--eval-batches", "-1",
			"--data", stray, "--data-cache-dir", filepath.Join(dir, "cache"), "--max-data-mb", "1"})
	})
	require.Error(t, err)
	assert.Contains(t, log, "note: --max-data-mb bounds text read into memory", "a flag that does nothing here is said to")
	assert.Contains(t, err.Error(), fmt.Sprintf("holds token id %d (a scan of its .bin)", maxDataVocab))
	assert.Contains(t, err.Error(), "give the --tokenizer the data was made with")

	ds, err := indexed.Open(stray)
	require.NoError(t, err)
	defer ds.Close()
	fi, err := os.Stat(filepath.Join(dir, "cache", "maxtoken-"+ds.Fingerprint()))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
	err = mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=4", "--batch", "2", "--run", "--steps", "1", "--eval-batches", "-1",
		"--data", stray, "--data-cache-dir", filepath.Join(dir, "cache")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the scan cached in "+filepath.Join(dir, "cache", "maxtoken-"+ds.Fingerprint()))
}

// A sample index folder without room for the first epoch index the run
// builds is refused before training (it failed at step 1, after the
// compile; a later epoch's, hours in); without room for every epoch the
// run reaches it is warned about.
func TestIndexFolderWithoutRoomIsRefused(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 40, 20, 200, 17)
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "60", "--eval-batches", "-1",
		"--data", prefix, "--data-cache-dir", filepath.Join(dir, "cache")}
	t.Cleanup(func() { freeSpace = freeBytes })
	freeSpace = func(string) (int64, bool) { return 10, true }
	err := mainErr(args)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has 10 B free, and the first epoch index this run builds takes")
	built, _ := filepath.Glob(filepath.Join(dir, "cache", "gpt-*.idx"))
	assert.Empty(t, built, "no epoch index built")

	// Room for one epoch's index, not for the several 60 steps of 4
	// samples cross (the split holds about 40·10/16 samples an epoch).
	freeSpace = func(string) (int64, bool) { return 2000, true }
	log, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(args), "--steps", "2")) })
	require.NoError(t, err)
	assert.NotContains(t, log, "sample index folder", "two steps stay in the first epoch")
	log, err = captureStderr(t, func() error { return mainErr(args) })
	require.NoError(t, err)
	assert.Contains(t, log, "warning: the sample index folder")
	assert.Contains(t, log, "will not fit")
}

// data prepare refuses inputs that would write a document twice (an
// input given twice, a file inside a folder also given) and a dataset
// written inside an input folder, whose next prepare would read the
// dataset as documents, before anything is tokenized.
func TestDataPrepareRefusesOverlappingInputsAndOutputs(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	docs := filepath.Join(dir, "docs")
	require.NoError(t, os.MkdirAll(docs, 0o755))
	a := filepath.Join(docs, "a.txt")
	require.NoError(t, os.WriteFile(a, []byte("hello world"), 0o644))
	out := filepath.Join(dir, "out", "ds")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"twice", []string{"--output-prefix", out, a, a}, "INPUT " + a + " is given twice"},
		{"file in a folder", []string{"--output-prefix", out, docs, a}, "INPUT " + a + " is inside INPUT folder " + docs},
		{"folder after its file", []string{"--output-prefix", out, a, docs}, "INPUT folder " + docs + " holds INPUT " + a},
		{"output in the input folder", []string{"--output-prefix", filepath.Join(docs, "ds"), docs}, "--output-prefix " + filepath.Join(docs, "ds") + " is inside INPUT folder " + docs},
		{"output over an input", []string{"--output-prefix", filepath.Join(dir, "x"), filepath.Join(dir, "x.json")}, "which is INPUT " + filepath.Join(dir, "x.json")},
		{"output a folder not made yet", []string{"--output-prefix", filepath.Join(dir, "new") + string(filepath.Separator), a}, "is a folder; give a path prefix inside it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := prepareMain(append([]string{"--tokenizer", tok, "--quiet"}, tc.args...), io.Discard, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NoFileExists(t, out+".bin")
			assert.NoFileExists(t, filepath.Join(docs, "ds.bin"))
			assert.NoDirExists(t, filepath.Join(dir, "new"), "nothing made")
		})
	}
}

// A prepare's outputs never replace what its tokenizer reads (the file,
// its merges, the config beside it, a folder's files) or a file of the
// prefix's names that is not a dataset's: each was lost before.
func TestDataPrepareKeepsTheTokenizerAndOtherFiles(t *testing.T) {
	dir := t.TempDir()
	llama3 := filepath.Join(dir, "llama3")
	require.NoError(t, os.CopyFS(llama3, os.DirFS(filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama3"))))
	gpt2 := filepath.Join(dir, "gpt2")
	require.NoError(t, os.CopyFS(gpt2, os.DirFS(filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2"))))
	text := filepath.Join(dir, "a.txt")
	writeFile(t, text, "hello world")
	hf := filepath.Join(dir, "hf")
	writeFile(t, filepath.Join(hf, "config.json"), `{"model_type": "llama"}`)
	writeFile(t, filepath.Join(hf, "blob.bin"), "\x00weights")
	writeFile(t, filepath.Join(hf, "notes.idx"), "an index of something else")
	writeFile(t, filepath.Join(hf, "draft.json"), "not JSON at all")
	for _, tc := range []struct {
		name, tokenizer, merges, prefix, victim, want string
	}{
		{"the tokenizer file", filepath.Join(llama3, "tokenizer.json.gz"), "", filepath.Join(llama3, "tokenizer_config"), filepath.Join(llama3, "tokenizer_config.json"),
			"writes " + filepath.Join(llama3, "tokenizer_config.json") + ", which --tokenizer reads"},
		{"a tokenizer folder's file", llama3, "", filepath.Join(llama3, "tokenizer_config"), filepath.Join(llama3, "tokenizer_config.json"), "which --tokenizer reads"},
		{"a folder's file not there yet", gpt2, "", filepath.Join(gpt2, "encoder"), filepath.Join(gpt2, "encoder.json.gz"), "writes " + filepath.Join(gpt2, "encoder.json") + ", which --tokenizer reads"},
		{"another JSON", llama3, "", filepath.Join(hf, "config"), filepath.Join(hf, "config.json"), "would replace " + filepath.Join(hf, "config.json") + ", which is not a dataset record"},
		{"a file that is not JSON, and no dataset", llama3, "", filepath.Join(hf, "draft"), filepath.Join(hf, "draft.json"), "which is not a dataset record"},
		{"a .bin with no index", llama3, "", filepath.Join(hf, "blob"), filepath.Join(hf, "blob.bin"), "has no index beside it"},
		{"an .idx of something else", llama3, "", filepath.Join(hf, "notes"), filepath.Join(hf, "notes.idx"), "which is not an indexed dataset's index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := os.ReadFile(tc.victim)
			require.NoError(t, err)
			args := []string{"--tokenizer", tc.tokenizer, "--output-prefix", tc.prefix, "--quiet", text}
			err = prepareMain(args, io.Discard, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			after, err := os.ReadFile(tc.victim)
			require.NoError(t, err)
			assert.Equal(t, before, after)
		})
	}
	// A dataset is replaced by a second prepare of its prefix, also when
	// its record no longer matches its files.
	prefix := filepath.Join(dir, "ds")
	for range 2 {
		require.NoError(t, prepareMain([]string{"--tokenizer", llama3, "--output-prefix", prefix, "--quiet", text}, io.Discard, io.Discard))
	}
	f, err := os.OpenFile(prefix+".bin", os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{1, 2})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, prepareMain([]string{"--tokenizer", llama3, "--output-prefix", prefix, "--quiet", text}, io.Discard, io.Discard))
	// And when its record was cut short, or its .bin and .idx are gone.
	require.NoError(t, os.Truncate(prefix+".json", 20))
	require.NoError(t, prepareMain([]string{"--tokenizer", llama3, "--output-prefix", prefix, "--quiet", text}, io.Discard, io.Discard))
	require.NoError(t, os.Remove(prefix+".bin"))
	require.NoError(t, os.Remove(prefix+".idx"))
	require.NoError(t, prepareMain([]string{"--tokenizer", llama3, "--output-prefix", prefix, "--quiet", text}, io.Discard, io.Discard))
	err = prepareMain([]string{"--tokenizer", llama3, "--output-prefix", dir, "--quiet", text}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--output-prefix "+dir+" is a folder; give a path prefix inside it")
}

// A blend of datasets prepared with different tokenizers is refused
// before training, --tokenizer given or not: each part's record names
// its tokenizer, and ids of one would train as another's tokens.
func TestBlendOfTwoTokenizersIsRefused(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "a.txt")
	writeFile(t, text, strings.Repeat("the quick brown fox jumps over the lazy dog. ", 40))
	tokdir := filepath.Join("..", "..", "data", "tokenizer", "testdata")
	gpt2, llama := filepath.Join(dir, "gpt2"), filepath.Join(dir, "llama")
	require.NoError(t, prepareMain([]string{"--tokenizer", filepath.Join(tokdir, "gpt2"), "--output-prefix", gpt2, "--quiet", text}, io.Discard, io.Discard))
	require.NoError(t, prepareMain([]string{"--tokenizer", filepath.Join(tokdir, "llama2"), "--output-prefix", llama, "--quiet", text}, io.Discard, io.Discard))
	err := mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "2", "--run", "--steps", "1", "--eval-batches", "-1",
		"--data", "0.5 " + gpt2 + " 0.5 " + llama})
	require.ErrorIs(t, err, errDataMismatch)
	assert.ErrorContains(t, err, "--data blends "+gpt2+", prepared with the tokenizer ")
	assert.ErrorContains(t, err, "and "+llama+", prepared with ")
}

// A dataset prepared with a tokenizer whose end-of-document token came
// from its tokenizer_config.json, trained with the same tokenizer.json
// without it, is refused naming the token that differs, not "their
// vocabularies or merges", which are the same.
func TestTokenizerMismatchNamesWhatDiffers(t *testing.T) {
	dir := t.TempDir()
	qwen := filepath.Join("..", "..", "data", "tokenizer", "testdata", "qwen3")
	bare := filepath.Join(dir, "bare")
	require.NoError(t, os.MkdirAll(bare, 0o755))
	raw, err := os.ReadFile(filepath.Join(qwen, "tokenizer.json.gz"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(bare, "tokenizer.json.gz"), raw, 0o644))
	text := filepath.Join(dir, "a.txt")
	writeFile(t, text, strings.Repeat("the quick brown fox jumps over the lazy dog. ", 20))
	prefix := filepath.Join(dir, "ds")
	require.NoError(t, prepareMain([]string{"--tokenizer", qwen, "--output-prefix", prefix, "--quiet", text}, io.Discard, io.Discard))
	err = mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "2", "--run", "--steps", "1", "--eval-batches", "-1",
		"--data", prefix, "--tokenizer", bare})
	require.ErrorIs(t, err, errDataMismatch)
	assert.ErrorContains(t, err, `the data ends each document with "<|im_end|>" (151645), and this tokenizer's end-of-document token is "<|endoftext|>" (151643)`)
	assert.NotContains(t, err.Error(), "vocabularies")
}

// A Megatron dataset whose documents were split into sentences (several
// sequences a document) says both counts, and that --split counts
// sequences, rather than calling each sequence a document.
func TestSentenceSplitDatasetSaysBothCounts(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 60, 20, 200, 9)
	// Rewrite its document index: two sequences a document. The header is
	// the magic (9 bytes), the version (8), the dtype (1), the counts of
	// sequences and of document index entries (8 each); then the lengths
	// (4 bytes a sequence), the pointers (8) and the document index (8).
	idx, err := os.ReadFile(prefix + ".idx")
	require.NoError(t, err)
	const header = 9 + 8 + 1
	nseq := int(binary.LittleEndian.Uint64(idx[header:]))
	body := header + 16 + 12*nseq
	out := append([]byte{}, idx[:body]...)
	binary.LittleEndian.PutUint64(out[header+8:], uint64(nseq/2+1))
	for d := 0; d <= nseq; d += 2 {
		out = binary.LittleEndian.AppendUint64(out, uint64(d))
	}
	require.NoError(t, os.WriteFile(prefix+".idx", out, 0o644))
	log, err := captureStderr(t, func() error {
		return mainErr(tokenGPT(t, prefix, "--steps", "1", "--split", "80,20"))
	})
	require.NoError(t, err)
	assert.Contains(t, log, fmt.Sprintf("data %s: 60 sequences (30 documents split into sentences; --split and the shuffle count sequences", prefix))
}

// byteLevelTokenizer writes a byte-level BPE tokenizer.json of the 256
// byte symbols and no merges (ids 0–255, GPT-2's byte-to-symbol map) into
// dir and returns its path.
func byteLevelTokenizer(t *testing.T, dir string) string {
	t.Helper()
	vocab := map[string]int{}
	next := 256
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(next)
			next++
		}
		vocab[string(r)] = b
	}
	raw, err := json.Marshal(map[string]any{
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"added_tokens":  []any{},
	})
	require.NoError(t, err)
	path := filepath.Join(dir, "bytes-tokenizer.json")
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	return path
}

// Weights saved at the data's classes load into any padding of them: a
// --set that differs in vocab alone, both paddings of the classes, is the
// same model (another tp pads the vocabulary otherwise), and gets no note.
func TestPaddedAlike(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"layers=1,vocab=151680", "layers=1,vocab=151808", true},
		{"vocab=151680,layers=1", "layers=1,vocab=151680", true},
		{"layers=1,vocab=151680", "layers=2,vocab=151808", false},
		{"layers=1,vocab=151680", "layers=1,vocab=151000", false},
		{"layers=1,vocab=151680", "layers=1", false},
		{"layers=1,vocab=x", "layers=1,vocab=151680", false},
	} {
		assert.Equal(t, tc.want, paddedAlike(tc.a, tc.b, 151669), "%s vs %s", tc.a, tc.b)
	}
}

// A .gir model that is a pipe is refused as a model.go one is: its batch
// was read from it before any check, and the run hung.
func TestModelDumpThatIsAPipeIsRefused(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "model.gir")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	err := fifotest.OpenWithin(t, fifo, func() error { return mainErr([]string{fifo}) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the model "+fifo+" is not a regular file")
}
