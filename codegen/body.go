package codegen

import (
	"fmt"

	"gcompile/ir"
)

// checkRefs reports an operand of step i that names an arg past nargs or
// a temp not yet computed. ir.ParseFusedBody refuses such bodies already;
// both generators check again because a body may also be built in Go.
func checkRefs(i int, st ir.FusedStep, nargs int) error {
	for _, r := range st.Args {
		if r.Arg && r.Index >= nargs || !r.Arg && r.Index >= i {
			return fmt.Errorf("fused body step t%d reads %v, which does not exist", i, r)
		}
	}
	return nil
}

// floatAttr is a step's float attribute, as the op's kernel takes it.
func floatAttr(st ir.FusedStep, name string) (float64, error) {
	v, ok := st.Attrs[name].(float64)
	if !ok {
		return 0, fmt.Errorf("%s needs float attribute %s", st.Op, name)
	}
	return v, nil
}
