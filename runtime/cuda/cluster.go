package cuda

import (
	"errors"
	"fmt"

	"gcompile/lower"
	"gcompile/runtime"
)

// Both drive the training loop.
var (
	_ runtime.Device = (*Device)(nil)
	_ runtime.Device = (*Cluster)(nil)
)

// Cluster runs one SPMD program (or one program per pipeline rank) on
// every device of its mesh, one goroutine per device, as cpu.Cluster does
// and with the same methods, so the training loop and the CLI drive
// either. Devices are virtual devices sharing one GPU (NewCluster,
// NewPipelineCluster), connected by device-to-device copies, or one
// device per GPU connected by NCCL (NewNCCLCluster). Inputs are given
// whole and split by their placement; outputs are read from the first
// device that has them (they are replicated). All of that is its
// MeshCluster's, shared with the CPU backend.
type Cluster struct {
	runtime.MeshCluster[*Device]
	rts   []*Runtime // by rank; virtual devices share one
	progs []*lower.Program
	opts  Options
	nccl  bool
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
	return newCluster(rts, progs, opts, newFabric(), false)
}

// NewNCCLCluster places rank r on rts[r] (one GPU each) and connects the
// ranks with NCCL communicators, one per group of devices a collective
// spans, all created in this process.
func NewNCCLCluster(rts []*Runtime, progs []*lower.Program, opts Options) (*Cluster, error) {
	n, err := meshDevices(progs)
	if err != nil {
		return nil, err
	}
	if len(rts) != n {
		return nil, fmt.Errorf("the mesh has %d devices; NCCL runs one per GPU and %d GPUs were given", n, len(rts))
	}
	cm, err := newNCCLComm(rts, progs)
	if err != nil {
		return nil, err
	}
	c, err := newCluster(rts, progs, opts, cm, true)
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

func newCluster(rts []*Runtime, progs []*lower.Program, opts Options, cm comm, viaNCCL bool) (*Cluster, error) {
	c := &Cluster{rts: rts, progs: progs, opts: opts, nccl: viaNCCL}
	if progs[0].Mesh != nil {
		c.comm = cm
	}
	c.MeshCluster = runtime.NewMeshCluster[*Device](c.abort, func(err error) bool { return errors.Is(err, ErrAborted) })
	for r := range rts {
		d, err := load(rts[r], programOf(progs, r), opts, r, c.comm)
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
	if c.nccl {
		e, err = NewNCCLCluster(c.rts, progs, c.opts)
	} else {
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
