package tokenizer

import "errors"

// The sentinels below let callers tell a tokenizer this package cannot run
// (ErrUnsupported) from a file that is broken (ErrFormat) with errors.Is,
// whatever the wording of the message around them. Every error Load returns
// names the file it was reading; a file that does not exist comes back
// wrapping fs.ErrNotExist.
var (
	// ErrUnsupported marks a tokenizer that is valid but uses a model, normalizer,
	// pre-tokenizer or option this package does not implement. Refusing is safer
	// than encoding with different ids than the reference would.
	ErrUnsupported = errors.New("tokenizer: unsupported")

	// ErrUnknownPattern marks a pre-tokenizer regex that is not one of the
	// patterns with a hand-written matcher (GPT-2, Llama 3, Qwen 2). It always
	// comes wrapped together with ErrUnsupported.
	ErrUnknownPattern = errors.New("tokenizer: unknown pre-tokenizer pattern")

	// ErrFormat marks a malformed file: bad JSON or gzip, a merge that names a
	// token missing from the vocabulary, two tokens sharing an id, and the like.
	ErrFormat = errors.New("tokenizer: malformed file")

	// ErrMissingMerges marks a GPT-2 vocab.json/encoder.json given without the
	// merges file (merges.txt or vocab.bpe) that it cannot work without.
	ErrMissingMerges = errors.New("tokenizer: merges file required")
)
