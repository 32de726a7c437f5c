package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/internal/fifotest"
	"gcompile/internal/pidlock"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda/fakegpu"
)

// ckptGPT is the model of the checkpoint tests: two layers, so a
// pipeline has a layer per stage.
var ckptGPT = []string{gptModel, "--set", "layers=2,hidden=32,heads=2,seq=16", "--batch", "4", "--max-data-mb", "1",
	"--run", "--eval-batches", "1", "--warmup", "3"}

// stateSums are a checkpoint's files and their checksums: equal sums of
// the same plan's checkpoints mean bit-identical params, optimizer state
// and blocks.
func stateSums(t *testing.T, dir string) map[string]checkpoint.Sum {
	t.Helper()
	m, err := checkpoint.ReadManifest(dir)
	require.NoError(t, err)
	return m.Files
}

// dumps holds the .gir dumps gir made, by model and sizes; dumpRoot is
// their folder, removed by TestMain.
var (
	dumpsMu  sync.Mutex
	dumps    = map[string]string{}
	dumpRoot string
)

// gir replaces a model.go and its --set and --batch in args by the dump of
// that model at those sizes before any pass, made once per test binary:
// parsing a dump takes milliseconds where building a model.go takes a Go
// build, and the module (its fingerprint too) is the same.
func gir(t testing.TB, args []string) []string {
	t.Helper()
	model := args[0]
	var set, batch string
	var rest []string
	for i := 1; i < len(args); i++ {
		switch args[i] {
		case "--set":
			set, i = args[i+1], i+1
		case "--batch":
			batch, i = args[i+1], i+1
		default:
			rest = append(rest, args[i])
		}
	}
	key := model + " " + set + " " + batch
	dumpsMu.Lock()
	defer dumpsMu.Unlock()
	path, ok := dumps[key]
	if !ok {
		if dumpRoot == "" {
			var err error
			dumpRoot, err = os.MkdirTemp("", "gcompile-ckpt-dumps")
			require.NoError(t, err)
		}
		dir := filepath.Join(dumpRoot, strconv.Itoa(len(dumps)))
		made := []string{model, "--dump", dir}
		if set != "" {
			made = append(made, "--set", set)
		}
		if batch != "" {
			made = append(made, "--batch", batch)
		}
		require.NoError(t, mainErr(made))
		path = filepath.Join(dir, "00-input.gir")
		dumps[key] = path
	}
	return append([]string{path}, rest...)
}

func losses(m runtime.Metrics) []float64 {
	var out []float64
	for _, s := range m.Steps {
		out = append(out, s.Loss)
	}
	return out
}

// A run stopped at step 10 and resumed to 20 is bit for bit the run that
// never stopped: the same losses at steps 11–20, the same held-out loss
// and the same final params and optimizer state, under every plan.
func TestResumeIsBitIdentical(t *testing.T) {
	cases := []struct {
		name string
		plan []string
	}{
		{"one device", nil},
		{"dp2 ZeRO-2", []string{"--devices", "2", "--dp", "2", "--zero", "2"}},
		{"pp2 1F1B", []string{"--devices", "2", "--pp", "2", "--microbatches", "2"}},
		// Overflows halve the scale from 2^20 for the first steps, on both
		// sides of the checkpoint.
		{"fp16 dynamic scaling with skipped steps", []string{"--precision", "fp16", "--initial-loss-scale", "1048576"}},
	}
	if fullMatrix() {
		cases = append(cases, []struct {
			name string
			plan []string
		}{
			{"tp2 sp", []string{"--devices", "2", "--tp", "2", "--sequence-parallel"}},
			{"pp2 interleaved", []string{"--devices", "2", "--pp", "2", "--vpp", "2", "--microbatches", "2", "--set", "layers=4,hidden=32,heads=2,seq=16"}},
			{"2BW", []string{"--devices", "2", "--pp", "2", "--microbatches", "2", "--schedule", "2bw"}},
			{"bf16", []string{"--precision", "bf16"}},
			{"offload", []string{"--offload", "optimizer,params"}},
			{"tp2 pp2 dp2 ZeRO-1", []string{"--devices", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--zero", "1", "--microbatches", "2"}},
		}...)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			run := func(extra ...string) runtime.Metrics {
				args := append(append(slices.Clone(ckptGPT), "--steps", "20"), tc.plan...)
				return runMetrics(t, gir(t, append(args, extra...))...)
			}
			whole := run("--checkpoint-dir", filepath.Join(dir, "whole"))
			first := run("--checkpoint-dir", filepath.Join(dir, "cut"), "--stop-after", "10")
			require.Len(t, first.Steps, 10)
			assert.Equal(t, filepath.Join(dir, "cut", "step-00000010"), first.Checkpoint)
			rest := run("--checkpoint-dir", filepath.Join(dir, "cut"), "--resume", filepath.Join(dir, "cut"))
			require.NotNil(t, rest.ResumedFrom)
			assert.Equal(t, 10, rest.ResumedFrom.Step)
			require.Len(t, rest.Steps, 10)
			assert.Equal(t, 11, rest.Steps[0].Step)
			assert.Equal(t, losses(whole)[10:], losses(rest), "losses of steps 11–20")
			assert.Equal(t, whole.Eval[len(whole.Eval)-1], rest.Eval[len(rest.Eval)-1], "held-out loss at the end")
			assert.Equal(t, stateSums(t, checkpoint.StepDir(filepath.Join(dir, "whole"), 20)), stateSums(t, checkpoint.StepDir(filepath.Join(dir, "cut"), 20)),
				"the final params and optimizer state")
			if strings.Contains(tc.name, "skipped") {
				skipped := func(ss []runtime.StepMetrics) int {
					n := 0
					for _, s := range ss {
						if s.Skipped {
							n++
						}
					}
					return n
				}
				require.Positive(t, skipped(first.Steps), "a step before the checkpoint was skipped")
				assert.Equal(t, losses(whole)[:10], losses(first))
				m, err := checkpoint.ReadManifest(checkpoint.StepDir(filepath.Join(dir, "cut"), 10))
				require.NoError(t, err)
				require.NotNil(t, m.State.LossScale)
				assert.Equal(t, 10-skipped(first.Steps), m.State.OptStep, "skipped steps do not count as optimizer steps")
				assert.Equal(t, whole.Steps[10].LossScale, rest.Steps[0].LossScale, "the loss scale continues")
			}
		})
	}
}

// reshardGPT has heads and layers for tp4 and pp4 with two chunks a rank.
var reshardGPT = []string{gptModel, "--set", "layers=8,hidden=32,heads=4,seq=16", "--batch", "8", "--max-data-mb", "1",
	"--run", "--eval-batches", "1", "--warmup", "3", "--steps", "14"}

// A checkpoint saved under one plan continues under any other like the
// run that never stopped.
func TestResumeUnderAnotherPlan(t *testing.T) {
	dir := t.TempDir()
	whole := runMetrics(t, gir(t, reshardGPT)...)
	cases := []struct {
		from []string
		to   [][]string
	}{
		{[]string{"--devices", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--microbatches", "2"}, [][]string{
			nil,
			{"--devices", "4", "--dp", "4", "--zero", "3"},
			{"--devices", "4", "--tp", "4"},
			{"--devices", "4", "--pp", "4", "--vpp", "2", "--microbatches", "4"},
		}},
		{nil, [][]string{{"--devices", "4", "--tp", "2", "--pp", "2", "--microbatches", "2"}}},
	}
	if !fullMatrix() {
		cases[0].to = cases[0].to[1:3]
	}
	for i, tc := range cases {
		saved := filepath.Join(dir, strconv.Itoa(i))
		require.NoError(t, mainErr(gir(t, append(append(slices.Clone(reshardGPT), tc.from...), "--checkpoint-dir", saved, "--stop-after", "10"))))
		for _, to := range tc.to {
			t.Run(fmt.Sprintf("%v to %v", tc.from, to), func(t *testing.T) {
				rest := runMetrics(t, gir(t, append(append(slices.Clone(reshardGPT), to...), "--resume", saved))...)
				want := losses(whole)[10:]
				got := losses(rest)
				require.Len(t, got, len(want))
				for k := range want {
					assert.InEpsilon(t, want[k], got[k], 1e-5, "step %d", 11+k)
				}
			})
		}
	}
}

// The Llama's grouped-query k/v projections are split over tp2 (2 k/v
// heads) and replicated over tp4: a checkpoint of one continues in the
// other.
func TestLlamaResumesWithKVHeadsReplicated(t *testing.T) {
	llama := []string{llamaModel, "--set", "layers=4,hidden=32,heads=4,kv_heads=2,ffn=64,seq=16", "--batch", "8", "--max-data-mb", "1",
		"--run", "--eval-batches", "1", "--warmup", "3", "--steps", "12"}
	whole := runMetrics(t, gir(t, llama)...)
	ck := filepath.Join(t.TempDir(), "ck")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(llama), "--devices", "4", "--tp", "2", "--pp", "2", "--microbatches", "2", "--checkpoint-dir", ck, "--stop-after", "6"))))
	rest := runMetrics(t, gir(t, append(slices.Clone(llama), "--devices", "4", "--tp", "4", "--resume", ck))...)
	want, got := losses(whole)[6:], losses(rest)
	require.Len(t, got, len(want))
	for k := range want {
		assert.InEpsilon(t, want[k], got[k], 1e-5, "step %d", 7+k)
	}
}

// A file --save writes under any plan loads under that plan and on one
// device with the same step-1 loss.
func TestSaveLoadRoundTripsUnderEveryPlan(t *testing.T) {
	plans := [][]string{
		{"--devices", "4", "--tp", "2", "--pp", "2", "--microbatches", "2"},
		{"--devices", "2", "--dp", "2", "--zero", "3", "--precision", "bf16"},
	}
	if fullMatrix() {
		plans = append(plans,
			[]string{"--devices", "2", "--tp", "2", "--sequence-parallel"},
			[]string{"--devices", "2", "--pp", "2", "--vpp", "2", "--microbatches", "2", "--set", "layers=4,hidden=32,heads=2,seq=16"},
			[]string{"--devices", "4", "--dp", "4", "--zero", "2"},
			[]string{"--precision", "fp16"},
		)
	}
	for _, plan := range plans {
		t.Run(strings.Join(plan, " "), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "w.safetensors")
			require.NoError(t, mainErr(gir(t, append(append(append(slices.Clone(ckptGPT), "--steps", "5", "--lr", "1e-2"), plan...), "--save", file))))
			step1 := func(plan ...string) float64 {
				return runMetrics(t, gir(t, append(append(slices.Clone(ckptGPT), "--steps", "1", "--load", file), plan...))...).Steps[0].Loss
			}
			var model []string // the plan's model sizes, if it sets them
			if i := slices.Index(plan, "--set"); i >= 0 {
				model = plan[i : i+2]
			}
			tol := 1e-5
			if slices.Contains(plan, "--precision") {
				tol = 2e-3 // the plan's step runs in 16 bits
			}
			assert.InEpsilon(t, step1(model...), step1(plan...), tol, "step-1 loss on one device and under the plan")
		})
	}
}

// compiled is a plan of reshardGPT compiled as the CLI does, with its
// cluster.
func compiled(t *testing.T, plan ...string) (*compile.Result, *cpu.Cluster) {
	t.Helper()
	c, err := parseArgs(gir(t, append(slices.Clone(reshardGPT), plan...)))
	require.NoError(t, err)
	res, err := compile.Compile(&c.Config, passes.Hooks{})
	require.NoError(t, err)
	cl, err := cpu.NewPipelineCluster(res.Programs, cpu.Options{})
	require.NoError(t, err)
	return res, cl
}

// Loading a checkpoint under another plan and saving it again gives back
// every param and optimizer state bit for bit: blocks are moved, never
// converted.
func TestReshardingKeepsEveryBit(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(reshardGPT), "--devices", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--zero", "1",
		"--microbatches", "2", "--checkpoint-dir", src, "--stop-after", "4"))))
	saved := checkpoint.StepDir(src, 4)
	for i, plan := range [][]string{{"--devices", "4", "--tp", "4"}, {"--devices", "4", "--dp", "2", "--pp", "2", "--vpp", "2", "--zero", "3", "--microbatches", "2"}} {
		res, cl := compiled(t, plan...)
		m, err := checkpoint.RestoreState(cl, res.Programs, saved, checkpoint.Expect{ModelFingerprint: res.ModelFingerprint,
			Plan: checkpoint.Plan{Precision: "fp32", Optimizer: "adamw", Batch: 8, Seq: 16, DPSync: "sync"}})
		require.NoError(t, err, "%v", plan)
		again, err := checkpoint.SaveState(cl, res.Programs, checkpoint.SaveOptions{Root: filepath.Join(dir, strconv.Itoa(i)), State: m.State})
		require.NoError(t, err)
		for _, kind := range []lower.BufferKind{lower.Param, lower.State} {
			_, want, err := checkpoint.Consolidate(saved, kind)
			require.NoError(t, err)
			_, got, err := checkpoint.Consolidate(again, kind)
			require.NoError(t, err)
			require.Equal(t, len(want), len(got))
			for k := range want {
				require.Equal(t, want[k].Name, got[k].Name)
				require.True(t, slices.Equal(want[k].Data, got[k].Data), "%v: %s %q changed", plan, kind, want[k].Name)
			}
		}
	}
}

// snapshot is every file under dir with its content, to show a failed
// load changed nothing.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		out[p] = string(raw)
		return err
	}))
	return out
}

// Every way a checkpoint can be broken or foreign is a named error before
// any step, and leaves the checkpoint as it was.
func TestBadCheckpointsAreNamedErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", "4", "--devices", "2", "--dp", "2", "--checkpoint-dir", good, "--stop-after", "2"))))
	step := checkpoint.StepDir(good, 2)
	cases := []struct {
		name   string
		break_ func(t *testing.T, ck string)
		args   []string
		want   []string
		is     error
	}{
		{"missing shard", func(t *testing.T, ck string) {
			require.NoError(t, os.Remove(filepath.Join(ck, "rank-00000.safetensors")))
		},
			nil, []string{"rank-00000.safetensors is missing"}, checkpoint.ErrCorrupt},
		{"checksum", func(t *testing.T, ck string) { flipByte(t, filepath.Join(ck, "rank-00000.safetensors"), -3) },
			nil, []string{"CRC-32C", "the manifest says"}, checkpoint.ErrCorrupt},
		{"truncated", func(t *testing.T, ck string) {
			p := filepath.Join(ck, "rank-00000.safetensors")
			fi, err := os.Stat(p)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(p, fi.Size()/2))
		}, nil, []string{"truncated"}, checkpoint.ErrCorrupt},
		{"newer format", func(t *testing.T, ck string) { editManifest(t, ck, `"version": 1`, `"version": 2`) },
			nil, []string{"manifest version 2", "reads version 1"}, checkpoint.ErrVersion},
		{"no manifest", func(t *testing.T, ck string) {
			require.NoError(t, os.Remove(filepath.Join(ck, checkpoint.ManifestName)))
		},
			nil, []string{"no complete checkpoint"}, checkpoint.ErrNoCheckpoint},
		{"a file outside its folder", func(t *testing.T, ck string) {
			editManifest(t, ck, `"rank-00000.safetensors"`, `"../rank-00000.safetensors"`)
		}, nil, []string{`file "../rank-00000.safetensors" is not a name in the checkpoint's folder`}, checkpoint.ErrCorrupt},
		{"another model", nil, []string{"--set", "layers=2,hidden=32,heads=4,seq=16"}, []string{"another model"}, checkpoint.ErrMismatch},
		{"another batch", nil, []string{"--batch", "8"}, []string{"--batch 4", "this run has 8"}, checkpoint.ErrMismatch},
		{"another optimizer", nil, []string{"--optimizer", "sgd"}, []string{"--optimizer adamw"}, checkpoint.ErrMismatch},
		{"another precision", nil, []string{"--precision", "bf16"}, []string{"--precision fp32"}, checkpoint.ErrMismatch},
		{"another seed", nil, []string{"--seed", "7"}, []string{"seeded with 1, not --seed 7"}, nil},
		{"another schedule's state", nil, []string{"--devices", "2", "--pp", "2", "--microbatches", "2", "--schedule", "2bw"},
			[]string{"saved with --schedule none and this run has --schedule 2bw", "2bw.prev/", "resume without --schedule 2bw"}, checkpoint.ErrMismatch},
		{"a plan that cannot hold it", nil, []string{"--devices", "3", "--tp", "3"}, []string{"tp=3 must divide"}, nil},
		{"past the run's steps", nil, []string{"--steps", "1"}, []string{"at step 2, past --steps 1"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ck := filepath.Join(t.TempDir(), "ck")
			require.NoError(t, os.CopyFS(ck, os.DirFS(step)))
			if tc.break_ != nil {
				tc.break_(t, ck)
			}
			before := snapshot(t, ck)
			args := append(append(slices.Clone(ckptGPT), "--steps", "4", "--resume", ck), tc.args...)
			err := mainErr(gir(t, args))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
			assert.Equal(t, before, snapshot(t, ck), "the checkpoint is unchanged")
		})
	}
	// What the manifest alone tells is found before the compile: launch
	// refuses it before any process starts.
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "1", "--devices", "2", "--dp", "2", "--resume", step))
	err := mainErr(append([]string{"launch", "--nproc", "2", "--"}, args...))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "launch: no process started: --resume")
	assert.Contains(t, err.Error(), "at step 2, past --steps 1")
}

// A run killed after its last checkpoint, before its outputs were
// written, finishes when the same command runs again with --resume: it
// writes the weights and metrics it owed (the weights the uninterrupted
// run saved, byte for byte; its held-out loss) and exits 0.
func TestResumingAFinishedRunWritesItsOutputs(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	args := func(tag string) []string {
		return gir(t, append(slices.Clone(ckptGPT), "--steps", "4", "--checkpoint-dir", ck,
			"--save", filepath.Join(dir, tag+".safetensors"), "--metrics", filepath.Join(dir, tag+".json")))
	}
	require.NoError(t, mainErr(args("first")))
	require.NoError(t, mainErr(append(args("again"), "--resume", ck)))
	first, again := readMetrics(t, filepath.Join(dir, "first.json")), readMetrics(t, filepath.Join(dir, "again.json"))
	assert.Empty(t, again.Steps, "no step ran")
	require.NotNil(t, again.Steps, "a list, not null")
	require.NotEmpty(t, first.Eval)
	require.Len(t, again.Eval, 1)
	assert.Equal(t, first.Eval[len(first.Eval)-1], again.Eval[0], "the final held-out loss")
	assert.Equal(t, checkpoint.StepDir(ck, 4), again.Checkpoint)
	w1, err := os.ReadFile(filepath.Join(dir, "first.safetensors"))
	require.NoError(t, err)
	w2, err := os.ReadFile(filepath.Join(dir, "again.safetensors"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(w1, w2), "the weights it owed are the finished run's")
}

// --resume takes a step folder as people type it (ck/step-2 for
// ck/step-00000002); a step never saved is refused before any work,
// naming the checkpoints there are, newest first.
func TestResumeTakesTheStepAsTyped(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	args := append(slices.Clone(ckptGPT), "--steps", "4")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(args), "--checkpoint-dir", ck, "--checkpoint-every", "1", "--stop-after", "3"))))
	tests := []struct {
		resume string
		step   int    // the checkpoint resumed from
		err    string // or the error
	}{
		{"step-2", 2, ""},
		{"step-0002", 2, ""},
		{"step-00000001", 1, ""},
		{"step-7", 0, "--resume: checkpoint " + filepath.Join(ck, "step-7") + " does not exist; " + ck + " holds " +
			strings.Join([]string{checkpoint.StepDir(ck, 3), checkpoint.StepDir(ck, 2), checkpoint.StepDir(ck, 1)}, ", ") + " (newest first)"},
	}
	for _, tc := range tests {
		t.Run(tc.resume, func(t *testing.T) {
			resume := filepath.Join(ck, tc.resume)
			if tc.err != "" {
				err := mainErr(gir(t, append(slices.Clone(args), "--resume", resume)))
				require.Error(t, err)
				assert.ErrorContains(t, err, tc.err)
				return
			}
			m := runMetrics(t, gir(t, append(slices.Clone(args), "--resume", resume))...)
			require.NotNil(t, m.ResumedFrom)
			assert.Equal(t, checkpoint.StepDir(ck, tc.step), m.ResumedFrom.Checkpoint)
			assert.Equal(t, tc.step, m.ResumedFrom.Step)
			require.NotEmpty(t, m.Steps)
			assert.Equal(t, tc.step+1, m.Steps[0].Step)
		})
	}
}

func flipByte(t *testing.T, path string, at int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	raw[len(raw)+at] ^= 0x40
	require.NoError(t, os.WriteFile(path, raw, 0o644))
}

// editManifest replaces old with new in dir's manifest and removes its
// checksum, as a user editing it on purpose does, so the checks after the
// checksum's see the edit.
func editManifest(t *testing.T, dir, old, new string) {
	t.Helper()
	p := filepath.Join(dir, checkpoint.ManifestName)
	raw, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Contains(t, string(raw), old)
	raw = []byte(strings.Replace(string(raw), old, new, 1))
	checksum := regexp.MustCompile(`,\n *"checksum": "[0-9a-f]+"`)
	require.Len(t, checksum.FindAll(raw, -1), 1, "a save's manifest has a checksum")
	require.NoError(t, os.WriteFile(p, checksum.ReplaceAll(raw, nil), 0o644))
}

// Killed (kill -9) at any point of a save, a run leaves a checkpoint
// folder whose latest complete checkpoint loads, and resuming from it
// ends bit for bit where the run that was never killed does.
func TestKilledDuringSaveLeavesALoadableCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "6", "--checkpoint-every", "2", "--keep-last", "2"))
	clean := filepath.Join(dir, "clean")
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", clean)))
	want := stateSums(t, checkpoint.StepDir(clean, 6))
	// A one-device save has 5 fault points (the rank file written, then
	// synced; shards without a manifest; the manifest written; committed),
	// so the three saves have 15; past them the run ends normally.
	points := make([]int, 20)
	for k := range points {
		points[k] = k + 1
	}
	if !fullMatrix() {
		// Four points, seeded: a different four for another seed.
		rand.New(rand.NewPCG(12, 0)).Shuffle(len(points), func(i, j int) { points[i], points[j] = points[j], points[i] })
		points = points[:4]
	}
	for _, k := range points {
		t.Run(fmt.Sprintf("kill at point %d", k), func(t *testing.T) {
			ck := filepath.Join(t.TempDir(), "ck")
			cmd := exec.Command(os.Args[0], append(slices.Clone(args), "--checkpoint-dir", ck)...)
			cmd.Env = append(os.Environ(), asMainEnv+"=1", checkpoint.FaultEnv+"="+strconv.Itoa(k))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				// Past the last point the run ends normally.
				require.NoError(t, err, "%s", out)
			}
			found, err := checkpoint.Find(ck)
			if errors.Is(err, checkpoint.ErrNoCheckpoint) {
				_, statErr := os.Stat(checkpoint.StepDir(ck, 2))
				assert.True(t, os.IsNotExist(statErr), "no checkpoint committed yet: %s", out)
				return
			}
			require.NoError(t, err)
			m, err := checkpoint.ReadManifest(found)
			require.NoError(t, err)
			if m.State.Step == 6 {
				assert.Equal(t, want, stateSums(t, found))
				return
			}
			res := filepath.Join(t.TempDir(), "res")
			require.NoError(t, mainErr(append(slices.Clone(args), "--resume", found, "--checkpoint-dir", res)))
			assert.Equal(t, want, stateSums(t, checkpoint.StepDir(res, 6)), "resumed from step %d", m.State.Step)
		})
	}
}

// Killed after its last checkpoint's commit and before pruning, a run
// keeps one checkpoint more than --keep-last; rerun, it finds the run
// finished, writes what it owes and prunes. It kept the extra one.
func TestFinishedRunPrunesToKeepLast(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "6", "--checkpoint-every", "2", "--keep-last", "2"))
	ck := filepath.Join(t.TempDir(), "ck")
	// Five fault points a one-device save, the fifth its commit: the
	// third save's is the fifteenth.
	cmd := exec.Command(os.Args[0], append(slices.Clone(args), "--checkpoint-dir", ck)...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1", checkpoint.FaultEnv+"=15")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	steps, err := checkpoint.Steps(ck)
	require.NoError(t, err)
	require.Equal(t, []int{2, 4, 6}, steps, "killed before pruning: %s", out)
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", ck, "--resume", ck)))
	steps, err = checkpoint.Steps(ck)
	require.NoError(t, err)
	assert.Equal(t, []int{4, 6}, steps, "--keep-last 2")
}

// readerPy reads a safetensors file by hand with Python's standard
// library (an 8-byte length, a JSON header, raw little-endian data) and
// prints each tensor's name, dtype, shape and the sum of its F32 values.
const readerPy = `
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
for name in sorted(k for k in header if k != "__metadata__"):
    e = header[name]
    b, end = e["data_offsets"]
    assert e["dtype"] == "F32", e
    xs = struct.unpack("<%df" % ((end - b) // 4), data[b:end])
    print(name, e["dtype"], "x".join(map(str, e["shape"])), repr(sum(xs)))
`

// export writes a trained GPT's checkpoint as one file that an
// independent reader takes with Hugging Face GPT-2's names and shapes,
// that --load starts from, and as shards with an index that --load takes
// too.
func TestExportIsHuggingFaceWeights(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", "4", "--devices", "4", "--tp", "2", "--pp", "2", "--microbatches", "2",
		"--checkpoint-dir", ck, "--save", filepath.Join(dir, "saved.safetensors")))))
	out := filepath.Join(dir, "model.safetensors")
	// A run on bytes has no tokenizer to write beside the weights.
	llama3 := filepath.Join("..", "..", "data", "tokenizer", "testdata", "llama3")
	err := mainErr([]string{"export", ck, "--out", out, "--tokenizer", llama3})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--tokenizer "+llama3+": the checkpoint's run trained on bytes, one byte per token")
	assert.NoFileExists(t, out)
	require.NoError(t, mainErr([]string{"export", ck, "--out", out}))

	// The export is --save's file of the same weights, tensor for tensor.
	saved, _, err := checkpoint.Load(filepath.Join(dir, "saved.safetensors"))
	require.NoError(t, err)
	exported, meta, err := checkpoint.Load(out)
	require.NoError(t, err)
	assert.Equal(t, "pt", meta["format"])
	require.Equal(t, len(saved), len(exported))
	for i := range saved {
		assert.Equal(t, saved[i].Name, exported[i].Name)
		assert.Equal(t, saved[i].Shape, exported[i].Shape)
		assert.True(t, slices.Equal(saved[i].Data, exported[i].Data), "%s", saved[i].Name)
	}

	python, err := exec.LookPath("python3")
	if err != nil {
		missingLauncher(t, "no python3 to read the export independently")
	}
	text, err := exec.Command(python, "-c", readerPy, out).CombinedOutput()
	require.NoError(t, err, "%s", text)
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	require.Len(t, lines, 28, "the 2-layer GPT-2's tensors")
	shapes := map[string]string{}
	for _, l := range lines {
		f := strings.Fields(l)
		shapes[f[0]] = f[2]
	}
	// Hugging Face GPT-2's names and Conv1D [in,out] layouts.
	for name, shape := range map[string]string{"wte.weight": "256x32", "wpe.weight": "16x32", "h.0.attn.c_attn.weight": "32x96",
		"h.1.attn.c_proj.weight": "32x32", "h.0.mlp.c_fc.weight": "32x128", "h.1.mlp.c_proj.bias": "32", "ln_f.weight": "32"} {
		assert.Equal(t, shape, shapes[name], name)
	}

	// Beside them the model's config.json, as GPT2Config reads it: the
	// values the model computes with, not the library's defaults
	// (n_positions 1024).
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	for key, want := range map[string]any{"model_type": "gpt2", "architectures": []any{"GPT2LMHeadModel"}, "vocab_size": 256.0, "n_positions": 16.0,
		"n_embd": 32.0, "n_layer": 2.0, "n_head": 2.0, "n_inner": 128.0, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
		"tie_word_embeddings": true, "torch_dtype": "float32"} {
		assert.Equal(t, want, cfg[key], key)
	}

	// Shards with an index load like the one file.
	// A name that fits as one file but not as a shard's (15 bytes longer)
	// is refused before anything is written.
	long := filepath.Join(dir, "long", strings.Repeat("m", maxOutputName-len(".safetensors")-10)+".safetensors")
	require.NoError(t, mainErr([]string{"export", ck, "--out", long}))
	require.NoError(t, os.Remove(long))
	err = mainErr([]string{"export", ck, "--out", long, "--max-shard-size", "40KB"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "go above --max-shard-size 40000 in shards named after --out")
	// The first shard of the fewest the weights take, not "of 00001".
	assert.Regexp(t, fmt.Sprintf(`-00001-of-0000[2-9].safetensors: a file name of %d bytes`, maxOutputName+5), err.Error())
	left, err := os.ReadDir(filepath.Join(dir, "long"))
	require.NoError(t, err)
	assert.Len(t, left, 1, "only the config.json of the first export: %v", left)
	require.NoError(t, mainErr([]string{"export", ck, "--out", filepath.Join(dir, "sharded", "model.safetensors"), "--max-shard-size", "40KB"}))
	index := filepath.Join(dir, "sharded", "model.safetensors.index.json")
	shards, err := filepath.Glob(filepath.Join(dir, "sharded", "model-*-of-*.safetensors"))
	require.NoError(t, err)
	require.Greater(t, len(shards), 1)
	step1 := func(file string) float64 {
		m := runMetrics(t, gir(t, append(slices.Clone(ckptGPT), "--steps", "1", "--load", file))...)
		return m.Steps[0].Loss
	}
	assert.Equal(t, step1(out), step1(index))

	// Exported again under the same name in fewer shards, then as one
	// file: what the earlier export left and the new one does not
	// replace is gone, so a loader given the folder reads the new one.
	names := func() []string {
		entries, err := os.ReadDir(filepath.Join(dir, "sharded"))
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	require.NoError(t, mainErr([]string{"export", ck, "--out", filepath.Join(dir, "sharded", "model.safetensors"), "--max-shard-size", "100KB"}))
	fewer, err := filepath.Glob(filepath.Join(dir, "sharded", "model-*-of-*.safetensors"))
	require.NoError(t, err)
	require.Less(t, len(fewer), len(shards))
	assert.Len(t, names(), len(fewer)+2, "the new shards, their index and config.json: %v", names())
	require.NoError(t, mainErr([]string{"export", ck, "--out", filepath.Join(dir, "sharded", "model.safetensors")}))
	assert.Equal(t, []string{"config.json", "model.safetensors"}, names())
}

// inspect shows the state, the plan and every rank's file.
func TestInspectDescribesTheCheckpoint(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", "6", "--devices", "2", "--dp", "2", "--zero", "1",
		"--checkpoint-dir", ck, "--checkpoint-every", "2", "--keep-last", "2"))))
	entries, err := os.ReadDir(ck)
	require.NoError(t, err)
	var kept []string
	for _, e := range entries {
		kept = append(kept, e.Name())
	}
	assert.Equal(t, []string{"step-00000004", "step-00000006"}, kept, "--keep-last 2")
	m, err := checkpoint.ReadManifest(checkpoint.StepDir(ck, 6))
	require.NoError(t, err)
	text := checkpoint.Describe(ck, m)
	for _, want := range []string{"state: step 6, optimizer step 6, 24 samples consumed, seed 1", "mesh dp=2", "optimizer adamw",
		"rank-00000.safetensors", "rank-00001.safetensors"} {
		assert.Contains(t, text, want)
	}
	// ZeRO-1 splits the optimizer state over dp: both ranks write blocks.
	assert.Len(t, m.Files, 2)
	require.NoError(t, inspectMain([]string{ck}))

	// A flipped byte in a shard makes inspect fail, naming the file, as a
	// resume from it would.
	shard := filepath.Join(checkpoint.StepDir(ck, 6), "rank-00001.safetensors")
	raw, err := os.ReadFile(shard)
	require.NoError(t, err)
	raw[len(raw)-1] ^= 0xff
	require.NoError(t, os.WriteFile(shard, raw, 0o644))
	err = inspectMain([]string{ck})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot be resumed")
	assert.Contains(t, err.Error(), "rank-00001.safetensors has CRC-32C")
	assert.ErrorIs(t, err, checkpoint.ErrCorrupt)
}

// SIGTERM, SIGINT or SIGHUP (the terminal gone) during training stops at
// the next step boundary with a checkpoint and the outputs asked for,
// names it, and exits with the signal's status (143, 130, 129: the run
// did not finish); the run resumes from it bit for bit. So does a log
// whose reader went away (SIGPIPE, 141): the run does not die at its
// next line.
func TestSignalSavesAndExits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "100"))
	whole := filepath.Join(dir, "whole")
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", whole)))
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE} {
		t.Run(sig.String(), func(t *testing.T) {
			ck, metrics := filepath.Join(t.TempDir(), "ck"), filepath.Join(t.TempDir(), "m.json")
			cmd, stderr := startMain(t, append(slices.Clone(args), "--checkpoint-dir", ck, "--metrics", metrics)...)
			var log strings.Builder
			readUntil(t, stderr, &log, "step 5/100")
			if sig == syscall.SIGPIPE {
				// The log's reader goes away: its next line is the signal.
				require.NoError(t, stderr.(io.Closer).Close())
			} else {
				require.NoError(t, cmd.Process.Signal(sig))
				rest, _ := io.ReadAll(stderr)
				log.Write(rest)
			}
			var exit *exec.ExitError
			require.ErrorAs(t, cmd.Wait(), &exit, "%s", log.String())
			assert.Equal(t, 128+int(sig), exit.ExitCode(), "exit status after a %v: %s", sig, log.String())
			name := signalName(sig)
			found, err := checkpoint.Find(ck)
			require.NoError(t, err)
			if sig != syscall.SIGPIPE {
				assert.Contains(t, log.String(), "stopped by "+name+" after step")
				assert.Contains(t, log.String(), fmt.Sprintf("exit status %d, so that a scheduler does not take it for finished", 128+int(sig)))
				assert.Contains(t, log.String(), "continue with --resume "+found)
			}
			m, err := checkpoint.ReadManifest(found)
			require.NoError(t, err)
			require.Less(t, m.State.Step, 100, "stopped early")
			met := readMetrics(t, metrics)
			assert.Equal(t, name, met.Stopped)
			assert.Len(t, met.Steps, m.State.Step, "the metrics hold every step run")
			require.NoError(t, mainErr(append(slices.Clone(args), "--resume", ck, "--checkpoint-dir", ck)))
			assert.Equal(t, stateSums(t, checkpoint.StepDir(whole, 100)), stateSums(t, checkpoint.StepDir(ck, 100)))
		})
	}
}

// A signal during a --plan search ends it with the signal's status and
// removes the copies of the module the search compiles from, which the
// deferred removals, not run on a signal, left in $TMPDIR.
func TestSignalDuringASearchLeavesNoFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	tmp := t.TempDir()
	args := gir(t, []string{gptModel, "--set", "layers=8,hidden=64,heads=4,seq=32", "--batch", "64"})
	cmd := exec.Command(os.Args[0], append(args, "--devices", "64", "--plan", "--plan-top", "40")...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1", "TMPDIR="+tmp)
	var log strings.Builder
	cmd.Stderr = &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	copies := func() []string {
		m, err := filepath.Glob(filepath.Join(tmp, "gcompile-module-*"))
		require.NoError(t, err)
		return m
	}
	// The search has begun once it has written its copy.
	for deadline := time.Now().Add(time.Minute); len(copies()) == 0; time.Sleep(2 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "no search began: %s", log.String())
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	var exit *exec.ExitError
	require.ErrorAs(t, cmd.Wait(), &exit, "the search ended before the signal: %s", log.String())
	assert.Equal(t, 143, exit.ExitCode(), log.String())
	assert.Contains(t, log.String(), "gcompile: plan: stopped by SIGTERM; removed the search's")
	assert.Empty(t, copies())
}

// Asynchronous data parallelism stopped by a signal exits with its
// status too (it exited 0 after saying it stopped).
func TestAsyncSignalExitsWithItsStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "100000", "--devices", "2", "--dp", "2", "--dp-sync", "async", "--staleness", "1"))
	cmd, stderr := startMain(t, args...)
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var log strings.Builder
	readUntil(t, stderr, &log, "step 3/")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	rest, _ := io.ReadAll(stderr)
	log.Write(rest)
	var exit *exec.ExitError
	require.ErrorAs(t, cmd.Wait(), &exit, "%s", log.String())
	assert.Equal(t, 130, exit.ExitCode(), "%s", log.String())
	assert.Contains(t, log.String(), "exit status 130, so that a scheduler does not take it for finished")
}

// A signal while the model is built stops the build: gcompile exits with
// an error saying so, and neither the driver process nor its work folder
// outlives it.
func TestSignalDuringModelBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "hang", "model.go")
	require.NoError(t, os.MkdirAll(filepath.Dir(model), 0o755))
	require.NoError(t, os.WriteFile(model, []byte(`package hang

import (
	"os"
	"time"

	"gcompile/frontend"
)

func Model(b *frontend.Builder) {
	// Written whole, then renamed: the test reads the file once it exists.
	pidFile := os.Getenv("HANG_PID_FILE")
	os.WriteFile(pidFile+".tmp", []byte(itoa(os.Getpid())), 0o644)
	os.Rename(pidFile+".tmp", pidFile)
	for {
		time.Sleep(time.Second)
	}
}

func itoa(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}
`), 0o644))
	tmp, pidFile := filepath.Join(dir, "tmp"), filepath.Join(dir, "driver.pid")
	require.NoError(t, os.MkdirAll(tmp, 0o755))
	cmd := exec.Command(os.Args[0], model)
	cmd.Env = append(os.Environ(), asMainEnv+"=1", "TMPDIR="+tmp, "HANG_PID_FILE="+pidFile)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	driver := 0
	// A failing test leaves neither the command nor the model's looping
	// driver behind.
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if driver > 0 && t.Failed() {
			_ = syscall.Kill(driver, syscall.SIGKILL)
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(pidFile); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "Model() never ran: %s", out.String())
		time.Sleep(50 * time.Millisecond)
	}
	raw, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	driver, err = strconv.Atoi(string(raw))
	require.NoError(t, err, "pid file %q", raw)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out.String())
	assert.Equal(t, 130, exit.ExitCode(), "SIGINT's status, 128 + 2")
	assert.Contains(t, out.String(), "building the model was interrupted")
	assert.Error(t, syscall.Kill(driver, 0), "the driver (pid %d) is gone", driver)
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "no work folder is left in TMPDIR")
}

// A job of two processes writes one checkpoint together, the same bytes
// as one process running the plan, and resumes from it in either.
func TestCheckpointAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	t.Setenv(asMainEnv, "1")
	dir := t.TempDir()
	plan := []string{"--devices", "2", "--dp", "2", "--zero", "1"}
	args := gir(t, append(append(slices.Clone(ckptGPT), "--steps", "6"), plan...))
	one := filepath.Join(dir, "one")
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", one)))
	two := filepath.Join(dir, "two")
	launch := []string{"launch", "--nproc", "2", "--"}
	require.NoError(t, mainErr(append(append(slices.Clone(launch), args...), "--checkpoint-dir", two, "--stop-after", "3")))
	m, err := checkpoint.ReadManifest(checkpoint.StepDir(two, 3))
	require.NoError(t, err)
	assert.Len(t, m.Files, 2, "each process wrote its rank's blocks")
	names := func(step int) (got []string) {
		es, err := os.ReadDir(checkpoint.StepDir(two, step))
		require.NoError(t, err)
		for _, e := range es {
			got = append(got, e.Name())
		}
		return got
	}
	// Process 0 merged the others' parts and removed them; its own it
	// kept in memory (it was left behind as part-00000.json).
	assert.ElementsMatch(t, names(3), append(slices.Collect(maps.Keys(m.Files)), checkpoint.ManifestName))
	require.NoError(t, mainErr(append(append(slices.Clone(launch), args...), "--checkpoint-dir", two, "--resume", two)))
	assert.Equal(t, stateSums(t, checkpoint.StepDir(one, 6)), stateSums(t, checkpoint.StepDir(two, 6)))
}

// Checkpoints cross backends: a CPU checkpoint resumes on the (stand-in)
// GPU, whose checkpoint resumes on the CPU, and the run goes on as the
// CPU run that never stopped.
func TestCheckpointAcrossBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a step in the kernel emulator (seconds); skipped with -short")
	}
	fakegpu.Install(t)
	t.Setenv("GCOMPILE_FAKEGPU_DEVICES", "2")
	t.Setenv("GCOMPILE_CACHE", t.TempDir())
	dir := t.TempDir()
	args := append(slices.Clone(tinyGPT), "--run", "--steps", "3", "--eval-batches", "1", "--devices", "2", "--tp", "2")
	whole := runMetrics(t, args...)
	cpuCk, gpuCk := filepath.Join(dir, "cpu"), filepath.Join(dir, "gpu")
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", cpuCk, "--stop-after", "1")))
	onGPU := runMetrics(t, append(slices.Clone(args), "--backend", "cuda", "--resume", cpuCk, "--checkpoint-dir", gpuCk, "--stop-after", "2")...)
	require.Len(t, onGPU.Steps, 1)
	assert.InEpsilon(t, whole.Steps[1].Loss, onGPU.Steps[0].Loss, 1e-6, "step 2 on the GPU")
	back := runMetrics(t, append(slices.Clone(args), "--resume", gpuCk)...)
	require.Len(t, back.Steps, 1)
	assert.InEpsilon(t, whole.Steps[2].Loss, back.Steps[0].Loss, 1e-5, "step 3 on the CPU")
}

// Asynchronous data parallelism checkpoints the parameter server's state.
// With staleness 0 the run is deterministic and the resumed run is the
// uninterrupted one bit for bit, in one process or two (the replicas of
// the other process are told to stop); with staleness 2 the interleaving
// is timing's, and the resumed run trains as well as the uninterrupted
// one.
func TestAsyncResume(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	t.Setenv(asMainEnv, "1")
	dir := t.TempDir()
	plan := []string{"--devices", "2", "--dp", "2", "--dp-sync", "async"}
	args := append(append(slices.Clone(ckptGPT), "--steps", "20"), plan...)
	k0 := append(slices.Clone(args), "--staleness", "0")
	whole := runMetrics(t, append(slices.Clone(k0), "--checkpoint-dir", filepath.Join(dir, "whole"))...)
	launch := []string{"launch", "--nproc", "2", "--"}
	cut := filepath.Join(dir, "cut")
	require.NoError(t, mainErr(append(append(slices.Clone(launch), k0...), "--checkpoint-dir", cut, "--stop-after", "10")))
	m, err := checkpoint.ReadManifest(checkpoint.StepDir(cut, 10))
	require.NoError(t, err)
	assert.Equal(t, 10, m.State.Step)
	rest := runMetrics(t, append(slices.Clone(k0), "--checkpoint-dir", cut, "--resume", cut)...)
	assert.Equal(t, losses(whole)[10:], losses(rest), "staleness 0: losses of steps 11–20")
	assert.Equal(t, stateSums(t, checkpoint.StepDir(filepath.Join(dir, "whole"), 20)), stateSums(t, checkpoint.StepDir(cut, 20)))

	k2 := append(slices.Clone(args), "--staleness", "2")
	free := runMetrics(t, k2...)
	cut2 := filepath.Join(dir, "cut2")
	require.NoError(t, mainErr(append(slices.Clone(k2), "--checkpoint-dir", cut2, "--stop-after", "10")))
	rest2 := runMetrics(t, append(slices.Clone(k2), "--resume", cut2)...)
	require.Len(t, rest2.Steps, 10)
	assert.LessOrEqual(t, rest2.Async.MaxStalenessSeen, 2)
	assert.InEpsilon(t, free.Eval[0].Loss, rest2.Eval[0].Loss, 0.03, "staleness 2: the held-out loss after 20 steps")
}

// A --checkpoint-dir another live run holds is refused before any work,
// naming that run; a lock whose process is gone is taken over, with the
// partial folders its interrupted saves left; the lock goes with the run.
func TestCheckpointDirIsLocked(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	cases := []struct {
		name string
		lock ckptLock
		want string // the error; "" when the run takes the folder
		// empty: the lock file is empty (made and not written yet, or a
		// crash between the two), last modified age ago.
		empty bool
		age   time.Duration
	}{
		{"held by a live run", ckptLock{Host: host, PID: os.Getpid(), Start: pidlock.ProcessStart(os.Getpid()), Since: "2026-12-04T00:00:00Z", Command: "gcompile other"},
			fmt.Sprintf("is in use by another run: pid %d on %s since 2026-12-04T00:00:00Z (gcompile other)", os.Getpid(), host), false, 0},
		{"held on another host", ckptLock{Host: "node7", PID: 1, Since: "2026-12-04T00:00:00Z", Command: "gcompile other"}, "pid 1 on node7", false, 0},
		{"left by a run that is gone", ckptLock{Host: host, PID: dead.Process.Pid, Since: "2026-12-04T00:00:00Z"}, "", false, 0},
		{"left by a pid now reused", ckptLock{Host: host, PID: os.Getpid(), Start: "1", Since: "2026-12-04T00:00:00Z"}, "", false, 0},
		{"being made by another run", ckptLock{}, "is being taken by another run", true, 0},
		{"left empty by a crash", ckptLock{}, "", true, time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ck := filepath.Join(t.TempDir(), "ck")
			require.NoError(t, os.MkdirAll(filepath.Join(ck, "step-00000002.partial"), 0o755))
			raw, err := json.Marshal(tc.lock)
			require.NoError(t, err)
			if tc.empty {
				raw = []byte{}
			}
			lock := filepath.Join(ck, lockName)
			require.NoError(t, os.WriteFile(lock, raw, 0o644))
			if tc.age > 0 {
				then := time.Now().Add(-tc.age)
				require.NoError(t, os.Chtimes(lock, then, then))
			}
			metrics := filepath.Join(t.TempDir(), "m.json")
			err = mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", ck, "--metrics", metrics)))
			if tc.want != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)
				if !tc.empty {
					assert.Contains(t, err.Error(), "remove "+lock)
				}
				assert.NoFileExists(t, metrics, "refused before any work")
				after, err := os.ReadFile(lock)
				require.NoError(t, err)
				assert.Equal(t, raw, after, "the holder's lock is left alone")
				return
			}
			require.NoError(t, err)
			assert.NoFileExists(t, lock, "released at the end")
			assert.NoDirExists(t, filepath.Join(ck, "step-00000002.partial"), "the dead run's partial save is gone")
			assert.DirExists(t, checkpoint.StepDir(ck, 2))
		})
	}
}

// The last step's checkpoint failing (a full disk; here a file-size limit
// of 200 KB, which the 139 KB weights fit and the 410 KB shard does not)
// fails the run, but the weights and metrics of the finished training are
// written, and the error says what failed.
func TestFailedFinalCheckpointKeepsTheOtherOutputs(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash for ulimit -f")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	w, m := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "m.json")
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", ck, "--save", w, "--metrics", m))
	cmd := exec.Command("bash", append([]string{"-c", `ulimit -f 400; exec "$0" "$@"`, self}, args...)...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "the checkpoint of the last step (2)")
	assert.Contains(t, string(out), "file too large")
	assert.FileExists(t, w, "the weights of the finished training")
	assert.Len(t, readMetrics(t, m).Steps, 2, "the metrics of every step")
	assert.NoDirExists(t, checkpoint.StepDir(ck, 2), "no checkpoint claims to be complete")
}

// A --checkpoint-dir that holds checkpoints takes only the run that
// continues its newest one: a new run there, one resumed from an older
// step (a branch) or from another folder is refused before it trains,
// leaving the checkpoints as they were, and so is a --stop-after the
// resumed run is already past.
func TestCheckpointDirHoldsOneRun(t *testing.T) {
	dir := t.TempDir()
	ck, other := filepath.Join(dir, "ck"), filepath.Join(dir, "other")
	run := func(args ...string) error { return mainErr(gir(t, append(slices.Clone(ckptGPT), args...))) }
	require.NoError(t, run("--steps", "4", "--checkpoint-dir", ck, "--checkpoint-every", "2"))
	require.NoError(t, run("--steps", "2", "--checkpoint-dir", other))
	before := stateSums(t, checkpoint.StepDir(ck, 4))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a new run", []string{"--steps", "6", "--checkpoint-dir", ck},
			"--checkpoint-dir " + ck + " holds checkpoints of steps 2 to 4: a new run there would write over them"},
		{"a branch from an older step", []string{"--steps", "6", "--checkpoint-dir", ck, "--resume", filepath.Join(ck, "step-2")},
			"this run resumes from step 2 (" + checkpoint.StepDir(ck, 2) + "): it would branch into the folder of the newer steps"},
		{"another run's folder", []string{"--steps", "6", "--checkpoint-dir", other, "--resume", ck},
			"--checkpoint-dir " + other + " holds checkpoints of steps 2 to 2, and this run continues " + checkpoint.StepDir(ck, 4) + " from elsewhere"},
		{"stop-after already past", []string{"--steps", "6", "--checkpoint-dir", ck, "--resume", ck, "--stop-after", "4"},
			"--stop-after 4: the run resumes after step 4"},
		{"weights into a checkpoint", []string{"--steps", "6", "--checkpoint-dir", ck, "--resume", ck, "--save", filepath.Join(checkpoint.StepDir(ck, 4), "rank-00000.safetensors")},
			"--save " + filepath.Join(checkpoint.StepDir(ck, 4), "rank-00000.safetensors") + " is inside --checkpoint-dir " + ck},
		{"metrics over a manifest", []string{"--steps", "6", "--resume", ck, "--metrics", filepath.Join(checkpoint.StepDir(ck, 4), "manifest.json")},
			"is inside --resume " + ck},
		{"a dump named like the last step", []string{"--steps", "6", "--checkpoint-dir", ck, "--resume", ck, "--dump", checkpoint.StepDir(ck, 6)},
			"--dump " + checkpoint.StepDir(ck, 6) + " is inside --checkpoint-dir " + ck},
		{"a dump into the resumed step", []string{"--steps", "6", "--resume", checkpoint.StepDir(ck, 4), "--dump", checkpoint.StepDir(ck, 4)},
			"--dump " + checkpoint.StepDir(ck, 4) + " is inside --resume " + checkpoint.StepDir(ck, 4)},
		{"checkpoints inside the resumed folder", []string{"--steps", "6", "--resume", ck, "--checkpoint-dir", checkpoint.StepDir(ck, 4)},
			"--checkpoint-dir " + checkpoint.StepDir(ck, 4) + " is inside the checkpoint --resume " + ck},
		{"checkpoints into the resumed step", []string{"--steps", "6", "--resume", filepath.Join(ck, "step-4"), "--checkpoint-dir", filepath.Join(ck, "step-4")},
			"is inside the checkpoint --resume " + filepath.Join(ck, "step-4")},
		{"checkpoints into another run's step", []string{"--steps", "2", "--checkpoint-dir", checkpoint.StepDir(ck, 4)},
			"--checkpoint-dir " + checkpoint.StepDir(ck, 4) + " is inside checkpoint " + checkpoint.StepDir(ck, 4) + ": this run's steps would be saved into another's checkpoint"},
		{"checkpoints under another run's step", []string{"--steps", "2", "--checkpoint-dir", filepath.Join(checkpoint.StepDir(ck, 4), "new")},
			"is inside checkpoint " + checkpoint.StepDir(ck, 4)},
		{"metrics where the checkpoints go", []string{"--steps", "2", "--checkpoint-dir", filepath.Join(dir, "new"), "--metrics", filepath.Join(dir, "new")},
			"--metrics " + filepath.Join(dir, "new") + " is also --checkpoint-dir's folder; give each its own path"},
		{"a report where the dump goes", []string{"--steps", "2", "--dump", filepath.Join(dir, "x.html"), "--report", filepath.Join(dir, "x.html")},
			"--report " + filepath.Join(dir, "x.html") + " is also --dump's folder; give each its own path"},
		{"other text", []string{"--steps", "6", "--checkpoint-dir", ck, "--resume", ck, "--max-data-mb", "2"},
			"the checkpoint was trained on other data (byte-level text of "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			steps, err := checkpoint.Steps(ck)
			require.NoError(t, err)
			assert.Equal(t, []int{2, 4}, steps, "the checkpoints are as they were")
			assert.Equal(t, before, stateSums(t, checkpoint.StepDir(ck, 4)))
		})
	}
	err := mainErr([]string{"export", ck, "--out", filepath.Join(dir, "weights.bin")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the weights are a safetensors file; give a FILE.safetensors")
	err = mainErr([]string{"export", ck, "--out", filepath.Join(checkpoint.StepDir(ck, 4), "rank-00000.safetensors")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is inside the checkpoint "+checkpoint.StepDir(ck, 4)+" it exports")
	assert.Equal(t, before, stateSums(t, checkpoint.StepDir(ck, 4)))
	require.NoError(t, run("--steps", "6", "--checkpoint-dir", ck, "--resume", ck, "--checkpoint-every", "2"), "the run that continues the newest")
	steps, err := checkpoint.Steps(ck)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 4, 6}, steps)
}

// A signal caught while the module is compiled (Config.Interrupt
// cancelled) stops the compile before the lowering: a run stopped before
// training does not train. The .gir module needs no build, so the
// cancelled context meets the passes.
func TestSignalDuringThePassesStopsTheCompile(t *testing.T) {
	c, err := parseArgs(gir(t, slices.Clone(reshardGPT)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("SIGINT"))
	c.Interrupt = ctx
	_, err = compile.Compile(&c.Config, passes.Hooks{})
	require.Error(t, err)
	assert.Equal(t, "stopped during the compile passes by SIGINT", err.Error())
}

// An asynchronous run's checkpoint resumes at the dp it ran: its model is
// one replica's share of the batch, and another dp is refused naming
// that, not as "another model".
func TestAsyncCheckpointResumesAtItsDP(t *testing.T) {
	dir := t.TempDir()
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "4", "--dp-sync", "async", "--staleness", "0"))
	require.NoError(t, mainErr(append(slices.Clone(args), "--devices", "4", "--dp", "4", "--stop-after", "2", "--checkpoint-dir", filepath.Join(dir, "ck"))))
	m, err := checkpoint.ReadManifest(checkpoint.StepDir(filepath.Join(dir, "ck"), 2))
	require.NoError(t, err)
	assert.Contains(t, checkpoint.Describe(dir, m), "data parallelism: asynchronous over 4 replicas, staleness 0")
	err = mainErr(append(slices.Clone(args), "--devices", "2", "--dp", "2", "--resume", filepath.Join(dir, "ck"), "--checkpoint-dir", filepath.Join(dir, "ck2")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the checkpoint is of asynchronous data parallelism over 4 replicas")
	assert.Contains(t, err.Error(), "resume it with --dp 4")
	require.NoError(t, mainErr(append(slices.Clone(args), "--devices", "4", "--dp", "4", "--resume", filepath.Join(dir, "ck"), "--checkpoint-dir", filepath.Join(dir, "ck3"))))
}

// Resuming under PipeDream-2BW from another schedule, or the reverse, is
// refused naming --schedule (it said the checkpoint had tensors "of
// another schedule or optimizer?"); another --set names the checkpoint's.
func TestResumeNamesTheScheduleAndTheSet(t *testing.T) {
	dir := t.TempDir()
	args := append(slices.Clone(ckptGPT), "--steps", "4", "--devices", "2", "--pp", "2", "--microbatches", "2")
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(slices.Clone(args), "--schedule", "2bw", "--stop-after", "2", "--checkpoint-dir", ck)))
	m, err := checkpoint.ReadManifest(checkpoint.StepDir(ck, 2))
	require.NoError(t, err)
	assert.Contains(t, checkpoint.Describe(ck, m), "schedule: PipeDream-2BW")
	err = mainErr(append(slices.Clone(args), "--schedule", "1f1b", "--resume", ck, "--checkpoint-dir", filepath.Join(dir, "ck2")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the checkpoint was saved with --schedule 2bw and this run has --schedule 1f1b")
	assert.ErrorIs(t, err, checkpoint.ErrMismatch)

	other := slices.Clone(args)
	other[2] = "layers=2,hidden=48,heads=2,seq=16"
	err = mainErr(append(other, "--schedule", "2bw", "--resume", ck, "--checkpoint-dir", filepath.Join(dir, "ck3")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `the checkpoint is of model "gpt" built with --set "layers=2,hidden=32,heads=2,seq=16"`)
	assert.Contains(t, err.Error(), `this run's with --set "layers=2,hidden=48,heads=2,seq=16"`)
}

// A model's implementation parameter (the attention core: one fused op
// or its primitive ops) chooses how it computes, not what: a checkpoint
// saved under one resumes under the other and trains on as the run that
// never stopped, to rounding; eval reads it too. Another size is still
// another model.
func TestResumeUnderAnotherAttentionImplementation(t *testing.T) {
	dir := t.TempDir()
	args := append(slices.Clone(ckptGPT), "--steps", "6")
	withSet := func(set string, extra ...string) []string {
		a := slices.Clone(args)
		a[2] = set
		return append(a, extra...)
	}
	whole := runMetrics(t, withSet("layers=2,hidden=32,heads=2,seq=16", "--checkpoint-dir", filepath.Join(dir, "whole"))...)
	first := runMetrics(t, withSet("layers=2,hidden=32,heads=2,seq=16", "--checkpoint-dir", filepath.Join(dir, "cut"), "--stop-after", "3")...)
	require.Len(t, first.Steps, 3)
	rest := runMetrics(t, withSet("layers=2,hidden=32,heads=2,seq=16,attention=unfused", "--checkpoint-dir", filepath.Join(dir, "cut"), "--resume", filepath.Join(dir, "cut"))...)
	require.NotNil(t, rest.ResumedFrom)
	require.Len(t, rest.Steps, 3)
	assert.InDeltaSlice(t, losses(whole)[3:], losses(rest), 1e-5, "losses of steps 4–6")

	require.NoError(t, mainErr([]string{"eval", gptModel, "--set", "layers=2,hidden=32,heads=2,seq=16,attention=unfused", "--max-data-mb", "1",
		"--resume", filepath.Join(dir, "whole"), "--eval-batches", "1"}))

	err := mainErr(withSet("layers=2,hidden=32,heads=1,seq=16,attention=unfused", "--checkpoint-dir", filepath.Join(dir, "other"), "--resume", filepath.Join(dir, "cut", "step-00000003")))
	require.Error(t, err)
	assert.ErrorIs(t, err, checkpoint.ErrMismatch)
	assert.Contains(t, err.Error(), `this run's with --set "layers=2,hidden=32,heads=1,seq=16,attention=unfused"`)
}

// The training settings the manifest records are compared before the
// compile, which can be long: another --batch, --precision or
// --optimizer is refused with nothing compiled.
func TestResumeRefusesAnotherTrainingBeforeTheCompile(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", ck)))
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--batch", "8"}, "the checkpoint was saved with --batch 4 and this run has 8"},
		{[]string{"--precision", "bf16"}, "the checkpoint was saved with --precision fp32 and this run has bf16"},
		{[]string{"--optimizer", "sgd"}, "the checkpoint was saved with --optimizer adamw and this run has sgd"},
	} {
		out, err := captureStderr(t, func() error {
			return mainErr(append(append(slices.Clone(ckptGPT), "--steps", "4", "--resume", ck, "--checkpoint-dir", filepath.Join(dir, "other")), tc.flags...))
		})
		require.Error(t, err, tc.want)
		assert.ErrorIs(t, err, checkpoint.ErrMismatch)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, out, "compiled", "refused before the compile")
	}
}

// A folder named as a step's checkpoint that gcompile did not complete (a
// user's files in it) is refused before training, not met at the save,
// and is left as it was.
func TestCheckpointDirWithAForeignStepFolderIsRefused(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	args := append(slices.Clone(ckptGPT), "--checkpoint-dir", ck, "--checkpoint-every", "2")
	require.NoError(t, mainErr(append(slices.Clone(args), "--steps", "2")))
	notes := filepath.Join(checkpoint.StepDir(ck, 4), "notes.txt")
	writeFile(t, notes, "mine")
	err := mainErr(append(slices.Clone(args), "--steps", "6", "--resume", checkpoint.StepDir(ck, 2)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is named as a checkpoint of step 4 but is not one gcompile completed")
	assert.FileExists(t, notes)

	// One below the step resumed from is never written: the run goes on.
	other := filepath.Join(dir, "other")
	oargs := append(slices.Clone(ckptGPT), "--checkpoint-dir", other, "--checkpoint-every", "2")
	require.NoError(t, mainErr(append(slices.Clone(oargs), "--steps", "4")))
	require.NoError(t, os.Remove(filepath.Join(checkpoint.StepDir(other, 2), "manifest.json")))
	require.NoError(t, mainErr(append(slices.Clone(oargs), "--steps", "6", "--resume", other)))
}

// A checkpoint's size is known once the plan is compiled: a folder with
// less room than one is refused before training, and the estimate is
// what the saved files take, within their headers and manifest.
func TestCheckpointDirWithoutRoomIsRefused(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	args := append(slices.Clone(ckptGPT), "--checkpoint-dir", ck, "--steps", "2", "--devices", "4", "--tp", "2", "--dp", "2", "--zero", "1")
	require.NoError(t, mainErr(args))
	var onDisk int64
	require.NoError(t, filepath.WalkDir(checkpoint.StepDir(ck, 2), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			fi, err := d.Info()
			require.NoError(t, err)
			onDisk += fi.Size()
		}
		return err
	}))
	c, err := parseArgs(args)
	require.NoError(t, err)
	res, err := compile.Compile(&c.Config, passes.Hooks{})
	require.NoError(t, err)
	want := checkpointBytes(res.Module, 4)
	assert.GreaterOrEqual(t, want, onDisk, "the estimate bounds the files, headers and manifest included")
	assert.Less(t, want-onDisk, int64(512<<10), "%d estimated, %d on disk", want, onDisk)

	one := checkpointBytes(res.Module, 1) // the same model on one device
	freeSpace = func(string) (int64, bool) { return one - 1, true }
	t.Cleanup(func() { freeSpace = freeBytes })
	err = mainErr(append(slices.Clone(ckptGPT), "--checkpoint-dir", filepath.Join(dir, "other"), "--steps", "2"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the first save would fail after training to it")
	assert.NoDirExists(t, filepath.Join(dir, "other", "step-00000002"))
	// --save's weights, written after the training, too.
	weights := savedBytes(res.Module)
	freeSpace = func(string) (int64, bool) { return weights - 1, true }
	w := filepath.Join(dir, "w.safetensors")
	err = mainErr(append(slices.Clone(ckptGPT), "--save", w, "--steps", "2"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--save "+w+": ")
	assert.Contains(t, err.Error(), "they would fail to be written after the training")
	assert.NoFileExists(t, w)
	// A finished run's rerun writes no checkpoint: the weights need their
	// own room only.
	freeSpace = func(string) (int64, bool) { return weights + 1, true }
	require.NoError(t, mainErr(append(slices.Clone(args), "--resume", ck, "--save", w)))
	assert.FileExists(t, w)
}

// A resumed run that changes the schedule or the update's settings is
// allowed, and each change is named against the checkpoint's run.
func TestResumeNamesChangedTrainingSettings(t *testing.T) {
	saved := map[string]any{"lr": 3e-4, "min_lr": 3e-5, "warmup": 10.0, "steps": 100.0, "weight_decay": 0.1, "clip": 1.0,
		"beta1": 0.9, "beta2": 0.95, "lr_decay": "cosine"}
	c := &config{lr: 3e-4, minLR: 3e-5, warmup: 10, steps: 100, decay: "cosine"}
	c.WeightDecay, c.Clip, c.Beta1, c.Beta2 = 0.1, 1, 0.9, 0.95
	assert.Empty(t, scheduleChanges(saved, c))
	c.WeightDecay, c.Clip, c.Beta2, c.decay = 0.01, 0.5, 0.99, "constant"
	assert.Equal(t, []string{"--weight-decay 0.01 (the checkpoint's run: 0.1)", "--clip 0.5 (the checkpoint's run: 1)",
		"--beta2 0.99 (the checkpoint's run: 0.95)", "--lr-decay constant (the checkpoint's run: cosine)"}, scheduleChanges(saved, c))

	// A static loss scale is the run's own: another is named. fp16's
	// dynamic scaler (0) against a static one is refused elsewhere.
	async := map[string]any{"staleness": 0.0}
	c = &config{}
	c.DPSync, c.Staleness = "async", 2
	assert.Equal(t, []string{"--staleness 2 (the checkpoint's run: 0)"}, scheduleChanges(async, c))

	reduce := map[string]any{"grad_reduce_dtype": "fp32"}
	c = &config{}
	c.GradReduceDType, c.DP = "fp32", 2
	assert.Empty(t, scheduleChanges(reduce, c))
	c.GradReduceDType = "bf16"
	assert.Equal(t, []string{"--grad-reduce-dtype bf16 (the checkpoint's run: fp32)"}, scheduleChanges(reduce, c))
	// Without dp (or ep, cp) no reduction runs: fp32 is what is recorded
	// and compared.
	c.DP = 1
	assert.Empty(t, scheduleChanges(reduce, c))
	assert.Equal(t, "fp32", c.metricsConfig(1)["grad_reduce_dtype"])

	static := map[string]any{"loss_scale": 128.0}
	c = &config{}
	c.Precision, c.LossScale = "fp16", 1024
	assert.Equal(t, []string{"--loss-scale 1024 (the checkpoint's run: 128)"}, scheduleChanges(static, c))
	c.LossScale = 0
	assert.Empty(t, scheduleChanges(static, c))
	c.Precision = "bf16"
	assert.Equal(t, []string{"--loss-scale none (the checkpoint's run: 128)"}, scheduleChanges(static, c))
}

// A static loss scale is a flag, not state: restored, the scaler keeps
// the run's own scale (it took the checkpoint's, and trained a resumed
// --loss-scale 1024 run at 128 with no word); a dynamic one continues
// from the checkpoint's.
func TestStaticLossScaleIsTheRunsOwn(t *testing.T) {
	s := runtime.NewLossScaler(1024)
	require.NoError(t, s.Restore(runtime.ScalerState{Scale: 128, Clean: 6}))
	assert.Equal(t, 1024.0, s.Scale)
	d := runtime.NewLossScaler(0)
	require.NoError(t, d.Restore(runtime.ScalerState{Scale: 4096, Dynamic: true, Clean: 6}))
	assert.Equal(t, 4096.0, d.Scale)
	require.Error(t, s.Restore(runtime.ScalerState{Scale: 4096, Dynamic: true}))
}

// A requeue loop runs one command every time: --resume of its own
// --checkpoint-dir starts afresh while that holds no checkpoint (its
// first attempt, or one killed in its first save), as Megatron-LM's
// --load of an empty folder does, and resumes once it holds one; a
// --resume of another folder that holds none stays refused.
func TestARequeuedCommandStartsAfreshThenResumes(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	loop := func(steps string) (string, error) {
		return captureStderr(t, func() error {
			return mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", steps, "--checkpoint-dir", ck, "--resume", ck)))
		})
	}
	// The first attempt was killed in its first save.
	writeFile(t, filepath.Join(checkpoint.StepDir(ck, 1)+".partial", "rank-00000.safetensors"), "cut short")
	log, err := loop("2")
	require.NoError(t, err)
	assert.Contains(t, log, "note: --resume "+ck+" holds no complete checkpoint yet: the run starts at step 0")
	log, err = loop("3")
	require.NoError(t, err)
	assert.Contains(t, log, "resumed from "+checkpoint.StepDir(ck, 2)+" at step 2")
	err = mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", ck, "--resume", filepath.Join(dir, "other"))))
	assert.ErrorContains(t, err, "--resume: checkpoint "+filepath.Join(dir, "other")+" does not exist")
}

// --save and --metrics named through links write the files the links
// lead to, one of them yet to be written; the links stay links.
func TestOutputsAreWrittenThroughLinks(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	weights, metrics := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "m.json")
	writeFile(t, filepath.Join(other, "w.safetensors"), "an older file")
	require.NoError(t, os.Symlink(filepath.Join(other, "w.safetensors"), weights))
	require.NoError(t, os.Symlink("../"+filepath.Base(other)+"/m.json", metrics))
	require.NoError(t, mainErr(gir(t, append(slices.Clone(ckptGPT), "--steps", "1", "--save", weights, "--metrics", metrics))))
	for _, p := range []string{weights, metrics} {
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		assert.NotZero(t, fi.Mode()&os.ModeSymlink, "%s is still a link", p)
	}
	ts, _, err := checkpoint.Load(filepath.Join(other, "w.safetensors"))
	require.NoError(t, err)
	assert.NotEmpty(t, ts)
	raw, err := os.ReadFile(filepath.Join(other, "m.json"))
	require.NoError(t, err)
	assert.True(t, json.Valid(raw), "the metrics written through the link")
}

// No output lands in a checkpoint the run does not write, also through a
// linked folder; one file reached under two names is one output; a name
// too long for its temporary file is refused before training; a dump
// folder's files of other kinds are kept. Each of these lost a file.
func TestOutputsNeverWriteIntoACheckpoint(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	run := func(args ...string) error { return mainErr(gir(t, append(slices.Clone(ckptGPT), args...))) }
	require.NoError(t, run("--steps", "2", "--checkpoint-dir", ck))
	step := checkpoint.StepDir(ck, 2)
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(step, link))
	outs := filepath.Join(dir, "outs")
	require.NoError(t, os.MkdirAll(outs, 0o755))
	outsLink := filepath.Join(dir, "outs-link")
	require.NoError(t, os.Symlink(outs, outsLink))
	// Outputs are written through links (linkpath.Target): a link's
	// target is where the output lands.
	fileLink := filepath.Join(dir, "file-link.safetensors")
	require.NoError(t, os.Symlink(filepath.Join(step, "rank-00000.safetensors"), fileLink))
	newLink := filepath.Join(dir, "new-link.json")
	require.NoError(t, os.Symlink(filepath.Join(step, "metrics.json"), newLink))
	site := filepath.Join(dir, "site")
	writeFile(t, filepath.Join(site, "index.html"), "<h1>my site</h1>")
	before := stateSums(t, step)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"--save into another run's checkpoint", []string{"--steps", "1", "--save", filepath.Join(step, "rank-00000.safetensors")},
			"--save " + filepath.Join(step, "rank-00000.safetensors") + " is inside checkpoint " + step},
		{"--save through a linked folder into the resumed checkpoint", []string{"--steps", "3", "--resume", ck, "--save", filepath.Join(link, "rank-00000.safetensors")},
			"is inside --resume " + ck},
		{"--save, a link to another run's checkpoint file", []string{"--steps", "1", "--save", fileLink},
			"--save " + fileLink + " is inside checkpoint " + step},
		{"--metrics, a link to a file yet to be written in a checkpoint", []string{"--steps", "1", "--metrics", newLink},
			"--metrics " + newLink + " is inside checkpoint " + step},
		{"two outputs, one file under two names", []string{"--steps", "1", "--metrics", filepath.Join(outs, "a.json"), "--trace", filepath.Join(outsLink, "a.json")},
			"--metrics and --trace both write " + filepath.Join(outsLink, "a.json")},
		{"a name too long for its temporary file", []string{"--steps", "1", "--save", filepath.Join(outs, strings.Repeat("L", 240)+".safetensors")},
			"a file name of 252 bytes; written through a temporary file 36 bytes longer, past file systems' 255, it takes at most 219"},
		{"a dump into a folder of other files", []string{"--steps", "1", "--dump", site}, "--dump " + site + " holds index.html, which is not a dump's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, before, stateSums(t, step))
		})
	}
	b, err := os.ReadFile(filepath.Join(site, "index.html"))
	require.NoError(t, err)
	assert.Equal(t, "<h1>my site</h1>", string(b))

	// An export_config that is not an object (an edited manifest) is
	// refused before anything is written, not after the weights.
	edited := filepath.Join(dir, "edited")
	require.NoError(t, os.CopyFS(edited, os.DirFS(step)))
	raw, err := os.ReadFile(filepath.Join(edited, checkpoint.ManifestName))
	require.NoError(t, err)
	cfg := regexp.MustCompile(`"export_config": (\{[^}]*\}|"[^"]*")`).FindString(string(raw))
	require.NotEmpty(t, cfg, "the GPT declares its configuration")
	editManifest(t, edited, cfg, `"export_config": "hello"`)
	exported := filepath.Join(dir, "exported", "m.safetensors")
	err = mainErr([]string{"export", edited, "--out", exported})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the manifest's export_config is not a JSON object")
	assert.NoFileExists(t, exported)

	err = mainErr([]string{"export", ck, "--out", filepath.Join(link, "rank-00000.safetensors")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is inside the checkpoint "+step+" it exports")
	other := filepath.Join(dir, "other")
	require.NoError(t, run("--steps", "2", "--checkpoint-dir", other))
	err = mainErr([]string{"export", ck, "--out", filepath.Join(checkpoint.StepDir(other, 2), "w.safetensors")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is inside checkpoint "+checkpoint.StepDir(other, 2))
	assert.Equal(t, before, stateSums(t, step))
}

// noDevices is a checkpoint.Cluster of one process with no devices, for
// the checkpointer's decisions without a save.
type noDevices struct{}

func (noDevices) Local() ([]int, []runtime.BlockDevice) { return nil, nil }
func (noDevices) Process() (int, int)                   { return 0, 1 }
func (noDevices) AnyOf(flag bool) (bool, error)         { return flag, nil }

// A stop asked for by a signal ends the run at the next step boundary,
// unless that boundary is the last step's: the run is finished then,
// and says so with status 0, or a requeue loop would run it again.
func TestASignalDuringTheLastStepFinishesTheRun(t *testing.T) {
	var log bytes.Buffer
	stop := &preemption{}
	stop.got.Store(os.Signal(syscall.SIGTERM))
	k := &checkpointer{c: &config{steps: 3}, j: &job{log: &log}, dev: noDevices{}, stop: stop}
	done, err := k.boundary(runtime.State{Step: 3})
	require.NoError(t, err)
	assert.False(t, done)
	assert.Empty(t, k.stoppedBy)
	assert.Contains(t, log.String(), "the stop was asked for during the last step (3): the run finishes")
	done, err = k.boundary(runtime.State{Step: 2})
	require.NoError(t, err)
	assert.True(t, done, "before the last step it stops")
	assert.Equal(t, "SIGTERM", k.stoppedBy)
}

// Rerunning a command with --resume extends its --metrics file, which
// lists the checkpoint it resumes from, rather than replacing the whole
// run's record with its last part's: the file holds every step, as one
// run's does, and says how many came from earlier parts. A finished
// run's rerun keeps it whole; a file of another run is replaced.
func TestResumeKeepsTheRunsMetrics(t *testing.T) {
	dir := t.TempDir()
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "6", "--eval-every", "2"))
	whole := runMetrics(t, args...)
	ck, met, report := filepath.Join(dir, "ck"), filepath.Join(dir, "m.json"), filepath.Join(dir, "r.html")
	run := func(extra ...string) runtime.Metrics {
		t.Helper()
		require.NoError(t, mainErr(append(slices.Clone(args), append([]string{"--checkpoint-dir", ck, "--metrics", met, "--report", report}, extra...)...)))
		return readMetrics(t, met)
	}
	first := run("--stop-after", "3")
	require.Len(t, first.Steps, 3)
	for _, tc := range []struct {
		name    string
		carried int
	}{{"the rest of the run", 3}, {"a rerun of the finished run", 6}} {
		m := run("--resume", ck)
		assert.Equal(t, losses(whole), losses(m), "%s: every step's loss, in order", tc.name)
		assert.Equal(t, whole.Eval, m.Eval, tc.name)
		assert.Equal(t, tc.carried, m.Carried, tc.name)
		var saved []int
		for _, s := range m.Checkpoints {
			saved = append(saved, s.Step)
		}
		assert.Equal(t, []int{3, 6}, saved, tc.name)
		page, err := os.ReadFile(report)
		require.NoError(t, err)
		assert.Contains(t, string(page), "resumed from", tc.name)
	}
	// A checkpoint of another run, saved since at the same path and step
	// by a run that wrote no metrics (killed first), is not the one the
	// file lists: the file is replaced.
	require.NoError(t, os.RemoveAll(ck))
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", ck, "--stop-after", "3", "--seed", "7")))
	m := run("--resume", ck, "--seed", "7")
	assert.Zero(t, m.Carried, "another run's checkpoint at the same path and step")
	require.Len(t, m.Steps, 3)
	assert.Equal(t, 4, m.Steps[0].Step)
	// Metrics of another run at that path are replaced, as before.
	other := filepath.Join(dir, "other")
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", other, "--stop-after", "3")))
	m = run("--resume", other, "--checkpoint-dir", other)
	assert.Zero(t, m.Carried)
	require.Len(t, m.Steps, 3)
	assert.Equal(t, 4, m.Steps[0].Step)
}

// A part killed without warning (SIGKILL: a node lost, the out-of-memory
// killer) has written its --metrics record at each checkpoint, marked in
// progress: the requeued part resumes from its last checkpoint and
// carries the steps up to it, so the file holds every step of the run,
// with the losses of the run that never stopped.
func TestMetricsSurviveAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "400", "--eval-batches", "-1"))
	whole := runMetrics(t, args...)
	ck, met := filepath.Join(dir, "ck"), filepath.Join(dir, "m.json")
	part := append(slices.Clone(args), "--checkpoint-dir", ck, "--checkpoint-every", "2", "--metrics", met)
	require.NoError(t, mainErr(append(slices.Clone(part), "--stop-after", "2")))
	_, last := killAfterACheckpoint(t, met, append(slices.Clone(part), "--resume", ck)...)

	out, err := captureStderr(t, func() error { return mainErr(append(slices.Clone(part), "--resume", ck)) })
	require.NoError(t, err)
	assert.Contains(t, out, fmt.Sprintf("its %d steps are kept", last))
	m := readMetrics(t, met)
	assert.False(t, m.InProgress)
	assert.Equal(t, last, m.Carried)
	assert.Equal(t, losses(whole), losses(m), "every step's loss, in order")
}

// An asynchronous run writes its record at every checkpoint too: killed,
// it leaves the steps up to its last checkpoint, marked in progress. (Its
// steps are many, so that a test process held up under load does not
// find it finished before the kill.)
func TestAsyncMetricsSurviveAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	ck, met := filepath.Join(dir, "ck"), filepath.Join(dir, "m.json")
	args := append(slices.Clone(ckptGPT), "--steps", "4000", "--eval-batches", "-1", "--devices", "2", "--dp", "2", "--dp-sync", "async",
		"--checkpoint-dir", ck, "--checkpoint-every", "2", "--metrics", met)
	killed, _ := killAfterACheckpoint(t, met, args...)
	assert.NotNil(t, killed.Async)
}

// killAfterACheckpoint runs gcompile with args, kills it (SIGKILL) once
// it has saved its checkpoint of step 6, and checks the --metrics file
// met it left: marked in progress, listing every step up to its last
// checkpoint, whose step it returns with the record.
func killAfterACheckpoint(t *testing.T, met string, args ...string) (runtime.Metrics, int) {
	t.Helper()
	cmd, stderr := startMain(t, args...)
	var log strings.Builder
	readUntil(t, stderr, &log, "checkpoint of step 6 saved")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed := readMetrics(t, met)
	assert.True(t, killed.InProgress)
	require.NotEmpty(t, killed.Checkpoints)
	last := killed.Checkpoints[len(killed.Checkpoints)-1].Step
	require.GreaterOrEqual(t, last, 6)
	require.Len(t, killed.Steps, last, "the steps up to the last checkpoint")
	return killed, last
}

// Runs that find the same stale lock take it over one at a time: exactly
// one holds the folder. Removing the stale lock by path let a run remove
// the lock another had just made in its place, and both trained into one
// folder.
func TestStaleLockIsTakenOverOnce(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	stale, err := json.Marshal(ckptLock{Host: host, PID: dead.Process.Pid, Since: "2026-12-04T00:00:00Z"})
	require.NoError(t, err)
	for round := range 30 {
		ck := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(ck, lockName), stale, 0o644))
		var wg sync.WaitGroup
		var held atomic.Int32
		for range 4 {
			wg.Go(func() {
				if _, err := lockCheckpointDir(ck); err == nil {
					held.Add(1)
				} else {
					assert.Regexp(t, "is in use by another run|is being taken by another run", err)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, held.Load(), "round %d: runs holding the folder", round)
		left, err := filepath.Glob(filepath.Join(ck, lockName+".*"))
		require.NoError(t, err)
		assert.Empty(t, left, "no lock left aside")
	}
}

// A damaged newest checkpoint (a shard cut short) is named before the
// compile with the newest intact one before it; resuming that one into
// the same folder names the damaged ones to move out, instead of
// recommending them; moved out, the run resumes.
func TestDamagedNewestCheckpointNamesTheIntactOne(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	args := gir(t, append(slices.Clone(ckptGPT), "--steps", "6"))
	require.NoError(t, mainErr(append(slices.Clone(args), "--checkpoint-dir", ck, "--checkpoint-every", "2")))
	shard := filepath.Join(checkpoint.StepDir(ck, 6), "rank-00000.safetensors")
	require.NoError(t, os.Truncate(shard, 1000))
	more := append(slices.Clone(args[:len(args)-2]), "--steps", "8", "--checkpoint-dir", ck)
	err := mainErr(append(slices.Clone(more), "--resume", ck))
	require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	assert.ErrorContains(t, err, "is 1000 bytes, the manifest says")
	assert.ErrorContains(t, err, "the newest intact checkpoint before it is "+checkpoint.StepDir(ck, 4)+" (its files all there, at their sizes; ")
	assert.ErrorContains(t, err, ": move "+checkpoint.StepDir(ck, 6)+" out of "+ck)
	err = mainErr(append(slices.Clone(more), "--resume", checkpoint.StepDir(ck, 4)))
	require.Error(t, err)
	assert.ErrorContains(t, err, "the newer ones are damaged ("+checkpoint.StepDir(ck, 6)+"; gcompile inspect names what): move them out of the folder, then resume from step 4 again")
	assert.NotContains(t, err.Error(), "resume from step 6")
	require.NoError(t, os.Rename(checkpoint.StepDir(ck, 6), filepath.Join(dir, "damaged")))
	require.NoError(t, mainErr(append(slices.Clone(more), "--resume", checkpoint.StepDir(ck, 4))))
	// A flipped byte, which the checksums find as the blocks load, gets
	// the same hint.
	last := filepath.Join(checkpoint.StepDir(ck, 8), "rank-00000.safetensors")
	raw, err := os.ReadFile(last)
	require.NoError(t, err)
	raw[len(raw)-1] ^= 0xff
	require.NoError(t, os.WriteFile(last, raw, 0o644))
	err = mainErr(append(slices.Clone(more), "--steps", "10", "--resume", ck))
	require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	assert.ErrorContains(t, err, "has CRC-32C")
	assert.ErrorContains(t, err, "the newest intact checkpoint before it is "+checkpoint.StepDir(ck, 4), "steps 2, 4 and 8 are there")
}

// An exit that skips the deferred calls (a second signal's) releases the
// checkpoint lock first: left behind on a shared file system, another
// host could never take it over.
func TestHardExitReleasesTheLock(t *testing.T) {
	ck := t.TempDir()
	unlock, err := lockCheckpointDir(ck)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(ck, lockName))
	runHardExitHooks()
	assert.NoFileExists(t, filepath.Join(ck, lockName))
	unlock() // after the hooks ran: nothing left to do, and no panic
	// A lock released as usual is forgotten by the hooks: the next run's
	// lock is not theirs to remove.
	unlock2, err := lockCheckpointDir(ck)
	require.NoError(t, err)
	unlock2()
	unlock3, err := lockCheckpointDir(ck)
	require.NoError(t, err)
	defer unlock3()
	body, err := os.ReadFile(filepath.Join(ck, lockName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(ck, lockName), append([]byte(" "), body...), 0o644)) // another run's, say
	runHardExitHooks()
	assert.FileExists(t, filepath.Join(ck, lockName), "a lock this process no longer holds")
}

// A SIGPIPE from a socket whose peer closed (a job's lost peer) is not a
// lost log: the run goes on to the error its collective reports rather
// than stop, and a second signal is not one. A write to the log that
// fails with EPIPE asks for the stop, as SIGPIPE.
func TestOnlyALostLogStopsTheRun(t *testing.T) {
	p := watchSignals(io.Discard)
	defer p.release()
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGPIPE))
	time.Sleep(100 * time.Millisecond)
	assert.False(t, p.requested(), "a SIGPIPE alone")
	w := p.watchLog(epipeWriter{})
	_, err := w.Write([]byte("step 1"))
	require.ErrorIs(t, err, syscall.EPIPE)
	assert.True(t, p.requested())
	assert.Equal(t, syscall.SIGPIPE, p.signal())
}

// epipeWriter fails every write as a pipe without a reader does.
type epipeWriter struct{}

func (epipeWriter) Write([]byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: "/dev/stderr", Err: syscall.EPIPE}
}

// startMain starts gcompile with args as a process of its own, its stderr
// piped to the returned reader.
func startMain(t *testing.T, args ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	return cmd, stderr
}

// readUntil reads r into log until log holds want.
func readUntil(t *testing.T, r io.Reader, log *strings.Builder, want string) {
	t.Helper()
	buf := make([]byte, 4096)
	for !strings.Contains(log.String(), want) {
		n, err := r.Read(buf)
		log.Write(buf[:n])
		require.NoError(t, err, "%s", log.String())
	}
}

// A checkpoint's manifest or a folder's lock that is not a file (a pipe
// hung the read; a folder failed it in Go's words) is named as what it
// is, before any work, by --resume, inspect and --checkpoint-dir.
func TestCheckpointFilesThatAreNotFilesAreNamed(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", ck)))
	manifest := filepath.Join(checkpoint.StepDir(ck, 2), checkpoint.ManifestName)
	require.NoError(t, os.Remove(manifest))
	require.NoError(t, syscall.Mkfifo(manifest, 0o644))
	for _, args := range [][]string{
		append(slices.Clone(ckptGPT), "--steps", "4", "--resume", checkpoint.StepDir(ck, 2), "--checkpoint-dir", filepath.Join(dir, "other")),
		{"inspect", checkpoint.StepDir(ck, 2)},
	} {
		err := fifotest.OpenWithin(t, manifest, func() error { return mainErr(args) })
		require.Error(t, err, "%v", args)
		assert.Contains(t, err.Error(), "its manifest.json is a named pipe, not a file", "%v", args)
	}
	lock := filepath.Join(dir, "locked")
	require.NoError(t, os.MkdirAll(filepath.Join(lock, lockName), 0o755))
	err := mainErr(append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", lock))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "its gcompile.lock is a folder, not the lock file a run writes: remove it")
	piped := filepath.Join(dir, "piped")
	require.NoError(t, os.MkdirAll(piped, 0o755))
	require.NoError(t, syscall.Mkfifo(filepath.Join(piped, lockName), 0o644))
	err = fifotest.OpenWithin(t, filepath.Join(piped, lockName), func() error {
		return mainErr(append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", piped))
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "its gcompile.lock is a named pipe")
}

// A checkpoint whose param holds NaN (a diverged run's, its files intact)
// is refused by --resume before any step, naming the param, as eval and
// export refuse it: it had trained to "step 3: loss is NaN; lower --lr".
func TestResumeRefusesNonFiniteParams(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(slices.Clone(ckptGPT), "--steps", "2", "--checkpoint-dir", ck)))
	step := checkpoint.StepDir(ck, 2)
	shard := filepath.Join(step, "rank-00000.safetensors")
	before, err := os.ReadFile(shard)
	require.NoError(t, err)
	ts, meta, err := checkpoint.Load(shard)
	require.NoError(t, err)
	i := slices.IndexFunc(ts, func(t checkpoint.Tensor) bool { return t.Name == "ln_f.weight" })
	require.GreaterOrEqual(t, i, 0)
	w := checkpoint.BytesFloat32(ts[i].Data)
	w[3] = float32(math.NaN())
	ts[i].Data = checkpoint.Float32Bytes(w)
	require.NoError(t, checkpoint.Save(shard, ts, meta))
	after, err := os.ReadFile(shard)
	require.NoError(t, err)
	require.Len(t, after, len(before))
	crc := func(b []byte) string {
		return fmt.Sprintf("%08x", crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	}
	editManifest(t, step, `"crc32c": "`+crc(before)+`"`, `"crc32c": "`+crc(after)+`"`)

	out, err := captureStderr(t, func() error {
		return mainErr(append(slices.Clone(ckptGPT), "--steps", "4", "--resume", step, "--checkpoint-dir", filepath.Join(dir, "other")))
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `param "ln_f.weight" (device 0's share) holds 1 non-finite value(s) of 32, the first NaN at index 3: a diverged run's checkpoint?`)
	assert.NotContains(t, out, "step 3", "refused before any step")
	err = mainErr([]string{"export", step, "--out", filepath.Join(dir, "w.safetensors")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `param "ln_f.weight" holds 1 non-finite value(s) of 32`)
	assert.NoFileExists(t, filepath.Join(dir, "w.safetensors"))
}

// A checkpoint whose optimizer state lost a shard still exports its
// params, which are whole, and says the checkpoint is damaged: a
// --resume from it is refused.
func TestExportOfACheckpointMissingAStateShardSaysSo(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	require.NoError(t, mainErr(append(slices.Clone(ckptGPT), "--steps", "2", "--devices", "4", "--tp", "2", "--dp", "2", "--zero", "1", "--checkpoint-dir", ck)))
	step := checkpoint.StepDir(ck, 2)
	m, err := checkpoint.ReadManifest(step)
	require.NoError(t, err)
	holdsParams := map[string]bool{}
	for _, tb := range m.Tensors {
		for _, b := range tb.Blocks {
			if tb.Kind == "param" {
				holdsParams[b.File] = true
			}
		}
	}
	var stateOnly string
	for f := range m.Files {
		if !holdsParams[f] {
			stateOnly = f
		}
	}
	require.NotEmpty(t, stateOnly, "ZeRO-1 over dp 2 leaves a shard of optimizer state alone")
	require.NoError(t, os.Remove(filepath.Join(step, stateOnly)))
	out := filepath.Join(dir, "w.safetensors")
	log, err := captureStderr(t, func() error { return mainErr([]string{"export", step, "--out", out}) })
	require.NoError(t, err)
	assert.FileExists(t, out)
	assert.Contains(t, log, "note: export: checkpoint "+step+" is damaged beyond its params, which were read whole: shard "+filepath.Join(step, stateOnly)+" is missing")
}
