// Command flakehunt runs the test suite again and again under load and
// reports every failure, so that a test that passes only on a quiet
// machine is found before CI finds it:
//
//	go run ./tools/flakehunt -rounds 5 -parallel 2 -burn 2 -out bench/results/flakehunt.txt
//
// Each of -parallel clean clones of the repository's HEAD (git clone, so
// nothing uncommitted or ignored comes along, as on CI) runs `make
// TARGET` at once, round after round, while -burn goroutines spin on the
// CPU; every run's exit status, wall time and failed tests are printed
// and, with -out, appended to a file with the commit, the machine and the
// date. The exit status is 1 when any run failed. The clones share the
// Go build and module caches, as two engineers' checkouts on one machine
// would.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type options struct {
	rounds, parallel, burn int
	target, out, repo      string
	keep                   bool
	timeout                time.Duration
}

// result is one run of the target in one clone.
type result struct {
	round, clone int
	err          error
	wall         time.Duration
	failed       []string // "package Test" or "package (build)" lines
	log          string
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "rounds of runs")
	flag.IntVar(&o.parallel, "parallel", 2, "runs at once in each round, each in its own clone")
	flag.IntVar(&o.burn, "burn", 0, "goroutines spinning on the CPU during the rounds (extra load)")
	flag.StringVar(&o.target, "target", "test", "make target each run runs")
	flag.StringVar(&o.out, "out", "", "append the summary to this file")
	flag.StringVar(&o.repo, "repo", ".", "repository whose HEAD is cloned")
	flag.BoolVar(&o.keep, "keep", false, "keep the clones and logs (printed) instead of removing them")
	flag.DurationVar(&o.timeout, "timeout", 90*time.Minute, "longest one run may take (CI's limit); the run's whole process group is killed then")
	flag.Parse()
	if o.rounds < 1 || o.parallel < 1 || o.burn < 0 {
		fmt.Fprintln(os.Stderr, "flakehunt: -rounds and -parallel must be ≥ 1 and -burn ≥ 0")
		os.Exit(2)
	}
	failed, err := hunt(o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flakehunt:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

func hunt(o options, w io.Writer) (anyFailed bool, err error) {
	head, err := git(o.repo, "rev-parse", "--short", "HEAD")
	if err != nil {
		return false, err
	}
	dir, err := os.MkdirTemp("", "flakehunt-")
	if err != nil {
		return false, err
	}
	if o.keep {
		fmt.Fprintln(w, "clones and logs in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	clones := make([]string, o.parallel)
	for i := range clones {
		clones[i] = filepath.Join(dir, fmt.Sprintf("clone-%d", i+1))
		if _, err := git(o.repo, "clone", "--quiet", "--no-local", ".", clones[i]); err != nil {
			return false, err
		}
	}
	stop := burn(o.burn)
	defer stop()

	var summary strings.Builder
	fmt.Fprintf(&summary, "flakehunt %s: commit %s, %d rounds × %d parallel `make %s`, %d burning goroutines, %d CPUs, %s\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), head, o.rounds, o.parallel, o.target, o.burn, runtime.NumCPU(), goVersion())
	fmt.Fprint(w, summary.String())
	passes, runs := 0, 0
	for round := 1; round <= o.rounds; round++ {
		results := make([]result, o.parallel)
		var wg sync.WaitGroup
		for i := range clones {
			wg.Go(func() {
				results[i] = run(o, round, i, clones[i], dir)
			})
		}
		wg.Wait()
		for _, r := range results {
			runs++
			line := fmt.Sprintf("round %d clone %d: ", r.round, r.clone+1)
			if r.err == nil {
				passes++
				line += fmt.Sprintf("pass in %s", r.wall.Round(time.Second))
			} else {
				anyFailed = true
				line += fmt.Sprintf("FAIL in %s (%v): %s", r.wall.Round(time.Second), r.err, strings.Join(r.failed, "; "))
				if o.keep {
					line += " — log " + r.log
				}
			}
			fmt.Fprintln(w, line)
			fmt.Fprintln(&summary, line)
		}
	}
	total := fmt.Sprintf("%d passed, %d failed\n", passes, runs-passes)
	fmt.Fprint(w, total)
	fmt.Fprint(&summary, total)
	if o.out != "" {
		f, err := os.OpenFile(o.out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return anyFailed, err
		}
		defer f.Close()
		if _, err := fmt.Fprintln(f, summary.String()); err != nil {
			return anyFailed, err
		}
	}
	return anyFailed, nil
}

func run(o options, round, clone int, repo, dir string) result {
	r := result{round: round, clone: clone, log: filepath.Join(dir, fmt.Sprintf("round-%d-clone-%d.log", round, clone+1))}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	f, err := os.Create(r.log)
	if err != nil {
		r.err = err
		return r
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "make", o.target)
	cmd.Dir = repo
	cmd.Stdout, cmd.Stderr = f, f
	// make, go test and the test binaries in a group of their own, so that
	// a run past -timeout leaves nothing running into the next round.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	r.err = cmd.Run()
	r.wall = time.Since(start)
	if r.err != nil {
		r.failed = failures(r.log)
	}
	return r
}

var (
	failTest   = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
	unfinished = regexp.MustCompile(`^--- did not finish: (\S+)`)
	timedOut   = regexp.MustCompile(`^panic: (test timed out after \S+)`)
	failPkg    = regexp.MustCompile(`^FAIL\s+(\S+)`)
)

// failures lists the failed tests and packages testreport printed.
func failures(log string) []string {
	f, err := os.Open(log)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if m := failTest.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, m[1])
		} else if m := unfinished.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, m[1]+" (did not finish)")
		} else if m := timedOut.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, m[1])
		} else if m := failPkg.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, "package "+m[1])
		}
	}
	if len(out) == 0 {
		out = append(out, "no failed test named (see the log)")
	}
	return out
}

// burn spins n goroutines until the returned stop is called.
func burn(n int) (stop func()) {
	var done atomic.Bool
	var sink atomic.Uint64
	for range n {
		go func() {
			x := uint64(1)
			for !done.Load() {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			sink.Add(x)
		}()
	}
	return func() { done.Store(true) }
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func goVersion() string {
	out, err := exec.Command("go", "version").Output()
	if err != nil {
		return runtime.Version()
	}
	return strings.TrimSpace(string(out))
}
