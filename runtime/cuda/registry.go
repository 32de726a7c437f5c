package cuda

import (
	"errors"
	"fmt"
	"slices"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
)

// prepare plans one instruction at load (c.in) and returns the closure
// that queues its work at every step.
type prepare func(c *compiler) (func() error, error)

// registry maps op names to how the backend prepares them. Every op the
// backend runs is registered at init by the file of its kind
// (elementwise.go, shape.go, nn.go, optim.go, matmul.go, collective.go,
// copy.go, precision.go); an instruction of any other op is an error at
// load.
type registry struct {
	byOp map[string]prepare
}

func newRegistry() *registry { return &registry{byOp: map[string]prepare{}} }

// add registers op. A second registration of one op is an error rather
// than a replacement: two files claiming an op would make the one that
// runs depend on the order files are initialised in.
func (r *registry) add(op string, p prepare) error {
	if op == "" || p == nil {
		return fmt.Errorf("cuda: op %q registered without a name or a preparation", op)
	}
	if _, dup := r.byOp[op]; dup {
		return fmt.Errorf("cuda: op %s registered twice", op)
	}
	r.byOp[op] = p
	return nil
}

func (r *registry) lookup(op string) (prepare, bool) {
	p, ok := r.byOp[op]
	return p, ok
}

func (r *registry) names() []string {
	out := make([]string, 0, len(r.byOp))
	for op := range r.byOp {
		out = append(out, op)
	}
	slices.Sort(out)
	return out
}

var (
	// backendOps holds every op this backend runs.
	backendOps = newRegistry()
	// registryErr collects what went wrong registering backendOps. It is
	// reported by every load instead of stopping the process at init.
	registryErr error
)

// register adds the ops of one kind at init.
func register(p prepare, ops ...string) {
	for _, op := range ops {
		registryErr = errors.Join(registryErr, backendOps.add(op, p))
	}
}

// HasOp reports whether the backend can prepare instructions of op (as
// lower.Instr.Op names it). The registry is not open to other packages:
// every kernel the backend launches is CUDA C of package kernels/cuda,
// and preparing one needs this package's workspace, status words and
// launch planning, so a new op is added here, next to its kind.
func HasOp(op string) bool {
	_, ok := backendOps.lookup(op)
	return ok
}

// Ops lists the ops the backend runs, sorted by name.
func Ops() []string { return backendOps.names() }

// The stages below compose into an op's preparation. Ops that handle
// every dtype themselves (transfers, copies, casts) register their
// preparation as it is; the rest pass through emulated, and the ones
// that run fp32 kernels through onFP32 too.

// emulated runs f on fp32 scratch copies when the instruction reads or
// writes a 16-bit buffer (emulate16), and as it is otherwise. f checks
// the dtypes it sees itself.
func emulated(f prepare) prepare {
	return func(c *compiler) (func() error, error) {
		if c.touches16() {
			return c.emulate16(f)
		}
		return f(c)
	}
}

// dtypeRule says which buffer's dtype decides whether an op's fp32
// kernels can run it.
type dtypeRule int

const (
	// resultDType: the result must be fp32.
	resultDType dtypeRule = iota
	// argDType: a scalar result; the first argument must be fp32.
	argDType
	// movesBits: the op only moves elements, so an i32 result is moved
	// exactly by the fp32 kernel (its operands are marked bits).
	movesBits
)

// onFP32 is the path of an op run by fp32 kernels: 16-bit buffers are
// emulated, the dtype rule is checked, f plans the kernels, and the
// instruction's Scale (lower's mean over device-local rows) is applied
// to the result afterwards.
func onFP32(rule dtypeRule, f prepare) prepare {
	return emulated(func(c *compiler) (func() error, error) {
		in := c.in
		dt := c.dtype(in.Out)
		if rule == argDType {
			dt = c.dtype(in.Args[0])
		}
		switch {
		case dt == ir.F32:
		case dt == ir.I32 && rule == movesBits:
		default:
			return nil, fmt.Errorf("the cuda backend cannot run %s on %v", in.Op, dt)
		}
		run, err := f(c)
		if err != nil || in.Scale == 0 {
			return run, err
		}
		n := numel(c.outShape())
		scale, err := c.kernel(kcuda.InstrScale, c.out(), c.out(), n, float32(in.Scale))
		if err != nil {
			return nil, err
		}
		return seq(run, c.runs(scale)), nil
	})
}
