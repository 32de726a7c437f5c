package cuda

import (
	"fmt"

	"gcompile/ir"
	kcuda "gcompile/kernels/cuda"
)

// Counter-based random numbers and the normal CDF (ir/moe.go,
// kernels/cuda/random.cu), prepared from the local shapes as the CPU
// backend's kernels_moe.go reads them. The key is i32 and read where it
// is; a 16-bit result is drawn into fp32 scratch and rounded back, as
// the CPU's emulation does. normal_cdf is a plain unary kernel: it is
// not marked Elementwise, so it never appears in a fused body.
func init() {
	register(onFP32(resultDType, (*compiler).random), "random")
	register(onFP32(resultDType, unaryKernel), "normal_cdf")
}

// random draws, for each element of the local key, the product of dims
// numbers: one kernel per dist. The sharding rule keeps the trailing dims
// whole, so the result's local block is the key's block times dims; any
// other local shape (a split the kernel does not index) is refused at
// load.
func (c *compiler) random() (func() error, error) {
	if dt := c.dtype(c.in.Args[0]); dt != ir.I32 {
		return nil, fmt.Errorf("random: the key must be i32, got %v", dt)
	}
	n := int64(1)
	for _, d := range c.in.Attrs.Ints("dims") {
		n *= int64(d)
	}
	keys := numel(c.shape(0))
	if out := numel(c.outShape()); out != keys*n {
		return nil, fmt.Errorf("random: local result %v is not the local key %v times dims %v", c.outShape(), c.shape(0), c.in.Attrs.Ints("dims"))
	}
	stream := int64(c.in.Attrs.Int("stream", 0))
	switch dist := c.in.Attrs.Str("dist"); dist {
	case "uniform", "normal":
		return c.one("gc_random_"+dist, c.out(), c.arg(0), keys, n, stream)
	case "dropout":
		p := c.in.Attrs.Float("p", 0)
		if !(p >= 0 && p < 1) {
			return nil, fmt.Errorf("random: dropout probability p=%g outside [0, 1)", p)
		}
		keep, scale := kcuda.DropoutArgs(p)
		return c.one("gc_random_dropout", c.out(), c.arg(0), keys, n, stream, keep, scale)
	default:
		return nil, fmt.Errorf("random: dist %q: want one of %v", dist, ir.RandomDists)
	}
}
