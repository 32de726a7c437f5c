// Package tokenizer is a pure-Go implementation of the Hugging Face BPE
// tokenizers that real training data is prepared with. It gives the same
// ids as the reference implementations, so a model trained on data
// tokenized here works with the published vocabularies and checkpoints,
// and it needs neither cgo nor Python.
//
// Two families are built:
//
//   - Byte-level BPE (GPT-2, Llama 3, Qwen 2 and 3). Text is cut into
//     pre-tokens by the model's split pattern; each pre-token starts as one
//     symbol per byte and the merges apply by rank. Read from a
//     tokenizer.json whose pre-tokenizer is ByteLevel (with use_regex:
//     GPT-2's pattern), or a Sequence of Split and ByteLevel (Llama 3,
//     Qwen), or from GPT-2's original vocab.json/encoder.json with
//     merges.txt/vocab.bpe. Qwen's NFC normalizer is built in (its Unicode
//     tables are generated, see nfc_tables.go).
//   - SentencePiece-style BPE (Llama 2, Mistral). Either a normalizer
//     prepends ▁ and turns spaces into ▁ (Llama 2's older files) or a
//     Metaspace pre-tokenizer does (Mistral v0.3, newer Llama conversions;
//     see below); each character starts as a symbol, and one outside the
//     vocabulary becomes its UTF-8 bytes as <0xNN> tokens (byte_fallback)
//     or the unk token (fused when fuse_unk is set).
//
// Anything else (WordPiece, Unigram and WordLevel models, normalizers
// other than NFC, Prepend and Replace of a plain string, split regexes
// other than the known ones, a Metaspace pre-tokenizer combined with
// another one or with a replacement other than ▁) makes Load fail with
// ErrUnsupported: a tokenizer that would give different ids than its
// reference is worse than none.
//
// # Metaspace
//
// The Metaspace pre-tokenizer works on each stretch of text between added
// tokens, after the normalizer, as HF's does: every space (U+0020; not
// tabs or newlines) becomes ▁; then ▁ goes in front of the stretch unless
// it now starts with ▁ (so a leading space is not doubled, unlike the
// Prepend normalizer), as prepend_scheme says: "always" for every
// stretch, "first" only for the stretch at the start of the text (not one
// that follows an added token), "never" for none. With split true the
// result is cut before every ▁ and each piece, its ▁ at the start, is
// merged on its own (each space of a run is a ▁ of its own); with split
// false the stretch is one word. Files written before tokenizers 0.19
// have add_prefix_space instead: true is "always", false "never" (as the
// versions that wrote it read it; HF 0.19 and later refuse that file), and
// split is then true. prepend_scheme first is refused (ErrUnsupported)
// after a Prepend or Replace normalizer, and after NFC when added tokens
// are matched in normalized text: HF decides which stretch is first by
// its offset in the original text, read through the normalizer's
// alignments, which those would move.
//
// The Metaspace decoder turns ▁ into spaces, except that the first token
// loses its ▁ (unless prepend_scheme is never). Decode runs the decoder
// chain (Replace, ByteFallback, Fuse, Strip, Metaspace) step by step on
// the token strings, as HF does; see Decode for the round trips.
//
// # Pre-tokenizer patterns
//
// The split regexes are recognised by their exact text in tokenizer.json
// and run as hand-written matchers (Go's regexp has no look-ahead, and a
// matcher made for its pattern is much faster):
//
//	GPT-2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//	Llama 3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//	Qwen 2   the Llama 3 pattern with \p{N} in place of \p{N}{1,3}
//
// Another pattern fails with ErrUnknownPattern (wrapped in ErrUnsupported).
//
// # Which reference
//
// The semantics are those of HF tokenizers (Rust): added tokens are found
// first (those with normalized false in the raw text, then the others in
// the normalized text; leftmost, longest first, honouring lstrip, rstrip
// and single_word), every stretch of text between them is normalized and
// pre-tokenized on its own, BPE merges the lowest-ranked pair first
// (leftmost among equals), and with ignore_merges a pre-token found whole
// in the vocabulary is one id. The committed tests compare the ids with
// OpenAI's GPT-2 encoder (the gpt-3-encoder npm port) and with
// transformers.js (@lenml/tokenizers), which agree with HF on all of the
// test corpus, and the Metaspace tokenizers' ids with HF tokenizers
// itself (its Rust library, through the tokenizers npm package):
// transformers.js ignores split and does not prepend for files that spell
// prepend_scheme without add_prefix_space. Where the JavaScript regex
// engine and Rust's differ, this package follows Rust: \s is Unicode
// White_Space (U+0085 is a space,
// U+FEFF is not), and (?i) folds ſ (U+017F) to s. Character classes come
// from Go's unicode tables (Unicode 15.0), so letters and digits added in
// later Unicode versions count as symbols; the NFC tables come from ICU
// (Unicode 17.0), where HF's normalizer crate has older data, which matters
// only for characters added in recent versions.
//
// # Bytes that are not UTF-8
//
// Encode takes any bytes. In byte-level BPE an invalid byte is split as
// U+FFFD would be (a symbol, neither letter, digit nor space) but keeps
// its own value, so Decode(Encode(x)) == x for every x (NFC(x) under an NFC
// normalizer, which leaves invalid bytes alone too). SentencePiece BPE
// turns an invalid byte into its <0xNN> token, and Decode gives the byte
// back as it is (HF writes U+FFFD). HF itself only accepts valid strings;
// for those the ids are the same.
//
// # Files
//
// Load accepts gzipped files (by their magic bytes) as well as plain ones,
// and reads eos_token and bos_token from a tokenizer_config.json beside
// the tokenizer. Fingerprint identifies what decides the ids, so cached
// token data can be checked against the tokenizer that made it.
//
// # Speed
//
// A Tokenizer is safe for concurrent use, and EncodeAll spreads documents
// over goroutines. Each concurrent encode has its own word cache (pre-token
// bytes to ids), merges are looked up in an open-addressing table keyed by
// the pair of ids, short words merge by rescanning an array of pair ranks
// and long ones through a heap, and a warm AppendEncode allocates nothing.
// On mixed text that is 75 to 130 MB/s per core, depending on the
// tokenizer (bench/results/tokenizer-2026-12-04.txt).
package tokenizer
