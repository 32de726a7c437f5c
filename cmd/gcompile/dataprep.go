package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"gcompile/data/indexed"
	"gcompile/data/prepare"
	"gcompile/data/tokenizer"
)

// dataMain is `gcompile data SUBCOMMAND`: the data tools, prepare and
// merge.
func dataMain(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fmt.Fprint(os.Stderr, "usage: gcompile data prepare --tokenizer T --output-prefix PREFIX INPUT…\n"+
			"       gcompile data merge --output-prefix PREFIX DATASET…\n\n"+
			"  prepare   tokenize text files, folders or JSON Lines into a token dataset in Megatron-LM's\n"+
			"            indexed format (PREFIX.bin, PREFIX.idx), which --data PREFIX trains on\n"+
			"  merge     write token datasets (prepared in shards, say) one after another as one dataset,\n"+
			"            as Megatron-LM's tools/merge_datasets.py does\n")
		if len(args) == 0 {
			return errors.New("data: name a subcommand (prepare or merge)")
		}
		return nil
	}
	switch args[0] {
	case "prepare":
		return prepareMain(args[1:], os.Stdout, os.Stderr)
	case "merge":
		return mergeMain(args[1:], os.Stdout, os.Stderr)
	}
	return fmt.Errorf("data: unknown subcommand %q (want prepare or merge; see gcompile data -h)", args[0])
}

// maxPrepareWorkers bounds --workers: far past any machine's cores.
const maxPrepareWorkers = 4096

// prepareMain is `gcompile data prepare`.
func prepareMain(args []string, stdout, stderr io.Writer) error {
	fs := newSubcommandFlags("data prepare", "--tokenizer T --output-prefix PREFIX INPUT…\n\nINPUT is a text file (one document), a folder (its files, recursively, in name order), or JSON Lines (.jsonl, .ndjson or .json, in a folder too: one document per line, as Megatron-LM reads them; .gz read as gzip).")
	tok := fs.String("tokenizer", "", "a Hugging Face tokenizer.json, a folder holding one, or GPT-2's vocab.json (with --merges)")
	merges := fs.String("merges", "", "with --tokenizer vocab.json: GPT-2's merges.txt")
	out := fs.String("output-prefix", "", "write PREFIX.bin, PREFIX.idx (Megatron-LM's indexed format) and PREFIX.json (what made them); --data PREFIX trains on them (Megatron-LM's preprocess_data.py adds _text_document to its prefix, this does not)")
	key := fs.String("json-key", "text", "the field of each JSON Lines object that holds the document's text")
	skip := fs.Bool("skip-bad-lines", false, "skip (and count) JSON Lines lines that are not JSON objects, lack --json-key, or hold no UTF-8 string under it; by default such a line stops the run, naming file:line")
	workers := fs.Int("workers", 0, "tokenizing goroutines (0: one per core); the output is the same for any number")
	noEOS := fs.Bool("no-eos", false, "do not append the tokenizer's end-of-document token to each document")
	bos := fs.Bool("bos", false, "begin each document with the tokenizer's beginning-of-sequence token, as Hugging Face's Llama tokenizers add it and Megatron-LM's preprocess_data.py writes it with them (then generate with --bos)")
	quiet := fs.Bool("quiet", false, "no progress line")
	inputs, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *tok == "":
		return errors.New("data prepare: --tokenizer is required (a tokenizer.json, its folder, or GPT-2's vocab.json with --merges)")
	case *out == "":
		return errors.New("data prepare: --output-prefix PREFIX is required")
	case len(inputs) == 0:
		return errors.New("data prepare: name at least one INPUT (a text file, a folder or a .jsonl file)")
	case *workers < 0:
		return fmt.Errorf("data prepare: --workers must be ≥ 0, got %d", *workers)
	case *workers > maxPrepareWorkers:
		// Each holds a document and its tokens: more than the cores can
		// run only costs memory and start-up (a million took seconds for
		// a few bytes).
		return fmt.Errorf("data prepare: --workers %d: at most %d (0: one per core, %d here)", *workers, maxPrepareWorkers, goruntime.NumCPU())
	case *key == "":
		return errors.New(`data prepare: --json-key "": name the field that holds each document's text`)
	}
	if err := checkPrepareInputs(inputs, *out, tokenizer.ReadPaths(*tok, *merges)); err != nil {
		return fmt.Errorf("data prepare: %w", err)
	}
	if err := checkDatasetOutput(*out); err != nil {
		return fmt.Errorf("data prepare: %w", err)
	}
	t, err := tokenizer.Load(*tok, *merges)
	if err != nil {
		given := "--tokenizer " + *tok
		if *merges != "" {
			given += " --merges " + *merges
		}
		return fmt.Errorf("data prepare: %s: %w", given, err)
	}
	if _, ok := t.EOS(); !ok && !*noEOS {
		return fmt.Errorf("data prepare: --tokenizer %s has no end-of-document token to append to each document; give --no-eos to write documents without one", *tok)
	}
	bosID, hasBOS := t.BOS()
	if *bos && !hasBOS {
		return fmt.Errorf("data prepare: --bos: --tokenizer %s has no beginning-of-sequence token", *tok)
	}
	ctx, caught, stop := stopOnSignal()
	defer stop()
	opt := prepare.Options{
		Inputs: inputs, OutputPrefix: *out, JSONKey: *key, SkipBadLines: *skip, Workers: *workers,
		AppendEOS: !*noEOS, PrependBOS: *bos, BOS: bosID, DType: indexed.DTypeFor(t.VocabSize()),
		Tokenizer: t.Fingerprint(), TokenizerPath: t.Path(),
	}
	var last time.Time
	if !*quiet {
		opt.Progress = func(p prepare.Progress) {
			if time.Since(last) < 400*time.Millisecond {
				return
			}
			last = time.Now()
			fmt.Fprintf(stderr, "\r%s", p)
		}
	}
	fmt.Fprintf(stderr, "tokenizing with %s (%s, %d tokens) into %s.bin/.idx (%s)\n", t.Path(), t.Kind(), t.VocabSize(), *out, opt.DType)
	if why := t.Lossy(); why != "" {
		fmt.Fprintf(stderr, "note: the tokenizer drops what it has no token for (%s), as Hugging Face's does: documents holding such text lose it\n", why)
	}
	sum, err := prepare.Run(ctx, t, opt)
	if !*quiet {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return dataToolFailed("prepare", *out, caught, err)
	}
	fmt.Fprintf(stdout, "%s.bin, %s.idx: %s\n", *out, *out, sum)
	return nil
}

// mergeMain is `gcompile data merge`.
func mergeMain(args []string, stdout, stderr io.Writer) error {
	fs := newSubcommandFlags("data merge", "--output-prefix PREFIX DATASET…\n\nDATASET is a token dataset's prefix (DATASET.bin and DATASET.idx, as --data names it). Their documents are written in the order given, one dataset after another; the tokens are stored as the datasets store them, or as int32 where they differ. PREFIX.json, the record of the tokenizer that training checks, is written when every dataset has one and they agree.")
	out := fs.String("output-prefix", "", "write PREFIX.bin, PREFIX.idx and, where the datasets have records, PREFIX.json")
	inputs, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *out == "":
		return errors.New("data merge: --output-prefix PREFIX is required")
	case len(inputs) == 0:
		return errors.New("data merge: name at least one DATASET prefix to merge")
	}
	if err := checkDatasetOutput(*out); err != nil {
		return fmt.Errorf("data merge: %w", err)
	}
	ctx, caught, stop := stopOnSignal()
	defer stop()
	fmt.Fprintf(stderr, "merging %d datasets into %s.bin/.idx\n", len(inputs), *out)
	sum, err := prepare.Merge(ctx, *out, inputs)
	if err != nil {
		return dataToolFailed("merge", *out, caught, err)
	}
	fmt.Fprintf(stdout, "%s.bin, %s.idx: %s\n", *out, *out, sum)
	return nil
}

// dataToolFailed is the error of a data tool whose run failed, or was
// stopped by a signal it caught (then with the exit status 128 + the
// signal): either way nothing was written under out.
func dataToolFailed(tool, out string, caught <-chan os.Signal, err error) error {
	select {
	case s := <-caught:
		return &exitStatus{err: fmt.Errorf("data %s: stopped by %v (nothing was written under %s)", tool, s, out), code: signalStatus(s)}
	default:
	}
	return fmt.Errorf("data %s: %w (nothing was written under %s)", tool, err, out)
}

// checkDatasetOutput refuses an output prefix that names a folder or
// would replace files that are not a token dataset's, and makes its
// folder, as --dump's and --checkpoint-dir's are made.
func checkDatasetOutput(out string) error {
	if fi, err := os.Stat(out); err == nil && fi.IsDir() || strings.HasSuffix(out, string(filepath.Separator)) {
		// A prefix ending in a separator names a folder, made or not:
		// refused before the folder is made.
		return fmt.Errorf("--output-prefix %s is a folder; give a path prefix inside it, such as %s", out, filepath.Join(out, "data"))
	}
	if err := checkReplaceable(out); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("--output-prefix %s: %w", out, err)
	}
	for _, ext := range []string{".bin", ".idx", ".json"} {
		if err := checkOutputFile("output-prefix", out+ext); err != nil {
			return err
		}
	}
	return nil
}

// stopOnSignal is a context a stop signal cancels, with the signal caught
// (a stopped data tool writes nothing and exits as a stopped training run
// does, 128 + the signal), and the function that stops watching.
func stopOnSignal() (context.Context, <-chan os.Signal, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	caught := make(chan os.Signal, 1)
	go func() {
		select {
		case s := <-sigs:
			caught <- s
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, caught, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// checkReplaceable refuses an output prefix whose files exist and are not
// a token dataset's: a prepare replaces PREFIX.bin, .idx and .json, which
// is what a second prepare of a dataset wants, but a PREFIX.json of
// another kind (a model's config.json under --output-prefix DIR/config),
// or a PREFIX.bin beside no index, is someone's file that would be lost.
func checkReplaceable(out string) error {
	var errs []error
	fi, err := os.Stat(out + ".json")
	switch {
	case err == nil && fi.Mode().IsRegular():
		// A record of ours that no longer matches its files (ReadMeta's
		// error) is replaced like a good one.
		_, ours, err := prepare.ReadMeta(out)
		_, binErr := os.Stat(out + ".bin")
		_, idxErr := os.Stat(out + ".idx")
		// A file that is not JSON beside a dataset is our record cut
		// short; alone, it may be a user's file. A record of ours whose
		// dataset is gone (deleted, or a first prepare killed between its
		// renames) is replaced.
		raw, _ := os.ReadFile(out + ".json")
		if err == nil && !ours || err != nil && !json.Valid(raw) && binErr != nil && idxErr != nil {
			errs = append(errs, fmt.Errorf("--output-prefix %s would replace %s.json, which is not a dataset record (a gcompile data prepare writes one beside its .bin and .idx); give the dataset another prefix, or remove the file", out, out))
		}
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		errs = append(errs, fmt.Errorf("--output-prefix %s: %w", out, err))
	}
	idx, err := indexed.IsIndexFile(out + ".idx")
	switch {
	case err == nil && !idx:
		errs = append(errs, fmt.Errorf("--output-prefix %s would replace %s.idx, which is not an indexed dataset's index (no MMIDIDX magic); give the dataset another prefix, or remove the file", out, out))
	case errors.Is(err, fs.ErrNotExist):
		if _, err := os.Stat(out + ".bin"); err == nil {
			errs = append(errs, fmt.Errorf("--output-prefix %s would replace %s.bin, which has no index beside it (%s.idx) and so is not a dataset's (a prepare stopped while it replaced one may leave it: then remove it); give the dataset another prefix, or remove the file", out, out, out))
		}
	case err != nil:
		// Not a regular file: checkOutputFile names it. Unreadable: said.
		if fi, serr := os.Stat(out + ".idx"); serr != nil || fi.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("--output-prefix %s would replace %w", out, err))
		}
	}
	return errors.Join(errs...)
}

// checkPrepareInputs refuses inputs that would read a document twice (an
// input given twice, or a file inside a folder also given) and outputs
// that an input would read: inside an input folder, the next prepare of
// that folder would take the dataset for documents (its .json failed as
// a bad JSON Lines line), and over an input file it would destroy it.
func checkPrepareInputs(inputs []string, out string, tokenizerReads []string) error {
	var errs []error
	for _, ext := range []string{".bin", ".idx", ".json"} {
		for _, r := range tokenizerReads {
			if samePath(r, out+ext) {
				errs = append(errs, fmt.Errorf("--output-prefix %s writes %s, which --tokenizer reads: writing it would destroy the tokenizer; give the dataset another prefix", out, out+ext))
			}
		}
	}
	for i, in := range inputs {
		for _, prev := range inputs[:i] {
			switch {
			case samePath(prev, in):
				errs = append(errs, fmt.Errorf("INPUT %s is given twice: its documents would be written twice", in))
			case within(prev, in):
				errs = append(errs, fmt.Errorf("INPUT %s is inside INPUT folder %s, which reads it already: its documents would be written twice", in, prev))
			case within(in, prev):
				errs = append(errs, fmt.Errorf("INPUT folder %s holds INPUT %s, which it reads already: its documents would be written twice", in, prev))
			}
		}
		if within(in, out) {
			errs = append(errs, fmt.Errorf("--output-prefix %s is inside INPUT folder %s: the dataset's files would be read as documents by the next prepare of that folder; write it outside", out, in))
		}
		for _, ext := range []string{".bin", ".idx", ".json"} {
			if samePath(in, out+ext) {
				errs = append(errs, fmt.Errorf("--output-prefix %s writes %s, which is INPUT %s: writing it would destroy what is read; give the dataset another prefix", out, out+ext, in))
			}
		}
	}
	return errors.Join(errs...)
}
