package loader

import (
	"bytes"
	"context"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
)

// behaveSrc is a model outside any Go module (it is written to a temporary
// folder) that imports gcompile's packages and does what --set mode=N
// asks before recording a tiny model: 1 return, 2 os.Exit(3), 3
// os.Exit(0), 4 panic on a goroutine of its own, 5 a DSL error, 6 never
// return. It prints to stdout and stderr first, may start a grandchild
// (spawn=2) and writes its pid (and the grandchild's) to pidfile.
const behaveSrc = `// Package behave misbehaves on request.
package behave

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

// Model does what mode asks.
func Model(b *frontend.Builder) {
	mode := b.Int("mode", 1, "what to do")
	spawn := b.Int("spawn", 1, "2: start a grandchild first")
	pidfile := b.String("pidfile", "none", "write the pids here")
	fmt.Println("hello on stdout")
	fmt.Fprintln(os.Stderr, "hello on stderr")
	pids := strconv.Itoa(os.Getpid())
	if spawn == 2 {
		cmd := exec.Command("sleep", "300")
		if err := cmd.Start(); err == nil {
			pids += " " + strconv.Itoa(cmd.Process.Pid)
		}
	}
	if pidfile != "none" {
		_ = os.WriteFile(pidfile+".tmp", []byte(pids), 0o644)
		_ = os.Rename(pidfile+".tmp", pidfile)
	}
	switch mode {
	case 2:
		os.Exit(3)
	case 3:
		os.Exit(0)
	case 4:
		go func() { panic("boom on a goroutine") }()
		time.Sleep(time.Minute)
	case 5:
		b.Errorf("mode 5 fails") // DSL error line
	case 6:
		for {
			time.Sleep(10 * time.Millisecond)
		}
	case 7:
		return // no loss
	}
	tokens := b.Input("tokens", ir.I32, b.Batch(), 4)
	x, _ := nn.Embedding(tokens, "wte", 16, 8)
	b.Loss(x.Sum())
}
`

// behaveModel is behaveSrc's file, shared by the tests so that the go
// command compiles it once (its cache keys on the file's folder).
var behaveModel string

// helperEnv makes the test binary a loader that is killed by its parent
// test (TestDriverDiesWithTheLoader): it loads the model it names.
const helperEnv = "GCOMPILE_LOADER_TEST_HELPER"

func TestMain(m *testing.M) {
	if model := os.Getenv(helperEnv); model != "" {
		os.Exit(helperLoad(model))
	}
	dir, err := os.MkdirTemp("", "gcompile-loader-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	behaveModel = filepath.Join(dir, "behave", "model.go")
	if err := os.Mkdir(filepath.Dir(behaveModel), 0o755); err == nil {
		err = os.WriteFile(behaveModel, []byte(behaveSrc), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// helperLoad loads model with mode 6 (never returns) and its pid file
// next to it, as a gcompile would; the parent test kills this process.
func helperLoad(model string) int {
	l := &Loader{TempDir: os.Getenv(helperEnv + "_TMP"), Output: &bytes.Buffer{}}
	_, err := l.Load(model, frontend.Config{Set: map[string]string{"mode": "6", "pidfile": os.Getenv(helperEnv + "_PIDFILE")}})
	fmt.Fprintln(os.Stderr, "Load returned:", err)
	return 1
}

// testLoader is a quiet loader whose work folders go to a fresh folder,
// which assertNoWorkDirs checks.
func testLoader(t *testing.T) (*Loader, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	var output, progress bytes.Buffer
	return &Loader{TempDir: t.TempDir(), Output: &output, Progress: &progress}, &output, &progress
}

// assertNoWorkDirs checks that the load left nothing in l.TempDir.
func assertNoWorkDirs(t *testing.T, l *Loader) {
	t.Helper()
	entries, err := os.ReadDir(l.TempDir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Empty(t, names, "the load left its work folder behind")
}

// lineOf is the 1-based line of the first line of src containing s.
func lineOf(t *testing.T, src, s string) int {
	t.Helper()
	for i, line := range strings.Split(src, "\n") {
		if strings.Contains(line, s) {
			return i + 1
		}
	}
	t.Fatalf("%q not in the source", s)
	return 0
}

func writeModel(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.go")
	require.NoError(t, os.WriteFile(path, []byte(src), 0o644))
	return path
}

// Each way a model can end is reported as what it is, the model's prints
// are passed on without disturbing the module, and the work folder goes
// away whatever happened. The model lives outside any Go module.
func TestLoadReportsWhatTheModelDid(t *testing.T) {
	name := behaveModel // absolute: it is not below the working directory
	tests := []struct {
		name, mode string
		describe   bool
		wantErr    string   // the whole error; "" for none
		errHas     []string // parts of the error
		outHas     []string // parts of what the model printed, passed on
		outHasNot  []string
	}{
		{name: "prints and returns", mode: "1", outHas: []string{"hello on stdout\n", "hello on stderr\n"}},
		{name: "describe", mode: "1", describe: true, outHas: []string{"hello on stdout\n"}},
		{name: "os.Exit(3)", mode: "2", wantErr: name + ": Model() called os.Exit(3) before returning", outHas: []string{"hello on stdout\n"}},
		{name: "os.Exit(0)", mode: "3", wantErr: name + ": Model() called os.Exit(0) before returning"},
		{
			name: "panic on the model's goroutine", mode: "4",
			errHas:    []string{name + ":40: the model crashed before Model() returned (exit status 2): panic: boom on a goroutine; the Go runtime's report:\npanic: boom on a goroutine", "model.go:"},
			outHas:    []string{"hello on stdout\n"},
			outHasNot: []string{"panic"},
		},
		// The module names the file; the error names it as the go
		// command's errors do, by the path given.
		{name: "DSL error", mode: "5", wantErr: fmt.Sprintf("%s:%d: mode 5 fails", name, lineOf(t, behaveSrc, "mode 5 fails"))},
		// An error of the whole model, at no line, names the file.
		{name: "no loss", mode: "7", wantErr: name + ": model did not call b.Loss(…): there is nothing to train"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, output, progress := testLoader(t)
			l.ProgressAfter = time.Hour
			cfg := frontend.Config{Batch: 2, Set: map[string]string{"mode": tt.mode}}
			var err error
			var m *ir.Module
			var docs []frontend.ParamDoc
			if tt.describe {
				docs, err = l.Describe(behaveModel, cfg)
			} else {
				m, err = l.Load(behaveModel, cfg)
			}
			switch {
			case tt.wantErr != "":
				require.Error(t, err)
				assert.Equal(t, tt.wantErr, err.Error())
			case len(tt.errHas) > 0:
				require.Error(t, err)
				for _, s := range tt.errHas {
					assert.Contains(t, err.Error(), s)
				}
			case tt.describe:
				require.NoError(t, err)
				var keys []string
				for _, d := range docs {
					keys = append(keys, d.Key)
				}
				assert.Equal(t, []string{"mode", "spawn", "pidfile"}, keys)
			default:
				require.NoError(t, err)
				require.NotNil(t, m)
				assert.NotNil(t, m.Output(ir.OutputLoss), "the module came through whole")
			}
			for _, s := range tt.outHas {
				assert.Contains(t, output.String(), s)
			}
			for _, s := range tt.outHasNot {
				assert.NotContains(t, output.String(), s)
			}
			assert.Empty(t, progress.String(), "a load quicker than ProgressAfter says nothing")
			assertNoWorkDirs(t, l)
		})
	}
}

// Syntax errors come as the Go parser reports them, with their column,
// and alone (type errors in a file that does not parse are mostly echoes
// of it); type errors name file and line, as do the compiler's errors
// that go list passes on; only the linker's come from the driver build.
func TestGoErrorsNameTheUsersLine(t *testing.T) {
	const syntaxSrc = `package bad

import "gcompile/frontend"

func Model(b *frontend.Builder) {
	x := 1 +
}

func other() int { return "s" }
`
	const typeSrc = `package bad

import "gcompile/frontend"

func Model(b *frontend.Builder) {
	var n int = "two"
	_ = n
}
`
	const noModelSrc = `package bad

import "gcompile/frontend"

func Build(b *frontend.Builder) {}
`
	const noBodySrc = `package bad

import "gcompile/frontend"

func helper() // no body: fine for the type checker, not for the compiler

func Model(b *frontend.Builder) { helper() }
`
	// Passes the type checker and the compiler; only the linker sees it.
	const linkSrc = `package bad

import (
	_ "unsafe"

	"gcompile/frontend"
)

//go:linkname helper gcompile/frontend.doesNotExist
func helper()

func Model(b *frontend.Builder) { helper() }
`
	tests := []struct {
		name, src string
		first     string // the error's first line, after the file name
		lines     int    // lines in the whole error
		hasNot    []string
		has       []string // instead of first and lines
	}{
		{"syntax error", syntaxSrc, ":7:1: expected operand, found '}'", 2, []string{"declared and not used", "return values", "syntax error:"}, nil},
		{"one syntax error a line", "package bad\n\nfunc Model(b *frontend.Builder) {\n", ":3:35: expected ';', found 'EOF'", 1, nil, nil},
		{"type error", typeSrc, `:6: cannot use "two" (untyped string constant) as int value in variable declaration`, 1, nil, nil},
		{"no Model", noModelSrc, ":1: package bad has no func Model(b *frontend.Builder)", 1, nil, nil},
		{"a Model of another signature", "package bad\n\nfunc Model(x int) int { return x }\n", ":3: func Model(x int) int: want func Model(b *frontend.Builder)", 1, nil, nil},
		{"a Model that is a variable", "package bad\n\nvar Model = 3\n", ":3: var Model int: want func Model(b *frontend.Builder)", 1, nil, nil},
		{"a generic Model", "package bad\n\nimport \"gcompile/frontend\"\n\nfunc Model[T any](b *frontend.Builder) {}\n", ":5: func Model[T any](b *frontend.Builder): want func Model(b *frontend.Builder)", 1, nil, nil},
		{"compile error", noBodySrc, ":5:6: missing function body", 1, []string{"# "}, nil},
		{"link error", linkSrc, "", 0, []string{"# "}, []string{": building the model driver failed (exit status 1):\n", "doesNotExist"}},
		{"a missing import", "package bad\n\nimport (\n\t\"gcompile/frontend\"\n\t\"example.com/nowhere/pkg\"\n)\n\nfunc Model(b *frontend.Builder) { pkg.X() }\n",
			"", 0, []string{"invalid package name"}, []string{"model.go:5: could not import example.com/nowhere/pkg: no such package in the standard library, the model's module or its requirements"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeModel(t, tt.src)
			l, _, _ := testLoader(t)
			_, err := l.Load(path, frontend.Config{})
			require.Error(t, err)
			if tt.has != nil {
				for _, s := range tt.has {
					assert.Contains(t, err.Error(), s)
				}
			} else {
				first, _, _ := strings.Cut(err.Error(), "\n")
				assert.Equal(t, path+tt.first, first)
				assert.Len(t, strings.Split(err.Error(), "\n"), tt.lines, err.Error())
			}
			for _, s := range tt.hasNot {
				assert.NotContains(t, err.Error(), s)
			}
			assertNoWorkDirs(t, l)
		})
	}
}

// A model whose package panics while it is initialised (a var's value,
// an init function) is said to have crashed before Model was called, not
// "before Model() returned", and at its line.
func TestInitPanicIsNamedAsSuch(t *testing.T) {
	src := "package bad\n\nimport \"gcompile/frontend\"\n\nfunc init() { panic(\"boom in init\") }\n\nfunc Model(b *frontend.Builder) {}\n"
	path := writeModel(t, src)
	l, _, _ := testLoader(t)
	_, err := l.Load(path, frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), path+":5: the model crashed while its package was initialised (a package-level var or an init function), before Model() was called")
	assert.Contains(t, err.Error(), "panic: boom in init")
}

// Without the go command (a machine with a gcompile binary alone), a
// model.go's load says what it needs and what runs without it.
func TestLoadWithoutTheGoCommand(t *testing.T) {
	path := writeModel(t, "package m\n\nimport \"gcompile/frontend\"\n\nfunc Model(b *frontend.Builder) {}\n")
	l, _, _ := testLoader(t)
	t.Setenv("PATH", t.TempDir())
	_, err := l.Load(path, frontend.Config{})
	require.ErrorIs(t, err, exec.ErrNotFound)
	assert.Contains(t, err.Error(), "a model.go is built with the go command (install Go, or run a .gir dump of the model, which needs none)")
	assert.NotContains(t, err.Error(), "stderr:")
}

// A model in a module that does not require gcompile fails every import
// of gcompile alike: one error says why, naming the imports.
func TestModuleWithoutGcompileIsOneError(t *testing.T) {
	src := "package bad\n\nimport (\n\t\"gcompile/frontend\"\n\t\"gcompile/ir\"\n)\n\nfunc Model(b *frontend.Builder) { _ = ir.F32 }\n"
	path := writeModel(t, src)
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(path), "go.mod"), []byte("module example.com/other\n\ngo 1.26\n"), 0o644))
	l, _, _ := testLoader(t)
	_, err := l.Load(path, frontend.Config{})
	require.Error(t, err)
	assert.Len(t, strings.Split(err.Error(), "\n"), 1, err.Error())
	assert.Contains(t, err.Error(), path+":4: could not import gcompile/frontend (nor gcompile/ir): the model's module does not provide gcompile")
}

// A model file the go command leaves out of its package (a _test.go, a
// build constraint) is named as such, where the load said it was outside
// any Go module.
func TestExcludedModelFileIsNamed(t *testing.T) {
	const src = "package m\n\nimport \"gcompile/frontend\"\n\nfunc Model(b *frontend.Builder) {}\n"
	dir := t.TempDir()
	testFile := filepath.Join(dir, "model_test.go")
	require.NoError(t, os.WriteFile(testFile, []byte(src), 0o644))
	ignored := filepath.Join(dir, "model.go")
	require.NoError(t, os.WriteFile(ignored, []byte("//go:build ignore\n\n"+src), 0o644))
	l, _, _ := testLoader(t)
	_, err := l.Load(testFile, frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model_test.go: a _test.go file is compiled only by go test; name the model file without _test")
	_, err = l.Load(ignored, frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model.go: the go command leaves it out of its package on this machine")
	assert.Contains(t, err.Error(), "a //go:build line")
}

// The progress line comes only when a load takes longer than
// ProgressAfter, and never after the load returned.
func TestProgressLineOnlyForSlowLoads(t *testing.T) {
	path := writeModel(t, "package bad\n\nfunc Model(b *frontend.Builder) {\n")
	tests := []struct {
		name  string
		after time.Duration
		want  string
	}{
		{"slow", time.Nanosecond, "building model " + path + " …\n"},
		{"fast", time.Hour, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _, progress := testLoader(t)
			l.ProgressAfter = tt.after
			_, err := l.Load(path, frontend.Config{})
			require.Error(t, err)
			assert.Equal(t, tt.want, progress.String())
		})
	}
}

// A build that runs past its time is stopped and says so in one line.
func TestBuildTimeout(t *testing.T) {
	l, _, _ := testLoader(t)
	l.BuildTimeout = time.Millisecond
	_, err := l.Load(behaveModel, frontend.Config{})
	require.Error(t, err)
	assert.Equal(t, behaveModel+": type-checking and building the model did not finish within 1ms (--model-timeout)", err.Error())
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assertNoWorkDirs(t, l)
}

func TestGcompileRoot(t *testing.T) {
	want, err := filepath.Abs("../..")
	require.NoError(t, err)
	root, err := gcompileRoot()
	require.NoError(t, err)
	assert.Equal(t, want, root)

	t.Setenv(RootEnv, t.TempDir())
	_, err = gcompileRoot()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "$"+RootEnv+"=")
	assert.Contains(t, err.Error(), "not gcompile's source folder")
}

func TestStandaloneGoMod(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
		err      string
	}{
		{"gcompile", "module gcompile // the compiler\n\ngo 1.26.0\n\nrequire golang.org/x/tools v0.52.0\n",
			[]string{"module gcompile_model\n", "go 1.26.0\n", "require golang.org/x/tools v0.52.0\n", "require gcompile v0.0.0-00010101000000-000000000000\n", "replace gcompile => /src/gc\n"}, ""},
		{"another module", "module example.com/other\n", nil, "declares module example.com/other"},
		{"no module line", "go 1.26\n", nil, "has no module line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := standaloneGoMod([]byte(tt.in), "/src/gc")
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			for _, w := range tt.want {
				assert.Contains(t, string(out), w)
			}
		})
	}
	assert.Equal(t, `"/a b/gc"`, quoteModPath("/a b/gc"))
}

func TestSplitPos(t *testing.T) {
	tests := []struct{ pos, file, line, col string }{
		{"/a/model.go:7:1", "/a/model.go", "7", "1"},
		{"/a/model.go:7", "/a/model.go", "7", ""},
		{`C:\a\model.go:7:1`, `C:\a\model.go`, "7", "1"},
		{"/a/model.go", "/a/model.go", "", ""},
	}
	for _, tt := range tests {
		file, line, col := splitPos(tt.pos)
		assert.Equal(t, []string{tt.file, tt.line, tt.col}, []string{file, line, col}, tt.pos)
	}
}

// editedSrc is a model whose parameter's default comes from another file
// of its package (edited by TestReloadSeesEveryEdit).
const editedSrc = `package edited

import (
	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/ir"
)

func Model(b *frontend.Builder) {
	b.Int("n", %s, "a figure")
	b.Int("m", width, "another")
	tokens := b.Input("tokens", ir.I32, b.Batch(), 4)
	x, _ := nn.Embedding(tokens, "wte", 16, 8)
	b.Loss(x.Sum())
}
`

// The go command keeps the drivers it links (buildDriver): a load after
// an edit, of the model's file or of another file of its package, runs
// the edited code, and one after the edit is undone runs the first again.
func TestReloadSeesEveryEdit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "edited")
	require.NoError(t, os.Mkdir(dir, 0o755))
	model := filepath.Join(dir, "model.go")
	write := func(n, width string) {
		require.NoError(t, os.WriteFile(model, []byte(fmt.Sprintf(editedSrc, n)), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "width.go"), []byte("package edited\n\nconst width = "+width+"\n"), 0o644))
	}
	for _, step := range []struct{ n, width string }{{"1", "10"}, {"2", "10"}, {"2", "20"}, {"1", "10"}} {
		write(step.n, step.width)
		l, _, _ := testLoader(t)
		docs, err := l.Describe(model, frontend.Config{})
		require.NoError(t, err)
		got := map[string]string{}
		for _, d := range docs {
			got[d.Key] = d.Default
		}
		assert.Equal(t, map[string]string{"n": step.n, "m": step.width}, got, "n=%s width=%s", step.n, step.width)
		assertNoWorkDirs(t, l)
	}
}

// BenchmarkLoadAgain loads a model that has not changed since its last
// load: the driver's build (linked once, then kept by the go command;
// no type-check, driverTarget) and its run.
func BenchmarkLoadAgain(b *testing.B) {
	l := &Loader{TempDir: b.TempDir(), Output: &bytes.Buffer{}}
	cfg := frontend.Config{Set: map[string]string{"mode": "1"}}
	if _, err := l.Load(behaveModel, cfg); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := l.Load(behaveModel, cfg); err != nil {
			b.Fatal(err)
		}
	}
}

// Without a cp on the PATH the driver is built with go build, as before
// go run kept drivers: the load works the same.
func TestLoadWithoutCp(t *testing.T) {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err)
	bin := t.TempDir()
	require.NoError(t, os.Symlink(goTool, filepath.Join(bin, "go")))
	t.Setenv("PATH", bin)
	_, err = exec.LookPath("cp")
	require.Error(t, err, "cp is still on the PATH")
	l, output, _ := testLoader(t)
	m, err := l.Load(behaveModel, frontend.Config{Set: map[string]string{"mode": "1"}})
	require.NoError(t, err)
	assert.NotEmpty(t, m.Params, "the model's parameters")
	assert.Contains(t, output.String(), "hello on stdout")
	assertNoWorkDirs(t, l)
}

// A runtime failure that lists every goroutine is cut after the first,
// the one that crashed, with a count of the rest.
func TestCrashReportKeepsTheFirstGoroutine(t *testing.T) {
	report := "fatal error: runtime: out of memory\n\nruntime stack:\nruntime.throw(...)\n\ngoroutine 1 [running]:\nmain.Model(...)\n\tmodel.go:12 +0x1\n\ngoroutine 2 [chan receive]:\nos.signal\n\ngoroutine 3 [syscall]:\nruntime.x\n"
	got := firstGoroutine(report)
	assert.Equal(t, "fatal error: runtime: out of memory\n\nruntime stack:\nruntime.throw(...)\n\ngoroutine 1 [running]:\nmain.Model(...)\n\tmodel.go:12 +0x1\n… (2 more goroutines)", got)
	one := "panic: boom\n\ngoroutine 1 [running]:\nmain.Model()\n"
	assert.Equal(t, one, firstGoroutine(one))
}

// Runaway recursion's report repeats one frame a hundred times: a run of
// three or more identical frames is folded into the first and a count;
// two are kept, and so are frames of other calls between them.
func TestCrashReportFoldsARecursion(t *testing.T) {
	frame := func(fn, at string) string { return fn + "(0x1?)\n\t" + at + " +0x2b fp=0x1 sp=0x2 pc=0x3\n" }
	report := "runtime: goroutine stack exceeds 1000000000-byte limit\nfatal error: stack overflow\n\ngoroutine 1 [running]:\n" +
		strings.Repeat(frame("m.deep", "/m/model.go:5"), 50) + "...4473 frames elided...\n" +
		strings.Repeat(frame("m.deep", "/m/model.go:5"), 2) + frame("m.Model", "/m/model.go:8")
	got := foldRepeatedFrames(report)
	assert.Equal(t, "runtime: goroutine stack exceeds 1000000000-byte limit\nfatal error: stack overflow\n\ngoroutine 1 [running]:\n"+
		frame("m.deep", "/m/model.go:5")+"\t… the same call 49 more times\n...4473 frames elided...\n"+
		strings.Repeat(frame("m.deep", "/m/model.go:5"), 2)+frame("m.Model", "/m/model.go:8"), got)
	assert.Equal(t, "panic: boom\n", foldRepeatedFrames("panic: boom\n"))
}

// A DSL error's lines that start with a position in the model's folder
// read as the go command's errors do, with the folder as the user gave
// the path; other lines, positions inside a line, and names of files not
// in the folder are left alone.
func TestDSLErrorsNameTheModelsFolder(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.go"), []byte("package m\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "layers.go"), []byte("package m\n"), 0o644))
	msg := "model.go:12: matmul: inner dims differ\nlayers.go:3: reshape: %5 @model.go:7 changes the count\nother.go:4: not here\nmodel.go: no line\nmodel.go:x: not a line\n2 errors"
	want := filepath.Join(dir, "model.go") + ":12: matmul: inner dims differ\n" + filepath.Join(dir, "layers.go") + ":3: reshape: %5 @model.go:7 changes the count\nother.go:4: not here\nmodel.go: no line\nmodel.go:x: not a line\n2 errors"
	assert.Equal(t, want, InFolder(msg, dir))
	assert.Equal(t, msg, InFolder(msg, "."), "a model in the working folder keeps the names")
}

// A model that imports "C" is refused as such: the driver is built
// without cgo.
func TestModelWithCgoIsRefused(t *testing.T) {
	path := writeModel(t, "package m\n\n// int two(void) { return 2; }\nimport \"C\"\n\nimport \"gcompile/frontend\"\n\nfunc Model(b *frontend.Builder) {}\n")
	l, _, _ := testLoader(t)
	_, err := l.Load(path, frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `:4: import "C": a model is built without cgo (CGO_ENABLED=0, as gcompile is); write it in Go alone`)
	assert.NotContains(t, err.Error(), "could not import gcompile/frontend")
}

// A stuck model's frame: its line, or, for a loop that calls nothing
// (which the runtime reports at line 1, the package clause), its
// function.
func TestModelFrameNamesTheStuckLine(t *testing.T) {
	name := "/m/model.go"
	stuck := `goroutine 1 gp=0x1 m=nil [runnable]:
runtime.asyncPreempt2()
	/usr/local/go/src/runtime/preempt.go:320 +0x14
m.helper(...)
	/m/model.go:24 +0x2
m.Model(0x1)
	/m/model.go:17 +0x2
`
	assert.Equal(t, "/m/model.go:24", modelFrame(stuck, name))
	// What the driver's stacks said of for { x++ } in Model.
	loop := `goroutine 1 gp=0x1788db89c1e0 m=0 mp=0x6ad040 [running]:
gcompile_model.Model(0x6ad578?)
	/m/model.go:1 +0x1 fp=0x1788db9dbbd8 sp=0x1788db9dbbd0 pc=0x524c61
main.main()
	/tmp/driver/main.go:10 +0x2
`
	assert.Equal(t, "/m/model.go, in Model (a loop that calls nothing, for which the runtime reports no line)", modelFrame(loop, name))
	assert.Empty(t, modelFrame("goroutine 1:\nmain.main()\n\t/tmp/driver/main.go:10\n", name))
}

// The driver is built for this machine whatever GOOS and GOARCH the
// environment sets for other builds: it was cross-compiled, and its start
// failed with "exec format error".
func TestDriverIgnoresTheEnvironmentsTarget(t *testing.T) {
	goarch := "arm64"
	if runtime.GOARCH == goarch {
		goarch = "amd64"
	}
	t.Setenv("GOARCH", goarch)
	t.Setenv("GOOS", "windows")
	l, output, _ := testLoader(t)
	_, err := l.Load(behaveModel, frontend.Config{Set: map[string]string{"mode": "1"}})
	require.NoError(t, err)
	assert.Contains(t, output.String(), "hello on stdout")
	// Nor does it choose the files by them: a model_linux.go was left out
	// "on this machine (windows/…)". (build.Default read the environment
	// when the process started: the test sets it as such a start would.)
	saved := build.Default
	t.Cleanup(func() { build.Default = saved })
	build.Default.GOOS, build.Default.GOARCH = "windows", goarch
	named := filepath.Join(t.TempDir(), "m", "model_"+runtime.GOOS+".go")
	require.NoError(t, os.MkdirAll(filepath.Dir(named), 0o755))
	require.NoError(t, os.WriteFile(named, []byte("package m\n\nimport \"gcompile/frontend\"\n\nfunc Model(b *frontend.Builder) { b.Errorf(\"reached\") }\n"), 0o644))
	_, err = l.Load(named, frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "reached", "the model ran")
	assert.NotContains(t, err.Error(), "leaves it out of its package")
}
