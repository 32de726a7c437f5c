package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data"
)

// naiveEpoch is epoch e's samples by definition: the range's documents in
// the epoch's order concatenated into one stream, cut into windows of
// seq+1 tokens at multiples of seq, visited in the epoch's window order.
func naiveEpoch(f *fakeTokens, lo, hi, seq int, shuf bool, seed, epoch int64) [][]int32 {
	order := identity[uint64](int64(hi - lo))
	if shuf {
		shuffle(order, stream(seed, epoch, streamDocs))
	}
	var all []int32
	for _, d := range order {
		doc := lo + int(d)
		for off := range f.lens[doc] {
			all = append(all, tokenAt(doc, off))
		}
	}
	n := (len(all) - 1) / seq
	win := identity[uint64](int64(n))
	if shuf {
		shuffle(win, stream(seed, epoch, streamSamples))
	}
	out := make([][]int32, n)
	for i, j := range win {
		out[i] = all[int(j)*seq : int(j)*seq+seq+1]
	}
	return out
}

// draw is samples [from, to) of g.
func draw(t *testing.T, g *GPT, seed int64, ks []int64) [][]int32 {
	t.Helper()
	out := make([][]int32, len(ks))
	for i, k := range ks {
		dst := make([]int32, g.Seq()+1)
		require.NoError(t, g.Sample(seed, k, dst), "sample %d", k)
		out[i] = dst
	}
	return out
}

func span64(from, to int64) []int64 {
	var ks []int64
	for k := from; k < to; k++ {
		ks = append(ks, k)
	}
	return ks
}

// TestGPTMatchesNaive checks packing across document boundaries, epoch
// boundaries and both orders against the naive reference, with and without
// a cache folder.
func TestGPTMatchesNaive(t *testing.T) {
	tests := []struct {
		name  string
		lens  []int
		rng   [2]int
		seq   int
		shuf  bool
		seeds []int64
	}{
		{"short docs", []int{3, 0, 5, 1, 7, 2, 0, 4, 9, 1}, [2]int{0, 10}, 4, true, []int64{1, -5}},
		{"one-token docs", slices.Repeat([]int{1}, 40), [2]int{0, 40}, 3, true, []int64{2}},
		{"long docs", []int{50, 70, 33}, [2]int{0, 3}, 8, true, []int64{3}},
		{"seq 1", []int{4, 3, 2, 1}, [2]int{0, 4}, 1, true, []int64{4}},
		{"sub-range", lengths(60, 0, 12, 1), [2]int{17, 49}, 5, true, []int64{5, 6}},
		{"unshuffled", lengths(30, 0, 9, 2), [2]int{3, 30}, 4, false, []int64{0, 99}},
		{"whole stream one window", []int{2, 2, 1}, [2]int{0, 3}, 4, true, []int64{7}},
	}
	for _, tc := range tests {
		for _, cached := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/cached=%t", tc.name, cached), func(t *testing.T) {
				f := newFake(tc.lens)
				cfg := Config{Seq: tc.seq, Range: tc.rng, Shuffle: tc.shuf}
				if cached {
					cfg.CacheDir = t.TempDir()
					cfg.Identity = "fake:" + tc.name
				}
				g, err := NewGPT(f, cfg)
				require.NoError(t, err)
				defer g.Close()
				for _, seed := range tc.seeds {
					s := g.SamplesPerEpoch()
					for e := range int64(5) {
						want := naiveEpoch(f, tc.rng[0], tc.rng[1], tc.seq, tc.shuf, seed, e)
						require.Len(t, want, int(s))
						got := draw(t, g, seed, span64(e*s, (e+1)*s))
						require.Equal(t, want, got, "seed %d epoch %d", seed, e)
						assert.Equal(t, e, g.Epoch(e*s))
					}
				}
			})
		}
	}
}

// TestGPTEpochCoverage draws many epochs of a tiny split: within an epoch
// every sample is a distinct window, the windows cover the epoch's stream
// but for a tail shorter than seq, and epochs differ in order.
func TestGPTEpochCoverage(t *testing.T) {
	f := newFake([]int{5, 1, 0, 8, 3, 6, 2, 9})
	total := 34
	const seq = 4
	g, err := NewGPT(f, Config{Seq: seq, Range: [2]int{0, 8}, CacheDir: t.TempDir(), Identity: "tiny", Shuffle: true})
	require.NoError(t, err)
	defer g.Close()
	s := g.SamplesPerEpoch()
	require.EqualValues(t, (total-1)/seq, s)
	orders := map[string]bool{}
	for e := range int64(30) {
		got := draw(t, g, 11, span64(e*s, (e+1)*s))
		firsts := map[int32]bool{}
		covered := map[int32]bool{}
		for _, w := range got {
			require.False(t, firsts[w[0]], "epoch %d repeats a window", e)
			firsts[w[0]] = true
			for _, tok := range w {
				covered[tok] = true
			}
		}
		assert.Len(t, covered, int(s)*seq+1, "epoch %d covers all but the last %d tokens", e, total-int(s)*seq-1)
		assert.Less(t, total-len(covered), seq)
		orders[fmt.Sprint(got)] = true
	}
	assert.Greater(t, len(orders), 25, "epochs are shuffled differently")
}

// TestGPTDeterminism checks that a sample depends on nothing but its
// number: fresh objects, the cache, the order of access and concurrent
// builders of the same files all give the same tokens.
func TestGPTDeterminism(t *testing.T) {
	lens := lengths(300, 0, 40, 9)
	cfg := Config{Seq: 16, Range: [2]int{0, 300}, CacheDir: t.TempDir(), Identity: "det", Shuffle: true}
	open := func() *GPT {
		g, err := NewGPT(newFake(lens), cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	first := open()
	s := first.SamplesPerEpoch()
	ks := span64(0, 3*s+7)
	want := draw(t, first, 42, ks)

	// A fresh object in memory only, reading backwards.
	mem, err := NewGPT(newFake(lens), Config{Seq: 16, Range: cfg.Range, Shuffle: true})
	require.NoError(t, err)
	rev := slices.Clone(ks)
	slices.Reverse(rev)
	got := draw(t, mem, 42, rev)
	slices.Reverse(got)
	assert.Equal(t, want, got, "in memory, backwards")

	// A fresh object on the cache, at random.
	again := open()
	perm := rand.New(rand.NewPCG(1, 2)).Perm(len(ks))
	for _, i := range perm {
		dst := make([]int32, 17)
		require.NoError(t, again.Sample(42, ks[i], dst))
		require.Equal(t, want[i], dst, "sample %d from the cache", ks[i])
	}
	assert.Zero(t, again.Stats().Built, "the second object only reuses")

	// One object shared by goroutines, crossing epochs (and so mapping and
	// evicting indexes) at once.
	var shared sync.WaitGroup
	bad := make(chan string, 8)
	for w := range 4 {
		shared.Add(1)
		go func() {
			defer shared.Done()
			dst := make([]int32, 17)
			for i := w; i < len(ks); i += 4 {
				if err := again.Sample(42, ks[i], dst); err != nil || !slices.Equal(dst, want[i]) {
					bad <- fmt.Sprintf("sample %d: %v", ks[i], err)
					return
				}
			}
		}()
	}
	shared.Wait()
	close(bad)
	for msg := range bad {
		t.Error(msg)
	}

	// Another seed changes the samples.
	other := draw(t, again, 43, ks[:s])
	assert.NotEqual(t, want[:s], other)

	// Several builders of the same epochs at once, as the processes of a
	// job would be: all agree, none fails.
	cfg.CacheDir = t.TempDir()
	var wg sync.WaitGroup
	results := make([][][]int32, 4)
	errs := make([]error, 4)
	for w := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := NewGPT(newFake(lens), cfg)
			if err != nil {
				errs[w] = err
				return
			}
			defer g.Close()
			for _, k := range ks {
				dst := make([]int32, 17)
				if err := g.Sample(42, k, dst); err != nil {
					errs[w] = err
					return
				}
				results[w] = append(results[w], dst)
			}
		}()
	}
	wg.Wait()
	for w := range results {
		require.NoError(t, errs[w])
		assert.Equal(t, want, results[w], "builder %d", w)
	}
}

// TestGPTUnshuffled checks the held-out form: windows in document order,
// the same for every seed.
func TestGPTUnshuffled(t *testing.T) {
	f := newFake([]int{3, 4, 5, 6})
	g, err := NewGPT(f, Config{Seq: 2, Range: [2]int{1, 4}, CacheDir: t.TempDir(), Identity: "eval"})
	require.NoError(t, err)
	defer g.Close()
	require.EqualValues(t, 7, g.SamplesPerEpoch())
	a := draw(t, g, 1, span64(0, 14))
	b := draw(t, g, 2, span64(0, 14))
	assert.Equal(t, a, b)
	assert.Equal(t, []int32{tokenAt(1, 0), tokenAt(1, 1), tokenAt(1, 2)}, a[0])
	assert.Equal(t, []int32{tokenAt(1, 2), tokenAt(1, 3), tokenAt(2, 0)}, a[1])
	assert.Equal(t, a[:7], a[7:], "every pass is the same")
	assert.Equal(t, 2, g.Stats().Built, "one epoch file serves every pass (beside the summary)")
}

func TestGPTErrors(t *testing.T) {
	f := newFake([]int{3, 4, 5})
	tests := []struct {
		name string
		tok  Tokens
		cfg  Config
		err  error
	}{
		{"no tokens", nil, Config{Seq: 2, Range: [2]int{0, 3}}, ErrDataset},
		{"seq zero", f, Config{Seq: 0, Range: [2]int{0, 3}}, ErrSeq},
		{"seq negative", f, Config{Seq: -4, Range: [2]int{0, 3}}, ErrSeq},
		{"seq huge", f, Config{Seq: math.MaxInt, Range: [2]int{0, 3}}, ErrSeq},
		{"range reversed", f, Config{Seq: 2, Range: [2]int{2, 1}}, ErrRange},
		{"range past end", f, Config{Seq: 2, Range: [2]int{0, 4}}, ErrRange},
		{"range negative", f, Config{Seq: 2, Range: [2]int{-1, 2}}, ErrRange},
		{"too small", f, Config{Seq: 12, Range: [2]int{0, 3}}, ErrTooSmall},
		{"empty range", f, Config{Seq: 1, Range: [2]int{2, 2}}, ErrTooSmall},
		{"negative length", newFake([]int{3, -1}), Config{Seq: 1, Range: [2]int{0, 2}}, ErrDataset},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewGPT(tc.tok, tc.cfg)
			require.ErrorIs(t, err, tc.err)
			if tc.err == ErrTooSmall {
				assert.ErrorIs(t, err, data.ErrTooSmall)
				assert.Contains(t, err.Error(), "fewer than seq+1")
			}
		})
	}
	// The same refusals through the cache path.
	_, err := NewGPT(f, Config{Seq: 12, Range: [2]int{0, 3}, CacheDir: t.TempDir(), Identity: "x"})
	assert.ErrorIs(t, err, ErrTooSmall)

	g, err := NewGPT(f, Config{Seq: 4, Range: [2]int{0, 3}, Shuffle: true})
	require.NoError(t, err)
	assert.ErrorIs(t, g.Sample(1, 0, make([]int32, 4)), ErrDst)
	assert.ErrorIs(t, g.Sample(1, -1, make([]int32, 5)), ErrSampleNumber)
	require.NoError(t, g.Sample(1, math.MaxInt64, make([]int32, 5)), "any k has a sample")

	f.failDoc = 1
	var failed error
	for k := range int64(6) {
		if err := g.Sample(1, k, make([]int32, 5)); err != nil {
			failed = err
			break
		}
	}
	require.Error(t, failed)
	assert.Contains(t, failed.Error(), "of document 1:")
	assert.Contains(t, failed.Error(), "disk on fire")

	var nilG *GPT
	assert.Error(t, nilG.Sample(0, 0, nil))
	assert.Zero(t, nilG.SamplesPerEpoch())
}

// TestGPTDatasetChanged checks that a dataset whose lengths change under an
// unchanged Identity is reported, not read out of bounds.
func TestGPTDatasetChanged(t *testing.T) {
	dir := t.TempDir()
	lens := []int{10, 10, 10, 10}
	cfg := Config{Seq: 4, Range: [2]int{0, 4}, CacheDir: dir, Identity: "same", Shuffle: true}
	g, err := NewGPT(newFake(lens), cfg)
	require.NoError(t, err)
	require.NoError(t, g.Sample(1, 0, make([]int32, 5)))
	require.NoError(t, g.Close())

	shrunk := newFake([]int{10, 2, 10, 1})
	g, err = NewGPT(shrunk, cfg)
	require.NoError(t, err, "the cached summary is trusted by Identity")
	var bad error
	for k := range g.SamplesPerEpoch() {
		if err = g.Sample(1, k, make([]int32, 5)); err != nil {
			bad = err
			break
		}
	}
	require.Error(t, bad)
	assert.True(t, errors.Is(bad, ErrCorrupt), "%v", bad)
}

// offsetTokens is a Tokens whose token is its offset in its document:
// documents of billions of tokens cost nothing.
type offsetTokens []int

func (o offsetTokens) NumSequences() int     { return len(o) }
func (o offsetTokens) SequenceLen(i int) int { return o[i] }
func (o offsetTokens) Read(doc, off int, dst []int32) error {
	if off < 0 || off+len(dst) > o[doc] {
		return fmt.Errorf("read of %d tokens at %d of document %d, which has %d", len(dst), off, doc, o[doc])
	}
	for i := range dst {
		dst[i] = int32(off + i)
	}
	return nil
}

// TestGPTPastFourBillionTokens cuts samples from a split of more than
// 2^32 tokens (two documents of the longest length an .idx holds), where
// a 32-bit position anywhere would wrap: in order, sample k starts at
// token k·seq of the documents laid end to end; shuffled, every sample
// is still seq+1 consecutive tokens, across a document's end too.
func TestGPTPastFourBillionTokens(t *testing.T) {
	docs := offsetTokens{math.MaxInt32, math.MaxInt32, 12345}
	const seq = 1 << 20
	for _, shuffle := range []bool{false, true} {
		g, err := NewGPT(docs, Config{Seq: seq, Range: [2]int{0, len(docs)}, CacheDir: t.TempDir(), Identity: "huge", Shuffle: shuffle})
		require.NoError(t, err)
		defer g.Close()
		n := g.SamplesPerEpoch()
		require.Equal(t, (2*int64(math.MaxInt32)+12345-1)/seq, n)
		dst := make([]int32, seq+1)
		for _, k := range []int64{0, 2047, 2048, 4095, 4096, n - 1, n, 2*n + 1} {
			require.NoError(t, g.Sample(7, k, dst), "sample %d", k)
			if !shuffle {
				at := k % n * seq
				doc := 0
				for ; at >= int64(docs[doc]); doc++ {
					at -= int64(docs[doc])
				}
				require.Equal(t, int32(at), dst[0], "sample %d", k)
			}
			for i := 1; i < len(dst); i++ {
				if dst[i] != dst[i-1]+1 && !(dst[i] == 0 && slices.Contains(docs, int(dst[i-1])+1)) {
					t.Fatalf("shuffle %v, sample %d: token %d is %d after %d", shuffle, k, i, dst[i], dst[i-1])
				}
			}
		}
	}
}
