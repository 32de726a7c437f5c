package lower

import (
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// Block is one schedule action that computes: the forward (F), backward (B)
// or weight-gradient (W) work of one chunk on one microbatch.
type Block struct {
	Kind  byte // 'F', 'B' or 'W'
	Chunk int  // global chunk index
	Micro int
}

// LowerPipeline cuts a stage-tagged module (the pipeline-split pass) into
// one program per pipeline rank. order[r] is rank r's schedule as compute
// blocks; the rank's instructions follow it. Every computed value, param
// and optimizer state has one owner: the rank of its chunk. Another rank
// that uses it receives it (sent right after it is computed, so sends never
// wait; receives wait for their data); constants and inputs are copied to
// every rank that uses them. Per-step work (gradient accumulation, the
// optimizer, shared values) runs as soon as its inputs are there, except
// work that needs another rank's data, which waits until the rank's blocks
// are done so it cannot stall the pipeline.
//
// With B blocks and W blocks for the same (chunk, micro), the backward is
// split as zero-bubble schedules need: B computes what the previous chunk
// needs (input gradients); W the rest (weight gradients).
func LowerPipeline(m *ir.Module, order [][]Block) ([]*Program, error) {
	return LowerPipelineWith(m, order, Options{})
}

// LowerPipelineWith is LowerPipeline with options; offload applies to each
// rank's program on its own (its params, its state, its received copies).
func LowerPipelineWith(m *ir.Module, order [][]Block, o Options) ([]*Program, error) {
	return lowerPipeline(m, order, false, o)
}

// LowerPipelineForward cuts the forward-only programs that evaluation runs:
// every microbatch's forward on every chunk, in order, ending at the loss.
// They hold their own copies of the params, which the runtime refreshes
// from the training programs before each evaluation.
func LowerPipelineForward(m *ir.Module, p, v, micro int) ([]*Program, error) {
	return LowerPipelineForwardWith(m, p, v, micro, Options{})
}

// LowerPipelineForwardWith is LowerPipelineForward with options.
func LowerPipelineForwardWith(m *ir.Module, p, v, micro int, o Options) ([]*Program, error) {
	order := make([][]Block, p)
	for r := range p {
		for c := r; c < p*v; c += p {
			for k := range micro {
				order[r] = append(order[r], Block{Kind: 'F', Chunk: c, Micro: k})
			}
		}
	}
	return lowerPipeline(m, order, true, o)
}

// evaluated says whether a forward-only program keeps the output: the
// loss and the cross-entropy evaluation reads (runtime.EvalOutput).
func evaluated(output string) bool {
	return output == ir.OutputLoss || output == ir.AuxPrefix+ir.OutputLMLoss
}

func lowerPipeline(m *ir.Module, order [][]Block, forwardOnly bool, o Options) ([]*Program, error) {
	if _, _, err := ParseOffload(o.Offload); err != nil {
		return nil, fmt.Errorf("offload %q: %w", o.Offload, err)
	}
	if err := ir.Verify(m, "lower"); err != nil {
		return nil, err
	}
	ppAxis := m.Mesh.PipelineAxis()
	if ppAxis < 0 {
		return nil, fmt.Errorf("module %q has no pp mesh axis", m.Name)
	}
	p := m.Mesh.Axes[ppAxis].Size
	if len(order) != p {
		return nil, fmt.Errorf("schedule has %d ranks, the mesh has pp=%d", len(order), p)
	}
	isSource := func(v *ir.Value) bool {
		info, _ := ir.Lookup(v.Op)
		return info.Source
	}
	owner := func(v *ir.Value) int { return max(v.Meta.Stage, 0) % p }
	copied := func(v *ir.Value) bool { return v.Op == "const" || v.Op == "input" }

	// Which ranks read each value; read marks values any value reads.
	readers := map[*ir.Value][]int{}
	read := map[*ir.Value]bool{}
	for _, v := range m.Values {
		for _, a := range v.Args {
			read[a] = true
		}
	}
	for _, v := range m.Values {
		if isSource(v) || forwardOnly && v.Meta.Phase != ir.PhaseFwd {
			continue
		}
		for _, a := range v.Args {
			if r := owner(v); !slices.Contains(readers[a], r) {
				readers[a] = append(readers[a], r)
			}
		}
	}
	for _, o := range m.Outputs {
		if forwardOnly && !evaluated(o.Name) {
			continue
		}
		if r := owner(o.Value); !slices.Contains(readers[o.Value], r) {
			readers[o.Value] = append(readers[o.Value], r)
		}
	}

	// Blocks: values of (kind, chunk, micro). W takes the weight-gradient
	// part of a backward when the schedule has W blocks.
	type key struct {
		kind         byte
		chunk, micro int
	}
	hasW := false
	for _, rank := range order {
		for _, b := range rank {
			hasW = hasW || b.Kind == 'W'
		}
	}
	blocks := map[key][]*ir.Value{}
	var perStep []*ir.Value
	stepValue := map[*ir.Value]bool{}
	// Without gradient accumulation nothing carries a microbatch: the
	// whole batch is microbatch 0.
	micro := func(v *ir.Value) int { return v.Meta.Micro }
	if !m.Microbatched() {
		micro = func(*ir.Value) int { return 0 }
	}
	for _, v := range m.Values {
		if isSource(v) || forwardOnly && v.Meta.Phase != ir.PhaseFwd {
			continue
		}
		switch {
		case micro(v) < 0 || v.Meta.Phase == ir.PhaseOpt:
			perStep = append(perStep, v)
			stepValue[v] = true
		case v.Meta.Phase == ir.PhaseBwd || v.Meta.Phase == ir.PhaseRecompute:
			// A replayed forward value runs in its microbatch's backward,
			// on its chunk (passes.recompute keeps a segment on one
			// chunk): run after the forward, as it was, it kept every
			// replayed activation from the forward to the backward and
			// recompute saved nothing.
			k := key{'B', v.Meta.Stage, micro(v)}
			blocks[k] = append(blocks[k], v)
		default:
			k := key{'F', v.Meta.Stage, micro(v)}
			blocks[k] = append(blocks[k], v)
		}
	}
	uses := m.Uses()
	if hasW {
		// A once-a-step backward value another rank reads, or one a
		// backward value another rank reads is computed from (the last
		// chunk's part of a tied embedding's gradient, summed over the
		// microbatches and sent to the first): what a backward adds into
		// it is made in B, as a value sent straight to another rank is.
		// Deferred to W, the head's part kept each microbatch's logits'
		// gradient alive until its W. (The optimizer's values do not
		// count: every gradient reaches the global norm, whose scalars
		// cross the ranks.)
		sent := map[*ir.Value]bool{}
		for i := len(perStep) - 1; i >= 0; i-- {
			v := perStep[i]
			if v.Meta.Phase != ir.PhaseBwd {
				continue
			}
			for _, r := range readers[v] {
				sent[v] = sent[v] || r != owner(v)
			}
			for _, u := range uses[v] {
				sent[v] = sent[v] || sent[u]
			}
		}
		for k, vs := range blocks {
			if k.kind != 'B' {
				continue
			}
			b, w := splitBackward(vs, owner, readers, func(v *ir.Value) bool {
				return slices.ContainsFunc(uses[v], func(u *ir.Value) bool { return sent[u] })
			})
			blocks[k] = b
			blocks[key{'W', k.chunk, k.micro}] = w
		}
	}

	progs := make([]*Program, p)
	for r := range p {
		b := newBuilder(fmt.Sprintf("%s.pp%d", m.Name, r), m.Mesh)
		have := map[*ir.Value]bool{}
		done := map[*ir.Value]bool{}
		// need makes v available on rank r: a copy of a const or input, a
		// receive of another rank's value; its own values are built here
		// (a once-a-step value of this rank a block reads before its
		// arguments from other ranks were all in: computed now, receiving
		// them, where it used to be received from this rank itself).
		var emit func(v *ir.Value)
		need := func(v *ir.Value) {
			if have[v] {
				return
			}
			switch {
			case isSource(v) && (copied(v) || owner(v) == r):
				have[v] = true
				b.value(v)
			case stepValue[v] && owner(v) == r:
				emit(v)
			default:
				have[v] = true
				if axis, dim := b.scatterDim(v); axis >= 0 {
					b.recvGathered(v, owner(v), axis, dim)
				} else {
					b.recv(v, owner(v))
				}
			}
		}
		// sendOn sends v to every other rank that reads it.
		sendOn := func(v *ir.Value) {
			for _, q := range readers[v] {
				if q == r {
					continue
				}
				if axis, dim := b.scatterDim(v); axis >= 0 {
					b.sendScattered(v, q, axis, dim)
				} else {
					b.send(v, q)
				}
			}
		}
		emit = func(v *ir.Value) {
			for _, a := range v.Args {
				need(a)
			}
			have[v] = true
			b.value(v)
			done[v] = true
			sendOn(v)
		}
		// Every input exists somewhere, so the runtime can set the ones a
		// plan ignores (an optimizer without a learning rate): rank 0
		// holds those.
		if r == 0 {
			for _, v := range m.Values {
				if v.Op == "input" && !read[v] {
					need(v)
				}
			}
		}
		// Sources this rank owns exist from the start (and are sent to
		// readers elsewhere at the start of each step).
		for _, v := range m.Values {
			if isSource(v) && owner(v) == r && !copied(v) && (!forwardOnly || len(readers[v]) > 0) {
				need(v)
				sendOn(v)
			}
		}
		localReady := func(v *ir.Value) bool {
			for _, a := range v.Args {
				if !have[a] && !(isSource(a) && (copied(a) || owner(a) == r)) {
					return false
				}
			}
			return true
		}
		// An optimizer value that reads only sources and that no other
		// rank reads waits for the optimizer, or for the first value
		// that needs it: made at the start of the step it would live
		// through the step for nothing (PipeDream-2BW's 16-bit copy of a
		// param, which its next weight version takes).
		waits := map[*ir.Value]bool{}
		for _, v := range perStep {
			waits[v] = v.Meta.Phase == ir.PhaseOpt && !slices.ContainsFunc(v.Args, func(a *ir.Value) bool { return !isSource(a) }) &&
				!slices.ContainsFunc(readers[v], func(q int) bool { return q != r })
		}
		flush := func(remoteToo bool) {
			for progress := true; progress; {
				progress = false
				for _, v := range perStep {
					if done[v] || owner(v) != r || !remoteToo && waits[v] {
						continue
					}
					if remoteToo || localReady(v) {
						emit(v)
						progress = true
					}
				}
			}
		}
		// accumulate makes the once-a-step backward values that v
		// completes as soon as v is made, inside its block: a gradient's
		// sum over the microbatches, and what the last sum completes (its
		// reduction over dp, a send of it). Made at the block's end, every
		// gradient of the block was live beside its sum, a stage's
		// gradients held twice (Megatron-LM adds each into main_grad as
		// it comes). The values are the IR's, so the sums and their order,
		// and the bits, are unchanged; only where they run moves.
		var accumulate func(v *ir.Value)
		accumulate = func(v *ir.Value) {
			for _, u := range uses[v] {
				if stepValue[u] && !done[u] && owner(u) == r && u.Meta.Phase == ir.PhaseBwd && !waits[u] && localReady(u) {
					emit(u)
					accumulate(u)
				}
			}
		}
		label := func(from int, name string) {
			for i := from; i < len(b.p.Instrs); i++ {
				b.p.Instrs[i].Block = name
			}
		}
		flush(false)
		label(0, "step")
		for _, blk := range order[r] {
			if blk.Chunk%p != r {
				return nil, fmt.Errorf("schedule puts chunk %d on rank %d; it belongs on rank %d", blk.Chunk, r, blk.Chunk%p)
			}
			from := len(b.p.Instrs)
			for _, v := range blocks[key{blk.Kind, blk.Chunk, blk.Micro}] {
				emit(v)
				accumulate(v)
			}
			label(from, fmt.Sprintf("%c c%d m%d", blk.Kind, blk.Chunk, blk.Micro))
			from = len(b.p.Instrs)
			flush(false)
			label(from, "step")
		}
		from := len(b.p.Instrs)
		flush(true)
		label(from, "optimizer")
		for k, vs := range blocks {
			if k.chunk%p == r && (!forwardOnly || k.kind == 'F') {
				for _, v := range vs {
					if !done[v] {
						return nil, fmt.Errorf("rank %d's schedule has no %c block for chunk %d microbatch %d (%s is never computed)", r, k.kind, k.chunk, k.micro, v.Where())
					}
				}
			}
		}
		prog := b.p
		for _, o := range m.Outputs {
			if owner(o.Value) == r && (!forwardOnly || evaluated(o.Name)) {
				prog.Outputs[o.Name] = b.bufOf[o.Value]
			}
		}
		var ups []ir.Update
		for _, u := range m.Updates {
			if owner(u.State) == r && !forwardOnly {
				ups = append(ups, u)
			}
		}
		if err := groupBuckets(prog); err != nil {
			return nil, err
		}
		if o.SendsFirst {
			sendsBeforeBuckets(prog)
		}
		if err := planUpdates(prog, &ir.Module{Updates: ups}, b.bufOf); err != nil {
			return nil, err
		}
		widenIntoSums(prog)
		accumulateInPlace(prog)
		overwriteLastReads(prog)
		if err := offload(prog, o); err != nil {
			return nil, err
		}
		if err := checkArena(prog); err != nil {
			return nil, err
		}
		planMemory(prog)
		prog.ForwardEnd = -1 // no forward-only prefix: evaluation needs a forward schedule
		progs[r] = prog
	}
	return progs, nil
}

// sendsBeforeBuckets hoists, in each schedule block, the sends that
// stand after a gradient bucket's reductions without reading them, with
// the work they need, to before the first of those reductions. A bucket
// goes where its last gradient is made (groupBuckets), which in a chunk's
// last backward comes before its input gradient is: a runtime that runs
// collectives in program order (the CPU backend) then made the previous
// rank wait for this rank's data-parallel reductions before its own last
// backward could start, and so down the pipeline, every rank's
// reductions one after another. Hoisted, the input gradient leaves first
// and the ranks reduce at the same time, as Megatron-LM's do after the
// pipeline has drained. The send's work is the input gradient's chain
// through the chunk's layers, so the weight gradients after the first
// bucket wait for it, their layers' activations live that much longer
// (a ZeRO-2 pipeline of small buckets, which reduce-scatter in every
// backward block, peaked 4 % higher), and a comm stream would start the
// buckets later: a runtime with one (the CUDA backend) keeps the order
// (Options.SendsFirst).
func sendsBeforeBuckets(p *Program) {
	for start := 0; start < len(p.Instrs); {
		end := start
		for end < len(p.Instrs) && p.Instrs[end].Block == p.Instrs[start].Block {
			end++
		}
		if b := p.Instrs[start].Block; len(b) > 2 && strings.ContainsRune("FBW", rune(b[0])) && b[1] == ' ' {
			hoistSends(p.Instrs[start:end])
		}
		start = end
	}
}

// hoistSends reorders one block's instructions in place (see
// sendsBeforeBuckets).
func hoistSends(ins []Instr) {
	first := slices.IndexFunc(ins, isBucketCollective)
	if first < 0 {
		return
	}
	// reads says an instruction reads a bucket's result, directly or not.
	tainted := map[int]bool{}
	reads := func(in Instr) bool {
		return isBucketCollective(in) || slices.ContainsFunc(in.Args, func(a int) bool { return tainted[a] })
	}
	producer := map[int]int{}
	for i := first; i < len(ins); i++ {
		if reads(ins[i]) && ins[i].Out >= 0 {
			tainted[ins[i].Out] = true
		}
		if ins[i].Out >= 0 {
			producer[ins[i].Out] = i
		}
	}
	hoist := map[int]bool{}
	var need func(i int)
	need = func(i int) {
		if hoist[i] {
			return
		}
		hoist[i] = true
		for _, a := range ins[i].Args {
			if j, ok := producer[a]; ok && j < i {
				need(j)
			}
		}
	}
	for i := first; i < len(ins); i++ {
		if ins[i].Op == "send" && !reads(ins[i]) {
			need(i)
		}
	}
	if len(hoist) == 0 {
		return
	}
	rest := slices.Clone(ins[first:])
	at := first
	for i, in := range rest {
		if hoist[first+i] {
			ins[at] = in
			at++
		}
	}
	for i, in := range rest {
		if !hoist[first+i] {
			ins[at] = in
			at++
		}
	}
}

// isBucketCollective says whether in is a gradient bucket's reduction.
func isBucketCollective(in Instr) bool { return in.Bucket > 0 && ir.Collectives[in.Op] }

// splitBackward separates a chunk's backward into what other chunks need
// (the input gradient, what feeds a once-a-step value sent to another
// rank (feedsSent), and everything they depend on) and the rest (weight
// gradients), which a zero-bubble schedule defers.
func splitBackward(vs []*ir.Value, owner func(*ir.Value) int, readers map[*ir.Value][]int, feedsSent func(*ir.Value) bool) (b, w []*ir.Value) {
	in := map[*ir.Value]bool{}
	for _, v := range vs {
		in[v] = true
	}
	needed := map[*ir.Value]bool{}
	var mark func(v *ir.Value)
	mark = func(v *ir.Value) {
		if needed[v] || !in[v] {
			return
		}
		needed[v] = true
		for _, a := range v.Args {
			mark(a)
		}
	}
	for _, v := range vs {
		for _, r := range readers[v] {
			// Consecutive chunks are on different ranks whenever p > 1.
			if r != owner(v) {
				mark(v)
			}
		}
		if feedsSent(v) {
			mark(v)
		}
	}
	// A weight gradient no larger than a vector (a LayerNorm's gain and
	// bias, a bias's sum over rows) is made in B once what it reads is:
	// deferred to W, it kept the [rows, hidden] values it reads alive
	// until W, which a layer's GEMM weight gradients do not all need (the
	// LayerNorm's input and output gradient: 21·sbh stashed a layer for W
	// where B keeps 16).
	for changed := true; changed; {
		changed = false
		for _, v := range vs {
			if needed[v] || v.Type.Rank() > 1 {
				continue
			}
			ready := true
			for _, a := range v.Args {
				ready = ready && (!in[a] || needed[a])
			}
			if ready {
				needed[v], changed = true, true
			}
		}
	}
	for _, v := range vs {
		if needed[v] {
			b = append(b, v)
		} else {
			w = append(w, v)
		}
	}
	return b, w
}
