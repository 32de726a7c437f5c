package prepare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data/indexed"
)

func TestRunInputs(t *testing.T) {
	enc := byteEncoder{}
	tests := []struct {
		name   string
		files  map[string]string
		inputs []string // relative to the folder; the folder itself if empty
		opt    Options
		want   [][]int32
		// counts
		docs, empty, skippedLines int64
		blank                     int64
		nFiles, skippedFiles      int
		skippedArchives           int
	}{
		{
			name:  "text file",
			files: map[string]string{"a.txt": "hello world\n"},
			want:  enc.want("hello world\n"), docs: 1, nFiles: 1,
		},
		{
			name:  "text file with a byte order mark, gzipped",
			files: map[string]string{"a.txt.gz": "\uFEFFhéllo"},
			want:  enc.want("héllo"), docs: 1, nFiles: 1,
		},
		{
			name: "folder in walk order",
			files: map[string]string{
				"b.txt":            "second",
				"a/z.txt":          "first",
				"c/d.jsonl":        "{\"text\": \"third\"}\n{\"text\": \"fourth\"}\n",
				"c/e.json.gz":      "{\"text\": \"fifth\"}",
				"c/f.txt.gz":       "sixth",
				".hidden/x.txt":    "never",
				"c/.dot.txt":       "never",
				"c/binary.dat":     "\x00\x01\x02",
				"c/g.md":           "seventh",
				"c/h/i/deep.jsonl": "{\"text\": \"eighth\"}",
				"c/testdata.tar":   "an archive among the sources, as Go's tree has",
				"c/logs.jsonl.zst": "x",
			},
			want: enc.want("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"),
			docs: 8, nFiles: 7, skippedFiles: 1, skippedArchives: 2,
		},
		{
			name:   "inputs in the order given",
			files:  map[string]string{"a.txt": "A", "b.txt": "B", "c/d.txt": "D"},
			inputs: []string{"b.txt", "c", "a.txt"},
			want:   enc.want("B", "D", "A"), docs: 3, nFiles: 3,
		},
		{
			name: "jsonl",
			files: map[string]string{"d.jsonl": "\uFEFF{\"text\": \"plain\"}\r\n" +
				"\n" + // blank lines are not documents
				"   \t\n" +
				"{\"id\": 7, \"meta\": {\"text\": \"nested, not this\"}, \"text\": \"esc\\n\\\"aped\\\" \\u00e9\\ud83d\\ude00\"}\n" +
				"{\"text\": \"first\", \"text\": \"last wins\"}\n" +
				"{\"te\\u0078t\": \"escaped key\"}\n" +
				"{\"text\": \"no newline at the end\"}"},
			want: enc.want("plain", "esc\n\"aped\" é😀", "last wins", "escaped key", "no newline at the end"),
			docs: 5, nFiles: 1, blank: 2,
		},
		{
			name:  "jsonl gzipped",
			files: map[string]string{"d.jsonl.gz": "{\"text\": \"one\"}\n{\"text\": \"two\"}\n"},
			want:  enc.want("one", "two"), docs: 2, nFiles: 1,
		},
		{
			name:  "another key",
			files: map[string]string{"d.jsonl": "{\"content\": \"one\", \"text\": 5}\n{\"content\": \"two\"}\n"},
			opt:   Options{JSONKey: "content"},
			want:  enc.want("one", "two"), docs: 2, nFiles: 1,
		},
		{
			name: "bad lines skipped and counted",
			files: map[string]string{"d.jsonl": "{\"text\": \"good\"}\n" +
				"not json\n" +
				"{\"body\": \"no text key\"}\n" +
				"{\"text\": 42}\n" +
				"{\"text\": null}\n" +
				"[\"an array\"]\n" +
				"{\"text\": \"also good\"}\n"},
			opt:  Options{SkipBadLines: true},
			want: enc.want("good", "also good"), docs: 2, skippedLines: 5, nFiles: 1,
		},
		{
			name:  "empty documents left out",
			files: map[string]string{"a.txt": "", "b.txt": "b", "c.jsonl": "{\"text\": \"\"}\n{\"text\": \"c\"}\n"},
			want:  enc.want("b", "c"), docs: 2, empty: 2, nFiles: 3,
		},
		{
			name:  "no end-of-document id",
			files: map[string]string{"a.txt": "abc"},
			opt:   Options{AppendEOS: false},
			want:  [][]int32{{'a', 'b', 'c'}}, docs: 1, nFiles: 1,
		},
		{
			// Id 7 begins each document, an empty one gets none.
			name:  "a beginning-of-document id",
			files: map[string]string{"a.txt": "ab", "b.txt": "", "c.txt": "c"},
			opt:   Options{PrependBOS: true, BOS: 7},
			want:  [][]int32{{7, 'a', 'b', 256}, {7, 'c', 256}}, docs: 2, empty: 1, nFiles: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "in")
			writeTree(t, in, tc.files)
			opt := tc.opt
			opt.AppendEOS = tc.name != "no end-of-document id"
			opt.OutputPrefix = filepath.Join(dir, "out")
			opt.Inputs = []string{in}
			if tc.inputs != nil {
				opt.Inputs = nil
				for _, p := range tc.inputs {
					opt.Inputs = append(opt.Inputs, filepath.Join(in, p))
				}
			}
			opt.Tokenizer, opt.TokenizerPath = "fp-123", "/tok.json"
			sum, err := Run(context.Background(), enc, opt)
			require.NoError(t, err)
			assert.Equal(t, tc.want, readDataset(t, opt.OutputPrefix))
			assert.Equal(t, tc.docs, sum.Documents)
			assert.Equal(t, tc.empty, sum.EmptyDocuments)
			assert.Equal(t, tc.skippedLines, sum.SkippedLines)
			assert.Equal(t, tc.blank, sum.BlankLines, "blank lines are counted; a file's last newline ends its last line")
			if tc.blank > 0 {
				assert.Contains(t, sum.String(), fmt.Sprintf(", %d blank JSON Lines lines)", tc.blank))
			}
			assert.Equal(t, tc.nFiles, sum.Files)
			assert.Equal(t, tc.skippedFiles, sum.SkippedFiles)
			assert.Equal(t, tc.skippedArchives, sum.SkippedArchives)
			var tokens int64
			maxTok := int32(-1)
			for _, d := range tc.want {
				tokens += int64(len(d))
				for _, v := range d {
					maxTok = max(maxTok, v)
				}
			}
			assert.Equal(t, tokens, sum.Tokens)
			assert.Equal(t, maxTok, sum.MaxToken)
			assert.Equal(t, indexed.Uint16, sum.DType)
			assert.Equal(t, 2*tokens, sum.BinBytes)
			st, err := os.Stat(opt.OutputPrefix + ".idx")
			require.NoError(t, err)
			assert.Equal(t, st.Size(), sum.IdxBytes)
			assert.Positive(t, sum.InputBytes)
			assert.Contains(t, sum.String(), "documents")

			m, ok, err := ReadMeta(opt.OutputPrefix)
			require.NoError(t, err)
			require.True(t, ok)
			wantEOS := int32(256)
			if !opt.AppendEOS {
				wantEOS = -1
			}
			var wantBOS *int32
			if opt.PrependBOS {
				wantBOS = &opt.BOS
			}
			assert.Equal(t, Meta{
				Format: metaFormat, Version: 1, Documents: tc.docs, Tokens: tokens, DType: indexed.Uint16,
				MaxToken: maxTok, VocabSize: 257, EOS: wantEOS, BOS: wantBOS, Tokenizer: "fp-123", TokenizerPath: "/tok.json",
				JSONKey:        map[bool]string{true: tc.opt.JSONKey, false: "text"}[tc.opt.JSONKey != ""],
				EmptyDocuments: tc.empty, SkippedLines: tc.skippedLines, BinBytes: sum.BinBytes, IdxBytes: sum.IdxBytes,
			}, m)
			assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json"}, outputs(t, dir, "out"))
		})
	}
}

// failingEncoder emits an id its vocabulary does not have.
type failingEncoder struct{ byteEncoder }

func (failingEncoder) AppendEncode(dst []int32, text []byte) []int32 {
	if strings.Contains(string(text), "BOOM") {
		return append(dst, 70000)
	}
	return append(dst, 1)
}
func (failingEncoder) VocabSize() int { return 1000 }

// panicEncoder fails on one document, as a buggy tokenizer would.
type panicEncoder struct{ byteEncoder }

func (panicEncoder) AppendEncode(dst []int32, text []byte) []int32 {
	if strings.Contains(string(text), "BOOM") {
		panic("index out of range in the merges")
	}
	return append(dst, 1)
}

func TestRunErrors(t *testing.T) {
	type setup struct{ dir, in string }
	tests := []struct {
		name     string
		files    map[string]string
		prepare  func(t *testing.T, s setup, opt *Options)
		enc      Encoder
		want     error
		contains []string
		lacks    []string
	}{
		{
			name:  "bad line",
			files: map[string]string{"d.jsonl": "{\"text\": \"good\"}\n{\"text\": \"good\"\n"},
			want:  ErrBadLine, contains: []string{"d.jsonl:2", "not valid JSON", `"{\"text\": \"good\""`, "--skip-bad-lines"},
		},
		{
			name:  "missing key",
			files: map[string]string{"d.jsonl": "\n{\"body\": \"x\"}\n"},
			want:  ErrBadLine, contains: []string{"d.jsonl:2", `no "text" key`},
		},
		{
			name:  "value not a string",
			files: map[string]string{"d.json": "{\"text\": [\"a\"]}\n"},
			want:  ErrBadLine, contains: []string{"d.json:1", `the "text" value is not a string`, "read as JSON Lines"},
		},
		{
			name:  "a config file in a folder of text",
			files: map[string]string{"a.txt": "some text", "package.json": "{\n  \"name\": \"x\"\n}\n"},
			want:  ErrBadLine, contains: []string{"package.json:1", "a folder's .json and .ndjson files are read as JSON Lines", "move package.json out of ", "or name the text files as INPUTs"},
		},
		{
			// A shard of JSON Lines in a folder is JSON Lines by name:
			// no hint to move it out.
			name:  "a folder's .jsonl with a bad line",
			files: map[string]string{"a.jsonl": "{\"text\": \"hello\"}\nnot json\n"},
			want:  ErrBadLine, contains: []string{"a.jsonl:2", "not valid JSON"}, lacks: []string{"move a.jsonl", "read as JSON Lines"},
		},
		{
			name:  "a .json named on its own",
			files: map[string]string{"d.json": "{\"text\": 3}\n"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.Inputs = []string{filepath.Join(s.in, "d.json")}
			},
			want: ErrBadLine, contains: []string{"d.json:1", "a .json input is read as JSON Lines, one object per line, as Megatron-LM reads it"},
		},
		{
			name:  "text not UTF-8",
			files: map[string]string{"d.jsonl": "{\"text\": \"fine\"}\n{\"text\": \"caf\xe9\"}\n"},
			want:  ErrBadLine, contains: []string{"d.jsonl:2", "not UTF-8", `caf\xe9`},
		},
		{
			name:  "not an object",
			files: map[string]string{"d.jsonl": "{\"text\": \"a\"}\n\"just a string\"\n"},
			want:  ErrBadLine, contains: []string{"d.jsonl:2", "not a JSON object"},
		},
		{
			name:  "missing input",
			files: map[string]string{"a.txt": "a"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.Inputs = append(opt.Inputs, filepath.Join(s.in, "nope.txt"))
			},
			want: ErrInput, contains: []string{"nope.txt", "no such file"},
		},
		{
			name:  "not gzip",
			files: map[string]string{"a.txt": "a", "b.jsonl.gz": "{\"text\": \"plain, not gzipped\"}"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				require.NoError(t, os.WriteFile(filepath.Join(s.in, "b.jsonl.gz"), []byte("{\"text\": \"x\"}"), 0o644))
			},
			want: ErrGzip, contains: []string{"b.jsonl.gz", "gzip -t"},
		},
		{
			name:  "truncated gzip",
			files: map[string]string{"a.txt": "a", "b.txt.gz": strings.Repeat("some text that compresses ", 2000)},
			prepare: func(t *testing.T, s setup, opt *Options) {
				p := filepath.Join(s.in, "b.txt.gz")
				b, err := os.ReadFile(p)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(p, b[:len(b)-12], 0o644))
			},
			want: ErrGzip, contains: []string{"b.txt.gz", "unexpected EOF"},
		},
		{
			name:  "binary file named",
			files: map[string]string{"a.bin": "\x7fELF\x00\x00"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.Inputs = []string{filepath.Join(s.in, "a.bin")}
			},
			want: ErrInput, contains: []string{"a.bin", "looks binary"},
		},
		{
			name:  "zstd",
			files: map[string]string{"a.jsonl.zst": "x"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.Inputs = []string{filepath.Join(s.in, "a.jsonl.zst")} // named on its own; a folder's is skipped
			},
			want: ErrInput, contains: []string{"a.jsonl.zst", ".zst files cannot be read", "zstd -d"},
		},
		{
			name:  "input is an output",
			files: map[string]string{"a.txt": "a"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.OutputPrefix = filepath.Join(s.in, "a")
				require.NoError(t, os.WriteFile(opt.OutputPrefix+".json", []byte("{\"text\": \"x\"}\n"), 0o644))
				opt.Inputs = []string{opt.OutputPrefix + ".json"}
			},
			want: ErrInput, contains: []string{"a.json", "one of the outputs"},
		},
		{
			name:  "output folder missing, checked before the inputs",
			files: map[string]string{},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.OutputPrefix = filepath.Join(s.dir, "missing", "out")
				opt.Inputs = []string{filepath.Join(s.in, "nope")}
			},
			want: os.ErrNotExist, contains: []string{"missing", "output folder"},
		},
		{
			name:  "output prefix ending in a separator",
			files: map[string]string{"a.txt": "a"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.OutputPrefix = filepath.Join(s.dir, "outdir") + string(filepath.Separator)
			},
			contains: []string{"outdir", "ends in a path separator"},
		},
		{
			name:  "no end-of-document id",
			files: map[string]string{"a.txt": "a"},
			enc:   byteEncoder{noEOS: true},
			want:  ErrNoEOS, contains: []string{"--no-eos"},
		},
		{
			name:  "token past uint16",
			files: map[string]string{"a.txt": "fine", "b.jsonl": "{\"text\": \"ok\"}\n{\"text\": \"BOOM\"}\n"},
			enc:   failingEncoder{},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.AppendEOS = false
			},
			want: indexed.ErrTokenRange, contains: []string{"b.jsonl:2", "70000", "uint16", "int32"},
		},
		{
			name:  "encoder panics",
			files: map[string]string{"a.jsonl": "{\"text\": \"fine\"}\n{\"text\": \"BOOM\"}\n"},
			enc:   panicEncoder{},
			want:  nil, contains: []string{"a.jsonl:2", "encoder panicked", "index out of range in the merges"},
		},
		{
			name:  "vocabulary past uint16",
			files: map[string]string{"a.txt": "a"},
			enc:   byteEncoder{vocab: 70000},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.DType = indexed.Uint16
			},
			want: indexed.ErrTokenRange, contains: []string{"70000 tokens", "uint16 holds ids up to 65535", "int32"},
		},
		{
			name:  "float dtype",
			files: map[string]string{"a.txt": "a"},
			prepare: func(t *testing.T, s setup, opt *Options) {
				opt.DType = indexed.Float32
			},
			want: indexed.ErrDType, contains: []string{"float32"},
		},
		{
			name:  "nothing but empty documents",
			files: map[string]string{"a.txt": "", "b.jsonl": "\n\n"},
			want:  ErrNoDocuments, contains: []string{"2 input files", "1 empty documents"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "in")
			require.NoError(t, os.Mkdir(in, 0o755))
			writeTree(t, in, tc.files)
			opt := Options{Inputs: []string{in}, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true}
			if tc.prepare != nil {
				tc.prepare(t, setup{dir, in}, &opt)
			}
			enc := tc.enc
			if enc == nil {
				enc = byteEncoder{}
			}
			_, err := Run(context.Background(), enc, opt)
			require.Error(t, err)
			t.Log(err)
			if tc.want != nil {
				assert.ErrorIs(t, err, tc.want)
			}
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
			for _, s := range tc.lacks {
				assert.NotContains(t, err.Error(), s)
			}
			assert.Empty(t, outputs(t, dir, "out"), "nothing under the output names")
			assert.Empty(t, outputs(t, in, "a.json.tmp"))
		})
	}
}

func TestRunUnreadableInput(t *testing.T) {
	if os.Getuid() == 0 {
		t.Skip("root reads any file, so an unreadable input cannot be made")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "secret.txt")
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o000))
	_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{p}, OutputPrefix: filepath.Join(dir, "out")})
	assert.ErrorIs(t, err, ErrInput)
	assert.Contains(t, err.Error(), "secret.txt")
	assert.Empty(t, outputs(t, dir, "out"))
}

// TestRunSameForAnyWorkers: the output does not depend on the number of
// goroutines.
func TestRunSameForAnyWorkers(t *testing.T) {
	dir := t.TempDir()
	inputs := corpus(t, filepath.Join(dir, "in"), 3<<20)
	var first map[string][]byte
	for _, workers := range []int{1, 4, 3} {
		prefix := filepath.Join(dir, "out"+string(rune('0'+workers)))
		sum, err := Run(context.Background(), byteEncoder{}, Options{Inputs: inputs, OutputPrefix: prefix, Workers: workers, AppendEOS: true})
		require.NoError(t, err)
		assert.Greater(t, sum.Documents, int64(1000))
		got := map[string][]byte{}
		for _, ext := range []string{".bin", ".idx", ".json"} {
			b, err := os.ReadFile(prefix + ext)
			require.NoError(t, err)
			got[ext] = b
		}
		if first == nil {
			first = got
			continue
		}
		for ext := range got {
			assert.True(t, string(first[ext]) == string(got[ext]), "%s differs with %d workers", ext, workers)
		}
	}
}

// TestRunMatchesSerialEncoding: the dataset is the encoder applied document
// by document, in reading order, each followed by the end-of-document id.
func TestRunMatchesSerialEncoding(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.jsonl":     "{\"text\": \"alpha\"}\n{\"text\": \"beta\"}\n",
		"b/c.txt":     "gamma",
		"b/d.json.gz": "{\"text\": \"delta\"}\n{\"text\": \"epsilon\"}\n",
	}
	writeTree(t, filepath.Join(dir, "in"), files)
	enc := byteEncoder{shift: 1000}
	prefix := filepath.Join(dir, "out")
	sum, err := Run(context.Background(), enc, Options{Inputs: []string{filepath.Join(dir, "in")}, OutputPrefix: prefix, AppendEOS: true, Workers: 2})
	require.NoError(t, err)
	assert.Equal(t, enc.want("alpha", "beta", "gamma", "delta", "epsilon"), readDataset(t, prefix))
	assert.Equal(t, int32(1256), sum.MaxToken)
}

// TestRunCancelled cancels the run's context from inside the encoder, as an
// interrupt would arrive mid-run.
func TestRunCancelled(t *testing.T) {
	dir := t.TempDir()
	inputs := corpus(t, filepath.Join(dir, "in"), 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	enc := byteEncoder{called: func() {
		if calls.Add(1) == 10 {
			cancel()
		}
	}}
	before := runtime.NumGoroutine()
	_, err := Run(ctx, enc, Options{Inputs: inputs, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true, Workers: 2})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, outputs(t, dir, "out"))
	// Polled here rather than with assert.Eventually, whose own goroutines
	// would count.
	for deadline := time.Now().Add(2 * time.Second); runtime.NumGoroutine() > before && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "Run's goroutines end with it")

	// Cancelled before it starts.
	_, err = Run(ctx, byteEncoder{}, Options{Inputs: inputs, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, outputs(t, dir, "out"))
}

// TestRunOutputInsideInput: the outputs, and their temporary files, are
// never read as inputs, on the first run or when they already exist.
func TestRunOutputInsideInput(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.txt": "alpha", "sub/b.jsonl": "{\"text\": \"beta\"}\n"})
	prefix := filepath.Join(dir, "out")
	require.NoError(t, os.WriteFile(prefix+".json", []byte("{\"text\": \"an old sidecar\"}\n"), 0o644))
	for range 2 {
		sum, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{dir}, OutputPrefix: prefix, AppendEOS: true})
		require.NoError(t, err)
		assert.Equal(t, 2, sum.Files)
		assert.Equal(t, byteEncoder{}.want("alpha", "beta"), readDataset(t, prefix))
	}
}

func TestRunReplacesDataset(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.txt": "first run", "b.txt": "second"})
	prefix := filepath.Join(dir, "out")
	_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "a.txt")}, OutputPrefix: prefix, AppendEOS: true, Tokenizer: "one"})
	require.NoError(t, err)
	_, err = Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "b.txt")}, OutputPrefix: prefix, AppendEOS: true, Tokenizer: "two"})
	require.NoError(t, err)
	assert.Equal(t, byteEncoder{}.want("second"), readDataset(t, prefix))
	m, ok, err := ReadMeta(prefix)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "two", m.Tokenizer)
	assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json"}, outputs(t, dir, "out"))
}

func TestProgress(t *testing.T) {
	dir := t.TempDir()
	inputs := corpus(t, filepath.Join(dir, "in"), 1<<20)
	var mu sync.Mutex
	var calls []Progress
	sum, err := Run(context.Background(), byteEncoder{}, Options{Inputs: inputs, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true,
		Progress: func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, p)
		}})
	require.NoError(t, err)
	require.NotEmpty(t, calls)
	last := calls[len(calls)-1]
	assert.Equal(t, sum.InputBytes, last.TotalBytes, "everything on disk was read")
	assert.Equal(t, last.TotalBytes, last.BytesRead)
	assert.Equal(t, sum.Documents, last.Documents)
	assert.Equal(t, sum.Tokens, last.Tokens)
	assert.Equal(t, time.Duration(0), last.ETA)
	assert.Contains(t, last.String(), "(100%)")
	assert.Contains(t, Progress{TotalBytes: 10, ETA: -1}.String(), "ETA ?")
}

// TestMemoryStaysBounded: the heap stays far below the corpus size.
func TestMemoryStaysBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("reads a 48 MB corpus")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "big.jsonl")
	f, err := os.Create(p)
	require.NoError(t, err)
	line := []byte("{\"text\": \"" + strings.Repeat("lorem ipsum dolor sit amet ", 150) + "\"}\n")
	for range (48 << 20) / len(line) {
		_, err := f.Write(line)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	sum, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{p}, OutputPrefix: filepath.Join(dir, "out"), AppendEOS: true, Workers: 2})
	close(stop)
	wg.Wait()
	require.NoError(t, err)
	assert.Greater(t, sum.TextBytes, int64(48<<20)-int64(len(line)))
	t.Logf("heap in use peaked at %.1f MB", float64(peak.Load())/1e6)
	assert.Less(t, peak.Load(), uint64(40<<20), "heap in use peaked at %d bytes for %d bytes of text (%d bytes of tokens)", peak.Load(), sum.TextBytes, 4*sum.Tokens)
}

// PREFIX.jsonl beside the outputs is an input, not an output.
func TestInputNamedLikeThePrefixIsRead(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "data.jsonl")
	require.NoError(t, os.WriteFile(in, []byte("{\"text\": \"hello\"}\n"), 0o644))
	sum, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{in}, OutputPrefix: filepath.Join(dir, "data"), AppendEOS: true})
	require.NoError(t, err)
	assert.EqualValues(t, 1, sum.Documents)
}

// The temporary files a killed run left beside the prefix are removed by
// the next run of that prefix, which says how much it freed; nothing else
// removed them. Files of other prefixes, and names that only look alike,
// stay.
func TestRunRemovesAKilledRunsTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"in/a.txt":          "text",
		"out.bin.tmp-123":   strings.Repeat("b", 1000),
		"out.idx.tmp-4567":  strings.Repeat("i", 10),
		"out.json.tmp-89":   "{",
		"out.bin.tmp-notes": "someone's",
		"out.bin.tmp-":      "someone's",
		"other.bin.tmp-123": "another prefix's",
		"out.bin.bin.tmp-1": "the prefix out.bin's",
		"out.jsonl":         "{\"text\": \"an input\"}\n",
	})
	prefix := filepath.Join(dir, "out")
	sum, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "in")}, OutputPrefix: prefix, AppendEOS: true})
	require.NoError(t, err)
	assert.Equal(t, 3, sum.StaleFiles)
	assert.Equal(t, int64(1011), sum.StaleBytes)
	assert.Contains(t, sum.String(), "; removed 3 temporary files (1.0 kB) that an earlier prepare of "+prefix+" left when it was killed")
	assert.ElementsMatch(t, []string{"out.bin", "out.idx", "out.json", "out.bin.tmp-notes", "out.bin.tmp-", "out.bin.bin.tmp-1", "out.jsonl"}, outputs(t, dir, "out"))
	assert.Equal(t, []string{"other.bin.tmp-123"}, outputs(t, dir, "other"))

	sum, err = Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "in")}, OutputPrefix: prefix, AppendEOS: true})
	require.NoError(t, err)
	assert.Zero(t, sum.StaleFiles)
	assert.NotContains(t, sum.String(), "temporary files")
}
