package ir

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// FusedOp is the op that stands for a group of elementwise ops the fuse
// pass merged: its args are the group's external inputs and its "body"
// attribute is the group as a tiny SSA program over them (see
// [FusedBody]). The type rule parses and checks the body, so a .gir file
// with a broken body is refused when it is read.
const FusedOp = "fused"

// FusedRef names an operand inside a fused body: Arg i is the fused op's
// i-th argument (written aI), otherwise temp i, the result of the body's
// i-th step (written tI).
type FusedRef struct {
	Arg   bool
	Index int
}

func (r FusedRef) String() string {
	if r.Arg {
		return "a" + strconv.Itoa(r.Index)
	}
	return "t" + strconv.Itoa(r.Index)
}

// FusedStep is one elementwise op of a fused body. Attrs holds the op's
// float attributes (beta1 of adam_m, …); elementwise ops have no others.
type FusedStep struct {
	Op    string
	Args  []FusedRef
	Attrs Attrs
}

// FusedBody is a fused op's program: step i defines temp ti from the
// op's args and earlier temps; the last temp is the result. Its text is
// the steps joined by "; ", each "tI=OP REF… [NAME=FLOAT…]", e.g.
//
//	t0=add a0 a1; t1=gelu t0; t2=mul t1 a2
type FusedBody []FusedStep

// String is the body's text form; ParseFusedBody reads it back exactly.
func (b FusedBody) String() string {
	var s strings.Builder
	for i, st := range b {
		if i > 0 {
			s.WriteString("; ")
		}
		fmt.Fprintf(&s, "t%d=%s", i, st.Op)
		for _, r := range st.Args {
			s.WriteString(" " + r.String())
		}
		names := make([]string, 0, len(st.Attrs))
		for n := range st.Attrs {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			s.WriteString(" " + n + "=" + formatAttr(st.Attrs[n]))
		}
	}
	return s.String()
}

// ParseFusedBody reads a body over nargs arguments and checks it: every
// op known and elementwise (and not itself fused), arities as the op
// table says, attributes as the op's schema says, references only to
// existing args and earlier temps, every arg and every temp but the last
// read at least once.
func ParseFusedBody(text string, nargs int) (FusedBody, error) {
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("fused body is empty")
	}
	var body FusedBody
	argRead := make([]bool, nargs)
	var tempRead []bool
	for i, stmt := range strings.Split(text, ";") {
		fields := strings.Fields(stmt)
		if len(fields) == 0 {
			return nil, fmt.Errorf("fused body step %d is empty", i)
		}
		lhs, op, found := strings.Cut(fields[0], "=")
		if !found || lhs != "t"+strconv.Itoa(i) {
			return nil, fmt.Errorf("fused body step %d: %q must start with t%d=OP", i, strings.TrimSpace(stmt), i)
		}
		info, ok := Lookup(op)
		if !ok {
			return nil, fmt.Errorf("fused body step t%d: unknown op %q", i, op)
		}
		if !info.Elementwise || op == FusedOp {
			return nil, fmt.Errorf("fused body step t%d: %s is not an elementwise op that can be fused", i, op)
		}
		st := FusedStep{Op: op}
		for _, f := range fields[1:] {
			if name, val, isAttr := strings.Cut(f, "="); isAttr {
				spec, ok := info.Spec(name)
				if !ok || spec.Kind != AttrFloat {
					return nil, fmt.Errorf("fused body step t%d: %s has no float attribute %q", i, op, name)
				}
				x, err := strconv.ParseFloat(val, 64)
				if err != nil {
					return nil, fmt.Errorf("fused body step t%d: attribute %s: %w", i, name, err)
				}
				if st.Attrs == nil {
					st.Attrs = Attrs{}
				}
				if _, dup := st.Attrs[name]; dup {
					return nil, fmt.Errorf("fused body step t%d: attribute %s given twice", i, name)
				}
				st.Attrs[name] = x
				continue
			}
			if len(st.Attrs) > 0 {
				return nil, fmt.Errorf("fused body step t%d: operand %q after the attributes", i, f)
			}
			r, err := parseFusedRef(f)
			if err != nil {
				return nil, fmt.Errorf("fused body step t%d: %w", i, err)
			}
			switch {
			case r.Arg && r.Index >= nargs:
				return nil, fmt.Errorf("fused body step t%d reads %v but the op has %d args", i, r, nargs)
			case !r.Arg && r.Index >= i:
				return nil, fmt.Errorf("fused body step t%d reads %v, which is not defined before it", i, r)
			case r.Arg:
				argRead[r.Index] = true
			default:
				tempRead[r.Index] = true
			}
			st.Args = append(st.Args, r)
		}
		if len(st.Args) != info.Arity {
			return nil, fmt.Errorf("fused body step t%d: %s takes %d operands, got %d", i, op, info.Arity, len(st.Args))
		}
		for _, s := range info.Attrs {
			if _, ok := st.Attrs[s.Name]; s.Required && !ok {
				return nil, fmt.Errorf("fused body step t%d: %s needs attribute %s", i, op, s.Name)
			}
		}
		body = append(body, st)
		tempRead = append(tempRead, false)
	}
	if i := slices.Index(argRead, false); i >= 0 {
		return nil, fmt.Errorf("fused body never reads a%d", i)
	}
	if i := slices.Index(tempRead[:len(tempRead)-1], false); i >= 0 {
		return nil, fmt.Errorf("fused body computes t%d but never reads it (only the last temp is the result)", i)
	}
	return body, nil
}

func parseFusedRef(s string) (FusedRef, error) {
	if len(s) < 2 || (s[0] != 'a' && s[0] != 't') {
		return FusedRef{}, fmt.Errorf("operand %q: want aN (an arg) or tN (a temp)", s)
	}
	n, err := strconv.Atoi(s[1:])
	if err != nil || n < 0 || strconv.Itoa(n) != s[1:] {
		return FusedRef{}, fmt.Errorf("operand %q: want aN (an arg) or tN (a temp)", s)
	}
	return FusedRef{Arg: s[0] == 'a', Index: n}, nil
}

// inferFused is the fused op's type rule: args of one float type, and a
// body that parses and checks over them. Every op a body may hold maps
// equal types to that type, so the result has it too.
func inferFused(args []Type, a Attrs) (Type, error) {
	t, err := sameTypes(true)(args, a)
	if err != nil {
		return Type{}, err
	}
	if _, err := ParseFusedBody(a.Str("body"), len(args)); err != nil {
		return Type{}, err
	}
	return t, nil
}
