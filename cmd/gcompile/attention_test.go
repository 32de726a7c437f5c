package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --recompute selective on the GPT, whose attention is the fused op by
// default, compiles (nothing to drop is not an error) and says why it did
// nothing, everywhere a user looks: the log, the metrics' pass entry, the
// report's pass table and the dump's recompute column.
func TestSelectiveRecomputeNoteOfFusedAttention(t *testing.T) {
	dir := t.TempDir()
	report, metrics, dump := filepath.Join(dir, "r.html"), filepath.Join(dir, "m.json"), filepath.Join(dir, "dump")
	log, err := captureStderr(t, func() error {
		return mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=2,seq=16", "--batch", "4",
			"--recompute", "selective", "--report", report, "--metrics", metrics, "--dump", dump})
	})
	require.NoError(t, err)
	const note = "keep no [batch, heads, seq, seq] scores or probabilities, so there is nothing to drop there"
	assert.Contains(t, log, "note: pass recompute: selective: 2 fused attention op(s) "+note)

	met := readMetrics(t, metrics)
	found := false
	for _, p := range met.Passes {
		if p.Name == "recompute" {
			found = true
			assert.Contains(t, p.Note, note)
			assert.False(t, p.Changed, "nothing replayed")
		}
	}
	assert.True(t, found, "the metrics list the recompute pass")

	raw, err := os.ReadFile(report)
	require.NoError(t, err)
	page := parsePage(t, raw)
	assert.Contains(t, page.find(byAttr("id", "passes-table"))[0].text, note)

	index, err := os.ReadFile(filepath.Join(dump, "index.html"))
	require.NoError(t, err)
	assert.Contains(t, string(index), note)
}
