package dump

import (
	"bufio"
	"strconv"
)

// printer writes the page. It relies on bufio.Writer's sticky error: after a
// failed write every later write is a no-op and Flush reports the error, so
// the rendering code can stay free of error plumbing.
type printer struct {
	w *bufio.Writer
}

func (p *printer) s(str string) { _, _ = p.w.WriteString(str) }

func (p *printer) int(n int) { p.s(strconv.Itoa(n)) }

// count writes n and the noun's singular or plural.
func (p *printer) count(n int, one, many string) {
	p.int(n)
	p.s(" ")
	if n == 1 {
		p.s(one)
	} else {
		p.s(many)
	}
}

// esc writes str HTML-escaped, with the same replacements as
// html.EscapeString but without allocating, since it runs once per line of
// text on modules with tens of thousands of lines.
func (p *printer) esc(str string) {
	last := 0
	for i := 0; i < len(str); i++ {
		var r string
		switch str[i] {
		case '<':
			r = "&lt;"
		case '>':
			r = "&gt;"
		case '&':
			r = "&amp;"
		case '"':
			r = "&#34;"
		case '\'':
			r = "&#39;"
		default:
			continue
		}
		p.s(str[last:i])
		p.s(r)
		last = i + 1
	}
	p.s(str[last:])
}

func (p *printer) head(title string, cols []Column) {
	p.s("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>")
	p.esc(title)
	p.s("</title>\n<style>\n")
	p.s(pageCSS)
	p.s("</style>\n</head>\n<body>\n<div id=\"top\"><h1>")
	p.esc(title)
	p.s("</h1><span class=\"sum\">")

	shown := 0
	total := 0.0
	for i, c := range cols {
		if i == 0 || c.Changed {
			shown++
		}
		total += c.Millis
	}
	p.count(len(cols), "pass", "passes")
	p.s(" in ")
	p.count(shown, "column", "columns")
	p.s(" (a pass that changed nothing is listed in the column before it), ")
	p.s(fmtMillis(total))
	p.s(" in passes</span><span class=\"help\">")
	p.s("click a %N to highlight it in every column (again to clear, Esc clears all); " +
		"<span class=\"l a key\">added</span> <span class=\"l pb key\">phase=bwd</span> " +
		"<span class=\"l po key\">phase=opt</span> <span class=\"l m key\">~changed</span> " +
		"<span class=\"l r key\">removed</span>")
	p.s("</span></div>\n<div id=\"cols\">\n")
}

func (p *printer) tail() {
	p.s("</div>\n<script>\n")
	p.s(pageJS)
	p.s("</script>\n</body>\n</html>\n")
}

// column writes one full column; same are the passes after it that left
// the module unchanged, listed in its header; prev is the previous column,
// or nil for the first, which then has nothing to be diffed against.
func (p *printer) column(index int, c *Column, same []Column, cur, prev *snapshot) {
	// One map lookup per line on each side: this is the hot loop for big
	// modules. Counts use only the first definition of an id so that a
	// malformed module with duplicate definitions is not double counted.
	added, modified, nRemoved := 0, 0, 0
	var kinds []lineKind
	var removed []line
	if prev != nil {
		kinds = make([]lineKind, len(cur.lines))
		for i, ln := range cur.lines {
			if ln.def == "" {
				continue
			}
			if old, ok := prev.defs[ln.def]; !ok {
				kinds[i] = lineAdded
				if ln.first {
					added++
				}
			} else if old != ln.text {
				kinds[i] = lineModified
				if ln.first {
					modified++
				}
			}
		}
		for _, ln := range prev.lines {
			if ln.def == "" {
				continue
			}
			if _, ok := cur.defs[ln.def]; !ok {
				removed = append(removed, ln)
				if ln.first {
					nRemoved++
				}
			}
		}
	}

	id := "c" + strconv.Itoa(index)
	p.s("<section class=\"col\" id=\"")
	p.s(id)
	p.s("\">\n<div class=\"hd\"><div class=\"ps\"><span class=\"ix\">")
	p.int(index)
	p.s("</span><span class=\"pn\" title=\"")
	p.esc(c.Pass)
	p.s("\">")
	p.esc(c.Pass)
	p.s("</span>")
	for k := range same {
		p.s(" + <span class=\"same\" title=\"")
		p.esc(same[k].Pass)
		p.s(": ")
		p.s(fmtMillis(same[k].Millis))
		p.s(", left the module unchanged\"><span class=\"ix\">")
		p.int(index + 1 + k)
		p.s("</span><span class=\"fn\">")
		p.esc(same[k].Pass)
		p.s("</span></span>")
	}
	p.s("</div><div class=\"st\"><span class=\"ms\">")
	p.s(fmtMillis(c.Millis))
	p.s("</span>")
	if prev != nil {
		p.s(" <span class=\"na\">+")
		p.int(added)
		p.s("</span> ")
		if nRemoved > 0 {
			p.s("<a class=\"nr\" href=\"#")
			p.s(id)
			p.s("-rm\">\u2212")
			p.int(nRemoved)
			p.s("</a>")
		} else {
			p.s("<span class=\"nr\">\u22120</span>")
		}
		p.s(" <span class=\"nm\">~")
		p.int(modified)
		p.s("</span>")
	}
	p.s(" <span class=\"nt\">")
	p.int(len(cur.defs))
	p.s(" values</span>")
	if len(same) > 0 {
		var ms float64
		for _, c := range same {
			ms += c.Millis
		}
		p.s(" <span class=\"sm\">then ")
		p.count(len(same), "pass", "passes")
		p.s(" without change, ")
		p.s(fmtMillis(ms))
		p.s("</span>")
	}
	p.s("</div>")
	p.note("", c.Note)
	for k := range same {
		p.note(same[k].Pass, same[k].Note)
	}
	p.s("</div>\n<div class=\"body\">\n")

	for start := 0; start < len(cur.lines); start += chunkLines {
		end := min(start+chunkLines, len(cur.lines))
		p.s("<div class=\"ch\" style=\"contain-intrinsic-block-size:auto ")
		p.int((end - start) * lineHeightPx)
		p.s("px\">\n")
		for i := start; i < end; i++ {
			kind := lineSame
			if kinds != nil {
				kind = kinds[i]
			}
			p.line(cur.lines[i], kind)
		}
		p.s("</div>\n")
	}

	if len(removed) > 0 {
		p.s("<div class=\"rm\" id=\"")
		p.s(id)
		p.s("-rm\"><div class=\"rh\">removed by ")
		p.esc(c.Pass)
		p.s(" (")
		p.int(nRemoved)
		p.s(")</div>\n")
		for _, ln := range removed {
			p.line(ln, lineRemoved)
		}
		p.s("</div>\n")
	}
	p.s("</div>\n</section>\n")
}

// note writes a pass's note (passes.Result.Note), if it has one, under
// the column's pass names: a pass that had nothing to do for a request
// says why there. pass names it when the note is not the column's own.
func (p *printer) note(pass, text string) {
	if text == "" {
		return
	}
	p.s("<div class=\"pnote\">")
	if pass != "" {
		p.esc(pass)
		p.s(": ")
	}
	p.esc(text)
	p.s("</div>")
}

// lineKind is how a line relates to the previous full column.
type lineKind uint8

const (
	lineSame     lineKind = iota // not a definition, or defined identically before
	lineAdded                    // defines an id the previous column lacks
	lineModified                 // redefines an existing id with different text
	lineRemoved                  // a line of the previous column whose id is gone
)

// line writes one gir line as a block element. In removed lines the defined
// id is not marked as a definition, so that revealing a value's definition
// never jumps to a line that no longer exists in that column.
func (p *printer) line(ln line, kind lineKind) {
	comment := isComment(ln.text)
	p.s("<div class=\"l")
	switch kind {
	case lineRemoved:
		p.s(" r")
	case lineAdded:
		p.s(" a")
	case lineModified:
		p.s(" m")
	}
	if comment {
		p.s(" c")
	} else if ph := phaseOf(ln.text); ph == "bwd" {
		p.s(" pb")
	} else if ph == "opt" {
		p.s(" po")
	}
	p.s("\">")
	p.refs(ln.text, ln.def != "" && kind != lineRemoved, comment)
	p.s("</div>\n")
}

// refs writes a line with every %N reference wrapped in a clickable span.
// %N inside double-quoted strings (output and parameter names) is text, not
// a reference; comments have no string syntax, so quotes there are plain.
// markDef tags the first reference, the defined value, with class d.
func (p *printer) refs(s string, markDef, comment bool) {
	last := 0
	inQuote := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inQuote {
			if c == '\\' {
				i++
			} else if c == '"' {
				inQuote = false
			}
			continue
		}
		if c == '"' && !comment {
			inQuote = true
			continue
		}
		if c != '%' || (i > 0 && isIdent(s[i-1])) {
			continue
		}
		j := i + 1
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		if j == i+1 || (j < len(s) && isIdent(s[j])) {
			continue
		}
		p.esc(s[last:i])
		p.s("<span class=\"v v")
		p.s(normID(s[i+1 : j]))
		if markDef {
			p.s(" d")
			markDef = false
		}
		p.s("\">")
		p.s(s[i:j]) // '%' and digits: nothing to escape
		p.s("</span>")
		last = j
		i = j - 1
	}
	p.esc(s[last:])
}

func isComment(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t':
			continue
		case '#':
			return true
		}
		return false
	}
	return false
}
