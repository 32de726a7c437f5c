package sample

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
)

// Tokens is the token store the samples are cut from: one sequence per
// document, as Megatron's indexed dataset holds them. It is an interface so
// that the .bin/.idx reader, or a fake in tests, can stand behind it.
type Tokens interface {
	// NumSequences is the number of documents.
	NumSequences() int
	// SequenceLen is the number of tokens of document i.
	SequenceLen(i int) int
	// Read fills dst with tokens [offset, offset+len(dst)) of document seq.
	Read(seq, offset int, dst []int32) error
}

// Config says which samples a GPT draws; every field but CacheDir enters
// the index's cache key, so changing any of them never reuses a stale
// index.
type Config struct {
	// Seq is the model's sequence length: samples are Seq+1 tokens.
	Seq int
	// Range is the split's documents [Range[0], Range[1]), as SplitRanges
	// gives them.
	Range [2]int
	// CacheDir is the folder of the index files (DefaultCacheDir gives the
	// usual one). "" keeps every index in memory and writes nothing, for
	// small data or read-only machines: each process then builds the
	// epochs it touches, and memory grows with the split.
	CacheDir string
	// ReadDirs are folders searched for a matching index file before
	// CacheDir, never written (SharedCacheDirs: an index built beside a
	// read-only dataset).
	ReadDirs []string
	// Identity fingerprints the dataset, so an index built for other data
	// is never reused; it must change whenever the documents do. "" makes
	// NewGPT hash the lengths of the range's documents instead, which
	// reads every length once per process.
	Identity string
	// Shuffle draws documents and windows in a per-epoch order from the
	// seed, for training. Without it windows come in document order and
	// the seed is ignored, as a held-out split wants.
	Shuffle bool
}

// Stats says what NewGPT and the lookups so far did with the cache, for the
// log line that tells a user whether a run paid for building the index.
// The counts cover both kinds of file: the range's token count (one per range)
// and the epochs' indexes (one per epoch touched).
type Stats struct {
	// Built counts index files built by this GPT (in memory when Dir is
	// ""), including rebuilt ones.
	Built int
	// Reused counts index files found in the cache and used as they were.
	Reused int
	// Rebuilt counts files found corrupt, truncated or foreign and built
	// again.
	Rebuilt int
	// Dir is the cache folder, "" for memory only.
	Dir string
}

// maxOpen is how many epoch indexes a GPT keeps mapped: lookups of a run
// move through epochs in order, so a few cover the boundaries between
// them, and a run of many epochs over a small split does not run into the
// kernel's limit on mappings.
const maxOpen = 4

// maxTokens bounds the tokens of a split, so that file sizes and positions
// never overflow int64.
const maxTokens = 1 << 56

// GPT is a split of a token dataset cut into Megatron GPTDataset samples:
// sample k is a pure function of (dataset, Range, Seq, seed, k). It is safe
// for concurrent use.
type GPT struct {
	tok      Tokens
	cfg      Config
	identity string
	lo       int
	docs     int64
	tokens   int64
	maxLen   int64
	samples  int64
	width    int

	mu    sync.Mutex
	open  map[openKey]*epochIndex
	clock uint64
	stats Stats
}

// openKey names an open epoch index.
type openKey struct{ seed, epoch int64 }

// span is a piece of one document that a sample reads.
type span struct{ doc, off, n int }

// NewGPT prepares the samples of one split. Only the split's token count is
// needed up front, read from the cache when it holds it; an epoch's index
// is built or mapped the first time a sample of that epoch is asked for.
func NewGPT(tok Tokens, cfg Config) (*GPT, error) {
	if tok == nil {
		return nil, fmt.Errorf("%w: no token dataset given", ErrDataset)
	}
	if cfg.Seq <= 0 {
		return nil, fmt.Errorf("%w: %d; the sequence length must be positive", ErrSeq, cfg.Seq)
	}
	if cfg.Seq >= maxTokens {
		return nil, fmt.Errorf("%w: %d is more tokens than any split can hold", ErrSeq, cfg.Seq)
	}
	n := tok.NumSequences()
	lo, hi := cfg.Range[0], cfg.Range[1]
	if lo < 0 || hi < lo || hi > n {
		return nil, fmt.Errorf("%w: documents %d..%d of a dataset of %d; take the range from SplitRanges", ErrRange, lo, hi, n)
	}
	g := &GPT{
		tok:   tok,
		cfg:   cfg,
		lo:    lo,
		docs:  int64(hi - lo),
		open:  map[openKey]*epochIndex{},
		stats: Stats{Dir: cfg.CacheDir},
	}
	var err error
	switch {
	case cfg.Identity == "":
		err = g.fingerprint()
	case cfg.CacheDir == "":
		g.identity = cfg.Identity
		g.tokens, g.maxLen, err = g.measure()
	default:
		g.identity = cfg.Identity
		err = g.summary()
	}
	if err != nil {
		return nil, err
	}
	if g.tokens < int64(cfg.Seq)+1 {
		return nil, fmt.Errorf("%w: documents %d..%d hold %d tokens, fewer than seq+1 = %d; give the split more documents (--split) or shorten the sequence",
			ErrTooSmall, lo, hi, g.tokens, cfg.Seq+1)
	}
	g.samples = (g.tokens - 1) / int64(cfg.Seq)
	g.width = widthFor(g.docs, g.maxLen, g.samples)
	return g, nil
}

// measure reads the length of every document of the range: the split's
// token count and its longest document.
func (g *GPT) measure() (tokens, maxLen int64, err error) {
	for i := range g.docs {
		d := g.lo + int(i)
		n := int64(g.tok.SequenceLen(d))
		if n < 0 {
			return 0, 0, fmt.Errorf("%w: document %d has length %d", ErrDataset, d, n)
		}
		tokens += n
		maxLen = max(maxLen, n)
		if tokens > maxTokens {
			return 0, 0, fmt.Errorf("%w: documents %d..%d hold more than 2^56 tokens; split the dataset", ErrDataset, g.lo, g.lo+int(g.docs))
		}
	}
	return tokens, maxLen, nil
}

// fingerprint stands in for a missing Identity: a hash of the range's
// document lengths, which is all an index depends on.
func (g *GPT) fingerprint() error {
	h := sha256.New()
	var b [8]byte
	for i := range g.docs {
		d := g.lo + int(i)
		n := g.tok.SequenceLen(d)
		if n < 0 {
			return fmt.Errorf("%w: document %d has length %d", ErrDataset, d, n)
		}
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		h.Write(b[:])
		g.tokens += int64(n)
		g.maxLen = max(g.maxLen, int64(n))
		if g.tokens > maxTokens {
			return fmt.Errorf("%w: documents %d..%d hold more than 2^56 tokens; split the dataset", ErrDataset, g.lo, g.lo+int(g.docs))
		}
	}
	g.identity = "lengths:" + hex.EncodeToString(h.Sum(nil))
	return nil
}

// summaryKey is the cache key of the range's token count.
func (g *GPT) summaryKey() [32]byte {
	return sha256.Sum256(fmt.Appendf(nil, "gcompile data/sample summary v%d\nidentity %q\nsequences %d\nrange %d %d\n",
		formatVersion, g.identity, g.tok.NumSequences(), g.lo, g.lo+int(g.docs)))
}

// summary takes the range's token count from the cache, or measures it
// and caches it, so a run that reuses its index reads no per-document data
// of the dataset before its first step.
func (g *GPT) summary() error {
	key := g.summaryKey()
	name := "docs-" + hex.EncodeToString(key[:12]) + ".sum"
	check := func(h header) error {
		if h.kind != kindSummary || h.key != key || h.docs != uint64(g.docs) ||
			h.tokens > maxTokens || h.maxLen > h.tokens || h.size != headerSize {
			return fmt.Errorf("%w: not this range's summary", errStale)
		}
		return nil
	}
	for _, dir := range g.cfg.ReadDirs {
		if h, _, release, err := openFile(filepath.Join(dir, name), check); err == nil {
			_ = release()
			g.tokens, g.maxLen = int64(h.tokens), int64(h.maxLen)
			g.stats.Reused++
			return nil
		}
	}
	path := filepath.Join(g.cfg.CacheDir, name)
	h, _, release, err := openFile(path, check)
	if err == nil {
		_ = release()
		g.tokens, g.maxLen = int64(h.tokens), int64(h.maxLen)
		g.stats.Reused++
		return nil
	}
	stale := !errors.Is(err, fs.ErrNotExist)
	if g.tokens, g.maxLen, err = g.measure(); err != nil {
		return err
	}
	out := header{kind: kindSummary, key: key, docs: uint64(g.docs), tokens: uint64(g.tokens), maxLen: uint64(g.maxLen), size: headerSize}
	if err := writeAtomic(g.cfg.CacheDir, name, func(f *os.File) error {
		_, err := f.Write(out.encode(0))
		return err
	}); err != nil {
		return err
	}
	g.stats.Built++
	if stale {
		g.stats.Rebuilt++
	}
	return nil
}

// SamplesPerEpoch is the number of distinct windows of the split: (tokens -
// 1) / seq. The tokens after the last whole window of an epoch's stream are
// not used in that epoch (another epoch's order puts other tokens there).
func (g *GPT) SamplesPerEpoch() int64 {
	if g == nil {
		return 0
	}
	return g.samples
}

// Seq is the sequence length the samples were cut for; a sample is Seq+1
// tokens.
func (g *GPT) Seq() int {
	if g == nil {
		return 0
	}
	return g.cfg.Seq
}

// SplitTokens is the number of tokens in the split's documents, for logs.
func (g *GPT) SplitTokens() int64 {
	if g == nil {
		return 0
	}
	return g.tokens
}

// Epoch is the epoch that sample k falls in (0-based), for logs: how many
// times the run has gone through the split. It does not depend on the
// seed, since every epoch has the same number of samples.
func (g *GPT) Epoch(k int64) int64 {
	if g == nil || g.samples == 0 || k < 0 {
		return 0
	}
	return k / g.samples
}

// Stats says how many index files were built, reused and rebuilt so far.
func (g *GPT) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// Close unmaps the index files. The GPT stays usable: a later lookup maps
// its epoch again.
func (g *GPT) Close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for k, x := range g.open {
		errs = append(errs, x.close())
		delete(g.open, k)
	}
	return errors.Join(errs...)
}

// Sample fills dst (Seq+1 ids) with sample k (0, 1, 2, … across epochs
// without end) of the run with this seed.
func (g *GPT) Sample(seed, k int64, dst []int32) error {
	if g == nil {
		return fmt.Errorf("%w: no samples", ErrDataset)
	}
	if len(dst) != g.cfg.Seq+1 {
		return fmt.Errorf("%w: %d ids for samples of seq %d; pass seq+1 = %d", ErrDst, len(dst), g.cfg.Seq, g.cfg.Seq+1)
	}
	var buf [8]span
	spans, err := g.locate(seed, k, buf[:0])
	if err != nil {
		return err
	}
	at := 0
	for _, s := range spans {
		if err := g.tok.Read(s.doc, s.off, dst[at:at+s.n]); err != nil {
			return fmt.Errorf("sample %d: reading tokens %d..%d of document %d: %w", k, s.off, s.off+s.n, s.doc, err)
		}
		at += s.n
	}
	return nil
}

// locate is where sample k's tokens lie: the documents and offsets to
// read. An index from the cache whose values do not fit the dataset is
// rebuilt once; one built here that does not fit means the dataset changed
// under its Identity, which is reported.
func (g *GPT) locate(seed, k int64, spans []span) ([]span, error) {
	if k < 0 {
		return nil, fmt.Errorf("%w: %d is negative", ErrSampleNumber, k)
	}
	epoch, i := k/g.samples, k%g.samples
	if !g.cfg.Shuffle {
		seed, epoch = 0, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for force := false; ; force = true {
		x, err := g.index(seed, epoch, force)
		if err != nil {
			return nil, err
		}
		out, err := g.spans(x, i, spans)
		if err == nil {
			return out, nil
		}
		if !errors.Is(err, ErrCorrupt) || !x.fromDisk || force {
			return nil, fmt.Errorf("sample %d (epoch %d): %w", k, epoch, err)
		}
	}
}

// spans reads window i of an epoch index and turns it into pieces of
// documents, checking every value against the dataset on the way.
func (g *GPT) spans(x *epochIndex, i int64, spans []span) ([]span, error) {
	j := i
	if x.lay.shuffle >= 0 {
		v := x.at(x.lay.shuffle, i)
		if v >= uint64(g.samples) {
			return nil, fmt.Errorf("%w: window order entry %d is %d, past %d windows", ErrCorrupt, i, v, g.samples)
		}
		j = int64(v)
	}
	p, off := x.at(x.lay.starts, 2*j), x.at(x.lay.starts, 2*j+1)
	need := g.cfg.Seq + 1
	for first := true; need > 0; first = false {
		if p >= uint64(g.docs) {
			return nil, fmt.Errorf("%w: window %d runs past the range's %d documents", ErrCorrupt, j, g.docs)
		}
		d := p
		if x.lay.order >= 0 {
			if d = x.at(x.lay.order, int64(p)); d >= uint64(g.docs) {
				return nil, fmt.Errorf("%w: document order entry %d is %d, past %d documents", ErrCorrupt, p, d, g.docs)
			}
		}
		doc := g.lo + int(d)
		n := g.tok.SequenceLen(doc)
		if n < 0 {
			return nil, fmt.Errorf("%w: document %d has length %d", ErrDataset, doc, n)
		}
		if off >= uint64(n) && (first || n > 0) {
			return nil, fmt.Errorf("%w: window %d starts at token %d of document %d, which has %d", ErrCorrupt, j, off, doc, n)
		}
		if take := min(n-int(off), need); take > 0 {
			spans = append(spans, span{doc: doc, off: int(off), n: take})
			need -= take
		}
		p++
		off = 0
	}
	return spans, nil
}

// epochKey is the cache key of one epoch's index: everything its content
// depends on.
func (g *GPT) epochKey(seed, epoch int64) [32]byte {
	return sha256.Sum256(fmt.Appendf(nil, "gcompile data/sample epoch v%d\nidentity %q\nsequences %d\nrange %d %d\ndocs %d\ntokens %d\nseq %d\nshuffle %t\nseed %d\nepoch %d\n",
		formatVersion, g.identity, g.tok.NumSequences(), g.lo, g.lo+int(g.docs), g.docs, g.tokens, g.cfg.Seq, g.cfg.Shuffle, seed, epoch))
}

// epochHeader is the header an epoch's index must have.
func (g *GPT) epochHeader(seed, epoch int64) header {
	var flags uint32
	if g.cfg.Shuffle {
		flags = flagOrder | flagShuffle
	}
	return header{
		kind:    kindEpoch,
		key:     g.epochKey(seed, epoch),
		docs:    uint64(g.docs),
		tokens:  uint64(g.tokens),
		maxLen:  uint64(g.maxLen),
		seq:     uint64(g.cfg.Seq),
		samples: uint64(g.samples),
		width:   uint32(g.width),
		flags:   flags,
		size:    uint64(layoutOf(g.docs, g.samples, g.width, flags).size),
	}
}

// index is the open index of (seed, epoch): already mapped, found in the
// cache, or built. force drops what is open or cached and builds anew.
// g.mu is held.
func (g *GPT) index(seed, epoch int64, force bool) (*epochIndex, error) {
	g.clock++
	key := openKey{seed, epoch}
	if x := g.open[key]; x != nil {
		if !force {
			x.used = g.clock
			return x, nil
		}
		_ = x.close()
		delete(g.open, key)
	}
	want := g.epochHeader(seed, epoch)
	var x *epochIndex
	var err error
	if g.cfg.CacheDir == "" {
		x, err = g.buildMemory(want, seed, epoch)
	} else {
		x, err = g.fromCache(want, seed, epoch, force)
	}
	if err != nil {
		return nil, err
	}
	if len(g.open) >= maxOpen {
		var oldest openKey
		var when uint64 = math.MaxUint64
		for k, o := range g.open {
			if o.used < when {
				oldest, when = k, o.used
			}
		}
		_ = g.open[oldest].close()
		delete(g.open, oldest)
	}
	x.used = g.clock
	g.open[key] = x
	return x, nil
}

// build writes an epoch index to w: a header whose body checksum is 0,
// then the body. It returns the header with the body's checksum, for the
// caller to write over the first.
func (g *GPT) build(w io.Writer, h header, seed, epoch int64) ([]byte, error) {
	if _, err := w.Write(h.encode(0)); err != nil {
		return nil, err
	}
	var crc uint32
	var err error
	if h.width == 4 {
		crc, err = writeEpoch[uint32](w, g, seed, epoch, 4)
	} else {
		crc, err = writeEpoch[uint64](w, g, seed, epoch, 8)
	}
	if err != nil {
		return nil, err
	}
	return h.encode(crc), nil
}

// buildMemory builds an epoch index into memory, for a GPT without a cache
// folder.
func (g *GPT) buildMemory(h header, seed, epoch int64) (*epochIndex, error) {
	var b bytes.Buffer
	if h.size <= math.MaxInt {
		b.Grow(int(h.size))
	}
	head, err := g.build(&b, h, seed, epoch)
	if err != nil {
		return nil, fmt.Errorf("building the index of epoch %d: %w", epoch, err)
	}
	copy(b.Bytes(), head)
	g.stats.Built++
	return &epochIndex{data: b.Bytes(), width: g.width, lay: layoutOf(g.docs, g.samples, g.width, h.flags)}, nil
}

// fromCache maps the epoch's file, building it first when it is missing
// or does not match, header or body checksum (or when force says the
// mapped one proved corrupt).
func (g *GPT) fromCache(want header, seed, epoch int64, force bool) (*epochIndex, error) {
	name := epochFile(epoch, want.key)
	path := filepath.Join(g.cfg.CacheDir, name)
	check := func(h header) error {
		if h != want {
			return fmt.Errorf("%w: header differs", errStale)
		}
		return nil
	}
	openAt := func(path string) (*epochIndex, error) {
		_, b, release, err := openFile(path, check)
		if err != nil {
			return nil, err
		}
		return &epochIndex{data: b, release: release, width: g.width, lay: layoutOf(g.docs, g.samples, g.width, want.flags), fromDisk: true}, nil
	}
	open := func() (*epochIndex, error) { return openAt(path) }
	stale := force
	if !force {
		for _, dir := range g.cfg.ReadDirs {
			if x, err := openAt(filepath.Join(dir, name)); err == nil {
				g.stats.Reused++
				return x, nil
			}
		}
		x, err := open()
		if err == nil {
			g.stats.Reused++
			return x, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			stale = true
		}
	}
	unlock := buildLock(g.cfg.CacheDir, name)
	defer unlock()
	if !force {
		// Another process may have built it while this one waited.
		if x, err := open(); err == nil {
			g.stats.Reused++
			return x, nil
		}
	}
	if err := writeAtomic(g.cfg.CacheDir, name, func(f *os.File) error {
		head, err := g.build(f, want, seed, epoch)
		if err != nil {
			return err
		}
		_, err = f.WriteAt(head, 0)
		return err
	}); err != nil {
		return nil, fmt.Errorf("building the index of epoch %d in %s: %w", epoch, g.cfg.CacheDir, err)
	}
	g.stats.Built++
	if stale {
		g.stats.Rebuilt++
	}
	x, err := open()
	if err != nil {
		return nil, fmt.Errorf("%w: the index of epoch %d was written to %s but does not read back: %w", ErrCache, epoch, path, err)
	}
	// A file this GPT built is trusted to fit: if it does not, the dataset
	// changed, and building again would not help.
	x.fromDisk = false
	return x, nil
}

// MissingIndexBytes is what building the indexes of epochs first…last
// for seed would write to CacheDir, each epoch's (its size is known
// before it is built) whose file is in neither CacheDir nor ReadDirs yet;
// 0 without a CacheDir. A run checks it against the folder's free space
// before training, where a full disk would otherwise show at the first
// step of an epoch, hours in.
func (g *GPT) MissingIndexBytes(seed, first, last int64) (next, total int64) {
	if g == nil || g.cfg.CacheDir == "" {
		return 0, 0
	}
	dirs := append(append([]string(nil), g.cfg.ReadDirs...), g.cfg.CacheDir)
	for epoch := first; epoch <= last; epoch++ {
		h := g.epochHeader(seed, epoch)
		name := epochFile(epoch, h.key)
		found := false
		for _, dir := range dirs {
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().IsRegular() && fi.Size() == int64(h.size) {
				found = true
				break
			}
		}
		if !found {
			if total == 0 {
				next = int64(h.size)
			}
			total += int64(h.size)
		}
	}
	return next, total
}

// epochFile names an epoch's index file by its key.
func epochFile(epoch int64, key [32]byte) string {
	return fmt.Sprintf("gpt-e%d-%s.idx", epoch, hex.EncodeToString(key[:12]))
}
