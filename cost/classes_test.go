package cost

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
)

// A mesh of many devices has few classes: one per pipeline rank on one
// node, and a handful per node position across nodes.
func TestDeviceClassesAreFew(t *testing.T) {
	m := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: 4}, {Name: "dp", Size: 4096}, {Name: "tp", Size: 4}}}
	for _, tc := range []struct{ perNode, most int }{{1 << 20, 4}, {8, 4 * 8 * 8}} {
		seen := map[string]bool{}
		for r := range m.Devices() {
			seen[deviceClass(m, r, m.Coords(r)[0], tc.perNode)] = true
		}
		assert.LessOrEqual(t, len(seen), tc.most, "%d devices per node", tc.perNode)
	}
}
