package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A small SentencePiece vocabulary for the Metaspace tests. The merges, by
// rank: ▁▁ first, then ▁a, ▁b, ab, ▁ab and b▁; ▁ba (12) is in the
// vocabulary but no merge makes it.
var (
	metaVocab = map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "a": 4, "b": 5, "▁▁": 6, "▁a": 7, "▁b": 8,
		"ab": 9, "▁ab": 10, "b▁": 11, "▁ba": 12, "<0x78>": 13}
	metaMerges = [][2]string{{"▁", "▁"}, {"▁", "a"}, {"▁", "b"}, {"a", "b"}, {"▁a", "b"}, {"b", "▁"}}
	metaAdded  = []map[string]any{addedTok(1, "<s>"), addedTok(2, "</s>")}
)

func metaModel() map[string]any {
	m := bpeModel(metaVocab, metaMerges)
	m["unk_token"] = "<unk>"
	return m
}

func metaPre(fields ...any) map[string]any {
	m := map[string]any{"type": "Metaspace", "replacement": "▁"}
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i].(string)] = fields[i+1]
	}
	return m
}

// TestMetaspaceVariants: every prepend scheme with split false and true,
// on texts where the expected ids follow from HF's rules by hand.
//
// A space becomes ▁; ▁ goes in front of a stretch between added tokens
// (always: every stretch; first: only one that starts the text; never:
// none) unless it starts with ▁ after that. With split the text is cut
// before every ▁ and each piece is merged alone, so ▁▁ (the first merge)
// and b▁ can form only without split. For example "b  a" is ▁b▁▁a: merged
// whole, ▁▁ goes first, then ▁b, leaving ▁b ▁▁ a (8 6 4); split, it is
// ▁b | ▁ | ▁a (8 3 7).
func TestMetaspaceVariants(t *testing.T) {
	texts := []string{"a b", " ab", "b  a", "<s>ab", "ab</s>ab", "b ", "▁a", " ", ""}
	tests := []struct {
		name string
		pre  map[string]any
		want [][]int32 // per text
	}{
		{"always", metaPre("prepend_scheme", "always", "split", false),
			[][]int32{{7, 8}, {10}, {8, 6, 4}, {1, 10}, {10, 2, 10}, {8, 3}, {7}, {3}, {}}},
		{"always split", metaPre("prepend_scheme", "always", "split", true),
			[][]int32{{7, 8}, {10}, {8, 3, 7}, {1, 10}, {10, 2, 10}, {8, 3}, {7}, {3}, {}}},
		{"first", metaPre("prepend_scheme", "first", "split", false),
			[][]int32{{7, 8}, {10}, {8, 6, 4}, {1, 9}, {10, 2, 9}, {8, 3}, {7}, {3}, {}}},
		{"first split", metaPre("prepend_scheme", "first", "split", true),
			[][]int32{{7, 8}, {10}, {8, 3, 7}, {1, 9}, {10, 2, 9}, {8, 3}, {7}, {3}, {}}},
		{"never", metaPre("prepend_scheme", "never", "split", false),
			[][]int32{{4, 8}, {10}, {5, 6, 4}, {1, 9}, {9, 2, 9}, {11}, {7}, {3}, {}}},
		{"never split", metaPre("prepend_scheme", "never", "split", true),
			[][]int32{{4, 8}, {10}, {5, 3, 7}, {1, 9}, {9, 2, 9}, {5, 3}, {7}, {3}, {}}},
	}
	fps := map[string]string{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := loadJSON(t, tokJSON(metaModel(), metaAdded, tc.pre, nil, nil))
			assert.Equal(t, "SentencePiece BPE", tok.Kind())
			for i, s := range texts {
				assert.Equal(t, tc.want[i], tok.Encode([]byte(s)), "%q", s)
			}
			fps[tc.name] = tok.Fingerprint()
		})
	}
	assert.Len(t, fps, len(tests))
	seen := map[string]bool{}
	for _, fp := range fps {
		seen[fp] = true
	}
	assert.Len(t, seen, len(tests), "each variant has its own fingerprint")

	// The older spellings mean the same (split defaults to true).
	for _, sp := range []struct {
		pre  map[string]any
		same string
	}{
		{metaPre("add_prefix_space", true), "always split"},
		{metaPre("add_prefix_space", false), "never split"},
		{metaPre("add_prefix_space", true, "prepend_scheme", "first"), "first split"},
		{metaPre("add_prefix_space", false, "prepend_scheme", "never", "split", false), "never"},
		{metaPre(), "always split"},
		{map[string]any{"type": "Sequence", "pretokenizers": []any{metaPre("prepend_scheme", "first", "split", false)}}, "first"},
	} {
		tok := loadJSON(t, tokJSON(metaModel(), metaAdded, sp.pre, nil, nil))
		assert.Equal(t, fps[sp.same], tok.Fingerprint(), "%v", sp.pre)
	}

	// The Metaspace pre-tokenizer against the normalizers it replaces: the
	// same ids except where a stretch starts with a space, which the
	// normalizers prepend to regardless.
	norm := map[string]any{"type": "Sequence", "normalizers": []any{
		map[string]any{"type": "Prepend", "prepend": "▁"},
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
	}}
	legacy := loadJSON(t, tokJSON(metaModel(), metaAdded, nil, norm, nil))
	always := loadJSON(t, tokJSON(metaModel(), metaAdded, metaPre("prepend_scheme", "always", "split", false), nil, nil))
	assert.Equal(t, []int32{6, 9}, legacy.Encode([]byte(" ab")), "▁▁ab: ▁▁ merges first")
	assert.Equal(t, []int32{10}, always.Encode([]byte(" ab")))
	assert.Equal(t, legacy.Encode([]byte("b  a</s>ab")), always.Encode([]byte("b  a</s>ab")))

	// ignore_merges looks up each piece whole: ▁ba, which no merge makes.
	for _, split := range []bool{false, true} {
		m := metaModel()
		m["ignore_merges"] = true
		tok := loadJSON(t, tokJSON(m, nil, metaPre("prepend_scheme", "always", "split", split), nil, nil))
		want := []int32{8, 4, 8, 4} // ▁ba▁ba is not in the vocabulary: merged
		if split {
			want = []int32{12, 12}
		}
		assert.Equal(t, want, tok.Encode([]byte("ba ba")), "split %v", split)
		assert.Equal(t, []int32{12}, tok.Encode([]byte("ba")))
	}

	// A normalizer runs first; prepend_scheme always or never does not
	// depend on offsets, so it works with any.
	tok := loadJSON(t, tokJSON(metaModel(), metaAdded, metaPre("prepend_scheme", "always", "split", true),
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": "x"}, "content": " "}, nil))
	assert.Equal(t, []int32{7, 3, 8}, tok.Encode([]byte("ax b")))
}

// TestMetaspaceDecoder: the Metaspace decoder turns ▁ into a space, except
// in the first token, which loses its ▁ (unless the scheme is never); the
// steps of a Sequence act on the list of token strings in order, as HF's.
func TestMetaspaceDecoder(t *testing.T) {
	pre := metaPre("prepend_scheme", "always", "split", true)
	seq := func(ds ...any) map[string]any { return map[string]any{"type": "Sequence", "decoders": ds} }
	replace := map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "}
	tests := []struct {
		name string
		dec  any
		ids  []int32
		want string
	}{
		{"first token loses all its ▁", metaPre("prepend_scheme", "always"), []int32{6, 4}, "a"},
		{"later tokens keep them as spaces", metaPre("prepend_scheme", "first"), []int32{7, 8, 3, 3, 7}, "a b   a"},
		{"first token is an added token", metaPre("add_prefix_space", true), []int32{1, 7, 8}, "<s> a b"},
		{"never keeps every space", metaPre("prepend_scheme", "never"), []int32{6, 7, 8}, "   a b"},
		{"legacy add_prefix_space false", metaPre("add_prefix_space", false), []int32{7}, " a"},
		{"no ByteFallback: byte tokens are text", metaPre(), []int32{13, 7}, "<0x78> a"},
		{"Metaspace then ByteFallback", seq(metaPre("prepend_scheme", "first"), map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}),
			[]int32{13, 7, 13}, "x ax"},
		{"ByteFallback first: the byte run is the first token", seq(map[string]any{"type": "ByteFallback"}, metaPre()), []int32{13, 7}, "x a"},
		{"Fuse first: one token, every ▁ dropped", seq(map[string]any{"type": "Fuse"}, metaPre()), []int32{7, 8, 3}, "ab"},
		{"Strip without Fuse strips each token", seq(replace, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}), []int32{7, 8, 3}, "ab"},
		{"Strip after Fuse strips the whole", seq(replace, map[string]any{"type": "Fuse"}, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 1}), []int32{7, 8, 3}, "a b"},
		{"Replace of another string", seq(map[string]any{"type": "Replace", "pattern": map[string]any{"String": "ab"}, "content": "AB"}, replace), []int32{10, 9}, " ABAB"},
		{"ids without a token are skipped", metaPre(), []int32{-1, 99, 7, 8}, "a b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := loadJSON(t, tokJSON(metaModel(), metaAdded, pre, nil, tc.dec))
			assert.Equal(t, tc.want, string(tok.Decode(tc.ids)))
		})
	}
}

// TestDecodeChainMatchesTable runs Llama 2's decoder step by step (a
// Strip of nothing before the Fuse keeps it off the per-id table) and
// compares with the table on the corpus and the bench text.
func TestDecodeChainMatchesTable(t *testing.T) {
	top, dir, err := variantJSON("metaspace_first")
	require.NoError(t, err)
	top["decoder"] = json.RawMessage(`{"type": "Sequence", "decoders": [
		{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
		{"type": "Strip", "content": " ", "start": 0, "stop": 0}, {"type": "Fuse"},
		{"type": "Strip", "content": " ", "start": 1, "stop": 0}]}`)
	sp, err := parseTokenizerJSON(dir, top)
	require.NoError(t, err)
	chain, err := build(sp)
	require.NoError(t, err)
	require.NotNil(t, chain.decoder)
	table := loadFixture(t, "metaspace_first")
	require.Nil(t, table.decoder)
	cases, exp := loadCases(t)
	for _, c := range cases {
		for _, x := range [][]byte{c.raw(t), refText(c, exp.Cases[c.Name])} {
			ids := table.Encode(x)
			assert.Equal(t, string(table.Decode(ids)), string(chain.Decode(ids)), c.Name)
		}
	}
	ids := table.Encode([]byte(benchText()[:100000]))
	assert.Equal(t, string(table.Decode(ids)), string(chain.Decode(ids)))
}

func TestMetaspaceErrors(t *testing.T) {
	nfcFirst := tokJSON(metaModel(), []map[string]any{addedTok(1, "<s>", "normalized")}, metaPre("prepend_scheme", "first"),
		map[string]any{"type": "NFC"}, nil)
	tests := []struct {
		name string
		v    any
		is   error
		msg  string
	}{
		{"contradiction", tokJSON(metaModel(), nil, metaPre("add_prefix_space", false, "prepend_scheme", "first"), nil, nil),
			ErrFormat, "add_prefix_space false"},
		{"unknown scheme", tokJSON(metaModel(), nil, metaPre("prepend_scheme", "sometimes"), nil, nil), ErrFormat, "sometimes"},
		{"no replacement", tokJSON(metaModel(), nil, map[string]any{"type": "Metaspace"}, nil, nil), ErrFormat, "replacement"},
		{"other replacement", tokJSON(metaModel(), nil, metaPre("replacement", "_"), nil, nil), ErrUnsupported, `"_"`},
		{"in a sequence", tokJSON(metaModel(), nil, map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternGPT2}, "behavior": "Isolated", "invert": false},
			metaPre()}}, nil, nil), ErrUnsupported, "Metaspace in a Sequence"},
		{"first after Replace", tokJSON(metaModel(), nil, metaPre("prepend_scheme", "first"),
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "x"}, "content": ""}, nil), ErrUnsupported, "first"},
		{"first with NFC and normalized added tokens", nfcFirst, ErrUnsupported, `"<s>"`},
		{"bad Strip decoder", tokJSON(metaModel(), nil, metaPre(), nil, map[string]any{"type": "Strip", "content": "ab", "start": 1, "stop": 0}),
			ErrFormat, "Strip"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := Load(writeJSON(t, t.TempDir(), "tokenizer.json", tc.v), "")
			require.Error(t, err)
			assert.Nil(t, tok)
			assert.True(t, errors.Is(err, tc.is), "%v is not %v", err, tc.is)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Contains(t, err.Error(), "tokenizer.json")
		})
	}
	// NFC alone, or first with no normalized added token, is fine.
	loadJSON(t, tokJSON(metaModel(), metaAdded, metaPre("prepend_scheme", "first"), map[string]any{"type": "NFC"}, nil))
}

// TestMetaspaceFingerprint: a Metaspace tokenizer's fingerprint is the same
// from the gzipped and the plain file and from a reformatted one, and
// differs from the normalizer form of the same vocabulary.
func TestMetaspaceFingerprint(t *testing.T) {
	ref := loadFixture(t, "metaspace_first")
	again, err := loadVariant("metaspace_first")
	require.NoError(t, err)
	assert.Equal(t, ref.Fingerprint(), again.Fingerprint())

	top, _, err := variantJSON("metaspace_first")
	require.NoError(t, err)
	data, err := json.MarshalIndent(top, "", "  ")
	require.NoError(t, err)
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.json")
	require.NoError(t, os.WriteFile(plain, data, 0o644))
	f, err := os.Create(filepath.Join(dir, "packed.gz"))
	require.NoError(t, err)
	zw := gzip.NewWriter(f)
	_, err = zw.Write(data)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, f.Close())
	for _, p := range []string{plain, filepath.Join(dir, "packed.gz")} {
		tok, err := Load(p, "")
		require.NoError(t, err)
		assert.Equal(t, ref.Fingerprint(), tok.Fingerprint(), p)
	}
	var v map[string]any
	require.NoError(t, json.Unmarshal(data, &v))
	assert.Equal(t, ref.Fingerprint(), loadJSON(t, v).Fingerprint(), "compact, keys sorted")
	v["pre_tokenizer"].(map[string]any)["split"] = true
	assert.NotEqual(t, ref.Fingerprint(), loadJSON(t, v).Fingerprint(), "split")
	assert.NotEqual(t, ref.Fingerprint(), loadFixture(t, "llama2").Fingerprint())
}

// fixtureFingerprints pins every fixture's fingerprint: token datasets
// record it, so a change to what it hashes must be deliberate. Adding
// Metaspace left the first four as they were.
var fixtureFingerprints = map[string]string{
	"gpt2":                  "a9a6c5c034a3d3360807089059bdfbbcf79d748d18d70883679de86db7a42066",
	"llama3":                "f5587faac5954f596f56ac698293b280aafe3ade2156d38a3c43cdb0401332a4",
	"llama2":                "a6b32cc81aeafb0fa2bf8d35dabb392de53474dec791190357d2f016cc1a2fba",
	"qwen3":                 "5ff4d4a0aecd1d2e2374c01311a57214b8848629f510239dd1d058cb34fb2c5d",
	"metaspace_first":       "f4085927f4511dbc95195136d28e84a1a855bb44d58ab57ce3fe29e54c4e26f8",
	"metaspace_legacy":      "4840677849255f10f7babf5994efc26ce59d82a1569a807db80a3dfb228e87ca",
	"metaspace_first_split": "c5e527b1867ff4901d82653867eafd6d494a1c9648e1a8e1053ec02698f986e2",
	"metaspace_never":       "b69723ce0dbbd4173af7637ec8c930ae3d24148171dd550374216797cf535870",
}

func TestFingerprintValues(t *testing.T) {
	require.Len(t, fixtureFingerprints, len(fixtureNames))
	for _, name := range fixtureNames {
		assert.Equal(t, fixtureFingerprints[name], loadFixture(t, name).Fingerprint(), name)
	}
}

// Lossy names what Encode drops: nothing for GPT-2's byte-level
// vocabulary or an SP one with an unk token; a byte without a token, or
// an SP vocabulary with neither unk nor byte fallback.
func TestLossy(t *testing.T) {
	gpt2, err := Load(filepath.Join("testdata", "gpt2", "encoder.json.gz"), filepath.Join("testdata", "gpt2", "vocab.bpe.gz"))
	require.NoError(t, err)
	assert.Empty(t, gpt2.Lossy())
	assert.Empty(t, loadJSON(t, tokJSON(metaModel(), metaAdded, metaPre(), nil, nil)).Lossy())

	noHigh := byteLevelVocab("ab")
	delete(noHigh, string(byteToRune[0xff]))
	tok := loadJSON(t, tokJSON(bpeModel(noHigh, []string{"a b"}), nil, byteLevelPre, nil, nil))
	assert.Equal(t, "no token for the bytes 0xFF", tok.Lossy())
	assert.Equal(t, tok.Encode([]byte("a")), tok.Encode([]byte("a\xff")), "the byte is dropped")

	// An alphabet of the bytes the training text held (a DNA tokenizer's
	// A, C, G, T) is a real tokenizer: it loads, and Lossy says what it
	// drops. So does a character vocabulary with a few specials and no
	// merges.
	dna := map[string]int{"A": 0, "C": 1, "G": 2, "T": 3, "AC": 4, "GT": 5, "ACGT": 6}
	tok = loadJSON(t, tokJSON(bpeModel(dna, []string{"A C", "G T", "AC GT"}), nil, byteLevelPre, nil, nil))
	assert.Equal(t, []int32{6}, tok.Encode([]byte("ACGT")))
	assert.Contains(t, tok.Lossy(), "no token for the bytes 0x00, 0x01, 0x02, 0x03 … (252 bytes)")
	chars := byteLevelVocab("[PAD]", "[EOS]")
	assert.NotNil(t, loadJSON(t, tokJSON(bpeModel(chars, []string{}), nil, byteLevelPre, nil, nil)))

	noUnk := metaModel()
	noUnk["unk_token"] = nil
	assert.Equal(t, "no unk token and no byte fallback: a character outside the vocabulary has no token",
		loadJSON(t, tokJSON(noUnk, metaAdded, metaPre(), nil, nil)).Lossy())
	noUnk["byte_fallback"] = true
	assert.Equal(t, "no unk token, and its byte fallback has no token for the bytes 0x00, 0x01, 0x02, 0x03 … (255 bytes)",
		loadJSON(t, tokJSON(noUnk, metaAdded, metaPre(), nil, nil)).Lossy())
}
