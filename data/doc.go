// Package data turns real text into byte-level training data for a
// byte-level GPT (vocabulary of 256, one token per byte).
//
// The default corpus is the Go standard library sources under
// $(go env GOROOT)/src: every machine that can run gcompile already has
// them, so training runs on real, structured text without a download.
//
// Two properties matter more than anything else here:
//
//   - Which files are held out for evaluation depends only on each file's
//     path relative to the corpus root (an FNV-1a hash), never on the
//     training seed or on which other files exist. Evaluation losses from
//     runs with different seeds, or from a slightly different tree, are
//     therefore measured on the same text and can be compared.
//   - Batches are pure functions of their arguments: TrainBatch of
//     (seed, step) and EvalBatch of an index. A resumed or repeated run
//     sees exactly the same data, which keeps loss curves reproducible.
//
// Callers should call Corpus.Check with their sequence length before
// drawing batches; the batch functions return nil rather than failing
// when the corpus is too small. A model whose vocabulary is below 256
// cannot take every byte: Corpus.CheckVocab finds the first byte it
// cannot. A file given on its own that looks binary (a NUL byte in its
// first 8 KiB) is refused, as a folder's binary files are skipped.
package data
