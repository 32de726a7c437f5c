package dump

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fixture is a small pipeline that exercises every feature of the page:
// header lines, a comment, a blank line, added and removed values, phase
// tints, runs of unchanged passes (one in the middle, one at the end), and
// text that needs escaping.
func fixture() []Column {
	input := `gir 1
module "gpt"
passes verify-input
# forward
%1 = param : f32[4,8] {name="w<1>" phase=fwd} @model.go:10
%2 = input : f32[2,4] {phase=fwd} @model.go:11
%3 = matmul %2, %1 : f32[2,8] {layer=0 phase=fwd} @model.go:12

%4 = reduce_sum %3 : f32[] {phase=fwd} @model.go:13
output "loss" = %4
`
	autodiff := strings.Replace(input, "passes verify-input", "passes verify-input,autodiff", 1) +
		`%5 = ones : f32[] {phase=bwd} @model.go:13
%6 = broadcast %5 : f32[2,8] {phase=bwd} @model.go:13
%7 = matmul %2, %6 : f32[4,8] {transA=true phase=bwd} @model.go:12
%8 = sub %1, %7 : f32[4,8] {phase=opt note="a&b \"q\" %99"} @model.go:10
update "w" = %8
`
	fuse := strings.NewReplacer(
		"passes verify-input,autodiff", "passes verify-input,autodiff,cse,dce,fuse",
		"%5 = ones : f32[] {phase=bwd} @model.go:13\n%6 = broadcast %5 : f32[2,8] {phase=bwd} @model.go:13\n",
		"%9 = fill : f32[2,8] {value=1 phase=bwd} @model.go:13\n",
		"%7 = matmul %2, %6", "%7 = matmul %2, %9",
	).Replace(autodiff)
	return []Column{
		{Pass: "input", Text: input, Millis: 0},
		{Pass: "autodiff", Changed: true, Text: autodiff, Millis: 1.5},
		{Pass: "cse", Millis: 0.25},
		{Pass: "dce", Millis: 0.125},
		{Pass: "fuse", Changed: true, Text: fuse, Millis: 2},
		{Pass: "verify<out>", Millis: 0.5},
	}
}

func render(t testing.TB, title string, cols []Column) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, title, cols); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	return b.String()
}

func TestGolden(t *testing.T) {
	got := render(t, "gpt <step>", fixture())
	path := filepath.Join("testdata", "index.golden.html")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./passes/dump -update to create it)", err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("output differs from %s (-want +got); run with -update if intended:\n%s", path, diff)
	}
}

// sections splits the page into its column sections, in order.
func sections(page string) []string {
	parts := strings.Split(page, "<section ")
	out := parts[1:]
	for i, s := range out {
		if k := strings.Index(s, "</section>"); k >= 0 {
			out[i] = s[:k]
		}
	}
	return out
}

var (
	addedRE = regexp.MustCompile(`<div class="l a[^"]*"><span class="v v(\d+) d">`)
	defRE   = regexp.MustCompile(`<div class="l[^"]*"><span class="v v(\d+) d">`)
	rmRE    = regexp.MustCompile(`<div class="l r[^"]*"><span class="v v(\d+)">`)
)

func ids(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestAddedAndRemoved(t *testing.T) {
	secs := sections(render(t, "t", fixture()))
	if len(secs) != 3 {
		t.Fatalf("got %d sections, want 3 (input, autodiff + cse + dce, fuse + verify)", len(secs))
	}
	tests := []struct {
		name           string
		sec            string
		added, removed []string
		header         string
	}{
		{"input", secs[0], nil, nil, `<span class="nt">4 values</span>`},
		{"autodiff", secs[1], []string{"5", "6", "7", "8"}, nil, `<span class="na">+4</span> <span class="nr">−0</span> <span class="nm">~0</span> <span class="nt">8 values</span>`},
		{"fuse", secs[2], []string{"9"}, []string{"5", "6"}, `<span class="na">+1</span> <a class="nr" href="#c4-rm">−2</a> <span class="nm">~1</span> <span class="nt">7 values</span>`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(addedRE, tc.sec); !slices.Equal(got, tc.added) {
				t.Errorf("added ids = %v, want %v", got, tc.added)
			}
			if got := ids(rmRE, tc.sec); !slices.Equal(got, tc.removed) {
				t.Errorf("removed ids = %v, want %v", got, tc.removed)
			}
			if !strings.Contains(tc.sec, tc.header) {
				t.Errorf("header lacks %q:\n%s", tc.header, tc.sec[:min(len(tc.sec), 400)])
			}
		})
	}
	// The first column has no predecessor: nothing in it counts as added,
	// even though every value is new to the page.
	if strings.Contains(secs[0], `class="na"`) {
		t.Errorf("first column shows an added count")
	}
	// Removed lines must not carry the definition marker, or revealing a
	// value would scroll to a line that no longer exists in that column.
	rm := secs[2][strings.Index(secs[2], `class="rm"`):]
	if strings.Contains(rm, " d\"") {
		t.Errorf("removed section marks a definition:\n%s", rm)
	}
	if got := ids(defRE, secs[2]); !slices.Equal(got, []string{"1", "2", "3", "4", "9", "7", "8"}) {
		t.Errorf("fuse defs = %v", got)
	}
	// fuse rewired %7's operand: same id, new text, so it is marked changed.
	modRE := regexp.MustCompile(`<div class="l m[^"]*"><span class="v v(\d+) d">`)
	if got := ids(modRE, secs[2]); !slices.Equal(got, []string{"7"}) {
		t.Errorf("fuse modified ids = %v, want [7]", got)
	}
	if got := ids(modRE, secs[1]); got != nil {
		t.Errorf("autodiff modified ids = %v, want none", got)
	}
}

// TestAddedAgainstPreviousShown checks that "added" is relative to the
// previous column shown, not to the immediately preceding entry, which
// may be an unchanged pass whose text is not the module's.
func TestAddedAgainstPreviousShown(t *testing.T) {
	cols := []Column{
		{Pass: "input", Text: "%1 = a\n%2 = b\n"},
		{Pass: "noop", Text: "%1 = a\n"}, // unchanged: its text must be ignored
		{Pass: "p", Changed: true, Text: "%1 = a\n%2 = b\n%3 = c %1, %2\n"},
	}
	secs := sections(render(t, "t", cols))
	if len(secs) != 2 {
		t.Fatalf("got %d sections, want 2", len(secs))
	}
	if got := ids(addedRE, secs[1]); !slices.Equal(got, []string{"3"}) {
		t.Errorf("added = %v, want [3]", got)
	}
	if got := ids(rmRE, secs[1]); got != nil {
		t.Errorf("removed = %v, want none", got)
	}
}

// TestDuplicateDefinitions: a malformed module that defines an id twice
// still renders every line, but counts the id once.
func TestDuplicateDefinitions(t *testing.T) {
	cols := []Column{
		{Pass: "input", Text: "%1 = a\n%1 = b\n"},
		{Pass: "p", Changed: true, Text: "%2 = c\n%2 = c\n"},
	}
	secs := sections(render(t, "t", cols))
	if !strings.Contains(secs[0], `<span class="nt">1 values</span>`) {
		t.Errorf("input counts duplicates: %.300s", secs[0])
	}
	if !strings.Contains(secs[1], `<span class="na">+1</span> <a class="nr" href="#c1-rm">−1</a>`) {
		t.Errorf("counts wrong: %.300s", secs[1])
	}
	if got := ids(rmRE, secs[1]); !slices.Equal(got, []string{"1", "1"}) {
		t.Errorf("removed lines = %v, want both definitions of 1", got)
	}
	if got := ids(addedRE, secs[1]); !slices.Equal(got, []string{"2", "2"}) {
		t.Errorf("added lines = %v, want both definitions of 2", got)
	}
}

func TestEscaping(t *testing.T) {
	cols := []Column{
		{Pass: "in<put>", Text: "%1 = const : f32[] {s=\"<script>alert(1)</script>\"} @x.go:1\n# \"&'<b>\n"},
		{Pass: `p"&`, Changed: true, Text: "%1 = const : f32[] {s=\"<script>alert(1)</script>\"} @x.go:1\n%2 = neg %1 : f32[] {k=\"&\"} @x.go:2\n"},
	}
	page := render(t, `<script>"&`, cols)
	for _, want := range []string{
		`&lt;script&gt;alert(1)&lt;/script&gt;`,
		`# &#34;&amp;&#39;&lt;b&gt;`,
		`{k=&#34;&amp;&#34;}`,
		`<title>&lt;script&gt;&#34;&amp;</title>`,
		`<span class="pn" title="p&#34;&amp;">p&#34;&amp;</span>`,
		`in&lt;put&gt;`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := strings.Count(page, "<script"); n != 1 {
		t.Errorf("page has %d <script elements, want only the page's own", n)
	}
	checkWellFormed(t, page)
}

// Passes that leave the module unchanged merge into the column before
// them, as GOSSAFUNC's ssa.html does: their names, times and notes in its
// header, no column and no text of their own.
func TestUnchangedMergeIntoThePreviousColumn(t *testing.T) {
	const secret = "%1 = SHOULD_NOT_APPEAR"
	cols := []Column{
		{Pass: "input", Text: "%1 = a\n"},
		{Pass: "cse", Text: secret, Millis: 1},
		{Pass: "dce", Text: secret, Millis: 2, Note: "nothing <dead>"},
		{Pass: "fuse", Changed: true, Text: "%1 = a\n%2 = b %1\n"},
		{Pass: "verify", Millis: 3},
	}
	page := render(t, "t", cols)
	if strings.Contains(page, "SHOULD_NOT_APPEAR") {
		t.Errorf("text of an unchanged pass was rendered")
	}
	secs := sections(page)
	if len(secs) != 2 {
		t.Fatalf("got %d sections, want 2 (input + cse + dce, fuse + verify)", len(secs))
	}
	for _, want := range []string{
		`<span class="pn" title="input">input</span> + <span class="same" title="cse: 1.00 ms, left the module unchanged"><span class="ix">1</span><span class="fn">cse</span></span>`,
		` + <span class="same" title="dce: 2.00 ms, left the module unchanged"><span class="ix">2</span><span class="fn">dce</span></span></div>`,
		`<span class="sm">then 2 passes without change, 3.00 ms</span>`,
		`<div class="pnote">dce: nothing &lt;dead&gt;</div>`,
	} {
		if !strings.Contains(secs[0], want) {
			t.Errorf("first column's header lacks %q:\n%.800s", want, secs[0])
		}
	}
	for _, want := range []string{
		`<span class="ix">3</span><span class="pn" title="fuse">fuse</span> + <span class="same" title="verify: 3.00 ms, left the module unchanged"><span class="ix">4</span><span class="fn">verify</span></span>`,
		`<span class="sm">then 1 pass without change, 3.00 ms</span>`,
	} {
		if !strings.Contains(secs[1], want) {
			t.Errorf("trailing column's header lacks %q:\n%.800s", want, secs[1])
		}
	}
	if !strings.Contains(page, `5 passes in 2 columns`) {
		t.Errorf("summary does not count passes and columns")
	}
	// Each section holds its own text once, the merged passes none.
	if n := strings.Count(secs[0], `<div class="l`); n != 1 {
		t.Errorf("first column has %d lines, want 1", n)
	}
	if n := strings.Count(secs[1], `<div class="l`); n != 2 {
		t.Errorf("fuse column has %d lines, want 2", n)
	}
	checkWellFormed(t, page)
}

// TestFirstColumnAlwaysFull: the input is the baseline of the first diff, so
// it is shown even though nothing "changed" it.
func TestFirstColumnAlwaysFull(t *testing.T) {
	secs := sections(render(t, "t", []Column{{Pass: "input", Text: "%7 = a\n"}}))
	if len(secs) != 1 {
		t.Fatalf("want one column: %v", secs)
	}
	if !strings.Contains(secs[0], `<div class="l"><span class="v v7 d">%7</span> = a</div>`) {
		t.Errorf("first column content wrong:\n%s", secs[0])
	}
}

func TestReferences(t *testing.T) {
	tests := []struct{ in, want string }{
		{`%12 = add %10, %3 : f32[4]`, `<span class="v v12 d">%12</span> = add <span class="v v10">%10</span>, <span class="v v3">%3</span> : f32[4]`},
		{`  %007 = x %0`, `  <span class="v v7 d">%007</span> = x <span class="v v0">%0</span>`},
		{`output "a%1" = %40`, `output &#34;a%1&#34; = <span class="v v40">%40</span>`},
		{`update "a\"%1" = %5`, `update &#34;a\&#34;%1&#34; = <span class="v v5">%5</span>`},
		{`x%1 %2b 50% %`, `x%1 %2b 50% %`},
		{`# uses %3 "unbalanced`, `# uses <span class="v v3">%3</span> &#34;unbalanced`},
		{`%1 == %2`, `<span class="v v1">%1</span> == <span class="v v2">%2</span>`}, // not a definition
	}
	for _, tc := range tests {
		page := render(t, "t", []Column{{Pass: "input", Text: tc.in}})
		if !strings.Contains(page, `">`+tc.want+`</div>`) {
			t.Errorf("line %q: want rendering %q in\n%s", tc.in, tc.want, sections(page)[0])
		}
	}
}

func TestPhaseTint(t *testing.T) {
	text := "%1 = a {phase=fwd}\n%2 = b {layer=1 phase=bwd}\n%3 = c {phase=opt}\n%4 = d {xphase=bwd}\n%5 = e {phase=bwdx}\n# phase=bwd\n"
	page := render(t, "t", []Column{{Pass: "input", Text: text}})
	want := map[string]string{"1": "l", "2": "l pb", "3": "l po", "4": "l", "5": "l"}
	for id, cls := range want {
		if !strings.Contains(page, `<div class="`+cls+`"><span class="v v`+id+` d">`) {
			t.Errorf("value %s: want class %q", id, cls)
		}
	}
	if !strings.Contains(page, `<div class="l c"># phase=bwd</div>`) {
		t.Errorf("comment should be styled as comment, not tinted")
	}
}

func TestChunking(t *testing.T) {
	var b strings.Builder
	n := 2*chunkLines + 3
	for i := range n {
		fmt.Fprintf(&b, "%%%d = c\n", i)
	}
	page := render(t, "t", []Column{{Pass: "input", Text: b.String()}})
	if got := strings.Count(page, `<div class="ch"`); got != 3 {
		t.Errorf("got %d chunks, want 3", got)
	}
	if !strings.Contains(page, fmt.Sprintf("auto %dpx", chunkLines*lineHeightPx)) ||
		!strings.Contains(page, fmt.Sprintf("auto %dpx", 3*lineHeightPx)) {
		t.Errorf("chunk sizes not set from line counts")
	}
	if got := strings.Count(page, `<div class="l">`); got != n {
		t.Errorf("got %d lines, want %d", got, n)
	}
	checkWellFormed(t, page)
}

func TestCRLFAndNoTrailingNewline(t *testing.T) {
	page := render(t, "t", []Column{{Pass: "input", Text: "%1 = a\r\n%2 = b %1"}})
	if strings.Contains(page, "\r") {
		t.Errorf("carriage return leaked into the page")
	}
	if got := ids(defRE, page); !slices.Equal(got, []string{"1", "2"}) {
		t.Errorf("defs = %v", got)
	}
}

func TestEmpty(t *testing.T) {
	page := render(t, "t", nil)
	if !strings.Contains(page, "no passes recorded") {
		t.Errorf("empty page lacks a message")
	}
	checkWellFormed(t, page)
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

func TestWriteError(t *testing.T) {
	sentinel := errors.New("disk full")
	err := WriteHTML(failWriter{sentinel}, "t", fixture())
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want it to wrap %v", err, sentinel)
	}
}

func TestWellFormed(t *testing.T) {
	checkWellFormed(t, render(t, "gpt", fixture()))
}

// checkWellFormed is a small structural check standing in for an HTML
// parser: tags nest and close, attribute quotes pair up, no raw '<' or '>'
// appears in text or attributes, and every '&' starts an entity.
func checkWellFormed(t *testing.T, page string) {
	t.Helper()
	void := map[string]bool{"meta": true, "br": true, "hr": true, "img": true, "link": true, "input": true}
	tagName := regexp.MustCompile(`^[a-z][a-z0-9]*$`)
	entity := regexp.MustCompile(`^&([a-z]+|#[0-9]+);`)
	checkText := func(s string) bool {
		if strings.ContainsAny(s, ">") {
			t.Errorf("raw '>' in text %q", s)
			return false
		}
		for i := strings.IndexByte(s, '&'); i >= 0; i = strings.IndexByte(s, '&') {
			if !entity.MatchString(s[i:]) {
				t.Errorf("bare '&' in text %q", s)
				return false
			}
			s = s[i+1:]
		}
		return true
	}
	if !strings.HasPrefix(page, "<!DOCTYPE html>\n") {
		t.Errorf("missing doctype")
		return
	}
	s := page[len("<!DOCTYPE html>\n"):]
	var stack []string
	for {
		i := strings.IndexByte(s, '<')
		if i < 0 {
			if !checkText(s) {
				return
			}
			break
		}
		if !checkText(s[:i]) {
			return
		}
		s = s[i:]
		end := strings.IndexByte(s, '>')
		if end < 0 {
			t.Errorf("unterminated tag at %.40q", s)
			return
		}
		tag := s[1:end]
		s = s[end+1:]
		if strings.ContainsAny(tag, "<") || strings.Count(tag, `"`)%2 != 0 {
			t.Errorf("malformed tag <%s>", tag)
			return
		}
		if name, ok := strings.CutPrefix(tag, "/"); ok {
			if len(stack) == 0 || stack[len(stack)-1] != name {
				t.Errorf("</%s> closes %v", name, stack)
				return
			}
			stack = stack[:len(stack)-1]
			continue
		}
		name, _, _ := strings.Cut(tag, " ")
		if !tagName.MatchString(name) {
			t.Errorf("bad tag name in <%s>", tag)
			return
		}
		if void[name] {
			continue
		}
		if name == "script" || name == "style" {
			k := strings.Index(s, "</"+name+">")
			if k < 0 {
				t.Errorf("unclosed <%s>", name)
				return
			}
			s = s[k+len("</"+name+">"):]
			continue
		}
		stack = append(stack, name)
	}
	if len(stack) != 0 {
		t.Errorf("unclosed elements %v", stack)
	}
}

// TestSample writes the fixture and a bigger synthetic module to
// $DUMP_SAMPLE_DIR when set, for looking at the page in a browser.
func TestSample(t *testing.T) {
	dir := os.Getenv("DUMP_SAMPLE_DIR")
	if dir == "" {
		t.Skip("DUMP_SAMPLE_DIR not set")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bench := benchColumns(2000)
	fx := fixture()
	cols := []Column{bench[0], bench[1], fx[2], fx[3], bench[2], fx[5]}
	page := render(t, "sample <gpt>", cols)
	checkWellFormed(t, page)
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
}

// benchColumns builds a synthetic three-pass module of n lines per column:
// an input with a forward chain, an autodiff-like pass appending backward
// and optimizer values, and a fusion-like pass replacing every tenth value.
func benchColumns(n int) []Column {
	var in strings.Builder
	in.WriteString("gir 1\nmodule \"bench\"\npasses verify-input\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&in, "%%%d = matmul %%%d, %%%d : f32[4,128,1024] {transB=true layer=%d phase=fwd} @model.go:%d\n",
			i, max(i-1, 0), max(i-2, 0), i/100, 40+i%50)
	}
	var ad strings.Builder
	ad.WriteString(in.String())
	for i := n + 1; i <= n+n/10; i++ {
		phase := "bwd"
		if i%3 == 0 {
			phase = "opt"
		}
		fmt.Fprintf(&ad, "%%%d = add %%%d, %%%d : f32[4,128,1024] {layer=%d phase=%s} @model.go:%d\n",
			i, i-1, i-n, i/100, phase, 40+i%50)
	}
	ad.WriteString("output \"loss\" = %1\n")
	var fu strings.Builder
	for ln := range strings.Lines(ad.String()) {
		if id := defID(strings.TrimSuffix(ln, "\n")); id != "" && len(id) > 1 && id[len(id)-1] == '0' {
			fmt.Fprintf(&fu, "%%%s9000000 = fused_matmul_add %%1, %%2 : f32[4,128,1024] {phase=fwd} @model.go:1\n", id)
			continue
		}
		fu.WriteString(ln)
	}
	return []Column{
		{Pass: "bench-input", Text: in.String(), Millis: 0.1},
		{Pass: "bench-autodiff", Changed: true, Text: ad.String(), Millis: 12.5},
		{Pass: "bench-fuse", Changed: true, Text: fu.String(), Millis: 3.25},
	}
}

func BenchmarkWriteHTML(b *testing.B) {
	cols := benchColumns(20000)
	var size int64
	for _, c := range cols {
		size += int64(len(c.Text))
	}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteHTML(io.Discard, "bench", cols); err != nil {
			b.Fatal(err)
		}
	}
}
