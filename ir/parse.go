package ir

import (
	"errors"
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"
)

// ParseError is a syntax or reference error in .gir text.
type ParseError struct {
	File string
	Line int
	Msg  string
}

func (e *ParseError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// Parse reads .gir text. file names the input in errors. It checks syntax,
// references and attribute kinds; Verify checks the rest (types, shapes).
func Parse(file, text string) (*Module, error) {
	p := &parser{file: file, m: &Module{}, byID: map[int]*Value{}}
	lines := strings.Split(text, "\n")
	sawHeader, sawModule := false, false
	for i, line := range lines {
		p.line = i + 1
		line = strings.TrimRight(line, " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var err error
		switch {
		case !sawHeader:
			if line != FormatVersion {
				err = fmt.Errorf("first line must be %q, got %q", FormatVersion, line)
			}
			sawHeader = true
		case strings.HasPrefix(line, "module ") && sawModule,
			strings.HasPrefix(line, "passes ") && p.m.Passes != nil,
			strings.HasPrefix(line, "mesh ") && p.m.Mesh != nil:
			// A second one would silently replace the first.
			key, _, _ := strings.Cut(line, " ")
			err = fmt.Errorf("a second %s line: a module has one", key)
		case strings.HasPrefix(line, "module "):
			p.m.Name, err = strconv.Unquote(strings.TrimPrefix(line, "module "))
			sawModule = true
		case strings.HasPrefix(line, "passes "):
			p.m.Passes = strings.Split(strings.TrimPrefix(line, "passes "), ",")
		case strings.HasPrefix(line, "mesh "):
			p.m.Mesh, err = ParseMesh(strings.TrimPrefix(line, "mesh "))
		case strings.HasPrefix(line, "ignore-on-load "):
			var pat string
			if pat, err = strconv.Unquote(strings.TrimPrefix(line, "ignore-on-load ")); err == nil {
				if _, err = path.Match(pat, ""); err == nil {
					p.m.IgnoreOnLoad = append(p.m.IgnoreOnLoad, pat)
				}
			}
		case line == "evaluation-differs":
			p.m.EvalDiffers = true
		case strings.HasPrefix(line, "export-config "):
			if p.m.ExportConfig != "" {
				err = errors.New("a second export-config line: a module has one")
			} else if p.m.ExportConfig, err = strconv.Unquote(strings.TrimPrefix(line, "export-config ")); err == nil {
				err = CheckExportConfig(p.m.ExportConfig)
			}
		case strings.HasPrefix(line, "%"):
			err = p.value(line)
		case strings.HasPrefix(line, "output "):
			err = p.output(strings.TrimPrefix(line, "output "))
		case strings.HasPrefix(line, "update "):
			err = p.update(strings.TrimPrefix(line, "update "))
		default:
			err = fmt.Errorf("unexpected line %q", line)
		}
		if err != nil {
			return nil, &ParseError{File: file, Line: p.line, Msg: err.Error()}
		}
	}
	if !sawHeader || !sawModule {
		return nil, &ParseError{File: file, Line: p.line, Msg: "missing \"gir 1\" header or module line"}
	}
	return p.m, nil
}

type parser struct {
	file string
	line int
	m    *Module
	byID map[int]*Value
}

func (p *parser) lookup(tok string) (*Value, error) {
	if !strings.HasPrefix(tok, "%") {
		return nil, fmt.Errorf("want a value reference %%N, got %q", tok)
	}
	id, err := strconv.Atoi(tok[1:])
	if err != nil {
		return nil, fmt.Errorf("bad value reference %q", tok)
	}
	v, ok := p.byID[id]
	if !ok {
		return nil, fmt.Errorf("%%%d is used before it is defined", id)
	}
	return v, nil
}

func (p *parser) value(line string) error {
	lhs, rhs, ok := strings.Cut(line, " = ")
	if !ok {
		return fmt.Errorf("want %%N = op args : type, got %q", line)
	}
	id, err := strconv.Atoi(lhs[1:])
	if err != nil || id < 0 || id == math.MaxInt { // MaxInt: the next id would overflow
		return fmt.Errorf("bad value id %q", lhs)
	}
	if _, dup := p.byID[id]; dup {
		return fmt.Errorf("%%%d is defined twice", id)
	}
	head, rest, ok := strings.Cut(rhs, " : ")
	if !ok {
		return fmt.Errorf("missing \" : type\" in %q", line)
	}
	opName, argText, _ := strings.Cut(head, " ")
	info, ok := Lookup(opName)
	if !ok {
		return fmt.Errorf("unknown op %q", opName)
	}
	v := &Value{ID: id, Op: opName, Meta: NoMeta}
	if strings.HasSuffix(p.file, ".gir") {
		// A user's dump; the loader's text of a model.go is no file
		// the user has, and its values point at the model already.
		v.Read = Pos{File: p.file, Line: p.line}
	}
	if argText = strings.TrimSpace(argText); argText != "" {
		for _, tok := range strings.Split(argText, ",") {
			a, err := p.lookup(strings.TrimSpace(tok))
			if err != nil {
				return err
			}
			v.Args = append(v.Args, a)
		}
	}
	typeText, rest, _ := strings.Cut(rest, " ")
	if v.Type, err = ParseType(typeText); err != nil {
		return err
	}
	rest = strings.TrimSpace(rest)
	if strings.HasPrefix(rest, "{") {
		end, err := closingBrace(rest)
		if err != nil {
			return err
		}
		if err := p.fields(v, info, rest[1:end]); err != nil {
			return err
		}
		rest = strings.TrimSpace(rest[end+1:])
	}
	if rest != "" {
		if !strings.HasPrefix(rest, "@") {
			return fmt.Errorf("unexpected %q after type", rest)
		}
		file, lineText, ok := cutLast(rest[1:], ":")
		n, err := strconv.Atoi(lineText)
		if !ok || err != nil || file == "" {
			return fmt.Errorf("bad position %q: want @file:line", rest)
		}
		v.Pos = Pos{File: file, Line: n}
	}
	p.byID[id] = v
	p.m.Values = append(p.m.Values, v)
	if id >= p.m.nextID {
		p.m.nextID = id + 1
	}
	return nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// closingBrace finds the } that closes the { at s[0], skipping quoted strings.
func closingBrace(s string) (int, error) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			q, err := strconv.QuotedPrefix(s[i:])
			if err != nil {
				return 0, fmt.Errorf("bad quoted string in attributes: %w", err)
			}
			i += len(q) - 1
		case '}':
			return i, nil
		}
	}
	return 0, fmt.Errorf("unclosed { in attributes")
}

// fields parses "k=v k=v" where v is a quoted string, a [list] or a bare token.
func (p *parser) fields(v *Value, info *OpInfo, s string) error {
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		key, rest, ok := strings.Cut(s, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \"[") {
			return fmt.Errorf("want key=value in attributes, got %q", s)
		}
		var val string
		switch {
		case strings.HasPrefix(rest, `"`):
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return fmt.Errorf("attribute %s: bad quoted string", key)
			}
			val = q
		case strings.HasPrefix(rest, "["):
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return fmt.Errorf("attribute %s: unclosed [", key)
			}
			val = rest[:end+1]
		default:
			val, _, _ = strings.Cut(rest, " ")
		}
		s = rest[len(val):]
		if err := p.field(v, info, key, val); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) field(v *Value, info *OpInfo, key, val string) error {
	var err error
	switch key {
	case "place":
		if !strings.HasPrefix(val, "[") {
			return fmt.Errorf("place must be a [list], got %q", val)
		}
		v.Place = []Placement{}
		if body := val[1 : len(val)-1]; body != "" {
			for _, f := range strings.Split(body, ",") {
				pl, err := ParsePlacement(f)
				if err != nil {
					return err
				}
				v.Place = append(v.Place, pl)
			}
		}
		return nil
	case "layer":
		v.Meta.Layer, err = metaInt(key, val)
		return err
	case "stage":
		v.Meta.Stage, err = metaInt(key, val)
		return err
	case "chunk":
		v.Meta.Chunk, err = metaInt(key, val)
		return err
	case "micro":
		v.Meta.Micro, err = metaInt(key, val)
		return err
	case "phase":
		v.Meta.Phase, err = ParsePhase(val)
		return err
	case "selective":
		if val != "true" {
			return fmt.Errorf("selective must be true when given, got %q", val)
		}
		v.Meta.Selective = true
		return nil
	case "precision":
		v.Meta.Precision, err = ParseDType(val)
		if err == nil && !v.Meta.Precision.IsFloat() {
			err = fmt.Errorf("precision must be a float dtype, got %q", val)
		}
		return err
	}
	spec, ok := info.Spec(key)
	if !ok {
		return fmt.Errorf("op %s has no attribute %q", info.Name, key)
	}
	if _, dup := v.Attrs[key]; dup {
		return fmt.Errorf("attribute %s given twice", key)
	}
	a, err := parseAttr(spec.Kind, val)
	if err != nil {
		return fmt.Errorf("attribute %s: %w", key, err)
	}
	if v.Attrs == nil {
		v.Attrs = Attrs{}
	}
	v.Attrs[key] = a
	return nil
}

func metaInt(key, val string) (int, error) {
	n, err := strconv.Atoi(val)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s must be a non-negative integer, got %q", key, val)
	}
	return n, nil
}

func parseAttr(k AttrKind, val string) (any, error) {
	switch k {
	case AttrInt:
		return strconv.Atoi(val)
	case AttrFloat:
		return strconv.ParseFloat(val, 64)
	case AttrBool:
		return strconv.ParseBool(val)
	case AttrString:
		return strconv.Unquote(val)
	case AttrInts:
		if !strings.HasPrefix(val, "[") || !strings.HasSuffix(val, "]") {
			return nil, fmt.Errorf("want [ints], got %q", val)
		}
		out := []int{}
		if body := val[1 : len(val)-1]; body != "" {
			for _, f := range strings.Split(body, ",") {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("bad int %q in list", f)
				}
				out = append(out, n)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown attribute kind %v", k)
}

func (p *parser) output(s string) error {
	name, rest, ok := strings.Cut(s, " = ")
	if q, err := strconv.QuotedPrefix(s); err == nil {
		// The quoted name may itself contain " = ".
		name = q
		rest, ok = strings.CutPrefix(s[len(q):], " = ")
	}
	if !ok {
		return fmt.Errorf(`want output "name" = %%N`)
	}
	n, err := strconv.Unquote(name)
	if err != nil {
		return fmt.Errorf("bad output name %s", name)
	}
	v, err := p.lookup(rest)
	if err != nil {
		return err
	}
	p.m.Outputs = append(p.m.Outputs, Output{Name: n, Value: v})
	return nil
}

func (p *parser) update(s string) error {
	lhs, rhs, ok := strings.Cut(s, " = ")
	if !ok {
		return fmt.Errorf("want update %%STATE = %%VALUE")
	}
	st, err := p.lookup(lhs)
	if err != nil {
		return err
	}
	v, err := p.lookup(rhs)
	if err != nil {
		return err
	}
	p.m.Updates = append(p.m.Updates, Update{State: st, Value: v})
	return nil
}
