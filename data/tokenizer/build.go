package tokenizer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"unicode/utf8"
)

type kind uint8

const (
	kindByteLevel kind = iota + 1
	kindSentencePiece
)

func (k kind) String() string {
	if k == kindSentencePiece {
		return "SentencePiece BPE"
	}
	return "byte-level BPE"
}

const (
	// maxID bounds token ids, so that a malformed file cannot make the
	// tables indexed by id huge; real vocabularies stay below 300 000.
	maxID = 1 << 24
	// maxGap is how many ids beyond twice the tokens a vocabulary may leave
	// unused (reserved ranges) before it is taken for a typo.
	maxGap = 1 << 12
	// maxSteps bounds the pre-tokenizer chain (it recurses once per step).
	maxSteps = 4
	// metaSpace is SentencePiece's visible space.
	metaSpace = "\u2581"
	gpt2EOT   = "<|endoftext|>"
)

// addedToken is an entry of tokenizer.json's added_tokens: matched in the
// raw text (or, when normalized, in the normalized text) before any
// pre-tokenization, and never split.
type addedToken struct {
	id                         int32
	content                    string
	singleWord, lstrip, rstrip bool
	normalized                 bool
}

// step is one stage of the byte-level pre-tokenizer chain: either the
// ByteLevel prefix space or a split by one of the known patterns.
type step struct {
	prefixSpace bool
	split       pattern
}

// normOp is one normalizer: Prepend (to, when the text is not empty),
// Replace (every from by to) or NFC.
type normOp struct {
	prepend, nfc bool
	from, to     string
}

// prependScheme is when the Metaspace pre-tokenizer puts ▁ in front of a
// stretch of text.
type prependScheme uint8

const (
	prependAlways prependScheme = iota + 1 // every stretch between added tokens
	prependFirst                           // only the stretch at the start of the text
	prependNever
)

// metaspace is the Metaspace pre-tokenizer (or, with rep and prepend only,
// decoder): spaces become ▁, ▁ goes in front as prepend says unless the
// stretch already starts with one, and with split the text is cut before
// every ▁, each piece merged on its own.
type metaspace struct {
	rep     rune
	prepend prependScheme
	split   bool
}

// decKind names a decoder step.
type decKind uint8

const (
	decReplace      decKind = iota + 1 // each token: from becomes to
	decByteFallback                    // runs of <0xNN> tokens become their bytes
	decFuse                            // all tokens become one
	decStrip                           // each token: char dropped from its ends
	decMetaspace                       // each token: char becomes a space (dropped in the first token when first)
)

// decStep is one decoder of the chain, as HF applies it to the list of
// token strings.
type decStep struct {
	kind        decKind
	from, to    string // Replace
	char        rune   // Strip: the character removed; Metaspace: the replacement
	start, stop int    // Strip: at most this many from the start and the end
	first       bool   // Metaspace: the first token loses its replacement characters
}

// tokenRef is an eos/bos token as tokenizer_config.json names it.
type tokenRef struct {
	set, named bool // the key was present; it named a token (not null)
	name, file string
}

// spec is a parsed tokenizer, whichever file format it came from.
type spec struct {
	path, mergesFile                    string
	kind                                kind
	vocab                               map[string]int32
	merges                              [][2]string
	added                               []addedToken
	steps                               []step
	norm                                []normOp
	unk                                 *string
	byteFallback, fuseUnk, ignoreMerges bool
	meta                                *metaspace
	decoder                             []decStep
	eos, bos                            tokenRef
}

func hasMetaNormalizer(norm []normOp) bool {
	for _, op := range norm {
		if strings.Contains(op.to, metaSpace) {
			return true
		}
	}
	return false
}

// byteToRune is GPT-2's reversible map from bytes to printable characters:
// printable Latin-1 bytes stand for themselves, the rest are moved to
// U+0100 and up in byte order.
var byteToRune [256]rune

// runeToByte inverts byteToRune; every mapped rune is below 0x144.
var runeToByte [0x144]int16

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
	}
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	for b, r := range byteToRune {
		runeToByte[r] = int16(b)
	}
}

// byteLevelBytes turns a byte-level token's text into the bytes it stands
// for. clean is false when the text holds a character outside the map;
// such a character is kept as its own UTF-8, as HF's decoder does.
func byteLevelBytes(tok string) (out []byte, clean bool) {
	clean = true
	out = make([]byte, 0, len(tok))
	for _, r := range tok {
		if r >= 0 && int(r) < len(runeToByte) && runeToByte[r] >= 0 {
			out = append(out, byte(runeToByte[r]))
			continue
		}
		clean = false
		out = utf8.AppendRune(out, r)
	}
	return out, clean
}

// byteToken parses SentencePiece's byte tokens, <0x00> to <0xFF>.
func byteToken(tok string) (byte, bool) {
	if len(tok) != 6 || tok[:3] != "<0x" || tok[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(tok[3])
	lo, ok2 := hexDigit(tok[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// build checks a spec and turns it into a ready Tokenizer.
func build(sp *spec) (*Tokenizer, error) {
	t := &Tokenizer{
		path: sp.path, kind: sp.kind, steps: sp.steps, norm: sp.norm,
		byteFallback: sp.byteFallback, fuseUnk: sp.fuseUnk, ignoreMerges: sp.ignoreMerges,
		meta: sp.meta, unkID: -1,
	}
	if len(sp.vocab) == 0 {
		return nil, fmt.Errorf("%w: %s: empty vocabulary", ErrFormat, sp.path)
	}

	// Ids: the table runs to the largest id of the vocabulary and added tokens.
	size := 0
	for _, id := range sp.vocab {
		size = max(size, int(id)+1)
	}
	for _, a := range sp.added {
		size = max(size, int(a.id)+1)
	}
	// A vocabulary whose ids leave most of the table unused has a stray
	// id (a typo): the model's vocabulary follows the largest id, and
	// would be that large.
	if tokens := len(sp.vocab) + len(sp.added); size > 2*tokens+maxGap {
		return nil, fmt.Errorf("%w: %s: %d tokens with ids up to %d: the ids leave %d unused; a model's vocabulary follows the largest id, so check it",
			ErrFormat, sp.path, tokens, size-1, size-tokens)
	}
	t.vocabSize = size
	names := make([]string, size)
	has := make([]bool, size)
	for tok, id := range sp.vocab {
		if has[id] {
			a, b := min(tok, names[id]), max(tok, names[id])
			return nil, fmt.Errorf("%w: %s: tokens %q and %q share id %d", ErrFormat, sp.path, a, b, id)
		}
		names[id], has[id] = tok, true
	}

	// The encode-side vocabulary: byte-level tokens are keyed by the bytes
	// they stand for, so text never needs mapping to GPT-2's characters.
	if sp.kind == kindByteLevel {
		t.vocab = make(map[string]int32, len(sp.vocab))
		for tok, id := range sp.vocab {
			if raw, clean := byteLevelBytes(tok); clean {
				t.vocab[string(raw)] = id
			}
		}
	} else {
		t.vocab = sp.vocab
	}

	mergesFile := sp.path
	if sp.mergesFile != "" {
		mergesFile = sp.mergesFile
	}
	t.merges = newMergeTable(len(sp.merges))
	pairs := make([][2]int32, len(sp.merges))
	for rank, m := range sp.merges {
		a, okA := sp.vocab[m[0]]
		b, okB := sp.vocab[m[1]]
		n, okN := sp.vocab[m[0]+m[1]]
		switch {
		case !okA:
			return nil, fmt.Errorf("%w: %s: merge %d (%q %q) names %q, which is not in the vocabulary", ErrFormat, mergesFile, rank, m[0], m[1], m[0])
		case !okB:
			return nil, fmt.Errorf("%w: %s: merge %d (%q %q) names %q, which is not in the vocabulary", ErrFormat, mergesFile, rank, m[0], m[1], m[1])
		case !okN:
			return nil, fmt.Errorf("%w: %s: merge %d (%q %q) makes %q, which is not in the vocabulary", ErrFormat, mergesFile, rank, m[0], m[1], m[0]+m[1])
		}
		t.merges.put(a, b, uint32(rank), n)
		pairs[rank] = [2]int32{a, b}
	}

	for b := range t.byteIDs {
		t.byteIDs[b] = -1
		var name string
		if sp.kind == kindByteLevel {
			name = string(byteToRune[b])
		} else {
			name = fmt.Sprintf("<0x%02X>", b)
		}
		if id, ok := sp.vocab[name]; ok {
			t.byteIDs[b] = id
		}
	}

	if len(sp.merges) == 0 && !sp.ignoreMerges {
		// BPE makes every token longer than a symbol by merges: without
		// any, such tokens are never produced, and text comes out a
		// byte or character at a time (a merges file left empty by a
		// failed download).
		special := map[string]bool{}
		for _, a := range sp.added {
			special[a.content] = true
		}
		if sp.unk != nil {
			special[*sp.unk] = true
		}
		longer, single := 0, 0
		for tok := range sp.vocab {
			// Added and unknown tokens, byte tokens (<0x41>) and ones
			// spelt as specials (<s>, [PAD]) are not merges' work.
			if special[tok] || isByteTokenName(tok) || strings.HasPrefix(tok, "<") && strings.HasSuffix(tok, ">") ||
				strings.HasPrefix(tok, "[") && strings.HasSuffix(tok, "]") {
				continue
			}
			if utf8.RuneCountInString(tok) > 1 {
				longer++
			} else {
				single++
			}
		}
		// A few longer tokens beside an alphabet may be specials spelt
		// some other way; a vocabulary mostly of them is a BPE's.
		if longer > single {
			return nil, fmt.Errorf("%w: %s: no merges, but %d tokens of the vocabulary are longer than one symbol, which only merges make: the merges are missing (an empty merges.txt, or a tokenizer.json without model.merges)", ErrFormat, mergesFile, longer)
		}
	}

	if sp.kind == kindSentencePiece {
		for i := range t.asciiIDs {
			t.asciiIDs[i] = -1
		}
		t.charIDs = make(map[rune]int32)
		for tok, id := range sp.vocab {
			r, n := utf8.DecodeRuneInString(tok)
			if n != len(tok) || (r == utf8.RuneError && n < 3) {
				continue
			}
			if r < 0x80 {
				t.asciiIDs[r] = id
			} else {
				t.charIDs[r] = id
			}
		}
		if sp.unk != nil {
			id, ok := sp.vocab[*sp.unk]
			if !ok {
				return nil, fmt.Errorf("%w: %s: unk_token %q is not in the vocabulary", ErrFormat, sp.path, *sp.unk)
			}
			t.unkID = id
		}
		t.spSegment = segmentable(sp)
	}

	// Added tokens, and the two matchers: raw text first, then normalized.
	t.added = sp.added
	var rawPats, normPats []string
	var rawIdx, normIdx []int
	for i, a := range sp.added {
		if a.content == "" {
			continue
		}
		if !a.normalized {
			rawPats, rawIdx = append(rawPats, a.content), append(rawIdx, i)
			continue
		}
		p := a.content
		if len(sp.norm) > 0 {
			p = string(normalize([]byte(p), sp.norm))
		}
		if p != "" {
			normPats, normIdx = append(normPats, p), append(normIdx, i)
		}
	}
	t.raw = newTrie(rawPats, rawIdx)
	t.normed = newTrie(normPats, normIdx)

	// Decode table: per id, its bytes as Decode writes them (see
	// decodeTable), or, for a decoder chain that needs the token strings
	// themselves, the token's text.
	addedByID := make(map[int32]string, len(sp.added))
	for _, a := range sp.added {
		addedByID[a.id] = a.content
	}
	var perToken []decStep
	if sp.kind == kindSentencePiece {
		var ok bool
		if perToken, t.stripStart, t.stripStop, ok = decodeTable(sp.decoder); !ok {
			t.decoder = sp.decoder
			t.present = make([]bool, size)
		}
	}
	t.decOff = make([]uint32, size+1)
	for id := 0; id < size; id++ {
		t.decOff[id] = uint32(len(t.dec))
		tok, ok := addedByID[int32(id)]
		if !ok {
			if !has[id] {
				continue
			}
			tok = names[id]
		}
		switch {
		case t.present != nil:
			t.present[id] = true
			t.dec = append(t.dec, tok...)
		case sp.kind == kindByteLevel:
			if ok {
				t.dec = append(t.dec, tok...)
			} else {
				raw, _ := byteLevelBytes(tok)
				t.dec = append(t.dec, raw...)
			}
		default:
			t.dec = appendDecodedToken(t.dec, tok, perToken)
		}
	}
	t.decOff[size] = uint32(len(t.dec))

	lookup := func(name string) (int32, bool) {
		for i := len(sp.added) - 1; i >= 0; i-- {
			if sp.added[i].content == name {
				return sp.added[i].id, true
			}
		}
		id, ok := sp.vocab[name]
		return id, ok
	}
	var err error
	if t.eos, t.hasEOS, err = resolveRef(sp.eos, "eos_token", eosNames, lookup); err != nil {
		return nil, err
	}
	if t.bos, t.hasBOS, err = resolveRef(sp.bos, "bos_token", bosNames, lookup); err != nil {
		return nil, err
	}

	t.fingerprint = fingerprint(sp, t, names, has, pairs)
	t.states = make(chan *encState, 2*runtime.GOMAXPROCS(0)+2)
	return t, nil
}

func isByteTokenName(tok string) bool {
	_, ok := byteToken(tok)
	return ok
}

// The names EOS and BOS fall back to when no tokenizer_config.json says.
var (
	eosNames = []string{"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"}
	bosNames = []string{"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|endoftext|>"}
)

func resolveRef(ref tokenRef, key string, names []string, lookup func(string) (int32, bool)) (int32, bool, error) {
	if ref.set {
		if !ref.named {
			return -1, false, nil
		}
		id, ok := lookup(ref.name)
		if !ok {
			return -1, false, fmt.Errorf("%w: %s: %s %q is not a token of the tokenizer", ErrFormat, ref.file, key, ref.name)
		}
		return id, true, nil
	}
	for _, n := range names {
		if id, ok := lookup(n); ok {
			return id, true, nil
		}
	}
	return -1, false, nil
}

// segmentable says whether a SentencePiece text may be cut before every ▁
// that follows another character without changing the ids. That holds
// when no token has a ▁ after a non-▁ character: no merge can then join
// the two sides of such a cut, so BPE on the pieces equals BPE on the
// whole, and each piece (a word with its leading ▁) can be cached.
// ignore_merges looks at the whole text first, so it is handled apart.
func segmentable(sp *spec) bool {
	if _, ok := sp.vocab[metaSpace]; !ok {
		return false
	}
	for tok := range sp.vocab {
		rest := strings.TrimLeft(tok, metaSpace)
		if strings.Contains(rest, metaSpace) {
			return false
		}
	}
	return true
}

// fingerprint hashes everything that decides the ids, in a canonical
// order, so that it does not depend on JSON formatting, key order, gzip or
// which of the two GPT-2 file formats the tokenizer came from. Flags that
// cannot change an id (an added token's special flag, which is not even
// kept; normalized when there is no normalizer) are left out.
func fingerprint(sp *spec, t *Tokenizer, names []string, has []bool, pairs [][2]int32) string {
	h := sha256.New()
	var buf [8]byte
	num := func(v int64) {
		binary.LittleEndian.PutUint64(buf[:], uint64(v))
		h.Write(buf[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		h.Write([]byte(s))
	}
	flag := func(b bool) {
		if b {
			num(1)
		} else {
			num(0)
		}
	}
	str("gcompile/data/tokenizer v1")
	str(sp.kind.String())
	num(int64(len(names)))
	for id, tok := range names {
		flag(has[id])
		str(tok)
	}
	// Merges as they act: a pair listed twice keeps its last rank.
	live := 0
	for rank, p := range pairs {
		if v := t.merges.get(p[0], p[1]); int(v>>32) == rank {
			live++
		}
	}
	num(int64(live))
	for rank, p := range pairs {
		if v := t.merges.get(p[0], p[1]); int(v>>32) == rank {
			num(int64(p[0]))
			num(int64(p[1]))
		}
	}
	added := slices.Clone(sp.added)
	slices.SortStableFunc(added, func(x, y addedToken) int { return int(x.id) - int(y.id) })
	num(int64(len(added)))
	for _, a := range added {
		num(int64(a.id))
		str(a.content)
		flag(a.singleWord)
		flag(a.lstrip)
		flag(a.rstrip)
		flag(a.normalized && len(sp.norm) > 0)
	}
	num(int64(len(sp.steps)))
	for _, s := range sp.steps {
		flag(s.prefixSpace)
		str(s.split.String())
	}
	num(int64(len(sp.norm)))
	for _, op := range sp.norm {
		flag(op.prepend)
		flag(op.nfc)
		str(op.from)
		str(op.to)
	}
	flag(sp.byteFallback)
	flag(sp.fuseUnk)
	flag(sp.ignoreMerges)
	num(int64(t.unkID))
	num(int64(t.eos))
	num(int64(t.bos))
	// Added in a way that leaves the fingerprints of tokenizers without a
	// Metaspace pre-tokenizer as they were.
	if m := sp.meta; m != nil {
		str("metaspace")
		num(int64(m.rep))
		num(int64(m.prepend))
		flag(m.split)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// decodeTable says whether a SentencePiece decoder chain can be run from a
// table of per-id bytes: per-token Replace steps, then ByteFallback, then
// Fuse and a Strip of spaces from the whole (Llama's and Gemma's chains,
// and the default). It returns the per-token steps and how many spaces
// the Strip drops at the start and at the end. Other chains (a Metaspace
// decoder, whose first token differs from the rest; a Strip of each token)
// run step by step.
func decodeTable(steps []decStep) (perToken []decStep, start, stop int, ok bool) {
	i := 0
	for i < len(steps) && steps[i].kind == decReplace {
		i++
	}
	if i < len(steps) && steps[i].kind == decByteFallback {
		i++
	}
	perToken = steps[:i]
	if i < len(steps) && steps[i].kind == decFuse {
		i++
		if i < len(steps) && steps[i].kind == decStrip && steps[i].char == ' ' {
			start, stop = steps[i].start, steps[i].stop
			i++
		}
		for i < len(steps) && steps[i].kind == decFuse {
			i++
		}
	}
	return perToken, start, stop, i == len(steps)
}

// appendDecodedToken appends what per-token decoder steps (Replace, then
// ByteFallback) make of one token. A byte token becomes its byte as it
// is: HF writes U+FFFD for bytes that do not form valid UTF-8.
func appendDecodedToken(dst []byte, tok string, steps []decStep) []byte {
	for _, s := range steps {
		switch s.kind {
		case decReplace:
			tok = strings.ReplaceAll(tok, s.from, s.to)
		case decByteFallback:
			if b, ok := byteToken(tok); ok {
				return append(dst, b)
			}
		}
	}
	return append(dst, tok...)
}
