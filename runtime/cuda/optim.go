package cuda

import (
	"fmt"

	"gcompile/ir"
	"gcompile/lower"
)

// Optimizer updates, and the training step's global reductions: the
// gradient norm (sum_squares, clip_coef) and mixed precision's overflow
// check (nonfinite_count, where_finite). Updates that read the step
// number refuse a step below 1 before launching (checkStep).
func init() {
	// The global sums have a scalar result: the gradients' dtype decides.
	register(onFP32(argDType, (*compiler).globalSum), "sum_squares", "nonfinite_count")
	register(onFP32(argDType, (*compiler).clipCoef), "clip_coef")
	register(onFP32(resultDType, (*compiler).whereFinite), "where_finite")

	register(onFP32(resultDType, (*compiler).adamMoment), "adam_m", "adam_v")
	register(onFP32(resultDType, (*compiler).adamw), "adamw")
	register(onFP32(resultDType, (*compiler).sgdBuf), "sgd_buf")
	register(onFP32(resultDType, (*compiler).sgd), "sgd")
	register(onFP32(resultDType, (*compiler).adafactorFactoredAcc), "adafactor_row", "adafactor_col")
	register(onFP32(resultDType, (*compiler).adafactorV), "adafactor_v")
	register(onFP32(resultDType, (*compiler).adafactor), "adafactor", "adafactor_vec")
	register(onFP32(resultDType, (*compiler).sm3Row), "sm3_row")
	register(onFP32(resultDType, (*compiler).sm3Col), "sm3_col")
	register(onFP32(resultDType, (*compiler).sm3), "sm3")
	register(onFP32(resultDType, (*compiler).sm3V), "sm3_v")
	register(onFP32(resultDType, (*compiler).sm3Vec), "sm3_vec")
}

// attr is a float attribute of the instruction as a kernel's float.
func (c *compiler) attr(name string) float32 { return float32(c.in.Attrs.Float(name, 0)) }

func (c *compiler) clipCoef() (func() error, error) {
	return c.one("gc_clip_coef", c.out(), c.arg(0), c.attr("max_norm"))
}

// whereFinite takes (count, new, old).
func (c *compiler) whereFinite() (func() error, error) {
	return c.one("gc_where_finite", c.out(), c.arg(0), c.arg(1), c.arg(2), numel(c.outShape()))
}

// adamMoment is adam_m (beta1) or adam_v (beta2) over (moment, g).
func (c *compiler) adamMoment() (func() error, error) {
	beta := "beta1"
	if c.in.Op == "adam_v" {
		beta = "beta2"
	}
	return c.one("gc_"+c.in.Op, c.out(), c.arg(0), c.arg(1), numel(c.outShape()), c.attr(beta))
}

// adamw takes (p, m, v, lr, step).
func (c *compiler) adamw() (func() error, error) {
	f, err := c.one("gc_adamw", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), numel(c.outShape()),
		c.attr("beta1"), c.attr("beta2"), c.attr("eps"), c.attr("wd"))
	return c.checkStep(4, f, err)
}

// sgdBuf takes (buf, g, p).
func (c *compiler) sgdBuf() (func() error, error) {
	return c.one("gc_sgd_buf", c.out(), c.arg(0), c.arg(1), c.arg(2), numel(c.outShape()), c.attr("momentum"), c.attr("wd"))
}

// sgd takes (p, buf, lr).
func (c *compiler) sgd() (func() error, error) {
	return c.one("gc_sgd", c.out(), c.arg(0), c.arg(1), c.arg(2), numel(c.outShape()))
}

// adafactorFactoredAcc is adafactor_row or adafactor_col over
// (acc, g[n,m], step).
func (c *compiler) adafactorFactoredAcc() (func() error, error) {
	gs := c.shape(1)
	f, err := c.one("gc_"+c.in.Op, c.out(), c.arg(0), c.arg(1), c.arg(2), int64(gs[0]), int64(gs[1]), c.attr("eps1"), c.attr("decay"))
	return c.checkStep(2, f, err)
}

// adafactorV takes (v, g, step).
func (c *compiler) adafactorV() (func() error, error) {
	f, err := c.one("gc_adafactor_v", c.out(), c.arg(0), c.arg(1), c.arg(2), numel(c.outShape()), c.attr("eps1"), c.attr("decay"))
	return c.checkStep(2, f, err)
}

// sm3Row takes (row, g, col); the kernel takes (row, col, g).
func (c *compiler) sm3Row() (func() error, error) {
	s := c.shape(1)
	return c.one("gc_sm3_row", c.out(), c.arg(0), c.arg(2), c.arg(1), int64(s[0]), int64(s[1]))
}

// sm3Col takes (col, g, row); the kernel takes (row, col, g).
func (c *compiler) sm3Col() (func() error, error) {
	s := c.shape(1)
	return c.one("gc_sm3_col", c.out(), c.arg(2), c.arg(0), c.arg(1), int64(s[0]), int64(s[1]))
}

// sm3 takes (p[n,m], g, row, col, lr).
func (c *compiler) sm3() (func() error, error) {
	s := c.shape(0)
	return c.one("gc_sm3", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), int64(s[0]), int64(s[1]))
}

// sm3V takes (v, g).
func (c *compiler) sm3V() (func() error, error) {
	return c.one("gc_sm3_v", c.out(), c.arg(0), c.arg(1), numel(c.outShape()))
}

// sm3Vec takes (p, g, v, lr).
func (c *compiler) sm3Vec() (func() error, error) {
	return c.one("gc_sm3_vec", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), numel(c.outShape()))
}

// checkStep makes an optimizer update fail, as on the CPU, when the step
// number it reads (argument i, an input the runtime sets) is below 1: the
// kernel cannot report it.
func (c *compiler) checkStep(i int, f func() error, err error) (func() error, error) {
	if err != nil {
		return nil, err
	}
	id := c.in.Args[i]
	if c.buf(id).Kind != lower.Input {
		return f, nil
	}
	d, op := c.d, c.in.Op
	return func() error {
		if s, ok := d.scalars[id]; ok && s < 1 {
			return fmt.Errorf("%s: step must be ≥ 1, got %d", op, int64(s))
		}
		return f()
	}, nil
}

// partialGrid is the grid of a partial-sum launch over n elements: the
// number of per-block results it leaves.
func (c *compiler) partialGrid(n int64) uint32 {
	rt := c.d.rt
	return rt.gridFor(n, rt.threadsFor(n))
}

// globalSum is sum_squares or nonfinite_count over every argument: one
// partial launch per argument into consecutive per-block slots, then one
// block adds them in order.
func (c *compiler) globalSum() (func() error, error) {
	in := c.in
	grids := make([]uint32, len(in.Args))
	var total int64
	for i := range in.Args {
		grids[i] = c.partialGrid(numel(c.shape(i)))
		total += int64(grids[i])
	}
	partialName, finish, width, pdt := "gc_sum_squares_partial", "gc_finish_sum", int64(8), ir.F32
	if in.Op == "nonfinite_count" {
		partialName, finish, width, pdt = "gc_nonfinite_partial", "gc_finish_count", 4, ir.I32
	}
	base := c.scratch(width * total)
	var ls []*launch
	var off int64
	for i := range in.Args {
		p := parg{at: base.add(width * off), dt: pdt}
		l, err := c.kernelGrid(partialName, grids[i], p, c.arg(i), numel(c.shape(i)))
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		off += int64(grids[i])
	}
	var l *launch
	var err error
	if in.Op == "nonfinite_count" {
		l, err = c.kernel(finish, c.out(), parg{at: base, dt: ir.I32}, total)
	} else {
		l, err = c.kernel(finish, c.out(), parg{at: base, dt: ir.F32}, total, int64(1))
	}
	if err != nil {
		return nil, err
	}
	return c.runs(append(ls, l)...), nil
}

// adafactor is the factored (or vector) Adafactor update: the row sum,
// per-block partial norms, the clipped coefficient, then the update.
func (c *compiler) adafactor() (func() error, error) {
	in := c.in
	ws := parg{at: c.scratch(16), dt: ir.F32}
	step := c.arg(len(in.Args) - 1)
	eps2, clip, rel := c.attr("eps2"), c.attr("clip"), c.attr("rel_step")
	var ls []*launch
	add := func(l *launch, err error) error {
		if err == nil {
			ls = append(ls, l)
		}
		return err
	}
	if in.Op == "adafactor" {
		// Args are (p, g, row, col, step).
		s := c.shape(0)
		rows, cols := int64(s[0]), int64(s[1])
		grid := c.partialGrid(rows * cols)
		partial := parg{at: c.scratch(16 * int64(grid)), dt: ir.F32}
		if err := add(c.kernel("gc_adafactor_rowsum", ws, c.arg(2), rows)); err != nil {
			return nil, err
		}
		if err := add(c.kernelGrid("gc_adafactor_partial", grid, partial, c.arg(0), c.arg(1), c.arg(2), c.arg(3), ws, rows, cols)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("gc_adafactor_finish", ws, partial, step, int64(grid), rows*cols, eps2, clip, rel)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("gc_adafactor_apply", c.out(), c.arg(0), c.arg(1), c.arg(2), c.arg(3), ws, rows, cols)); err != nil {
			return nil, err
		}
		return c.checkStep(len(in.Args)-1, c.runs(ls...), nil)
	}
	// Args are (p, g, v, step).
	n := numel(c.shape(0))
	grid := c.partialGrid(n)
	partial := parg{at: c.scratch(16 * int64(grid)), dt: ir.F32}
	if err := add(c.kernelGrid("gc_adafactor_vec_partial", grid, partial, c.arg(0), c.arg(1), c.arg(2), n)); err != nil {
		return nil, err
	}
	if err := add(c.kernel("gc_adafactor_finish", ws, partial, step, int64(grid), n, eps2, clip, rel)); err != nil {
		return nil, err
	}
	if err := add(c.kernel("gc_adafactor_vec_apply", c.out(), c.arg(0), c.arg(1), c.arg(2), ws, n)); err != nil {
		return nil, err
	}
	return c.checkStep(len(in.Args)-1, c.runs(ls...), nil)
}
