package ir

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseInit(t *testing.T) {
	for _, tc := range []struct {
		init   string
		std    float64
		normal bool
		err    string
	}{
		{"", 0, false, ""},
		{"zeros", 0, false, ""},
		{"ones", 1, false, ""},
		{"normal(0.02)", 0.02, true, ""},
		{"normal(0)", 0, true, ""},
		{"uniform(1)", 0, false, `unknown init "uniform(1)"`},
		{"normal(0.02", 0, false, `unknown init "normal(0.02"`},
		{"bogus(3", 0, false, `unknown init "bogus(3"`},
		{"normal(-1)", 0, false, "the std must be a finite number ≥ 0"},
		{"normal(NaN)", 0, false, "the std must be a finite number ≥ 0"},
		{"normal(Inf)", 0, false, "the std must be a finite number ≥ 0"},
		{"normal(x)", 0, false, "the std must be a finite number ≥ 0"},
	} {
		std, normal, err := ParseInit(tc.init)
		if tc.err != "" {
			require.Error(t, err, tc.init)
			assert.Contains(t, err.Error(), tc.err, tc.init)
			continue
		}
		require.NoError(t, err, tc.init)
		assert.Equal(t, tc.std, std, tc.init)
		assert.Equal(t, tc.normal, normal, tc.init)
	}
}
