package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda/cublaslt"
	"gcompile/runtime/cuda/driver"
)

// Options configure a device.
type Options struct {
	// MemoryCap is the most arena bytes the device may hold; 0 means the
	// GPU's memory is the only limit.
	MemoryCap int64
}

// Device is one virtual device on a GPU executing one program. Its
// buffers live in one device allocation (the arena) at the program's
// static offsets, offloaded ones in one pinned host allocation; every
// instruction is turned into a closure that queues its kernels, GEMMs and
// copies once, at load, so a step is a loop of calls that allocates no
// device memory.
type Device struct {
	rt     *Runtime
	prog   *lower.Program
	rank   int
	coords []int
	comm   comm

	mem     memories
	scratch bump // per-instruction workspace, reused
	keep    bump // workspace that outlives an instruction
	nstatus int  // status words, one per kernel call that checks ids
	// statusOf is the instruction each status word belongs to.
	statusOf []int

	compute, copies driver.Stream
	lt              cublaslt.Handle
	plans           []*cublaslt.Plan
	gemmBytes       uint64
	launches        []*launch
	events          []driver.Event

	steps []func() error
	// born[i]: instruction i is the first to write a device temporary,
	// so its bytes become live there, as in the memory plan.
	born []bool
	// fetches are the host-to-device copies (on the copy stream), by
	// instruction, with the event each records when done; hostWrites the
	// instructions that write host memory on the compute stream.
	fetches    map[int]driver.Event
	hostWrites map[int]bool
	// waitBefore and waitAfter are the host-to-device copies the compute
	// stream must wait for around an instruction.
	waitBefore, waitAfter [][]driver.Event
	// scalars remembers the host value of each scalar input set, so that
	// a kernel that cannot fail checks its step number here.
	scalars map[int]float64

	live, high int64
	// OnInstr, when set, is told each instruction's start and duration,
	// measured with events on the compute stream (the Chrome trace).
	OnInstr func(i int, start time.Time, d time.Duration)
	timing  []driver.Event

	// notes describe each instruction's launches (launch plans).
	notes [][]string
}

// Load loads p as a single device on rt.
func Load(rt *Runtime, p *lower.Program, opts Options) (*Device, error) {
	if p.Mesh != nil && p.Mesh.Devices() > 1 {
		return nil, fmt.Errorf("program %q spans mesh %v: load it with NewCluster", p.Name, p.Mesh)
	}
	return load(rt, p, opts, 0, nil)
}

func load(rt *Runtime, p *lower.Program, opts Options, rank int, cm comm) (d *Device, err error) {
	if err := checkDTypes(p); err != nil {
		return nil, err
	}
	if opts.MemoryCap > 0 && p.ArenaBytes > opts.MemoryCap {
		return nil, fmt.Errorf("program %q needs an arena of %d bytes, more than the device cap of %d bytes", p.Name, p.ArenaBytes, opts.MemoryCap)
	}
	d = &Device{rt: rt, prog: p, rank: rank, comm: cm, scalars: map[int]float64{},
		fetches: map[int]driver.Event{}, hostWrites: map[int]bool{}}
	if p.Mesh != nil {
		if rank < 0 || rank >= p.Mesh.Devices() {
			return nil, fmt.Errorf("program %q spans mesh %v: rank %d is outside it", p.Name, p.Mesh, rank)
		}
		d.coords = cpu.Coords(p.Mesh, rank)
	}
	leave, err := rt.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	defer func() {
		if err != nil {
			err = errors.Join(err, d.release())
			d = nil
		}
	}()
	if rt.drv != nil {
		// Blocking streams: they order themselves after the synchronous
		// copies of inputs and params made between steps on the legacy
		// default stream (a copy from pageable memory may still be in
		// flight when the call returns).
		if d.compute, err = rt.drv.StreamCreate(driver.StreamDefault); err != nil {
			return d, err
		}
		if d.copies, err = rt.drv.StreamCreate(driver.StreamDefault); err != nil {
			return d, err
		}
		if d.lt, err = rt.lt.Create(); err != nil {
			return d, err
		}
	}
	written := map[int]bool{}
	for i, in := range p.Instrs {
		f, err := d.compile(i, in)
		if err != nil {
			return d, fmt.Errorf("%s: %s: %w", where(in), in.Op, err)
		}
		d.steps = append(d.steps, f)
		born := in.Out >= 0 && p.Buffers[in.Out].Kind == lower.Temp && !p.Buffers[in.Out].Host && !written[in.Out]
		if born {
			written[in.Out] = true
		}
		d.born = append(d.born, born)
	}
	if err := d.planCopyWaits(); err != nil {
		return d, err
	}
	if err := d.allocate(); err != nil {
		return d, err
	}
	for _, l := range d.launches {
		d.finalize(l)
	}
	for _, b := range p.Buffers {
		if b.Kind == lower.Const && rt.drv != nil {
			raw, err := encode(b.Type, b.Value.Attrs.Float("value", 0))
			if err != nil {
				return d, fmt.Errorf("%s: %w", bufferName(b), err)
			}
			if err := d.write(b, raw); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

func where(in lower.Instr) string {
	if in.Value == nil {
		return "instruction"
	}
	return in.Value.Where()
}

// allocate makes the arena, the host arena and the workspace: the only
// device allocations a device makes.
func (d *Device) allocate() error {
	drv := d.rt.drv
	if drv == nil {
		return nil
	}
	var err error
	alloc := func(n int64, what string) driver.DevicePtr {
		if err != nil || n <= 0 {
			return 0
		}
		var p driver.DevicePtr
		if p, err = drv.MemAlloc(uint64(n)); err != nil {
			err = fmt.Errorf("%s of program %q on %s: %w", what, d.prog.Name, d.rt.props.Name, err)
		}
		return p
	}
	d.mem.arena = alloc(d.prog.ArenaBytes, "arena")
	d.mem.scratch = alloc(d.scratch.high, "scratch workspace")
	d.mem.keep = alloc(d.keepBytes(), "status and staging workspace")
	d.mem.gemm = alloc(int64(d.gemmBytes), "cuBLASLt workspace")
	d.mem.gemmBytes = d.gemmBytes
	if err != nil {
		return err
	}
	if d.prog.HostBytes > 0 {
		if d.mem.host, err = drv.MemAllocHost(uint64(d.prog.HostBytes)); err != nil {
			return fmt.Errorf("host arena of program %q: %w", d.prog.Name, err)
		}
	}
	return nil
}

// keepBytes is the status words, then the staging regions.
func (d *Device) keepBytes() int64 {
	if d.keep.high == 0 && d.nstatus == 0 {
		return 0
	}
	return d.statusBytes() + d.keep.high
}

func (d *Device) statusBytes() int64 { return alignUp(4*int64(d.nstatus), wsAlign) }

// Workspace reports what the device allocated beside its arena.
func (d *Device) Workspace() Workspace {
	return Workspace{Scratch: d.scratch.high, Keep: d.keepBytes(), GEMM: int64(d.gemmBytes)}
}

// release frees everything the device holds.
func (d *Device) release() error {
	drv := d.rt.drv
	if drv == nil {
		return nil
	}
	var errs []error
	for _, p := range d.plans {
		errs = append(errs, p.Close())
	}
	d.plans = nil
	for _, e := range append(d.events, d.timing...) {
		errs = append(errs, drv.EventDestroy(e))
	}
	d.events, d.timing = nil, nil
	if d.lt != 0 {
		errs = append(errs, d.rt.lt.Destroy(d.lt))
		d.lt = 0
	}
	for _, s := range []*driver.Stream{&d.compute, &d.copies} {
		if *s != 0 {
			errs = append(errs, drv.StreamSynchronize(*s), drv.StreamDestroy(*s))
			*s = 0
		}
	}
	for _, p := range []*driver.DevicePtr{&d.mem.arena, &d.mem.scratch, &d.mem.keep, &d.mem.gemm} {
		if *p != 0 {
			errs = append(errs, drv.MemFree(*p))
			*p = 0
		}
	}
	if d.mem.host.Size() > 0 {
		errs = append(errs, drv.MemFreeHost(d.mem.host))
		d.mem.host = driver.HostMem{}
	}
	return errors.Join(errs...)
}

// Close frees the device's memory, streams, events and GEMM plans.
func (d *Device) Close() error {
	leave, err := d.rt.enter()
	if err != nil {
		return err
	}
	defer leave()
	return d.release()
}

// event creates an event for ordering work between streams (no timing).
func (d *Device) event() (driver.Event, error) {
	if d.rt.drv == nil {
		return 0, nil
	}
	e, err := d.rt.drv.EventCreate(driver.EventDisableTiming)
	if err != nil {
		return 0, err
	}
	d.events = append(d.events, e)
	return e, nil
}

// Program is the program the device runs.
func (d *Device) Program() *lower.Program { return d.prog }

// Rank is the device's rank in its mesh.
func (d *Device) Rank() int { return d.rank }

// Step runs the whole program once: forward, backward, optimizer, updates.
func (d *Device) Step() error { return d.exec(len(d.steps)) }

// Forward runs only the instructions the loss needs.
func (d *Device) Forward() error {
	if d.prog.ForwardEnd < 0 {
		return fmt.Errorf("program %q has no forward-only part (a pipeline rank's program interleaves forward and backward)", d.prog.Name)
	}
	return d.exec(d.prog.ForwardEnd)
}

func (d *Device) exec(n int) (err error) {
	drv := d.rt.drv
	if drv == nil {
		return fmt.Errorf("program %q was only planned (no GPU); it cannot run", d.prog.Name)
	}
	leave, err := d.rt.enter()
	if err != nil {
		return err
	}
	defer leave()
	defer func() {
		// Leave no work queued behind an error: the caller may free or
		// reuse what it reads.
		if err != nil {
			_ = drv.StreamSynchronize(d.compute)
			_ = drv.StreamSynchronize(d.copies)
		}
	}()
	if d.nstatus > 0 {
		if err := drv.MemsetD32Async(d.mem.keep, 0, uint64(d.nstatus), d.compute); err != nil {
			return err
		}
	}
	hook := d.OnInstr
	var hostStart time.Time
	if hook != nil {
		if err := d.timingEvents(); err != nil {
			return err
		}
		hostStart = time.Now()
	}
	d.live = 0
	for i, f := range d.steps[:n] {
		in := &d.prog.Instrs[i]
		// Persistent buffers are counted once, in PersistentBytes, and host
		// buffers not at all; a device temporary is live from its first
		// write, as the memory plan has it.
		if d.born[i] {
			d.live += d.prog.Buffers[in.Out].Bytes
		}
		d.high = max(d.high, d.live)
		for _, e := range d.waitBefore[i] {
			if err := drv.StreamWaitEvent(d.compute, e); err != nil {
				return err
			}
		}
		if hook != nil {
			if err := drv.EventRecord(d.timing[2*i], d.compute); err != nil {
				return err
			}
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s: %s: %w", where(*in), in.Op, err)
		}
		if hook != nil {
			if err := drv.EventRecord(d.timing[2*i+1], d.compute); err != nil {
				return err
			}
		}
		for _, e := range d.waitAfter[i] {
			if err := drv.StreamWaitEvent(d.compute, e); err != nil {
				return err
			}
		}
		for _, b := range in.Frees {
			d.live -= d.prog.Buffers[b].Bytes
		}
	}
	if err := drv.StreamSynchronize(d.copies); err != nil {
		return err
	}
	if err := drv.StreamSynchronize(d.compute); err != nil {
		return err
	}
	if err := d.checkStatus(); err != nil {
		return err
	}
	if hook != nil && n > 0 {
		for i := range n {
			from, err := drv.EventElapsed(d.timing[0], d.timing[2*i])
			if err != nil {
				return err
			}
			dur, err := drv.EventElapsed(d.timing[2*i], d.timing[2*i+1])
			if err != nil {
				return err
			}
			hook(i, hostStart.Add(msDuration(from)), msDuration(dur))
		}
	}
	return nil
}

func msDuration(ms float32) time.Duration {
	return time.Duration(float64(ms) * float64(time.Millisecond))
}

// timingEvents creates the start and end events of every instruction the
// first time a step is timed.
func (d *Device) timingEvents() error {
	if d.timing != nil {
		return nil
	}
	ev := make([]driver.Event, 0, 2*len(d.steps))
	for range 2 * len(d.steps) {
		e, err := d.rt.drv.EventCreate(driver.EventDefault)
		if err != nil {
			for _, e := range ev {
				_ = d.rt.drv.EventDestroy(e)
			}
			return err
		}
		ev = append(ev, e)
	}
	d.timing = ev
	return nil
}

// checkStatus reads the status words of the kernels that validate token
// ids and labels and names the instruction that met a bad one.
func (d *Device) checkStatus() error {
	if d.nstatus == 0 {
		return nil
	}
	raw := make([]byte, 4*d.nstatus)
	if err := d.rt.drv.MemcpyDtoH(raw, d.mem.keep); err != nil {
		return err
	}
	for w, i := range d.statusOf {
		if binary.LittleEndian.Uint32(raw[4*w:]) == 0 {
			continue
		}
		in := d.prog.Instrs[i]
		return fmt.Errorf("%s: %s: %s", where(in), in.Op, d.badIDs(in))
	}
	return nil
}

// badIDs describes the ids an embedding or cross-entropy found out of
// range, naming one when the ids are still in memory.
func (d *Device) badIDs(in lower.Instr) string {
	idArg, tableArg, dim := 1, 0, 0 // embedding: (table, ids); cross-entropy: (logits, labels)
	what := "token id"
	switch in.Op {
	case "embedding_grad":
		idArg, dim = 0, -1
	case "cross_entropy", "cross_entropy_grad":
		what, dim = "label", 1
	}
	var limit int
	if dim < 0 {
		limit = in.OutType.Shape[0]
	} else {
		limit = in.ArgTypes[tableArg].Shape[dim]
	}
	msg := fmt.Sprintf("a %s outside [0, %d)", what, limit)
	b := d.prog.Buffers[in.Args[idArg]]
	if b.Kind != lower.Input && b.Kind != lower.Param && b.Kind != lower.State {
		return msg
	}
	raw, err := d.read(b)
	if err != nil {
		return msg
	}
	for k := 0; k+4 <= len(raw); k += 4 {
		if id := int32(binary.LittleEndian.Uint32(raw[k:])); id < 0 || int(id) >= limit {
			return fmt.Sprintf("%s %d at position %d is outside [0, %d)", what, id, k/4, limit)
		}
	}
	return msg
}

// PeakBytes is the measured high-water mark of live bytes, persistent
// buffers included, counted as the CPU backend counts it: temporaries
// become live at their first write and die at their last use.
func (d *Device) PeakBytes() int64 { return d.prog.PersistentBytes + d.high }

func (d *Device) source(name string) (lower.Buffer, error) {
	id, ok := d.prog.Sources[name]
	if !ok {
		return lower.Buffer{}, fmt.Errorf("program %q has no param, state or input named %q", d.prog.Name, name)
	}
	return d.prog.Buffers[id], nil
}

// write copies data over buffer b (between steps).
func (d *Device) write(b lower.Buffer, data []byte) error {
	if int64(len(data)) != b.Bytes {
		return fmt.Errorf("%s is %v (%d bytes); got %d bytes", bufferName(b), b.Type, b.Bytes, len(data))
	}
	if b.Host {
		copy(d.mem.host.Bytes()[b.Offset:b.Offset+b.Bytes], data)
		return nil
	}
	if d.rt.drv == nil {
		return fmt.Errorf("program %q was only planned (no GPU)", d.prog.Name)
	}
	return d.rt.drv.MemcpyHtoD(d.ptr(at(b)), data)
}

// read copies buffer b to the host (between steps).
func (d *Device) read(b lower.Buffer) ([]byte, error) {
	out := make([]byte, b.Bytes)
	if b.Host {
		copy(out, d.mem.host.Bytes()[b.Offset:b.Offset+b.Bytes])
		return out, nil
	}
	if d.rt.drv == nil {
		return nil, fmt.Errorf("program %q was only planned (no GPU)", d.prog.Name)
	}
	if err := d.rt.drv.MemcpyDtoH(out, d.ptr(at(b))); err != nil {
		return nil, err
	}
	return out, nil
}

// hostIO runs f with the device's context current on the thread.
func (d *Device) hostIO(f func() error) error {
	leave, err := d.rt.enter()
	if err != nil {
		return err
	}
	defer leave()
	return f()
}

// SetInt32 writes an i32 input (tokens, targets).
func (d *Device) SetInt32(name string, data []int32) error {
	b, err := d.source(name)
	if err != nil {
		return err
	}
	if b.Type.DType != ir.I32 || int64(len(data)) != b.Type.Shape.NumElements() {
		return fmt.Errorf("input %q is %v; got %d int32 values", name, b.Type, len(data))
	}
	raw := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
	}
	return d.hostIO(func() error { return d.write(b, raw) })
}

// SetScalar writes a scalar input (lr, step, loss_scale) of any numeric dtype.
func (d *Device) SetScalar(name string, x float64) error {
	b, err := d.source(name)
	if err != nil {
		return err
	}
	if b.Type.Rank() != 0 {
		return fmt.Errorf("input %q is %v, not a scalar", name, b.Type)
	}
	raw, err := encode(b.Type, x)
	if err != nil {
		return fmt.Errorf("input %q: %w", name, err)
	}
	d.scalars[b.ID] = x
	return d.hostIO(func() error { return d.write(b, raw) })
}

// Scalar reads a scalar output (the loss, the gradient norm).
func (d *Device) Scalar(name string) (float64, error) {
	x, err := d.Float64s(name)
	if err != nil {
		return 0, err
	}
	if len(x) != 1 {
		return 0, fmt.Errorf("output %q has %d elements, not 1", name, len(x))
	}
	return x[0], nil
}

// Float64s reads an output or a source as float64s.
func (d *Device) Float64s(name string) ([]float64, error) {
	id, ok := d.prog.Outputs[name]
	if !ok {
		b, err := d.source(name)
		if err != nil {
			return nil, fmt.Errorf("no output or source named %q", name)
		}
		id = b.ID
	}
	b := d.prog.Buffers[id]
	var raw []byte
	if err := d.hostIO(func() (err error) { raw, err = d.read(b); return err }); err != nil {
		return nil, err
	}
	return decode(b.Type, raw)
}

// SetFloat64s writes a float source (a param or state) from float64s.
func (d *Device) SetFloat64s(name string, x []float64) error {
	b, err := d.source(name)
	if err != nil {
		return err
	}
	if int64(len(x)) != b.Type.Shape.NumElements() {
		return fmt.Errorf("%q is %v; got %d values", name, b.Type, len(x))
	}
	if !b.Type.DType.IsFloat() {
		return fmt.Errorf("%q is %v, not a float tensor", name, b.Type)
	}
	raw, err := encodeAll(b.Type.DType, x)
	if err != nil {
		return err
	}
	return d.hostIO(func() error { return d.write(b, raw) })
}

// Bytes returns a copy of a source's raw little-endian bytes (for
// checkpoints and evaluation programs).
func (d *Device) Bytes(name string) ([]byte, ir.Type, error) {
	b, err := d.source(name)
	if err != nil {
		return nil, ir.Type{}, err
	}
	var raw []byte
	err = d.hostIO(func() (err error) { raw, err = d.read(b); return err })
	return raw, b.Type, err
}

// SetBytes overwrites a source with raw bytes of its exact size.
func (d *Device) SetBytes(name string, data []byte) error {
	b, err := d.source(name)
	if err != nil {
		return err
	}
	return d.hostIO(func() error { return d.write(b, data) })
}

// InitParams sets every param from its init attribute, with the bytes
// the CPU backend would hold (cpu.InitialBytes: the same seed gives the
// same bits), and zeroes the optimizer state.
func (d *Device) InitParams(seed uint64) error {
	return d.hostIO(func() error {
		for _, b := range d.prog.Buffers {
			var raw []byte
			switch b.Kind {
			case lower.State:
				raw = make([]byte, b.Bytes)
			case lower.Param:
				var err error
				if raw, err = cpu.InitialBytes(b, d.prog.Mesh, d.coords, seed); err != nil {
					return err
				}
			default:
				continue
			}
			if err := d.write(b, raw); err != nil {
				return err
			}
		}
		// State initialised as a copy of a param (PipeDream-2BW's previous
		// weight version) is copied once every param is set.
		for _, b := range d.prog.Buffers {
			if from, ok := strings.CutPrefix(b.Value.Attrs.Str("init"), "copy:"); ok && b.Kind == lower.State {
				src, err := d.source(from)
				if err != nil {
					return fmt.Errorf("%s: init copies %q: %w", b.Value.Where(), from, err)
				}
				raw, err := d.read(src)
				if err != nil {
					return err
				}
				if err := d.write(b, raw); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// encode is x as one element of t's dtype, repeated over t's elements.
func encode(t ir.Type, x float64) ([]byte, error) {
	n := t.Shape.NumElements()
	xs := make([]float64, n)
	kcpu.Fill(xs, x)
	return encodeAll(t.DType, xs)
}

// encodeAll converts float64s to little-endian elements of dtype dt.
// 16-bit formats round to nearest even, as the kernels do.
func encodeAll(dt ir.DType, x []float64) ([]byte, error) {
	out := make([]byte, int64(len(x))*dt.Size())
	switch dt {
	case ir.F32:
		for i, v := range x {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
		}
	case ir.I32:
		for i, v := range x {
			binary.LittleEndian.PutUint32(out[4*i:], uint32(int32(v)))
		}
	case ir.I64:
		for i, v := range x {
			binary.LittleEndian.PutUint64(out[8*i:], uint64(int64(v)))
		}
	case ir.F16, ir.BF16:
		f := make([]float32, len(x))
		kcpu.Cast(f, x)
		h := make([]uint16, len(x))
		kcpu.Round16(h, f, dt == ir.BF16)
		for i, v := range h {
			binary.LittleEndian.PutUint16(out[2*i:], v)
		}
	default:
		return nil, fmt.Errorf("the cuda backend cannot write %v values", dt)
	}
	return out, nil
}

// decode reads little-endian elements of t as float64s.
func decode(t ir.Type, raw []byte) ([]float64, error) {
	n := t.Shape.NumElements()
	out := make([]float64, n)
	switch t.DType {
	case ir.F32:
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		}
	case ir.I32:
		for i := range out {
			out[i] = float64(int32(binary.LittleEndian.Uint32(raw[4*i:])))
		}
	case ir.I64:
		for i := range out {
			out[i] = float64(int64(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	case ir.F16, ir.BF16:
		h := make([]uint16, n)
		for i := range h {
			h[i] = binary.LittleEndian.Uint16(raw[2*i:])
		}
		f := make([]float32, n)
		kcpu.Widen16(f, h, t.DType == ir.BF16)
		kcpu.Cast(out, f)
	default:
		return nil, fmt.Errorf("cannot read %v", t)
	}
	return out, nil
}
