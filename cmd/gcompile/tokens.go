package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gcompile/data"
	"gcompile/data/indexed"
	"gcompile/data/prepare"
	"gcompile/data/sample"
	"gcompile/data/tokenizer"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
)

// tokenData is a run on token datasets (--data PREFIX, or a blend
// "W1 PREFIX1 W2 PREFIX2"): the datasets are opened and checked, and the
// tokenizer loaded, before any compile (checkPaths), so that a bad file is
// refused before any work; the sample index is built or reused once the
// compiled model gives the sequence length (source).
type tokenData struct {
	parts []sample.BlendPart
	sets  []*indexed.Dataset
	tok   *tokenizer.Tokenizer // nil when --tokenizer was not given
	// need is how many token ids the data needs the model to take: the
	// tokenizer's vocabulary, else the one the dataset was prepared with,
	// else its largest id + 1; where says which, for messages.
	need  int
	where string
	// fromData says that need came from the data's largest id alone:
	// no tokenizer and no record of the one that made the data.
	fromData bool
	// maxID is the largest id in any of the datasets.
	maxID int32
	// maxFrom says where maxID comes from, for an id past it met later.
	maxFrom string
	// samplers are the training and held-out splits' samplers, whose
	// cached indexes the summary reports on (rebuilt).
	samplers []*sample.GPT
}

// rebuilt counts the cached sample-index files the run found damaged,
// foreign or stale and built again, with the folders they were in: said
// in the summary, since each costs a rebuild the user may wonder about.
func (td *tokenData) rebuilt() (n int, dirs []string) {
	if td == nil {
		return 0, nil
	}
	for _, g := range td.samplers {
		if st := g.Stats(); st.Rebuilt > 0 {
			n += st.Rebuilt
			if !slices.Contains(dirs, st.Dir) {
				dirs = append(dirs, st.Dir)
			}
		}
	}
	return n, dirs
}

// isTokenData says whether --data names token datasets rather than text: a
// PREFIX, PREFIX.bin, PREFIX.idx or PREFIX.json whose PREFIX.idx exists
// (spaces in its path and all), a blend (weights and prefixes), a name
// ending .idx, or a prefix that names no file but has its .bin. A lone
// .bin is a file like any other (the text loader refuses it as binary),
// and so is any other file or folder that exists.
func isTokenData(s string) bool {
	if _, ok := oneDataset(s); ok {
		return true
	}
	if _, err := os.Stat(s); err == nil {
		return false
	}
	if strings.ContainsAny(strings.TrimSpace(s), " \t\n") || strings.HasSuffix(s, ".idx") {
		return true
	}
	// A prefix that names no file but has its .bin is a dataset without
	// its index (opening it says so), not a text file that is missing.
	if _, err := os.Stat(s); errors.Is(err, fs.ErrNotExist) {
		_, err := os.Stat(s + ".bin")
		return err == nil
	}
	return false
}

// oneDataset is the prefix of the one token dataset s names, when its
// PREFIX.idx exists: s is PREFIX, PREFIX.bin, PREFIX.idx or gcompile's
// PREFIX.json record (which, read as text, would train on the record).
// A path with spaces is one dataset too, not a blend.
func oneDataset(s string) (string, bool) {
	for _, p := range []string{datasetPrefix(s), strings.TrimSuffix(s, ".json")} {
		if fi, err := os.Stat(p + ".idx"); err == nil && !fi.IsDir() {
			return p, true
		}
	}
	return "", false
}

// dataBlend is --data's datasets: one dataset named whole (oneDataset),
// or Megatron's blend of weights and prefixes, each prefix given as
// oneDataset takes it. A dataset named twice is refused: each part
// draws its samples in the same order, so the two would give the same
// samples, not twice the data.
func dataBlend(s string) ([]sample.BlendPart, error) {
	if p, ok := oneDataset(s); ok {
		return []sample.BlendPart{{Weight: 1, Prefix: p}}, nil
	}
	parts, err := sample.ParseBlend(s)
	if err != nil {
		return nil, err
	}
	idx := make([]os.FileInfo, len(parts)) // each part's .idx, where it exists
	for i := range parts {
		if p, ok := oneDataset(parts[i].Prefix); ok {
			parts[i].Prefix = p
		} else {
			parts[i].Prefix = datasetPrefix(parts[i].Prefix)
		}
		idx[i], _ = os.Stat(parts[i].Prefix + ".idx")
		for j := range i {
			// The same file however named: a link, a path through a
			// linked folder, "./".
			same := idx[i] != nil && idx[j] != nil && os.SameFile(idx[i], idx[j]) ||
				filepath.Clean(parts[i].Prefix) == filepath.Clean(parts[j].Prefix)
			if same {
				return nil, fmt.Errorf("%w: %s (parts %d and %d, weights %g and %g): each part draws its samples in the same order, so both would give the same ones; name it once with the weights added", sample.ErrBlendTwice, parts[i].Prefix, j+1, i+1, parts[j].Weight, parts[i].Weight)
			}
		}
	}
	return parts, nil
}

// datasetsIn are the token datasets (PREFIX.idx with its PREFIX.bin) in
// folder dir, by prefix: a folder of them is not a folder of text, whose
// reader would skip the binary halves and train on what is left (their
// .json metadata). "" is none: --data's default is the Go sources, not
// the working folder.
func datasetsIn(dir string) []string {
	if dir == "" {
		return nil
	}
	idx, _ := filepath.Glob(filepath.Join(dir, "*.idx"))
	var prefixes []string
	for _, p := range idx {
		if _, err := os.Stat(datasetPrefix(p) + ".bin"); err == nil {
			prefixes = append(prefixes, filepath.Base(datasetPrefix(p)))
		}
	}
	return prefixes
}

// datasetPrefix is the prefix of PREFIX, PREFIX.bin or PREFIX.idx.
func datasetPrefix(p string) string {
	return strings.TrimSuffix(strings.TrimSuffix(p, ".bin"), ".idx")
}

// openTokenData opens --data's token datasets once, when it names some, and
// gives a model.go the vocabulary they need (applyVocab).
func (c *config) openTokenData() error {
	if c.tokens != nil || c.data == "" || !isTokenData(c.data) {
		return nil
	}
	td, err := openTokenData(c)
	if err != nil {
		return err
	}
	c.tokens = td
	return c.applyVocab()
}

// openTokenData opens every dataset of --data and the tokenizer, and checks
// them against each other: every id of the data is a token of the
// tokenizer, and a dataset prepared with another tokenizer is refused.
// Nothing of the data is read but the index files and, for a dataset
// without gcompile's metadata, one scan for its largest id (cached).
func openTokenData(c *config) (*tokenData, error) {
	parts, err := dataBlend(c.data)
	if err != nil {
		return nil, fmt.Errorf("--data %q: %w", c.data, err)
	}
	td := &tokenData{parts: parts, maxID: -1}
	if c.merges != "" && c.tokenizer == "" {
		return nil, fmt.Errorf("--merges %s is GPT-2's merges file for --tokenizer vocab.json, and no --tokenizer was given", c.merges)
	}
	if c.tokenizer != "" {
		if td.tok, err = tokenizer.Load(c.tokenizer, c.merges); err != nil {
			return nil, fmt.Errorf("--tokenizer %s: %w", c.tokenizer, err)
		}
	}
	fail := func(err error) (*tokenData, error) {
		td.close()
		return nil, err
	}
	metaVocab, metaFrom := 0, ""
	// The first part with a record of its tokenizer: a blend's parts
	// must agree on it, --tokenizer given or not, or ids of one
	// tokenizer would train as another's tokens.
	var firstTok *prepare.Meta
	var firstTokPrefix string
	for i := range td.parts {
		p := &td.parts[i]
		p.Prefix = datasetPrefix(p.Prefix)
		ds, err := indexed.Open(p.Prefix)
		if err != nil {
			return fail(fmt.Errorf("--data %s: %w", p.Prefix, err))
		}
		td.sets = append(td.sets, ds)
		if ds.Tokens() == 0 {
			// Without a tokenizer the vocabulary follows the largest id,
			// and there is none: the model file's vocab was blamed.
			return fail(fmt.Errorf("--data %s holds no tokens (%d documents, every one empty): there is nothing to train on or evaluate; prepare it again from documents with text", p.Prefix, ds.NumDocuments()))
		}
		meta, ok, err := prepare.ReadMeta(p.Prefix)
		if err != nil {
			return fail(fmt.Errorf("--data %s: %w", p.Prefix, err))
		}
		var maxID int32
		var cached string
		if ok {
			maxID = meta.MaxToken
			if td.tok != nil && meta.Tokenizer != "" && meta.Tokenizer != td.tok.Fingerprint() {
				return fail(fmt.Errorf("--data %s was prepared with the tokenizer %s, not --tokenizer %s (%s): give the tokenizer the data was prepared with, or prepare the data again: %w",
					p.Prefix, orUnknown(meta.TokenizerPath), c.tokenizer, tokenizerDifference(meta, td.tok), errDataMismatch))
			}
			if meta.Tokenizer != "" {
				if firstTok == nil {
					firstTok, firstTokPrefix = &meta, p.Prefix
				} else if meta.Tokenizer != firstTok.Tokenizer {
					return fail(fmt.Errorf("--data blends %s, prepared with the tokenizer %s, and %s, prepared with %s: their ids are another tokenizer's tokens; blend datasets prepared with one tokenizer: %w",
						firstTokPrefix, orUnknown(firstTok.TokenizerPath), p.Prefix, orUnknown(meta.TokenizerPath), errDataMismatch))
				}
			}
			if meta.VocabSize > metaVocab {
				metaVocab, metaFrom = meta.VocabSize, fmt.Sprintf("the vocabulary of %s's tokenizer (%d)", p.Prefix, meta.VocabSize)
			}
		} else if maxID, cached, err = cachedMaxToken(ds, p.Prefix, c.dataCacheDir); err != nil {
			return fail(fmt.Errorf("--data %s: %w", p.Prefix, err))
		}
		if td.tok == nil && metaVocab == 0 && int64(maxID) >= maxDataVocab {
			// The vocabulary would follow the id: an embedding of that
			// many rows is gigabytes, built before any check could say why.
			from := "a scan of its .bin"
			if cached != "" {
				from = "the scan cached in " + cached + " (delete it to scan again)"
			}
			return fail(fmt.Errorf("--data %s holds token id %d (%s): a vocabulary of that many rows is past any tokenizer's (gcompile takes at most %d without --tokenizer); a stray id or a damaged .bin? give the --tokenizer the data was made with, which checks every id, or prepare the data again",
				p.Prefix, maxID, from, maxDataVocab))
		}
		if td.tok != nil && int(maxID) >= td.tok.VocabSize() {
			return fail(fmt.Errorf("--data %s holds token id %d, but --tokenizer %s has %d tokens (ids 0..%d): the data was made with another tokenizer: %w",
				p.Prefix, maxID, c.tokenizer, td.tok.VocabSize(), td.tok.VocabSize()-1, errDataMismatch))
		}
		if maxID >= td.maxID {
			td.maxID = maxID
			td.maxFrom = fmt.Sprintf("the largest id a scan of %s found (%d)", p.Prefix, maxID)
			if cached != "" {
				td.maxFrom = fmt.Sprintf("the largest id a scan of %s found (%d), cached in %s: delete it if the .bin changed", p.Prefix, maxID, cached)
			}
			if ok {
				td.maxFrom = fmt.Sprintf("the largest id %s.json records (%d): the .bin changed after the record was written; delete it (the data is then scanned) or prepare the data again", p.Prefix, maxID)
			}
		}
	}
	switch {
	case td.tok != nil:
		td.need, td.where = td.tok.VocabSize(), fmt.Sprintf("--tokenizer %s's %d tokens", c.tokenizer, td.tok.VocabSize())
	case metaVocab > 0:
		td.need, td.where = metaVocab, metaFrom
	default:
		td.need, td.where = int(td.maxID)+1, fmt.Sprintf("the data's largest token id (%d) + 1", td.maxID)
		td.fromData = true
	}
	td.need = max(td.need, int(td.maxID)+1)
	return td, nil
}

// errDataMismatch marks a tokenizer that is not the one the data was made
// with.
var errDataMismatch = errors.New("the tokenizer does not match the dataset")

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

func (td *tokenData) close() {
	for _, ds := range td.sets {
		ds.Close()
	}
}

// maxVocabDivisible bounds --make-vocab-size-divisible-by: Megatron-LM
// pads by 128; a multiple of millions would make a vocabulary (and the
// loss's padding mask, built with the model) of billions of rows.
const maxVocabDivisible = 1 << 16

// maxPositions bounds a generation's new tokens: the caches' positions
// are counted in 32 bits.
const maxPositions = 1 << 30

// paddedVocab is the model vocabulary for need token ids: rounded up to a
// multiple of divisible·tp, as Megatron-LM's --make-vocab-size-divisible-by
// does, so that a vocab-parallel embedding and head split evenly over tp
// and the GEMMs get friendly sizes. The padding rows are never a target,
// and the loss masks them out of the softmax (compile.Config.Classes).
func paddedVocab(need, divisible, tp int) int {
	m := max(divisible, 1) * max(tp, 1)
	return (need + m - 1) / m * m
}

// applyVocab gives a model.go the vocabulary the data needs (--set
// vocab=N, padded), unless --set names one, which must then be large
// enough; a .gir has its vocabulary fixed and is checked after the
// compile (source).
func (c *config) applyVocab() error {
	td := c.tokens
	if td == nil || !strings.HasSuffix(c.Model, ".go") {
		return nil
	}
	// The classes past the data's ids are padding, masked out of the loss
	// (nn.CrossEntropy) whatever the vocabulary is.
	c.Classes = td.need
	if v, ok := setValue(c.Set, "vocab"); ok {
		n, err := strconv.Atoi(v)
		if err == nil && n < td.need {
			return fmt.Errorf("--set vocab=%d is smaller than %s: leave vocab out of --set (it is then %d, padded to a multiple of %d) or raise it",
				n, td.where, paddedVocab(td.need, c.vocabDivisible, c.TP), max(c.vocabDivisible, 1)*max(c.TP, 1))
		}
		return nil
	}
	v := resumedVocab(c.resume, td.need, c.vocabDivisible, c.TP)
	if td.fromData && c.run && !c.evalOnly && c.resume == "" && c.Progress != io.Discard {
		// Megatron-LM sizes the vocabulary from the tokenizer; a
		// tokenizer's ids past the data's would then have no row, which
		// generate, eval and export --tokenizer meet later.
		fmt.Fprintf(os.Stderr, "note: no tokenizer and no record of one (PREFIX.json) gives the vocabulary: it follows %s, padded to %d; give the data's --tokenizer for a model of all its ids\n", td.where, v)
	}
	if c.Set == "" {
		c.Set = "vocab=" + strconv.Itoa(v)
	} else {
		c.Set += ",vocab=" + strconv.Itoa(v)
	}
	c.vocabPadded = true
	return nil
}

// pinVocab is the --set the planner's pin flags need for a vocabulary
// from the data ("" when none): the planner built the model before it
// chose tp, padded for the tp of the command line, where a run with the
// flags' --tp would pad for that tp (Megatron-LM's divisor · tp) and
// build another model.
func (c *config) pinVocab(tp int) string {
	if !c.vocabPadded || c.tokens == nil {
		return ""
	}
	v, _ := setValue(c.Set, "vocab")
	if strconv.Itoa(resumedVocab(c.resume, c.tokens.need, c.vocabDivisible, tp)) == v {
		return ""
	}
	return " --set vocab=" + v
}

// resumedVocab is the padded vocabulary of a model built for need token
// ids: the checkpoint's, when resuming (or evaluating, or generating) from
// one whose padding holds the ids and splits over this tp, else
// paddedVocab's. Megatron-LM pads to a multiple of the divisor times tp,
// so a checkpoint saved under tp 2 has more rows than tp 1 would make;
// its own padding lets it resume under another tp, where the rows past
// the ids are masked out of the loss either way.
func resumedVocab(resume string, need, divisible, tp int) int {
	v := paddedVocab(need, divisible, tp)
	if resume == "" {
		return v
	}
	dir, err := checkpoint.Find(resume)
	if err != nil {
		return v // the resume itself says why
	}
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return v
	}
	set, _ := m.Plan.Flags["set"].(string)
	saved, ok := setValue(set, "vocab")
	n, err := strconv.Atoi(saved)
	if !ok || err != nil || n < need || n%max(tp, 1) != 0 {
		return v
	}
	return n
}

// setValue is key's value in a --set list.
func setValue(set, key string) (string, bool) {
	for _, kv := range strings.Split(set, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// source builds the training and held-out samples of the datasets for
// windows of seq tokens (the sample index is built once and cached beside
// the data, then reused), after checking that every id of the data is a
// row of the compiled model's embedding and a class of its loss.
func (td *tokenData) source(c *config, m *ir.Module, seq int, log func(string, ...any)) (data.Source, error) {
	if vocab, where := tokenRange(m); vocab > 0 && int(td.maxID) >= vocab {
		return nil, fmt.Errorf("--data holds token id %d, but the model takes %d (%s): %w; %s",
			td.maxID, vocab, where, data.ErrVocab, vocabFix(c, td))
	}
	split, err := sample.ParseSplit(c.split)
	if err != nil {
		return nil, fmt.Errorf("--split %q: %w", c.split, err)
	}
	var trains, evals []sample.Sampler
	var weights, evalWeights []float64
	var trainGPTs []*sample.GPT
	var caches []string
	for i, ds := range td.sets {
		p := td.parts[i]
		ranges := sample.SplitRanges(ds.NumSequences(), split)
		cache := c.dataCacheDir
		var shared []string
		if cache == "" {
			// Beside the data, or (a read-only dataset) in the user's
			// cache, reading an index built beside the data first.
			cache = sample.DefaultCacheDir(p.Prefix)
			shared = sample.SharedCacheDirs(p.Prefix, cache)
		}
		id := ds.Fingerprint()
		// A part of weight 0 stays in the blend, which draws none of its
		// samples: leaving it out would change the order the others'
		// are drawn in, and a checkpoint's data (which lists it) would
		// resume on other samples.
		zero := ""
		if p.Weight == 0 {
			zero = " (its weight is 0, so it gives no sample, but it is part of the blend's order; leave it out of --data if it cannot hold one)"
		}
		tr, err := sample.NewGPT(ds, sample.Config{Seq: seq, Range: ranges[0], CacheDir: cache, ReadDirs: shared, Identity: id, Shuffle: true})
		if err != nil {
			return nil, fmt.Errorf("--data %s, training split (documents %d..%d of %d, --split %s)%s: %w", p.Prefix, ranges[0][0], ranges[0][1], ds.NumSequences(), c.split, zero, err)
		}
		trains = append(trains, tr)
		trainGPTs, caches = append(trainGPTs, tr), append(caches, cache)
		td.samplers = append(td.samplers, tr)
		weights = append(weights, p.Weight)
		if c.evalBatches >= 0 && len(ranges) > 1 && ranges[1][1] > ranges[1][0] {
			ev, err := sample.NewGPT(ds, sample.Config{Seq: seq, Range: ranges[1], CacheDir: cache, ReadDirs: shared, Identity: id})
			if err != nil {
				return nil, fmt.Errorf("--data %s, held-out split (documents %d..%d of %d, --split %s)%s: %w", p.Prefix, ranges[1][0], ranges[1][1], ds.NumSequences(), c.split, zero, err)
			}
			evals = append(evals, ev)
			td.samplers = append(td.samplers, ev)
			evalWeights = append(evalWeights, p.Weight)
		}
		// Megatron's documents are the index's sequences (a sentence-split
		// dataset has several a document): the split and the shuffle are
		// over them, as Megatron-Core's are, and both counts are said.
		units := fmt.Sprintf("%d documents", ds.NumSequences())
		if ds.NumDocuments() != ds.NumSequences() {
			units = fmt.Sprintf("%d sequences (%d documents split into sentences; --split and the shuffle count sequences, as Megatron-LM's do)", ds.NumSequences(), ds.NumDocuments())
		}
		log("data %s: %s, %d tokens (%s); %d training samples of %d+1 tokens per epoch; index in %s\n",
			p.Prefix, units, ds.Tokens(), ds.DType(), tr.SamplesPerEpoch(), seq, cache)
	}
	if c.evalBatches >= 0 && len(evals) == 0 {
		var docs int64
		for _, ds := range c.tokens.sets {
			docs += int64(ds.NumSequences())
		}
		return nil, fmt.Errorf("--split %s leaves no held-out documents in --data to evaluate on (its %d documents split by those shares give the held-out part none, documents being split whole): give the held-out part a larger share, or turn evaluation off with --eval-batches -1", c.split, docs)
	}
	if err := checkIndexRoom(c, trainGPTs, caches, weights, log); err != nil {
		return nil, err
	}
	var train, eval sample.Sampler = trains[0], nil
	if len(trains) > 1 {
		if train, err = sample.NewBlend(weights, trains); err != nil {
			return nil, fmt.Errorf("--data: %w", err)
		}
	}
	if reads, per := int64(c.steps)*int64(c.Batch), train.SamplesPerEpoch(); c.run && !c.evalOnly && per > 0 && reads > per {
		// Past one epoch the samples repeat, each epoch in a new order,
		// as Megatron's do: said, since it changes what a run learns.
		log("training: --steps %d × --batch %d read %d samples, %.3g epochs of the training split's %d (each epoch shuffled anew)\n",
			c.steps, c.Batch, reads, float64(reads)/float64(per), per)
	}
	switch {
	case len(evals) == 1:
		eval = evals[0]
	case len(evals) > 1:
		// Held-out samples blend with the training weights, as Megatron's
		// validation blend does.
		if eval, err = sample.NewBlend(evalWeights, evals); err != nil {
			return nil, fmt.Errorf("--data, held-out split: %w", err)
		}
	}
	if eval != nil && c.evalBatches > 0 {
		// The held-out batches wrap around a small split, as Megatron's
		// validation sampler does: say so, since the repeats add nothing.
		if held, want := eval.SamplesPerEpoch(), int64(c.evalBatches)*int64(c.Batch); want > held {
			fix := fmt.Sprintf("--eval-batches %d reads each at most once", held/int64(c.Batch))
			if held < int64(c.Batch) {
				fix = fmt.Sprintf("one batch is more than the split: --batch %d or less reads each at most once", held)
			}
			log("held-out split: %d samples, fewer than the %d an evaluation reads (--eval-batches %d × --batch %d), so it reads some twice or more; %s\n",
				held, want, c.evalBatches, c.Batch, fix)
		}
	}
	return sample.New(train, eval, td.describe()).LimitIDs(td.maxID+1, td.maxFrom), nil
}

// checkIndexRoom checks, before training, that the index folders have
// room for the epoch indexes the run will build (each is built the first
// time a step reaches its epoch, so a full disk otherwise shows then,
// perhaps hours in). A folder without room for the first one the run
// needs is refused, unless resuming (whose seed, and so whose files, the
// checkpoint decides); one without room for them all is warned about.
// Each dataset of a blend draws its weight's share of the run's samples.
func checkIndexRoom(c *config, gpts []*sample.GPT, caches []string, weights []float64, log func(string, ...any)) error {
	if c.steps < 1 || c.Batch < 1 {
		return nil
	}
	var sum float64
	for _, w := range weights {
		sum += w
	}
	type room struct{ next, total int64 }
	need := map[string]*room{}
	var dirs []string
	for i, g := range gpts {
		spe := g.SamplesPerEpoch()
		if spe <= 0 || sum <= 0 {
			continue
		}
		samples := int64(math.Ceil(weights[i]/sum*float64(c.steps)*float64(c.Batch))) + 1
		next, total := g.MissingIndexBytes(c.seed, 0, (samples-1)/spe)
		if total == 0 {
			continue
		}
		r := need[caches[i]]
		if r == nil {
			r = &room{}
			need[caches[i]] = r
			dirs = append(dirs, caches[i])
		}
		r.next, r.total = max(r.next, next), r.total+total
	}
	for _, dir := range dirs {
		r := need[dir]
		free, ok := freeSpace(dir) // the nearest folder that exists: an index folder is made with its first file
		if !ok {
			continue
		}
		if free < r.next && c.resume == "" {
			return fmt.Errorf("the sample index folder %s has %s free, and the first epoch index this run builds takes %s: the run would stop at its first step; free some space or give --data-cache-dir another folder",
				dir, lower.HumanBytes(free), lower.HumanBytes(r.next))
		}
		if free < r.total {
			log("warning: the sample index folder %s has %s free; the %s of epoch indexes this run builds (one as a step first reaches each epoch) will not fit: give --data-cache-dir a larger folder\n",
				dir, lower.HumanBytes(free), lower.HumanBytes(r.total))
		}
	}
	return nil
}

// describe names the data for the log and the metrics.
func (td *tokenData) describe() string {
	var parts []string
	for i, p := range td.parts {
		s := p.Prefix
		if len(td.parts) > 1 {
			s = fmt.Sprintf("%.3g × %s", p.Weight, p.Prefix)
		}
		parts = append(parts, fmt.Sprintf("%s (%d tokens)", s, td.sets[i].Tokens()))
	}
	what := strings.Join(parts, " + ")
	if td.tok != nil {
		what += fmt.Sprintf(", tokenizer %s (%s, %d tokens)", td.tok.Path(), td.tok.Kind(), td.tok.VocabSize())
	}
	return what
}

// identity is what resume compares: the datasets (by their contents, not
// their names, so a dataset moved or renamed resumes), their weights, the
// split and the tokenizer. Resuming on other data would go on silently on
// tokens the run never saw in the order it assumed.
func (td *tokenData) identity(c *config) string { return td.identityWith(c, false, false) }

// legacyIdentities are identity as checkpoints saved before it spell it,
// so that they still resume (checkpoint.Expect.DataAlso): each dataset's
// base name before its fingerprint, and --split as it was typed rather
// than its fractions (which made 98/2 another split than 98,2).
func (td *tokenData) legacyIdentities(c *config) []string {
	return []string{td.identityWith(c, true, true), td.identityWith(c, false, true)}
}

// legacyOf says whether id is one of legacyIdentities (false for no
// token data).
func (td *tokenData) legacyOf(c *config, id string) bool {
	return td != nil && slices.Contains(td.legacyIdentities(c), id)
}

func (td *tokenData) identityWith(c *config, named, typedSplit bool) string {
	var b strings.Builder
	for i, p := range td.parts {
		if named {
			fmt.Fprintf(&b, "%g %s %s;", p.Weight, filepath.Base(p.Prefix), td.sets[i].ContentFingerprint())
		} else {
			fmt.Fprintf(&b, "%g %s;", p.Weight, td.sets[i].ContentFingerprint())
		}
	}
	split := c.split
	if w, err := sample.ParseSplit(c.split); err == nil && !typedSplit {
		// The fractions the split's documents follow: "98,2", "98/2" and
		// "49,1" are one split.
		f := make([]string, len(w))
		for i, x := range w {
			f[i] = strconv.FormatFloat(x, 'g', -1, 64)
		}
		split = strings.Join(f, ",")
	}
	fmt.Fprintf(&b, "split %s", split)
	if td.tok != nil {
		fmt.Fprintf(&b, ";tokenizer %s", td.tok.Fingerprint())
	}
	return b.String()
}

// vocabFix says how to give the model the vocabulary the data needs.
func vocabFix(c *config, td *tokenData) string {
	if !strings.HasSuffix(c.Model, ".go") {
		return "a .gir dump has its sizes fixed: compile the model.go with the data (its vocab follows the tokenizer)"
	}
	return fmt.Sprintf("leave vocab out of --set (it then follows %s, padded to %d)", td.where, paddedVocab(td.need, c.vocabDivisible, c.TP))
}

// maxDataVocab bounds a vocabulary taken from a dataset's largest id
// alone (no tokenizer or metadata gives it), as a record's vocab_size is
// bounded.
const maxDataVocab = prepare.MaxVocabSize

// cachedMaxToken is a dataset's largest id: one scan of its .bin the first
// time (a dataset gcompile did not prepare has no metadata saying it),
// remembered in the index cache under the dataset's fingerprint. cached
// names the cache file the id was read from ("" when scanned). The file
// is written with the umask's mode, as the sample index is, so the other
// users of a shared dataset read it rather than scan again.
func cachedMaxToken(ds *indexed.Dataset, prefix, cacheDir string) (id int32, cached string, err error) {
	var shared []string
	if cacheDir == "" {
		cacheDir = sample.DefaultCacheDir(prefix)
		shared = sample.SharedCacheDirs(prefix, cacheDir)
	}
	// A scan done beside a read-only dataset serves every user.
	for _, dir := range append(shared, cacheDir) {
		file := filepath.Join(dir, "maxtoken-"+ds.Fingerprint())
		if n, ok := readMaxToken(file, ds.DType()); ok {
			return n, file, nil
		}
	}
	file := filepath.Join(cacheDir, "maxtoken-"+ds.Fingerprint())
	n, err := ds.MaxToken()
	if err != nil {
		return 0, "", err
	}
	// A cache that cannot be written costs a scan next time, nothing more.
	if os.MkdirAll(cacheDir, 0o755) == nil {
		tmp, err := runtime.CreateTemp(cacheDir, ".maxtoken-*")
		if err == nil {
			_, werr := fmt.Fprintf(tmp, "%d\n", n)
			if cerr := tmp.Close(); werr == nil && cerr == nil {
				_ = os.Rename(tmp.Name(), file)
			} else {
				_ = os.Remove(tmp.Name())
			}
		}
	}
	return n, "", nil
}

// readMaxToken reads a cached largest id. A regular file only: a pipe
// there would hang the read (anything else is replaced when the scan is
// cached again); and an id the dataset's dtype can store, or the file is
// damaged and the scan is made again.
func readMaxToken(file string, dt indexed.DType) (int32, bool) {
	if fi, err := os.Stat(file); err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 32)
	if _, hi := dt.Range(); err != nil || n < 0 || n > int64(hi) {
		return 0, false
	}
	return int32(n), true
}

// vocabMaskPrefix starts the name of the constant nn.CrossEntropy adds to
// masked logits.
const vocabMaskPrefix = "vocab_mask_"

// vocabTables are the params whose rows are the padded vocabulary of a
// model built with classes < vocab, by name, with the rows that are real
// classes: the embedding table the tokens index, and the weight whose rows
// make the masked logits (x·Wᵀ: the tied embedding, or Llama's lm_head).
// --save and export write only those rows, as Hugging Face's vocab_size
// has them, and --load pads them back (padsVocab). The walk goes through
// the ops the passes wrap a param in (casts, gathers, reshapes: one
// argument each), so it finds them under any plan.
func vocabTables(m *ir.Module, classes int) map[string]int {
	vocab, _ := tokenRange(m)
	if classes <= 0 || vocab <= classes {
		return nil
	}
	out := map[string]int{}
	take := func(v *ir.Value) {
		if p := unwrap(v, "param"); p != nil && p.Type.Rank() == 2 && p.Type.Shape[0] == vocab {
			out[p.Name()] = classes
		}
	}
	isMask := func(v *ir.Value) bool {
		c := unwrap(v, "const")
		return c != nil && strings.HasPrefix(c.Name(), vocabMaskPrefix)
	}
	for _, v := range m.Values {
		switch {
		case v.Op == "embedding" && len(v.Args) == 2:
			take(v.Args[0])
		case v.Op == "add" && len(v.Args) == 2 && isMask(v.Args[1]):
			x := v.Args[0]
			for range 8 {
				if x.Op != "reshape" && x.Op != "convert" {
					break
				}
				x = x.Args[0]
			}
			if x.Op == "matmul" && x.Attrs.Bool("transB") && len(x.Args) == 2 {
				take(x.Args[1])
			}
		}
	}
	return out
}

// unwrap is the value of op op that v is, or wraps in one-argument ops
// (casts, gathers, reshapes, broadcasts); nil when there is none.
func unwrap(v *ir.Value, op string) *ir.Value {
	for range 8 {
		if v == nil || v.Op == op {
			return v
		}
		if len(v.Args) != 1 {
			return nil
		}
		v = v.Args[0]
	}
	return nil
}

// trimVocab cuts the padding rows off the vocabulary tables among ts.
func trimVocab(ts []checkpoint.Tensor, tables map[string]int) {
	for i, t := range ts {
		rows, ok := tables[t.Name]
		if !ok || len(t.Shape) != 2 || t.Shape[0] <= rows {
			continue
		}
		per := len(t.Data) / t.Shape[0]
		ts[i].Data = t.Data[:rows*per]
		ts[i].Shape = []int{rows, t.Shape[1]}
	}
}

// tokenizerDifference says what differs between the tokenizer a dataset
// was prepared with (its record) and tok, as far as the record tells: the
// vocabulary's size, or the end- or beginning-of-document token, which
// the tokenizer_config.json beside a tokenizer.json sets (without it
// they are guessed by name); else its tokens or merges.
func tokenizerDifference(meta prepare.Meta, tok *tokenizer.Tokenizer) string {
	if meta.VocabSize != tok.VocabSize() {
		return fmt.Sprintf("their vocabularies differ: %d tokens, and %d", meta.VocabSize, tok.VocabSize())
	}
	idOf := func(id int32, ok bool) int32 {
		if !ok {
			return -1
		}
		return id
	}
	name := func(id int32) string {
		if id < 0 {
			return "none"
		}
		return fmt.Sprintf("%q (%d)", tok.Decode([]int32{id}), id)
	}
	if eos := idOf(tok.EOS()); meta.EOS != eos {
		return fmt.Sprintf("the data ends each document with %s, and this tokenizer's end-of-document token is %s: the tokenizer_config.json beside it, which names it, differs or is missing", name(meta.EOS), name(eos))
	}
	if meta.BOS != nil {
		if bos := idOf(tok.BOS()); *meta.BOS != bos {
			return fmt.Sprintf("the data begins each document with %s, and this tokenizer's beginning-of-document token is %s: the tokenizer_config.json beside it, which names it, differs or is missing", name(*meta.BOS), name(bos))
		}
	}
	return "the same number of tokens, and other tokens or merges"
}
