package ir_test

import (
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/moe"
	"gcompile/frontend"
)

// A MoE's loss-only settings (the balancing and z-loss weights, one of
// them off altogether, which drops its values and renumbers the rest)
// change the module's Fingerprint but not what its logits depend on;
// a setting of the forward (experts per token, the activation width)
// changes both.
func TestForwardFingerprintIgnoresLossOnlySettings(t *testing.T) {
	base := map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16", "router": "softmax-topk"}
	build := func(extra map[string]string) (full, fwd string) {
		t.Helper()
		set := maps.Clone(base)
		maps.Copy(set, extra)
		m, err := frontend.Build(moe.Model, frontend.Config{Name: "moe", Batch: 2, Set: set})
		require.NoError(t, err)
		return m.Fingerprint(), m.ForwardFingerprint()
	}
	full, fwd := build(nil)
	for _, tc := range []struct {
		name    string
		set     map[string]string
		forward bool // whether the logits' maths change
	}{
		{"another aux weight", map[string]string{"aux": "0.5"}, false},
		{"no aux loss", map[string]string{"aux": "0"}, false},
		{"no z-loss", map[string]string{"zloss": "0"}, false},
		{"another k", map[string]string{"k": "1"}, true},
		{"another capacity", map[string]string{"capacity": "1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, w := build(tc.set)
			assert.NotEqual(t, full, f, "the whole module's fingerprint")
			if tc.forward {
				assert.NotEqual(t, fwd, w)
			} else {
				assert.Equal(t, fwd, w)
			}
		})
	}
}
