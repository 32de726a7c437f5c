package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gcompile/runtime"
)

// launchMain is `gcompile launch`: it starts --nproc processes of this
// program on this machine with the environment torchrun would give them
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) and a fresh secret token, and watches them: when one fails,
// the others are stopped; a signal to the launcher reaches them all; none
// outlives it. Runs on several machines go through torchrun, srun or
// mpirun instead, which start the same program.
// isRunFlag says whether name is a flag of gcompile MODEL (the processes'
// command line), for a launch flag error that names the fix.
func isRunFlag(name string) bool {
	_, err := parseArgs([]string{"model.go", "-" + name})
	return err == nil || !strings.Contains(err.Error(), "flag provided but not defined")
}

func launchMain(args []string) error {
	fs := flag.NewFlagSet("gcompile launch", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	nproc := fs.Int("nproc", 0, "number of processes to start on this machine")
	port := fs.Int("master-port", 0, "rendezvous port (0: a free one)")
	grace := fs.Duration("grace", 10*time.Second, fmt.Sprintf("after one process fails and the others have had %v to stop by themselves (they hear of it through the job) and then SIGTERM, how long they get to exit before they are killed", ownStopWait))
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: gcompile launch --nproc N [flags] -- MODEL.go|MODEL.gir [gcompile flags]\n\n")
		fs.PrintDefaults()
	}
	// The usage is printed for -h only; a mistake gets one line saying
	// what to change.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stderr)
			fs.Usage()
			return err
		}
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok && isRunFlag(name) {
			return fmt.Errorf("launch: -%s is a flag of the processes, not of launch: put it after -- (gcompile launch --nproc N -- MODEL.go -%s …)", name, name)
		}
		return fmt.Errorf("launch: %w (see gcompile launch -h)", err)
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	switch {
	case *nproc < 1:
		return fmt.Errorf("launch: --nproc must be ≥ 1, got %d", *nproc)
	case *nproc > maxLaunchProcs():
		return fmt.Errorf("launch: --nproc %d is more processes than this machine runs (%d at most: %d a CPU core, every process a whole gcompile); a larger job runs on several machines, started by torchrun, srun or mpirun (README, \"Running on several processes and machines\")", *nproc, maxLaunchProcs(), launchProcsPerCore)
	case *port < 0 || *port > 65535:
		return fmt.Errorf("launch: --master-port %d is not a port", *port)
	case *grace <= 0:
		return fmt.Errorf("launch: --grace must be positive")
	case len(rest) == 0:
		fs.Usage()
		return errors.New("launch: no model given (gcompile launch --nproc N -- MODEL.go [flags])")
	case rest[0] == "launch":
		return errors.New("launch: the processes it starts cannot be launchers themselves")
	case slices.Contains([]string{"eval", "generate", "export", "inspect", "data"}, rest[0]):
		return fmt.Errorf("launch: it starts the processes of a training job (gcompile launch --nproc N -- MODEL.go [flags]); run gcompile %s without it (eval and generate take --devices and a plan)", rest[0])
	}
	for _, a := range rest {
		for _, f := range []string{"rank", "world-size", "local-rank", "local-world-size", "master-addr", "master-port"} {
			if a == "-"+f || a == "--"+f || strings.HasPrefix(a, "-"+f+"=") || strings.HasPrefix(a, "--"+f+"=") {
				return fmt.Errorf("launch: --%s is set by the launcher for each process; leave it out", f)
			}
		}
	}
	c, err := checkJob(rest, *nproc)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return err // the usage was asked for, and printed once
	case err != nil:
		return fmt.Errorf("launch: no process started: %w", err)
	case c.helpModel:
		return helpModel(c)
	}
	if *port == 0 {
		p, err := freePort()
		if err != nil {
			return fmt.Errorf("launch: finding a free port: %w", err)
		}
		*port = p
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launch: finding this program: %w", err)
	}
	token := os.Getenv("GCOMPILE_TOKEN")
	if token == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("launch: making the job token: %w", err)
		}
		token = hex.EncodeToString(b)
	}
	return supervise(self, rest, *nproc, *port, token, *grace)
}

// launchProcsPerCore bounds how many processes launch starts on one
// machine (all of them run here), with room for jobs that oversubscribe a
// small machine in tests: a mistyped --nproc 100000 started ranks of
// 90 MB each until the machine stopped answering, its SIGTERM not heard
// until every rank had started.
const launchProcsPerCore = 8

// maxLaunchProcs is the most processes launch starts: launchProcsPerCore a
// core, at least 16.
func maxLaunchProcs() int { return max(16, launchProcsPerCore*goruntime.NumCPU()) }

// checkJob checks, once and before any process starts, what every
// process would otherwise find wrong on its own and print, each under
// its rank: the command line (flags and their combinations), the model
// file, the split of --devices over the processes, and the inputs and
// outputs checkPaths and checkCheckpointPaths check (the processes run on
// this machine and see its files). What needs the compiled plan or the
// other processes is still found by the processes.
func checkJob(args []string, nproc int) (*config, error) {
	c, err := parseArgs(args)
	if err != nil || c.helpModel {
		return c, err
	}
	if err := checkModelFile(c.Model); err != nil {
		return nil, err
	}
	layout := runtime.Layout{Devices: c.Devices, Procs: nproc}
	if err := layout.Check(); err != nil {
		return nil, fmt.Errorf("--devices %d over --nproc %d processes: %w", c.Devices, nproc, err)
	}
	if c.packGPU && nproc > 1 {
		return nil, fmt.Errorf("--pack-gpu runs one process's devices as virtual devices on one GPU; --nproc %d processes need one GPU per device (leave --pack-gpu out, or launch one process)", nproc)
	}
	if _, err := checkCheckpointPaths(c); err != nil {
		return nil, err
	}
	c.launchProcs = nproc
	if err := checkPaths(c, true); err != nil {
		return nil, err
	}
	c.corpus = nil // each process reads its own
	if c.tokens != nil {
		c.tokens.close()
		c.tokens = nil
	}
	return c, nil
}

// checkModelFile checks that the model names a file that can be read.
func checkModelFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("model file: %w", err)
	}
	if fi.IsDir() {
		return fmt.Errorf("model file %s is a folder; name its MODEL.go or a MODEL.gir", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("model file: %w", err)
	}
	return f.Close()
}

// freePort asks the system for a port no one listens on.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// childEnv is the environment of rank r: the launcher's, without the
// variables of other launchers that would disagree, plus torchrun's.
func childEnv(r, n, port int, token string) []string {
	return append(environWithout(placeVars),
		"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
		"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
		"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
		"GCOMPILE_TOKEN="+token)
}

// placeVars are the variables childEnv sets, and torchrun's that would
// place a child otherwise.
var placeVars = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
	"GCOMPILE_TOKEN", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID"}

// environWithout is this process's environment less the variables named.
func environWithout(names []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(names, name) {
			env = append(env, kv)
		}
	}
	return env
}

// ownStopWait is how long the launcher lets the other ranks stop by
// themselves after one fails, before it sends them SIGTERM: past the
// job's grace for a lost peer's own report (job.peerLostGrace).
const ownStopWait = peerLostGrace + 2*time.Second

// supervise runs the processes to the end: all succeed, or the first
// failure stops the rest and is the error, naming its rank.
func supervise(self string, args []string, n, port int, token string, grace time.Duration) error {
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, n)
	// The launcher's own output going away (a pipe to head, a killed
	// tee) stops the job as SIGTERM does, at a step boundary with a
	// checkpoint, and exits 141 as SIGPIPE would: a write to the closed
	// pipe fails with EPIPE (SIGPIPE is taken from the runtime, which
	// would otherwise end the launcher there, and every rank with it).
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	outputGone := make(chan struct{})
	var gone sync.Once
	tails := make([]*errorTail, n)
	same := &sameErrors{}
	for r := range tails {
		tails[r] = &errorTail{w: os.Stderr, same: same, broken: func() {
			gone.Do(func() {
				// For the rest of the process: what the launcher says on
				// its way out goes to the closed pipe too.
				signal.Ignore(syscall.SIGPIPE)
				close(outputGone)
			})
		}}
	}
	var mu sync.Mutex
	var procs []*os.Process
	start := func(r int) error {
		cmd := exec.Command(self, args...)
		cmd.Env = childEnv(r, n, port, token)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, tails[r]
		// In a process group of its own: a terminal's Ctrl-C (or timeout's
		// signal to the launcher's group) reaches the launcher alone,
		// which passes it on once. Reaching every rank too, beside the
		// one passed on, it read as a second signal and the ranks exited
		// at once, with no checkpoint.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// The child dies with the launcher, however the launcher ends.
		if err := startTied(cmd); err != nil {
			return fmt.Errorf("launch: starting rank %d: %w", r, err)
		}
		mu.Lock()
		procs = append(procs, cmd.Process)
		mu.Unlock()
		go func() {
			err := cmd.Wait() // which copies the rank's output to its last byte
			tails[r].flush()
			exits <- exit{r, err}
		}()
		return nil
	}
	signalAll := func(sig os.Signal) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range procs {
			p.Signal(sig)
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	started := 0
	var first error
	var signalled os.Signal
	// The rank that failed first and how, and whether the launcher has
	// sent the others SIGTERM since (they then report that signal).
	firstRank, termSent := -1, false
	killedOnSecond := false
	status := 0 // the exit status of a stopped job, when not its signal's
	var firstExit error
starting:
	for r := range n {
		select {
		case s := <-sigs:
			// Heard between starts, not after the last: the ranks
			// started stop as the signal asks, and no more start.
			signalled = s
			fmt.Fprintf(os.Stderr, "launch: %v while starting rank %d of %d: passed to the %d started, no more started\n", s, r, n, started)
			signalAll(s)
			break starting
		default:
		}
		if err := start(r); err != nil {
			first = err
			break
		}
		started++
	}
	if first != nil {
		signalAll(syscall.SIGTERM)
	}
	var term, kill <-chan time.Time
	for done := 0; done < started; {
		select {
		case e := <-exits:
			done++
			var ee *exec.ExitError
			if signalled != nil && errors.As(e.err, &ee) && stoppedBySignal(ee) {
				// Stopped as asked: the status the launcher exits with
				// below. A rank the signal reached before it set up its
				// handler was killed by it; one that heard of the stop
				// through the job before its own signal arrived exits
				// as stopped by another process's (143), which is a stop
				// too, not the job's failure.
				continue
			}
			if signalled == nil && first == nil && errors.As(e.err, &ee) {
				// A rank a signal stopped at a step boundary (sent to it
				// alone, by a scheduler or by hand): the others stop the
				// same way, and the job exits as a stopped run.
				// Killed by it outright too: a rank the signal reached
				// before its handler was set up.
				if sig, ok := stopSignal(ee); ok {
					signalled = sig
					// Every rank stops at the same step boundary; the
					// first to exit need not be the one signalled.
					fmt.Fprintf(os.Stderr, "launch: the job stopped on %s (rank %d exited first, at a step boundary, or at once before training): passed to every rank\n", signalName(sig), e.rank)
					signalAll(sig)
					continue
				}
			}
			if e.err != nil && first == nil {
				// The first to exit need not be the cause: a rank whose
				// peer failed exits too, with the cause its peer reported,
				// which every rank's own message above names.
				first = fmt.Errorf("launch: rank %d failed first (%v); stopping the others (the ranks' messages above name the cause)", e.rank, e.err)
				firstRank, firstExit = e.rank, e.err
				// The others hear of the failure through the job (a lost
				// peer, the store's abort) and stop with its cause within
				// a few seconds; a SIGTERM sent at once would be the
				// reason they gave instead.
				term = time.After(ownStopWait)
			}
		case <-pipe:
			// Drained: the write that raised it says which pipe closed.
		case <-outputGone:
			outputGone = nil // heard once
			if signalled == nil && first == nil {
				signalled, status = syscall.SIGTERM, signalStatus(syscall.SIGPIPE)
				signalAll(syscall.SIGTERM)
			}
		case <-term:
			termSent = true
			signalAll(syscall.SIGTERM)
			kill = time.After(grace)
		case s := <-sigs:
			// The first signal is passed on as it came: training ranks
			// stop at the next step boundary (with a checkpoint) and
			// exit 128 + its number, as ranks before training do; a
			// second kills them all.
			if signalled == nil {
				signalled = s
				fmt.Fprintf(os.Stderr, "launch: %v: passed to every rank (again to kill them)\n", s)
				signalAll(s)
				continue
			}
			if first == nil {
				// Killed as asked, with the status a second signal gives a
				// run of one process.
				first = &exitStatus{code: signalStatus(s), err: fmt.Errorf("launch: %s again: every rank killed (a checkpoint being saved stays partial and is never loaded)", signalName(s))}
				killedOnSecond = true
			}
			signalAll(syscall.SIGKILL)
		case <-kill:
			signalAll(syscall.SIGKILL)
		}
	}
	if first != nil && !killedOnSecond {
		// A rank's failure, not the user's second signal: its cause.
		if cause := failureCause(tails, firstRank, firstExit, termSent); cause != "" {
			if also := same.others(cause); also != "" {
				cause += " (" + also + " met the same; printed once above)"
			}
			first = fmt.Errorf("%w\nlaunch: the cause: %s", first, cause)
		}
	}
	if first == nil && signalled != nil {
		why := signalName(signalled)
		if status == 0 {
			status = signalStatus(signalled)
		} else {
			why = "SIGPIPE (the launcher's output closed; every rank was sent SIGTERM)"
		}
		return &exitStatus{code: status, err: fmt.Errorf("launch: stopped by %s: every rank stopped (the run did not finish)", why)}
	}
	return first
}

// failureCause names what made a job fail from its ranks' last errors
// (tails): the own error of the rank that failed first, unless it is an
// echo of another's ("stopped by another process's failure"); a rank
// killed by a signal that printed nothing (kill -9, the kernel's
// out-of-memory killer) is named so, where the others' messages would
// only say they lost it; else the first rank's own error, leaving out
// the SIGTERM the launcher itself sent the others (termSent), which is
// not the cause, and whose status (143) would have the job taken for
// stopped rather than failed.
func failureCause(tails []*errorTail, firstRank int, firstExit error, termSent bool) string {
	echo := func(msg string) bool { return strings.Contains(msg, "stopped by another process's failure") }
	if firstRank >= 0 {
		msg := tails[firstRank].last()
		var ee *exec.ExitError
		switch {
		case msg != "" && !echo(msg):
			return msg
		case msg == "" && errors.As(firstExit, &ee):
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				why := ""
				if ws.Signal() == syscall.SIGKILL {
					why = " (the system's log, dmesg, may say why: out of memory?)"
				}
				return fmt.Sprintf("rank %d was killed by %s and printed no error%s", firstRank, signalName(ws.Signal()), why)
			}
		}
	}
	for _, t := range tails {
		msg := t.last()
		if msg == "" || echo(msg) || termSent && interruptedRank.MatchString(msg) {
			continue
		}
		return msg
	}
	return ""
}

// stopSignal is the signal a rank exited as a run stops on (at a step
// boundary, 128 + SIGTERM's, SIGINT's or SIGHUP's number), or was killed
// by; false for any other exit.
func stopSignal(ee *exec.ExitError) (syscall.Signal, bool) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		if ee.ExitCode() == signalStatus(sig) || killedBy(ee, sig) {
			return sig, true
		}
	}
	return 0, false
}

// stoppedBySignal reports whether a rank exited as a run stops on a
// signal (stopSignal).
func stoppedBySignal(ee *exec.ExitError) bool {
	_, ok := stopSignal(ee)
	return ok
}

// killedBy reports whether a process ended killed by sig.
func killedBy(ee *exec.ExitError, sig os.Signal) bool {
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// errorTail passes a rank's stderr on, line by line, and keeps the first
// line of its last block of "gcompile: " lines: the error it exited with,
// which main prints a "gcompile: " line for each of its lines (a syntax
// error's knock-on errors, an out-of-memory report's largest buffers
// follow the cause). A block whose first line another rank has printed
// already, its rank aside, is left out (same says which).
type errorTail struct {
	mu    sync.Mutex
	w     io.Writer
	same  *sameErrors // nil: every block is passed on
	line  []byte
	err   string
	inErr bool // the last whole line was a "gcompile: " line
	drop  bool // ... of a block another rank printed
	// broken is called when a write to w fails with EPIPE (the
	// launcher's output closed); the rank's output is then dropped, not
	// left to fill its pipe and block the rank.
	broken func()
}

// rankError is the first line of a process's error, as main prints it:
// its rank, then the error.
var rankError = regexp.MustCompile(`^rank (\d+): (.+)$`)

func (t *errorTail) Write(b []byte) (int, error) {
	t.mu.Lock()
	var out []byte
	for _, c := range b {
		t.line = append(t.line, c)
		if c != '\n' {
			continue
		}
		s, ok := strings.CutPrefix(string(t.line[:len(t.line)-1]), "gcompile: ")
		if ok && !t.inErr {
			t.err = s
			t.drop = t.same.repeated(s)
		}
		t.inErr = ok
		if !ok || !t.drop {
			out = append(out, t.line...)
		}
		t.line = t.line[:0]
	}
	t.mu.Unlock()
	return len(b), t.pass(out)
}

// flush passes on what the rank wrote after its last newline; it is
// called once the rank has exited.
func (t *errorTail) flush() error {
	t.mu.Lock()
	out := t.line
	t.line = nil
	t.mu.Unlock()
	return t.pass(out)
}

func (t *errorTail) pass(out []byte) error {
	if len(out) == 0 {
		return nil
	}
	_, err := t.w.Write(out)
	if errors.Is(err, syscall.EPIPE) && t.broken != nil {
		t.broken()
		return nil
	}
	return err
}

// sameErrors remembers which rank printed each error first, so that an
// error every rank meets (a mistake in the model file, a plan that fits
// no device) is printed once, not once a rank; the job's cause then says
// which ranks printed it too.
type sameErrors struct {
	mu    sync.Mutex
	first map[string]int   // an error's first line, its rank left out → that rank
	also  map[string][]int // ... → the other ranks that printed it
}

// repeated reports whether line ("rank R: ERROR") is an error another
// rank printed first, and notes that R printed it too.
func (s *sameErrors) repeated(line string) bool {
	m := rankError.FindStringSubmatch(line)
	if s == nil || m == nil {
		return false
	}
	rank, _ := strconv.Atoi(m[1])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first == nil {
		s.first, s.also = map[string]int{}, map[string][]int{}
	}
	first, seen := s.first[m[2]]
	if !seen {
		s.first[m[2]] = rank
		return false
	}
	if first == rank {
		return false // the rank's own error again, printed again
	}
	s.also[m[2]] = append(s.also[m[2]], rank)
	return true
}

// others says which ranks but R met line's error ("rank R: ERROR"), in
// words ("" when none did).
func (s *sameErrors) others(line string) string {
	m := rankError.FindStringSubmatch(line)
	if s == nil || m == nil {
		return ""
	}
	rank, _ := strconv.Atoi(m[1])
	s.mu.Lock()
	defer s.mu.Unlock()
	first, seen := s.first[m[2]]
	if !seen {
		return ""
	}
	var ranks []int
	for _, r := range append([]int{first}, s.also[m[2]]...) {
		if r != rank && !slices.Contains(ranks, r) {
			ranks = append(ranks, r)
		}
	}
	slices.Sort(ranks)
	return rankNames(ranks)
}

func (t *errorTail) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}
