package runtime

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
)

// A sequence split over a zigzag axis of 2 devices: device 0 holds
// chunks 0 and 3 of 4, device 1 chunks 1 and 2; Block gives each its
// rows in that order, Unblock puts them back, SeqPositions names them.
func TestZigzagBlocks(t *testing.T) {
	mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "cp", Size: 2, Zigzag: true}}}
	v := &ir.Value{Op: "input", Type: ir.T(ir.I32, 2, 8), Place: []ir.Placement{{Kind: ir.Shard, Dim: 1}}}
	b := lower.Buffer{Type: ir.T(ir.I32, 2, 4), Global: v.Type, Place: v.Place, Value: v}
	x := []int{0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17}
	want := [][]int{{0, 1, 6, 7, 10, 11, 16, 17}, {2, 3, 4, 5, 12, 13, 14, 15}}
	whole := make([]int, len(x))
	for dev := range 2 {
		blk := Block(x, b, mesh, []int{dev})
		assert.Equal(t, want[dev], blk, "device %d", dev)
		Unblock(whole, b, mesh, []int{dev}, blk)
		pos, err := SeqPositions(mesh, v, 1, []int{dev})
		require.NoError(t, err)
		assert.Equal(t, [][]int{{0, 1, 6, 7}, {2, 3, 4, 5}}[dev], pos)
	}
	assert.Equal(t, x, whole)
}
