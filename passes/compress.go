package passes

import (
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// compress stashes activations for the backward in less memory (Gist,
// Jain et al. 2018). --compress-activations takes one mode or both,
// comma-separated:
//
//	relu  lossless: ReLU's gradient needs only the sign of its input x, so
//	      a 1-bit mask of x > 0 (relu_mask) is made right after the relu
//	      and the backward's relu_grad(x, dy) becomes relu_grad_mask(mask,
//	      dy). x then dies with the forward instead of being stashed: per
//	      ReLU, 4·n bytes of fp32 become ⌈n/8⌉ bytes per row. Training is
//	      bit-identical.
//	lowp  lossy ("delayed precision reduction"): every fp32 forward value
//	      the backward reads is kept as a bf16 copy made right after it is
//	      computed and widened back to fp32 just before its first backward
//	      use. The forward runs at full precision; only the backward sees
//	      the rounded copy.
//
// With both, the masks are made first, so lowp narrows what the backward
// still reads (the ReLU outputs the next matmul's weight gradient needs)
// and leaves the u8 masks alone. A ReLU input replayed by --recompute is
// masked the same way right after its replayed relu, so it dies there
// rather than living through the layer's backward.
func compress(m *ir.Module, o *Options) error {
	relu, lowp, err := compressModes(o.Compress)
	if err != nil {
		return err
	}
	if relu {
		if err := reluMasks(m, o); err != nil {
			return err
		}
	}
	if lowp {
		return lowPrecisionStash(m, o)
	}
	return nil
}

// compressModes reads --compress-activations: "", "none", or a comma list
// of relu and lowp, each at most once.
func compressModes(s string) (relu, lowp bool, err error) {
	if s == "" || s == "none" {
		return false, false, nil
	}
	for _, mode := range strings.Split(s, ",") {
		switch {
		case mode == "relu" && !relu:
			relu = true
		case mode == "lowp" && !lowp:
			lowp = true
		default:
			return false, false, fmt.Errorf("--compress-activations %q: want lowp, relu or both (relu,lowp)", s)
		}
	}
	return relu, lowp, nil
}

// reluMasks replaces, for every ReLU input x that the backward reads only
// through relu_grad, the stash of x by a packed 1-bit mask. An x that
// something else in the backward also reads stays live anyway, so it is
// left alone: a mask beside it would only add bytes; so is one the weight
// axis cannot split into whole bytes of mask. o takes a note of the
// inputs left stashed.
func reluMasks(m *ir.Module, o *Options) error {
	tp := o.Mesh.SizeOf(o.Mesh.WeightAxis())
	relus := 0
	for _, v := range m.Values {
		if v.Op == "relu" {
			relus++
		}
	}
	if relus == 0 {
		return fmt.Errorf("--compress-activations relu needs ReLU activations; model %q has none (lowp works on any model; examples/gpt has ReLU with --set activation=relu)", m.Name)
	}
	output := map[*ir.Value]bool{}
	for _, o := range m.Outputs {
		output[o.Value] = true
	}
	for _, u := range m.Updates {
		output[u.Value] = true
	}
	uses := m.Uses()
	after := map[*ir.Value][]*ir.Value{}
	masked := 0
	var kept string // why the first unmasked ReLU input stays stashed
	keptN := 0
	for _, x := range m.Values {
		if x.Meta.Phase != ir.PhaseFwd && x.Meta.Phase != ir.PhaseRecompute {
			continue
		}
		var relu, other *ir.Value
		var grads []*ir.Value
		for _, u := range uses[x] {
			switch {
			case u.Op == "relu" && u.Meta.Phase == x.Meta.Phase:
				if relu == nil {
					relu = u
				}
			case u.Op == "relu_grad" && u.Meta.Phase == ir.PhaseBwd && u.Args[0] == x && u.Args[1] != x:
				grads = append(grads, u)
			case u.Meta.Phase != x.Meta.Phase && other == nil:
				other = u
			}
		}
		if len(grads) == 0 {
			continue
		}
		// The weight axis (tp) splits a column-parallel ReLU's input on
		// its last dim, the one the mask packs 8 to a byte: where a
		// device's columns would not be whole bytes, the input stays
		// stashed (shard's packable would refuse the mask).
		unpackable := false
		if r := x.Type.Rank(); tp > 1 && r > 0 {
			unpackable = x.Type.Shape[r-1]%(8*tp) != 0
		}
		if info, _ := ir.Lookup(x.Op); info.Source || other != nil || output[x] || unpackable {
			keptN++
			if kept == "" {
				why := "a param, state or input: it is never freed"
				switch {
				case other != nil:
					why = "also read by " + other.Where()
				case output[x]:
					why = "a module output or update"
				case unpackable:
					why = fmt.Sprintf("%v, whose last dim a mask packs 8 to a byte: split over tp=%d a device's %d/%d columns are not whole bytes (the dim must be a multiple of %d)", x.Type, tp, x.Type.Shape[x.Type.Rank()-1], tp, 8*tp)
				}
				kept = fmt.Sprintf("%s is %s", x.Where(), why)
			}
			continue
		}
		// Right after the relu, so x's last reader is the relu or the mask.
		at := x
		if relu != nil {
			at = relu
		}
		mask, err := m.NewValue("relu_mask", []*ir.Value{x}, nil, at.Meta, at.Pos)
		if err != nil {
			return err
		}
		after[at] = append(after[at], mask)
		for _, g := range grads {
			args := []*ir.Value{mask, g.Args[1]}
			info, _ := ir.Lookup("relu_grad_mask")
			t, err := ir.InferType(info, args, nil)
			if err != nil {
				return fmt.Errorf("%s: relu_grad_mask: %w", g.Where(), err)
			}
			if !t.Equal(g.Type) {
				return fmt.Errorf("%s: relu_grad_mask gives %v, relu_grad gave %v", g.Where(), t, g.Type)
			}
			g.Op, g.Args = "relu_grad_mask", args
		}
		masked++
	}
	if kept != "" && masked > 0 {
		o.notef("relu: %d of %d ReLU inputs keep their stash (first: %s)", keptN, keptN+masked, kept)
	}
	if masked == 0 {
		if kept == "" {
			kept = "the backward reads no ReLU input through relu_grad"
		}
		return fmt.Errorf("--compress-activations relu: no ReLU input can leave the stash (%s)", kept)
	}
	m.Values = splice(m.Values, nil, after)
	return nil
}

// lowPrecisionStash is the lowp mode: bf16 copies of the fp32 forward
// values the backward reads, widened back just before their first
// backward use on each pipeline chunk that reads them. Recompute's
// replays count as backward uses: a segment's kept input is stashed in
// bf16 and widened before its replay (left fp32 for the replay, both
// copies lived from the forward to the backward).
func lowPrecisionStash(m *ir.Module, o *Options) error {
	uses := m.Uses()
	pos := make(map[*ir.Value]int, len(m.Values))
	for i, v := range m.Values {
		pos[v] = i
	}
	backward := func(u *ir.Value) bool { return u.Meta.Phase == ir.PhaseBwd || u.Meta.Phase == ir.PhaseRecompute }
	after := map[*ir.Value][]*ir.Value{}
	before := map[*ir.Value][]*ir.Value{}
	type onChunk struct {
		v     *ir.Value
		stage int
	}
	widened := map[onChunk]*ir.Value{}
	narrowed := map[*ir.Value]*ir.Value{}
	var bytes int64 // what the bf16 copies save, over the step
	for _, v := range m.Values {
		if v.Meta.Phase != ir.PhaseFwd || v.Type.DType != ir.F32 || v.Type.Rank() < 2 {
			continue
		}
		if info, _ := ir.Lookup(v.Op); info.Source {
			continue
		}
		// Each chunk that reads v in its backward widens its own copy
		// in its own backward: a copy widened on one chunk and read on
		// another would travel between two backward blocks.
		first := map[int]*ir.Value{}
		var stages []int
		for _, u := range uses[v] {
			if !backward(u) {
				continue
			}
			f, ok := first[u.Meta.Stage]
			if !ok {
				stages = append(stages, u.Meta.Stage)
			}
			if !ok || pos[u] < pos[f] {
				first[u.Meta.Stage] = u
			}
		}
		if len(stages) == 0 {
			continue
		}
		var narrow *ir.Value
		var err error
		if n := narrowed[v.Args[0]]; v.Op == "reshape" && n != nil {
			// A reshape is a view: when what it views is stashed too (the
			// fused attention's output, read by its gradient, and the same
			// buffer merged to [b, s, h] for the output projection), its
			// bf16 copy is a view of that one rather than a second copy.
			narrow, err = m.NewValue("reshape", []*ir.Value{n}, v.Attrs.Clone(), v.Meta, v.Pos)
		} else {
			narrow, err = m.NewValue("cast", []*ir.Value{v}, ir.Attrs{"to": "bf16"}, v.Meta, v.Pos)
		}
		if err != nil {
			return err
		}
		narrowed[v] = narrow
		after[v] = append(after[v], narrow)
		if narrow.Op == "cast" {
			bytes += v.Type.Bytes() / 2
		}
		slices.Sort(stages)
		for _, st := range stages {
			f := first[st]
			wide, err := m.NewValue("cast", []*ir.Value{narrow}, ir.Attrs{"to": "f32"}, f.Meta, v.Pos)
			if err != nil {
				return err
			}
			before[f] = append(before[f], wide)
			widened[onChunk{v, st}] = wide
		}
	}
	for _, u := range m.Values {
		if !backward(u) {
			continue
		}
		for i, a := range u.Args {
			if w := widened[onChunk{a, u.Meta.Stage}]; w != nil {
				u.Args[i] = w
			}
		}
	}
	if o.Precision == "fp16" || o.Precision == "bf16" {
		// Mixed precision stashes 16-bit values already: only the fp32
		// ones (the logits' upcast, norms' statistics) are left to narrow.
		o.notef("lowp: under --precision %s the stash is 16-bit already but for %d fp32 value(s), whose bf16 copies save %d bytes while stashed", o.Precision, len(narrowed), bytes)
	}
	m.Values = splice(m.Values, before, after)
	return nil
}
