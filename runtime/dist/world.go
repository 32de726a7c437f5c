package dist

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
)

// Launcher names as World.Launcher reports them.
const (
	LauncherTorchrun = "torchrun"
	LauncherMPI      = "mpi"
	LauncherSlurm    = "slurm"
)

// DefaultMasterPort is the rendezvous port used when neither the
// environment nor the launcher's job id gives one; it is torch's default,
// so a job mixing gcompile and torch conventions agrees on it.
const DefaultMasterPort = 29500

// loopback is where a single process, or a job that lives on one node,
// meets itself.
const loopback = "127.0.0.1"

// World is where this process sits in a job.
type World struct {
	Rank, Size           int    // this process's global rank, number of processes
	LocalRank, LocalSize int    // on this node
	MasterAddr           string // host of rank 0 (rendezvous)
	MasterPort           int
	Launcher             string // "torchrun", "mpi", "slurm", or "" when no launcher variables were found (a single process)
	AgentStore           bool   // torchrun's agent already hosts torch's TCPStore at MasterAddr:MasterPort (TORCHELASTIC_USE_AGENT_STORE=True)
	JobID                string // the launcher's identity of the job (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, OMPI job id, …), "" if none
}

// MaxSize is the most processes a job has: one a device at most, and
// compile.MaxDevices devices.
const MaxSize = 1 << 20

// Validate checks that the fields describe a place in a job: 0 ≤ Rank <
// Size, 0 ≤ LocalRank < LocalSize ≤ Size, and, when there is more than one
// process (so a rendezvous is needed), a master address and a port in
// 1..65535.
func (w World) Validate() error {
	switch {
	case w.Size < 1:
		return fmt.Errorf("world size %d: must be at least 1", w.Size)
	case w.Size > MaxSize:
		// A process holds at least one device: the rendezvous would wait
		// for, and keep a slot for, processes that can never be.
		return fmt.Errorf("world size %d: a job has at most %d processes, one a device at most", w.Size, MaxSize)
	case w.Rank < 0 || w.Rank >= w.Size:
		return fmt.Errorf("rank %d is not in [0, %d)", w.Rank, w.Size)
	case w.LocalSize < 1 || w.LocalSize > w.Size:
		return fmt.Errorf("local size %d is not in [1, %d] (world size %d)", w.LocalSize, w.Size, w.Size)
	case w.LocalRank < 0 || w.LocalRank >= w.LocalSize:
		return fmt.Errorf("local rank %d is not in [0, %d)", w.LocalRank, w.LocalSize)
	}
	if w.Size > 1 {
		if w.MasterAddr == "" {
			return fmt.Errorf("master address is empty; %d processes need one to meet", w.Size)
		}
		if w.MasterPort < 1 || w.MasterPort > 65535 {
			return fmt.Errorf("master port %d is not in 1..65535", w.MasterPort)
		}
	}
	return nil
}

// String describes the world in one line for logs, e.g. "rank 1 of 4
// (local 1 of 2) via torchrun, master 10.0.0.1:29500".
func (w World) String() string {
	via := "via " + w.Launcher
	if w.Launcher == "" {
		via = "without a launcher"
	}
	return fmt.Sprintf("rank %d of %d (local %d of %d) %s, master %s",
		w.Rank, w.Size, w.LocalRank, w.LocalSize, via, w.MasterHostPort())
}

// MasterHostPort is MasterAddr:MasterPort in the form net.Dial takes
// (IPv6 addresses bracketed).
func (w World) MasterHostPort() string {
	return net.JoinHostPort(w.MasterAddr, strconv.Itoa(w.MasterPort))
}

// StorePort is the first port at which to look for (ServeNear, DialNear)
// the job's store: MasterPort, or, when torchrun's agent already hosts
// torch's own store there, the port after it (before it at 65535).
func (w World) StorePort() int {
	if !w.AgentStore {
		return w.MasterPort
	}
	if w.MasterPort >= 65535 {
		return w.MasterPort - 1
	}
	return w.MasterPort + 1
}

// FromEnv finds this process's place in its job from the launcher's
// environment variables, read through getenv (os.Getenv in production; an
// empty value counts as unset). Launchers are tried in the order torchrun,
// Open MPI, SLURM: torchrun started inside a SLURM allocation leaves both
// sets of variables, and then torchrun's describe the process. With none
// of them the process is alone: rank 0 of 1. Every malformed value is an
// error naming the variable and the value, and the result is validated.
func FromEnv(getenv func(string) string) (World, error) {
	e := env{getenv: getenv}
	var (
		w   World
		err error
	)
	switch {
	case e.has("RANK") || e.has("WORLD_SIZE"):
		w, err = e.torchrun()
	case e.has("OMPI_COMM_WORLD_RANK") && e.has("OMPI_COMM_WORLD_SIZE"):
		w, err = e.mpi()
	case e.has("SLURM_PROCID") && e.has("SLURM_NTASKS"):
		w, err = e.slurm()
	case e.has("OMPI_COMM_WORLD_RANK") || e.has("OMPI_COMM_WORLD_SIZE"):
		err = e.half("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun")
	case e.get("SLURM_PROCID") != "" && e.get("SLURM_PROCID") != "0":
		// A batch script's own shell has SLURM_PROCID 0 and, without
		// --ntasks, no SLURM_NTASKS, and salloc's shell SLURM_NTASKS
		// alone: such a process is alone. A task of rank 1 or more is
		// srun's, which sets both.
		err = e.half("SLURM_PROCID", "SLURM_NTASKS", "srun")
	default:
		w, err = e.single()
	}
	if err != nil {
		return World{}, err
	}
	if err := w.Validate(); err != nil {
		return World{}, fmt.Errorf("launcher %q: %w", w.Launcher, err)
	}
	return w, nil
}

// env reads launcher variables and phrases every complaint about one the
// same way: the variable, its value, the rule.
type env struct{ getenv func(string) string }

func (e env) get(name string) string { return e.getenv(name) }

func (e env) has(name string) bool { return e.getenv(name) != "" }

// int reads a required integer no smaller than min.
func (e env) int(name string, min int) (int, error) {
	v := e.get(name)
	if v == "" {
		return 0, fmt.Errorf("%s is not set", name)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: not an integer", name, v)
	}
	if n < min {
		return 0, fmt.Errorf("%s=%d: must be at least %d", name, n, min)
	}
	return n, nil
}

// intOr reads an optional integer, def when unset.
func (e env) intOr(name string, min, def int) (int, error) {
	if !e.has(name) {
		return def, nil
	}
	return e.int(name, min)
}

// port reads an optional port, def when unset.
func (e env) port(name string, def int) (int, error) {
	p, err := e.intOr(name, 1, def)
	if err != nil {
		return 0, err
	}
	if p > 65535 {
		return 0, fmt.Errorf("%s=%d: not a port (1..65535)", name, p)
	}
	return p, nil
}

// below checks the rank-like variable lo against the size-like hi.
func below(loName string, lo int, hiName string, hi int) error {
	if lo >= hi {
		return fmt.Errorf("%s %d is not below %s %d", loName, lo, hiName, hi)
	}
	return nil
}

func (e env) torchrun() (World, error) {
	w := World{Launcher: LauncherTorchrun}
	// One of the pair alone is a hand-made launch gone wrong; running as
	// a lone process would leave the others waiting for it forever.
	for _, pair := range [][2]string{{"RANK", "WORLD_SIZE"}, {"WORLD_SIZE", "RANK"}} {
		if e.has(pair[0]) && !e.has(pair[1]) {
			return World{}, fmt.Errorf("%s=%q is set but %s is not: torchrun sets both", pair[0], e.get(pair[0]), pair[1])
		}
	}
	var err error
	if w.Size, err = e.int("WORLD_SIZE", 1); err != nil {
		return World{}, err
	}
	if w.Rank, err = e.int("RANK", 0); err != nil {
		return World{}, err
	}
	if err := below("RANK", w.Rank, "WORLD_SIZE", w.Size); err != nil {
		return World{}, err
	}
	if w.LocalSize, err = e.intOr("LOCAL_WORLD_SIZE", 1, w.Size); err != nil {
		return World{}, err
	}
	if w.LocalRank, err = e.intOr("LOCAL_RANK", 0, w.Rank); err != nil {
		return World{}, err
	}
	if e.has("LOCAL_WORLD_SIZE") && e.has("LOCAL_RANK") {
		if err := below("LOCAL_RANK", w.LocalRank, "LOCAL_WORLD_SIZE", w.LocalSize); err != nil {
			return World{}, err
		}
	}
	if w.MasterAddr, w.MasterPort, err = e.master(w.Size, loopback, "torchrun sets it"); err != nil {
		return World{}, err
	}
	if v := e.get("TORCHELASTIC_USE_AGENT_STORE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return World{}, fmt.Errorf("TORCHELASTIC_USE_AGENT_STORE=%q: not True or False", v)
		}
		w.AgentStore = b
	}
	w.JobID = e.get("TORCHELASTIC_RUN_ID")
	if w.JobID == "" {
		// torchrun inside a SLURM step: the step still names the job.
		w.JobID = e.slurmJobID()
	}
	return w, nil
}

// master reads MASTER_ADDR and MASTER_PORT. When more than one process
// must meet, the address is required; a lone process meets at def.
func (e env) master(size int, def, hint string) (string, int, error) {
	addr := e.get("MASTER_ADDR")
	if addr == "" {
		if size > 1 {
			return "", 0, fmt.Errorf("MASTER_ADDR is not set (%s); %d processes need it to meet", hint, size)
		}
		addr = def
	}
	port, err := e.port("MASTER_PORT", DefaultMasterPort)
	if err != nil {
		return "", 0, err
	}
	return addr, port, nil
}

func (e env) mpi() (World, error) {
	w := World{Launcher: LauncherMPI}
	var err error
	if w.Size, err = e.int("OMPI_COMM_WORLD_SIZE", 1); err != nil {
		return World{}, err
	}
	if w.Rank, err = e.int("OMPI_COMM_WORLD_RANK", 0); err != nil {
		return World{}, err
	}
	if err := below("OMPI_COMM_WORLD_RANK", w.Rank, "OMPI_COMM_WORLD_SIZE", w.Size); err != nil {
		return World{}, err
	}
	// mpirun always sets the local pair; without it the process cannot
	// tell which GPU is its own, so guessing would be worse than failing.
	if w.LocalSize, err = e.int("OMPI_COMM_WORLD_LOCAL_SIZE", 1); err != nil {
		return World{}, err
	}
	if w.LocalRank, err = e.int("OMPI_COMM_WORLD_LOCAL_RANK", 0); err != nil {
		return World{}, err
	}
	if err := below("OMPI_COMM_WORLD_LOCAL_RANK", w.LocalRank, "OMPI_COMM_WORLD_LOCAL_SIZE", w.LocalSize); err != nil {
		return World{}, err
	}
	// Open MPI 4 names the job in an MCA variable; Open MPI 5 runs on PMIx,
	// whose namespace is the job's name.
	w.JobID = e.get("OMPI_MCA_ess_base_jobid")
	if w.JobID == "" {
		w.JobID = e.get("PMIX_NAMESPACE")
	}
	// MPI publishes no rendezvous address. When every process is on this
	// node, loopback is right; otherwise only the user knows rank 0's host.
	w.MasterAddr = e.get("MASTER_ADDR")
	if w.MasterAddr == "" {
		if w.LocalSize != w.Size {
			return World{}, fmt.Errorf("no master address: the %d processes span several nodes (%d on this one) and Open MPI names no rendezvous host; set MASTER_ADDR (or pass --master-addr) to rank 0's host", w.Size, w.LocalSize)
		}
		w.MasterAddr = loopback
	}
	def := DefaultMasterPort
	if w.JobID != "" {
		def = derivedPort(w.JobID)
	}
	if w.MasterPort, err = e.port("MASTER_PORT", def); err != nil {
		return World{}, err
	}
	return w, nil
}

// derivedPort spreads jobs over 20000–39999 so that two mpirun jobs
// sharing a first node rarely start at the same port; ServeNear and
// DialNear absorb the collisions that remain.
func derivedPort(jobID string) int {
	h := fnv.New32a()
	h.Write([]byte(jobID))
	return 20000 + int(h.Sum32()%20000)
}

func (e env) slurm() (World, error) {
	w := World{Launcher: LauncherSlurm}
	var err error
	if w.Size, err = e.int("SLURM_NTASKS", 1); err != nil {
		return World{}, err
	}
	if w.Rank, err = e.int("SLURM_PROCID", 0); err != nil {
		return World{}, err
	}
	if err := below("SLURM_PROCID", w.Rank, "SLURM_NTASKS", w.Size); err != nil {
		return World{}, err
	}
	if w.LocalSize, err = e.slurmLocalSize(w.Size); err != nil {
		return World{}, err
	}
	if w.Size == 1 && !e.has("SLURM_LOCALID") {
		w.LocalRank = 0
	} else if w.LocalRank, err = e.int("SLURM_LOCALID", 0); err != nil {
		return World{}, err
	}
	if w.LocalRank >= w.LocalSize {
		return World{}, fmt.Errorf("SLURM_LOCALID %d is not below this node's task count %d", w.LocalRank, w.LocalSize)
	}
	w.JobID = e.slurmJobID()

	w.MasterAddr = e.get("MASTER_ADDR")
	if w.MasterAddr == "" {
		// Slurm sorts a step's nodes and, with its default block
		// distribution, places task 0 on the first of them.
		for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
			if v := e.get(name); v != "" {
				if w.MasterAddr, err = firstHost(v); err != nil {
					return World{}, fmt.Errorf("%s %w", name, err)
				}
				break
			}
		}
	}
	if w.MasterAddr == "" {
		if w.Size > 1 {
			return World{}, errors.New("none of MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set: no host to meet at")
		}
		w.MasterAddr = loopback
	}
	def := DefaultMasterPort
	if v := e.get("SLURM_JOB_ID"); v != "" {
		id, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return World{}, fmt.Errorf("SLURM_JOB_ID=%q: not a job number", v)
		}
		def = 10000 + int(id%20000)
	}
	if w.MasterPort, err = e.port("MASTER_PORT", def); err != nil {
		return World{}, err
	}
	return w, nil
}

// slurmJobID names the job step: concurrent steps of one job are
// different rendezvous.
func (e env) slurmJobID() string {
	id := e.get("SLURM_JOB_ID")
	if id != "" && e.has("SLURM_STEP_ID") {
		id += "." + e.get("SLURM_STEP_ID")
	}
	return id
}

// slurmLocalSize is the number of tasks on this node. The step's own
// layout comes first: an srun step inside a larger allocation inherits the
// allocation's per-node counts, which would overstate it.
func (e env) slurmLocalSize(size int) (int, error) {
	if v := e.get("SLURM_STEP_TASKS_PER_NODE"); v != "" {
		return e.tasksOnThisNode("SLURM_STEP_TASKS_PER_NODE", v)
	}
	if e.has("SLURM_NTASKS_PER_NODE") {
		n, err := e.int("SLURM_NTASKS_PER_NODE", 1)
		if err != nil {
			return 0, err
		}
		// --ntasks-per-node is a maximum; the last node may hold fewer.
		return min(n, size), nil
	}
	if v := e.get("SLURM_TASKS_PER_NODE"); v != "" {
		return e.tasksOnThisNode("SLURM_TASKS_PER_NODE", v)
	}
	if size == 1 {
		return 1, nil
	}
	return 0, errors.New("none of SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE is set: cannot tell how many tasks share this node")
}

// tasksOnThisNode picks this node's entry, by SLURM_NODEID, of a
// tasks-per-node list in Slurm's compressed form.
func (e env) tasksOnThisNode(name, v string) (int, error) {
	counts, err := parseTasksPerNode(v)
	if err != nil {
		return 0, fmt.Errorf("%s %w", name, err)
	}
	if len(counts) == 1 && counts[0].repeat == 1 {
		// A plain number applies to every node: SLURM_NODEID is moot.
		return counts[0].tasks, nil
	}
	if !e.has("SLURM_NODEID") {
		return 0, fmt.Errorf("%s=%q lists several nodes but SLURM_NODEID is not set to pick this one", name, v)
	}
	node, err := e.int("SLURM_NODEID", 0)
	if err != nil {
		return 0, err
	}
	rest := node
	for _, c := range counts {
		if rest < c.repeat {
			return c.tasks, nil
		}
		rest -= c.repeat
	}
	return 0, fmt.Errorf("SLURM_NODEID %d is not below the %d nodes of %s=%q", node, node-rest, name, v)
}

// single is a process started without a launcher: alone, meeting itself
// on loopback.
// half is the error of a launcher's pair of variables of which one is
// set: a process that took itself for alone would train as rank 0 of a
// job of one, beside the job it belongs to.
func (e env) half(rank, size, launcher string) error {
	set, unset := rank, size
	if !e.has(rank) {
		set, unset = size, rank
	}
	return fmt.Errorf("%s=%q is set but %s is not: %s sets both", set, e.get(set), unset, launcher)
}

func (e env) single() (World, error) {
	port, err := e.port("MASTER_PORT", DefaultMasterPort)
	if err != nil {
		return World{}, err
	}
	return World{Size: 1, LocalSize: 1, MasterAddr: loopback, MasterPort: port}, nil
}

// DefaultToken is the job token every rendezvous connection must present.
// GCOMPILE_TOKEN, when set, is used as it is and is secret (true): only
// processes given it can join. Otherwise the token is derived (sha256, 32
// hex digits) from the launcher's identity of the job and the master
// address, which every process of the job knows and nobody else needs to
// guess: it stops a process of another job (a stale run, a neighbour that
// picked the same port) from joining by mistake. It is not secret (false)
// and does not stop an attacker on the network.
func DefaultToken(w World, getenv func(string) string) (token string, secret bool) {
	if t := getenv("GCOMPILE_TOKEN"); t != "" {
		return t, true
	}
	h := sha256.New()
	// Separators keep ("ab","c") and ("a","bc") from meeting.
	for _, part := range []string{"gcompile rendezvous v1", w.Launcher, w.JobID, w.MasterHostPort()} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32], false
}

// JobIdentity is a public name of the job: a hash of what every process
// of the job knows (the launcher, its job id when it gives one, and the
// master address), which names no secret (the derived token comes from
// the same facts). The store's handshake says it, so a process of the job
// that was given another token learns that it reached its own job's
// store, not another job's. Without a launcher's job id (World.JobID) two
// jobs that share a master address and port share it too.
func JobIdentity(w World) string {
	h := sha256.New()
	for _, part := range []string{"gcompile job v2", w.Launcher, w.JobID, w.MasterHostPort()} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
