package tokenizer

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Tokenizer turns text into token ids and back. It is immutable after Load
// and safe for concurrent use; each concurrent Encode takes its own scratch
// space and word cache from a free list.
type Tokenizer struct {
	path string
	kind kind

	// vocab is the encode-side vocabulary: byte-level tokens keyed by the
	// bytes they stand for, SentencePiece tokens by their text.
	vocab  map[string]int32
	merges mergeTable
	// byteIDs is, per byte, the id of its byte-level character or of its
	// <0xNN> fallback token; -1 when there is none.
	byteIDs  [256]int32
	asciiIDs [128]int32     // SentencePiece: id of each one-character ASCII token, or -1
	charIDs  map[rune]int32 // SentencePiece: ids of the other one-character tokens
	unkID    int32

	byteFallback, fuseUnk, ignoreMerges bool
	spSegment                           bool

	steps []step
	norm  []normOp
	meta  *metaspace // SentencePiece: the Metaspace pre-tokenizer, if any

	added       []addedToken
	raw, normed *trie

	// dec[decOff[id]:decOff[id+1]] is what Decode writes for id, or, when
	// decoder is set (a chain the table cannot express), the token's text,
	// which the chain then decodes; present marks the ids that have one.
	dec                   []byte
	decOff                []uint32
	stripStart, stripStop int
	decoder               []decStep
	present               []bool

	vocabSize      int
	eos, bos       int32
	hasEOS, hasBOS bool
	fingerprint    string

	states chan *encState
}

// Encode returns the ids of text, with no BOS or EOS added. Added and
// special tokens written in the text (such as <|endoftext|>) are matched
// before anything else and become their single id, as HF tokenizers do
// by default.
func (t *Tokenizer) Encode(text []byte) []int32 {
	return t.AppendEncode(t.idsFor(text), text)
}

// idsFor allocates room for text's ids: about 3.5 bytes make a token in
// English for byte-level BPE and 2.8 for SentencePiece, so most texts
// need no regrowth.
func (t *Tokenizer) idsFor(text []byte) []int32 {
	if t.kind == kindSentencePiece {
		return make([]int32, 0, len(text)/2+8)
	}
	return make([]int32, 0, len(text)/3+8)
}

// AppendEncode appends the ids of text to dst and returns the extended
// slice, so a caller reusing dst encodes without allocating.
func (t *Tokenizer) AppendEncode(dst []int32, text []byte) []int32 {
	st := t.getState()
	dst = t.encode(st, dst, text)
	t.putState(st)
	return dst
}

// encode splits out the added tokens that match the raw text, then hands
// each stretch between them on, saying whether it starts the text (for
// Metaspace's prepend_scheme first).
func (t *Tokenizer) encode(st *encState, dst []int32, text []byte) []int32 {
	if t.raw == nil {
		return t.encodePiece(st, dst, text, true)
	}
	pos := 0
	for {
		s, e, id, ok := t.nextAdded(t.raw, text, pos, pos)
		if !ok {
			break
		}
		dst = t.encodePiece(st, dst, text[pos:s], pos == 0)
		dst = append(dst, id)
		pos = e
	}
	return t.encodePiece(st, dst, text[pos:], pos == 0)
}

// encodePiece normalizes a stretch of text between added tokens, splits
// out the added tokens that match normalized text, and runs the model on
// what is left. HF normalizes each stretch on its own, so a SentencePiece
// Prepend applies after every added token, not only at the start. first
// says the stretch starts the text; of its parts, only the one before any
// added token does.
func (t *Tokenizer) encodePiece(st *encState, dst []int32, piece []byte, first bool) []int32 {
	if len(piece) == 0 {
		return dst
	}
	if len(t.norm) > 0 {
		st.norm[0], st.norm[1] = normalizeInto(st.norm[0], st.norm[1], piece, t.norm, &st.runes)
		piece = st.norm[0]
	}
	if t.normed == nil {
		return t.encodeModel(st, dst, piece, first)
	}
	pos := 0
	for {
		s, e, id, ok := t.nextAdded(t.normed, piece, pos, pos)
		if !ok {
			break
		}
		dst = t.encodeModel(st, dst, piece[pos:s], first && pos == 0)
		dst = append(dst, id)
		pos = e
	}
	return t.encodeModel(st, dst, piece[pos:], first && pos == 0)
}

func (t *Tokenizer) encodeModel(st *encState, dst []int32, text []byte, first bool) []int32 {
	if len(text) == 0 {
		return dst
	}
	if t.kind == kindSentencePiece {
		if t.meta != nil {
			return t.encodeMetaspace(st, dst, text, first)
		}
		return t.encodeSP(st, dst, text)
	}
	if len(t.steps) == 1 && !t.steps[0].prefixSpace {
		p := t.steps[0].split
		for i := 0; i < len(text); {
			j := p.next(text, i)
			dst = t.encodeWord(st, dst, text[i:j])
			i = j
		}
		return dst
	}
	return t.preTokenize(st, dst, text, 0)
}

// preTokenize runs the pre-tokenizer chain from step k on: ByteLevel's
// prefix space goes in front of every piece that reaches it, and each
// split cuts every piece it is given.
func (t *Tokenizer) preTokenize(st *encState, dst []int32, text []byte, k int) []int32 {
	if len(text) == 0 {
		return dst
	}
	if k == len(t.steps) {
		return t.encodeWord(st, dst, text)
	}
	s := t.steps[k]
	if s.prefixSpace {
		if text[0] == ' ' {
			return t.preTokenize(st, dst, text, k+1)
		}
		buf := append(append(st.prefix[k][:0], ' '), text...)
		st.prefix[k] = buf
		return t.preTokenize(st, dst, buf, k+1)
	}
	for i := 0; i < len(text); {
		j := s.split.next(text, i)
		dst = t.preTokenize(st, dst, text[i:j], k+1)
		i = j
	}
	return dst
}

// normalizeInto applies the normalizers to src, using a, b and runes as
// scratch; the result is in the first returned slice.
func normalizeInto(a, b, src []byte, ops []normOp, runes *[]rune) ([]byte, []byte) {
	a = append(a[:0], src...)
	for _, op := range ops {
		if op.nfc {
			b = nfcAppend(b[:0], a, runes)
		} else if op.prepend {
			if len(a) == 0 {
				continue
			}
			b = append(append(b[:0], op.to...), a...)
		} else {
			b = b[:0]
			rest := a
			for {
				i := bytes.Index(rest, []byte(op.from))
				if i < 0 {
					break
				}
				b = append(append(b, rest[:i]...), op.to...)
				rest = rest[i+len(op.from):]
			}
			b = append(b, rest...)
		}
		a, b = b, a
	}
	return a, b
}

// normalize is normalizeInto for one-off use.
func normalize(src []byte, ops []normOp) []byte {
	var runes []rune
	out, _ := normalizeInto(nil, nil, src, ops, &runes)
	return out
}

// encodeMetaspace runs the Metaspace pre-tokenizer on a stretch of
// (normalized) text and the model on what it makes, as HF does: every
// space (U+0020 only) becomes ▁; ▁ goes in front when the prepend scheme
// says so (always, or first and this stretch starts the text) unless the
// stretch now starts with ▁; with split the result is cut before every ▁,
// so each word, its ▁ in front, merges on its own (and with ignore_merges
// is looked up whole), and each space of a run becomes a ▁ token of its
// own. Without split the stretch is one word, as under the Prepend/Replace
// normalizers.
func (t *Tokenizer) encodeMetaspace(st *encState, dst []int32, text []byte, first bool) []int32 {
	meta := []byte(metaSpace)
	buf := st.meta[:0]
	if p := t.meta.prepend; (p == prependAlways || p == prependFirst && first) && text[0] != ' ' && !bytes.HasPrefix(text, meta) {
		buf = append(buf, meta...)
	}
	for {
		i := bytes.IndexByte(text, ' ')
		if i < 0 {
			break
		}
		buf = append(append(buf, text[:i]...), meta...)
		text = text[i+1:]
	}
	buf = append(buf, text...)
	st.meta = buf
	if !t.meta.split {
		return t.encodeSP(st, dst, buf)
	}
	start := 0
	for {
		// A ▁ found from start+1 on is never the one at start: its second
		// byte is a continuation byte, and ▁ starts with a lead byte.
		k := bytes.Index(buf[start+1:], meta)
		if k < 0 {
			break
		}
		end := start + 1 + k
		dst = t.encodeSPPiece(st, dst, buf[start:end])
		start = end
	}
	return t.encodeSPPiece(st, dst, buf[start:])
}

// encodeSPPiece encodes one pre-token: whole when ignore_merges finds it
// in the vocabulary, otherwise merged.
func (t *Tokenizer) encodeSPPiece(st *encState, dst []int32, w []byte) []int32 {
	if t.ignoreMerges {
		if id, ok := t.vocab[string(w)]; ok {
			return append(dst, id)
		}
	}
	return t.encodeSPWord(st, dst, w)
}

// encodeSP runs SentencePiece-style BPE on normalized text.
func (t *Tokenizer) encodeSP(st *encState, dst []int32, text []byte) []int32 {
	if t.ignoreMerges {
		if id, ok := t.vocab[string(text)]; ok {
			return append(dst, id)
		}
	}
	if !t.spSegment {
		return t.encodeSPWord(st, dst, text)
	}
	meta := []byte(metaSpace)
	start := 0
	for i := 0; ; {
		k := bytes.Index(text[i:], meta)
		if k < 0 {
			break
		}
		i += k
		if i > start && !bytes.HasSuffix(text[:i], meta) {
			dst = t.encodeSPWord(st, dst, text[start:i])
			start = i
		}
		i += len(meta)
	}
	return t.encodeSPWord(st, dst, text[start:])
}

// encodeSPWord encodes one SentencePiece word: characters in the
// vocabulary start as their ids, others become their <0xNN> byte tokens
// (byte_fallback) or the unk token (consecutive ones fused into one when
// fuse_unk is set); then the merges run.
func (t *Tokenizer) encodeSPWord(st *encState, dst []int32, w []byte) []int32 {
	if len(w) == 0 {
		return dst
	}
	cacheable := len(w) <= cacheMaxWord
	if cacheable {
		if ids, ok := st.lookup(w); ok {
			return append(dst, ids...)
		}
	}
	syms := st.syms[:0]
	pendingUnk := false
	for i := 0; i < len(w); {
		id, n := int32(-1), 1
		if c := w[i]; c < utf8.RuneSelf {
			id = t.asciiIDs[c]
		} else {
			var r rune
			r, n = utf8.DecodeRune(w[i:])
			if n > 1 {
				if v, ok := t.charIDs[r]; ok {
					id = v
				}
			}
		}
		if id < 0 && t.byteFallback {
			all := true
			for _, c := range w[i : i+n] {
				if t.byteIDs[c] < 0 {
					all = false
					break
				}
			}
			if all {
				if pendingUnk {
					syms, pendingUnk = append(syms, t.unkID), false
				}
				for _, c := range w[i : i+n] {
					syms = append(syms, t.byteIDs[c])
				}
				i += n
				continue
			}
		}
		switch {
		case id >= 0:
			if pendingUnk {
				syms, pendingUnk = append(syms, t.unkID), false
			}
			syms = append(syms, id)
		case t.unkID >= 0:
			if pendingUnk && !t.fuseUnk {
				syms = append(syms, t.unkID)
			}
			pendingUnk = true
		}
		i += n
	}
	if pendingUnk {
		syms = append(syms, t.unkID)
	}
	syms = t.merge(st, syms)
	st.syms = syms[:0]
	if cacheable {
		st.store(w, syms)
	}
	return append(dst, syms...)
}

// Decode turns ids back into bytes. Added and special tokens decode to
// their content; ids outside the vocabulary are skipped.
//
// Byte-level BPE decodes to exactly the bytes that were encoded, so
// Decode(Encode(x)) == x for any x, valid UTF-8 or not (for a tokenizer
// with an NFC normalizer, as Qwen's, it is NFC(x)). HF would turn bytes
// that do not form valid UTF-8 into U+FFFD instead.
//
// SentencePiece BPE runs the tokenizer's decoder chain as HF does, step by
// step on the list of token strings: Replace (▁ to a space), ByteFallback
// (<0xNN> tokens to their bytes, kept raw where HF writes U+FFFD for bytes
// that are not valid UTF-8), Fuse, Strip (Llama's drops one leading space
// of the whole output) and Metaspace (▁ to a space, except that the first
// token loses its ▁ unless the prepend scheme is never). A tokenizer.json
// without a decoder this package knows decodes as Llama 2's.
//
// Round trips, for a tokenizer with byte_fallback (so that no character
// becomes unk) and Llama's decoder: every stretch of text between added
// tokens comes back with its spaces and its ▁ (U+2581) as spaces, after a
// space for the ▁ that the encoding put in front of it, then one leading
// space of the whole is dropped. Under the Prepend/Replace normalizers a
// ▁ goes in front of every stretch, so Decode(Encode(x)) == x exactly when
// x contains no ▁ and no added token followed by more text (that text
// comes back with a space in front, as from HF); text that starts with
// spaces round-trips, only the prepended one is dropped. Under a Metaspace
// pre-tokenizer the ▁ goes in front only where its prepend scheme says
// (always: every stretch; first: the stretch at the start of the text;
// never: none) and only to a stretch that does not already start with a
// space or ▁: so with first, x comes back exactly when it contains no ▁
// and does not start with a space (that one space is lost, as in HF).
func (t *Tokenizer) Decode(ids []int32) []byte {
	if t.decoder != nil {
		return t.decodeChain(ids)
	}
	out := make([]byte, 0, len(ids)*4)
	for _, id := range ids {
		if id >= 0 && int(id) < t.vocabSize {
			out = append(out, t.dec[t.decOff[id]:t.decOff[id+1]]...)
		}
	}
	if t.kind == kindSentencePiece {
		n := 0
		for n < t.stripStart && n < len(out) && out[n] == ' ' {
			n++
		}
		out = out[n:]
		for k := 0; k < t.stripStop && len(out) > 0 && out[len(out)-1] == ' '; k++ {
			out = out[:len(out)-1]
		}
	}
	return out
}

// decodeChain runs the decoder chain step by step on the ids' token
// strings, for chains the per-id table cannot express.
func (t *Tokenizer) decodeChain(ids []int32) []byte {
	toks := make([][]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && int(id) < t.vocabSize && t.present[id] {
			toks = append(toks, t.dec[t.decOff[id]:t.decOff[id+1]:t.decOff[id+1]])
		}
	}
	for _, s := range t.decoder {
		toks = s.apply(toks)
	}
	return bytes.Join(toks, nil)
}

// apply runs one decoder step on the token strings. Slices may share
// memory with the decode table, so a token is replaced, never changed in
// place.
func (s *decStep) apply(toks [][]byte) [][]byte {
	switch s.kind {
	case decReplace:
		from, to := []byte(s.from), []byte(s.to)
		for i, tok := range toks {
			if bytes.Contains(tok, from) {
				toks[i] = bytes.ReplaceAll(tok, from, to)
			}
		}
	case decByteFallback:
		out := toks[:0:0]
		var run []byte
		inRun := false
		for _, tok := range toks {
			if b, ok := byteToken(string(tok)); ok {
				run, inRun = append(run, b), true
				continue
			}
			if inRun {
				out, run, inRun = append(out, run), nil, false
			}
			out = append(out, tok)
		}
		if inRun {
			out = append(out, run)
		}
		return out
	case decFuse:
		return [][]byte{bytes.Join(toks, nil)}
	case decStrip:
		for i, tok := range toks {
			toks[i] = stripRune(tok, s.char, s.start, s.stop)
		}
	case decMetaspace:
		rep := utf8.AppendRune(nil, s.char)
		for i, tok := range toks {
			if !bytes.Contains(tok, rep) {
				continue
			}
			if i == 0 && s.first {
				toks[i] = bytes.ReplaceAll(tok, rep, nil)
			} else {
				toks[i] = bytes.ReplaceAll(tok, rep, []byte(" "))
			}
		}
	}
	return toks
}

// stripRune drops up to start leading and stop trailing c from tok, as
// HF's Strip decoder does (which would panic where the two overlap; here
// the token becomes empty).
func stripRune(tok []byte, c rune, start, stop int) []byte {
	i := 0
	for k := 0; k < start && i < len(tok); k++ {
		r, n := utf8.DecodeRune(tok[i:])
		if r != c || n == 1 && r == utf8.RuneError && c != utf8.RuneError {
			break
		}
		i += n
	}
	j := len(tok)
	for k := 0; k < stop && j > i; k++ {
		r, n := utf8.DecodeLastRune(tok[i:j])
		if r != c || n == 1 && r == utf8.RuneError && c != utf8.RuneError {
			break
		}
		j -= n
	}
	return tok[i:j]
}

// Lossy says which characters Encode drops, "" when none: a byte-level
// vocabulary without some byte's token, or a SentencePiece one without an
// unk token whose byte fallback does not cover every byte. Hugging Face's
// tokenizers drop them too, silently; a tool that tokenizes a corpus says
// so before it starts.
func (t *Tokenizer) Lossy() string {
	var missing []string
	for b, id := range t.byteIDs {
		if id < 0 {
			missing = append(missing, fmt.Sprintf("0x%02X", b))
		}
	}
	list := func() string {
		if len(missing) > 4 {
			return fmt.Sprintf("%s … (%d bytes)", strings.Join(missing[:4], ", "), len(missing))
		}
		return strings.Join(missing, ", ")
	}
	switch {
	case t.kind == kindByteLevel && len(missing) > 0:
		return "no token for the bytes " + list()
	case t.kind != kindSentencePiece || t.unkID >= 0:
		return ""
	case !t.byteFallback:
		return "no unk token and no byte fallback: a character outside the vocabulary has no token"
	case len(missing) > 0:
		return "no unk token, and its byte fallback has no token for the bytes " + list()
	}
	return ""
}

// VocabSize is 1 + the largest id of the vocabulary and added tokens: the
// size an embedding table needs.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// EOS is the id that ends a document: tokenizer_config.json's eos_token
// when that file sits beside the tokenizer, otherwise the first token found
// among <|end_of_text|> (Llama 3), <|endoftext|> (GPT-2, Qwen), </s>
// (Llama 2, Mistral) and <eos>. ok is false when there is none (the config
// sets eos_token to null, or no such token exists). The config wins even
// where it names a chat model's end of turn: Qwen 3's names <|im_end|>.
func (t *Tokenizer) EOS() (id int32, ok bool) { return t.eos, t.hasEOS }

// BOS is the id that starts a document: tokenizer_config.json's bos_token,
// otherwise the first of <|begin_of_text|>, <s>, <bos>, <|startoftext|>
// and <|endoftext|> (GPT-2 uses its end token for both). ok is false when
// there is none, as for Qwen, whose config sets bos_token to null.
func (t *Tokenizer) BOS() (id int32, ok bool) { return t.bos, t.hasBOS }

// Kind is "byte-level BPE" (GPT-2, Llama 3, Qwen) or "SentencePiece BPE"
// (Llama 2, Mistral).
func (t *Tokenizer) Kind() string { return t.kind.String() }

// Fingerprint is a hex SHA-256 of what determines the ids: vocabulary,
// merges in effect, added tokens and their matching flags, pre-tokenizer,
// normalizer, model options, and the EOS and BOS ids. It is taken from the
// parsed tokenizer, so it does not change with JSON formatting, key order,
// compression, or between GPT-2's vocab.json+merges.txt and an equivalent
// tokenizer.json. Token datasets record it to detect a tokenizer change.
func (t *Tokenizer) Fingerprint() string { return t.fingerprint }

// Path is the file the tokenizer was read from (tokenizer.json, or GPT-2's
// vocab.json/encoder.json); for a folder, the file found in it.
func (t *Tokenizer) Path() string { return t.path }

// EncodeAll encodes documents in parallel on workers goroutines
// (GOMAXPROCS when workers < 1). The result is identical to encoding each
// document in order: out[i] is t.Encode(docs[i]).
func EncodeAll(t *Tokenizer, docs [][]byte, workers int) [][]int32 {
	out := make([][]int32, len(docs))
	if workers < 1 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, len(docs))
	if workers <= 1 {
		st := t.getState()
		for i, d := range docs {
			out[i] = t.encode(st, t.idsFor(d), d)
		}
		t.putState(st)
		return out
	}
	// Documents are handed out one at a time from a shared counter, so a
	// few long documents do not leave the other workers idle.
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := t.getState()
			defer t.putState(st)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(docs) {
					return
				}
				out[i] = t.encode(st, t.idsFor(docs[i]), docs[i])
			}
		}()
	}
	wg.Wait()
	return out
}
