package cost_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/cost"
	"gcompile/lower"
)

// Predict prices each class of alike devices once (deviceClass); the
// busy time it gives every device is the one pricing that device alone
// gives, on one node and across nodes of 1, 2 and 3 devices (3: a tp pair that
// straddles two nodes beside one that does not), where the
// groups of different devices span different links.
func TestDeviceClassesPriceLikeEveryDevice(t *testing.T) {
	res := compileGPT(t, 2, 1, 1)
	for _, perNode := range []int{1, 2, 3, 8} {
		h, err := cost.Preset("h100-sxm")
		require.NoError(t, err)
		h.DevicesPerNode = perNode
		pred, err := h.Predict(res.Programs, nil)
		require.NoError(t, err)
		require.Len(t, pred.Busy, 4)
		for r := range 4 {
			alone := cost.DeviceBusy(h, lower.ProgramOf(res.Programs, r), r)
			assert.Equal(t, alone, pred.Busy[r], "%d per node, device %d", perNode, r)
		}
	}
}
