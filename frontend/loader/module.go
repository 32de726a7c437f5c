package loader

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/mod/modfile"
)

// gcompileModule is the module path of gcompile itself, which every model
// imports (gcompile/frontend).
const gcompileModule = "gcompile"

// RootEnv names the environment variable that tells the loader where
// gcompile's source tree is, for a binary that cannot find it itself
// (built with -trimpath, or the tree moved after the build).
const RootEnv = "GCOMPILE_ROOT"

// standaloneModule is the module path a model outside any Go module is
// given: the loader places a go.mod beside it, virtually.
const standaloneModule = "gcompile_model"

// moduleSetup is what the go command needs to see besides the user's
// files: for a model outside any module, a go.mod and go.sum that exist
// only in the overlay and resolve gcompile to its source tree.
type moduleSetup struct {
	// overlay maps the virtual files' paths to their contents; nil when
	// the model's own module is used as it is.
	overlay map[string][]byte
	// env and flags are added to every go command run on the model.
	env, flags []string
}

// findEnclosingModule reports the go.mod governing dir, as the go command
// finds it: the nearest one in dir or a parent.
func findEnclosingModule(dir string) (string, bool) {
	for {
		gomod := filepath.Join(dir, "go.mod")
		if fi, err := os.Stat(gomod); err == nil && !fi.IsDir() {
			return gomod, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// setupModule decides how the model file's package is built. A model in a
// module builds with that module's requirements. A model anywhere else
// gets a go.mod beside it, only in the go command's overlay so nothing is
// written into the user's folder, that requires gcompile, replaced by the
// source tree this loader was built from, and every module gcompile
// requires, with gcompile's go.sum: the model may import what gcompile
// does and the build needs no network.
func setupModule(modelDir string) (*moduleSetup, error) {
	if _, ok := findEnclosingModule(modelDir); ok {
		return &moduleSetup{}, nil
	}
	root, err := gcompileRoot()
	if err != nil {
		return nil, err
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("reading gcompile's go.mod: %w", err)
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading gcompile's go.sum: %w", err)
	}
	mod, err := standaloneGoMod(gomod, root)
	if err != nil {
		return nil, err
	}
	return &moduleSetup{
		overlay: map[string][]byte{
			filepath.Join(modelDir, "go.mod"): mod,
			filepath.Join(modelDir, "go.sum"): gosum,
		},
		// A go.work of the user's would take the virtual go.mod out of the
		// build; -mod=readonly because GOFLAGS may ask for a vendor folder
		// the virtual module does not have.
		env:   []string{"GOWORK=off"},
		flags: []string{"-mod=readonly"},
	}, nil
}

// standaloneGoMod turns gcompile's go.mod into the virtual module's: the
// same go version and requirements, plus gcompile itself replaced by root.
func standaloneGoMod(gomod []byte, root string) ([]byte, error) {
	var out bytes.Buffer
	found := false
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			if strings.Trim(f[1], `"`) != gcompileModule {
				return nil, fmt.Errorf("%s/go.mod declares module %s, not %s", root, f[1], gcompileModule)
			}
			fmt.Fprintf(&out, "module %s\n", standaloneModule)
			found = true
			continue
		}
		out.WriteString(line + "\n")
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading gcompile's go.mod: %w", err)
	}
	if !found {
		return nil, fmt.Errorf("%s/go.mod has no module line", root)
	}
	fmt.Fprintf(&out, "\nrequire %s v0.0.0-00010101000000-000000000000\n\nreplace %s => %s\n", gcompileModule, gcompileModule, quoteModPath(root))
	return out.Bytes(), nil
}

// quoteModPath quotes a folder for a go.mod replace line when it holds
// characters the go.mod syntax would split on.
func quoteModPath(p string) string {
	if strings.ContainsAny(p, " \t\"'`()") {
		return fmt.Sprintf("%q", p)
	}
	return p
}

// gcompileRoot finds gcompile's source tree, which a model outside any
// module is built against: $GCOMPILE_ROOT, else the folder this file was
// compiled from (recorded in the binary unless it was built with
// -trimpath). Either must hold gcompile's go.mod.
func gcompileRoot() (string, error) {
	if root := os.Getenv(RootEnv); root != "" {
		if err := checkRoot(root); err != nil {
			return "", fmt.Errorf("$%s=%s: %w", RootEnv, root, err)
		}
		return root, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if ok && filepath.IsAbs(file) {
		// file is ROOT/frontend/loader/module.go.
		root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
		if err := checkRoot(root); err == nil {
			return root, nil
		}
	}
	return "", fmt.Errorf("the model is not inside a Go module, and this gcompile does not know where its own source is to build it against (built with -trimpath, or the source moved): set %s to gcompile's source folder, or put the model in a module that requires %s", RootEnv, gcompileModule)
}

// checkRoot tells whether root is gcompile's module root.
func checkRoot(root string) error {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return fmt.Errorf("not gcompile's source folder: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "module" {
			if strings.Trim(f[1], `"`) == gcompileModule {
				return nil
			}
			return fmt.Errorf("not gcompile's source folder: its go.mod declares module %s", f[1])
		}
	}
	return errors.New("not gcompile's source folder: its go.mod has no module line")
}

// driverTarget names the model file's package (its import path and its
// module's root) from the files alone, as the go command would, so that
// the driver can be built without listing the package first. ok is false
// wherever the files alone might not tell (a file the build would leave
// out, a package main, a Model that is not a plain function in this
// file, GOPATH mode, another go.mod than the one found): the package is
// then listed and type-checked first, as it always was.
func driverTarget(file string, mod *moduleSetup, env []string) (pkgPath, modDir string, ok bool) {
	gomodule := ""
	for _, kv := range env {
		// A later assignment wins, as in the go command's environment.
		if v, found := strings.CutPrefix(kv, "GO111MODULE="); found {
			gomodule = v
		}
		if v, found := strings.CutPrefix(kv, "GOFLAGS="); found && strings.Contains(v, "-modfile") {
			return "", "", false
		}
	}
	if gomodule == "off" {
		return "", "", false
	}
	if !modelFileIsPlain(file) {
		return "", "", false
	}
	dir := filepath.Dir(file)
	if mod.overlay != nil {
		// The virtual go.mod sits beside the model.
		return standaloneModule, dir, true
	}
	gomod, found := findEnclosingModule(dir)
	if !found {
		return "", "", false
	}
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", "", false
	}
	modPath := modfile.ModulePath(data)
	if modPath == "" {
		return "", "", false
	}
	modDir = filepath.Dir(gomod)
	rel, err := filepath.Rel(modDir, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", "", false
	}
	if rel == "." {
		return modPath, modDir, true
	}
	return modPath + "/" + filepath.ToSlash(rel), modDir, true
}

// modelFileIsPlain says the build takes file into its package as it is
// (no build constraint, not a test file, a name no GOOS or GOARCH suffix
// excludes, without cgo), that the package is not main, and that the file
// declares Model as a function of one parameter and no results: then a
// driver that builds calls what a type-check would have accepted.
func modelFileIsPlain(file string) bool {
	base := filepath.Base(file)
	if !strings.HasSuffix(base, ".go") || strings.HasSuffix(base, "_test.go") {
		return false
	}
	bctx := hostBuild()
	if match, err := bctx.MatchFile(filepath.Dir(file), base); err != nil || !match {
		return false
	}
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil || f.Name.Name == "main" {
		return false
	}
	for _, d := range f.Decls {
		fn, isFunc := d.(*ast.FuncDecl)
		if isFunc && fn.Recv == nil && fn.Name.Name == ModelFuncName {
			return fn.Type.TypeParams == nil && fn.Type.Params.NumFields() == 1 && fn.Type.Results.NumFields() == 0
		}
	}
	return false
}

// hostBuild is the build context the model driver is built in: this
// machine's GOOS and GOARCH whatever the environment sets for other
// builds (the driver runs here), without cgo.
func hostBuild() *build.Context {
	bctx := build.Default
	bctx.GOOS, bctx.GOARCH, bctx.CgoEnabled = runtime.GOOS, runtime.GOARCH, false
	return &bctx
}
