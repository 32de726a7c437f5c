package passes

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"gcompile/ir"
)

// recompute trades compute for activation memory (Chen et al. 2016;
// Korthikanti et al. 2022). Forward values the backward needs are replayed
// in the backward (phase recompute, just before their first backward use)
// from a few kept values, and the backward reads the replayed copies, so
// the originals die as soon as the forward is done with them.
//
//	full      every layer is a segment: only each layer's input is kept
//	every=K   segments of K layers (every=sqrt: K = ⌈√L⌉, the O(√n) plan)
//	block=N   the first N layers of each pipeline chunk, a segment each, the
//	          others kept whole (Megatron-LM's --recompute-method block
//	          --recompute-num-layers N): memory between none and full for
//	          a share of full's compute
//	selective only what the model tags (Meta.Selective, b.RecomputeSelective
//	          in the DSL) is replayed: for a transformer written with the
//	          unfused attention, its core (q·kᵀ, its scaling, the causal
//	          mask and the softmax: the [b, heads, s, s] tensors), as
//	          Korthikanti et al. do. The fused attention op makes no such
//	          tensor, so there it has nothing to drop: the pass notes that
//	          (Result.Note) and replays only what else is tagged; full and
//	          every=K replay the fused op like any other forward op.
//
// It runs before placement, so the replayed values are placed like any
// other (a ZeRO-3 parameter is gathered again, a tensor-parallel collective
// inside a layer is replayed too), and after microbatching and the pipeline
// split, whose tags the copies keep.
func recompute(m *ir.Module, o *Options) error {
	mode := o.Recompute
	if mode == "" || mode == "none" {
		return nil
	}
	layers := 0
	for _, v := range m.Values {
		layers = max(layers, v.Meta.Layer+1)
	}
	if layers == 0 {
		return fmt.Errorf("--recompute %s: module %q marks no layers: recompute replays a layer's forward in that layer's backward, so it needs to know where each layer begins and ends (build each block inside b.Layer in the model)", mode, m.Name)
	}
	var replay func(v *ir.Value) (segment int, ok bool)
	switch {
	case mode == "full":
		replay = func(v *ir.Value) (int, bool) { return v.Meta.Layer, v.Meta.Layer >= 0 }
	case mode == "selective":
		tagged, fused := false, 0
		for _, v := range m.Values {
			if v.Meta.Phase != ir.PhaseFwd {
				continue
			}
			tagged = tagged || v.Meta.Selective
			if v.Op == "attention" {
				fused++
			}
		}
		if fused > 0 {
			// What selective recompute exists to drop, the [b, heads, s,
			// s] scores and probabilities, the fused op never makes: it
			// keeps only its inputs and output, which the backward reads
			// anyway. Say so rather than look as if it did something.
			what := "nothing else is tagged, so nothing is replayed"
			if tagged {
				what = "the values the model tags are replayed"
			}
			o.notef("selective: %d fused attention op(s) keep no [batch, heads, seq, seq] scores or probabilities, so there is nothing to drop there; %s", fused, what)
		}
		if !tagged {
			if fused > 0 {
				return nil
			}
			return fmt.Errorf("--recompute selective: model %q tags no value that selective recompute may drop (record them inside b.RecomputeSelective, as the layer library's unfused attention does for its core); use --recompute full or every=K, or tag the ops", m.Name)
		}
		replay = func(v *ir.Value) (int, bool) { return v.Meta.Layer, v.Meta.Selective }
	case strings.HasPrefix(mode, "every="):
		k, err := SegmentLayers(strings.TrimPrefix(mode, "every="), layers)
		if err != nil {
			return err
		}
		replay = func(v *ir.Value) (int, bool) { return v.Meta.Layer / k, v.Meta.Layer >= 0 }
	case strings.HasPrefix(mode, "block="):
		n, err := BlockLayers(strings.TrimPrefix(mode, "block="), layers)
		if err != nil {
			return err
		}
		// Each chunk's first layer, from its forward.
		first := map[int]int{}
		for _, v := range m.Values {
			if v.Meta.Phase != ir.PhaseFwd || v.Meta.Layer < 0 {
				continue
			}
			if f, ok := first[v.Meta.Stage]; !ok || v.Meta.Layer < f {
				first[v.Meta.Stage] = v.Meta.Layer
			}
		}
		replay = func(v *ir.Value) (int, bool) {
			f, ok := first[v.Meta.Stage]
			return v.Meta.Layer, ok && v.Meta.Layer >= 0 && v.Meta.Layer-f < n
		}
	default:
		return fmt.Errorf("--recompute %q: want none, full, selective, every=K or block=N", mode)
	}
	// A segment never spans pipeline chunks: each chunk replays its own
	// layers in its own backward. A backward on another chunk (the next
	// chunk's first layer reading this chunk's output) reads the copy it
	// received in the forward, which it keeps as the kept input of its
	// own segment; replayed for it, the value would come from this
	// chunk's backward, which runs after that one.
	type seg struct {
		segment, micro, stage int
	}
	// Forward values replayed, by segment, microbatch and chunk. Under
	// gradient accumulation a once-a-step forward value (a weight's 16-bit
	// copy, which every microbatch reads) lives until the last
	// microbatch's forward anyway, past the first backwards under 1F1B:
	// replayed, the weights' copies were held twice (Megatron-LM keeps one
	// 16-bit set, which its replays read).
	microbatched := m.Microbatched()
	inSeg := map[*ir.Value]seg{}
	for _, v := range m.Values {
		if v.Meta.Phase != ir.PhaseFwd || microbatched && v.Meta.Micro < 0 {
			continue
		}
		if info, _ := ir.Lookup(v.Op); info.Source {
			continue
		}
		if s, ok := replay(v); ok {
			inSeg[v] = seg{s, v.Meta.Micro, v.Meta.Stage}
		}
	}
	uses := m.Uses()
	// The first backward use of each segment on its chunk is where its
	// replay goes.
	firstUse := map[seg]*ir.Value{}
	for _, v := range m.Values {
		if v.Meta.Phase != ir.PhaseBwd {
			continue
		}
		for _, a := range v.Args {
			if s, ok := inSeg[a]; ok && s.stage == v.Meta.Stage && firstUse[s] == nil {
				firstUse[s] = v
			}
		}
	}
	// Values each segment must replay: those the backward reads, and
	// within the segment everything they are computed from.
	needed := map[*ir.Value]bool{}
	var need func(v *ir.Value)
	need = func(v *ir.Value) {
		if needed[v] {
			return
		}
		needed[v] = true
		for _, a := range v.Args {
			if _, ok := inSeg[a]; ok && inSeg[a] == inSeg[v] {
				need(a)
			}
		}
	}
	for v, s := range inSeg {
		for _, u := range uses[v] {
			if u.Meta.Phase == ir.PhaseBwd && u.Meta.Stage == s.stage {
				need(v)
			}
		}
	}
	before := map[*ir.Value][]*ir.Value{}
	replayed := map[*ir.Value]*ir.Value{}
	for _, v := range m.Values { // program order, so args are replayed first
		s, ok := inSeg[v]
		if !ok || !needed[v] {
			continue
		}
		at := firstUse[s]
		args := make([]*ir.Value, len(v.Args))
		for i, a := range v.Args {
			args[i] = a
			// Within the segment, from the replay; from outside it (the
			// segment's input), the kept value.
			if r := replayed[a]; r != nil && inSeg[a] == s {
				args[i] = r
			}
		}
		meta := v.Meta
		meta.Phase = ir.PhaseRecompute
		r, err := m.NewValue(v.Op, args, v.Attrs.Clone(), meta, v.Pos)
		if err != nil {
			return err
		}
		replayed[v] = r
		before[at] = append(before[at], r)
	}
	redirectBackward(m.Values, replayed)
	m.Values = splice(m.Values, before, nil)
	if o.DeferWeightGradients {
		return replayForW(m)
	}
	return nil
}

// replayForW replays again, for the weight gradients a zero-bubble
// schedule defers to W, the replayed values they read that the B block
// computes too. Read from B, every such value (each GEMM's input) lived
// from a microbatch's B to its W, up to p microbatches on every rank, and
// recompute saved almost nothing (the last rank's peak fell 0.6 %); the
// price is a second replay of those values in W.
//
// B is what lower.splitBackward puts there: what another chunk reads (the
// gradient sent back), what feeds a once-a-step value sent to another
// chunk, and everything they are computed from within its
// microbatch's backward, and the vector weight gradients (a LayerNorm's,
// a bias's) whose arguments B makes. The rest runs in W.
func replayForW(m *ir.Module) error {
	type block struct{ stage, micro int }
	backward := func(v *ir.Value) bool {
		return v.Meta.Micro >= 0 && (v.Meta.Phase == ir.PhaseBwd || v.Meta.Phase == ir.PhaseRecompute)
	}
	in := func(v *ir.Value) (block, bool) { return block{v.Meta.Stage, v.Meta.Micro}, backward(v) }
	uses := m.Uses()
	inB := map[*ir.Value]bool{}
	var mark func(v *ir.Value)
	mark = func(v *ir.Value) {
		if inB[v] {
			return
		}
		inB[v] = true
		k, _ := in(v)
		for _, a := range v.Args {
			if ka, ok := in(a); ok && ka == k {
				mark(a)
			}
		}
	}
	// Once-a-step backward values another chunk reads, or that one is
	// computed from (a tied embedding's last-chunk gradient sum): what
	// feeds them is B's. (Not the optimizer's: every gradient reaches the
	// global norm, whose scalars cross the chunks.)
	sent := map[*ir.Value]bool{}
	for i := len(m.Values) - 1; i >= 0; i-- {
		if v := m.Values[i]; v.Meta.Micro < 0 && v.Meta.Phase == ir.PhaseBwd {
			for _, u := range uses[v] {
				sent[v] = sent[v] || u.Meta.Stage != v.Meta.Stage || sent[u]
			}
		}
	}
	for _, v := range m.Values {
		if !backward(v) {
			continue
		}
		for _, u := range uses[v] {
			if u.Meta.Stage != v.Meta.Stage || sent[u] {
				mark(v)
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for _, v := range m.Values {
			if !backward(v) || inB[v] || v.Type.Rank() > 1 {
				continue
			}
			k, _ := in(v)
			ready := true
			for _, a := range v.Args {
				if ka, ok := in(a); ok && ka == k && !inB[a] {
					ready = false
				}
			}
			if ready {
				inB[v], changed = true, true
			}
		}
	}
	before := map[*ir.Value][]*ir.Value{}
	again := map[*ir.Value]*ir.Value{} // a B replay's copy for W
	var replayAgain func(r, at *ir.Value) (*ir.Value, error)
	replayAgain = func(r, at *ir.Value) (*ir.Value, error) {
		if c := again[r]; c != nil {
			return c, nil
		}
		args := slices.Clone(r.Args)
		for i, a := range args {
			if a.Meta.Phase == ir.PhaseRecompute && inB[a] {
				c, err := replayAgain(a, at)
				if err != nil {
					return nil, err
				}
				args[i] = c
			}
		}
		c, err := m.NewValue(r.Op, args, r.Attrs.Clone(), r.Meta, r.Pos)
		if err != nil {
			return nil, err
		}
		again[r] = c
		before[at] = append(before[at], c)
		return c, nil
	}
	for _, u := range m.Values {
		if !backward(u) || inB[u] {
			continue
		}
		for i, a := range u.Args {
			if a.Meta.Phase != ir.PhaseRecompute || !inB[a] {
				continue
			}
			c, err := replayAgain(a, u)
			if err != nil {
				return err
			}
			u.Args[i] = c
		}
	}
	m.Values = splice(m.Values, before, nil)
	return nil
}

// SegmentLayers reads K of --recompute every=K for a model of layers
// layers ("sqrt": ⌈√L⌉), refusing a K the model cannot have; the
// planner checks a pinned K with it before any compile.
func SegmentLayers(s string, layers int) (int, error) {
	if s == "sqrt" {
		return max(1, int(math.Ceil(math.Sqrt(float64(layers))))), nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 {
		return 0, fmt.Errorf("--recompute every=%s: want a positive number of layers or sqrt", s)
	}
	if layers > 0 && k > layers {
		// One segment of every layer, replayed whole in the backward:
		// every=layers says that, and more says nothing else.
		return 0, fmt.Errorf("--recompute every=%d: more than the model's %d layers; a segment holds at most every layer (every=%d)", k, layers, layers)
	}
	return k, nil
}

// BlockLayers reads N of --recompute block=N for a model of layers
// layers, refusing an N the model cannot have: more than its layers
// would replay no more than block=layers, full's replay.
func BlockLayers(s string, layers int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--recompute block=%s: want a positive number of layers of each pipeline chunk", s)
	}
	if layers > 0 && n > layers {
		return 0, fmt.Errorf("--recompute block=%d: more than the model's %d layers (block=%d replays every layer of every chunk, as full does)", n, layers, layers)
	}
	return n, nil
}
