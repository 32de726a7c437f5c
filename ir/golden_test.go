package ir_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/passes"
)

var update = flag.Bool("update", false, "rewrite golden files")

const goldenGPT = "testdata/gpt-small.gir"

// compileTinyGPT is the tiny reference GPT after the whole default pipeline.
func compileTinyGPT(t testing.TB) *ir.Module {
	t.Helper()
	m := buildGPT(t, nil)
	opts := passes.DefaultOptions()
	opts.Verify = true
	_, err := passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	return m
}

// TestGoldenGPT compares the dump of the tiny GPT after all passes with
// testdata/gpt-small.gir. Positions are base name and line (@model.go:37),
// so the file only changes when examples/gpt/model.go, the frontend or a
// pass changes what is compiled. Rewrite it with `go test ./ir -update`
// and review the diff.
func TestGoldenGPT(t *testing.T) {
	got := ir.Print(compileTinyGPT(t))
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(goldenGPT), 0o755))
		require.NoError(t, os.WriteFile(goldenGPT, []byte(got), 0o644))
		t.Logf("rewrote %s", goldenGPT)
	}
	want, err := os.ReadFile(goldenGPT)
	require.NoError(t, err, "run `go test ./ir -run TestGoldenGPT -update` to create it")
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Fatalf("%s is out of date (-golden +got); if the change is intended, rerun with -update:\n%s", goldenGPT, diff)
	}
}

// TestGoldenGPTParses checks the golden dump as an input: it parses,
// verifies, prints back byte for byte and resumes as a finished module.
func TestGoldenGPTParses(t *testing.T) {
	text, err := os.ReadFile(goldenGPT)
	require.NoError(t, err)
	m := reparse(t, filepath.Base(goldenGPT), string(text))
	require.NoError(t, ir.Verify(m, m.Passes[len(m.Passes)-1]))
	require.NotNil(t, m.Output("loss"))

	results, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{})
	require.NoError(t, err)
	for _, r := range results {
		require.Equal(t, "already applied", r.Skipped, "pass %s", r.Name)
	}
	require.Equal(t, string(text), ir.Print(m), "resuming a finished module must not change it")
}
