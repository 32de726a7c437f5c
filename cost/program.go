package cost

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes/schedule"
)

// Prediction is the cost model's account of one training step of a
// compiled plan.
type Prediction struct {
	// StepSeconds is the predicted time of one step.
	StepSeconds float64
	// Bubble is the pipeline bubble the schedule simulator finds with
	// these costs ((step − ideal)/ideal, REFERENCE.md's definition); 0
	// without a pipeline.
	Bubble float64
	// ComputeSeconds and CommSeconds divide the busiest device's time:
	// kernels, and collectives/transfers by mesh axis ("tp", "dp", "pp";
	// "host" for offload copies).
	ComputeSeconds float64
	CommSeconds    map[string]float64
	// CommBytes is what the busiest device sends per step, by axis.
	CommBytes map[string]float64
	// FLOPs is the work of every device together in one step, recompute
	// included; ModelFLOPs leaves recompute out (MFU's numerator).
	FLOPs, ModelFLOPs float64
	// Busy is each device's summed instruction time.
	Busy []float64
	// Timeline places every instruction of the step in time, per pipeline
	// rank (WriteTrace draws it as a Chrome trace beside a measured one).
	Timeline *Timeline
}

// Timeline is a predicted step, per pipeline rank: every device of a rank
// runs the rank's program, and in lockstep (a collective waits for its
// slowest member), so one timeline serves all of them. Without a pipeline
// there is one rank.
type Timeline struct {
	// Instrs are the rank's instructions in issue order: Instrs[r][i] is
	// instruction i of the program of rank r.
	Instrs [][]Slice
	// Actions are the rank's schedule actions ("F c0 m3"), nil without a
	// pipeline.
	Actions [][]ActionSlice
	// RankOfDevice maps a device to its pipeline rank.
	RankOfDevice []int
}

// Slice is one instruction on the timeline. Copies of offloaded buffers
// run on a stream of their own (Copy), beside the compute stream.
type Slice struct {
	Start, Seconds float64
	Axis           string // the mesh axis a collective or transfer crosses; "" for a kernel
	Copy           bool
}

// ActionSlice is one schedule action on the timeline.
type ActionSlice struct {
	Name           string
	Start, Seconds float64
}

// instrCost is one instruction's predicted time and what it moves.
type instrCost struct {
	seconds float64
	axis    string // "" for compute
	bytes   float64
	copy    bool // a host↔device copy (its own stream on the GPU)
	// hidden is the part of a compute instruction's seconds that is
	// communication on axis hiddenAxis it could not hide (ring attention's
	// transfers beyond its compute), and hiddenBytes what it moves there.
	hiddenAxis          string
	hidden, hiddenBytes float64
}

// Predict prices one step of the programs (one per pipeline rank, as
// compile.Result.Programs) under sched (nil without a pipeline).
//
// Every device's program is walked instruction by instruction, in the
// order the runtime issues them. Kernels are rooflines (OpTime);
// collectives are α-β over the ranks of their mesh axis, on the slowest
// link the group spans (LinkFor); a bucket of reductions is one call;
// sends are buffered (the sender copies into staging), receives take the
// transfer; offloaded buffers' copies run on a stream of their own, so
// they cost only what exceeds the compute they overlap. Collectives are
// priced in program order on the compute stream, so nothing else
// overlaps: a data-parallel reduction delays the backward work after it
// by its whole time. That is the CPU backend; with h.OverlapBuckets (the
// CUDA backend's comm stream) buckets' all-reduces overlap the backward
// when there is no pipeline, unless the program reduces them in order
// (lower.Program.SerialBuckets).
//
// The devices of one pipeline rank run the same program in lockstep: a
// collective ends when its slowest member's does, so the rank's time for
// each instruction is the slowest of its devices'. Under pipeline
// parallelism the instructions of each schedule block (lower.Instr.Block)
// add up to that action's cost, per-step work between blocks is charged
// to the block before it, and the schedule simulator runs the step with
// those costs; what follows the last block (the optimizer, the reductions
// across dp) is added per rank.
func (h *Hardware) Predict(progs []*lower.Program, sched *schedule.Schedule) (*Prediction, error) {
	if len(progs) == 0 {
		return nil, fmt.Errorf("no programs to price")
	}
	mesh := progs[0].Mesh
	devices := 1
	if mesh != nil {
		devices = mesh.Devices()
	}
	pred := &Prediction{CommSeconds: map[string]float64{}, CommBytes: map[string]float64{}, Busy: make([]float64, devices)}
	ppAxis := -1
	if mesh != nil {
		ppAxis = mesh.PipelineAxis()
	}
	ranks := 1
	if sched != nil {
		ranks = sched.Ranks
	}
	tl := &Timeline{Instrs: make([][]Slice, ranks), RankOfDevice: make([]int, devices)}
	rankProg := make([]*lower.Program, ranks)
	classes := map[string]*devicePrice{}
	busiest := -1.0
	for r := range devices {
		prog := lower.ProgramOf(progs, r)
		pr := 0
		if ppAxis >= 0 && sched != nil {
			pr = mesh.Coords(r)[ppAxis]
		}
		tl.RankOfDevice[r] = pr
		if mesh == nil || isFirstReplica(mesh, r, ppAxis) {
			for _, in := range prog.Instrs {
				if f, ok := instrFlops(in); ok {
					pred.FLOPs += f
					if in.Value == nil || in.Value.Meta.Phase != ir.PhaseRecompute {
						pred.ModelFLOPs += f
					}
				}
			}
		}
		// Devices alike in their program and in where their groups sit
		// among the nodes cost the same: each class is priced once, so a
		// mesh of a million devices is priced in the time of a few.
		key := deviceClass(mesh, r, pr, h.DevicesPerNode)
		dc, seen := classes[key]
		if !seen {
			dc = h.priceDevice(prog, r)
			classes[key] = dc
			if tl.Instrs[pr] == nil {
				rankProg[pr] = prog
				tl.Instrs[pr] = make([]Slice, len(prog.Instrs))
				for i, ic := range dc.ics {
					tl.Instrs[pr][i] = Slice{Axis: ic.axis, Copy: ic.copy}
				}
			}
			for i, ic := range dc.ics {
				sl := &tl.Instrs[pr][i]
				sl.Seconds = math.Max(sl.Seconds, ic.seconds)
			}
		}
		pred.Busy[r] = dc.busy
		if dc.busy > busiest {
			busiest = dc.busy
			pred.ComputeSeconds = dc.compute
			pred.CommSeconds, pred.CommBytes = dc.comm, dc.bytes
		}
	}
	// FLOPs were counted on one replica of each program (see
	// isFirstReplica); scale to every device.
	if mesh != nil {
		reps := float64(devices) / float64(replicaCount(mesh, ppAxis))
		pred.FLOPs *= reps
		pred.ModelFLOPs *= reps
	}
	if sched == nil {
		// One rank: the instructions one after another, copies on their
		// own stream from the moment they are issued. With OverlapBuckets
		// a bucket's all-reduce or reduce-scatter (the consecutive members
		// of one op: a bucket under ZeRO may all-reduce what it cannot
		// split) runs on the comm stream from the moment it is issued
		// (after the comm stream's previous bucket), and the
		// compute stream waits for it before the first instruction that
		// reads one of its results or runs a collective on its axis, as
		// the CUDA backend orders them.
		var clock, copyClock, copies, commClock float64
		prog := rankProg[0]
		type pendingBucket struct {
			outs map[int]bool
			axis string
			end  float64
		}
		var pending []pendingBucket
		overlap := h.OverlapBuckets && !prog.SerialBuckets
		onComm := false // the bucket run this instruction stands in runs on the comm stream
		for i := range tl.Instrs[0] {
			sl := &tl.Instrs[0][i]
			if sl.Copy {
				sl.Start = math.Max(clock, copyClock)
				copyClock = sl.Start + sl.Seconds
				copies += sl.Seconds
				continue
			}
			in := prog.Instrs[i]
			run, leads := prog.BucketRun(i)
			if leads {
				// A reduce-scatter of one gradient runs where it stands
				// (the CUDA backend stages only buckets of several).
				onComm = overlap && (in.Op == "all_reduce" || in.Op == "reduce_scatter" && len(run) > 1)
			}
			inComm := onComm && in.Bucket > 0
			if overlap && len(pending) > 0 {
				axis := ""
				if ir.Collectives[in.Op] {
					axis = in.Attrs.Str("axis")
				}
				kept := pending[:0]
				for _, b := range pending {
					reads := axis != "" && axis == b.axis && !inComm
					for _, a := range in.Args {
						reads = reads || b.outs[a]
					}
					if reads {
						clock = math.Max(clock, b.end)
						continue
					}
					kept = append(kept, b)
				}
				pending = kept
			}
			if inComm {
				if leads {
					pending = append(pending, pendingBucket{outs: map[int]bool{}, axis: in.Attrs.Str("axis")})
				}
				sl.Start = math.Max(clock, commClock)
				commClock = sl.Start + sl.Seconds
				b := &pending[len(pending)-1]
				b.outs[in.Out] = true
				b.end = commClock
				continue
			}
			sl.Start = clock
			clock += sl.Seconds
		}
		pred.StepSeconds = math.Max(math.Max(clock, commClock), copies)
	} else if err := h.pipelineStep(pred, tl, rankProg, sched); err != nil {
		return nil, err
	}
	pred.Timeline = tl
	// Virtual devices sharing a host's cores cannot all run at once: the
	// step takes at least their summed work over the cores.
	if h.HostCores > 0 {
		var sum float64
		for _, t := range pred.Busy {
			sum += t
		}
		pred.StepSeconds = math.Max(pred.StepSeconds, sum/float64(h.HostCores))
	}
	return pred, nil
}

// blockName is the lower.Instr.Block of a schedule action.
func blockName(a schedule.Action) (string, bool) {
	var k byte
	switch a.Kind {
	case schedule.F:
		k = 'F'
	case schedule.B:
		k = 'B'
	case schedule.W:
		k = 'W'
	default:
		return "", false
	}
	return fmt.Sprintf("%c c%d m%d", k, a.Chunk, a.Micro), true
}

// pipelineStep prices each rank's schedule blocks from the timeline's
// per-instruction times, runs the schedule simulator with them and places
// every instruction at its action's start; it sets the step time and the
// bubble.
func (h *Hardware) pipelineStep(pred *Prediction, tl *Timeline, progs []*lower.Program, sched *schedule.Schedule) error {
	p := sched.Ranks
	type rankCost struct {
		blocks      map[string]float64 // F/B/W block → seconds
		sent        map[string]float64 // F/B/W block → seconds to its last microbatch send
		toSend      map[string]float64 // the block's seconds so far that its sends wait for
		head, tail  float64            // before the first block, after the last
		blockCopies map[string]float64
	}
	costs := make([]rankCost, p)
	for r := range p {
		rc := rankCost{blocks: map[string]float64{}, sent: map[string]float64{}, toSend: map[string]float64{}, blockCopies: map[string]float64{}}
		if progs[r] == nil {
			costs[r] = rc
			continue
		}
		// A comm stream reduces the buckets beside the rest: a send
		// after them in program order does not wait for them.
		overlap := h.OverlapBuckets && !progs[r].SerialBuckets
		cur := ""
		for i, in := range progs[r].Instrs {
			sl := tl.Instrs[r][i]
			switch in.Block {
			case "", "step", "optimizer":
				if in.Block == "optimizer" || in.Block == "" && cur != "" {
					rc.tail += sl.Seconds
				} else if cur == "" {
					rc.head += sl.Seconds
				} else if !sl.Copy {
					rc.blocks[cur] += sl.Seconds
				}
			default:
				cur = in.Block
				if sl.Copy {
					rc.blockCopies[cur] += sl.Seconds
				} else {
					rc.blocks[cur] += sl.Seconds
				}
				if !sl.Copy && !(overlap && in.Bucket > 0 && ir.Collectives[in.Op]) {
					rc.toSend[cur] += sl.Seconds
				}
				// The microbatch's activation or gradient, which the next
				// rank waits for; a once-a-step value (a tied embedding's
				// gradient, sent after its bucket) is not.
				if in.Op == "send" && in.Value != nil && in.Value.Meta.Micro >= 0 {
					rc.sent[cur] = rc.toSend[cur]
				}
			}
		}
		// A block's copies overlap its own work.
		for k, c := range rc.blockCopies {
			rc.blocks[k] = math.Max(rc.blocks[k], c)
		}
		costs[r] = rc
	}
	cost := func(a schedule.Action) float64 {
		name, ok := blockName(a)
		if !ok {
			return 0
		}
		return costs[sched.RankOf(a.Chunk)].blocks[name]
	}
	// The head (per-step work before the first block) delays a rank's
	// first action: charged to it through a longer first action.
	first := make([]int, p)
	for r := range p {
		first[r] = -1
		for k, a := range sched.Actions[r] {
			if a.Kind == schedule.F || a.Kind == schedule.B || a.Kind == schedule.W {
				first[r] = k
				break
			}
		}
	}
	withHead := func(a schedule.Action) float64 {
		c := cost(a)
		if a.Kind <= schedule.W {
			if r := sched.RankOf(a.Chunk); first[r] >= 0 && sched.Actions[r][first[r]] == a {
				c += costs[r].head
			}
		}
		return c
	}
	// What a block sends leaves when it is made: the next rank need not
	// wait for the work after the block's microbatch send (weight
	// gradients, the data-parallel reductions of a chunk's last
	// backward).
	ready := func(a schedule.Action) float64 {
		name, ok := blockName(a)
		if !ok {
			return 0
		}
		c := withHead(a)
		if sent, ok := costs[sched.RankOf(a.Chunk)].sent[name]; ok {
			return c - (cost(a) - sent)
		}
		return c
	}
	sim, err := schedule.SimulateReady(sched, withHead, ready)
	if err != nil {
		return err
	}
	tl.Actions = make([][]ActionSlice, p)
	lastEnd := make([]float64, p)
	blockStart := make([]map[string]float64, p)
	for r, acts := range sched.Actions {
		blockStart[r] = map[string]float64{}
		for k, a := range acts {
			if name, ok := blockName(a); ok {
				start, dur := sim.Start[r][k], withHead(a)
				tl.Actions[r] = append(tl.Actions[r], ActionSlice{Name: name, Start: start, Seconds: dur})
				blockStart[r][name] = start
			}
		}
		if len(acts) > 0 {
			lastEnd[r] = sim.Start[r][len(acts)-1] + withHead(acts[len(acts)-1])
		}
		pred.StepSeconds = math.Max(pred.StepSeconds, lastEnd[r]+costs[r].tail)
	}
	pred.Bubble = sim.Bubble
	// Place the instructions: the head at the start of the rank's first
	// action, each block's from its action's start, per-step work after
	// its block, the tail after the last action; copies on their stream.
	for r := range p {
		if progs[r] == nil {
			continue
		}
		firstStart := 0.0
		if first[r] >= 0 {
			firstStart = sim.Start[r][first[r]]
		}
		clock, copyClock := firstStart, 0.0
		cur, inTail := "", false
		for i, in := range progs[r].Instrs {
			sl := &tl.Instrs[r][i]
			switch in.Block {
			case "", "step", "optimizer":
				if !inTail && (in.Block == "optimizer" || in.Block == "" && cur != "") {
					inTail = true
					clock = math.Max(clock, lastEnd[r])
				}
			default:
				if in.Block != cur {
					if start, ok := blockStart[r][in.Block]; ok && cur != "" {
						clock = start
					}
					cur = in.Block
				}
			}
			if sl.Copy {
				sl.Start = math.Max(clock, copyClock)
				copyClock = sl.Start + sl.Seconds
				continue
			}
			sl.Start = clock
			clock += sl.Seconds
		}
	}
	return nil
}

// isFirstReplica says whether device r has coordinate 0 on every axis but
// pp: one device per pipeline rank, whose program every other device of
// that rank runs too (SPMD).
// devicePrice is one device's instructions priced, and their sums.
type devicePrice struct {
	ics                   []instrCost
	comm, bytes           map[string]float64
	compute, copies, busy float64
}

// priceDevice prices rank r's instructions and sums them: compute, the
// time on each axis's links, and copies to and from the host, which
// overlap the rest.
func (h *Hardware) priceDevice(prog *lower.Program, r int) *devicePrice {
	dc := &devicePrice{ics: h.instrCosts(prog, r), comm: map[string]float64{}, bytes: map[string]float64{}}
	for _, ic := range dc.ics {
		switch {
		case ic.copy:
			dc.copies += ic.seconds
			dc.comm["host"] += ic.seconds
			dc.bytes["host"] += ic.bytes
		case ic.axis != "":
			dc.comm[ic.axis] += ic.seconds
			dc.bytes[ic.axis] += ic.bytes
		default:
			dc.compute += ic.seconds - ic.hidden
			if ic.hiddenAxis != "" {
				dc.comm[ic.hiddenAxis] += ic.hidden
				dc.bytes[ic.hiddenAxis] += ic.hiddenBytes
			}
		}
	}
	// Summed in the axes' order, not the map's: a float sum in a random
	// order differs in its last bits from run to run, and plans that tie
	// would rank differently in every process of a job.
	t := dc.compute
	for _, axis := range slices.Sorted(maps.Keys(dc.comm)) {
		t += dc.comm[axis]
	}
	dc.busy = math.Max(t-dc.copies, dc.copies)
	return dc
}

// deviceClass is what a device's price depends on besides the programs:
// its pipeline rank, and where it and each of its axis groups start among
// the devices of a node (a group of ranks base + i·stride spans the same
// pattern of nodes for every base with the same base mod perNode).
func deviceClass(m *ir.Mesh, r, pr, perNode int) string {
	if m == nil {
		return ""
	}
	if perNode >= m.Devices() {
		return strconv.Itoa(pr) // one node: every group is within it
	}
	perNode = max(perNode, 1)
	key := fmt.Sprintf("%d/%d", pr, r%perNode)
	coords := m.Coords(r)
	for ax := range m.Axes {
		c := coords[ax]
		coords[ax] = 0
		key += fmt.Sprintf("/%d", m.Rank(coords)%perNode)
		coords[ax] = c
	}
	return key
}

func isFirstReplica(m *ir.Mesh, r, ppAxis int) bool {
	for i, c := range m.Coords(r) {
		if i != ppAxis && c != 0 {
			return false
		}
	}
	return true
}

func replicaCount(m *ir.Mesh, ppAxis int) int {
	if ppAxis < 0 {
		return 1
	}
	return m.Axes[ppAxis].Size
}

// instrFlops is an instruction's flops from the op table (0 for
// transfers and copies).
func instrFlops(in lower.Instr) (float64, bool) {
	f, _, _, ok := kernelCost(in)
	return float64(f), ok
}

// kernelCost is an instruction's flops and bytes from the op table and
// the dtype it computes in (a matmul's operands'); ok is false for an op
// the table does not price.
func kernelCost(in lower.Instr) (flops, bytes int64, dt ir.DType, ok bool) {
	info, ok := ir.Lookup(in.Op)
	if !ok || info.Cost == nil {
		return 0, 0, 0, false
	}
	var attrs ir.Attrs
	if in.Value != nil {
		attrs = in.Value.Attrs
	}
	flops, bytes = info.Cost(in.ArgTypes, in.OutType, attrs)
	if n := ringSteps(in); n > 1 {
		// Ring attention: the kernel runs once per chunk of the keys.
		flops, bytes = flops*int64(n), bytes*int64(n)
	}
	dt = in.OutType.DType
	if len(in.ArgTypes) > 0 && in.Op == "matmul" {
		dt = in.ArgTypes[0].DType
	}
	return flops, bytes, dt, true
}

// instrCosts prices every instruction of prog as device rank runs it.
func (h *Hardware) instrCosts(prog *lower.Program, rank int) []instrCost {
	out := make([]instrCost, len(prog.Instrs))
	mesh := prog.Mesh
	var coords []int
	if mesh != nil {
		coords = mesh.Coords(rank)
	}
	// One rank list per axis, made once: a program has hundreds of
	// collectives, and an axis may hold a million ranks (--plan over a
	// large --devices).
	groups := map[string][]int{}
	group := func(axis string) ([]int, string) {
		if mesh == nil {
			return nil, axis
		}
		if g, ok := groups[axis]; ok {
			return g, axis
		}
		ax := mesh.Axis(axis)
		if ax < 0 {
			return nil, axis
		}
		groups[axis] = mesh.AxisRanks(coords, ax)
		return groups[axis], axis
	}
	// The link an axis's group spans, likewise once per axis.
	links := map[string]Link{}
	linkOf := func(axis string, ranks []int) Link {
		l, ok := links[axis]
		if !ok {
			l = h.LinkFor(ranks)
			links[axis] = l
		}
		return l
	}
	// Buckets: one call per run of one op in a bucket, priced at its
	// first instruction.
	calls := bucketCalls(prog)
	for i, in := range prog.Instrs {
		ic := &out[i]
		switch {
		case ir.Collectives[in.Op]:
			ranks, axis := group(in.Attrs.Str("axis"))
			if in.Value != nil && axis == "" {
				ranks, axis = group(in.Value.Attrs.Str("axis"))
			}
			n := len(ranks)
			ic.axis = axis
			b := float64(wholeBytes(in))
			if call, ok := calls[i]; ok {
				if call == 0 {
					ic.bytes = b * float64(max(n-1, 0)) / float64(max(n, 1)) * busFactor(in.Op)
					continue
				}
				b = call
			}
			ic.seconds = h.kernels(1, Collective(in.Op, n, b, linkOf(axis, ranks))+h.LaunchUS*1e-6)
			if in.Bucket > 0 {
				b = float64(wholeBytes(in))
			}
			ic.bytes = b * float64(max(n-1, 0)) / float64(max(n, 1)) * busFactor(in.Op)
		case in.Op == "send" || in.Op == "recv":
			ic.axis = "pp"
			var n int64
			if in.Op == "send" {
				n = in.ArgTypes[0].Bytes()
			} else {
				n = in.OutType.Bytes()
			}
			ic.bytes = float64(n)
			if in.Op == "send" {
				// Buffered: the sender copies into staging and goes on.
				ic.seconds = h.LaunchUS*1e-6 + h.memTime(2*float64(n))
				ic.bytes = float64(n)
				continue
			}
			ic.bytes = 0 // counted once, at the sender
			peer := []int{rank}
			if mesh != nil {
				if pa := mesh.PipelineAxis(); pa >= 0 {
					c := append([]int(nil), coords...)
					c[pa] = in.Peer
					peer = append(peer, mesh.Rank(c))
				}
			}
			ic.seconds = P2P(float64(n), h.LinkFor(peer))
		case in.Op == "copy" && isHostCopy(prog, in):
			n := float64(prog.Buffers[in.Out].Bytes)
			ic.copy, ic.bytes = true, n
			ic.seconds = n / (h.HostGBps * 1e9)
		default:
			f, b, dt, ok := kernelCost(in)
			if !ok {
				continue
			}
			ic.seconds = h.OpTime(in.Op, dt, f, b)
			if lower.RingAttention(in.Value, mesh) {
				ax := mesh.SequenceAxis()
				ranks, name := group(mesh.Axes[ax].Name)
				h.priceRing(ic, in, linkOf(name, ranks), name, mesh.Axes[ax].Zigzag)
			}
			// Megatron's vocab-parallel cross-entropy exchanges per-row
			// statistics inside the one instruction (runtime/cpu/vocab.go:
			// an all-gather of the row maxima, an all-reduce of the sums
			// and target logits, in float64): invisible to the IR, priced
			// here.
			if (in.Op == "cross_entropy" || in.Op == "cross_entropy_grad") && in.Value != nil && mesh != nil {
				if ax := vocabAxis(in.Value.Args[0]); ax >= 0 {
					ranks, name := group(mesh.Axes[ax].Name)
					rows := float64(in.ArgTypes[0].Shape[0])
					l := linkOf(name, ranks)
					n := len(ranks)
					extra := Collective("all_gather", n, rows*8*float64(n), l) + Collective("all_reduce", n, 2*rows*8, l)
					ic.seconds += extra
					ic.axis = mesh.Axes[ax].Name
					ic.bytes = rows * 8 * float64(n-1) * 3
				}
			}
		}
	}
	return out
}

// priceRing prices a ring attention instruction (lower.RingAttention)
// whose cp chunks' kernels ic.seconds already holds (kernelCost): cp steps, each
// beside the transfer of the chunks that travel (their own stream on a
// GPU, so a step pays the larger of the two), and for dk and dv the
// finished gradient's step home. Chunks travel in float32 (16-bit
// operands are widened) or float64.
func (h *Hardware) priceRing(ic *instrCost, in lower.Instr, l Link, axis string, zigzag bool) {
	cp := float64(ringSteps(in))
	if L := float64(in.ArgTypes[0].Shape[2]); !zigzag && in.Value.Attrs.Bool("causal") {
		// kernelCost counted cp chunks of the average rank's causal work,
		// L(L+1)/2 pairs each; in contiguous chunks the last rank sees
		// every earlier chunk whole: (cp−1)·L² + L(L+1)/2.
		diag := L * (L + 1) / 2
		ic.seconds *= ((cp-1)*L*L + diag) / (cp * diag)
	}
	ns, nh, nc := lower.RingTraffic(in.Op, in.ArgTypes[0], in.ArgTypes[1])
	streams, home, chunk := float64(ns), float64(nh), float64(nc)
	step := ic.seconds / cp // kernelCost priced every step
	move := P2P(streams*chunk, l)
	exposed := (cp - 1) * math.Max(move-step, 0)
	ic.hiddenBytes = (cp - 1) * streams * chunk
	if home > 0 {
		exposed += home * P2P(chunk, l)
		ic.hiddenBytes += home * chunk
	}
	ic.seconds += exposed
	ic.hidden, ic.hiddenAxis = exposed, axis
}

// ringSteps is how many chunks of the keys a ring attention instruction
// (one with scratch, lower.RingScratch) computes on: its q's whole
// sequence over its local one; 1 for any other instruction.
func ringSteps(in lower.Instr) int {
	if len(in.Scratch) == 0 || in.Value == nil || len(in.Value.Args) == 0 || len(in.ArgTypes) == 0 || in.ArgTypes[0].Rank() != 4 {
		return 1
	}
	return in.Value.Args[0].Type.Shape[2] / max(in.ArgTypes[0].Shape[2], 1)
}

// bucketCalls says, for each bucketed collective of prog, whether it
// leads its call (lower.Program.BucketRun: the consecutive members of its
// bucket and op, which a runtime issues as one call) and the whole bytes
// the call moves (0 for the members that follow the leader).
func bucketCalls(prog *lower.Program) map[int]float64 {
	bytes := map[int]float64{}
	for i := range prog.Instrs {
		run, leads := prog.BucketRun(i)
		if !leads || !ir.Collectives[run[0].Op] {
			continue
		}
		for k, in := range run {
			bytes[i+k] = 0
			bytes[i] += float64(wholeBytes(in))
		}
	}
	return bytes
}

// busFactor is how many times a ring collective's per-step share crosses
// a device's link: twice for an all-reduce (reduce-scatter then
// all-gather), once for the others.
func busFactor(op string) float64 {
	if op == "all_reduce" {
		return 2
	}
	return 1
}

// wholeBytes is the size of a collective's unsplit tensor: the larger of
// its local argument and result.
func wholeBytes(in lower.Instr) int64 {
	n := in.OutType.Bytes()
	for _, t := range in.ArgTypes {
		n = max(n, t.Bytes())
	}
	return n
}

// isHostCopy says whether a copy moves an offloaded buffer between host
// and device (the other copies are device-local update copies).
func isHostCopy(prog *lower.Program, in lower.Instr) bool {
	if in.Out >= 0 && in.Out < len(prog.Buffers) && prog.Buffers[in.Out].Host {
		return true
	}
	for _, a := range in.Args {
		if a >= 0 && a < len(prog.Buffers) && prog.Buffers[a].Host {
			return true
		}
	}
	return false
}

// vocabAxis is the mesh axis splitting dim 1 of logits, or −1.
func vocabAxis(v *ir.Value) int {
	for i, p := range v.Place {
		if p.Kind == ir.Shard && p.Dim == 1 {
			return i
		}
	}
	return -1
}
