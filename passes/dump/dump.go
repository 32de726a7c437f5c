package dump

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Column is the module text after one pass. The driver records one per pass,
// including passes that changed nothing, so the page can still show where
// they ran in the pipeline and what they cost.
type Column struct {
	Pass    string  // pass name, e.g. "autodiff"
	Changed bool    // false: the pass left the module as it was (listed in the previous column's header, Text may be empty)
	Text    string  // full gir text after the pass (only needed when Changed, or for the first column)
	Millis  float64 // time the pass took
	Note    string  // what the pass noted (passes.Result.Note), shown under its name
}

// chunkLines is how many lines share one lazily laid out block. Big enough
// that the per-block overhead is negligible, small enough that scrolling
// into an unrendered region lays out only a screenful or two.
const chunkLines = 512

// lineHeightPx must match the .l rule in pageCSS: the page sizes skipped
// chunks from it so the scrollbars are about right before they are
// rendered (long lines wrap, so a chunk may end up taller; the browser
// keeps the real size once it has laid a chunk out).
const lineHeightPx = 16

// WriteHTML renders cols as a side-by-side page. cols[0] is shown in full
// whatever its Changed flag, since it is the baseline the rest are read
// against; a later column with Changed false merges into the column before
// it, as GOSSAFUNC's ssa.html merges passes with identical output: its text
// is that column's, so the page lists the pass in that column's header
// instead of repeating the text. It fails only when w does (the error wraps
// w's), leaving it to the driver to decide whether a broken dump should stop
// a compile.
func WriteHTML(w io.Writer, title string, cols []Column) error {
	p := &printer{w: bufio.NewWriterSize(w, 64<<10)}
	p.head(title, cols)

	var prev *snapshot
	for i := 0; i < len(cols); {
		j := i + 1
		for j < len(cols) && !cols[j].Changed {
			j++
		}
		cur := parse(cols[i].Text)
		p.column(i, &cols[i], cols[i+1:j], cur, prev)
		prev = cur
		i = j
	}
	if len(cols) == 0 {
		p.s(`<p class="empty">no passes recorded</p>`)
	}
	p.tail()

	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("dump: writing HTML: %w", err)
	}
	return nil
}

// line is one line of gir text; def is the normalized id it defines, or ""
// when the line is not a value definition.
type line struct {
	text  string
	def   string
	first bool // the first definition of def in its column
}

// snapshot is one column's text split into lines plus its definitions by
// id, which is all the diffing between columns needs.
type snapshot struct {
	lines []line
	defs  map[string]string // id -> defining line
}

func parse(text string) *snapshot {
	n := strings.Count(text, "\n") + 1
	s := &snapshot{lines: make([]line, 0, n), defs: make(map[string]string, n)}
	for len(text) > 0 {
		var ln string
		if k := strings.IndexByte(text, '\n'); k >= 0 {
			ln, text = text[:k], text[k+1:]
		} else {
			ln, text = text, ""
		}
		ln = strings.TrimSuffix(ln, "\r")
		d := defID(ln)
		first := false
		if d != "" {
			if _, dup := s.defs[d]; !dup {
				s.defs[d] = ln
				first = true
			}
		}
		s.lines = append(s.lines, line{text: ln, def: d, first: first})
	}
	return s
}

// defID returns the normalized id defined by a line of the form
// `%<digits> = ...` (leading blanks allowed), or "".
func defID(ln string) string {
	i := 0
	for i < len(ln) && (ln[i] == ' ' || ln[i] == '\t') {
		i++
	}
	if i >= len(ln) || ln[i] != '%' {
		return ""
	}
	i++
	start := i
	for i < len(ln) && isDigit(ln[i]) {
		i++
	}
	if i == start {
		return ""
	}
	id := ln[start:i]
	for i < len(ln) && (ln[i] == ' ' || ln[i] == '\t') {
		i++
	}
	if i >= len(ln) || ln[i] != '=' || (i+1 < len(ln) && ln[i+1] == '=') {
		return ""
	}
	return normID(id)
}

// normID strips leading zeros so that %007 and %7 name the same value in
// class names and in the diff.
func normID(digits string) string {
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:]
	}
	return digits
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isIdent(c byte) bool {
	return isDigit(c) || c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

// phaseOf reports the training phase a line is tagged with, so the page can
// tint backward and optimizer values. Only the two tinted phases are
// recognised; anything else (fwd, untagged) returns "".
func phaseOf(ln string) string {
	for off := 0; ; {
		k := strings.Index(ln[off:], "phase=")
		if k < 0 {
			return ""
		}
		k += off
		rest := ln[k+len("phase="):]
		if k == 0 || !isIdent(ln[k-1]) {
			for _, ph := range [...]string{"bwd", "opt"} {
				if strings.HasPrefix(rest, ph) && (len(rest) == len(ph) || !isIdent(rest[len(ph)])) {
					return ph
				}
			}
		}
		off = k + len("phase=")
	}
}

func fmtMillis(ms float64) string {
	return strconv.FormatFloat(ms, 'f', 2, 64) + " ms"
}
