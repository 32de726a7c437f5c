package comm

import (
	"fmt"

	"gcompile/ir"
	"gcompile/runtime"
)

// The rules a member's own arguments must follow, the same for every
// transport. Each check returns the first violation (wrapping
// runtime.ErrArgs), without naming the call: each transport says where.

// allReduceArgs checks a bucket: summable elements, whole elements in
// every buffer, no two buffers sharing memory. total is its byte length.
func allReduceArgs(dt ir.DType, bufs [][]byte) (total int, err error) {
	if err := checkSummable(dt); err != nil {
		return 0, err
	}
	for i, b := range bufs {
		total += len(b)
		if err == nil {
			err = checkElems(dt, fmt.Sprintf("bufs[%d]", i), len(b))
		}
		for j := range i {
			if err == nil && overlap(b, bufs[j]) {
				err = fmt.Errorf("%w: bufs[%d] and bufs[%d] overlap", runtime.ErrArgs, j, i)
			}
		}
	}
	return total, err
}

// reduceScatterArgs checks len(in) = group size × len(out), and that out
// does not overlap in except as exactly the caller's chunk of in (NCCL's
// in-place form, which inPlace reports).
func reduceScatterArgs(g runtime.Group, rank int, dt ir.DType, in, out []byte) (inPlace bool, err error) {
	n, k := g.Size(), len(out)
	if err := checkSummable(dt); err != nil {
		return false, err
	}
	if err := checkElems(dt, "out", k); err != nil {
		return false, err
	}
	switch p := g.Pos(rank); {
	case len(in) != n*k:
		return false, fmt.Errorf("%w: len(in) is %d, want group size %d × len(out) %d = %d", runtime.ErrArgs, elems(dt, len(in)), n, elems(dt, k), elems(dt, n*k))
	case p >= 0 && same(out, in[p*k:(p+1)*k]):
		return k > 0, nil
	case overlap(in, out):
		return false, fmt.Errorf("%w: out overlaps in other than as in's own chunk [%d:%d] (the in-place form)", runtime.ErrArgs, elems(dt, p*k), elems(dt, (p+1)*k))
	}
	return false, nil
}

// allGatherArgs checks len(out) = group size × len(in), and that in does
// not overlap out except as exactly the caller's chunk of out (NCCL's
// in-place form, which inPlace reports).
func allGatherArgs(g runtime.Group, rank int, dt ir.DType, in, out []byte) (inPlace bool, err error) {
	n, k := g.Size(), len(in)
	if err := checkElems(dt, "in", k); err != nil {
		return false, err
	}
	switch p := g.Pos(rank); {
	case len(out) != n*k:
		return false, fmt.Errorf("%w: len(out) is %d, want group size %d × len(in) %d = %d", runtime.ErrArgs, elems(dt, len(out)), n, elems(dt, k), elems(dt, n*k))
	case p >= 0 && same(in, out[p*k:(p+1)*k]):
		return true, nil
	case overlap(in, out):
		return false, fmt.Errorf("%w: in overlaps out other than as out's own chunk [%d:%d] (the in-place form)", runtime.ErrArgs, elems(dt, p*k), elems(dt, (p+1)*k))
	}
	return false, nil
}

// allToAllArgs checks equal lengths, a whole chunk per member and no
// overlap.
func allToAllArgs(g runtime.Group, dt ir.DType, in, out []byte) error {
	n := g.Size()
	if err := checkElems(dt, "in", len(in)); err != nil {
		return err
	}
	switch {
	case len(in) != len(out):
		return fmt.Errorf("%w: len(in) is %d but len(out) is %d; they must be equal", runtime.ErrArgs, elems(dt, len(in)), elems(dt, len(out)))
	case n > 0 && len(in)%(n*int(dt.Size())) != 0:
		return fmt.Errorf("%w: len(in) %d is not a multiple of the group size %d", runtime.ErrArgs, elems(dt, len(in)), n)
	case overlap(in, out):
		return fmt.Errorf("%w: in and out overlap", runtime.ErrArgs)
	}
	return nil
}

// broadcastArgs checks whole elements and a root inside the group.
func broadcastArgs(g runtime.Group, root int, dt ir.DType, buf []byte) error {
	if err := checkElems(dt, "buf", len(buf)); err != nil {
		return err
	}
	if root < 0 || root >= g.Size() {
		return fmt.Errorf("%w: root position %d is outside the group's [0,%d)", runtime.ErrArgs, root, g.Size())
	}
	return nil
}
