package passes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gcompile/ir"
)

// shard places every value on the device mesh, GSPMD-style: sources get
// their placement from the plan (batch inputs split over dp; params and
// optimizer state replicated, or split over dp by ZeRO), and every other
// value gets one from its op's sharding rule (shard_rules.go) applied to its
// arguments' placements, one mesh axis at a time. Where a rule needs an
// argument placed differently, shard inserts a redistribute op that the
// redistribute pass turns into collectives. A rule that has no way to run
// an op on the placements it is given reports the op and the user's line;
// nothing is replicated behind the user's back.
//
// Reductions (a partial sum made whole or scattered) are placed right
// after the value they reduce, so gradients are reduced as soon as they
// exist; gathers and slices right before the op that needs them, so a
// gathered ZeRO-3 parameter lives only while it is used.
// shardNamingHeads is shard, whose failure under a tp that does not
// divide some attention's query heads names that as the likely cause:
// the failure itself shows up at whatever op first cannot keep the
// heads' split (the reshape into heads, the row-parallel projection),
// in placement terms.
func shardNamingHeads(m *ir.Module, o *Options) error {
	err := shard(m, o)
	if err == nil || m.Mesh == nil {
		return err
	}
	tp := m.Mesh.SizeOf(m.Mesh.WeightAxis())
	if tp <= 1 {
		return err
	}
	for _, v := range m.Values {
		if v.Op == "attention" && len(v.Args) > 0 && v.Args[0].Type.Rank() == 4 {
			if heads := v.Args[0].Type.Shape[1]; heads%tp != 0 {
				return fmt.Errorf("--tp %d does not divide the %d query heads of the attention at %s (tensor parallelism gives each device whole heads): give a --tp that divides %d, or a model with more heads; where the split failed: %w", tp, heads, v.Pos, heads, err)
			}
		}
	}
	return err
}

func shard(m *ir.Module, o *Options) error {
	if m.Mesh == nil {
		m.Mesh = o.Mesh
	}
	if m.Mesh == nil || m.Mesh.Devices() == 1 {
		m.Mesh = nil
		return nil
	}
	for i, a := range m.Mesh.Axes {
		if a.Size == 1 {
			continue
		}
		switch {
		case a.Role() == ir.RoleUnknown:
			return fmt.Errorf("mesh axis %s=%d has no role: name axes dp (data), ep (experts), tp (tensor), cp (context) or pp (pipeline)", a.Name, a.Size)
		case i != m.Mesh.DataAxis() && i != m.Mesh.ExpertAxis() && i != m.Mesh.WeightAxis() && i != m.Mesh.PipelineAxis() && i != m.Mesh.SequenceAxis():
			return fmt.Errorf("mesh axis %s=%d: only one data (dp), one expert (ep), one tensor (tp), one context (cp) and one pipeline (pp) axis are placed yet; the sharding rules for %s are %w", a.Name, a.Size, a.Name, ErrNotYet)
		}
	}
	if cp := m.Mesh.SequenceAxis(); cp >= 0 && m.Mesh.Axes[cp].Size > 1 {
		// The ring and Ulysses are strategies of the fused attention op;
		// attention composed of primitive ops would need every key on
		// every rank and its [s, s] scores.
		for _, v := range m.Values {
			if v.Op == "causal_mask" {
				return fmt.Errorf("%s: context parallelism (cp=%d) runs attention as the fused op, by the ring or Ulysses; this is the causal mask of attention composed of primitive ops: build the model with its fused attention (the examples' --set attention=fused)", v.Where(), m.Mesh.Axes[cp].Size)
			}
		}
	}
	if o.SequenceParallel && m.Mesh.SizeOf(m.Mesh.WeightAxis()) == 1 {
		return fmt.Errorf("sequence parallelism splits activations over tp, and the mesh %v has no tp axis larger than 1", m.Mesh)
	}
	s := &sharder{m: m, o: o, dp: m.Mesh.DataAxis(), ep: m.Mesh.ExpertAxis(), tp: m.Mesh.WeightAxis(), cp: m.Mesh.SequenceAxis(),
		params: map[string]*ir.Value{}, before: map[*ir.Value][]*ir.Value{}, after: map[*ir.Value][]*ir.Value{},
		cache: map[string]*ir.Value{}, prefer: map[*ir.Value][]ir.Placement{}, gatherable: map[*ir.Value]bool{}, keepWhole: map[*ir.Value]bool{},
		settle: map[*ir.Value][]ir.Placement{}, gradDest: map[*ir.Value][]ir.Placement{}}
	if err := s.planGradients(); err != nil {
		return err
	}
	values := m.Values
	for _, v := range values {
		if err := s.place(v); err != nil {
			return err
		}
	}
	// Outputs are read whole and updates must match their state. A
	// reduction goes right after the value (so evaluation, which runs the
	// program only up to the loss, includes it); anything else at the end.
	for i := range m.Outputs {
		o := &m.Outputs[i]
		want := ir.Replicated(m.Mesh)
		if !ir.SamePlacement(o.Value.Place, want) {
			o.Value = s.redistribute(o.Value, want, o.Value, !reduces(o.Value.Place, want))
		}
	}
	for i := range m.Updates {
		u := &m.Updates[i]
		if !ir.SamePlacement(u.Value.Place, u.State.Place) {
			u.Value = s.redistribute(u.Value, u.State.Place, u.Value, !reduces(u.Value.Place, u.State.Place))
		}
	}
	m.Values = splice(values, s.before, s.after)
	// A dim split by two axes is split in the mesh's split order for it
	// (tp first, but the ring's cp before tp: ir.Mesh.SplitOrderOn), and
	// the redistribute pass keeps its
	// collectives in that order; fused blocks split twice are not placed,
	// except a sequence split over cp merged into rows (S(0)xbatch on cp),
	// whose blocks the coarser batch axes split (ir.BlockBox).
	for _, v := range m.Values {
		for i, p := range v.Place {
			for j := i + 1; j < len(v.Place); j++ {
				q := v.Place[j]
				if s.sequenceRows(i, p, j, q) || s.sequenceRows(j, q, i, p) {
					continue
				}
				if p.Kind == ir.Shard && q.Kind == ir.Shard && p.Dim == q.Dim && (p.NumBlocks() > 1 || q.NumBlocks() > 1) {
					return fmt.Errorf("%s: dim %d of %v would be split in fused blocks over both %s and %s, which is %w", v.Where(), p.Dim, v.Type, m.Mesh.Axes[i].Name, m.Mesh.Axes[j].Name, ErrNotYet)
				}
			}
		}
	}
	return nil
}

// ErrNotYet marks plans that are valid but not implemented yet.
var ErrNotYet = fmt.Errorf("not yet supported")

type sharder struct {
	m             *ir.Module
	o             *Options
	dp, ep, tp    int // index of the dp, ep and tp axes, or -1
	cp            int // index of the context-parallel axis, or -1
	params        map[string]*ir.Value
	before, after map[*ir.Value][]*ir.Value
	cache         map[string]*ir.Value
	// prefer says where a partial-sum value should go when an op cannot
	// take it partial: gradients go to S(0) on dp under ZeRO-2/3 (reduce-
	// scatter) and to R otherwise (all-reduce).
	prefer map[*ir.Value][]ir.Placement
	// gatherable values are stored sharded but used whole: ZeRO-3
	// parameters, all-gathered before each forward and backward use, and
	// under mixed precision and ZeRO the 16-bit copies of the params
	// (made from the shards, so only 16 bits travel); keepWhole marks
	// those gathered once a step and kept until the backward is done.
	gatherable, keepWhole map[*ir.Value]bool
	// settle holds where a value's users other than attention ops read
	// it: an all2all attention's head-split result goes back to the
	// sequence split (contextParallelAttention).
	settle map[*ir.Value][]ir.Placement
	// gradDest is where the gradient an embedding_grad is summed into
	// goes (planGradients): a vocab-parallel table's gradient is made for
	// the device's rows only, from whole ids and dy.
	gradDest map[*ir.Value][]ir.Placement
}

// planGradients finds the gradient each optimizer op consumes (before and
// after clipping) and records where its partial sum should go: where the
// optimizer state lives (split over dp under ZeRO-2/3, else whole on dp),
// and like its param on tp.
func (s *sharder) planGradients() error {
	params := map[string]*ir.Value{}
	for _, v := range s.m.Values {
		if v.Op == "param" {
			params[v.Name()] = v
		}
	}
	for _, v := range s.m.Values {
		// An update from a gradient takes its param or state first and the
		// gradient (clipped or not) as argument ir.UpdateGradArg.
		if info, _ := ir.Lookup(v.Op); v.Meta.Phase != ir.PhaseOpt || len(v.Args) <= ir.UpdateGradArg || info == nil || info.Update != ir.UpdateFromGrad {
			continue
		}
		name := v.Args[0].Name()
		if v.Args[0].Op != "param" {
			_, name, _ = strings.Cut(strings.Replace(name, ":", "/", 1), "/")
		}
		p := params[name]
		if p == nil {
			continue
		}
		want := ir.Replicated(s.m.Mesh)
		if s.tp >= 0 && s.m.Mesh.Axes[s.tp].Size > 1 {
			t, err := s.tensorSeed(p)
			if err != nil {
				return err
			}
			want[s.tp] = t
		}
		if s.ep >= 0 {
			want[s.ep] = s.expertSeed(p)
		}
		// From stage 1 on each device updates only its shard of the
		// optimizer state, so it needs only that shard of the gradient:
		// the gradient is reduce-scattered, not all-reduced, and the
		// updated shards are gathered (Ψ·(N−1)/N each way, the traffic of
		// a plain all-reduce, where an all-reduce and a gather moved half
		// as much again).
		if s.o.Zero >= 1 && s.dp >= 0 && p.Type.Rank() > 0 {
			d, err := s.zeroPlace(p, want, fmt.Sprintf("ZeRO-%d", s.o.Zero))
			if err != nil {
				return err
			}
			want[s.dp] = d
		}
		// The optimizer's own scalings (clipping, and mixed precision's
		// unscaling) are linear: the gradient is reduced before them, where
		// the backward made it, so its reduction joins a bucket that
		// overlaps the rest of the backward rather than waiting for the
		// optimizer. Under mixed precision that is the fp32 copy of the
		// 16-bit gradient (or the fp32 sum of the microbatches'), scaled
		// by the loss scale, as Megatron-LM reduces its fp32 main_grad.
		g := v.Args[ir.UpdateGradArg]
		s.prefer[g] = want
		for g.Op == "scale" && g.Meta.Phase == ir.PhaseOpt {
			g = g.Args[0]
			s.prefer[g] = want
		}
		if s.o.Zero >= 2 && s.dp >= 0 && want[s.dp].Kind == ir.Shard {
			// ZeRO-2/3 with microbatches: each microbatch's gradients are
			// reduce-scattered as they come and the shards summed, as
			// DeepSpeed's stages 2 and 3 accumulate, so a device never
			// holds the whole sum. Stage 1 sums whole and reduce-scatters
			// once a step, as Megatron-LM's distributed optimizer does: 4
			// bytes a param more, and one reduction in place of m.
			s.preferEachMicrobatch(g, want)
		}
		s.markEmbeddingGrads(g, want, map[*ir.Value]bool{})
	}
	return nil
}

// markEmbeddingGrads records, for each embedding_grad summed into the
// gradient g (through the microbatches' sums, a tied head's sum, casts
// and scalings), where g is planned to go.
func (s *sharder) markEmbeddingGrads(g *ir.Value, want []ir.Placement, seen map[*ir.Value]bool) {
	if seen[g] {
		return
	}
	seen[g] = true
	switch g.Op {
	case "embedding_grad":
		s.gradDest[g] = want
	case "add", "scale", "cast":
		for _, a := range g.Args {
			if a.Meta.Phase == ir.PhaseBwd || a.Meta.Phase == ir.PhaseOpt {
				s.markEmbeddingGrads(a, want, seen)
			}
		}
	}
}

// preferEachMicrobatch plans the gradients summed into g over microbatches
// (the microbatch pass's fp32 adds, microbatch -1) to go to want one by
// one, before they are added.
func (s *sharder) preferEachMicrobatch(g *ir.Value, want []ir.Placement) {
	if g.Op != "add" || g.Meta.Micro >= 0 || g.Meta.Phase != ir.PhaseBwd {
		return
	}
	for _, a := range g.Args {
		if a.Meta.Micro >= 0 {
			s.prefer[a] = want
		} else {
			s.preferEachMicrobatch(a, want)
		}
	}
}

// zeroPlace is where ZeRO splits a param-shaped value over dp: the first
// dim that tp leaves whole and dp divides (dim 0 unless tp splits it, as
// for a vocab-parallel embedding), or else a dim tp splits whose tp part
// dp divides: a column-parallel bias is split inside each tp block (tp is
// first in the mesh's split order), so gathering over dp gives back the tp
// block. A vector tp splits in fused blocks (q, k, v's bias) stays whole
// over dp, and so does one whose tp part dp does not divide when no dim
// is free; otherwise no dim dp divides is an error.
func (s *sharder) zeroPlace(v *ir.Value, place []ir.Placement, why string) (ir.Placement, error) {
	n := s.m.Mesh.Axes[s.dp].Size
	dims := make([]int, v.Type.Rank())
	for i := range dims {
		dims[i] = i
	}
	if s.o.SequenceParallel {
		// Under sequence parallelism a gradient can come out split on dim 0
		// over tp (the position embedding's rows are sequence positions),
		// so ZeRO takes the last free dim instead.
		slices.Reverse(dims)
	}
	// parts is how many parts the other axes split dim d into; fused
	// reports a split in fused blocks.
	split := func(d int) (parts int, fused bool) {
		parts = 1
		for i, p := range place {
			if i != s.dp && p.Kind == ir.Shard && p.Dim == d {
				parts *= s.m.Mesh.Axes[i].Size
				fused = fused || p.NumBlocks() > 1
			}
		}
		return parts, fused
	}
	free := 0
	for _, d := range dims {
		if parts, _ := split(d); parts == 1 {
			free++
			if v.Type.Shape[d]%n == 0 {
				return ir.Placement{Kind: ir.Shard, Dim: d}, nil
			}
		}
	}
	if free > 0 {
		return ir.Placement{}, fmt.Errorf("%s: %s splits %q %v over dp=%d, but no dim is divisible by %d (and not already split over tp)", v.Where(), why, v.Name(), v.Type, n, n)
	}
	for _, d := range dims {
		if parts, fused := split(d); !fused && v.Type.Shape[d]%(parts*n) == 0 {
			return ir.Placement{Kind: ir.Shard, Dim: d}, nil
		}
	}
	return rep, nil
}

func (s *sharder) axisName(i int) string { return s.m.Mesh.Axes[i].Name }

// seed is the placement of a source value: on tp from the model's
// parallel hints (Megatron's layout), on dp from data parallelism and ZeRO.
// Optimizer state follows its param on tp.
func (s *sharder) seed(v *ir.Value) ([]ir.Placement, error) {
	place := ir.Replicated(s.m.Mesh)
	if v.Op == "param" {
		s.params[v.Name()] = v
	}
	if s.tp >= 0 && s.m.Mesh.Axes[s.tp].Size > 1 {
		p, err := s.tensorSeed(v)
		if err != nil {
			return nil, err
		}
		place[s.tp] = p
	}
	if s.ep >= 0 {
		place[s.ep] = s.expertSeed(v)
		if n := s.m.Mesh.Axes[s.ep].Size; v.Op == "param" && place[s.ep].Kind == ir.Shard && v.Type.Shape[0]%n != 0 {
			return nil, fmt.Errorf("%s: expert parallelism ep=%d must divide the %d experts of %q %v", v.Where(), n, v.Type.Shape[0], v.Name(), v.Type)
		}
		if v.Op == "input" && v.Type.Rank() > 0 && !v.Attrs.Bool("whole") {
			// Tokens are split over dp×ep, dp the coarser split.
			n := s.m.Mesh.SizeOf(s.dp) * s.m.Mesh.Axes[s.ep].Size
			if v.Type.Shape[0]%n != 0 {
				return nil, fmt.Errorf("%s: data and expert parallelism split %q %v along dim 0 over dp·ep = %d, which does not divide it", v.Where(), v.Name(), v.Type, n)
			}
			place[s.ep] = shardOn(0)
		}
	}
	if s.cp >= 0 && v.Op == "input" && v.Type.Rank() >= 2 && !v.Attrs.Bool("whole") {
		// Every [batch, seq, …] input is split on its sequence over cp;
		// the zigzag layout cuts it into 2·cp chunks.
		a := s.m.Mesh.Axes[s.cp]
		if seq := v.Type.Shape[1]; a.Zigzag && seq%(2*a.Size) != 0 {
			fix := "give a --cp that does, or --cp-layout contiguous"
			switch {
			case a.Size > seq:
				fix = fmt.Sprintf("cp=%d is more than its %d positions: give a --cp that divides half of them", a.Size, seq)
			case seq%a.Size != 0:
				fix = fmt.Sprintf("cp=%d does not divide the %d positions either: give a --cp whose double divides them", a.Size, seq)
			}
			return nil, fmt.Errorf("%s: context parallelism in the zigzag layout splits %q %v along its sequence (dim 1) into 2·cp = %d chunks, which do not divide it (%s)", v.Where(), v.Name(), v.Type, 2*a.Size, fix)
		}
		if v.Type.Shape[1]%a.Size != 0 {
			return nil, fmt.Errorf("%s: context parallelism splits %q %v along its sequence (dim 1) over cp=%d, which does not divide it", v.Where(), v.Name(), v.Type, a.Size)
		}
		place[s.cp] = shardOn(1)
	}
	if s.tp >= 0 && s.o != nil && s.o.SequenceParallel && v.Op == "input" && v.Type.Rank() >= 2 && !v.Attrs.Bool("whole") {
		// The activations of a [batch, seq, …] input are split on the
		// sequence over tp (after cp's split): said here once, not by
		// every op the split reaches.
		n := s.m.Mesh.Axes[s.tp].Size
		if s.cp >= 0 {
			n *= s.m.Mesh.Axes[s.cp].Size
		}
		if v.Type.Shape[1]%n != 0 {
			return nil, fmt.Errorf("%s: --sequence-parallel splits %q %v along its sequence (dim 1) over tp (·cp) = %d, which does not divide it: give a sequence length it divides, or leave sequence parallelism off", v.Where(), v.Name(), v.Type, n)
		}
	}
	if s.dp < 0 {
		return place, nil
	}
	dpSize := s.m.Mesh.Axes[s.dp].Size
	split := func(why string) error {
		if v.Op == "input" {
			// The batch dim.
			if v.Type.Shape[0]%dpSize != 0 {
				return fmt.Errorf("%s: %s splits %q %v along dim 0 over dp=%d, which does not divide it", v.Where(), why, v.Name(), v.Type, dpSize)
			}
			place[s.dp] = ir.Placement{Kind: ir.Shard, Dim: 0}
			return nil
		}
		p, err := s.zeroPlace(v, place, why)
		place[s.dp] = p
		return err
	}
	switch v.Op {
	case "input":
		if v.Type.Rank() > 0 && !v.Attrs.Bool("whole") {
			return place, split("data parallelism")
		}
	case "param":
		if (s.o.Zero >= 3 || s.splitsMasters()) && v.Type.Rank() > 0 {
			s.gatherable[v] = true
			return place, split(fmt.Sprintf("ZeRO-%d", s.o.Zero))
		}
	case "state":
		// A scalar has nothing to split; it stays whole on every device.
		if s.o.Zero >= 1 && v.Type.Rank() > 0 {
			return place, split(fmt.Sprintf("ZeRO-%d", s.o.Zero))
		}
	}
	return place, nil
}

// splitsMasters reports whether the params, mixed precision's fp32
// master weights, are split over dp with the optimizer state, as ZeRO's
// stages 1 and 2 split them (Rajbhandari et al.: the fp32 copy is part of
// the optimizer state). The 16-bit copy the forward and backward compute
// with is made from each device's shard and gathered once a step: the
// paper's 2Ψ of 16-bit params beside (2+K)Ψ/N of the rest, where keeping
// the masters whole held 4Ψ of them on every device, and the gather moves
// 16 bits a param, not 32.
func (s *sharder) splitsMasters() bool {
	return s.o.Zero >= 1 && s.dp >= 0 && (s.o.Precision == "fp16" || s.o.Precision == "bf16")
}

// tensorSeed reads a param's hint: column-parallel weights [in,out] split
// their columns (and their bias), a fused column weight splits each of its
// blocks, row-parallel weights split their rows, a vocab-parallel table
// its rows. Optimizer state (adam.m/NAME, …) is placed like NAME.
func (s *sharder) tensorSeed(v *ir.Value) (ir.Placement, error) {
	t := s.m.Mesh.Axes[s.tp].Size
	switch v.Op {
	case "state":
		return s.paramPlace(v, s.tp), nil
	case "param":
	default:
		return rep, nil
	}
	hint := v.Attrs.Str("parallel")
	if inner, ok := expertHint(hint); ok {
		return expertTensorSeed(v, inner, t)
	}
	split, layout, _ := strings.Cut(hint, ",")
	kind, blocksText, _ := strings.Cut(split, ":")
	blocks, unit := 1, 0
	if blocksText != "" {
		n, err := strconv.Atoi(blocksText)
		if err != nil || n < 1 {
			return rep, fmt.Errorf("%s: parallel hint %q of param %q: %q is not a positive count", v.Where(), hint, v.Name(), blocksText)
		}
		blocks = n
	}
	if kind == "heads" {
		kind, blocks, unit = "column", 1, blocks
	}
	outIn := layout == "out_in"
	var dim int
	switch {
	case hint == "":
		return rep, nil
	case layout != "" && (!outIn || v.Type.Rank() != 2 || kind == "vocab"):
		return rep, fmt.Errorf("%s: parallel hint %q does not fit param %q %v (a layout applies to a column or row matrix)", v.Where(), hint, v.Name(), v.Type)
	case kind == "column" && v.Type.Rank() == 2:
		dim = 1
	case kind == "column" && v.Type.Rank() == 1, kind == "row" && v.Type.Rank() == 2, kind == "vocab" && v.Type.Rank() == 2:
		dim = 0
	default:
		return rep, fmt.Errorf("%s: parallel hint %q does not fit param %q %v", v.Where(), hint, v.Name(), v.Type)
	}
	if outIn {
		dim = 1 - dim
	}
	if unit > 0 {
		// Whole heads or nothing: a grouped-query k/v projection whose
		// heads tp does not divide is replicated.
		if v.Type.Shape[dim]%unit != 0 {
			return rep, fmt.Errorf("%s: param %q %v: dim %d (%d) is not a whole number of %d-wide heads", v.Where(), v.Name(), v.Type, dim, v.Type.Shape[dim], unit)
		}
		if (v.Type.Shape[dim]/unit)%t != 0 {
			return rep, nil
		}
	}
	if v.Type.Shape[dim]%(t*blocks) != 0 {
		what := fmt.Sprintf("dim %d (%d)", dim, v.Type.Shape[dim])
		if blocks > 1 {
			what = fmt.Sprintf("each of its %d fused blocks (%d)", blocks, v.Type.Shape[dim]/blocks)
		}
		return rep, fmt.Errorf("%s: tensor parallelism tp=%d must divide %s of %s-parallel %q %v", v.Where(), t, what, kind, v.Name(), v.Type)
	}
	return blockShard(dim, blocks), nil
}

// blockShard is S(dim), with the block count written only when it matters.
func blockShard(dim, blocks int) ir.Placement {
	if blocks <= 1 {
		blocks = 0
	}
	return ir.Placement{Kind: ir.Shard, Dim: dim, Blocks: blocks}
}

func (s *sharder) place(v *ir.Value) error {
	info, _ := ir.Lookup(v.Op)
	if isKVCache(v) {
		return nil // placed at its kv_write (placeKVCache)
	}
	if v.Op == "kv_write" {
		placeKVCache(v)
	}
	if info.Source {
		p, err := s.seed(v)
		v.Place = p
		return err
	}
	if v.Op == "sum_squares" || v.Op == "nonfinite_count" {
		if err := s.splitSumSquares(v); err != nil {
			return err
		}
	}
	// Under mixed precision a sharded param's 16-bit copy is made on the
	// shard, and that copy is what is gathered (once a step below ZeRO-3).
	if v.Op == "cast" && s.gatherable[v.Args[0]] && v.Args[0].Op == "param" && v.Meta.Phase != ir.PhaseOpt && v.Type.DType != ir.F32 {
		s.gatherable[v] = true
		s.keepWhole[v] = s.o.Zero < 3
	} else if v.Meta.Phase != ir.PhaseOpt {
		// ZeRO-3: a sharded parameter is gathered whole before each
		// forward and backward use; the optimizer works on the shards.
		for i, a := range v.Args {
			if s.gatherable[a] {
				// Over dp only: the tensor-parallel split is what the op
				// computes with.
				whole := slices.Clone(a.Place)
				whole[s.dp] = rep
				if !ir.SamePlacement(a.Place, whole) {
					v.Args[i] = s.redistribute(a, whole, v, false)
				}
			}
		}
	}
	if !isAttentionOp(v.Op) {
		for i, a := range v.Args {
			if want, ok := s.settle[a]; ok {
				v.Args[i] = s.redistribute(a, want, v, false)
			}
		}
	}
	for attempt := 0; ; attempt++ {
		want, out, err := s.rule(v)
		if err != nil {
			return err
		}
		changed := false
		for i, a := range v.Args {
			if !ir.SamePlacement(a.Place, want[i]) {
				v.Args[i] = s.redistribute(a, want[i], v, false)
				changed = true
			}
		}
		if !changed || attempt > 0 {
			v.Place = out
			s.settleAttention(v)
			return nil
		}
	}
}

// sequenceRows reports whether axis a's placement p is a sequence split
// over cp merged into rows (S(d)xbatch) and axis b a batch axis splitting
// the same dim whole: b takes whole sequences, cp splits each.
func (s *sharder) sequenceRows(a int, p ir.Placement, b int, q ir.Placement) bool {
	return a == s.cp && p.Kind == ir.Shard && q.Kind == ir.Shard && p.Dim == q.Dim && p.NumBlocks() > 1 && q.NumBlocks() == 1 && s.m.Mesh.Axes[b].Role() == ir.RoleBatch
}

// isAttentionOp reports whether op is one of the fused attention ops.
func isAttentionOp(op string) bool {
	switch op {
	case "attention", "attention_stats", "attention_grad_q", "attention_grad_k", "attention_grad_v":
		return true
	}
	return false
}

// settleAttention records that an all2all attention's head-split result
// (not its statistics, which only the gradients read) is read by others
// split on its sequence again: the all_to_all back of Ulysses.
func (s *sharder) settleAttention(v *ir.Value) {
	if s.cp < 0 || !isAttentionOp(v.Op) || v.Op == "attention_stats" {
		return
	}
	_, result := attentionRoles(v.Op)
	if p := v.Place[s.cp]; p.Kind == ir.Shard && p.Dim == result.headDim() {
		want := slices.Clone(v.Place)
		want[s.cp] = shardOn(result.seqDim())
		s.settle[v] = want
	}
}

// splitSumSquares turns a global norm over tensors placed in different
// ways (split over tp, whole over tp, split over dp by ZeRO) into one
// sum_squares per placement and a sum of the scalars: each group's squares
// add up locally, and the scalars' placement rules reduce the partial ones
// with one all-reduce per group, not one per tensor. Mixed precision's
// nonfinite_count over the same gradients is split the same way: slicing
// a whole tensor to match the others would split q, k, v's bias, in fused
// blocks over tp and whole over dp under ZeRO, twice.
func (s *sharder) splitSumSquares(v *ir.Value) error {
	groups := map[string][]*ir.Value{}
	var order []string
	for i, a := range v.Args {
		place := append([]ir.Placement(nil), a.Place...)
		for ax, p := range place {
			if p.Kind == ir.Partial {
				place[ax] = AxisRule{s: s, v: v, ax: ax}.Resolve(i)
			}
		}
		// Under pipeline parallelism each rank squares its own gradients.
		key := fmt.Sprintf("%s@%d", ir.PlacementString(place), a.Meta.Stage)
		if groups[key] == nil {
			order = append(order, key)
		}
		groups[key] = append(groups[key], a)
	}
	if len(order) < 2 {
		return nil
	}
	var parts []*ir.Value
	for _, key := range order {
		meta := v.Meta
		meta.Stage = groups[key][0].Meta.Stage
		g, err := s.m.NewValue(v.Op, groups[key], nil, meta, v.Pos)
		if err != nil {
			return err
		}
		s.before[v] = append(s.before[v], g)
		if err := s.place(g); err != nil {
			return err
		}
		parts = append(parts, g)
	}
	for len(parts) > 2 {
		a, err := s.m.NewValue("add", parts[:2], nil, v.Meta, v.Pos)
		if err != nil {
			return err
		}
		s.before[v] = append(s.before[v], a)
		if err := s.place(a); err != nil {
			return err
		}
		parts = append([]*ir.Value{a}, parts[2:]...)
	}
	v.Op, v.Args, v.Attrs = "add", parts, nil
	return nil
}

// rule applies the op's sharding rule on every mesh axis.
func (s *sharder) rule(v *ir.Value) (want [][]ir.Placement, out []ir.Placement, err error) {
	n := len(s.m.Mesh.Axes)
	want = make([][]ir.Placement, len(v.Args))
	for i := range want {
		want[i] = make([]ir.Placement, n)
	}
	out = make([]ir.Placement, n)
	for ax := range n {
		if ax == s.m.Mesh.PipelineAxis() {
			// Pipeline ranks hold different values, not parts of one: every
			// value is whole on its rank (the lowering cuts by stage).
			continue
		}
		have := make([]ir.Placement, len(v.Args))
		for i, a := range v.Args {
			have[i] = a.Place[ax]
		}
		r := AxisRule{s: s, v: v, ax: ax, have: have}
		w, o, err := r.apply()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: sharding on axis %s: %w", v.Where(), s.axisName(ax), err)
		}
		for i := range w {
			want[i][ax] = w[i]
		}
		out[ax] = o
	}
	return want, out, nil
}

// redistribute returns a value holding v placed as want, creating the
// redistribute op once per (value, placement, phase).
func (s *sharder) redistribute(v *ir.Value, want []ir.Placement, user *ir.Value, atEnd bool) *ir.Value {
	// A change that reduces and also reshards happens in two steps: the
	// reduction alone, once, right after the value (shared by every user
	// and free to join a gradient bucket), then the rest before the user.
	if reduces(v.Place, want) {
		mid := append([]ir.Placement(nil), v.Place...)
		for i, p := range v.Place {
			if p.Kind == ir.Partial {
				mid[i] = want[i]
			}
		}
		if !ir.SamePlacement(mid, want) {
			r := s.redistribute(v, mid, user, atEnd)
			return s.redistribute(r, want, user, atEnd)
		}
	}
	// A reduction is made once, wherever it is needed; a gather is made
	// once per phase, so a ZeRO-3 parameter is not kept whole from the
	// forward pass to the backward pass.
	phase := user.Meta.Phase
	if reduces(v.Place, want) || onlyMoves(v.Place, want) || s.keepWhole[v] {
		// An all_to_all keeps the bytes a device holds (a local slice
		// only drops some): the moved copy can serve the backward pass
		// too, in place of its source.
		phase = ir.PhaseNone
	}
	micro := -1
	if s.gatherable[v] && !s.keepWhole[v] {
		// ZeRO-3 gathers a param for each microbatch's forward and
		// backward and drops it after (DeepSpeed's stage 3): one gather
		// a phase kept every layer whole across the step's microbatches.
		micro = user.Meta.Micro
	}
	key := fmt.Sprintf("%d %s %v %d", v.ID, ir.PlacementString(want), phase, micro)
	if r := s.cache[key]; r != nil {
		return r
	}
	at, meta := user, user.Meta
	if reduces(v.Place, want) {
		at, meta = v, v.Meta
	}
	// Placed by the before/after lists, not appended.
	r, err := s.m.NewValue("redistribute", []*ir.Value{v}, nil, meta, at.Pos)
	if err != nil {
		panic(err) // identity type rule: cannot fail
	}
	r.Place = append([]ir.Placement(nil), want...)
	switch {
	case atEnd:
		last := s.m.Values[len(s.m.Values)-1]
		s.after[last] = append(s.after[last], r)
	case reduces(v.Place, want) && s.definedAt(v) != nil:
		host := s.definedAt(v)
		s.after[host] = append(s.after[host], r)
	default:
		s.before[user] = append(s.before[user], r)
	}
	s.cache[key] = r
	return r
}

// reduces reports whether going from have to want sums partial values.
func reduces(have, want []ir.Placement) bool {
	for i, p := range have {
		if p.Kind == ir.Partial && want[i].Kind != ir.Partial {
			return true
		}
	}
	return false
}

// definedAt is the original value after which v's reduction is emitted:
// v itself, or, for a value inserted by this pass, the value it follows.
func (s *sharder) definedAt(v *ir.Value) *ir.Value {
	if v.Op != "redistribute" {
		return v
	}
	for host, list := range s.after {
		for _, x := range list {
			if x == v {
				return host
			}
		}
	}
	return nil
}

func placeNames(ps []ir.Placement) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// expertHint reports whether hint marks a mixture-of-experts weight
// [E, in, out] ("expert", or "expert|column" / "expert|row" for its split
// inside each expert over tp) and returns that inner split.
func expertHint(hint string) (inner string, ok bool) {
	rest, ok := strings.CutPrefix(hint, "expert")
	if !ok || rest != "" && rest[0] != '|' {
		return "", false
	}
	return strings.TrimPrefix(rest, "|"), true
}

// expertTensorSeed places an expert weight [E, in, out] on tp: each
// expert's matrix split as Megatron splits a dense MLP's, column-parallel
// on out, row-parallel on in.
func expertTensorSeed(v *ir.Value, inner string, t int) (ir.Placement, error) {
	var dim int
	switch {
	case v.Type.Rank() != 3:
		return rep, fmt.Errorf("%s: expert hint of param %q %v: an expert weight is [experts, in, out]", v.Where(), v.Name(), v.Type)
	case inner == "":
		return rep, nil
	case inner == "column":
		dim = 2
	case inner == "row":
		dim = 1
	default:
		return rep, fmt.Errorf("%s: parallel hint %q of param %q: within an expert only column or row splits exist", v.Where(), v.Attrs.Str("parallel"), v.Name())
	}
	if v.Type.Shape[dim]%t != 0 {
		return rep, fmt.Errorf("%s: tensor parallelism tp=%d must divide dim %d (%d) of expert weight %q %v", v.Where(), t, dim, v.Type.Shape[dim], v.Name(), v.Type)
	}
	return shardOn(dim), nil
}

// expertSeed is a param's or optimizer state's placement on ep: an expert
// weight [E, …] split by expert, everything else whole (its gradient is
// then summed over ep like over dp).
func (s *sharder) expertSeed(v *ir.Value) ir.Placement {
	switch v.Op {
	case "state":
		return s.paramPlace(v, s.ep)
	case "param":
		if _, ok := expertHint(v.Attrs.Str("parallel")); ok && v.Type.Rank() > 0 {
			return shardOn(0)
		}
	}
	return rep
}

// onlyMoves reports whether going from have to want moves shards from
// one dim to another on some axis (all_to_all) and otherwise at most
// slices whole values locally: nothing is gathered or reduced, so the
// result holds no more bytes than its source.
func onlyMoves(have, want []ir.Placement) bool {
	moved := false
	for i, p := range have {
		q := want[i]
		switch {
		case p.Equal(q):
		case p.Kind == ir.Shard && q.Kind == ir.Shard && p.NumBlocks() == 1 && q.NumBlocks() == 1:
			moved = true
		case p.Kind == ir.Replicate && q.Kind == ir.Shard:
		default:
			return false
		}
	}
	return moved
}

// paramPlace is where optimizer state (adam.m/NAME, …) goes on axis: like
// its param NAME, placed already; whole when there is none.
func (s *sharder) paramPlace(state *ir.Value, axis int) ir.Placement {
	_, name, _ := strings.Cut(state.Name(), "/")
	if p := s.params[name]; p != nil && p.Place != nil {
		return p.Place[axis]
	}
	return rep
}
