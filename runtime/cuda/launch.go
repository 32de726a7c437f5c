package cuda

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unsafe"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
	"gcompile/runtime/cuda/driver"
)

// parg is a pointer argument of a kernel: where the data is and what it
// holds. bits marks an operand of a kernel that only moves elements, where
// any 4-byte type may stand in for float (token ids cut into microbatches).
type parg struct {
	at   loc
	dt   ir.DType
	bits bool
}

// abs is a pointer argument given as an address, for the collectives,
// whose operands include other devices' buffers.
type abs struct {
	p  driver.DevicePtr
	dt ir.DType
}

// launch is one kernel call planned at load: the kernel, its geometry and
// its arguments, checked against the kernel table.
type launch struct {
	k           kcuda.Kernel
	fn          driver.Function
	grid, block uint32
	args        []any // parg, abs, int64, int32 or float32, in parameter order
	params      []unsafe.Pointer
}

// String describes the call, as launch plans print it.
func (l *launch) String() string {
	return fmt.Sprintf("%s<<<%d, %d>>>", l.k.Name, l.grid, l.block)
}

// Block sizes. Row kernels get a block sized to the row (a warp for short
// rows) so no thread idles through a row of 32; elementwise kernels get
// up to 256 threads and a grid of a few blocks per SM, looping over the
// rest. Config.Launch lowers the bounds.
const (
	maxBlock       = 256
	blocksPerSM    = 4
	rowBlocksPerSM = 16
)

// limits are the launch bounds in effect: most threads per block, most
// blocks of an elementwise launch and of a row launch.
func (rt *Runtime) limits() (threads, blocks, rowBlocks int64) {
	threads, blocks, rowBlocks = maxBlock, int64(rt.props.SMs*blocksPerSM), int64(rt.props.SMs*rowBlocksPerSM)
	if t := rt.cfg.Launch.Threads; t > 0 {
		threads = int64(t)
	}
	if b := rt.cfg.Launch.Blocks; b > 0 {
		blocks, rowBlocks = min(blocks, int64(b)), min(rowBlocks, int64(b))
	}
	return max(threads, 32), max(blocks, 1), max(rowBlocks, 1)
}

// rowParam names, for each block-per-row kernel, the parameter that holds
// the work along one row, which sizes the block.
var rowParam = map[string]string{
	"gc_reduce_sum_rows": "n", "gc_reduce_max_rows": "n", "gc_softmax": "n", "gc_softmax_grad": "n",
	"gc_layernorm": "n", "gc_layernorm_grad_x": "n", "gc_layernorm_stats": "n", "gc_rmsnorm": "n", "gc_rmsnorm_grad_x": "n",
	"gc_rmsnorm_stats": "n", "gc_embedding_grad": "dim",
	"gc_cross_entropy_rows": "vocab", "gc_cross_entropy_grad": "vocab", "gc_vocab_ce_max": "vocab",
	"gc_vocab_ce_sums": "vocab", "gc_adafactor_row": "m", "gc_sm3_row": "m",
	"gc_top_k_mask": "n", "gc_moe_slot_dot": "hidden",
}

// threadsFor is a block size for work of n elements: a multiple of the
// warp, at most the runtime's bound.
func (rt *Runtime) threadsFor(n int64) uint32 {
	limit, _, _ := rt.limits()
	return uint32(min(alignUp(max(n, 1), 32), limit))
}

// gridFor is an elementwise grid over n elements in blocks of block
// threads.
func (rt *Runtime) gridFor(n int64, block uint32) uint32 {
	_, blocks, _ := rt.limits()
	return uint32(min(max((n+int64(block)-1)/int64(block), 1), blocks))
}

// newLaunch checks args against kernel name's parameters and plans its
// geometry from the table's launch style and extent. grid, when not 0,
// fixes the grid (kernels that leave one partial result per block).
func (d *Device) newLaunch(name string, grid uint32, args ...any) (*launch, error) {
	k, ok := kcuda.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("no kernel %s in the kernel table", name)
	}
	return d.newLaunchOf(k, grid, args...)
}

// newLaunchOf is newLaunch for a kernel given by its entry: one of the
// table's, or one generated at load (a fused body's), whose function is
// found once its module is loaded (see Runtime.fusedFunction).
func (d *Device) newLaunchOf(k kcuda.Kernel, grid uint32, args ...any) (*launch, error) {
	name := k.Name
	if len(args) != len(k.Params) {
		return nil, fmt.Errorf("%s takes %d arguments, got %d", name, len(k.Params), len(args))
	}
	l := &launch{k: k, args: make([]any, len(args))}
	sizes := map[string]int64{}
	for i, p := range k.Params {
		v, err := checkArg(p, args[i])
		if err != nil {
			return nil, fmt.Errorf("%s argument %d (%s %s): %w", name, i, p.Type, p.Name, err)
		}
		l.args[i] = v
		if n, ok := v.(int64); ok {
			sizes[p.Name] = n
		}
	}
	over, err := extent(k.Over, sizes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	rt := d.rt
	switch k.Launch {
	case kcuda.GridStride:
		l.block = rt.threadsFor(over)
		l.grid = rt.gridFor(over, l.block)
	case kcuda.BlockPerRow:
		row := int64(maxBlock)
		if p, ok := rowParam[name]; ok {
			row = sizes[p]
		}
		_, _, rowBlocks := rt.limits()
		l.block = rt.threadsFor(row)
		l.grid = uint32(min(max(over, 1), rowBlocks))
	case kcuda.SingleBlock:
		l.block = rt.threadsFor(over)
		l.grid = 1
	default:
		return nil, fmt.Errorf("%s: launch style %v", name, k.Launch)
	}
	if grid > 0 {
		l.grid = grid
	}
	if d.rt.fns != nil {
		l.fn = d.rt.fns[name]
	}
	return l, nil
}

// checkArg converts one argument to the exact type of its parameter.
func checkArg(p kcuda.Param, a any) (any, error) {
	if p.Type.Pointer() {
		var dt ir.DType
		bits := false
		switch v := a.(type) {
		case parg:
			dt, bits = v.dt, v.bits
			if v.at.sp == inHost {
				return nil, fmt.Errorf("an offloaded buffer is in host memory; only a copy may read it")
			}
		case abs:
			dt = v.dt
		default:
			return nil, fmt.Errorf("want a device pointer, got %T", a)
		}
		var want []ir.DType
		switch p.Type {
		case kcuda.F32In, kcuda.F32Out:
			want = []ir.DType{ir.F32}
			if bits {
				want = append(want, ir.I32)
			}
		case kcuda.I32In, kcuda.I32Out:
			want = []ir.DType{ir.I32}
		case kcuda.U8In, kcuda.U8Out:
			want = []ir.DType{ir.U8}
		case kcuda.U16In, kcuda.U16Out:
			want = []ir.DType{ir.F16, ir.BF16}
		case kcuda.I64In:
			want = []ir.DType{ir.I64}
		default:
			return nil, fmt.Errorf("unknown pointer type %q", p.Type)
		}
		for _, w := range want {
			if dt == w {
				return a, nil
			}
		}
		return nil, fmt.Errorf("the buffer holds %v", dt)
	}
	switch p.Type {
	case kcuda.Size:
		switch v := a.(type) {
		case int:
			return int64(v), nil
		case int64:
			return v, nil
		}
	case kcuda.Int:
		var v int64
		switch x := a.(type) {
		case int:
			v = int64(x)
		case int32:
			v = int64(x)
		case bool:
			if x {
				v = 1
			}
		default:
			return nil, fmt.Errorf("want an int, got %T", a)
		}
		if v < math.MinInt32 || v > math.MaxInt32 {
			return nil, fmt.Errorf("%d does not fit an int", v)
		}
		return int32(v), nil
	case kcuda.F32Value:
		switch v := a.(type) {
		case float32:
			return v, nil
		case float64:
			return float32(v), nil
		}
	default:
		return nil, fmt.Errorf("unknown parameter type %q", p.Type)
	}
	return nil, fmt.Errorf("got %T", a)
}

// extent evaluates a kernel's Over expression ("n", "rows*t", "1") from
// its size arguments.
func extent(over string, sizes map[string]int64) (int64, error) {
	n := int64(1)
	for _, f := range strings.Split(over, "*") {
		f = strings.TrimSpace(f)
		if v, err := strconv.ParseInt(f, 10, 64); err == nil {
			n *= v
			continue
		}
		v, ok := sizes[f]
		if !ok {
			return 0, fmt.Errorf("extent %q names %q, which is not a size parameter", over, f)
		}
		n *= v
	}
	return n, nil
}

// finalize resolves pointer arguments to addresses once the device's
// memories exist, building the parameter array every launch reuses.
func (d *Device) finalize(l *launch) {
	var a driver.Args
	for _, v := range l.args {
		switch x := v.(type) {
		case parg:
			a.Ptr(d.ptr(x.at))
		case abs:
			a.Ptr(x.p)
		case int64:
			a.Int64(x)
		case int32:
			a.Int32(x)
		case float32:
			a.Float32(x)
		}
	}
	l.params = a.Pointers()
}

// run queues the call on the device's compute stream.
func (d *Device) run(l *launch) error { return d.runOn(l, d.compute) }

// runOn queues the call on stream s.
func (d *Device) runOn(l *launch, s driver.Stream) error {
	if err := d.rt.drv.LaunchKernel(l.fn, driver.Dim3{X: l.grid, Y: 1, Z: 1}, driver.Dim3{X: l.block, Y: 1, Z: 1}, 0, s, l.params); err != nil {
		return fmt.Errorf("%s: %w", l, err)
	}
	return nil
}

// kernel plans a call made at every execution of the instruction being
// compiled: its parameter array is built once, after allocation.
func (c *compiler) kernel(name string, args ...any) (*launch, error) {
	return c.kernelGrid(name, 0, args...)
}

func (c *compiler) kernelGrid(name string, grid uint32, args ...any) (*launch, error) {
	l, err := c.d.newLaunch(name, grid, args...)
	if err != nil {
		return nil, err
	}
	c.d.launches = append(c.d.launches, l)
	c.note(l.String())
	return l, nil
}

// generated plans a call of a kernel generated at load, as kernel does
// for the table's.
func (c *compiler) generated(k kcuda.Kernel, args ...any) (*launch, error) {
	l, err := c.d.newLaunchOf(k, 0, args...)
	if err != nil {
		return nil, err
	}
	c.d.launches = append(c.d.launches, l)
	c.note(l.String())
	return l, nil
}

// call runs a kernel on addresses known only at run time (other devices'
// buffers) on stream s, checking its arguments as at load.
func (d *Device) call(s driver.Stream, name string, args ...any) error {
	l, err := d.newLaunch(name, 0, args...)
	if err != nil {
		return err
	}
	d.finalize(l)
	return d.runOn(l, s)
}
