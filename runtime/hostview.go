package runtime

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// DeviceMemory is how the host reaches a device's buffers between steps;
// each backend says where its buffers live. ReadBuffer returns the
// buffer's bytes: the buffer itself where the host shares the device's
// memory (this backend), a copy where it does not (a GPU). Callers
// neither keep nor modify them. WriteBuffer copies data, of the buffer's
// exact size, over the buffer.
type DeviceMemory interface {
	ReadBuffer(b lower.Buffer) ([]byte, error)
	WriteBuffer(b lower.Buffer, data []byte) error
}

// HostView is one device's program as the host sees it between steps:
// params, state and inputs by name (its sources), outputs by name, read
// and written as float64s, int32s or raw little-endian bytes whatever
// the buffer's dtype. It holds no memory of its own, so every backend's
// device embeds one over its DeviceMemory and gets the same checks, the
// same conversions and the same initial weights.
type HostView struct {
	prog   *lower.Program
	coords []int
	mem    DeviceMemory
}

// NewHostView is the view of prog on the device at coords of prog's mesh
// (nil without a mesh) whose buffers mem reaches.
func NewHostView(prog *lower.Program, coords []int, mem DeviceMemory) HostView {
	return HostView{prog: prog, coords: coords, mem: mem}
}

// Program is the program the device runs.
func (v HostView) Program() *lower.Program { return v.prog }

// Coords is the device's position on each axis of the program's mesh
// (nil without a mesh).
func (v HostView) Coords() []int { return v.coords }

// Source is the buffer of the param, state or input called name.
func (v HostView) Source(name string) (lower.Buffer, error) {
	id, ok := v.prog.Sources[name]
	if !ok {
		return lower.Buffer{}, fmt.Errorf("program %q has no param, state or input named %q", v.prog.Name, name)
	}
	return v.prog.Buffers[id], nil
}

// write checks the size here rather than in each backend's memory, so a
// short write can never leave part of a buffer stale.
func (v HostView) write(b lower.Buffer, data []byte) error {
	if int64(len(data)) != b.Bytes {
		return fmt.Errorf("%q is %v (%d bytes); got %d bytes", b.Name, b.Type, b.Bytes, len(data))
	}
	return v.mem.WriteBuffer(b, data)
}

// SetInt32 writes an i32 input (tokens, targets).
func (v HostView) SetInt32(name string, data []int32) error {
	b, err := v.Source(name)
	if err != nil {
		return err
	}
	if b.Type.DType != ir.I32 || int64(len(data)) != b.Type.Shape.NumElements() {
		return fmt.Errorf("input %q is %v; got %d int32 values", name, b.Type, len(data))
	}
	raw := make([]byte, 4*len(data))
	for i, x := range data {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(x))
	}
	return v.write(b, raw)
}

// SetScalar writes a scalar input (lr, step, loss_scale) of any numeric dtype.
func (v HostView) SetScalar(name string, x float64) error {
	b, err := v.Source(name)
	if err != nil {
		return err
	}
	if b.Type.Rank() != 0 {
		return fmt.Errorf("input %q is %v, not a scalar", name, b.Type)
	}
	raw, err := EncodeFilled(b.Type, x)
	if err != nil {
		return fmt.Errorf("input %q: %w", name, err)
	}
	return v.write(b, raw)
}

// Scalar reads a scalar output (the loss, the gradient norm).
func (v HostView) Scalar(name string) (float64, error) {
	x, err := v.Float64s(name)
	if err != nil {
		return 0, err
	}
	if len(x) != 1 {
		return 0, fmt.Errorf("output %q has %d elements, not 1", name, len(x))
	}
	return x[0], nil
}

// Float64s reads an output or a source as float64s.
func (v HostView) Float64s(name string) ([]float64, error) {
	id, ok := v.prog.Outputs[name]
	if !ok {
		b, err := v.Source(name)
		if err != nil {
			return nil, fmt.Errorf("no output or source named %q", name)
		}
		id = b.ID
	}
	b := v.prog.Buffers[id]
	raw, err := v.mem.ReadBuffer(b)
	if err != nil {
		return nil, err
	}
	return Decode(b.Type, raw)
}

// SetFloat64s writes a float source (a param or state) from float64s,
// rounding to the buffer's dtype.
func (v HostView) SetFloat64s(name string, x []float64) error {
	b, err := v.Source(name)
	if err != nil {
		return err
	}
	if int64(len(x)) != b.Type.Shape.NumElements() {
		return fmt.Errorf("%q is %v; got %d values", name, b.Type, len(x))
	}
	if !b.Type.DType.IsFloat() {
		return fmt.Errorf("%q is %v, not a float tensor", name, b.Type)
	}
	raw, err := Encode(b.Type.DType, x)
	if err != nil {
		return fmt.Errorf("%q: %w", name, err)
	}
	return v.write(b, raw)
}

// Bytes returns a source's raw little-endian bytes (for checkpoints and
// evaluation programs), as DeviceMemory.ReadBuffer gives them.
func (v HostView) Bytes(name string) ([]byte, ir.Type, error) {
	b, err := v.Source(name)
	if err != nil {
		return nil, ir.Type{}, err
	}
	raw, err := v.mem.ReadBuffer(b)
	if err != nil {
		return nil, ir.Type{}, err
	}
	return raw, b.Type, nil
}

// SetBytes overwrites a source with raw bytes of its exact size.
func (v HostView) SetBytes(name string, data []byte) error {
	b, err := v.Source(name)
	if err != nil {
		return err
	}
	return v.write(b, data)
}

// InitParams sets every param from its init attribute (InitialBytes) and
// zeroes the optimizer state. A param's values depend only on the seed
// and its name, never on the plan or the backend, so every parallel
// configuration on every backend starts from the weights of one device.
func (v HostView) InitParams(seed uint64) error {
	for _, b := range v.prog.Buffers {
		var raw []byte
		switch b.Kind {
		case lower.State:
			raw = make([]byte, b.Bytes)
		case lower.Param:
			var err error
			if raw, err = InitialBytes(b, v.prog.Mesh, v.coords, seed); err != nil {
				return err
			}
		default:
			continue
		}
		if err := v.write(b, raw); err != nil {
			return err
		}
	}
	// State initialised as a copy of a param (PipeDream-2BW's previous
	// weight version) is copied once every param is set.
	for _, b := range v.prog.Buffers {
		from, ok := strings.CutPrefix(b.Value.Attrs.Str("init"), ir.InitCopyPrefix)
		if !ok || b.Kind != lower.State {
			continue
		}
		src, err := v.Source(from)
		if err != nil {
			return fmt.Errorf("%s: init copies %q: %w", b.Value.Where(), from, err)
		}
		raw, err := v.mem.ReadBuffer(src)
		if err != nil {
			return err
		}
		if src.Type.DType != b.Type.DType {
			// A version kept in the compute dtype (under mixed precision)
			// starts as the param rounded as the cast kernels round.
			x, err := Decode(src.Type, raw)
			if err != nil {
				return fmt.Errorf("%s: init copies %q: %w", b.Value.Where(), from, err)
			}
			if raw, err = Encode(b.Type.DType, x); err != nil {
				return fmt.Errorf("%s: init copies %q: %w", b.Value.Where(), from, err)
			}
		}
		if err := v.write(b, raw); err != nil {
			return err
		}
	}
	return nil
}

// ConstBytes is the content of const buffer b on the device at coords of
// mesh: its table (ir.ConstData), the device's block of it when it is
// placed in parts, or its fill value, encoded in the buffer's dtype.
func ConstBytes(b lower.Buffer, mesh *ir.Mesh, coords []int) ([]byte, error) {
	data, err := ir.ConstData(b.Value)
	if err != nil {
		return nil, err
	}
	if data == nil {
		return EncodeFilled(b.Type, b.Value.Attrs.Float("value", 0))
	}
	return Encode(b.Type.DType, Block(data, b, mesh, coords))
}

// EncodeFilled is t's elements, every one x, as little-endian bytes of
// t's dtype (a scalar input, a constant).
func EncodeFilled(t ir.Type, x float64) ([]byte, error) {
	xs := make([]float64, t.Shape.NumElements())
	kcpu.Fill(xs, x)
	return Encode(t.DType, xs)
}

// Encode converts float64s to little-endian elements of dtype dt, the
// layout both backends keep in memory. 16-bit formats round to nearest
// even, as the kernels do; integers truncate toward zero.
func Encode(dt ir.DType, x []float64) ([]byte, error) {
	out := make([]byte, int64(len(x))*dt.Size())
	switch dt {
	case ir.F32:
		for i, v := range x {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
		}
	case ir.F64:
		for i, v := range x {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(v))
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
		return nil, fmt.Errorf("cannot write %v values", dt)
	}
	return out, nil
}

// Decode reads raw, little-endian elements of type t, as float64s; the
// inverse of Encode up to its rounding.
func Decode(t ir.Type, raw []byte) ([]float64, error) {
	n := t.Shape.NumElements()
	switch t.DType {
	case ir.F32, ir.F64, ir.I32, ir.I64, ir.F16, ir.BF16:
	default:
		return nil, fmt.Errorf("cannot read %v", t)
	}
	if int64(len(raw)) < n*t.DType.Size() {
		return nil, fmt.Errorf("%v needs %d bytes; got %d", t, n*t.DType.Size(), len(raw))
	}
	out := make([]float64, n)
	switch t.DType {
	case ir.F32:
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		}
	case ir.F64:
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
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
	}
	return out, nil
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
	std, normal, err := ir.ParseInit(init)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", b.Value.Where(), err)
	case !normal:
		x = make([]float64, local)
		if std != 0 {
			kcpu.Fill(x, std)
		}
	default:
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
	switch b.Type.DType {
	case ir.F32, ir.F64, ir.I32, ir.I64:
		return Encode(b.Type.DType, x)
	}
	return nil, fmt.Errorf("%s: the cpu backend has no %v storage for param %q", b.Value.Where(), b.Type.DType, b.Name)
}

// Block returns the block of a whole tensor x, laid out as b.Global, that
// the device at coords of mesh holds: each sharded dim keeps the slice at
// the device's coordinate on the sharding axis. With no mesh or placement
// it is x itself.
func Block[T any](x []T, b lower.Buffer, mesh *ir.Mesh, coords []int) []T {
	if mesh == nil || b.Place == nil {
		return x
	}
	x = zigzagHeld(x, b.Global.Shape, ZigzagSplits(mesh, b.Place))
	box := ir.BlockBox(mesh, b.Place, b.Global.Shape, coords)
	return block(x, box.Shape, box.Lo, box.Size)
}

// Unblock writes blk, the block of the device at coords of mesh, into
// whole, the inverse of Block.
func Unblock[T any](whole []T, b lower.Buffer, mesh *ir.Mesh, coords []int, blk []T) {
	if mesh == nil || b.Place == nil {
		copy(whole, blk)
		return
	}
	box := ir.BlockBox(mesh, b.Place, b.Global.Shape, coords)
	splits := ZigzagSplits(mesh, b.Place)
	if len(splits) == 0 {
		unblock(whole, box.Shape, box.Lo, box.Size, blk)
		return
	}
	// In the held order the block is a box; the rest of whole keeps what
	// it had.
	held := zigzagHeld(whole, b.Global.Shape, splits)
	unblock(held, box.Shape, box.Lo, box.Size, blk)
	for i := len(splits) - 1; i >= 0; i-- {
		Zigzag(whole, held, b.Global.Shape, splits[i], false)
		if i > 0 {
			copy(held, whole)
		}
	}
}

// VocabRows reports whether value v (a [vocab, dim] table or its
// gradient) is split by rows on mesh, and then the first row the device
// at coords holds and the whole vocabulary: a vocab-parallel embedding's
// gradient keeps only the device's rows.
func VocabRows(mesh *ir.Mesh, v *ir.Value, coords []int) (offset, vocab int, split bool) {
	if mesh == nil || v == nil || v.Place == nil || v.Type.Rank() != 2 {
		return 0, 0, false
	}
	for _, p := range v.Place {
		if p.Kind == ir.Shard && p.Dim == 0 {
			box := ir.BlockBox(mesh, v.Place, v.Type.Shape, coords)
			return box.Lo[0], v.Type.Shape[0], true
		}
	}
	return 0, 0, false
}
