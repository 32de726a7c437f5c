package main

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkJobStep is the step time of the demo model (make demo's GPT,
// batch 16) on 4 devices (dp2 × tp2), as 4 virtual devices in one
// process and as a job of 4 processes connected by TCP: the cost of
// running across processes. It reports ms/step over the steps after the
// first three (warm-up); compare the two with benchstat.
func BenchmarkJobStep(b *testing.B) {
	b.Setenv(asMainEnv, "1")
	model := filepath.Join(b.TempDir(), "demo")
	require.NoError(b, mainErr([]string{gptModel, "--batch", "16", "--dump", model}))
	plan := []string{"--devices", "4", "--dp", "2", "--tp", "2"}
	for _, nproc := range []int{1, 4} {
		b.Run("procs="+strconv.Itoa(nproc), func(b *testing.B) {
			const warm = 3
			dir := b.TempDir()
			args := append([]string{filepath.Join(model, "00-input.gir"), "--run", "--steps", strconv.Itoa(b.N + warm),
				"--eval-batches", "-1", "--max-data-mb", "1", "--metrics", filepath.Join(dir, "m.json")}, plan...)
			if nproc > 1 {
				args = append([]string{"launch", "--nproc", strconv.Itoa(nproc), "--"}, args...)
			}
			b.ResetTimer()
			require.NoError(b, mainErr(args))
			b.StopTimer()
			met := readMetrics(b, filepath.Join(dir, "m.json"))
			var ms float64
			for _, s := range met.Steps[warm:] {
				ms += s.Ms
			}
			b.ReportMetric(ms/float64(b.N), "ms/step")
		})
	}
}
