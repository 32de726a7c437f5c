package runtime

import (
	"fmt"

	"gcompile/ir"
)

// ZigzagSplit is a dim a zigzag mesh axis splits (ir.MeshAxis.Zigzag):
// each of its Blocks blocks (one unless the dim merges several
// sequences) is cut into 2·N chunks, and the devices hold them in the
// order ir.ZigzagChunk gives.
type ZigzagSplit struct {
	Dim, Blocks, N int
}

// ZigzagSplits lists the dims of a value placed by place on mesh that a
// zigzag axis splits.
func ZigzagSplits(mesh *ir.Mesh, place []ir.Placement) []ZigzagSplit {
	if mesh == nil {
		return nil
	}
	var out []ZigzagSplit
	for i, p := range place {
		if i < len(mesh.Axes) && mesh.Axes[i].Zigzag && mesh.Axes[i].Size > 1 && p.Kind == ir.Shard {
			out = append(out, ZigzagSplit{Dim: p.Dim, Blocks: p.NumBlocks(), N: mesh.Axes[i].Size})
		}
	}
	return out
}

// Zigzag copies src, a tensor of shape, into dst with dim z.Dim
// reordered: from the natural order into the order the devices hold its
// chunks (toHeld), or back. In the held order a zigzag split is a plain
// split: device i's part is the held chunks 2i and 2i+1.
func Zigzag[T any](dst, src []T, shape []int, z ZigzagSplit, toHeld bool) {
	outer, inner := 1, 1
	for _, n := range shape[:z.Dim] {
		outer *= n
	}
	for _, n := range shape[z.Dim+1:] {
		inner *= n
	}
	outer *= z.Blocks
	m := shape[z.Dim] / z.Blocks // one block's length along the dim
	chunk := m / (2 * z.N) * inner
	for o := range outer {
		base := o * m * inner
		for k := range 2 * z.N {
			held, natural := base+k*chunk, base+ir.ZigzagChunk(k, z.N)*chunk
			if toHeld {
				copy(dst[held:held+chunk], src[natural:natural+chunk])
			} else {
				copy(dst[natural:natural+chunk], src[held:held+chunk])
			}
		}
	}
}

// zigzagHeld is x (of shape) in the held order of every zigzag split,
// a copy when there is one, x itself otherwise.
func zigzagHeld[T any](x []T, shape []int, splits []ZigzagSplit) []T {
	for _, z := range splits {
		y := make([]T, len(x))
		Zigzag(y, x, shape, z, true)
		x = y
	}
	return x
}

// SeqPositions is the global position, along dim, of each of the rows
// v's block holds on the device at coords: a chunk of a sequence split
// over a context-parallel axis, two chunks in the zigzag layout. nil
// when the dim is whole.
func SeqPositions(mesh *ir.Mesh, v *ir.Value, dim int, coords []int) ([]int, error) {
	first, err := seqOffset(mesh, v, dim, coords)
	if err != nil || mesh == nil || v == nil || v.Place == nil || dim >= v.Type.Rank() {
		return nil, err
	}
	local := ir.LocalShape(v.Type.Shape, v.Place, mesh)[dim]
	for ax, p := range v.Place {
		if a := mesh.Axes[ax]; a.Zigzag && a.Size > 1 && p.Placed(dim) {
			half := local / 2
			lo, hi := ir.ZigzagChunk(2*coords[ax], a.Size), ir.ZigzagChunk(2*coords[ax]+1, a.Size)
			pos := make([]int, local)
			for i := range pos {
				if i < half {
					pos[i] = lo*half + i
				} else {
					pos[i] = hi*half + i - half
				}
			}
			return pos, nil
		}
	}
	if local == v.Type.Shape[dim] {
		return nil, nil
	}
	pos := make([]int, local)
	for i := range pos {
		pos[i] = first + i
	}
	return pos, nil
}

// seqOffset is the global index of the first row along dim of v's block
// on the device at coords: where a contiguous chunk of a sequence split
// over a context-parallel axis starts (0 when the dim is whole).
func seqOffset(mesh *ir.Mesh, v *ir.Value, dim int, coords []int) (int, error) {
	if mesh == nil || v == nil || v.Place == nil || dim >= v.Type.Rank() {
		return 0, nil
	}
	view := dim
	for _, p := range v.Place {
		if p.Kind == ir.Shard && p.NumBlocks() > 1 {
			if p.Dim == dim {
				return 0, fmt.Errorf("%s: dim %d is split in blocks (%v): its rows are not one chunk", v.Where(), dim, p)
			}
			if p.Dim < dim {
				view++
			}
		}
	}
	return ir.BlockBox(mesh, v.Place, v.Type.Shape, coords).Lo[view], nil
}
