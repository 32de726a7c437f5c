package prepare

import (
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
)

// Errors callers can tell apart with errors.Is. Messages name the file (and
// line, for JSON Lines) and, where there is one, the fix.
var (
	// ErrInput marks an input that is missing, unreadable, binary, of a
	// format that cannot be read, or one of the outputs.
	ErrInput = errors.New("bad input")
	// ErrGzip marks a .gz input that is not a whole, valid gzip stream.
	ErrGzip = errors.New("corrupt gzip input")
	// ErrBadLine marks a JSON Lines line that is not a JSON object holding
	// a string under the key, when such lines are not skipped.
	ErrBadLine = errors.New("bad JSON Lines line")
	// ErrNoEOS marks a run asked to append an end-of-document token with
	// an encoder that has none.
	ErrNoEOS = errors.New("the encoder has no end-of-document token")
	// ErrNoDocuments marks inputs that held no document with any token:
	// a dataset of nothing would only fail later, at training.
	ErrNoDocuments = errors.New("no documents in the inputs")
	// ErrMeta marks a metadata file (PREFIX.json) that is ours but cannot
	// be used: unreadable, of a newer version, or describing other files
	// than the ones beside it.
	ErrMeta = errors.New("bad dataset metadata")
	// ErrLocked marks an output prefix another data prepare is writing
	// (its PREFIX.lock names it), or whose PREFIX.lock is not a data
	// prepare's.
	ErrLocked = errors.New("the output prefix is locked")
)

// gzipErr is the error for a .gz input whose stream is broken.
func gzipErr(path string, err error) error {
	return fmt.Errorf("input %s: %w: %w (the file is not gzip, or is truncated or damaged: check it with gzip -t)", path, ErrGzip, err)
}

// readErr classifies an error reading path: a broken gzip stream, or an
// I/O error.
func readErr(path string, gz bool, err error) error {
	var corrupt flate.CorruptInputError
	if gz && (errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &corrupt)) {
		return gzipErr(path, err)
	}
	return fmt.Errorf("input %s: read: %w", path, err)
}
