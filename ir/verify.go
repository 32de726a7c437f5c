package ir

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// VerifyError is one broken rule. Its text starts with where it is:
// `after pass "shard": %17 matmul @model.go:41: …`.
type VerifyError struct {
	Pass  string // the pass after which the module was checked ("" for input)
	Value *Value // nil for module-level errors
	Rule  string // short rule name, e.g. "ssa-order"; tests match on it
	Msg   string
}

func (e *VerifyError) Error() string {
	var b strings.Builder
	if e.Pass != "" {
		fmt.Fprintf(&b, "after pass %q: ", e.Pass)
	}
	if e.Value != nil {
		b.WriteString(e.Value.Where() + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// The rules Verify checks, named in VerifyError.Rule.
const (
	RuleDuplicateID = "duplicate-id"
	RuleSSAOrder    = "ssa-order"
	RuleUnknownOp   = "unknown-op"
	RuleOpRule      = "op-rule" // arity, attributes, type and shape rule of the op
	RuleTypeMatch   = "type-mismatch"
	RuleSourceName  = "source-name"
	RulePlacement   = "placement"
	RuleOutput      = "output"
	RuleUpdate      = "update"
	RuleNextID      = "next-id"
	RuleCollective  = "collective"
)

// maxVerifyErrors bounds the report: the first errors are the useful ones.
const maxVerifyErrors = 10

// Verify checks m and returns nil or an error joining up to ten
// *VerifyError values. pass names the pass that produced m.
func Verify(m *Module, pass string) error {
	var errs []error
	fail := func(v *Value, rule, format string, args ...any) {
		if len(errs) < maxVerifyErrors {
			errs = append(errs, &VerifyError{Pass: pass, Value: v, Rule: rule, Msg: fmt.Sprintf(format, args...)})
		}
	}
	defined := make(map[*Value]bool, len(m.Values))
	// bad are the values whose own rule failed: the ops that read them
	// are not checked, since their errors would follow from that one (a
	// .gir's wrong declared type failed every op after it too).
	bad := map[*Value]bool{}
	ids := make(map[int]bool, len(m.Values))
	names := map[string]*Value{}
	for _, v := range m.Values {
		if ids[v.ID] {
			fail(v, RuleDuplicateID, "id %d is used by two values", v.ID)
		}
		ids[v.ID] = true
		if v.ID >= m.nextID {
			fail(v, RuleNextID, "id %d is not below the module's next id %d", v.ID, m.nextID)
		}
		for i, a := range v.Args {
			if a == nil || !defined[a] {
				fail(v, RuleSSAOrder, "arg %d (%s) is not defined before its use", i, ref(a))
			}
		}
		defined[v] = true
		info, ok := Lookup(v.Op)
		if !ok {
			fail(v, RuleUnknownOp, "unknown op %q", v.Op)
			bad[v] = true
			continue
		}
		if info.Source {
			if len(v.Args) > 0 {
				fail(v, RuleOpRule, "source op %s takes no args, got %d", v.Op, len(v.Args))
			}
			if err := CheckType(v.Type); err != nil {
				fail(v, RuleOpRule, "%v", err)
			}
			if err := checkAttrs(info, v.Attrs); err != nil {
				fail(v, RuleOpRule, "%v", err)
			}
			if v.Op == "const" {
				if _, err := ConstData(v); err != nil {
					fail(v, RuleOpRule, "%v", err)
				}
			}
			if v.Op == "param" {
				if _, _, err := ParamSaveEach(v); err != nil {
					fail(v, RuleOpRule, "%v", err)
				}
			}
			if v.Op != "const" || v.Name() != "" {
				if prev := names[v.Name()]; prev != nil {
					fail(v, RuleSourceName, "name %q is already used by %s", v.Name(), prev.Where())
				}
				names[v.Name()] = v
			}
		} else if hasNil(v.Args) {
			continue // reported above
		} else if slices.ContainsFunc(v.Args, func(a *Value) bool { return bad[a] }) {
			bad[v] = true
		} else if t, err := InferType(info, v.Args, v.Attrs); err != nil {
			fail(v, RuleOpRule, "%v", err)
			bad[v] = true
		} else if !t.Equal(v.Type) {
			fail(v, RuleTypeMatch, "declared type %v but the %s rule gives %v", v.Type, v.Op, t)
			bad[v] = true
		}
		if checkPlacement(m, v, fail) && !bad[v] && !info.Source {
			checkLocalShapes(m, v, info, fail)
		}
	}
	outNames := map[string]bool{}
	for _, o := range m.Outputs {
		if outNames[o.Name] {
			fail(nil, RuleOutput, "output %q is defined twice", o.Name)
		}
		outNames[o.Name] = true
		if o.Value == nil || !defined[o.Value] {
			fail(nil, RuleOutput, "output %q refers to %s, which is not in the module", o.Name, ref(o.Value))
		}
	}
	updated := map[*Value]bool{}
	for _, u := range m.Updates {
		switch {
		case u.State == nil || !defined[u.State] || u.Value == nil || !defined[u.Value]:
			fail(nil, RuleUpdate, "update %s = %s refers to a value not in the module", ref(u.State), ref(u.Value))
		case u.State.Op != "param" && u.State.Op != "state":
			fail(u.State, RuleUpdate, "only param and state values can be updated")
		case !u.State.Type.Equal(u.Value.Type):
			fail(u.State, RuleUpdate, "updated with %s of type %v, want %v", u.Value.Ref(), u.Value.Type, u.State.Type)
		case updated[u.State]:
			fail(u.State, RuleUpdate, "updated twice in one step")
		}
		updated[u.State] = true
	}
	return errors.Join(errs...)
}

func hasNil(vs []*Value) bool {
	for _, v := range vs {
		if v == nil {
			return true
		}
	}
	return false
}

func checkPlacement(m *Module, v *Value, fail func(*Value, string, string, ...any)) (ok bool) {
	if v.Place == nil {
		if _, _, isColl := collectiveFlow(v); isColl {
			fail(v, RuleCollective, "%s has no placement: a collective changes one, so it needs a mesh and placed values", v.Op)
			return false
		}
		return true // replicated on every axis
	}
	if m.Mesh == nil {
		fail(v, RulePlacement, "placement %v given but the module has no mesh", v.Place)
		return false
	}
	if len(v.Place) != len(m.Mesh.Axes) {
		fail(v, RulePlacement, "placement has %d entries for mesh %v", len(v.Place), m.Mesh)
		return false
	}
	ok = true
	for i, p := range v.Place {
		if p.Kind != Shard {
			continue
		}
		axis := m.Mesh.Axes[i]
		if p.Dim < 0 || p.Dim >= v.Type.Rank() {
			fail(v, RulePlacement, "S(%d) on axis %s: %v has no dim %d", p.Dim, axis.Name, v.Type, p.Dim)
			ok = false
		} else if axis.Size < 1 {
			fail(v, RulePlacement, "S(%d) on axis %s: the axis has size %d", p.Dim, axis.Name, axis.Size)
			ok = false
		} else if parts, fits := MulInt64(int64(axis.Size), int64(p.NumBlocks())); !fits {
			// Wrapped, the product could be 0: a division panic.
			fail(v, RulePlacement, "%v on axis %s: %d parts of %d blocks are more than an int64 holds", p, axis.Name, axis.Size, p.NumBlocks())
			ok = false
		} else if int64(v.Type.Shape[p.Dim])%parts != 0 {
			fail(v, RulePlacement, "%v on axis %s: dim size %d is not divisible by %d", p, axis.Name, v.Type.Shape[p.Dim], parts)
			ok = false
		}
	}
	checkCollective(m, v, fail)
	return ok
}

// localRule names the ops whose type rule holds of the blocks one device
// holds as of the whole values: elementwise ops (not a fused group, whose
// body may broadcast), reductions (their axes are dims either way) and
// matmul. Ops whose attributes give global sizes (reshape, broadcast,
// slice) are not among them.
func localRule(info *OpInfo) bool {
	switch info.Name {
	case "reduce_sum", "reduce_mean", "reduce_max", "matmul":
		return true
	}
	return info.Elementwise && info.Name != FusedOp
}

// checkLocalShapes checks that an op's operands, as the devices hold
// them, make the block its result's placement gives each device: the
// lowering builds each device's program from the placements alone, so an
// edited .gir whose placements disagree along an op (an operand split
// where its result is whole) would reach a kernel with buffers of other
// lengths than it computes.
func checkLocalShapes(m *Module, v *Value, info *OpInfo, fail func(*Value, string, string, ...any)) {
	if m.Mesh == nil || !localRule(info) {
		return
	}
	args := make([]Type, len(v.Args))
	placed := false
	for i, a := range v.Args {
		if a.Place != nil && len(a.Place) != len(m.Mesh.Axes) {
			return // its own placement rule failed
		}
		args[i] = Type{DType: a.Type.DType, Shape: LocalShape(a.Type.Shape, a.Place, m.Mesh)}
		placed = placed || a.Place != nil
	}
	if !placed && v.Place == nil {
		return
	}
	want := LocalShape(v.Type.Shape, v.Place, m.Mesh)
	got, err := info.Infer(args, v.Attrs)
	if err == nil && got.Shape.Equal(want) {
		return
	}
	var held []string
	for _, a := range v.Args {
		held = append(held, fmt.Sprintf("%s %s (a block %v)", ref(a), PlacementString(orReplicated(a.Place, m.Mesh)), LocalShape(a.Type.Shape, a.Place, m.Mesh)))
	}
	why := fmt.Sprintf("they make a block %v", got.Shape)
	if err != nil {
		why = fmt.Sprintf("as blocks they break its rule: %v", err)
	}
	fail(v, RulePlacement, "placed %s, each device holds a block %v, but its operands are %s: %s (placements edited along the op?)",
		PlacementString(orReplicated(v.Place, m.Mesh)), want, strings.Join(held, ", "), why)
}

func orReplicated(place []Placement, m *Mesh) []Placement {
	if place == nil {
		return Replicated(m)
	}
	return place
}

// collectiveFlow gives, for a collective, the placement its arg must have
// and the one it produces on its axis.
func collectiveFlow(v *Value) (from, to Placement, ok bool) {
	sh := Placement{Kind: Shard, Dim: v.Attrs.Int("dim", 0), Blocks: v.Attrs.Int("blocks", 0)}
	switch v.Op {
	case "all_reduce":
		return Placement{Kind: Partial}, Placement{}, true
	case "reduce_scatter":
		return Placement{Kind: Partial}, sh, true
	case "all_gather":
		return sh, Placement{}, true
	case "shard_slice":
		return Placement{}, sh, true
	case "all_to_all":
		return Placement{Kind: Shard, Dim: v.Attrs.Int("from", 0)}, Placement{Kind: Shard, Dim: v.Attrs.Int("to", 0)}, true
	}
	return Placement{}, Placement{}, false
}

// checkCollective: a collective changes exactly its axis, from the
// placement its kind consumes to the one it produces.
func checkCollective(m *Module, v *Value, fail func(*Value, string, string, ...any)) {
	from, to, ok := collectiveFlow(v)
	if !ok || len(v.Args) != 1 || v.Args[0] == nil {
		return
	}
	axis := m.Mesh.Axis(v.Attrs.Str("axis"))
	if axis < 0 {
		fail(v, RuleCollective, "axis %q is not in mesh %v", v.Attrs.Str("axis"), m.Mesh)
		return
	}
	in := v.Args[0].Place
	if len(in) != len(v.Place) {
		fail(v, RuleCollective, "%s of %s, which is placed %v, into %v: both must be placed on every mesh axis", v.Op, v.Args[0].Ref(), in, v.Place)
		return
	}
	for i := range in {
		switch {
		case i == axis && (!in[i].Equal(from) || !v.Place[i].Equal(to)):
			fail(v, RuleCollective, "%s on axis %s turns %v into %v, but the arg is %v and the result %v%s", v.Op, m.Mesh.Axes[i].Name, from, to, in[i], v.Place[i], blocksHint(from, to, in[i], v.Place[i]))
		case i != axis && !in[i].Equal(v.Place[i]):
			fail(v, RuleCollective, "%s on axis %s must leave axis %s as it is (%v), got %v", v.Op, m.Mesh.Axes[axis].Name, m.Mesh.Axes[i].Name, in[i], v.Place[i])
		}
	}
}

// blocksHint explains a collective whose placements differ from what it
// converts only in the number of fused blocks: the blocks attribute is
// what is wrong, and moving such a split as a plain one would mix blocks.
func blocksHint(from, to, in, out Placement) string {
	for _, p := range [][2]Placement{{from, in}, {to, out}} {
		want, got := p[0], p[1]
		if want.Kind == Shard && got.Kind == Shard && want.Dim == got.Dim && want.NumBlocks() != got.NumBlocks() {
			return fmt.Sprintf(": its blocks attribute must be %d, as in %v", got.NumBlocks(), got)
		}
	}
	return ""
}
