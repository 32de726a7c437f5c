package cuda

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cuda/nccl"
)

// Both drive the training loop.
var (
	_ runtime.Device = (*Device)(nil)
	_ runtime.Device = (*Cluster)(nil)
)

// Cluster runs one SPMD program (or one program per pipeline rank) on
// the devices of its mesh this process holds, one goroutine per device,
// as cpu.Cluster does and with the same methods, so the training loop and
// the CLI drive either. Devices are virtual devices sharing one GPU
// (NewCluster, NewPipelineCluster), connected by device-to-device copies,
// or one device per GPU connected by NCCL, all in this process
// (NewNCCLCluster) or spread over the processes of a job
// (NewNCCLJobCluster). Inputs are given whole and split by their
// placement; outputs are read from the first device that has them (they
// are replicated). All of that is its MeshCluster's, shared with the CPU
// backend.
type Cluster struct {
	runtime.MeshCluster[*Device]
	rts   []*Runtime // by local device; virtual devices share one
	progs []*lower.Program
	opts  Options
	nccl  *NCCLJob // how the communicators were made; nil for virtual devices
	comm  comm
	// eval is the cluster of forward-only programs its MeshCluster
	// evaluates with, kept here to be closed.
	eval *Cluster
}

// NewCluster loads prog on every device of its mesh (one device when the
// program has no mesh), all of them virtual devices on rt's GPU.
func NewCluster(rt *Runtime, prog *lower.Program, opts Options) (*Cluster, error) {
	return NewPipelineCluster(rt, []*lower.Program{prog}, opts)
}

// NewPipelineCluster loads one program per pipeline rank (progs[r] on the
// devices whose pp coordinate is r) as virtual devices on rt's GPU.
func NewPipelineCluster(rt *Runtime, progs []*lower.Program, opts Options) (*Cluster, error) {
	n, err := meshDevices(progs)
	if err != nil {
		return nil, err
	}
	rts := make([]*Runtime, n)
	for i := range rts {
		rts[i] = rt
	}
	return newCluster(rts, runtime.SingleProcess(n).Local(), progs, opts, newFabric(), nil, nil)
}

// NewNCCLCluster places rank r on rts[r] (one GPU each) and connects the
// ranks with NCCL communicators, all created in this process.
func NewNCCLCluster(rts []*Runtime, progs []*lower.Program, opts Options) (*Cluster, error) {
	n, err := meshDevices(progs)
	if err != nil {
		return nil, err
	}
	if len(rts) != n {
		return nil, fmt.Errorf("the mesh has %d devices; NCCL runs one per GPU and %d GPUs were given", n, len(rts))
	}
	return newNCCLCluster(rts, progs, opts, &NCCLJob{}, localIDs)
}

// NCCLJob is what a process of a job needs to share NCCL communicators
// with the others: the job (where every device lives, and the comm the
// host's exchanges use) and the directory communicator ids are handed out
// through. Prefix keeps apart the ids of several clusters of one job (the
// training and the evaluation programs).
type NCCLJob struct {
	Job     *runtime.Job
	Dir     runtime.Directory
	Prefix  string
	Timeout time.Duration // how long to wait for another process's id (0: runtime.DefaultTimeout)
}

// NewNCCLJobCluster loads this process's devices of a job, the ranks of
// job.Job.Layout.Local() in order on rts (one GPU each), and connects them
// with NCCL to every device of the job, in this process or another.
// Every process of the job calls it with the same programs.
func NewNCCLJobCluster(rts []*Runtime, progs []*lower.Program, opts Options, job NCCLJob) (*Cluster, error) {
	if job.Job == nil || job.Dir == nil {
		return nil, errors.New("an NCCL job cluster needs the job and its directory")
	}
	l := job.Job.Layout
	if len(rts) != l.PerProc() {
		return nil, fmt.Errorf("this process holds %d devices; NCCL runs one per GPU and %d GPUs were given", l.PerProc(), len(rts))
	}
	timeout := job.Timeout
	if timeout <= 0 {
		timeout = runtime.DefaultTimeout
	}
	ids := func(key string, creator bool, make func() (nccl.UniqueID, error)) (nccl.UniqueID, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		key = job.Prefix + "nccl/" + key
		if creator {
			id, err := make()
			if err != nil {
				return nccl.UniqueID{}, err
			}
			return id, job.Dir.Set(ctx, key, id.Bytes())
		}
		raw, err := job.Dir.Get(ctx, key)
		if err != nil {
			return nccl.UniqueID{}, err
		}
		return nccl.UniqueIDFromBytes(raw)
	}
	return newNCCLCluster(rts, progs, opts, &job, ids)
}

func newNCCLCluster(rts []*Runtime, progs []*lower.Program, opts Options, job *NCCLJob, ids idSource) (*Cluster, error) {
	ranks := runtime.SingleProcess(len(rts)).Local()
	if job.Job != nil {
		ranks = job.Job.Layout.Local()
	}
	local := map[int]*Runtime{}
	for i, r := range ranks {
		local[r] = rts[i]
	}
	cm, err := newNCCLComm(local, progs, ids)
	if err != nil {
		return nil, err
	}
	c, err := newCluster(rts, ranks, progs, opts, cm, job, job.Job)
	if err != nil {
		return nil, errors.Join(err, cm.close())
	}
	return c, nil
}

// Which devices a set of pipeline programs needs, and which program each
// runs, follow the CPU backend's rules; Plan uses them too.
var (
	meshDevices = lower.MeshDevices
	programOf   = lower.ProgramOf
)

// newCluster loads the devices of ranks, rank ranks[i] on rts[i].
func newCluster(rts []*Runtime, ranks []int, progs []*lower.Program, opts Options, cm comm, viaNCCL *NCCLJob, job *runtime.Job) (*Cluster, error) {
	c := &Cluster{rts: rts, progs: progs, opts: opts, nccl: viaNCCL}
	if progs[0].Mesh != nil {
		c.comm = cm
	}
	c.MeshCluster = runtime.NewMeshCluster[*Device](c.abort, func(err error) bool { return errors.Is(err, ErrAborted) })
	c.SetWatchdog(opts.Timeout)
	if job != nil {
		if err := c.SpanJob(job, progs); err != nil {
			return nil, err
		}
	}
	for i, r := range ranks {
		d, err := load(rts[i], programOf(progs, r), opts, r, c.comm)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("device %d: %w", r, err), c.Close())
		}
		c.Devices = append(c.Devices, d)
		c.Ranks = append(c.Ranks, r)
	}
	return c, nil
}

// Close frees every device (and the evaluation programs').
func (c *Cluster) Close() error {
	var errs []error
	if c.eval != nil {
		errs = append(errs, c.eval.Close())
		c.eval = nil
		c.EvaluateWith(nil)
	}
	for _, d := range c.Devices {
		errs = append(errs, d.Close())
	}
	c.Devices = nil
	if nc, ok := c.comm.(*ncclComm); ok {
		errs = append(errs, nc.close())
	}
	return errors.Join(errs...)
}

// Name is the GPU the cluster runs on (the first device's).
func (c *Cluster) Name() string {
	if len(c.rts) == 0 {
		return ""
	}
	return c.rts[0].Name()
}

// SetEvalPrograms gives the cluster forward-only programs (one per
// pipeline rank) for Forward. Before each evaluation the current params
// and inputs are copied into them.
func (c *Cluster) SetEvalPrograms(progs []*lower.Program) error {
	var e *Cluster
	var err error
	switch {
	case c.nccl != nil && c.nccl.Job != nil:
		job := *c.nccl
		job.Prefix += "eval/"
		e, err = NewNCCLJobCluster(c.rts, progs, c.opts, job)
	case c.nccl != nil:
		e, err = NewNCCLCluster(c.rts, progs, c.opts)
	default:
		e, err = NewPipelineCluster(c.rts[0], progs, c.opts)
	}
	if err != nil {
		return fmt.Errorf("evaluation programs: %w", err)
	}
	if c.eval != nil {
		err = c.eval.Close()
	}
	c.eval = e
	c.EvaluateWith(&e.MeshCluster)
	return err
}

// abort stops the devices waiting in a collective or a receive.
func (c *Cluster) abort(err error) {
	if c.comm != nil {
		c.comm.abort(err)
	}
}
