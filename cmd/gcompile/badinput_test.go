package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"gcompile/compile"
	"gcompile/data"
	"gcompile/passes"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/dist"
)

// mainNoPanic is mainErr, failing the test instead of crashing it when
// mainErr panics: a bad input must be an error, never a panic.
func mainNoPanic(t *testing.T, args []string) (err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("mainErr(%q) panicked: %v\n%s", args, r, debug.Stack())
		}
	}()
	return mainErr(args)
}

// tree is every file (by its content) and folder under dir, to show that
// a refused run left them as they were.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[rel+"/"] = ""
			return nil
		}
		raw, err := os.ReadFile(p)
		out[rel] = string(raw)
		return err
	}))
	return out
}

// badInput is one way to get the command line, a model, the data, a
// weights or checkpoint file or an output path wrong. In args, $D is the
// case's own folder (setup writes its files there) and $W the fixtures'.
type badInput struct {
	name string
	// args follow tinyGPT unless own is set (then they start with the model).
	args  []string
	own   bool
	setup func(t *testing.T, dir string)
	want  []string
	is    error
	// multi: several failures, joined one per line (e.g. Go's parser
	// reports each syntax error).
	multi bool
}

// badFixtures are files several cases derive theirs from, made once: the
// tiny GPT's input module as a .gir, and its weights after one step.
type badFixtures struct {
	dir, gir, weights string
	tensors           []checkpoint.Tensor
}

func makeBadFixtures(t *testing.T) badFixtures {
	t.Helper()
	dir := t.TempDir()
	f := badFixtures{dir: dir, weights: filepath.Join(dir, "w.safetensors")}
	require.NoError(t, mainErr(append(slices.Clone(tinyGPT), "--run", "--steps", "1", "--eval-batches", "1",
		"--save", f.weights, "--dump", filepath.Join(dir, "d"))))
	raw, err := os.ReadFile(filepath.Join(dir, "d", "00-input.gir"))
	require.NoError(t, err)
	f.gir = string(raw)
	f.tensors, _, err = checkpoint.Load(f.weights)
	require.NoError(t, err)
	return f
}

// withTensors writes the fixture weights, changed by edit, to dir/name.
func (f badFixtures) withTensors(t *testing.T, path string, edit func([]checkpoint.Tensor) []checkpoint.Tensor) {
	t.Helper()
	ts := make([]checkpoint.Tensor, len(f.tensors))
	for i, x := range f.tensors {
		x.Data = bytes.Clone(x.Data)
		x.Shape = slices.Clone(x.Shape)
		ts[i] = x
	}
	require.NoError(t, checkpoint.Save(path, edit(ts), nil))
}

// setF32 sets element i of the named F32 tensor.
func setF32(t *testing.T, ts []checkpoint.Tensor, name string, i int, v float32) []checkpoint.Tensor {
	t.Helper()
	for _, x := range ts {
		if x.Name == name {
			binary.LittleEndian.PutUint32(x.Data[4*i:], math.Float32bits(v))
			return ts
		}
	}
	t.Fatalf("no tensor %q", name)
	return nil
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(path, 0o755))
}

// text is n bytes of ASCII text.
func text(n int) string {
	return strings.Repeat("the quick brown fox jumps over the lazy dog\n", n/44+1)[:n]
}

const modelHeader = "package m\n\nimport \"gcompile/frontend\"\n\n"

// Every bad input is a named error before any work it would spoil: one
// line (unless it joins several failures) that names the flag or the
// file and line; no panic; and the files the run was given, outputs
// included, are left as they were (an existing metrics file, given to
// every case that does not test --metrics itself, keeps the previous
// run's content).
func TestBadInputsAreNamedErrors(t *testing.T) {
	fx := makeBadFixtures(t)
	trainRun := []string{"--run", "--steps", "1", "--eval-batches", "1"}
	run := func(extra ...string) []string { return append(slices.Clone(trainRun), extra...) }
	cases := []badInput{
		// Real-valued flags: NaN, ±Inf and out of range.
		{name: "lr NaN", args: []string{"--lr", "NaN"}, want: []string{"--lr", "NaN"}},
		{name: "lr +Inf", args: []string{"--lr", "Inf"}, want: []string{"--lr", "+Inf"}},
		{name: "lr -Inf", args: []string{"--lr", "-Inf"}, want: []string{"--lr", "-Inf"}},
		{name: "lr negative", args: []string{"--lr", "-0.1"}, want: []string{"--lr > 0", "-0.1"}},
		{name: "lr zero", args: []string{"--lr", "0"}, want: []string{"learning rate: want --lr > 0"}},
		{name: "lr not a number", args: []string{"--lr", "fast"}, want: []string{`invalid value "fast" for flag -lr`, "(see gcompile -h)"}},
		{name: "min-lr NaN", args: []string{"--min-lr", "NaN"}, want: []string{"--min-lr NaN"}},
		{name: "min-lr +Inf", args: []string{"--min-lr", "+Inf"}, want: []string{"--min-lr +Inf"}},
		{name: "min-lr negative", args: []string{"--min-lr", "-1e-4"}, want: []string{"0 ≤ --min-lr ≤ --lr"}},
		{name: "min-lr above lr", args: []string{"--lr", "1e-3", "--min-lr", "1e-2"}, want: []string{"0 ≤ --min-lr ≤ --lr (0.001), got --min-lr 0.01"}},
		{name: "clip NaN", args: []string{"--clip", "NaN"}, want: []string{"--clip", "NaN"}},
		{name: "clip +Inf", args: []string{"--clip", "Inf"}, want: []string{"--clip", "+Inf"}},
		{name: "clip negative", args: []string{"--clip", "-1"}, want: []string{"--clip must be a finite norm ≥ 0"}},
		{name: "weight-decay NaN", args: []string{"--weight-decay", "NaN"}, want: []string{"--weight-decay", "NaN"}},
		{name: "weight-decay -Inf", args: []string{"--weight-decay", "-Inf"}, want: []string{"--weight-decay", "-Inf"}},
		{name: "weight-decay negative", args: []string{"--weight-decay", "-0.1"}, want: []string{"--weight-decay must be finite as a 32-bit float and ≥ 0, got -0.1"}},
		{name: "beta1 NaN", args: []string{"--beta1", "NaN"}, want: []string{"--beta1 must lie in [0, 1) as a 32-bit float, which the optimizer computes in, got NaN"}},
		{name: "beta2 that rounds to one", args: []string{"--beta2", "0.99999999"}, want: []string{"--beta2 must lie in [0, 1) as a 32-bit float, which the optimizer computes in, got 0.99999999"}},
		{name: "weight decay past float32", args: []string{"--weight-decay", "1e39"}, want: []string{"--weight-decay must be finite as a 32-bit float and ≥ 0, got 1e+39"}},
		{name: "min-lr without decay", args: run("--lr-decay", "constant", "--min-lr", "0.001"), want: []string{"--min-lr has no effect with --lr-decay constant"}},
		{name: "unknown decay", args: run("--lr-decay", "step"), want: []string{`--lr-decay "step": want one of cosine, linear, constant, inverse-square-root, wsd`}},
		{name: "decay steps negative", args: run("--lr-decay-steps", "-5"), want: []string{"--lr-decay-steps must be ≥ 0 (0: --steps), got -5"}},
		{name: "decay ends in the warm-up", args: run("--warmup", "10", "--lr-decay-steps", "10"), want: []string{"--lr-decay-steps 10 is not past --warmup 10"}},
		{name: "decay steps without decay", args: run("--lr-decay", "constant", "--lr-decay-steps", "100"), want: []string{"--lr-decay-steps has no effect with --lr-decay constant"}},
		{name: "wsd without its steps", args: run("--lr-decay", "wsd"), want: []string{"--lr-decay wsd needs --lr-wsd-decay-steps N ≥ 1"}},
		{name: "wsd anneal past the decay", args: run("--lr-decay", "wsd", "--warmup", "0", "--lr-wsd-decay-steps", "2"), want: []string{"--lr-wsd-decay-steps 2 is longer than the decay, 1 steps"}},
		{name: "wsd unknown style", args: run("--lr-decay", "wsd", "--lr-wsd-decay-steps", "1", "--warmup", "0", "--lr-wsd-decay-style", "step"), want: []string{`--lr-wsd-decay-style "step": want one of exponential, linear, cosine, minus_sqrt`}},
		{name: "wsd steps without wsd", args: run("--lr-wsd-decay-steps", "3"), want: []string{"--lr-wsd-decay-steps has no effect with --lr-decay cosine"}},
		{name: "wsd with an empty decay", args: run("--lr-decay", "wsd", "--lr-wsd-decay-steps", "2"), want: []string{"--lr-decay wsd: the decay has no steps: --warmup 10 is not shorter than its end, step 1"}},
		{name: "recompute segments past the layers", args: []string{"--recompute", "every=5"}, want: []string{"--recompute every=5: more than the model's 1 layers; a segment holds at most every layer (every=1)"}},
		{name: "lr of adafactor", args: []string{"--optimizer", "adafactor", "--lr", "0.01"}, want: []string{"--lr has no effect with --optimizer adafactor (Adafactor's step is relative"}},
		{name: "betas of sgd", args: []string{"--optimizer", "sgd", "--beta2", "0.9"}, want: []string{"--beta2 has no effect with --optimizer sgd"}},
		{name: "adam-eps zero", args: []string{"--adam-eps", "0"}, want: []string{"--adam-eps must be positive", "got 0"}},
		{name: "adam-eps negative", args: []string{"--adam-eps", "-1e-8"}, want: []string{"--adam-eps must be positive and finite as a 32-bit float", "got -1e-08"}},
		{name: "adam-eps below float32", args: []string{"--adam-eps", "1e-50"}, want: []string{"--adam-eps must be positive and finite as a 32-bit float", "got 1e-50"}},
		{name: "adam-eps NaN", args: []string{"--adam-eps", "NaN"}, want: []string{"--adam-eps", "NaN"}},
		{name: "adam-eps of sgd", args: []string{"--optimizer", "sgd", "--adam-eps", "1e-6"}, want: []string{"--adam-eps has no effect with --optimizer sgd"}},
		{name: "beta1 one", args: []string{"--beta1", "1"}, want: []string{"--beta1 must lie in [0, 1) as a 32-bit float, which the optimizer computes in, got 1"}},
		{name: "beta1 negative", args: []string{"--beta1", "-0.9"}, want: []string{"--beta1", "-0.9"}},
		{name: "beta2 NaN", args: []string{"--beta2", "NaN"}, want: []string{"--beta2", "NaN"}},
		{name: "beta2 +Inf", args: []string{"--beta2", "Inf"}, want: []string{"--beta2", "+Inf"}},
		{name: "beta2 above one", args: []string{"--beta2", "1.5"}, want: []string{"--beta2", "1.5"}},
		{name: "loss-scale NaN", args: []string{"--precision", "fp16", "--loss-scale", "NaN"}, want: []string{"--loss-scale", "NaN"}},
		{name: "loss-scale +Inf", args: []string{"--precision", "fp16", "--loss-scale", "Inf"}, want: []string{"--loss-scale", "+Inf"}},
		{name: "loss-scale NaN under fp32", args: []string{"--loss-scale", "NaN"}, want: []string{"--loss-scale", "NaN"}},
		{name: "loss-scale negative", args: []string{"--precision", "bf16", "--loss-scale", "-8"}, want: []string{"--loss-scale must be positive", "-8"}},
		{name: "timeline not svg", args: []string{"--devices", "2", "--pp", "2", "--set", "layers=2,hidden=32,heads=2,seq=16", "--microbatches", "2", "--timeline", "t.png"}, want: []string{"--timeline \"t.png\": the timeline is an SVG drawing; give a FILE.svg"}},
		{name: "cp-layout without cp", args: []string{"--cp-layout", "zigzag"}, want: []string{"--cp-layout zigzag applies to --cp > 1"}},
		{name: "loss-scale underflows float32", args: []string{"--precision", "fp16", "--loss-scale", "1e-300"}, want: []string{"--loss-scale 1e-300", "must be a normal float32 (1.18e-38 to 3.4e+38)"}},
		{name: "initial loss scale past float32", args: []string{"--precision", "fp16", "--initial-loss-scale", "1e300"}, want: []string{"--initial-loss-scale 1e+300", "must be a normal float32"}},
		{name: "initial-loss-scale NaN", args: []string{"--precision", "fp16", "--initial-loss-scale", "NaN"}, want: []string{"--initial-loss-scale", "NaN"}},
		{name: "initial-loss-scale +Inf", args: []string{"--precision", "fp16", "--initial-loss-scale", "Inf"}, want: []string{"--initial-loss-scale", "+Inf"}},
		{name: "initial-loss-scale zero", args: []string{"--precision", "fp16", "--initial-loss-scale", "0"}, want: []string{"--initial-loss-scale must be a positive finite number"}},
		// Said once: not also as below the default --min-loss-scale.
		{name: "initial-loss-scale negative", args: []string{"--precision", "fp16", "--initial-loss-scale", "-1"}, want: []string{"--initial-loss-scale must be a positive finite number, got -1"}},
		{name: "loss-scale past float32", args: []string{"--precision", "fp16", "--loss-scale", "1e39"}, want: []string{"--loss-scale must be positive (0: dynamic) and finite as a 32-bit float, got 1e+39"}},
		{name: "loss-scale-window zero", args: []string{"--precision", "fp16", "--loss-scale-window", "0"}, want: []string{"--loss-scale-window must be ≥ 1 clean step, got 0"}},
		{name: "hysteresis zero", args: []string{"--precision", "fp16", "--hysteresis", "0"}, want: []string{"--hysteresis must be ≥ 1 overflowed step"}},
		{name: "min-loss-scale negative", args: []string{"--precision", "fp16", "--min-loss-scale", "-1"}, want: []string{"--min-loss-scale must be ≥ 0 and finite (0: no floor), got -1"}},
		{name: "min-loss-scale above the start", args: []string{"--precision", "fp16", "--min-loss-scale", "1e6"}, want: []string{"--min-loss-scale 1e+06 is above the scale the run starts from, --initial-loss-scale 65536"}},
		{name: "hysteresis of bf16", args: []string{"--precision", "bf16", "--hysteresis", "2"}, want: []string{"--hysteresis applies to dynamic loss scaling: --precision fp16 without --loss-scale"}},
		{name: "bucket-mb NaN", args: []string{"--bucket-mb", "NaN"}, want: []string{"--bucket-mb", "NaN"}},
		{name: "bucket-mb +Inf", args: []string{"--bucket-mb", "Inf"}, want: []string{"--bucket-mb", "+Inf"}},
		{name: "bucket-mb zero", args: []string{"--bucket-mb", "0"}, want: []string{"--bucket-mb must be positive"}},
		{name: "bucket-mb beyond any model", args: []string{"--bucket-mb", "1e300"}, want: []string{"--bucket-mb", "at most 1048576"}},
		// Integer flags out of range.
		{name: "steps zero", args: []string{"--steps", "0"}, want: []string{"--steps must be ≥ 1, got 0"}},
		{name: "steps negative", args: []string{"--steps", "-5"}, want: []string{"--steps must be ≥ 1, got -5"}},
		{name: "steps not an integer", args: []string{"--steps", "1e3"}, want: []string{`invalid value "1e3" for flag -steps`}},
		{name: "batch zero", args: []string{"--batch", "0"}, want: []string{"--batch must be ≥ 1"}},
		{name: "batch negative", args: []string{"--batch", "-4"}, want: []string{"--batch must be ≥ 1"}},
		{name: "warmup negative", args: []string{"--warmup", "-1"}, want: []string{"--warmup must be ≥ 0, got -1"}},
		{name: "eval-every negative", args: []string{"--eval-every", "-10"}, want: []string{"--eval-every must be ≥ 0"}},
		{name: "eval-batches zero", args: []string{"--eval-batches", "0"}, want: []string{"--eval-batches must be ≥ 1 (or -1: no held-out evaluation), got 0"}},
		{name: "eval-batches below -1", args: []string{"--eval-batches", "-2"}, want: []string{"--eval-batches", "got -2"}},
		{name: "staleness negative", args: []string{"--devices", "2", "--dp-sync", "async", "--staleness", "-1"}, want: []string{"--staleness must be ≥ 0, got -1"}},
		{name: "max-data-mb zero", args: []string{"--max-data-mb", "0"}, want: []string{"--max-data-mb must be in 1..1048576, got 0"}},
		{name: "max-data-mb past int64 bytes", args: []string{"--max-data-mb", "17592186044416"}, want: []string{"--max-data-mb", "17592186044416"}},
		{name: "offload-prefetch negative", args: []string{"--offload", "params", "--offload-prefetch", "-1"}, want: []string{"--offload-prefetch -1"}},
		{name: "timeout zero", args: []string{"--timeout", "0s"}, want: []string{"--timeout must be positive, got 0s"}},
		{name: "timeout negative", args: []string{"--timeout", "-5s"}, want: []string{"--timeout must be positive, got -5s"}},
		{name: "rdzv-timeout zero", args: []string{"--rdzv-timeout", "0s"}, want: []string{"--rdzv-timeout must be positive, got 0s"}},
		{name: "calibrate a folder", args: []string{"--plan", "--calibrate", fx.dir}, want: []string{"--calibrate " + fx.dir + " is a folder; it wants a JSON file"}},
		{name: "cp-impl empty", args: []string{"--cp-impl", ""}, want: []string{`--cp-impl "": want ring or all2all`}},
		{name: "cp-layout empty without cp", args: []string{"--cp-layout", ""}, want: []string{`--cp-layout "" applies to --cp > 1`}},
		{name: "timeout without a unit", args: []string{"--timeout", "10"}, want: []string{`time: missing unit in duration "10" (give a unit: 90s, 10m, 1h30m)`}},
		{name: "device-memory of exbibytes", args: []string{"--device-memory", "8EiB"}, want: []string{"8EiB is past 2^63 bytes"}},
		{name: "advertise-addr not a host", args: []string{"--advertise-addr", "not an addr"}, want: []string{`--advertise-addr "not an addr": want a host name or an IP address`}},
		{name: "master-addr with a port", args: []string{"--master-addr", "10.0.0.1:29500"}, want: []string{`--master-addr "10.0.0.1:29500": want a host name or an IP address (no port: --master-port gives the rendezvous's)`}},
		{name: "rdzv-timeout of a nanosecond", args: []string{"--rdzv-timeout", "1ns"}, want: []string{"--rdzv-timeout 1ns: under 1s, processes started together cannot meet"}},
		{name: "timeout of a millisecond", args: []string{"--timeout", "1ms"}, want: []string{"--timeout 1ms: under 1s, a rank's wait for another ends before the other can answer"}},
		{name: "rdzv-timeout past timeout", args: []string{"--rdzv-timeout", "20m"}, want: []string{"--rdzv-timeout 20m0s is longer than --timeout 10m0s"}},
		{name: "timeout without a unit", args: []string{"--timeout", "5"}, want: []string{`invalid value "5" for flag -timeout`}},
		{name: "checkpoint-every negative", args: run("--checkpoint-dir", "$D/ck", "--checkpoint-every", "-1"), want: []string{"--checkpoint-every must be ≥ 0, got -1"}},
		{name: "keep-last negative", args: run("--checkpoint-dir", "$D/ck", "--keep-last", "-3"), want: []string{"--keep-last must be ≥ 0, got -3"}},
		{name: "stop-after negative", args: run("--stop-after", "-1"), want: []string{"--stop-after must be ≥ 0, got -1"}},
		{name: "stop-after-time negative", args: run("--stop-after-time", "-1h"), want: []string{"--stop-after-time must be ≥ 0 (0: no limit), got -1h0m0s"}},
		{name: "stop-after-time without a run", args: []string{"--stop-after-time", "1h"}, want: []string{"--stop-after-time stops a training run; add --run"}},
		{name: "stop-after not before steps", args: []string{"--run", "--steps", "3", "--stop-after", "3"}, want: []string{"--stop-after 3 must be below --steps 3"}},
		{name: "devices zero", args: []string{"--devices", "0"}, want: []string{"--devices must be ≥ 1, got 0"}},
		{name: "tp negative", args: []string{"--tp", "-2"}, want: []string{"--tp must be in 0..1048576, got -2"}},
		{name: "degrees whose product overflows", args: []string{"--tp", "4294967296"}, want: []string{"--tp must be in 0..1048576, got 4294967296"}},
		{name: "microbatches zero", args: []string{"--microbatches", "0"}, want: []string{"--microbatches must be ≥ 1, got 0"}},
		{name: "microbatches past a program", args: []string{"--batch", "8388608", "--microbatches", "8388608"}, want: []string{"--microbatches 8388608: past the 16384 a compiled program holds"}},
		{name: "seed not an integer", args: []string{"--seed", "1.5"}, want: []string{`invalid value "1.5" for flag -seed`}},
		{name: "master-port out of range", args: []string{"--master-port", "70000"}, want: []string{"--master-port 70000 is not a port"}},
		{name: "rank negative", args: []string{"--rank", "-2"}, want: []string{"--rank must be ≥ 0, got -2"}},
		{name: "world-size zero", args: []string{"--world-size", "0"}, want: []string{"--world-size must be ≥ 1, got 0"}},
		// Sizes: the whole string is a positive whole number of bytes.
		{name: "size with junk before B", args: []string{"--device-memory", "12XB"}, want: []string{`--device-memory "12XB": want a positive size`}},
		{name: "size with junk before GiB", args: []string{"--device-memory", "12XGiB"}, want: []string{`--device-memory "12XGiB"`}},
		{name: "size of half a byte", args: []string{"--device-memory", "0.5B"}, want: []string{`--device-memory "0.5B"`, "whole bytes"}},
		{name: "size past float64", args: []string{"--device-memory", "1e400GB"}, want: []string{`--device-memory "1e400GB"`}},
		{name: "size past int64", args: []string{"--device-memory", "1e10TB"}, want: []string{`--device-memory "1e10TB"`}},
		{name: "size negative", args: []string{"--device-memory", "-3GB"}, want: []string{`--device-memory "-3GB"`}},
		{name: "size NaN", args: []string{"--device-memory", "NaN"}, want: []string{`--device-memory "NaN"`}},
		{name: "size Inf", args: []string{"--device-memory", "InfGiB"}, want: []string{`--device-memory "InfGiB"`}},
		{name: "size zero", args: []string{"--device-memory", "0"}, want: []string{`--device-memory "0"`}},
		{name: "size without a number", args: []string{"--device-memory", "GiB"}, want: []string{`--device-memory "GiB"`}},
		// The command line itself.
		{name: "unknown flag", args: []string{"--foo"}, want: []string{"flag provided but not defined: -foo (see gcompile -h)"}},
		{name: "flag without its value", args: []string{"--steps"}, want: []string{"flag needs an argument: -steps (see gcompile -h)"}},
		{name: "no model", own: true, args: []string{"--run"}, want: []string{"want exactly one MODEL.go or MODEL.gir, got 0 arguments (see gcompile -h)"}},
		{name: "two models", own: true, args: []string{gptModel, gptModel}, want: []string{"want exactly one MODEL.go or MODEL.gir, got 2"}},
		{name: "model of another kind", own: true, args: []string{"$D/model.txt"}, want: []string{"model.txt: the model must be a .go file or a .gir dump"}},
		{name: "--set on a .gir", own: true, args: []string{"$D/m.gir", "--set", "layers=2"}, want: []string{"--set applies to a model.go"}},

		// Model files.
		{name: "model file missing", own: true, args: []string{"$D/nope/model.go"}, want: []string{"model file:", "no such file"}},
		{name: "model syntax error", own: true, args: []string{"$D/model.go"}, multi: true,
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "model.go"), modelHeader+"func Model(b *frontend.Builder) {\n\tx := \n}\n")
			}, want: []string{"model.go:7:"}},
		{name: "model type error", own: true, args: []string{"$D/model.go"},
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "model.go"), modelHeader+"func Model(b *frontend.Builder) {\n\tvar x int = \"two\"\n\t_ = x\n}\n")
			}, want: []string{"model.go:6: ", `cannot use "two"`}},
		{name: "model file empty", own: true, args: []string{"$D/model.go"},
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "model.go"), "\n") },
			want:  []string{"model.go is empty: it needs a package clause (not main) and a func Model(b *frontend.Builder)"}},
		{name: "model without a Model func", own: true, args: []string{"$D/model.go"},
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "model.go"), modelHeader+"func Build(b *frontend.Builder) {}\n")
			}, want: []string{"model.go:", "has no func Model"}},
		{name: "model that panics", own: true, args: []string{"$D/model.go"},
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "model.go"), modelHeader+"func Model(b *frontend.Builder) {\n\tvar m map[string]int\n\tm[\"x\"] = 1\n}\n")
			}, want: []string{"model.go:7: model panicked", "nil map"}},

		// .gir files.
		{name: "gir missing", own: true, args: []string{"$D/nope.gir"}, want: []string{"nope.gir"}},
		{name: "gir empty", own: true, args: []string{"$D/m.gir"},
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "m.gir"), "") }, want: []string{"m.gir:"}},
		{name: "gir truncated", own: true, args: []string{"$D/m.gir"},
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "m.gir"), fx.gir[:strings.Index(fx.gir, "%3 = embedding")+12])
			}, want: []string{"m.gir:9"}},
		{name: "gir unknown op", own: true, args: []string{"$D/m.gir"},
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "m.gir"), strings.Replace(fx.gir, "%3 = embedding", "%3 = embed", 1))
			}, want: []string{"m.gir:9", "embed"}},
		{name: "gir bad dims", own: true, args: []string{"$D/m.gir"}, multi: true,
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "m.gir"), strings.Replace(fx.gir, "%3 = embedding %2, %0 : f32[4,16,32]", "%3 = embedding %2, %0 : f32[4,16,33]", 1))
			}, want: []string{"%3 embedding @model.go:32 (", "m.gir:9): declared type f32[4,16,33] but the embedding rule gives f32[4,16,32]"}},

		// Training text.
		{name: "data missing", args: run("--data", "$D/nope.txt"), want: []string{"--data ", "nope.txt", "no such file"}},
		{name: "data empty file", args: run("--data", "$D/empty.txt"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "empty.txt"), "") },
			want:  []string{"--data ", "empty.txt is empty"}, is: data.ErrNoFiles},
		{name: "data binary file", args: run("--data", "$D/model.bin"),
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "model.bin"), "\x7fELF\x02\x01\x01\x00"+text(4000))
			},
			want: []string{"--data ", "model.bin looks binary"}, is: data.ErrBinary},
		{name: "data folder of binaries", args: run("--data", "$D/bins"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "bins", "a.bin"), "\x00\x01\x02") },
			want:  []string{"--data ", "has no non-empty text files"}, is: data.ErrNoFiles},
		{name: "data empty folder", args: run("--data", "$D/none"),
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "none")) },
			want:  []string{"--data ", "has no text files"}, is: data.ErrNoFiles},
		{name: "data shorter than a window", args: run("--data", "$D/short.txt"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "short.txt"), text(12)) },
			want:  []string{"--data ", "training split has"}, is: data.ErrTooSmall},
		{name: "data bytes past the vocab", args: run("--set", "layers=1,hidden=32,heads=2,seq=16,vocab=128", "--data", "$D/utf8.txt"),
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "utf8.txt"), text(3000)+"café"+text(3000))
			},
			want: []string{"--data ", "byte 195 at offset 3003", "vocab 128", "embedding table's 128 rows", "--set vocab=256"}, is: data.ErrVocab},

		// Weights and checkpoints.
		{name: "load missing", args: run("--load", "$D/nope.safetensors"), want: []string{"--load: ", "no such file"}},
		{name: "load a folder", args: run("--load", "$D"), want: []string{"--load ", "is a folder"}},
		{name: "load a text file", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "w.safetensors"), "not weights\n") },
			want:  []string{"--load: ", "w.safetensors", `the file starts with text ("not weig"), so it is not safetensors`}},
		{name: "load truncated", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) {
				raw, err := os.ReadFile(fx.weights)
				require.NoError(t, err)
				writeFile(t, filepath.Join(dir, "w.safetensors"), string(raw[:len(raw)/2]))
			}, want: []string{"--load: ", "w.safetensors"}},
		{name: "load NaN weight", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) {
				fx.withTensors(t, filepath.Join(dir, "w.safetensors"), func(ts []checkpoint.Tensor) []checkpoint.Tensor {
					return setF32(t, ts, "wte.weight", 5, float32(math.NaN()))
				})
			}, want: []string{"--load ", `tensor "wte.weight"`, "1 non-finite value(s)", "NaN at index 5"}},
		{name: "load NaN weight under async dp", args: run("--load", "$D/w.safetensors", "--devices", "2", "--dp", "2", "--dp-sync", "async"),
			setup: func(t *testing.T, dir string) {
				fx.withTensors(t, filepath.Join(dir, "w.safetensors"), func(ts []checkpoint.Tensor) []checkpoint.Tensor {
					return setF32(t, ts, "wte.weight", 5, float32(math.NaN()))
				})
			}, want: []string{"--load ", `tensor "wte.weight"`, "NaN at index 5"}},
		{name: "load Inf weight", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) {
				fx.withTensors(t, filepath.Join(dir, "w.safetensors"), func(ts []checkpoint.Tensor) []checkpoint.Tensor {
					return setF32(t, setF32(t, ts, "ln_f.bias", 0, float32(math.Inf(-1))), "ln_f.bias", 3, float32(math.Inf(1)))
				})
			}, want: []string{"--load ", `tensor "ln_f.bias"`, "2 non-finite value(s)", "-Inf at index 0"}},
		{name: "load wrong shape", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) {
				fx.withTensors(t, filepath.Join(dir, "w.safetensors"), func(ts []checkpoint.Tensor) []checkpoint.Tensor {
					for i := range ts {
						if ts[i].Name == "wte.weight" {
							ts[i].Shape, ts[i].Data = []int{255, 32}, ts[i].Data[:255*32*4]
						}
					}
					return ts
				})
			}, want: []string{"--load ", `tensor "wte.weight" is F32[255 32], the model's param is f32[256,32]`}},
		{name: "load without a param's tensor", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) {
				fx.withTensors(t, filepath.Join(dir, "w.safetensors"), func(ts []checkpoint.Tensor) []checkpoint.Tensor {
					return slices.DeleteFunc(ts, func(x checkpoint.Tensor) bool { return x.Name == "ln_f.bias" })
				})
			}, want: []string{"--load ", "1 of the model's 16 params have no tensor in it: ln_f.bias"}},
		{name: "load an empty weights file", args: run("--load", "$D/w.safetensors"),
			setup: func(t *testing.T, dir string) {
				fx.withTensors(t, filepath.Join(dir, "w.safetensors"), func([]checkpoint.Tensor) []checkpoint.Tensor { return nil })
			}, want: []string{"--load ", "the file holds no tensors, and the model has 16 params"}},
		{name: "resume missing", args: run("--resume", "$D/nope"), want: []string{"--resume: "}},
		{name: "resume a folder without checkpoints", args: run("--resume", "$D/ck"),
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "ck")) },
			want:  []string{"--resume: "}, is: checkpoint.ErrNoCheckpoint},
		{name: "resume with load", args: run("--resume", "$D/ck", "--load", "$W/w.safetensors"), want: []string{"--resume continues a run with its own weights; it does not combine with --load"}},
		{name: "checkpoint-every without a folder", args: run("--checkpoint-every", "5"), want: []string{"--checkpoint-every applies to --checkpoint-dir"}},
		{name: "checkpoint-dir is a file", args: run("--checkpoint-dir", "$D/ck"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "ck"), "a file\n") },
			want:  []string{"--checkpoint-dir"}},

		// Output paths, refused before any compile.
		{name: "metrics is a folder", args: []string{"--metrics", "$D/out"},
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "out")) },
			want:  []string{"--metrics ", "out is a folder; it wants a file path"}},
		{name: "save in a folder not made yet", args: run("--save", "$D/new/"), want: []string{"--save ", "new/ names a folder; it wants a file path (such as ", "model.safetensors)"}},
		{name: "metrics in a folder not made yet", args: []string{"--metrics", "$D/new/"}, want: []string{"--metrics ", "new/ names a folder; it wants a file path"}},
		{name: "metrics under a file", args: []string{"--metrics", "$D/f/m.json"},
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "f"), "a file\n") },
			want:  []string{"--metrics ", "is a file, not a folder"}},
		{name: "metrics is a device", args: []string{"--metrics", os.DevNull}, want: []string{"--metrics " + os.DevNull + " is not a regular file"}},
		{name: "trace is a folder", args: run("--trace", "$D"), want: []string{"--trace ", "is a folder"}},
		{name: "trace under a file", args: run("--trace", "$D/f/sub/t.json"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "f"), "a file\n") },
			want:  []string{"--trace ", "is a file, not a folder"}},
		{name: "save is a folder", args: run("--save", "$D/w"),
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "w")) },
			want:  []string{"--save ", "is a folder"}},
		{name: "save under a file", args: run("--save", "$D/f/w.safetensors"),
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "f"), "a file\n") },
			want:  []string{"--save ", "is a file, not a folder"}},
		{name: "timeline is a folder", args: []string{"--devices", "2", "--pp", "2", "--set", "layers=2,hidden=32,heads=2,seq=16", "--microbatches", "2", "--timeline", "$D/t.svg"},
			setup: func(t *testing.T, dir string) { require.NoError(t, os.Mkdir(filepath.Join(dir, "t.svg"), 0o755)) },
			want:  []string{"--timeline ", "is a folder"}},
		{name: "report is a folder", args: []string{"--report", "$D/r.html"},
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "r.html")) },
			want:  []string{"--report ", "r.html is a folder"}},
		{name: "dump is a file", args: []string{"--dump", "$D/d"},
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "d"), "a file\n") },
			want:  []string{"--dump ", "is a file; it wants a folder"}},
		{name: "dump under a file", args: []string{"--dump", "$D/f/d"},
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "f"), "a file\n") },
			want:  []string{"--dump ", "is a file, not a folder"}},
		{name: "two outputs, one file", args: run("--metrics", "$D/out.json", "--trace", "$D/sub/../out.json"),
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "sub")) },
			want:  []string{"--metrics and --trace both write"}},
		{name: "metrics among the logs", args: run("--log-dir", "$D/logs", "--metrics", "$D/logs/rank-1.log"), want: []string{"--metrics ", "is inside --log-dir ", "the processes' logs"}},
		{name: "metrics at the logs' folder", args: run("--log-dir", "$D/m.json", "--metrics", "$D/m.json"), want: []string{"--metrics ", "is also --log-dir's folder"}},
		{name: "logs among the checkpoints", args: run("--checkpoint-dir", "$D/ck", "--log-dir", "$D/ck/logs"), want: []string{"--log-dir ", "is inside --checkpoint-dir "}},
		{name: "logs in the dump's folder", args: run("--dump", "$D/d", "--log-dir", "$D/d"), want: []string{"--log-dir ", "is also --dump's folder"}},
		{name: "several bad outputs at once", args: run("--metrics", "$D/out", "--save", "$D/out"), multi: true,
			setup: func(t *testing.T, dir string) { mkdir(t, filepath.Join(dir, "out")) },
			want:  []string{"--metrics ", "--save ", "is a folder"}},
	}
	if goruntime.GOOS == "linux" {
		// No one, root included, makes folders in /proc.
		cases = append(cases, badInput{name: "metrics where no folder can be made", args: []string{"--metrics", "/proc/gcompile-no-such/m.json"},
			want: []string{"--metrics: cannot create the folder /proc/gcompile-no-such"}})
	}
	require.GreaterOrEqual(t, len(cases), 60)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// Nothing gcompile starts outlives a refused run: no folder in
			// its temporary folder, no child process.
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			var args []string
			if !tc.own {
				args = slices.Clone(tinyGPT)
			}
			if !slices.Contains(tc.args, "--metrics") {
				prev := filepath.Join(dir, "previous-metrics.json")
				writeFile(t, prev, "{\"the previous run's\": \"metrics\"}\n")
				args = append(args, "--metrics", prev)
			}
			for _, a := range tc.args {
				args = append(args, strings.NewReplacer("$D", dir, "$W", fx.dir).Replace(a))
			}
			before := tree(t, dir)
			err := mainNoPanic(t, args)
			require.Error(t, err, "%q", args)
			msg := err.Error()
			if !tc.multi {
				assert.NotContains(t, msg, "\n", "one failure, one line")
			}
			for _, w := range tc.want {
				assert.Contains(t, msg, w)
			}
			assert.NotContains(t, msg, "panic:")
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
			assert.Equal(t, before, tree(t, dir), "the run's files are as they were")
			left, err := os.ReadDir(tmp)
			require.NoError(t, err)
			assert.Empty(t, left, "nothing is left in TMPDIR")
			assert.Empty(t, children(t), "no process gcompile started is still running")
		})
	}
}

// children are this process's child processes still alive (Linux: from
// /proc; elsewhere none are seen). Zombies are not counted: they have
// ended, and Go reaps what exec started.
func children(t *testing.T) []string {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	if err != nil || len(tasks) == 0 {
		return nil
	}
	var out []string
	for _, f := range tasks {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, pid := range strings.Fields(string(raw)) {
			stat, err := os.ReadFile("/proc/" + pid + "/stat")
			if err != nil || strings.Contains(string(stat), ") Z ") {
				continue
			}
			out = append(out, pid+": "+string(stat[:min(len(stat), 60)]))
		}
	}
	return out
}

// Values at the edges of their range are taken: any seed, -1 held-out
// batches (none), a loss scale of 0 (dynamic), betas of 0, no clipping,
// sizes in any unit that come to whole bytes.
func TestFlagEdgesAreAccepted(t *testing.T) {
	for _, args := range [][]string{
		{"--seed", "-5"},
		{"--seed", "9223372036854775807"},
		{"--eval-batches", "-1"},
		{"--precision", "fp16", "--loss-scale", "0"},
		{"--beta1", "0", "--beta2", "0"},
		{"--clip", "0", "--weight-decay", "0"},
		{"--lr", "1e-3", "--min-lr", "1e-3", "--warmup", "0"},
		{"--device-memory", "1.5GiB"},
		{"--device-memory", "80 GiB"},
		{"--device-memory", "512mib"},
		{"--device-memory", "1e9"},
		{"--max-data-mb", "1048576"},
		{"--bucket-mb", "0.5"},
	} {
		_, err := parseArgs(append(slices.Clone(tinyGPT), args...))
		assert.NoError(t, err, "%q", args)
	}
}

func TestParseBytes(t *testing.T) {
	good := []struct {
		in   string
		want int64
	}{
		{"1", 1}, {"1B", 1}, {"2KB", 2000}, {"2KiB", 2048}, {"1.5GiB", 3 << 29}, {" 80 GiB ", 80 << 30},
		{"1e9", 1e9}, {"3TB", 3e12}, {"1TiB", 1 << 40}, {"0.5KiB", 512}, {"512mib", 512 << 20}, {"1_000", 1000}, {"4611686018427387904", 1 << 62},
	}
	for _, tt := range good {
		got, err := parseBytes(tt.in)
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
	// 9223372036854775807 (2^63-1) rounds to 2^63 as a float64, which no
	// int64 holds.
	for _, in := range []string{"", "B", "12XB", "12XGiB", "0.5B", "1.5B", "1e400GB", "1e10TB", "-3GB", "0", "NaN", "Inf", "+InfB", "12 G", "0x", "GiB12", "9223372036854775807", "8EiB"} {
		_, err := parseBytes(in)
		assert.Error(t, err, "%q", in)
	}
	// Too large is said as such, not as "not positive".
	for _, in := range []string{"1e30", "1e10TB", "9223372036854775807", "+InfB"} {
		_, err := parseBytes(in)
		assert.ErrorContains(t, err, "is past 2^63 bytes (8 EiB)", in)
	}
}

// -h and --help print the usage on stdout and succeed (exit 0); a mistake
// on the command line is one line on stderr that points to -h (exit 1).
func TestHelpAndFlagMistakes(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {gptModel, "-h"}, {"export", "-h"}, {"inspect", "--help"}} {
		out := captureStdout(t, func() { assert.NoError(t, mainNoPanic(t, args), "%q", args) })
		assert.Contains(t, out, "usage: gcompile", "%q", args)
	}
	out := captureStdout(t, func() { require.NoError(t, mainNoPanic(t, []string{"-h"})) })
	assert.Contains(t, out, "-lr float")
	assert.Contains(t, out, "-checkpoint-dir")
	// --help-model checks a --set against the parameters the model reads.
	err := mainNoPanic(t, []string{gptModel, "--help-model", "--set", "layrs=3"})
	assert.ErrorContains(t, err, "--set: unknown model parameter(s) layrs (this model reads: layers, hidden")
	// eval's usage lists the flags it takes, not those it refuses.
	out = captureStdout(t, func() { require.NoError(t, mainNoPanic(t, []string{"eval", "-h"})) })
	for _, f := range []string{"-load string", "-data string", "-tp int", "-eval-batches int"} {
		assert.Contains(t, out, f)
	}
	for _, f := range []string{"-lr float", "-seed int", "-metrics string", "-checkpoint-dir string"} {
		assert.NotContains(t, out, f)
	}
	// Nor training's words for the flags it reads otherwise: eval plans
	// nothing, and takes a checkpoint's params at any batch.
	for _, s := range []string{"the planner's choice", "chosen by the planner", "continue training", "training data:"} {
		assert.NotContains(t, out, s)
	}
	assert.Contains(t, out, "eval does not plan")

	if testing.Short() {
		t.Skip("starts the command as a process; skipped with -short")
	}
	run := func(args ...string) (stdout, stderr string, code int) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), asMainEnv+"=1")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code = 0
		if exit, ok := err.(*exec.ExitError); ok {
			code = exit.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return o.String(), e.String(), code
	}
	stdout, stderr, code := run("-h")
	assert.Equal(t, 0, code, "-h exits 0")
	assert.Contains(t, stdout, "usage: gcompile MODEL.go|MODEL.gir [flags]")
	assert.Empty(t, stderr)
	stdout, stderr, code = run(gptModel, "--foo")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Equal(t, "gcompile: flag provided but not defined: -foo (see gcompile -h)\n", stderr, "one line, not the usage")
	_, stderr, code = run(gptModel, "--lr", "NaN")
	assert.Equal(t, 1, code)
	assert.Equal(t, "gcompile: learning rate: want --lr > 0 and finite as a 32-bit float (at least 1.401298464324817e-45), got NaN\n", stderr)
}

// -h lists every command mainErr dispatches, each with its arguments and
// a line that says what it does; each name reaches its own command (its
// -h is its usage), and no command a user has been told of goes missing.
// --fuse's line names both backends, which both run fused ops.
func TestHelpListsEverySubcommand(t *testing.T) {
	out := captureStdout(t, func() { require.NoError(t, mainNoPanic(t, []string{"-h"})) })
	names := map[string]bool{}
	for _, sc := range subcommandTable() {
		names[sc.name] = true
	}
	for _, want := range []string{"launch", "inspect", "export"} {
		assert.True(t, names[want], "gcompile %s is dispatched", want)
	}
	for _, sc := range subcommandTable() {
		t.Run(sc.name, func(t *testing.T) {
			require.NotEmpty(t, sc.doc)
			assert.Contains(t, out, "gcompile "+sc.name+" "+sc.args+"\n", "the usage line")
			assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(sc.name)+` +`+regexp.QuoteMeta(sc.doc)+`$`, out, "the command's line under commands:")
			// The subcommands' own usage goes to stdout (export, inspect)
			// or stderr (launch's flag set).
			var help string
			stdout := captureStdout(t, func() {
				var err error
				help, err = captureStderr(t, func() error { return mainNoPanic(t, []string{sc.name, "-h"}) })
				assert.NoError(t, err)
			})
			assert.Contains(t, stdout+help, "usage: gcompile "+sc.name+" ")
		})
	}
	assert.Regexp(t, `-fuse\n\s+merge .*on either backend \(cpu: .*; cuda: .*NVRTC\)`, out)
}

// captureStdout runs f with os.Stdout going to a pipe and returns what it
// printed.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		raw, _ := io.ReadAll(r)
		done <- string(raw)
	}()
	defer func() {
		os.Stdout = saved
	}()
	f()
	os.Stdout = saved
	require.NoError(t, w.Close())
	return <-done
}

// When writing an output fails at the end, the others are still written
// and every failure is reported, naming its flag: here the metrics and
// the weights cannot be written (a folder stands where each is first
// written, its name plus .tmp), while the trace and the dump are.
func TestRunWritesEveryOutputItCan(t *testing.T) {
	dir := t.TempDir()
	metrics, weights, trace, dumps := filepath.Join(dir, "m.json"), filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "t.json"), filepath.Join(dir, "d")
	// The metrics and the weights fail as a full disk fails them, after
	// the paths were found writable.
	failWrite = func(flag string, write func(string) error) func(string) error {
		if flag != "metrics" && flag != "save" {
			return write
		}
		return func(string) error { return syscall.ENOSPC }
	}
	t.Cleanup(func() { failWrite = nil })
	err := mainNoPanic(t, append(slices.Clone(tinyGPT), "--run", "--steps", "2", "--eval-batches", "1",
		"--metrics", metrics, "--save", weights, "--trace", trace, "--dump", dumps))
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 2, "%s", err)
	assert.True(t, slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "--metrics: ") }), "%s", err)
	assert.True(t, slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "--save: ") }), "%s", err)
	raw, err := os.ReadFile(trace)
	require.NoError(t, err)
	assert.True(t, json.Valid(raw), "the trace is written")
	assert.FileExists(t, filepath.Join(dumps, "index.html"))
	assert.NoFileExists(t, metrics)
	assert.NoFileExists(t, weights)
}

// A run stopped early (--stop-after here; SIGTERM and SIGINT stop at the
// same step boundary) writes every output: the metrics of the steps done,
// the trace, the weights and the dump; outputs go into folders that did
// not exist, which the refused runs above never leave behind.
func TestStoppedRunWritesEveryOutput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "folders")
	metrics, weights, trace, dumps := filepath.Join(dir, "a", "m.json"), filepath.Join(dir, "b", "w.safetensors"), filepath.Join(dir, "c", "t.json"), filepath.Join(dir, "d")
	require.NoError(t, mainNoPanic(t, append(slices.Clone(tinyGPT), "--run", "--steps", "4", "--stop-after", "2", "--eval-batches", "1",
		"--metrics", metrics, "--save", weights, "--trace", trace, "--dump", dumps)))
	m := readMetrics(t, metrics)
	assert.Len(t, m.Steps, 2)
	assert.Equal(t, "--stop-after", m.Stopped)
	ts, _, err := checkpoint.Load(weights)
	require.NoError(t, err)
	assert.NotEmpty(t, ts)
	assert.FileExists(t, trace)
	assert.FileExists(t, filepath.Join(dumps, "index.html"))
}

// --stop-after-time ends the run, with a checkpoint, at the first step
// boundary past the wall time since the process started (here one
// nanosecond: the first step), exits 0 as --stop-after does, and names
// the checkpoint to continue from; the resumed run finishes.
func TestStopAfterTimeSavesAndEnds(t *testing.T) {
	dir := t.TempDir()
	metrics, ckpt := filepath.Join(dir, "m.json"), filepath.Join(dir, "ckpt")
	log, err := captureStderr(t, func() error {
		return mainNoPanic(t, append(slices.Clone(tinyGPT), "--run", "--steps", "4", "--stop-after-time", "1ns", "--eval-batches", "1",
			"--checkpoint-dir", ckpt, "--metrics", metrics))
	})
	require.NoError(t, err)
	m := readMetrics(t, metrics)
	assert.Len(t, m.Steps, 1)
	assert.Equal(t, "--stop-after-time 1ns", m.Stopped)
	assert.Contains(t, log, "stopped by --stop-after-time 1ns after step 1 of 4: continue with --resume "+filepath.Join(ckpt, "step-00000001"))
	require.NoError(t, mainNoPanic(t, append(slices.Clone(tinyGPT), "--run", "--steps", "4", "--eval-batches", "1", "--resume", ckpt, "--metrics", metrics)))
	steps := readMetrics(t, metrics).Steps
	require.Len(t, steps, 4, "the first run's step and the resumed run's")
	assert.Equal(t, 4, steps[3].Step)
}

// A reused --dump folder is cleared of the previous dump's files, and of
// nothing else: another compile's NN-<pass>.gir would read as this one's.
func TestReusedDumpIsCleared(t *testing.T) {
	dumps := filepath.Join(t.TempDir(), "d")
	stale := []string{"07-stale-pass.gir", "99-old.failed.gir", "100-many.gir", "schedule.txt"}
	kept := []string{"notes.txt", "7-one-digit.gir", "01-pass.gir.txt", "ab-pass.gir", "12-.gir", ".hidden.gir"}
	// An earlier dump's files, as a dump writes them (a file of a dump's
	// name that is not one is refused: TestOutputsNeverWriteIntoACheckpoint).
	for _, f := range stale {
		text := "gir 1\nfrom before\n"
		if f == "schedule.txt" {
			text = "schedule 1f1b p=2 v=1 m=4\n"
		}
		writeFile(t, filepath.Join(dumps, f), text)
	}
	for _, f := range kept {
		writeFile(t, filepath.Join(dumps, f), "from before\n")
	}
	writeFile(t, filepath.Join(dumps, "index.html"), "<title>gcompile: the previous index</title>\n")
	mkdir(t, filepath.Join(dumps, "05-folder.gir"))
	require.NoError(t, mainNoPanic(t, append(slices.Clone(tinyGPT), "--dump", dumps)))
	for _, f := range stale {
		assert.NoFileExists(t, filepath.Join(dumps, f))
	}
	for _, f := range kept {
		raw, err := os.ReadFile(filepath.Join(dumps, f))
		require.NoError(t, err, f)
		assert.Equal(t, "from before\n", string(raw), f)
	}
	assert.DirExists(t, filepath.Join(dumps, "05-folder.gir"), "only files go")
	html, err := os.ReadFile(filepath.Join(dumps, "index.html"))
	require.NoError(t, err)
	assert.Contains(t, string(html), "autodiff", "this compile's index")
	assert.FileExists(t, filepath.Join(dumps, dumpName(t, "autodiff")))
	for _, name := range []string{"00-input.gir", "index.html", "schedule.txt", "12-pass.gir", "03-autodiff.failed.gir", "100-x.gir"} {
		assert.True(t, isDumpFile(name), name)
	}
	for _, name := range kept {
		assert.False(t, isDumpFile(name), name)
	}
}

// A dump's own .gir reloaded with --dump into its folder is refused before
// anything is removed (the dump would delete it before reading it), and a
// model that fails to build leaves the previous dump as it was.
func TestDumpKeepsItsInputsAndTheLastGoodDump(t *testing.T) {
	dumps := filepath.Join(t.TempDir(), "d")
	require.NoError(t, mainNoPanic(t, append(slices.Clone(tinyGPT), "--dump", dumps)))
	before := map[string][]byte{}
	entries, err := os.ReadDir(dumps)
	require.NoError(t, err)
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dumps, e.Name()))
		require.NoError(t, err)
		before[e.Name()] = raw
	}
	unchanged := func(what string) {
		t.Helper()
		for name, raw := range before {
			got, err := os.ReadFile(filepath.Join(dumps, name))
			require.NoError(t, err, "%s: %s", what, name)
			assert.Equal(t, raw, got, "%s: %s", what, name)
		}
	}
	gir := filepath.Join(dumps, dumpName(t, "autodiff"))
	err = mainNoPanic(t, []string{gir, "--dump", dumps})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the model file "+gir+" is in --dump "+dumps)
	assert.Contains(t, err.Error(), "copy it out, or dump into another folder")
	unchanged("a .gir reloaded into its dump")

	broken := filepath.Join(t.TempDir(), "model.go")
	writeFile(t, broken, "package m\n\nfunc Model(b *frontend.Builder) {\n")
	require.Error(t, mainNoPanic(t, []string{broken, "--dump", dumps}))
	unchanged("a model that does not build")
}

// A pass that fails leaves the module as it left it in NN-<pass>.failed.gir,
// and only there; a failure after the passes (here the memory plan over --device-memory)
// is no pass's, and leaves none.
func TestDumpNamesOnlyAFailingPass(t *testing.T) {
	failed := func(d string) []string {
		var out []string
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".failed.gir") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	model := []string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=15", "--batch", "8", "--devices", "2", "--tp", "2"}
	d := filepath.Join(t.TempDir(), "d")
	require.Error(t, mainNoPanic(t, append(slices.Clone(model), "--sequence-parallel", "--dump", d)))
	assert.Equal(t, []string{dumpName(t, "shard")[:3] + "shard.failed.gir"}, failed(d))
	// Only as failed: a plain NN-shard.gir of the half-placed module
	// would read as a dump to resume, and fail there blaming an edit.
	assert.NoFileExists(t, filepath.Join(d, dumpName(t, "shard")))
	d = filepath.Join(t.TempDir(), "d")
	require.Error(t, mainNoPanic(t, append(slices.Clone(model), "--device-memory", "100KB", "--dump", d)))
	assert.Empty(t, failed(d))
}

// The vocab bound is read from the compiled module under any plan (the
// ids reach the embedding through the microbatch pass's slices, and the
// table is vocab-parallel under tp), and a corpus within it trains.
func TestVocabIsReadFromTheModule(t *testing.T) {
	set := "layers=2,hidden=32,heads=2,seq=16,vocab=128"
	for _, plan := range [][]string{
		nil,
		{"--devices", "2", "--tp", "2"},
		{"--devices", "2", "--pp", "2", "--microbatches", "2"},
		{"--devices", "2", "--dp", "2", "--dp-sync", "async"},
	} {
		c, err := parseArgs(append([]string{gptModel, "--set", set, "--batch", "4"}, plan...))
		require.NoError(t, err)
		res, err := compile.Compile(&c.Config, passes.Hooks{})
		require.NoError(t, err, "%v", plan)
		vocab, where := tokenRange(res.Module)
		assert.Equal(t, 128, vocab, "%v", plan)
		assert.Contains(t, where, "model.go:", "%v", plan)
	}
	path := filepath.Join(t.TempDir(), "ascii.txt")
	writeFile(t, path, text(6000))
	m := runMetrics(t, gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16,vocab=128", "--batch", "4", "--data", path, "--run", "--steps", "1", "--eval-batches", "1")
	assert.Len(t, m.Steps, 1)
}

// The processes of one job check the same missing output folder at once;
// one removing the folder it made must not fail another's check.
func TestOutputFolderProbedConcurrently(t *testing.T) {
	for round := range 20 {
		dir := filepath.Join(t.TempDir(), fmt.Sprint("ckpt", round), "deep")
		var g errgroup.Group
		for range 8 {
			g.Go(func() error { return checkOutputDir("checkpoint-dir", dir) })
		}
		require.NoError(t, g.Wait())
	}
}

// A second --set adds to the first, a key given again taking its new
// value; a key twice in one list is the model's error to name.
func TestSetFlagJoins(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"layers=1"}, "layers=1"},
		{[]string{"layers=1", "hidden=32"}, "layers=1,hidden=32"},
		{[]string{"layers=1,hidden=64", "hidden=32,heads=2"}, "layers=1,hidden=32,heads=2"},
		{[]string{"layers=1", ""}, "layers=1"},
		{[]string{"", "layers=1"}, "layers=1"},
		{[]string{"layers=1,layers=2"}, "layers=1,layers=2"},
	} {
		var got string
		for _, s := range tc.sets {
			require.NoError(t, setFlag{&got}.Set(s))
		}
		assert.Equal(t, tc.want, got, "%q", tc.sets)
	}
	c, err := parseArgs([]string{gptModel, "--set", "layers=1", "--set", "hidden=32,heads=2,seq=16"})
	require.NoError(t, err)
	assert.Equal(t, "layers=1,hidden=32,heads=2,seq=16", c.Set)
}

// --master-port 0 keeps the launcher's port, or the default, as its help
// says, instead of asking for port 0.
func TestMasterPortZeroKeepsTheDefault(t *testing.T) {
	c, err := parseArgs([]string{gptModel, "--master-port", "0", "--rank", "0", "--world-size", "2"})
	require.NoError(t, err)
	w, err := worldOf(c)
	require.NoError(t, err)
	assert.Equal(t, dist.DefaultMasterPort, w.MasterPort)
}

// A run on a folder of text refuses, before it trains, outputs that
// would lie among the files it reads: the next run would train on them,
// and a --resume would find other data. A hidden folder inside it, which
// the loader skips, and --save's binary weights are accepted.
func TestOutputsInsideTheTextDataAreRefused(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text")
	require.NoError(t, os.MkdirAll(text, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(text, "a.txt"), bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 200), 0o644))
	base := []string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "4", "--run", "--steps", "1", "--eval-batches", "-1", "--data", text}
	for _, flag := range []string{"metrics", "report", "checkpoint-dir", "dump"} {
		path := filepath.Join(text, "out", flag)
		if flag == "report" {
			path += ".html"
		}
		err := mainErr(append(slices.Clone(base), "--"+flag, path))
		require.Error(t, err, flag)
		assert.ErrorContains(t, err, "--"+flag+" "+path+" is inside --data "+text+", whose text files every run on it reads", flag)
		_, serr := os.Stat(filepath.Join(text, "out"))
		assert.ErrorIs(t, serr, fs.ErrNotExist, "nothing written for --%s", flag)
	}
	require.NoError(t, mainErr(append(slices.Clone(base), "--metrics", filepath.Join(text, ".runs", "m.json"), "--save", filepath.Join(text, "w.safetensors"))))
	// One process writes no log in --log-dir, which is noted as unused;
	// a launch of two would, and is refused before it starts any.
	require.NoError(t, mainErr(append(slices.Clone(base), "--log-dir", filepath.Join(text, "logs"))))
	assert.NoDirExists(t, filepath.Join(text, "logs"), "nor makes the folder")
	err := mainErr(append([]string{"launch", "--nproc", "2", "--"}, append(slices.Clone(base), "--devices", "2", "--dp", "2", "--log-dir", filepath.Join(text, "logs"))...))
	require.Error(t, err)
	assert.ErrorContains(t, err, "launch: no process started: ")
	assert.ErrorContains(t, err, "--log-dir "+filepath.Join(text, "logs")+" is inside --data "+text)
}
