package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/comm"
	"gcompile/runtime/dist"
)

// job is this process's place in a run of several processes: the world
// the launcher described, the rendezvous store (hosted by process 0), the
// comm that connects every device, and the signals that stop the job. A
// single process is a job of one, with none of the machinery.
type job struct {
	world   dist.World
	layout  runtime.Layout
	timeout time.Duration
	// rdzvTimeout bounds the rendezvous (--rdzv-timeout): still starting
	// is told from never coming sooner than a collective's --timeout.
	rdzvTimeout time.Duration
	token       string
	// settings are this process's run-defining flags (config.settings),
	// compared with rank 0's at the rendezvous.
	settings []string
	// advertise is --advertise-addr (or GCOMPILE_ADVERTISE_ADDR), "" for
	// the address found on the route to the master.
	advertise string

	server *dist.Server
	store  *dist.Client
	net    *comm.Net

	// ctx ends when the job must stop: a signal, another process's
	// failure reported through the store, or this process's own.
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() // ends the signal and abort watchers
	// failOnce and failed make fail's report happen once, and every
	// caller wait until it is out: a signal's report must reach the store
	// before the process exits.
	failOnce sync.Once
	failed   chan struct{}
	// preemptible is set while training: a signal then stops the run at
	// the next step boundary (every process agrees, see checkpointer)
	// instead of failing the job.
	preemptible atomic.Bool
	// finishing is set once training is over: a signal then lets the
	// outputs (--save, --metrics) be written, the run being done; it
	// failed the job "before training" and lost the weights.
	finishing atomic.Bool
	// started is set once every process has met at the rendezvous.
	started atomic.Bool

	log    io.Writer // this process's log: stderr, prefixed for ranks > 0, or a file in --log-dir
	closer io.Closer
}

// Keys of the rendezvous store.
const (
	keyAbort       = "job/abort"           // the first failure, "rank N: why"
	keyFingerprint = "job/fingerprint/"    // + process rank: its compiled plan's fingerprint
	keyCkptLock    = "job/checkpoint-lock" // rank 0's --checkpoint-dir lock, which every process must see
	keySettings    = "job/settings/"       // + process rank: its run-defining flags
	keyReachedAt   = "job/reached-at"      // the master's address as the other machines reached it (Server.ReachedAt)
	keyBeat        = "job/beat/"           // + process rank: its heartbeat, a counter
	keyPhase       = "job/phase/"          // + process rank: what it is doing, when that is long (a checkpoint save)
)

// rendezvousPorts is how many ports from its first the store may look
// through for a free one.
const rendezvousPorts = 16

// storePorts are where a job's store may be: the first free port of
// rendezvousPorts from StorePort (MASTER_PORT, or the port above it where
// torchrun's agent store holds MASTER_PORT), so a port taken by someone
// else, or a derived port two jobs share, does not stop the job; the
// others look for it there, skipping anything that is not this job's
// store.
func storePorts(w dist.World) (port, tries int) {
	port = w.StorePort()
	return port, min(rendezvousPorts, 65536-port)
}

// memberOf is how a process of job w presents itself to the job's store.
func memberOf(w dist.World, token string) dist.Member {
	return dist.Member{Token: token, Rank: w.Rank, Size: w.Size, Job: dist.JobIdentity(w), JobNamed: w.JobID != ""}
}

// worldOf reads the launcher's environment and lays the command line's
// flags over it.
func worldOf(c *config) (dist.World, error) {
	w, err := dist.FromEnv(os.Getenv)
	if err != nil {
		return w, err
	}
	if c.explicit["rank"] {
		w.Rank = c.rank
	}
	if c.explicit["world-size"] {
		w.Size = c.worldSize
		if !c.explicit["local-world-size"] && w.LocalSize <= 1 {
			w.LocalSize = c.worldSize // flags alone describe one machine
		}
	}
	if c.explicit["local-rank"] {
		w.LocalRank = c.localRank
	} else if c.explicit["rank"] && w.Launcher == "" {
		w.LocalRank = w.Rank
	}
	if c.explicit["local-world-size"] {
		w.LocalSize = c.localWorldSize
	}
	if c.explicit["master-addr"] {
		w.MasterAddr = c.masterAddr
	}
	if c.explicit["master-port"] && c.masterPort != 0 {
		w.MasterPort = c.masterPort // 0, as the flag's help says, keeps the launcher's (or the default)
	}
	if err := w.Validate(); err != nil {
		return w, fmt.Errorf("the job's processes: %w", err)
	}
	return w, nil
}

// startJob joins this process to its job: with one process it only sets
// up the log; with several it meets the others at the rendezvous store,
// hosted by process 0 at the master address, and watches for signals and
// for another process's failure.
func startJob(c *config) (*job, error) {
	w, err := worldOf(c)
	if err != nil {
		return nil, err
	}
	j := &job{world: w, timeout: c.timeout, rdzvTimeout: c.rdzvTimeout, settings: c.settings, advertise: c.advertiseAddr, log: os.Stderr, failed: make(chan struct{})}
	if !c.explicit["advertise-addr"] {
		j.advertise = os.Getenv("GCOMPILE_ADVERTISE_ADDR")
	}
	j.layout = runtime.Layout{Devices: c.Devices, Procs: w.Size, Proc: w.Rank}
	if w.Size > 1 {
		if err := j.layout.Check(); err != nil {
			return nil, fmt.Errorf("--devices %d over %d processes: %w", c.Devices, w.Size, err)
		}
		if c.packGPU {
			return nil, errors.New("--pack-gpu runs one process's devices as virtual devices on one GPU; a job of several processes needs one GPU per device (NCCL)")
		}
	}
	j.ctx, j.cancel = context.WithCancelCause(context.Background())
	j.stop = func() {}
	if w.Size == 1 {
		// A process on its own keeps the default: a signal ends it.
		return j, nil
	}
	// A signal to any process of a job stops the job: the others hear of
	// it through the comm and the store, and say which rank it was.
	sigs, got, stopSignals := signalContext()
	go func() {
		select {
		case <-sigs.Done():
			if j.preemptible.Load() {
				return // the training loop stops at the next step boundary
			}
			if j.finishing.Load() {
				j.logf("rank %d: %s after the last step: the outputs are written first", w.Rank, signalName(got()))
				return
			}
			// Every process exits with the signal's status (exitCode).
			j.fail(fmt.Errorf("rank %d was interrupted by %s before training", w.Rank, signalName(got())))
		case <-j.ctx.Done():
		}
	}()
	j.stop = stopSignals
	if err := j.openLog(c.logDir); err != nil {
		return nil, err
	}
	j.token = c.token
	if !c.explicit["token"] {
		var secret bool
		j.token, secret = dist.DefaultToken(w, os.Getenv)
		if !secret && w.Rank == 0 {
			j.logf("%s", derivedTokenNote(w))
		}
	}
	if err := j.rendezvous(); err != nil {
		// A signal or another process's failure ended the wait: that is
		// the cause to report, not the wait's own "context canceled".
		if cause := context.Cause(j.ctx); j.ctx.Err() != nil && cause != nil {
			err = cause
		}
		// The job never started: close neither waits at the exit
		// barrier (a second --timeout) nor long for the others, and the
		// store tells those still waiting why.
		j.cancel(err)
		j.close()
		return nil, &rendezvousError{err}
	}
	return j, nil
}

// rendezvousError is a failure of the rendezvous itself, which the job
// has heard of: tellJob has nothing to add.
type rendezvousError struct{ error }

func (e *rendezvousError) Unwrap() error { return e.error }

// tellJobWait bounds how long a process that failed before joining its
// job spends telling the others: long enough for processes started
// together to meet, short enough not to hold up a launcher that would
// stop them anyway once this one exits.
const tellJobWait = 10 * time.Second

// tellJob tells a job that this process failed before it joined (a bad
// flag, a layout its world size cannot have), so that the others fail
// within seconds with its reason instead of waiting for it until
// --rdzv-timeout. Rank 0 hosts the store for a moment and shuts it down
// with the reason once the others have connected; another rank reports
// the reason as the job's failure, which rank 0 watches during the
// rendezvous. It is best effort: with a launcher that stops the job when
// one process exits (gcompile launch, torchrun, mpirun) it changes
// nothing; a process whose token or place is wrong cannot tell anyone.
func tellJob(c *config, w dist.World, cause error) {
	token, _ := dist.DefaultToken(w, os.Getenv)
	if c != nil && c.explicit["token"] {
		token = c.token
	}
	if token == "" || w.MasterAddr == "" || w.MasterPort == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tellJobWait)
	defer cancel()
	port, tries := storePorts(w)
	me := memberOf(w, token)
	reason := fmt.Sprintf("the job cannot start: %v", cause)
	if w.Rank == 0 {
		s, err := dist.ServeNear(dist.BindHost(w.MasterAddr), port, tries, dist.ServerOptions{Token: token, Ranks: w.Size, JobID: me.Job})
		if err != nil {
			return
		}
		for ctx.Err() == nil && len(s.MissingRanks()) > 1 { // rank 0 itself never joins
			time.Sleep(50 * time.Millisecond)
		}
		s.Shutdown(reason)
		return
	}
	store, err := dist.DialNearAs(ctx, w.MasterAddr, port, tries, me)
	if err != nil {
		return
	}
	defer store.Close()
	if ok, err := store.Check(ctx, keyAbort); err == nil && !ok {
		store.Set(ctx, keyAbort, []byte(reason))
	}
}

// openLog sends the log of a rank other than 0 to --log-dir/rank-N.log,
// or to stderr with every line prefixed by the rank; rank 0 logs to
// stderr as a single process does.
func (j *job) openLog(dir string) error {
	if j.world.Rank == 0 {
		return nil
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("--log-dir: %w", err)
		}
		// Appended to, under a line that starts each run: a requeued
		// job's earlier attempts keep their logs, a failed one's above
		// all, as the launcher's own output (to a file a scheduler
		// appends) keeps them.
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", j.world.Rank)), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("--log-dir: %w", err)
		}
		fmt.Fprintf(f, "=== rank %d of %d, pid %d, started %s ===\n", j.world.Rank, j.world.Size, os.Getpid(), time.Now().Format(time.RFC3339))
		j.log, j.closer = f, f
		return nil
	}
	j.log = &prefixWriter{w: os.Stderr, prefix: fmt.Sprintf("[rank %d] ", j.world.Rank)}
	return nil
}

func (j *job) logf(format string, args ...any) {
	fmt.Fprintf(j.log, format+"\n", args...)
}

// multi reports whether the job has several processes.
func (j *job) multi() bool { return j.world.Size > 1 }

// lead reports whether this process writes the job's outputs.
func (j *job) lead() bool { return j.world.Rank == 0 }

// rendezvous starts the store on process 0 and connects every process to
// it. Under torchrun's agent store MASTER_PORT is taken, so the store
// takes the first free port above it and the others look for it there.
func (j *job) rendezvous() error {
	w := j.world
	// Rank 0 gives up first: it knows which ranks never joined and its
	// store tells the others, who wait a moment longer to hear it.
	// The rendezvous deadline, never longer than --timeout.
	limit := j.timeout
	if j.rdzvTimeout > 0 {
		limit = min(limit, j.rdzvTimeout)
	}
	if w.Rank != 0 {
		limit += rendezvousGrace
	}
	ctx, cancel := context.WithTimeout(j.ctx, limit)
	defer cancel()
	if err := checkResolves(ctx, w.MasterAddr); err != nil {
		return fmt.Errorf("rank %d: %w", w.Rank, err)
	}
	me := memberOf(w, j.token)
	opts := dist.ServerOptions{Token: j.token, Ranks: w.Size, JobID: me.Job, Logf: func(f string, a ...any) { j.logf("rendezvous: "+f, a...) },
		OnMisfit: j.misfit}
	host := dist.BindHost(w.MasterAddr)
	port, tries := storePorts(w)
	var err error
	dialPort, dialTries := port, tries
	if w.Rank == 0 {
		if j.server, err = dist.ServeNear(host, port, tries, opts); err != nil {
			return fmt.Errorf("rank 0 cannot host the rendezvous on %s ports %d–%d: %w", host, port, port+tries-1, err)
		}
		// Rank 0 joins the store it hosts: dialling from the first port
		// of the range, it joined another job's store on that port (one
		// of the same public facts, hence the same token), which then
		// stopped as having two ranks 0.
		if _, p, err := net.SplitHostPort(j.server.Addr()); err == nil {
			if n, err := strconv.Atoi(p); err == nil {
				dialPort, dialTries = n, 1
			}
		}
	}
	if j.store, err = dist.DialNearAs(ctx, w.MasterAddr, dialPort, dialTries, me); err != nil {
		return fmt.Errorf("rank %d: joining the job's rendezvous at %s ports %d–%d: %w", w.Rank, w.MasterAddr, port, port+tries-1, err)
	}
	// From here a process that failed before joining (tellJob), or fails
	// later, ends every process's wait with its reason.
	go j.watchAbort()
	waiting := make(chan struct{})
	go j.sayWhoIsMissing(ctx, waiting)
	err = j.store.Barrier(ctx, "job/start", w.Size)
	close(waiting)
	if err != nil {
		if missing := j.missingRanks(); missing != "" && j.ctx.Err() == nil {
			return fmt.Errorf("rank %d: waiting for all %d processes at the rendezvous: %s never joined (not started, or they cannot reach %s): %w", w.Rank, w.Size, missing, j.rendezvousAddr(), err)
		}
		return fmt.Errorf("rank %d: waiting for all %d processes at the rendezvous: %w", w.Rank, w.Size, err)
	}
	j.started.Store(true)
	j.setPhase("compiling and loading, before the first step") // train says when it trains
	go j.beat()
	if j.server != nil && j.timeout > stallLimit {
		go j.watchBeats()
	}
	if j.server != nil {
		// Every process has joined: the other machines' connections say
		// where they reach this one.
		if err := j.store.Set(ctx, keyReachedAt, []byte(j.server.ReachedAt())); err != nil {
			return fmt.Errorf("rank 0: publishing the master's address: %w", err)
		}
	}
	return j.checkSettings(ctx)
}

// checkSettings compares every process's run-defining flags with rank
// 0's: a process given another --seed, --lr or --steps would train
// another run and exchange garbage, or hang when its steps run out. The
// error, the same on every process, names the first process that differs
// and each flag with both values.
func (j *job) checkSettings(ctx context.Context) error {
	me := strings.Join(j.settings, "\n")
	if err := j.store.Set(ctx, keySettings+strconv.Itoa(j.world.Rank), []byte(me)); err != nil {
		return fmt.Errorf("rank %d: publishing this process's flags: %w", j.world.Rank, err)
	}
	var first []string
	for r := range j.world.Size {
		v, err := j.store.Get(ctx, keySettings+strconv.Itoa(r))
		if err != nil {
			return fmt.Errorf("rank %d: waiting for rank %d's flags: %w", j.world.Rank, r, err)
		}
		theirs := strings.Split(string(v), "\n")
		if r == 0 {
			first = theirs
			continue
		}
		if diff := settingsDiff(first, theirs); diff != "" {
			return fmt.Errorf("rank %d was given other flags than rank 0: %s; every process of a job must be given the same flags (only where it sits and where it writes may differ)", r, diff)
		}
	}
	return nil
}

// settingsDiff names the flags whose values differ between rank 0's
// settings and another rank's ("--seed 7 (rank 0: 1)"), "" if none.
func settingsDiff(zero, other []string) string {
	values := func(list []string) map[string]string {
		m := map[string]string{}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return m
	}
	a, b := values(zero), values(other)
	var names []string
	for k := range a {
		names = append(names, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var diffs []string
	for _, k := range names {
		va, okA := a[k]
		vb, okB := b[k]
		switch {
		case !okA || !okB:
			// Another gcompile build: its fingerprint check would name it
			// too, but later.
			diffs = append(diffs, fmt.Sprintf("--%s is known to one of them only (another gcompile build?)", k))
		case va != vb:
			diffs = append(diffs, fmt.Sprintf("--%s %q (rank 0: %q)", k, vb, va))
		}
	}
	return strings.Join(diffs, ", ")
}

// checkResolves fails when the master address is a name the resolver
// says does not exist: retrying it until the rendezvous deadline would
// only delay the same answer. A lookup that fails otherwise (a resolver
// that is slow or down) is left to the dial's retries.
func checkResolves(ctx context.Context, master string) error {
	host := strings.TrimSuffix(strings.TrimPrefix(master, "["), "]")
	if host == "" || net.ParseIP(host) != nil {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := net.DefaultResolver.LookupHost(lctx, host)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return fmt.Errorf("the master address %q does not resolve on this machine (%w): set MASTER_ADDR (or --master-addr; under SLURM, the first host of the node list) to a name or address every machine of the job resolves", master, err)
	}
	return nil
}

// misfit hears of a process of this job that rank 0's store refused.
// Before the job starts, the job cannot start: two processes with one
// rank, or one told another job size, end the rendezvous at once (the
// store tells the others why); one that names this job but not its token
// ends it when that rank has not joined with the right token within
// misfitGrace (the process fails at once on its side, but the claim is
// unproven: another job on the same master address may have made it).
// Once the job has started, the latecomer alone is refused.
func (j *job) misfit(m dist.Misfit) {
	if j.started.Load() {
		// A second process holding the job's token and a rank already
		// in it: which of the two was meant is unknowable, so the job
		// stops on every process rather than train with the wrong one
		// (it went on, and only the latecomer failed).
		if m.Duplicate && !m.Unproven {
			go j.fail(fmt.Errorf("the job stops: %s", m.Reason))
		}
		return
	}
	stop := func() {
		if !j.started.Load() {
			j.cancel(fmt.Errorf("the job cannot start: %s", m.Reason))
		}
	}
	if !m.Unproven {
		stop()
		return
	}
	time.AfterFunc(misfitGrace, func() {
		if j.server != nil && slices.Contains(j.server.MissingRanks(), m.Rank) {
			stop()
		}
	})
}

// misfitGrace is how long rank 0 waits for a rank whose process named
// this job with another token to join with the right one.
const misfitGrace = 2 * time.Second

// derivedTokenNote is what rank 0 says of a token derived from public
// facts: a note on one machine, where the store listens on loopback or
// a local address; a warning, with the fix, for a job across machines,
// where anyone who can reach the master can compute the token and join.
func derivedTokenNote(w dist.World) string {
	if w.LocalSize >= w.Size {
		return "the job token is derived from the job's public facts (set GCOMPILE_TOKEN or --token for a secret one)"
	}
	return fmt.Sprintf(`WARNING: this job spans several machines and its rendezvous token is derived from public facts (the launcher, its job id, the master address %s): anyone who can reach the master can compute it, join the job and stop it.
WARNING: set GCOMPILE_TOKEN to the same secret in every process's environment, e.g. in the sbatch script or before the launcher: export GCOMPILE_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')`, w.MasterHostPort())
}

// defaultRdzvTimeout is --rdzv-timeout's default: processes of a large
// job may start minutes apart (containers pulled, nodes booted), but a
// process that never comes is named well before a collective's 10-minute
// --timeout.
const defaultRdzvTimeout = 5 * time.Minute

// rendezvousGrace is how much longer than rank 0 the other processes wait
// at the rendezvous: enough for rank 0's reason to reach them.
const rendezvousGrace = 3 * time.Second

// missingRanks names the ranks the store (on rank 0) has not seen, "" when
// this process hosts no store or none is missing.
// sayWhoIsMissing has rank 0 name, while the rendezvous waits, the
// ranks that have not joined: after missingAfter (a third of a shorter
// wait), then every missingEvery until waiting closes, so a wait of
// minutes for a process that never started is not minutes of silence.
func (j *job) sayWhoIsMissing(ctx context.Context, waiting <-chan struct{}) {
	if j.server == nil {
		return
	}
	first := missingAfter
	if d, ok := ctx.Deadline(); ok {
		first = min(first, time.Until(d)/3)
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-waiting:
			return
		case <-t.C:
		}
		if m := j.missingRanks(); m != "" {
			left := "until the job's --timeout"
			if d, ok := ctx.Deadline(); ok {
				left = fmt.Sprintf("%s more at most (--rdzv-timeout)", time.Until(d).Round(time.Second))
			}
			j.logf("rendezvous: waiting for %s of %d to join at %s, %s", m, j.world.Size, j.rendezvousAddr(), left)
		}
		t.Reset(missingEvery)
	}
}

// When sayWhoIsMissing speaks.
const (
	missingAfter = 10 * time.Second
	missingEvery = 30 * time.Second
)

func (j *job) missingRanks() string {
	if j.server == nil {
		return ""
	}
	return rankNames(j.server.MissingRanks())
}

// rankNames says ranks in words: "rank 3", "ranks 0, 2, 5" ("" for none).
func rankNames(ranks []int) string {
	if len(ranks) == 0 {
		return ""
	}
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = strconv.Itoa(r)
	}
	if len(ranks) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}

// beatEvery is how often a process of a job says in the store that it is
// alive: a process stopped (SIGSTOP, a hung filesystem call holding every
// thread, a machine frozen) stops its heartbeat, one that is merely busy
// does not (the beat is a goroutine of its own).
const beatEvery = time.Second

// beat counts this process's heartbeat in the store until the job ends.
func (j *job) beat() {
	t := time.NewTicker(beatEvery)
	defer t.Stop()
	key := keyBeat + strconv.Itoa(j.world.Rank)
	for {
		if _, err := j.store.Add(j.ctx, key, 1); err != nil {
			return
		}
		select {
		case <-t.C:
		case <-j.ctx.Done():
			return
		}
	}
}

// stallLimit is how long a process of a job may go without a heartbeat
// while another still beats before rank 0 stops the job (under a longer
// --timeout; a shorter one names the stalled process when it expires): a
// process killed while it built or compiled the model (before any
// connection of the comm could tell), or stopped (SIGSTOP), held the
// others until --timeout, ten minutes by default.
const stallLimit = 30 * beatEvery

// watchBeats runs on rank 0, which hosts the store: it reads every
// process's heartbeat each beat and fails the job, naming the process and
// what it was last doing, once one has not moved for the stall limit
// while another has moved within the last few beats (a machine too
// loaded for anyone to beat says nothing, as stalled does).
func (j *job) watchBeats() {
	t := time.NewTicker(beatEvery)
	defer t.Stop()
	n := j.world.Size
	last, since := make([]int64, n), make([]time.Time, n)
	start := time.Now()
	for p := range n {
		last[p], since[p] = -1, start
	}
	for {
		select {
		case <-t.C:
		case <-j.ctx.Done():
			return
		}
		now := time.Now()
		for p := range n {
			ctx, cancel := context.WithTimeout(j.ctx, beatEvery)
			v, err := j.store.Add(ctx, keyBeat+strconv.Itoa(p), 0)
			cancel()
			if err != nil {
				if j.ctx.Err() != nil {
					return
				}
				continue
			}
			if v != last[p] {
				last[p], since[p] = v, now
			}
		}
		for p := range n {
			if now.Sub(since[p]) < stallLimit {
				continue
			}
			alive := false
			for q := range n {
				alive = alive || q != p && now.Sub(since[q]) < 3*beatEvery
			}
			if !alive {
				continue
			}
			what := ""
			ctx, cancel := context.WithTimeout(j.ctx, beatEvery)
			if v, err := j.store.Get(ctx, keyPhase+strconv.Itoa(p)); err == nil {
				what = ", last " + string(v)
			}
			cancel()
			j.fail(fmt.Errorf("%s stopped answering (no heartbeat for %v%s, while the others beat: killed or stopped); the job stops rather than wait out --timeout %v", j.procName(p), stallLimit, what, j.timeout))
			return
		}
	}
}

// setPhase says in the store what this process is doing, so that a
// process stalled in it is named with it.
func (j *job) setPhase(what string) {
	if !j.multi() || j.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(j.ctx, 5*time.Second)
	defer cancel()
	j.store.Set(ctx, keyPhase+strconv.Itoa(j.world.Rank), []byte(what))
}

// stalled names the processes whose heartbeat stopped, with what each
// was last doing, "" when every other process still beats. A process
// that timed out waiting for another calls it: the one it waited for may
// itself be waiting for the one that stalled (every process of a
// collective waits for its slowest), and only the heartbeats tell which.
// A store that does not answer is rank 0's process, which hosts it.
func (j *job) stalled() string {
	if !j.multi() || j.store == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*beatEvery)
	defer cancel()
	read := func() ([]int64, error) {
		out := make([]int64, j.world.Size)
		for p := range out {
			v, err := j.store.Add(ctx, keyBeat+strconv.Itoa(p), 0)
			if err != nil {
				return nil, err
			}
			out[p] = v
		}
		return out, nil
	}
	noStore := fmt.Sprintf("%s stopped answering (it hosts the rendezvous store, which does not answer either)", j.procName(0))
	before, err := read()
	if err != nil {
		return noStore
	}
	time.Sleep(5 * beatEvery / 2)
	after, err := read()
	if err != nil {
		return noStore
	}
	// Stalled is relative: a process whose count did not move while
	// another's moved at least twice. A machine so loaded that nobody beat
	// says nothing.
	moved := int64(0)
	for p := range after {
		moved = max(moved, after[p]-before[p])
	}
	if moved < 2 {
		return ""
	}
	var out []string
	for p := range after {
		if p == j.world.Rank || after[p] != before[p] {
			continue
		}
		what := ""
		pctx, pcancel := context.WithTimeout(ctx, beatEvery)
		if ok, err := j.store.Check(pctx, keyPhase+strconv.Itoa(p)); err == nil && ok {
			if v, err := j.store.Get(pctx, keyPhase+strconv.Itoa(p)); err == nil {
				what = ", last " + string(v)
			}
		}
		pcancel()
		out = append(out, fmt.Sprintf("%s stopped answering (no heartbeat for %v%s)", j.procName(p), 5*beatEvery/2, what))
	}
	return strings.Join(out, "; ")
}

// procName names process p by its ranks: "process 1 (ranks 2–3)".
func (j *job) procName(p int) string {
	k := j.layout.PerProc()
	if k == 1 {
		return fmt.Sprintf("process %d (rank %d)", p, p)
	}
	return fmt.Sprintf("process %d (ranks %d–%d)", p, p*k, p*k+k-1)
}

// explainTimeout leads a timeout's message with the processes that
// stalled, when their heartbeats say so: the rank this process waited for
// is often healthy and waiting too. A timeout another process passed on
// (its abort carries only text) counts as well.
func (j *job) explainTimeout(err error) error {
	if !j.multi() || !errors.Is(err, runtime.ErrTimeout) && !strings.Contains(err.Error(), "timed out after") {
		return err
	}
	who := j.stalled()
	if who == "" {
		return err
	}
	msg := err.Error()
	if _, rest, ok := rankLabel(msg); ok && rest != msg {
		msg = rest
	}
	return &headlined{msg: who + ": " + msg, err: err}
}

// watchAbort ends the job's context when another process reports a
// failure through the store, so nobody waits for it until a timeout.
func (j *job) watchAbort() {
	why, err := j.store.Get(j.ctx, keyAbort)
	if err != nil || j.ctx.Err() != nil {
		return
	}
	err = errors.New(string(why))
	j.cancel(err)
	if j.net != nil {
		j.net.Abort(err)
	}
}

// peerLostGrace is how long a process that lost a peer waits for the
// peer's own report before reporting the loss as the cause.
const peerLostGrace = 2 * time.Second

// echoPoll is how often a process waiting for another's report looks
// for processes that stopped answering.
const echoPoll = 2 * beatEvery

// awaitReport waits for another process's report of a failure this one
// only echoes: it ends the job's context. It gives up after --timeout, or
// as soon as processes stop answering, and then names them: a process
// that failed and was killed before it reported (its outputs' writes
// running out of memory), or rank 0 gone with the store, held this one
// until --timeout, where rank 0's stall watch, itself waiting here, could
// not step in.
func (j *job) awaitReport() (stalled string) {
	deadline := time.NewTimer(j.timeout)
	defer deadline.Stop()
	poll := time.NewTicker(echoPoll)
	defer poll.Stop()
	for {
		select {
		case <-j.ctx.Done():
			return ""
		case <-deadline.C:
			return ""
		case <-poll.C:
			// The report may come while stalled watches the beats: its
			// sender, gone after it, is no staller.
			if who := j.stalled(); who != "" && j.ctx.Err() == nil {
				return who
			}
		}
	}
}

// fail stops the job: this process's comm calls end, and every other
// process hears of it through the comm and the store.
func (j *job) fail(err error) {
	j.failOnce.Do(func() {
		defer close(j.failed)
		j.report(err)
	})
	<-j.failed
}

// hasFailed reports whether this process called fail.
func (j *job) hasFailed() bool {
	select {
	case <-j.failed:
		return true
	default:
		return false
	}
}

// report is fail's work, done once.
func (j *job) report(err error) {
	if j.ctx.Err() != nil {
		return
	}
	if j.multi() && j.store != nil && errors.Is(err, checkpoint.ErrPeerFailed) {
		// Only the echo of another process's failure of its share of a
		// checkpoint: that process, alive, reports its cause once its
		// outputs are written. The first report wins, and this one would
		// hide it.
		who := j.awaitReport()
		if who == "" && j.ctx.Err() != nil {
			return
		}
		if who != "" {
			err = &headlined{msg: who + ": " + err.Error(), err: err}
		}
	}
	if j.multi() && j.store != nil && errors.Is(err, runtime.ErrPeerLost) {
		// A lost peer is most often the echo of that peer's own failure,
		// whose report may reach the store a moment after its sockets
		// close: give it that moment, so the job names the cause (rank 1
		// was interrupted) rather than the broken pipe it left.
		select {
		case <-j.ctx.Done():
			return
		case <-time.After(peerLostGrace):
		}
	}
	j.cancel(err)
	if !j.multi() {
		return
	}
	// The store first: the others' grace for a lost peer then finds the
	// reason there before the comm's abort closes this process's sockets.
	if j.store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		msg := labelled(j.world.Rank, err).Error()
		// The first report wins: a failure echoing an earlier one must not
		// hide its cause.
		if ok, err := j.store.Check(ctx, keyAbort); err == nil && !ok {
			j.store.Set(ctx, keyAbort, []byte(msg))
		}
		cancel()
	}
	if j.net != nil {
		j.net.Abort(err)
	}
}

// rendezvousAddr is where the job's store listens: on process 0, the
// port it took (the next free one of the range when the master port was
// taken, where the others find it too); elsewhere, the master address.
func (j *job) rendezvousAddr() string {
	if j.server != nil {
		// The master's name, as the others dial it, not the bound
		// address (all interfaces: 0.0.0.0).
		if _, port, err := net.SplitHostPort(j.server.Addr()); err == nil {
			return net.JoinHostPort(j.world.MasterAddr, port)
		}
	}
	return j.world.MasterHostPort()
}

// checkPlan compares every process's gcompile build, fingerprint of its
// compiled plan and the identity of the data it read: another build can
// lower the same flags to other kernels or another wire order, a process
// that compiled something else (another model file, other flags) would
// exchange garbage, and one that read other data (a --data that names
// other files on its machine) would train another run beside the job.
// The error, the same on every process, names the first process that
// differs from process 0.
func (j *job) checkPlan(fingerprint, data, sources string) error {
	if !j.multi() {
		return nil
	}
	ctx, cancel := context.WithTimeout(j.ctx, j.timeout)
	defer cancel()
	mine := processIdentity{Build: buildIdentity(), Plan: fingerprint, Data: data, Sources: sources}
	if err := j.store.Set(ctx, keyFingerprint+strconv.Itoa(j.world.Rank), []byte(mine.String())); err != nil {
		return j.cause(fmt.Errorf("publishing this process's compiled plan: %w", err))
	}
	ids := make([]processIdentity, j.world.Size)
	for r := range ids {
		v, err := j.store.Get(ctx, keyFingerprint+strconv.Itoa(r))
		if err != nil {
			return j.cause(fmt.Errorf("waiting for rank %d's compiled plan: %w", r, err))
		}
		ids[r] = parseProcessIdentity(string(v))
	}
	return sameProcesses(ids)
}

// processIdentity is what checkPlan compares between processes.
// Sources are the flags each process is given that every process must
// agree on although their paths may differ between machines
// (processSources).
type processIdentity struct{ Build, Plan, Data, Sources string }

func (p processIdentity) String() string {
	return p.Build + "\n" + p.Plan + "\n" + p.Data + "\n" + p.Sources
}

func parseProcessIdentity(s string) processIdentity {
	var p processIdentity
	p.Build, s, _ = strings.Cut(s, "\n")
	p.Plan, s, _ = strings.Cut(s, "\n")
	p.Data, p.Sources, _ = strings.Cut(s, "\n")
	return p
}

// processSources are the per-process flags whose paths may differ between
// machines but whose presence, and what they name, must not: --load's
// weights (its file's header: names, types, sizes, offsets), --resume's
// checkpoint (its manifest's ID), and whether --checkpoint-dir and --save
// are given (every process takes part in a save, gathering what it holds;
// process 0 writes). One process given one of them alone had trained
// apart (its own weights) or hung at the first save, the whole run lost.
// "; "-separated "flag what" parts, in a fixed order.
func processSources(c *config, resumeDir string) string {
	var parts []string
	if c.load != "" {
		parts = append(parts, "--load "+weightsIdentity(c.load))
	}
	if resumeDir != "" {
		id := "(no manifest)"
		if m, err := checkpoint.ReadManifest(resumeDir); err == nil {
			id = fmt.Sprintf("step %d, %s", m.State.Step, m.ID())
		}
		parts = append(parts, "--resume "+id)
	}
	if c.ckptDir != "" {
		parts = append(parts, "--checkpoint-dir")
	}
	if c.save != "" {
		parts = append(parts, "--save")
	}
	return strings.Join(parts, "; ")
}

// weightsIdentity names a --load file by its safetensors header (or a
// shard index's bytes): the tensors, their types and where they lie, not
// a checksum of gigabytes of weights.
func weightsIdentity(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "(unreadable)"
	}
	defer f.Close()
	h := sha256.New()
	if strings.HasSuffix(path, ".index.json") {
		_, _ = io.Copy(h, io.LimitReader(f, 64<<20))
	} else {
		var n [8]byte
		if _, err := io.ReadFull(f, n[:]); err == nil {
			size := min(binary.LittleEndian.Uint64(n[:]), checkpoint.MaxHeaderLength)
			h.Write(n[:])
			_, _ = io.Copy(h, io.LimitReader(f, int64(size)))
		}
	}
	return fmt.Sprintf("header sha256 %.12x", h.Sum(nil))
}

// sameProcesses says how the first process that differs from process 0
// differs: its build first (another build explains another plan).
func sameProcesses(ids []processIdentity) error {
	for r, p := range ids {
		switch {
		case p.Build != ids[0].Build:
			return fmt.Errorf("rank %d runs another gcompile build than rank 0 (%s, rank 0: %s): every process must run the same build", r, p.Build, ids[0].Build)
		case p.Plan != ids[0].Plan:
			return fmt.Errorf("rank %d compiled a different plan than rank 0 (fingerprint %.12s… vs %.12s…): every process must run the same gcompile build with the same model file and flags", r, p.Plan, ids[0].Plan)
		case p.Data != ids[0].Data:
			return fmt.Errorf("rank %d reads other data than rank 0 (%s, rank 0: %s): every process must be given the same --data (its path may differ between machines, its contents may not)", r, p.Data, ids[0].Data)
		case p.Sources != ids[0].Sources:
			return fmt.Errorf("rank %d was given %s, rank 0 %s: every process must be given the same --load weights and --resume checkpoint, and --checkpoint-dir and --save alike (every process takes part in a save; their paths may differ between machines)", r, orNone(p.Sources), orNone(ids[0].Sources))
		}
	}
	return nil
}

// buildIdentity names this gcompile build: its Go version, the commit it
// was built from and the build settings that change code (architecture
// level, tags), and where the commit does not say it all (a build from
// a modified tree, or without version control) a hash of the executable.
// Two machines that build one commit with one Go release agree.
var buildIdentity = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown build " + executableHash()
	}
	id := []string{info.GoVersion}
	revision, modified := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "GOARCH", "GOAMD64", "GOARM64", "-tags", "CGO_ENABLED":
			id = append(id, s.Key+"="+s.Value)
		}
	}
	switch {
	case revision != "" && !modified:
		id = append(id, "commit "+revision[:min(12, len(revision))])
	case revision != "":
		id = append(id, "commit "+revision[:min(12, len(revision))]+" modified, executable "+executableHash())
	default:
		id = append(id, "executable "+executableHash())
	}
	return strings.Join(id, " ")
})

// executableHash is the first bytes of the SHA-256 of this process's
// executable, or why there is none.
func executableHash() string {
	path, err := os.Executable()
	if err != nil {
		return "(unreadable)"
	}
	f, err := os.Open(path)
	if err != nil {
		return "(unreadable)"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "(unreadable)"
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:6])
}

// checkSharedDir checks that the --checkpoint-dir every process writes
// its part of each checkpoint into is one folder all of them share: rank
// 0 publishes the lock it took there, and every other process must find
// that same lock in the folder it was given. A folder local to each
// machine (or a path that names another folder on one of them) would
// otherwise be found at the first save, hours in, with a message about
// a part another process failed to write.
func (j *job) checkSharedDir(dir string) error {
	if !j.multi() || dir == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(j.ctx, j.timeout)
	defer cancel()
	path := filepath.Join(dir, lockName)
	if j.lead() {
		raw, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("--checkpoint-dir %s: reading this run's lock: %w", dir, err)
		}
		if err := j.store.Set(ctx, keyCkptLock, raw); err != nil {
			return j.cause(fmt.Errorf("publishing the --checkpoint-dir lock: %w", err))
		}
		return nil
	}
	want, err := j.store.Get(ctx, keyCkptLock)
	if err != nil {
		return j.cause(fmt.Errorf("waiting for rank 0's --checkpoint-dir lock: %w", err))
	}
	got, err := os.ReadFile(path)
	switch {
	case err != nil:
		return fmt.Errorf("--checkpoint-dir %s is not the folder rank 0 writes (rank 0's %s is not there on this machine: %w): every process writes its part of each checkpoint into one folder, which all of them must share, as a network file system is", dir, lockName, err)
	case !bytes.Equal(got, want):
		return fmt.Errorf("--checkpoint-dir %s is not the folder rank 0 writes (its %s is another run's: %s): every process writes its part of each checkpoint into one folder, which all of them must share, as a network file system is", dir, lockName, strings.TrimSpace(string(got)))
	}
	return nil
}

// cause is err, or, when the job was stopped by another process's
// failure, that failure: the error that explains the others.
func (j *job) cause(err error) error {
	if j.ctx.Err() == nil && errors.Is(err, dist.ErrDisconnected) {
		// Rank 0 closes the store as it exits: its report of why (the
		// abort watchAbort reads) may come a moment after the close this
		// call saw first. Waited for, briefly, so that every process
		// names the cause rather than the store it lost with it.
		select {
		case <-j.ctx.Done():
		case <-time.After(peerLostGrace):
		}
	}
	if j.ctx.Err() != nil {
		if c := context.Cause(j.ctx); c != nil && c != context.Canceled {
			return c
		}
	}
	if j.world.Rank != 0 && errors.Is(err, dist.ErrDisconnected) {
		// No report came: process 0, which hosts the store, is gone
		// without a word (killed outright, or its machine down).
		return fmt.Errorf("lost process 0 (rank 0), which hosts the job's rendezvous: it stopped without a report (killed outright, or its machine is down): %w", err)
	}
	return err
}

// stoppedBy is the error this process reports, own its failure (in a job
// of several processes, labelled with its rank): own; or what stopped the
// job first, when that was this process too (a signal to it); or, when it
// was another process's failure, that one, said to have stopped this
// process. A process that failed the same way on its own (every process
// of a job refused by the same check) reports its own.
func (j *job) stoppedBy(own error) error {
	cause := j.cause(own)
	if !j.multi() || cause == own || sameFailure(cause.Error(), own.Error()) {
		return own
	}
	if errors.Is(cause, own) {
		// own, headed by what explains it (process 0 lost with the store).
		return labelled(j.world.Rank, cause)
	}
	if r, _, ok := rankLabel(cause.Error()); ok && r == j.world.Rank {
		return cause
	}
	return fmt.Errorf("rank %d: stopped by another process's failure: %w", j.world.Rank, cause)
}

// labelled is err as process rank reports it: starting with its rank, so
// that in the output of a job, where every process prints its error,
// each line says which process printed it.
func labelled(rank int, err error) error {
	if r, _, ok := rankLabel(err.Error()); ok && r == rank {
		return err
	}
	return fmt.Errorf("rank %d: %w", rank, err)
}

// headline puts the peer a failure names first: in a job's output the
// process that was lost or fell silent is what to look at, not the step
// and op where this process noticed, nor the process that passed the
// news on (an abort carries the text of its cause). A lost process
// explains a silence, so it wins; of several, the innermost (last)
// mention is the cause. A label of this process's own rank moves in
// front of it (labelled puts it back).
func headline(rank int, err error) error {
	msg := err.Error()
	var head string
	if m := lostPeer.FindAllStringSubmatch(msg, -1); m != nil {
		head = "lost " + m[len(m)-1][1]
	} else if m := silentPeer.FindAllStringSubmatch(msg, -1); m != nil {
		head = "no answer from " + m[len(m)-1][1]
	} else {
		return err
	}
	if r, rest, ok := rankLabel(msg); ok && r == rank && rest != msg {
		msg = rest
	}
	if strings.HasPrefix(msg, head) {
		return err
	}
	return &headlined{msg: head + ": " + msg, err: err}
}

// lostPeer and silentPeer find the peer in runtime/comm's messages:
// "peer lost: process 2 (rank 2 at …)" and "timed out after 3s waiting
// for rank 2 (process 1 (ranks 2–3 at …))".
var (
	lostPeer   = regexp.MustCompile(`peer lost: (?:writing to )?(process \d+ \([^()]*\))`)
	silentPeer = regexp.MustCompile(`waiting for (rank \d+ \(process \d+ \([^()]*\)\))`)
)

// headlined is an error with its message rewritten (headline); errors.Is
// and As still see the original.
type headlined struct {
	msg string
	err error
}

func (h *headlined) Error() string { return h.msg }
func (h *headlined) Unwrap() error { return h.err }

// rankLabel reads the rank a message starts with ("rank 3: …" or
// "rank 3 was interrupted"); after a label with a colon, rest is the
// message that follows it, otherwise the whole message.
func rankLabel(msg string) (rank int, rest string, ok bool) {
	after, ok := strings.CutPrefix(msg, "rank ")
	if !ok {
		return 0, msg, false
	}
	end := strings.IndexFunc(after, func(r rune) bool { return r < '0' || r > '9' })
	if end <= 0 {
		return 0, msg, false
	}
	rank, err := strconv.Atoi(after[:end])
	if err != nil {
		return 0, msg, false
	}
	if rest, ok := strings.CutPrefix(after[end:], ": "); ok {
		return rank, rest, true
	}
	return rank, msg, strings.HasPrefix(after[end:], " ")
}

// sameFailure says whether two processes' messages report the same
// failure, each under its own process's label.
func sameFailure(a, b string) bool {
	_, a, _ = rankLabel(a)
	_, b, _ = rankLabel(b)
	return a == b
}

// connect builds the comm between every device of the job.
func (j *job) connect() (*comm.Net, error) {
	ctx, cancel := context.WithTimeout(j.ctx, j.timeout)
	defer cancel()
	bind, advertise, err := j.transportAddr(ctx)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", j.world.Rank, err)
	}
	n, err := comm.NewNet(ctx, comm.NetConfig{
		Layout: j.layout, Token: j.token, Bind: bind, Advertise: advertise, Timeout: j.timeout,
		Logf: func(f string, a ...any) { j.logf(f, a...) },
	}, j.store)
	if err != nil {
		return nil, fmt.Errorf("rank %d: connecting the job's devices: %w", j.world.Rank, err)
	}
	j.net = n
	return n, nil
}

// close ends the job: on success every process waits for the others at a
// final barrier, so that none closes its connections while another still
// needs them; process 0 keeps the store up until every other has left.
func (j *job) close() error {
	defer j.stop()
	if !j.multi() {
		j.cancel(errors.New("the job is over"))
		return nil
	}
	var errs []error
	if j.ctx.Err() == nil && j.store != nil {
		ctx, cancel := context.WithTimeout(j.ctx, j.timeout)
		if err := j.store.Barrier(ctx, "job/exit", j.world.Size); err != nil {
			// Another process's failure ends the wait: that is the cause.
			errs = append(errs, j.stoppedBy(fmt.Errorf("rank %d: waiting for the other processes to finish: %w", j.world.Rank, err)))
		}
		cancel()
	} else if j.store != nil && j.started.Load() && !j.hasFailed() {
		// This process finished its work, but another failed (after
		// training: its --save, --metrics) before this one reached the
		// barrier: the job failed, and this process says why.
		errs = append(errs, j.stoppedBy(fmt.Errorf("rank %d: the job failed after this process finished", j.world.Rank)))
	}
	if j.net != nil {
		j.net.Close()
	}
	if j.store != nil {
		j.store.Close()
	}
	if j.server != nil {
		// After a failure the others still read why from the store; a
		// stalled process may never leave, so that wait is short.
		drain := 10 * time.Second
		if len(errs) > 0 || j.ctx.Err() != nil {
			drain = 2 * time.Second
		}
		if j.started.Load() {
			// Before the start the others wait for rank 0's word, which
			// the shutdown below is: nothing to drain.
			ctx, cancel := context.WithTimeout(context.Background(), drain)
			j.server.WaitDrained(ctx, j.world.Size)
			cancel()
		}
		if cause := context.Cause(j.ctx); j.ctx.Err() != nil && cause != nil {
			j.server.Shutdown(cause.Error())
		} else {
			j.server.Close()
		}
	}
	j.cancel(errors.New("the job is over"))
	if j.closer != nil {
		j.closer.Close()
	}
	return errors.Join(errs...)
}

// prefixWriter starts every line it writes with prefix.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	mid    bool // inside a line
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []byte
	for _, c := range b {
		if !p.mid {
			out = append(out, p.prefix...)
		}
		out = append(out, c)
		p.mid = c != '\n' && c != '\r'
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// transportAddr is where this process's transport listens (bind) and the
// address the others dial it at (advertise; "" means bind's):
//
//   - --advertise-addr (or GCOMPILE_ADVERTISE_ADDR), both;
//   - otherwise this machine's address on its route to the master, both:
//     where the master reaches it, and only there;
//   - on the master's machine, whose route to the master is loopback: for
//     a job on one machine, loopback as the store's; for a job across
//     machines, the address the other machines reached the rendezvous at
//     (Server.ReachedAt), since a hosts file that maps the machine's own
//     name to 127.0.1.1 (Debian's and Ubuntu's default) makes the route
//     loopback while the others reach it on its real address.
//
// A loopback address in a job across machines is refused, saying what to
// set: the others could never connect.
func (j *job) transportAddr(ctx context.Context) (bind, advertise string, err error) {
	w := j.world
	spans := w.LocalSize < w.Size
	loopbackErr := func(addr, why string) error {
		return fmt.Errorf("this process's transport address would be %s, a loopback address (%s), but the job spans machines (LOCAL_WORLD_SIZE %d < WORLD_SIZE %d), whose processes cannot reach it: set --advertise-addr (or GCOMPILE_ADVERTISE_ADDR) to this machine's address on the job's network, or map the master's name (%s) to that address, not to 127.0.1.1, in /etc/hosts", addr, why, w.LocalSize, w.Size, w.MasterAddr)
	}
	if a := j.advertise; a != "" {
		if spans && isLoopbackHost(a) {
			return "", "", loopbackErr(a, "from --advertise-addr or GCOMPILE_ADVERTISE_ADDR")
		}
		return a, a, nil
	}
	out := outboundHost(w.MasterHostPort())
	if out != "" && !isLoopbackHost(out) {
		return out, out, nil
	}
	if !spans || out == "" {
		// One machine, or no route found: the store's choice, which the
		// others reach, as before.
		bind = dist.BindHost(w.MasterAddr)
		if bind == "0.0.0.0" {
			return bind, out, nil
		}
		return bind, "", nil
	}
	// This process is on the master's machine, in a job across machines.
	v, err := j.store.Get(ctx, keyReachedAt)
	if err != nil {
		return "", "", fmt.Errorf("reading the master's address: %w", err)
	}
	if len(v) == 0 {
		return "", "", loopbackErr(out, "the route to the master "+w.MasterAddr+" is loopback, and no process of another machine reached the rendezvous")
	}
	return string(v), string(v), nil
}

// isLoopbackHost reports whether host is a loopback address or localhost.
func isLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(host, "localhost")
}

// outboundHost is this machine's address on the route to addr: the one
// other machines of the job can reach it at.
func outboundHost(addr string) string {
	c, err := net.Dial("udp", addr) // sends nothing: only picks the route
	if err != nil {
		return ""
	}
	defer c.Close()
	host, _, _ := net.SplitHostPort(c.LocalAddr().String())
	return host
}
