package prepare

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"gcompile/data/indexed"
)

// byteEncoder is a byte-level tokenizer: byte b is id b+shift, and the
// end-of-document id is 256+shift. It stands in for data/tokenizer.
type byteEncoder struct {
	shift  int32
	vocab  int // 0: 257+shift
	noEOS  bool
	called func() // if set, called at every AppendEncode
}

func (e byteEncoder) AppendEncode(dst []int32, text []byte) []int32 {
	if e.called != nil {
		e.called()
	}
	for _, c := range text {
		dst = append(dst, int32(c)+e.shift)
	}
	return dst
}

func (e byteEncoder) VocabSize() int {
	if e.vocab > 0 {
		return e.vocab
	}
	return 257 + int(e.shift)
}

func (e byteEncoder) EOS() (int32, bool) { return 256 + e.shift, !e.noEOS }

// want is what the encoder makes of texts, each followed by the
// end-of-document id, empty texts left out.
func (e byteEncoder) want(texts ...string) [][]int32 {
	var out [][]int32
	for _, t := range texts {
		if t == "" {
			continue
		}
		doc := e.AppendEncode(nil, []byte(t))
		out = append(out, append(doc, 256+e.shift))
	}
	return out
}

// writeTree creates files (relative path -> contents) under root; a name
// ending in .gz is gzipped.
func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		data := []byte(content)
		if strings.HasSuffix(rel, ".gz") {
			data = gzipped(t, content)
		}
		require.NoError(t, os.WriteFile(p, data, 0o644))
	}
}

func gzipped(t testing.TB, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// readDataset reads every sequence of the dataset at prefix.
func readDataset(t testing.TB, prefix string) [][]int32 {
	t.Helper()
	d, err := indexed.Open(prefix)
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, d.NumSequences(), d.NumDocuments(), "one sequence per document")
	var out [][]int32
	for i := range d.NumSequences() {
		s := make([]int32, d.SequenceLen(i))
		require.NoError(t, d.Read(i, 0, s))
		out = append(out, s)
	}
	return out
}

// outputs lists the names in dir that start with base: the outputs and
// any temporary file left behind.
func outputs(t testing.TB, dir, base string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), base) {
			names = append(names, e.Name())
		}
	}
	return names
}

var words = strings.Fields("the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their has would when if so no will can more other time some what only into them")

// corpus writes a generated corpus of about size bytes under dir: several
// JSON Lines files (one gzipped) and a folder of text files, and returns
// the inputs.
func corpus(t testing.TB, dir string, size int) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	doc := func() string {
		var sb strings.Builder
		n := 20 + rng.IntN(800)
		for i := range n {
			if i > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[rng.IntN(len(words))])
		}
		if rng.IntN(10) == 0 {
			sb.WriteString(" \"quoted\" é\n\ttab")
		}
		return sb.String()
	}
	files := map[string]string{}
	per := size / 4
	for f := range 3 {
		var sb strings.Builder
		for sb.Len() < per {
			fmt.Fprintf(&sb, "{\"id\": %d, \"text\": %s}\n", sb.Len(), quote(doc()))
		}
		name := fmt.Sprintf("shard%d.jsonl", f)
		if f == 1 {
			name += ".gz"
		}
		files[name] = sb.String()
	}
	total := 0
	for i := 0; total < per; i++ {
		d := doc()
		total += len(d)
		files[fmt.Sprintf("texts/%02d/doc%04d.txt", i%7, i)] = d
	}
	writeTree(t, dir, files)
	return []string{filepath.Join(dir, "shard0.jsonl"), filepath.Join(dir, "texts"), filepath.Join(dir, "shard1.jsonl.gz"), filepath.Join(dir, "shard2.jsonl")}
}
