package loader

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
)

const plainModelSrc = `package plain

import (
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

func Model(b *frontend.Builder) {
	tokens := b.Input("tokens", ir.I32, b.Batch(), 4)
	x, _ := nn.Embedding(tokens, "wte", 16, 8)
	b.Loss(x.Sum())
}
`

// driverTarget names the package from the files alone only where the go
// command would build exactly that file into exactly that package; every
// other case goes the long way (listed and type-checked first).
func TestDriverTarget(t *testing.T) {
	otherOS := "windows"
	if runtime.GOOS == otherOS {
		otherOS = "linux"
	}
	tests := []struct {
		name     string
		gomod    string // "" : outside any module
		sub      string // the model's folder below the module's root
		file     string // the model's file name ("": model.go)
		src      string // "": plainModelSrc
		env      []string
		wantPath string // "": not from the files alone
	}{
		{name: "outside any module", wantPath: standaloneModule},
		{name: "module root", gomod: "module example.com/m\n", wantPath: "example.com/m"},
		{name: "below the root", gomod: "module example.com/m\n\ngo 1.26\n", sub: "models/gpt", wantPath: "example.com/m/models/gpt"},
		{name: "quoted module path", gomod: "module \"example.com/q\"\n", wantPath: "example.com/q"},
		{name: "no module line", gomod: "go 1.26\n"},
		{name: "package main", src: "package main\n\nimport \"gcompile/frontend\"\n\nfunc Model(b *frontend.Builder) {}\n"},
		{name: "a test file", file: "model_test.go"},
		{name: "another GOOS's file", file: "model_" + otherOS + ".go"},
		{name: "a build constraint", src: "//go:build ignore\n\n" + plainModelSrc},
		{name: "needs cgo", src: "//go:build cgo\n\n" + plainModelSrc},
		{name: "Model is a variable", src: "package plain\n\nimport \"gcompile/frontend\"\n\nvar Model = func(b *frontend.Builder) {}\n"},
		{name: "Model in another file", src: "package plain\n\nfunc helper() {}\n"},
		{name: "Model is a method", src: "package plain\n\nimport \"gcompile/frontend\"\n\ntype T struct{}\n\nfunc (T) Model(b *frontend.Builder) {}\n"},
		{name: "Model is generic", src: "package plain\n\nimport \"gcompile/frontend\"\n\nfunc Model[T any](b *frontend.Builder) {}\n"},
		{name: "Model returns", src: "package plain\n\nimport \"gcompile/frontend\"\n\nfunc Model(b *frontend.Builder) error { return nil }\n"},
		{name: "syntax error", src: "package plain\n\nfunc Model(b *frontend.Builder) {\n"},
		{name: "GOPATH mode", env: []string{"GO111MODULE=off"}},
		{name: "GOPATH mode undone later", env: []string{"GO111MODULE=off", "GO111MODULE=on"}, wantPath: standaloneModule},
		{name: "another go.mod", env: []string{"GOFLAGS=-modfile=other.mod"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.gomod != "" {
				require.NoError(t, os.WriteFile(filepath.Join(root, "go.mod"), []byte(tt.gomod), 0o644))
			}
			dir := filepath.Join(root, filepath.FromSlash(tt.sub))
			require.NoError(t, os.MkdirAll(dir, 0o755))
			name, src := tt.file, tt.src
			if name == "" {
				name = "model.go"
			}
			if src == "" {
				src = plainModelSrc
			}
			file := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
			mod, err := setupModule(dir)
			require.NoError(t, err)
			pkgPath, modDir, ok := driverTarget(file, mod, append([]string{"PATH=/bin"}, tt.env...))
			if tt.wantPath == "" {
				assert.False(t, ok, "named %q from the files alone", pkgPath)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tt.wantPath, pkgPath)
			assert.Equal(t, root, modDir)
		})
	}
}

// A model that builds takes one go command, the driver's build; the
// package is listed and type-checked only for one that does not, so its
// errors read as before (TestGoErrorsNameTheUsersLine).
func TestAPlainModelTakesOneGoCommand(t *testing.T) {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err)
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash for the go command's stand-in")
	}
	bin, log := t.TempDir(), filepath.Join(t.TempDir(), "calls")
	wrapper := "#!" + bash + "\necho \"$1\" >> " + log + "\nexec " + goTool + " \"$@\"\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "go"), []byte(wrapper), 0o755))
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	calls := func() []string {
		data, err := os.ReadFile(log)
		if os.IsNotExist(err) {
			return nil
		}
		require.NoError(t, err)
		require.NoError(t, os.Remove(log))
		return strings.Fields(string(data))
	}

	l, _, _ := testLoader(t)
	m, err := l.Load(writeModel(t, plainModelSrc), frontend.Config{})
	require.NoError(t, err)
	assert.Len(t, m.Params(), 1, "the model's parameters")
	assert.Equal(t, []string{"run"}, calls(), "the go commands a load of a plain model ran")

	_, err = l.Load(writeModel(t, "package plain\n\nimport \"gcompile/frontend\"\n\nvar Model = func(b *frontend.Builder) {}\n"), frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model.go:5: var Model func(b *frontend.Builder): want func Model(b *frontend.Builder)")
	assert.Contains(t, calls(), "list", "a model the files alone cannot vouch for is type-checked")
	assertNoWorkDirs(t, l)
}
