package tokenizer

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExactIDs compares every case's ids with the reference implementations'
// (testdata/expected.json, written by testdata/gen/gen.js).
func TestExactIDs(t *testing.T) {
	cases, exp := loadCases(t)
	require.Len(t, exp.Cases, len(cases), "expected.json is stale: run testdata/gen/gen.js")
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				e, ok := exp.Cases[c.Name]
				require.True(t, ok, "case %s missing from expected.json", c.Name)
				want, ok := e.IDs[name]
				require.True(t, ok)
				got := tok.Encode(refText(c, e))
				if want == nil {
					want = []int32{}
				}
				assert.Equal(t, want, got, "case %s", c.Name)
			}
		})
	}
}

// TestDecodeMatchesReference decodes the reference ids and compares with the
// reference's own decoding (all of it valid UTF-8).
func TestDecodeMatchesReference(t *testing.T) {
	cases, exp := loadCases(t)
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				e := exp.Cases[c.Name]
				assert.Equal(t, e.Decoded[name], string(tok.Decode(e.IDs[name])), "case %s", c.Name)
			}
		})
	}
}

// spStrip is, per SentencePiece fixture, how many leading spaces of the
// whole its decoder drops: Llama's Strip, or a Metaspace decoder's first
// token, which with split holds at most the one ▁ at its start. -1: no
// rule, the decoder has no ByteFallback, so <0xNN> tokens come back as
// text (TestDecodeMatchesReference checks it on the corpus).
var spStrip = map[string]int{
	"llama2": 1, "metaspace_first": 1, "metaspace_first_split": 1, "metaspace_never": 0, "metaspace_legacy": -1,
}

// spRoundTrip is what Decode(Encode(x)) gives for SentencePiece BPE, by the
// rule Decode documents: ▁ comes back as a space, every stretch of text
// between added tokens comes back after a space for the ▁ put in front of
// it (under the Prepend normalizer always; under Metaspace where its
// prepend scheme says, and only if the stretch does not start with a space
// or ▁), and the decoder drops up to strip leading spaces of the whole.
func spRoundTrip(tok *Tokenizer, x []byte, strip int) []byte {
	var out []byte
	text := func(p []byte, first bool) {
		if len(p) == 0 {
			return
		}
		prepend := true
		if m := tok.meta; m != nil {
			prepend = (m.prepend == prependAlways || m.prepend == prependFirst && first) &&
				p[0] != ' ' && !bytes.HasPrefix(p, []byte(metaSpace))
		}
		if prepend {
			out = append(out, ' ')
		}
		out = append(out, bytes.ReplaceAll(p, []byte(metaSpace), []byte(" "))...)
	}
	pos := 0
	for {
		s, e, id, ok := tok.nextAdded(tok.raw, x, pos, pos)
		if !ok {
			break
		}
		text(x[pos:s], pos == 0)
		out = append(out, tok.Decode([]int32{id})...)
		pos = e
	}
	text(x[pos:], pos == 0)
	for ; strip > 0 && len(out) > 0 && out[0] == ' '; strip-- {
		out = out[1:]
	}
	return out
}

// roundTrip is what Decode(Encode(x)) should give: x itself for byte-level
// BPE, or its NFC for a byte-level tokenizer with an NFC normalizer (Qwen);
// spRoundTrip for SentencePiece BPE. ok is false for a fixture with no
// rule.
func roundTrip(name string, tok *Tokenizer, x []byte) (want []byte, ok bool) {
	if tok.kind == kindSentencePiece {
		strip, known := spStrip[name]
		if !known || strip < 0 {
			return nil, false
		}
		return spRoundTrip(tok, x, strip), true
	}
	if len(tok.norm) > 0 {
		return normalize(x, tok.norm), true
	}
	return x, true
}

// TestRoundTrip checks Decode(Encode(x)) on every case, on the raw bytes
// (invalid UTF-8 included) as well as on the reference's text.
func TestRoundTrip(t *testing.T) {
	cases, exp := loadCases(t)
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				for _, x := range [][]byte{c.raw(t), refText(c, exp.Cases[c.Name])} {
					want, ok := roundTrip(name, tok, x)
					if !ok {
						return
					}
					assert.Equal(t, string(want), string(tok.Decode(tok.Encode(x))), "case %s", c.Name)
				}
			}
		})
	}
	// The plain statement of the SentencePiece rule, on texts where it holds.
	tok := loadFixture(t, "llama2")
	for _, s := range []string{"Hello world", " starts with a space", "  two", "tabs\tand\nnewlines\n", "</s>", "ends with special </s>", "bytes \xff\xfe kept"} {
		assert.Equal(t, s, string(tok.Decode(tok.Encode([]byte(s)))))
	}
	assert.Equal(t, "a b", string(tok.Decode(tok.Encode([]byte("a\u2581b")))))
	assert.Equal(t, "x</s> y", string(tok.Decode(tok.Encode([]byte("x</s>y")))))
	// Metaspace with prepend_scheme first (Mistral v0.3's form): exact
	// unless x contains ▁ or starts with a space, whose space is lost; no
	// space appears after an added token.
	tok = loadFixture(t, "metaspace_first")
	for _, s := range []string{"Hello world", "tabs\tand\nnewlines\n", "</s>", "ends with special </s>", "x</s>y", "x</s> y", "<s> after", "bytes \xff\xfe kept"} {
		assert.Equal(t, s, string(tok.Decode(tok.Encode([]byte(s)))))
	}
	assert.Equal(t, "starts with a space", string(tok.Decode(tok.Encode([]byte(" starts with a space")))))
	assert.Equal(t, " two", string(tok.Decode(tok.Encode([]byte("  two")))))
}

func TestPreTokenizers(t *testing.T) {
	cases, exp := loadCases(t)
	for _, p := range []pattern{patGPT2, patLlama3, patQwen2} {
		t.Run(p.String(), func(t *testing.T) {
			for _, c := range cases {
				e := exp.Cases[c.Name]
				text := refText(c, e)
				got := []string{}
				for i := 0; i < len(text); {
					j := p.next(text, i)
					require.Greater(t, j, i)
					got = append(got, string(text[i:j]))
					i = j
				}
				want := e.Pretokens[p.String()]
				if want == nil {
					want = []string{}
				}
				assert.Equal(t, want, got, "case %s", c.Name)
			}
		})
	}
}

// TestPreTokenizerRustSemantics pins the places where the Rust regex
// engines behind HF tokenizers (which this package follows) and JavaScript
// (which wrote expected.json) disagree, so they are not in the corpus.
func TestPreTokenizerRustSemantics(t *testing.T) {
	split := func(p pattern, s string) []string {
		var out []string
		for i := 0; i < len(s); {
			j := p.next([]byte(s), i)
			out = append(out, s[i:j])
			i = j
		}
		return out
	}
	tests := []struct {
		name string
		p    pattern
		in   string
		want []string
	}{
		// U+0085 (NEL) is White_Space; JavaScript's \s lacks it.
		{"nel is space gpt2", patGPT2, "a\u0085\u0085b", []string{"a", "\u0085", "\u0085", "b"}},
		{"nel is space llama3", patLlama3, "a\u0085\u0085b", []string{"a", "\u0085", "\u0085b"}},
		// U+FEFF is a format character, not White_Space; JavaScript's \s has it.
		{"bom is symbol gpt2", patGPT2, "a \ufeffb", []string{"a", " \ufeff", "b"}},
		{"bom is symbol llama3", patLlama3, "\ufeffword", []string{"\ufeffword"}},
		// (?i) folds ſ (U+017F) to s in Rust's engines.
		{"long s contraction", patLlama3, "it'ſ", []string{"it", "'ſ"}},
		{"long s gpt2 case-sensitive", patGPT2, "it'ſ", []string{"it", "'", "ſ"}},
		// Invalid bytes split as U+FFFD (a symbol) would.
		{"invalid byte symbol", patGPT2, "a\xff\xfeb c", []string{"a", "\xff\xfe", "b", " c"}},
		{"invalid byte leads letters", patLlama3, "\xffabc 1234", []string{"\xffabc", " ", "123", "4"}},
		{"qwen digits", patQwen2, "x 2024", []string{"x", " ", "2", "0", "2", "4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, split(tc.p, tc.in))
		})
	}
}

func TestEncodeAll(t *testing.T) {
	cases, exp := loadCases(t)
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		t.Run(name, func(t *testing.T) {
			var docs [][]byte
			for _, c := range cases {
				docs = append(docs, c.raw(t), refText(c, exp.Cases[c.Name]))
			}
			docs = append(docs, []byte(benchText()[:200000]))
			serial := make([][]int32, len(docs))
			for i, d := range docs {
				serial[i] = tok.Encode(d)
			}
			for _, w := range []int{1, 4, 0} {
				assert.Equal(t, serial, EncodeAll(tok, docs, w), "workers %d", w)
			}
			assert.Empty(t, EncodeAll(tok, nil, 4))
		})
	}
}

func TestAppendEncode(t *testing.T) {
	tok := loadFixture(t, "llama3")
	dst := []int32{7, 8}
	got := tok.AppendEncode(dst, []byte("Hello world"))
	assert.Equal(t, []int32{7, 8, 9906, 1917}, got)
	text := []byte(benchText()[:20000])
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		buf := make([]int32, 0, len(text))
		// Warm the word cache and scratch space of every state on the
		// free list: the fixture is shared, and the earlier tests'
		// parallel encodes leave a number of states there that depends on
		// how their workers met (up to cap(states)). Each call takes the
		// oldest and puts it back last, so this many calls warm them all.
		for range cap(tok.states) + 1 {
			tok.AppendEncode(buf[:0], text)
		}
		allocs := testing.AllocsPerRun(10, func() { buf = tok.AppendEncode(buf[:0], text) })
		assert.Zero(t, allocs, "%s: a warm AppendEncode into a large enough slice allocates nothing", name)
	}
}

func TestMetadata(t *testing.T) {
	tests := []struct {
		name      string
		kind      string
		vocab     int
		eos, bos  int32
		fileMatch string
	}{
		{"gpt2", "byte-level BPE", 50257, 50256, 50256, "encoder.json.gz"},
		{"llama3", "byte-level BPE", 128256, 128001, 128000, "tokenizer.json.gz"},
		{"llama2", "SentencePiece BPE", 32000, 2, 1, "tokenizer.json.gz"},
		// Qwen 3's config names <|im_end|> as eos_token and sets bos_token
		// to null.
		{"qwen3", "byte-level BPE", 151669, 151645, -1, "tokenizer.json.gz"},
		{"metaspace_first", "SentencePiece BPE", 32000, 2, 1, "tokenizer.json.gz"},
		{"metaspace_legacy", "SentencePiece BPE", 32000, 2, 1, "tokenizer.json.gz"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := loadFixture(t, tc.name)
			assert.Equal(t, tc.kind, tok.Kind())
			assert.Equal(t, tc.vocab, tok.VocabSize())
			eos, ok := tok.EOS()
			assert.True(t, ok)
			assert.Equal(t, tc.eos, eos)
			bos, ok := tok.BOS()
			assert.Equal(t, tc.bos >= 0, ok)
			if ok {
				assert.Equal(t, tc.bos, bos)
			}
			assert.True(t, strings.HasSuffix(tok.Path(), tc.fileMatch), tok.Path())
			assert.Len(t, tok.Fingerprint(), 64)
		})
	}
}

// TestMergeLongMatchesSmall checks the heap merge against the quadratic one
// on long words, where only the heap runs in Encode.
func TestMergeLongMatchesSmall(t *testing.T) {
	text := benchText()
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		st := newEncState()
		for start := 0; start+400 < len(text) && start < 60000; start += 977 {
			w := []byte(text[start : start+65+start%300])
			var syms []int32
			if tok.kind == kindByteLevel {
				for _, c := range w {
					syms = append(syms, tok.byteIDs[c])
				}
			} else {
				for _, r := range string(w) {
					id, ok := tok.charIDs[r]
					if r < 0x80 {
						id, ok = tok.asciiIDs[r], tok.asciiIDs[r] >= 0
					}
					if ok {
						syms = append(syms, id)
					}
				}
			}
			long := tok.mergeLong(st, append([]int32(nil), syms...))
			small := tok.mergeSmall(st, append([]int32(nil), syms...))
			require.Equal(t, small, long, "%s at %d", name, start)
		}
	}
}

func ExampleTokenizer_Encode() {
	tok, err := Load("testdata/llama2", "")
	if err != nil {
		panic(err)
	}
	ids := tok.Encode([]byte("Hello world</s>"))
	fmt.Println(ids, string(tok.Decode(ids)))
	// Output: [22557 1526 2] Hello world</s>
}
