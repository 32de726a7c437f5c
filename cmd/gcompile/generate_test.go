package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data/tokenizer"
	"gcompile/lower"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cuda/fakegpu"
)

// genGPT is a GPT small enough to train in a second, with a position
// table longer than its training sequence (ctx) so generation can run
// past it.
var genGPT = []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--batch", "4", "--max-data-mb", "1"}

// trainedTiny trains genGPT once for every test that needs its weights:
// --save's file and --checkpoint-dir's checkpoint of the same run.
var trainedTiny = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gcompile-generate-")
	if err != nil {
		return "", err
	}
	args := append(append([]string{}, genGPT...), "--run", "--steps", "4", "--save", filepath.Join(dir, "w.safetensors"),
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--metrics", filepath.Join(dir, "metrics.json"))
	return dir, mainErr(args)
})

func tinyWeights(t *testing.T) string {
	t.Helper()
	dir, err := trainedTiny()
	require.NoError(t, err)
	return dir
}

// generateJSON runs gcompile generate with --output json and returns one
// result per prompt.
func generateJSON(t *testing.T, args ...string) []genResult {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, runGenerate(append(args, "--output", "json"), &out, io.Discard))
	return decodeResults(t, &out)
}

// decodeResults reads --output json's objects, one per prompt.
func decodeResults(t *testing.T, r io.Reader) []genResult {
	t.Helper()
	var res []genResult
	dec := json.NewDecoder(r)
	for dec.More() {
		var g genResult
		require.NoError(t, dec.Decode(&g))
		res = append(res, g)
	}
	return res
}

// Sampling draws one uniform number per (seed, prompt, token), so a seed
// gives the same tokens on one device, under tp2 and under dp2, for a
// batch of ragged prompts; --load and --resume of the same run's weights
// give the same tokens; greedy decoding is the argmax.
func TestGenerateIsTheSameUnderEveryPlan(t *testing.T) {
	dir := tinyWeights(t)
	prompts := filepath.Join(t.TempDir(), "prompts.txt")
	require.NoError(t, os.WriteFile(prompts, []byte("func main() {\n\treturn x\n"), 0o644))
	base := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--prompt-file", prompts,
		"--max-new-tokens", "12", "--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--seed", "3"}
	load := append(append([]string{}, base...), "--load", filepath.Join(dir, "w.safetensors"))
	one := generateJSON(t, load...)
	require.Len(t, one, 2)
	for i, r := range one {
		assert.Len(t, r.IDs, 12, "prompt %d runs to --max-new-tokens", i)
		assert.Equal(t, "length", r.Stop)
	}
	assert.Equal(t, []int32{102, 117, 110, 99, 32, 109, 97, 105, 110, 40, 41, 32, 123}, one[0].PromptIDs, "bytes in")
	for _, plan := range [][]string{{"--devices", "2", "--tp", "2"}, {"--devices", "2", "--dp", "2"}, {"--devices", "4", "--tp", "2", "--dp", "2"}} {
		got := generateJSON(t, append(append([]string{}, load...), plan...)...)
		assert.Equal(t, one, got, "plan %v", plan)
	}
	resumed := generateJSON(t, append(append([]string{}, base...), "--resume", filepath.Join(dir, "ckpt"))...)
	assert.Equal(t, one, resumed, "--resume reads the same weights as --load")
	other := generateJSON(t, append(append([]string{}, load...), "--seed", "4")...)
	assert.NotEqual(t, one, other, "another seed draws other tokens")
	// The repetition penalty, applied to the gathered logits, is the same
	// under tp.
	penalised := generateJSON(t, append(append([]string{}, load...), "--repetition-penalty", "3")...)
	assert.NotEqual(t, one, penalised, "--repetition-penalty changes the draws")
	assert.Equal(t, penalised, generateJSON(t, append(append([]string{}, load...), "--repetition-penalty", "3", "--devices", "2", "--tp", "2")...))
}

// A bad request is refused with the rule it breaks, before any token is
// generated.
func TestGenerateBadInput(t *testing.T) {
	dir := tinyWeights(t)
	w := filepath.Join(dir, "w.safetensors")
	set := "layers=1,hidden=32,heads=4,seq=16,ctx=48"
	empty := filepath.Join(t.TempDir(), "empty-line.txt")
	require.NoError(t, os.WriteFile(empty, []byte("one\n\nthree\n"), 0o644))
	llamaDir := t.TempDir()
	llamaW := filepath.Join(llamaDir, "l.safetensors")
	ckptDir := filepath.Join(llamaDir, "ck")
	require.NoError(t, mainErr([]string{llamaModel, "--set", "layers=1,hidden=32,heads=4,kv_heads=2,ffn=48,seq=16", "--batch", "4", "--max-data-mb", "1", "--run", "--steps", "1", "--save", llamaW, "--checkpoint-dir", ckptDir}))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"empty prompt", []string{"--prompt", ""}, `--prompt "": the prompt is empty`},
		{"empty line", []string{"--prompt-file", empty}, "empty-line.txt:2: the prompt is empty"},
		{"no prompt", nil, "give the text with --prompt TEXT or --prompt-file FILE"},
		{"past the table", []string{"--prompt", strings.Repeat("x", 40), "--max-new-tokens", "10"}, "49 positions (the longest prompt, 40 tokens, plus --max-new-tokens 10 less the last, which is not fed back) are past the model's position table of 48 rows: --max-new-tokens 9 or fewer fits"},
		{"a cache past the table", []string{"--prompt", "hi", "--max-new-tokens", "2", "--context", "1000"}, "--context 1000: past the model's position table of 48 rows (the prompts and --max-new-tokens need 3 positions"},
		// Said before the memory its caches would take (terabytes).
		{"far past the table", []string{"--prompt", "hi", "--max-new-tokens", "1000000000"}, "1000000001 positions (the longest prompt, 2 tokens, plus --max-new-tokens 1000000000 less the last, which is not fed back) are past the model's position table of 48 rows"},
		{"past --context", []string{"--prompt", "abcdef", "--context", "8", "--max-new-tokens", "4"}, "the longest prompt has 6 tokens and 4 are to be generated: 9 positions (the last new token is not fed back), past --context 8"},
		{"above the vocabulary", []string{"--prompt", "ok é", "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48,vocab=128"}, "prompt 1's token 4 is id 195, outside the model's vocabulary of 128"},
		{"top-p 0", []string{"--prompt", "a", "--top-p", "0"}, "--top-p 0"},
		// The flag the loader's timeout names is generate's too.
		{"model-timeout 0", []string{"--prompt", "a", "--model-timeout", "0"}, `invalid value "0" for flag -model-timeout: must be positive`},
		{"max-new-tokens past 32 bits", []string{"--prompt", "a", "--max-new-tokens", "9223372036854775807"}, "--max-new-tokens 9223372036854775807: want 1 to 1073741824"},
		{"top-p 1.5", []string{"--prompt", "a", "--top-p", "1.5"}, "--top-p 1.5"},
		{"temperature -1", []string{"--prompt", "a", "--temperature", "-1"}, "--temperature -1"},
		{"repetition penalty 0", []string{"--prompt", "a", "--repetition-penalty", "0"}, "--repetition-penalty 0: want a finite penalty > 0 (1: none)"},
		{"repetition penalty negative", []string{"--prompt", "a", "--repetition-penalty", "-1.2"}, "--repetition-penalty -1.2: want a finite penalty > 0 (1: none)"},
		{"another model", []string{"--prompt", "a", "--load", llamaW}, "no param of the model"},
		{"pack-gpu on cpu", []string{"--prompt", "a", "--pack-gpu"}, "--pack-gpu needs --backend cuda"},
		{"pipeline", []string{"--prompt", "a", "--devices", "2", "--pp", "2"}, "--pp 2: generation runs on data and tensor parallelism"},
		{"context parallel", []string{"--prompt", "a", "--devices", "2", "--cp", "2"}, "--cp 2: context parallelism in generation (a key/value cache split over cp) is not yet supported"},
		// What generation does not run is the cause, not a training plan's
		// rules over --devices and --batch.
		{"prompt-file a folder", []string{"--prompt-file", llamaDir}, "--prompt-file " + llamaDir + " is a folder; it wants a file of prompts, one a line"},
		// Hugging Face's from_pretrained takes a folder: one holding no
		// model.safetensors (or its index) is named, a checkpoint as one.
		{"load a folder of no weights", []string{"--prompt", "a", "--load", llamaDir}, "--load " + llamaDir + " is a folder holding neither model.safetensors nor model.safetensors.index.json"},
		{"load a checkpoint", []string{"--prompt", "a", "--load", ckptDir}, "--load " + ckptDir + " is a checkpoint, which --resume reads"},
		{"load nothing", []string{"--prompt", "a", "--load", filepath.Join(dir, "none.safetensors")}, "--load: stat " + filepath.Join(dir, "none.safetensors") + ": no such file"},
		{"dump a file", []string{"--prompt", "a", "--dump", llamaW}, "--dump " + llamaW + " is a file; it wants a folder"},
		{"expert parallel on one device", []string{"--prompt", "a", "--ep", "2"}, "--ep 2: expert parallelism in generation is not yet supported"},
		{"a context past 2^30", []string{"--prompt", "a", "--context", "4611686018427387904"}, "--context 4611686018427387904: want a number of positions up to 1073741824"},
		{"cache does not fit", []string{"--prompt", "abc", "--max-new-tokens", "40", "--device-memory", "90KiB"},
			"key/value cache is 10.5 KiB per device: 2 caches (k and v of 1 layers) of f32[1,4,42,8] [batch, kv_heads, context, head_dim] = 5.2 KiB each"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{gptModel, "--set", set, "--max-new-tokens", "8"}
			if !strings.Contains(strings.Join(tc.args, " "), "--load") {
				args = append(args, "--load", w)
			}
			var out bytes.Buffer
			err := runGenerate(append(args, tc.args...), &out, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, out.String(), "nothing is generated")
		})
	}
	// A --set the model does not read is the model's error, the same for
	// every program: said without a program's name.
	err := runGenerate([]string{gptModel, "--set", set + ",bogus=1", "--load", w, "--prompt", "a"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "--set: unknown model parameter(s) bogus"), err.Error())
	// A pipeline is refused for itself, not for microbatches it was given
	// by default (a pipeline's microbatches follow from its schedule).
	err = runGenerate([]string{gptModel, "--set", set, "--load", w, "--prompt", "a", "--devices", "2", "--pp", "2"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "--microbatches")
	// Axes that do not make --devices are said once, not beside a --batch
	// rule over a batch no one gave (the prompts set it).
	err = runGenerate([]string{gptModel, "--set", set, "--load", w, "--prompt", "a", "--devices", "3", "--dp", "2"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tp·pp·dp·ep·cp = 1·1·2·1·1 = 2 must equal --devices 3")
	assert.NotContains(t, err.Error(), "--batch")
	// A model file that is not there is named as such, not as the prefill
	// program's failure.
	err = runGenerate([]string{filepath.Join(t.TempDir(), "nope.go"), "--prompt", "a", "--load", w}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "generate: model file: stat ")
	assert.NotContains(t, err.Error(), "prefill")
	// A prompt that fills the position table still gets its one new
	// token, which is sampled and never fed back (it was refused as 49
	// positions of 48).
	var out bytes.Buffer
	require.NoError(t, runGenerate([]string{gptModel, "--set", set, "--load", w, "--prompt", strings.Repeat("x", 48), "--max-new-tokens", "1", "--output", "json"}, &out, io.Discard))
	assert.Contains(t, out.String(), `"ids":[`)
}

// A training --load of weights another --set of the model trained says
// so, as generate and eval do: with a note where they load (other heads,
// the same shapes), and with the failure where they do not (more layers).
func TestTrainingLoadNotesWeightsOfAnotherModel(t *testing.T) {
	w := filepath.Join(tinyWeights(t), "w.safetensors")
	set := "layers=1,hidden=32,heads=4,seq=16,ctx=48"
	run := func(set string) (string, error) {
		return captureStderr(t, func() error {
			return mainErr([]string{gptModel, "--set", set, "--load", w, "--run", "--steps", "1", "--batch", "4", "--max-data-mb", "1", "--eval-batches", "-1"})
		})
	}
	log, err := run(set)
	require.NoError(t, err)
	assert.NotContains(t, log, "note: --load")
	log, err = run("layers=1,hidden=32,heads=2,seq=16,ctx=48")
	require.NoError(t, err)
	assert.Contains(t, log, `note: --load `+w+`: the weights are of model "gpt" trained with --set "`+set+`"`)
	_, err = run("layers=2,hidden=32,heads=4,seq=16,ctx=48")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "of the model's")
	assert.Contains(t, err.Error(), `the weights are of model "gpt" trained with --set "`+set+`"`)
	assert.NotContains(t, err.Error(), "they load if their shapes fit")
}

// Weights gcompile saved record the model that trained them: generating
// from them with a model of other maths but the same param shapes
// (another activation) is noted, naming both --set lists; the same model
// is not.
func TestGenerateNotesWeightsOfAnotherModel(t *testing.T) {
	w := filepath.Join(tinyWeights(t), "w.safetensors")
	set := "layers=1,hidden=32,heads=4,seq=16,ctx=48"
	for _, tc := range []struct {
		set  string
		note bool
	}{{set, false}, {set + ",activation=relu", true}} {
		var out, log bytes.Buffer
		require.NoError(t, runGenerate([]string{gptModel, "--set", tc.set, "--load", w, "--prompt", "a", "--max-new-tokens", "1"}, &out, &log))
		if !tc.note {
			assert.NotContains(t, log.String(), "note: --load", tc.set)
			continue
		}
		assert.Contains(t, log.String(), `note: --load `+w+`: the weights are of model "gpt" trained with --set "`+set+`"`)
		assert.Contains(t, log.String(), `with --set "`+tc.set+`" this model is another`)
	}
}

// gcompile eval of a run's --save weights gives the held-out loss the run
// reported at its end, to the last digit on the same plan, and under
// tensor and data parallelism to 1e-6.
func TestEvalGivesTheRunsHeldOutLoss(t *testing.T) {
	dir := tinyWeights(t)
	m := readMetrics(t, filepath.Join(dir, "metrics.json"))
	require.NotEmpty(t, m.Eval)
	want := m.Eval[len(m.Eval)-1].Loss
	eval := func(extra ...string) evalResult {
		t.Helper()
		out := captureStdout(t, func() {
			require.NoError(t, mainErr(append(append([]string{"eval"}, genGPT...), append([]string{"--load", filepath.Join(dir, "w.safetensors")}, extra...)...)))
		})
		var r evalResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), "%s", out)
		require.NotNil(t, r.Loss)
		return r
	}
	var r evalResult
	// Its progress to a pipe is a line a batch, not carriage returns.
	log, err := captureStderr(t, func() error { r = eval(); return nil })
	require.NoError(t, err)
	assert.NotContains(t, log, "\r")
	assert.Contains(t, log, "\neval batch 8/8  loss ")
	assert.Equal(t, want, *r.Loss, "the same figure as the run's last evaluation")
	assert.Equal(t, 8, r.Batches, "training's --eval-batches default")
	for _, plan := range [][]string{{"--devices", "2", "--tp", "2"}, {"--devices", "2", "--dp", "2"}} {
		assert.InDelta(t, want, *eval(plan...).Loss, 1e-6, "plan %v", plan)
	}
	err = mainErr(append(append([]string{"eval"}, genGPT...), "--load", filepath.Join(dir, "w.safetensors"), "--eval-batches", "0"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--eval-batches 0 (the whole held-out split) needs a token dataset")
	err = mainErr(append(append([]string{"eval"}, genGPT...), "--save", "x.safetensors"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "give the weights with --load")
	assert.Contains(t, err.Error(), "--save belongs to training")
	// Both weights' flags: one error, eval's, not training's too.
	err = mainErr(append(append([]string{"eval"}, genGPT...), "--load", filepath.Join(dir, "w.safetensors"), "--resume", dir))
	require.Error(t, err)
	assert.Equal(t, "eval: --load and --resume both give the weights; give one", err.Error())
	err = mainErr(append(append([]string{"eval"}, genGPT...), "--load", filepath.Join(dir, "w.safetensors"), "--metrics", "m.json", "--run"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--metrics records a training run; eval prints the held-out loss and writes no file")
	assert.Contains(t, err.Error(), "--run belongs to training")
	for _, flag := range [][]string{{"--lr", "0.5"}, {"--optimizer", "sgd"}, {"--seed", "7"}, {"--clip", "0.5"}, {"--recompute", "full"}, {"--plan-trace", "p.json"},
		{"--grad-reduce-dtype", "fp16"}} {
		err = mainErr(append(append(append([]string{"eval"}, genGPT...), "--load", filepath.Join(dir, "w.safetensors")), flag...))
		require.Error(t, err, "%v", flag)
		// Said alone: not the training rules over the value too (fp16
		// reductions want fp16 precision).
		assert.Equal(t, "eval: "+flag[0]+" changes only training (the update, the backward or the run's files); eval runs the forward of the weights given, so leave it out", err.Error())
	}
	out := captureStdout(t, func() {
		require.NoError(t, mainErr(append(append([]string{"eval"}, genGPT...), "--load", filepath.Join(dir, "w.safetensors"), "--help-model")))
	})
	assert.NotContains(t, out, "\"loss\"", "--help-model lists the model's parameters and evaluates nothing")
}

// A byte-level model's ids past the bytes (a vocabulary set above 256)
// have no byte: the text shows each as U+FFFD, not as a byte it wraps to.
func TestByteDecodeMarksIdsPastTheBytes(t *testing.T) {
	assert.Equal(t, "a\uFFFDb\uFFFD", codec{}.decode([]int32{'a', 256, 'b', 259, 7}, 7))
	assert.Equal(t, "\x00\xff", codec{}.decode([]int32{0, 255}, -1))
}

// --stop ends a prompt's text where a stop string begins (the string is
// not kept), and says so; the streamed text is the same text. The text is
// compared as printed (a byte-level model's bytes need not be UTF-8,
// which JSON would replace).
func TestGenerateStopsAtAStopString(t *testing.T) {
	dir := tinyWeights(t)
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--load", filepath.Join(dir, "w.safetensors"),
		"--prompt", "x := ", "--max-new-tokens", "24", "--temperature", "0.7", "--seed", "5"}
	text := func(extra ...string) string {
		var out bytes.Buffer
		require.NoError(t, runGenerate(append(append([]string{}, args...), extra...), &out, io.Discard))
		return strings.TrimSuffix(strings.TrimPrefix(out.String(), "x := "), "\n")
	}
	full := text()
	require.GreaterOrEqual(t, len(full), 8)
	stop := full[5:7]
	cut := strings.Index(full, stop)
	assert.Equal(t, full[:cut], text("--stop", stop))
	all := generateJSON(t, args...)
	got := generateJSON(t, append(append([]string{}, args...), "--stop", stop)...)
	assert.Equal(t, "stop", got[0].Stop)
	assert.Equal(t, "length", all[0].Stop)
	assert.Less(t, len(got[0].IDs), len(all[0].IDs))
	assert.Equal(t, all[0].IDs[:len(got[0].IDs)], got[0].IDs, "the same tokens up to the one that completed the stop string")
}

// With a Hugging Face tokenizer, prompts are encoded and the new tokens
// decoded through it, the model's vocabulary is the tokenizer's padded as
// in training (the file --save trimmed to 50257 rows loads into 50304),
// and the padding classes, masked out of the logits, are never drawn.
func TestGenerateThroughATokenizer(t *testing.T) {
	dir := t.TempDir()
	// A copy of GPT-2's pair, which the runs record and which is moved
	// away below.
	gpt2 := filepath.Join(dir, "gpt2")
	require.NoError(t, os.CopyFS(gpt2, os.DirFS(filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2"))))
	tok := []string{"--tokenizer", filepath.Join(gpt2, "encoder.json.gz"), "--merges", filepath.Join(gpt2, "vocab.bpe.gz")}
	docs := filepath.Join(dir, "docs.jsonl")
	var doc strings.Builder
	for i := range 12 {
		fmt.Fprintf(&doc, "{\"text\": \"Document %d says hello to the world, again and again.\"}\n", i)
	}
	require.NoError(t, os.WriteFile(docs, []byte(doc.String()), 0o644))
	prefix := filepath.Join(dir, "prepared")
	var stdout, stderr strings.Builder
	require.NoError(t, prepareMain(append(append([]string{}, tok...), "--output-prefix", prefix, "--quiet", docs), &stdout, &stderr))
	w := filepath.Join(dir, "w.safetensors")
	set := []string{"--set", "layers=1,hidden=32,heads=2,seq=16,ctx=64"}
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(append([]string{gptModel, "--batch", "4", "--run", "--steps", "2", "--eval-batches", "1", "--data", prefix, "--split", "60,40", "--save", w, "--checkpoint-dir", ck}, set...), tok...)))

	// Training resumed without the tokenizer is refused, naming the
	// files the run read.
	err := mainErr(append([]string{gptModel, "--batch", "4", "--run", "--steps", "3", "--eval-batches", "1", "--data", prefix, "--split", "60,40", "--resume", ck, "--checkpoint-dir", ck}, set...))
	assert.ErrorContains(t, err, "this one none (the run read --tokenizer "+tok[1]+" --merges "+tok[3]+")")

	// Another tokenizer of as many ids (two merges swapped) is not the
	// run's: its ids would be read as other text.
	other := filepath.Join(dir, "other")
	require.NoError(t, os.MkdirAll(other, 0o755))
	gunzipTo(t, tok[1], filepath.Join(other, "encoder.json"))
	gunzipTo(t, tok[3], filepath.Join(other, "vocab.bpe"))
	merges, err := os.ReadFile(filepath.Join(other, "vocab.bpe"))
	require.NoError(t, err)
	lines := strings.Split(string(merges), "\n")
	lines[len(lines)-3], lines[len(lines)-2] = lines[len(lines)-2], lines[len(lines)-3]
	writeFile(t, filepath.Join(other, "vocab.bpe"), strings.Join(lines, "\n"))
	otherTok := []string{"--tokenizer", filepath.Join(other, "encoder.json"), "--merges", filepath.Join(other, "vocab.bpe")}
	err = runGenerate(append(append([]string{gptModel, "--resume", ck, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), otherTok...), io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--tokenizer "+filepath.Join(other, "encoder.json")+" is not the tokenizer the checkpoint's run trained with")
	// A tokenizer of another size (Llama 2's 32,000 ids) is named as
	// such too, not as another model file (its vocabulary pads another
	// table, which the model's check saw first).
	llama2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2")
	err = runGenerate(append(append([]string{gptModel, "--resume", ck, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), "--tokenizer", llama2), io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--tokenizer "+llama2+" is not the tokenizer the checkpoint's run trained with")
	// The --save weights record it too: --load is refused alike.
	err = runGenerate(append(append([]string{gptModel, "--load", w, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), otherTok...), io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--tokenizer "+filepath.Join(other, "encoder.json")+" is not the tokenizer the weights' run ("+w+") trained with")
	// The same tokens without the record of their tokenizer (PREFIX.json).
	bare := filepath.Join(dir, "bare")
	for _, ext := range []string{".bin", ".idx"} {
		b, err := os.ReadFile(prefix + ext)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(bare+ext, b, 0o644))
	}
	err = mainErr(append(append([]string{"eval", gptModel, "--batch", "4", "--resume", ck, "--data", bare, "--split", "60,40"}, set...), otherTok...))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not the tokenizer the checkpoint's run trained with")
	err = mainErr(append(append([]string{"eval", gptModel, "--batch", "4", "--load", w, "--data", bare, "--split", "60,40"}, set...), otherTok...))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not the tokenizer the weights' run ("+w+") trained with")
	// With no tokenizer, the one the run recorded is read, as a note
	// says, and the output is what it gives: the same ids as with the
	// flags; gone, it is named as what to give, not the model file.
	small := tokenDataset(t, dir, 40, 20, 100, 3)
	require.NoError(t, mainErr(append([]string{"eval", gptModel, "--batch", "4", "--resume", ck, "--data", small, "--split", "60,40"}, set...)))
	prompt := []string{gptModel, "--prompt", "Document 3 says", "--max-new-tokens", "4", "--output", "json"}
	for _, from := range [][]string{{"--resume", ck}, {"--load", w}} {
		var given, taken, note strings.Builder
		require.NoError(t, runGenerate(slices.Concat(prompt, from, set, tok), &given, io.Discard))
		require.NoError(t, runGenerate(slices.Concat(prompt, from, set), &taken, &note))
		assert.Equal(t, given.String(), taken.String(), "%v", from)
		assert.Contains(t, note.String(), "note: --tokenizer "+tok[1]+" --merges "+tok[3]+": the tokenizer the run trained with, recorded in the ")
	}
	require.NoError(t, os.Rename(gpt2, gpt2+"-moved"))
	err = mainErr(append([]string{"eval", gptModel, "--batch", "4", "--resume", ck, "--data", small, "--split", "60,40"}, set...))
	assert.ErrorContains(t, err, "the checkpoint's run trained with a tokenizer (fingerprint ")
	assert.ErrorContains(t, err, "give it with --tokenizer (the run read "+tok[1]+" with --merges "+tok[3]+", which is not there now)")
	err = runGenerate(slices.Concat(prompt, []string{"--load", w, "--set", "layers=1,hidden=32,heads=2,seq=16,ctx=64,vocab=50304"}), io.Discard, io.Discard)
	assert.ErrorContains(t, err, "the weights' run ("+w+") trained with a tokenizer (fingerprint ", "a --set vocab of the tokenizer's size reads its ids as bytes no more")
	require.NoError(t, os.Rename(gpt2+"-moved", gpt2))
	// Exported weights keep the data's identity as --save's do: loaded
	// without --tokenizer, the one export wrote beside them is read; with
	// another, it is refused as such.
	exported := filepath.Join(dir, "export", "model.safetensors")
	require.NoError(t, mainErr(append([]string{"export", ck, "--out", exported}, tok...)))
	exportDir := filepath.Dir(exported)
	var note strings.Builder
	require.NoError(t, runGenerate(append([]string{gptModel, "--load", exportDir, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), io.Discard, &note), "the folder, as from_pretrained takes it")
	assert.Contains(t, note.String(), "note: --tokenizer "+filepath.Join(exportDir, "vocab.json")+" --merges "+filepath.Join(exportDir, "merges.txt")+": the tokenizer the run trained with, beside the weights")
	err = runGenerate(append(append([]string{gptModel, "--load", exported, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), otherTok...), io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not the tokenizer the weights' run ("+exported+") trained with")
	require.NoError(t, runGenerate(append(append([]string{gptModel, "--load", exported, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), tok...), io.Discard, io.Discard))
	// Sharded, the folder's index is read, and its shards' record.
	shardDir := filepath.Join(dir, "sharded")
	require.NoError(t, mainErr(append([]string{"export", ck, "--out", filepath.Join(shardDir, "model.safetensors"), "--max-shard-size", "2MB"}, tok...)))
	require.FileExists(t, filepath.Join(shardDir, "model.safetensors.index.json"))
	note.Reset()
	require.NoError(t, runGenerate(append([]string{gptModel, "--load", shardDir, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), io.Discard, &note))
	assert.Contains(t, note.String(), "note: --tokenizer "+filepath.Join(shardDir, "vocab.json")+" --merges "+filepath.Join(shardDir, "merges.txt")+": the tokenizer the run trained with, beside the weights")
	err = runGenerate(append(append([]string{gptModel, "--load", shardDir, "--prompt", "Document 3 says", "--max-new-tokens", "2"}, set...), otherTok...), io.Discard, io.Discard)
	assert.ErrorContains(t, err, "is not the tokenizer the weights' run ("+filepath.Join(shardDir, "model.safetensors.index.json")+") trained with")

	res := generateJSON(t, append(append([]string{gptModel, "--load", w, "--prompt", "Document 3 says", "--max-new-tokens", "30", "--seed", "2"}, set...), tok...)...)
	require.Len(t, res, 1)
	tk, err := tokenizer.Load(tok[1], tok[3])
	require.NoError(t, err)
	assert.Equal(t, tk.Encode([]byte("Document 3 says")), res[0].PromptIDs)
	for _, id := range res[0].IDs {
		assert.Less(t, id, int32(50257), "a padding class was drawn")
	}
	eos, _ := tk.EOS()
	ids := res[0].IDs
	if res[0].Stop == "eos" {
		assert.Equal(t, eos, ids[len(ids)-1])
		ids = ids[:len(ids)-1]
	}
	// Bytes that are not UTF-8 become U+FFFD, one per ill-formed part.
	assert.Equal(t, lossy(string(tk.Decode(ids))), res[0].Text)

	// export --tokenizer writes the run's tokenizer beside the weights as
	// AutoTokenizer reads it (GPT-2's pair as vocab.json and merges.txt,
	// unzipped), with its end and start ids in config.json; another
	// tokenizer is refused before anything is written.
	out := filepath.Join(dir, "hf", "model.safetensors")
	err = mainErr([]string{"export", ck, "--out", out, "--tokenizer", otherTok[1], "--merges", otherTok[3]})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not the tokenizer the checkpoint's run trained with")
	assert.NoDirExists(t, filepath.Dir(out), "nothing written")
	// Without --tokenizer it writes the one the run recorded, a note
	// says; gone, a note says what to give.
	log, err := captureStderr(t, func() error { return mainErr([]string{"export", ck, "--out", out}) })
	require.NoError(t, err)
	assert.Contains(t, log, "note: --tokenizer "+tok[1]+" --merges "+tok[3]+": the tokenizer the run trained with, recorded in the checkpoint")
	assert.Contains(t, log, "wrote vocab.json, merges.txt, tokenizer_config.json in "+filepath.Dir(out))
	require.NoError(t, os.Rename(gpt2, gpt2+"-moved"))
	log, err = captureStderr(t, func() error {
		return mainErr([]string{"export", ck, "--out", filepath.Join(dir, "bare-export", "model.safetensors")})
	})
	require.NoError(t, os.Rename(gpt2+"-moved", gpt2))
	require.NoError(t, err)
	assert.Contains(t, log, "note: no tokenizer written: give export the run's --tokenizer (it read "+tok[1]+" with --merges "+tok[3]+", which is not there now)")
	log, err = captureStderr(t, func() error { return mainErr([]string{"export", ck, "--out", out, tok[0], tok[1], tok[2], tok[3]}) })
	require.NoError(t, err)
	assert.Contains(t, log, "wrote vocab.json, merges.txt, tokenizer_config.json in "+filepath.Dir(out))
	assert.JSONEq(t, `{"tokenizer_class": "GPT2Tokenizer"}`, string(readBytes(t, filepath.Join(filepath.Dir(out), "tokenizer_config.json"))),
		"the pair alone: AutoTokenizer is told its class, not left to config.json's model_type")
	for name, src := range map[string]string{"vocab.json": tok[1], "merges.txt": tok[3]} {
		gunzipTo(t, src, filepath.Join(dir, "want-"+name))
		assert.Equal(t, readBytes(t, filepath.Join(dir, "want-"+name)), readBytes(t, filepath.Join(filepath.Dir(out), name)), name)
	}
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(readBytes(t, filepath.Join(filepath.Dir(out), "config.json")), &cfg))
	assert.EqualValues(t, eos, cfg["eos_token_id"])
	bos, _ := tk.BOS()
	assert.EqualValues(t, bos, cfg["bos_token_id"])
	assert.EqualValues(t, 50257, cfg["vocab_size"])
	err = mainErr([]string{"export", ck, "--out", out, "--merges", tok[3]})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--merges "+tok[3]+" goes with --tokenizer vocab.json, which was not given")
}

// On the CUDA backend (the fake GPU: the kernels in the emulator),
// generation gives the CPU backend's tokens, one GPU per device through
// NCCL under tp2.
func TestGenerateOnTheCUDABackend(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the programs in the kernel emulator (seconds); skipped with -short")
	}
	dir := tinyWeights(t)
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--load", filepath.Join(dir, "w.safetensors"),
		"--prompt", "func main() {", "--max-new-tokens", "6", "--temperature", "0", "--devices", "2", "--tp", "2"}
	want := generateJSON(t, args...)
	fakegpu.Install(t)
	t.Setenv("GCOMPILE_FAKEGPU_DEVICES", "2")
	t.Setenv("GCOMPILE_CACHE", t.TempDir())
	got := generateJSON(t, append(args, "--backend", "cuda")...)
	assert.Equal(t, want, got)
	t.Setenv("GCOMPILE_LIBCUDA", filepath.Join(t.TempDir(), "libcuda.so.1"))
	err := runGenerate(append(args, "--backend", "cuda"), io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot load CUDA driver from GCOMPILE_LIBCUDA")
}

// On a token dataset, gcompile eval --eval-batches 0 reads the whole
// held-out split (its samples over the batch): the mean of as many
// batches as a run evaluating that many would report; --resume reads
// the params of a training checkpoint under another plan.
func TestEvalOnATokenDataset(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 200, 40, 256, 3)
	base := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16", "--batch", "4", "--data", prefix, "--split", "80,20",
		"--data-cache-dir", filepath.Join(dir, "cache")}
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(append([]string{}, base...), "--run", "--steps", "3", "--checkpoint-dir", ck)))
	eval := func(extra ...string) evalResult {
		t.Helper()
		out := captureStdout(t, func() {
			require.NoError(t, mainErr(append(append([]string{"eval"}, base...), append([]string{"--resume", ck}, extra...)...)))
		})
		var r evalResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), "%s", out)
		require.NotNil(t, r.Loss)
		return r
	}
	// Another split than the training's is evaluated, and said.
	log, err := captureStderr(t, func() error {
		out := captureStdout(t, func() {
			require.NoError(t, mainErr(append(append([]string{"eval"}, base...), "--resume", ck, "--split", "70,30")))
		})
		require.NotEmpty(t, out)
		return nil
	})
	require.NoError(t, err)
	assert.Contains(t, log, "note: the checkpoint was trained on ")
	assert.NotContains(t, log, "epochs of the training split", "evaluation trains nothing")
	assert.Contains(t, log, "split 0.8,0.2,0; this evaluation reads ")
	whole := eval("--eval-batches", "0")
	require.Greater(t, whole.Batches, 8, "the held-out split holds more than training's 8 batches")
	same := eval("--eval-batches", strconv.Itoa(whole.Batches), "--devices", "2", "--tp", "2")
	assert.InDelta(t, *whole.Loss, *same.Loss, 1e-6, "the whole split is that many batches, under any plan")
	assert.InDelta(t, math.Exp(*whole.Loss), *whole.Perplexity, 1e-9)
}

// --bos begins every prompt with the tokenizer's BOS, as Hugging Face's
// Llama tokenizers do (Llama 2's <s> is id 1); a byte-level model has none.
func TestGenerateWithBOS(t *testing.T) {
	dir := t.TempDir()
	w := filepath.Join(dir, "w.safetensors")
	set := []string{"--set", "layers=1,hidden=32,heads=2,seq=16,ctx=48,vocab=32000"}
	require.NoError(t, mainErr(append([]string{gptModel, "--batch", "4", "--max-data-mb", "1", "--run", "--steps", "1", "--eval-batches", "-1", "--save", w}, set...)))
	// Weights of Llama 2's vocabulary from elsewhere: without the record
	// of their run on bytes, which refuses any tokenizer.
	ts, _, err := checkpoint.Load(w)
	require.NoError(t, err)
	require.NoError(t, checkpoint.Save(w, ts, nil))
	llama2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2")
	res := generateJSON(t, append([]string{gptModel, "--load", w, "--prompt", "Hello", "--max-new-tokens", "2", "--tokenizer", llama2, "--bos"}, set...)...)
	require.Len(t, res, 1)
	require.NotEmpty(t, res[0].PromptIDs)
	assert.Equal(t, int32(1), res[0].PromptIDs[0])
	plain := generateJSON(t, append([]string{gptModel, "--load", w, "--prompt", "Hello", "--max-new-tokens", "2", "--tokenizer", llama2}, set...)...)
	assert.Equal(t, res[0].PromptIDs[1:], plain[0].PromptIDs)
	err = runGenerate([]string{gptModel, "--load", w, "--prompt", "Hello", "--bos"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--bos needs --tokenizer")
}

// Megatron-LM pads the vocabulary to a multiple of the divisor times tp,
// so a checkpoint trained under tp 2 on 300 token ids has 512 rows where
// tp 1 would make 384: evaluating or resuming it under tp 1 takes the
// checkpoint's padding (its rows past the ids are masked out of the loss),
// where it used to fail on the table's shape or the model's fingerprint.
func TestACheckpointKeepsItsVocabularyPaddingUnderAnotherTP(t *testing.T) {
	dir := t.TempDir()
	prefix := tokenDataset(t, dir, 200, 40, 300, 4)
	base := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16", "--batch", "4", "--data", prefix, "--split", "80,20",
		"--data-cache-dir", filepath.Join(dir, "cache")}
	ck := filepath.Join(dir, "ck")
	trained := runMetrics(t, append(slices.Clone(base), "--run", "--steps", "2", "--eval-batches", "2", "--devices", "2", "--tp", "2", "--checkpoint-dir", ck)...)
	assert.Contains(t, trained.Config["set"], "vocab=512")
	for _, plan := range [][]string{nil, {"--devices", "2", "--tp", "2"}} {
		out := captureStdout(t, func() {
			require.NoError(t, mainErr(append(append([]string{"eval"}, base...), append([]string{"--resume", ck, "--eval-batches", "2"}, plan...)...)))
		})
		var r evalResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), "%s", out)
		require.NotNil(t, r.Loss)
		assert.InDelta(t, trained.Eval[len(trained.Eval)-1].Loss, *r.Loss, 1e-6, "eval under %v", plan)
	}
	resumed := runMetrics(t, append(slices.Clone(base), "--run", "--steps", "3", "--eval-batches", "2", "--resume", ck, "--checkpoint-dir", filepath.Join(dir, "ck1"))...)
	require.Len(t, resumed.Steps, 1, "step 3 under tp 1")
}

// eval and generate refuse a checkpoint of another model, as a resumed
// training run does: eight heads of four wide hold the same params as
// four of eight, but compute something else, and used to load and give
// another loss and other text without a word. The model it was trained as
// evaluates at any batch.
func TestEvalAndGenerateRefuseACheckpointOfAnotherModel(t *testing.T) {
	ck := filepath.Join(tinyWeights(t), "ckpt")
	other := []string{gptModel, "--set", "layers=1,hidden=32,heads=8,seq=16,ctx=48", "--batch", "4", "--max-data-mb", "1"}
	err := mainErr(append(append([]string{"eval"}, other...), "--resume", ck))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `the checkpoint is of model "gpt" trained with --set "layers=1,hidden=32,heads=4,seq=16,ctx=48"`)
	assert.Contains(t, err.Error(), "give the --set it was trained with")
	err = runGenerate(append(slices.Clone(other[:3]), "--resume", ck, "--prompt", "abc", "--max-new-tokens", "2"), io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `the checkpoint is of model "gpt"`)
	captureStdout(t, func() {
		require.NoError(t, mainErr(append(append([]string{"eval"}, genGPT...), "--resume", ck, "--batch", "8")))
	})
	// The same --set with another model file: the file is named, not the
	// --set the checkpoint already has.
	src, err := os.ReadFile(gptModel)
	require.NoError(t, err)
	relu := filepath.Join(t.TempDir(), "gpt", "model.go") // the model's name is its folder's
	require.NoError(t, os.MkdirAll(filepath.Dir(relu), 0o755))
	require.NoError(t, os.WriteFile(relu, bytes.Replace(src, []byte(`"activation", "gelu",`), []byte(`"activation", "relu",`), 1), 0o644))
	err = mainErr([]string{"eval", relu, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--batch", "4", "--max-data-mb", "1", "--resume", ck})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "with the same --set \"layers=1,hidden=32,heads=4,seq=16,ctx=48\" is another model")
	assert.Contains(t, err.Error(), "give the model file the checkpoint was trained with")
	// The model file copied to another folder builds a model of that
	// folder's name: the error says so, not "another --set".
	copyDir := filepath.Join(t.TempDir(), "y")
	require.NoError(t, os.MkdirAll(copyDir, 0o755))
	copied := filepath.Join(copyDir, "model.go")
	require.NoError(t, os.WriteFile(copied, src, 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"eval", copied, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--batch", "4", "--max-data-mb", "1", "--resume", ck}, copied + ` builds model "y"`},
		{[]string{copied, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--batch", "4", "--max-data-mb", "1", "--run", "--steps", "5", "--resume", ck,
			"--checkpoint-dir", filepath.Join(t.TempDir(), "ck")}, `this run's is model "y"`},
	} {
		err = mainErr(tc.args)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want, tc.args[0])
		assert.Contains(t, err.Error(), `another model, or the`, tc.args[0])
		assert.Contains(t, err.Error(), `model file in a folder of another name (a model.go's model is named by its folder`, tc.args[0])
		assert.Contains(t, err.Error(), `run it from a folder named "gpt"`, tc.args[0])
	}
	// A tokenizer given for a run on bytes: its ids are bytes, said so,
	// not a --set to give.
	gpt2 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "gpt2")
	err = runGenerate([]string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--resume", ck, "--prompt", "abc", "--max-new-tokens", "2",
		"--tokenizer", filepath.Join(gpt2, "encoder.json.gz"), "--merges", filepath.Join(gpt2, "vocab.bpe.gz")}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the checkpoint's run trained on bytes, one byte per token: its ids are bytes, which no tokenizer reads (leave --tokenizer out)")
	assert.NotContains(t, err.Error(), "give the --set it was trained with")
	// A dump among the checkpoints is refused before it is written: one
	// named like a step's folder made that step unloadable.
	steps, err := filepath.Glob(filepath.Join(ck, "step-*"))
	require.NoError(t, err)
	require.NotEmpty(t, steps)
	for _, dump := range []string{filepath.Join(ck, "step-99999999"), filepath.Join(steps[0], "dump")} {
		err = runGenerate(append(slices.Clone(genGPT[:3]), "--resume", ck, "--prompt", "abc", "--max-new-tokens", "2", "--dump", dump), io.Discard, io.Discard)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--dump "+dump+" is inside --resume "+ck, dump)
		assert.NoDirExists(t, dump)
	}
}

// A --batch that dp does not divide is rounded up, and the log says so,
// where it used to change without a word; the tokens are the same.
func TestGenerateSaysItRoundsTheBatch(t *testing.T) {
	dir := tinyWeights(t)
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--prompt", "abc", "--max-new-tokens", "3",
		"--temperature", "0", "--load", filepath.Join(dir, "w.safetensors")}
	var log bytes.Buffer
	require.NoError(t, runGenerate(append(slices.Clone(args), "--devices", "2", "--dp", "2", "--batch", "1", "--output", "json"), io.Discard, &log))
	assert.Contains(t, log.String(), "generate: 1 sequences a batch rounded up to 2, a multiple of dp=2")
	assert.Contains(t, log.String(), "prefill (3 tokens × 2 sequences) and decode (1 token × 2 sequences)")
}

// Started by a launcher as one of several processes, generate runs on
// rank 0 only: the others step aside, printing no text, rather than each
// generating the same; a broken launcher environment is refused.
func TestGenerateRunsOnRankZeroOfALaunchersWorld(t *testing.T) {
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "localhost")
	var out, log bytes.Buffer
	require.NoError(t, runGenerate([]string{gptModel, "--load", "absent.safetensors", "--prompt", "a"}, &out, &log))
	assert.Empty(t, out.String())
	assert.Contains(t, log.String(), "rank 1 of 2 (torchrun) leaves generation to rank 0")
	// An environment that names no world whole (no MASTER_ADDR, as a
	// training run refuses it) cannot say which rank generates: refused,
	// not every process generating.
	t.Setenv("MASTER_ADDR", "")
	err := runGenerate([]string{gptModel, "--load", "absent.safetensors", "--prompt", "a"}, &out, &log)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "generate: the launcher's environment: ")
	assert.Contains(t, err.Error(), "MASTER_ADDR")
}

// The text after a prompt is what the prompt and its continuation decode
// to together, less the prompt: a SentencePiece decoder strips the
// leading space of a text, so decoded alone "▁main" after "func" lost
// its space ("funcmain"), and a stop string beginning with it never
// matched.
func TestContinuationKeepsTheSpaceAtTheJoin(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2"), "")
	require.NoError(t, err)
	tx := codec{tok: tok}
	ids := tx.encode("func main() { alpha 6")
	require.Greater(t, len(ids), 3)
	for cut := 1; cut < len(ids); cut++ {
		prompt, got := ids[:cut], ids[cut:]
		assert.Equal(t, tx.decode(ids, -1), tx.decode(prompt, -1)+tx.continuation(prompt, got, -1), "cut at %d", cut)
	}
	assert.Equal(t, " main() { alpha 6", tx.continuation(ids[:1], ids[1:], -1))
	// The end-of-sequence id ends the text, as decode's does.
	eos, ok := tok.EOS()
	require.True(t, ok)
	assert.Equal(t, " main() { alpha 6", tx.continuation(ids[:1], append(slices.Clone(ids[1:]), eos), eos))
	// Bytes: the continuation is its own bytes.
	assert.Equal(t, "bc", codec{}.continuation([]int32{'a'}, []int32{'b', 'c'}, -1))
}

// With --bos an empty prompt is the BOS token alone, which a model can
// continue (as Hugging Face generates from <s>); without it, it is
// refused, naming its line.
func TestEmptyPromptLineNeedsBOS(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.txt")
	require.NoError(t, os.WriteFile(file, []byte("one\n\nthree\n"), 0o644))
	g := &genConfig{promptFile: file}
	_, err := g.readPrompts()
	assert.ErrorContains(t, err, "p.txt:2: the prompt is empty")
	g.bos = true
	got, err := g.readPrompts()
	require.NoError(t, err)
	assert.Equal(t, []string{"one", "", "three"}, got)
	// A file of one newline is one empty prompt, not an empty file; a
	// byte-order mark is not the first prompt's text; CRLF ends lines.
	for body, want := range map[string][]string{"\n": {""}, "\r\n": {""}, "\ufeffone\r\ntwo\r\n": {"one", "two"}} {
		require.NoError(t, os.WriteFile(file, []byte(body), 0o644))
		got, err := g.readPrompts()
		require.NoError(t, err, "%q", body)
		assert.Equal(t, want, got, "%q", body)
	}
	g.bos = false
	require.NoError(t, os.WriteFile(file, []byte("\n"), 0o644))
	_, err = g.readPrompts()
	assert.ErrorContains(t, err, "p.txt:1: the prompt is empty")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = g.readPrompts()
	assert.ErrorContains(t, err, "no prompts (the file is empty)")
}

// gunzipTo writes the gunzipped contents of src to dst.
func gunzipTo(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	b, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, b, 0o644))
}

func readBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// Bytes that are not UTF-8 become one U+FFFD per maximal ill-formed part,
// as Hugging Face's decode gives them, not one per byte.
func TestLossyAsHuggingFace(t *testing.T) {
	for in, want := range map[string]string{
		"plain é 日本":              "plain é 日本",
		" realm \xe2\x96 shale":   " realm \ufffd shale",
		"\xe2\x96\xe2\x96":        "\ufffd\ufffd",
		"\xf0\x9f\x98":            "\ufffd",
		"\xff\xfe":                "\ufffd\ufffd",
		"\x80\x80a":               "\ufffd\ufffda",
		"\xed\xa0\x80":            "\ufffd\ufffd\ufffd", // a surrogate: ED takes 80–9F only
		"\xe0\x80\xaf":            "\ufffd\ufffd\ufffd", // overlong
		"a\xc3":                   "a\ufffd",
		"ok \ufffd kept as it is": "ok \ufffd kept as it is",
	} {
		assert.Equal(t, want, lossy(in), "%q", in)
	}
}

// Prompts that do not fit memory all together (the prefill's activations
// are batch × longest prompt × hidden a layer) are generated fewer a step
// when --batch is left out, said, with the tokens all at once would give; with
// --batch given, the refusal stands.
func TestGenerateFitsFewerPromptsAStep(t *testing.T) {
	w := filepath.Join(tinyWeights(t), "w.safetensors")
	prompts := filepath.Join(t.TempDir(), "p.txt")
	require.NoError(t, os.WriteFile(prompts, []byte("aaaa\nbbbb\ncccc\ndddd\n"), 0o644))
	args := []string{gptModel, "--set", "layers=1,hidden=32,heads=4,seq=16,ctx=48", "--load", w, "--prompt-file", prompts, "--max-new-tokens", "3", "--seed", "5"}
	want := generateJSON(t, args...)
	require.Len(t, want, 4)
	var out, log bytes.Buffer
	require.NoError(t, runGenerate(append(slices.Clone(args), "--device-memory", "100KiB", "--output", "json"), &out, &log))
	assert.Contains(t, log.String(), "generate: 4 prompts a step do not fit (out of device memory: prefill")
	assert.Contains(t, log.String(), "2 a step instead (--batch sets it)")
	assert.Equal(t, want, decodeResults(t, &out), "the same tokens, fewer prompts a step")
	err := runGenerate(append(slices.Clone(args), "--device-memory", "100KiB", "--batch", "4"), io.Discard, io.Discard)
	require.ErrorIs(t, err, lower.ErrDoesNotFit)
}

// After a prompt of the BOS alone (--bos and an empty prompt) the new
// tokens start the text, as Hugging Face decodes them: Llama 2's decoder
// strips the space before the first word there. After a word the space
// stays.
func TestContinuationAfterTheBOSAlone(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama2"), "")
	require.NoError(t, err)
	bos, ok := tok.BOS()
	require.True(t, ok)
	tx := codec{tok: tok}
	ids := tok.Encode([]byte("hi there"))
	assert.Equal(t, "hi there", tx.continuation([]int32{bos}, ids, -1))
	hello := append([]int32{bos}, tok.Encode([]byte("Hello"))...)
	assert.Equal(t, " hi there", tx.continuation(hello, ids, -1))
}

// eval under pp runs the forward-only programs: training's schedule, its
// backward blocks and optimizer, is not printed as if it ran.
func TestEvalUnderPPPrintsNoTrainingSchedule(t *testing.T) {
	w := filepath.Join(t.TempDir(), "w.safetensors")
	model := []string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=16", "--batch", "4", "--max-data-mb", "1"}
	require.NoError(t, mainErr(append(slices.Clone(model), "--run", "--steps", "1", "--save", w)))
	log, err := captureStderr(t, func() error {
		return mainErr(append(append([]string{"eval"}, model...), "--load", w, "--eval-batches", "1", "--devices", "2", "--pp", "2"))
	})
	require.NoError(t, err, log)
	assert.Contains(t, log, "eval batch 1/1")
	assert.NotContains(t, log, "schedule 1f1b")
}
