package passes

import (
	"fmt"

	"gcompile/ir"
)

// pipelineSplit cuts the model into pipeline chunks by tagging every
// forward value with its global chunk (Meta.Stage): with p pipeline ranks
// and v chunks per rank there are p·v chunks of L/(p·v) consecutive layers,
// and chunk j runs on rank j mod p (Megatron-LM's interleaved assignment;
// v = 1 gives contiguous stages). Values outside the layers go to the first
// chunk (embeddings) or, when they depend on a layer's output, to the last
// (final LayerNorm, LM head, loss); values that depend on no layer run on
// the first chunk that uses them (labels go straight to the loss's chunk). Autodiff, microbatching and the
// optimizer copy the tag to the values they derive, so the backward of a
// chunk runs where its forward ran; the lowering cuts one program per
// pipeline rank and inserts the sends and receives between chunks.
//
// It runs before autodiff (the plan puts it after the memory passes)
// because the stage of a backward value is that of the forward value it
// differentiates, which only autodiff knows.
func pipelineSplit(m *ir.Module, o *Options) error {
	p := 1
	p = o.Mesh.SizeOf(o.Mesh.PipelineAxis())
	v := max(o.VPP, 1)
	if p == 1 {
		if v > 1 {
			return fmt.Errorf("%d virtual stages per rank need pipeline parallelism (pp > 1)", v)
		}
		return nil
	}
	if err := m.CheckLayerMarks(); err != nil {
		return err
	}
	layers := 0
	for _, x := range m.Values {
		layers = max(layers, x.Meta.Layer+1)
	}
	chunks := p * v
	switch {
	case layers == 0:
		return fmt.Errorf("module %q marks no layers (b.Layer in the model): nothing to cut into %d pipeline chunks", m.Name, chunks)
	case layers < p:
		return fmt.Errorf("pp=%d is more than the %d layers of the model: every pipeline rank needs at least one layer", p, layers)
	case layers%chunks != 0:
		return fmt.Errorf("%d layers cannot be cut into pp·vpp = %d·%d = %d chunks of equal size", layers, p, v, chunks)
	}
	per := layers / chunks
	afterLayers := map[*ir.Value]bool{}
	for _, x := range m.Values {
		if x.Meta.Layer >= 0 {
			x.Meta.Stage = x.Meta.Layer / per
			afterLayers[x] = true
			continue
		}
		for _, a := range x.Args {
			if afterLayers[a] {
				afterLayers[x] = true
			}
		}
		if afterLayers[x] {
			x.Meta.Stage = chunks - 1
		} else {
			x.Meta.Stage = 0
		}
	}
	// A layer's ops read earlier stages' values only: a value outside the
	// layers computed from them runs on the last stage, so a layer before
	// it that reads it (an encoder's final norm read by a decoder's
	// layers on an earlier stage) made programs whose transfers wait for
	// each other; the layer marks (ir.CheckLayerMarks) cannot see stages.
	for _, x := range m.Values {
		if x.Meta.Layer < 0 {
			continue
		}
		for _, a := range x.Args {
			if a.Meta.Stage > x.Meta.Stage {
				err := fmt.Errorf("%s, marked layer %d on pipeline stage %d, reads %s, outside the layers and computed from them, which runs on the last stage, %d: a stage reads earlier stages' values only; mark it with the layer that computes it (b.Layer), or give a --pp whose last stage holds the layers that read it",
					x.Where(), x.Meta.Layer, x.Meta.Stage, a.Where(), a.Meta.Stage)
				for _, y := range m.Values {
					y.Meta.Stage = -1 // a refused plan tags nothing
				}
				return err
			}
		}
	}
	// A value that depends on no layer (labels reshaped for the loss, the
	// embedding lookup) runs where it is first needed, so nothing crosses
	// the pipeline only to be used at its far end.
	uses := m.Uses()
	for i := len(m.Values) - 1; i >= 0; i-- {
		x := m.Values[i]
		if x.Meta.Layer >= 0 || afterLayers[x] || len(uses[x]) == 0 {
			continue
		}
		first := chunks
		for _, u := range uses[x] {
			first = min(first, u.Meta.Stage)
		}
		x.Meta.Stage = first
	}
	// A source used by several chunks (the tied embedding, constants) is
	// held by every rank that uses it; its tag is its first user's chunk.
	for _, x := range m.Values {
		if info, _ := ir.Lookup(x.Op); info.Source && len(uses[x]) > 0 {
			x.Meta.Stage = uses[x][0].Meta.Stage
		}
	}
	return nil
}
