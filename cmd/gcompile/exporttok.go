package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gcompile/data/tokenizer"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
)

// exportedTokenizer is what export writes of the run's tokenizer beside
// the weights: the files AutoTokenizer.from_pretrained reads, so that the
// folder loads as a whole; nothing when no --tokenizer was given.
type exportedTokenizer struct {
	files []tokenizer.HFFile
}

// trainedOnBytes says whether the checkpoint's run read byte-level text,
// whose ids are the bytes themselves ("" is how older checkpoints and
// .gir runs on text record it).
func trainedOnBytes(m *checkpoint.Manifest) bool {
	return m.Plan.Data == "" || checkpoint.IsTextIdentity(m.Plan.Data)
}

// exportTokenizer reads the tokenizer export was given and checks it is
// the run's: the fingerprint its data identity records, or, for a run on
// token data without a tokenizer, one whose ids the model's vocabulary
// holds. It sets cfg's eos_token_id and bos_token_id to the tokenizer's:
// a run that trained with it recorded the same (exportConfigOf), and a run
// on token data without one recorded none, which leaves Hugging Face's
// defaults (LlamaConfig's 1 and 2; Llama 3 ends a document with 128001),
// and its generate stops at the config's end id. All of it is found out
// before the weights are written.
func exportTokenizer(m *checkpoint.Manifest, path, merges string, cfg map[string]any) (exportedTokenizer, error) {
	if path == "" {
		if merges != "" {
			return exportedTokenizer{}, fmt.Errorf("--merges %s goes with --tokenizer vocab.json, which was not given", merges)
		}
		return exportedTokenizer{}, nil
	}
	if trainedOnBytes(m) {
		return exportedTokenizer{}, fmt.Errorf("--tokenizer %s: the checkpoint's run trained on bytes, one byte per token: its ids are bytes, which no tokenizer reads (leave --tokenizer out)", path)
	}
	tok, err := tokenizer.Load(path, merges)
	if err != nil {
		return exportedTokenizer{}, fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	if err := sameTokenizer(m, tok, path); err != nil {
		return exportedTokenizer{}, err
	}
	if !strings.Contains(m.Plan.Data, ";tokenizer ") {
		rows := 0
		for _, r := range m.Plan.VocabTables {
			rows = r
		}
		if rows > 0 && tok.VocabSize() > rows {
			return exportedTokenizer{}, fmt.Errorf("--tokenizer %s has %d ids, and the model's vocabulary %d rows: it is not the tokenizer its data was prepared with", path, tok.VocabSize(), rows)
		}
		fmt.Fprintf(os.Stderr, "note: the checkpoint records no tokenizer (its run read token data without --tokenizer): %s is taken as the data's, unchecked\n", path)
	}
	files, err := tokenizer.HFFiles(path, merges)
	if err != nil {
		return exportedTokenizer{}, fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	if cfg != nil {
		if id, ok := tok.EOS(); ok {
			cfg["eos_token_id"] = id
		}
		if id, ok := tok.BOS(); ok {
			cfg["bos_token_id"] = id
		}
	}
	return exportedTokenizer{files}, nil
}

// write writes the tokenizer's files into dir, each atomically.
func (t exportedTokenizer) write(dir string) error {
	var names []string
	for _, f := range t.files {
		if err := runtime.WriteFileAtomic(filepath.Join(dir, f.Name), f.Data); err != nil {
			return fmt.Errorf("the tokenizer's %s: %w", f.Name, err)
		}
		names = append(names, f.Name)
	}
	if len(names) > 0 {
		fmt.Fprintf(os.Stderr, "wrote %s in %s (the run's tokenizer, as AutoTokenizer reads it)\n", strings.Join(names, ", "), dir)
	}
	return nil
}
