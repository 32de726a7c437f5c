package cpu

import (
	"errors"
	"fmt"
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
}

// NewCluster loads prog on every device of its mesh (one device when the
// program has no mesh).
func NewCluster(prog *lower.Program, opts Options) (*Cluster, error) {
	n := 1
	if prog.Mesh != nil {
		n = prog.Mesh.Devices()
	}
	c := &Cluster{prog: prog}
	if prog.Mesh != nil {
		c.Comm = NewComm(n)
	}
	for r := range n {
		o := opts
		o.Rank, o.Comm = r, c.Comm
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
			}
		}()
	}
	wg.Wait()
	// Report the device that failed first, not the ones it aborted.
	for _, err := range errs {
		if err != nil && !errors.Is(err, ErrAborted) {
			return err
		}
	}
	return errors.Join(errs...)
}

// Step runs one training step on every device.
func (c *Cluster) Step() error { return c.each((*Device).Step) }

// Forward runs the loss's instructions on every device.
func (c *Cluster) Forward() error { return c.each((*Device).Forward) }

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

// SetInt32 gives every device its block of a whole input.
func (c *Cluster) SetInt32(name string, data []int32) error {
	b, err := c.Devices[0].source(name)
	if err != nil {
		return err
	}
	if int64(len(data)) != b.Global.Shape.NumElements() {
		return fmt.Errorf("input %q is %v; got %d values", name, b.Global, len(data))
	}
	for _, d := range c.Devices {
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

// SetScalar sets a scalar input on every device.
func (c *Cluster) SetScalar(name string, x float64) error {
	for _, d := range c.Devices {
		if err := d.SetScalar(name, x); err != nil {
			return err
		}
	}
	return nil
}

// Scalar reads a replicated scalar output.
func (c *Cluster) Scalar(name string) (float64, error) { return c.Devices[0].Scalar(name) }

// Global assembles a whole param or state from the devices' blocks.
func (c *Cluster) Global(name string) ([]float64, error) {
	b, err := c.Devices[0].source(name)
	if err != nil {
		return nil, err
	}
	whole := make([]float64, b.Global.Shape.NumElements())
	for _, d := range c.Devices {
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
	b, err := c.Devices[0].source(name)
	if err != nil {
		return err
	}
	for _, d := range c.Devices {
		if err := d.SetFloat64s(name, d.LocalBlock(x, b)); err != nil {
			return err
		}
	}
	return nil
}
