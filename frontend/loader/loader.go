// Package loader turns a model file into IR: it builds a driver program
// around the file's package's Model function (frontend.Main) and runs it.
// Where the file alone cannot name its package, or the build fails, the
// package is type-checked with go/packages first, for errors that name
// the user's line. It is separate from frontend so the driver, which
// imports frontend, does not link go/packages.
//
// The model's code runs only in the driver, a process of its own group
// that is killed with all it started when the load ends, times out, or
// (on Linux) when gcompile dies; the module comes back in a result file,
// not on stdout, which the model may print to. A model outside any Go
// module is built against the gcompile source tree the loader came from.
package loader

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/tools/go/packages"

	"gcompile/frontend"
	"gcompile/ir"
)

// ModelFuncName is the function a model file must define.
const ModelFuncName = "Model"

const frontendPath = "gcompile/frontend"

const (
	// DefaultTimeout bounds type-checking and building a model, and
	// separately running its Model(), when Loader.Timeout is zero
	// (--model-timeout's default).
	DefaultTimeout = 2 * time.Minute
	// DefaultProgressAfter is how long a load runs before the loader says
	// on Loader.Progress that it is building the model: a cold build of
	// the driver takes many seconds, a warm one well under this, so fast
	// builds stay quiet.
	DefaultProgressAfter = time.Second
	// WorkDirPrefix starts the name of the temporary folder each load
	// builds in (under Loader.TempDir); the folder is removed before the
	// load returns.
	WorkDirPrefix = "gcompile-driver-"
)

// Loader loads model files. The zero value is ready to use: it applies
// DefaultTimeout, prints no progress and passes the model's own output to
// os.Stderr.
type Loader struct {
	// Timeout bounds running Model() (0: DefaultTimeout), and, unless
	// BuildTimeout is set, type-checking and building the model, each on
	// its own: a cold build must not eat the model's time. When it passes,
	// the go command or the driver is killed (with all they started) and
	// the load returns a *TimeoutError.
	Timeout time.Duration
	// BuildTimeout bounds type-checking and building the model (0:
	// Timeout), for callers that know one of the two is slow.
	BuildTimeout time.Duration
	// Progress receives one line ("building model FILE …") when a load
	// takes longer than ProgressAfter; nil: none. The CLI passes
	// os.Stderr; tests leave it quiet.
	Progress io.Writer
	// ProgressAfter is the delay before the progress line (0:
	// DefaultProgressAfter).
	ProgressAfter time.Duration
	// Output receives what the model itself printed, to stdout or
	// stderr, once the driver has ended (nil: os.Stderr). The module does
	// not travel on the driver's stdout, so prints cannot corrupt it, and
	// they are not dropped: they may be the user's debugging.
	Output io.Writer
	// TempDir is the folder the per-load work folder is created in (""
	// : os.TempDir()).
	TempDir string
	// Context, when it ends, stops the load as a timeout does (the CLI
	// ends it on SIGINT or SIGTERM): the go command or the driver is
	// killed, the work folder removed, and the load returns an
	// *InterruptedError. nil: never.
	Context context.Context
}

// InterruptedError is a load stopped by Loader.Context (a signal).
type InterruptedError struct {
	File string
	err  error
}

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("%s: building the model was interrupted (%v); it was stopped and its work folder removed", e.File, e.err)
}

// Unwrap gives the context's error (context.Canceled, or its cause).
func (e *InterruptedError) Unwrap() error { return e.err }

// parent is the context loads run under.
func (l *Loader) parent() context.Context {
	if l.Context != nil {
		return l.Context
	}
	return context.Background()
}

// interrupted reports the load's context having ended, if it has.
func (l *Loader) interrupted(name string) error {
	if err := l.parent().Err(); err != nil {
		return &InterruptedError{File: name, err: context.Cause(l.parent())}
	}
	return nil
}

// TimeoutError is a load that ran past Loader.Timeout: the go command or
// the driver was killed.
type TimeoutError struct {
	File  string // the model file, as the errors name it
	What  string // what did not finish, e.g. "Model() did not return"
	Limit time.Duration
	// At is the line of the model file the driver was running when it was
	// stopped (file:line), "" when not known.
	At string
}

func (e *TimeoutError) Error() string {
	if e.At != "" {
		return fmt.Sprintf("%s: %s within %v (--model-timeout); it was at %s", e.File, e.What, e.Limit, e.At)
	}
	return fmt.Sprintf("%s: %s within %v (--model-timeout)", e.File, e.What, e.Limit)
}

// Unwrap lets callers test for context.DeadlineExceeded.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// LoadModel builds and runs (type-checking the Go package holding path
// first where a build alone would not do, see driverTarget) a small
// driver program that calls the package's Model function and writes the
// module; the module is parsed back from that text. Go errors and DSL
// errors come back as "model.go:LINE: message" lines; no model code runs
// inside the compiler's process, so a model that crashes cannot take the
// compiler down with it. It is the command line's loader: default
// timeout, progress on os.Stderr.
func LoadModel(path string, cfg frontend.Config) (*ir.Module, error) {
	l := &Loader{Progress: os.Stderr}
	return l.Load(path, cfg)
}

// DescribeModel lists the model parameters a model file reads (--help-model),
// with LoadModel's settings.
func DescribeModel(path string, cfg frontend.Config) ([]frontend.ParamDoc, error) {
	l := &Loader{Progress: os.Stderr}
	return l.Describe(path, cfg)
}

// Load builds the module of the model file path (see LoadModel).
func (l *Loader) Load(path string, cfg frontend.Config) (*ir.Module, error) {
	out, err := l.run(path, cfg, false)
	if err != nil {
		return nil, err
	}
	return ir.Parse(filepath.Base(path), string(out))
}

// Describe lists the model parameters the model file path reads.
func (l *Loader) Describe(path string, cfg frontend.Config) ([]frontend.ParamDoc, error) {
	out, err := l.run(path, cfg, true)
	if err != nil {
		return nil, err
	}
	var docs []frontend.ParamDoc
	if err := json.Unmarshal(out, &docs); err != nil {
		return nil, fmt.Errorf("reading the model's parameter list: %w", err)
	}
	return docs, nil
}

func (l *Loader) timeout() time.Duration {
	if l.Timeout > 0 {
		return l.Timeout
	}
	return DefaultTimeout
}

func (l *Loader) output() io.Writer {
	if l.Output != nil {
		return l.Output
	}
	return os.Stderr
}

// run builds (type-checking first where needed) and runs the model's
// driver and returns the payload of its result. Everything it starts is
// killed, and its work folder removed, before it returns, whichever way
// it returns.
func (l *Loader) run(path string, cfg frontend.Config, describe bool) (out []byte, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	name := relPath(abs)
	if src, err := os.ReadFile(abs); err == nil && len(bytes.TrimSpace(src)) == 0 {
		// The parser would say "expected ';', found 'EOF'".
		return nil, fmt.Errorf("model file %s is empty: it needs a package clause (not main) and a func %s(b *frontend.Builder)", name, ModelFuncName)
	}
	after := l.ProgressAfter
	if after <= 0 {
		after = DefaultProgressAfter
	}
	stop := startProgress(l.Progress, after, fmt.Sprintf("building model %s …\n", name))
	defer stop()

	work, err := os.MkdirTemp(l.TempDir, WorkDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating the model's build folder: %w", err)
	}
	defer func() {
		// buildDriver and runDriver kill what they started before they
		// return, so nothing writes here any more.
		if rerr := os.RemoveAll(work); rerr != nil && err == nil {
			err = fmt.Errorf("removing the model's build folder: %w", rerr)
		}
	}()
	// The go command's own scratch folders go in the work folder too, so
	// that a go command killed at the timeout leaves none in $TMPDIR.
	gotmp := filepath.Join(work, "gotmp")
	if err := os.Mkdir(gotmp, 0o700); err != nil {
		return nil, fmt.Errorf("creating the model's build folder: %w", err)
	}
	mod, err := setupModule(filepath.Dir(abs))
	if err != nil {
		return nil, err
	}
	// The driver runs here: a GOOS or GOARCH set for other builds in the
	// environment would cross-compile it into a binary this machine
	// cannot start ("exec format error").
	env := append(os.Environ(), "CGO_ENABLED=0", "GOTMPDIR="+gotmp, "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
	env = append(env, mod.env...)

	timeout := l.timeout()
	if l.BuildTimeout > 0 {
		timeout = l.BuildTimeout
	}
	buildCtx, cancel := context.WithTimeout(l.parent(), timeout)
	defer cancel()
	// A model that builds needs only the build: when its file alone names
	// its package (driverTarget), the driver is built straight away, one
	// go command instead of the four that listing and type-checking the
	// package first take. A build that fails is diagnosed the long way,
	// with the package listed, so every error reads as it always has.
	if pkgPath, modDir, ok := driverTarget(abs, mod, env); ok {
		if bin, err := buildDriver(buildCtx, name, pkgPath, modDir, work, mod, env); err == nil {
			cancel()
			return l.runDriver(bin, name, work, cfg, describe)
		}
	}
	if buildCtx.Err() == nil {
		var pkg *packages.Package
		if pkg, err = typeCheck(buildCtx, abs, mod, env); err == nil {
			var bin string
			if bin, err = buildDriver(buildCtx, name, pkg.PkgPath, pkg.Module.Dir, work, mod, env); err == nil {
				cancel()
				return l.runDriver(bin, name, work, cfg, describe)
			}
		}
	}
	if ierr := l.interrupted(name); ierr != nil {
		return nil, ierr
	}
	if buildCtx.Err() != nil {
		return nil, &TimeoutError{File: name, What: "type-checking and building the model did not finish", Limit: timeout}
	}
	return nil, err
}

// startProgress writes msg to w once after has passed, unless the
// returned stop is called first; stop waits for a write in progress, so
// nothing is written to w once it returned.
func startProgress(w io.Writer, after time.Duration, msg string) (stop func()) {
	if w == nil {
		return func() {}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTimer(after)
		defer t.Stop()
		select {
		case <-t.C:
			// A progress line that cannot be written is no reason to fail
			// the load.
			_, _ = io.WriteString(w, msg)
		case <-done:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-finished
		})
	}
}

// runDriver runs the built driver and reads its result file (see
// frontend.DriverOK). What the model printed goes to l.Output.
func (l *Loader) runDriver(bin, name, work string, cfg frontend.Config, describe bool) ([]byte, error) {
	if cfg.Float == ir.Invalid {
		cfg.Float = ir.F32
	}
	if cfg.Batch == 0 {
		cfg.Batch = 8
	}
	resultFile := filepath.Join(work, "result")
	args := []string{"-name", cfg.Name, "-batch", strconv.Itoa(cfg.Batch), "-float", cfg.Float.String(), "-set", frontend.FormatSet(cfg.Set), "-out", resultFile}
	if cfg.Eval {
		args = append(args, "-eval")
	}
	if cfg.Classes > 0 {
		args = append(args, "-classes", strconv.Itoa(cfg.Classes))
	}
	if g := cfg.Generate; g != nil {
		args = append(args, "-gen-step", strconv.Itoa(g.Step), "-gen-context", strconv.Itoa(g.Context))
		if g.EveryRow {
			args = append(args, "-gen-every-row")
		}
	}
	if describe {
		args = append(args, "-describe")
	}
	// The model's stdout and stderr go to one file rather than pipes: no
	// copying goroutine can then block on a pipe that something the model
	// started keeps open, and prints keep their order.
	outFile, err := os.Create(filepath.Join(work, "output"))
	if err != nil {
		return nil, fmt.Errorf("running the model driver: %w", err)
	}
	defer outFile.Close()

	timeout := l.timeout()
	ctx, cancel := context.WithTimeout(l.parent(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = outFile, outFile
	isolate(cmd)
	cmd.Cancel = func() error {
		// Past the timeout (not stopped by the caller), SIGQUIT has the Go
		// runtime print every goroutine's stack and exit: the stack says
		// where the model was stuck. WaitDelay bounds the wait for it.
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) && l.parent().Err() == nil && quit(cmd) {
			return nil
		}
		killGroup(cmd)
		return nil
	}
	cmd.WaitDelay = quitWait
	// On every way out, including a panic here: the driver and anything
	// the model started (same process group) are killed.
	defer killGroup(cmd)
	// Linux's Pdeathsig (see isolate) fires when the thread that started
	// the child ends; holding this goroutine to its thread until the child
	// is gone keeps any other goroutine from ending that thread (a
	// goroutine that exits locked to its thread takes the thread along).
	runtime.LockOSThread()
	runErr := cmd.Run()
	runtime.UnlockOSThread()
	// The driver has ended; what the model started in the background
	// must not outlive the load either.
	killGroup(cmd)
	if ierr := l.interrupted(name); ierr != nil {
		return nil, ierr
	}

	result, rerr := os.ReadFile(resultFile)
	switch {
	case rerr == nil:
		l.copyOutput(outFile, -1)
		out, err := parseResult(result)
		if err != nil {
			msg := InFolder(err.Error(), filepath.Dir(name))
			if !positioned(msg) && !strings.HasPrefix(msg, "--") {
				// An error of the whole model (no b.Loss) names its file;
				// one of a flag (--set) names the flag.
				msg = relPath(name) + ": " + msg
			}
			err = errors.New(msg)
		}
		return out, err
	case !errors.Is(rerr, fs.ErrNotExist):
		return nil, fmt.Errorf("reading the model driver's result: %w", rerr)
	case ctx.Err() != nil:
		te := &TimeoutError{File: name, What: ModelFuncName + "() did not return", Limit: timeout}
		output, _ := readAll(outFile)
		if at := strings.Index(string(output), "SIGQUIT: quit"); at >= 0 {
			// The stacks are the loader's business; what came before them
			// is the model's own output.
			te.At = modelFrame(string(output[at:]), name)
			l.copyOutput(outFile, int64(at))
		} else {
			l.copyOutput(outFile, -1)
		}
		return nil, te
	}
	return nil, l.explainExit(name, runErr, outFile)
}

// InFolder gives the lines of a DSL error that start with a position in
// the model's folder that folder, as name (the path the user gave) has
// it: the module records positions by file name, the same wherever the
// file lies, while the go command's errors give the path, so that both
// read alike and an editor opens either. Positions inside a line (an
// op's "@model.go:12") are left as the module has them.
func InFolder(msg, dir string) string {
	if dir == "." {
		return msg
	}
	lines := strings.Split(msg, "\n")
	for i, line := range lines {
		file, rest, ok := goPosition(line)
		if !ok || strings.ContainsAny(file, `/\ `) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, file)); err == nil && fi.Mode().IsRegular() {
			lines[i] = filepath.Join(dir, file) + ":" + rest
		}
	}
	return strings.Join(lines, "\n")
}

// goPosition splits a line that starts at a place of a Go file,
// FILE.go:LINE: …, into the file and what follows its colon.
func goPosition(line string) (file, rest string, ok bool) {
	file, rest, ok = strings.Cut(line, ":")
	if !ok || !strings.HasSuffix(file, ".go") {
		return "", "", false
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	return file, rest, digits > 0 && strings.HasPrefix(rest[digits:], ":")
}

// positioned says msg starts at a place of a Go file.
func positioned(msg string) bool {
	_, _, ok := goPosition(msg)
	return ok
}

// parseResult splits the driver's result file into its status and payload.
func parseResult(result []byte) ([]byte, error) {
	s := string(result)
	switch {
	case strings.HasPrefix(s, frontend.DriverOK):
		return result[len(frontend.DriverOK):], nil
	case strings.HasPrefix(s, frontend.DriverError):
		return nil, errors.New(strings.TrimSpace(s[len(frontend.DriverError):]))
	}
	return nil, fmt.Errorf("the model driver's result starts with %q, not a status line", firstLine(s))
}

// quitWait is how long a driver asked for its stacks (SIGQUIT) past the
// timeout has to print them and exit before it is killed.
const quitWait = 3 * time.Second

// maxCrashReport bounds the part of a crash's output put into the error;
// a stack overflow prints megabytes of frames.
const maxCrashReport = 8 << 10

// explainExit says why the driver ended without a result: the model
// called os.Exit, the Go runtime crashed it (a panic on a goroutine the
// model started, a stack overflow, …), or a signal killed it.
func (l *Loader) explainExit(name string, runErr error, outFile *os.File) error {
	var exitErr *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exitErr) {
		return fmt.Errorf("running the model driver: %w", runErr)
	}
	output, err := readAll(outFile)
	if err != nil {
		return fmt.Errorf("reading the model's output: %w", err)
	}
	if runErr == nil {
		l.copyOutput(outFile, -1)
		return fmt.Errorf("%s: %s() called os.Exit(0) before returning", name, ModelFuncName)
	}
	code := exitErr.ExitCode()
	if code < 0 { // killed by a signal
		l.copyOutput(outFile, -1)
		return fmt.Errorf("%s: the model driver was killed before %s() returned: %w", name, ModelFuncName, runErr)
	}
	if at := crashStart(output); at >= 0 {
		// What the model printed before the crash is its own output; the
		// crash report is the error.
		l.copyOutput(outFile, int64(at))
		report := firstGoroutine(strings.TrimSpace(string(output[at:])))
		if len(report) > maxCrashReport {
			report = report[:maxCrashReport] + fmt.Sprintf("\n… (%d more bytes)", len(report)-maxCrashReport)
		}
		// The frame in the model file leads, so the error names the line
		// even when the runtime's report runs to many frames first.
		where := name
		if at := modelFrame(report, name); at != "" {
			where = at
		}
		when := "before " + ModelFuncName + "() returned"
		switch {
		case initFrame.MatchString(report) && !strings.Contains(report, "."+ModelFuncName+"("):
			// The package's initialisation (a var's value, an init
			// function) runs before Model is called at all.
			when = "while its package was initialised (a package-level var or an init function), before " + ModelFuncName + "() was called"
		case strings.Contains(report, "used after Model returned"):
			// A goroutine the model left running recorded an op late.
			when = "after " + ModelFuncName + "() returned, in a goroutine it left running (wait for it before returning)"
		}
		return fmt.Errorf("%s: the model crashed %s (%w): %s; the Go runtime's report:\n%s", where, when, runErr, firstLine(report), report)
	}
	for _, line := range strings.Split(string(output), "\n") {
		if msg, ok := strings.CutPrefix(line, frontend.DriverFailPrefix); ok {
			l.copyOutput(outFile, -1)
			return fmt.Errorf("%s: the model driver failed: %s", name, msg)
		}
		if line == "flag provided but not defined: -out" {
			// The model's module requires a gcompile older than this
			// loader: its frontend.Main prints the module on stdout.
			return fmt.Errorf("%s: the model's module requires a gcompile whose model driver predates this one (it has no -out flag): update its gcompile requirement", name)
		}
	}
	l.copyOutput(outFile, -1)
	return fmt.Errorf("%s: %s() called os.Exit(%d) before returning", name, ModelFuncName, code)
}

// initFrame matches a package initialiser's frame in a crash report
// (pkg.init, pkg.init.0 for an init function): with no Model frame above
// it, the package crashed before Model was called.
var initFrame = regexp.MustCompile(`(?m)^\S+\.init(\.\d+)?\(\)\s*$`)

// firstGoroutine is a crash report cut after the stack of the goroutine
// that crashed, the first one listed: a runtime failure (out of memory)
// lists every goroutine, a hundred lines of the driver's own.
func firstGoroutine(report string) string {
	report = foldRepeatedFrames(report)
	first := strings.Index(report, "\ngoroutine ")
	if first < 0 {
		return report
	}
	rest := report[first+1:]
	next := strings.Index(rest, "\n\ngoroutine ")
	if next < 0 {
		return report
	}
	more := strings.Count(rest[next:], "\n\ngoroutine ")
	return report[:first+1+next] + fmt.Sprintf("\n… (%d more goroutines)", more)
}

// foldRepeatedFrames folds a run of three or more identical frames in a
// Go crash report (a function line and its file:line line, the same call
// again and again: runaway recursion) into the first and a count, so
// that the report's hundred frames of one call do not bury its start.
func foldRepeatedFrames(report string) string {
	lines := strings.Split(report, "\n")
	// key is a frame's function (without its arguments) and call site
	// (without its offset), "" for a line that starts no frame.
	key := func(i int) string {
		if i+1 >= len(lines) || strings.HasPrefix(lines[i], "\t") || !strings.HasPrefix(lines[i+1], "\t") {
			return ""
		}
		fn, _, _ := strings.Cut(lines[i], "(")
		at, _, _ := strings.Cut(strings.TrimSpace(lines[i+1]), " +0x")
		return fn + "\x00" + at
	}
	var out []string
	for i := 0; i < len(lines); {
		k := key(i)
		if k == "" {
			out = append(out, lines[i])
			i++
			continue
		}
		n := 1
		for key(i+2*n) == k {
			n++
		}
		out = append(out, lines[i], lines[i+1])
		if n >= 3 {
			out = append(out, fmt.Sprintf("\t… the same call %d more times", n-1))
		} else if n == 2 {
			out = append(out, lines[i+2], lines[i+3])
		}
		i += 2 * n
	}
	return strings.Join(out, "\n")
}

// modelFrame is the first frame of a crash report in the model file name,
// as name:line ("examples/gpt/model.go:11"), "" when none is: the line of the model's own code
// where the crash happened, or the deepest call of it on the way there.
// A frame caught in a loop that calls nothing, which the compiler made
// a bare jump, is reported by the runtime at line 1 (the file's package
// clause, where no code runs): that frame is named by its function
// instead ("model.go, in Model (…)").
func modelFrame(report, name string) string {
	base := filepath.Base(name)
	fn := ""
	for _, line := range strings.Split(report, "\n") {
		line = strings.TrimSpace(line)
		file, rest, ok := strings.Cut(line, ".go:")
		if !ok || filepath.Base(file+".go") != base {
			fn = line
			continue
		}
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 {
			continue
		}
		if rest[:n] == "1" {
			f, _, _ := strings.Cut(fn, "(")
			f = f[strings.LastIndex(f, ".")+1:]
			return fmt.Sprintf("%s, in %s (a loop that calls nothing, for which the runtime reports no line)", name, f)
		}
		return name + ":" + rest[:n]
	}
	return ""
}

// crashStart finds where the Go runtime's crash report starts in the
// driver's output: the first line starting "panic: ", "fatal error: " or
// "runtime: " (a stack overflow's first line); -1 if there is none.
func crashStart(output []byte) int {
	s := string(output)
	best := -1
	for _, head := range []string{"panic: ", "fatal error: ", "runtime: "} {
		for i := 0; i < len(s); {
			j := strings.Index(s[i:], head)
			if j < 0 {
				break
			}
			at := i + j
			if at == 0 || s[at-1] == '\n' {
				if best < 0 || at < best {
					best = at
				}
				break
			}
			i = at + len(head)
		}
	}
	return best
}

// copyOutput passes the first n bytes of what the model printed (all when
// n < 0) on to l.Output.
func (l *Loader) copyOutput(f *os.File, n int64) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return
	}
	var r io.Reader = f
	if n >= 0 {
		r = io.LimitReader(f, n)
	}
	// The model's prints are a courtesy; failing to pass them on must not
	// fail the load.
	_, _ = io.Copy(l.output(), r)
}

func readAll(f *os.File) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// typeCheck loads the package of file and reports Go errors: syntax errors
// as the Go parser reports them, "file:line:col: message", and only those
// when there are any (as go build does: type errors in a file that does
// not parse are mostly echoes of the syntax error); otherwise type errors
// as "file:line: message". Files are named relative to the working
// directory when that is shorter.
func typeCheck(ctx context.Context, file string, mod *moduleSetup, env []string) (*packages.Package, error) {
	cfg := &packages.Config{
		Context:    ctx,
		Mode:       packages.NeedName | packages.NeedFiles | packages.NeedTypes | packages.NeedModule,
		Dir:        filepath.Dir(file),
		Env:        env,
		BuildFlags: mod.flags,
		Overlay:    mod.overlay,
	}
	// A file the go command leaves out of its package has no package to
	// load: said as such, not as a file outside any module.
	if base := filepath.Base(file); strings.HasSuffix(base, "_test.go") {
		return nil, fmt.Errorf("%s: a _test.go file is compiled only by go test; name the model file without _test", relPath(file))
	} else if ok, err := hostBuild().MatchFile(filepath.Dir(file), base); err == nil && !ok {
		return nil, fmt.Errorf("%s: the go command leaves it out of its package on this machine (%s/%s): a //go:build line, a _GOOS or _GOARCH suffix, or a name starting with _ or . excludes it", relPath(file), runtime.GOOS, runtime.GOARCH)
	}
	if err := noCgo(filepath.Dir(file)); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("go"); err != nil {
		// Said before packages.Load, whose message for it ends in an
		// empty "stderr: ".
		return nil, fmt.Errorf("loading %s: %w: a model.go is built with the go command (install Go, or run a .gir dump of the model, which needs none)", relPath(file), err)
	}
	pkgs, err := packages.Load(cfg, "file="+file)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", relPath(file), err)
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("%s: expected one package, found %d", relPath(file), len(pkgs))
	}
	pkg := pkgs[0]
	if len(pkg.Errors) > 0 {
		return nil, goErrors(pkg.Errors, filepath.Dir(file))
	}
	if pkg.Name == "main" {
		return nil, fmt.Errorf("%s:1: package main cannot be imported by the model driver; name the package after the model (e.g. package gpt)", relPath(file))
	}
	if pkg.Module == nil {
		return nil, fmt.Errorf("%s: not inside a Go module; put it in a module that requires gcompile", relPath(file))
	}
	obj := pkg.Types.Scope().Lookup(ModelFuncName)
	fn, ok := obj.(*types.Func)
	if obj != nil && pkg.Fset != nil && (!ok || !isModelFunc(fn)) {
		// There is a Model, of another kind: say what it is, where.
		pos := pkg.Fset.Position(obj.Pos())
		what := types.ObjectString(obj, func(p *types.Package) string {
			if p == pkg.Types {
				return ""
			}
			return p.Name() // frontend.Builder, as the model's source says it
		})
		return nil, fmt.Errorf("%s:%d: %s: want func %s(b *frontend.Builder)", relPath(pos.Filename), pos.Line, what, ModelFuncName)
	}
	if !ok || !isModelFunc(fn) {
		return nil, fmt.Errorf("%s:1: package %s has no func %s(b *frontend.Builder)", relPath(file), pkg.Name, ModelFuncName)
	}
	return pkg, nil
}

// goErrors picks and formats the errors go/packages found in the package
// in folder dir. Syntax errors come first and alone. A type error is reported twice, by the type
// checker and inside the build log of `go list`; the type checker's is
// kept, it has a position.
func goErrors(all []packages.Error, dir string) error {
	var kind packages.ErrorKind = packages.UnknownError
	for _, k := range []packages.ErrorKind{packages.ParseError, packages.TypeError} {
		if slices.ContainsFunc(all, func(e packages.Error) bool { return e.Kind == k }) {
			kind = k
			break
		}
	}
	var errs []error
	seen := map[string]bool{}
	gcompileImports := 0
	for _, e := range all {
		if kind != packages.UnknownError && e.Kind != kind {
			continue
		}
		if e.Kind == packages.ParseError {
			// go/packages parses with parser.AllErrors; the go command and
			// gofmt report only the first syntax error of a line, the
			// rest being the parser losing its way.
			file, line, _ := splitPos(e.Pos)
			if seen[file+":"+line] {
				continue
			}
			seen[file+":"+line] = true
		}
		if e.Pos == "" && strings.HasPrefix(e.Msg, "# ") {
			errs = append(errs, errors.New(buildLog(e.Msg, dir)))
			continue
		}
		if path, ok := strings.CutPrefix(e.Msg, "could not import gcompile/"); ok {
			// Every import of gcompile fails alike when the model's module
			// does not require it: one error says so, naming the others.
			if gcompileImports++; gcompileImports > 1 {
				continue
			}
			var others []string
			for _, o := range all {
				if p, ok := strings.CutPrefix(o.Msg, "could not import gcompile/"); ok && o.Msg != e.Msg {
					others = append(others, "gcompile/"+strings.TrimSuffix(p, ` (invalid package name: "")`))
				}
			}
			slices.Sort(others)
			others = slices.Compact(others)
			and := ""
			if len(others) > 0 {
				and = " (nor " + strings.Join(others, ", ") + ")"
			}
			e.Msg = fmt.Sprintf("could not import gcompile/%s%s: the model's module does not provide gcompile; add require gcompile and replace gcompile => the gcompile checkout to its go.mod, or move the model out of that module",
				strings.TrimSuffix(path, ` (invalid package name: "")`), and)
		}
		errs = append(errs, errors.New(formatGoError(e, e.Kind == packages.ParseError)))
	}
	return errors.Join(errs...)
}

// buildLog turns a compiler log that go list passes on ("# pkgpath", then
// "./model.go:5:6: message" lines relative to the package folder dir)
// into lines that name the file as the other errors do; the package path
// line is dropped, it is the loader's business (gcompile_model for a model
// outside any module).
func buildLog(msg, dir string) string {
	var out []string
	for _, line := range strings.Split(msg, "\n") {
		if strings.HasPrefix(line, "# ") {
			continue
		}
		if f, rest, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(f, ".go") && !filepath.IsAbs(f) {
			line = relPath(filepath.Join(dir, f)) + ":" + rest
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func isModelFunc(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.TypeParams().Len() > 0 || sig.Params().Len() != 1 || sig.Results().Len() != 0 {
		// A generic Model cannot be called without its type arguments.
		return false
	}
	ptr, ok := sig.Params().At(0).Type().(*types.Pointer)
	if !ok {
		return false
	}
	named, ok := ptr.Elem().(*types.Named)
	return ok && named.Obj().Name() == "Builder" && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == frontendPath
}

// formatGoError turns "dir/model.go:12:5: msg" into "model.go:12: msg", or
// "model.go:12:5: msg" with withCol. The position is split from the right,
// since a Windows path holds a colon of its own.
func formatGoError(e packages.Error, withCol bool) string {
	// An import the go command found nowhere reaches the type checker as
	// a package with no name; say what that means.
	if path, ok := strings.CutPrefix(e.Msg, "could not import "); ok && strings.HasSuffix(path, ` (invalid package name: "")`) {
		path = strings.TrimSuffix(path, ` (invalid package name: "")`)
		e.Msg = fmt.Sprintf("could not import %s: no such package in the standard library, the model's module or its requirements (check the path; a package of another module is added to the model's go.mod with go get)", path)
	}
	pos := e.Pos
	if pos == "" || pos == "-" {
		return e.Msg
	}
	file, line, col := splitPos(pos)
	if line == "" {
		return relPath(file) + ": " + e.Msg
	}
	if withCol && col != "" {
		return relPath(file) + ":" + line + ":" + col + ": " + e.Msg
	}
	return relPath(file) + ":" + line + ": " + e.Msg
}

// splitPos splits "file:line:col" or "file:line"; line and col are empty
// where the position has none.
func splitPos(pos string) (file, line, col string) {
	isNum := func(s string) bool {
		_, err := strconv.Atoi(s)
		return err == nil
	}
	rest, last, ok := cutLast(pos)
	if !ok || !isNum(last) {
		return pos, "", ""
	}
	if f, l, ok := cutLast(rest); ok && isNum(l) {
		return f, l, last
	}
	return rest, last, ""
}

func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

func relPath(p string) string {
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// buildDriver compiles a main package that calls pkg's Model (of the file
// the errors call name). The driver
// source lives only in a build overlay, placed virtually inside the
// model's module so it resolves the same dependencies; nothing is written
// into the user's tree. The go command runs in its own process group and
// is killed with everything it started when ctx ends.
func buildDriver(ctx context.Context, name, pkgPath, modDir, work string, mod *moduleSetup, env []string) (string, error) {
	src := fmt.Sprintf("package main\n\nimport (\n\tmodel %q\n\t%q\n)\n\nfunc main() { frontend.Main(model.%s) }\n", pkgPath, frontendPath, ModelFuncName)
	sum := sha256.Sum256([]byte(src))
	dir := filepath.Join(modDir, "gcompile_driver_"+hex.EncodeToString(sum[:6]))
	srcFile := filepath.Join(work, "main.go")
	if err := os.WriteFile(srcFile, []byte(src), 0o644); err != nil {
		return "", fmt.Errorf("writing the model driver: %w", err)
	}
	replace := map[string]string{filepath.Join(dir, "main.go"): srcFile}
	// The virtual go.mod and go.sum of a model outside any module: the
	// build overlay names files, so they are written to the work folder.
	i := 0
	for virtual, data := range mod.overlay {
		onDisk := filepath.Join(work, fmt.Sprintf("overlay%d_%s", i, filepath.Base(virtual)))
		i++
		if err := os.WriteFile(onDisk, data, 0o644); err != nil {
			return "", fmt.Errorf("writing the model's build overlay: %w", err)
		}
		replace[virtual] = onDisk
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": replace})
	if err != nil {
		return "", fmt.Errorf("writing the model's build overlay: %w", err)
	}
	overlayFile := filepath.Join(work, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		return "", fmt.Errorf("writing the model's build overlay: %w", err)
	}
	bin := filepath.Join(work, "driver")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building the model needs the go command: %w", err)
	}
	// -buildvcs=false: the driver needs no version stamp, and stamping
	// fails in a repository whose VCS tool is not installed. -s -w: no
	// symbol table or DWARF, which nothing reads (a panic's file:line
	// comes from the pclntab, kept), and the link is the load's largest
	// step after type-checking: a load takes 13 % less CPU.
	flags := append(slices.Clone(mod.flags), "-buildvcs=false", "-ldflags=-s -w", "-overlay", overlayFile)
	driverMain := filepath.Join(dir, "main.go")
	args := append(append([]string{"build"}, flags...), "-o", bin, driverMain)
	if cp, err := exec.LookPath("cp"); err == nil {
		// go run keeps the executables it links in the build cache (since
		// Go 1.24), keyed like every build action: a model loaded again
		// with nothing changed is not linked again, which is a third of
		// a load. -exec cp copies the executable to bin instead of
		// running it.
		args = append(append([]string{"run"}, flags...), "-exec", cp, driverMain, bin)
	}
	cmd := exec.CommandContext(ctx, goTool, args...)
	cmd.Dir = modDir
	cmd.Env = env
	isolate(cmd)
	cmd.Cancel = func() error {
		killGroup(cmd)
		return nil
	}
	// The compiler and linker the go command started share its pipe;
	// once the group is killed, do not wait long for it to close.
	cmd.WaitDelay = 5 * time.Second
	defer killGroup(cmd)
	// As for the driver (see runDriver): Pdeathsig is per thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: building the model driver failed (%w):\n%s", name, err, strings.TrimSpace(buildLog(string(out), modDir)))
	}
	return bin, nil
}

// noCgo refuses a model package that imports "C": the driver is built
// with CGO_ENABLED=0 (as gcompile is), where go/packages says only that
// it cannot import C, and then, wrongly, gcompile/frontend.
func noCgo(dir string) error {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			continue // the build says what is wrong with it
		}
		for _, imp := range parsed.Imports {
			if imp.Path.Value == `"C"` {
				return fmt.Errorf("%s:%d: import \"C\": a model is built without cgo (CGO_ENABLED=0, as gcompile is); write it in Go alone", relPath(f), fset.Position(imp.Pos()).Line)
			}
		}
	}
	return nil
}
