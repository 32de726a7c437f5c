package prepare

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gcompile/data/indexed"
)

// Encoder turns text into token ids. Run calls AppendEncode from several
// goroutines at once, so it must be safe for concurrent use (a tokenizer's
// vocabulary and merges are read-only; per-call state must not be shared).
type Encoder interface {
	// AppendEncode appends the ids of text to dst and returns it; it lets
	// Run reuse one buffer per batch instead of allocating per document.
	AppendEncode(dst []int32, text []byte) []int32
	// VocabSize is the number of ids, which picks the stored type
	// (indexed.DTypeFor) and is recorded for readers of the dataset.
	VocabSize() int
	// EOS is the end-of-document id, if the encoder has one.
	EOS() (int32, bool)
}

// Options says what Run reads and writes.
type Options struct {
	// Inputs are files and folders, read in the order given (see the
	// package comment for what each becomes).
	Inputs []string
	// OutputPrefix names the outputs: PREFIX.bin, PREFIX.idx, PREFIX.json,
	// and PREFIX.lock while Run writes them.
	OutputPrefix string
	// JSONKey is the field of each JSON Lines object holding the text;
	// empty means "text".
	JSONKey string
	// SkipBadLines skips and counts a JSON Lines line that is not an
	// object with a string under JSONKey; by default such a line stops the
	// run, naming FILE:LINE.
	SkipBadLines bool
	// Workers is the number of tokenizing goroutines; 0 means one per
	// core. The output is the same for any number.
	Workers int
	// AppendEOS ends each document with the encoder's end-of-document id,
	// so that training windows spanning two documents see the boundary.
	// The zero value is false; the command sets it unless told not to.
	// Run refuses it when the encoder has no such id.
	AppendEOS bool
	// PrependBOS begins each document with BOS, the tokenizer's
	// beginning-of-sequence id, as Hugging Face's Llama tokenizers do by
	// default and Megatron-LM's preprocess_data.py writes with them.
	PrependBOS bool
	BOS        int32
	// DType is how tokens are stored; 0 means indexed.DTypeFor of the
	// encoder's vocabulary size, as Megatron-LM would choose.
	DType indexed.DType
	// Tokenizer identifies the encoder (a fingerprint of its vocabulary
	// and merges) and TokenizerPath says where it was loaded from; both are
	// recorded in PREFIX.json so that training can refuse a dataset made
	// with another tokenizer.
	Tokenizer     string
	TokenizerPath string
	// Progress, when set, is called about twice a second from one of Run's
	// goroutines (never two calls at once), and once more at the end.
	Progress func(Progress)
}

// Run tokenizes opt.Inputs with enc into the dataset opt.OutputPrefix and
// returns what it wrote. It checks the options, the output folder and
// every input before tokenizing anything; on any error or cancellation of
// ctx nothing is left under the output names. While it runs,
// PREFIX.lock names it: a second Run on the prefix, in this process or
// another, is refused with ErrLocked before it writes anything.
func Run(ctx context.Context, enc Encoder, opt Options) (Summary, error) {
	start := time.Now()
	cfg, err := settle(enc, opt)
	if err != nil {
		return Summary{}, err
	}
	if err := indexed.CheckPrefix(opt.OutputPrefix); err != nil {
		return Summary{}, err
	}
	release, err := lockPrefix(opt.OutputPrefix)
	if err != nil {
		return Summary{}, err
	}
	defer release() // after the temporary files are removed
	staleFiles, staleBytes := removeStaleTemps(opt.OutputPrefix)
	w, err := indexed.Create(opt.OutputPrefix, cfg.dtype)
	if err != nil {
		return Summary{}, err
	}
	committed := false
	defer func() {
		if !committed {
			w.Abort()
		}
	}()
	in, err := collectInputs(opt.Inputs, opt.OutputPrefix)
	if err != nil {
		return Summary{}, err
	}
	p := &pipeline{cfg: cfg, enc: enc, files: in.files, w: w, total: in.bytes, start: start}
	sum, err := p.run(ctx)
	if err != nil {
		return Summary{}, err
	}
	sum.SkippedFiles, sum.SkippedArchives, sum.DuplicateFiles = in.skipped, in.archives, in.duplicates
	sum.BlankLines = p.blank.Load()
	if sum.Documents == 0 {
		return Summary{}, fmt.Errorf("%w: %d input files, %d empty documents, %d bad lines skipped, %d binary files, %d archives and %d duplicate files skipped: nothing to train on",
			ErrNoDocuments, len(in.files), sum.EmptyDocuments, sum.SkippedLines, in.skipped, in.archives, in.duplicates)
	}
	if err := ctx.Err(); err != nil {
		return Summary{}, err
	}
	// The record is written whole beside the temporary .bin and .idx and
	// renamed into place by Commit, after every write has succeeded and
	// while no dataset is under the prefix: a run that fails (a full
	// disk) leaves the old dataset and its record as they were, and a
	// crash never leaves a pair beside the other pair's record or without
	// its own (see indexed.Writer.Commit for the order).
	sum.BinBytes, sum.IdxBytes = w.BinBytes(), w.IdxBytes()
	tmp, err := writeMetaTemp(opt.OutputPrefix, metaOf(cfg, sum))
	if err != nil {
		return Summary{}, err
	}
	if err := w.Commit(indexed.Companion{Temp: tmp, Path: metaPath(opt.OutputPrefix)}); err != nil {
		os.Remove(tmp) // gone already if Commit renamed it
		return Summary{}, err
	}
	committed = true
	sum.StaleFiles, sum.StaleBytes = staleFiles, staleBytes
	sum.Seconds = time.Since(start).Seconds()
	return sum, nil
}

// config is Options with the defaults filled in and checked.
type config struct {
	Options
	dtype     indexed.DType
	eos       int32 // -1: none appended
	bos       int32 // -1: none prepended
	vocabSize int
	workers   int
}

func settle(enc Encoder, opt Options) (config, error) {
	c := config{Options: opt, eos: -1, bos: -1}
	if enc == nil {
		return c, errors.New("prepare: no encoder")
	}
	switch {
	case opt.OutputPrefix == "":
		return c, errors.New("prepare: no output prefix: give a path prefix such as data/corpus (for data/corpus.bin and data/corpus.idx)")
	case len(opt.Inputs) == 0:
		return c, fmt.Errorf("prepare: %w: no inputs: name text files, folders or JSON Lines files", ErrInput)
	case opt.Workers < 0:
		return c, fmt.Errorf("prepare: Workers is %d: want 0 (one per core) or more", opt.Workers)
	}
	if c.JSONKey == "" {
		c.JSONKey = "text"
	}
	c.workers = opt.Workers
	if c.workers == 0 {
		c.workers = runtime.NumCPU()
	}
	c.vocabSize = enc.VocabSize()
	c.dtype = opt.DType
	if c.dtype == 0 {
		c.dtype = indexed.DTypeFor(c.vocabSize)
	}
	if !c.dtype.Integer() {
		return c, fmt.Errorf("prepare: dtype %s: token ids are stored as an integer type: %w", c.dtype, indexed.ErrDType)
	}
	_, hi := c.dtype.Range()
	if int64(c.vocabSize)-1 > int64(hi) {
		return c, fmt.Errorf("prepare: the encoder has %d tokens, but %s holds ids up to %d: store them as %s: %w",
			c.vocabSize, c.dtype, hi, indexed.DTypeFor(c.vocabSize), indexed.ErrTokenRange)
	}
	if opt.AppendEOS {
		eos, ok := enc.EOS()
		if !ok {
			return c, fmt.Errorf("prepare: %w to append to each document: write the documents without one (AppendEOS false, --no-eos), or use a tokenizer that has one", ErrNoEOS)
		}
		if eos < 0 || eos > hi {
			return c, fmt.Errorf("prepare: the end-of-document id %d does not fit %s (0..%d): %w", eos, c.dtype, hi, indexed.ErrTokenRange)
		}
		c.eos = eos
	}
	if opt.PrependBOS {
		if opt.BOS < 0 || opt.BOS > hi || int(opt.BOS) >= c.vocabSize {
			return c, fmt.Errorf("prepare: the beginning-of-document id %d is not a token of the encoder's %d: %w", opt.BOS, c.vocabSize, indexed.ErrTokenRange)
		}
		c.bos = opt.BOS
	}
	for _, ext := range []string{".bin", ".idx", ".json"} {
		if st, err := os.Stat(opt.OutputPrefix + ext); err == nil && st.IsDir() {
			return c, fmt.Errorf("prepare: output %s%s is a folder: remove it or choose another prefix", opt.OutputPrefix, ext)
		}
	}
	return c, nil
}

// Summary is what Run wrote and read.
type Summary struct {
	// Prefix is the output prefix.
	Prefix string
	// Files is the number of input files read; SkippedFiles the number of
	// a folder's files skipped because they look binary, SkippedArchives
	// because they are archives or compressed in a format not read,
	// DuplicateFiles because they are a file read already through another
	// path (a symbolic or hard link).
	Files, SkippedFiles, SkippedArchives, DuplicateFiles int
	// Documents is the number written, one sequence each.
	Documents int64
	// EmptyDocuments is the number of documents with no tokens, not
	// written (see the package comment).
	EmptyDocuments int64
	// SkippedLines is the number of bad JSON Lines lines skipped;
	// BlankLines the blank ones (empty or spaces only), which hold no
	// document and are left out as Hugging Face's JSON loader leaves them
	// (Megatron-LM's preprocessing stops at one).
	SkippedLines, BlankLines int64
	// Tokens is the number written, end-of-document ids included.
	Tokens int64
	// InputBytes is the size of the inputs on disk (compressed for .gz);
	// TextBytes the number of bytes after decompression.
	InputBytes, TextBytes int64
	// BinBytes and IdxBytes are the sizes of PREFIX.bin and PREFIX.idx.
	BinBytes, IdxBytes int64
	// Seconds is the wall time of the whole run.
	Seconds float64
	// MaxToken is the largest id written.
	MaxToken int32
	// DType is how the tokens are stored.
	DType indexed.DType
	// VocabSize is the encoder's vocabulary size.
	VocabSize int
	// StaleFiles and StaleBytes are the temporary files, and their size,
	// that an earlier run on the prefix left when it was killed, which
	// this one removed.
	StaleFiles int
	StaleBytes int64
}

// String is the one-line report the command prints.
func (s Summary) String() string {
	extra := ""
	if s.EmptyDocuments > 0 || s.SkippedLines > 0 || s.SkippedFiles > 0 || s.SkippedArchives > 0 || s.DuplicateFiles > 0 || s.BlankLines > 0 {
		extra = fmt.Sprintf(" (left out: %d empty documents, %d bad lines, %d binary files, %d archives, %d duplicate files",
			s.EmptyDocuments, s.SkippedLines, s.SkippedFiles, s.SkippedArchives, s.DuplicateFiles)
		if s.BlankLines > 0 {
			extra += fmt.Sprintf(", %d blank JSON Lines lines", s.BlankLines)
		}
		extra += ")"
	}
	rate := 0.0
	if s.Seconds > 0 {
		rate = float64(s.InputBytes) / 1e6 / s.Seconds
	}
	stale := ""
	if s.StaleFiles > 0 {
		stale = fmt.Sprintf("; removed %d temporary files (%s) that an earlier prepare of %s left when it was killed", s.StaleFiles, megabytes(s.StaleBytes), s.Prefix)
	}
	return fmt.Sprintf("%d documents%s, %d tokens as %s (largest id %d, vocabulary %d), from %d files, %s in %.1fs (%.1f MB/s); .bin %s, .idx %s%s",
		s.Documents, extra, s.Tokens, s.DType, s.MaxToken, s.VocabSize, s.Files, megabytes(s.InputBytes), s.Seconds, rate, megabytes(s.BinBytes), megabytes(s.IdxBytes), stale)
}

// Progress is a snapshot of a running Run.
type Progress struct {
	// BytesRead and TotalBytes count input bytes on disk: compressed bytes
	// for .gz inputs, so that TotalBytes is known before reading.
	BytesRead, TotalBytes int64
	// Documents and Tokens written so far.
	Documents, Tokens int64
	// Elapsed is the time since Run started.
	Elapsed time.Duration
	// MBPerSec is BytesRead per second, in 10^6 bytes.
	MBPerSec float64
	// ETA is the time left at the rate so far; negative when unknown.
	ETA time.Duration
}

// String is a progress line of steady width, for a terminal's \r updates.
func (p Progress) String() string {
	pct := 100.0
	if p.TotalBytes > 0 {
		pct = 100 * float64(p.BytesRead) / float64(p.TotalBytes)
	}
	eta := "?"
	if p.ETA >= 0 {
		eta = p.ETA.Round(time.Second).String()
	}
	return fmt.Sprintf("%s of %s (%3.0f%%), %d documents, %d tokens, %.1f MB/s, ETA %s   ",
		megabytes(p.BytesRead), megabytes(p.TotalBytes), pct, p.Documents, p.Tokens, p.MBPerSec, eta)
}

// megabytes writes a size in decimal units, as MB/s rates are given.
func megabytes(n int64) string {
	switch {
	case n < 1e3:
		return fmt.Sprintf("%d B", n)
	case n < 1e6:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	case n < 1e9:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.2f GB", float64(n)/1e9)
}

// Batching bounds: a batch is read whole before it is tokenized, and at
// most inFlight(workers) batches exist at once, which is what bounds
// memory. 256 KiB keeps the per-batch costs (a channel hop, a map insert)
// negligible while 2·workers+2 batches stay within a few MiB of text.
const (
	batchBytes = 256 << 10
	batchDocs  = 4096
	// keepBytes: a buffer grown past this by one large document is dropped
	// rather than kept for the next batch.
	keepBytes = 4 * batchBytes
)

func inFlight(workers int) int { return 2*workers + 2 }

// docRef is one document of a batch.
type docRef struct {
	file       int   // index into pipeline.files
	line       int64 // 1-based, for JSON Lines; 0 for a text file
	start, end int   // its text in batch.text
}

// batch is the unit of work: documents read in order, then their tokens.
type batch struct {
	seq  int
	text []byte
	docs []docRef
	// last marks the reader's final batch; err, if set, is why it stopped
	// early, reported after the batch's documents.
	last bool
	err  error
	// Set by the worker:
	fail   error // the encoder panicked; nothing of the batch is written
	tokens []int32
	ends   []int // ends[i] is where document i's tokens end in tokens
	status []lineStatus
	empty  []bool
	maxTok int32
}

func (b *batch) reset(seq int) {
	b.seq, b.last, b.err, b.fail, b.maxTok = seq, false, nil, nil, -1
	if cap(b.text) > keepBytes {
		b.text = nil
	}
	if cap(b.tokens) > keepBytes {
		b.tokens = nil
	}
	b.text, b.docs = b.text[:0], b.docs[:0]
	b.tokens, b.ends, b.status, b.empty = b.tokens[:0], b.ends[:0], b.status[:0], b.empty[:0]
}

// pipeline is one Run's reader, workers and writer.
type pipeline struct {
	cfg   config
	enc   Encoder
	files []input
	w     *indexed.Writer
	total int64
	start time.Time

	read      atomic.Int64 // input bytes read, on disk
	text      atomic.Int64 // bytes after decompression
	docs      atomic.Int64
	tokens    atomic.Int64
	filesRead atomic.Int64
	blank     atomic.Int64 // blank JSON Lines lines
}

func (p *pipeline) run(ctx context.Context) (Summary, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := inFlight(p.cfg.workers)
	free := make(chan *batch, n)
	for range n {
		free <- &batch{}
	}
	work := make(chan *batch, n)
	done := make(chan *batch, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(work)
		p.readAll(ctx, free, work)
	}()
	for range p.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				p.encode(b)
				select {
				case done <- b:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	stopProgress := p.progressLoop()
	sum, err := p.writeAll(ctx, done, free)
	cancel()
	wg.Wait()
	stopProgress()
	return sum, err
}

// progressLoop calls Progress every half second until the returned
// function is called, which makes one last call.
func (p *pipeline) progressLoop() (stop func()) {
	if p.cfg.Progress == nil {
		return func() {}
	}
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.cfg.Progress(p.snapshot())
			case <-quit:
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-exited
		p.cfg.Progress(p.snapshot())
	}
}

func (p *pipeline) snapshot() Progress {
	pr := Progress{BytesRead: p.read.Load(), TotalBytes: p.total, Documents: p.docs.Load(), Tokens: p.tokens.Load(), Elapsed: time.Since(p.start), ETA: -1}
	if s := pr.Elapsed.Seconds(); s > 0 {
		pr.MBPerSec = float64(pr.BytesRead) / 1e6 / s
		if pr.BytesRead > 0 {
			left := float64(pr.TotalBytes-pr.BytesRead) / (float64(pr.BytesRead) / s)
			pr.ETA = time.Duration(max(left, 0) * float64(time.Second))
		}
	}
	return pr
}

// encode tokenizes every document of b. An encoder that panics fails the
// run with an error naming the document, instead of taking the process
// down with the temporary files in place.
func (p *pipeline) encode(b *batch) {
	doc := -1
	defer func() {
		if r := recover(); r != nil {
			b.fail = fmt.Errorf("prepare: the encoder panicked on %s: %v", p.where(b.docs[doc]), r)
		}
	}()
	for i, d := range b.docs {
		doc = i
		text := b.text[d.start:d.end]
		status := lineOK
		if d.line > 0 {
			text, status = jsonField(text, p.cfg.JSONKey)
		}
		before := len(b.tokens)
		if status == lineOK {
			if p.cfg.bos >= 0 {
				b.tokens = append(b.tokens, p.cfg.bos)
			}
			start := len(b.tokens)
			if b.tokens = p.enc.AppendEncode(b.tokens, text); len(b.tokens) == start {
				b.tokens = b.tokens[:before] // an empty document gets no BOS either
			}
		}
		empty := status == lineOK && len(b.tokens) == before
		if status == lineOK && !empty && p.cfg.eos >= 0 {
			b.tokens = append(b.tokens, p.cfg.eos)
		}
		for _, t := range b.tokens[before:] {
			b.maxTok = max(b.maxTok, t)
		}
		b.ends = append(b.ends, len(b.tokens))
		b.status = append(b.status, status)
		b.empty = append(b.empty, empty)
	}
}

// writeAll takes the encoded batches and writes them in reading order.
func (p *pipeline) writeAll(ctx context.Context, done <-chan *batch, free chan<- *batch) (Summary, error) {
	sum := Summary{Prefix: p.cfg.OutputPrefix, DType: p.cfg.dtype, VocabSize: p.cfg.vocabSize, MaxToken: -1}
	pending := make(map[int]*batch)
	next := 0
	for {
		select {
		case b := <-done:
			pending[b.seq] = b
		case <-ctx.Done():
			return sum, ctx.Err()
		}
		for {
			b, ok := pending[next]
			if !ok {
				break
			}
			delete(pending, next)
			next++
			if err := p.write(b, &sum); err != nil {
				return sum, err
			}
			if b.last {
				sum.Files = int(p.filesRead.Load())
				sum.InputBytes = p.read.Load()
				sum.TextBytes = p.text.Load()
				return sum, nil
			}
			free <- b
		}
	}
}

// write adds b's documents to the dataset and its counts to sum.
func (p *pipeline) write(b *batch, sum *Summary) error {
	if b.fail != nil {
		return b.fail
	}
	from := 0
	for i, d := range b.docs {
		toks := b.tokens[from:b.ends[i]]
		from = b.ends[i]
		switch {
		case b.status[i] != lineOK:
			if !p.cfg.SkipBadLines {
				return p.badLine(b, d, b.status[i])
			}
			sum.SkippedLines++
		case b.empty[i]:
			sum.EmptyDocuments++
		default:
			if err := p.w.Add(toks); err != nil {
				var pe *fs.PathError
				if errors.As(err, &pe) {
					// The output's failure (a full disk), not the input's.
					return fmt.Errorf("writing the dataset: %w", err)
				}
				return fmt.Errorf("%s: %w", p.where(d), err)
			}
			sum.Documents++
			sum.Tokens += int64(len(toks))
			p.docs.Add(1)
			p.tokens.Add(int64(len(toks)))
		}
	}
	sum.MaxToken = max(sum.MaxToken, b.maxTok)
	return b.err
}

// where is a document's place in the inputs: FILE:LINE or FILE.
func (p *pipeline) where(d docRef) string {
	if d.line > 0 {
		return fmt.Sprintf("%s:%d", p.files[d.file].path, d.line)
	}
	return p.files[d.file].path
}

func (p *pipeline) badLine(b *batch, d docRef, s lineStatus) error {
	line := b.text[d.start:d.end]
	const show = 80
	snippet := string(line[:min(len(line), show)])
	if len(line) > show {
		snippet += "…"
	}
	hint := ""
	name := strings.TrimSuffix(strings.ToLower(p.files[d.file].path), ".gz")
	if in := p.files[d.file]; in.folder != "" && (strings.HasSuffix(name, ".json") || strings.HasSuffix(name, ".ndjson")) {
		// A folder of text may hold a config file (package.json): it is
		// read as JSON Lines all the same, since a folder of Megatron
		// shards named .json is read so too.
		hint = fmt.Sprintf(" (a folder's .json and .ndjson files are read as JSON Lines, one object per line, as .jsonl ones are; move %s out of %s, or name the text files as INPUTs)", filepath.Base(in.path), in.folder)
	} else if strings.HasSuffix(name, ".json") {
		hint = " (a .json input is read as JSON Lines, one object per line, as Megatron-LM reads it)"
	}
	return fmt.Errorf("%s: %w: %s%s: %q; skip such lines with --skip-bad-lines, or fix the line",
		p.where(d), ErrBadLine, s.describe(p.cfg.JSONKey), hint, snippet)
}
