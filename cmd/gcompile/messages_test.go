package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data"
	"gcompile/planner"
)

// The MoE model's settings whose 0 is documented (group 0: one sequence;
// ffn 0: 4·hidden; random_second 0: always keep the second expert) take
// 0 from --set; a negative one is refused, naming it.
func TestMoESettingsTakeZero(t *testing.T) {
	require.NoError(t, mainErr([]string{moeModel, "--set", "layers=2,hidden=32,heads=4,seq=16,router=gshard,random_second=0,group=0,ffn=0", "--batch", "4"}))
	err := mainErr([]string{moeModel, "--set", "layers=2,hidden=32,heads=4,seq=16,group=-1", "--batch", "4"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--set group=-1: want an integer ≥ 0")
}

// The Llama's settings are checked where they are used, one error each:
// a rope_theta of 0 (which the layer library reads as "no rotary
// embedding") and a negative rms_norm_eps are named, and a failed op adds
// no second error about the sizes of its poisoned result.
func TestLlamaSettingsAreNamed(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"rope_theta=0", "--set rope_theta=0: want a base > 1"},
		{"rms_norm_eps=-1", "rmsnorm: eps must be a finite number ≥ 0, got -1"},
	} {
		err := mainErr([]string{llamaModel, "--set", "layers=1,hidden=32,heads=2,kv_heads=1,ffn=64,seq=16," + tc.set, "--batch", "4"})
		require.Error(t, err, tc.set)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), "hidden size 0")
		assert.NotContains(t, err.Error(), "--lr")
		assert.Equal(t, 1, strings.Count(err.Error(), "model.go:"), "one error: %v", err)
	}
}

// A gcompile flag put before launch's -- is named with the fix, not
// answered with launch's usage; an unknown one points at launch -h.
func TestLaunchNamesAMisplacedFlag(t *testing.T) {
	err := mainErr([]string{"launch", "--nproc", "2", "--steps", "3", "--", gptModel})
	require.Error(t, err)
	assert.Equal(t, "launch: -steps is a flag of the processes, not of launch: put it after -- (gcompile launch --nproc N -- MODEL.go -steps …)", err.Error())
	err = mainErr([]string{"launch", "--nproc", "2", "--bogus", "--", gptModel})
	require.Error(t, err)
	assert.Equal(t, "launch: flag provided but not defined: -bogus (see gcompile launch -h)", err.Error())
}

// A --nproc one machine cannot run is refused before anything starts: a
// mistyped 100000 started ranks until the machine stopped answering.
func TestLaunchRefusesMoreProcessesThanTheMachineRuns(t *testing.T) {
	n := maxLaunchProcs() + 1
	err := mainErr([]string{"launch", "--nproc", strconv.Itoa(n), "--", gptModel, "--devices", strconv.Itoa(n)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("launch: --nproc %d is more processes than this machine runs (%d at most: 8 a CPU core", n, n-1))
	assert.Contains(t, err.Error(), "torchrun, srun or mpirun")
}

// --plan over sizes with no candidate says which rules no degrees met,
// with the axes the user fixed; over a very large mesh it answers (each
// class of alike devices is priced once, cost.Predict).
func TestPlannerSaysWhyAndAnswers(t *testing.T) {
	err := mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=16", "--plan", "--devices", "8", "--tp", "3", "--batch", "8"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no plan fits on 8 devices: no candidate exists: --tp 3 as given must divide --devices 8; --tp 3 does not divide the model's 4 heads")
	assert.NotContains(t, err.Error(), "(0 candidates)")
	err = mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=16", "--plan", "--devices", "7", "--batch", "8"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no plan fits on 7 devices: no candidate exists: no tp·pp·dp·ep·cp = 7 has tp dividing the 4 heads")
	out := captureStdout(t, func() {
		require.NoError(t, mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=16", "--plan", "--devices", "65536", "--batch", "65536", "--hardware", "h100-sxm"}))
	})
	assert.Contains(t, out, "dp=65536")
}

// --plan --metrics writes its table when no plan fits: no rows, the
// error, and the plans dropped with their reasons, so a script that reads
// the file learns why; the error names the plan nearest to fitting.
func TestPlanMetricsWhenNoPlanFits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plans.json")
	err := mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=16", "--plan", "--devices", "4", "--batch", "8",
		"--device-memory", "64KiB", "--metrics", path})
	require.ErrorIs(t, err, planner.ErrNoPlan)
	// The plan nearest to fitting is named with how far it is.
	assert.Regexp(t, `the closest to fitting, tp=\d+ pp=\d+ dp=\d+ [^,]*, needs \d+\.\d+ KiB per device, [\d.]+× the 64\.0 KiB available \(more devices`, err.Error())
	data, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	var got struct {
		Candidates int                   `json:"candidates"`
		Plans      []planner.Row         `json:"plans"`
		Error      string                `json:"error"`
		Rejected   []planner.RejectedRow `json:"rejected"`
	}
	require.NoError(t, json.Unmarshal(data, &got))
	assert.NotNil(t, got.Plans)
	assert.Empty(t, got.Plans)
	assert.Equal(t, err.Error(), got.Error)
	assert.Positive(t, got.Candidates)
	require.NotEmpty(t, got.Rejected)
	for _, r := range got.Rejected {
		assert.NotEmpty(t, r.Reason, r.Plan)
		assert.Equal(t, 4, r.TP*r.PP*r.DP*r.EP*r.CP, "%s: the plan's axes", r.Plan)
	}
}

// A trace of a run as short as the steps --trace records refines the
// preset: its last step, which holds the evaluation's forward too, is
// left out instead of failing the match ("embedding occurs 2 times").
func TestRefineFromAShortRunsTrace(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.json")
	set := []string{gptModel, "--set", "layers=2,hidden=32,heads=4,seq=16", "--batch", "4"}
	require.NoError(t, mainErr(append(append([]string{}, set...), "--max-data-mb", "1", "--run", "--steps", "2", "--trace", trace)))
	out := captureStdout(t, func() {
		require.NoError(t, mainErr(append(append([]string{}, set...), "--plan", "--hardware", "cpu", "--tp", "1", "--pp", "1", "--dp", "1", "--refine-trace", trace)))
	})
	assert.Contains(t, out, "tp=1 pp=1 dp=1")
}

// A rank the launcher's signal reached before it set up its handler dies
// of the signal: the launcher counts it stopped as asked, not failed.
func TestKilledBy(t *testing.T) {
	err := exec.Command("/bin/sh", "-c", "kill -TERM $$").Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.True(t, killedBy(ee, syscall.SIGTERM))
	assert.False(t, killedBy(ee, syscall.SIGINT))
	err = exec.Command("/bin/sh", "-c", "exit 143").Run()
	require.ErrorAs(t, err, &ee)
	assert.False(t, killedBy(ee, syscall.SIGTERM), "an exit status is not a death by signal")
}

// A subcommand without its checkpoint says so once, under its own name.
func TestSubcommandWithoutItsCheckpoint(t *testing.T) {
	for _, sub := range []string{"inspect", "export"} {
		err := mainErr([]string{sub})
		require.Error(t, err)
		assert.Equal(t, sub+": want one checkpoint folder, got 0 arguments (see gcompile "+sub+" -h)", err.Error())
	}
}

// Flags that have nothing to act on in a run are said to be unused,
// not dropped without a word: the training loop's without --run,
// --hardware when the plan is given (it prices the planner's plans), a
// gradient reduction's on one device or a plan without data
// parallelism, a job's log folder for one
// process, the spacing of evaluations that do not run.
func TestUnusedFlagsAreNoted(t *testing.T) {
	for _, tc := range []struct {
		args []string
		note string
	}{
		{[]string{"--steps", "3"}, "note: --steps, --max-data-mb shape a training run, and without --run nothing trains: they are not used (add --run to train)"},
		{[]string{"--devices", "2", "--tp", "2", "--hardware", "h100-sxm"}, "note: --hardware describes the devices the planner prices plans on"},
		{[]string{"--bucket-mb", "1"}, "note: --bucket-mb shapes the data-parallel gradient reduction, which one device does not have: not used"},
		{[]string{"--devices", "2", "--tp", "2", "--overlap-grad-reduce"}, "note: --overlap-grad-reduce shapes the data-parallel gradient reduction, and with dp·ep·cp = 1 (tp·pp = 2 take the devices) there is none: not used"},
		{[]string{"--bucket-mb", "1", "--overlap-grad-reduce"}, "note: --bucket-mb, --overlap-grad-reduce shape the data-parallel gradient reduction"},
		{[]string{"--offload", "params", "--offload-prefetch", "1000"}, "note: --offload-prefetch 1000 reaches past the "},
		{[]string{"--set", "layers=2,hidden=32,heads=2,seq=16", "--devices", "2", "--pp", "2"}, "note: --pp 2 splits each step's batch into 2 microbatches, the fewest its 1f1b schedule takes (--microbatches pins another count)"},
		{[]string{"--set", "layers=4,hidden=32,heads=2,seq=16", "--devices", "2", "--pp", "2", "--vpp", "2"}, "note: --pp 2 splits each step's batch into 2 microbatches, the fewest its interleaved schedule takes"},
		{[]string{"--set", "layers=2,hidden=32,heads=2,seq=16", "--devices", "2", "--pp", "2", "--batch", "9"}, "note: --pp 2 splits each step's batch into 3 microbatches"},
		{[]string{"--log-dir", t.TempDir()}, "note: --log-dir holds the logs of the processes of a job"},
		{[]string{"--run", "--steps", "2", "--eval-batches", "-1", "--eval-every", "1"}, "note: --eval-every has no evaluation to space out with --eval-batches -1: not used"},
		{[]string{"--run", "--steps", "2", "--eval-batches", "-1", "--warmup", "100"}, "note: --warmup 100 is not shorter than --steps 2: the run ends before the learning rate reaches --lr (its last step at 6e-05)"},
	} {
		log, err := captureStderr(t, func() error { return mainErr(append(append([]string{}, tinyGPT...), tc.args...)) })
		require.NoError(t, err, "%v", tc.args)
		assert.Contains(t, log, tc.note, "%v", tc.args)
	}
	log, err := captureStderr(t, func() error {
		return mainErr(append(append([]string{}, tinyGPT...), "--devices", "2", "--hardware", "h100-sxm"))
	})
	require.NoError(t, err)
	assert.NotContains(t, log, "note: --hardware", "the planner used it")
	log, err = captureStderr(t, func() error {
		return mainErr(append(append([]string{}, tinyGPT...), "--offload", "params", "--offload-prefetch", "2"))
	})
	require.NoError(t, err)
	assert.NotContains(t, log, "note: --offload-prefetch", "a prefetch within the step's blocks")
	// cp reduces the gradients too.
	log, err = captureStderr(t, func() error {
		return mainErr(append(append([]string{}, tinyGPT...), "--devices", "2", "--cp", "2", "--grad-reduce-dtype", "bf16"))
	})
	require.NoError(t, err)
	assert.NotContains(t, log, "note: --grad-reduce-dtype", "cp's reductions are narrowed")
}

// What --data is read as, where a user could mean another: JSON Lines
// trained on as bytes, and a path that is a text file and a dataset's
// prefix at once. A text too short for a window names --max-data-mb only
// when the cap cut it.
func TestDataIsNotedWhereItCouldMeanAnother(t *testing.T) {
	dir := t.TempDir()
	jsonl := filepath.Join(dir, "docs.jsonl")
	writeFile(t, jsonl, strings.Repeat(`{"text": "the quick brown fox jumps over the lazy dog"}`+"\n", 60))
	prefix := tokenDataset(t, dir, 60, 20, 200, 5)
	writeFile(t, prefix, strings.Repeat("some text beside the dataset\n", 60))
	for _, tc := range []struct {
		data, note string
	}{
		{jsonl, "note: --data " + jsonl + " is read as text, one byte per token, its JSON syntax included; gcompile data prepare"},
		{prefix, "note: --data " + prefix + " names a text file or folder and the token dataset " + prefix + ".bin and .idx: the dataset is read"},
	} {
		log, err := captureStderr(t, func() error {
			return mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "2", "--run", "--steps", "1", "--eval-batches", "-1", "--data", tc.data})
		})
		require.NoError(t, err)
		assert.Contains(t, log, tc.note)
	}
	short := filepath.Join(dir, "short.txt")
	writeFile(t, short, "tiny")
	err := mainErr([]string{gptModel, "--set", "layers=1,hidden=32,heads=2,seq=16", "--batch", "2", "--run", "--steps", "1", "--data", short})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "--max-data-mb")
}

// A split too small names --max-data-mb only where the cap may have cut
// it: the whole text at the cap, or either split at its own share.
func TestCutByCap(t *testing.T) {
	const limit = 1 << 20
	evalShare := int(math.Round(limit * data.DefaultEvalFraction))
	for _, tc := range []struct {
		name        string
		train, eval int
		cut         bool
	}{
		{"a few bytes", 5, 1, false},
		{"the whole cap", limit - evalShare, evalShare, true},
		{"the held-out share alone", 20000, evalShare, true},
		{"the training share alone", limit - evalShare, 100, true},
		{"half of each", (limit - evalShare) / 2, evalShare / 2, false},
	} {
		c := &data.Corpus{Train: make([]byte, tc.train), Eval: make([]byte, tc.eval)}
		assert.Equal(t, tc.cut, cutByCap(c, limit), tc.name)
	}
}

// Tensor parallelism over a model of one head reaches the row-parallel
// projection with its input whole (the attention gathered it): the error
// says what the weight needs and what usually gives it, beside the hint.
func TestRowParallelWithAWholeInputSaysWhy(t *testing.T) {
	err := mainErr([]string{gptModel, "--set", "layers=1,hidden=16,heads=1,seq=8", "--devices", "2", "--tp", "2", "--batch", "2"})
	require.Error(t, err)
	assert.ErrorContains(t, err, "has no rule for operands placed R (whole on every device) and S(0) (split on dim 0) over tp (the weight is split on the dim it contracts, so its input must be split there too, as a column-parallel layer, or attention whose heads divide by tp=2, leaves it; here it arrives whole)")
	assert.ErrorContains(t, err, `"h.0.attn.c_proj.weight"'s hint "row"`)
	assert.ErrorContains(t, err, "--tp 2 does not divide the 1 query heads of the attention at model.go:", "the likely cause comes first")
}

// Without --data on a machine whose Go sources are not found (a .gir run
// where Go is not installed), the error names the flag to give, not the
// library's field.
func TestNoDefaultCorpusNamesTheFlag(t *testing.T) {
	err := dataErr(&config{}, fmt.Errorf("data: %w: cannot locate the Go sources", data.ErrNoDefaultCorpus))
	require.ErrorIs(t, err, data.ErrNoDefaultCorpus)
	assert.Contains(t, err.Error(), "give --data a text file or folder, or a token dataset")
	assert.NotContains(t, err.Error(), "Options.Path")
	other := errors.New("no such file")
	assert.Equal(t, other, dataErr(&config{}, other))
}

// A rank's error is the first line of its last block of "gcompile: "
// lines: a syntax error's knock-on errors and an out-of-memory report's
// largest buffers follow the cause, and the launcher names the cause.
func TestErrorTailKeepsTheErrorsFirstLine(t *testing.T) {
	tail := &errorTail{w: io.Discard}
	for _, line := range []string{
		"gcompile: SIGTERM: stopping after this step (again to exit now)",
		"step 3/10 loss 5.1",
		"gcompile: model.go:6:72: missing ','",
		"gcompile: model.go:8:1: expected operand, found '}'",
	} {
		_, err := tail.Write([]byte(line + "\n"))
		require.NoError(t, err)
	}
	assert.Equal(t, "model.go:6:72: missing ','", tail.last())
}

// An error every rank meets is printed once, by the rank that printed it
// first, knock-on lines and all; each rank's own errors, other lines and
// a last line without its newline are passed on; the cause then names
// the ranks that met it too.
func TestLaunchPrintsAnErrorEveryRankMeetsOnce(t *testing.T) {
	var out bytes.Buffer
	same := &sameErrors{}
	tails := []*errorTail{{w: &out, same: same}, {w: &out, same: same}, {w: &out, same: same}}
	write := func(r int, s string) {
		_, err := tails[r].Write([]byte(s))
		require.NoError(t, err)
	}
	write(1, "gcompile: rank 1: model.go:6:72: missing ','\ngcompile: model.go:8:1: expected operand\n")
	write(0, "note: a note\ngcompile: rank 0: model.go:6:72: missing ','\n")
	write(0, "gcompile: model.go:8:1: expected operand\nstep 1\n")
	write(2, "gcompile: rank 2: out of memory\nstep 2\n")
	write(2, "gcompile: rank 2: model.go:6:72: missing ','\ngcompile: model.go:8:1: expected operand\nlast words")
	for _, tail := range tails {
		require.NoError(t, tail.flush())
	}
	assert.Equal(t, "gcompile: rank 1: model.go:6:72: missing ','\ngcompile: model.go:8:1: expected operand\n"+
		"note: a note\nstep 1\ngcompile: rank 2: out of memory\nstep 2\nlast words", out.String())
	for r, tail := range tails {
		assert.Equal(t, fmt.Sprintf("rank %d: model.go:6:72: missing ','", r), tail.last())
	}
	assert.Equal(t, "ranks 0, 2", same.others(tails[1].last()))
	assert.Equal(t, "ranks 1, 2", same.others(tails[0].last()))
	assert.Empty(t, same.others("rank 2: out of memory"))
	assert.Empty(t, same.others("rank 2: never printed"))
}

// The job's address flags take a host name or an IP address, checked
// before any process compiles; a run of one process says it does not use
// them.
func TestJobAddressesAreHosts(t *testing.T) {
	for _, ok := range []string{"127.0.0.1", "::1", "[fe80::1]", "::1%lo", "fe80::1%eth0", "node-01", "my_node", "node-01.cluster.local", "n1.", "10.0.0.1"} {
		assert.True(t, validHost(ok), ok)
	}
	for _, bad := range []string{"", "not an addr", "10.0.0.1:29500", "-node", "a..b", strings.Repeat("a", 64)} {
		assert.False(t, validHost(bad), bad)
	}
	c, err := parseArgs([]string{gptModel, "--master-addr", "node-01", "--rdzv-timeout", "1m"})
	require.NoError(t, err)
	assert.Contains(t, c.inertFlags(true), "note: --master-addr, --rdzv-timeout say how the processes of a job meet; this run is one process: not used")
	assert.NotContains(t, strings.Join(c.inertFlags(false), "\n"), "how the processes of a job meet")
	c, err = parseArgs([]string{gptModel, "--advertise-addr", "node-01"})
	require.NoError(t, err)
	assert.Contains(t, c.inertFlags(true), "note: --advertise-addr says how the processes of a job meet; this run is one process: not used")
}

// Under a signal the launcher passed on, a rank that exits as any stop
// does (129, 130, 143, or killed by the signal before its handler) has
// stopped as asked: one that heard of the stop through the job before
// its own SIGHUP arrived exits 143, and was taken for the job's failure.
func TestStoppedBySignal(t *testing.T) {
	exit := func(script string) *exec.ExitError {
		err := exec.Command("sh", "-c", script).Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, script)
		return ee
	}
	for _, script := range []string{"exit 129", "exit 130", "exit 143", "kill -HUP $$", "kill -TERM $$"} {
		assert.True(t, stoppedBySignal(exit(script)), script)
	}
	for _, script := range []string{"exit 1", "exit 137", "kill -KILL $$"} {
		assert.False(t, stoppedBySignal(exit(script)), script)
	}
}

// An error's lines each start "gcompile: ", and a trailing line end (a
// tool's output quoted whole) prints no empty "gcompile: " line.
func TestPrintErrorPrefixesEachLine(t *testing.T) {
	out, _ := captureStderr(t, func() error {
		printError(errors.New("loading m.go: stderr: -mod=bogus not supported\nsecond\n"))
		return nil
	})
	assert.Equal(t, "gcompile: loading m.go: stderr: -mod=bogus not supported\ngcompile: second\n", out)
}
