package runtime

import (
	"fmt"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// Ring is one device's place on the ring of a ring-attention instruction
// (Megatron-Core's context parallelism): the instruction's q and k are
// split on their sequence over the mesh's context-parallel axis, and the
// K/V chunks pass around that axis's devices one step per device. Both
// backends find it the same way (RingOf) and give each step's chunk the
// same global positions (Chunk), so they mask alike.
type Ring struct {
	// Axis is the context-parallel mesh axis; Pos the device's position
	// on it and N its size.
	Axis, Pos, N int
	// Zigzag: position p holds chunks p and 2N−1−p of the sequence's 2N
	// (ir.MeshAxis.Zigzag); otherwise the p-th of N.
	Zigzag bool
}

// RingOf finds the ring attention instruction in runs on at the device
// at coords: ok is false when its q is not split on the sequence (dim 2)
// over a context-parallel axis. A q and k split unlike each other, or a
// zigzag sequence that 2·N does not divide, is an error naming the rule.
func RingOf(mesh *ir.Mesh, in lower.Instr, coords []int) (r Ring, ok bool, err error) {
	if mesh == nil || in.Value == nil || len(in.Value.Args) < 2 {
		return Ring{}, false, nil
	}
	ax := mesh.SequenceAxis()
	if ax < 0 || mesh.Axes[ax].Size == 1 {
		return Ring{}, false, nil
	}
	q, k := in.Value.Args[0], in.Value.Args[1]
	if q.Place == nil || !q.Place[ax].Placed(2) {
		return Ring{}, false, nil
	}
	if k.Place == nil || !k.Place[ax].Placed(2) || q.Type.Shape[2] != k.Type.Shape[2] {
		return Ring{}, true, fmt.Errorf("%s: ring attention needs q and k split alike on their sequence over %s (q %v %v, k %v %v)",
			in.Op, mesh.Axes[ax].Name, q.Type, q.Place, k.Type, k.Place)
	}
	a := mesh.Axes[ax]
	if a.Zigzag && q.Type.Shape[2]%(2*a.Size) != 0 {
		return Ring{}, true, fmt.Errorf("%s: the zigzag layout cuts the sequence of %d into 2·%d chunks, which do not divide it", in.Op, q.Type.Shape[2], a.Size)
	}
	return Ring{Axis: ax, Pos: coords[ax], N: a.Size, Zigzag: a.Zigzag}, true, nil
}

// Src is the position of the device whose K/V chunk the ring holds at
// step t: its own at step 0, then the previous device's, and so on.
func (r Ring) Src(t int) int { return ((r.Pos-t)%r.N + r.N) % r.N }

// Chunk is d (the device's own problem) with the queries at this
// device's rows and the keys at the rows of the device at ring position
// src, and whether a causal mask hides all of it (the step is then
// skipped; the chunk still travels on).
func (r Ring) Chunk(d kcpu.AttentionDims, src int) (kcpu.AttentionDims, bool) {
	d.Positioned = true
	if r.Zigzag {
		hq, hk := d.SQ/2, d.SK/2
		d.QPos = [2]int{ir.ZigzagChunk(2*r.Pos, r.N) * hq, ir.ZigzagChunk(2*r.Pos+1, r.N) * hq}
		d.KPos = [2]int{ir.ZigzagChunk(2*src, r.N) * hk, ir.ZigzagChunk(2*src+1, r.N) * hk}
		d.QBreak, d.KBreak = hq, hk
	} else {
		d.QPos, d.KPos = [2]int{r.Pos * d.SQ, r.Pos * d.SQ}, [2]int{src * d.SK, src * d.SK}
		d.QBreak, d.KBreak = d.SQ, d.SK
	}
	return d, d.Hidden()
}
