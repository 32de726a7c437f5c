package indexed

import (
	"errors"
	"fmt"
)

// Errors that callers can tell apart with errors.Is. Every error about a
// dataset's contents or its use wraps one of them, and its message names
// the file, the field, what was expected and what was found; errors from
// the file system (a missing file, a folder that cannot be written) wrap
// the os error instead.
var (
	// ErrFormat marks a file that is not a well-formed dataset: a wrong
	// magic, inconsistent offsets or document indices, trailing bytes.
	ErrFormat = errors.New("not a valid indexed dataset")
	// ErrTruncated marks a file shorter than its header says: usually a
	// copy or a write that did not finish.
	ErrTruncated = errors.New("indexed dataset file is truncated")
	// ErrVersion marks an .idx of a version other than 1, the only one
	// Megatron-LM has written.
	ErrVersion = errors.New("unsupported indexed dataset version")
	// ErrDType marks a dtype code that is unknown or not an integer type.
	ErrDType = errors.New("unsupported token dtype")
	// ErrTokenRange marks a token id that the dtype cannot hold, or one
	// stored in the dataset that is not a valid int32 id (negative, or
	// above 2^31-1 in an int64 dataset).
	ErrTokenRange = errors.New("token id out of range")
	// ErrBounds marks a Read outside the dataset: a sequence index or a
	// token range that does not exist.
	ErrBounds = errors.New("read out of bounds")
	// ErrClosed marks use of a Dataset after Close or of a Writer after
	// Commit or Abort.
	ErrClosed = errors.New("indexed dataset is closed")
)

// fileErr is an error about one file: "FILE: MESSAGE: SENTINEL".
func fileErr(file string, sentinel error, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", file, fmt.Sprintf(format, args...), sentinel)
}
