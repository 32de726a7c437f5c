package dl_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/dl/dltest"
)

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
	require.NoError(t, os.WriteFile(to, b, 0o755))
}

func TestOpenLoadsRealLibraryInSearchOrder(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so")
	root := t.TempDir()
	ld := filepath.Join(root, "ld")
	sys := filepath.Join(root, "sys")
	// The folder order wins over the soname order: a .12 in LD_LIBRARY_PATH
	// beats a .13 in a system folder, and inside one folder .13 beats .12.
	copyFile(t, built, filepath.Join(ld, "libnvrtc.so.12"))
	copyFile(t, built, filepath.Join(sys, "libnvrtc.so.13"))
	copyFile(t, built, filepath.Join(sys, "libnvrtc.so.12"))

	s := dl.Search{LibraryPath: []string{ld}, SystemDirs: []string{sys}}
	lib, err := s.Open(dl.NVRTC)
	require.NoError(t, err)
	defer lib.Close()
	assert.Equal(t, filepath.Join(ld, "libnvrtc.so.12"), lib.Path)
	assert.Equal(t, dl.FromLibraryPath, lib.From)

	s = dl.Search{SystemDirs: []string{sys}}
	lib2, err := s.Open(dl.NVRTC)
	require.NoError(t, err)
	defer lib2.Close()
	assert.Equal(t, filepath.Join(sys, "libnvrtc.so.13"), lib2.Path)
}

func TestOpenSkipsAFileThatDoesNotLoad(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so")
	root := t.TempDir()
	ld := filepath.Join(root, "ld")
	sys := filepath.Join(root, "sys")
	require.NoError(t, os.MkdirAll(ld, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ld, "libnccl.so.2"), []byte("truncated"), 0o644))
	copyFile(t, built, filepath.Join(sys, "libnccl.so.2"))

	lib, err := dl.Search{LibraryPath: []string{ld}, SystemDirs: []string{sys}}.Open(dl.NCCL)
	require.NoError(t, err)
	defer lib.Close()
	assert.Equal(t, filepath.Join(sys, "libnccl.so.2"), lib.Path)
}

func TestOverrideLoadsTheGivenFile(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "whatever-name.so")
	s := dl.Search{Getenv: func(k string) string {
		if k == "GCOMPILE_LIBCUDA" {
			return built
		}
		return ""
	}}
	lib, err := s.Open(dl.CUDA)
	require.NoError(t, err)
	defer lib.Close()
	assert.Equal(t, built, lib.Path)
	assert.Equal(t, "GCOMPILE_LIBCUDA", lib.From)
}

func TestBindCallsThroughAndReportsMissingSymbols(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so")
	lib, err := dl.OpenFile("fake", built)
	require.NoError(t, err)
	defer lib.Close()

	var add func(a, b int32) int32
	require.NoError(t, lib.Bind(&add, "fake_add"))
	assert.Equal(t, int32(-7), add(5, -12))

	var affine func(x float64, scale float32, shift int64) float64
	require.NoError(t, lib.Bind(&affine, "fake_affine"))
	assert.Equal(t, 2.5*4+(1<<40), affine(2.5, 4, 1<<40))

	var name func() string
	require.NoError(t, lib.Bind(&name, "fake_name"))
	assert.Equal(t, "fake library", name())

	var missing func() int32
	err = lib.Bind(&missing, "fake_absent")
	require.ErrorIs(t, err, dl.ErrSymbol)
	assert.Contains(t, err.Error(), `"fake_absent"`)
	assert.Contains(t, err.Error(), built)
	assert.Nil(t, missing, "nothing is bound when the symbol is missing")
	assert.False(t, lib.Has("fake_absent"))
	assert.True(t, lib.Has("fake_add"))
}

func TestBindRejectsWhatIsNotAFuncPointer(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so")
	lib, err := dl.OpenFile("fake", built)
	require.NoError(t, err)
	defer lib.Close()

	var notFunc int
	var nilFn *func()
	for _, arg := range []any{nil, notFunc, &notFunc, nilFn} {
		err := lib.Bind(arg, "fake_add")
		require.Error(t, err, "%T", arg)
		assert.Contains(t, err.Error(), "fake_add")
	}
	// A signature purego cannot marshal is an error, not a panic.
	var bad func(m map[string]int) int32
	err = lib.Bind(&bad, "fake_add")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "fake_add")
}

func TestBindAllReportsEveryMissingSymbol(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so", "-DNO_NEW")
	lib, err := dl.OpenFile("fake", built)
	require.NoError(t, err)
	defer lib.Close()

	var add func(a, b int32) int32
	var version func() uint64
	var newer func() uint64
	var gone1, gone2 func() int32
	err = lib.BindAll([]dl.Symbol{
		dl.Sym(&add, "fake_add"),
		dl.FirstOf(&version, "fake_version_v2", "fake_version"),
		dl.Optional(&newer, "fake_version_v2"),
		dl.Sym(&gone1, "fake_gone_one"),
		dl.Sym(&gone2, "fake_gone_two"),
	})
	require.ErrorIs(t, err, dl.ErrSymbol)
	assert.Contains(t, err.Error(), "fake_gone_one")
	assert.Contains(t, err.Error(), "fake_gone_two")
	assert.NotContains(t, err.Error(), "fake_version_v2", "optional and fallback symbols are not errors")
	assert.Equal(t, uint64(42), version(), "fell back to the older name")
	assert.Nil(t, newer)
	assert.Equal(t, int32(3), add(1, 2))
}

func TestFirstOfPrefersTheNewestName(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so")
	lib, err := dl.OpenFile("fake", built)
	require.NoError(t, err)
	defer lib.Close()
	var version func() uint64
	name, err := lib.BindFirst(&version, "fake_version_v2", "fake_version")
	require.NoError(t, err)
	assert.Equal(t, "fake_version_v2", name)
	assert.Equal(t, uint64(43), version())
}

func TestGoStringAndCString(t *testing.T) {
	b := dl.CString("héllo")
	assert.Equal(t, byte(0), b[len(b)-1])
	assert.Equal(t, "héllo", dl.GoString(&b[0]))
	assert.Equal(t, "", dl.GoString(nil))
	empty := dl.CString("")
	assert.Equal(t, "", dl.GoString(&empty[0]))
}

func TestClosedLibraryRefusesLookups(t *testing.T) {
	built := dltest.Build(t, "testdata/fake_sym.c", "libfake.so")
	lib, err := dl.OpenFile("fake", built)
	require.NoError(t, err)
	require.NoError(t, lib.Close())
	require.NoError(t, lib.Close(), "closing twice is harmless")
	_, err = lib.Lookup("fake_add")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not open")
}
