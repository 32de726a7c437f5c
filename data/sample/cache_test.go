package sample

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// indexFiles is the epoch index files in dir, sorted.
func indexFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "gpt-*.idx"))
	require.NoError(t, err)
	slices.Sort(m)
	return m
}

// cachedOnce builds cfg's sampler over lens once, draws every sample of
// epoch 8 and closes it, leaving the one epoch index file it cached: the
// samples, their indices and the file.
func cachedOnce(t *testing.T, lens []int, cfg Config) (want [][]int32, ks []int64, file string) {
	t.Helper()
	g, err := NewGPT(newFake(lens), cfg)
	require.NoError(t, err)
	ks = span64(0, g.SamplesPerEpoch())
	want = draw(t, g, 8, ks)
	require.NoError(t, g.Close())
	files := indexFiles(t, cfg.CacheDir)
	require.Len(t, files, 1)
	return want, ks, files[0]
}

func TestCacheBuiltOnceThenReused(t *testing.T) {
	dir := t.TempDir()
	lens := lengths(200, 1, 50, 3)
	cfg := Config{Seq: 8, Range: [2]int{0, 200}, CacheDir: dir, Identity: "reuse", Shuffle: true}
	g, err := NewGPT(newFake(lens), cfg)
	require.NoError(t, err)
	s := g.SamplesPerEpoch()
	want := draw(t, g, 5, []int64{0, 1, s - 1, 5*s + 3})
	assert.Equal(t, Stats{Built: 3, Dir: dir}, g.Stats(), "the summary, epoch 0 and epoch 5")
	assert.Len(t, indexFiles(t, dir), 2, "only the epochs touched are built")
	assert.Contains(t, indexFiles(t, dir)[1], "gpt-e5-")
	require.NoError(t, g.Close())

	f := newFake(lens)
	g, err = NewGPT(f, cfg)
	require.NoError(t, err)
	defer g.Close()
	assert.Zero(t, f.lenCalls.Load(), "a reused summary reads no document length")
	assert.Equal(t, want, draw(t, g, 5, []int64{0, 1, s - 1, 5*s + 3}))
	assert.Equal(t, Stats{Reused: 3, Dir: dir}, g.Stats())
	// Leftover temporary files would mean a write was not renamed.
	tmp, _ := filepath.Glob(filepath.Join(dir, ".*.tmp"))
	assert.Empty(t, tmp)
}

// TestCacheCorruptRebuilt damages the index file in several ways; each is
// noticed (by the header, the size or a value out of bounds) and rebuilt,
// and the samples stay the same.
func TestCacheCorruptRebuilt(t *testing.T) {
	lens := lengths(100, 1, 30, 4)
	damages := []struct {
		name string
		hurt func(t *testing.T, path string)
	}{
		{"header byte", func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			b[50] ^= 0xff
			require.NoError(t, os.WriteFile(path, b, 0o644))
		}},
		{"truncated", func(t *testing.T, path string) {
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(path, st.Size()-3))
		}},
		{"empty", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, nil, 0o644))
		}},
		{"body out of bounds", func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			for i := headerSize; i < len(b); i++ {
				b[i] = 0xff
			}
			require.NoError(t, os.WriteFile(path, b, 0o644))
		}},
		{"foreign file", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not an index ", 40)), 0o644))
		}},
	}
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Seq: 6, Range: [2]int{0, 100}, CacheDir: dir, Identity: "corrupt", Shuffle: true}
			want, ks, file := cachedOnce(t, lens, cfg)
			d.hurt(t, file)

			g, err := NewGPT(newFake(lens), cfg)
			require.NoError(t, err)
			defer g.Close()
			assert.Equal(t, want, draw(t, g, 8, ks))
			st := g.Stats()
			assert.Equal(t, 1, st.Rebuilt, "%+v", st)
			assert.Equal(t, 1, st.Built)
		})
	}

	// A damaged summary is rebuilt too.
	dir := t.TempDir()
	cfg := Config{Seq: 6, Range: [2]int{0, 100}, CacheDir: dir, Identity: "corrupt", Shuffle: true}
	_, err := NewGPT(newFake(lens), cfg)
	require.NoError(t, err)
	sums, _ := filepath.Glob(filepath.Join(dir, "docs-*.sum"))
	require.Len(t, sums, 1)
	require.NoError(t, os.WriteFile(sums[0], []byte("junk"), 0o644))
	g, err := NewGPT(newFake(lens), cfg)
	require.NoError(t, err)
	assert.Equal(t, Stats{Built: 1, Rebuilt: 1, Dir: dir}, g.Stats())
}

// editIndex rewrites the epoch index at path through edit, which sees the
// file's layout and gets and sets its values by array offset and element.
func editIndex(t *testing.T, path string, edit func(lay epochLayout, get func(off, i int64) uint64, set func(off, i int64, v uint64))) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	h, err := decodeHeader(b)
	require.NoError(t, err)
	lay := layoutOf(int64(h.docs), int64(h.samples), int(h.width), h.flags)
	w := int64(h.width)
	get := func(off, i int64) uint64 {
		if w == 4 {
			return uint64(binary.LittleEndian.Uint32(b[off+4*i:]))
		}
		return binary.LittleEndian.Uint64(b[off+8*i:])
	}
	set := func(off, i int64, v uint64) {
		if w == 4 {
			binary.LittleEndian.PutUint32(b[off+4*i:], uint32(v))
		} else {
			binary.LittleEndian.PutUint64(b[off+8*i:], v)
		}
	}
	edit(lay, get, set)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// sameSamples asserts got == want, naming how many samples differ and the
// first, rather than printing every sample of an epoch.
func sameSamples(t *testing.T, want, got [][]int32) {
	t.Helper()
	require.Len(t, got, len(want))
	var bad []int
	for k := range want {
		if !slices.Equal(want[k], got[k]) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d samples differ from a fresh build's; sample %d is %v, want %v", len(bad), len(want), bad[0], got[bad[0]], want[bad[0]])
	}
}

// TestCacheInRangeDamageRebuilt damages a cached epoch index so that every
// value stays within the dataset's bounds, which no lookup can notice: the
// body's checksum must, and the next GPT rebuilds the file and draws the
// samples a fresh build draws.
func TestCacheInRangeDamageRebuilt(t *testing.T) {
	lens := lengths(100, 1, 30, 4)
	damages := []struct {
		name string
		hurt func(lay epochLayout, get func(off, i int64) uint64, set func(off, i int64, v uint64))
	}{
		{"window order entry copied from the next", func(lay epochLayout, get func(off, i int64) uint64, set func(off, i int64, v uint64)) {
			set(lay.shuffle, 0, get(lay.shuffle, 1))
		}},
		{"window start moved back 3 tokens", func(lay epochLayout, get func(off, i int64) uint64, set func(off, i int64, v uint64)) {
			for j := int64(0); ; j++ {
				if off := get(lay.starts, 2*j+1); off >= 3 {
					set(lay.starts, 2*j+1, off-3)
					return
				}
			}
		}},
		{"document order entry duplicated", func(lay epochLayout, get func(off, i int64) uint64, set func(off, i int64, v uint64)) {
			set(lay.order, 0, get(lay.order, 1))
		}},
	}
	fresh := func(t *testing.T, cfg Config) [][]int32 {
		cfg.CacheDir = t.TempDir()
		g, err := NewGPT(newFake(lens), cfg)
		require.NoError(t, err)
		defer g.Close()
		return draw(t, g, 8, span64(0, g.SamplesPerEpoch()))
	}
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Seq: 6, Range: [2]int{0, 100}, CacheDir: dir, Identity: "in range", Shuffle: true}
			_, ks, file := cachedOnce(t, lens, cfg)
			editIndex(t, file, d.hurt)

			g, err := NewGPT(newFake(lens), cfg)
			require.NoError(t, err)
			defer g.Close()
			sameSamples(t, fresh(t, cfg), draw(t, g, 8, ks))
			assert.Equal(t, Stats{Built: 1, Reused: 1, Rebuilt: 1, Dir: dir}, g.Stats(), "the summary reused, the epoch rebuilt")
		})
	}
}

// TestCacheVersion1Rebuilt puts a file in the layout of format version 1
// (no body checksum; the header's CRC-32 at byte 104) where an epoch index
// is looked for: it is rebuilt once, then reused.
func TestCacheVersion1Rebuilt(t *testing.T) {
	lens := lengths(100, 1, 30, 4)
	dir := t.TempDir()
	cfg := Config{Seq: 6, Range: [2]int{0, 100}, CacheDir: dir, Identity: "v1", Shuffle: true}
	want, ks, file := cachedOnce(t, lens, cfg)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	binary.LittleEndian.PutUint32(b[8:], 1)
	binary.LittleEndian.PutUint32(b[104:], crc32.ChecksumIEEE(b[:104]))
	binary.LittleEndian.PutUint32(b[108:], 0)
	require.NoError(t, os.WriteFile(file, b, 0o644))

	for _, st := range []Stats{{Built: 1, Reused: 1, Rebuilt: 1, Dir: dir}, {Reused: 2, Dir: dir}} {
		g, err := NewGPT(newFake(lens), cfg)
		require.NoError(t, err)
		assert.Equal(t, want, draw(t, g, 8, ks))
		assert.Equal(t, st, g.Stats())
		require.NoError(t, g.Close())
	}
}

// TestCacheKeys checks that every input of an index gets its own file.
func TestCacheKeys(t *testing.T) {
	dir := t.TempDir()
	lens := lengths(80, 1, 20, 5)
	base := Config{Seq: 4, Range: [2]int{0, 70}, CacheDir: dir, Identity: "keys", Shuffle: true}
	variants := []struct {
		name string
		cfg  Config
		seed int64
	}{
		{"base", base, 1},
		{"seed", base, 2},
		{"seq", func() Config { c := base; c.Seq = 5; return c }(), 1},
		{"range", func() Config { c := base; c.Range = [2]int{70, 80}; return c }(), 1},
		{"identity", func() Config { c := base; c.Identity = "other"; return c }(), 1},
		{"unshuffled", func() Config { c := base; c.Shuffle = false; return c }(), 1},
	}
	seen := map[string]string{}
	for _, v := range variants {
		g, err := NewGPT(newFake(lens), v.cfg)
		require.NoError(t, err)
		before := indexFiles(t, dir)
		require.NoError(t, g.Sample(v.seed, 0, make([]int32, v.cfg.Seq+1)))
		after := indexFiles(t, dir)
		require.Len(t, after, len(before)+1, "%s makes a new file", v.name)
		for _, f := range after {
			if !slices.Contains(before, f) {
				assert.NotContains(t, seen, f)
				seen[f] = v.name
			}
		}
		require.NoError(t, g.Close())
	}
}

// TestFirstLookupIndependentOfDocs checks that a run reusing its index does
// work independent of the dataset's size before its first sample: the
// same handful of length reads and token reads for 10^4 as for 10^6
// documents.
func TestFirstLookupIndependentOfDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an index of a million documents")
	}
	for _, docs := range []int{10_000, 1_000_000} {
		dir := t.TempDir()
		lens := lengths(docs, 1, 600, 6)
		cfg := Config{Seq: 1024, Range: [2]int{0, docs}, CacheDir: dir, Identity: "big", Shuffle: true}
		g, err := NewGPT(newFake(lens), cfg)
		require.NoError(t, err)
		require.NoError(t, g.Sample(1, 0, make([]int32, 1025)))
		require.NoError(t, g.Close())

		f := newFake(lens)
		g, err = NewGPT(f, cfg)
		require.NoError(t, err)
		require.Equal(t, int64(0), g.Epoch(777))
		require.NoError(t, g.Sample(1, 777, make([]int32, 1025)))
		assert.Equal(t, Stats{Reused: 2, Dir: dir}, g.Stats())
		require.NoError(t, g.Close())
		t.Logf("%d documents: first lookup on a reused index read %d lengths and made %d token reads", docs, f.lenCalls.Load(), f.reads.Load())
		assert.Less(t, f.lenCalls.Load(), int64(30))
	}
}

func TestDefaultCacheDir(t *testing.T) {
	root := t.TempDir()
	prefix := filepath.Join(root, "data", "corpus_text_document")
	require.NoError(t, os.MkdirAll(filepath.Dir(prefix), 0o755))
	assert.Equal(t, filepath.Join(root, "data", "gcompile-index"), DefaultCacheDir(prefix))
	_, err := os.Stat(filepath.Join(root, "data", "gcompile-index"))
	assert.True(t, os.IsNotExist(err), "finding the folder does not create it")
	entries, err := os.ReadDir(filepath.Join(root, "data"))
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe file is removed")

	// Data under a path that cannot be a folder falls back to the user's
	// cache folder.
	cache := filepath.Join(root, "home-cache")
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("HOME", root)
	file := filepath.Join(root, "afile")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	assert.Equal(t, filepath.Join(cache, "gcompile", "index"), DefaultCacheDir(filepath.Join(file, "corpus")))

	if os.Geteuid() == 0 {
		t.Skip("root writes into read-only folders")
	}
	ro := filepath.Join(root, "ro")
	require.NoError(t, os.MkdirAll(ro, 0o755))
	require.NoError(t, os.Chmod(ro, 0o555))
	t.Cleanup(func() { _ = os.Chmod(ro, 0o755) })
	assert.Equal(t, filepath.Join(cache, "gcompile", "index"), DefaultCacheDir(filepath.Join(ro, "corpus")))
}

// An index built beside a dataset its users cannot write is read from
// there (Config.ReadDirs, SharedCacheDirs) rather than built again in
// each user's cache: the same samples, nothing built, nothing written.
func TestSharedIndexIsReadNotRebuilt(t *testing.T) {
	root := t.TempDir()
	prefix := filepath.Join(root, "data", "corpus")
	beside := filepath.Join(root, "data", "gcompile-index")
	require.NoError(t, os.MkdirAll(beside, 0o755))
	lens := lengths(200, 1, 50, 3)
	cfg := Config{Seq: 8, Range: [2]int{0, 200}, CacheDir: beside, Identity: "shared", Shuffle: true}
	want, ks, _ := cachedOnce(t, lens, cfg)

	own := filepath.Join(root, "user-cache")
	assert.Equal(t, []string{beside}, SharedCacheDirs(prefix, own))
	assert.Empty(t, SharedCacheDirs(prefix, beside), "the folder itself is no other folder")
	assert.Empty(t, SharedCacheDirs(filepath.Join(root, "elsewhere", "corpus"), own), "none beside that data")
	cfg.CacheDir, cfg.ReadDirs = own, SharedCacheDirs(prefix, own)
	g, err := NewGPT(newFake(lens), cfg)
	require.NoError(t, err)
	defer g.Close()
	assert.Equal(t, want, draw(t, g, 8, ks))
	assert.Equal(t, Stats{Reused: 2, Dir: own}, g.Stats(), "the summary and epoch 8, both read beside the data")
	_, err = os.Stat(own)
	assert.True(t, os.IsNotExist(err), "nothing built in the user's cache")
}

// Two processes of a job that need the same missing epoch index build it
// once: the second waits for the first's build (a lock beside the file)
// and maps the file it wrote, rather than building its own copy at the
// same time. Two GPTs in one process stand in for them (flock locks each
// open of the file apart). The lock file is gone afterwards.
func TestConcurrentBuildersBuildOnce(t *testing.T) {
	dir := t.TempDir()
	lens := lengths(3000, 1, 50, 5)
	cfg := Config{Seq: 8, Range: [2]int{0, 3000}, CacheDir: dir, Identity: "together", Shuffle: true}
	first, second := newFake(lens), newFake(lens)
	g1, err := NewGPT(first, cfg)
	require.NoError(t, err)
	defer g1.Close()
	g2, err := NewGPT(second, cfg)
	require.NoError(t, err)
	defer g2.Close()
	// The first builder stops at its first document until the second has
	// had time to look for the file and queue behind the lock.
	building := make(chan struct{})
	var once sync.Once
	first.pause = func() {
		once.Do(func() {
			close(building)
			time.Sleep(300 * time.Millisecond)
		})
	}
	ks := []int64{0, 7, g1.SamplesPerEpoch() - 1}
	var want [][]int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		want = draw(t, g1, 4, ks)
	}()
	<-building
	got := draw(t, g2, 4, ks)
	<-done
	assert.Equal(t, want, got)
	assert.Equal(t, Stats{Built: 2, Dir: dir}, g1.Stats(), "the summary and the epoch")
	assert.Equal(t, Stats{Reused: 2, Dir: dir}, g2.Stats(), "the summary, and the epoch the first built")
	assert.Len(t, indexFiles(t, dir), 1)
	locks, _ := filepath.Glob(filepath.Join(dir, ".*.lock"))
	assert.Empty(t, locks)
}
