package dl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// ErrNotFound is wrapped by every error that reports a library which could
// not be found or loaded.
var ErrNotFound = errors.New("library not found")

// Where a candidate came from, as shown in error messages.
const (
	FromLibraryPath = "LD_LIBRARY_PATH"
	FromSystem      = "system folder"
	FromWheel       = "python wheel"
	FromLoader      = "dynamic loader"
)

// Search holds the places a library is looked for. Tests build one by hand
// with temporary folders; [DefaultSearch] fills it from the environment.
type Search struct {
	// Getenv reads the per-library override variables (Spec.EnvVar). Nil
	// disables overrides.
	Getenv func(string) string
	// LibraryPath is searched first (LD_LIBRARY_PATH's folders).
	LibraryPath []string
	// SystemDirs are the standard CUDA and distribution folders.
	SystemDirs []string
	// SitePackages are Python site-packages folders; each is joined with the
	// Spec's wheel subfolders.
	SitePackages []string
	// Loader, when set, finally asks the dynamic loader for each bare soname.
	Loader bool
}

// Candidate is one place a library may be loaded from.
type Candidate struct {
	Path string // a file path, or a bare soname when From is FromLoader
	From string // FromLibraryPath, FromSystem, FromWheel, FromLoader or the override variable
}

// DefaultSearch returns the search used outside tests: overrides from the
// process environment, LD_LIBRARY_PATH, the standard CUDA folders, the
// site-packages folders of the active and system Pythons, and the dynamic
// loader.
func DefaultSearch() Search {
	tuple, libDir := archDirs()
	system := []string{
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/" + tuple + "/lib",
		libDir,
		"/usr/lib64",
	}
	return Search{
		Getenv:       os.Getenv,
		LibraryPath:  splitList(os.Getenv("LD_LIBRARY_PATH")),
		SystemDirs:   system,
		SitePackages: defaultSitePackages(os.Getenv),
		Loader:       true,
	}
}

// archDirs names the per-architecture folders of the CUDA toolkit and of
// Debian-style multiarch layouts.
func archDirs() (cudaTarget, multiarch string) {
	if runtime.GOARCH == "arm64" {
		return "sbsa-linux", "/usr/lib/aarch64-linux-gnu"
	}
	return "x86_64-linux", "/usr/lib/x86_64-linux-gnu"
}

// defaultSitePackages lists existing site-packages folders, explicit and
// active environments first so that they win over system installs.
func defaultSitePackages(getenv func(string) string) []string {
	var dirs []string
	dirs = append(dirs, splitList(getenv("GCOMPILE_PYTHON_SITE"))...)
	for _, prefix := range []string{getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX")} {
		if prefix != "" {
			dirs = append(dirs, globDirs(filepath.Join(prefix, "lib", "python3*", "site-packages"))...)
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, globDirs(filepath.Join(home, ".local", "lib", "python3*", "site-packages"))...)
	}
	dirs = append(dirs, globDirs("/usr/local/lib/python3*/site-packages")...)
	dirs = append(dirs, globDirs("/usr/local/lib/python3*/dist-packages")...)
	dirs = append(dirs, globDirs("/usr/lib/python3*/site-packages")...)
	dirs = append(dirs, globDirs("/usr/lib/python3*/dist-packages")...)
	return dedupe(dirs)
}

// globDirs returns the matches of pattern, newest Python first (python3.12
// before python3.9), so the most recent interpreter's wheels are preferred.
func globDirs(pattern string) []string {
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return nil
	}
	sort.Slice(matches, func(i, j int) bool { return pyVersionLess(matches[j], matches[i]) })
	return matches
}

// pyVersionLess orders paths by the python3.N component numerically.
func pyVersionLess(a, b string) bool {
	va, vb := pyMinor(a), pyMinor(b)
	if va != vb {
		return va < vb
	}
	return a < b
}

func pyMinor(path string) int {
	i := strings.Index(path, "python3.")
	if i < 0 {
		return -1
	}
	n := 0
	for _, c := range path[i+len("python3."):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func splitList(s string) []string {
	var out []string
	for _, p := range filepath.SplitList(s) {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func dedupe(in []string) []string {
	seen := make(map[string]bool, len(in))
	out := in[:0]
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// override returns the override path for spec, or "" when none is set.
func (s Search) override(spec Spec) string {
	if s.Getenv == nil || spec.EnvVar == "" {
		return ""
	}
	return s.Getenv(spec.EnvVar)
}

// Candidates lists, in search order, every place Open would try for spec.
// With the override variable set it is the only candidate.
func (s Search) Candidates(spec Spec) []Candidate {
	if p := s.override(spec); p != "" {
		return []Candidate{{Path: p, From: spec.EnvVar}}
	}
	var out []Candidate
	inDirs := func(dirs []string, from string) {
		for _, d := range dirs {
			for _, name := range spec.Sonames {
				out = append(out, Candidate{Path: filepath.Join(d, name), From: from})
			}
		}
	}
	inDirs(s.LibraryPath, FromLibraryPath)
	inDirs(s.SystemDirs, FromSystem)
	for _, site := range s.SitePackages {
		for _, wheel := range spec.WheelDirs {
			inDirs([]string{filepath.Join(site, filepath.FromSlash(wheel))}, FromWheel)
		}
	}
	if s.Loader {
		for _, name := range spec.Sonames {
			out = append(out, Candidate{Path: name, From: FromLoader})
		}
	}
	return out
}

// Attempt records one candidate that did not load and why.
type Attempt struct {
	Candidate
	Err error
}

// NotFoundError reports a library that could not be loaded from any
// candidate. It wraps [ErrNotFound].
type NotFoundError struct {
	Spec     Spec
	Override bool // the override variable was set; nothing else was tried
	Attempts []Attempt
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	if e.Override {
		fmt.Fprintf(&b, "cuda/dl: cannot load %s from %s (no other place is searched while it is set)",
			e.Spec.Name, e.Spec.EnvVar)
	} else {
		fmt.Fprintf(&b, "cuda/dl: cannot load %s (%s); set %s to the library's path. Tried:",
			e.Spec.Name, strings.Join(e.Spec.Sonames, ", "), e.Spec.EnvVar)
	}
	if len(e.Attempts) == 0 {
		b.WriteString(": no places to search")
	}
	for _, a := range e.Attempts {
		fmt.Fprintf(&b, "\n  %s (%s): %v", a.Path, a.From, a.Err)
	}
	return b.String()
}

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// errMissing is recorded for a candidate file that does not exist.
var errMissing = errors.New("no such file")

// Open loads spec from the first candidate that loads. Files that exist but
// fail to load are recorded and skipped; with the override variable set only
// that path is tried.
func (s Search) Open(spec Spec) (*Lib, error) {
	cands := s.Candidates(spec)
	nf := &NotFoundError{Spec: spec, Override: s.override(spec) != ""}
	for _, c := range cands {
		path := c.Path
		if c.From != FromLoader {
			abs, err := filepath.Abs(path)
			if err != nil {
				nf.Attempts = append(nf.Attempts, Attempt{c, err})
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					err = errMissing
				}
				nf.Attempts = append(nf.Attempts, Attempt{c, err})
				continue
			}
			// An absolute path keeps dlopen from searching on its own.
			path = abs
		}
		h, err := dlopen(path)
		if err != nil {
			nf.Attempts = append(nf.Attempts, Attempt{c, err})
			continue
		}
		return &Lib{Spec: spec, Path: path, From: c.From, handle: h}, nil
	}
	return nil, nf
}

// Open loads spec with [DefaultSearch].
func Open(spec Spec) (*Lib, error) { return DefaultSearch().Open(spec) }
