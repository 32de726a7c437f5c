// Package cpu runs lowered programs on the CPU. Each device owns one arena
// (a single allocation sized by the compile-time memory plan); every buffer
// is a typed view at its static offset, and each instruction is turned into
// a Go closure once, at load, so a step is a loop of calls.
package cpu

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// Options configure a device.
type Options struct {
	// MemoryCap is the most arena bytes the device may hold; 0 means unlimited.
	MemoryCap int64
	// Rank is the device's global rank in the mesh and Comm the in-process
	// communicator shared by the devices (nil for one device).
	Rank int
	Comm *Comm
	// Mail carries pipeline sends and receives between devices.
	Mail *Mailbox
}

// Device is one virtual CPU device executing one program.
type Device struct {
	prog  *lower.Program
	arena []uint64 // uint64 backing keeps every view 8-byte aligned
	bytes []byte
	// host holds offloaded buffers (params and optimizer state under --offload).
	host []byte
	run  []func() error
	// born[i]: instruction i is the first to write a device temporary, so
	// its bytes become live there (an offloaded param's device copy is
	// written again by its in-place update; that adds nothing).
	born []bool
	// live and high track bytes held by live buffers as the step executes.
	live, high int64
	// OnInstr, when set, is told each instruction's start and duration
	// (the Chrome trace).
	OnInstr func(i int, start time.Time, d time.Duration)

	rank   int
	coords []int // position on each mesh axis
	comm   *Comm
	mail   *Mailbox
}

// Load allocates the arena and prepares every instruction.
func Load(p *lower.Program, opts Options) (*Device, error) {
	if opts.MemoryCap > 0 && p.ArenaBytes > opts.MemoryCap {
		return nil, fmt.Errorf("program %q needs an arena of %d bytes, more than the device cap of %d bytes", p.Name, p.ArenaBytes, opts.MemoryCap)
	}
	d := &Device{prog: p, arena: make([]uint64, (p.ArenaBytes+7)/8), rank: opts.Rank, comm: opts.Comm, mail: opts.Mail}
	if p.Mesh != nil {
		if opts.Comm == nil || opts.Comm.Devices() != p.Mesh.Devices() || opts.Rank < 0 || opts.Rank >= p.Mesh.Devices() {
			return nil, fmt.Errorf("program %q spans mesh %v: load it with a Comm for %d devices and a rank below that", p.Name, p.Mesh, p.Mesh.Devices())
		}
		d.coords = Coords(p.Mesh, opts.Rank)
	}
	d.bytes = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.arena))), len(d.arena)*8)
	if p.HostBytes > 0 {
		h := make([]uint64, (p.HostBytes+7)/8)
		d.host = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), len(h)*8)
	}
	for _, b := range p.Buffers {
		if b.Kind == lower.Const {
			if err := d.fill(b, b.Value.Attrs.Float("value", 0)); err != nil {
				return nil, err
			}
		}
	}
	written := map[int]bool{}
	for _, in := range p.Instrs {
		f, err := d.compile(in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Value.Where(), err)
		}
		d.run = append(d.run, f)
		born := in.Out >= 0 && p.Buffers[in.Out].Kind == lower.Temp && !p.Buffers[in.Out].Host && !written[in.Out]
		if born {
			written[in.Out] = true
		}
		d.born = append(d.born, born)
	}
	return d, nil
}

// Program is the program the device runs.
func (d *Device) Program() *lower.Program { return d.prog }

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

func (d *Device) fill(b lower.Buffer, x float64) error {
	switch b.Type.DType {
	case ir.F32:
		kcpu.Fill(view[float32](d, b.ID), float32(x))
	case ir.F64:
		kcpu.Fill(view[float64](d, b.ID), x)
	case ir.I32:
		s := view[int32](d, b.ID)
		for i := range s {
			s[i] = int32(x)
		}
	case ir.I64:
		s := view[int64](d, b.ID)
		for i := range s {
			s[i] = int64(x)
		}
	default:
		return fmt.Errorf("the cpu backend has no %v storage yet (16-bit formats come with mixed precision)", b.Type.DType)
	}
	return nil
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

func (d *Device) exec(n int) error {
	d.live = 0
	for i, f := range d.run[:n] {
		in := &d.prog.Instrs[i]
		// Persistent buffers are counted once, in PersistentBytes, and host
		// buffers not at all; a device temporary is live from its first
		// write, as the memory plan has it.
		if d.born[i] {
			d.live += d.prog.Buffers[in.Out].Bytes
		}
		d.high = max(d.high, d.live)
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
		for _, b := range in.Frees {
			d.live -= d.prog.Buffers[b].Bytes
		}
	}
	return nil
}

// PeakBytes is the measured high-water mark of live bytes, persistent
// buffers included.
func (d *Device) PeakBytes() int64 { return d.prog.PersistentBytes + d.high }

func (d *Device) source(name string) (lower.Buffer, error) {
	id, ok := d.prog.Sources[name]
	if !ok {
		return lower.Buffer{}, fmt.Errorf("program %q has no param, state or input named %q", d.prog.Name, name)
	}
	return d.prog.Buffers[id], nil
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
	copy(view[int32](d, b.ID), data)
	return nil
}

// SetScalar writes a scalar input (lr, step) of any numeric dtype.
func (d *Device) SetScalar(name string, x float64) error {
	b, err := d.source(name)
	if err != nil {
		return err
	}
	if b.Type.Rank() != 0 {
		return fmt.Errorf("input %q is %v, not a scalar", name, b.Type)
	}
	return d.fill(b, x)
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
	out := make([]float64, b.Type.Shape.NumElements())
	switch b.Type.DType {
	case ir.F32:
		kcpu.Cast(out, view[float32](d, id))
	case ir.F64:
		copy(out, view[float64](d, id))
	case ir.I32:
		kcpu.Cast(out, view[int32](d, id))
	case ir.I64:
		kcpu.Cast(out, view[int64](d, id))
	default:
		return nil, fmt.Errorf("cannot read %v", b.Type)
	}
	return out, nil
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
	switch b.Type.DType {
	case ir.F32:
		kcpu.Cast(view[float32](d, b.ID), x)
	case ir.F64:
		copy(view[float64](d, b.ID), x)
	default:
		return fmt.Errorf("%q is %v, not a float tensor", name, b.Type)
	}
	return nil
}

// Bytes returns a source's raw little-endian bytes (for checkpoints).
func (d *Device) Bytes(name string) ([]byte, ir.Type, error) {
	b, err := d.source(name)
	if err != nil {
		return nil, ir.Type{}, err
	}
	return d.raw(b), b.Type, nil
}

// SetBytes overwrites a source with raw bytes of its exact size.
func (d *Device) SetBytes(name string, data []byte) error {
	b, err := d.source(name)
	if err != nil {
		return err
	}
	if int64(len(data)) != b.Bytes {
		return fmt.Errorf("%q is %v (%d bytes); got %d bytes", name, b.Type, b.Bytes, len(data))
	}
	copy(d.raw(b), data)
	return nil
}

var normalInit = regexp.MustCompile(`^normal\(([^)]+)\)$`)

// InitParams sets every param from its init attribute and zeroes the
// optimizer state. A param's values depend only on the seed and its name,
// never on the plan, so every parallel configuration starts from the same
// weights as one device.
func (d *Device) InitParams(seed uint64) error {
	for _, b := range d.prog.Buffers {
		switch b.Kind {
		case lower.State:
			clear(d.raw(b))
		case lower.Param:
			if err := d.initParam(b, seed); err != nil {
				return err
			}
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
			copy(d.raw(b), d.raw(src))
		}
	}
	return nil
}

func (d *Device) initParam(b lower.Buffer, seed uint64) error {
	raw, err := InitialBytes(b, d.prog.Mesh, d.coords, seed)
	if err != nil {
		return err
	}
	copy(d.raw(b), raw)
	return nil
}

// InitialBytes is the initial content of param buffer b on the device at
// coords of mesh (nil mesh: the only device): the little-endian bytes of
// the device's block, in the buffer's dtype, from the param's init
// attribute (normal(std), zeros or ones). A normal init draws the whole
// tensor from a PRNG seeded by seed and the param's name and each device
// keeps its block, so a sharded param holds exactly the numbers one device
// would, and every backend that starts from these bytes starts from the
// same weights.
func InitialBytes(b lower.Buffer, mesh *ir.Mesh, coords []int, seed uint64) ([]byte, error) {
	init := b.Value.Attrs.Str("init")
	local := b.Type.Shape.NumElements()
	var x []float64
	switch {
	case init == "zeros" || init == "":
		x = make([]float64, local)
	case init == "ones":
		x = make([]float64, local)
		kcpu.Fill(x, 1)
	default:
		m := normalInit.FindStringSubmatch(init)
		if m == nil {
			return nil, fmt.Errorf("%s: unknown init %q (want normal(std), zeros or ones)", b.Value.Where(), init)
		}
		std, err := strconv.ParseFloat(m[1], 64)
		if err != nil || std < 0 || math.IsNaN(std) {
			return nil, fmt.Errorf("%s: bad std in init %q", b.Value.Where(), init)
		}
		if b.Type.DType != ir.F32 && b.Type.DType != ir.F64 {
			return nil, fmt.Errorf("%s: %q is %v, not a float tensor", b.Value.Where(), b.Name, b.Type)
		}
		h := fnv.New64a()
		h.Write([]byte(b.Name))
		rng := rand.New(rand.NewPCG(seed, h.Sum64()))
		whole := make([]float64, b.Global.Shape.NumElements())
		for i := range whole {
			whole[i] = rng.NormFloat64() * std
		}
		x = Block(whole, b, mesh, coords)
	}
	if int64(len(x)) != local {
		return nil, fmt.Errorf("%s: %q holds %d elements on this device, its block of %v has %d", b.Value.Where(), b.Name, local, b.Global, len(x))
	}
	out := make([]byte, 0, b.Bytes)
	for _, v := range x {
		switch b.Type.DType {
		case ir.F32:
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(v)))
		case ir.F64:
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(v))
		case ir.I32:
			out = binary.LittleEndian.AppendUint32(out, uint32(int32(v)))
		case ir.I64:
			out = binary.LittleEndian.AppendUint64(out, uint64(int64(v)))
		default:
			return nil, fmt.Errorf("%s: the cpu backend has no %v storage for param %q", b.Value.Where(), b.Type.DType, b.Name)
		}
	}
	return out, nil
}

// Block returns the block of a whole tensor x, laid out as b.Global, that
// the device at coords of mesh holds: each sharded dim keeps the slice at
// the device's coordinate on the sharding axis. With no mesh or placement
// it is x itself.
func Block[T any](x []T, b lower.Buffer, mesh *ir.Mesh, coords []int) []T {
	if mesh == nil || b.Place == nil {
		return x
	}
	shape, lo, size := blockOf(mesh, b.Place, b.Global.Shape, coords)
	return block(x, shape, lo, size)
}

// Unblock writes blk, the block of the device at coords of mesh, into
// whole, the inverse of Block.
func Unblock[T any](whole []T, b lower.Buffer, mesh *ir.Mesh, coords []int, blk []T) {
	if mesh == nil || b.Place == nil {
		copy(whole, blk)
		return
	}
	shape, lo, size := blockOf(mesh, b.Place, b.Global.Shape, coords)
	unblock(whole, shape, lo, size, blk)
}
