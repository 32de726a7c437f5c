package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"
	"unsafe"

	"gcompile/ir"
	"gcompile/lower"
)

// Member is what a MeshCluster needs of each of its devices. A device
// that embeds a HostView has all of it but stepping and its peak.
type Member interface {
	Device
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
//
// A cluster holds the devices of one process. In a job of several
// processes (see Job) the others hold the rest; then reading an output
// held elsewhere, assembling a tensor and gathering peaks are collective:
// every process makes the same calls in the same order (the training loop
// does), and the values cross processes through the job's Comm.
type MeshCluster[D Member] struct {
	// Devices are this process's devices, Ranks their global ranks,
	// ascending.
	Devices []D
	Ranks   []int
	// job is where the other devices live; nil when all are here.
	job   *Job
	progs []*lower.Program
	// hostTags numbers the host's point-to-point exchanges; every process
	// counts them alike, so both ends of one agree on its tag.
	hostTags int
	// abort tells the devices still running that one failed, so none
	// waits forever in a collective or a receive; echo says whether an
	// error is only another device's failure coming back through such a
	// wait, so the first cause is the one reported.
	abort func(error)
	echo  func(error) bool
	// watchdog, when positive, bounds one call of Each on all devices: a
	// device still busy then is stopped through abort (see SetWatchdog).
	watchdog time.Duration
	// eval runs forward-only programs when the training programs have no
	// forward-only prefix (pipelines); evaluated says Scalar reads it.
	eval      *MeshCluster[D]
	evaluated bool
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

// SpanJob makes the cluster one process's part of job, running progs (one
// per pipeline rank) over the whole mesh: it then holds the devices of
// job.Layout.Local(), added by the backend in that order.
func (c *MeshCluster[D]) SpanJob(job *Job, progs []*lower.Program) error {
	n, err := lower.MeshDevices(progs)
	if err != nil {
		return err
	}
	if err := job.Layout.Check(); err != nil {
		return err
	}
	if job.Layout.Devices != n {
		return fmt.Errorf("the job has %d devices but the mesh %v has %d", job.Layout.Devices, progs[0].Mesh, n)
	}
	if job.Comm == nil || job.Comm.Size() != n {
		return fmt.Errorf("a job of %d devices needs a comm that connects all of them", n)
	}
	c.job, c.progs = job, progs
	return nil
}

// Job is the job the cluster is part of, or nil when it holds every device.
func (c *MeshCluster[D]) Job() *Job { return c.job }

// distributed reports whether other processes hold some of the devices.
func (c *MeshCluster[D]) distributed() bool { return c.job != nil && c.job.Layout.Procs > 1 }

// rankOf is the global rank of local device i.
func (c *MeshCluster[D]) rankOf(i int) int {
	if i < len(c.Ranks) {
		return c.Ranks[i]
	}
	return i
}

// EvaluateWith makes Forward run e, a cluster of forward-only programs
// laid out like this one's, on this cluster's current params and inputs
// (nil: run the training programs' forward part). Until the next Forward,
// Scalar reads the training programs' outputs.
func (c *MeshCluster[D]) EvaluateWith(e *MeshCluster[D]) {
	c.eval, c.evaluated = e, false
	if e != nil {
		e.watchdog = c.watchdog
	}
}

// SetWatchdog bounds every step (and evaluation) to d: a device still
// running then is stopped through the cluster's abort, with an error
// wrapping ErrTimeout that names it. A backend whose waits have no
// timeouts of their own (a GPU's stream waiting in NCCL) needs one; d ≤ 0
// turns it off.
func (c *MeshCluster[D]) SetWatchdog(d time.Duration) {
	c.watchdog = d
	if c.eval != nil {
		c.eval.SetWatchdog(d)
	}
}

// Each runs f on every device concurrently, one goroutine each. The
// first failure aborts the others so none hangs, and is the error
// returned.
func (c *MeshCluster[D]) Each(f func(D) error) error {
	if len(c.Devices) == 1 && c.watchdog <= 0 {
		return f(c.Devices[0])
	}
	errs := make([]error, len(c.Devices))
	var running sync.Map
	var wg sync.WaitGroup
	for r, d := range c.Devices {
		wg.Add(1)
		running.Store(c.rankOf(r), true)
		go func() {
			defer wg.Done()
			defer running.Delete(c.rankOf(r))
			if err := f(d); err != nil {
				errs[r] = fmt.Errorf("device %d: %w", c.rankOf(r), err)
				c.abort(errs[r])
			}
		}()
	}
	if c.watchdog > 0 {
		t := time.AfterFunc(c.watchdog, func() {
			var stuck []int
			running.Range(func(k, _ any) bool { stuck = append(stuck, k.(int)); return true })
			sort.Ints(stuck)
			c.abort(fmt.Errorf("%w: device(s) %v still running after %v (a device waiting for another that failed, stalled or left)", ErrTimeout, stuck, c.watchdog))
		})
		defer t.Stop()
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
	// Forward-only pipeline programs run whole; a training program of
	// the evaluation module (its shapes differ from training's) runs its
	// forward prefix.
	return c.eval.Each(func(d D) error {
		if d.Program().ForwardEnd >= 0 {
			return d.Forward()
		}
		return d.Step()
	})
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

// holders are this process's devices whose program has the named source.
// A name no device of the job holds is an error; one held only in other
// processes gives none.
func (c *MeshCluster[D]) holders(name string) ([]holding[D], error) {
	var hs []holding[D]
	for _, d := range c.Devices {
		if id, ok := d.Program().Sources[name]; ok {
			hs = append(hs, holding[D]{d, d.Program().Buffers[id]})
		}
	}
	if len(hs) == 0 {
		if _, ok := c.remoteSource(name); !ok {
			return nil, fmt.Errorf("no device holds a param, state or input named %q", name)
		}
	}
	return hs, nil
}

// remoteSource finds the named source's buffer in any program of the job.
func (c *MeshCluster[D]) remoteSource(name string) (lower.Buffer, bool) {
	for _, p := range c.progs {
		if id, ok := p.Sources[name]; ok {
			return p.Buffers[id], true
		}
	}
	return lower.Buffer{}, false
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
	global, _ := c.remoteSource(name)
	if len(hs) > 0 {
		global = hs[0].buf
	}
	if g := global.Global; int64(len(x)) != g.Shape.NumElements() {
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
// it (under pipeline parallelism, the loss lives on the last stage). In a
// job of several processes the device that has it may be elsewhere: its
// process reads it and sends it to the others, so every process must call
// Scalar for the same names in the same order.
func (c *MeshCluster[D]) Scalar(name string) (float64, error) {
	if c.evaluated {
		return c.eval.Scalar(name)
	}
	if !c.distributed() {
		for _, d := range c.Devices {
			if _, ok := d.Program().Outputs[name]; ok {
				return d.Scalar(name)
			}
		}
		return 0, fmt.Errorf("no device has an output named %q", name)
	}
	owner := -1
	for r := range c.job.Layout.Devices {
		if _, ok := lower.ProgramOf(c.progs, r).Outputs[name]; ok {
			owner = r
			break
		}
	}
	if owner < 0 {
		return 0, fmt.Errorf("no device has an output named %q", name)
	}
	buf := make([]byte, 8)
	if c.job.Layout.Holds(owner) {
		x, err := c.Devices[owner-c.Ranks[0]].Scalar(name)
		if err != nil {
			return 0, err
		}
		binary.LittleEndian.PutUint64(buf, math.Float64bits(x))
	}
	g, me, root := c.hostGroup(owner)
	if err := c.job.Comm.Broadcast(g, me, root, ir.F64, buf); err != nil {
		return 0, fmt.Errorf("output %q from device %d: %w", name, owner, err)
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(buf)), nil
}

// hostGroup is one rank per process, owner speaking for its own process
// and each other process's lead for it: the group of a host exchange
// rooted at owner. It returns the group, the rank this process calls
// with and owner's position.
func (c *MeshCluster[D]) hostGroup(owner int) (g Group, me, root int) {
	l := c.job.Layout
	g.Channel = HostChannel
	for p := range l.Procs {
		r := l.Lead(p)
		if p == l.ProcOf(owner) {
			r, root = owner, p
		}
		if p == l.Proc {
			me = r
		}
		g.Ranks = append(g.Ranks, r)
	}
	return g, me, root
}

// hostTag is the tag of the next host point-to-point exchange. Tags the
// lowering gives pipeline transfers are value ids, never negative.
func (c *MeshCluster[D]) hostTag() int {
	c.hostTags++
	return -c.hostTags
}

// Global assembles a whole param or state from the devices' blocks. In a
// job of several processes it is collective: every process calls it, the
// blocks travel to process 0, which alone gets the tensor (the others get
// nil).
func (c *MeshCluster[D]) Global(name string) ([]float64, error) {
	hs, err := c.holders(name)
	if err != nil {
		return nil, err
	}
	buf, _ := c.remoteSource(name)
	if len(hs) > 0 {
		buf = hs[0].buf
	}
	for _, p := range buf.Place {
		if p.Kind == ir.Partial {
			return nil, fmt.Errorf("%q is a partial sum on some axis; it has no whole value per device", name)
		}
	}
	if c.distributed() {
		return c.gather(name, buf)
	}
	whole := make([]float64, buf.Global.Shape.NumElements())
	for _, h := range hs {
		blk, err := h.dev.Float64s(name)
		if err != nil {
			return nil, err
		}
		Unblock(whole, h.buf, h.dev.Program().Mesh, h.dev.Coords(), blk)
	}
	return whole, nil
}

// gather brings every distinct block of the named source to process 0:
// each block from the first rank that holds it, sent by that rank's
// process unless process 0 holds it too.
func (c *MeshCluster[D]) gather(name string, buf lower.Buffer) ([]float64, error) {
	l := c.job.Layout
	mesh := c.progs[0].Mesh
	var whole []float64
	if l.Proc == 0 {
		whole = make([]float64, buf.Global.Shape.NumElements())
	}
	seen := map[string]bool{}
	for r := range l.Devices {
		p := lower.ProgramOf(c.progs, r)
		id, ok := p.Sources[name]
		if !ok {
			continue
		}
		b := p.Buffers[id]
		coords := mesh.Coords(r)
		box := ir.BlockBox(mesh, b.Place, b.Global.Shape, coords)
		key := fmt.Sprint(box.Lo)
		if seen[key] {
			continue
		}
		seen[key] = true
		tag := c.hostTag()
		var blk []float64
		switch {
		case l.Holds(r):
			var err error
			if blk, err = c.Devices[r-c.Ranks[0]].Float64s(name); err != nil {
				return nil, err
			}
			if l.Proc != 0 {
				if err := c.job.Comm.Send(r, l.Lead(0), tag, ir.F64, f64Bytes(blk)); err != nil {
					return nil, fmt.Errorf("%q from device %d: %w", name, r, err)
				}
				continue
			}
		case l.Proc == 0:
			blk = make([]float64, b.Type.Shape.NumElements())
			if err := c.job.Comm.Recv(r, l.Lead(0), tag, ir.F64, f64Bytes(blk)); err != nil {
				return nil, fmt.Errorf("%q from device %d: %w", name, r, err)
			}
		default:
			continue
		}
		Unblock(whole, b, mesh, coords, blk)
	}
	return whole, nil
}

// Peaks is every device's measured peak, by global rank. In a job of
// several processes it is collective, and only process 0 gets the figures
// (the others get nil).
func (c *MeshCluster[D]) Peaks() ([]int64, error) {
	if !c.distributed() {
		out := make([]int64, len(c.Devices))
		for i, d := range c.Devices {
			out[i] = d.PeakBytes()
		}
		return out, nil
	}
	l := c.job.Layout
	mine := make([]float64, len(c.Devices))
	for i, d := range c.Devices {
		mine[i] = float64(d.PeakBytes())
	}
	var out []int64
	if l.Proc == 0 {
		out = make([]int64, l.Devices)
		for i, x := range mine {
			out[c.Ranks[i]] = int64(x)
		}
	}
	for p := 1; p < l.Procs; p++ {
		tag := c.hostTag()
		switch l.Proc {
		case p:
			if err := c.job.Comm.Send(l.Lead(p), l.Lead(0), tag, ir.F64, f64Bytes(mine)); err != nil {
				return nil, fmt.Errorf("peaks: %w", err)
			}
		case 0:
			theirs := make([]float64, l.PerProc())
			if err := c.job.Comm.Recv(l.Lead(p), l.Lead(0), tag, ir.F64, f64Bytes(theirs)); err != nil {
				return nil, fmt.Errorf("peaks of process %d: %w", p, err)
			}
			for i, x := range theirs {
				out[l.Lead(p)+i] = int64(x)
			}
		}
	}
	return out, nil
}

// SetGlobal gives every device its block of a whole param or state.
func (c *MeshCluster[D]) SetGlobal(name string, x []float64) error {
	return scatter(c, name, x, func(d D, blk []float64) error { return d.SetFloat64s(name, blk) })
}

// f64Bytes is x's memory as bytes, shared.
func f64Bytes(x []float64) []byte {
	if len(x) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 8*len(x))
}

// BlockDevice is one device's raw blocks of its params and state, as a
// checkpoint reads and writes them.
type BlockDevice interface {
	Program() *lower.Program
	Coords() []int
	Bytes(name string) ([]byte, ir.Type, error)
	SetBytes(name string, data []byte) error
}

// Local is this process's devices and their global ranks, ascending.
func (c *MeshCluster[D]) Local() ([]int, []BlockDevice) {
	devs := make([]BlockDevice, len(c.Devices))
	for i, d := range c.Devices {
		devs[i] = d
	}
	return c.Ranks, devs
}

// Process is this process's index in the job and the job's process
// count (0 and 1 when the cluster holds every device).
func (c *MeshCluster[D]) Process() (proc, procs int) {
	if !c.distributed() {
		return 0, 1
	}
	return c.job.Layout.Proc, c.job.Layout.Procs
}

// AnyOf is true on every process when flag is true on any: the processes
// of a job agree on whether to stop, or wait for each other (a barrier:
// no process returns before every process has called it). It is
// collective; in one process it is flag itself.
func (c *MeshCluster[D]) AnyOf(flag bool) (bool, error) {
	if !c.distributed() {
		return flag, nil
	}
	l := c.job.Layout
	one := func(b bool) []byte {
		if b {
			return []byte{1}
		}
		return []byte{0}
	}
	up, down := c.hostTag(), c.hostTag()
	buf := make([]byte, 1)
	if l.Proc != 0 {
		if err := c.job.Comm.Send(l.Lead(l.Proc), l.Lead(0), up, ir.Bool, one(flag)); err != nil {
			return false, fmt.Errorf("agreeing with process 0: %w", err)
		}
		if err := c.job.Comm.Recv(l.Lead(0), l.Lead(l.Proc), down, ir.Bool, buf); err != nil {
			return false, fmt.Errorf("agreeing with process 0: %w", err)
		}
		return buf[0] != 0, nil
	}
	for p := 1; p < l.Procs; p++ {
		if err := c.job.Comm.Recv(l.Lead(p), l.Lead(0), up, ir.Bool, buf); err != nil {
			return false, fmt.Errorf("agreeing with process %d: %w", p, err)
		}
		flag = flag || buf[0] != 0
	}
	for p := 1; p < l.Procs; p++ {
		if err := c.job.Comm.Send(l.Lead(0), l.Lead(p), down, ir.Bool, one(flag)); err != nil {
			return false, fmt.Errorf("agreeing with process %d: %w", p, err)
		}
	}
	return flag, nil
}

// HeldRows says which rows (the first dim) of the named batch inputs this
// process's devices hold, so the data source reads only those: a process
// of a job of several, or one whose devices are all later pipeline stages,
// reads none of the others' samples. A row counts as held when any local
// device's block of any of the inputs has an element of it, whatever the
// placement (found by cutting a tensor of row numbers as the inputs are
// cut).
func (c *MeshCluster[D]) HeldRows(names ...string) (func(row int) bool, error) {
	var held []bool
	for _, name := range names {
		if _, err := c.holders(name); err != nil {
			return nil, err
		}
		for _, d := range c.Devices {
			id, ok := d.Program().Sources[name]
			if !ok {
				continue
			}
			buf := d.Program().Buffers[id]
			shape := buf.Global.Shape
			if len(shape) == 0 || shape[0] <= 0 {
				return nil, nil // a scalar input has no rows to choose: read everything
			}
			rows := shape[0]
			if held == nil {
				held = make([]bool, rows)
			} else if len(held) != rows {
				return nil, fmt.Errorf("the batch inputs disagree on their rows: %q has %d, another %d", name, rows, len(held))
			}
			per := int(shape.NumElements()) / rows
			index := make([]int32, rows*per)
			for i := range index {
				index[i] = int32(i / per)
			}
			for _, r := range Block(index, buf, d.Program().Mesh, d.Coords()) {
				held[r] = true
			}
		}
	}
	if held == nil {
		return func(int) bool { return false }, nil
	}
	return func(row int) bool { return row >= 0 && row < len(held) && held[row] }, nil
}

// WholeOutput reads an output every device holds whole (generation's
// logits, made whole by the shard pass) from this process's first device.
func (c *MeshCluster[D]) WholeOutput(name string) ([]float64, error) {
	if len(c.Devices) == 0 {
		return nil, fmt.Errorf("output %q: this process holds no device", name)
	}
	d := c.Devices[0]
	id, ok := d.Program().Outputs[name]
	if !ok {
		return nil, fmt.Errorf("the program has no output %q", name)
	}
	for _, p := range d.Program().Buffers[id].Place {
		if p.Kind != ir.Replicate {
			return nil, fmt.Errorf("output %q is not whole on every device (%v)", name, d.Program().Buffers[id].Place)
		}
	}
	return d.Float64s(name)
}

// CopySources copies the named sources (params, states) of every local
// device of src into the same device of dst, byte for byte: two programs
// of one plan that hold them alike (generation's prefill and decode
// programs) then run on the same weights and caches without assembling
// them whole.
func CopySources[D Member](dst, src *MeshCluster[D], names []string) error {
	if len(dst.Devices) != len(src.Devices) {
		return fmt.Errorf("copying %d sources: %d devices into %d", len(names), len(src.Devices), len(dst.Devices))
	}
	for i, from := range src.Devices {
		to := dst.Devices[i]
		for _, name := range names {
			raw, t, err := from.Bytes(name)
			if err != nil {
				return err
			}
			if _, u, err := to.Bytes(name); err != nil {
				return err
			} else if !u.Equal(t) {
				return fmt.Errorf("%q is %v on one program's device %d and %v on the other's", name, t, i, u)
			}
			if err := to.SetBytes(name, raw); err != nil {
				return err
			}
		}
	}
	return nil
}
