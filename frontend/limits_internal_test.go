package frontend

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A model whose size from --set is far past any model's records until
// the module's bound, then stops with its sizes named, where it recorded
// until --model-timeout (2 minutes) or memory ran out.
func TestARunawayModelStopsAtTheBound(t *testing.T) {
	was := maxValues
	maxValues = 1000
	t.Cleanup(func() { maxValues = was })
	_, err := Build(func(b *Builder) {
		x := b.Param("x", []int{2}, Zeros, NoParallel)
		for i := range b.Int("layers", 1, "layers") {
			x = x.Add(b.Param(fmt.Sprintf("w%d", i), []int{2}, Zeros, NoParallel))
		}
		b.Loss(x.Sum())
	}, Config{Set: map[string]string{"layers": "4611686018427387904"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model panicked: the model has recorded 1000 ops, the most a module holds: is a size from --set far too large (--set layers=4611686018427387904)?")
}
