package cpu

import (
	"errors"
	"fmt"
	"sync"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// Member is what a MeshCluster needs of each of its devices. A device
// that embeds a HostView has all of it but stepping and its peak.
type Member interface {
	runtime.Device
	Program() *lower.Program
	Coords() []int
	InitParams(seed uint64) error
	Float64s(name string) ([]float64, error)
	SetFloat64s(name string, x []float64) error
	Bytes(name string) ([]byte, ir.Type, error)
	SetBytes(name string, data []byte) error
}

// MeshCluster is the part of a cluster that is the same on every
// backend: it steps all its devices at once, gives each device its block
// of a whole input or tensor and assembles the blocks back, and reads
// replicated outputs. Loading programs, memory and the links between
// devices stay with each backend's cluster, which embeds a MeshCluster
// and tells it how to stop the others when one device fails.
type MeshCluster[D Member] struct {
	// Devices are the cluster's devices by rank.
	Devices []D
	// abort tells the devices still running that one failed, so none
	// waits forever in a collective or a receive; echo says whether an
	// error is only another device's failure coming back through such a
	// wait, so the first cause is the one reported.
	abort func(error)
	echo  func(error) bool
	// eval runs forward-only programs when the training programs have no
	// forward-only prefix (pipelines); evaluated says Scalar reads it.
	eval      *MeshCluster[D]
	evaluated bool
}

// MeshDevices checks that progs has one program per pipeline rank of
// their shared mesh and returns the mesh's device count (1 without a
// mesh).
func MeshDevices(progs []*lower.Program) (int, error) {
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

// ProgramOf is the program device rank runs: its pipeline rank's, from
// progs as MeshDevices accepts them.
func ProgramOf(progs []*lower.Program, rank int) *lower.Program {
	mesh := progs[0].Mesh
	if mesh == nil || mesh.Axis("pp") < 0 {
		return progs[0]
	}
	return progs[Coords(mesh, rank)[mesh.Axis("pp")]]
}

// NewMeshCluster is an empty cluster whose devices, when one fails, are
// stopped by abort; echo recognises the errors that stopping causes.
// Either may be nil where devices never wait on each other.
func NewMeshCluster[D Member](abort func(error), echo func(error) bool) MeshCluster[D] {
	if abort == nil {
		abort = func(error) {}
	}
	if echo == nil {
		echo = func(error) bool { return false }
	}
	return MeshCluster[D]{abort: abort, echo: echo}
}

// EvaluateWith makes Forward run e, a cluster of forward-only programs
// laid out like this one's, on this cluster's current params and inputs
// (nil: run the training programs' forward part). Until the next Forward,
// Scalar reads the training programs' outputs.
func (c *MeshCluster[D]) EvaluateWith(e *MeshCluster[D]) {
	c.eval, c.evaluated = e, false
}

// Each runs f on every device concurrently, one goroutine each. The
// first failure aborts the others so none hangs, and is the error
// returned.
func (c *MeshCluster[D]) Each(f func(D) error) error {
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
				c.abort(errs[r])
			}
		}()
	}
	wg.Wait()
	// Report the device that failed first, not the ones it aborted.
	for _, err := range errs {
		if err != nil && !c.echo(err) {
			return err
		}
	}
	return errors.Join(errs...)
}

// Step runs one training step on every device.
func (c *MeshCluster[D]) Step() error {
	c.evaluated = false
	return c.Each(func(d D) error { return d.Step() })
}

// Forward runs the loss's instructions on every device, or the evaluation
// programs on the current params.
func (c *MeshCluster[D]) Forward() error {
	if c.eval == nil {
		return c.Each(func(d D) error { return d.Forward() })
	}
	for i, d := range c.Devices {
		e := c.eval.Devices[i]
		// Params, inputs and any state the forward reads (PipeDream-2BW's
		// previous weights).
		for name := range e.Program().Sources {
			if _, ok := d.Program().Sources[name]; !ok {
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
func (c *MeshCluster[D]) InitParams(seed uint64) error {
	return c.Each(func(d D) error { return d.InitParams(seed) })
}

// PeakBytes is the largest measured peak over the devices.
func (c *MeshCluster[D]) PeakBytes() int64 {
	var p int64
	for _, d := range c.Devices {
		p = max(p, d.PeakBytes())
	}
	return p
}

// holding is a device that holds a source, and its buffer there.
type holding[D Member] struct {
	dev D
	buf lower.Buffer
}

// holders are the devices whose program has the named source.
func (c *MeshCluster[D]) holders(name string) ([]holding[D], error) {
	var hs []holding[D]
	for _, d := range c.Devices {
		if id, ok := d.Program().Sources[name]; ok {
			hs = append(hs, holding[D]{d, d.Program().Buffers[id]})
		}
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("no device holds a param, state or input named %q", name)
	}
	return hs, nil
}

// SetInt32 gives every device that uses the input its block of it.
func (c *MeshCluster[D]) SetInt32(name string, data []int32) error {
	return scatter(c, name, data, func(d D, blk []int32) error { return d.SetInt32(name, blk) })
}

// scatter hands each device holding the named source its block of x, the
// whole tensor, through set.
func scatter[D Member, T any](c *MeshCluster[D], name string, x []T, set func(D, []T) error) error {
	hs, err := c.holders(name)
	if err != nil {
		return err
	}
	if g := hs[0].buf.Global; int64(len(x)) != g.Shape.NumElements() {
		return fmt.Errorf("%q is %v; got %d values", name, g, len(x))
	}
	for _, h := range hs {
		if err := set(h.dev, Block(x, h.buf, h.dev.Program().Mesh, h.dev.Coords())); err != nil {
			return err
		}
	}
	return nil
}

// SetScalar sets a scalar input on every device that uses it.
func (c *MeshCluster[D]) SetScalar(name string, x float64) error {
	hs, err := c.holders(name)
	if err != nil {
		return err
	}
	for _, h := range hs {
		if err := h.dev.SetScalar(name, x); err != nil {
			return err
		}
	}
	return nil
}

// Scalar reads a replicated scalar output from the first device that has
// it (under pipeline parallelism, the loss lives on the last stage).
func (c *MeshCluster[D]) Scalar(name string) (float64, error) {
	if c.evaluated {
		return c.eval.Scalar(name)
	}
	for _, d := range c.Devices {
		if _, ok := d.Program().Outputs[name]; ok {
			return d.Scalar(name)
		}
	}
	return 0, fmt.Errorf("no device has an output named %q", name)
}

// Global assembles a whole param or state from the devices' blocks.
func (c *MeshCluster[D]) Global(name string) ([]float64, error) {
	hs, err := c.holders(name)
	if err != nil {
		return nil, err
	}
	for _, p := range hs[0].buf.Place {
		if p.Kind == ir.Partial {
			return nil, fmt.Errorf("%q is a partial sum on some axis; it has no whole value per device", name)
		}
	}
	whole := make([]float64, hs[0].buf.Global.Shape.NumElements())
	for _, h := range hs {
		blk, err := h.dev.Float64s(name)
		if err != nil {
			return nil, err
		}
		Unblock(whole, h.buf, h.dev.Program().Mesh, h.dev.Coords(), blk)
	}
	return whole, nil
}

// SetGlobal gives every device its block of a whole param or state.
func (c *MeshCluster[D]) SetGlobal(name string, x []float64) error {
	return scatter(c, name, x, func(d D, blk []float64) error { return d.SetFloat64s(name, blk) })
}
