package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
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

	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cuda"
	"gcompile/runtime/cuda/fakegpu"
	"gcompile/runtime/dist"
)

// asMainEnv makes the test binary run gcompile's main instead of its
// tests: the launcher and the fault tests start processes of this binary.
const asMainEnv = "GCOMPILE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	code := m.Run()
	if dumpRoot != "" {
		os.RemoveAll(dumpRoot)
	}
	if jobModelMade.Load() {
		if path, err := jobModel(); err == nil {
			os.RemoveAll(filepath.Dir(path))
		}
	}
	os.Exit(code)
}

// fullMatrix reports whether the full test matrices run (make test-full):
// make test covers each feature once.
func fullMatrix() bool { return os.Getenv("GCOMPILE_FULL_TESTS") == "1" }

// jobModelMade says jobModel ran, so there is a folder to remove.
var jobModelMade atomic.Bool

// jobModel is the module the job tests compile, as a .gir dump of the
// model before any pass: every process parses it instead of building the
// model.go (a Go build per process).
var jobModel = sync.OnceValues(func() (string, error) {
	jobModelMade.Store(true)
	dir, err := os.MkdirTemp("", "gcompile-job-model")
	if err != nil {
		return "", err
	}
	err = mainErr([]string{gptModel, "--set", "layers=4,hidden=32,heads=4,seq=16", "--batch", "8", "--dump", dir})
	return filepath.Join(dir, "00-input.gir"), err
})

// jobArgs is a run of the job model under plan, writing its metrics and
// weights into dir.
func jobArgs(t *testing.T, dir string, plan ...string) []string {
	t.Helper()
	model, err := jobModel()
	require.NoError(t, err)
	args := append([]string{model, "--run", "--steps", "20", "--eval-batches", "1", "--max-data-mb", "1", "--seed", "2",
		"--metrics", filepath.Join(dir, "m.json"), "--save", filepath.Join(dir, "w.safetensors")}, plan...)
	return args
}

// Every plan run as a job of several processes (TCP between them) trains
// bit for bit as the same plan in one process: the same loss at every
// step, the same held-out loss, the same final weights, and every
// device's measured peak equal to the plan's.
func TestJobAcrossProcessesMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	t.Setenv(asMainEnv, "1")
	cases := []struct {
		nproc int
		plan  []string
	}{
		{2, []string{"--devices", "2", "--dp", "2"}},
		{2, []string{"--devices", "2", "--pp", "2", "--microbatches", "2"}},
		{4, []string{"--devices", "4", "--dp", "2", "--tp", "2", "--zero", "1"}},
		{4, []string{"--devices", "4", "--pp", "2", "--tp", "2", "--vpp", "2", "--microbatches", "4"}},
		// The ring's K/V chunks cross processes: cp neighbours are tp = 2
		// ranks apart, on different processes.
		{2, []string{"--devices", "4", "--cp", "2", "--tp", "2"}},
	}
	if fullMatrix() {
		cases = append(cases, []struct {
			nproc int
			plan  []string
		}{
			{2, []string{"--devices", "2", "--tp", "2"}},
			{2, []string{"--devices", "8", "--pp", "2", "--dp", "2", "--tp", "2", "--zero", "3", "--microbatches", "2"}},
		}...)
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d procs %s", tc.nproc, strings.Join(tc.plan, " ")), func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, mainErr(append([]string{"launch", "--nproc", strconv.Itoa(tc.nproc), "--"}, jobArgs(t, dir, tc.plan...)...)))
			assertMatchesOneProcess(t, tc.plan, tc.nproc, dir)
		})
	}
}

// oneProcessRun is a run of a plan in one process: what a job must
// reproduce.
type oneProcessRun struct {
	metrics runtime.Metrics
	weights []byte
}

// oneProcessRuns holds one run per plan (a func() (oneProcessRun, error)
// by the plan's flags), so that the launchers' tests of one plan train it
// in one process once.
var oneProcessRuns sync.Map

// oneProcess is the reference run of plan, in this process.
func oneProcess(t *testing.T, plan []string) oneProcessRun {
	t.Helper()
	dir := t.TempDir()
	args := jobArgs(t, dir, plan...)
	f, _ := oneProcessRuns.LoadOrStore(strings.Join(plan, " "), sync.OnceValues(func() (oneProcessRun, error) {
		var ref oneProcessRun
		if err := mainErr(args); err != nil {
			return ref, err
		}
		raw, err := os.ReadFile(filepath.Join(dir, "m.json"))
		if err != nil {
			return ref, err
		}
		if err := json.Unmarshal(raw, &ref.metrics); err != nil {
			return ref, err
		}
		ref.weights, err = os.ReadFile(filepath.Join(dir, "w.safetensors"))
		return ref, err
	}))
	ref, err := f.(func() (oneProcessRun, error))()
	require.NoError(t, err, "the reference run of %q in one process", plan)
	return ref
}

// assertMatchesOneProcess checks that the job that wrote dir ran as
// nproc processes and trained as plan does in one: the same loss and
// gradient norm at every step, the same held-out loss, every device's
// measured peak equal to the plan's and to the reference's, and the same
// saved weights, byte for byte. It returns the job's metrics.
func assertMatchesOneProcess(t *testing.T, plan []string, nproc int, dir string) runtime.Metrics {
	t.Helper()
	want := oneProcess(t, plan)
	got := readMetrics(t, filepath.Join(dir, "m.json"))
	// Processes that missed the launcher's variables would each train
	// alone and match too; only a job of nproc processes says this.
	require.EqualValues(t, nproc, got.Config["processes"], "the processes ran as one job")
	require.Len(t, got.Steps, len(want.metrics.Steps))
	require.NotEmpty(t, got.Steps)
	for i, s := range want.metrics.Steps {
		assert.Equal(t, s.Loss, got.Steps[i].Loss, "step %d", i+1)
		assert.Equal(t, s.GradNorm, got.Steps[i].GradNorm, "step %d", i+1)
	}
	require.Len(t, got.Eval, len(want.metrics.Eval))
	for i, e := range want.metrics.Eval {
		assert.Equal(t, e.Loss, got.Eval[i].Loss, "held-out loss %d", i)
	}
	require.Len(t, got.Devices, len(want.metrics.Devices))
	for r, d := range got.Devices {
		assert.Equal(t, d.PeakBytesPredicted, d.PeakBytesMeasured, "device %d", r)
		assert.Equal(t, want.metrics.Devices[r].PeakBytesMeasured, d.PeakBytesMeasured, "device %d", r)
	}
	w, err := os.ReadFile(filepath.Join(dir, "w.safetensors"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want.weights, w), "the saved weights are the same bytes")
	return got
}

// proc is one process of a job started by hand, as srun or mpirun would.
type proc struct {
	cmd *exec.Cmd
	out bytes.Buffer
	err error
}

// startProcs starts n processes of a job with torchrun's variables (and
// env on top), each running gcompile with args. Cleanup kills what is
// left and checks that nothing is.
func startProcs(t *testing.T, n int, args []string, env func(r int) []string) []*proc {
	t.Helper()
	ranks := make([]int, n)
	for r := range ranks {
		ranks[r] = r
	}
	return startRanks(t, n, ranks, args, env)
}

// startRanks is startProcs for a job of world processes of which those of
// ranks are started, one process each (a rank may be given twice).
func startRanks(t *testing.T, world int, ranks []int, args []string, env func(r int) []string) []*proc {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	port, err := freePort()
	require.NoError(t, err)
	ps := make([]*proc, len(ranks))
	token := jobToken(t)
	for i, r := range ranks {
		ps[i] = startProc(t, self, args, append(append(childEnv(r, world, port, token), asMainEnv+"=1"), envOf(env, r)...))
	}
	return ps
}

// ownGroup puts the process cmd starts in a process group of its own.
// The tests stop processes (SIGSTOP) to stand for a stalled rank, and
// the kernel sends SIGHUP, then SIGCONT, to every process of an orphaned
// process group that holds a stopped one when an exit leaves it orphaned:
// a test binary run in the background of a shell that has since ended, as
// a CI job's may be, is in such a group, and a stalled process in it was
// seen killed by that SIGHUP 2–3 s after its stop, ending the job by the
// lost connection instead of the timeout the test waits for. A group of
// its own, whose leader's parent (the test binary) is in another group of
// the same session, is not orphaned while the test binary lives.
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// jobToken is a fresh token for one job of a test. Jobs of tests that run
// at once would otherwise share one, and two whose stores' port ranges
// meet (freePort's ports are the system's, and a store looks through
// rendezvousPorts of them) would take each other's processes and failure
// reports, as two real jobs given one GCOMPILE_TOKEN on nearby ports
// would.
func jobToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// startProc starts one process of a job, killed with the test if still
// running then, and with the test binary however it ends (startTied), in
// a process group of its own (ownGroup).
func startProc(t *testing.T, self string, args, env []string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(self, args...)}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	ownGroup(p.cmd)
	require.NoError(t, startTied(p.cmd))
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
		// Signal 0 checks that the process is gone (reaped above).
		assert.Error(t, p.cmd.Process.Signal(syscall.Signal(0)), "a process is still running")
	})
	return p
}

// waitAll waits for every process, failing the test after limit.
func waitAll(t *testing.T, ps []*proc, limit time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		for _, p := range ps {
			p.err = p.cmd.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("the job's processes did not exit within %v", limit)
	}
}

// faultArgs is a long run (so a fault lands mid-training) with a short
// timeout.
func faultArgs(t *testing.T, steps int, extra ...string) []string {
	model, err := jobModel()
	require.NoError(t, err)
	return append([]string{model, "--run", "--steps", strconv.Itoa(steps), "--eval-batches", "1", "--max-data-mb", "1",
		"--devices", "4", "--dp", "2", "--tp", "2", "--timeout", "20s"}, extra...)
}

// waitForStep waits until process p has printed that it trains.
func waitForTraining(t *testing.T, ps []*proc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(ps[0].output(), "step 2/") {
		if time.Now().After(deadline) {
			t.Fatalf("the job never started training:\n%s", ps[0].output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var outMu sync.Mutex

func (p *proc) output() string {
	outMu.Lock()
	defer outMu.Unlock()
	return p.out.String()
}

// kill -9 of one process mid-step: every other process exits non-zero
// within the timeout, naming the lost rank.
func TestJobLosesAProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	assertLossNamed(t, startProcs(t, 4, faultArgs(t, 100000), nil), 2)
}

// assertLossNamed kills process victim of a training job (one device
// each) with SIGKILL and checks that every other exits non-zero, well
// within the timeout, naming it.
func assertLossNamed(t *testing.T, ps []*proc, victim int) {
	t.Helper()
	waitForTraining(t, ps)
	start := time.Now()
	require.NoError(t, ps[victim].cmd.Process.Kill())
	waitAll(t, ps, 20*time.Second)
	t.Logf("the job ended %v after the kill", time.Since(start).Round(time.Millisecond))
	want := fmt.Sprintf("process %d (rank %d", victim, victim)
	// The error line leads with the lost process, whichever step and op
	// each process noticed it in.
	first := regexp.MustCompile(fmt.Sprintf(`(?m)^gcompile: rank \d+: (stopped by another process's failure: rank \d+: )?lost process %d \(rank %d`, victim, victim))
	for r, p := range ps {
		require.Error(t, p.err, "rank %d", r)
		if r != victim {
			assert.Contains(t, p.output(), want, "rank %d names the lost process:\n%s", r, p.output())
			assert.Regexp(t, first, p.output(), "rank %d names the lost process first", r)
			assert.Equal(t, 1, strings.Count(p.output(), "gcompile: "), "rank %d prints its failure once:\n%s", r, p.output())
		}
	}
}

// A stalled process (SIGSTOP) is named by the others' timeout, first,
// by its heartbeat. The collective that timed out may be one with a
// device of this process (its tp peer, itself waiting for process 1),
// so which rank it names after is not asserted: that is why the
// heartbeat leads.
func TestJobTimesOutOnAStalledProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ps, _ := stallProcessOne(t, "3s", 30*time.Second)
	assert.Contains(t, ps[0].output(), "timed out after 3s waiting for rank")
	assert.Regexp(t, `(?m)^gcompile: rank 0: process 1 \(ranks 2–3\) stopped answering \(no heartbeat for 2\.5s, last training\): no answer from rank [0-3] \(process [01] \(ranks [02]–[13]`, ps[0].output(), "the stalled process first, by its heartbeat")
}

// stallProcessOne starts a job of two processes under --timeout, stops
// process 1 (SIGSTOP) once it trains, and waits at most wait for process
// 0 to fail: it returns the processes and how long that took. Process 1
// is killed when the test ends.
func stallProcessOne(t *testing.T, timeout string, wait time.Duration) ([]*proc, time.Duration) {
	t.Helper()
	args := faultArgs(t, 100000)
	args[len(args)-1] = timeout
	ps := startProcs(t, 2, args, nil)
	waitForTraining(t, ps)
	require.NoError(t, ps[1].cmd.Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() {
		ps[1].cmd.Process.Signal(syscall.SIGKILL)
		ps[1].cmd.Wait()
	})
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- ps[0].cmd.Wait() }()
	select {
	case ps[0].err = <-done:
	case <-time.After(wait):
		t.Fatalf("process 0 was still running %v after process 1 stopped", wait)
	}
	require.Error(t, ps[0].err)
	return ps, time.Since(start)
}

// Under a long --timeout (the default ten minutes), a process that stops
// beating while the others beat (stopped, or killed before the comm
// connects: while it builds or compiles the model) stops the job after
// stallLimit, named by rank 0, which watches the heartbeats: it held the
// others until --timeout.
func TestJobStopsOnAStalledProcessBeforeTheTimeout(t *testing.T) {
	if testing.Short() || !fullMatrix() {
		t.Skip("waits half a minute for the stall limit: GCOMPILE_FULL_TESTS=1")
	}
	ps, took := stallProcessOne(t, "10m", stallLimit+30*time.Second)
	assert.Less(t, took, stallLimit+20*time.Second)
	assert.Contains(t, ps[0].output(), "process 1 (ranks 2–3) stopped answering (no heartbeat for 30s, last training, while the others beat: killed or stopped); the job stops rather than wait out --timeout 10m0s")
}

// A process stopped (SIGSTOP) while the job saves a checkpoint every step
// is named by every other process as the one that stopped answering, by
// its heartbeat: the others' own waits may be for a healthy process that
// waits for it too (before, 4 of 25 such stalls were blamed on rank 0).
func TestJobNamesTheStalledProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	args := faultArgs(t, 100000, "--checkpoint-dir", t.TempDir(), "--checkpoint-every", "1")
	for i, a := range args {
		if a == "--timeout" {
			args[i+1] = "3s"
		}
	}
	ps := startProcs(t, 4, args, nil)
	waitForTraining(t, ps)
	require.NoError(t, ps[3].cmd.Process.Signal(syscall.SIGSTOP))
	defer ps[3].cmd.Process.Signal(syscall.SIGKILL)
	waitAll(t, ps[:3], 40*time.Second)
	for r, p := range ps[:3] {
		require.Error(t, p.err, "rank %d", r)
		assert.Equal(t, 1, strings.Count(p.output(), "gcompile: "), "rank %d prints its failure once:\n%s", r, p.output())
		assert.Regexp(t, `(?m)^gcompile: rank \d+: (stopped by another process's failure: rank \d+: )?process 3 \(rank 3\) stopped answering \(no heartbeat for 2\.5s, last (training|saving the checkpoint of step \d+)\): `, p.output(), "rank %d names the stalled process first", r)
	}
}

// A misconfigured job fails within seconds on every process, each naming
// the cause, under the default --timeout (10 minutes) and
// --rdzv-timeout (5): before, each of these waited for one of them.
func TestMisconfiguredJobsFailFast(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	args := []string{model, "--devices", "2", "--run", "--steps", "2", "--max-data-mb", "1", "--eval-batches", "1"}
	const unresolvable = "gcompile-no-such-host.invalid"
	tests := []struct {
		name  string
		env   func(r int) []string
		extra func(r int) []string
		want  []string // in every process's output, by rank
		skip  func() string
	}{
		{
			name: "one-sided token",
			env: func(r int) []string {
				if r == 1 {
					return []string{"GCOMPILE_TOKEN=not-the-secret"}
				}
				return nil
			},
			want: []string{
				"the job cannot start: rank 1 at 127.0.0.1:",
				"so the job's processes were given different tokens: give them all one GCOMPILE_TOKEN",
			},
		},
		{
			name: "one-sided token, the launcher names the job",
			env: func(r int) []string {
				env := []string{"TORCHELASTIC_RUN_ID=run-7"}
				if r == 1 {
					env = append(env, "GCOMPILE_TOKEN=not-the-secret")
				}
				return env
			},
			want: []string{
				"names this job but holds another token",
				"it is this job's store (job ",
			},
		},
		{
			name: "world size differs",
			// Four devices: a layout for both two and four processes.
			extra: func(int) []string { return []string{"--devices", "4"} },
			env: func(r int) []string {
				if r == 1 {
					return []string{"WORLD_SIZE=4", "LOCAL_WORLD_SIZE=4"}
				}
				return nil
			},
			want: []string{
				"the job cannot start: rank 1 at 127.0.0.1:",
				"was told the job has 4 processes, the store's process (rank 0) was told 2",
			},
		},
		{
			name: "a flag differs",
			extra: func(r int) []string {
				if r == 1 {
					return []string{"--seed", "7"}
				}
				return nil
			},
			want: []string{
				`rank 1 was given other flags than rank 0: --seed "7" (rank 0: "1")`,
				`rank 1 was given other flags than rank 0: --seed "7" (rank 0: "1")`,
			},
		},
		{
			name: "a process fails before it joins",
			extra: func(r int) []string {
				if r == 1 {
					return []string{"--zero", "7"}
				}
				return nil
			},
			want: []string{
				"the job cannot start: rank 1: --zero 7: want 0, 1, 2 or 3",
				"rank 1: --zero 7: want 0, 1, 2 or 3",
			},
		},
		{
			name: "rank 0 fails before it joins",
			extra: func(r int) []string {
				if r == 0 {
					return []string{"--steps", "-5"}
				}
				return nil
			},
			want: []string{
				"rank 0: --steps",
				"the job cannot start: rank 0: --steps",
			},
		},
		{
			name: "master address does not resolve",
			env:  func(int) []string { return []string{"MASTER_ADDR=" + unresolvable} },
			want: []string{
				`the master address "` + unresolvable + `" does not resolve on this machine`,
				`the master address "` + unresolvable + `" does not resolve on this machine`,
			},
			skip: func() string {
				_, err := net.DefaultResolver.LookupHost(context.Background(), unresolvable)
				var dnsErr *net.DNSError
				if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
					return fmt.Sprintf("this machine's resolver does not say that %s does not exist: %v", unresolvable, err)
				}
				return ""
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.skip != nil {
				if why := tc.skip(); why != "" {
					t.Skip(why)
				}
			}
			ps := make([]*proc, 2)
			self, err := os.Executable()
			require.NoError(t, err)
			port, err := freePort()
			require.NoError(t, err)
			token := jobToken(t)
			for r := range ps {
				a := slices.Clone(args)
				if tc.extra != nil {
					a = append(a, tc.extra(r)...)
				}
				ps[r] = startProc(t, self, a, append(append(childEnv(r, 2, port, token), asMainEnv+"=1"), envOf(tc.env, r)...))
			}
			start := time.Now()
			waitAll(t, ps, 60*time.Second)
			assert.Less(t, time.Since(start), 15*time.Second, "the job fails within seconds, not after a timeout")
			for r, p := range ps {
				t.Logf("rank %d:\n%s", r, p.output())
				require.Error(t, p.err, "rank %d:\n%s", r, p.output())
				assert.Contains(t, p.output(), tc.want[r], "rank %d", r)
				assert.NotContains(t, p.output(), "building model", "rank %d builds nothing", r)
			}
		})
	}
}

// envOf is env(r), or nothing when env is nil.
func envOf(env func(int) []string, r int) []string {
	if env == nil {
		return nil
	}
	return env(r)
}

// twoProcessJob runs a job of two processes to its end, each given the
// arguments argsOf(rank), and returns them.
func twoProcessJob(t *testing.T, argsOf func(r int) []string) []*proc {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	port, err := freePort()
	require.NoError(t, err)
	ps := make([]*proc, 2)
	token := jobToken(t)
	for r := range 2 {
		ps[r] = startProc(t, self, argsOf(r), append(childEnv(r, 2, port, token), asMainEnv+"=1"))
	}
	waitAll(t, ps, 60*time.Second)
	return ps
}

// refusedBeforeTraining asserts that both processes of ps failed before
// any step, each saying want.
func refusedBeforeTraining(t *testing.T, ps []*proc, want string) {
	t.Helper()
	for r, p := range ps {
		require.Error(t, p.err, "rank %d", r)
		assert.Contains(t, p.output(), want, "rank %d:\n%s\nthe other:\n%s", r, p.output(), ps[1-r].output())
		assert.NotContains(t, p.output(), "step 1/", "rank %d trained", r)
	}
}

// A process that read other data than rank 0 (its --data, a path each
// machine may give its own way, names other text) is named before any
// training: by the text's contents, not its path.
func TestJobRefusesOtherDataOnOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	same, copied, other := filepath.Join(dir, "a.txt"), filepath.Join(dir, "copy.txt"), filepath.Join(dir, "b.txt")
	require.NoError(t, os.WriteFile(same, []byte(text(8192)), 0o644))
	require.NoError(t, os.WriteFile(copied, []byte(text(8192)), 0o644))
	require.NoError(t, os.WriteFile(other, []byte(strings.ToUpper(text(8192))), 0o644))
	dataOf := func(second string) func(r int) []string {
		return func(r int) []string {
			if r == 1 {
				return faultArgs(t, 2, "--data", second)
			}
			return faultArgs(t, 2, "--data", same)
		}
	}
	for r, p := range twoProcessJob(t, dataOf(copied)) {
		require.NoError(t, p.err, "rank %d, the same text under another name:\n%s", r, p.output())
	}
	refusedBeforeTraining(t, twoProcessJob(t, dataOf(other)), "rank 1 reads other data than rank 0 (byte-level text of ")
}

// The processes of a job write one checkpoint folder: one given a folder
// the others do not see (here its own path; on a cluster, a disk of its
// machine) is named before any training, by its own error on every
// process, not at the first save.
func TestJobRefusesACheckpointDirItDoesNotShare(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	ps := twoProcessJob(t, func(r int) []string {
		return faultArgs(t, 2, "--checkpoint-dir", filepath.Join(dir, fmt.Sprintf("ck-of-rank-%d", r)))
	})
	refusedBeforeTraining(t, ps, "--checkpoint-dir "+filepath.Join(dir, "ck-of-rank-1")+" is not the folder rank 0 writes")
}

// What one process loads, resumes or saves the others must too: --save
// given to rank 0 alone (every process gathers for it) is named before
// any training, where a sharded plan had trained to the end and hung at
// the save, the weights lost.
func TestJobRefusesASaveOnOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	dir := t.TempDir()
	ps := twoProcessJob(t, func(r int) []string {
		if r == 0 {
			return faultArgs(t, 2, "--save", filepath.Join(dir, "w.safetensors"))
		}
		return faultArgs(t, 2)
	})
	refusedBeforeTraining(t, ps, "rank 1 was given none, rank 0 --save: every process must be given the same --load weights and --resume checkpoint")
}

// A process that compiled another plan (here: another model file, with
// one LayerNorm's eps changed; its flags are rank 0's) is named before
// any training.
func TestJobRefusesADifferentPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	src, err := os.ReadFile(model)
	require.NoError(t, err)
	require.Contains(t, string(src), "eps=1e-05")
	other := filepath.Join(t.TempDir(), "other.gir")
	require.NoError(t, os.WriteFile(other, []byte(strings.Replace(string(src), "eps=1e-05", "eps=2e-05", 1)), 0o644))
	ps := twoProcessJob(t, func(r int) []string {
		args := faultArgs(t, 2, "--timeout", "20s")
		if r == 1 {
			args[0] = other
		}
		return args
	})
	refusedBeforeTraining(t, ps, "rank 1 compiled a different plan than rank 0")
}

// A process that runs another gcompile build (here a copy of this
// executable with a byte appended: a test binary carries no commit, so
// its build is named by its hash) is named before any training, as the
// build, even though it compiled the same plan.
func TestJobRefusesAnotherBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	exe, err := os.ReadFile(self)
	require.NoError(t, err)
	other := filepath.Join(t.TempDir(), "gcompile-other")
	require.NoError(t, os.WriteFile(other, append(exe, 0), 0o755))
	port, err := freePort()
	require.NoError(t, err)
	token := jobToken(t)
	ps := make([]*proc, 2)
	for r, bin := range []string{self, other} {
		ps[r] = startProc(t, bin, faultArgs(t, 2, "--timeout", "20s"), append(childEnv(r, 2, port, token), asMainEnv+"=1"))
	}
	waitAll(t, ps, 60*time.Second)
	refusedBeforeTraining(t, ps, "rank 1 runs another gcompile build than rank 0")
}

// Processes compare one identity each: the first that differs from
// process 0's is named, by its build before its plan before its data.
func TestSameProcesses(t *testing.T) {
	base := processIdentity{Build: "go1.26 commit a", Plan: "p", Data: "d"}
	with := func(f func(*processIdentity)) processIdentity { p := base; f(&p); return p }
	for _, tc := range []struct {
		name string
		ids  []processIdentity
		want string
	}{
		{"alike", []processIdentity{base, base, base}, ""},
		{"build", []processIdentity{base, base, with(func(p *processIdentity) { p.Build, p.Plan = "go1.26 commit b", "q" })}, "rank 2 runs another gcompile build than rank 0 (go1.26 commit b, rank 0: go1.26 commit a)"},
		{"plan", []processIdentity{base, with(func(p *processIdentity) { p.Plan = "q" }), base}, "rank 1 compiled a different plan than rank 0"},
		{"data", []processIdentity{base, with(func(p *processIdentity) { p.Data = "e" })}, "rank 1 reads other data than rank 0 (e, rank 0: d)"},
		{"sources", []processIdentity{with(func(p *processIdentity) { p.Sources = "--load header sha256 ab; --save" }), with(func(p *processIdentity) { p.Sources = "--save" })},
			"rank 1 was given --save, rank 0 --load header sha256 ab; --save"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.ids {
				tc.ids[i] = parseProcessIdentity(tc.ids[i].String())
			}
			err := sameProcesses(tc.ids)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	assert.NotEmpty(t, buildIdentity())
	assert.Contains(t, buildIdentity(), goruntime.Version())
	assert.Equal(t, buildIdentity(), buildIdentity())
}

// The launcher stops every process when one fails, and says which, and
// the cause (a rank's own error, not another's echo of it): here every
// process's compile refuses the plan (a check that needs the compiled
// plan, which the launcher does not compile). The error, which both
// ranks print, is printed once, and the cause names the other rank.
func TestLaunchStopsTheJobWhenOneFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "launch", "--nproc", "2", "--", model, "--devices", "2", "--device-memory", "10KiB")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Regexp(t, `(?m)^gcompile: launch: rank [01] failed first \(exit status 1\); stopping the others \(the ranks' messages above name the cause\)\ngcompile: launch: the cause: rank [01]: no plan fits on 2 devices .*( \(rank [01] met the same; printed once above\))?$`, string(out))
	// The other rank's same error is left out (or, held up past the
	// launcher's wait under load, never printed).
	assert.Equal(t, 2, strings.Count(string(out), "no plan fits on 2 devices"), "once from a rank, once as the cause:\n%s", out)
}

// What the launcher can check itself is checked once, before any process
// starts: one error, under no rank, and nothing started (a started
// process would print its own, labelled with its rank).
func TestLaunchChecksTheJobBeforeStarting(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the launcher as a process; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	dir := t.TempDir()
	notDir, folder := filepath.Join(dir, "file"), filepath.Join(dir, "model.go")
	require.NoError(t, os.WriteFile(notDir, []byte("x"), 0o644))
	require.NoError(t, os.Mkdir(folder, 0o755))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing model", []string{filepath.Join(dir, "nope", "model.go"), "--devices", "4"},
			"gcompile: launch: no process started: model file: stat " + filepath.Join(dir, "nope", "model.go") + ": no such file or directory"},
		{"model is a folder", []string{folder, "--devices", "4"}, "gcompile: launch: no process started: model file " + folder + " is a folder"},
		{"flag value", []string{model, "--devices", "4", "--zero", "7"}, "gcompile: launch: no process started: --zero 7: want 0, 1, 2 or 3"},
		{"unknown flag", []string{model, "--devices", "4", "--bogus"}, "gcompile: launch: no process started: flag provided but not defined: -bogus (see gcompile -h)"},
		{"devices over processes", []string{model, "--devices", "6", "--tp", "6"},
			"gcompile: launch: no process started: --devices 6 over --nproc 4 processes: 6 devices do not split evenly over 4 processes"},
		{"missing checkpoint", []string{model, "--devices", "4", "--run", "--resume", filepath.Join(dir, "ck", "step-20")},
			"gcompile: launch: no process started: --resume: checkpoint " + filepath.Join(dir, "ck", "step-20") + ": stat"},
		{"missing --load", []string{model, "--devices", "4", "--run", "--load", filepath.Join(dir, "w.safetensors")},
			"gcompile: launch: no process started: --load: stat " + filepath.Join(dir, "w.safetensors") + ": no such file or directory"},
		{"a subcommand", []string{"eval", model, "--devices", "4"},
			"gcompile: launch: it starts the processes of a training job (gcompile launch --nproc N -- MODEL.go [flags]); run gcompile eval without it"},
		{"output under a file", []string{model, "--devices", "4", "--metrics", filepath.Join(notDir, "m.json")},
			"gcompile: launch: no process started: --metrics " + filepath.Join(notDir, "m.json") + ": " + notDir + " is a file, not a folder"},
		{"log folder under a file", []string{model, "--devices", "4", "--log-dir", filepath.Join(notDir, "logs")},
			"gcompile: launch: no process started: --log-dir " + filepath.Join(notDir, "logs") + ": " + notDir + " is a file, not a folder"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append([]string{"launch", "--nproc", "4", "--"}, tc.args...)...)
			cmd.Env = append(os.Environ(), asMainEnv+"=1")
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s", out)
			assert.Equal(t, 1, exit.ExitCode())
			assert.True(t, strings.HasPrefix(string(out), tc.want), "want %q, got:\n%s", tc.want, out)
			assert.Equal(t, 1, strings.Count(string(out), "gcompile:"), "one error line:\n%s", out)
			assert.NotContains(t, string(out), "rank", "no process started:\n%s", out)
		})
	}
}

// In a job whose processes fail, every error line starts with the rank
// of the process that prints it: the process that failed names itself,
// and the processes its failure stopped say so, naming it after their own.
func TestJobErrorsNameTheirOwnRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	self, err := os.Executable()
	require.NoError(t, err)
	port, err := freePort()
	require.NoError(t, err)
	const n, failing = 4, 2
	ps := make([]*proc, n)
	token := jobToken(t)
	for r := range n {
		args := []string{model, "--devices", "4", "--dp", "4", "--run", "--timeout", "20s"}
		if r == failing {
			args = append(args, "--device-memory", "10KiB") // only this process's compile fails
		}
		p := &proc{cmd: exec.Command(self, args...)}
		p.cmd.Env = append(childEnv(r, n, port, token), asMainEnv+"=1")
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		ownGroup(p.cmd)
		require.NoError(t, startTied(p.cmd))
		ps[r] = p
	}
	waitAll(t, ps, 60*time.Second)
	label := regexp.MustCompile(`(?m)^gcompile: rank (\d+)\b`)
	for r, p := range ps {
		require.Error(t, p.err, "rank %d", r)
		out := p.output()
		labels := label.FindAllStringSubmatch(out, -1)
		require.NotEmpty(t, labels, "rank %d labels its error:\n%s", r, out)
		for _, l := range labels {
			assert.Equal(t, strconv.Itoa(r), l[1], "process %d printed a line labelled rank %s:\n%s", r, l[1], out)
		}
		want := fmt.Sprintf("gcompile: rank %d: stopped by another process's failure: rank %d: out of device memory", r, failing)
		if r == failing {
			want = fmt.Sprintf("gcompile: rank %d: out of device memory", r)
		}
		assert.Contains(t, out, want, "rank %d", r)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// On the stand-in GPU, a job of two processes with two GPUs each (NCCL
// between all four, pipeline transfers over NCCL send/recv across the
// processes) trains as the CPU backend does in one process.
func TestCUDAJobAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("trains in the kernel emulator in two processes; skipped with -short")
	}
	libs := fakegpu.Install(t)
	t.Setenv(asMainEnv, "1")
	t.Setenv("GCOMPILE_FAKEGPU_DEVICES", "4")
	t.Setenv("GCOMPILE_CACHE", t.TempDir())
	t.Setenv(cuda.LaunchEnv, "32x4") // the emulator's fastest geometry
	for _, kv := range libs.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	// A smaller model than the other job tests': every step runs in the
	// emulator.
	small := filepath.Join(t.TempDir(), "small")
	require.NoError(t, mainErr([]string{gptModel, "--set", "layers=2,hidden=16,heads=2,seq=8", "--batch", "4", "--dump", small}))
	cpuDir, gpuDir := t.TempDir(), t.TempDir()
	short := func(dir string) []string {
		return []string{filepath.Join(small, "00-input.gir"), "--run", "--steps", "2", "--eval-batches", "1", "--max-data-mb", "1",
			"--metrics", filepath.Join(dir, "m.json"), "--devices", "4", "--pp", "2", "--dp", "2", "--microbatches", "2"}
	}
	require.NoError(t, mainErr(short(cpuDir)))
	launch := append([]string{"launch", "--nproc", "2", "--"}, append(short(gpuDir), "--backend", "cuda")...)
	require.NoError(t, mainErr(launch))
	want, got := readMetrics(t, filepath.Join(cpuDir, "m.json")), readMetrics(t, filepath.Join(gpuDir, "m.json"))
	require.Len(t, got.Steps, 2)
	for i := range want.Steps {
		assert.InEpsilon(t, want.Steps[i].Loss, got.Steps[i].Loss, 1e-6, "step %d", i+1)
	}
	assert.InEpsilon(t, want.Eval[0].Loss, got.Eval[0].Loss, 1e-6, "held-out loss")
	for r, d := range got.Devices {
		assert.Equal(t, d.PeakBytesPredicted, d.PeakBytesMeasured, "device %d", r)
	}
	assert.Contains(t, got.Config["device"], "fake GPU")
}

// SIGTERM to one process during training stops the whole job at the
// same step boundary: every process saves its part of the checkpoint and
// exits 143 (the job did not finish), and rank 0 says why and how to
// continue. Before training a signal fails the job, every process with
// the signal's status.
func TestJobStopsOnASignalToOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ck := filepath.Join(t.TempDir(), "ck")
	ps := startProcs(t, 2, faultArgs(t, 100000, "--checkpoint-dir", ck, "--zero", "1"), nil)
	waitForTraining(t, ps)
	require.NoError(t, ps[1].cmd.Process.Signal(syscall.SIGTERM))
	waitAll(t, ps, 20*time.Second)
	for r, p := range ps {
		var exit *exec.ExitError
		require.ErrorAs(t, p.err, &exit, "rank %d:\n%s", r, lastLine(p.output()))
		assert.Equal(t, 143, exit.ExitCode(), "rank %d:\n%s", r, lastLine(p.output()))
	}
	found, err := checkpoint.Find(ck)
	require.NoError(t, err)
	assert.Contains(t, ps[0].output(), "stopped by a signal to another process after step", "rank 0:\n%s", lastLine(ps[0].output()))
	assert.Contains(t, ps[0].output(), "continue with --resume "+found)
	m, err := checkpoint.ReadManifest(found)
	require.NoError(t, err)
	assert.Len(t, m.Files, 4, "both processes wrote their ranks' blocks (ZeRO-1 splits the optimizer state over dp, ranks 2 and 3 being process 1's)")
}

// A signal to a process before training (here while it waits for a
// process that never comes) ends it within seconds with the signal's
// status, as a signal during training does (TestSignalSavesAndExits): the
// job did not finish.
func TestJobSignalledBeforeTraining(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ps := startProcs(t, 2, faultArgs(t, 100000), nil)
	require.NoError(t, ps[1].cmd.Process.Kill())
	time.Sleep(time.Second) // rank 0 is in the rendezvous, its signals caught
	require.NoError(t, ps[0].cmd.Process.Signal(syscall.SIGINT))
	start := time.Now()
	waitAll(t, ps, 20*time.Second)
	assert.Less(t, time.Since(start), 15*time.Second)
	var exit *exec.ExitError
	require.ErrorAs(t, ps[0].err, &exit, "%s", ps[0].output())
	assert.Equal(t, 130, exit.ExitCode(), "%s", ps[0].output())
	assert.Contains(t, ps[0].output(), "rank 0 was interrupted by SIGINT before training")
}

// SIGTERM to gcompile launch reaches every rank: they stop at a step
// boundary, and the launcher exits 143, not 0 (the run did not finish)
// nor 1 (nothing failed); SIGHUP (the terminal gone) likewise, with 129. A terminal's Ctrl-C, SIGINT to the launcher's
// whole process group, does the same with 130: the ranks run in groups
// of their own, so they hear it once, from the launcher (heard twice,
// they exited at once as on a second signal, with no checkpoint).
func TestLaunchPassesASignalOn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	for _, tc := range []struct {
		sig   syscall.Signal
		group bool
		code  int
	}{{syscall.SIGTERM, false, 143}, {syscall.SIGINT, true, 130}, {syscall.SIGHUP, false, 129}} {
		t.Run(fmt.Sprintf("%v group=%v", tc.sig, tc.group), func(t *testing.T) { launchAndSignal(t, tc.sig, tc.group, tc.code) })
	}
}

// The launcher's output closing (a pipe to head, a killed tee) stops the
// job as SIGTERM does, each rank at a step boundary with the checkpoint,
// and the launcher exits 141; before, the launcher died of SIGPIPE at
// its next line and took every rank with it, with no checkpoint.
func TestLaunchStopsWhenItsOutputCloses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ck := filepath.Join(t.TempDir(), "ck")
	cmd, stderr := startMain(t, append([]string{"launch", "--nproc", "2", "--"}, faultArgs(t, 100000, "--checkpoint-dir", ck)...)...)
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	var log strings.Builder
	readUntil(t, stderr, &log, "step 2/")
	require.NoError(t, stderr.(io.Closer).Close())
	var exit *exec.ExitError
	require.ErrorAs(t, cmd.Wait(), &exit)
	assert.Equal(t, 141, exit.ExitCode(), "SIGPIPE's status, 128 + 13: %v", exit)
	found, err := checkpoint.Find(ck)
	require.NoError(t, err, "the ranks stopped at a step boundary with a checkpoint")
	m, err := checkpoint.ReadManifest(found)
	require.NoError(t, err)
	assert.Positive(t, m.State.Step)
}

func launchAndSignal(t *testing.T, sig syscall.Signal, group bool, code int) {
	cmd := exec.Command(os.Args[0], append([]string{"launch", "--nproc", "2", "--"}, faultArgs(t, 100000)...)...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the launcher leads a group, as a terminal's foreground job does
	out := &proc{cmd: cmd}
	cmd.Stdout, cmd.Stderr = &out.out, &out.out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.output(), "step 2/") {
		require.True(t, time.Now().Before(deadline), "no training: %s", out.output())
		time.Sleep(20 * time.Millisecond)
	}
	if group {
		require.NoError(t, syscall.Kill(-cmd.Process.Pid, sig))
	} else {
		require.NoError(t, cmd.Process.Signal(sig))
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out.output())
	assert.Equal(t, code, exit.ExitCode(), "%s", out.output())
	assert.Contains(t, out.output(), "launch: stopped by "+signalName(sig)+": every rank stopped")
	assert.NotContains(t, out.output(), "failed")
	assert.NotContains(t, out.output(), "exiting now")
}

// --log-dir's logs are appended to, each run under a line of its own: a
// requeued job keeps its earlier attempts' logs.
func TestLogDirKeepsEarlierRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	logs := filepath.Join(t.TempDir(), "logs")
	for range 2 {
		cmd := exec.Command(os.Args[0], append([]string{"launch", "--nproc", "2", "--"}, faultArgs(t, 1, "--log-dir", logs)...)...)
		cmd.Env = append(os.Environ(), asMainEnv+"=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	raw, err := os.ReadFile(filepath.Join(logs, "rank-1.log"))
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(raw), "=== rank 1 of 2, pid "), "%s", raw)
}

// Only rank 0 says that it builds the model: a job of N processes prints
// the line once, not N times. The model takes 1.5 s to record, past the
// loader's one second before it says so.
func TestJobSaysItBuildsTheModelOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model := filepath.Join(t.TempDir(), "slow", "model.go")
	require.NoError(t, os.MkdirAll(filepath.Dir(model), 0o755))
	require.NoError(t, os.WriteFile(model, []byte(`package slow

import (
	"time"

	"gcompile/examples/gpt"
	"gcompile/frontend"
)

func Model(b *frontend.Builder) {
	time.Sleep(1500 * time.Millisecond)
	gpt.Model(b)
}
`), 0o644))
	cmd := exec.Command(os.Args[0], "launch", "--nproc", "3", "--", model, "--set", "layers=1,hidden=32,heads=2,seq=16",
		"--max-data-mb", "1", "--devices", "3", "--batch", "3")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, 1, strings.Count(string(out), "building model "), "%s", out)
}

// Two processes given one rank (ranks 0, 1, 1 of a job of 4, ranks 2 and
// 3 never started): the job fails within seconds on every process,
// naming the rank and both addresses. The second claim was accepted
// before, and the job waited for the missing ranks until --timeout.
func TestJobRefusesTwoProcessesWithOneRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	ps := startRanks(t, 4, []int{0, 1, 1}, []string{model, "--devices", "4", "--run", "--steps", "3", "--max-data-mb", "1"}, nil)
	start := time.Now()
	waitAll(t, ps, 30*time.Second)
	assert.Less(t, time.Since(start), 15*time.Second, "the job fails at once, not after --timeout")
	for i, p := range ps {
		require.Error(t, p.err, "process %d", i)
		assert.Regexp(t, `rank 1 is already in the job, from 127\.0\.0\.1:\d+; this process at 127\.0\.0\.1:\d+ claims it too`, p.output(), "process %d", i)
	}
}

// The same with every rank present (ranks 0, 1, 1 of a job of 2): the
// job that started with one of the two stops on every process too, where
// it went on training and only the latecomer failed.
func TestCompleteJobStopsOnADuplicateRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	ps := startRanks(t, 2, []int{0, 1, 1}, []string{model, "--devices", "2", "--run", "--steps", "100000", "--max-data-mb", "1"}, nil)
	waitAll(t, ps, 60*time.Second)
	for i, p := range ps {
		require.Error(t, p.err, "process %d", i)
		assert.Regexp(t, `rank 1 is already in the job, from 127\.0\.0\.1:\d+; this process at 127\.0\.0\.1:\d+ claims it too`, p.output(), "process %d", i)
	}
}

// A job some of whose processes never start fails after its rendezvous
// deadline (--rdzv-timeout, here 3 s; --timeout stays 10 minutes), not
// after two --timeouts (the exit barrier no longer waits again), and rank
// 0 names the ranks that never joined; the processes that came hear why
// from it.
func TestJobNamesTheRanksThatNeverJoined(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	model, err := jobModel()
	require.NoError(t, err)
	ps := startRanks(t, 4, []int{0, 1}, []string{model, "--devices", "4", "--run", "--steps", "3", "--max-data-mb", "1", "--rdzv-timeout", "3s"}, nil)
	start := time.Now()
	waitAll(t, ps, 30*time.Second)
	assert.Less(t, time.Since(start), 9*time.Second, "the rendezvous deadline (3 s), not --timeout")
	for r, p := range ps {
		require.Error(t, p.err, "rank %d", r)
		assert.Contains(t, p.output(), "ranks 2, 3 never joined (not started, or they cannot reach 127.0.0.1:", "rank %d", r)
	}
	// While it waited, rank 0 said whom for (after a third of the wait).
	assert.Contains(t, ps[0].output(), "rendezvous: waiting for ranks 2, 3 of 4 to join at 127.0.0.1:")
}

// smallFilesJob runs a job of two processes to its end, rank 0 under a
// file size limit of 8 KiB (ulimit -f: its writes past it fail with EFBIG,
// as on a full disk), each given faultArgs(2) plus extra.
func smallFilesJob(t *testing.T, extra ...string) []*proc {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	port, err := freePort()
	require.NoError(t, err)
	token := jobToken(t)
	ps := make([]*proc, 2)
	for r := range 2 {
		bin, args := self, faultArgs(t, 2, extra...)
		if r == 0 {
			bin, args = "/bin/sh", append([]string{"-c", `ulimit -f 16 && exec "$0" "$@"`, self}, args...)
		}
		ps[r] = startProc(t, bin, args, append(childEnv(r, 2, port, token), asMainEnv+"=1"))
	}
	waitAll(t, ps, 60*time.Second)
	for r, p := range ps {
		t.Logf("rank %d (%v):\n%s", r, p.err, p.output())
	}
	return ps
}

// Rank 0's part of a checkpoint fails to write: every process names
// rank 0's error, with the file (once), not "another process failed".
func TestJobNamesTheProcessThatFailedItsCheckpointPart(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	ps := smallFilesJob(t, "--checkpoint-dir", ck, "--checkpoint-every", "1")
	want := regexp.MustCompile(`(?m)^gcompile: rank [01]: (stopped by another process's failure: rank 0: )?checkpoint ` + regexp.QuoteMeta(ck) + `/step-0+1: device 0: write .*rank-00000\.safetensors.*: file too large$`)
	for r, p := range ps {
		require.Error(t, p.err, "rank %d", r)
		assert.Regexp(t, want, p.output(), "rank %d", r)
		assert.NotContains(t, p.output(), "another process failed", "rank %d", r)
		assert.NotContains(t, p.output(), ".tmp: write ", "rank %d: the file named once", r)
	}
}

// Rank 0 fails to write --save after training: rank 1, whose share of
// the save was done, names that failure, not "context canceled".
func TestJobNamesAFailureAfterTraining(t *testing.T) {
	w := filepath.Join(t.TempDir(), "w.safetensors")
	ps := smallFilesJob(t, "--save", w)
	for r, p := range ps {
		require.Error(t, p.err, "rank %d:\n%s", r, p.output())
		assert.Contains(t, p.output(), "rank 0: --save: ", "rank %d", r)
		assert.Contains(t, p.output(), "file too large", "rank %d", r)
		assert.NotContains(t, p.output(), "context canceled", "rank %d", r)
	}
	assert.Contains(t, ps[1].output(), "gcompile: rank 1: stopped by another process's failure: rank 0: --save: ")
}

// A process that only echoes another's failure of its checkpoint share
// waits for that process's report, but not past the moment it stops
// answering: rank 0 killed before it reported (and with it the store's
// other watchers) held the echo until --timeout, ten minutes by default.
func TestEchoStopsWaitingForAProcessThatStoppedAnswering(t *testing.T) {
	t.Parallel()
	srv, err := dist.Serve("127.0.0.1:0", dist.ServerOptions{Token: "t", Ranks: 2})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peer, err := dist.Dial(ctx, srv.Addr(), "t", 0)
	require.NoError(t, err)
	defer peer.Close()
	store, err := dist.Dial(ctx, srv.Addr(), "t", 1)
	require.NoError(t, err)
	defer store.Close()

	jctx, jcancel := context.WithCancelCause(context.Background())
	j := &job{world: dist.World{Rank: 1, Size: 2}, layout: runtime.Layout{Devices: 2, Procs: 2, Proc: 1},
		timeout: 10 * time.Minute, store: store, ctx: jctx, cancel: jcancel, failed: make(chan struct{})}
	defer jcancel(nil)
	go j.beat()
	// Process 0 beats a while, then is gone without a report.
	for range 3 {
		_, err := peer.Add(ctx, keyBeat+"0", 1)
		require.NoError(t, err)
		time.Sleep(beatEvery)
	}
	start := time.Now()
	j.fail(fmt.Errorf("checkpoint step-1: %w", checkpoint.ErrPeerFailed))
	assert.Less(t, time.Since(start), time.Minute)
	cause := context.Cause(jctx)
	require.Error(t, cause)
	assert.ErrorIs(t, cause, checkpoint.ErrPeerFailed)
	assert.Regexp(t, `^process 0 \(rank 0\) stopped answering \(no heartbeat for 2\.5s\): checkpoint step-1: another process failed its share$`, cause.Error())
	abort, err := peer.Get(ctx, keyAbort)
	require.NoError(t, err)
	assert.Equal(t, "rank 1: "+cause.Error(), string(abort))
}

// A rank a signal kills outright is told by its signal. SIGKILL (kill -9,
// the out-of-memory killer) before training is the cause the launcher
// names, and the job exits 1, failed: the SIGTERM the launcher then sends
// the other ranks is not the cause, and its status, 143, would have a
// requeue loop run a crashing job forever. SIGTERM (it came before the
// rank set up its handler) is a stop, as a rank exiting 143 is: the
// others are passed it, and the job exits 143.
func TestLaunchStatusOfARankKilledByASignal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("needs sh")
	}
	for _, tc := range []struct {
		signal string
		status int
		want   []string
	}{
		{"KILL", 1, []string{"launch: rank 1 failed first (signal: killed)", "launch: the cause: rank 1 was killed by SIGKILL and printed no error"}},
		{"TERM", 143, []string{"stopped by SIGTERM"}},
	} {
		t.Run(tc.signal, func(t *testing.T) {
			script := `if [ "$RANK" = 1 ]; then sleep 0.2; kill -` + tc.signal + ` $$; fi
trap 'echo "gcompile: rank 0 was interrupted by SIGTERM before training" >&2; exit 143' TERM
while :; do sleep 0.1; done`
			err := supervise(sh, []string{"-c", script}, 2, 0, "t", 5*time.Second)
			require.Error(t, err)
			assert.Equal(t, tc.status, exitCode(err), "%v", err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// Process 0 names where its store listens, by the master's name and the
// port it took (the next free one when the master port was taken), not
// the master port, which is another program's.
func TestRendezvousAddrIsTheStoresPort(t *testing.T) {
	srv, err := dist.Serve("127.0.0.1:0", dist.ServerOptions{Token: "t", Ranks: 2})
	require.NoError(t, err)
	defer srv.Close()
	_, port, err := net.SplitHostPort(srv.Addr())
	require.NoError(t, err)
	w := dist.World{Rank: 0, Size: 2, MasterAddr: "localhost", MasterPort: 1}
	assert.Equal(t, "localhost:"+port, (&job{world: w, server: srv}).rendezvousAddr())
	w.Rank = 1
	assert.Equal(t, "localhost:1", (&job{world: w}).rendezvousAddr())
}

// Placed by flags (--rank, --world-size, as a script started by hand
// or by srun gives them), a process whose command line does not parse
// (a flag its build lacks) still tells the job: rank 0 stops within
// seconds, naming it, where it waited out --rdzv-timeout.
func TestAFlagOneProcessLacksStopsTheJob(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	port, err := freePort()
	require.NoError(t, err)
	env := append(environWithout(placeVars), asMainEnv+"=1")
	args := faultArgs(t, 2, "--world-size", "2", "--master-addr", "127.0.0.1", "--master-port", strconv.Itoa(port), "--token", jobToken(t))
	ps := []*proc{
		startProc(t, self, append(slices.Clone(args), "--rank", "0"), env),
		startProc(t, self, append(slices.Clone(args), "--rank", "1", "--no-such-flag"), env),
	}
	start := time.Now()
	waitAll(t, ps, 60*time.Second)
	assert.Less(t, time.Since(start), 15*time.Second, "the job fails within seconds, not after --rdzv-timeout")
	for r, p := range ps {
		require.Error(t, p.err, "rank %d", r)
		assert.Contains(t, p.output(), "rank 1: flag provided but not defined: -no-such-flag", "rank %d:\n%s", r, p.output())
	}
	assert.Contains(t, ps[0].output(), "the job cannot start: rank 1: flag provided but not defined")
}

// A process that loses the store with no report in it (process 0, which
// hosts it, killed outright) names process 0, not the store's socket.
func TestALostStoreNamesProcessZero(t *testing.T) {
	own := fmt.Errorf("rank 1: waiting for the other processes to finish: barrier \"job/exit\" for 2 clients: store at 127.0.0.1:1 %w", dist.ErrDisconnected)
	for rank, want := range map[int]string{
		1: `^rank 1: lost process 0 \(rank 0\), which hosts the job's rendezvous: it stopped without a report \(killed outright, or its machine is down\): rank 1: waiting for the other processes to finish`,
		0: `^rank 1: waiting for the other processes to finish`,
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		j := &job{world: dist.World{Rank: rank, Size: 2}, ctx: ctx, cancel: cancel}
		err := j.stoppedBy(own)
		cancel(nil)
		assert.Regexp(t, want, err.Error(), "rank %d", rank)
		assert.ErrorIs(t, err, dist.ErrDisconnected)
	}
}
