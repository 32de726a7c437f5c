package tokenizer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// benchWords and benchSyllables feed benchText. testdata/gen/bench.js holds
// the same lists and algorithm, so both sides measure the same text; the
// hash in TestBenchText ties them together.
var benchWords = strings.Fields(`the of and to in a is that for it as was with be by on not he I this are or his
from at which but have an they you were her she there been one all we their has would when if so no will more
can had what out up about who them into do some than time only its other my like then could new also two may
first any these our over such after most made well where way many before must even because through much back
years down people should very work world each being still life great those both here between under long never
same another while last might us without again place against right think too old part three day get system
government little year number however around take end small own thing state large program general point come
high public used different form since house school give during until fact per often set find upon water
data model training tokens token text encoder decoder layer attention weights gradient loss batch sequence
device memory kernel compile graph tensor shape float matrix vector function return value error string index
Hello World OpenAI Llama Python Go Rust JavaScript GPU CPU API HTTP JSON UTF-8 ASCII Unicode
don't it's I'm we're they've you'll he'd isn't can't won't
café naïve résumé über straße año façade
中文 日本語 한국어 数据 模型 训练 Привет мир Ελληνικά العربية हिन्दी
😀 👍 🚀 ❤️ 👨‍👩‍👧
( ) [ ] { } -- ... ; : ! ? " ' & % $ # @ * + = / < > | ~ ^`)

var benchSyllables = strings.Fields(`ka lo mi ne ru ta ve xo zi pra stre ing tion ment able ous ize qua blo fen dor wix ul ar en om
ch sh th ph gr tr pl sk sm sn sp st`)

// benchCases are the text cases of testdata/cases.json, in file order.
func benchCases() []string {
	data, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		panic(err)
	}
	var cs []testCase
	if err := json.Unmarshal(data, &cs); err != nil {
		panic(err)
	}
	var out []string
	for _, c := range cs {
		if c.Text != nil {
			out = append(out, *c.Text)
		}
	}
	return out
}

var (
	benchOnce sync.Once
	benchData string
)

// benchText is a deterministic, realistic mix of about 1 MB: paragraphs of
// Zipf-like common words with numbers and made-up words (so the word cache
// also misses), and every sixth paragraph a corpus case (code, CJK, emoji,
// whitespace runs, special tokens).
func benchText() string {
	benchOnce.Do(func() {
		state := uint32(0x9E3779B9)
		r := func() uint32 {
			state ^= state << 13
			state ^= state >> 17
			state ^= state << 5
			return state
		}
		cases := benchCases()
		n := uint32(len(benchWords))
		var b strings.Builder
		for para := 0; b.Len() < 1<<20; para++ {
			if para%6 == 5 {
				b.WriteString(cases[(para/6)%len(cases)])
				b.WriteString("\n\n")
				continue
			}
			nsent := 3 + r()%5
			for s := uint32(0); s < nsent; s++ {
				nw := 6 + r()%14
				for w := uint32(0); w < nw; w++ {
					var word string
					switch x := r(); {
					case x%16 == 0:
						word = strconv.FormatUint(uint64(r()%100000), 10)
					case x%7 == 0:
						k := 1 + r()%4
						for i := uint32(0); i < k; i++ {
							word += benchSyllables[r()%uint32(len(benchSyllables))]
						}
					default:
						a := r() % n
						c := r() % n
						word = benchWords[a*c/n]
					}
					if w == 0 && word[0] >= 'a' && word[0] <= 'z' {
						word = string(word[0]-'a'+'A') + word[1:]
					}
					b.WriteString(word)
					if w < nw-1 {
						if r()%10 == 0 {
							b.WriteString(", ")
						} else {
							b.WriteString(" ")
						}
					}
				}
				if s < nsent-1 {
					b.WriteString(". ")
				} else {
					b.WriteString(".\n\n")
				}
			}
		}
		benchData = b.String()
	})
	return benchData
}

// benchTextSHA256 is the hash testdata/gen/bench.js prints for its copy of
// the text.
const benchTextSHA256 = "b21d8eea1b9ca15e9e2e218d7ccf380de5359b5f9971ac512d55fbf4d3159e9c"

func TestBenchText(t *testing.T) {
	text := benchText()
	sum := sha256.Sum256([]byte(text))
	assert.Equal(t, benchTextSHA256, hex.EncodeToString(sum[:]), "the bench text changed: update the hashes here from testdata/gen/bench.js's output")
	assert.GreaterOrEqual(t, len(text), 1<<20)
}

// benchIDsSHA256 are the SHA-256 of the reference implementations' ids (as
// little-endian int32) on the whole bench text, printed by
// testdata/gen/bench.js: an exact-id check on a megabyte of mixed text
// that commits nothing big.
var benchIDsSHA256 = map[string]string{
	"gpt2":   "d187df700662c68a879f5751f7e729c60e65e753ff99c526aada96bc9973e7e7",
	"llama3": "bae63fa83db95b40f251449d7a00cb0792116dcdc3c05eb7f98a090adc4a0a0c",
	"llama2": "80d639d36daa547cea37ac08827ee26139a51df15f1320ecd41c83e3997026bf",
	"qwen3":  "576c38b2891f9e6b55db901756285e0d16adad88f74255e8cb488208d4610c42",
	// HF tokenizers (Rust) on the Metaspace variants of testdata/metaspace.json.
	"metaspace_first":       "1b2b18846d3fdc4b71bd47dae500d5d224144133a3506ec7f161ff2f3c731ab7",
	"metaspace_legacy":      "b00a12de40c45829d236bbc8f073030a1f516b7c00198bac5f8d054a163c9a4c",
	"metaspace_first_split": "976a85ace7bcde5ba89df5c6def16c23015e8264240f2c8a1ab2866a892d39ac",
	"metaspace_never":       "5cd8065a2e249daf9027bb18356ee20c369d506e3e90702f326da5f34fd664b4",
}

// benchDocTokens are the reference implementations' token counts with the
// bench text encoded document by document (as BenchmarkEncodeAll cuts it),
// printed by testdata/gen/bench.js.
var benchDocTokens = map[string]int{"gpt2": 327037, "llama3": 286938, "llama2": 368434, "qwen3": 336041,
	"metaspace_first": 368353, "metaspace_legacy": 373625, "metaspace_first_split": 373607, "metaspace_never": 367878}

func TestBenchTextIDs(t *testing.T) {
	text := []byte(benchText())
	docs := benchDocs()
	for _, name := range fixtureNames {
		tok := loadFixture(t, name)
		n := 0
		for _, ids := range EncodeAll(tok, docs, 2) {
			n += len(ids)
		}
		assert.Equal(t, benchDocTokens[name], n, "%s: tokens of the documents", name)
		ids := tok.Encode(text)
		buf := make([]byte, 4*len(ids))
		for i, id := range ids {
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(id))
		}
		sum := sha256.Sum256(buf)
		assert.Equal(t, benchIDsSHA256[name], hex.EncodeToString(sum[:]), "%s: %d ids", name, len(ids))
	}
}

func BenchmarkEncode(b *testing.B) {
	text := []byte(benchText())
	for _, name := range fixtureNames {
		tok := loadFixture(b, name)
		b.Run(name, func(b *testing.B) {
			buf := make([]int32, 0, len(text))
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				buf = tok.AppendEncode(buf[:0], text)
			}
			b.ReportMetric(float64(len(text))/float64(len(buf)), "bytes/token")
		})
	}
}

// benchDocs cuts the bench text into documents after each "\n\n" (3687
// of them).
func benchDocs() [][]byte {
	var docs [][]byte
	for _, d := range strings.SplitAfter(benchText(), "\n\n") {
		if d != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// BenchmarkEncodeAll encodes the bench text's documents with 1 and 2
// workers.
func BenchmarkEncodeAll(b *testing.B) {
	docs := benchDocs()
	var total int64
	for _, d := range docs {
		total += int64(len(d))
	}
	for _, name := range fixtureNames {
		tok := loadFixture(b, name)
		for _, w := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/workers=%d", name, w), func(b *testing.B) {
				b.SetBytes(total)
				for b.Loop() {
					out := EncodeAll(tok, docs, w)
					require.Len(b, out, len(docs))
				}
			})
		}
	}
}
