package tokenizer

import (
	"path/filepath"
)

// HFFile is one file of a tokenizer as Hugging Face's AutoTokenizer reads
// it from a model's folder: its name there and its bytes, unzipped.
type HFFile struct {
	Name string
	Data []byte
}

// HFFiles are the files Load(path, merges) read, under the names
// AutoTokenizer.from_pretrained looks for beside a model's weights:
// tokenizer.json, or GPT-2's pair as vocab.json and merges.txt (whatever
// they were called, encoder.json and vocab.bpe included), then the
// tokenizer_config.json and special_tokens_map.json found beside the main
// file, if any. Gzipped files are written unzipped, as Hugging Face reads
// none. Call it on arguments Load accepted.
func HFFiles(path, merges string) ([]HFFile, error) {
	main, mergesPath, err := resolve(path, merges)
	if err != nil {
		return nil, err
	}
	type source struct{ name, path string }
	sources := []source{{"tokenizer.json", main}}
	if mergesPath != "" {
		sources = []source{{"vocab.json", main}, {"merges.txt", mergesPath}}
	}
	for _, name := range []string{"tokenizer_config.json", "special_tokens_map.json"} {
		if p := findFile(filepath.Dir(main), name); p != "" {
			sources = append(sources, source{name, p})
		}
	}
	files := make([]HFFile, 0, len(sources))
	for _, s := range sources {
		data, err := readFile(s.path)
		if err != nil {
			return nil, err
		}
		files = append(files, HFFile{s.name, data})
	}
	return files, nil
}
