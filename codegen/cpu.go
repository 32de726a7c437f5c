package codegen

import (
	"fmt"
	"sync"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
)

// tile is the number of elements each step of a fused body covers at a
// time: big enough that a kernel call costs little next to its loop,
// small enough that a body's temps stay in the first-level cache.
const tile = 2048

// grain is the fewest elements worth a goroutine, as for kernels/cpu's
// elementwise loops.
const grain = 16384

// stepKernel computes one body step over a tile: out from ins.
type stepKernel[T kcpu.Float] func(out []T, ins [][]T)

// CPU compiles a fused body into a closure that sets out from args, each
// of len(out) elements, exactly as running the body's ops one by one with
// kernels/cpu would. out may be the very slice of an arg (an update in
// place): each tile reads its arg elements before the last step writes
// them.
func CPU[T kcpu.Float](body ir.FusedBody, out []T, args [][]T) (func(), error) {
	if len(body) == 0 {
		return nil, fmt.Errorf("fused body is empty")
	}
	for i, a := range args {
		if len(a) != len(out) {
			return nil, fmt.Errorf("fused arg a%d has %d elements, the result %d", i, len(a), len(out))
		}
	}
	steps := make([]stepKernel[T], len(body))
	for i, st := range body {
		k, err := cpuKernel[T](st)
		if err != nil {
			return nil, fmt.Errorf("fused body step t%d: %w", i, err)
		}
		if err := checkRefs(i, st, len(args)); err != nil {
			return nil, err
		}
		steps[i] = k
	}
	temps := len(body) - 1
	pool := sync.Pool{New: func() any {
		s := make([]T, temps*tile)
		return &s
	}}
	n := len(out)
	run := func(lo, hi int) {
		scratch := pool.Get().(*[]T)
		defer pool.Put(scratch)
		ins := make([][]T, 0, 4)
		for start := lo; start < hi; start += tile {
			end := min(start+tile, hi)
			m := end - start
			temp := func(i int) []T { return (*scratch)[i*tile : i*tile+m] }
			for i, st := range body {
				ins = ins[:0]
				for _, r := range st.Args {
					if r.Arg {
						ins = append(ins, args[r.Index][start:end])
					} else {
						ins = append(ins, temp(r.Index))
					}
				}
				dst := out[start:end]
				if i < temps {
					dst = temp(i)
				}
				steps[i](dst, ins)
			}
		}
	}
	return func() { kcpu.ParallelFor(n, grain, run) }, nil
}

// cpuKernel maps one step onto the kernels/cpu function the CPU backend
// runs for its op, with the attributes converted as the backend converts
// them (float64 → T).
func cpuKernel[T kcpu.Float](st ir.FusedStep) (stepKernel[T], error) {
	attr := func(name string) (T, error) {
		v, err := floatAttr(st, name)
		return T(v), err
	}
	unary := map[string]func(o, x []T){"neg": kcpu.Neg[T], "exp": kcpu.Exp[T], "log": kcpu.Log[T], "tanh": kcpu.Tanh[T],
		"sqrt": kcpu.Sqrt[T], "gelu": kcpu.Gelu[T], "relu": kcpu.Relu[T], "silu": kcpu.Silu[T]}
	binary := map[string]func(o, a, b []T){"add": kcpu.Add[T], "sub": kcpu.Sub[T], "mul": kcpu.Mul[T], "div": kcpu.Div[T],
		"gelu_grad": kcpu.GeluGrad[T], "relu_grad": kcpu.ReluGrad[T], "tanh_grad": kcpu.TanhGrad[T], "silu_grad": kcpu.SiluGrad[T], "sm3_v": kcpu.SM3Accumulate[T]}
	want := 0
	var k stepKernel[T]
	switch op := st.Op; {
	case unary[op] != nil:
		f := unary[op]
		want, k = 1, func(o []T, in [][]T) { f(o, in[0]) }
	case binary[op] != nil:
		f := binary[op]
		want, k = 2, func(o []T, in [][]T) { f(o, in[0], in[1]) }
	case op == "adam_m" || op == "adam_v":
		name, f := "beta1", kcpu.AdamMoment1[T]
		if op == "adam_v" {
			name, f = "beta2", kcpu.AdamMoment2[T]
		}
		beta, err := attr(name)
		if err != nil {
			return nil, err
		}
		want, k = 2, func(o []T, in [][]T) { f(o, in[0], in[1], beta) }
	case op == "sgd_buf":
		mom, err := attr("momentum")
		if err != nil {
			return nil, err
		}
		wd, err := attr("wd")
		if err != nil {
			return nil, err
		}
		want, k = 3, func(o []T, in [][]T) { kcpu.SGDMomentum(o, in[0], in[1], in[2], mom, wd) }
	default:
		return nil, fmt.Errorf("no CPU kernel for %s in a fused body", op)
	}
	if len(st.Args) != want {
		return nil, fmt.Errorf("%s takes %d operands, got %d", st.Op, want, len(st.Args))
	}
	return k, nil
}
