package planner

import (
	"fmt"
	"slices"
	"strings"

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
	layers, moeLayers := map[int]bool{}, map[int]bool{}
	var route ir.Shape // the first MoE block's slot index [G, E, C]
	var mask *ir.Value // ... and the router's choice it was made from
	var tokens int     // the batch's
	for _, v := range m.Values {
		if v.Op == "moe_route" && v.Type.Rank() == 3 {
			moeLayers[v.Meta.Layer] = true
			if route == nil {
				route, mask = v.Type.Shape, v.Args[1]
			}
		}
		if v.Meta.Layer >= 0 && v.Op != "param" {
			layers[v.Meta.Layer] = true
		}
		switch {
		case v.Op == "input" && v.Name() == ir.InputTokens && v.Type.Rank() == 2:
			t.Seq, tokens = v.Type.Shape[1], v.Type.Shape[0]*v.Type.Shape[1]
		case v.Op == "embedding" && t.Vocab == 0 && len(v.Args) > 0 && v.Args[0].Type.Rank() == 2:
			t.Vocab, t.Hidden = v.Args[0].Type.Shape[0], v.Args[0].Type.Shape[1]
		case v.Op == "attention" && t.Heads == 0 && len(v.Args) > 1:
			as := ir.AttentionShapeOf(v.Args[0].Type, v.Args[1].Type)
			t.Heads, t.FusedAttention = as.Heads, true
			if as.KVHeads > 0 && as.KVHeads != as.Heads {
				t.KVHeads = as.KVHeads
			}
		case v.Op == "softmax" && t.Heads == 0 && v.Type.Rank() == 4:
			t.Heads = v.Type.Shape[1]
		}
	}
	t.Layers = len(layers)
	if route != nil {
		t.Routed = routedPerToken(mask, route[1])
		if err := moeShape(m, &t, route, tokens, moeLayers); err != nil {
			return t, err
		}
	}
	for _, p := range m.Params() {
		if p.Meta.Layer == 0 && p.Type.Rank() == 2 && !moeLayers[0] {
			for _, d := range p.Type.Shape {
				if d != t.Hidden && d != 3*t.Hidden && d > t.FFN {
					t.FFN = d
				}
			}
		}
	}
	if t.FFN == 0 && t.Experts > 0 && t.MoELayers == t.Layers {
		t.FFN = t.ExpertFFN // no dense block
	}
	countParams(m, &t, moeLayers)
	if t.Seq == 0 || t.Vocab == 0 || t.Hidden == 0 || t.Layers == 0 || t.Heads == 0 || t.FFN == 0 {
		return t, fmt.Errorf("the planner models decoder transformers (tokens [batch, seq], an embedding, layers tagged with b.Layer, attention, an MLP); %s does not read as one: %+v", m.Name, t)
	}
	return t, nil
}

// routedPerToken is how many experts the router sends a token to, read
// from the choice moe_route slots (its mask [G, T, E]): the largest k of
// a top-k over the experts it is made from (GShard's second expert, kept
// at random, counts as a choice), 0 when it is no such top-k (an
// expert-choice router's top-k over the tokens: its slots, all filled,
// are what a token gets).
func routedPerToken(mask *ir.Value, experts int) float64 {
	k := 0
	seen := map[*ir.Value]bool{}
	var walk func(v *ir.Value)
	walk = func(v *ir.Value) {
		if v == nil || seen[v] {
			return
		}
		seen[v] = true
		switch v.Op {
		case "top_k_mask":
			if sh := v.Type.Shape; len(sh) > 0 && sh[len(sh)-1] == experts {
				k = max(k, v.Attrs.Int("k", 0))
			}
		case "add", "sub", "mul", "maximum", "less", "cast":
			// The arithmetic of masks (GShard keeps its second choice
			// where a draw is less than its gate); anything else (the
			// gates, the draw, a top-k over the tokens turned back by a
			// transpose) is not a token's choice.
			for _, a := range v.Args {
				walk(a)
			}
		}
	}
	walk(mask)
	return float64(min(k, experts))
}

// moeShape reads the mixture of experts from the module: the blocks with
// a router (moe_route), the experts and slots per group from the first
// one's slot index [G, E, C] (T = batch·seq/G tokens per group, so a token
// takes E·C/T slots on average), the experts' width from that block's
// expert weights [E, in, out] (the "expert" hint), and its router's
// weights (its other matrices with an E-wide dim).
func moeShape(m *ir.Module, t *cost.Transformer, route ir.Shape, tokens int, moeLayers map[int]bool) error {
	g, e, c := route[0], route[1], route[2]
	if g <= 0 || e <= 0 || tokens%g != 0 {
		return fmt.Errorf("the planner reads a MoE block's slot index [groups, experts, capacity] over the batch's tokens; %s has %v for %d tokens", m.Name, route, tokens)
	}
	first := -1
	for l := range moeLayers {
		if first < 0 || l < first {
			first = l
		}
	}
	t.Experts, t.MoELayers = e, len(moeLayers)
	t.Slots = float64(e*c) / float64(tokens/g)
	matrices := 0
	for _, p := range m.Params() {
		if p.Meta.Layer != first {
			continue
		}
		if strings.HasPrefix(p.Attrs.Str("parallel"), "expert") && p.Type.Rank() == 3 && p.Type.Shape[0] == e {
			// [E, h, f] or [E, f, h]: the width is the dim that is not h
			// (or h itself when both are).
			w := p.Type.Shape[1]
			if w == t.Hidden {
				w = p.Type.Shape[2]
			}
			t.ExpertFFN = max(t.ExpertFFN, w)
			t.ExpertParams += int(p.Type.Shape.NumElements()) / e
			matrices++
		} else if p.Type.Rank() == 2 && slices.Contains(p.Type.Shape, e) {
			t.RouterParams += int(p.Type.Shape.NumElements())
		}
	}
	// Three matrices an expert (up, gate, down) make a gated MLP, as
	// Mixtral's SwiGLU experts; the MoE GPT's have two.
	t.GatedExperts = matrices >= 3
	if t.ExpertFFN == 0 {
		return fmt.Errorf("the planner reads a MoE block's experts from its weights [experts, in, out] with the expert hint (frontend.ExpertParallel); %s's block %d has none", m.Name, first)
	}
	return nil
}

// countParams reads the parameter counts the formulas would guess: a
// dense block's (its first), and what tensor parallelism splits of it
// (the weights with a column or row hint); the parameters outside the
// blocks and their vocab-parallel part; and whether the MLP is gated
// (three matrices of the MLP's width, as SwiGLU's, where the GPT's has
// two).
func countParams(m *ir.Module, t *cost.Transformer, moeLayers map[int]bool) {
	dense := -1
	for l := 0; l < t.Layers; l++ {
		if !moeLayers[l] {
			dense = l
			break
		}
	}
	wide := 0
	for _, p := range m.Params() {
		n := float64(p.Type.Shape.NumElements())
		split := p.Attrs.Str("parallel") != ""
		switch {
		case p.Meta.Layer < 0:
			t.OuterParams += n
			if split {
				t.OuterSplit += n
			}
		case p.Meta.Layer == dense:
			t.LayerParamCount += n
			if split {
				t.LayerSplit += n
			}
			if p.Type.Rank() == 2 && slices.Contains(p.Type.Shape, t.FFN) && t.FFN != t.Hidden {
				wide++
			}
		}
	}
	t.GatedMLP = wide >= 3
}
