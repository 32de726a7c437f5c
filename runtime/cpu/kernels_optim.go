package cpu

import (
	"fmt"
	"math"

	kcpu "gcompile/kernels/cpu"
)

// Optimizer ops: the global-norm clipping and overflow checks around a
// step, then Adam, SGD, Adafactor and SM3 updates. Each op has one result;
// an update that changes several tensors is several ops.
func init() {
	// Scalar results: the dtype of the first argument picks the kernel.
	builtin(Kernel{F32: sumSquares[float32], F64: sumSquares[float64], TypeOf: Arg(0)}, "sum_squares")
	builtin(Kernel{F32: nonfiniteCount[float32], F64: nonfiniteCount[float64], TypeOf: Arg(0)}, "nonfinite_count")
	builtin(Kernel{F32: clipCoef[float32], F64: clipCoef[float64], TypeOf: Arg(0)}, "clip_coef")
	builtin(Kernel{F32: whereFinite[float32], F64: whereFinite[float64]}, "where_finite")

	builtin(Kernel{F32: adamM[float32], F64: adamM[float64]}, "adam_m")
	builtin(Kernel{F32: adamV[float32], F64: adamV[float64]}, "adam_v")
	builtin(Kernel{F32: adamW[float32], F64: adamW[float64]}, "adamw")
	builtin(Kernel{F32: sgdBuf[float32], F64: sgdBuf[float64]}, "sgd_buf")
	builtin(Kernel{F32: sgd[float32], F64: sgd[float64]}, "sgd")
	builtin(Kernel{F32: adafactorAcc[float32], F64: adafactorAcc[float64]}, "adafactor_row", "adafactor_col", "adafactor_v")
	builtin(Kernel{F32: adafactor[float32], F64: adafactor[float64]}, "adafactor", "adafactor_vec")
	builtin(Kernel{F32: sm3Acc[float32], F64: sm3Acc[float64]}, "sm3_row", "sm3_col")
	builtin(Kernel{F32: sm3[float32], F64: sm3[float64]}, "sm3")
	builtin(Kernel{F32: sm3V[float32], F64: sm3V[float64]}, "sm3_v")
	builtin(Kernel{F32: sm3Vec[float32], F64: sm3Vec[float64]}, "sm3_vec")
}

func sumSquares[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, xs := c.Out(), c.Args()
	return ok(func() {
		var s float64
		for _, x := range xs {
			s += kcpu.SumSquares(x)
		}
		out[0] = T(s)
	}), nil
}

func nonfiniteCount[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, xs := c.Out(), c.Args()
	return ok(func() {
		n := 0
		for _, x := range xs {
			n += kcpu.CountNonFinite(x)
		}
		out[0] = T(n)
	}), nil
}

// whereFinite takes (count, new, old); out may share old's buffer (an
// update in place).
func whereFinite[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, n, nw, old := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	return ok(func() {
		if n[0] == 0 {
			copy(out, nw)
		} else {
			copy(out, old)
		}
	}), nil
}

func clipCoef[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, ss, maxNorm := c.Out(), c.Arg(0), c.Instr.Attrs.Float("max_norm", 0)
	return ok(func() { out[0] = T(min(1, maxNorm/(math.Sqrt(float64(ss[0]))+1e-6))) }), nil
}

func adamM[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, m, g, b1 := c.Out(), c.Arg(0), c.Arg(1), T(c.Instr.Attrs.Float("beta1", 0))
	return ok(func() { kcpu.AdamMoment1(out, m, g, b1) }), nil
}

func adamV[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, v, g, b2 := c.Out(), c.Arg(0), c.Arg(1), T(c.Instr.Attrs.Float("beta2", 0))
	return ok(func() { kcpu.AdamMoment2(out, v, g, b2) }), nil
}

// checkStep rejects a step below 1: bias corrections and decay schedules
// divide by or raise to it.
func checkStep(op string, step int64) error {
	if step < 1 {
		return fmt.Errorf("%s: step must be ≥ 1, got %d", op, step)
	}
	return nil
}

func adamW[T kcpu.Float](c *Call[T]) (func() error, error) {
	a := c.Instr.Attrs
	out, p, m, v, lr, step := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3), c.Int64(4)
	b1, b2, eps, wd := T(a.Float("beta1", 0)), T(a.Float("beta2", 0)), T(a.Float("eps", 0)), T(a.Float("wd", 0))
	return func() error {
		if err := checkStep("adamw", step[0]); err != nil {
			return err
		}
		kcpu.AdamW(out, p, m, v, lr[0], b1, b2, eps, wd, int(step[0]))
		return nil
	}, nil
}

func sgdBuf[T kcpu.Float](c *Call[T]) (func() error, error) {
	a := c.Instr.Attrs
	out, buf, g, p := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	mom, wd := T(a.Float("momentum", 0)), T(a.Float("wd", 0))
	return ok(func() { kcpu.SGDMomentum(out, buf, g, p, mom, wd) }), nil
}

func sgd[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, p, buf, lr := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	return ok(func() { kcpu.SGDUpdate(out, p, buf, lr[0]) }), nil
}

// adafactorAcc updates one of Adafactor's accumulators: args (acc, g,
// step), the decayed row sums, column sums or unfactored moment.
func adafactorAcc[T kcpu.Float](c *Call[T]) (func() error, error) {
	op, a := c.Instr.Op, c.Instr.Attrs
	out, acc, g, step, gs := c.Out(), c.Arg(0), c.Arg(1), c.Int64(2), c.Shape(1)
	eps1, decay := a.Float("eps1", 0), a.Float("decay", 0)
	return func() error {
		if err := checkStep(op, step[0]); err != nil {
			return err
		}
		beta := kcpu.AdafactorBeta2(int(step[0]), decay)
		switch op {
		case "adafactor_row":
			kcpu.AdafactorRows(out, acc, g, gs[0], gs[1], beta, eps1)
		case "adafactor_col":
			kcpu.AdafactorCols(out, acc, g, gs[0], gs[1], beta, eps1)
		default:
			kcpu.AdafactorMoment(out, acc, g, beta, eps1)
		}
		return nil
	}, nil
}

// adafactor is the update itself: args (p, g, row, col, step) for a
// factored matrix or (p, g, v, step) for a vector.
func adafactor[T kcpu.Float](c *Call[T]) (func() error, error) {
	op, a := c.Instr.Op, c.Instr.Attrs
	out, p, g, v := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	var col []T
	if op == "adafactor" {
		col = c.Arg(3)
	}
	step, s := c.Int64(len(c.Instr.Args)-1), c.Shape(0)
	h := kcpu.AdafactorStep{Eps2: a.Float("eps2", 0), Clip: a.Float("clip", 0), RelStep: a.Float("rel_step", 0)}
	return func() error {
		if err := checkStep(op, step[0]); err != nil {
			return err
		}
		h.Step = int(step[0])
		if col != nil {
			kcpu.Adafactor(out, p, g, v, col, s[0], s[1], h)
		} else {
			kcpu.AdafactorVec(out, p, g, v, h)
		}
		return nil
	}, nil
}

// sm3Acc updates one of SM3's covers of a matrix: args (own accumulator,
// g, other accumulator).
func sm3Acc[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, row, g, col := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2)
	n, m := c.Shape(1)[0], c.Shape(1)[1]
	if c.Instr.Op == "sm3_col" {
		row, col = col, row
		return ok(func() { kcpu.SM3Cols(out, row, col, g, n, m) }), nil
	}
	return ok(func() { kcpu.SM3Rows(out, row, col, g, n, m) }), nil
}

func sm3[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, p, g, row, col, lr := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3), c.Arg(4)
	n, m := c.Shape(0)[0], c.Shape(0)[1]
	return ok(func() { kcpu.SM3(out, p, g, row, col, n, m, float64(lr[0])) }), nil
}

func sm3V[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, v, g := c.Out(), c.Arg(0), c.Arg(1)
	return ok(func() { kcpu.SM3Accumulate(out, v, g) }), nil
}

func sm3Vec[T kcpu.Float](c *Call[T]) (func() error, error) {
	out, p, g, v, lr := c.Out(), c.Arg(0), c.Arg(1), c.Arg(2), c.Arg(3)
	return ok(func() { kcpu.SM3Vec(out, p, g, v, float64(lr[0])) }), nil
}
