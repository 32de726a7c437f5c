package ir_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

func TestMeshCoordsAndRank(t *testing.T) {
	m, err := ir.ParseMesh("pp=2,dp=3,tp=2")
	require.NoError(t, err)
	seen := map[int]bool{}
	for r := range m.Devices() {
		c := m.Coords(r)
		assert.Equal(t, r, m.Rank(c), "rank %d", r)
		seen[m.Rank(c)] = true
	}
	assert.Len(t, seen, 12)
	assert.Equal(t, []int{0, 1, 1}, m.Coords(3), "tp varies fastest, pp slowest")
	assert.Equal(t, []int{0, 2, 4}, m.AxisRanks(m.Coords(4), 1), "the dp line through rank 4")
	assert.Equal(t, []int{4, 5}, m.AxisRanks(m.Coords(5), 2), "the tp pair through rank 5")
}

// A dim split by two axes is split in mesh order: the first axis picks
// the coarse half, the second the fine quarter inside it, so the four
// devices' blocks tile the dim exactly once.
func TestBlockBoxSplitsOneDimOverSeveralAxesInMeshOrder(t *testing.T) {
	m, err := ir.ParseMesh("dp=2,ep=2")
	require.NoError(t, err)
	place := []ir.Placement{{Kind: ir.Shard, Dim: 0}, {Kind: ir.Shard, Dim: 0}}
	global := ir.Shape{8, 3}
	var starts []int
	for r := range m.Devices() {
		b := ir.BlockBox(m, place, global, m.Coords(r))
		assert.Equal(t, []int{2, 3}, b.Size, "rank %d holds a quarter of the rows", r)
		starts = append(starts, b.Lo[0])
		assert.Equal(t, 0, b.Lo[1])
	}
	assert.Equal(t, []int{0, 2, 4, 6}, starts, "dp picks the half, ep the quarter within it")

	// Fused blocks split by one axis: each device holds its slice of
	// every block, the box in the (blocks, size/blocks) view.
	tp, err := ir.ParseMesh("tp=2")
	require.NoError(t, err)
	b := ir.BlockBox(tp, []ir.Placement{{Kind: ir.Shard, Dim: 1, Blocks: 3}}, ir.Shape{4, 12}, []int{1})
	assert.Equal(t, ir.Shape{4, 3, 4}, b.Shape)
	assert.Equal(t, []int{0, 0, 2}, b.Lo)
	assert.Equal(t, []int{4, 3, 2}, b.Size)
}

// The weight axis splits a shared dim first whatever the mesh order: on
// [dp, tp], ZeRO's dp split of a tp-split vector falls inside each tp
// block, so the dp parts of one tp rank make up its tp block.
func TestBlockBoxSplitsInsideTensorParallelBlocks(t *testing.T) {
	m, err := ir.ParseMesh("dp=2,tp=2")
	require.NoError(t, err)
	assert.Equal(t, []int{1, 0}, m.SplitOrder())
	place := []ir.Placement{{Kind: ir.Shard, Dim: 0}, {Kind: ir.Shard, Dim: 0}}
	starts := map[[2]int]int{}
	for r := range m.Devices() {
		c := m.Coords(r)
		starts[[2]int{c[0], c[1]}] = ir.BlockBox(m, place, ir.Shape{8}, c).Lo[0]
	}
	assert.Equal(t, map[[2]int]int{{0, 0}: 0, {1, 0}: 2, {0, 1}: 4, {1, 1}: 6}, starts, "tp picks the half, dp the quarter inside it")
	assert.True(t, m.InnerSplit(place, 1, 0), "dp splits inside tp's part")
	assert.False(t, m.InnerSplit(place, 0, 0), "nothing splits inside dp's part")
}

// An outer cp (the ring's) splits the sequence before tp: each cp rank's
// chunk is split over tp, as Megatron-Core lays it out, while a dim cp
// does not split keeps tp first (ZeRO's dp split inside tp's block), and
// without :outer tp is the coarser split of the sequence too.
func TestOuterSequenceAxisSplitsBeforeTensorParallelism(t *testing.T) {
	for _, tc := range []struct {
		mesh string
		// starts of each (dp, cp, tp) device's part of the sequence dim
		// (dim 1 of [2, 8], split over cp and tp; dp splits dim 0)
		want map[[3]int]int
	}{
		{"dp=2,cp=2:outer,tp=2", map[[3]int]int{{0, 0, 0}: 0, {0, 0, 1}: 2, {0, 1, 0}: 4, {0, 1, 1}: 6}},
		{"dp=2,cp=2,tp=2", map[[3]int]int{{0, 0, 0}: 0, {0, 0, 1}: 4, {0, 1, 0}: 2, {0, 1, 1}: 6}},
	} {
		t.Run(tc.mesh, func(t *testing.T) {
			m, err := ir.ParseMesh(tc.mesh)
			require.NoError(t, err)
			assert.Equal(t, tc.mesh, m.String(), "printed as parsed")
			place := []ir.Placement{{Kind: ir.Shard, Dim: 0}, {Kind: ir.Shard, Dim: 1}, {Kind: ir.Shard, Dim: 1}}
			got := map[[3]int]int{}
			for r := range m.Devices() {
				c := m.Coords(r)
				b := ir.BlockBox(m, place, ir.Shape{2, 8}, c)
				assert.Equal(t, c[0], b.Lo[0], "dp takes whole rows")
				if c[0] == 0 {
					got[[3]int{c[0], c[1], c[2]}] = b.Lo[1]
				}
			}
			assert.Equal(t, tc.want, got)
			outer := m.Axes[1].Outer
			assert.Equal(t, !outer, m.InnerSplit(place, 2, 1), "cp inside tp's part unless outer")
			assert.Equal(t, outer, m.InnerSplit(place, 1, 1), "tp inside cp's part when outer")
			// A dim cp does not split: tp first, dp inside its block.
			zero := []ir.Placement{{Kind: ir.Shard, Dim: 0}, {}, {Kind: ir.Shard, Dim: 0}}
			assert.Equal(t, []int{2, 0, 1}, m.SplitOrderOn(0, zero))
			assert.True(t, m.InnerSplit(zero, 2, 0), "dp splits inside tp's part")
		})
	}
	_, err := ir.ParseMesh("tp=2:outer")
	require.ErrorContains(t, err, "only a sequence axis (cp) can split before the weight axes")
	for _, text := range []string{"cp=4:zigzag:outer", "cp=4:outer:zigzag"} {
		m, err := ir.ParseMesh(text)
		require.NoError(t, err)
		assert.Equal(t, ir.MeshAxis{Name: "cp", Size: 4, Zigzag: true, Outer: true}, m.Axes[0], text)
	}
	for _, text := range []string{"cp=4:outer:outer", "cp=4:inner", "cp=4:"} {
		_, err := ir.ParseMesh(text)
		require.ErrorContains(t, err, "is not a layout (want zigzag or outer, each at most once)", text)
	}
}

func TestMatMulGEMM(t *testing.T) {
	g, err := ir.MatMulGEMM(ir.Shape{4, 3, 8, 5}, ir.Shape{5, 7}, false, false)
	require.NoError(t, err)
	assert.Equal(t, ir.GEMM{Batch: 12, M: 8, N: 7, K: 5, SharedB: true}, g)
	g, err = ir.MatMulGEMM(ir.Shape{2, 5, 8}, ir.Shape{2, 7, 5}, true, true)
	require.NoError(t, err)
	assert.Equal(t, ir.GEMM{Batch: 2, M: 8, N: 7, K: 5}, g, "transposed operands are stored k×m and n×k")
	_, err = ir.MatMulGEMM(ir.Shape{8}, ir.Shape{8, 2}, false, false)
	assert.ErrorContains(t, err, "both need rank ≥ 2")
}

// Passes find axes by role, not by name: dp and ep split the batch, tp the
// weights, pp the layers, cp the sequence; other names have no role; a nil
// mesh has no axes.
func TestMeshAxesByRole(t *testing.T) {
	m := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: 2}, {Name: "dp", Size: 2}, {Name: "ep", Size: 2}, {Name: "tp", Size: 4}, {Name: "cp", Size: 1}, {Name: "sp", Size: 1}}}
	assert.Equal(t, 0, m.PipelineAxis())
	assert.Equal(t, 1, m.DataAxis())
	assert.Equal(t, 1, m.AxisFor(ir.RoleBatch), "the first batch axis")
	assert.Equal(t, 3, m.WeightAxis())
	assert.Equal(t, ir.RoleBatch, m.Axes[2].Role())
	assert.Equal(t, ir.RoleSequence, m.Axes[4].Role())
	assert.Equal(t, 4, m.SequenceAxis())
	assert.Equal(t, ir.RoleUnknown, m.Axes[5].Role())
	assert.Equal(t, 4, m.SizeOf(m.WeightAxis()))
	assert.Equal(t, 1, m.SizeOf(-1))
	var none *ir.Mesh
	assert.Equal(t, -1, none.PipelineAxis())
	assert.Equal(t, -1, none.DataAxis())
	assert.Equal(t, 1, none.SizeOf(none.WeightAxis()))
}
