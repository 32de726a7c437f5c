package cpu

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The built-in kernels register without a clash; otherwise every Load
// would fail.
func TestBuiltinKernelsRegister(t *testing.T) {
	assert.NoError(t, registryErr)
	assert.NotEmpty(t, Kernels())
}
