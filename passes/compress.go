package passes

import (
	"fmt"

	"gcompile/ir"
)

// compress stashes activations for the backward in less memory (Gist,
// Jain et al. 2018, "delayed precision reduction"): with "lowp", every fp32
// forward value the backward reads is kept as a bf16 copy made right after
// it is computed and widened back to fp32 just before its first backward
// use. The forward itself runs at full precision (its own uses read the
// original, which now dies with the forward); only the backward sees the
// rounded copy, so the result is close to, not equal to, fp32 training.
// The lossless 1-bit ReLU mask ("relu") is not built yet.
func compress(m *ir.Module, o *Options) error {
	switch o.Compress {
	case "", "none":
		return nil
	case "lowp":
	case "relu":
		return fmt.Errorf("--compress-activations relu (1-bit ReLU masks) is %w", ErrNotYet)
	default:
		return fmt.Errorf("--compress-activations %q: want lowp or relu", o.Compress)
	}
	uses := m.Uses()
	pos := make(map[*ir.Value]int, len(m.Values))
	for i, v := range m.Values {
		pos[v] = i
	}
	after := map[*ir.Value][]*ir.Value{}
	before := map[*ir.Value][]*ir.Value{}
	widened := map[*ir.Value]*ir.Value{}
	for _, v := range m.Values {
		if v.Meta.Phase != ir.PhaseFwd || v.Type.DType != ir.F32 || v.Type.Rank() < 2 {
			continue
		}
		if info, _ := ir.Lookup(v.Op); info.Source {
			continue
		}
		var first *ir.Value
		for _, u := range uses[v] {
			if u.Meta.Phase == ir.PhaseBwd && (first == nil || pos[u] < pos[first]) {
				first = u
			}
		}
		if first == nil {
			continue
		}
		narrow, err := m.NewValue("cast", []*ir.Value{v}, ir.Attrs{"to": "bf16"}, v.Meta, v.Pos)
		if err != nil {
			return err
		}
		wide, err := m.NewValue("cast", []*ir.Value{narrow}, ir.Attrs{"to": "f32"}, first.Meta, v.Pos)
		if err != nil {
			return err
		}
		after[v] = append(after[v], narrow)
		before[first] = append(before[first], wide)
		widened[v] = wide
	}
	redirectBackward(m.Values, widened)
	m.Values = splice(m.Values, before, after)
	return nil
}
