package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// byteLevelVocab is a byte-level vocabulary whose first 256 ids are the
// single bytes (id = byte value), followed by extra tokens.
func byteLevelVocab(extra ...string) map[string]int {
	v := make(map[string]int, 256+len(extra))
	for b := 0; b < 256; b++ {
		v[string(byteToRune[b])] = b
	}
	for i, e := range extra {
		v[e] = 256 + i
	}
	return v
}

// tokJSON builds a tokenizer.json from its parts; nil parts are null.
func tokJSON(model map[string]any, added []map[string]any, preTok, norm, dec any) map[string]any {
	if added == nil {
		added = []map[string]any{}
	}
	return map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": added, "normalizer": norm, "pre_tokenizer": preTok,
		"post_processor": nil, "decoder": dec, "model": model,
	}
}

func bpeModel(vocab map[string]int, merges any) map[string]any {
	return map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
		"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges}
}

var byteLevelPre = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}

func addedTok(id int, content string, flags ...string) map[string]any {
	m := map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	for _, f := range flags {
		m[f] = !m[f].(bool)
	}
	return m
}

// writeJSON writes v as JSON to dir/name and returns the path.
func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, data, 0o644))
	return p
}

func loadJSON(t *testing.T, v any) *Tokenizer {
	t.Helper()
	tok, err := Load(writeJSON(t, t.TempDir(), "tokenizer.json", v), "")
	require.NoError(t, err)
	return tok
}

func gunzipFile(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	data, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, data, 0o644))
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	vocab := map[string]int{"a": 0, "b": 1, "ab": 2}
	vocabPath := writeJSON(t, dir, "vocab.json", vocab)
	badMerges := filepath.Join(dir, "bad_merges.txt")
	require.NoError(t, os.WriteFile(badMerges, []byte("#version: 0.2\na b\na c\n"), 0o644))
	badLine := filepath.Join(dir, "bad_line.txt")
	require.NoError(t, os.WriteFile(badLine, []byte("#version: 0.2\na b c\n"), 0o644))
	noResult := filepath.Join(dir, "no_result.txt")
	require.NoError(t, os.WriteFile(noResult, []byte("b a\n"), 0o644))
	garbage := filepath.Join(dir, "garbage.json")
	require.NoError(t, os.WriteFile(garbage, []byte(`{"model": {"type": "BPE", "vocab": {"a": 0,`), 0o644))
	badGz := filepath.Join(dir, "bad.json.gz")
	require.NoError(t, os.WriteFile(badGz, []byte{0x1f, 0x8b, 8, 0, 0, 0}, 0o644))
	notTok := writeJSON(t, dir, "other.json", map[string]any{"hello": "world"})
	emptyDir := t.TempDir()
	pairDir := t.TempDir()
	writeJSON(t, pairDir, "vocab.json", vocab)

	bl := byteLevelVocab("ab")
	model := func(typ string, extra map[string]any) map[string]any {
		m := bpeModel(bl, []string{"a b"})
		m["type"] = typ
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	file := func(name string, v any) string { return writeJSON(t, dir, name, v) }
	dupIDs := bpeModel(map[string]int{"a": 0, "b": 0}, []string{})
	stray := byteLevelVocab("ab")
	stray["ab"] = 1<<24 - 1 // a typo of an id: the vocabulary would run to 2^24
	// A vocabulary mostly of words, as a BPE's is, given no merges.
	var words []string
	for i := range 300 {
		words = append(words, fmt.Sprintf("w%03d", i))
	}
	wordy := byteLevelVocab(words...)
	emptyMerges := filepath.Join(dir, "empty_merges.txt")
	require.NoError(t, os.WriteFile(emptyMerges, []byte("#version: 0.2\n"), 0o644))
	withCfg := t.TempDir()
	writeJSON(t, withCfg, "tokenizer.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, byteLevelPre, nil, nil))
	writeJSON(t, withCfg, "tokenizer_config.json", map[string]any{"eos_token": "<nope>"})

	tests := []struct {
		name   string
		path   string
		merges string
		is     []error
		msg    []string
	}{
		{"wordpiece", file("wp.json", tokJSON(map[string]any{"type": "WordPiece", "vocab": map[string]int{"[UNK]": 0}, "unk_token": "[UNK]"}, nil, nil, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"wp.json", `model.type "WordPiece"`}},
		{"unigram", file("uni.json", tokJSON(map[string]any{"type": "Unigram", "vocab": [][]any{{"a", -1.0}}, "unk_id": 0}, nil, nil, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"uni.json", `model.type "Unigram"`}},
		{"wordlevel", file("wl.json", tokJSON(map[string]any{"type": "WordLevel", "vocab": map[string]int{"a": 0}, "unk_token": "a"}, nil, nil, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"wl.json", `"WordLevel"`}},
		{"no model type", file("none.json", tokJSON(map[string]any{"vocab": map[string]int{"a": 0}}, nil, nil, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"none.json", "(none)"}},
		{"garbage json", garbage, "", []error{ErrFormat}, []string{"garbage.json"}},
		{"a json array", file("array.json", []any{1, 2}), "", []error{ErrFormat}, []string{"array.json: the file is a JSON array, want a JSON object"}},
		{"bad gzip", badGz, "", []error{ErrFormat}, []string{"bad.json.gz", "gzip"}},
		{"neither format", notTok, "", []error{ErrFormat}, []string{"other.json"}},
		{"missing file", filepath.Join(dir, "nope.json"), "", []error{fs.ErrNotExist}, []string{"nope.json"}},
		{"empty folder", emptyDir, "", []error{fs.ErrNotExist}, []string{emptyDir}},
		{"vocab without merges", vocabPath, "", []error{ErrMissingMerges}, []string{"vocab.json", "merges"}},
		{"folder without merges", pairDir, "", []error{ErrMissingMerges}, []string{pairDir, "merges.txt"}},
		{"merges file missing", vocabPath, filepath.Join(dir, "nope.txt"), []error{fs.ErrNotExist}, []string{"nope.txt"}},
		{"merge token not in vocab", vocabPath, badMerges, []error{ErrFormat}, []string{"bad_merges.txt", `"c"`, "not in the vocabulary"}},
		{"merge result not in vocab", vocabPath, noResult, []error{ErrFormat}, []string{"no_result.txt", `"ba"`}},
		{"bad merges line", vocabPath, badLine, []error{ErrFormat}, []string{"bad_line.txt", "line 2"}},
		{"a long bad merge quoted short", file("longmerge.json", tokJSON(bpeModel(bl, []string{strings.Repeat("a", 200)}), nil, byteLevelPre, nil, nil)), "",
			[]error{ErrFormat}, []string{"longmerge.json", `"` + strings.Repeat("a", 80) + `…"`}},
		{"json merge not in vocab", file("m.json", tokJSON(bpeModel(bl, []string{"a zz"}), nil, byteLevelPre, nil, nil)), "",
			[]error{ErrFormat}, []string{"m.json", `"zz"`}},
		{"unknown pattern", file("pat.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\w+|\s+`}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}, nil, nil)), "",
			[]error{ErrUnsupported, ErrUnknownPattern}, []string{"pat.json", "Split regex", `w+|`}},
		{"split removed", file("rm.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternGPT2}, "behavior": "Removed", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"rm.json", "Removed"}},
		{"nfkc normalizer", file("nfkc.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, byteLevelPre, map[string]any{"type": "NFKC"}, nil)), "",
			[]error{ErrUnsupported}, []string{"nfkc.json", `"NFKC"`}},
		{"metaspace with ByteLevel", file("meta.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Metaspace", "replacement": "▁"}, byteLevelPre}}, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"meta.json", "Metaspace"}},
		{"plain bpe", file("plain.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, nil, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"plain.json", "ByteLevel"}},
		{"dropout", file("drop.json", tokJSON(model("BPE", map[string]any{"dropout": 0.1}), nil, byteLevelPre, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"drop.json", "dropout"}},
		{"suffix", file("suffix.json", tokJSON(model("BPE", map[string]any{"end_of_word_suffix": "</w>"}), nil, byteLevelPre, nil, nil)), "",
			[]error{ErrUnsupported}, []string{"suffix.json", "</w>"}},
		{"shared ids", file("dup.json", tokJSON(dupIDs, nil, byteLevelPre, nil, nil)), "",
			[]error{ErrFormat}, []string{"dup.json", "share id 0"}},
		{"added tokens sharing an id", file("adddup.json", tokJSON(bpeModel(bl, []string{"a b"}), []map[string]any{
			{"id": 300, "content": "<|a|>", "special": true}, {"id": 300, "content": "<|b|>", "special": true}}, byteLevelPre, nil, nil)), "",
			[]error{ErrFormat}, []string{"adddup.json", `added_tokens "<|a|>" and "<|b|>" share id 300`}},
		{"a stray id", file("stray.json", tokJSON(bpeModel(stray, []string{"a b"}), nil, byteLevelPre, nil, nil)), "",
			[]error{ErrFormat}, []string{"stray.json", "257 tokens with ids up to 16777215"}},
		{"unk not in vocab", file("unk.json", tokJSON(model("BPE", map[string]any{"unk_token": "<unk>", "byte_fallback": true}), nil, nil,
			map[string]any{"type": "Prepend", "prepend": "▁"}, nil)), "",
			[]error{ErrFormat}, []string{"unk.json", "<unk>"}},
		{"merges given with tokenizer.json", file("tj.json", tokJSON(bpeModel(bl, []string{"a b"}), nil, byteLevelPre, nil, nil)), badMerges,
			[]error{ErrFormat}, []string{"tj.json", "bad_merges.txt"}},
		{"config names unknown eos", withCfg, "", []error{ErrFormat}, []string{"tokenizer_config.json", "<nope>"}},
		{"no merges", file("nomerges.json", tokJSON(bpeModel(wordy, []string{}), nil, byteLevelPre, nil, nil)), "",
			[]error{ErrFormat}, []string{"nomerges.json", "no merges, but 300 tokens of the vocabulary are longer than one symbol"}},
		{"empty merges.txt", file("wordy_vocab.json", wordy), emptyMerges, []error{ErrFormat}, []string{"empty_merges.txt", "no merges, but 300 tokens"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := Load(tc.path, tc.merges)
			require.Error(t, err)
			assert.Nil(t, tok)
			for _, want := range tc.is {
				assert.True(t, errors.Is(err, want), "%v is not %v", err, want)
			}
			for _, m := range tc.msg {
				assert.Contains(t, err.Error(), m)
			}
		})
	}
}

// A GPT-2 vocabulary and merges file given the wrong way round are named
// as such, and the bad line is quoted short: a vocab.json is one line of a
// megabyte, which the error used to print whole.
func TestSwappedVocabAndMerges(t *testing.T) {
	dir := t.TempDir()
	var words []string
	for i := range 2000 {
		words = append(words, fmt.Sprintf("w%04d", i))
	}
	vocab := writeJSON(t, dir, "vocab.json", byteLevelVocab(words...))
	pretty, err := json.MarshalIndent(byteLevelVocab("ab"), "", "  ")
	require.NoError(t, err)
	prettyVocab := filepath.Join(dir, "pretty.json")
	require.NoError(t, os.WriteFile(prettyVocab, pretty, 0o644))
	merges := filepath.Join(dir, "merges.txt")
	require.NoError(t, os.WriteFile(merges, []byte("#version: 0.2\nw 0\nw0 0\n"), 0o644))
	bare := filepath.Join(dir, "bare_merges.txt")
	require.NoError(t, os.WriteFile(bare, []byte("w 0\nw0 0\n"), 0o644))
	cut := filepath.Join(dir, "cut.json")
	require.NoError(t, os.WriteFile(cut, []byte("{\"a\": 0,\n\"b\": 1,"), 0o644))
	sentencePiece := filepath.Join(dir, "tokenizer.model")
	require.NoError(t, os.WriteFile(sentencePiece, []byte("\n\x0e\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02"), 0o644))
	tiktoken := filepath.Join(dir, "tiktoken.model")
	require.NoError(t, os.WriteFile(tiktoken, []byte("IQ== 0\nIg== 1\nIw== 2\n"), 0o644))
	const swapped = "the vocabulary and the merges file may be swapped"
	for _, tc := range []struct {
		name, path, merges string
		msg                []string
		not                []string
	}{
		{"vocab.json as the merges", vocab, vocab, []string{"vocab.json line 1", "…", "looks like JSON", swapped}, nil},
		{"an indented vocab.json as the merges", vocab, prettyVocab, []string{"pretty.json line 1", `"{"`, "looks like JSON", swapped}, nil},
		{"merges.txt as the vocabulary", merges, vocab, []string{"merges.txt", "invalid character '#'", "looks like a merges file", swapped}, nil},
		{"a merges file without a header as the vocabulary", bare, vocab, []string{"bare_merges.txt", "looks like a merges file"}, nil},
		{"JSON cut short is not a merges file", cut, "", []string{"cut.json"}, []string{"merges file"}},
		{"a SentencePiece model", sentencePiece, "", []string{"tokenizer.model", "a binary file (a SentencePiece tokenizer.model?)", "give the model's tokenizer.json"}, nil},
		{"a tiktoken file is not a merges file", tiktoken, "", []string{"tiktoken.model", "a tiktoken file", "give the model's tokenizer.json"}, []string{"merges file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path, tc.merges)
			require.ErrorIs(t, err, ErrFormat)
			for _, m := range tc.msg {
				assert.Contains(t, err.Error(), m)
			}
			for _, m := range tc.not {
				assert.NotContains(t, err.Error(), m)
			}
			assert.Less(t, len(err.Error()), 400, err.Error())
		})
	}
}

// TestGPT2Formats loads GPT-2 as the original pair and as an equivalent
// tokenizer.json (merges as [a, b] pairs, the newer spelling), and checks
// ids and fingerprint agree.
func TestGPT2Formats(t *testing.T) {
	dir := t.TempDir()
	gunzipFile(t, "testdata/gpt2/encoder.json.gz", filepath.Join(dir, "encoder.json"))
	gunzipFile(t, "testdata/gpt2/vocab.bpe.gz", filepath.Join(dir, "vocab.bpe"))
	pair, err := Load(filepath.Join(dir, "encoder.json"), filepath.Join(dir, "vocab.bpe"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "encoder.json"), pair.Path())
	ref := loadFixture(t, "gpt2")
	assert.Equal(t, ref.Fingerprint(), pair.Fingerprint(), "gzip or not")

	var vocab map[string]int
	data, err := os.ReadFile(filepath.Join(dir, "encoder.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &vocab))
	data, err = os.ReadFile(filepath.Join(dir, "vocab.bpe"))
	require.NoError(t, err)
	var merges [][2]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n")[1:] {
		a, b, _ := strings.Cut(line, " ")
		merges = append(merges, [2]string{a, b})
	}
	tj := tokJSON(bpeModel(vocab, merges), []map[string]any{addedTok(50256, "<|endoftext|>", "normalized")}, byteLevelPre, nil,
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})
	js := loadJSON(t, tj)
	assert.Equal(t, pair.Fingerprint(), js.Fingerprint(), "pair and tokenizer.json")
	cases, exp := loadCases(t)
	for _, c := range cases {
		x := refText(c, exp.Cases[c.Name])
		assert.Equal(t, pair.Encode(x), js.Encode(x), c.Name)
	}
	eos, _ := js.EOS()
	bos, _ := js.BOS()
	assert.Equal(t, []int32{50256, 50256}, []int32{eos, bos})
}

// TestFingerprint: stable across loads, gzip and JSON formatting; changed
// by anything that changes ids.
func TestFingerprint(t *testing.T) {
	ref := loadFixture(t, "llama2")
	again, err := Load("testdata/llama2", "")
	require.NoError(t, err)
	assert.Equal(t, ref.Fingerprint(), again.Fingerprint())

	dir := t.TempDir()
	gunzipFile(t, "testdata/llama2/tokenizer.json.gz", filepath.Join(dir, "plain.json"))
	plain, err := Load(filepath.Join(dir, "plain.json"), "")
	require.NoError(t, err)
	assert.Equal(t, ref.Fingerprint(), plain.Fingerprint(), "gzip")
	eos, ok := plain.EOS()
	assert.True(t, ok, "no config beside: by name")
	assert.Equal(t, int32(2), eos)

	// Re-serialised: compact, keys sorted by Go's encoder.
	data, err := os.ReadFile(filepath.Join(dir, "plain.json"))
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(data, &v))
	compact := loadJSON(t, v)
	assert.Equal(t, ref.Fingerprint(), compact.Fingerprint(), "formatting")

	// Changes that change ids change the fingerprint.
	model := v["model"].(map[string]any)
	merges := model["merges"].([]any)
	model["merges"] = merges[:len(merges)-1]
	fewer := loadJSON(t, v)
	assert.NotEqual(t, ref.Fingerprint(), fewer.Fingerprint(), "one merge fewer")
	model["merges"] = merges
	model["byte_fallback"] = false
	noFallback := loadJSON(t, v)
	assert.NotEqual(t, ref.Fingerprint(), noFallback.Fingerprint(), "byte_fallback")

	fps := map[string]bool{}
	for _, name := range fixtureNames {
		fps[loadFixture(t, name).Fingerprint()] = true
	}
	assert.Len(t, fps, len(fixtureNames))
}

func TestAddedTokenFlags(t *testing.T) {
	bl := byteLevelVocab("ab")
	const mask, sep = 300, 301
	tok := loadJSON(t, tokJSON(bpeModel(bl, []string{"a b"}), []map[string]any{
		addedTok(mask, "<mask>", "lstrip", "rstrip", "single_word"),
		addedTok(sep, "[SEP]", "normalized"),
		addedTok(302, "[SEP][SEP]"),
	}, byteLevelPre, nil, nil))
	ids := func(s string) []int32 { return tok.Encode([]byte(s)) }
	sp := int32(' ')
	assert.Equal(t, []int32{'x', mask, 'y'}, ids("x  <mask>\t y"), "lstrip and rstrip swallow spaces")
	assert.Equal(t, []int32{'x', '<', 'm', 'a', 's', 'k', '>'}, ids("x<mask>"), "single_word: a letter before")
	assert.Equal(t, []int32{'(', mask, ')'}, ids("(<mask>)"), "punctuation is not a word character")
	assert.Equal(t, []int32{256, sep, sp, 256}, ids("ab[SEP] ab"))
	assert.Equal(t, []int32{302, sep}, ids("[SEP][SEP][SEP]"), "longest first")
	assert.Equal(t, []byte("ab<mask>[SEP]"), tok.Decode([]int32{256, mask, sep}))
	assert.Equal(t, 303, tok.VocabSize())
	_, ok := tok.EOS()
	assert.False(t, ok)
}

func TestPrefixSpaceAndChain(t *testing.T) {
	bl := byteLevelVocab("Ġa", "Ġb")
	sp := int32(' ')
	pre := map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	tok := loadJSON(t, tokJSON(bpeModel(bl, [][2]string{{"Ġ", "a"}, {"Ġ", "b"}}), nil, pre, nil, nil))
	assert.Equal(t, []int32{256, 257}, tok.Encode([]byte("a b")), "a space goes in front")
	assert.Equal(t, []int32{256}, tok.Encode([]byte(" a")), "not twice")
	assert.Equal(t, []byte(" a b"), tok.Decode(tok.Encode([]byte("a b"))))

	// Split (Llama 3 pattern) then ByteLevel with a prefix space: every
	// split piece gets one, as HF does.
	seq := map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": false},
	}}
	tok = loadJSON(t, tokJSON(bpeModel(bl, [][2]string{{"Ġ", "a"}}), nil, seq, nil, nil))
	assert.Equal(t, []int32{256, sp, '1', '2', '3', sp, '4'}, tok.Encode([]byte("a1234")))
}

func TestSentencePieceOptions(t *testing.T) {
	vocab := map[string]int{"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "<0x78>": 5, "ab": 6, "▁ab": 7}
	merges := []string{"▁ a", "a b", "▁a b"}
	norm := map[string]any{"type": "Sequence", "normalizers": []any{
		map[string]any{"type": "Prepend", "prepend": "▁"},
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
	}}
	dec := map[string]any{"type": "Sequence", "decoders": []any{
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
		map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
		map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
	}}
	model := func(fuse, fallback bool) map[string]any {
		m := bpeModel(vocab, merges)
		m["unk_token"], m["fuse_unk"], m["byte_fallback"] = "<unk>", fuse, fallback
		return m
	}
	fused := loadJSON(t, tokJSON(model(true, false), nil, nil, norm, dec))
	assert.Equal(t, "SentencePiece BPE", fused.Kind())
	assert.Equal(t, []int32{1, 0, 7}, fused.Encode([]byte("yzw ab")), "unknown characters fuse into one unk")
	assert.Equal(t, []int32{4, 0, 3}, fused.Encode([]byte("ayzb")))
	plain := loadJSON(t, tokJSON(model(false, false), nil, nil, norm, dec))
	assert.Equal(t, []int32{1, 0, 0, 0, 7}, plain.Encode([]byte("yzw ab")))
	fallback := loadJSON(t, tokJSON(model(true, true), nil, nil, norm, dec))
	assert.Equal(t, []int32{1, 5, 0, 3}, fallback.Encode([]byte("xyzb")), "x has a byte token, y and z do not")
	assert.Equal(t, []byte("xab"), fallback.Decode([]int32{1, 5, 6}))
	assert.Equal(t, []byte(" ab"), fallback.Decode([]int32{1, 7}), "only one space is stripped")
	assert.Equal(t, []int32{1, 7}, fallback.Encode([]byte(" ab")))

	// A normalized added token matches the normalized text: "▁ab" here.
	withAdded := loadJSON(t, tokJSON(model(true, true), []map[string]any{addedTok(8, "ab", "normalized")}, nil, norm, dec))
	assert.Equal(t, []int32{1, 5, 8}, withAdded.Encode([]byte("x ab")))
	assert.Equal(t, []int32{8}, withAdded.Encode([]byte("ab")))
	assert.Equal(t, []int32{1, 3, 6}, withAdded.Encode([]byte("bab")), "the pattern is \"▁ab\": no match inside a word")
}

func TestEOSBOSConfig(t *testing.T) {
	bl := byteLevelVocab("</s>", "<s>")
	dir := t.TempDir()
	writeJSON(t, dir, "tokenizer.json", tokJSON(bpeModel(bl, []string{}), []map[string]any{addedTok(256, "</s>"), addedTok(257, "<s>")}, byteLevelPre, nil, nil))
	tok, err := Load(dir, "")
	require.NoError(t, err)
	eos, ok := tok.EOS()
	assert.True(t, ok)
	assert.Equal(t, int32(256), eos)
	bos, ok := tok.BOS()
	assert.True(t, ok)
	assert.Equal(t, int32(257), bos)

	writeJSON(t, dir, "tokenizer_config.json", map[string]any{
		"eos_token": map[string]any{"__type": "AddedToken", "content": "<s>"}, "bos_token": nil})
	tok, err = Load(dir, "")
	require.NoError(t, err)
	eos, ok = tok.EOS()
	assert.True(t, ok)
	assert.Equal(t, int32(257), eos)
	_, ok = tok.BOS()
	assert.False(t, ok, "bos_token: null means none")
}

func TestLoadPlainFolderAndFile(t *testing.T) {
	dir := t.TempDir()
	gunzipFile(t, "testdata/llama3/tokenizer.json.gz", filepath.Join(dir, "tokenizer.json"))
	data, err := os.ReadFile("testdata/llama3/tokenizer_config.json")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644))
	tok, err := Load(filepath.Join(dir, "tokenizer.json"), "")
	require.NoError(t, err)
	assert.Equal(t, loadFixture(t, "llama3").Fingerprint(), tok.Fingerprint())
	assert.True(t, bytes.Equal([]byte(filepath.Join(dir, "tokenizer.json")), []byte(tok.Path())))
}

// A gzipped tokenizer file that unpacks past the bound is refused by
// name: a few MB of zeros compress to a bomb that ran the process out of
// memory.
func TestGzipBombIsRefused(t *testing.T) {
	old := maxTokenizerFile
	t.Cleanup(func() { maxTokenizerFile = old })
	maxTokenizerFile = 1 << 20
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write(make([]byte, 2<<20))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	path := filepath.Join(t.TempDir(), "tokenizer.json.gz")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	_, err = readFile(path)
	require.ErrorIs(t, err, ErrFormat)
	assert.ErrorContains(t, err, "unpacks to more than 1 MiB")
}
