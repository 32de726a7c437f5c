package dl

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrSymbol is wrapped by errors that report a symbol missing from a library.
var ErrSymbol = errors.New("symbol not found")

// Lib is an opened shared library.
type Lib struct {
	Spec   Spec
	Path   string // the file (or soname, for the dynamic loader) that was opened
	From   string // where it was found, as in Candidate.From
	handle uintptr
}

// dlopen resolves every symbol now (a missing dependency is reported at open,
// not at the first call) and keeps the library's symbols to itself, so two
// libraries exporting the same name do not interfere.
func dlopen(path string) (uintptr, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return 0, fmt.Errorf("dlopen: %w", err)
	}
	return h, nil
}

// OpenFile opens the library at path, described by name in messages. It is
// for libraries that are not searched for, such as test stand-ins.
func OpenFile(name, path string) (*Lib, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("cuda/dl: open %s: %w", name, err)
	}
	h, err := dlopen(abs)
	if err != nil {
		return nil, fmt.Errorf("cuda/dl: open %s at %s: %w", name, abs, err)
	}
	return &Lib{Spec: Spec{Name: name}, Path: abs, From: "file", handle: h}, nil
}

// Lookup returns the address of symbol.
func (l *Lib) Lookup(symbol string) (uintptr, error) {
	if l == nil || l.handle == 0 {
		return 0, fmt.Errorf("cuda/dl: lookup %q: library is not open", symbol)
	}
	addr, err := purego.Dlsym(l.handle, symbol)
	if err != nil || addr == 0 {
		return 0, fmt.Errorf("cuda/dl: %s (%s) has no symbol %q: %w", l.Spec.Name, l.Path, symbol, ErrSymbol)
	}
	return addr, nil
}

// Has reports whether the library exports symbol.
func (l *Lib) Has(symbol string) bool {
	_, err := l.Lookup(symbol)
	return err == nil
}

// Bind sets *fnptr (a pointer to a Go func variable whose signature mirrors
// the C prototype) to call symbol. A missing symbol is an error naming it and
// the library; nothing is bound then.
func (l *Lib) Bind(fnptr any, symbol string) error {
	if err := checkFuncPtr(fnptr); err != nil {
		return fmt.Errorf("cuda/dl: bind %q: %w", symbol, err)
	}
	addr, err := l.Lookup(symbol)
	if err != nil {
		return err
	}
	return register(fnptr, addr, symbol)
}

// BindFirst binds the first of symbols the library exports and returns its
// name. It serves versioned entry points (cuEventElapsedTime_v2 in new
// drivers, cuEventElapsedTime in old ones).
func (l *Lib) BindFirst(fnptr any, symbols ...string) (string, error) {
	if len(symbols) == 0 {
		return "", errors.New("cuda/dl: BindFirst: no symbols given")
	}
	if err := checkFuncPtr(fnptr); err != nil {
		return "", fmt.Errorf("cuda/dl: bind %q: %w", symbols[0], err)
	}
	for _, s := range symbols {
		addr, err := l.Lookup(s)
		if err != nil {
			continue
		}
		return s, register(fnptr, addr, s)
	}
	return "", fmt.Errorf("cuda/dl: %s (%s) has none of the symbols %q: %w", l.Spec.Name, l.Path, symbols, ErrSymbol)
}

// Close releases the library. Functions bound from it must not be called
// afterwards.
func (l *Lib) Close() error {
	if l == nil || l.handle == 0 {
		return nil
	}
	h := l.handle
	l.handle = 0
	if err := purego.Dlclose(h); err != nil {
		return fmt.Errorf("cuda/dl: close %s: %w", l.Spec.Name, err)
	}
	return nil
}

func checkFuncPtr(fnptr any) error {
	v := reflect.ValueOf(fnptr)
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Func {
		return fmt.Errorf("want a non-nil pointer to a func variable, got %T", fnptr)
	}
	return nil
}

// register wraps purego.RegisterFunc, which panics on signatures it cannot
// marshal, so that such a mistake surfaces as an error naming the symbol.
func register(fnptr any, addr uintptr, symbol string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda/dl: bind %q as %T: %v", symbol, fnptr, r)
		}
	}()
	purego.RegisterFunc(fnptr, addr)
	return nil
}

// Symbol is one row of a binding table for [Lib.BindAll].
type Symbol struct {
	Fn       any      // pointer to the func variable to set
	Names    []string // tried in order; the first exported one is bound
	Optional bool     // a missing optional symbol leaves Fn nil and is not an error
}

// Sym is a required symbol.
func Sym(fn any, name string) Symbol { return Symbol{Fn: fn, Names: []string{name}} }

// Optional is a symbol that only some library versions export.
func Optional(fn any, name string) Symbol {
	return Symbol{Fn: fn, Names: []string{name}, Optional: true}
}

// FirstOf is a required symbol known under several names, newest first.
func FirstOf(fn any, names ...string) Symbol { return Symbol{Fn: fn, Names: names} }

// BindAll binds every row of table and reports all missing required symbols
// in one error, so a library that is too old is diagnosed at once rather
// than one symbol per run.
func (l *Lib) BindAll(table []Symbol) error {
	var errs []error
	for _, s := range table {
		if len(s.Names) == 0 {
			errs = append(errs, errors.New("cuda/dl: binding table row without a symbol name"))
			continue
		}
		_, err := l.BindFirst(s.Fn, s.Names...)
		if err != nil && s.Optional && errors.Is(err, ErrSymbol) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// GoString copies the NUL-terminated C string at p. A nil p gives "".
func GoString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// CString returns s as a NUL-terminated byte slice for C functions that keep
// no reference to it past the call.
func CString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}
