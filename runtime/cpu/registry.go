package cpu

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// Builder builds the closure that runs one instruction on one device,
// computing in T. It runs once, at load: shapes, strides and views are
// resolved there, not on every step.
type Builder[T kcpu.Float] func(c *Call[T]) (func() error, error)

// Operand names one buffer of an instruction: its result or one of its
// arguments. The zero value is the result.
type Operand int

// Result is an instruction's result buffer.
const Result Operand = 0

// Arg is an instruction's argument i.
func Arg(i int) Operand { return Operand(i + 1) }

// Kernel is how the backend runs the instructions of one op. F32 and F64
// build the closure of an instruction that computes in float32 or float64:
// the backend runs float64 programs for reference runs, so an op needs
// both to take part in them. Most kernels are one generic function
// instantiated twice, Kernel{F32: k[float32], F64: k[float64]}.
//
// Around every float kernel the backend keeps its shared behaviour: fp16
// and bf16 buffers are widened to float32 scratch copies before F32 runs
// and rounded back after it, and Instr.Scale multiplies the result. The
// few ops whose operands are not one float type (copy, cast, send, recv)
// are the backend's own.
type Kernel struct {
	// F32 builds the closure of a float32 instruction, and of a 16-bit
	// one on its widened copies; both builders are required.
	F32 Builder[float32]
	// F64 builds the closure of a float64 instruction.
	F64 Builder[float64]
	// TypeOf is the operand whose dtype picks F32 or F64: the result by
	// default. Ops with a scalar result or a packed mask name the
	// argument that carries the float type instead.
	TypeOf Operand
	// Bits marks an op that only moves elements: an i32 instruction runs
	// F32 on the bits, which copies every element exactly.
	Bits bool

	// raw, when set, replaces the float dispatch for ops whose operands
	// are not one float type (copies, casts, pipeline transfers). It sees
	// 16-bit buffers as they are, and Instr.Scale does not apply.
	raw func(d *Device, in lower.Instr) (func() error, error)
}

// registry holds every op the backend runs, by lower.Instr.Op. The
// built-in kernels are registered at init by the file of their kind
// (kernels_elementwise.go, kernels_shape.go, kernels_linalg.go,
// kernels_nn.go, kernels_attention.go, kernels_optim.go, collective.go,
// kernels_transfer.go, kernels_cast.go), others by RegisterKernel; loads
// only read it.
var registry = struct {
	sync.RWMutex
	kernels map[string]Kernel
}{kernels: map[string]Kernel{}}

// registryErr collects what went wrong registering the built-in kernels.
// Every Load reports it, rather than stopping the process at init.
var registryErr error

// RegisterKernel makes k the kernel of op. Registering an op a second
// time is an error rather than a replacement: two registrations of one op
// would make the kernel that runs depend on initialisation order.
func RegisterKernel(op string, k Kernel) error {
	if op == "" {
		return errors.New("cpu: a kernel needs an op name")
	}
	if k.raw == nil && (k.F32 == nil || k.F64 == nil) {
		return fmt.Errorf("cpu: kernel of op %s needs both an F32 and an F64 builder", op)
	}
	if k.TypeOf < Result {
		return fmt.Errorf("cpu: kernel of op %s types by operand %d, which names no buffer", op, k.TypeOf)
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.kernels[op]; dup {
		return fmt.Errorf("cpu: op %s registered twice", op)
	}
	registry.kernels[op] = k
	return nil
}

// HasKernel reports whether the backend can run instructions of op.
func HasKernel(op string) bool {
	_, ok := kernelOf(op)
	return ok
}

// Kernels lists the ops the backend can run, sorted.
func Kernels() []string {
	registry.RLock()
	defer registry.RUnlock()
	ops := make([]string, 0, len(registry.kernels))
	for op := range registry.kernels {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	return ops
}

func kernelOf(op string) (Kernel, bool) {
	registry.RLock()
	defer registry.RUnlock()
	k, ok := registry.kernels[op]
	return k, ok
}

// builtin registers one of the backend's own kernels under each op name.
func builtin(k Kernel, ops ...string) {
	for _, op := range ops {
		registryErr = errors.Join(registryErr, RegisterKernel(op, k))
	}
}

// compile turns one instruction into a closure over arena views.
func (d *Device) compile(in lower.Instr) (func() error, error) {
	k, ok := kernelOf(in.Op)
	if !ok {
		return nil, fmt.Errorf("the cpu backend has no kernel for op %s", in.Op)
	}
	if k.raw != nil {
		return k.raw(d, in)
	}
	if f, ok := d.compileAddWiden16(in); ok {
		return f, nil
	}
	if f, ok, err := d.compileSum16(in); ok {
		return f, err
	}
	if d.touches16(in) {
		return d.compile16(in)
	}
	id := in.Out
	if k.TypeOf != Result {
		i := int(k.TypeOf) - 1
		if i >= len(in.Args) {
			return nil, fmt.Errorf("%s takes its type from argument %d, but has %d arguments", in.Op, i, len(in.Args))
		}
		id = in.Args[i]
	}
	switch dt := d.prog.Buffers[id].Type.DType; {
	case dt == ir.F32, dt == ir.I32 && k.Bits:
		// An i32 buffer viewed as float32 is copied exactly (token ids
		// cut into microbatches, for example).
		return scaled(&Call[float32]{Instr: in, d: d}, k.F32)
	case dt == ir.F64:
		return scaled(&Call[float64]{Instr: in, d: d}, k.F64)
	default:
		return nil, fmt.Errorf("the cpu backend cannot run %s on %v yet", in.Op, dt)
	}
}

// scaled builds c's closure and, when the instruction has a Scale,
// multiplies the result by it after every run.
func scaled[T kcpu.Float](c *Call[T], b Builder[T]) (func() error, error) {
	f, err := b(c)
	if err != nil || c.Instr.Scale == 0 {
		return f, err
	}
	out, scale := c.Out(), T(c.Instr.Scale)
	return func() error {
		if err := f(); err != nil {
			return err
		}
		kcpu.Scale(out, out, scale)
		return nil
	}, nil
}

// Call is one instruction as a float kernel's builder sees it on one
// device: the lowered instruction, and its buffers as views of the
// device's memory. A builder keeps the views in the closure it returns
// and reads them only when that closure runs: at load they hold nothing
// yet.
type Call[T kcpu.Float] struct {
	Instr lower.Instr
	d     *Device
}

// Arg is argument i's buffer as T.
func (c *Call[T]) Arg(i int) []T { return view[T](c.d, c.Instr.Args[i]) }

// Out is the result's buffer as T.
func (c *Call[T]) Out() []T { return view[T](c.d, c.Instr.Out) }

// Args is every argument's buffer as T (variadic ops).
func (c *Call[T]) Args() [][]T {
	xs := make([][]T, len(c.Instr.Args))
	for i := range xs {
		xs[i] = c.Arg(i)
	}
	return xs
}

// Shape is argument i's local shape. Shapes are the instruction's local
// ones: a reshape shares its argument's buffer, and a sharded value is
// smaller than its IR type.
func (c *Call[T]) Shape(i int) []int { return []int(c.Instr.ArgTypes[i].Shape) }

// OutShape is the result's local shape.
func (c *Call[T]) OutShape() []int { return []int(c.Instr.OutType.Shape) }

// Int32 is argument i's buffer as int32 (token ids, labels); an error
// when it is not an i32 buffer.
func (c *Call[T]) Int32(i int) ([]int32, error) { return int32Arg(c.d, c.Instr, i) }

// Int64 is argument i's buffer as int64 (the optimizer step).
func (c *Call[T]) Int64(i int) []int64 { return view[int64](c.d, c.Instr.Args[i]) }

func ok(f func()) func() error { return func() error { f(); return nil } }

func int32Arg(d *Device, in lower.Instr, i int) ([]int32, error) {
	b := d.prog.Buffers[in.Args[i]]
	if b.Type.DType != ir.I32 {
		return nil, fmt.Errorf("%s: the cpu backend takes i32 ids and labels, got %v", in.Op, b.Type)
	}
	return view[int32](d, b.ID), nil
}
