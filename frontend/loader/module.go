package loader

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
