package cpu

import (
	"errors"
	"fmt"
	"strings"

	"gcompile/lower"
)

// Cluster runs one SPMD program on every device of its mesh, one goroutine
// per device, connected by an in-process Comm. It implements the training
// loop's Device interface: inputs are given whole and split by their
// placement, outputs are read from the first device that has them (they
// are replicated). What it does as the CUDA cluster does is its
// MeshCluster's.
type Cluster struct {
	MeshCluster[*Device]
	prog *lower.Program
	Comm *Comm
	Mail *Mailbox
}

// SetEvalPrograms gives the cluster forward-only programs (one per
// pipeline rank) for Forward. Before each evaluation the current params
// and inputs are copied into them.
func (c *Cluster) SetEvalPrograms(progs []*lower.Program) error {
	e, err := NewPipelineCluster(progs, Options{})
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
// devices whose pp coordinate is r) over the programs' shared mesh.
func NewPipelineCluster(progs []*lower.Program, opts Options) (*Cluster, error) {
	n, err := MeshDevices(progs)
	if err != nil {
		return nil, err
	}
	c := &Cluster{prog: progs[0], Mail: NewMailbox()}
	if progs[0].Mesh != nil {
		c.Comm = NewComm(n)
	}
	c.MeshCluster = NewMeshCluster[*Device](c.abort, aborted)
	for r := range n {
		o := opts
		o.Rank, o.Comm, o.Mail = r, c.Comm, c.Mail
		d, err := Load(ProgramOf(progs, r), o)
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", r, err)
		}
		c.Devices = append(c.Devices, d)
	}
	return c, nil
}

// abort stops the devices waiting in a collective or a pipeline receive.
func (c *Cluster) abort(err error) {
	if c.Comm != nil {
		c.Comm.Abort(err)
	}
	c.Mail.Abort(err)
}

// aborted says whether err is a device giving up because another failed.
func aborted(err error) bool {
	return errors.Is(err, ErrAborted) || strings.Contains(err.Error(), "pipeline aborted")
}
