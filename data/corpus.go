package data

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// DefaultMaxBytes caps how much text Load reads when Options.MaxBytes is 0.
// 16 MiB is enough text for small models to learn from while keeping
// start-up well under a second.
const DefaultMaxBytes int64 = 16 << 20

// DefaultEvalFraction is the share of files held out when
// Options.EvalFraction is 0: enough text for a stable evaluation loss
// without starving training.
const DefaultEvalFraction = 0.05

// binarySniffLen is how much of a file is inspected for NUL bytes when
// deciding whether a file in a user-given folder is text.
const binarySniffLen = 8 << 10

// ErrNoFiles is wrapped by Load when a folder holds no file it can use, so
// callers can tell "wrong folder" apart from I/O failures.
var ErrNoFiles = errors.New("no usable files")

// ErrBinary is wrapped by Load when the file given as the corpus looks
// binary (a NUL byte in its first 8 KiB): a folder skips such files, and a
// file named on its own is refused for the same reason, not trained on.
var ErrBinary = errors.New("binary file")

// ErrVocab is wrapped by Corpus.CheckVocab when the text holds a byte that
// is no token of the model.
var ErrVocab = errors.New("byte outside the vocabulary")

// ErrTooSmall is wrapped by Corpus.Check when a split cannot hold a single
// training window, so callers can suggest a larger MaxBytes or corpus.
var ErrTooSmall = errors.New("corpus too small")

// Options selects the text to train on. The zero value is usable: it means
// 16 MiB of the Go standard library sources with 5% of files held out.
type Options struct {
	// Path is a file or folder. "" means the .go files under
	// $(go env GOROOT)/src, which every Go installation has.
	Path string
	// MaxBytes caps the bytes read in total (0 means DefaultMaxBytes), so
	// start-up stays fast even on a large tree.
	MaxBytes int64
	// EvalFraction is the share of files (or, for a single file, of bytes)
	// held out for evaluation; 0 means DefaultEvalFraction.
	EvalFraction float64
}

// Corpus holds the training and evaluation text as raw bytes; each byte is
// one token, so no tokenizer has to be shipped or versioned.
type Corpus struct {
	// Source describes where the text came from, for logs and run
	// reports, e.g. "/usr/local/go/src (*.go, 812 files, 16.0 MiB)".
	Source string
	// Train and Eval are the concatenated file contents of each split.
	Train, Eval []byte
	// TrainFiles and EvalFiles count the files that contributed bytes to
	// each split (both are 1 in single-file mode).
	TrainFiles, EvalFiles int
}

// DefaultPath returns the folder of the default corpus, GOROOT/src. It
// prefers runtime.GOROOT() because it needs no subprocess, and falls back to
// `go env GOROOT` for binaries built with -trimpath or moved to another
// machine, where the compiled-in root may not exist.
func DefaultPath() (string, error) {
	return locateGoSrc(runtime.GOROOT(), goEnvGOROOT)
}

// goEnvGOROOT asks the go command where its sources are.
func goEnvGOROOT() (string, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("`go env GOROOT` failed: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// ErrNoDefaultCorpus is the default corpus, the Go installation's
// sources, not found (a machine without Go): name a text file or folder
// (Options.Path) instead.
var ErrNoDefaultCorpus = errors.New("no default corpus (the Go installation's sources)")

// locateGoSrc returns root/src when that folder exists and otherwise the
// src folder of the root that goEnv reports (ErrNoDefaultCorpus when
// neither has one); it is split from DefaultPath so
// tests can exercise the fallback.
func locateGoSrc(root string, goEnv func() (string, error)) (string, error) {
	var tried string
	if root != "" {
		src := filepath.Join(root, "src")
		if isDir(src) {
			return src, nil
		}
		tried = fmt.Sprintf("runtime.GOROOT() gave %q, which has no src folder", root)
	} else {
		tried = "runtime.GOROOT() is empty"
	}
	envRoot, err := goEnv()
	if err != nil {
		return "", fmt.Errorf("data: %w: cannot locate the Go sources (%s): %w", ErrNoDefaultCorpus, tried, err)
	}
	src := filepath.Join(envRoot, "src")
	if envRoot == "" || !isDir(src) {
		return "", fmt.Errorf("data: %w: cannot locate the Go sources (%s; `go env GOROOT` gave %q, which has no src folder): %w",
			ErrNoDefaultCorpus, tried, envRoot, fs.ErrNotExist)
	}
	return src, nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// Load reads the corpus described by opts and splits it into training and
// evaluation text, so that the rest of the trainer only ever sees two byte
// slices.
//
// In a folder it takes regular files (symlinks are not followed, hidden
// files and folders such as .git are skipped): only *.go files for the
// default GOROOT corpus, and for a user folder every file without a NUL
// byte in its first 8 KiB. Each file goes to evaluation when the FNV-1a
// hash of its slash-separated path relative to the folder, mod 1000, is
// below EvalFraction·1000; files are read in hash order until each split
// has its share of MaxBytes (the last file of a split may be cut short).
// A single file is split by bytes instead: its last EvalFraction is held
// out.
func Load(opts Options) (*Corpus, error) {
	maxBytes := opts.MaxBytes
	switch {
	case maxBytes < 0:
		return nil, fmt.Errorf("data: MaxBytes is %d, must not be negative", maxBytes)
	case maxBytes == 0:
		maxBytes = DefaultMaxBytes
	}
	frac := opts.EvalFraction
	switch {
	case math.IsNaN(frac) || frac < 0 || frac >= 1:
		return nil, fmt.Errorf("data: EvalFraction is %v, must be in [0, 1)", frac)
	case frac == 0:
		frac = DefaultEvalFraction
	}

	path, goOnly := opts.Path, false
	if path == "" {
		var err error
		if path, err = DefaultPath(); err != nil {
			return nil, err
		}
		goOnly = true
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: corpus path %s: %w", path, err)
	}
	switch {
	case fi.IsDir():
		return loadDir(path, goOnly, maxBytes, frac)
	case fi.Mode().IsRegular():
		return loadFile(path, maxBytes, frac)
	default:
		return nil, fmt.Errorf("data: corpus path %s is neither a regular file nor a folder (mode %v): %w", path, fi.Mode(), ErrNoFiles)
	}
}

// loadFile splits one file by bytes: the last frac of what was read is
// held out, since there are no files to split by.
func loadFile(path string, maxBytes int64, frac float64) (*Corpus, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: open corpus file: %w", err)
	}
	defer f.Close()
	buf, err := io.ReadAll(io.LimitReader(f, maxBytes))
	if err != nil {
		return nil, fmt.Errorf("data: read corpus file %s: %w", path, err)
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("data: corpus file %s is empty: %w", path, ErrNoFiles)
	}
	// The sniff a folder's files get (see readTextFile), on the bytes
	// read: a binary file would only teach the model noise. Past MaxBytes
	// nothing is trained on, so a short prefix is all that is looked at.
	if i := bytes.IndexByte(buf[:min(len(buf), binarySniffLen)], 0); i >= 0 {
		return nil, fmt.Errorf("data: corpus file %s looks binary (a NUL byte at offset %d of its first %d KiB; a folder's binary files are skipped): give a text file or a folder: %w",
			path, i, binarySniffLen>>10, ErrBinary)
	}
	nEval := int(math.Round(float64(len(buf)) * frac))
	cut := len(buf) - nEval
	return &Corpus{
		Source:     fmt.Sprintf("%s (single file, last %.0f%% held out, %s)", path, frac*100, mib(len(buf))),
		Train:      buf[:cut:cut],
		Eval:       buf[cut:],
		TrainFiles: 1,
		EvalFiles:  1,
	}, nil
}

// candidate is a file found by the walk, before any of it is read.
type candidate struct {
	abs  string
	rel  string // slash-separated, relative to the root: the stable identity
	hash uint64
	eval bool
}

// pathHash is the stable identity used both for the split and the order:
// FNV-1a of the slash-separated relative path, so the same tree gives the
// same answer on every OS and for every seed.
func pathHash(rel string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(rel)) // hash.Hash never fails
	return h.Sum64()
}

// isEvalFile reports whether a file belongs to the evaluation split. It
// depends only on the relative path, so adding files elsewhere or changing
// the seed never moves a file between splits.
func isEvalFile(rel string, frac float64) bool {
	return pathHash(rel)%1000 < uint64(math.Round(frac*1000))
}

func loadDir(root string, goOnly bool, maxBytes int64, frac float64) (*Corpus, error) {
	var files []candidate
	links := 0 // files reached by a link inside the folder, not read
	// A root that is a link to a folder is walked as that folder:
	// WalkDir does not follow the root's link, and found no file in it.
	walk := root
	if resolved, err := filepath.EvalSymlinks(root); err == nil {
		walk = resolved
	}
	err := filepath.WalkDir(walk, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walk %s: %w", p, err)
		}
		name := d.Name()
		if d.IsDir() {
			// Hidden folders (.git, .cache, ...) hold tool state, not text.
			if p != walk && strings.HasPrefix(name, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 && !strings.HasPrefix(name, ".") {
			links++
		}
		if !d.Type().IsRegular() || strings.HasPrefix(name, ".") {
			return nil
		}
		if goOnly && filepath.Ext(name) != ".go" {
			return nil
		}
		rel, err := filepath.Rel(walk, p)
		if err != nil {
			return fmt.Errorf("relative path of %s: %w", p, err)
		}
		rel = filepath.ToSlash(rel)
		files = append(files, candidate{abs: p, rel: rel, hash: pathHash(rel), eval: isEvalFile(rel, frac)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("data: corpus folder %s: %w", root, err)
	}
	kind := "text files"
	if goOnly {
		kind = "*.go"
	}
	if len(files) == 0 {
		if links > 0 {
			what := "its symbolic link is"
			if links > 1 {
				what = fmt.Sprintf("its %d symbolic links are", links)
			}
			return nil, fmt.Errorf("data: corpus folder %s has no %s (%s not followed: a link could lead out of the folder or round it; give a folder of the files themselves, or a link to that folder): %w", root, kind, what, ErrNoFiles)
		}
		return nil, fmt.Errorf("data: corpus folder %s has no %s: %w", root, kind, ErrNoFiles)
	}

	// Hash order is a deterministic shuffle: a MaxBytes prefix samples the
	// whole tree instead of whichever package sorts first.
	slices.SortFunc(files, func(a, b candidate) int {
		if a.hash != b.hash {
			if a.hash < b.hash {
				return -1
			}
			return 1
		}
		return strings.Compare(a.rel, b.rel)
	})

	evalBudget := int64(math.Round(float64(maxBytes) * frac))
	trainBudget := maxBytes - evalBudget
	var train, eval bytes.Buffer
	c := &Corpus{}
	for _, f := range files {
		buf, budget, count := &train, trainBudget, &c.TrainFiles
		if f.eval {
			buf, budget, count = &eval, evalBudget, &c.EvalFiles
		}
		if int64(train.Len()) >= trainBudget && int64(eval.Len()) >= evalBudget {
			break
		}
		room := budget - int64(buf.Len())
		if room <= 0 {
			continue
		}
		content, err := readTextFile(f.abs, room, !goOnly)
		if err != nil {
			return nil, fmt.Errorf("data: corpus folder %s: %w", root, err)
		}
		if len(content) == 0 {
			continue
		}
		buf.Write(content)
		*count++
	}
	total := train.Len() + eval.Len()
	if total == 0 {
		return nil, fmt.Errorf("data: corpus folder %s has no non-empty %s: %w", root, kind, ErrNoFiles)
	}
	c.Train, c.Eval = train.Bytes(), eval.Bytes()
	c.Source = fmt.Sprintf("%s (%s, %d files, %s)", root, kind, c.TrainFiles+c.EvalFiles, mib(total))
	return c, nil
}

// readTextFile reads at most limit bytes of path. With sniff set it returns
// nothing for a file with a NUL byte in its first 8 KiB, the usual sign of
// a binary file that would only teach the model noise.
func readTextFile(path string, limit int64, sniff bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read text file: %w", err)
	}
	defer f.Close()
	if sniff {
		head := make([]byte, binarySniffLen)
		n, err := io.ReadFull(f, head)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if bytes.IndexByte(head[:n], 0) >= 0 {
			return nil, nil
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("seek %s: %w", path, err)
		}
	}
	content, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return content, nil
}

func mib(n int) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Check reports whether both splits are long enough to draw windows of
// seq+1 bytes. Call it once before training: the batch functions have no
// error result and return nil for a corpus that is too small.
func (c *Corpus) Check(seq int) error {
	if err := c.CheckTrain(seq); err != nil {
		return err
	}
	if need := seq + 1; len(c.Eval) <= need {
		return fmt.Errorf("data: %s: evaluation split has %d bytes from %d files, needs more than %d for one window of sequence length %d (read more of the corpus, or add files): %w",
			c.Source, len(c.Eval), c.EvalFiles, need, seq, ErrTooSmall)
	}
	return nil
}

// CheckTrain is Check for a run that evaluates nothing: the training
// split alone must hold a window.
func (c *Corpus) CheckTrain(seq int) error {
	if c == nil {
		return errors.New("data: corpus is nil")
	}
	if seq < 1 {
		return fmt.Errorf("data: sequence length %d must be at least 1", seq)
	}
	if need := seq + 1; len(c.Train) <= need {
		return fmt.Errorf("data: %s: training split has %d bytes, needs more than %d for one window of sequence length %d (read more of the corpus, or use a larger one): %w",
			c.Source, len(c.Train), need, seq, ErrTooSmall)
	}
	return nil
}

// CheckVocab reports whether every byte of both splits is a token of a
// model with vocab tokens: each byte is one token, so a model whose vocab
// is below 256 cannot take every text, and a byte ≥ vocab would index past
// its embedding table. Call it once before training, as Check.
func (c *Corpus) CheckVocab(vocab int) error {
	if c == nil {
		return errors.New("data: corpus is nil")
	}
	if vocab >= 256 {
		return nil
	}
	for _, split := range []struct {
		name string
		text []byte
	}{{"training", c.Train}, {"evaluation", c.Eval}} {
		for i, b := range split.text {
			if int(b) >= vocab {
				return fmt.Errorf("data: %s: the %s split has byte %d at offset %d, not a token of a model with vocab %d (bytes are tokens: 0..%d): %w",
					c.Source, split.name, b, i, vocab, vocab-1, ErrVocab)
			}
		}
	}
	return nil
}

// Reads says whether Load of the folder root reads the file at path:
// inside root, under no hidden folder, not hidden itself, a regular file
// (a link is not followed), and text by its first 8 KiB. It is how a run
// tells an output it would write over its corpus from one beside it.
func Reads(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return false
	}
	for _, part := range strings.Split(filepath.ToSlash(rel), "/") {
		if strings.HasPrefix(part, ".") {
			return false
		}
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	text, err := readTextFile(path, binarySniffLen, true)
	return err == nil && text != nil
}
