// Package cpu runs lowered programs on the CPU. Each device owns one arena
// (a single allocation sized by the compile-time memory plan); every buffer
// is a typed view at its static offset, and each instruction is turned into
// a Go closure once, at load, so a step is a loop of calls. Devices reach
// one another through a runtime.Comm: in-process when a cluster holds
// every device, over TCP when a job spreads them over processes.
package cpu

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// Options configure a device.
type Options struct {
	// MemoryCap is the most arena bytes the device may hold; 0 means unlimited.
	MemoryCap int64
	// HostMemory says what the machine can still give; the arenas of all
	// the devices a load allocates must fit in it together. Nil reads
	// Linux's figures (HostMemory).
	HostMemory MemorySource
	// Rank is the device's global rank in the mesh and Comm connects it
	// to the others (nil for one device): collectives and pipeline
	// transfers.
	Rank int
	Comm runtime.Comm
}

// Device is one virtual CPU device executing one program.
type Device struct {
	prog  *lower.Program
	arena []uint64 // uint64 backing keeps every view 8-byte aligned
	bytes []byte
	// host holds offloaded buffers (params and optimizer state under --offload).
	host []byte
	run  []func() error
	// peak counts the bytes live buffers hold as the program runs.
	peak runtime.PeakMeter
	// OnInstr, when set, is told each instruction's start and duration
	// (the Chrome trace).
	OnInstr func(i int, start time.Time, d time.Duration)

	rank   int
	coords []int // position on each mesh axis
	comm   runtime.Comm
	// scatterStage is the staging of the buckets of reduce-scatters
	// (scatterStaging), *[2][]T for the program's float type; instrAt
	// each instruction's position by its value (indexOf).
	scatterStage any
	instrAt      map[*ir.Value]int

	// HostView reads and writes the device's params, state, inputs and
	// outputs by name between steps.
	runtime.HostView
}

// Load allocates the arena and prepares every instruction. It refuses,
// before allocating, an arena larger than opts.MemoryCap or than the
// memory the machine has available.
func Load(p *lower.Program, opts Options) (*Device, error) {
	if err := checkMemory([]*lower.Program{p}, []string{deviceName(opts.Rank)}, opts); err != nil {
		return nil, err
	}
	return loadChecked(p, opts)
}

// loadChecked is Load once checkMemory has passed p: a cluster checks all
// its devices' arenas together, then loads each.
func loadChecked(p *lower.Program, opts Options) (*Device, error) {
	if registryErr != nil {
		return nil, fmt.Errorf("the cpu backend's kernels: %w", registryErr)
	}
	d := &Device{prog: p, arena: make([]uint64, (p.ArenaBytes+7)/8), rank: opts.Rank, comm: opts.Comm}
	if p.Mesh != nil {
		if opts.Comm == nil || opts.Comm.Size() != p.Mesh.Devices() || opts.Rank < 0 || opts.Rank >= p.Mesh.Devices() {
			return nil, fmt.Errorf("program %q spans mesh %v: load it with a Comm for %d devices and a rank below that", p.Name, p.Mesh, p.Mesh.Devices())
		}
		d.coords = p.Mesh.Coords(opts.Rank)
	}
	d.HostView = runtime.NewHostView(p, d.coords, arenaMemory{d})
	d.bytes = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.arena))), len(d.arena)*8)
	if p.HostBytes > 0 {
		h := make([]uint64, (p.HostBytes+7)/8)
		d.host = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), len(h)*8)
	}
	for _, b := range p.Buffers {
		if b.Kind == lower.Const {
			raw, err := runtime.ConstBytes(b, p.Mesh, d.coords)
			if err != nil {
				return nil, fmt.Errorf("%s: constant: %w", b.Value.Where(), err)
			}
			copy(d.raw(b), raw)
		}
	}
	for _, in := range p.Instrs {
		f, err := d.compile(in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Value.Where(), err)
		}
		d.run = append(d.run, f)
	}
	d.peak = runtime.NewPeakMeter(p)
	return d, nil
}

// mem is the memory a buffer lives in: the device arena or, offloaded, the host's.
func (d *Device) mem(b lower.Buffer) []byte {
	if b.Host {
		return d.host
	}
	return d.bytes
}

func (d *Device) raw(b lower.Buffer) []byte { return d.mem(b)[b.Offset : b.Offset+b.Bytes] }

func view[T any](d *Device, id int) []T {
	b := d.prog.Buffers[id]
	var zero T
	n := int(b.Bytes / int64(unsafe.Sizeof(zero)))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&d.mem(b)[b.Offset])), n)
}

// Step runs the whole program once: forward, backward, optimizer, updates.
func (d *Device) Step() error { return d.exec(len(d.run)) }

// Forward runs only the instructions the loss needs.
func (d *Device) Forward() error {
	if d.prog.ForwardEnd < 0 {
		return fmt.Errorf("program %q has no forward-only part (a pipeline rank's program interleaves forward and backward)", d.prog.Name)
	}
	return d.exec(d.prog.ForwardEnd)
}

// ErrMalformed marks an instruction whose buffers do not fit its kernel,
// which only a program edited by hand reaches.
var ErrMalformed = errors.New("malformed instruction: its buffers do not fit its kernel (a .gir whose placements were edited after the shard pass, on an op the verifier does not recheck such as a slice, makes such programs; from a model.go, it is a bug of gcompile's: please report it with this message)")

func (d *Device) exec(n int) (err error) {
	at := -1
	defer func() {
		// A kernel's own check (operand lengths, ranks) failing is an
		// error naming the instruction, not a crash of every device's
		// goroutine: the lowering only builds what fits, so it meets a
		// program whose placements were edited inconsistently on an op
		// the verifier does not recheck (ir's checkLocalShapes).
		if p := recover(); p != nil {
			where := "before the first instruction"
			if at >= 0 {
				where = d.prog.Instrs[at].Value.Where()
			}
			err = fmt.Errorf("%s: %v: %w", where, p, ErrMalformed)
		}
	}()
	d.peak.Start()
	for i, f := range d.run[:n] {
		at = i
		in := &d.prog.Instrs[i]
		d.peak.Issue(i)
		var start time.Time
		if d.OnInstr != nil {
			start = time.Now()
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", in.Value.Where(), err)
		}
		if d.OnInstr != nil {
			d.OnInstr(i, start, time.Since(start))
		}
		d.peak.Retire(i)
	}
	return nil
}

// PeakBytes is the measured high-water mark of live bytes, persistent
// buffers included.
func (d *Device) PeakBytes() int64 { return d.peak.PeakBytes() }

// arenaMemory is a CPU device's buffers as the host reaches them: the
// very bytes the instructions use, since host and device share memory.
type arenaMemory struct{ d *Device }

func (m arenaMemory) ReadBuffer(b lower.Buffer) ([]byte, error) { return m.d.raw(b), nil }

func (m arenaMemory) WriteBuffer(b lower.Buffer, data []byte) error {
	copy(m.d.raw(b), data)
	return nil
}
