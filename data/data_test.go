package data

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTree creates files (relative path -> content) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, filepath.FromSlash(rel))
		mustNoErr(t, os.MkdirAll(filepath.Dir(p), 0o755))
		mustNoErr(t, os.WriteFile(p, []byte(content), 0o644))
	}
}

// markedFiles returns n files whose contents start with a unique marker, so
// tests can tell which split a file landed in.
func markedFiles(prefix string, n, lines int) map[string]string {
	files := make(map[string]string, n)
	for i := range n {
		rel := fmt.Sprintf("%s/file%02d.txt", prefix, i)
		files[rel] = marker(rel) + strings.Repeat(fmt.Sprintf("line %d of %s\n", i, rel), lines)
	}
	return files
}

func marker(rel string) string { return "<<" + rel + ">>\n" }

// splitOf reports, sorted, which of the given files are in Eval and which
// in Train.
func splitOf(c *Corpus, files map[string]string) (eval, train []string) {
	for rel := range files {
		switch {
		case bytes.Contains(c.Eval, []byte(marker(rel))):
			eval = append(eval, rel)
		case bytes.Contains(c.Train, []byte(marker(rel))):
			train = append(train, rel)
		}
	}
	slices.Sort(eval)
	slices.Sort(train)
	return eval, train
}

func TestSplitIsStable(t *testing.T) {
	const frac = 0.3
	root := t.TempDir()
	base := markedFiles("pkg", 30, 5)
	writeTree(t, root, base)

	first, err := Load(Options{Path: root, EvalFraction: frac})
	mustNoErr(t, err)
	wantEval, wantTrain := splitOf(first, base)
	if len(wantEval) == 0 || len(wantTrain) == 0 {
		t.Fatalf("30 files at 30%% should fill both splits; got %d eval, %d train", len(wantEval), len(wantTrain))
	}
	expectEqual(t, len(base), len(wantEval)+len(wantTrain), "files found in exactly one split")
	expectEqual(t, len(wantEval), first.EvalFiles, "EvalFiles")
	expectEqual(t, len(wantTrain), first.TrainFiles, "TrainFiles")
	for _, rel := range wantEval {
		expect(t, isEvalFile(rel, frac), "%s is in eval but its hash says train", rel)
	}

	tests := []struct {
		name   string
		mutate func(t *testing.T)
	}{
		{"reload unchanged", func(*testing.T) {}},
		{"files added in another folder", func(t *testing.T) {
			writeTree(t, root, markedFiles("other", 25, 5))
		}},
		{"files added beside the originals", func(t *testing.T) {
			writeTree(t, root, markedFiles("pkg/sub", 10, 5))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.mutate(t)
			c, err := Load(Options{Path: root, EvalFraction: frac})
			mustNoErr(t, err)
			gotEval, gotTrain := splitOf(c, base)
			expectEqual(t, wantEval, gotEval, "eval files")
			expectEqual(t, wantTrain, gotTrain, "train files")
		})
	}

	// The split takes no seed at all; drawing training batches with other
	// seeds must leave the evaluation data untouched.
	c, err := Load(Options{Path: root, EvalFraction: frac})
	mustNoErr(t, err)
	evalBefore := bytes.Clone(c.Eval)
	e1, _ := c.EvalBatch(0, 4, 16)
	c.TrainBatch(1, 0, 4, 16)
	c.TrainBatch(99, 7, 4, 16)
	e2, _ := c.EvalBatch(0, 4, 16)
	expect(t, bytes.Equal(evalBefore, c.Eval), "Eval changed after training batches")
	expectEqual(t, e1, e2, "EvalBatch(0) across seeds")
}

func TestFolderFiltering(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"keep/a.txt":       marker("keep/a.txt") + "plain text\n",
		"keep/b.go":        marker("keep/b.go") + "package b\n",
		".git/config":      marker(".git/config") + "[core]\n",
		"keep/.hidden.txt": marker("keep/.hidden.txt") + "hidden\n",
		"keep/binary.bin":  marker("keep/binary.bin") + "abc\x00def",
	})
	c, err := Load(Options{Path: root, EvalFraction: 0.5})
	mustNoErr(t, err)
	all := append(bytes.Clone(c.Train), c.Eval...)
	tests := []struct {
		rel  string
		want bool
	}{
		{"keep/a.txt", true},
		{"keep/b.go", true},
		{".git/config", false},
		{"keep/.hidden.txt", false},
		{"keep/binary.bin", false},
	}
	for _, tt := range tests {
		expect(t, bytes.Contains(all, []byte(marker(tt.rel))) == tt.want, "%s: included = %v, want %v", tt.rel, !tt.want, tt.want)
	}
	expectEqual(t, 2, c.TrainFiles+c.EvalFiles, "files used")
	expect(t, strings.HasPrefix(c.Source, root) && strings.Contains(c.Source, "2 files"), "Source %q", c.Source)
}

// A --data that is a link to a folder reads the folder's files, split as
// the folder itself would be; WalkDir does not follow a root's link, and
// it used to find no text file.
func TestFolderThroughALink(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "real")
	writeTree(t, root, map[string]string{
		"a.txt":     marker("a.txt") + "plain text\n",
		"sub/b.txt": marker("sub/b.txt") + "more text\n",
	})
	link := filepath.Join(dir, "link")
	mustNoErr(t, os.Symlink(root, link))
	direct, err := Load(Options{Path: root, EvalFraction: 0.5})
	mustNoErr(t, err)
	linked, err := Load(Options{Path: link, EvalFraction: 0.5})
	mustNoErr(t, err)
	expectEqual(t, 2, linked.TrainFiles+linked.EvalFiles, "files used")
	expect(t, bytes.Equal(direct.Train, linked.Train) && bytes.Equal(direct.Eval, linked.Eval), "the same split through the link")
}

func TestMaxBytes(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, markedFiles("big", 60, 40)) // 60 files of about 1 KiB
	tests := []struct {
		name     string
		maxBytes int64
		frac     float64
	}{
		{"tiny cap truncates a file", 100, 0.2},
		{"a few files", 5000, 0.2},
		{"default fraction", 20000, 0},
		{"cap above corpus size", 1 << 30, 0.2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(Options{Path: root, MaxBytes: tt.maxBytes, EvalFraction: tt.frac})
			mustNoErr(t, err)
			total := int64(len(c.Train) + len(c.Eval))
			expect(t, total <= tt.maxBytes, "read %d bytes, cap is %d", total, tt.maxBytes)
			frac := tt.frac
			if frac == 0 {
				frac = DefaultEvalFraction
			}
			if total == tt.maxBytes {
				// When the cap binds, each split gets its share.
				want := int(frac*float64(tt.maxBytes) + 0.5)
				expectEqual(t, want, len(c.Eval), "eval bytes under the cap")
			}
		})
	}
}

func TestSingleFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corpus.txt")
	content := make([]byte, 1000)
	for i := range content {
		content[i] = byte('a' + i%26)
	}
	mustNoErr(t, os.WriteFile(path, content, 0o644))

	tests := []struct {
		name      string
		opts      Options
		wantTrain []byte
		wantEval  []byte
	}{
		{"last tenth held out", Options{Path: path, EvalFraction: 0.1}, content[:900], content[900:]},
		{"default fraction", Options{Path: path}, content[:950], content[950:]},
		{"MaxBytes reads a prefix", Options{Path: path, EvalFraction: 0.1, MaxBytes: 500}, content[:450], content[450:500]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.opts)
			mustNoErr(t, err)
			expect(t, bytes.Equal(tt.wantTrain, c.Train), "Train is %d bytes, want the first %d", len(c.Train), len(tt.wantTrain))
			expect(t, bytes.Equal(tt.wantEval, c.Eval), "Eval is %d bytes, want the %d after Train", len(c.Eval), len(tt.wantEval))
			expectEqual(t, 1, c.TrainFiles, "TrainFiles")
			expectEqual(t, 1, c.EvalFiles, "EvalFiles")
			expect(t, strings.Contains(c.Source, path), "Source %q does not name %s", c.Source, path)
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "does-not-exist")
	empty := filepath.Join(dir, "empty")
	mustNoErr(t, os.Mkdir(empty, 0o755))
	binOnly := filepath.Join(dir, "binonly")
	writeTree(t, binOnly, map[string]string{"x.bin": "\x00\x01\x02"})
	emptyFile := filepath.Join(dir, "empty.txt")
	mustNoErr(t, os.WriteFile(emptyFile, nil, 0o644))
	binFile := filepath.Join(dir, "model.bin")
	mustNoErr(t, os.WriteFile(binFile, []byte("ELF\x02\x01\x00text after"), 0o644))
	linksOnly := filepath.Join(dir, "links")
	mustNoErr(t, os.Mkdir(linksOnly, 0o755))
	mustNoErr(t, os.Symlink(emptyFile, filepath.Join(linksOnly, "a.txt")))
	lateNUL := filepath.Join(dir, "late-nul.bin")
	mustNoErr(t, os.WriteFile(lateNUL, append(bytes.Repeat([]byte("a"), binarySniffLen-1), 0), 0o644))

	tests := []struct {
		name    string
		opts    Options
		wantIs  error
		wantMsg string
	}{
		{"missing path", Options{Path: missing}, fs.ErrNotExist, missing},
		{"empty folder", Options{Path: empty}, ErrNoFiles, empty},
		{"only binary files", Options{Path: binOnly}, ErrNoFiles, binOnly},
		{"only links", Options{Path: linksOnly}, ErrNoFiles, "(its symbolic link is not followed"},
		{"empty file", Options{Path: emptyFile}, ErrNoFiles, emptyFile},
		{"binary file", Options{Path: binFile}, ErrBinary, binFile + " looks binary (a NUL byte at offset 5"},
		{"NUL at the end of the sniffed prefix", Options{Path: lateNUL}, ErrBinary, "offset 8191"},
		{"negative MaxBytes", Options{Path: dir, MaxBytes: -1}, nil, "MaxBytes"},
		{"EvalFraction of 1", Options{Path: dir, EvalFraction: 1}, nil, "EvalFraction"},
		{"negative EvalFraction", Options{Path: dir, EvalFraction: -0.1}, nil, "EvalFraction"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.opts)
			expectErr(t, err, tt.wantIs, tt.wantMsg)
			expect(t, c == nil, "got a corpus along with the error")
		})
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		corpus  *Corpus
		seq     int
		wantIs  error
		wantErr string
	}{
		{"ok", &Corpus{Train: make([]byte, 10), Eval: make([]byte, 10)}, 8, nil, ""},
		{"train only one window", &Corpus{Train: make([]byte, 9), Eval: make([]byte, 10)}, 8, ErrTooSmall, "training split has 9 bytes"},
		{"eval too small", &Corpus{Train: make([]byte, 100), Eval: make([]byte, 3)}, 8, ErrTooSmall, "evaluation split has 3 bytes"},
		{"zero seq", &Corpus{Train: make([]byte, 100), Eval: make([]byte, 100)}, 0, nil, "sequence length 0"},
		{"nil corpus", nil, 8, nil, "nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.corpus.Check(tt.seq)
			if tt.wantErr == "" {
				mustNoErr(t, err)
				return
			}
			expectErr(t, err, tt.wantIs, tt.wantErr)
		})
	}
}

// A NUL past the sniffed prefix is text's business (a folder's files are
// judged the same way), and MaxBytes short of the NUL never sees it.
func TestSingleFileSniffsOnlyThePrefix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corpus.txt")
	content := append(bytes.Repeat([]byte("abc\n"), binarySniffLen), 0)
	mustNoErr(t, os.WriteFile(path, content, 0o644))
	c, err := Load(Options{Path: path})
	mustNoErr(t, err)
	expectEqual(t, len(content), len(c.Train)+len(c.Eval), "bytes read")
}

func TestCheckVocab(t *testing.T) {
	text := &Corpus{Source: "t.txt", Train: []byte("plain ascii"), Eval: []byte("caf\xc3\xa9")}
	tests := []struct {
		name    string
		corpus  *Corpus
		vocab   int
		wantErr []string
	}{
		{"bytes", text, 256, nil},
		{"a larger vocab", text, 50257, nil},
		{"ascii fits 128 in training", &Corpus{Train: []byte("abc"), Eval: []byte("def")}, 128, nil},
		{"utf-8 in the held-out split", text, 128, []string{"t.txt", "evaluation split has byte 195 at offset 3", "vocab 128", "0..127"}},
		{"training split first", text, 100, []string{"training split has byte 112 at offset 0", "vocab 100"}},
		{"nil corpus", nil, 128, []string{"nil"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.corpus.CheckVocab(tt.vocab)
			if tt.wantErr == nil {
				mustNoErr(t, err)
				return
			}
			var target error
			if tt.corpus != nil {
				target = ErrVocab
			}
			expectErr(t, err, target, tt.wantErr...)
		})
	}
}

// testCorpus builds a corpus of pseudo-random printable bytes, so distinct
// windows are distinguishable.
func testCorpus() *Corpus {
	mk := func(n int, mul uint32) []byte {
		b := make([]byte, n)
		x := uint32(12345)
		for i := range b {
			x = x*mul + 1013904223
			b[i] = byte(32 + (x>>24)%95)
		}
		return b
	}
	return &Corpus{Source: "test", Train: mk(5000, 1664525), Eval: mk(800, 22695477)}
}

// checkWindows checks the shape of a batch, that targets are inputs shifted
// by one, and that each row is a real window of text.
func checkWindows(t *testing.T, text []byte, inputs, targets []int32, batch, seq int) {
	t.Helper()
	if len(inputs) != batch*seq || len(targets) != batch*seq {
		t.Fatalf("got %d inputs and %d targets, want %d each", len(inputs), len(targets), batch*seq)
	}
	for r := range batch {
		in := inputs[r*seq : (r+1)*seq]
		tg := targets[r*seq : (r+1)*seq]
		expect(t, slices.Equal(in[1:], tg[:seq-1]), "row %d: targets are not inputs shifted by one", r)
		window := make([]byte, 0, seq+1)
		for _, v := range in {
			expect(t, v >= 0 && v < 256, "row %d: token %d out of byte range", r, v)
			window = append(window, byte(v))
		}
		window = append(window, byte(tg[seq-1]))
		expect(t, bytes.Contains(text, window), "row %d is not a window of the text", r)
	}
}

func TestTrainBatch(t *testing.T) {
	c := testCorpus()
	const batch, seq = 8, 32
	base, baseT := c.TrainBatch(42, 3, batch, seq)
	checkWindows(t, c.Train, base, baseT, batch, seq)

	tests := []struct {
		name string
		seed int64
		step int
		same bool
	}{
		{"same seed and step", 42, 3, true},
		{"next step", 42, 4, false},
		{"previous step", 42, 2, false},
		{"other seed", 43, 3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, tg := c.TrainBatch(tt.seed, tt.step, batch, seq)
			checkWindows(t, c.Train, in, tg, batch, seq)
			expectEqual(t, tt.same, slices.Equal(base, in), "inputs equal to those of (42, 3)")
			if tt.same {
				expectEqual(t, baseT, tg, "targets")
			}
		})
	}
}

func TestEvalBatch(t *testing.T) {
	c := testCorpus()
	const batch, seq = 4, 16
	seen := map[string]bool{}
	for index := range 5 {
		in, tg := c.EvalBatch(index, batch, seq)
		checkWindows(t, c.Eval, in, tg, batch, seq)
		again, againT := c.EvalBatch(index, batch, seq)
		expectEqual(t, in, again, fmt.Sprintf("EvalBatch(%d) inputs on a second call", index))
		expectEqual(t, tg, againT, fmt.Sprintf("EvalBatch(%d) targets on a second call", index))
		for r := range batch {
			key := fmt.Sprint(in[r*seq : (r+1)*seq])
			expect(t, !seen[key], "batch %d row %d repeats an earlier window", index, r)
			seen[key] = true
		}
	}
}

func TestBatchBadInput(t *testing.T) {
	c := testCorpus()
	small := &Corpus{Train: []byte("abc"), Eval: []byte("abc")}
	tests := []struct {
		name  string
		c     *Corpus
		index int
		batch int
		seq   int
	}{
		{"zero batch", c, 0, 0, 8},
		{"zero seq", c, 0, 4, 0},
		{"negative batch", c, 0, -1, 8},
		{"negative eval index", c, -1, 2, 8},
		{"corpus too small", small, 0, 1, 8},
		{"size overflows int", c, 0, 1 << 62, 1 << 10},
		{"nil corpus", nil, 0, 1, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.index >= 0 {
				in, tg := tt.c.TrainBatch(1, 0, tt.batch, tt.seq)
				expect(t, in == nil && tg == nil, "TrainBatch returned data")
			}
			in, tg := tt.c.EvalBatch(tt.index, tt.batch, tt.seq)
			expect(t, in == nil && tg == nil, "EvalBatch returned data")
		})
	}
}

func TestEvalStrideCoprime(t *testing.T) {
	for _, n := range []uint64{1, 2, 3, 4, 10, 64, 97, 1000, 1 << 20, 999983} {
		s := evalStride(n)
		expect(t, gcd(s, n) == 1, "n=%d: stride %d shares a factor with n", n, s)
	}
}

func TestDefaultGoRootCorpus(t *testing.T) {
	const maxBytes = 1 << 20
	c, err := Load(Options{MaxBytes: maxBytes})
	mustNoErr(t, err)
	expect(t, len(c.Train) > 0 && len(c.Eval) > 0, "splits: %d train bytes, %d eval bytes", len(c.Train), len(c.Eval))
	expect(t, c.TrainFiles > 0 && c.EvalFiles > 0, "files: %d train, %d eval", c.TrainFiles, c.EvalFiles)
	expect(t, len(c.Train)+len(c.Eval) <= maxBytes, "read %d bytes, cap is %d", len(c.Train)+len(c.Eval), maxBytes)
	mustNoErr(t, c.Check(256))
	expect(t, bytes.Contains(c.Train, []byte("package ")), "training text does not look like Go")

	src, err := DefaultPath()
	mustNoErr(t, err)
	expect(t, strings.HasPrefix(c.Source, src) && strings.Contains(c.Source, "*.go"), "Source %q should name %s and *.go", c.Source, src)
	t.Logf("default corpus: %s, %d train / %d eval files", c.Source, c.TrainFiles, c.EvalFiles)
}

func TestLocateGoSrc(t *testing.T) {
	goroot := t.TempDir()
	mustNoErr(t, os.Mkdir(filepath.Join(goroot, "src"), 0o755))
	bogus := filepath.Join(t.TempDir(), "no-goroot")
	envGives := func(root string, err error) func() (string, error) {
		return func() (string, error) { return root, err }
	}
	envMustNotRun := func() (string, error) {
		t.Error("go env consulted although runtime.GOROOT() has sources")
		return "", nil
	}
	tests := []struct {
		name    string
		root    string
		goEnv   func() (string, error)
		want    string
		wantErr []string
	}{
		{"runtime root has sources", goroot, envMustNotRun, filepath.Join(goroot, "src"), nil},
		{"fall back to go env", bogus, envGives(goroot, nil), filepath.Join(goroot, "src"), nil},
		{"empty runtime root", "", envGives(goroot, nil), filepath.Join(goroot, "src"), nil},
		{"go command missing", bogus, envGives("", fs.ErrNotExist), "", []string{bogus, "no default corpus (the Go installation's sources)"}},
		{"go env root without sources", "", envGives(bogus, nil), "", []string{"runtime.GOROOT() is empty", bogus}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := locateGoSrc(tt.root, tt.goEnv)
			if tt.wantErr != nil {
				expectErr(t, err, nil, tt.wantErr...)
				return
			}
			mustNoErr(t, err)
			expectEqual(t, tt.want, got, "source folder")
		})
	}
}
