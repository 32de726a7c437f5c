package checkpoint

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

// u16s is n 2-byte elements 0, 1, …, n−1 (a BF16 tensor's bytes).
func u16s(n int) []byte {
	var b []byte
	for i := range n {
		b = binary.LittleEndian.AppendUint16(b, uint16(i))
	}
	return b
}

// A stack [2,2,3] splits into pieces under their names, transposed
// ([3,2]) in the out_in layout and as held ([2,3]) otherwise, the other
// tensors kept in their places; joining the pieces gives the stack back
// byte for byte, whatever the dtype.
func TestSplitAndJoinEach(t *testing.T) {
	stack := Tensor{Name: "w", DType: "BF16", Shape: []int{2, 2, 3}, Data: u16s(12)}
	other := Tensor{Name: "b", DType: "F32", Shape: []int{1}, Data: Float32Bytes([]float32{7})}
	for _, c := range []struct {
		layout string
		shape  []int
		piece1 []uint16 // expert 1's elements as the file holds them
	}{
		{ir.PieceOutIn, []int{3, 2}, []uint16{6, 9, 7, 10, 8, 11}},
		{ir.PieceAsHeld, []int{2, 3}, []uint16{6, 7, 8, 9, 10, 11}},
	} {
		t.Run("layout "+c.layout, func(t *testing.T) {
			each := map[string]ir.SaveEach{"w": {Template: "experts.{e}.w.weight", Layout: c.layout}}
			split, err := SplitEach([]Tensor{other, stack}, each)
			require.NoError(t, err)
			require.Len(t, split, 3)
			assert.Equal(t, other, split[0])
			for i, p := range split[1:] {
				assert.Equal(t, []string{"experts.0.w.weight", "experts.1.w.weight"}[i], p.Name)
				assert.Equal(t, "BF16", p.DType)
				assert.Equal(t, c.shape, p.Shape)
			}
			var got []uint16
			for i := 0; i < len(split[2].Data); i += 2 {
				got = append(got, binary.LittleEndian.Uint16(split[2].Data[i:]))
			}
			assert.Equal(t, c.piece1, got)

			joined, err := JoinEach(split, each, map[string][]int{"w": {2, 2, 3}})
			require.NoError(t, err)
			assert.Equal(t, []Tensor{other, stack}, joined)
		})
	}
}

// Joining keeps a stacked tensor the file holds under the param's name
// and refuses pieces of two dtypes.
func TestJoinEachKeepsStacksAndRefusesMixedPieces(t *testing.T) {
	each := map[string]ir.SaveEach{"w": {Template: "w.{e}", Layout: ir.PieceOutIn}}
	shapes := map[string][]int{"w": {2, 1, 2}}
	stack := Tensor{Name: "w", DType: "F32", Shape: []int{2, 1, 2}, Data: Float32Bytes([]float32{1, 2, 3, 4})}
	got, err := JoinEach([]Tensor{stack}, each, shapes)
	require.NoError(t, err)
	assert.Equal(t, []Tensor{stack}, got)

	mixed := []Tensor{
		{Name: "w.0", DType: "F32", Shape: []int{2, 1}, Data: Float32Bytes([]float32{1, 2})},
		{Name: "w.1", DType: "BF16", Shape: []int{2, 1}, Data: u16s(2)},
	}
	_, err = JoinEach(mixed, each, shapes)
	assert.ErrorContains(t, err, `tensor "w.1" is BF16 but "w.0" is F32: the pieces of param "w" must share a dtype`)

	_, err = SplitEach([]Tensor{{Name: "w", DType: "F32", Shape: []int{2, 2}, Data: Float32Bytes([]float32{1, 2, 3, 4})}}, each)
	assert.ErrorContains(t, err, `tensor "w": a stack of [2,2] cannot be saved as pieces in layout "out_in": it needs rank ≥ 3`)
}
