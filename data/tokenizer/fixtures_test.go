package tokenizer

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The reference tokenizers of testdata/, each loaded once per test binary:
// Llama 3's and Qwen 3's tokenizer.json are 9 and 11 MB.
var fixtureNames = []string{"gpt2", "llama3", "llama2", "qwen3"}

type fixture struct {
	once sync.Once
	tok  *Tokenizer
	err  error
}

var fixtures = map[string]*fixture{"gpt2": {}, "llama3": {}, "llama2": {}, "qwen3": {}}

func loadFixture(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	f := fixtures[name]
	require.NotNil(tb, f, "unknown fixture %s", name)
	f.once.Do(func() { f.tok, f.err = Load(filepath.Join("testdata", name), "") })
	require.NoError(tb, f.err)
	return f.tok
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
