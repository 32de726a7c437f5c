// Package loader turns a model file into IR: it type-checks the file's Go
// package with go/packages, builds a driver program around the package's
// Model function (frontend.Main) and runs it. It is separate from frontend
// so the driver, which imports frontend, does not link go/packages.
package loader

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/packages"

	"gcompile/frontend"
	"gcompile/ir"
)

// ModelFuncName is the function a model file must define.
const ModelFuncName = "Model"

const frontendPath = "gcompile/frontend"

// LoadModel type-checks the Go package holding path, then builds and runs
// a small driver program that calls the package's Model function and
// prints the module; the module is parsed back from that text. Go errors
// and DSL errors come back as "model.go:LINE: message" lines; no model code
// runs inside the compiler's process, so a model that crashes cannot take
// the compiler down with it.
func LoadModel(path string, cfg frontend.Config) (*ir.Module, error) {
	out, err := runDriver(path, cfg, false)
	if err != nil {
		return nil, err
	}
	return ir.Parse(filepath.Base(path), string(out))
}

// DescribeModel lists the model parameters a model file reads (--help-model).
func DescribeModel(path string, cfg frontend.Config) ([]frontend.ParamDoc, error) {
	out, err := runDriver(path, cfg, true)
	if err != nil {
		return nil, err
	}
	var docs []frontend.ParamDoc
	if err := json.Unmarshal(out, &docs); err != nil {
		return nil, fmt.Errorf("reading the model's parameter list: %w", err)
	}
	return docs, nil
}

func runDriver(path string, cfg frontend.Config, describe bool) ([]byte, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	pkg, err := typeCheck(abs)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "gcompile-driver-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	bin, err := buildDriver(pkg, work)
	if err != nil {
		return nil, err
	}
	if cfg.Float == ir.Invalid {
		cfg.Float = ir.F32
	}
	if cfg.Batch == 0 {
		cfg.Batch = 8
	}
	args := []string{"-name", cfg.Name, "-batch", strconv.Itoa(cfg.Batch), "-float", cfg.Float.String(), "-set", frontend.FormatSet(cfg.Set)}
	if describe {
		args = append(args, "-describe")
	}
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return nil, errors.New(msg)
		}
		return nil, fmt.Errorf("running the model driver: %w", err)
	}
	return stdout.Bytes(), nil
}

// typeCheck loads the package of file and reports Go errors as
// "file:line: message", relative to the working directory when shorter.
func typeCheck(file string) (*packages.Package, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedTypes | packages.NeedModule,
		Dir:  filepath.Dir(file),
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
		// A type error is reported twice: by the type checker and inside the
		// build log of `go list`; keep the type checker's, which has a position.
		typed := slices.ContainsFunc(pkg.Errors, func(e packages.Error) bool { return e.Kind == packages.TypeError })
		var errs []error
		for _, e := range pkg.Errors {
			if typed && e.Kind != packages.TypeError {
				continue
			}
			errs = append(errs, errors.New(formatGoError(e)))
		}
		return nil, errors.Join(errs...)
	}
	if pkg.Name == "main" {
		return nil, fmt.Errorf("%s:1: package main cannot be imported by the model driver; name the package after the model (e.g. package gpt)", relPath(file))
	}
	if pkg.Module == nil {
		return nil, fmt.Errorf("%s: not inside a Go module; put it in a module that requires gcompile", relPath(file))
	}
	obj := pkg.Types.Scope().Lookup(ModelFuncName)
	fn, ok := obj.(*types.Func)
	if !ok || !isModelFunc(fn) {
		return nil, fmt.Errorf("%s:1: package %s has no func %s(b *frontend.Builder)", relPath(file), pkg.Name, ModelFuncName)
	}
	return pkg, nil
}

func isModelFunc(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Params().Len() != 1 || sig.Results().Len() != 0 {
		return false
	}
	ptr, ok := sig.Params().At(0).Type().(*types.Pointer)
	if !ok {
		return false
	}
	named, ok := ptr.Elem().(*types.Named)
	return ok && named.Obj().Name() == "Builder" && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == frontendPath
}

// formatGoError turns "dir/model.go:12:5: msg" into "model.go:12: msg".
func formatGoError(e packages.Error) string {
	pos := e.Pos
	if pos == "" || pos == "-" {
		return e.Msg
	}
	parts := strings.Split(pos, ":")
	if len(parts) >= 3 {
		pos = strings.Join(parts[:len(parts)-1], ":") // drop the column
	}
	file, line, _ := strings.Cut(pos, ":")
	return relPath(file) + ":" + line + ": " + e.Msg
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

// buildDriver compiles a main package that calls pkg's Model. The driver
// source lives only in a build overlay, placed virtually inside the
// model's module so it resolves the same dependencies; nothing is written
// into the user's tree.
func buildDriver(pkg *packages.Package, work string) (string, error) {
	src := fmt.Sprintf("package main\n\nimport (\n\tmodel %q\n\t%q\n)\n\nfunc main() { frontend.Main(model.%s) }\n", pkg.PkgPath, frontendPath, ModelFuncName)
	sum := sha256.Sum256([]byte(src))
	dir := filepath.Join(pkg.Module.Dir, "gcompile_driver_"+hex.EncodeToString(sum[:6]))
	srcFile := filepath.Join(work, "main.go")
	if err := os.WriteFile(srcFile, []byte(src), 0o644); err != nil {
		return "", err
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(dir, "main.go"): srcFile}})
	if err != nil {
		return "", err
	}
	overlayFile := filepath.Join(work, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(work, "driver")
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building the model needs the go command: %w", err)
	}
	cmd := exec.Command(goTool, "build", "-overlay", overlayFile, "-o", bin, filepath.Join(dir, "main.go"))
	cmd.Dir = pkg.Module.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the model driver: %w\n%s", err, out)
	}
	return bin, nil
}
