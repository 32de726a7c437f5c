package cuda

import (
	"encoding/binary"
	"fmt"

	"gcompile/ir"
	"gcompile/lower"
)

// Mixture-of-experts routing (ir/moe.go, kernels/cuda/moe.cu), prepared
// from the local shapes as the CPU backend's kernels_moe.go reads them.
// The routing index src is i32 and read where it is; 16-bit values go
// through the usual emulation, while the fp32 slot weights of a 16-bit
// dispatch or combine (F32Args) and moe_slot_dot's fp32 result are used
// where they are. The kernels that read src validate it through a status
// word, as the embedding does its ids.
func init() {
	register(onFP32(resultDType, (*compiler).topKMask), "top_k_mask")
	register(onFP32(resultDType, (*compiler).less), "less")
	// The result is i32: the scores' dtype decides the kernel.
	register(onFP32(argDType, (*compiler).moeRoute), "moe_route")
	register(onFP32(resultDType, (*compiler).moeDispatch), "moe_dispatch")
	register(onFP32(resultDType, (*compiler).moeCombine), "moe_combine")
	register(onFP32(resultDType, (*compiler).moeSlotDot), "moe_slot_dot")
	register(onFP32(resultDType, (*compiler).moeSlotGather), "moe_slot_gather")
	register(onFP32(resultDType, (*compiler).moeSlotScatter), "moe_slot_scatter")
}

func (c *compiler) topKMask() (func() error, error) {
	rows, n := lastDim(c.outShape())
	k := int64(c.in.Attrs.Int("k", 0))
	if k < 1 || k > n {
		return nil, fmt.Errorf("top_k_mask: k=%d outside 1..%d, the local last dim", k, n)
	}
	return c.one("gc_top_k_mask", c.out(), c.arg(0), rows, n, k)
}

func (c *compiler) less() (func() error, error) {
	return c.one("gc_less", c.out(), c.arg(0), c.arg(1), numel(c.outShape()))
}

// moeSizes are one routing problem's local sizes: G groups of T tokens of
// width M, E experts of C slots.
type moeSizes struct{ G, T, M, E, C int64 }

// moeShape is one operand's local shape and the shape the routing sizes
// give it.
type moeShape struct {
	name string
	got  []int
	want []int64
}

// moeLayouts checks the local shapes against the routing sizes. A device
// whose blocks disagree (a split the kernels do not index) is refused at
// load rather than launched to read out of bounds.
func moeLayouts(op string, shapes ...moeShape) error {
	for _, s := range shapes {
		ok := len(s.got) == len(s.want)
		for j := 0; ok && j < len(s.got); j++ {
			ok = int64(s.got[j]) == s.want[j]
		}
		if !ok {
			return fmt.Errorf("%s: local %s is %v, want %v", op, s.name, s.got, s.want)
		}
	}
	return nil
}

// moeSrc reads G, E and C from the local src, argument 1 of every op
// that takes one, and checks that it is i32.
func (c *compiler) moeSrc() (moeSizes, error) {
	if dt := c.dtype(c.in.Args[1]); dt != ir.I32 {
		return moeSizes{}, fmt.Errorf("%s: src must be i32, got %v", c.in.Op, dt)
	}
	s := c.shape(1)
	if len(s) != 3 {
		return moeSizes{}, fmt.Errorf("%s: src must be [groups, experts, capacity], got local %v", c.in.Op, s)
	}
	return moeSizes{G: int64(s[0]), E: int64(s[1]), C: int64(s[2])}, nil
}

// moeWeights is the optional slot-weight argument 2 of dispatch and combine,
// checked against src: the operand and the kernels' flag. Without one the
// kernels read no weight, so x stands in for the pointer.
func (c *compiler) moeWeights(d moeSizes) (w parg, weighted bool, err error) {
	if len(c.in.Args) < 3 {
		return c.arg(0), false, nil
	}
	return c.arg(2), true, moeLayouts(c.in.Op, moeShape{"weights", c.shape(2), []int64{d.G, d.E, d.C}})
}

func (c *compiler) moeRoute() (func() error, error) {
	if dt := c.dtype(c.in.Out); dt != ir.I32 {
		return nil, fmt.Errorf("moe_route: the result must be i32, got %v", dt)
	}
	s, out := c.shape(0), c.outShape()
	if len(s) != 3 || len(out) != 3 {
		return nil, fmt.Errorf("moe_route: scores %v and result %v must be rank 3", s, out)
	}
	d := moeSizes{G: int64(s[0]), T: int64(s[1]), E: int64(s[2]), C: int64(out[2])}
	if err := moeLayouts("moe_route", moeShape{"mask", c.shape(1), []int64{d.G, d.T, d.E}}, moeShape{"result", out, []int64{d.G, d.E, d.C}}); err != nil {
		return nil, err
	}
	rank := parg{at: c.scratch(4 * max(d.G*d.T*d.E, 1)), dt: ir.I32}
	l1, err := c.kernel("gc_moe_route_rank", rank, c.arg(0), c.arg(1), d.G, d.T, d.E)
	if err != nil {
		return nil, err
	}
	l2, err := c.kernel("gc_moe_route_fill", c.out(), rank, d.G, d.T, d.E, d.C)
	if err != nil {
		return nil, err
	}
	return c.runs(l1, l2), nil
}

func (c *compiler) moeDispatch() (func() error, error) {
	d, err := c.moeSrc()
	if err != nil {
		return nil, err
	}
	x := c.shape(0)
	if len(x) != 3 {
		return nil, fmt.Errorf("moe_dispatch: x must be [groups, tokens, hidden], got local %v", x)
	}
	d.T, d.M = int64(x[1]), int64(x[2])
	w, weighted, err := c.moeWeights(d)
	if err == nil {
		err = moeLayouts("moe_dispatch", moeShape{"x", x, []int64{d.G, d.T, d.M}}, moeShape{"result", c.outShape(), []int64{d.E, d.G, d.C, d.M}})
	}
	if err != nil {
		return nil, err
	}
	return c.one("gc_moe_dispatch", c.out(), c.status(), c.arg(0), c.arg(1), w, d.G, d.T, d.M, d.E, d.C, weighted)
}

func (c *compiler) moeCombine() (func() error, error) {
	d, err := c.moeSrc()
	if err != nil {
		return nil, err
	}
	out := c.outShape()
	if len(out) != 3 {
		return nil, fmt.Errorf("moe_combine: the result must be [groups, tokens, hidden], got local %v", out)
	}
	d.T, d.M = int64(out[1]), int64(out[2])
	w, weighted, err := c.moeWeights(d)
	if err == nil {
		err = moeLayouts("moe_combine", moeShape{"y", c.shape(0), []int64{d.E, d.G, d.C, d.M}}, moeShape{"result", out, []int64{d.G, d.T, d.M}})
	}
	if err != nil {
		return nil, err
	}
	return c.one("gc_moe_combine", c.out(), c.status(), c.arg(0), c.arg(1), w, d.G, d.T, d.M, d.E, d.C, weighted)
}

func (c *compiler) moeSlotDot() (func() error, error) {
	d, err := c.moeSrc()
	if err != nil {
		return nil, err
	}
	x := c.shape(2)
	if len(x) != 3 {
		return nil, fmt.Errorf("moe_slot_dot: x must be [groups, tokens, hidden], got local %v", x)
	}
	d.T, d.M = int64(x[1]), int64(x[2])
	if err := moeLayouts("moe_slot_dot", moeShape{"y", c.shape(0), []int64{d.E, d.G, d.C, d.M}}, moeShape{"x", x, []int64{d.G, d.T, d.M}},
		moeShape{"result", c.outShape(), []int64{d.G, d.E, d.C}}); err != nil {
		return nil, err
	}
	return c.one("gc_moe_slot_dot", c.out(), c.status(), c.arg(0), c.arg(1), c.arg(2), d.G, d.T, d.M, d.E, d.C)
}

func (c *compiler) moeSlotGather() (func() error, error) {
	d, err := c.moeSrc()
	if err != nil {
		return nil, err
	}
	p := c.shape(0)
	if len(p) != 3 {
		return nil, fmt.Errorf("moe_slot_gather: p must be [groups, tokens, experts], got local %v", p)
	}
	d.T = int64(p[1])
	if err := moeLayouts("moe_slot_gather", moeShape{"p", p, []int64{d.G, d.T, d.E}}, moeShape{"result", c.outShape(), []int64{d.G, d.E, d.C}}); err != nil {
		return nil, err
	}
	return c.one("gc_moe_slot_gather", c.out(), c.status(), c.arg(0), c.arg(1), d.G, d.T, d.E, d.C)
}

func (c *compiler) moeSlotScatter() (func() error, error) {
	d, err := c.moeSrc()
	if err != nil {
		return nil, err
	}
	out := c.outShape()
	if len(out) != 3 {
		return nil, fmt.Errorf("moe_slot_scatter: the result must be [groups, tokens, experts], got local %v", out)
	}
	d.T = int64(out[1])
	if err := moeLayouts("moe_slot_scatter", moeShape{"w", c.shape(0), []int64{d.G, d.E, d.C}}, moeShape{"result", out, []int64{d.G, d.T, d.E}}); err != nil {
		return nil, err
	}
	return c.one("gc_moe_slot_scatter", c.out(), c.status(), c.arg(0), c.arg(1), d.G, d.T, d.E, d.C)
}

// badSlots describes the slot index an MoE kernel found naming no token
// of its group, as the CPU kernels' error does, reading the index back
// when it is still in memory (an input or a state; a temporary may have
// been overwritten since). Positions are in the device's local block.
func (d *Device) badSlots(in lower.Instr) string {
	var tokens int
	switch in.Op {
	case "moe_dispatch", "moe_slot_gather":
		tokens = in.ArgTypes[0].Shape[1]
	case "moe_slot_dot":
		tokens = in.ArgTypes[2].Shape[1]
	default: // moe_combine, moe_slot_scatter: [G, tokens, …] results
		tokens = in.OutType.Shape[1]
	}
	msg := fmt.Sprintf("a slot names a token outside [-1, %d)", tokens)
	b, s := d.prog.Buffers[in.Args[1]], in.ArgTypes[1].Shape
	if b.Kind != lower.Input && b.Kind != lower.Param && b.Kind != lower.State || len(s) != 3 {
		return msg
	}
	raw, err := d.read(b)
	if err != nil {
		return msg
	}
	for k := 0; k+4 <= len(raw); k += 4 {
		if t := int32(binary.LittleEndian.Uint32(raw[k:])); t < -1 || int(t) >= tokens {
			i := k / 4
			return fmt.Sprintf("slot (group %d, expert %d, position %d) names token %d of a group of %d", i/(s[1]*s[2]), i/s[2]%s[1], i%s[2], t, tokens)
		}
	}
	return msg
}
