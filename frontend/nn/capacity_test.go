package nn

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The capacities follow ⌈k·T·cf/E⌉ and ⌊T·c/E⌋ and are bounded by the
// group, however large the factor: a factor past int's range gives every
// expert the whole group, not a wrapped-around slot count.
func TestCapacitiesAreBoundedByTheGroup(t *testing.T) {
	for _, c := range []struct {
		k, group, experts int
		cf                float64
		token, choice     int
	}{
		{1, 8, 4, 1, 2, 2},
		{2, 8, 4, 1.25, 5, 2},
		{1, 8, 4, 0.01, 1, 0},
		{1, 8, 4, 4, 8, 8},
		{1, 8, 4, 1e19, 8, 8},
		{2, 4096, 64, 1e300, 4096, 4096},
	} {
		assert.Equal(t, c.token, tokenCapacity(c.k, c.group, c.experts, c.cf), "token choice, %+v", c)
		assert.Equal(t, c.choice, expertChoiceCapacity(c.group, c.experts, c.cf), "expert choice, %+v", c)
	}
}
