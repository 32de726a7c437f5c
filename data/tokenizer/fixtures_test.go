package tokenizer

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The reference tokenizers of testdata/, each loaded once per test binary:
// Llama 3's and Qwen 3's tokenizer.json are 9 and 11 MB. The metaspace_*
// ones are the variants of testdata/metaspace.json: llama2's file with a
// Metaspace pre-tokenizer.
var fixtureNames = []string{"gpt2", "llama3", "llama2", "qwen3",
	"metaspace_first", "metaspace_legacy", "metaspace_first_split", "metaspace_never"}

type fixture struct {
	once sync.Once
	tok  *Tokenizer
	err  error
}

var fixtures = map[string]*fixture{}

func init() {
	for _, n := range fixtureNames {
		fixtures[n] = &fixture{}
	}
}

func loadFixture(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	f := fixtures[name]
	require.NotNil(tb, f, "unknown fixture %s", name)
	f.once.Do(func() {
		if strings.HasPrefix(name, "metaspace_") {
			f.tok, f.err = loadVariant(name)
			return
		}
		f.tok, f.err = Load(filepath.Join("testdata", name), "")
	})
	require.NoError(tb, f.err)
	return f.tok
}

// metaspaceFile is testdata/metaspace.json.
type metaspaceFile struct {
	Base     string                                `json:"base"`
	Variants map[string]map[string]json.RawMessage `json:"variants"`
}

// variantJSON returns the top-level members of a variant's tokenizer.json
// (the base file's, with the variant's replaced, as testdata/gen/metaspace.js
// builds it) and the base folder.
func variantJSON(name string) (map[string]json.RawMessage, string, error) {
	data, err := os.ReadFile("testdata/metaspace.json")
	if err != nil {
		return nil, "", err
	}
	var mf metaspaceFile
	if err := json.Unmarshal(data, &mf); err != nil {
		return nil, "", err
	}
	v, ok := mf.Variants[name]
	if !ok {
		return nil, "", fmt.Errorf("no variant %s in testdata/metaspace.json", name)
	}
	dir := filepath.Join("testdata", mf.Base)
	path := findFile(dir, "tokenizer.json")
	raw, err := readFile(path)
	if err != nil {
		return nil, "", err
	}
	top, err := topLevel(path, raw)
	if err != nil {
		return nil, "", err
	}
	for k, val := range v {
		if k != "about" {
			top[k] = val
		}
	}
	return top, dir, nil
}

// loadVariant builds a variant as Load would its file (with the base's
// tokenizer_config.json), without writing it out.
func loadVariant(name string) (*Tokenizer, error) {
	top, dir, err := variantJSON(name)
	if err != nil {
		return nil, err
	}
	sp, err := parseTokenizerJSON(findFile(dir, "tokenizer.json"), top)
	if err != nil {
		return nil, err
	}
	if err := readConfig(sp, dir); err != nil {
		return nil, err
	}
	return build(sp)
}

// testCase is an entry of testdata/cases.json: text, or hex for bytes that
// are not valid UTF-8.
type testCase struct {
	Name string  `json:"name"`
	Text *string `json:"text"`
	Hex  *string `json:"hex"`
}

// raw is the case's bytes as the Go side encodes them.
func (c testCase) raw(tb testing.TB) []byte {
	if c.Hex != nil {
		b, err := hex.DecodeString(*c.Hex)
		require.NoError(tb, err)
		return b
	}
	return []byte(*c.Text)
}

// expectation is what testdata/gen/gen.js recorded for one case.
type expectation struct {
	Lossy     *string             `json:"lossy"`
	IDs       map[string][]int32  `json:"ids"`
	Decoded   map[string]string   `json:"decoded"`
	Pretokens map[string][]string `json:"pretokens"`
}

type expectedFile struct {
	Generator map[string]string      `json:"generator"`
	Cases     map[string]expectation `json:"cases"`
}

var (
	casesOnce sync.Once
	casesList []testCase
	expected  expectedFile
	casesErr  error
)

func loadCases(tb testing.TB) ([]testCase, expectedFile) {
	tb.Helper()
	casesOnce.Do(func() {
		data, err := os.ReadFile("testdata/cases.json")
		if err != nil {
			casesErr = err
			return
		}
		if casesErr = json.Unmarshal(data, &casesList); casesErr != nil {
			return
		}
		data, err = os.ReadFile("testdata/expected.json")
		if err != nil {
			casesErr = err
			return
		}
		casesErr = json.Unmarshal(data, &expected)
	})
	require.NoError(tb, casesErr)
	return casesList, expected
}

// refText is the text the reference encoded: the case itself, or its lossy
// decoding when it is not valid UTF-8.
func refText(c testCase, e expectation) []byte {
	if e.Lossy != nil {
		return []byte(*e.Lossy)
	}
	return []byte(*c.Text)
}
