package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fp16 with 4 microbatches skips the steps one device skips, and only
// those: each microbatch's backward starts from its share of the loss
// scale, so its 16-bit activation gradients are one device's. Seeded with
// the whole scale they were 4 times larger, and this run skipped step 8
// (the scale halved and the runs parted) where one device took it.
func TestFP16MicrobatchesTakeTheStepsOneDeviceTakes(t *testing.T) {
	run := func(micro string) []float64 {
		m := runMetrics(t, gptModel, "--set", "layers=2,hidden=64,heads=4,seq=32", "--batch", "8", "--max-data-mb", "1",
			"--precision", "fp16", "--microbatches", micro, "--run", "--steps", "8", "--eval-batches", "-1")
		require.Len(t, m.Steps, 8)
		var losses []float64
		for _, s := range m.Steps {
			assert.False(t, s.Skipped, "--microbatches %s: step %d skipped at scale %g", micro, s.Step, s.LossScale)
			losses = append(losses, s.Loss)
		}
		return losses
	}
	one, four := run("1"), run("4")
	for i := range one {
		assert.InEpsilon(t, one[i], four[i], 1e-4, "step %d", i+1)
	}
}
