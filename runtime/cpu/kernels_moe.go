package cpu

import (
	"fmt"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// Mixture-of-experts routing (ir/moe.go): the top-k mask and comparison
// the routers are written with, the slot assignment, and the index-based
// dispatch and combine with their gradients.
func init() {
	builtin(Kernel{F32: topKMask[float32], F64: topKMask[float64]}, "top_k_mask")
	builtin(Kernel{F32: less[float32], F64: less[float64]}, "less")
	// The result is i32: the scores pick the kernel.
	builtin(Kernel{F32: moeRoute[float32], F64: moeRoute[float64], TypeOf: Arg(0)}, "moe_route")
	builtin(Kernel{F32: moeDispatch[float32], F64: moeDispatch[float64]}, "moe_dispatch")
	builtin(Kernel{F32: moeCombine[float32], F64: moeCombine[float64]}, "moe_combine")
	builtin(Kernel{F32: moeSlotDot[float32], F64: moeSlotDot[float64]}, "moe_slot_dot")
	builtin(Kernel{F32: moeSlotGather[float32], F64: moeSlotGather[float64]}, "moe_slot_gather")
	builtin(Kernel{F32: moeSlotScatter[float32], F64: moeSlotScatter[float64]}, "moe_slot_scatter")
}

func topKMask[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, x := c.Out(), c.Arg(0)
	rows, n := lastDim(c.OutShape())
	k := c.Instr.Attrs.Int("k", 0)
	return ok(func() { kcpu.TopKMask(out, x, rows, n, k) }), nil
}

func less[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, a, b := c.Out(), c.Arg(0), c.Arg(1)
	return ok(func() { kcpu.Less(out, a, b) }), nil
}

// moeDims reads the routing sizes from an instruction's local src
// [G, E, C] (argument srcArg) and its token count and hidden size.
func moeDims(c interface{ Shape(int) []int }, srcArg, tokens, hidden int) kcpu.MoEDims {
	s := c.Shape(srcArg)
	return kcpu.MoEDims{G: s[0], E: s[1], C: s[2], T: tokens, M: hidden}
}

func moeRoute[T kcpu.Float](c *Call[T]) (func() error, error) {
	if c.Instr.OutType.DType != ir.I32 {
		return nil, fmt.Errorf("moe_route: the result must be i32, got %v", c.Instr.OutType)
	}
	src := view[int32](c.d, c.Instr.Out)
	scores, mask, s := c.Arg(0), c.Arg(1), c.Shape(0)
	out := c.OutShape()
	d := kcpu.MoEDims{G: s[0], T: s[1], E: s[2], C: out[2]}
	return ok(func() { kcpu.MoERoute(src, scores, mask, d) }), nil
}

// weights is the optional third argument of dispatch and combine.
func weights[T kcpu.Float](c *Call[T]) []T {
	if len(c.Instr.Args) < 3 {
		return nil
	}
	return c.Arg(2)
}

func moeDispatch[T kcpu.Float](c *Call[T]) (func() error, error) {
	src, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	out, x, w, xs := c.Out(), c.Arg(0), weights(c), c.Shape(0)
	d := moeDims(c, 1, xs[1], xs[2])
	return func() error { return kcpu.MoEDispatch(out, x, src, w, d) }, nil
}

func moeCombine[T kcpu.Float](c *Call[T]) (func() error, error) {
	src, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	out, y, w, os := c.Out(), c.Arg(0), weights(c), c.OutShape()
	d := moeDims(c, 1, os[1], os[2])
	return func() error { return kcpu.MoECombine(out, y, src, w, d) }, nil
}

func moeSlotDot[T kcpu.Float](c *Call[T]) (func() error, error) {
	src, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	out, y, x, xs := c.Out(), c.Arg(0), c.Arg(2), c.Shape(2)
	d := moeDims(c, 1, xs[1], xs[2])
	return func() error { return kcpu.MoESlotDot(out, y, x, src, d) }, nil
}

func moeSlotGather[T kcpu.Float](c *Call[T]) (func() error, error) {
	src, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	out, p, ps := c.Out(), c.Arg(0), c.Shape(0)
	d := moeDims(c, 1, ps[1], 0)
	return func() error { return kcpu.MoESlotGather(out, p, src, d) }, nil
}

func moeSlotScatter[T kcpu.Float](c *Call[T]) (func() error, error) {
	src, err := c.Int32(1)
	if err != nil {
		return nil, err
	}
	out, w, os := c.Out(), c.Arg(0), c.OutShape()
	d := moeDims(c, 1, os[1], 0)
	return func() error { return kcpu.MoESlotScatter(out, w, src, d) }, nil
}

func init() {
	builtin(Kernel{F32: random[float32], F64: random[float64]}, "random")
	builtin(unaryKernel(kcpu.NormalCDF[float32], kcpu.NormalCDF[float64]), "normal_cdf")
}

// random draws per key (argument 0, i32) the product of dims numbers.
func random[T kcpu.Float](c *Call[T]) (func() error, error) {
	keys, err := c.Int32(0)
	if err != nil {
		return nil, err
	}
	n := 1
	for _, d := range c.Instr.Attrs.Ints("dims") {
		n *= d
	}
	out, stream := c.Out(), c.Instr.Attrs.Int("stream", 0)
	switch c.Instr.Attrs.Str("dist") {
	case "normal":
		return ok(func() { kcpu.RandomNormal(out, keys, stream, n) }), nil
	case "dropout":
		p := c.Instr.Attrs.Float("p", 0)
		return ok(func() { kcpu.RandomDropout(out, keys, stream, n, p) }), nil
	}
	return ok(func() { kcpu.RandomUniform(out, keys, stream, n) }), nil
}
