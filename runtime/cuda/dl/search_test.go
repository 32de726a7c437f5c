package dl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestCandidatesOrder(t *testing.T) {
	s := Search{
		LibraryPath:  []string{"/ld/a", "/ld/b"},
		SystemDirs:   []string{"/usr/local/cuda/lib64"},
		SitePackages: []string{"/venv/site-packages"},
		Loader:       true,
	}
	got := s.Candidates(NVRTC)
	want := []Candidate{
		{"/ld/a/libnvrtc.so.13", FromLibraryPath},
		{"/ld/a/libnvrtc.so.12", FromLibraryPath},
		{"/ld/a/libnvrtc.so", FromLibraryPath},
		{"/ld/b/libnvrtc.so.13", FromLibraryPath},
		{"/ld/b/libnvrtc.so.12", FromLibraryPath},
		{"/ld/b/libnvrtc.so", FromLibraryPath},
		{"/usr/local/cuda/lib64/libnvrtc.so.13", FromSystem},
		{"/usr/local/cuda/lib64/libnvrtc.so.12", FromSystem},
		{"/usr/local/cuda/lib64/libnvrtc.so", FromSystem},
		{"/venv/site-packages/nvidia/cu13/lib/libnvrtc.so.13", FromWheel},
		{"/venv/site-packages/nvidia/cu13/lib/libnvrtc.so.12", FromWheel},
		{"/venv/site-packages/nvidia/cu13/lib/libnvrtc.so", FromWheel},
		{"/venv/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.13", FromWheel},
		{"/venv/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12", FromWheel},
		{"/venv/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so", FromWheel},
		{"libnvrtc.so.13", FromLoader},
		{"libnvrtc.so.12", FromLoader},
		{"libnvrtc.so", FromLoader},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("candidates (-want +got):\n%s", d)
	}
}

func TestCandidatesOverrideIsAlone(t *testing.T) {
	s := Search{
		Getenv:      envMap(map[string]string{"GCOMPILE_LIBNCCL": "/opt/nccl/libnccl.so.2"}),
		LibraryPath: []string{"/ld"},
		Loader:      true,
	}
	got := s.Candidates(NCCL)
	assert.Equal(t, []Candidate{{"/opt/nccl/libnccl.so.2", "GCOMPILE_LIBNCCL"}}, got)
}

func TestSpecsMatchTheDocumentedNames(t *testing.T) {
	// The driver is never shipped in a wheel; the others are searched in
	// both the CUDA 12 (per-library) and CUDA 13 (nvidia/cu13) layouts.
	tests := []struct {
		spec   Spec
		env    string
		first  string
		wheels []string
	}{
		{CUDA, "GCOMPILE_LIBCUDA", "libcuda.so.1", nil},
		{NVRTC, "GCOMPILE_LIBNVRTC", "libnvrtc.so.13", []string{"nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"}},
		{CuBLASLt, "GCOMPILE_LIBCUBLASLT", "libcublasLt.so.13", []string{"nvidia/cu13/lib", "nvidia/cublas/lib"}},
		{NCCL, "GCOMPILE_LIBNCCL", "libnccl.so.2", []string{"nvidia/nccl/lib", "nvidia/cu13/lib"}},
	}
	for _, tt := range tests {
		t.Run(tt.spec.Name, func(t *testing.T) {
			assert.Equal(t, tt.env, tt.spec.EnvVar)
			assert.Equal(t, tt.first, tt.spec.Sonames[0])
			assert.Equal(t, tt.wheels, tt.spec.WheelDirs)
		})
	}
}

// layout is a set of empty search roots under one temporary folder.
type layout struct {
	ld, system, site string
}

func newLayout(t *testing.T) layout {
	root := t.TempDir()
	l := layout{
		ld:     filepath.Join(root, "ld"),
		system: filepath.Join(root, "usr-local-cuda-lib64"),
		site:   filepath.Join(root, "venv", "lib", "python3.12", "site-packages"),
	}
	for _, d := range []string{l.ld, l.system, l.site} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	return l
}

func (l layout) search(env map[string]string) Search {
	return Search{
		Getenv:       envMap(env),
		LibraryPath:  []string{l.ld},
		SystemDirs:   []string{l.system},
		SitePackages: []string{l.site},
	}
}

func place(t *testing.T, path string, content []byte) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, content, 0o644))
}

// notALibrary is a file named like a library that dlopen rejects; finding it
// shows up as a load failure rather than a missing file.
var notALibrary = []byte("this is not an ELF file\n")

func TestOpenFindsEachSource(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		where func(l layout, env map[string]string) string // places the file, returns its path
		from  string
	}{
		{
			name: "env override",
			spec: CuBLASLt,
			where: func(l layout, env map[string]string) string {
				p := filepath.Join(filepath.Dir(l.ld), "custom", "my-cublasLt.so")
				env["GCOMPILE_LIBCUBLASLT"] = p
				return p
			},
			from: "GCOMPILE_LIBCUBLASLT",
		},
		{
			name:  "LD_LIBRARY_PATH",
			spec:  CUDA,
			where: func(l layout, _ map[string]string) string { return filepath.Join(l.ld, "libcuda.so.1") },
			from:  FromLibraryPath,
		},
		{
			name:  "standard folder",
			spec:  NVRTC,
			where: func(l layout, _ map[string]string) string { return filepath.Join(l.system, "libnvrtc.so.12") },
			from:  FromSystem,
		},
		{
			name: "cuda 12 wheel folder",
			spec: CuBLASLt,
			where: func(l layout, _ map[string]string) string {
				return filepath.Join(l.site, "nvidia", "cublas", "lib", "libcublasLt.so.12")
			},
			from: FromWheel,
		},
		{
			name: "cuda 13 wheel folder",
			spec: NVRTC,
			where: func(l layout, _ map[string]string) string {
				return filepath.Join(l.site, "nvidia", "cu13", "lib", "libnvrtc.so.13")
			},
			from: FromWheel,
		},
		{
			name: "nccl wheel folder",
			spec: NCCL,
			where: func(l layout, _ map[string]string) string {
				return filepath.Join(l.site, "nvidia", "nccl", "lib", "libnccl.so.2")
			},
			from: FromWheel,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLayout(t)
			env := map[string]string{}
			path := tt.where(l, env)
			place(t, path, notALibrary)

			lib, err := l.search(env).Open(tt.spec)
			require.Error(t, err)
			assert.Nil(t, lib)
			var nf *NotFoundError
			require.ErrorAs(t, err, &nf)
			require.ErrorIs(t, err, ErrNotFound)

			// Every candidate before the placed file is missing; the placed
			// file itself was found and handed to dlopen, which refused it.
			found := -1
			for i, a := range nf.Attempts {
				if a.Path == path {
					found = i
					break
				}
				assert.ErrorIs(t, a.Err, errMissing, "attempt %d %s", i, a.Path)
			}
			require.GreaterOrEqual(t, found, 0, "placed file %s never tried; attempts: %v", path, nf.Attempts)
			a := nf.Attempts[found]
			assert.Equal(t, tt.from, a.From)
			assert.NotErrorIs(t, a.Err, errMissing)
			assert.Contains(t, a.Err.Error(), "dlopen")
		})
	}
}

func TestNotFoundNamesEveryPathAndTheVariable(t *testing.T) {
	l := newLayout(t)
	s := l.search(nil)
	_, err := s.Open(NCCL)
	require.ErrorIs(t, err, ErrNotFound)
	msg := err.Error()
	assert.Contains(t, msg, "NCCL")
	assert.Contains(t, msg, "GCOMPILE_LIBNCCL")
	cands := s.Candidates(NCCL)
	require.Len(t, cands, 2+2+2*2) // two sonames in ld, system and two wheel folders
	for _, c := range cands {
		assert.Contains(t, msg, c.Path)
	}
	assert.Equal(t, len(cands), strings.Count(msg, "no such file"))
}

func TestOverrideMissingFileIsTheError(t *testing.T) {
	l := newLayout(t)
	// A loadable-looking candidate in LD_LIBRARY_PATH must not be used as a
	// fallback when the override is set.
	place(t, filepath.Join(l.ld, "libnccl.so.2"), notALibrary)
	missing := filepath.Join(filepath.Dir(l.ld), "nope", "libnccl.so.2")
	_, err := l.search(map[string]string{"GCOMPILE_LIBNCCL": missing}).Open(NCCL)
	require.ErrorIs(t, err, ErrNotFound)
	var nf *NotFoundError
	require.ErrorAs(t, err, &nf)
	assert.True(t, nf.Override)
	require.Len(t, nf.Attempts, 1)
	assert.Equal(t, missing, nf.Attempts[0].Path)
	assert.Contains(t, err.Error(), missing)
	assert.Contains(t, err.Error(), "GCOMPILE_LIBNCCL")
	assert.NotContains(t, err.Error(), l.ld)
}

func TestOverrideThatDoesNotLoadIsTheError(t *testing.T) {
	l := newLayout(t)
	bad := filepath.Join(filepath.Dir(l.ld), "bad.so")
	place(t, bad, notALibrary)
	_, err := l.search(map[string]string{"GCOMPILE_LIBCUDA": bad}).Open(CUDA)
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), bad)
	assert.Contains(t, err.Error(), "dlopen")
}

func TestDefaultSearchReadsTheEnvironment(t *testing.T) {
	site := t.TempDir()
	venv := t.TempDir()
	for _, v := range []string{"python3.9", "python3.12", "python3.10"} {
		require.NoError(t, os.MkdirAll(filepath.Join(venv, "lib", v, "site-packages"), 0o755))
	}
	t.Setenv("LD_LIBRARY_PATH", "/first/lib:/second/lib")
	t.Setenv("GCOMPILE_PYTHON_SITE", site)
	t.Setenv("VIRTUAL_ENV", venv)
	t.Setenv("CONDA_PREFIX", "")
	t.Setenv("GCOMPILE_LIBNVRTC", "/x/libnvrtc.so")

	s := DefaultSearch()
	assert.Equal(t, []string{"/first/lib", "/second/lib"}, s.LibraryPath)
	assert.Contains(t, s.SystemDirs, "/usr/local/cuda/lib64")
	require.GreaterOrEqual(t, len(s.SitePackages), 4)
	assert.Equal(t, []string{
		site,
		filepath.Join(venv, "lib", "python3.12", "site-packages"),
		filepath.Join(venv, "lib", "python3.10", "site-packages"),
		filepath.Join(venv, "lib", "python3.9", "site-packages"),
	}, s.SitePackages[:4])
	assert.True(t, s.Loader)
	assert.Equal(t, []Candidate{{"/x/libnvrtc.so", "GCOMPILE_LIBNVRTC"}}, s.Candidates(NVRTC))
}

func TestOpenWithNoPlacesSaysSo(t *testing.T) {
	_, err := Search{}.Open(CUDA)
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), "no places to search")
	assert.True(t, errors.Is(err, ErrNotFound))
}
