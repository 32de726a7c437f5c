package ir

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Output is a named result of the step: the loss, a gradient, a metric.
type Output struct {
	Name  string
	Value *Value
}

// Update says that after a step the source value State (a param or state)
// takes the value Value.
type Update struct {
	State *Value
	Value *Value
}

// Module is one training step as an SSA graph.
type Module struct {
	Name string
	// Passes lists the passes already applied, in order; a dumped module
	// resumes the pipeline after the last of them.
	Passes []string
	Mesh   *Mesh // nil: one device
	// IgnoreOnLoad are the patterns (path.Match syntax) of tensor names a
	// checkpoint may hold that the model has no use for on purpose (GPT-2's
	// causal-mask buffers): loading skips them and refuses any other
	// tensor that matches no param.
	IgnoreOnLoad []string
	// EvalDiffers says the model's shapes depend on whether it is built
	// for evaluation (b.Evaluating in the DSL: a MoE layer's evaluation
	// capacity), so the compiler builds and lowers an evaluation module
	// of its own.
	EvalDiffers bool
	// ExportConfig is a JSON object: the model's configuration as another
	// framework reads it beside the weights (Hugging Face's config.json,
	// b.ExportConfig), which export writes. It describes the maths rather
	// than being part of it, so the fingerprint leaves it out.
	ExportConfig string
	Values       []*Value
	Outputs      []Output
	Updates      []Update
	nextID       int
}

// NewModule returns an empty module.
func NewModule(name string) *Module { return &Module{Name: name} }

// NextID is the id the next new value will get.
func (m *Module) NextID() int { return m.nextID }

// Add appends a value whose type follows from the op's rule and returns it.
// Sources must use AddSource. The error names the op, the broken rule and
// pos, so a frontend can hand it straight to the user.
func (m *Module) Add(op string, args []*Value, attrs Attrs, meta Meta, pos Pos) (*Value, error) {
	v, err := m.NewValue(op, args, attrs, meta, pos)
	if err != nil {
		return nil, err
	}
	m.Values = append(m.Values, v)
	return v, nil
}

// NewValue is Add without the append: the value gets its type and an id,
// and a pass that inserts values in the middle of the program places it
// in Values itself.
func (m *Module) NewValue(op string, args []*Value, attrs Attrs, meta Meta, pos Pos) (*Value, error) {
	info, ok := Lookup(op)
	if !ok {
		return nil, fmt.Errorf("%v: unknown op %q", pos, op)
	}
	if info.Source {
		return nil, fmt.Errorf("%v: %s is a source op; use AddSource", pos, op)
	}
	t, err := InferType(info, args, attrs)
	if err != nil {
		return nil, fmt.Errorf("%v: %s: %w", pos, op, err)
	}
	// Args are copied: callers reuse their slices.
	v := &Value{ID: m.nextID, Op: op, Args: slices.Clone(args), Type: t, Attrs: attrs, Meta: meta, Pos: pos}
	m.nextID++
	return v, nil
}

// AddSource appends a source value (param, state, input, const) of type t.
func (m *Module) AddSource(op string, t Type, attrs Attrs, meta Meta, pos Pos) (*Value, error) {
	info, ok := Lookup(op)
	if !ok || !info.Source {
		return nil, fmt.Errorf("%v: %q is not a source op", pos, op)
	}
	if err := CheckType(t); err != nil {
		return nil, fmt.Errorf("%v: %s: %w", pos, op, err)
	}
	if err := checkAttrs(info, attrs); err != nil {
		return nil, fmt.Errorf("%v: %s: %w", pos, op, err)
	}
	return m.append(&Value{Op: op, Type: t, Attrs: attrs, Meta: meta, Pos: pos}), nil
}

func (m *Module) append(v *Value) *Value {
	v.ID = m.nextID
	m.nextID++
	m.Values = append(m.Values, v)
	return v
}

// InferType checks args and attrs against the op's arity, schema and type
// rule and returns the result type.
func InferType(info *OpInfo, args []*Value, attrs Attrs) (Type, error) {
	if info.Infer == nil {
		return Type{}, fmt.Errorf("%s is a source op: its type is declared, not inferred", info.Name)
	}
	if info.Arity == Variadic && len(args) == 0 || info.Arity != Variadic && len(args) != info.Arity {
		want := fmt.Sprint(info.Arity)
		if info.Arity == Variadic {
			want = "at least 1"
		}
		return Type{}, fmt.Errorf("takes %s args, got %d", want, len(args))
	}
	if err := checkAttrs(info, attrs); err != nil {
		return Type{}, err
	}
	ts := make([]Type, len(args))
	for i, a := range args {
		if a == nil {
			return Type{}, fmt.Errorf("arg %d is missing", i)
		}
		ts[i] = a.Type
	}
	t, err := info.Infer(ts, attrs)
	if err != nil {
		return Type{}, err
	}
	// Type rules multiply and add dims taken from attributes (broadcast,
	// reshape, repeat, concat), so a result can be too large even when
	// every argument is fine.
	if err := checkDims(t); err != nil {
		return Type{}, err
	}
	return t, nil
}

func checkAttrs(info *OpInfo, a Attrs) error {
	for name, v := range a {
		spec, ok := info.Spec(name)
		if !ok {
			return fmt.Errorf("unknown attribute %q (op %s takes %v)", name, info.Name, attrNames(info))
		}
		if !attrKindOK(spec.Kind, v) {
			return fmt.Errorf("attribute %s must be %v, got %T", name, spec.Kind, v)
		}
	}
	for _, s := range info.Attrs {
		if _, ok := a[s.Name]; s.Required && !ok {
			return fmt.Errorf("missing required attribute %s (%v)", s.Name, s.Kind)
		}
	}
	return nil
}

func attrNames(info *OpInfo) []string {
	var names []string
	for _, s := range info.Attrs {
		names = append(names, s.Name)
	}
	return names
}

func attrKindOK(k AttrKind, v any) bool {
	switch v.(type) {
	case int:
		return k == AttrInt
	case []int:
		return k == AttrInts
	case float64:
		return k == AttrFloat
	case string:
		return k == AttrString
	case bool:
		return k == AttrBool
	}
	return false
}

// Output returns the named output value, or nil.
func (m *Module) Output(name string) *Value {
	for _, o := range m.Outputs {
		if o.Name == name {
			return o.Value
		}
	}
	return nil
}

// SetOutput adds or replaces a named output.
func (m *Module) SetOutput(name string, v *Value) {
	for i := range m.Outputs {
		if m.Outputs[i].Name == name {
			m.Outputs[i].Value = v
			return
		}
	}
	m.Outputs = append(m.Outputs, Output{Name: name, Value: v})
}

// SetOutputs is SetOutput of each of outs in turn, with one index of the
// outputs' names rather than a search of them per output (autodiff sets
// one gradient output per param: quadratic in the params, one search at a
// time).
func (m *Module) SetOutputs(outs []Output) {
	at := make(map[string]int, len(m.Outputs)+len(outs))
	for i, o := range m.Outputs {
		if _, ok := at[o.Name]; !ok {
			at[o.Name] = i // SetOutput replaces the first of a name
		}
	}
	for _, o := range outs {
		if i, ok := at[o.Name]; ok {
			m.Outputs[i].Value = o.Value
			continue
		}
		at[o.Name] = len(m.Outputs)
		m.Outputs = append(m.Outputs, o)
	}
}

// OutputsByName maps each output's name to its value: the first output
// of that name, as Output finds it.
func (m *Module) OutputsByName() map[string]*Value {
	byName := make(map[string]*Value, len(m.Outputs))
	for _, o := range m.Outputs {
		if _, ok := byName[o.Name]; !ok {
			byName[o.Name] = o.Value
		}
	}
	return byName
}

// Microbatched reports whether the microbatch pass split the step: some
// value belongs to a microbatch (Meta.Micro ≥ 0).
func (m *Module) Microbatched() bool {
	return slices.ContainsFunc(m.Values, func(v *Value) bool { return v.Meta.Micro >= 0 })
}

// Params returns the param values in program order.
func (m *Module) Params() []*Value {
	var ps []*Value
	for _, v := range m.Values {
		if v.Op == "param" {
			ps = append(ps, v)
		}
	}
	return ps
}

// Source returns the param, state or input with the given name, or nil.
func (m *Module) Source(name string) *Value {
	for _, v := range m.Values {
		if (v.Op == "param" || v.Op == "state" || v.Op == "input") && v.Name() == name {
			return v
		}
	}
	return nil
}

// Uses maps each value to the values that take it as an argument, each
// reader once, in program order.
//
// Each reader v is visited once, so a v already in uses[a] was appended
// while visiting v's own arguments and is the list's last element:
// comparing with the last element is enough. (A search of the whole list
// made this quadratic in the readers of one value; the learning rate, the
// step and the clipping coefficient are read by every param's update, 12
// per GPT layer.)
func (m *Module) Uses() map[*Value][]*Value {
	uses := make(map[*Value][]*Value, len(m.Values))
	for _, v := range m.Values {
		for _, a := range v.Args {
			if l := uses[a]; len(l) == 0 || l[len(l)-1] != v {
				uses[a] = append(l, v)
			}
		}
	}
	return uses
}

// Live is the set of values some output or update needs, directly or
// through the values computed from them (Values is in dependency order).
func (m *Module) Live() map[*Value]bool {
	live := map[*Value]bool{}
	for _, o := range m.Outputs {
		live[o.Value] = true
	}
	for _, u := range m.Updates {
		live[u.Value] = true
	}
	for _, v := range slices.Backward(m.Values) {
		if live[v] {
			for _, a := range v.Args {
				live[a] = true
			}
		}
	}
	return live
}

// DropDead removes the values no output or update needs (Live), keeping
// the rest in order: a module cut down to some of its outputs.
func (m *Module) DropDead() {
	live := m.Live()
	kept := m.Values[:0]
	for _, v := range m.Values {
		if live[v] {
			kept = append(kept, v)
		}
	}
	clear(m.Values[len(kept):])
	m.Values = kept
}

// Hoist moves each of vs to just after the last of its arguments, keeping
// the order of every other value (Values is in dependency order, and so
// the program order the lowering follows): a value computed as soon as it
// can be frees what it replaces sooner. vs must list a value after those
// of its arguments it also lists; values hoisted behind the same value
// keep the order of vs.
func (m *Module) Hoist(vs ...*Value) {
	moving := make(map[*Value]bool, len(vs))
	for _, v := range vs {
		moving[v] = true
	}
	rest := make([]*Value, 0, len(m.Values))
	at := map[*Value]int{} // index in rest of the value each moved one follows
	for _, v := range m.Values {
		if !moving[v] {
			at[v] = len(rest)
			rest = append(rest, v)
		}
	}
	after := map[int][]*Value{}
	for _, v := range vs {
		anchor := -1
		for _, a := range v.Args {
			anchor = max(anchor, at[a])
		}
		at[v] = anchor
		after[anchor] = append(after[anchor], v)
	}
	m.Values = append(m.Values[:0], after[-1]...)
	for i, v := range rest {
		m.Values = append(m.Values, v)
		m.Values = append(m.Values, after[i]...)
	}
}

// MarkPass records that a pass has run.
func (m *Module) MarkPass(name string) { m.Passes = append(m.Passes, name) }

// HasRun reports whether the named pass has been applied.
func (m *Module) HasRun(name string) bool { return slices.Contains(m.Passes, name) }

// CheckExportConfig says whether text is a module's ExportConfig: a JSON
// object.
func CheckExportConfig(text string) error {
	var obj map[string]any
	if err := json.Unmarshal([]byte(text), &obj); err != nil || obj == nil {
		return fmt.Errorf("export-config %.40q: want a JSON object", text)
	}
	return nil
}
