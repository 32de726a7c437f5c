package nvrtc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingCompiler stands in for NVRTC: its output names its inputs, and it
// counts calls so the tests can tell hits from misses.
type countingCompiler struct {
	mu           sync.Mutex
	calls        int
	lastOptions  []string
	major, minor int
	fail         error
}

func (c *countingCompiler) Compile(src, name string, options []string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.lastOptions = append([]string(nil), options...)
	if c.fail != nil {
		return nil, c.fail
	}
	return []byte(fmt.Sprintf("CUBIN(%s|%s|%s)\x00\xff", name, strings.Join(options, ","), src)), nil
}

func (c *countingCompiler) Version() (int, int, error) { return c.major, c.minor, nil }

func (c *countingCompiler) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func newCache(t *testing.T) (*Cache, *countingCompiler) {
	cc := &countingCompiler{major: 12, minor: 8}
	return &Cache{Dir: filepath.Join(t.TempDir(), "cubin"), Compiler: cc, DriverVersion: 12080}, cc
}

var baseReq = Request{
	Name:    "gelu.cu",
	Source:  `extern "C" __global__ void gelu(float *x, int n) {}`,
	Arch:    "sm_90",
	Options: []string{"-default-device", "--std=c++17"},
}

func TestCacheHitDoesNotCompile(t *testing.T) {
	c, cc := newCache(t)
	first, err := c.Compile(baseReq)
	require.NoError(t, err)
	require.Equal(t, 1, cc.count())
	assert.Equal(t, []string{"--gpu-architecture=sm_90", "-default-device", "--std=c++17"}, cc.lastOptions)

	second, err := c.Compile(baseReq)
	require.NoError(t, err)
	assert.Equal(t, 1, cc.count(), "second compile must be a hit")
	assert.Equal(t, first, second)

	// A new Cache over the same folder (a later run) hits too.
	c2 := &Cache{Dir: c.Dir, Compiler: cc, DriverVersion: 12080}
	third, err := c2.Compile(baseReq)
	require.NoError(t, err)
	assert.Equal(t, 1, cc.count())
	assert.Equal(t, first, third)
}

func TestEveryInputChangesTheKey(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *Request, c *Cache, cc *countingCompiler)
	}{
		{"source", func(r *Request, _ *Cache, _ *countingCompiler) { r.Source += " " }},
		{"name", func(r *Request, _ *Cache, _ *countingCompiler) { r.Name = "gelu2.cu" }},
		{"arch", func(r *Request, _ *Cache, _ *countingCompiler) { r.Arch = "sm_80" }},
		{"option value", func(r *Request, _ *Cache, _ *countingCompiler) {
			r.Options = []string{"-default-device", "--std=c++20"}
		}},
		{"option order", func(r *Request, _ *Cache, _ *countingCompiler) {
			r.Options = []string{"--std=c++17", "-default-device"}
		}},
		{"options joined", func(r *Request, _ *Cache, _ *countingCompiler) { r.Options = []string{"-default-device --std=c++17"} }},
		{"no options", func(r *Request, _ *Cache, _ *countingCompiler) { r.Options = nil }},
		{"nvrtc version", func(_ *Request, _ *Cache, cc *countingCompiler) { cc.minor = 9 }},
		{"driver version", func(_ *Request, c *Cache, _ *countingCompiler) { c.DriverVersion = 13000 }},
	}
	c0, _ := newCache(t)
	baseKey, err := c0.Key(baseReq)
	require.NoError(t, err)
	again, err := c0.Key(baseReq)
	require.NoError(t, err)
	require.Equal(t, baseKey, again, "the key is deterministic")
	require.Len(t, baseKey, 64)

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, cc := newCache(t)
			req := baseReq
			req.Options = append([]string(nil), baseReq.Options...)
			_, err := c.Compile(req)
			require.NoError(t, err)
			tt.mutate(&req, c, cc)
			key, err := c.Key(req)
			require.NoError(t, err)
			assert.NotEqual(t, baseKey, key)
			_, err = c.Compile(req)
			require.NoError(t, err)
			assert.Equal(t, 2, cc.count(), "a changed input must compile again")
		})
	}
}

func TestDamagedEntriesAreRecompiled(t *testing.T) {
	tests := []struct {
		name   string
		damage func(b []byte) []byte
	}{
		{"flipped byte", func(b []byte) []byte { b[len(b)-3] ^= 0x40; return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }},
		{"empty", func([]byte) []byte { return nil }},
		{"wrong magic", func(b []byte) []byte { b[0] = 'X'; return b }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, cc := newCache(t)
			good, err := c.Compile(baseReq)
			require.NoError(t, err)
			path, err := c.Path(baseReq)
			require.NoError(t, err)
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, tt.damage(b), 0o644))

			got, err := c.Compile(baseReq)
			require.NoError(t, err)
			assert.Equal(t, good, got)
			assert.Equal(t, 2, cc.count(), "damaged entry must not be used")

			_, err = c.Compile(baseReq)
			require.NoError(t, err)
			assert.Equal(t, 2, cc.count(), "the rewritten entry is a hit")
		})
	}
}

func TestWritesLeaveNoTemporaryFiles(t *testing.T) {
	c, _ := newCache(t)
	var wg sync.WaitGroup
	results := make([][]byte, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := baseReq
			req.Source = fmt.Sprintf("%s // variant %d", baseReq.Source, i%3)
			results[i], errs[i] = c.Compile(req)
		}()
	}
	wg.Wait()
	for i := range results {
		require.NoError(t, errs[i])
		assert.Contains(t, string(results[i]), fmt.Sprintf("variant %d", i%3))
	}
	entries, err := os.ReadDir(c.Dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		assert.True(t, strings.HasSuffix(e.Name(), ".cubin"), "leftover %s", e.Name())
	}
	assert.Len(t, names, 3)
}

func TestCompileFailureIsNotCached(t *testing.T) {
	c, cc := newCache(t)
	cc.fail = &CompileError{Name: "gelu.cu", Log: "gelu.cu(1): error: expected a ;", Err: ErrorCompilation}
	_, err := c.Compile(baseReq)
	require.ErrorIs(t, err, ErrorCompilation)
	assert.Contains(t, err.Error(), "expected a ;")
	cc.fail = nil
	_, err = c.Compile(baseReq)
	require.NoError(t, err)
	assert.Equal(t, 2, cc.count())
}

func TestUnwritableCacheFolder(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-folder")
	require.NoError(t, os.WriteFile(file, nil, 0o644))

	cc := &countingCompiler{major: 12, minor: 8}
	c := &Cache{Dir: file, Compiler: cc}
	_, err := c.Compile(baseReq)
	require.Error(t, err)
	assert.Contains(t, err.Error(), CacheEnv)
	assert.Contains(t, err.Error(), file)

	var reported []error
	c.OnWriteError = func(err error) { reported = append(reported, err) }
	cubin, err := c.Compile(baseReq)
	require.NoError(t, err)
	assert.Contains(t, string(cubin), "CUBIN(gelu.cu")
	require.Len(t, reported, 1)
	assert.Contains(t, reported[0].Error(), file)
}

func TestRequestsNeedARealArchitecture(t *testing.T) {
	c, cc := newCache(t)
	for _, arch := range []string{"", "compute_90", "sm90", "90", "sm_90 -G"} {
		req := baseReq
		req.Arch = arch
		_, err := c.Compile(req)
		require.Error(t, err, "arch %q", arch)
		assert.Contains(t, err.Error(), "architecture")
	}
	assert.Equal(t, 0, cc.count())
	for _, arch := range []string{"sm_80", "sm_90a", "sm_100f", "sm_120"} {
		req := baseReq
		req.Arch = arch
		_, err := c.Compile(req)
		require.NoError(t, err, "arch %q", arch)
	}
}

func TestCacheNeedsAFolderAndACompiler(t *testing.T) {
	_, err := (&Cache{Compiler: &countingCompiler{}}).Compile(baseReq)
	require.Error(t, err)
	_, err = (&Cache{Dir: t.TempDir()}).Compile(baseReq)
	require.Error(t, err)
}

func TestDefaultDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(CacheEnv, dir)
	got, err := DefaultDir()
	require.NoError(t, err)
	assert.Equal(t, dir, got)

	t.Setenv(CacheEnv, "")
	xdg := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", xdg)
	got, err = DefaultDir()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(xdg, "gcompile", "cubin"), got)

	c, err := NewCache(&countingCompiler{}, 12080)
	require.NoError(t, err)
	assert.Equal(t, got, c.Dir)
}

func TestCompileErrorWrapsTheStatus(t *testing.T) {
	ce := &CompileError{Name: "x.cu", Options: []string{"-a"}, Log: "x.cu(2): error: bad\n\n", Err: &Error{Func: "nvrtcCompileProgram", Code: ErrorCompilation, Msg: "NVRTC_ERROR_COMPILATION"}}
	var e *Error
	require.True(t, errors.As(ce, &e))
	assert.True(t, errors.Is(ce, ErrorCompilation))
	assert.Equal(t, "nvrtc: compiling x.cu with -a: nvrtcCompileProgram: NVRTC_ERROR_COMPILATION\nx.cu(2): error: bad", ce.Error())
	assert.False(t, IsCompileError(errors.New("other")))
}
