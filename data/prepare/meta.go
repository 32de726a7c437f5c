package prepare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"gcompile/data/indexed"
	"gcompile/internal/filekind"
)

// metaFormat marks a PREFIX.json as ours, so that an unrelated file under
// that name (a foreign dataset's notes, an input) is never taken for one.
const metaFormat = "gcompile indexed dataset"

// metaVersion is the version written; ReadMeta refuses newer ones.
const metaVersion = 1

// Meta is PREFIX.json, what made a dataset: it lets training check that a
// tokenizer matches the data and size the model's vocabulary without
// scanning the .bin for its largest id.
type Meta struct {
	// Format marks the file as this package's ("gcompile indexed
	// dataset"), so that another tool's JSON under that name is ignored.
	Format string `json:"format"`
	// Version is the layout of this file, 1; ReadMeta refuses newer ones.
	Version int `json:"version"`
	// Documents and Tokens are what the dataset holds, end-of-document ids
	// included.
	Documents int64 `json:"documents"`
	Tokens    int64 `json:"tokens"`
	// DType is how the .bin stores the tokens.
	DType indexed.DType `json:"dtype"`
	// MaxToken is the largest id in the .bin.
	MaxToken int32 `json:"max_token"`
	// VocabSize is the encoder's vocabulary size.
	VocabSize int `json:"vocab_size"`
	// EOS is the end-of-document id appended to each document, -1 if none.
	EOS int32 `json:"eos"`
	// BOS is the beginning-of-document id prepended to each document; nil
	// if none (and in files written before it was recorded).
	BOS *int32 `json:"bos,omitempty"`
	// Tokenizer and TokenizerPath are Options.Tokenizer and
	// Options.TokenizerPath: the encoder's fingerprint and origin.
	Tokenizer     string `json:"tokenizer"`
	TokenizerPath string `json:"tokenizer_path"`
	// JSONKey is the JSON Lines field the text was read from.
	JSONKey string `json:"json_key"`
	// EmptyDocuments and SkippedLines are what was left out.
	EmptyDocuments int64 `json:"empty_documents"`
	SkippedLines   int64 `json:"skipped_lines"`
	// BinBytes and IdxBytes are the sizes of the files described, which
	// ReadMeta checks so that a dataset rewritten by another tool is not
	// described by a stale file.
	BinBytes int64 `json:"bin_bytes"`
	IdxBytes int64 `json:"idx_bytes"`
}

func metaPath(prefix string) string { return prefix + ".json" }

// MaxVocabSize bounds the vocabulary a dataset's record, or its largest
// id alone, may give a model: 2^24 rows, far past any published
// tokenizer's (Gemma's 256k).
const MaxVocabSize = 1 << 24

func metaOf(c config, s Summary) Meta {
	var bos *int32
	if c.bos >= 0 {
		bos = &c.bos
	}
	return Meta{
		Format: metaFormat, Version: metaVersion,
		Documents: s.Documents, Tokens: s.Tokens, DType: c.dtype, MaxToken: s.MaxToken,
		VocabSize: c.vocabSize, EOS: c.eos, BOS: bos, Tokenizer: c.Tokenizer, TokenizerPath: c.TokenizerPath,
		JSONKey: c.JSONKey, EmptyDocuments: s.EmptyDocuments, SkippedLines: s.SkippedLines,
		BinBytes: s.BinBytes, IdxBytes: s.IdxBytes,
	}
}

// ReadMeta reads PREFIX.json. ok is false, with no error, when there is no
// such file or it is JSON that is not ours: a dataset from Megatron-LM's
// tools, whose largest id must then be found by a scan
// (indexed.Dataset.MaxToken). A file that is not JSON (a record cut
// short), or one of ours that is damaged, newer than this reader, or
// describes files of other sizes than PREFIX.bin and PREFIX.idx, is an
// ErrMeta error.
func ReadMeta(prefix string) (Meta, bool, error) {
	path := metaPath(prefix)
	// Stat before opening: opening a FIFO for reading waits for a writer,
	// so a FIFO in place of PREFIX.json would hang the run.
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, false, nil
	}
	if err != nil {
		return Meta{}, false, fmt.Errorf("%s: %w: %w", path, ErrMeta, err)
	}
	if !fi.Mode().IsRegular() {
		return Meta{}, false, fmt.Errorf("%s: %w: not a regular file (%s)", path, ErrMeta, filekind.Of(fi.Mode()))
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return Meta{}, false, fmt.Errorf("%s: %w: %w", path, ErrMeta, err)
	}
	// A file that is not JSON at all is not taken for someone else's: a
	// record cut short (a copy that stopped, a full disk) is one, and
	// ignoring it would train with any tokenizer unchecked.
	var first json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&first); err != nil {
		return Meta{}, false, fmt.Errorf("%s is not a readable dataset record (%w): prepare the dataset again, or remove the file to train without the tokenizer check: %w", path, err, ErrMeta)
	}
	var probe struct {
		Format string `json:"format"`
	}
	if json.Unmarshal(first, &probe) != nil || probe.Format != metaFormat {
		return Meta{}, false, nil
	}
	var m Meta
	if err := json.Unmarshal(raw, &m); err != nil {
		return Meta{}, false, fmt.Errorf("%s: %w: %w (delete it: the dataset then reads as one without metadata)", path, ErrMeta, err)
	}
	switch {
	case m.Version > metaVersion:
		return Meta{}, false, fmt.Errorf("%s: %w: version %d, newer than the %d this gcompile reads: update gcompile", path, ErrMeta, m.Version, metaVersion)
	case m.Version < 1:
		return Meta{}, false, fmt.Errorf("%s: %w: version %d, want 1..%d", path, ErrMeta, m.Version, metaVersion)
	case m.MaxToken < 0 || (m.VocabSize > 0 && int(m.MaxToken) >= m.VocabSize):
		return Meta{}, false, fmt.Errorf("%s: %w: max_token %d does not fit vocab_size %d", path, ErrMeta, m.MaxToken, m.VocabSize)
	case m.VocabSize < 0 || m.VocabSize > MaxVocabSize:
		// The model's tables follow vocab_size: a damaged one would
		// allocate them before any other check.
		return Meta{}, false, fmt.Errorf("%s: %w: vocab_size %d, want 0 (unknown) to %d (2^24, far past any published tokenizer's)", path, ErrMeta, m.VocabSize, MaxVocabSize)
	}
	if _, hi := m.DType.Range(); hi >= 0 && m.MaxToken > hi {
		return Meta{}, false, fmt.Errorf("%s: %w: max_token %d cannot be stored as its dtype %v (at most %d)", path, ErrMeta, m.MaxToken, m.DType, hi)
	}
	for _, f := range []struct {
		ext  string
		want int64
	}{{".bin", m.BinBytes}, {".idx", m.IdxBytes}} {
		info, err := os.Stat(prefix + f.ext)
		if err != nil {
			return Meta{}, false, fmt.Errorf("%s: %w: the file it describes: %w", path, ErrMeta, err)
		}
		if info.Size() != f.want {
			return Meta{}, false, fmt.Errorf("%s: %w: it describes a %s of %d bytes, but %s%s has %d: the dataset was rewritten after it was prepared; delete %s or prepare the dataset again",
				path, ErrMeta, f.ext, f.want, prefix, f.ext, info.Size(), path)
		}
	}
	return m, true, nil
}

// writeMetaTemp writes the record m of the dataset at prefix to a
// temporary file beside PREFIX.json, synced to disk, and returns its name:
// indexed.Writer.Commit renames it into place with the dataset.
func writeMetaTemp(prefix string, m Meta) (string, error) {
	path := metaPath(prefix)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	b = append(b, '\n')
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	merr := tmp.Chmod(0o644) // readable like the dataset it describes
	_, werr := tmp.Write(b)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(merr, werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("write the record %s: %w", path, err)
	}
	return tmp.Name(), nil
}
