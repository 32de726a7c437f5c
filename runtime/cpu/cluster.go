package cpu

import (
	"errors"
	"fmt"

	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/comm"
)

// Cluster runs one SPMD program (or one per pipeline rank) on the devices
// of its mesh that this process holds, one goroutine per device. They
// reach each other, and the devices of other processes, through a
// runtime.Comm: an in-process one when the cluster holds every device.
// It implements the training loop's Device interface: inputs are given
// whole and split by their placement, outputs are read from the first
// device that has them (they are replicated). What it does as the CUDA
// cluster does is its MeshCluster's.
type Cluster struct {
	runtime.MeshCluster[*Device]
	opts Options
	Comm runtime.Comm
}

// SetEvalPrograms gives the cluster forward-only programs (one per
// pipeline rank) for Forward. Before each evaluation the current params
// and inputs are copied into them.
func (c *Cluster) SetEvalPrograms(progs []*lower.Program) error {
	var e *Cluster
	var err error
	if job := c.Job(); job != nil {
		// The evaluation runs between steps, in the same order on every
		// process, so it shares the job's comm with the training programs.
		e, err = NewJobCluster(progs, c.opts, job)
	} else {
		e, err = NewPipelineCluster(progs, c.opts)
	}
	if err != nil {
		return fmt.Errorf("evaluation programs: %w", err)
	}
	c.EvaluateWith(&e.MeshCluster)
	return nil
}

// NewCluster loads prog on every device of its mesh (one device when the
// program has no mesh).
func NewCluster(prog *lower.Program, opts Options) (*Cluster, error) {
	return NewPipelineCluster([]*lower.Program{prog}, opts)
}

// NewPipelineCluster loads one program per pipeline rank (progs[r] on the
// devices whose pp coordinate is r) over the programs' shared mesh, every
// device in this process, connected by an in-process comm.
func NewPipelineCluster(progs []*lower.Program, opts Options) (*Cluster, error) {
	n, err := lower.MeshDevices(progs)
	if err != nil {
		return nil, err
	}
	var cm runtime.Comm
	if n > 1 || progs[0].Mesh != nil {
		cm = comm.NewLocal(n)
	}
	return load(progs, opts, cm, nil, runtime.SingleProcess(n).Local())
}

// NewJobCluster loads this process's part of a job: the devices of
// job.Layout.Local(), each running its pipeline rank's program of progs,
// connected to every device of the job by job.Comm.
func NewJobCluster(progs []*lower.Program, opts Options, job *runtime.Job) (*Cluster, error) {
	return load(progs, opts, job.Comm, job, job.Layout.Local())
}

func load(progs []*lower.Program, opts Options, cm runtime.Comm, job *runtime.Job, ranks []int) (*Cluster, error) {
	c := &Cluster{opts: opts, Comm: cm}
	c.MeshCluster = runtime.NewMeshCluster[*Device](c.abort, aborted)
	if job != nil {
		if err := c.SpanJob(job, progs); err != nil {
			return nil, err
		}
	}
	mine := make([]*lower.Program, len(ranks))
	names := make([]string, len(ranks))
	for i, r := range ranks {
		mine[i], names[i] = lower.ProgramOf(progs, r), deviceName(r)
	}
	// The devices share the machine's memory: all their arenas must fit
	// together, which is known before the first is allocated.
	if err := checkMemory(mine, names, opts); err != nil {
		return nil, err
	}
	for i, r := range ranks {
		o := opts
		o.Rank, o.Comm = r, cm
		d, err := loadChecked(mine[i], o)
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", r, err)
		}
		c.Devices = append(c.Devices, d)
		c.Ranks = append(c.Ranks, r)
	}
	return c, nil
}

// abort stops the devices waiting in a collective or a pipeline receive.
func (c *Cluster) abort(err error) {
	if c.Comm != nil {
		c.Comm.Abort(err)
	}
}

// aborted says whether err is a device giving up because another failed.
func aborted(err error) bool { return errors.Is(err, runtime.ErrAborted) }
