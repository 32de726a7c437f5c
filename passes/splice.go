package passes

import "gcompile/ir"

// splice returns values with before[v] inserted ahead of each v and
// after[v] behind it; inserted values may have insertions of their own.
// Passes that place new values next to existing ones (collectives,
// replays, compressed copies) build these lists instead of shifting
// Values at every insertion.
func splice(values []*ir.Value, before, after map[*ir.Value][]*ir.Value) []*ir.Value {
	out := make([]*ir.Value, 0, len(values))
	var emit func(v *ir.Value)
	emit = func(v *ir.Value) {
		for _, b := range before[v] {
			emit(b)
		}
		out = append(out, v)
		for _, a := range after[v] {
			emit(a)
		}
	}
	for _, v := range values {
		emit(v)
	}
	return out
}

// redirectBackward makes the backward values on a's pipeline chunk read
// to[a] wherever they read a (a replayed copy instead of the forward
// original).
func redirectBackward(values []*ir.Value, to map[*ir.Value]*ir.Value) {
	for _, v := range values {
		if v.Meta.Phase != ir.PhaseBwd {
			continue
		}
		for i, a := range v.Args {
			if c := to[a]; c != nil && a.Meta.Stage == v.Meta.Stage {
				v.Args[i] = c
			}
		}
	}
}
