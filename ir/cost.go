package ir

// Cost conventions. An op's Cost is the work of one execution on the
// types one device holds (lower.Instr's ArgTypes and OutType):
//
//   - flops counts floating-point operations on elements: an add, a
//     multiply, a divide, a compare, a select or a conversion is 1; a
//     transcendental (exp, log, tanh, sqrt, rsqrt) is TranscendentalFlops.
//     An op's count per element follows the formula its kernels evaluate
//     (gelu is 8 + one tanh, softmax max, subtract, exp, sum and divide).
//     Work done once per row or once per step (a row's reciprocal, Adam's
//     bias correction) is left out: it is small next to the per-element
//     work and depends on the kernel. An fp32 accumulator for a 16-bit op
//     costs nothing extra.
//   - bytes counts the compulsory traffic: every argument read once, the
//     result written once, at their dtypes' sizes. A kernel that takes
//     two passes over a tensor, or a GEMM that re-reads tiles, moves more;
//     that belongs to a model of the kernel, not to the op. Ops that touch
//     only part of an argument count only that part (slice, embedding).
//     A reshape is a view and costs nothing; sources cost nothing per step.
//   - collectives count 0 flops (a reduction's adds are hidden behind the
//     transfer) and the bytes of their local argument and result. What
//     crosses the links depends on the group size, the algorithm and the
//     topology, which a cost model adds from the mesh.
//   - counts saturate at math.MaxInt64 (SatMul, SatAdd): a type that
//     passed CheckType fits in int64 bytes, but FLOPs of a GEMM or the
//     traffic of several such tensors need not, and a wrapped count
//     would read as cheap.

// TranscendentalFlops is what one exp, log, tanh, sqrt or rsqrt counts
// as: the special-function units of a GPU issue about a quarter as many
// of these per cycle as fused multiply-adds.
const TranscendentalFlops = 4

func elems(t Type) int64 { return t.Shape.NumElements() }

// ioBytes is every argument read once plus the result written once.
func ioBytes(args []Type, out Type) int64 {
	n := out.Bytes()
	for _, t := range args {
		n = SatAdd(n, t.Bytes())
	}
	return n
}

// perOut is the cost of an op doing k flops per result element.
func perOut(k int64) CostFunc {
	return func(args []Type, out Type, _ Attrs) (int64, int64) {
		return SatMul(k, elems(out)), ioBytes(args, out)
	}
}

// perArg is the cost of an op doing k flops per element of argument i
// (reductions, and ops whose result is smaller than their input).
func perArg(i int, k int64) CostFunc {
	return func(args []Type, out Type, _ Attrs) (int64, int64) {
		return SatMul(k, elems(args[i])), ioBytes(args, out)
	}
}

// perArgs is the cost of an op doing k flops per element of every
// argument (the variadic sums over gradients).
func perArgs(k int64) CostFunc {
	return func(args []Type, out Type, _ Attrs) (int64, int64) {
		var n int64
		for _, t := range args {
			n = SatAdd(n, elems(t))
		}
		return SatMul(k, n), ioBytes(args, out)
	}
}

// scalarCost is the cost of an op computing a scalar from scalars in k
// flops.
func scalarCost(k int64) CostFunc {
	return func(args []Type, out Type, _ Attrs) (int64, int64) { return k, ioBytes(args, out) }
}

// moveCost is the cost of an op that only moves data: transposes,
// concatenations, broadcasts and collectives.
func moveCost(args []Type, out Type, _ Attrs) (int64, int64) { return 0, ioBytes(args, out) }

// noCost is the cost of a view (reshape) and of a source, which the
// runtime fills at load or before the step rather than computing.
func noCost([]Type, Type, Attrs) (int64, int64) { return 0, 0 }

// sliceCost: the slice reads only the part it keeps.
func sliceCost(_ []Type, out Type, _ Attrs) (int64, int64) { return 0, SatMul(2, out.Bytes()) }

// matmulCost is 2·m·n·k per batch: one multiply and one add per term of
// every dot product. k is the contraction dim of the first operand.
func matmulCost(args []Type, out Type, a Attrs) (int64, int64) {
	x := args[0]
	k := x.Shape[x.Rank()-1]
	if a.Bool("transA") {
		k = x.Shape[x.Rank()-2]
	}
	return SatMul(SatMul(2, elems(out)), int64(k)), ioBytes(args, out)
}

// reduceMeanCost adds every input element and divides every result.
func reduceMeanCost(args []Type, out Type, _ Attrs) (int64, int64) {
	return SatAdd(elems(args[0]), elems(out)), ioBytes(args, out)
}

// embeddingCost: a gather moves the ids and, for each, one table row in
// and one result row out; the rest of the table is not read.
func embeddingCost(args []Type, out Type, _ Attrs) (int64, int64) {
	return 0, SatAdd(args[1].Bytes(), SatMul(2, out.Bytes()))
}

// embeddingGradCost: the result is zeroed, then each id's dy row is added
// to its row of the result (read, add, write).
func embeddingGradCost(args []Type, out Type, _ Attrs) (int64, int64) {
	dy := args[1]
	return elems(dy), SatAdd(ioBytes(args, out), SatMul(2, dy.Bytes()))
}

// factoredAccCost is Adafactor's row or column accumulator (own, g,
// step): g² + ε₁ summed for every element of g, then the decayed blend of
// every accumulator element.
func factoredAccCost(args []Type, out Type, _ Attrs) (int64, int64) {
	return SatAdd(SatMul(3, elems(args[1])), SatMul(3, elems(out))), ioBytes(args, out)
}

// fusedCost is the sum of the body's steps, each at its own op's cost per
// element, with the traffic of the fused op alone: the point of fusing is
// that the temporaries never reach memory. A body the type rule would
// refuse counts no flops.
func fusedCost(args []Type, out Type, a Attrs) (int64, int64) {
	body, err := ParseFusedBody(a.Str("body"), len(args))
	if err != nil {
		return 0, ioBytes(args, out)
	}
	var flops int64
	for _, st := range body {
		info, ok := Lookup(st.Op)
		if !ok || info.Cost == nil {
			continue
		}
		stepArgs := make([]Type, len(st.Args))
		for i := range stepArgs {
			stepArgs[i] = out
		}
		f, _ := info.Cost(stepArgs, out, st.Attrs)
		flops = SatAdd(flops, f)
	}
	return flops, ioBytes(args, out)
}
