package tokenizer

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"gcompile/internal/filekind"
)

// Load reads a tokenizer: path is a tokenizer.json, a folder holding
// tokenizer.json, or GPT-2's vocab.json/encoder.json, in which case merges
// (merges.txt/vocab.bpe) must be given (a folder holding vocab.json+merges.txt
// or encoder.json+vocab.bpe also works). merges is "" otherwise.
//
// Any of these files may be gzipped (recognised by its magic bytes, whatever
// its name), and a folder is searched for name.gz as well as name, so large
// tokenizer.json files can be kept compressed. A tokenizer_config.json (or
// .gz) beside the main file supplies the eos_token and bos_token; without
// one they are found by their usual names (see EOS).
//
// A GPT-2 pair gets the HF GPT-2 tokenizer's behaviour: the GPT-2 split
// pattern, no prefix space, and <|endoftext|> as a special token that is
// never split.
func Load(path, merges string) (*Tokenizer, error) {
	main, mergesPath, err := resolve(path, merges)
	if err != nil {
		return nil, err
	}
	data, err := readFile(main)
	if err != nil {
		return nil, err
	}
	top, err := topLevel(main, data)
	if err != nil {
		return nil, err
	}
	var sp *spec
	if m := bytes.TrimSpace(top["model"]); len(m) > 0 && m[0] == '{' {
		if mergesPath != "" {
			return nil, fmt.Errorf("%w: %s is a tokenizer.json, which holds its own merges, but a merges file (%s) was given too", ErrFormat, main, mergesPath)
		}
		sp, err = parseTokenizerJSON(main, top)
	} else {
		if !looksLikeVocab(top) {
			return nil, fmt.Errorf("%w: %s is neither a tokenizer.json (no \"model\" key) nor a GPT-2 vocab.json (token to id)", ErrFormat, main)
		}
		if mergesPath == "" {
			return nil, fmt.Errorf("%w: %s is a GPT-2 vocab.json/encoder.json; give its merges.txt/vocab.bpe", ErrMissingMerges, main)
		}
		sp, err = parsePair(main, top, mergesPath)
	}
	if err != nil {
		return nil, err
	}
	if err := readConfig(sp, filepath.Dir(main)); err != nil {
		return nil, err
	}
	return build(sp)
}

// resolve turns Load's arguments into the main file and the merges file.
func resolve(path, merges string) (main, mergesPath string, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("tokenizer: %w", err)
	}
	if !fi.IsDir() {
		return path, merges, nil
	}
	if p := findFile(path, "tokenizer.json"); p != "" {
		if merges != "" {
			return "", "", fmt.Errorf("%w: %s holds a tokenizer.json, which holds its own merges, but a merges file (%s) was given too", ErrFormat, path, merges)
		}
		return p, "", nil
	}
	for _, pair := range [][2]string{{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}} {
		v := findFile(path, pair[0])
		if v == "" {
			continue
		}
		if merges != "" {
			return v, merges, nil
		}
		m := findFile(path, pair[1])
		if m == "" {
			return "", "", fmt.Errorf("%w: %s holds %s but no %s", ErrMissingMerges, path, filepath.Base(v), pair[1])
		}
		return v, m, nil
	}
	return "", "", fmt.Errorf("tokenizer: %s: no tokenizer.json, vocab.json+merges.txt or encoder.json+vocab.bpe in this folder: %w", path, fs.ErrNotExist)
}

// FolderFiles are the names Load reads in a tokenizer's folder, each
// also gzipped (NAME.gz): what a run that reads the folder must not
// write over.
var FolderFiles = []string{"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe"}

// ReadPaths are the files Load(path, merges) reads or would read, each
// also gzipped (NAME.gz): a folder's FolderFiles, or the file, the merges
// file and the tokenizer_config.json beside the file. An output written
// over one of them would destroy the tokenizer or, over a config not yet
// there, change it.
func ReadPaths(path, merges string) []string {
	var names []string
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		for _, n := range FolderFiles {
			names = append(names, filepath.Join(path, n))
		}
	} else {
		names = append(names, path, filepath.Join(filepath.Dir(path), "tokenizer_config.json"))
	}
	if merges != "" {
		names = append(names, merges)
	}
	var out []string
	for _, n := range names {
		out = append(out, n, n+".gz")
	}
	return out
}

// findFile returns dir/name or dir/name.gz, whichever exists first, or "".
func findFile(dir, name string) string {
	for _, n := range []string{name, name + ".gz"} {
		p := filepath.Join(dir, n)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	return ""
}

// readFile reads a whole file, gunzipping it when it starts with gzip's magic
// bytes. Anything but a regular file is refused before it is opened:
// opening a FIFO for reading waits for a writer, so one named as a
// tokenizer, merges or config file would hang the run.
func readFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s: not a regular file (%s)", ErrFormat, path, filekind.Of(fi.Mode()))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
		return data, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: gzip: %v", ErrFormat, path, err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, int64(maxTokenizerFile)+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: gzip: %v", ErrFormat, path, err)
	}
	if len(out) > maxTokenizerFile {
		// A few MB compress to a bomb of gigabytes, which ran the
		// process out of memory.
		return nil, fmt.Errorf("%w: %s: unpacks to more than %d MiB; no tokenizer file is that large", ErrFormat, path, maxTokenizerFile>>20)
	}
	return out, nil
}

// maxTokenizerFile bounds what a gzipped tokenizer file may unpack to:
// the largest published tokenizer.json files are tens of MB.
var maxTokenizerFile = 512 << 20

// topLevel splits a JSON object into its members without decoding them.
func topLevel(path string, data []byte) (map[string]json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		var kind *json.UnmarshalTypeError
		if errors.As(err, &kind) && kind.Field == "" {
			// Valid JSON of another kind: say which, not Go's types.
			return nil, fmt.Errorf("%w: %s: the file is a JSON %s, want a JSON object (a tokenizer.json, or a vocab.json of tokens to ids)", ErrFormat, path, kind.Value)
		}
		if other := otherFormat(data); other != "" {
			return nil, fmt.Errorf("%w: %s: %v: it looks like %s, which is not read here; give the model's tokenizer.json (Hugging Face's model repositories ship one beside it)", ErrFormat, path, err, other)
		}
		if looksLikeMerges(data) {
			return nil, fmt.Errorf("%w: %s: %v: it looks like a merges file (merges.txt, vocab.bpe), not a tokenizer.json or vocab.json: the vocabulary and the merges file may be swapped", ErrFormat, path, err)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, path, err)
	}
	if top == nil {
		return nil, fmt.Errorf("%w: %s: not a JSON object", ErrFormat, path)
	}
	return top, nil
}

// looksLikeVocab says whether a JSON object maps tokens to ids, as GPT-2's
// vocab.json does.
func looksLikeVocab(top map[string]json.RawMessage) bool {
	if len(top) == 0 {
		return false
	}
	for _, v := range top {
		if len(v) == 0 || !(v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
			return false
		}
	}
	return true
}

// jsonModel is the part of tokenizer.json's "model" this package reads; the
// vocabulary and merges stay raw until the type is known to be BPE, because
// other model types spell them differently.
type jsonModel struct {
	Type                    string          `json:"type"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Dropout                 *float64        `json:"dropout"`
}

type jsonAdded struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type jsonPattern struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

// jsonComponent covers the fields of the normalizers, pre-tokenizers and
// decoders this package understands; each type reads the ones it has.
type jsonComponent struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Decoders       []json.RawMessage `json:"decoders"`
	Pattern        *jsonPattern      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Prepend        *string           `json:"prepend"`
	Content        *string           `json:"content"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
	Replacement    *string           `json:"replacement"`
	PrependScheme  *string           `json:"prepend_scheme"`
	Split          *bool             `json:"split"`
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

func parseTokenizerJSON(path string, top map[string]json.RawMessage) (*spec, error) {
	var m jsonModel
	if err := json.Unmarshal(top["model"], &m); err != nil {
		return nil, fmt.Errorf("%w: %s: model: %v", ErrFormat, path, err)
	}
	typ := m.Type
	if typ == "" && m.Merges != nil {
		typ = "BPE" // files written before the type tag existed
	}
	if typ != "BPE" {
		if typ == "" {
			typ = "(none)"
		}
		return nil, fmt.Errorf("%w: %s: model.type %q: only BPE (byte-level or SentencePiece-style) is built", ErrUnsupported, path, typ)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return nil, fmt.Errorf("%w: %s: BPE continuing_subword_prefix %q", ErrUnsupported, path, *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("%w: %s: BPE end_of_word_suffix %q", ErrUnsupported, path, *m.EndOfWordSuffix)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("%w: %s: BPE dropout %v makes ids random", ErrUnsupported, path, *m.Dropout)
	}
	sp := &spec{path: path, byteFallback: m.ByteFallback, fuseUnk: m.FuseUnk, ignoreMerges: m.IgnoreMerges, unk: m.UnkToken}
	var err error
	if sp.vocab, err = parseVocab(m.Vocab); err != nil {
		return nil, fmt.Errorf("%w: %s: model.vocab: %v", ErrFormat, path, err)
	}
	if sp.merges, err = parseMerges(m.Merges); err != nil {
		return nil, fmt.Errorf("%w: %s: model.merges: %v", ErrFormat, path, err)
	}
	if raw, ok := top["added_tokens"]; ok && !isNull(raw) {
		var added []jsonAdded
		if err := json.Unmarshal(raw, &added); err != nil {
			return nil, fmt.Errorf("%w: %s: added_tokens: %v", ErrFormat, path, err)
		}
		seen := map[int64]string{}
		for i, a := range added {
			if a.ID == nil || *a.ID < 0 || *a.ID >= maxID {
				return nil, fmt.Errorf("%w: %s: added_tokens[%d] (%q): missing or out-of-range id", ErrFormat, path, i, a.Content)
			}
			// Two contents under one id: text would encode to an id that
			// decodes as the other.
			if other, dup := seen[*a.ID]; dup && other != a.Content {
				return nil, fmt.Errorf("%w: %s: added_tokens %q and %q share id %d", ErrFormat, path, other, a.Content, *a.ID)
			}
			seen[*a.ID] = a.Content
			normalized := !a.Special // the HF default when the flag is absent
			if a.Normalized != nil {
				normalized = *a.Normalized
			}
			sp.added = append(sp.added, addedToken{id: int32(*a.ID), content: a.Content, singleWord: a.SingleWord,
				lstrip: a.LStrip, rstrip: a.RStrip, normalized: normalized})
		}
	}
	byteLevel := false
	if raw := top["pre_tokenizer"]; !isNull(raw) {
		if byteLevel, err = parsePreTokenizer(sp, raw); err != nil {
			return nil, fmt.Errorf("%s: pre_tokenizer: %w", path, err)
		}
	}
	if raw := top["normalizer"]; !isNull(raw) {
		if err := parseNormalizer(sp, raw); err != nil {
			return nil, fmt.Errorf("%s: normalizer: %w", path, err)
		}
	}
	switch {
	case byteLevel:
		sp.kind = kindByteLevel
	case sp.byteFallback || hasMetaNormalizer(sp.norm) || sp.meta != nil:
		sp.kind = kindSentencePiece
	default:
		return nil, fmt.Errorf("%w: %s: BPE with neither a ByteLevel pre-tokenizer nor SentencePiece's byte_fallback, %q normalizer or Metaspace pre-tokenizer", ErrUnsupported, path, metaSpace)
	}
	if err := checkFirstScheme(sp); err != nil {
		return nil, fmt.Errorf("%s: pre_tokenizer: %w", path, err)
	}
	// Byte-level BPE decodes by its byte map, whatever the decoder says.
	if raw := top["decoder"]; !isNull(raw) && sp.kind == kindSentencePiece {
		if err := parseDecoder(sp, raw); err != nil {
			return nil, fmt.Errorf("%s: decoder: %w", path, err)
		}
	}
	if sp.kind == kindSentencePiece && len(sp.decoder) == 0 {
		// No decoder this package knows: decode as Llama 2's does.
		sp.decoder = llamaDecoder
	}
	return sp, nil
}

// llamaDecoder is Llama 2's decoder: ▁ is a space, <0xNN> tokens are
// bytes, and one leading space of the whole is dropped.
var llamaDecoder = []decStep{
	{kind: decReplace, from: metaSpace, to: " "},
	{kind: decByteFallback},
	{kind: decFuse},
	{kind: decStrip, char: ' ', start: 1},
}

// Known split patterns, matched by their exact text as tokenizer.json
// spells them.
const (
	patternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var knownPatterns = map[string]pattern{
	patternGPT2:   patGPT2,
	patternLlama3: patLlama3,
	patternQwen2:  patQwen2,
}

// parsePreTokenizer turns the pre-tokenizer into steps; it reports whether
// a ByteLevel pre-tokenizer was present.
func parsePreTokenizer(sp *spec, raw json.RawMessage) (bool, error) {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return false, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	var parts []jsonComponent
	if c.Type == "Sequence" {
		for _, r := range c.Pretokenizers {
			var p jsonComponent
			if err := json.Unmarshal(r, &p); err != nil {
				return false, fmt.Errorf("%w: %v", ErrFormat, err)
			}
			parts = append(parts, p)
		}
	} else {
		parts = []jsonComponent{c}
	}
	byteLevel := false
	for i, p := range parts {
		switch p.Type {
		case "Metaspace":
			if len(parts) != 1 {
				return false, fmt.Errorf("%w: Metaspace in a Sequence with other pre-tokenizers", ErrUnsupported)
			}
			m, err := parseMetaspace(p, true)
			if err != nil {
				return false, err
			}
			sp.meta = &m
			return false, nil
		case "Split":
			if byteLevel {
				return false, fmt.Errorf("%w: Split after ByteLevel", ErrUnsupported)
			}
			if p.Pattern == nil || p.Pattern.Regex == nil {
				return false, fmt.Errorf("%w: Split on a plain string (only the known regexes are built)", ErrUnsupported)
			}
			pat, ok := knownPatterns[*p.Pattern.Regex]
			if !ok {
				return false, fmt.Errorf("%w: %w: Split regex %q (known: GPT-2, Llama 3, Qwen 2)", ErrUnsupported, ErrUnknownPattern, *p.Pattern.Regex)
			}
			if p.Behavior != "Isolated" || p.Invert {
				return false, fmt.Errorf("%w: Split behavior %q invert %v (only Isolated, not inverted)", ErrUnsupported, p.Behavior, p.Invert)
			}
			sp.steps = append(sp.steps, step{split: pat})
		case "ByteLevel":
			if byteLevel {
				return false, fmt.Errorf("%w: two ByteLevel pre-tokenizers", ErrUnsupported)
			}
			if i != len(parts)-1 {
				return false, fmt.Errorf("%w: ByteLevel pre-tokenizer before another one", ErrUnsupported)
			}
			byteLevel = true
			if p.AddPrefixSpace != nil && *p.AddPrefixSpace {
				sp.steps = append(sp.steps, step{prefixSpace: true})
			}
			if p.UseRegex == nil || *p.UseRegex {
				sp.steps = append(sp.steps, step{split: patGPT2})
			}
		default:
			return false, fmt.Errorf("%w: pre-tokenizer type %q", ErrUnsupported, p.Type)
		}
	}
	if len(sp.steps) > maxSteps {
		return false, fmt.Errorf("%w: %d pre-tokenizer steps (at most %d)", ErrUnsupported, len(sp.steps), maxSteps)
	}
	if !byteLevel {
		return false, fmt.Errorf("%w: Split without a ByteLevel pre-tokenizer", ErrUnsupported)
	}
	return true, nil
}

func parseNormalizer(sp *spec, raw json.RawMessage) error {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("%w: %v", ErrFormat, err)
	}
	switch c.Type {
	case "Sequence":
		for _, r := range c.Normalizers {
			if err := parseNormalizer(sp, r); err != nil {
				return err
			}
		}
	case "NFC":
		sp.norm = append(sp.norm, normOp{nfc: true})
	case "Prepend":
		if c.Prepend == nil {
			return fmt.Errorf("%w: Prepend without \"prepend\"", ErrFormat)
		}
		sp.norm = append(sp.norm, normOp{prepend: true, to: *c.Prepend})
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil {
			return fmt.Errorf("%w: Replace with a regex pattern (only plain strings are built)", ErrUnsupported)
		}
		if c.Content == nil {
			return fmt.Errorf("%w: Replace without \"content\"", ErrFormat)
		}
		if *c.Pattern.String != "" {
			sp.norm = append(sp.norm, normOp{from: *c.Pattern.String, to: *c.Content})
		}
	default:
		return fmt.Errorf("%w: normalizer type %q", ErrUnsupported, c.Type)
	}
	return nil
}

// parseMetaspace reads a Metaspace pre-tokenizer or decoder. Files
// written by tokenizers 0.19 and later spell it with prepend_scheme
// ("always", "first" or "never", always when absent) and split (true when
// absent); older ones with add_prefix_space, where false means never. HF
// reads add_prefix_space false together with a prepend_scheme other than
// never as an error, and so does this package; add_prefix_space false
// alone, which HF 0.19 and later also reject, is read as the tokenizers
// that wrote it did: never. pre says whether it is the pre-tokenizer,
// which works only with ▁ as its replacement (the decoder takes any
// character).
func parseMetaspace(c jsonComponent, pre bool) (metaspace, error) {
	var m metaspace
	if c.Replacement == nil || utf8.RuneCountInString(*c.Replacement) != 1 {
		return m, fmt.Errorf("%w: Metaspace replacement must be one character", ErrFormat)
	}
	if pre && *c.Replacement != metaSpace {
		return m, fmt.Errorf("%w: Metaspace replacement %q (only %q is built)", ErrUnsupported, *c.Replacement, metaSpace)
	}
	m.rep, _ = utf8.DecodeRuneInString(*c.Replacement)
	m.prepend = prependAlways
	if c.PrependScheme != nil {
		switch *c.PrependScheme {
		case "always":
			m.prepend = prependAlways
		case "first":
			m.prepend = prependFirst
		case "never":
			m.prepend = prependNever
		default:
			return m, fmt.Errorf("%w: Metaspace prepend_scheme %q (want always, first or never)", ErrFormat, *c.PrependScheme)
		}
	}
	if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
		if c.PrependScheme != nil && m.prepend != prependNever {
			return m, fmt.Errorf("%w: Metaspace add_prefix_space false contradicts prepend_scheme %q", ErrFormat, *c.PrependScheme)
		}
		m.prepend = prependNever
	}
	m.split = c.Split == nil || *c.Split
	return m, nil
}

// checkFirstScheme refuses prepend_scheme first where this package could
// not tell exactly which stretch of text HF treats as the first. HF
// prepends ▁ to a stretch whose offset in the original text is 0, reading
// the offset through the normalizer's alignments: a normalizer that
// deletes the first characters, or an added token matched in normalized
// text inside what the first character became, moves it. Without a
// normalizer the first stretch is the one at byte 0; with NFC alone it is
// too, unless added tokens are matched in normalized text.
func checkFirstScheme(sp *spec) error {
	if sp.meta == nil || sp.meta.prepend != prependFirst || len(sp.norm) == 0 {
		return nil
	}
	for _, op := range sp.norm {
		if !op.nfc {
			return fmt.Errorf("%w: Metaspace prepend_scheme first after a Prepend or Replace normalizer (which text counts as first depends on HF's offset alignment)", ErrUnsupported)
		}
	}
	for _, a := range sp.added {
		if a.normalized && a.content != "" {
			return fmt.Errorf("%w: Metaspace prepend_scheme first with a normalizer and added tokens matched in normalized text (%q)", ErrUnsupported, a.content)
		}
	}
	return nil
}

// parseDecoder reads the decoder as a chain of steps for Decode:
// Replace of a plain string, ByteFallback, Fuse, Strip and Metaspace, in
// the file's order. The decoder does not change ids, so a decoder this
// package does not know (BPEDecoder, WordPiece, CTC, a Replace by regex)
// is left out of the chain rather than refused.
func parseDecoder(sp *spec, raw json.RawMessage) error {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("%w: %v", ErrFormat, err)
	}
	parts := []jsonComponent{c}
	if c.Type == "Sequence" {
		parts = parts[:0]
		for _, r := range c.Decoders {
			var p jsonComponent
			if err := json.Unmarshal(r, &p); err != nil {
				return fmt.Errorf("%w: %v", ErrFormat, err)
			}
			parts = append(parts, p)
		}
	}
	for _, p := range parts {
		switch p.Type {
		case "ByteFallback":
			sp.decoder = append(sp.decoder, decStep{kind: decByteFallback})
		case "Fuse":
			sp.decoder = append(sp.decoder, decStep{kind: decFuse})
		case "Strip":
			if p.Content == nil || utf8.RuneCountInString(*p.Content) != 1 || p.Start < 0 || p.Stop < 0 {
				return fmt.Errorf("%w: Strip content must be one character, start and stop not negative", ErrFormat)
			}
			r, _ := utf8.DecodeRuneInString(*p.Content)
			sp.decoder = append(sp.decoder, decStep{kind: decStrip, char: r, start: p.Start, stop: p.Stop})
		case "Metaspace":
			m, err := parseMetaspace(p, false)
			if err != nil {
				return err
			}
			sp.decoder = append(sp.decoder, decStep{kind: decMetaspace, char: m.rep, first: m.prepend != prependNever})
		case "Replace":
			if p.Pattern != nil && p.Pattern.String != nil && *p.Pattern.String != "" && p.Content != nil {
				sp.decoder = append(sp.decoder, decStep{kind: decReplace, from: *p.Pattern.String, to: *p.Content})
			}
		}
	}
	return nil
}

// parsePair reads GPT-2's original files: vocab.json/encoder.json and
// merges.txt/vocab.bpe.
func parsePair(path string, top map[string]json.RawMessage, mergesPath string) (*spec, error) {
	sp := &spec{path: path, kind: kindByteLevel, steps: []step{{split: patGPT2}}}
	sp.vocab = make(map[string]int32, len(top))
	for k, v := range top {
		var id int64
		if err := json.Unmarshal(v, &id); err != nil || id < 0 || id >= maxID {
			return nil, fmt.Errorf("%w: %s: token %q: id %s is not a non-negative integer", ErrFormat, path, k, v)
		}
		sp.vocab[k] = int32(id)
	}
	data, err := readFile(mergesPath)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), len(data)+1)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSuffix(sc.Text(), "\r")
		if s == "" || strings.HasPrefix(s, "#version") {
			continue
		}
		a, b, ok := strings.Cut(s, " ")
		if !ok || a == "" || b == "" || strings.Contains(b, " ") {
			hint := ""
			if t := strings.TrimSpace(s); strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
				hint = ": it looks like JSON (a vocab.json or tokenizer.json), not a merges file: the vocabulary and the merges file may be swapped"
			}
			return nil, fmt.Errorf("%w: %s line %d: %q is not two tokens separated by one space%s", ErrFormat, mergesPath, line, snippet(s), hint)
		}
		sp.merges = append(sp.merges, [2]string{a, b})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, mergesPath, err)
	}
	sp.mergesFile = mergesPath
	// HF's GPT-2 tokenizer treats <|endoftext|> as a special token.
	if id, ok := sp.vocab[gpt2EOT]; ok {
		sp.added = append(sp.added, addedToken{id: id, content: gpt2EOT, normalized: true})
	}
	return sp, nil
}

// readConfig takes eos_token and bos_token from a tokenizer_config.json
// beside the main file. A key that is absent leaves the name-based default; a
// key set to null means the tokenizer has no such token.
func readConfig(sp *spec, dir string) error {
	p := findFile(dir, "tokenizer_config.json")
	if p == "" {
		return nil
	}
	data, err := readFile(p)
	if err != nil {
		return err
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrFormat, p, err)
	}
	for _, k := range []struct {
		key string
		ref *tokenRef
	}{{"eos_token", &sp.eos}, {"bos_token", &sp.bos}} {
		raw, ok := cfg[k.key]
		if !ok {
			continue
		}
		k.ref.set = true
		k.ref.file = p
		if isNull(raw) {
			continue
		}
		var name string
		if err := json.Unmarshal(raw, &name); err != nil {
			var obj struct {
				Content *string `json:"content"`
			}
			if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
				return fmt.Errorf("%w: %s: %s is neither a string nor an object with \"content\"", ErrFormat, p, k.key)
			}
			name = *obj.Content
		}
		k.ref.name = name
		k.ref.named = true
	}
	return nil
}

// parseVocab reads model.vocab, a JSON object from token to id.
func parseVocab(raw json.RawMessage) (map[string]int32, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("missing")
	}
	var v map[string]int64
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	out := make(map[string]int32, len(v))
	for k, id := range v {
		if id < 0 || id >= maxID {
			return nil, fmt.Errorf("token %q: id %d out of range", k, id)
		}
		out[k] = int32(id)
	}
	return out, nil
}

// parseMerges reads model.merges in either spelling: "a b" strings (older
// files) or [a, b] pairs (tokenizers 0.20 and later, which can hold tokens
// with spaces).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	s := bytes.TrimSpace(raw)
	if isNull(s) {
		return nil, nil
	}
	if len(s) < 2 || s[0] != '[' {
		return nil, fmt.Errorf("not a list")
	}
	first := bytes.TrimSpace(s[1:])
	if len(first) > 0 && first[0] == '[' {
		var pairs [][]string
		if err := json.Unmarshal(s, &pairs); err != nil {
			return nil, err
		}
		out := make([][2]string, len(pairs))
		for i, p := range pairs {
			if len(p) != 2 {
				return nil, fmt.Errorf("merge %d has %d parts, want 2", i, len(p))
			}
			out[i] = [2]string{p[0], p[1]}
		}
		return out, nil
	}
	var strs []string
	if err := json.Unmarshal(s, &strs); err != nil {
		return nil, err
	}
	out := make([][2]string, len(strs))
	for i, m := range strs {
		a, b, ok := strings.Cut(m, " ")
		if !ok {
			return nil, fmt.Errorf("merge %d (%q) is not two tokens separated by a space", i, snippet(m))
		}
		out[i] = [2]string{a, b}
	}
	return out, nil
}

// snippetLen bounds how much of a bad line an error quotes: a vocab.json
// given as the merges file is one line of a megabyte.
const snippetLen = 80

// snippet is s cut to snippetLen bytes at a character boundary, marked
// with … when cut.
func snippet(s string) string {
	if len(s) <= snippetLen {
		return s
	}
	n := snippetLen
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// looksLikeMerges says whether a file that is not JSON reads as a GPT-2
// merges file: a "#version" header, or first lines of two tokens each.
// JSON cut short can also have such lines, so text starting as JSON does
// not count.
// otherFormat names a tokenizer format that is neither JSON nor a merges
// file, from the file's first bytes, or "": a binary file (SentencePiece's
// tokenizer.model is a protobuf) or tiktoken's lines of a base64 token
// and its rank (Llama 3's original tokenizer.model), which would
// otherwise read as a merges file of two-field lines.
func otherFormat(data []byte) string {
	head := data[:min(len(data), 512)]
	for _, c := range head {
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' {
			return "a binary file (a SentencePiece tokenizer.model?)"
		}
	}
	lines := 0
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, "\r\n")
		tok, rank, ok := bytes.Cut(line, []byte(" "))
		// Padded base64, and the ranks from 0 up: a merges file's pair of
		// a letter and a digit is neither.
		if !ok || len(tok) == 0 || len(tok)%4 != 0 || strings.Trim(string(tok), "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != "" ||
			string(rank) != strconv.Itoa(lines) {
			return ""
		}
		if lines++; lines == 3 {
			break
		}
	}
	if lines == 0 {
		return ""
	}
	return "a tiktoken file (a base64 token and its rank a line, as Llama 3's original tokenizer.model)"
}

func looksLikeMerges(data []byte) bool {
	data = bytes.TrimPrefix(data, []byte("\uFEFF"))
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] == '{' || t[0] == '[' {
		return false
	}
	if bytes.HasPrefix(data, []byte("#version")) {
		return true
	}
	lines := 0
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			continue
		}
		a, b, ok := bytes.Cut(line, []byte(" "))
		if !ok || len(a) == 0 || len(b) == 0 || bytes.IndexByte(b, ' ') >= 0 {
			return false
		}
		if lines++; lines == 3 {
			break
		}
	}
	return lines > 0
}
