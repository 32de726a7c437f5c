package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests start gcompile jobs the way users do, through the real
// launchers (torchrun, Open MPI's mpirun) or, for SLURM, which cannot run
// here, with the environment srun gives each task; each run must train bit
// for bit like the same plan in one process. The launchers exec the test
// binary itself, which runs gcompile's main when asMainEnv is set (see
// TestMain): launchers pass their environment on to the processes they
// start.

// requireLaunchersEnv names the variable that, set to 1, turns a missing
// launcher from a skip into a failure: CI installs the launchers and sets
// it, so these tests cannot pass there by not running.
const requireLaunchersEnv = "GCOMPILE_REQUIRE_LAUNCHERS"

// launcherTimeout bounds one launcher run; a run takes a few seconds, so
// reaching it means a process hangs. gcompile's own --timeout (below) is
// shorter, so a stuck rendezvous fails with its own message first.
const launcherTimeout = 2 * time.Minute

// missingLauncher skips the test, or fails it when requireLaunchersEnv=1.
func missingLauncher(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(requireLaunchersEnv) == "1" {
		t.Fatalf("%s, and %s=1", msg, requireLaunchersEnv)
	}
	t.Skipf("%s; set %s=1 to make this a failure", msg, requireLaunchersEnv)
}

// torchPython is an interpreter that can import torchrun's module. Debian's
// python3-torch is installed for /usr/bin/python3, while the python3 first
// on PATH may be another one (pyenv, a virtualenv) without torch, so
// /usr/bin/python3 is tried first.
var torchPython = sync.OnceValues(func() (string, error) {
	var tried []string
	for _, name := range []string{"/usr/bin/python3", "python3", "python"} {
		path, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		out, err := exec.Command(path, "-c", "import torch.distributed.run").CombinedOutput()
		if err == nil {
			return path, nil
		}
		tried = append(tried, fmt.Sprintf("%s: %s", path, lastLine(string(out))))
	}
	if len(tried) == 0 {
		return "", errors.New("no python3 on PATH or at /usr/bin/python3")
	}
	return "", fmt.Errorf("no python can import torch.distributed.run (%s)", strings.Join(tried, "; "))
})

// launcherEnv is this process's environment for a launcher to start
// gcompile processes in: without the variables of any launcher this test
// may itself run under (they would describe another job, and the
// launcher's own would be mixed with them), with asMainEnv set, and with
// extra on top.
func launcherEnv(extra ...string) []string {
	drop := map[string]bool{
		"RANK": true, "WORLD_SIZE": true, "LOCAL_RANK": true, "LOCAL_WORLD_SIZE": true, "GROUP_RANK": true,
		"MASTER_ADDR": true, "MASTER_PORT": true, "GCOMPILE_TOKEN": true,
	}
	// PET_ variables are torchrun's defaults for its own flags.
	prefixes := []string{"TORCHELASTIC_", "PET_", "OMPI_COMM_WORLD_", "OMPI_MCA_ess_base_", "PMIX_", "SLURM_"}
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if drop[name] || name == asMainEnv || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, asMainEnv+"=1"), extra...)
}

// runLauncher runs argv (the launcher called name and its arguments) with
// env to the end and returns everything it printed. The launcher gets a
// process group of its own, so that a run that overstays launcherTimeout
// is stopped with every process it started.
func runLauncher(t *testing.T, name string, argv, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), launcherTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// SIGTERM first: mpirun and torchrun pass it on to their processes,
	// some of which (Open MPI's) are in process groups of their own.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err := cmd.Run()
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything left behind; ESRCH when nothing is
	require.NoError(t, err, "%s\n%s", strings.Join(argv, " "), out.String())
	t.Logf("%s ran the job in %v", name, time.Since(start).Round(time.Millisecond))
	return out.String()
}

// The plans the launchers run: data parallelism (an all-reduce between
// the processes) and pipeline parallelism (sends between them).
var (
	launcherDP2 = []string{"--devices", "2", "--dp", "2"}
	launcherPP2 = []string{"--devices", "2", "--pp", "2", "--microbatches", "2"}
)

// launcherJobTimeout makes a rendezvous that cannot complete fail within
// the test with gcompile's own message, rather than at the default 10
// minutes.
var launcherJobTimeout = []string{"--timeout", "60s"}

// torchrun starts two gcompile processes in both of its rendezvous modes.
// With the static rendezvous (--master_addr/--master_port) torchrun's
// agent hosts torch's TCPStore at MASTER_PORT and says so with
// TORCHELASTIC_USE_AGENT_STORE=True: gcompile's store must take a port
// above it. With a c10d rendezvous (what --standalone sets up) torch 1.13
// leaves MASTER_PORT free for gcompile. The test asks for that rendezvous
// on port 0, a free one, rather than with --standalone, which in torch
// 1.13 always takes 29400: of two jobs on one machine at once (two suites,
// or this test beside the README's) the second fails to bind it, joins the
// first's rendezvous as a client, and fails when the first job ends and
// closes it ("RendezvousConnectionError: ... Broken pipe", after its own
// training finished).
//
// Debian's python3-torch 1.13 on Python 3.11 crashes at start with its
// default --redirects 0 and --tee 0 ("'NoneType' object has no attribute
// 'get'"): Std.from_str looks the value up by iterating the Std flag enum,
// and Python 3.11 leaves the zero flag (and ALL=3) out of that iteration,
// so "0" becomes None. Only 1 and 2 survive, as a value or in a mapping,
// so the runs pass "9:1", a mapping for local rank 9, which does not exist
// with fewer than 10 processes per node: every stream stays as without the
// flags (no redirection to files, no prefixes), on any torch version.
// --log_dir keeps torchrun's per-run folder out of /tmp.
func TestTorchrunMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	python, err := torchPython()
	if err != nil {
		missingLauncher(t, "torchrun not found: %v", err)
	}
	cases := []struct {
		name       string
		plan       []string
		rendezvous func(t *testing.T) []string
		agentStore string // TORCHELASTIC_USE_AGENT_STORE as torchrun must set it; "": as it likes
	}{
		{"static rendezvous dp2", launcherDP2, func(t *testing.T) []string {
			port, err := freePort()
			require.NoError(t, err)
			return []string{"--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port)}
		}, "True"},
		// torch 1.13 sets False here; later versions may share the c10d
		// store with the processes, which is the case above again.
		{"c10d rendezvous pp2", launcherPP2, func(*testing.T) []string {
			return []string{"--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--nnodes", "1"}
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			self, err := os.Executable()
			require.NoError(t, err)
			dir := t.TempDir()
			argv := []string{python, "-m", "torch.distributed.run", "--nproc_per_node", "2"}
			argv = append(argv, tc.rendezvous(t)...)
			argv = append(argv,
				// The agent checks on its processes every 5 s by default,
				// which would be most of each run.
				"--monitor_interval", "0.1",
				"--redirects", "9:1", "--tee", "9:1", "--log_dir", filepath.Join(dir, "torchrun"),
				// sh reports the mode torchrun chose before it becomes
				// gcompile, so the test knows which path it proved.
				"--no_python", "sh", "-c", `echo "torchrun: TORCHELASTIC_USE_AGENT_STORE=$TORCHELASTIC_USE_AGENT_STORE MASTER_PORT=$MASTER_PORT" >&2; exec "$0" "$@"`,
				self)
			argv = append(append(argv, jobArgs(t, dir, tc.plan...)...), launcherJobTimeout...)
			out := runLauncher(t, "torchrun", argv, launcherEnv())
			if tc.agentStore != "" {
				assert.Equal(t, 2, strings.Count(out, "TORCHELASTIC_USE_AGENT_STORE="+tc.agentStore+" "), "torchrun's rendezvous mode:\n%s", out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "torchrun: ") {
					t.Log(line)
				}
			}
			assertMatchesOneProcess(t, tc.plan, 2, dir)
		})
	}
}

// mpirun starts two gcompile processes. Open MPI names no rendezvous
// host: on one node gcompile meets on loopback at a port derived from
// Open MPI's job id (the dp2 case, which gives no MASTER_ADDR or
// MASTER_PORT), and MASTER_ADDR/MASTER_PORT passed with -x (the way to
// name rank 0's host for a job across nodes) take precedence (pp2).
func TestMPIMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		missingLauncher(t, "mpirun not found: %v", err)
	}
	if out, err := exec.Command(mpirun, "--version").CombinedOutput(); err != nil || !strings.Contains(string(out), "Open MPI") {
		missingLauncher(t, "%s is not Open MPI's mpirun (%v): %s", mpirun, err, lastLine(string(out)))
	}
	cases := []struct {
		name   string
		plan   []string
		master func(t *testing.T) []string
	}{
		{"derived port dp2", launcherDP2, func(*testing.T) []string { return nil }},
		{"MASTER_ADDR and MASTER_PORT pp2", launcherPP2, func(t *testing.T) []string {
			port, err := freePort()
			require.NoError(t, err)
			return []string{"-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + strconv.Itoa(port)}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			self, err := os.Executable()
			require.NoError(t, err)
			dir := t.TempDir()
			// --allow-run-as-root: CI runs as root, which mpirun refuses
			// otherwise; --oversubscribe: the machine may have fewer cores
			// than processes.
			argv := []string{mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", asMainEnv}
			argv = append(argv, tc.master(t)...)
			argv = append(append(append(argv, self), jobArgs(t, dir, tc.plan...)...), launcherJobTimeout...)
			runLauncher(t, "mpirun", argv, launcherEnv())
			assertMatchesOneProcess(t, tc.plan, 2, dir)
		})
	}
}

// slurmJobID is a SLURM job id whose derived rendezvous port (10000 + id
// mod 20000, as dist.FromEnv derives it) is free here, so the test takes
// the default path srun users take, with no MASTER_PORT.
func slurmJobID(t *testing.T) string {
	t.Helper()
	for range 100 {
		port := 10000 + rand.IntN(20000)
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		ln.Close()
		return strconv.Itoa(20000*(50+rand.IntN(1000)) + port - 10000)
	}
	t.Fatal("no free port in 10000..29999 for a SLURM job id")
	return ""
}

// SLURM cannot run here, so the test starts the tasks itself with the
// variables srun sets for a one-node step (and none of torchrun's): the
// rendezvous host is the first of the step's nodes, the port derives from
// the job id, the tasks per node come from SLURM_NTASKS_PER_NODE or from
// the compressed SLURM_STEP_TASKS_PER_NODE ("2(x1)"). With the machine's
// host name as the node list gcompile resolves it, as on a real cluster.
func TestSlurmMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	host, err := os.Hostname()
	require.NoError(t, err)
	cases := []struct {
		name string
		plan []string
		node func(t *testing.T) []string // the variables naming the node and its tasks
	}{
		{"localhost dp2", launcherDP2, func(*testing.T) []string {
			return []string{"SLURM_JOB_NODELIST=localhost", "SLURM_STEP_NODELIST=localhost", "SLURM_NTASKS_PER_NODE=2", "SLURM_TASKS_PER_NODE=2"}
		}},
		{"host name pp2", launcherPP2, func(t *testing.T) []string {
			if _, err := net.LookupHost(host); err != nil {
				t.Skipf("this machine's name %q does not resolve here: %v", host, err)
			}
			return []string{"SLURM_JOB_NODELIST=" + host, "SLURM_STEP_NODELIST=" + host, "SLURM_TASKS_PER_NODE=2(x1)", "SLURM_STEP_TASKS_PER_NODE=2(x1)"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			self, err := os.Executable()
			require.NoError(t, err)
			dir := t.TempDir()
			args := append(jobArgs(t, dir, tc.plan...), launcherJobTimeout...)
			common := append([]string{"SLURM_JOB_ID=" + slurmJobID(t), "SLURM_STEP_ID=0", "SLURM_NTASKS=2", "SLURM_NPROCS=2",
				"SLURM_NNODES=1", "SLURM_NODEID=0"}, tc.node(t)...)
			ctx, cancel := context.WithTimeout(context.Background(), launcherTimeout)
			defer cancel()
			cmds := make([]*exec.Cmd, 2)
			outs := make([]bytes.Buffer, 2)
			start := time.Now()
			for r := range cmds {
				cmd := exec.CommandContext(ctx, self, args...)
				cmd.Env = launcherEnv(append([]string{"SLURM_PROCID=" + strconv.Itoa(r), "SLURM_LOCALID=" + strconv.Itoa(r)}, common...)...)
				cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
				require.NoError(t, startTied(cmd))
				cmds[r] = cmd
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			}
			for r, cmd := range cmds {
				require.NoError(t, cmd.Wait(), "task %d:\n%s", r, outs[r].String())
			}
			t.Logf("the tasks ran the job in %v", time.Since(start).Round(time.Millisecond))
			assertMatchesOneProcess(t, tc.plan, 2, dir)
		})
	}
}
