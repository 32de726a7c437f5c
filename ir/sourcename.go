package ir

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// BadName says whether name cannot name a param, state or input: empty,
// or holding a space, a control character, a quote or invalid UTF-8
// (weights files, checkpoints and dumps name them by it).
func BadName(name string) bool {
	return name == "" || strings.IndexFunc(name, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == '"' || r == utf8.RuneError
	}) >= 0
}

// CheckParamName is the rule for a param's name, checked where a model
// is built (the DSL, a .gir) so that a run never ends in a save that
// cannot write it: a name BadName accepts, other than safetensors'
// reserved "__metadata__".
func CheckParamName(name string) error {
	switch {
	case name == "":
		return errors.New("a param needs a name: weights are saved and loaded under it")
	case BadName(name):
		return fmt.Errorf("param name %q: want printable UTF-8 without spaces or quotes (weights files and dumps name params by it)", name)
	case name == "__metadata__":
		return fmt.Errorf("param name %q is reserved: a safetensors file keeps its metadata under it, so the weights could not be saved", name)
	}
	return nil
}
