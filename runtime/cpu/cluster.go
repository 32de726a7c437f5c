package cpu

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"gcompile/ir"
	"gcompile/lower"
)

// Cluster runs one SPMD program on every device of its mesh, one goroutine
// per device, connected by an in-process Comm. It implements the training
// loop's Device interface: inputs are given whole and split by their
// placement, outputs are read from rank 0 (they are replicated).
type Cluster struct {
	prog    *lower.Program
	Devices []*Device
	Comm    *Comm
	Mail    *Mailbox
	// eval runs forward-only programs when the training programs have no
	// forward-only prefix (pipelines); evaluated says Scalar reads it.
	eval      *Cluster
	evaluated bool
}

// SetEvalPrograms gives the cluster forward-only programs (one per
// pipeline rank) for Forward. Before each evaluation the current params
// and inputs are copied into them.
func (c *Cluster) SetEvalPrograms(progs []*lower.Program) error {
	e, err := NewPipelineCluster(progs, Options{})
	if err != nil {
		return fmt.Errorf("evaluation programs: %w", err)
	}
	c.eval = e
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
	mesh := progs[0].Mesh
	n, ppAxis := 1, -1
	if mesh != nil {
		n, ppAxis = mesh.Devices(), mesh.Axis("pp")
	}
	if ppAxis < 0 && len(progs) != 1 || ppAxis >= 0 && len(progs) != mesh.Axes[ppAxis].Size {
		return nil, fmt.Errorf("%d programs for mesh %v: want one per pipeline rank", len(progs), mesh)
	}
	c := &Cluster{prog: progs[0], Mail: NewMailbox()}
	if mesh != nil {
		c.Comm = NewComm(n)
	}
	for r := range n {
		o := opts
		o.Rank, o.Comm, o.Mail = r, c.Comm, c.Mail
		prog := progs[0]
		if ppAxis >= 0 {
			prog = progs[Coords(mesh, r)[ppAxis]]
		}
		d, err := Load(prog, o)
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", r, err)
		}
		c.Devices = append(c.Devices, d)
	}
	return c, nil
}

// each runs f on every device concurrently. The first failure aborts the
// Comm so devices blocked in a collective return instead of hanging.
func (c *Cluster) each(f func(*Device) error) error {
	if len(c.Devices) == 1 {
		return f(c.Devices[0])
	}
	errs := make([]error, len(c.Devices))
	var wg sync.WaitGroup
	for r, d := range c.Devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(d); err != nil {
				errs[r] = fmt.Errorf("device %d: %w", r, err)
				c.Comm.Abort(errs[r])
				c.Mail.Abort(errs[r])
			}
		}()
	}
	wg.Wait()
	// Report the device that failed first, not the ones it aborted.
	for _, err := range errs {
		if err != nil && !errors.Is(err, ErrAborted) && !strings.Contains(err.Error(), "pipeline aborted") {
			return err
		}
	}
	return errors.Join(errs...)
}

// Step runs one training step on every device.
func (c *Cluster) Step() error {
	c.evaluated = false
	return c.each((*Device).Step)
}

// Forward runs the loss's instructions on every device, or the evaluation
// programs on the current params.
func (c *Cluster) Forward() error {
	if c.eval == nil {
		return c.each((*Device).Forward)
	}
	for i, d := range c.Devices {
		e := c.eval.Devices[i]
		// Params, inputs and any state the forward reads (PipeDream-2BW's
		// previous weights).
		for name := range e.prog.Sources {
			raw, _, err := d.Bytes(name)
			if err != nil {
				continue // an input this rank's training program does not hold
			}
			if err := e.SetBytes(name, raw); err != nil {
				return err
			}
		}
	}
	c.evaluated = true
	return c.eval.Step()
}

// InitParams initialises every device's shard of every param.
func (c *Cluster) InitParams(seed uint64) error {
	return c.each(func(d *Device) error { return d.InitParams(seed) })
}

// PeakBytes is the largest measured peak over the devices.
func (c *Cluster) PeakBytes() int64 {
	var p int64
	for _, d := range c.Devices {
		p = max(p, d.PeakBytes())
	}
	return p
}

// holders are the devices whose program has the named source.
func (c *Cluster) holders(name string) ([]*Device, lower.Buffer, error) {
	var ds []*Device
	var buf lower.Buffer
	for _, d := range c.Devices {
		if id, ok := d.prog.Sources[name]; ok {
			ds = append(ds, d)
			buf = d.prog.Buffers[id]
		}
	}
	if len(ds) == 0 {
		return nil, buf, fmt.Errorf("no device holds a param, state or input named %q", name)
	}
	return ds, buf, nil
}

// SetInt32 gives every device that uses the input its block of it.
func (c *Cluster) SetInt32(name string, data []int32) error {
	ds, b, err := c.holders(name)
	if err != nil {
		return err
	}
	if int64(len(data)) != b.Global.Shape.NumElements() {
		return fmt.Errorf("input %q is %v; got %d values", name, b.Global, len(data))
	}
	for _, d := range ds {
		blk := data
		if d.prog.Mesh != nil && b.Place != nil {
			shape, lo, size := blockOf(d.prog.Mesh, b.Place, b.Global.Shape, d.coords)
			blk = block(data, shape, lo, size)
		}
		if err := d.SetInt32(name, blk); err != nil {
			return err
		}
	}
	return nil
}

// SetScalar sets a scalar input on every device that uses it.
func (c *Cluster) SetScalar(name string, x float64) error {
	ds, _, err := c.holders(name)
	if err != nil {
		return err
	}
	for _, d := range ds {
		if err := d.SetScalar(name, x); err != nil {
			return err
		}
	}
	return nil
}

// Scalar reads a replicated scalar output from the first device that has
// it (under pipeline parallelism, the loss lives on the last stage).
func (c *Cluster) Scalar(name string) (float64, error) {
	if c.evaluated {
		return c.eval.Scalar(name)
	}
	for _, d := range c.Devices {
		if _, ok := d.prog.Outputs[name]; ok {
			return d.Scalar(name)
		}
	}
	return 0, fmt.Errorf("no device has an output named %q", name)
}

// Global assembles a whole param or state from the devices' blocks.
func (c *Cluster) Global(name string) ([]float64, error) {
	ds, b, err := c.holders(name)
	if err != nil {
		return nil, err
	}
	whole := make([]float64, b.Global.Shape.NumElements())
	for _, d := range ds {
		blk, err := d.Float64s(name)
		if err != nil {
			return nil, err
		}
		if d.prog.Mesh == nil || b.Place == nil {
			return blk, nil
		}
		for _, p := range b.Place {
			if p.Kind == ir.Partial {
				return nil, fmt.Errorf("%q is a partial sum on some axis; it has no whole value per device", name)
			}
		}
		shape, lo, size := blockOf(d.prog.Mesh, b.Place, b.Global.Shape, d.coords)
		unblock(whole, shape, lo, size, blk)
	}
	return whole, nil
}

// SetGlobal gives every device its block of a whole param or state.
func (c *Cluster) SetGlobal(name string, x []float64) error {
	ds, b, err := c.holders(name)
	if err != nil {
		return err
	}
	for _, d := range ds {
		if err := d.SetFloat64s(name, d.LocalBlock(x, b)); err != nil {
			return err
		}
	}
	return nil
}
