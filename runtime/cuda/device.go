package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"gcompile/codegen"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cuda/cublaslt"
	"gcompile/runtime/cuda/driver"
)

// Options configure a device.
type Options struct {
	// MemoryCap is the most arena bytes the device may hold; 0 means the
	// GPU's memory is the only limit.
	MemoryCap int64
	// Timeout bounds a cluster's step: a device still running then (its
	// stream waiting in NCCL for a rank that failed or stalled) is freed
	// with ncclCommAbort. 0: no bound.
	Timeout time.Duration
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
	// comms runs gradient buckets' reductions beside the compute stream
	// (made when the program has a bucket); buckets are those
	// reductions, in program order, and bucketTmp the workspace the
	// fabric reduces them into.
	comms     driver.Stream
	buckets   []*bucketPlan
	bucketTmp *loc
	// scatterPlans are the reduce-scatter buckets on the comm stream, in
	// program order, and scatterTmp their two staging buffers
	// (scatterStaging).
	scatterPlans []*bucketPlan
	scatterTmp   *[2][2]loc
	// onComm marks the instructions of the bucket runs issued on the comm
	// stream: every other collective of their axis waits for them.
	onComm map[int]bool

	lt        cublaslt.Handle
	plans     []*cublaslt.Plan
	gemmBytes uint64
	launches  []*launch
	events    []driver.Event
	// generated are the kernels written at load for the program's fused
	// ops, by name (one per distinct body).
	generated map[string]codegen.CUDAKernel

	steps []func() error
	// fetches are the host-to-device copies (on the copy stream), by
	// instruction, with the event each records when done; hostWrites the
	// instructions that write host memory on the compute stream.
	fetches    map[int]driver.Event
	hostWrites map[int]bool
	// touches lists, by instruction, the buffers its closure reads or
	// writes besides its own arguments and result (the first all_reduce
	// of a bucket works on every member's buffers), so that the copy
	// waits cover them too.
	touches map[int][]int
	// planEvents numbers the stand-in events of a planning device, so
	// that the planned waits can be told apart without a GPU.
	planEvents driver.Event
	// waitBefore and waitAfter are the host-to-device copies the compute
	// stream must wait for around an instruction.
	waitBefore, waitAfter [][]driver.Event
	// scalars remembers the host value of each scalar input set, so that
	// a kernel that cannot fail checks its step number here.
	scalars map[int]float64
	// inboxes and links are the receiving ends and the streams of
	// pipeline transfers over NCCL, by peer (see ncclComm).
	inboxes map[int]*inbox
	links   map[link]driver.Stream

	// peak counts the bytes live buffers hold as the CPU device counts them.
	peak runtime.PeakMeter
	// OnInstr, when set, is told each instruction's start and duration,
	// measured with events on the compute stream (the Chrome trace).
	OnInstr func(i int, start time.Time, d time.Duration)
	timing  []driver.Event
	// onIssue, when set, is told each instruction's index before its
	// waits and work are queued (tests mark the fake GPU's call trace).
	onIssue func(i int)

	// notes describe each instruction's launches (launch plans).
	notes [][]string

	// HostView reads and writes the device's params, state, inputs and
	// outputs by name between steps, as the CPU backend's devices do.
	runtime.HostView
}

// Load loads p as a single device on rt.
func Load(rt *Runtime, p *lower.Program, opts Options) (*Device, error) {
	if p.Mesh != nil && p.Mesh.Devices() > 1 {
		return nil, fmt.Errorf("program %q spans mesh %v: load it with NewCluster", p.Name, p.Mesh)
	}
	return load(rt, p, opts, 0, nil)
}

func load(rt *Runtime, p *lower.Program, opts Options, rank int, cm comm) (d *Device, err error) {
	if registryErr != nil {
		return nil, fmt.Errorf("the cuda backend's op registry: %w", registryErr)
	}
	if err := checkDTypes(p); err != nil {
		return nil, err
	}
	if opts.MemoryCap > 0 && p.ArenaBytes > opts.MemoryCap {
		return nil, fmt.Errorf("program %q needs an arena of %d bytes, more than the device cap of %d bytes", p.Name, p.ArenaBytes, opts.MemoryCap)
	}
	d = &Device{rt: rt, prog: p, rank: rank, comm: cm, scalars: map[int]float64{}, inboxes: map[int]*inbox{}, links: map[link]driver.Stream{},
		fetches: map[int]driver.Event{}, hostWrites: map[int]bool{}, touches: map[int][]int{}}
	if p.Mesh != nil {
		if rank < 0 || rank >= p.Mesh.Devices() {
			return nil, fmt.Errorf("program %q spans mesh %v: rank %d is outside it", p.Name, p.Mesh, rank)
		}
		d.coords = p.Mesh.Coords(rank)
	}
	d.HostView = runtime.NewHostView(p, d.coords, hostMemory{d})
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
	for i, in := range p.Instrs {
		f, err := d.compile(i, in)
		if err != nil {
			return d, fmt.Errorf("%s: %s: %w", where(in), in.Op, err)
		}
		d.steps = append(d.steps, f)
	}
	d.peak = runtime.NewPeakMeter(p)
	d.planCopyWaits()
	d.planBucketWaits()
	if err := rt.loadGenerated(d.generated); err != nil {
		return d, err
	}
	if err := d.allocate(); err != nil {
		return d, err
	}
	for _, l := range d.launches {
		if l.fn == 0 && rt.drv != nil {
			if l.fn, err = rt.generatedFunction(l.k.Name); err != nil {
				return d, err
			}
		}
		d.finalize(l)
	}
	for _, b := range p.Buffers {
		if b.Kind == lower.Const && rt.drv != nil {
			raw, err := runtime.ConstBytes(b, p.Mesh, d.coords)
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
	for k, s := range d.links {
		errs = append(errs, drv.StreamSynchronize(s), drv.StreamDestroy(s))
		delete(d.links, k)
	}
	for _, s := range []*driver.Stream{&d.compute, &d.copies, &d.comms} {
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
func (d *Device) Close() error { return d.hostIO(d.release) }

// event creates an event for ordering work between streams (no timing).
// A planning device hands out distinct stand-in handles that are never
// given to a driver.
func (d *Device) event() (driver.Event, error) {
	if d.rt.drv == nil {
		d.planEvents++
		return d.planEvents, nil
	}
	e, err := d.rt.drv.EventCreate(driver.EventDisableTiming)
	if err != nil {
		return 0, err
	}
	d.events = append(d.events, e)
	return e, nil
}

// link names one of a device's transfer streams: to or from a peer.
type link struct {
	peer int
	send bool
}

// linkStream is the stream of the device's transfers to (send) or from
// peer, made the first time it is asked for (at load, by the transfer's
// preparation).
func (d *Device) linkStream(peer int, send bool) (driver.Stream, error) {
	k := link{peer, send}
	if s, ok := d.links[k]; ok {
		return s, nil
	}
	if d.rt.drv == nil {
		return 0, nil
	}
	s, err := d.rt.drv.StreamCreate(driver.StreamDefault)
	if err != nil {
		return 0, err
	}
	d.links[k] = s
	return s, nil
}

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
			if d.comms != 0 {
				_ = drv.StreamSynchronize(d.comms)
			}
			for _, s := range d.links {
				_ = drv.StreamSynchronize(s)
			}
		}
	}()
	for _, box := range d.inboxes {
		box.posted = 0
		clear(box.used)
	}
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
	d.peak.Start()
	for i, f := range d.steps[:n] {
		in := &d.prog.Instrs[i]
		if d.onIssue != nil {
			d.onIssue(i)
		}
		d.peak.Issue(i)
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
		d.peak.Retire(i)
	}
	if err := drv.StreamSynchronize(d.copies); err != nil {
		return err
	}
	// A bucket whose results nothing in this step waited for (the end of
	// a forward-only run, a program whose gradients are outputs) is done
	// before the host reads anything.
	if d.comms != 0 {
		if err := drv.StreamSynchronize(d.comms); err != nil {
			return err
		}
	}
	if err := drv.StreamSynchronize(d.compute); err != nil {
		return err
	}
	// A step's transfers end within it: the next step's copies into the
	// staging regions must not overtake them.
	for _, s := range d.links {
		if err := drv.StreamSynchronize(s); err != nil {
			return err
		}
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
	case "moe_dispatch", "moe_combine", "moe_slot_dot", "moe_slot_gather", "moe_slot_scatter":
		return d.badSlots(in)
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
func (d *Device) PeakBytes() int64 { return d.peak.PeakBytes() }

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

// SetScalar writes a scalar input (lr, step, loss_scale) and remembers
// its value on the host: an optimizer instruction checks the step number
// there, since a queued kernel cannot report a bad one.
func (d *Device) SetScalar(name string, x float64) error {
	if err := d.HostView.SetScalar(name, x); err != nil {
		return err
	}
	b, err := d.Source(name)
	if err != nil {
		return err
	}
	d.scalars[b.ID] = x
	return nil
}

// hostMemory is a GPU device's buffers as the host reaches them: copies
// made with the device's context current on the calling thread.
type hostMemory struct{ d *Device }

func (m hostMemory) ReadBuffer(b lower.Buffer) ([]byte, error) {
	var raw []byte
	err := m.d.hostIO(func() (err error) { raw, err = m.d.read(b); return err })
	return raw, err
}

func (m hostMemory) WriteBuffer(b lower.Buffer, data []byte) error {
	return m.d.hostIO(func() error { return m.d.write(b, data) })
}
