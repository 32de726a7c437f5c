package planner

import (
	"fmt"

	"gcompile/cost"
	"gcompile/ir"
)

// ShapeOf reads the transformer shape the analytic estimate needs from a
// module as the frontend built it (before any pass): the sequence length
// from the tokens input, vocabulary and width from the table the
// embedding op reads, layers from the layer tags, heads from the
// attention core (the fused op's q, or a 4-D softmax), the MLP width from
// layer 0's widest weight. A model that is no decoder of this kind is
// refused: the estimate would be meaningless for it.
func ShapeOf(m *ir.Module) (cost.Transformer, error) {
	var t cost.Transformer
	layers := map[int]bool{}
	for _, v := range m.Values {
		if v.Meta.Layer >= 0 && v.Op != "param" {
			layers[v.Meta.Layer] = true
		}
		switch {
		case v.Op == "input" && v.Name() == ir.InputTokens && v.Type.Rank() == 2:
			t.Seq = v.Type.Shape[1]
		case v.Op == "embedding" && t.Vocab == 0 && len(v.Args) > 0 && v.Args[0].Type.Rank() == 2:
			t.Vocab, t.Hidden = v.Args[0].Type.Shape[0], v.Args[0].Type.Shape[1]
		case v.Op == "attention" && t.Heads == 0 && len(v.Args) > 1:
			t.Heads, t.FusedAttention = ir.AttentionShapeOf(v.Args[0].Type, v.Args[1].Type).Heads, true
		case v.Op == "softmax" && t.Heads == 0 && v.Type.Rank() == 4:
			t.Heads = v.Type.Shape[1]
		}
	}
	t.Layers = len(layers)
	for _, p := range m.Params() {
		if p.Meta.Layer == 0 && p.Type.Rank() == 2 {
			for _, d := range p.Type.Shape {
				if d != t.Hidden && d != 3*t.Hidden && d > t.FFN {
					t.FFN = d
				}
			}
		}
	}
	if t.Seq == 0 || t.Vocab == 0 || t.Hidden == 0 || t.Layers == 0 || t.Heads == 0 || t.FFN == 0 {
		return t, fmt.Errorf("the planner models decoder transformers (tokens [batch, seq], an embedding, layers tagged with b.Layer, attention, an MLP); %s does not read as one: %+v", m.Name, t)
	}
	return t, nil
}
