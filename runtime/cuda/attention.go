package cuda

import (
	"fmt"

	"gcompile/ir"
	"gcompile/runtime"
)

// The fused attention ops (kernels/cuda/attention.cu): the forward, the
// statistics the gradients share, and one kernel per gradient. Each
// instruction finds at load where the device's heads sit
// (runtime.AttentionDims, as the CPU backend does), so a device holding a
// block of the query heads reads the right k/v heads whether k and v are
// split with them or whole. The statistics are an f32 result even when q
// is 16-bit: the emulation widens the 16-bit operands only, and the
// kernels read the f32 statistics where they are.
func init() {
	for _, op := range []string{"attention", "attention_stats", "attention_grad_q", "attention_grad_k", "attention_grad_v"} {
		register(onFP32(resultDType, (*compiler).attention), op)
	}
}

// attTile is the most floats of one tile the kernels stage in shared
// memory (GC_ATT_TILE); attRows the most rows of a tile (GC_ATT_ROWS).
const (
	attTile = 2048
	attRows = 32
)

// attention launches the instruction's kernel, gc_<op>, over its
// operands in order and the problem's sizes.
func (c *compiler) attention() (func() error, error) {
	d, err := runtime.AttentionDims(c.d.prog.Mesh, c.in, c.d.coords)
	if err != nil {
		return nil, err
	}
	if d.HeadDim < 1 || d.HeadDim > attTile {
		return nil, fmt.Errorf("%s: head dim %d: the kernels stage tiles of at most %d floats, so a head dim of 1 to %d", c.in.Op, d.HeadDim, attTile, attTile)
	}
	if r, ok, err := runtime.RingOf(c.d.prog.Mesh, c.in, c.d.coords); err != nil || ok {
		if err != nil {
			return nil, err
		}
		return c.ringAttention(r, d)
	}
	rows := min(attRows, attTile/d.HeadDim)
	seq := d.SQ // query tiles, or key tiles for dk and dv
	if c.in.Op == "attention_grad_k" || c.in.Op == "attention_grad_v" {
		seq = d.SK
	}
	args := []any{c.out()}
	if c.in.Op == "attention" {
		args = append(args, abs{dt: ir.F32}) // no log-sum-exp wanted
	}
	for i := range c.in.Args {
		args = append(args, c.arg(i))
	}
	args = append(args, attSizes(d, int64((seq+rows-1)/rows))...)
	return c.one("gc_"+c.in.Op, args...)
}
