package runtime

import (
	"fmt"

	"gcompile/ir"
	"gcompile/lower"
)

// CollectiveBlocks is how many blocks of a collective's split dim (its
// blocks attribute, S(d)xK) the device's operand holds: where an axis
// coarser than the collective's (earlier in ir.Mesh.SplitOrderOn) splits
// that dim too, it splits the blocks themselves (ir.BlockBox), and the
// device holds K over its size of them. A sequence cut into routing
// groups and split over cp (S(0)xbatch) whose sequences ep also splits is
// such a dim.
func CollectiveBlocks(mesh *ir.Mesh, in lower.Instr) (int, error) {
	k := in.Attrs.Int("blocks", 1)
	if k <= 1 || mesh == nil || in.Value == nil || len(in.Value.Args) == 0 {
		return k, nil
	}
	ax := mesh.Axis(in.Attrs.Str("axis"))
	d := in.Attrs.Int("dim", 0)
	coarser := 1
	place := in.Value.Args[0].Place
	for _, a := range mesh.SplitOrderOn(d, place) {
		if a == ax {
			break
		}
		if a < len(place) && place[a].Kind == ir.Shard && place[a].Dim == d && place[a].NumBlocks() == 1 {
			coarser *= mesh.Axes[a].Size
		}
	}
	if k%coarser != 0 {
		return 0, fmt.Errorf("%s over %s: dim %d in %d blocks is split %d ways by coarser axes, which do not divide the blocks", in.Op, in.Attrs.Str("axis"), d, k, coarser)
	}
	return k / coarser, nil
}
