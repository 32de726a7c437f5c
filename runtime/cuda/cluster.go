package cuda

import (
	"errors"
	"fmt"
	"sync"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
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
// device that has them (they are replicated).
type Cluster struct {
	rts     []*Runtime // by rank; virtual devices share one
	progs   []*lower.Program
	opts    Options
	nccl    bool
	Devices []*Device
	comm    comm
	// eval runs forward-only programs when the training programs have no
	// forward-only prefix (pipelines); evaluated says Scalar reads it.
	eval      *Cluster
	evaluated bool
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

// meshDevices checks that progs has one program per pipeline rank and
// returns the device count.
func meshDevices(progs []*lower.Program) (int, error) {
	if len(progs) == 0 {
		return 0, errors.New("no programs to load")
	}
	mesh := progs[0].Mesh
	n, ppAxis := 1, -1
	if mesh != nil {
		n, ppAxis = mesh.Devices(), mesh.Axis("pp")
	}
	if ppAxis < 0 && len(progs) != 1 || ppAxis >= 0 && len(progs) != mesh.Axes[ppAxis].Size {
		return 0, fmt.Errorf("%d programs for mesh %v: want one per pipeline rank", len(progs), mesh)
	}
	return n, nil
}

// programOf is the program device rank runs: its pipeline rank's.
func programOf(progs []*lower.Program, rank int) *lower.Program {
	mesh := progs[0].Mesh
	if mesh == nil || mesh.Axis("pp") < 0 {
		return progs[0]
	}
	return progs[cpu.Coords(mesh, rank)[mesh.Axis("pp")]]
}

func newCluster(rts []*Runtime, progs []*lower.Program, opts Options, cm comm, viaNCCL bool) (*Cluster, error) {
	c := &Cluster{rts: rts, progs: progs, opts: opts, nccl: viaNCCL}
	if progs[0].Mesh != nil {
		c.comm = cm
	}
	for r := range rts {
		d, err := load(rts[r], programOf(progs, r), opts, r, c.comm)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("device %d: %w", r, err), c.Close())
		}
		c.Devices = append(c.Devices, d)
	}
	return c, nil
}

// Close frees every device (and the evaluation programs').
func (c *Cluster) Close() error {
	var errs []error
	if c.eval != nil {
		errs = append(errs, c.eval.Close())
		c.eval = nil
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
	return err
}

// each runs f on every device concurrently, one goroutine each. The
// first failure aborts the others' waits, so none hangs in a collective.
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
				if c.comm != nil {
					c.comm.abort(errs[r])
				}
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
			if _, ok := d.prog.Sources[name]; !ok {
				continue // an input this rank's training program does not hold
			}
			raw, _, err := d.Bytes(name)
			if err != nil {
				return err
			}
			if err := e.SetBytes(name, raw); err != nil {
				return err
			}
		}
	}
	c.evaluated = true
	return c.eval.Step()
}

// InitParams initialises every device's block of every param.
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
		if err := d.SetInt32(name, cpu.Block(data, d.prog.Buffers[d.prog.Sources[name]], d.prog.Mesh, d.coords)); err != nil {
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
	for _, p := range b.Place {
		if p.Kind == ir.Partial {
			return nil, fmt.Errorf("%q is a partial sum on some axis; it has no whole value per device", name)
		}
	}
	whole := make([]float64, b.Global.Shape.NumElements())
	for _, d := range ds {
		blk, err := d.Float64s(name)
		if err != nil {
			return nil, err
		}
		cpu.Unblock(whole, d.prog.Buffers[d.prog.Sources[name]], d.prog.Mesh, d.coords, blk)
	}
	return whole, nil
}

// SetGlobal gives every device its block of a whole param or state.
func (c *Cluster) SetGlobal(name string, x []float64) error {
	ds, b, err := c.holders(name)
	if err != nil {
		return err
	}
	if int64(len(x)) != b.Global.Shape.NumElements() {
		return fmt.Errorf("%q is %v; got %d values", name, b.Global, len(x))
	}
	for _, d := range ds {
		if err := d.SetFloat64s(name, cpu.Block(x, d.prog.Buffers[d.prog.Sources[name]], d.prog.Mesh, d.coords)); err != nil {
			return err
		}
	}
	return nil
}
