package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gcompile/ir"
	"gcompile/passes"
	"gcompile/passes/dump"
	"gcompile/runtime"
)

// dumper writes --dump output. A nil dumper (no --dump) does nothing, so
// the pipeline pays nothing for dumps it was not asked for.
type dumper struct {
	dir  string
	cols []dump.Column
	n    int
	err  error
}

func newDumper(dir string) *dumper {
	if dir == "" {
		return nil
	}
	return &dumper{dir: dir}
}

func (d *dumper) hooks() passes.Hooks {
	if d == nil {
		return passes.Hooks{}
	}
	return passes.Hooks{
		Before: func(m *ir.Module) {
			// The old dump goes only now, once the model has loaded: a
			// model that fails to build leaves the last good dump alone.
			if err := os.MkdirAll(d.dir, 0o755); err != nil {
				d.err = err
			} else {
				d.err = clearDump(d.dir)
			}
			text := ir.Print(m)
			d.cols = append(d.cols, dump.Column{Pass: "input", Changed: true, Text: text})
			d.write("00-input.gir", text)
		},
		After: func(r passes.Result, m *ir.Module) {
			d.n++
			col := dump.Column{Pass: r.Name, Changed: r.Changed, Millis: r.Ms, Note: r.Note}
			if r.Changed {
				col.Text = ir.Print(m)
				// A failed pass's module is half done: finish writes it
				// as NN-<pass>.failed.gir, never as a dump to resume.
				if !r.Failed {
					d.write(fmt.Sprintf("%02d-%s.gir", d.n, r.Name), col.Text)
				}
			}
			d.cols = append(d.cols, col)
		},
	}
}

// write writes one file of the dump whole or not at all: a full disk
// leaves no .gir cut mid-line, which would fail to resume, or an
// index.html naming files that are not there.
func (d *dumper) write(name, text string) {
	if d.err == nil {
		d.err = runtime.ReplaceFile(filepath.Join(d.dir, name), []byte(text))
	}
}

// finish writes index.html. After a failing pass the module as that pass
// left it is also written as NN-<pass>.failed.gir: the dump users need most.
func (d *dumper) finish(m *ir.Module, passErr error) error {
	if d == nil {
		return nil
	}
	if passErr != nil && len(d.cols) > 0 {
		// Only a pass's own failure: one after the passes (the memory
		// plan, a signal during the lowering) is not the last pass's,
		// whose module is already written as it left it.
		if last := d.cols[len(d.cols)-1]; strings.Contains(passErr.Error(), fmt.Sprintf("pass %q", last.Pass)) {
			d.write(fmt.Sprintf("%02d-%s.failed.gir", d.n, last.Pass), ir.Print(m))
		}
	}
	var buf bytes.Buffer
	if err := dump.WriteHTML(&buf, "gcompile: "+m.Name, d.cols); err != nil {
		return err
	}
	d.write("index.html", buf.String())
	if d.err != nil {
		return fmt.Errorf("--dump %s: %w", d.dir, d.err)
	}
	return nil
}

// clearDump removes what an earlier dump left in dir before this one is
// written: a pass that changed the module then but not now would leave
// its NN-<pass>.gir beside this run's, where it reads as this run's and
// resumes a different compile. Only the names a dump writes go (NN-*.gir,
// index.html, schedule.txt, and only regular files): the folder may hold
// the user's own files.
func clearDump(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() && isDumpFile(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// foreignDumpFile names the first file of dir that has a name a dump
// writes (and so replaces) but is not a dump's by its first bytes: an
// index.html that is not a dump page, a NN-*.gir that is not IR text, a
// schedule.txt that is not a schedule. "" when there is none.
func foreignDumpFile(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !isDumpFile(e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return e.Name()
		}
		head := make([]byte, 512)
		n, _ := io.ReadFull(f, head)
		f.Close()
		text := string(head[:n])
		ours := false
		switch e.Name() {
		case "index.html":
			ours = strings.Contains(text, "<title>gcompile: ")
		case "schedule.txt":
			ours = strings.HasPrefix(text, "schedule ")
		default:
			ours = strings.HasPrefix(text, "gir ")
		}
		if !ours {
			return e.Name()
		}
	}
	return ""
}

// isDumpFile reports whether name is one a dump writes: NN-<pass>.gir
// (two or more digits, NN-<pass>.failed.gir included), index.html or
// schedule.txt.
func isDumpFile(name string) bool {
	if name == "index.html" || name == "schedule.txt" {
		return true
	}
	digits := 0
	for digits < len(name) && name[digits] >= '0' && name[digits] <= '9' {
		digits++
	}
	rest := name[digits:]
	return digits >= 2 && len(rest) > len("-.gir") && rest[0] == '-' && strings.HasSuffix(rest, ".gir")
}
