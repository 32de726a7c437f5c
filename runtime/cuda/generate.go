package cuda

import (
	"fmt"

	"gcompile/runtime"
)

// Generation's ops (kernels/cuda/generate.cu): positions come from the
// step's positions input. kv_write and attention_at check every position
// against the cache through a status word, so a position outside it fails
// the step, naming the op, instead of touching memory past the cache.
func init() {
	register(onFP32(resultDType, (*compiler).ropeAt), "rope_at")
	register(onFP32(resultDType, (*compiler).kvWrite), "kv_write")
	register(onFP32(resultDType, (*compiler).attentionAt), "attention_at")
}

// attAtHeadDim is the largest head dim gc_attention_at holds in a
// thread's accumulator (GC_ATT_AT_HD).
const attAtHeadDim = 256

func (c *compiler) ropeAt() (func() error, error) {
	s := c.shape(0)
	if len(s) != 4 || s[3]%2 != 0 {
		return nil, fmt.Errorf("rope_at needs x [batch, heads, step, d] with d even, got %v", c.in.ArgTypes[0])
	}
	theta := c.in.Attrs.Float("theta", 0)
	if float64(float32(theta)) != theta {
		return nil, fmt.Errorf("rope_at: theta %v is not exact in float32, which the kernel takes", theta)
	}
	return c.one("gc_rope_at", c.out(), c.arg(0), c.arg(1), int64(s[0]), int64(s[1]), int64(s[2]), int64(s[3]/2), float32(theta))
}

// kvWrite writes the step's rows into the cache where the lowering put
// the result over it (in place); otherwise the cache is copied into the
// result first.
func (c *compiler) kvWrite() (func() error, error) {
	s, step := c.shape(0), c.shape(1)[2]
	write, err := c.one("gc_kv_write", c.out(), c.status(), c.arg(1), c.arg(2), int64(s[0]), int64(s[1]), int64(s[2]), int64(step), int64(s[3]))
	if err != nil || c.in.Args[0] == c.in.Out {
		return write, err
	}
	cp, err := c.deviceCopy(c.buf(c.in.Args[0]), c.buf(c.in.Out))
	if err != nil {
		return nil, err
	}
	return seq(cp, write), nil
}

func (c *compiler) attentionAt() (func() error, error) {
	d, err := runtime.AttentionDims(c.d.prog.Mesh, c.in, c.d.coords)
	if err != nil {
		return nil, err
	}
	if d.HeadDim < 1 || d.HeadDim > attAtHeadDim {
		return nil, fmt.Errorf("attention_at: head dim %d: the kernel keeps a row's accumulator of at most %d in each thread", d.HeadDim, attAtHeadDim)
	}
	return c.one("gc_attention_at", c.out(), c.status(), c.arg(0), c.arg(1), c.arg(2), c.arg(3),
		int64(d.Batch), int64(d.Heads), int64(d.KVHeads), int64(d.SQ), int64(d.SK), int64(d.HeadDim),
		int64(d.Group), int64(d.QHeadOffset), int64(d.KVHeadOffset), float32(d.Scale))
}
