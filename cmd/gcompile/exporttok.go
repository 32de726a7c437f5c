package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
		// The run's classes came from the data alone (its largest id + 1,
		// or a dataset's record): the tokenizer may have more ids than
		// the data used (Llama 3's reserved ones), which the padded
		// table has rows for. The export keeps a row for each of its ids.
		for name, classes := range m.Plan.VocabTables {
			tb := m.Tensors[name]
			if tb == nil || len(tb.Shape) == 0 {
				continue
			}
			if rows := tb.Shape[0]; tok.VocabSize() > rows {
				return exportedTokenizer{}, fmt.Errorf("--tokenizer %s has %d ids, and the model's vocabulary table %s only %d rows: its run read the data without --tokenizer, so the vocabulary followed the data's %d classes (padded), and the ids past it have no row; train with --tokenizer for a model of all the tokenizer's ids, or export without it", path, tok.VocabSize(), name, rows, classes)
			} else if tok.VocabSize() > classes {
				m.Plan.VocabTables[name] = tok.VocabSize()
				fmt.Fprintf(os.Stderr, "note: export keeps %d rows of %s, one for each of the tokenizer's ids; the data's ids are below %d, so the rows past them kept their initial values\n", tok.VocabSize(), name, classes)
			}
		}
		if len(m.Plan.VocabTables) == 0 && cfg != nil {
			// A vocabulary not padded: the model's own size.
			if v, ok := cfg["vocab_size"].(float64); ok && float64(tok.VocabSize()) > v {
				return exportedTokenizer{}, fmt.Errorf("--tokenizer %s has %d ids, and the model's vocabulary %g: ids past it have no row; it is not the tokenizer of this model", path, tok.VocabSize(), v)
			}
		}
		fmt.Fprintf(os.Stderr, "note: the checkpoint records no tokenizer (its run read token data without --tokenizer): %s is taken as the data's, checked only against the vocabulary's size\n", path)
	}
	files, err := tokenizer.HFFiles(path, merges)
	if err != nil {
		return exportedTokenizer{}, fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	if !slices.ContainsFunc(files, func(f tokenizer.HFFile) bool { return f.Name == "tokenizer_config.json" || f.Name == "tokenizer.json" }) {
		// GPT-2's pair alone: AutoTokenizer would take the tokenizer
		// class from config.json's model_type (a Llama's cannot read a
		// vocab.json and merges.txt).
		files = append(files, tokenizer.HFFile{Name: "tokenizer_config.json", Data: []byte(`{"tokenizer_class": "GPT2Tokenizer"}` + "\n")})
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

// hfTokenizerFiles are the files AutoTokenizer reads beside a model.
var hfTokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json"}

// checkFolder refuses a folder that holds a tokenizer file export would
// not write: AutoTokenizer would read it beside the ones written (a
// tokenizer.json left by another export is read before vocab.json and
// merges.txt), and it is not export's to remove.
func (t exportedTokenizer) checkFolder(dir string) error {
	for _, name := range hfTokenizerFiles {
		if slices.ContainsFunc(t.files, func(f tokenizer.HFFile) bool { return f.Name == name }) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("%s holds %s, which is not this tokenizer's: AutoTokenizer would read it beside the files written; remove it, or export into another folder", dir, name)
		}
	}
	return nil
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
