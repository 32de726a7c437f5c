// Package lower turns a compiled ir.Module into a Program a runtime can
// execute without further decisions: an instruction list in program order,
// one arena per device with a static offset for every buffer, the
// predicted peak of live bytes, and which instructions compute the loss
// alone (for evaluation).
//
// Memory is planned at compile time (memplan.go). Params, optimizer state,
// inputs and constants live for the whole run at the bottom of the arena;
// every other value gets a buffer live from its defining instruction to its
// last use, and buffers whose lifetimes do not overlap share bytes (a
// linear scan with first-fit, or a greedy order when that packs tighter).
// A reshape is a view of its argument and gets no buffer of its own. An
// update whose new value is computed by an elementwise op at the state's
// last read is done in place; other updates become copies at the end of
// the step. With Options.Offload, params and optimizer state live in a
// host arena and are copied to the device around their uses (offload.go).
package lower

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"gcompile/ir"
)

// BufferKind says what a buffer holds and so how long it lives.
type BufferKind uint8

// Buffer kinds. Persistent kinds live for the whole run.
const (
	Temp  BufferKind = iota // an intermediate value of one step
	Param                   // trainable parameter
	State                   // optimizer state
	Input                   // fed by the runtime before each step
	Const                   // filled once at load
)

var kindNames = [...]string{"temp", "param", "state", "input", "const"}

func (k BufferKind) String() string { return kindNames[k] }

// Persistent reports whether buffers of this kind outlive a step.
func (k BufferKind) Persistent() bool { return k != Temp }

// Buffer is a region of the arena.
type Buffer struct {
	ID   int
	Kind BufferKind
	Name string // source name for params, state and inputs
	// Type is what one device holds; Global the whole value, split over
	// the mesh by Place.
	Type   ir.Type
	Global ir.Type
	Place  []ir.Placement
	Offset int64
	Bytes  int64
	Value  *ir.Value // the value that defines the buffer
	// Host buffers live in the host arena (offloaded), not the device's.
	Host bool
	// Scratch buffers are live only while one instruction runs (its
	// Instr.Scratch): ring attention's chunks in flight. Workspace.
	Scratch bool
}

// Instr is one kernel launch, a collective (Op all_reduce, …), or, with
// Op "copy", a buffer copy.
type Instr struct {
	Op    string
	Attrs ir.Attrs
	Args  []int // buffer ids
	Out   int   // buffer id
	Value *ir.Value
	// ArgTypes and OutType are the local (per-device) types.
	ArgTypes []ir.Type
	OutType  ir.Type
	// Scale, when not 0, multiplies the result: a mean over rows that are
	// split across devices divides by the global count, not the local one.
	Scale float64
	// Bucket > 0 groups consecutive reductions into one collective call
	// (bucket number + 1; 0 means alone).
	Bucket int
	// Peer and Tag address a pipeline transfer (Op "send" or "recv"): the
	// pipeline rank at the other end and the value's id. A send has Out −1.
	Peer, Tag int
	// Block names the schedule action an instruction belongs to under
	// pipeline parallelism ("F c1 m3"), for traces; "" otherwise.
	Block string
	// Frees lists buffers whose last use is this instruction.
	Frees []int
	// Scratch lists temporary buffers live only while this instruction
	// runs: ring attention's chunks in flight and running results
	// (RingScratch). The memory plan counts them there.
	Scratch []int
}

// Program is what one device executes each step.
type Program struct {
	Name    string
	Mesh    *ir.Mesh // nil: one device
	Buffers []Buffer
	Instrs  []Instr
	// ForwardEnd: Instrs[:ForwardEnd] compute every forward value the loss
	// needs, so evaluation runs only that prefix.
	ForwardEnd int
	// Outputs and sources by name, as buffer ids.
	Outputs map[string]int
	Sources map[string]int
	// ArenaBytes is the arena size; PeakBytes the most bytes live at once,
	// persistent buffers included; PersistentBytes the persistent part.
	ArenaBytes, PeakBytes, PersistentBytes int64
	// HostBytes is the host arena: offloaded buffers.
	HostBytes int64
	// PeakAt is the instruction at which PeakBytes is live, Peak how those
	// bytes divide, and PeakLive the temporaries live there, largest first.
	PeakAt   int
	Peak     Breakdown
	PeakLive []int
	// SerialBuckets: the gradient buckets' reductions run in program
	// order with the rest (Options.SerialBuckets).
	SerialBuckets bool
}

// Breakdown divides a device's live bytes the way memory is usually
// discussed: parameters, gradients (everything the backward pass computes),
// optimizer state, activations (what the forward pass computes and keeps),
// inputs and workspace (the optimizer's temporaries, collective scratch).
type Breakdown struct {
	Params      int64 `json:"params"`
	Gradients   int64 `json:"gradients"`
	Optimizer   int64 `json:"optimizer_state"`
	Activations int64 `json:"activations"`
	Inputs      int64 `json:"inputs"`
	Workspace   int64 `json:"workspace"`
	// KVCache is generation's key/value caches (ir.KVCachePrefix).
	KVCache int64 `json:"kv_cache,omitempty"`
}

// KVCache reports whether b is one of generation's key/value caches
// (state named ir.KVCachePrefix…).
func (b Buffer) KVCache() bool {
	return b.Kind == State && strings.HasPrefix(b.Name, ir.KVCachePrefix)
}

// Category names where a buffer's bytes count in a Breakdown.
func (b Buffer) Category() string {
	switch {
	case b.Scratch:
		return "workspace"
	case isWeight(b.Value) || weightCopy(b.Value):
		// A param, a weight version kept as state (PipeDream-2BW), or a
		// temporary copy of either (offload's device copy, a pipeline
		// rank's received param, mixed precision's 16-bit copy, ZeRO's
		// gathered one).
		return "params"
	case b.KVCache():
		return "kv_cache"
	case b.Kind == State || b.Value.Op == "state":
		return "optimizer_state"
	case b.Kind == Input || b.Kind == Const:
		return "inputs"
	}
	switch b.Value.Meta.Phase {
	case ir.PhaseFwd, ir.PhaseRecompute:
		return "activations"
	case ir.PhaseBwd:
		return "gradients"
	}
	return "workspace"
}

// weightCopy reports whether v is a weight cast to another dtype or
// gathered whole, or a chain of those.
func weightCopy(v *ir.Value) bool {
	for v != nil && (v.Op == "cast" || v.Op == "all_gather") && len(v.Args) == 1 {
		v = v.Args[0]
		if isWeight(v) {
			return true
		}
	}
	return false
}

func (bd *Breakdown) add(category string, n int64) {
	switch category {
	case "params":
		bd.Params += n
	case "optimizer_state":
		bd.Optimizer += n
	case "inputs":
		bd.Inputs += n
	case "kv_cache":
		bd.KVCache += n
	case "activations":
		bd.Activations += n
	case "gradients":
		bd.Gradients += n
	default:
		bd.Workspace += n
	}
}

// Options change how a module is lowered.
type Options struct {
	// Offload names what lives in the host arena rather than the
	// device's: "optimizer" (optimizer state), "params" (parameters), or
	// both, "optimizer,params"; "" or "none" offloads nothing. An offloaded
	// buffer is on the device only around its uses (see offload).
	Offload string
	// PrefetchLayers is how many layer blocks ahead of its use an
	// offloaded buffer is copied to the device: with 1 (DefaultPrefetch-
	// Layers, which 0 selects) layer l+1's params are copied when layer l
	// starts, so the copy can overlap layer l's compute. A negative value
	// issues each copy right before its first use.
	PrefetchLayers int
	// SerialBuckets (--overlap-grad-reduce=false) has the runtime reduce
	// each gradient bucket in program order on the compute stream, not on
	// a stream of its own beside the rest of the backward.
	SerialBuckets bool
	// SendsFirst puts a pipeline block's sends before its gradient
	// buckets (sendsBeforeBuckets), for a runtime that runs collectives
	// in program order: the CPU backend, or SerialBuckets.
	SendsFirst bool
}

// Lower builds the Program for m.
func Lower(m *ir.Module) (*Program, error) { return LowerWith(m, Options{}) }

// LowerWith builds the Program for m with options.
func LowerWith(m *ir.Module, o Options) (*Program, error) {
	if _, _, err := ParseOffload(o.Offload); err != nil {
		return nil, fmt.Errorf("offload %q: %w", o.Offload, err)
	}
	if err := ir.Verify(m, "lower"); err != nil {
		return nil, err
	}
	// ir.Verify checked that every op's operands, as each device holds
	// them, make its result's block (its checkLocalShapes): the kernels
	// run on the blocks.
	b := newBuilder(m.Name, m.Mesh)
	for _, v := range m.Values {
		b.value(v)
	}
	p, bufOf := b.p, b.bufOf
	for _, o := range m.Outputs {
		p.Outputs[o.Name] = bufOf[o.Value]
	}
	if err := groupBuckets(p); err != nil {
		return nil, err
	}
	p.ForwardEnd = forwardEnd(p, m, bufOf)
	for _, in := range p.Instrs[:p.ForwardEnd] {
		if in.Value.Meta.Phase == ir.PhaseOpt {
			return nil, fmt.Errorf("%s: optimizer op before the loss is complete; evaluation would update the weights", in.Value.Where())
		}
	}
	if err := planUpdates(p, m, bufOf); err != nil {
		return nil, err
	}
	widenIntoSums(p)
	accumulateInPlace(p)
	overwriteLastReads(p)
	if err := offload(p, o); err != nil {
		return nil, err
	}
	// Copies inserted in the forward move the loss's instruction.
	p.ForwardEnd = forwardEnd(p, m, bufOf)
	if err := checkArena(p); err != nil {
		return nil, err
	}
	planMemory(p)
	p.SerialBuckets = o.SerialBuckets
	return p, nil
}

// builder turns values into buffers and instructions.
type builder struct {
	p     *Program
	bufOf map[*ir.Value]int
}

func newBuilder(name string, mesh *ir.Mesh) *builder {
	return &builder{p: &Program{Name: name, Mesh: mesh, Outputs: map[string]int{}, Sources: map[string]int{}}, bufOf: map[*ir.Value]int{}}
}

func (b *builder) local(v *ir.Value) ir.Type {
	return ir.Type{DType: v.Type.DType, Shape: ir.LocalShape(v.Type.Shape, v.Place, b.p.Mesh)}
}

func (b *builder) newBuf(v *ir.Value, kind BufferKind) int {
	id := len(b.p.Buffers)
	t := b.local(v)
	b.p.Buffers = append(b.p.Buffers, Buffer{ID: id, Kind: kind, Name: v.Name(), Type: t, Global: v.Type, Place: v.Place, Bytes: t.Bytes(), Value: v})
	b.bufOf[v] = id
	return id
}

var sourceKinds = map[string]BufferKind{"param": Param, "state": State, "input": Input, "const": Const}

// value adds v: a source gets a persistent buffer, a reshape shares its
// argument's buffer, anything else gets a buffer and an instruction.
func (b *builder) value(v *ir.Value) {
	p := b.p
	switch v.Op {
	case "param", "state", "input", "const":
		b.newBuf(v, sourceKinds[v.Op])
		if v.Op != "const" {
			p.Sources[v.Name()] = b.bufOf[v]
		}
	case "reshape":
		b.bufOf[v] = b.bufOf[v.Args[0]]
	default:
		b.newBuf(v, Temp)
		in := Instr{Op: v.Op, Attrs: v.Attrs, Out: b.bufOf[v], Value: v, OutType: b.local(v), Scale: meanScale(v, p.Mesh)}
		for _, a := range v.Args {
			in.Args = append(in.Args, b.bufOf[a])
			in.ArgTypes = append(in.ArgTypes, b.local(a))
		}
		if bk, ok := v.Attrs["bucket"].(int); ok {
			in.Bucket = bk + 1
		}
		if RingAttention(v, p.Mesh) {
			var n int64
			for _, piece := range RingScratch(v.Op, in.ArgTypes[0], in.ArgTypes[1]) {
				n += piece
			}
			t := ir.Type{DType: ir.U8, Shape: ir.Shape{int(n)}} // raw bytes, carved by the runtime
			id := len(p.Buffers)
			p.Buffers = append(p.Buffers, Buffer{ID: id, Kind: Temp, Type: t, Global: t, Bytes: n, Value: v, Scratch: true})
			in.Scratch = []int{id}
		}
		p.Instrs = append(p.Instrs, in)
	}
}

// send transfers v's buffer to pipeline rank peer; recv makes v available
// here, received from peer.
func (b *builder) send(v *ir.Value, peer int) {
	b.p.Instrs = append(b.p.Instrs, Instr{Op: "send", Args: []int{b.bufOf[v]}, ArgTypes: []ir.Type{b.local(v)}, Out: -1, Value: v, Peer: peer, Tag: v.ID})
}

func (b *builder) recv(v *ir.Value, peer int) {
	out := b.newBuf(v, Temp)
	b.p.Instrs = append(b.p.Instrs, Instr{Op: "recv", Out: out, OutType: b.local(v), Value: v, Peer: peer, Tag: v.ID})
}

// scatterDim is where a pipeline transfer of v can be cut across the
// tensor-parallel ranks (Megatron's scatter/gather): a value whole on tp
// is sent as 1/t slices, one per tp rank, and gathered by the receiver.
// -1 when v is not whole on a tp axis larger than 1 or no dim divides.
func (b *builder) scatterDim(v *ir.Value) (axis int, dim int) {
	m := b.p.Mesh
	axis = m.WeightAxis()
	if axis < 0 || m.Axes[axis].Size == 1 || v.Place == nil || v.Place[axis].Kind != ir.Replicate {
		return -1, -1
	}
	t := m.Axes[axis].Size
	local := b.local(v)
	for d := local.Rank() - 1; d >= 0; d-- {
		if local.Shape[d]%t == 0 {
			return axis, d
		}
	}
	return -1, -1
}

// tempOf adds a scratch buffer holding v's local value sliced on dim over
// the axis.
func (b *builder) tempOf(v *ir.Value, axis, dim int) (int, ir.Type) {
	t := b.local(v)
	t.Shape = t.Shape.Clone()
	t.Shape[dim] /= b.p.Mesh.Axes[axis].Size
	id := len(b.p.Buffers)
	b.p.Buffers = append(b.p.Buffers, Buffer{ID: id, Kind: Temp, Type: t, Global: v.Type, Bytes: t.Bytes(), Value: v})
	return id, t
}

// sendScattered sends this tp rank's slice of v.
func (b *builder) sendScattered(v *ir.Value, peer, axis, dim int) {
	tmp, t := b.tempOf(v, axis, dim)
	attrs := ir.Attrs{"axis": b.p.Mesh.Axes[axis].Name, "dim": dim}
	b.p.Instrs = append(b.p.Instrs,
		Instr{Op: "shard_slice", Attrs: attrs, Args: []int{b.bufOf[v]}, ArgTypes: []ir.Type{b.local(v)}, Out: tmp, OutType: t, Value: v},
		Instr{Op: "send", Args: []int{tmp}, ArgTypes: []ir.Type{t}, Out: -1, Value: v, Peer: peer, Tag: v.ID})
}

// recvGathered receives this tp rank's slice of v and all-gathers v.
func (b *builder) recvGathered(v *ir.Value, peer, axis, dim int) {
	tmp, t := b.tempOf(v, axis, dim)
	out := b.newBuf(v, Temp)
	attrs := ir.Attrs{"axis": b.p.Mesh.Axes[axis].Name, "dim": dim}
	b.p.Instrs = append(b.p.Instrs,
		Instr{Op: "recv", Out: tmp, OutType: t, Value: v, Peer: peer, Tag: v.ID},
		Instr{Op: "all_gather", Attrs: attrs, Args: []int{tmp}, ArgTypes: []ir.Type{t}, Out: out, OutType: b.local(v), Value: v})
}

// meanScale is the factor that turns a mean over device-local rows into
// that device's share of the mean over all rows: 1/n for each mesh axis of
// size n that splits a reduced dim. 0 means no scaling.
func meanScale(v *ir.Value, mesh *ir.Mesh) float64 {
	if mesh == nil || len(v.Args) == 0 || v.Args[0].Place == nil {
		return 0
	}
	var reduced []int
	switch v.Op {
	case "cross_entropy", "cross_entropy_grad":
		reduced = []int{0}
	case "reduce_mean":
		reduced = v.Attrs.Ints("axes")
	default:
		return 0
	}
	f := 1.0
	for i, pl := range v.Args[0].Place {
		if pl.Kind == ir.Shard && slices.Contains(reduced, pl.Dim) {
			f /= float64(mesh.Axes[i].Size)
		}
	}
	if f == 1 {
		return 0
	}
	return f
}

// BucketRun says whether instruction i leads a run of bucketed
// collectives, and the run it leads: the consecutive instructions of its
// bucket and op from i on, which a runtime issues as one call (a bucket
// under ZeRO may all-reduce the few gradients it cannot split among its
// reduce-scatters, and each run of one op is a call). An instruction
// outside a bucket, or one that follows its run's leader, leads nothing
// (members nil), so asking of every instruction costs the program's
// length.
func (p *Program) BucketRun(i int) (members []Instr, leads bool) {
	in := p.Instrs[i]
	same := func(j int) bool { return p.Instrs[j].Bucket == in.Bucket && p.Instrs[j].Op == in.Op }
	if in.Bucket <= 0 || i > 0 && same(i-1) {
		return nil, false
	}
	j := i
	for j < len(p.Instrs) && same(j) {
		j++
	}
	return p.Instrs[i:j], true
}

// LargestScatterBucket is the elements of the largest bucket run of
// reduce-scatters of several gradients, whole and its shards: what the
// runtimes stage such a bucket in (a bucket of one gradient needs no
// staging). Both are at most the bucket size.
func (p *Program) LargestScatterBucket() (whole, shard int64) {
	for i := range p.Instrs {
		run, leads := p.BucketRun(i)
		if !leads || len(run) < 2 || run[0].Op != "reduce_scatter" {
			continue
		}
		var w, s int64
		for _, m := range run {
			w += m.ArgTypes[0].Shape.NumElements()
			s += m.OutType.Shape.NumElements()
		}
		whole, shard = max(whole, w), max(shard, s)
	}
	return whole, shard
}

// groupBuckets moves the reductions of each gradient bucket next to the
// bucket's last member, so the runtime issues them as one collective.
// Moving a reduction later is safe when nothing reads its result before
// the bucket completes, which holds for gradients (read by the optimizer).
// Gradient accumulation's adds of a microbatch's reduced gradients
// (passes.dataParallel buckets ZeRO-2/3's per-microbatch reduce-scatters)
// move with them, after the bucket, and so does whatever reads a moved
// add before then (the next microbatch's add); a bucket member that would
// have to move after its own bucket, or anything else that reads a
// bucket's result before the bucket completes, is an error.
func groupBuckets(p *Program) error {
	last := map[int]int{}
	for i, in := range p.Instrs {
		if in.Bucket > 0 {
			last[in.Bucket] = i
		}
	}
	if len(last) == 0 {
		return nil
	}
	// after[id] is the bucket whose end a moved instruction waits for,
	// and the instruction's value, by its output; pending[b] what runs
	// after bucket b's last member.
	type waiting struct {
		bucket int
		v      *ir.Value
	}
	after := map[int]waiting{}
	pending := map[int][]Instr{}
	var out []Instr
	for i, in := range p.Instrs {
		wait, read := 0, in.Value // the bucket this instruction must follow, and what it reads of it
		for _, a := range in.Args {
			if w, ok := after[a]; ok && last[w.bucket] > i && (wait == 0 || last[w.bucket] > last[wait]) {
				wait, read = w.bucket, w.v
			}
		}
		// A bucketed reader runs where its bucket goes: a dp bucket
		// reading an ep bucket's sums (passes.dataParallel) waits for its
		// own last gradient, after the ep bucket.
		if wait > 0 && (in.Bucket > 0 && last[in.Bucket] <= last[wait] || in.Bucket == 0 && !movable(in, p.Mesh)) {
			return fmt.Errorf("%s: bucket %d cannot wait for its last gradient: %s reads the result first", read.Where(), wait-1, in.Value.Where())
		}
		switch {
		case wait > 0 && in.Bucket == 0:
			pending[wait] = append(pending[wait], in)
			after[in.Out] = waiting{wait, in.Value}
		case in.Bucket > 0 && i != last[in.Bucket]:
			pending[in.Bucket] = append(pending[in.Bucket], in)
			after[in.Out] = waiting{in.Bucket, in.Value}
		case in.Bucket > 0:
			// The members first, then what waited for the bucket.
			var members, readers []Instr
			for _, q := range pending[in.Bucket] {
				if q.Bucket == in.Bucket {
					members = append(members, q)
				} else {
					readers = append(readers, q)
				}
			}
			out = append(out, members...)
			out = append(out, in)
			out = append(out, readers...)
			delete(pending, in.Bucket)
		default:
			out = append(out, in)
		}
	}
	p.Instrs = out
	return nil
}

// movable says whether in may run later than where it stands for a
// gradient bucket it reads: gradient accumulation's sums in the backward,
// and the optimizer's work. A pipeline rank emits the optimizer's work on
// a gradient as soon as the gradient is reduced (lower.LowerPipeline);
// under zero-bubble a bucket holds gradients B finishes (a LayerNorm's)
// and gradients W finishes, and what read the former (mixed precision's
// unscale, ZeRO's shard of the gradient) stood before the bucket's end.
// A collective moves only on an axis within a pipeline stage (dp, tp, ep,
// cp), whose ranks all run this program and move it alike; a transfer to
// or from another stage, whose rank runs another program, never moves.
func movable(in Instr, mesh *ir.Mesh) bool {
	v := in.Value
	if v.Op == "add" && v.Meta.Micro < 0 && v.Meta.Phase == ir.PhaseBwd {
		return true
	}
	if v.Op == "cast" && len(v.Args) == 1 && v.Args[0].Attrs.Bool("round_each") {
		// The fp32 copy of a 16-bit reduction's sum (--grad-reduce-dtype).
		return true
	}
	if v.Meta.Phase != ir.PhaseOpt || in.Op == "send" || in.Op == "recv" {
		return false
	}
	if ir.Collectives[in.Op] {
		ax := mesh.Axis(in.Attrs.Str("axis"))
		return ax >= 0 && ax != mesh.PipelineAxis()
	}
	return true
}

// forwardEnd is one past the last instruction the loss depends on.
//
// The model's forward outputs (aux/…: an MoE's lm_loss, which evaluation
// reports) count too: with microbatches their means may come after the
// loss's, and an evaluation that stopped at the loss read a buffer never
// written.
func forwardEnd(p *Program, m *ir.Module, bufOf map[*ir.Value]int) int {
	if m.Output(ir.OutputLoss) == nil {
		return 0
	}
	ends := map[int]bool{}
	for _, o := range m.Outputs {
		if o.Name == ir.OutputLoss || strings.HasPrefix(o.Name, ir.AuxPrefix) && o.Value.Meta.Phase == ir.PhaseFwd {
			ends[bufOf[o.Value]] = true
		}
	}
	end := 0
	for i, in := range p.Instrs {
		if ends[in.Out] {
			end = i + 1
		}
	}
	return end
}

// planUpdates makes each update either an in-place write (the instruction
// producing the new value writes straight into the state's buffer) or a
// copy at the end of the step.
func planUpdates(p *Program, m *ir.Module, bufOf map[*ir.Value]int) error {
	lastRead := map[int]int{}
	for i, in := range p.Instrs {
		for _, a := range in.Args {
			lastRead[a] = i
		}
	}
	producer := map[int]int{}
	for i, in := range p.Instrs {
		if in.Out >= 0 {
			producer[in.Out] = i
		}
	}
	// An update whose new value is another state's old value (PipeDream-
	// 2BW's previous weights) copies it at the end of the step: that copy
	// reads it last, so nothing may overwrite it in place before then.
	for _, u := range m.Updates {
		if _, computed := producer[bufOf[u.Value]]; !computed {
			lastRead[bufOf[u.Value]] = len(p.Instrs)
		}
	}
	// Where each buffer is read (instruction, argument): an update points
	// its new value's readers at the state's buffer through it, where a
	// walk of the instructions after the producer, for each of a model's
	// thousands of updates, made lowering quadratic in its layers.
	type use struct{ instr, arg int }
	readers := map[int][]use{}
	for j, in := range p.Instrs {
		for k, a := range in.Args {
			readers[a] = append(readers[a], use{j, k})
		}
	}
	var copies []Instr
	for _, u := range m.Updates {
		dst, src := bufOf[u.State], bufOf[u.Value]
		i, computed := producer[src]
		if computed && !isOutput(p, src) && (overwrites(p.Instrs[i], dst) && lastRead[dst] == i || writesOver(p, i, src, dst, lastRead)) {
			// Point every reader of the new value (from its producer on)
			// at the state's buffer.
			for _, r := range readers[src] {
				if r.instr >= i && p.Instrs[r.instr].Args[r.arg] == src {
					p.Instrs[r.instr].Args[r.arg] = dst
					readers[dst] = append(readers[dst], r)
				}
			}
			p.Instrs[i].Out = dst
			p.Buffers[src].Bytes = 0 // unused now
			continue
		}
		copies = append(copies, Instr{Op: "copy", Args: []int{src}, Out: dst, Value: u.Value})
	}
	p.Instrs = append(p.Instrs, copies...)
	return nil
}

// accumulateInPlace writes each partial sum of a gradient over the
// microbatches (the microbatch pass's once-a-step adds) over the sum
// before it, where that add is the only reader of the earlier sum: one
// buffer accumulates, as Megatron-LM's main_grad does. Otherwise the old
// and the new sum were both live at every add, and a device held a
// gradient's bytes twice at its peak (the last pipeline rank twice the
// tied head's V·h). The kernels of add read each element before writing
// it (ir's elementwise ops).
func accumulateInPlace(p *Program) {
	readers := make([]int, len(p.Buffers))
	for _, in := range p.Instrs {
		for _, a := range in.Args {
			readers[a]++
		}
	}
	writeOver(p, func(_ int, in *Instr) (int, bool) {
		v := in.Value
		if in.Op != "add" || v == nil || v.Meta.Phase != ir.PhaseBwd || v.Meta.Micro >= 0 || len(in.Args) != 2 || in.Args[0] == in.Args[1] {
			return 0, false
		}
		return in.Args[0], readers[in.Args[0]] == 1
	}, func(src, dst int) { readers[src] = readers[dst] })
}

// widenIntoSums lets each fp32 sum of mixed-precision gradients read a
// 16-bit gradient itself where it read an fp32 copy of it made for it
// alone: add(sum, cast(g)) becomes an add of the fp32 sum and the 16-bit
// g, which both backends run as one kernel that widens g as it reads it
// (Megatron-LM adds into its fp32 main_grad the same way). These are the
// sums over the microbatches, and a tied table's two parts of a
// microbatch's gradient (the embedding's and the head's). The cast's fp32
// buffer was 4 bytes an element beside the sum's 4 and g's 2 at every
// add, the largest gradient's included; widening is exact, so the sums
// are the same bits. A cast anything else reads (ZeRO-2's reduce-scatter
// of each microbatch's copy) stays.
func widenIntoSums(p *Program) {
	readers := make([]int, len(p.Buffers))
	producer := make([]int, len(p.Buffers))
	for i, in := range p.Instrs {
		for _, a := range in.Args {
			readers[a]++
		}
		if in.Out >= 0 {
			producer[in.Out] = i + 1 // 0: none
		}
	}
	for _, b := range p.Outputs {
		readers[b]++
	}
	drop := map[int]bool{}
	for i := range p.Instrs {
		in := &p.Instrs[i]
		v := in.Value
		if in.Op != "add" || v == nil || v.Meta.Phase != ir.PhaseBwd || len(in.Args) != 2 ||
			in.Args[0] == in.Args[1] || in.OutType.DType != ir.F32 {
			continue
		}
		for k := 1; k >= 0; k-- {
			c, sum := in.Args[k], in.Args[1-k]
			j := producer[c] - 1
			if j < 0 || readers[c] != 1 || p.Instrs[j].Op != "cast" || len(p.Instrs[j].Args) != 1 || in.ArgTypes[1-k].DType != ir.F32 {
				continue
			}
			g := p.Instrs[j].Args[0]
			gb, cb := p.Buffers[g], p.Buffers[c]
			if !gb.Type.DType.Is16() || cb.Type.DType != ir.F32 || gb.Kind != Temp || cb.Kind != Temp || gb.Scratch || cb.Scratch ||
				!gb.Type.Shape.Equal(cb.Type.Shape) {
				continue
			}
			in.Args = []int{sum, g}
			in.ArgTypes = []ir.Type{in.ArgTypes[1-k], p.Instrs[j].ArgTypes[0]}
			drop[j] = true
			p.Buffers[c].Bytes = 0 // unused now
			break
		}
	}
	if len(drop) == 0 {
		return
	}
	kept := p.Instrs[:0]
	end := p.ForwardEnd
	for i, in := range p.Instrs {
		if drop[i] {
			if i < p.ForwardEnd {
				end--
			}
			continue
		}
		kept = append(kept, in)
	}
	p.Instrs, p.ForwardEnd = kept, end
}

// overwriteLastReads writes the result of an op the table lets work in
// place (its kernels read each element before writing it) over its
// in-place argument where that instruction is the argument's last reader:
// the loss's gradient over the fp32 logits it reads, as Megatron-LM's
// cross-entropy writes its gradient over its softmax, where both were
// live at the peak of most plans (4 bytes a logit). Only arguments no
// collective, copy or transfer reads (the CUDA backend runs those on side
// streams, which could still be reading).
func overwriteLastReads(p *Program) {
	last := make([]int, len(p.Buffers))
	sideRead := make([]bool, len(p.Buffers))
	for i, in := range p.Instrs {
		for _, a := range in.Args {
			last[a] = i
			switch in.Op {
			case "copy", "send", "recv", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "redistribute":
				sideRead[a] = true
			}
		}
	}
	writeOver(p, func(i int, in *Instr) (int, bool) {
		info, ok := ir.Lookup(in.Op)
		if !ok || !info.InPlace || info.Update != ir.NoUpdate || info.InPlaceArg >= len(in.Args) {
			return 0, false
		}
		src := in.Args[info.InPlaceArg]
		return src, src != in.Out && last[src] == i && !sideRead[src] && overwrites(*in, src)
	}, func(src, dst int) { last[src], sideRead[src] = last[dst], sideRead[dst] })
}

// writeOver makes each instruction that pick names an argument for write
// its result into that argument's buffer, where both are temporaries of
// the same bytes, type and placement (none a program output, on the host
// or scratch). Every later instruction reads the result there: renamed as
// the pass reaches them, in one pass over the program. merged(src, dst)
// tells pick's bookkeeping that dst's reads are now src's.
func writeOver(p *Program, pick func(i int, in *Instr) (src int, ok bool), merged func(src, dst int)) {
	outputs := map[int]bool{}
	for _, b := range p.Outputs {
		outputs[b] = true
	}
	rename := map[int]int{}
	for i := range p.Instrs {
		in := &p.Instrs[i]
		for k, a := range in.Args {
			if r, ok := rename[a]; ok {
				in.Args[k] = r
			}
		}
		if in.Out < 0 {
			continue
		}
		if r, ok := rename[in.Out]; ok {
			// A buffer an earlier pass made several instructions write (a
			// sum written over the one before it): its later writers
			// follow it, and none of them moves it again, which would
			// leave its earlier writers and readers on a buffer gone.
			in.Out = r
			continue
		}
		src, ok := pick(i, in)
		if !ok {
			continue
		}
		dst := in.Out
		s, d := p.Buffers[src], p.Buffers[dst]
		if outputs[src] || outputs[dst] || s.Host || d.Host || s.Scratch || d.Scratch || s.Kind.Persistent() || d.Kind.Persistent() ||
			s.Bytes != d.Bytes || !s.Type.Equal(d.Type) || !s.Global.Equal(d.Global) || !slices.Equal(s.Place, d.Place) {
			continue
		}
		rename[dst] = src
		in.Out = src
		merged(src, dst)
		p.Buffers[dst].Bytes = 0 // unused now
	}
}

// writesOver reports whether instruction i, which computes src, may write
// its result straight into dst, a state src replaces: no instruction reads
// dst from i on (i itself included, so no kernel reads what it writes),
// and both buffers are the same device bytes. The new value then never
// needs room of its own, as ZeRO's gathered params would (a second copy
// of every param after the update). Instructions run in program order on
// a device (the CUDA backend's side streams reduce gradients and copy
// offloaded buffers, never a state's new value), so a read before i is
// done before i writes.
func writesOver(p *Program, i, src, dst int, lastRead map[int]int) bool {
	r, seen := lastRead[dst]
	s, d := p.Buffers[src], p.Buffers[dst]
	return (!seen || r < i) && !s.Host && !d.Host && s.Bytes == d.Bytes && s.Type.DType == d.Type.DType
}

// overwrites reports whether the op table lets in write its result over
// buffer dst, its in-place argument (its kernels read each element before
// writing it) and no other; the lowering does so only when in is dst's
// last reader.
func overwrites(in Instr, dst int) bool {
	info, ok := ir.Lookup(in.Op)
	return ok && info.InPlace && slices.Index(in.Args, dst) == info.InPlaceArg && !slices.Contains(in.Args[info.InPlaceArg+1:], dst)
}

func isOutput(p *Program, buf int) bool {
	for _, b := range p.Outputs {
		if b == buf {
			return true
		}
	}
	return false
}

// CheckFits returns an error if the arena exceeds limit bytes, naming the
// program point of the peak and the largest tensors live there with the
// user's lines, so the user knows what to shrink or recompute.
func (p *Program) CheckFits(device string, limit int64) error {
	if limit <= 0 || p.ArenaBytes <= limit {
		return nil
	}
	var b strings.Builder
	// Exact bytes beside the rounded sizes: a limit a few bytes short
	// would otherwise read as met.
	fmt.Fprintf(&b, "%s does not fit: the plan's arena needs %s (%d bytes; %s live at the peak), --device-memory is %s (%d bytes)", device, human(p.ArenaBytes), p.ArenaBytes, human(p.PeakBytes), human(limit), limit)
	if p.PeakAt < len(p.Instrs) {
		v := p.Instrs[p.PeakAt].Value
		fmt.Fprintf(&b, "\n  peak at instruction %d: %s (phase %v, layer %d)", p.PeakAt, v.Where(), v.Meta.Phase, v.Meta.Layer)
	}
	bd := p.Peak
	fmt.Fprintf(&b, "\n  at the peak: params %s, gradients %s, optimizer state %s, activations %s, inputs %s, workspace %s",
		human(bd.Params), human(bd.Gradients), human(bd.Optimizer), human(bd.Activations), human(bd.Inputs), human(bd.Workspace))
	if bd.KVCache > 0 {
		fmt.Fprintf(&b, ", key/value cache %s", human(bd.KVCache))
	}
	b.WriteString("\n  largest live tensors:")
	for i, id := range p.PeakLive {
		if i == 5 {
			break
		}
		b.WriteString("\n    " + describeBuffer(p.Buffers[id]))
	}
	return fmt.Errorf("%w: %s", ErrDoesNotFit, b.String())
}

// ErrDoesNotFit marks a plan larger than the device memory.
var ErrDoesNotFit = errors.New("out of device memory")

func human(n int64) string {
	if n < 0 && n > math.MinInt64 {
		return "-" + human(-n) // a difference of two sizes
	}
	switch {
	case n >= 1<<50:
		return fmt.Sprintf("%.2f PiB", float64(n)/(1<<50))
	case n >= 1<<40:
		return fmt.Sprintf("%.2f TiB", float64(n)/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// Describe is a one-line summary for logs.
func (p *Program) Describe() string {
	s := fmt.Sprintf("%d instrs, %d buffers, arena %d B, predicted peak %d B (%d B persistent)", len(p.Instrs), len(p.Buffers), p.ArenaBytes, p.PeakBytes, p.PersistentBytes)
	if p.HostBytes > 0 {
		s += fmt.Sprintf(", host %d B (offloaded)", p.HostBytes)
	}
	return s
}
