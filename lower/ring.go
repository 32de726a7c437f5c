package lower

import "gcompile/ir"

// RingAttention reports whether v is an attention op that runs as ring
// attention: its q is split on its sequence (dim 2) over the mesh's
// context-parallel axis, so the instruction passes K/V chunks around the
// cp ranks itself (passes' contextParallelAttention, runtime/cpu's ring).
func RingAttention(v *ir.Value, mesh *ir.Mesh) bool {
	if mesh == nil || v == nil || len(v.Args) < 2 || v.Args[0].Place == nil {
		return false
	}
	switch v.Op {
	case "attention", "attention_stats", "attention_grad_q", "attention_grad_k", "attention_grad_v":
	default:
		return false
	}
	ax := mesh.SequenceAxis()
	return ax >= 0 && mesh.Axes[ax].Size > 1 && v.Args[0].Place[ax].Placed(2)
}

// RingScratch is the scratch of a ring attention instruction, in the
// order the runtime carves it, each piece's bytes rounded up to 8: the K
// (and V, and for dk and dv the gradient) chunk held and the one being
// received, and the instruction's running results. q and k are the local
// types of its first two operands; the kernels compute in float64 for
// f64 operands and in float32 otherwise (16-bit operands are widened).
func RingScratch(op string, q, k ir.Type) []int64 {
	if q.Rank() != 4 || k.Rank() != 4 {
		return nil
	}
	e := int64(4)
	if q.DType == ir.F64 {
		e = 8
	}
	qLen := q.Shape.NumElements()
	kvLen := k.Shape.NumElements()
	rows := qLen / int64(max(q.Shape[3], 1))
	round := func(n int64) int64 { return (n + 7) &^ 7 }
	var pieces []int64
	add := func(n, size int64) { pieces = append(pieces, round(n*size)) }
	chunks := func(streams int64) {
		for range 2 * streams { // held and received
			add(kvLen, e)
		}
	}
	switch op {
	case "attention":
		chunks(2)
		add(qLen, 8) // the running output
		add(rows, 8) // its log-sum-exp
		add(rows, 8) // the step's log-sum-exp
		add(qLen, e) // the step's output
	case "attention_stats":
		chunks(1)
		add(2*rows, e) // the step's statistics
		add(rows, 8)   // the running log-sum-exp
	case "attention_grad_q":
		chunks(2)
		add(qLen, e) // the step's share of dq
		add(qLen, 8) // the running dq
	case "attention_grad_k":
		chunks(3)
		add(kvLen, e) // the step's share of dk
	case "attention_grad_v":
		chunks(2)
		add(kvLen, e) // the step's share of dv
	}
	return pieces
}

// RingTraffic is what a ring attention instruction (q and k its first
// operands' local types) passes around the ring: at each step but the
// last, streams chunks of chunk bytes (K and V forward; K for the
// statistics; K and V for dq; K, V and the running dk for dk; K and the
// running dv for dv), in the kernels' float width (RingScratch), and at
// the end home chunks more (dk and dv return to their rank).
func RingTraffic(op string, q, k ir.Type) (streams, home, chunk int64) {
	e := int64(4)
	if q.DType == ir.F64 {
		e = 8
	}
	switch op {
	case "attention", "attention_grad_q":
		streams = 2
	case "attention_stats":
		streams = 1
	case "attention_grad_k":
		streams, home = 3, 1
	case "attention_grad_v":
		streams, home = 2, 1
	}
	return streams, home, k.Shape.NumElements() * e
}

// RingSendBytes is what one device sends around a ring of n for a ring
// attention instruction (RingTraffic).
func RingSendBytes(op string, q, k ir.Type, n int) int64 {
	if n < 2 {
		return 0
	}
	streams, home, chunk := RingTraffic(op, q, k)
	return (int64(n-1)*streams + home) * chunk
}
