// Package prepare turns text into a token dataset: the library behind
// `gcompile data prepare`. Run reads text files, folders and JSON Lines
// (plain or gzipped), tokenizes every document with the Encoder it is given
// on a pool of goroutines, and writes PREFIX.bin and PREFIX.idx in
// Megatron-LM's indexed format (package data/indexed) plus a small
// metadata file, PREFIX.json, that later readers use to check a tokenizer
// against the dataset without scanning it.
//
// What makes a document:
//
//   - A text file (any name not listed below, optionally .gz) is one
//     document: its whole contents, a leading UTF-8 byte order mark
//     removed. Bytes in it that are not UTF-8 (a Latin-1 file) are
//     tokenized as they are, as the tokenizer's byte-level or
//     byte-fallback tokens; a JSON Lines string cannot hold them, so
//     there they stop the run (below).
//   - In a .jsonl, .ndjson or .json file (optionally .gz), each line is one
//     JSON object and one document, the string under Options.JSONKey
//     ("text" by default). A .json input is read as JSON Lines, as
//     Megatron-LM's tools/preprocess_data.py reads its "loose JSON" input.
//     Blank lines are ignored. A line that is not a JSON object, lacks the
//     key, holds something other than a string under it, or holds a string
//     with bytes that are not UTF-8 stops the run,
//     naming FILE:LINE, unless Options.SkipBadLines counts and skips it.
//   - A folder is walked recursively, depth first, each folder's entries
//     in name order, so the output does not depend on the file system's
//     listing order. Names
//     starting with a dot are skipped, symbolic links to files are read and
//     links to folders are not followed. A file read already through
//     another path (a symbolic or hard link to it, in a folder or named)
//     is skipped and counted, so its documents are written once. A
//     folder's text file that looks binary (a NUL byte in its first 8 KiB)
//     is skipped and counted; one named on its own is refused.
//   - .zst, .xz, .bz2, .zip, .tar and similar inputs are refused: decompress
//     or extract them first. In a folder they are skipped and counted, as
//     binary files are.
//
// Each document's tokens are followed by the encoder's end-of-document
// token when Options.AppendEOS is set. A document that encodes to no
// tokens (an empty text file, an empty "text" value) is not written at
// all; Summary.EmptyDocuments counts them. This differs from Megatron-LM's
// preprocess_data.py in form only: it too appends no end-of-document token
// to an empty document, and records it as a document of zero sequences,
// which no training sample can draw from. Leaving it out keeps one
// sequence per document.
//
// Run's output is byte-identical for any number of workers: documents are
// read in order by one goroutine, in batches of a bounded size, tokenized
// in parallel and written back in the reading order. At most a fixed number
// of batches is in flight, so memory does not grow with the corpus; it
// grows only with the largest single document, which must be held whole
// to be tokenized.
//
// Everything that can be checked before the work is checked first: the
// output folder is writable (the temporary files are created), every
// input exists, is readable, and (for .gz) starts as gzip. On any failure,
// and when the context is cancelled, the temporary files are removed and
// nothing is left under PREFIX.bin, PREFIX.idx or PREFIX.json. A dataset
// already under the prefix stays as it was, its PREFIX.json included,
// unless the failure comes while the finished files are renamed over it
// (then there is none): the new record is renamed into place with the
// new pair, after every write has succeeded.
//
// While Run writes, PREFIX.lock names it (pid, host, start time), taken
// before anything else is written: a second Run on the same prefix, from
// any process, is refused with ErrLocked and told which one holds it. A
// lock whose process is gone (on this host) is taken over; one from
// another host, or a PREFIX.lock that is not a data prepare's, is left
// for the user to remove. Holding the lock, Run removes the temporary
// files (PREFIX.bin.tmp-N, .idx.tmp-N, .json.tmp-N) that a run of the
// prefix killed before it finished left, and Summary says how much.
package prepare
