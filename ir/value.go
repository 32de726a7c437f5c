package ir

import (
	"fmt"
	"slices"
	"strconv"
)

// Pos is a position in the user's model source. Passes copy it onto every
// value they derive, so diagnostics always point at the user's line.
type Pos struct {
	File string
	Line int
}

// IsKnown reports whether the position was recorded.
func (p Pos) IsKnown() bool { return p.File != "" }

func (p Pos) String() string {
	if !p.IsKnown() {
		return "?"
	}
	return p.File + ":" + strconv.Itoa(p.Line)
}

// Phase says which part of a training step a value belongs to.
type Phase uint8

// The phases of a step. Recompute marks forward ops replayed in backward.
const (
	PhaseNone Phase = iota
	PhaseFwd
	PhaseBwd
	PhaseOpt
	PhaseRecompute
)

var phaseNames = [...]string{PhaseNone: "", PhaseFwd: "fwd", PhaseBwd: "bwd", PhaseOpt: "opt", PhaseRecompute: "recompute"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// ParsePhase reads a phase name.
func ParsePhase(s string) (Phase, error) {
	for i, n := range phaseNames {
		if n == s && i != 0 {
			return Phase(i), nil
		}
	}
	return PhaseNone, fmt.Errorf("unknown phase %q (want fwd, bwd, opt or recompute)", s)
}

// Meta is what passes need to cut and schedule the graph. Layer, Stage,
// Chunk and Micro are -1 when not assigned.
type Meta struct {
	Layer int
	Phase Phase
	Stage int
	Chunk int
	// Micro is the microbatch a per-microbatch value belongs to; per-step
	// values (params, optimizer, accumulated gradients) have -1.
	Micro int
	// Selective marks a forward value the model allows selective
	// recompute to drop and replay (the attention core of a transformer).
	Selective bool
	// Precision, when set, is the dtype the model wants the op computed
	// in whatever the precision plan (F32: keep it out of fp16/bf16).
	Precision DType
}

// NoMeta is the metadata of a value nobody has annotated.
var NoMeta = Meta{Layer: -1, Stage: -1, Chunk: -1, Micro: -1}

// Attrs are an op's static attributes. Values have the Go type given by the
// op's schema: int, []int, float64, string or bool.
type Attrs map[string]any

// Int returns an int attribute, or def when absent.
func (a Attrs) Int(name string, def int) int {
	if v, ok := a[name].(int); ok {
		return v
	}
	return def
}

// Ints returns an []int attribute (nil when absent).
func (a Attrs) Ints(name string) []int {
	v, _ := a[name].([]int)
	return v
}

// Float returns a float64 attribute, or def when absent.
func (a Attrs) Float(name string, def float64) float64 {
	if v, ok := a[name].(float64); ok {
		return v
	}
	return def
}

// Str returns a string attribute, or "" when absent.
func (a Attrs) Str(name string) string {
	v, _ := a[name].(string)
	return v
}

// Bool returns a bool attribute, or false when absent.
func (a Attrs) Bool(name string) bool {
	v, _ := a[name].(bool)
	return v
}

// Clone copies the map and any slices in it.
func (a Attrs) Clone() Attrs {
	if a == nil {
		return nil
	}
	c := make(Attrs, len(a))
	for k, v := range a {
		if s, ok := v.([]int); ok {
			v = slices.Clone(s)
		}
		c[k] = v
	}
	return c
}

// Value is one SSA value: the result of Op applied to Args.
type Value struct {
	ID    int
	Op    string
	Args  []*Value
	Type  Type
	Attrs Attrs
	Place []Placement // one per mesh axis; nil when unplaced
	Meta  Meta
	Pos   Pos
	// Read is the .gir line the value was parsed from (unknown for a
	// value built from the DSL or added by a pass): an edited dump's
	// diagnostics name the line to fix as well as the model's.
	Read Pos
}

// Name is the name attribute of a source value (param, state, input).
func (v *Value) Name() string { return v.Attrs.Str("name") }

// Ref is how other lines refer to the value: %ID.
func (v *Value) Ref() string { return "%" + strconv.Itoa(v.ID) }

// Where is the prefix of every diagnostic about v: "%17 matmul
// @model.go:41", and "(04-autodiff.gir:88)" after it for a value read
// from a dump.
func (v *Value) Where() string {
	w := v.Ref() + " " + v.Op + " @" + v.Pos.String()
	if v.Read.IsKnown() {
		w += " (" + v.Read.String() + ")"
	}
	return w
}
