package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRoundTrip checks, for any bytes, that no tokenizer panics, every id is
// in range, a second (cached) encode agrees with the first, byte-level BPE
// decodes back to exactly the input, and SentencePiece BPE decodes by the
// rule Decode documents (NFC applied first where the tokenizer normalizes;
// for each fixture that has a rule, see spStrip).
// It also checks that NFC is idempotent, and the heap merge against the
// quadratic one on the input's bytes.
func FuzzRoundTrip(f *testing.F) {
	cases, exp := loadCases(f)
	for _, c := range cases {
		f.Add(c.raw(f))
		f.Add(refText(c, exp.Cases[c.Name]))
	}
	toks := make([]*Tokenizer, len(fixtureNames))
	for i, name := range fixtureNames {
		toks[i] = loadFixture(f, name)
	}
	st := newEncState()
	f.Fuzz(func(t *testing.T, x []byte) {
		for i, tok := range toks {
			ids := tok.Encode(x)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("%s: id %d out of range for %q", tok.Path(), id, x)
				}
			}
			again := tok.AppendEncode([]int32{-1}, x)
			if len(again) != len(ids)+1 || again[0] != -1 {
				t.Fatalf("%s: AppendEncode gave %d ids after the prefix, Encode %d, for %q", tok.Path(), len(again)-1, len(ids), x)
			}
			for i := range ids {
				if again[i+1] != ids[i] {
					t.Fatalf("%s: second encode differs at %d for %q", tok.Path(), i, x)
				}
			}
			got := tok.Decode(ids)
			if want, ok := roundTrip(fixtureNames[i], tok, x); ok && string(got) != string(want) {
				t.Fatalf("%s: round trip of %q gave %q, want %q", fixtureNames[i], x, got, want)
			}
		}
		var runes []rune
		once := nfcAppend(nil, x, &runes)
		if twice := nfcAppend(nil, once, &runes); string(twice) != string(once) {
			t.Fatalf("NFC is not idempotent on %q: %q then %q", x, once, twice)
		}
		gpt2 := toks[0]
		n := min(len(x), 300)
		if n >= 2 {
			syms := make([]int32, n)
			for i, c := range x[:n] {
				syms[i] = gpt2.byteIDs[c]
			}
			long := gpt2.mergeLong(st, append([]int32(nil), syms...))
			small := gpt2.mergeSmall(st, syms)
			if len(long) != len(small) {
				t.Fatalf("merge of %q: heap %v, quadratic %v", x[:n], long, small)
			}
			for i := range long {
				if long[i] != small[i] {
					t.Fatalf("merge of %q: heap %v, quadratic %v", x[:n], long, small)
				}
			}
		}
	})
}

// FuzzLoad feeds arbitrary bytes to Load as a tokenizer.json, a vocab.json
// with merges, and a merges file: Load must return a tokenizer or an error,
// never panic, and a tokenizer it returns must encode without panicking.
func FuzzLoad(f *testing.F) {
	seeds := []any{
		tokJSON(bpeModel(byteLevelVocab("ab"), []string{"a b"}), []map[string]any{addedTok(300, "<x>", "lstrip", "single_word")}, byteLevelPre, nil, nil),
		tokJSON(bpeModel(map[string]int{"<unk>": 0, "▁": 1, "a": 2, "▁a": 3}, [][2]string{{"▁", "a"}}), nil, nil,
			map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "Prepend", "prepend": "▁"}, map[string]any{"type": "NFC"}}}, nil),
		map[string]int{"a": 0, "b": 1, "ab": 2},
		tokJSON(metaModel(), metaAdded, metaPre("prepend_scheme", "first", "split", true), nil,
			map[string]any{"type": "Sequence", "decoders": []any{metaPre(), map[string]any{"type": "ByteFallback"},
				map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 2}}}),
	}
	for _, s := range seeds {
		data, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, []byte("#version: 0.2\na b\n"))
	}
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":16777215},"merges":[["a","a"]]},"added_tokens":[{"id":3,"content":""}]}`), []byte("a a"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, main, merges []byte) {
		p := filepath.Join(dir, fmt.Sprintf("main-%d.json", os.Getpid()))
		m := filepath.Join(dir, fmt.Sprintf("merges-%d.txt", os.Getpid()))
		if err := os.WriteFile(p, main, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(m, merges, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, mp := range []string{"", m} {
			tok, err := Load(p, mp)
			if err != nil {
				continue
			}
			ids := tok.Encode([]byte("a b\xff <x> ab\u2581a  <s>b "))
			tok.Decode(ids)
		}
	})
}
