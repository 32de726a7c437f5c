package passes

import (
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// AxisRule is what a sharding rule sees: one op on one mesh axis, with
// its arguments' current placements on that axis. The rule decides which
// placement each argument must have and which placement the result gets.
type AxisRule struct {
	s    *sharder
	v    *ir.Value
	ax   int
	have []ir.Placement
}

// ShardRule decides, for one op on one mesh axis, the placement each
// argument must have (shard inserts a redistribute where it differs from
// r.Have) and the placement of the result. Its error says why the op
// cannot run on the placements it is given; shard adds the op, the user's
// line and the axis.
type ShardRule func(r AxisRule) (want []ir.Placement, out ir.Placement, err error)

var (
	rep = ir.Placement{Kind: ir.Replicate}
	par = ir.Placement{Kind: ir.Partial}
)

func shardOn(d int) ir.Placement { return ir.Placement{Kind: ir.Shard, Dim: d} }

// moved is p on another dim, keeping its blocks.
func moved(p ir.Placement, d int) ir.Placement {
	p.Dim = d
	return p
}

// Value is the op being placed; its Args are in argument order.
func (r AxisRule) Value() *ir.Value { return r.v }

// Have is each argument's current placement on the axis.
func (r AxisRule) Have() []ir.Placement { return slices.Clone(r.have) }

// Axis is the mesh axis being placed: its name and size.
func (r AxisRule) Axis() ir.MeshAxis { return r.s.m.Mesh.Axes[r.ax] }

// Resolve is where partial argument i goes when the op cannot take it
// partial: the planned placement for gradients, otherwise whole.
func (r AxisRule) Resolve(i int) ir.Placement {
	if p, ok := r.s.prefer[r.v.Args[i]]; ok {
		return p[r.ax]
	}
	if r.seqParallel() && r.v.Args[i].Type.Rank() == 3 {
		return shardOn(1) // [batch, seq, hidden]: reduce-scatter on seq
	}
	return rep
}

// sequence reports whether this axis is the context-parallel one (cp).
func (r AxisRule) sequence() bool { return r.ax == r.s.cp }

// seqParallel reports whether this axis is tp with sequence parallelism on.
func (r AxisRule) seqParallel() bool {
	return r.s.o != nil && r.s.o.SequenceParallel && r.ax == r.s.tp
}

// Same is placement p for every argument.
func (r AxisRule) Same(p ir.Placement) []ir.Placement {
	w := make([]ir.Placement, len(r.have))
	for i := range w {
		w[i] = p
	}
	return w
}

// shardRules maps each op to its rule family. An op missing here has no
// way to run on placed arguments yet, and placing it is an error.
var shardRules = map[string]ShardRule{}

// HasShardRule reports whether op has a registered sharding rule.
func HasShardRule(op string) bool {
	_, ok := shardRules[op]
	return ok
}

// RegisterShardRule makes rule the sharding rule of op, an op of the ir
// table that computes (not a source). It refuses an unknown op and a
// second rule for one op. ElementwiseRule and WholeRule are families a new
// op may reuse. Call it from an init function, after the op's
// ir.Register: the table is not guarded for concurrent use.
func RegisterShardRule(op string, rule ShardRule) error {
	info, ok := ir.Lookup(op)
	switch {
	case !ok:
		return fmt.Errorf("passes: sharding rule for op %q, which is not in the ir op table", op)
	case rule == nil:
		return fmt.Errorf("passes: nil sharding rule for op %s", op)
	case info.Source:
		return fmt.Errorf("passes: op %s is a source: shard places it from the plan, not by a rule", op)
	}
	if _, dup := shardRules[op]; dup {
		return fmt.Errorf("passes: op %s already has a sharding rule", op)
	}
	shardRules[op] = rule
	return nil
}

func init() {
	for _, op := range []string{"add", "sub", "mul", "div", "neg", "exp", "log", "tanh", "sqrt", "gelu", "relu", "silu",
		"gelu_grad", "relu_grad", "silu_grad", "tanh_grad", "scale", "cast", "adam_m", "adam_v", "adamw", "sgd_buf", "sgd"} {
		shardRules[op] = ElementwiseRule
	}
	shardRules["matmul"] = matmulRule
	shardRules["reshape"] = reshapeRule
	shardRules["transpose"] = transposeRule
	shardRules["slice"] = sliceRule
	shardRules["slice_grad"] = sliceRule
	shardRules["concat"] = concatRule
	shardRules["broadcast"] = broadcastRule
	shardRules["repeat_interleave"] = repeatRule
	shardRules["repeat_interleave_grad"] = repeatRule
	shardRules["reduce_sum"] = reduceRule
	shardRules["reduce_mean"] = reduceRule
	shardRules["reduce_max"] = reduceRule
	shardRules["reduce_max_grad"] = reduceMaxGradRule
	for _, op := range []string{"softmax", "softmax_grad", "causal_mask", "layernorm", "layernorm_grad_x", "layernorm_grad_gamma",
		"rmsnorm", "rmsnorm_grad_x", "rmsnorm_grad_gamma", "rope"} {
		shardRules[op] = rowwiseRule
	}
	for _, op := range []string{"attention", "attention_stats", "attention_grad_q", "attention_grad_k", "attention_grad_v"} {
		shardRules[op] = attentionRule
	}
	shardRules["embedding"] = embeddingRule
	shardRules["embedding_grad"] = embeddingGradRule
	shardRules["cross_entropy"] = crossEntropyRule
	shardRules["cross_entropy_grad"] = crossEntropyRule
	shardRules["sum_squares"] = sumSquaresRule
	// Counts of non-finite elements add up like sums of squares.
	shardRules["nonfinite_count"] = sumSquaresRule
	shardRules["where_finite"] = whereFiniteRule
	shardRules["clip_coef"] = func(r AxisRule) ([]ir.Placement, ir.Placement, error) { return r.Same(rep), rep, nil }
	for _, op := range []string{"adafactor_row", "adafactor_col", "adafactor_v", "adafactor", "adafactor_vec", "sm3_row", "sm3_col", "sm3"} {
		shardRules[op] = WholeRule
	}
	// SM3 of an unfactored param is AdaGrad: element by element.
	shardRules["sm3_v"] = ElementwiseRule
	shardRules["sm3_vec"] = ElementwiseRule
	shardRules["relu_mask"] = reluMaskRule
	shardRules["relu_grad_mask"] = reluGradMaskRule
}

// reluMaskRule: the mask is split like x. Along every dim but the last
// that is plain elementwise; along the last, packed 8 elements to a byte,
// each device packs its own elements, which are bytes of the global mask
// only when every local piece of the dim (one per fused block) holds a
// multiple of 8 elements. x partial is summed first: a sign is not linear.
func reluMaskRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	if p.Kind == ir.Partial {
		p = r.Resolve(0)
	}
	if err := r.packable(p, r.v.Args[0].Type); err != nil {
		return nil, rep, err
	}
	return []ir.Placement{p}, p, nil
}

// reluGradMaskRule: the mask decides, and dy (and the result, x's
// gradient) are placed like it, which is like x. The mask itself is never
// moved: packed bits would need byte-wise collectives, and a dy placed
// otherwise is the rare case, so dy moves instead.
func reluGradMaskRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	if p.Kind == ir.Partial {
		return nil, rep, fmt.Errorf("relu_grad_mask with a partial-sum mask: a mask of signs cannot be summed")
	}
	if err := r.packable(p, r.v.Type); err != nil {
		return nil, rep, err
	}
	return []ir.Placement{p, p}, p, nil
}

// packable checks that a placement of an unpacked tensor t can carry over
// to its packed mask: a split of the last dim must leave each device
// pieces of whole bytes.
func (r AxisRule) packable(p ir.Placement, t ir.Type) error {
	last := t.Rank() - 1
	if p.Kind != ir.Shard || p.Dim != last {
		return nil
	}
	size := r.s.m.Mesh.Axes[r.ax].Size
	n, pieces := t.Shape[last], size*p.NumBlocks()
	if n%(8*pieces) == 0 {
		return nil
	}
	held := fmt.Sprintf("%d/%d elements", n, pieces)
	if n%pieces == 0 {
		held = fmt.Sprintf("%d elements", n/pieces)
	}
	return fmt.Errorf("%s packs dim %d of %v 8 elements to a byte, but split %v over %s=%d a device holds pieces of %s, not a multiple of 8: the dim must be a multiple of %d",
		r.v.Op, last, t, p, r.s.axisName(r.ax), size, held, 8*pieces)
}

// WholeRule wants every argument whole and gives a whole result: a rule
// for any op, at the price of gathering. The built-in users are the
// optimizer ops that reduce over a whole param: Adafactor's and SM3's row
// and column statistics, Adafactor's RMS of the update and of the param.
// A shard alone cannot compute them, so under tp or ZeRO the param,
// gradient and state are gathered for the update and the result is sliced
// back to the state's placement; a weight split in fused blocks (the fused
// qkv projection, S(1)x3 on tp) is gathered and sliced block by block.
// That is correct but costs a gather and a whole copy per param; computing
// the statistics from shards (partial row/column sums, max all-reduces for
// SM3) would move only vectors.
func WholeRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	return r.Same(rep), rep, nil
}

func (r AxisRule) apply() ([]ir.Placement, ir.Placement, error) {
	f, ok := shardRules[r.v.Op]
	if !ok {
		return nil, rep, fmt.Errorf("op %s has no sharding rule yet; its arguments are %s", r.v.Op, placeNames(r.have))
	}
	return f(r)
}

// partialThrough reports whether the op maps partial sums in its partial
// arguments to a partial sum of its result, the others fixed and whole:
// sums of partials, negation, casts, and products or quotients with
// exactly one partial factor in the numerator.
func partialThrough(op string, have []ir.Placement) bool {
	partial := 0
	for _, p := range have {
		switch p.Kind {
		case ir.Partial:
			partial++
		case ir.Shard:
			return false
		}
	}
	switch op {
	case "add", "sub":
		return partial == len(have)
	case "neg", "cast":
		return partial == 1
	case "mul":
		return partial == 1
	case "div", "scale":
		return partial == 1 && have[0].Kind == ir.Partial
	}
	return false
}

// ElementwiseRule is the rule of ops that map equal-shaped arguments to a
// result of that shape element by element: full-shape arguments share one
// placement; lower-rank arguments (learning rate, step, scale factors)
// must be whole. A sharded argument decides the placement (whole arguments
// are sliced locally, for free); partial arguments stay partial only
// through linear ops and are otherwise reduced to their planned placement.
func ElementwiseRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	rank := r.v.Type.Rank()
	full := func(i int) bool { return r.v.Args[i].Type.Rank() == rank }
	// A partial value with a planned placement (a gradient) is reduced
	// once, to that placement, and every user reads the reduced copy; it
	// is not carried partial through linear ops to be reduced again.
	planned := false
	for i, p := range r.have {
		_, ok := r.s.prefer[r.v.Args[i]]
		planned = planned || p.Kind == ir.Partial && ok
	}
	if !planned && partialThrough(r.v.Op, r.have) {
		return slices.Clone(r.have), par, nil
	}
	target := rep
	for i, p := range r.have {
		if full(i) && p.Kind == ir.Shard {
			target = p
			break
		}
	}
	if target.Kind == ir.Replicate {
		for i, p := range r.have {
			if p.Kind == ir.Partial {
				if q := r.Resolve(i); q.Kind == ir.Shard && full(i) {
					target = q
					break
				}
			}
		}
	}
	want := make([]ir.Placement, len(r.have))
	for i := range want {
		if full(i) {
			want[i] = target
		} else {
			want[i] = rep
		}
	}
	return want, target, nil
}

// matmul on one axis: batch or row sharding passes through, column
// sharding of the weight gives column-sharded output, matching sharding
// of the contraction dim gives a partial sum.
func matmulRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	a, b := r.v.Args[0].Type, r.v.Args[1].Type
	ta, tb := r.v.Attrs.Bool("transA"), r.v.Attrs.Bool("transB")
	ra, rb, ro := a.Rank(), b.Rank(), r.v.Type.Rank()
	mA, kA := ra-2, ra-1
	if ta {
		mA, kA = kA, mA
	}
	kB, nB := rb-2, rb-1
	if tb {
		kB, nB = nB, kB
	}
	pa, pb := r.have[0], r.have[1]
	try := func(pa, pb ir.Placement) (ir.Placement, bool) {
		switch {
		case pa.Kind == ir.Replicate && pb.Kind == ir.Replicate:
			return rep, true
		case pa.Kind == ir.Partial && pb.Kind == ir.Replicate, pa.Kind == ir.Replicate && pb.Kind == ir.Partial:
			return par, true
		case pa.Kind == ir.Shard && pa.Dim < ra-2 && (rb == 2 && pb.Kind == ir.Replicate || rb > 2 && pb.Equal(pa)):
			return pa, true // batch dim
		case pa.Kind == ir.Shard && pa.Dim == mA && pb.Kind == ir.Replicate:
			return moved(pa, ro-2), true // rows
		case pa.Kind == ir.Replicate && pb.Kind == ir.Shard && pb.Dim == nB:
			return moved(pb, ro-1), true // columns
		case pa.Kind == ir.Shard && pa.Dim == kA && pb.Kind == ir.Shard && pb.Dim == kB && pa.NumBlocks() == pb.NumBlocks():
			return par, true // contraction
		}
		return rep, false
	}
	if out, ok := try(pa, pb); ok {
		return []ir.Placement{pa, pb}, out, nil
	}
	// A partial operand of a product with a sharded one is reduced first.
	if pa.Kind == ir.Partial {
		pa = r.Resolve(0)
	}
	if pb.Kind == ir.Partial {
		pb = r.Resolve(1)
	}
	// Sequence parallel: activations split on the sequence are gathered
	// before a matmul with a split weight, and so is an operand split on
	// the sequence where it is contracted with one split another way (the
	// LM head's weight gradient at batch 1; v whole on tp times heads-split
	// probabilities).
	switch {
	case r.seqParallel() && pa.Kind == ir.Shard && pa.Dim != kA && pb.Kind == ir.Shard && pb.Dim == kB && pa.NumBlocks() == 1 && pb.NumBlocks() == 1:
		pb = rep
	case r.seqParallel() && pb.Kind == ir.Shard && pb.Dim != kB && pa.Kind == ir.Shard && pa.Dim == kA && pa.NumBlocks() == 1:
		// pb may be a fused weight's gradient, split in blocks (GPT-2's
		// c_attn at batch 1): only pa is gathered.
		pa = rep
	case r.seqParallel() && pa.Kind == ir.Shard && pa.Dim != kA && pb.Kind == ir.Shard:
		pa = rep
	}
	// A batched pair sharded on the batch of one side: slice the other.
	if rb > 2 && pa.Kind == ir.Shard && pa.Dim < ra-2 && pb.Kind == ir.Replicate {
		pb = pa
	}
	if rb > 2 && pb.Kind == ir.Shard && pb.Dim < rb-2 && pa.Kind == ir.Replicate {
		pa = pb
	}
	// Expert parallelism: weights split by expert (a batch dim) meet
	// tokens split another way (by routing group); the tokens move to
	// their experts' devices, an all_to_all, rather than the weights to
	// the tokens.
	if rb > 2 && pb.Kind == ir.Shard && pb.Dim < rb-2 && pb.NumBlocks() == 1 && pa.Kind == ir.Shard && pa.Dim != pb.Dim && pa.NumBlocks() == 1 {
		pa = pb
	}
	if rb > 2 && pa.Kind == ir.Shard && pa.Dim < ra-2 && pa.NumBlocks() == 1 && pb.Kind == ir.Shard && pb.Dim != pa.Dim && pb.NumBlocks() == 1 {
		pb = pa
	}
	// A gradient that arrives whole (the backward of a sum over the split
	// dim broadcasts it) meets a weight split on the dim they contract:
	// each device slices its own part, a local shard_slice, and the
	// product is partial, as a column-parallel layer's input gradient is.
	// In the forward a whole input there is a plan's mistake, said below.
	if r.v.Meta.Phase == ir.PhaseBwd {
		switch {
		case pa.Kind == ir.Replicate && pb.Kind == ir.Shard && pb.Dim == kB && pb.NumBlocks() == 1:
			pa = ir.Placement{Kind: ir.Shard, Dim: kA}
		case pb.Kind == ir.Replicate && pa.Kind == ir.Shard && pa.Dim == kA && pa.NumBlocks() == 1:
			pb = ir.Placement{Kind: ir.Shard, Dim: kB}
		}
	}
	if out, ok := try(pa, pb); ok {
		return []ir.Placement{pa, pb}, out, nil
	}
	why := ""
	if r.have[0].Kind == ir.Replicate && r.have[1].Kind == ir.Shard && r.have[1].Dim == kB {
		// A row-parallel weight meets a whole activation: what makes it
		// was gathered rather than split on its last dim.
		n := r.s.m.Mesh.Axes[r.ax].Size
		why = fmt.Sprintf(" (the weight is split on the dim it contracts, so its input must be split there too, as a column-parallel layer, or attention whose heads divide by %s=%d, leaves it; here it arrives whole)", r.s.axisName(r.ax), n)
	}
	return nil, rep, fmt.Errorf("matmul %v·%v has no rule for operands placed %s and %s over %s%s%s%s", a, b, placedWords(r.have[0]), placedWords(r.have[1]), r.s.axisName(r.ax), why,
		hintOrigin(r.v.Args[0]), hintOrigin(r.v.Args[1]))
}

// placedWords is a placement in the dumps' notation and in words.
func placedWords(p ir.Placement) string {
	switch {
	case p.Kind == ir.Replicate:
		return "R (whole on every device)"
	case p.Kind == ir.Partial:
		return "P (partial sums, one a device)"
	case p.NumBlocks() > 1:
		return fmt.Sprintf("%v (split on dim %d, in each of %d fused blocks)", p, p.Dim, p.NumBlocks())
	}
	return fmt.Sprintf("%v (split on dim %d)", p, p.Dim)
}

// hintOrigin names the params whose parallel hints placed v: v itself, or
// the hinted params a few ops up its arguments. A misused hint (row on a
// table added to the activations) shows up as a matmul without a rule,
// lines away from the param it is written on.
func hintOrigin(v *ir.Value) string {
	var found []string
	seen := map[*ir.Value]bool{}
	level := []*ir.Value{v}
	for depth := 0; depth < 4 && len(level) > 0; depth++ {
		var next []*ir.Value
		for _, x := range level {
			if seen[x] {
				continue
			}
			seen[x] = true
			if x.Op == "param" {
				if h := x.Attrs.Str("parallel"); h != "" {
					found = append(found, fmt.Sprintf("%q's hint %q (%s)", x.Name(), h, x.Pos))
				}
				continue
			}
			next = append(next, x.Args...)
		}
		level = next
	}
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("; %%%d is placed by the parallel hints of %s", v.ID, strings.Join(found, ", "))
}

// reshapeRule keeps a sharded dim sharded when the reshape leaves the
// same elements in each device's block: the dims before it multiply to the
// same number on both sides and the new dim still splits evenly.
func reshapeRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	if p.Kind != ir.Shard {
		return r.have, p, nil
	}
	in, out := r.v.Args[0].Type.Shape, r.v.Type.Shape
	n := r.s.m.Mesh.Axes[r.ax].Size
	prefix := in[:p.Dim].NumElements()
	// chunks is how many pieces the axis cuts a dim into: 2·n in the
	// zigzag layout, rank i holding pieces i and 2n−1−i. A dim cut out
	// of the split one keeps the layout only if it cuts into as many
	// pieces: [seq] → [2, seq/2] under zigzag cp2 would hand rank 0 the
	// first half where it holds the first and last quarters.
	chunks := n
	if r.s.m.Mesh.Axes[r.ax].Zigzag {
		chunks = 2 * n
	}
	if r.sequence() {
		if q, ok := mergeSequence(in, out, p, n, chunks); ok {
			return r.have, q, nil
		}
	}
	for d := range out {
		if out[:d].NumElements() != prefix {
			continue
		}
		// Fused blocks survive only a reshape that leaves their dim whole.
		if p.NumBlocks() > 1 && out[d] == in[p.Dim] {
			return r.have, moved(p, d), nil
		}
		if p.NumBlocks() == 1 && out[d]%chunks == 0 && in[p.Dim]%chunks == 0 && (out[d]%in[p.Dim] == 0 || in[p.Dim]%out[d] == 0) {
			return r.have, shardOn(d), nil
		}
	}
	if r.seqParallel() || r.sequence() {
		// Gather the sequence first: under cp, routing groups that the
		// chunks do not hold whole (mergeSequence) are routed whole.
		return []ir.Placement{rep}, rep, nil
	}
	by := fmt.Sprintf("%s=%d", r.s.axisName(r.ax), n)
	if chunks != n {
		by = fmt.Sprintf("the %d chunks of the zigzag layout over %s", chunks, by)
	}
	for d := range out {
		// The split dim's leading factor lands whole in dim d: when it
		// does not divide, that factor is the cause (the 3 heads of
		// [.., 96] → [.., 3, 32] under tp=2), not the 96.
		if out[:d].NumElements() == prefix && out[d] > 1 && in[p.Dim]%out[d] == 0 && out[d]%chunks != 0 {
			return nil, rep, fmt.Errorf("reshape %v → %v cuts dim %d (size %d), split over %s=%d, into %d × %d: the %d (in an attention, its heads) is not divisible by %s, so no device holds a whole part of it", in, out, p.Dim, in[p.Dim], r.s.axisName(r.ax), n, out[d], in[p.Dim]/out[d], out[d], by)
		}
	}
	return nil, rep, fmt.Errorf("reshape %v → %v cannot keep dim %d (size %d) split over %s=%d: no dim of the result holds the same blocks (e.g. the heads are not divisible by %d)", in, out, p.Dim, in[p.Dim], r.s.axisName(r.ax), n, n)
}

// mergeSequence places a reshape of a sequence split over cp that merges
// the sequence with the dims before it ([batch, seq, h] → [batch·seq, h]:
// each sequence becomes a block of the rows, split over cp, S(0)xbatch),
// cutting it into groups of T tokens on the way ([batch, seq, h] →
// [batch·seq/T, T, h], the routing groups of a mixture of experts: each
// sequence's seq/T groups a block split over cp), merges such groups with
// their tokens or cuts rows into them again (the blocks kept), or undoes
// such a reshape. chunks is how many pieces the axis cuts a sequence into (2·cp
// in the zigzag layout): each must hold whole groups. Other reshapes take
// reshapeRule's general path.
func mergeSequence(in, out ir.Shape, p ir.Placement, n, chunks int) (ir.Placement, bool) {
	prefix := in[:p.Dim].NumElements()
	k := int64(p.NumBlocks())
	// group is the tokens of one group when dim d holds the groups and
	// the next dim their tokens (1: no such dim, tokens are rows).
	group := func(d int, groups int64) int64 {
		if groups <= 0 || int64(in[p.Dim])%groups != 0 {
			return 0
		}
		t := int64(in[p.Dim]) / groups
		if t > 1 && (d+1 >= len(out) || int64(out[d+1]) != t) {
			return 0
		}
		return t
	}
	for d := range out {
		before := out[:d].NumElements()
		switch {
		case k == 1 && before < prefix && prefix%before == 0 && int64(out[d])%(prefix/before) == 0:
			groups := int64(out[d]) / (prefix / before) // of one sequence
			if t := group(d, groups); t > 0 && groups%int64(chunks) == 0 {
				return blockShard(d, int(prefix/before)), true
			}
		case k > 1 && before == prefix && out[d]%in[p.Dim] == 0:
			// The groups merge with their tokens (or capacity slots):
			// each block's part stays whole groups.
			return moved(p, d), true
		case k > 1 && before == prefix && in[p.Dim]%out[d] == 0 && int64(out[d])%(k*int64(chunks)) == 0:
			// Rows cut into groups again, whole groups on each device.
			return moved(p, d), true
		case k > 1 && before == prefix*k && int64(out[d])*k%int64(in[p.Dim]) == 0 && out[d]%n == 0:
			t := int64(out[d]) * k / int64(in[p.Dim])
			if t == 1 || p.Dim+1 < len(in) && int64(in[p.Dim+1]) == t {
				return shardOn(d), true
			}
		}
	}
	return ir.Placement{}, false
}

// repeatRule: a split of the repeated dim stays a split when the axis
// divides the smaller side (the k/v heads), since each device's query
// heads then share whole k/v heads of its own. Otherwise the value is made
// whole first: grouped-query attention whose k/v heads tp does not divide
// keeps k and v replicated (their projections are replicated, as Megatron
// and vLLM do), and the gradient gathers its query heads before summing
// them into k/v heads. Other placements pass through (the op is linear).
func repeatRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	dim := r.v.Attrs.Int("dim", 0)
	if p.Kind != ir.Shard || p.Dim != dim {
		return r.have, p, nil
	}
	small := min(r.v.Args[0].Type.Shape[dim], r.v.Type.Shape[dim])
	if p.NumBlocks() == 1 && small%r.s.m.Mesh.Axes[r.ax].Size == 0 {
		return r.have, p, nil
	}
	return []ir.Placement{rep}, rep, nil
}

func transposeRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	if p.Kind != ir.Shard {
		return r.have, p, nil
	}
	return r.have, moved(p, slices.Index(r.v.Attrs.Ints("perm"), p.Dim)), nil
}

// sliceRule: slicing a dim that is not split is local. A dim split in
// fused blocks may be sliced on block boundaries (q, k, v out of a fused
// projection): every device slices its part of the chosen blocks.
// slice_grad, the inverse, pads back to the fused layout.
func sliceRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	dim := r.v.Attrs.Int("dim", 0)
	if p.Kind != ir.Shard || p.Dim != dim {
		return r.have, p, nil
	}
	in, out := r.v.Args[0].Type.Shape[dim], r.v.Type.Shape[dim]
	block := in / p.NumBlocks()
	start := r.v.Attrs.Int("start", 0)
	if r.v.Op == "slice" && start%block == 0 && out%block == 0 {
		return r.have, blockShard(dim, out/block), nil
	}
	if r.v.Op == "slice_grad" && start%block == 0 && out%block == 0 {
		return r.have, blockShard(dim, out/block), nil
	}
	if r.v.Op == "slice_grad" && p.NumBlocks() == 1 {
		// The gradient of a slice of a whole dim (a position table's
		// first seq rows) stays split in blocks of the slice's length.
		return nil, rep, fmt.Errorf("slice_grad puts the gradient of %d rows, split over %s, back into %d rows at %d: under that split the rows and the start must be multiples of %d (a position table: its rows, ctx, a multiple of seq)", in, r.s.axisName(r.ax), out, start, block)
	}
	return nil, rep, fmt.Errorf("%s along dim %d, which is split over %s, at %d: not on a boundary of its %d-wide blocks", r.v.Op, dim, r.s.axisName(r.ax), start, block)
}

func concatRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	for _, q := range r.have {
		if q != p {
			return nil, rep, fmt.Errorf("concat of arguments placed %s: they must agree", placeNames(r.have))
		}
	}
	if p.Kind == ir.Shard && p.Dim == r.v.Attrs.Int("dim", 0) {
		return nil, rep, fmt.Errorf("concat along dim %d, which is sharded", p.Dim)
	}
	return r.have, p, nil
}

func broadcastRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	if p.Kind != ir.Shard {
		return r.have, p, nil
	}
	in, out := r.v.Args[0].Type.Shape, r.v.Type.Shape
	off := len(out) - len(in)
	if in[p.Dim] != out[p.Dim+off] {
		return nil, rep, fmt.Errorf("broadcast expands dim %d, which is sharded", p.Dim)
	}
	return r.have, moved(p, p.Dim+off), nil
}

// reduceRule: summing (or averaging) over a sharded dim leaves each device
// a partial result; the lowering scales a partial mean by the local share.
func reduceRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[0]
	axes := r.v.Attrs.Ints("axes")
	switch {
	case p.Kind == ir.Partial && r.v.Op == "reduce_max":
		return []ir.Placement{r.Resolve(0)}, rep, nil
	case p.Kind != ir.Shard:
		return r.have, p, nil
	case slices.Contains(axes, p.Dim):
		if r.v.Op == "reduce_max" {
			return nil, rep, fmt.Errorf("reduce_max over sharded dim %d: a max of partial maxima needs a max all-reduce, which is not implemented", p.Dim)
		}
		return r.have, par, nil
	}
	d := p.Dim
	if !r.v.Attrs.Bool("keepdims") {
		for _, a := range axes {
			if a < p.Dim {
				d--
			}
		}
	}
	return r.have, moved(p, d), nil
}

// reduceMaxGradRule follows x: its kept dims carry their sharding to y
// and dy (which have the reduced shape) and to the result.
func reduceMaxGradRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	x := r.have[0]
	if x.Kind == ir.Partial {
		x = r.Resolve(0)
	}
	if x.Kind != ir.Shard {
		return []ir.Placement{x, rep, rep}, x, nil
	}
	axes := r.v.Attrs.Ints("axes")
	if slices.Contains(axes, x.Dim) {
		return nil, rep, fmt.Errorf("reduce_max_grad over sharded dim %d", x.Dim)
	}
	d := x.Dim
	if !r.v.Attrs.Bool("keepdims") {
		for _, a := range axes {
			if a < x.Dim {
				d--
			}
		}
	}
	// The max and its gradient keep x's split of that dim, blocks too
	// (an MoE router's [groups, tokens, experts] under cp: each
	// sequence's groups a block).
	return []ir.Placement{x, moved(x, d), moved(x, d)}, x, nil
}

// rowwiseRule covers ops that normalise over the last dim(s): the row dims
// may be sharded, the normalised dims may not, partial inputs are reduced
// first, and per-feature vectors (γ, β) stay whole. layernorm_grad_gamma
// sums over rows, so sharded rows give a partial result.
func rowwiseRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	x := r.v.Args[0].Type
	inner := 1
	if r.v.Op == "causal_mask" || r.v.Op == "rope" && !r.sequence() {
		// The mask and the rotation depend on the row's position. Over cp
		// the rotation finds its rows' global positions from the
		// placement (runtime.SeqPositions).
		inner = 2
	}
	target := rep
	for i, p := range r.have {
		if r.v.Args[i].Type.Rank() != x.Rank() {
			continue
		}
		if p.Kind == ir.Partial {
			// A norm is not linear: the sum is made first, scattered on
			// the sequence under sequence parallelism (Resolve), as the
			// Llama's first RMSNorm reads its vocab-parallel embedding.
			p = r.Resolve(i)
		}
		if p.Kind == ir.Shard {
			if p.Dim >= x.Rank()-inner {
				if r.seqParallel() {
					// The rotation of k or v projected by a weight whole
					// on tp (k/v heads tp does not divide): gather the
					// sequence first.
					continue
				}
				return nil, rep, fmt.Errorf("%s normalises over dim %d, which is sharded%s", r.v.Op, p.Dim, hintOrigin(r.v.Args[0]))
			}
			target = p
		}
	}
	want := make([]ir.Placement, len(r.have))
	for i := range want {
		if r.v.Args[i].Type.Rank() == x.Rank() {
			want[i] = target
		} else {
			want[i] = rep
		}
	}
	out := target
	if (r.v.Op == "layernorm_grad_gamma" || r.v.Op == "rmsnorm_grad_gamma") && target.Kind == ir.Shard {
		out = par
	}
	return want, out, nil
}

func embeddingRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	table, ids := r.have[0], r.have[1]
	switch {
	case table.Kind == ir.Partial:
		return []ir.Placement{r.Resolve(0), ids}, ids, nil
	case table.Kind == ir.Shard && table.Dim == 0 && table.NumBlocks() == 1 && ids.Kind == ir.Replicate:
		// Vocab-parallel: each device looks up the ids in its rows and
		// gives zeros for the rest, so the result is a partial sum.
		return r.have, par, nil
	case table.Kind == ir.Shard:
		return nil, rep, fmt.Errorf("embedding table placed %v with ids %v has no rule", table, ids)
	}
	return r.have, ids, nil
}

func embeddingGradRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	ids, dy := r.have[0], r.have[1]
	switch {
	case ids.Kind == ir.Shard && ids.Dim < r.v.Args[0].Type.Rank():
		return []ir.Placement{ids, ids}, par, nil // scattered rows from local tokens
	case ids.Kind == ir.Replicate && dy.Kind == ir.Replicate && vocabSplitGrad(r):
		// A vocab-parallel table: the device makes its rows of the
		// gradient only (runtime.VocabRows), as Megatron-LM's
		// VocabParallelEmbedding does. Made whole, each tp rank held the
		// whole table's gradient and its fp32 sum, V·h·4 bytes where its
		// rows are V·h·4/t, until the optimizer took its rows.
		return r.have, shardOn(0), nil
	case ids.Kind == ir.Replicate && dy.Kind != ir.Shard:
		return r.have, dy, nil
	case ids.Kind == ir.Replicate && dy.Kind == ir.Shard && dy.Dim < r.v.Args[0].Type.Rank():
		if vocabSplitGrad(r) {
			// A vocab-parallel table under sequence parallelism: dy is
			// gathered whole (b·s·h, as Megatron-LM's backward of its
			// reduce-scatter to the sequence split does) and the device
			// makes its rows of the gradient only. Taking the ids of its
			// tokens instead made a partial gradient of the whole table,
			// V·h a device, reduce-scattered once a step.
			return []ir.Placement{ids, rep}, shardOn(0), nil
		}
		return []ir.Placement{dy, dy}, par, nil // take the ids of the local rows
	}
	return nil, rep, fmt.Errorf("embedding_grad with ids %v and dy %v has no rule", ids, dy)
}

// vocabSplitGrad says whether the gradient r makes is of a table split by
// rows (vocab-parallel) on r's axis, one block a device.
func vocabSplitGrad(r AxisRule) bool {
	d, ok := r.s.gradDest[r.v]
	return ok && d[r.ax].Kind == ir.Shard && d[r.ax].Dim == 0 && d[r.ax].NumBlocks() == 1
}

// crossEntropyRule: rows sharded give a partial mean (the lowering divides
// by the global row count) and a row-sharded gradient.
func crossEntropyRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	logits, labels := r.have[0], r.have[1]
	want := slices.Clone(r.have)
	if logits.Kind == ir.Partial {
		want[0] = r.Resolve(0)
	}
	if want[0].Kind == ir.Shard && want[0].Dim == 1 && want[0].NumBlocks() == 1 {
		// Vocab-parallel: the runtime reduces the row max, the sum of
		// exponentials and the target logit across the axis, so no device
		// ever holds full-vocab logits; the loss is whole, the gradient
		// stays split like the logits.
		want[1] = rep
		if len(want) == 3 {
			want[2] = rep
			return want, want[0], nil
		}
		return want, rep, nil
	}
	if want[0].Kind == ir.Shard || labels.Kind == ir.Shard {
		// Rows split; in blocks when they are sequences split over cp.
		rows := shardOn(0)
		for _, p := range []ir.Placement{want[0], labels} {
			if p.Kind == ir.Shard && p.Dim == 0 {
				rows = p
				break
			}
		}
		want[0], want[1] = rows, rows
	}
	if len(want) == 3 {
		want[2] = rep // dloss
	}
	out := want[0]
	if r.v.Op == "cross_entropy" && out.Kind == ir.Shard {
		out = par
	}
	return want, out, nil
}

// sumSquaresRule: squares of shards add to a partial sum; whole arguments
// give a whole sum. Mixed arguments would count the whole ones once per
// device, so partial ones are resolved and sharded/whole must agree.
func sumSquaresRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	want := make([]ir.Placement, len(r.have))
	sharded := 0
	for i, p := range r.have {
		if p.Kind == ir.Partial {
			p = r.Resolve(i)
		}
		want[i] = p
		if p.Kind == ir.Shard {
			sharded++
		}
	}
	if sharded == 0 {
		return want, rep, nil
	}
	// Mixed: slice the whole tensors locally so each device squares only
	// its block; a sum of squares does not care which dim is split.
	n := r.s.m.Mesh.Axes[r.ax].Size
	for i, p := range want {
		if p.Kind != ir.Replicate {
			continue
		}
		t := r.v.Args[i].Type
		d := slices.IndexFunc(t.Shape, func(k int) bool { return k%n == 0 })
		if d < 0 {
			return nil, rep, fmt.Errorf("sum_squares mixes sharded tensors with %v, which no dim of splits over %d devices", t, n)
		}
		want[i] = shardOn(d)
	}
	return want, par, nil
}

// whereFiniteRule: the count is whole; new and old take old's placement
// (the state's), so the choice is made block by block.
func whereFiniteRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	p := r.have[2]
	if p.Kind == ir.Partial {
		p = r.Resolve(2)
	}
	return []ir.Placement{rep, p, p}, p, nil
}

// attentionRole is what an operand of an attention op is shaped like:
// q ([b, heads, sq, ·]: q and the statistics), k ([b, kvHeads, sk, hd]:
// k, v and their gradients) or the output ([b, sq, heads, hd]: out and
// dout). Their heads are dim 1, 1 and 2.
type attentionRole int

const (
	attQ attentionRole = iota
	attKV
	attOut
)

func (r attentionRole) headDim() int {
	if r == attOut {
		return 2
	}
	return 1
}

// seqDim is the operand's sequence dim: 2 for q- and k-shaped operands,
// 1 for the output's layout.
func (r attentionRole) seqDim() int {
	if r == attOut {
		return 1
	}
	return 2
}

// attentionRoles gives the roles of an attention op's arguments and of
// its result. Every attention op reads q first and k second.
func attentionRoles(op string) (args []attentionRole, result attentionRole) {
	switch op {
	case "attention", "attention_at":
		return []attentionRole{attQ, attKV, attKV}, attOut
	case "attention_stats":
		return []attentionRole{attQ, attKV, attOut, attOut}, attQ
	case "attention_grad_q":
		return []attentionRole{attQ, attKV, attKV, attOut, attQ}, attQ
	case "attention_grad_k":
		return []attentionRole{attQ, attKV, attKV, attOut, attQ}, attKV
	}
	return []attentionRole{attQ, attKV, attOut, attQ}, attKV // attention_grad_v
}

// attentionRule places the fused attention ops. Batch split over the
// axis (dp, or the microbatch pass's virtual axis): every argument and the
// result split on the batch. Heads split (tp, Megatron's layout): q, the
// output and the values shaped like them split on their heads; k and v
// split on theirs when the axis divides the k/v heads, else kept whole,
// each device reading the k/v heads of its own query heads (the kernels
// find them from the two placements, runtime.AttentionDims), and the
// gradient of whole k/v is then a partial sum of each device's query
// heads. Anything else (the sequence or head dim split, partial sums that
// resolve whole) runs on whole arguments: a query needs every key, so
// sequence parallelism gathers the sequence before attention, as it did
// before the op existed.
func attentionRule(r AxisRule) ([]ir.Placement, ir.Placement, error) {
	v := r.v
	roles, result := attentionRoles(v.Op)
	have := slices.Clone(r.have)
	for i, p := range have {
		if p.Kind == ir.Partial {
			have[i] = r.Resolve(i) // attention is not linear in its arguments
		}
	}
	if r.sequence() {
		return r.contextParallelAttention(roles, result)
	}
	split := func(head bool) bool {
		for i, p := range have {
			d := 0
			if head {
				d = roles[i].headDim()
			}
			if p.Kind == ir.Shard && p.Dim == d && p.NumBlocks() == 1 {
				return true
			}
		}
		return false
	}
	n := r.s.m.Mesh.Axes[r.ax].Size
	heads, kvHeads := v.Args[0].Type.Shape[1], v.Args[1].Type.Shape[1]
	want := make([]ir.Placement, len(have))
	switch {
	case split(false):
		for i := range want {
			want[i] = shardOn(0)
		}
		return want, shardOn(0), nil
	case split(true) && heads%n == 0:
		kv := rep
		if kvHeads%n == 0 {
			kv = shardOn(1)
		}
		for i, role := range roles {
			want[i] = shardOn(role.headDim())
			if role == attKV {
				want[i] = kv
			}
		}
		switch {
		case result != attKV:
			return want, shardOn(result.headDim()), nil
		case kv.Kind == ir.Shard:
			return want, kv, nil
		}
		// Each device adds its query heads' share into whole k/v heads.
		return want, par, nil
	}
	for i := range want {
		want[i] = rep
	}
	return want, rep, nil
}

// contextParallelAttention places an attention op on the context-parallel
// axis. Ring (Megatron-Core's context parallelism): every operand stays
// split on its sequence dim, and the instruction passes K/V chunks around
// the cp ranks itself, merging partial results by their log-sum-exp, so a
// query row still sees every key. All2all (DeepSpeed-Ulysses): operands
// are made head-split (all_to_all from the sequence split), attention
// runs on whole sequences of heads/cp heads, and the result goes back to
// the sequence split before anything else reads it (sharder.settle); the
// statistics stay head-split, since only the gradients read them.
func (r AxisRule) contextParallelAttention(roles []attentionRole, result attentionRole) ([]ir.Placement, ir.Placement, error) {
	v := r.v
	want := make([]ir.Placement, len(roles))
	if r.s.o == nil || r.s.o.CPImpl != "all2all" {
		for i, role := range roles {
			want[i] = shardOn(role.seqDim())
		}
		return want, shardOn(result.seqDim()), nil
	}
	n := r.s.m.Mesh.Axes[r.ax].Size
	if r.s.m.Mesh.Axes[r.ax].Zigzag {
		return nil, rep, fmt.Errorf("--cp-impl all2all splits heads over cp, which the zigzag layout (for the ring) cannot: use --cp-layout contiguous")
	}
	// The heads the other axes (tp) leave each device.
	heads := func(arg int) (local, whole int) {
		a := v.Args[arg]
		whole = a.Type.Shape[1]
		local = whole
		for ax, p := range a.Place {
			if ax != r.ax && p.Kind == ir.Shard && p.Dim == 1 {
				local /= r.s.m.Mesh.Axes[ax].Size
			}
		}
		return local, whole
	}
	for _, arg := range []int{0, 1} {
		local, whole := heads(arg)
		if local%n != 0 {
			what := "query heads"
			if arg == 1 {
				what = "key/value heads"
			}
			hint := "give --cp a divisor of them"
			if local < whole {
				// Another axis (tp) split them first: cp splits each
				// device's share, so tp·cp must divide the heads.
				hint = fmt.Sprintf("tp·cp must divide the model's %d: give a smaller --tp or --cp", whole)
			}
			return nil, rep, fmt.Errorf("--cp-impl all2all splits the %s over cp=%d, and the device's %d of the model's %d are not divisible by it: %s, or use --cp-impl ring", what, n, local, whole, hint)
		}
	}
	for i, role := range roles {
		want[i] = shardOn(role.headDim())
	}
	return want, shardOn(result.headDim()), nil
}
