package planner

import (
	"os"
	"path/filepath"
	"testing"

	"gcompile/ir"
	"gcompile/passes"
)

func writeGir(t testing.TB, m *ir.Module) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "model.gir")
	if err := os.WriteFile(p, []byte(ir.Print(m)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func passesHooks() passes.Hooks { return passes.Hooks{} }
