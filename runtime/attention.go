package runtime

import (
	"fmt"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
)

// AttentionDims is the problem an instruction of one of the fused
// attention ops (attention, attention_stats, attention_grad_q/k/v: each
// reads q first and k second) solves on the device at coords: the local
// shapes, the causal flag and scale, and where the device's heads sit.
// Under tensor parallelism q is split by heads and k, v either split
// alike or whole (when tp does not divide the k/v heads, passes'
// attentionRule), so a device's query head h reads global k/v head
// (qOffset+h)/group, which is local head that minus the offset of its
// block of k. The offsets are the first head of each block; a program
// with no mesh, or heads not split, has both 0.
func AttentionDims(mesh *ir.Mesh, in lower.Instr, coords []int) (kcpu.AttentionDims, error) {
	if len(in.ArgTypes) < 2 || in.ArgTypes[0].Rank() != 4 || in.ArgTypes[1].Rank() != 4 {
		return kcpu.AttentionDims{}, fmt.Errorf("%s needs q [batch, heads, seq, hd] and k [batch, kv_heads, seq, hd], got %v", in.Op, in.ArgTypes)
	}
	q, k := in.ArgTypes[0].Shape, in.ArgTypes[1].Shape
	d := kcpu.AttentionDims{Batch: q[0], Heads: q[1], KVHeads: k[1], SQ: q[2], SK: k[2], HeadDim: q[3],
		Causal: in.Attrs.Bool("causal"), Scale: in.Attrs.Float("scale", 0)}
	d.Group = d.Heads / max(d.KVHeads, 1)
	if v := in.Value; v != nil && len(v.Args) >= 2 {
		gq, gk := v.Args[0], v.Args[1]
		d.Group = gq.Type.Shape[1] / max(gk.Type.Shape[1], 1)
		var err error
		if d.QHeadOffset, err = headOffset(mesh, gq, coords); err != nil {
			return d, err
		}
		if d.KVHeadOffset, err = headOffset(mesh, gk, coords); err != nil {
			return d, err
		}
	}
	for h := range d.Heads {
		if j := (d.QHeadOffset+h)/max(d.Group, 1) - d.KVHeadOffset; j < 0 || j >= d.KVHeads {
			return d, fmt.Errorf("%s: the device's query head %d (global %d) reads k/v head %d, which it does not hold (its k/v heads are %d from %d)",
				in.Op, h, d.QHeadOffset+h, j+d.KVHeadOffset, d.KVHeads, d.KVHeadOffset)
		}
	}
	return d, nil
}

// headOffset is the global index of the first head (dim 1) of v's block
// on the device at coords.
func headOffset(mesh *ir.Mesh, v *ir.Value, coords []int) (int, error) {
	if mesh == nil || v.Place == nil {
		return 0, nil
	}
	for _, p := range v.Place {
		if p.Kind == ir.Shard && p.Dim <= 1 && p.NumBlocks() > 1 {
			return 0, fmt.Errorf("attention operand %s is split in blocks on dim %d (%v): heads must be split whole", v.Where(), p.Dim, p)
		}
	}
	return ir.BlockBox(mesh, v.Place, v.Type.Shape, coords).Lo[1], nil
}

// SplitOverSequence reports whether dim of v is split over the mesh's
// context-parallel axis (cp), and names that axis.
func SplitOverSequence(mesh *ir.Mesh, v *ir.Value, dim int) (string, bool) {
	if mesh == nil || v == nil || v.Place == nil {
		return "", false
	}
	ax := mesh.SequenceAxis()
	if ax < 0 || mesh.Axes[ax].Size == 1 || !v.Place[ax].Placed(dim) {
		return "", false
	}
	return mesh.Axes[ax].Name, true
}
