package cost

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"gcompile/passes/schedule"
)

// Transformer is the shape of a decoder, what the analytic estimate needs
// to know of a model: L blocks of attention (q, k, v projections, output
// projection) and an MLP of width FFN, token (and position) embeddings, a
// head of Vocab rows. The GPT's, unless the fields below say otherwise:
// grouped-query attention, a gated MLP (SwiGLU, as Llama's), and the
// parameter counts as a module has them (no biases, RMSNorm, an untied
// head, no position table).
type Transformer struct {
	Layers, Hidden, Heads, Seq, Vocab, FFN int
	// KVHeads is the key/value heads of grouped-query attention (0: Heads).
	KVHeads int
	// GatedMLP: the MLP has a gate beside its up projection (SwiGLU:
	// three h×f matrices where the GPT's has two).
	GatedMLP bool
	// LayerParamCount, when set, is a dense block's parameters as the
	// module has them and LayerSplit the part tensor parallelism splits;
	// OuterParams the parameters outside the blocks (embeddings, position
	// table, head, final norm) and OuterSplit their split part (the
	// vocab-parallel tables). Unset, the GPT's formulas stand.
	LayerParamCount, LayerSplit, OuterParams, OuterSplit float64
	// FusedAttention: the attention core is one op (no [s, s] scores kept
	// for the backward), as the reference GPT's default.
	FusedAttention bool
	// Mixture of experts, when Experts > 0: MoELayers of the blocks have,
	// in place of the MLP, a router of RouterParams weights and Experts
	// MLPs of width ExpertFFN; each token takes Slots expert slots on
	// average (E·C/T for C slots per expert and T tokens per routing
	// group: k times the capacity factor, empty slots included, as the
	// dispatch buffer holds and the experts compute them).
	Experts, MoELayers, ExpertFFN, RouterParams int
	Slots                                       float64
	// Routed is the experts a token goes through in the model's own
	// count: its router's k (an expert-choice router's slots a token,
	// which it fills). Model FLOPs (MFU's numerator) count these, as
	// Megatron-LM's do; the hardware FLOPs count every slot computed,
	// empty ones too. 0: Slots.
	Routed float64
	// ExpertParams is one expert's parameter count when known (the
	// module's own); 0 means an MLP's, 2·h·f + f + h, or 3·h·f when
	// GatedExperts.
	ExpertParams int
	// GatedExperts: each expert is a gated MLP (Mixtral's SwiGLU experts:
	// three h×f matrices).
	GatedExperts bool
}

// expertParams is one expert's parameter count.
func (t Transformer) expertParams() float64 {
	if t.ExpertParams > 0 {
		return float64(t.ExpertParams)
	}
	if t.GatedExperts {
		return 3 * float64(t.Hidden) * float64(t.ExpertFFN)
	}
	return mlpParams(t.Hidden, t.ExpertFFN)
}

// Params is the parameter count: per dense block 4h² + 4h (attention) +
// 2·h·f + f + h (MLP) + 4h (two LayerNorms), a MoE block's MLP replaced
// by its router and E experts' MLPs; embeddings (V + s)·h; final LN 2h.
func (t Transformer) Params() float64 {
	dense := float64(t.Layers - t.moeLayers())
	return dense*t.LayerParams() + float64(t.moeLayers())*t.moeLayerParams() + t.outerParams()
}

// outerParams are the parameters outside the blocks: the module's count,
// or the GPT's embeddings (V + s)·h and final LayerNorm 2h.
func (t Transformer) outerParams() float64 {
	if t.OuterParams > 0 {
		return t.OuterParams
	}
	h := float64(t.Hidden)
	return float64(t.Vocab+t.Seq)*h + 2*h
}

// outerParamsPerDevice is outerParams on one of tp ranks: the
// vocab-parallel tables split, the rest whole.
func (t Transformer) outerParamsPerDevice(tp float64) float64 {
	if t.OuterParams > 0 {
		return t.OuterSplit/tp + t.OuterParams - t.OuterSplit
	}
	h := float64(t.Hidden)
	return float64(t.Vocab)*h/tp + float64(t.Seq)*h + 2*h
}

// LayerParams is one dense block's parameter count.
func (t Transformer) LayerParams() float64 {
	if t.LayerParamCount > 0 {
		return t.LayerParamCount
	}
	return t.attnParams() + t.mlpParams(t.FFN)
}

// kvWidth is the width of the k (or v) projection: h·KVHeads/Heads.
func (t Transformer) kvWidth() float64 {
	if t.KVHeads <= 0 || t.Heads <= 0 {
		return float64(t.Hidden)
	}
	return float64(t.Hidden) * float64(t.KVHeads) / float64(t.Heads)
}

// attnParams is a block's attention and LayerNorm parameters.
func (t Transformer) attnParams() float64 {
	h := float64(t.Hidden)
	return 2*h*h + 2*h*t.kvWidth() + 4*h + 4*h
}

// mlpParams is a block's MLP of width ffn: two matrices and two biases,
// or three matrices when gated.
func (t Transformer) mlpParams(ffn int) float64 {
	if t.GatedMLP {
		return 3 * float64(t.Hidden) * float64(ffn)
	}
	return mlpParams(t.Hidden, ffn)
}

// mlpParams is an MLP's parameters: two matrices and two biases.
func mlpParams(hidden, ffn int) float64 {
	h, f := float64(hidden), float64(ffn)
	return 2*h*f + f + h
}

// attnParamsPerDevice is attnParams on one of tp ranks, as Megatron
// splits them: the q, k, v projection and its bias and the output
// projection's matrix over tp; the LayerNorms and the output projection's
// bias (a row-parallel layer's) whole on every rank.
func (t Transformer) attnParamsPerDevice(tp float64) float64 {
	h := float64(t.Hidden)
	return (2*h*h+2*h*t.kvWidth()+3*h)/tp + 5*h
}

// layerParamsPerDevice is LayerParams on one of tp ranks: the MLP's first
// matrix and bias and its second matrix split, its second bias whole (or
// the module's split and whole parts).
func (t Transformer) layerParamsPerDevice(tp float64) float64 {
	if t.LayerParamCount > 0 {
		return t.LayerSplit/tp + t.LayerParamCount - t.LayerSplit
	}
	h, f := float64(t.Hidden), float64(t.FFN)
	if t.GatedMLP {
		return t.attnParamsPerDevice(tp) + 3*h*f/tp
	}
	return t.attnParamsPerDevice(tp) + (2*h*f+f)/tp + h
}

// moeLayers is the number of MoE blocks (0 for a dense model).
func (t Transformer) moeLayers() int {
	if t.Experts <= 0 {
		return 0
	}
	return t.MoELayers
}

// moeLayerParams is one MoE block's parameter count.
func (t Transformer) moeLayerParams() float64 {
	return t.attnParams() + float64(t.RouterParams) + float64(t.Experts)*t.expertParams()
}

// ModelFLOPs is the work of one step without recompute, for a global
// batch of B sequences: three times the forward GEMMs (forward, and a
// backward of twice the forward), as Narayanan et al. count model FLOPs:
// 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) when f = 4h.
func (t Transformer) ModelFLOPs(batch int) float64 {
	return 3 * t.fwdFLOPs(t.routed()) * float64(batch)
}

// routed is Routed, or Slots where it is not set.
func (t Transformer) routed() float64 {
	if t.Routed > 0 {
		return t.Routed
	}
	return t.Slots
}

// fwdFLOPsPerSeq is one sequence's forward GEMM flops as the devices
// compute them: a MoE block's experts over every slot.
func (t Transformer) fwdFLOPsPerSeq() float64 { return t.fwdFLOPs(t.Slots) }

// fwdFLOPs is one sequence's forward GEMM flops: per block
// 2·s·(2h² + 2·h·kv + 2·h·f) for the projections (q and the output h²
// each, k and v h·kv) and the MLP (3·h·f gated), plus 4·s²·h for the
// attention core (QKᵀ and PV); a MoE block's experts take the MLP's
// place over slots expert slots a token, and its router 2·s·h·E; the
// head 2·s·h·V.
func (t Transformer) fwdFLOPs(slots float64) float64 {
	s, h, f, v := float64(t.Seq), float64(t.Hidden), float64(t.FFN), float64(t.Vocab)
	mlp := 2.0
	if t.GatedMLP {
		mlp = 3
	}
	layer := 2*s*(2*h*h+2*h*t.kvWidth()+mlp*h*f) + 4*s*s*h
	emlp := 2.0
	if t.GatedExperts {
		emlp = 3
	}
	moe := 2*s*(2*h*h+2*h*t.kvWidth()+emlp*h*float64(t.ExpertFFN)*slots+h*float64(t.Experts)) + 4*s*s*h
	dense := float64(t.Layers - t.moeLayers())
	return dense*layer + float64(t.moeLayers())*moe + 2*s*h*v
}

// cpShardsFirst says whether the sequence is split over cp before tp:
// the ring's layout, not Ulysses' (Plan.CPImpl).
func (p Plan) cpShardsFirst() bool { return p.CPImpl != "all2all" }

// Plan is one point of the search space.
type Plan struct {
	TP, PP, DP, VPP int
	EP              int // expert-parallel degree (0 or 1: none); tokens split over dp·ep
	// CP is the context-parallel degree (0 or 1: none): every
	// activation's sequence split over cp ranks; CPImpl how attention
	// runs over them, "ring" ("" too) or "all2all" (Ulysses). Under
	// sequence parallelism the ring splits the sequence over cp first and
	// each cp rank's share over tp (ir.MeshAxis.Outer, Megatron-Core's
	// layout), so sp's tp collectives move a cp rank's tokens; Ulysses
	// splits over tp first (its heads need it), so each of them joins cp's
	// split before and cuts it after (cpShardsFirst).
	CP     int
	CPImpl string
	// CPLayout is the ring's split of the sequence: "zigzag" ("" too),
	// every rank the same share of causal work, or "contiguous", the last
	// rank the most.
	CPLayout         string
	MicroBatch       int // sequences per microbatch per data-parallel rank (b)
	Microbatches     int // m
	Zero             int
	SequenceParallel bool
	Recompute        string // none, selective, full, every=K, block=N
	Offload          string // "", optimizer, params, optimizer,params
	// Precision is fp32, fp16 or bf16 (mixed, fp32 master weights), or
	// fp8: Transformer Engine's recipe, which a run another framework made
	// is priced with (the compiler emits no fp8): the blocks' linear
	// GEMMs in fp8, their inputs and output gradients cast to it; the
	// attention core, the head and every elementwise op in bf16.
	Precision string
	Schedule  string // "" without a pipeline
	Optimizer string // adamw (2 states), sgd (1), others factored (≈0)
	// SerialReductions (--overlap-grad-reduce=false): the data-parallel
	// reductions, a bucket at a time, follow the backward even where the
	// hardware's runtime could overlap them with it
	// (Hardware.OverlapBuckets).
	SerialReductions bool
	// OverlapTP: the tensor-parallel collectives run in chunks beside the
	// GEMMs they feed and follow (Megatron-Core's --tp-comm-overlap), so a
	// block pays the larger of its GEMMs and its tp communication, not
	// their sum.
	OverlapTP bool
	// OverlapShards: under ZeRO-1 or 2 the framework reduce-scatters the
	// gradients in buckets beside the last microbatch's backward and
	// all-gathers the updated params beside the next step's first forward
	// (Megatron-Core's distributed optimizer with --overlap-grad-reduce
	// and --overlap-param-gather), so a step pays only what each cannot
	// hide. gcompile's own runtime does neither: its plans leave it off.
	OverlapShards bool
	// ReduceOnce: under ZeRO-2/3 the framework sums the microbatches'
	// gradients whole and reduce-scatters them once a step (Megatron-LM's
	// distributed optimizer, FSDP's no_sync), where gcompile, as DeepSpeed,
	// reduce-scatters each microbatch's.
	ReduceOnce bool
	// GatherBytes is the bytes a param the ZeRO all-gather moves: 0 for
	// gcompile's (the fp32 params, or under mixed precision their 16-bit
	// copies made from the shards), 2 for a framework that gathers its
	// bf16 model weights, 1 for fp8 params.
	GatherBytes float64
	// GradReduceBytes is the bytes of a gradient element the data-parallel
	// reductions (dp, and ep's and cp's) move: 0 for 4, fp32
	// (--grad-reduce-dtype fp32, Megatron-LM's main_grad); 2 for
	// --grad-reduce-dtype bf16 or fp16, or a framework that reduces its
	// 16-bit gradients (DeepSpeed's communication_data_type under fp16,
	// Megatron-LM's --grad-reduce-in-bf16).
	GradReduceBytes float64
	// BucketBytes is the gradient bytes of one data-parallel reduction
	// (--bucket-mb; 0: 25 MiB). Each bucket is its own collective and pays
	// its latency; all but the last can hide behind the backward.
	BucketBytes float64
	// Compress is --compress-activations. "lowp" stashes every fp32
	// forward value the backward reads in bf16 (passes/compress.go): half
	// the stashed bytes, for a cast after the forward writes each (4 bytes
	// read, 2 written) and a widening before the backward reads it; it
	// changes nothing in a 16-bit run. "relu" keeps ReLU inputs as 1-bit
	// masks, and prices nothing here: these shapes' MLPs are GELU or
	// SwiGLU.
	Compress string
	// OffloadPrefetch is --offload-prefetch: with params offloaded, each
	// layer block's params are copied to the device this many blocks
	// ahead of use (0: right before use, exposed). Ahead, the forward's
	// and the backward's copies run beside the compute.
	OffloadPrefetch int
}

// gradReduceBytes is GradReduceBytes, 4 where unset.
func (p Plan) gradReduceBytes() float64 {
	if p.GradReduceBytes > 0 {
		return p.GradReduceBytes
	}
	return 4
}

// defaultBucketBytes is --bucket-mb's default, 25 MiB of gradients.
const defaultBucketBytes = 25 << 20

// Devices is tp·pp·dp·ep·cp.
func (p Plan) Devices() int { return p.TP * p.PP * p.DP * max(p.EP, 1) * max(p.CP, 1) }

// String is the plan in the flags' words, as the published-run tables
// print it.
func (p Plan) String() string {
	s := fmt.Sprintf("tp=%d pp=%d dp=%d", p.TP, p.PP, p.DP)
	if p.EP > 1 {
		s += fmt.Sprintf(" ep=%d", p.EP)
	}
	if p.CP > 1 {
		s += fmt.Sprintf(" cp=%d", p.CP)
		if p.CPImpl == "all2all" {
			s += " all2all"
		}
	}
	if p.VPP > 1 {
		s += fmt.Sprintf(" vpp=%d", p.VPP)
	}
	s += fmt.Sprintf(" mb=%d×%d", p.MicroBatch, p.Microbatches)
	if p.SequenceParallel {
		s += " sp"
	}
	return s + " rc=" + p.Recompute
}

// Estimate is the analytic prediction for one plan.
type Estimate struct {
	StepSeconds float64
	// Bubble is a pipeline rank's idle time over its work, (p−1)/m for
	// 1F1B at unit costs: above 1 when m < p−1.
	Bubble float64
	// ModelFLOPs is the step's work without recompute (MFU's numerator);
	// FLOPs with it (hardware FLOPs).
	ModelFLOPs, FLOPs float64
	// MemoryLowerBound is the persistent bytes the busiest device must
	// hold whatever the memory plan does (params and optimizer state
	// after every split): a plan above the device's memory cannot fit, so
	// pruning on it never drops a plan that fits. MemoryEstimate adds
	// gradients and stashed activations (for ranking, not pruning).
	MemoryLowerBound, MemoryEstimate int64
	CommSeconds                      map[string]float64
	CommBytes                        map[string]float64
	ComputeSeconds                   float64
}

func (p Plan) actBytes() float64 {
	switch p.Precision {
	case "fp16", "bf16", "fp8":
		return 2
	}
	return 4
}

// dtype is what everything but the blocks' linear GEMMs computes in.
func (p Plan) dtype() string {
	switch p.Precision {
	case "fp16", "bf16":
		return p.Precision
	case "fp8":
		return "bf16"
	}
	return "fp32"
}

// linearDtype is what the blocks' linear GEMMs (QKV, the projection, the
// MLP's, the experts') compute in.
func (p Plan) linearDtype() string {
	if p.Precision == "fp8" {
		return "fp8"
	}
	return p.dtype()
}

// states is the optimizer's fp32 words per parameter.
func (p Plan) states() float64 {
	switch p.Optimizer {
	case "", "adamw":
		return 2
	case "sgd":
		return 1
	}
	return 0
}

// gemm prices a GEMM of m×k by k×n: its device time, or the host's time
// to issue it when that is longer (Hardware.HostOpUS).
func (h *Hardware) gemm(m, n, k float64, dtype string, eb float64) float64 {
	return h.kernels(1, h.gemmDevice(m, n, k, dtype, eb))
}

// gemmDevice is a GEMM's device time: launch, then compute at the
// efficiency its flops reach or its memory traffic, whichever is slower.
func (h *Hardware) gemmDevice(m, n, k float64, dtype string, eb float64) float64 {
	return h.LaunchUS*1e-6 + h.gemmWork(m, n, k, dtype, eb)
}

// gemmWork is a GEMM's device time without its launch.
func (h *Hardware) gemmWork(m, n, k float64, dtype string, eb float64) float64 {
	f := 2 * m * n * k
	if !(f > 0) {
		return 0 // an empty GEMM (a router of no weights) is no work
	}
	peak := h.Peak(dtype)
	half := peak * h.GEMMHalfUS * 1e-6
	compute := f / (peak * h.GEMMEfficiency * f / (f + half))
	return math.Max(compute, h.memTime(eb*(m*k+k*n+m*n)))
}

// attentionCore is one of the attention core's two batched GEMMs (QKᵀ,
// PV) over heads heads of s×s by s×dh: one kernel, each head priced on
// the small-GEMM curve. A batch whose inner dimension is a head's (64–128)
// stays far from the large-GEMM efficiency; priced as one GEMM of all its
// flops instead, every A100 source is 2–5 points worse
// (docs/architecture.md, "Cost model").
func (h *Hardware) attentionCore(heads, s, dh float64, dtype string, eb float64) float64 {
	return h.LaunchUS*1e-6 + heads*h.gemmWork(s, s, dh, dtype, eb)
}

// unfusedScores is the traffic of an attention core that is not fused,
// over heads heads' s×s scores: the fused scale-mask-softmax reads them
// and writes the probabilities, and dropout reads those and writes its
// output and a one-byte mask (the GEMMs' own reads and writes are theirs).
// Two kernels.
func (h *Hardware) unfusedScores(heads, s, eb float64) float64 {
	n := heads * s * s
	return h.memKernels(2, 4*eb*n+n)
}

// memKernels is n memory-bound kernels that move bytes together, each
// launched.
func (h *Hardware) memKernels(n, bytes float64) float64 {
	return h.kernels(n, h.memTime(bytes)+n*h.LaunchUS*1e-6)
}

// Estimate predicts a step of t under plan p from the shape alone; see
// docs/architecture.md for each term. It is what the planner ranks and
// prunes with before compiling, and what it reports for models too large
// to compile quickly.
func (h *Hardware) Estimate(t Transformer, p Plan) (*Estimate, error) {
	return h.estimate(t, p, true)
}

// EstimateFast is Estimate with the pipeline priced in closed form rather
// than simulated: the busiest rank's work plus one chunk round trip (F +
// B of a chunk, that rank's average) of every other rank, which is the
// simulator's answer for uniform chunks under 1F1B, interleaved and
// GPipe, (p−1) round trips, and within 1 % of it when the head makes the
// last stage heavier; a third of the wait for zero-bubble. The search
// ranks tens of thousands of plans with it.
func (h *Hardware) EstimateFast(t Transformer, p Plan) (*Estimate, error) {
	return h.estimate(t, p, false)
}

func (h *Hardware) estimate(t Transformer, p Plan, simulate bool) (*Estimate, error) {
	var everyK int
	if p.TP < 1 || p.PP < 1 || p.DP < 1 || p.MicroBatch < 1 || p.Microbatches < 1 {
		return nil, fmt.Errorf("plan %+v: degrees and batch sizes must be ≥ 1", p)
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	if err := p.check(t, simulate); err != nil {
		return nil, err
	}
	// every=K (recompute in segments of K layers: --recompute every=K)
	// replays every block's forward as full does; it keeps each segment's
	// input, and a segment's activations while its backward runs.
	// block=N replays the first N layers of each chunk as full does and
	// keeps the others' activations whole: full on a share of the layers.
	block := 0
	p.Recompute, everyK, block = p.recomputeSegments(t.Layers)
	v := max(p.VPP, 1)
	if t.Layers%(p.PP*v) != 0 {
		return nil, fmt.Errorf("%d layers do not split into pp·vpp = %d chunks", t.Layers, p.PP*v)
	}
	// share is the part of each chunk's layers that full recompute (or
	// block=N) replays.
	share := 1.0
	if block > 0 {
		share = math.Min(float64(block)/float64(t.Layers/(p.PP*v)), 1)
	}
	ep := max(p.EP, 1)
	if ep > 1 && t.moeLayers() == 0 {
		return nil, fmt.Errorf("ep=%d: the model has no experts to split", ep)
	}
	if t.moeLayers() > 0 && t.Experts%ep != 0 {
		return nil, fmt.Errorf("%d experts do not split over ep=%d", t.Experts, ep)
	}
	cp := max(p.CP, 1)
	if t.Seq%cp != 0 {
		return nil, fmt.Errorf("cp=%d does not divide the sequence of %d tokens", cp, t.Seq)
	}
	if cp > 1 && p.CPImpl == "all2all" {
		// Ulysses splits each device's heads over cp: k/v heads split
		// over tp, or whole on it when tp does not divide them.
		kv := t.KVHeads
		if kv == 0 {
			kv = t.Heads
		}
		kvLocal := kv
		if kv%p.TP == 0 {
			kvLocal = kv / p.TP
		}
		if t.Heads%(p.TP*cp) != 0 || kvLocal%cp != 0 {
			return nil, fmt.Errorf("cp=%d all2all: cp must divide each device's heads (%d = %d heads over tp=%d) and k/v heads (%d)", cp, t.Heads/p.TP, t.Heads, p.TP, kvLocal)
		}
	}
	switch p.Precision {
	case "", "fp32", "fp16", "bf16":
	case "fp8":
		if h.PeakTFLOPS["fp8"] <= 0 {
			return nil, fmt.Errorf("precision fp8: %s has no FP8 matrix peak (peak_tflops.fp8): FP8 tensor cores came with Hopper", h.Name)
		}
	default:
		return nil, fmt.Errorf("precision %q: want fp32, fp16, bf16 or fp8", p.Precision)
	}
	e := &Estimate{CommSeconds: map[string]float64{}, CommBytes: map[string]float64{}}
	tp, b := float64(p.TP), float64(p.MicroBatch)
	s, hd, f, V := float64(t.Seq), float64(t.Hidden), float64(t.FFN), float64(t.Vocab)
	a := float64(t.Heads)
	eb, dt, ldt := p.actBytes(), p.dtype(), p.linearDtype()
	// A device's tokens of a microbatch: context parallelism splits every
	// sequence over cp.
	fcp := float64(cp)
	tokens := b * s / fcp

	// One block's forward on one microbatch: the GEMMs (split over tp),
	// the attention core, and the elementwise traffic (LayerNorms,
	// residuals, biases, GELU), replicated over tp unless sequence
	// parallel splits it.
	attn := h.gemm(tokens, (hd+2*t.kvWidth())/tp, hd, ldt, eb) + h.gemm(tokens, hd, hd/tp, ldt, eb)
	// QKᵀ and PV over this device's b·a/tp heads (attentionCore), and the
	// scores through memory between them unless the core is fused.
	core := h.kernels(2, 2*h.attentionCore(b*a/tp, s, hd/a, dt, eb))
	if !t.FusedAttention {
		core += h.unfusedScores(b*a/tp, s, eb)
	}
	// Context parallelism: Ulysses runs whole sequences on a/(tp·cp)
	// heads; the ring runs a device's s/cp queries against every chunk of
	// s/cp keys, one chunk a step, and its K/V chunks travel meanwhile
	// (their own stream on a GPU): each step pays the larger of its
	// compute and its transfer. The backward moves four chunks a step
	// (K for the statistics, K and V for dq, K, V and dK for dk, K and dV
	// for dv) against twice the compute, and two gradients home at the
	// end. The model prices a causal s×s like a full one (the cp = 1
	// core above), so in its units the zigzag layout gives every rank cp
	// chunks' work; in contiguous chunks the last rank, the busiest,
	// sees every earlier chunk whole, 2·cp−1 of them.
	var cpF, cpB float64
	cpLink := h.axisLink(cp, p.TP, p.Devices())
	if cp > 1 {
		kvHeadsPerTP := t.kvWidth() / tp
		if t.KVHeads > 0 && t.KVHeads%p.TP != 0 {
			kvHeadsPerTP = t.kvWidth() // k/v projections replicated over tp
		}
		chunk := eb * tokens * kvHeadsPerTP // one K (or V) chunk
		if p.CPImpl == "all2all" {
			core = h.kernels(2, 2*h.attentionCore(b*a/(tp*fcp), s, hd/a, dt, eb))
			q := Collective("all_to_all", cp, eb*tokens*hd/tp, cpLink)
			kv := Collective("all_to_all", cp, chunk, cpLink)
			// Forward: q, k, v to heads, the output back. Backward: dout to
			// heads (the statistics read the forward's head-split output
			// and q, k, v), dq, dk, dv back.
			cpF = 2*q + 2*kv
			cpB = 2*q + 2*kv
			e.CommBytes["cp"] = float64(t.Layers/p.PP) * float64(p.Microbatches) * (4*eb*tokens*hd/tp + 4*chunk) * (fcp - 1) / fcp
		} else {
			step := h.kernels(2, 2*h.attentionCore(b*a/tp, s/fcp, hd/a, dt, eb))
			if !t.FusedAttention {
				step += h.unfusedScores(b*a/tp, s/fcp, eb)
			}
			core = fcp * step
			if p.CPLayout == "contiguous" {
				core = (2*fcp - 1) * step
			}
			step = core / fcp
			p2p := P2P(2*chunk, cpLink)
			cpF = (fcp - 1) * math.Max(p2p-step, 0)
			cpB = (fcp-1)*math.Max(4*p2p-2*step, 0) + 2*P2P(chunk, cpLink)
			e.CommBytes["cp"] = float64(t.Layers/p.PP) * float64(p.Microbatches) * ((fcp-1)*10*chunk + 2*chunk)
		}
	}
	rep := 10.0
	if p.SequenceParallel {
		rep /= tp
	}
	// elem is the block's elementwise traffic with an MLP of width w over
	// rows tokens (the dense MLP, or a MoE block's expert slots).
	elem := func(rows, w float64) float64 {
		return h.memKernels(10, eb*tokens*hd*(rep+4/tp)+eb*rows*w*3/tp)
	}
	mlpGEMMs := h.gemm(tokens, f/tp, hd, ldt, eb) + h.gemm(tokens, hd, f/tp, ldt, eb)
	if t.GatedMLP {
		mlpGEMMs += h.gemm(tokens, f/tp, hd, ldt, eb) // the gate
	}
	// fp8 casts: each linear GEMM's input (QKV's and the MLP's whole
	// [tokens, h] after any all-gather, the projection's and the MLP
	// output's this device's share) read in bf16 and written in fp8 with
	// its transpose for the weight gradient, 4 kernels; the backward casts
	// the output gradients the same way, twice the bytes (a dgrad and a
	// wgrad operand each). The weights' own casts, once a step, are in
	// the tail.
	var f8F, f8B float64
	if ldt == "fp8" {
		in := tokens * (2*hd + hd/tp + f/tp)
		f8F = h.memKernels(4, in*(2+1+1))
		f8B = 2 * f8F
	}
	denseF := attn + mlpGEMMs + core + elem(tokens, f) + f8F
	// A MoE block: the router in fp32, the routing and the moves into
	// and out of the expert buffers through memory, and this device's E/ep
	// experts, each over its share of the tokens·Slots rows the
	// all_to_all brings (split within each expert over tp).
	layerF := denseF
	moeWeight := 0.0
	// blockGEMMs is a block's GEMMs on average (a MoE block's experts in
	// place of the MLP): what tp's overlapped collectives hide behind.
	blockGEMMs := attn + mlpGEMMs
	var a2a float64
	if nm := t.moeLayers(); nm > 0 {
		E, fe := float64(t.Experts), float64(t.ExpertFFN)
		rows := tokens * t.Slots
		local := E / float64(ep)
		one := h.gemm(rows/local, fe/tp, hd, ldt, eb) + h.gemm(rows/local, hd, fe/tp, ldt, eb)
		if t.GatedExperts {
			one += h.gemm(rows/local, fe/tp, hd, ldt, eb) // the gate
		}
		experts := local * one
		router := h.gemm(tokens, float64(t.RouterParams)/hd, hd, "fp32", 4) + h.memTime(4*tokens*E*8)
		moves := h.memTime(eb * rows * hd * 4)
		moeF := attn + experts + router + moves + core + elem(rows, fe) + f8F
		moeWeight = float64(nm) / float64(t.Layers)
		layerF = (1-moeWeight)*denseF + moeWeight*moeF
		blockGEMMs = attn + (1-moeWeight)*mlpGEMMs + moeWeight*experts
		// Rows travel to their experts' ranks and back: tp consecutive
		// ranks form the innermost axis, so an ep group is strided by tp.
		a2a = Collective("all_to_all", ep, eb*rows*hd, h.axisLink(ep, p.TP*cp, p.Devices()))
	}
	// kept is the bytes a layer keeps from its forward for its backward,
	// per microbatch, without recompute; stashed with the plan's.
	// Korthikanti et al. 2022 count sbh·(10 + 24/t) bytes in 16 bits for a
	// GPT under tp: in elements of h a token, 5 whole on every tp rank
	// (the norms' inputs, the attention's and the MLP's inputs, the two
	// dropout masks) and 12 split (q, k, v and the projection's input; the
	// MLP's hidden before and after its activation, 2·4h); all 34·sbh
	// split under sequence parallelism; plus 5·as²b/t where the core keeps
	// its scores (this once priced 34 + 24/t, and 68/t with sp). Another
	// model's widths enter where they differ: k and v at the k/v heads'
	// width (grouped-query attention), and a gated MLP's hidden four times
	// (gate, up, the activation, the product) where the GPT's is twice.
	mlpHidden := 2 * f
	if t.GatedMLP {
		mlpHidden = 4 * f
	}
	split := 2 + 2*t.kvWidth()/hd + mlpHidden/hd
	kept := func() float64 {
		act := tokens * hd * eb * (5 + split/tp)
		if p.SequenceParallel {
			act = tokens * hd * eb * (5 + split) / tp
		}
		if !t.FusedAttention && p.Recompute != "selective" {
			act += 2.5 * eb * b * a * s * s / tp
		}
		if moeWeight > 0 {
			// A MoE block keeps its expert buffers (rows in and out, the
			// experts' hidden before and after the activation) where a
			// dense one keeps its MLP's hidden.
			rows := tokens * t.Slots
			expertHidden := 2 * float64(t.ExpertFFN)
			if t.GatedExperts {
				expertHidden *= 2 // gate, up, the activation, the product
			}
			act += moeWeight * eb * math.Max(rows*(2*hd+expertHidden/tp)-tokens*mlpHidden/tp, 0)
		}
		return act
	}
	stashedFull := func() float64 {
		if p.Recompute == "full" {
			// Each layer's input (Korthikanti's 2·sbh), split over tp
			// under sequence parallelism as the compiled programs keep it.
			in := tokens * hd * eb
			if p.SequenceParallel {
				in /= tp
			}
			if everyK > 1 {
				in /= float64(everyK) // a segment's input
			}
			if p.Schedule == "zb" {
				// W replays the GEMMs' inputs (passes.replayForW) but
				// keeps their output gradients from B: q, k, v, the
				// projection, the MLP's up (and gate) and down.
				up := f
				if t.GatedMLP {
					up *= 2
				}
				in += tokens * eb * (3*hd + 2*t.kvWidth() + up) / tp
			}
			return in
		}
		return kept()
	}
	// A layer's stash, averaged over a chunk's layers under block=N.
	stashed := func() float64 {
		if p.Recompute == "full" && share < 1 {
			return share*stashedFull() + (1-share)*kept()
		}
		return stashedFull()
	}
	// lowp's casts and widenings of the stash, ten kernels each way like
	// the elementwise ops.
	var castF, castB float64
	if strings.Contains(p.Compress, "lowp") && eb == 4 {
		castF = h.memKernels(10, 1.5*stashed())
		castB = castF
	}
	layerF += castF
	layerB := 2*(layerF-castF-f8F) + castB + f8B
	switch p.Recompute {
	case "full":
		layerB += share * layerF
		if p.Schedule == "zb" && p.PP > 1 {
			layerB += share * layerF // replayed again in W
		}
	case "selective":
		if !t.FusedAttention {
			// A fused core keeps nothing selective recompute could
			// drop: the compiled plan is the one without recompute.
			layerB += core
		}
	}
	chunks := p.PP * v
	perChunk := float64(t.Layers / chunks)
	// Tensor parallelism: two all-reduces of [b,s,h] forward, two
	// backward (and two more when full recompute replays the forward);
	// sequence parallelism moves the same bytes as reduce-scatter +
	// all-gather. Groups are tp consecutive ranks.
	tpLink := h.axisLink(p.TP, 1, p.Devices())
	arBytes := eb * tokens * hd
	// Both tp and ep move twice a layer forward and twice backward, and
	// twice more when full recompute replays the forward.
	per := 4.0
	if p.Recompute == "full" {
		per = 4 + 2*share
	}
	tpF, tpB := 0.0, 0.0
	// spAG and spRS are one of sequence parallelism's all-gathers and
	// reduce-scatters over tp, spSize the bytes each moves whole, spCP the
	// bytes one pair moves over cp (see below).
	// tpAR is one all-reduce of an activation over tp.
	var spAG, spRS, spSize, spCP, tpAR float64
	if p.TP > 1 {
		tpAR = h.kernels(1, Collective("all_reduce", p.TP, arBytes, tpLink))
		tpF, tpB = 2*tpAR, (per-2)*tpAR
		tpBytes := per * 2 * arBytes * (tp - 1) / tp
		if p.SequenceParallel {
			// Sequence parallelism: an all-gather before and a
			// reduce-scatter after attention and the MLP forward, the same
			// for the gradients backward, and an all-gather more of each
			// saved input for its weight gradient (the input is kept split,
			// as Megatron-LM does): 6 all-gathers and 4 reduce-scatters a
			// layer, 2 and 2 more when full recompute replays the forward.
			ags, rss := per+2, per
			size := arBytes
			ag, rs := Collective("all_gather", p.TP, size, tpLink), Collective("reduce_scatter", p.TP, size, tpLink)
			if cp > 1 && !p.cpShardsFirst() {
				// Under Ulysses, tp is the coarser split of the sequence
				// (ir.Mesh.SplitOrderOn): each collective over tp joins cp's
				// split first (an all_gather over cp), runs on the whole
				// sequence, and cuts cp's split again after (a local slice).
				size = arBytes * fcp
				ag = Collective("all_gather", p.TP, size, tpLink) + Collective("all_gather", cp, size/tp, cpLink)
				rs = Collective("reduce_scatter", p.TP, size, tpLink) + Collective("all_gather", cp, size, cpLink)
				e.CommBytes["cp"] += float64(t.Layers/p.PP) * float64(p.Microbatches) * (ags*size/tp + rss*size) * (fcp - 1) / fcp
			}
			tpF, tpB = 2*ag+2*rs, (ags-2)*ag+(rss-2)*rs
			tpBytes = (ags + rss) * size * (tp - 1) / tp
			spAG, spRS, spSize = ag, rs, size
			if cp > 1 && !p.cpShardsFirst() {
				spCP = (size/tp + size) * (fcp - 1) / fcp
			}
		}
		e.CommSeconds["tp"] = float64(t.Layers/p.PP) * float64(p.Microbatches) * (tpF + tpB)
		e.CommBytes["tp"] = float64(t.Layers/p.PP) * float64(p.Microbatches) * tpBytes
		if p.OverlapTP {
			// Hidden behind the block's projections and MLP GEMMs (twice
			// as long backward), what they cannot hide stays.
			tpF, tpB = math.Max(tpF-blockGEMMs, 0), math.Max(tpB-2*blockGEMMs, 0)
		}
	}
	// The all_to_alls (dispatch, combine), per layer on average.
	epF, epB := 2*a2a*moeWeight, (per-2)*a2a*moeWeight
	if ep > 1 {
		e.CommSeconds["ep"] = float64(t.Layers/p.PP) * float64(p.Microbatches) * (epF + epB)
		e.CommBytes["ep"] = float64(t.Layers/p.PP) * moeWeight * float64(p.Microbatches) * per * eb * tokens * t.Slots * hd * float64(ep-1) / float64(ep)
	}
	if cp > 1 {
		e.CommSeconds["cp"] = float64(t.Layers/p.PP) * float64(p.Microbatches) * (cpF + cpB)
	}
	layerF += tpF + epF + cpF
	layerB += tpB + epB + cpB
	// The head (vocab-parallel logits and cross-entropy) on the last chunk,
	// the embedding on the first.
	headF := h.gemm(tokens, V/tp, hd, dt, eb) + h.memTime(4*tokens*V/tp*3)
	headB := 2*h.gemm(tokens, V/tp, hd, dt, eb) + h.memTime(4*tokens*V/tp*3)
	embF := h.memTime(eb * tokens * hd * 3)
	embB := h.memTime(eb * tokens * hd * 3)
	if p.TP > 1 {
		if spSize > 0 {
			// Sequence parallelism outside the blocks: the embedding's
			// partial sum is reduce-scattered and its gradient gathered
			// back (the device makes its vocab rows of the table's
			// gradient from dy whole), the head's input all-gathered and
			// its gradient reduce-scattered.
			embF += spRS
			embB += spAG
			headF += spAG
			headB += spRS
			e.CommSeconds["tp"] += float64(p.Microbatches) * 2 * (spRS + spAG)
			e.CommBytes["tp"] += float64(p.Microbatches) * 4 * spSize * (tp - 1) / tp
			if !p.cpShardsFirst() {
				e.CommBytes["cp"] += float64(p.Microbatches) * 2 * spCP
			}
		} else {
			// Without sequence parallelism, the vocab-parallel embedding's
			// partial sum is all-reduced forward, and so is the gradient of
			// the head's input backward.
			embF += tpAR
			headB += tpAR
			e.CommSeconds["tp"] += float64(p.Microbatches) * 2 * tpAR
			e.CommBytes["tp"] += float64(p.Microbatches) * 2 * 2 * arBytes * (tp - 1) / tp
		}
		// The vocab-parallel cross-entropy exchanges each row's statistics,
		// in float64, forward and again in its gradient: an all-gather of
		// the row maxima and an all-reduce of the sums and target logits
		// (runtime/cpu/vocab.go; Predict prices the same).
		stats := Collective("all_gather", p.TP, tokens*8*tp, tpLink) + Collective("all_reduce", p.TP, 2*tokens*8, tpLink)
		headF += stats
		headB += stats
		e.CommSeconds["tp"] += float64(p.Microbatches) * 2 * stats
		e.CommBytes["tp"] += float64(p.Microbatches) * 2 * 3 * tokens * 8 * (tp - 1)
	}

	// A stage's parameters per device: a MoE block holds its router whole
	// and E/ep experts; expertParams are those experts, reduced over dp
	// only, the rest over every data rank (dp·ep).
	layerParams := (1 - moeWeight) * t.layerParamsPerDevice(tp)
	var expertParams float64
	if moeWeight > 0 {
		expertParams = perChunk * float64(v) * moeWeight * float64(t.Experts/ep) * t.expertParams() / tp
		layerParams += moeWeight * (t.attnParamsPerDevice(tp) + float64(t.RouterParams))
	}
	// The word embedding is split over tp (vocab-parallel); the position
	// table is whole, on the first stage; the final LayerNorm on the last.
	stageParams := perChunk*float64(v)*layerParams + expertParams + t.outerParamsPerDevice(tp)
	// The mesh is (pp, dp, ep, tp), tp innermost. A dp group is every
	// tp·ep-th rank of a stage: one member per node once tp fills the
	// node, up to a node's worth otherwise (LinkFor).
	data := p.DP * ep
	dpLink := h.axisLink(p.DP, p.TP*cp*ep, p.Devices())
	// Pipeline: chunk costs into the schedule simulator. A transfer
	// between stages (neighbours tp·dp ranks apart) carries b·s·h/t per tp
	// rank: without sequence parallelism the value is whole on every tp
	// rank, so each sends its 1/t slice and the receiver all-gathers the
	// slices over tp (Megatron's scatter/gather, as lower.recvGathered
	// emits it); under sequence parallelism each rank already holds its
	// own 1/t and no gather follows.
	ppLink := h.pairLink(p.TP*cp*data, p.Devices())
	p2p := P2P(eb*tokens*hd/tp, ppLink)
	if p.TP > 1 && !p.SequenceParallel {
		p2p += Collective("all_gather", p.TP, eb*tokens*hd, tpLink)
	}
	chunkF := func(j int) float64 {
		c := perChunk * layerF
		if j == 0 {
			c += embF
		}
		if j == chunks-1 {
			c += headF
		}
		if j > 0 {
			c += p2p
		}
		return c
	}
	chunkB := func(j int) float64 {
		c := perChunk * layerB
		if j == 0 {
			c += embB
		}
		if j == chunks-1 {
			c += headB
		}
		if j < chunks-1 {
			c += p2p
		}
		return c
	}
	var pipe float64
	if p.PP > 1 {
		name := p.Schedule
		if name == "" {
			name = "1f1b"
			if v > 1 {
				name = "interleaved"
			}
		}
		fc, bc := make([]float64, chunks), make([]float64, chunks)
		for j := range chunks {
			fc[j], bc[j] = chunkF(j), chunkB(j)
		}
		if !simulate {
			if p.Microbatches < p.PP && name != "gpipe" {
				return nil, fmt.Errorf("schedule %s with pp=%d needs at least %d microbatches, got %d", name, p.PP, p.PP, p.Microbatches)
			}
			if name == "interleaved" && p.Microbatches%p.PP != 0 {
				return nil, fmt.Errorf("schedule interleaved needs microbatches a multiple of pp=%d, got %d", p.PP, p.Microbatches)
			}
			// Each rank's round trip of one chunk (its chunks' F + B on
			// average). The busiest rank works m·v of them; every other
			// rank's round is on the path once, as the first microbatch's
			// forward fills the pipeline to the busiest rank and the last
			// one's backward drains it: (p−1)·round for uniform chunks, the
			// textbook (p−1)/(v·m) bubble, and for a heavy last stage (the
			// head) its m rounds plus the other stages' once each.
			busy := make([]float64, p.PP)
			for j := range chunks {
				busy[j%p.PP] += fc[j] + bc[j]
			}
			busiest := 0
			for r, b := range busy {
				if b > busy[busiest] {
					busiest = r
				}
			}
			ideal := float64(p.Microbatches) * busy[busiest]
			wait := 0.0
			for r, b := range busy {
				if r != busiest {
					wait += b / float64(v)
				}
			}
			if name == "zb" {
				wait /= 3
			}
			pipe, e.Bubble = ideal+wait, wait/ideal
			e.CommSeconds["pp"] = 2 * float64(p.Microbatches*v) * p2p
			e.CommBytes["pp"] = 2 * float64(p.Microbatches*v) * eb * tokens * hd / tp
		} else {
			sched, err := schedule.New(name, p.PP, v, p.Microbatches)
			if err != nil {
				return nil, err
			}
			cost := func(a schedule.Action) float64 {
				switch a.Kind {
				case schedule.F:
					return fc[a.Chunk]
				case schedule.B:
					if name == "zb" {
						return bc[a.Chunk] / 2
					}
					return bc[a.Chunk]
				case schedule.W:
					return bc[a.Chunk] / 2
				}
				return 0
			}
			sim, err := schedule.Simulate(sched, cost)
			if err != nil {
				return nil, err
			}
			pipe, e.Bubble = sim.StepTime, sim.Bubble
			e.CommSeconds["pp"] = 2 * float64(p.Microbatches*v) * p2p
			e.CommBytes["pp"] = 2 * float64(p.Microbatches*v) * eb * tokens * hd / tp
		}
	} else {
		pipe = float64(p.Microbatches) * (chunkF(0) + chunkB(0))
	}

	// Offloaded params copied blocks ahead (--offload-prefetch) travel
	// beside the compute, on the host link; when they take longer, the
	// compute waits for them (copyWait), and the reductions below, on
	// their own links, run through that wait too. Pricing the two
	// overlaps apart hid both behind the same compute, so that faster
	// compute made a longer step.
	var host, ahead float64
	if strings.Contains(p.Offload, "params") && p.OffloadPrefetch > 0 {
		// The forward's and the backward's copies; the update's
		// write-back still waits.
		ahead = 2 * 4 * stageParams
	}
	copyWait := math.Max(ahead/(h.HostGBps*1e9)-pipe, 0)

	// Data parallelism and the optimizer, after the last backward (both
	// backends issue reductions in program order on the compute stream).
	var tail float64
	if data > 1 || cp > 1 {
		// Gradients reduced in fp32 (a 16-bit gradient's fp32 copy, before
		// the unscaling), or in 16 bits (GradReduceBytes), over dp; under
		// expert parallelism the shared ones first over ep (as the shard
		// pass places them: partial over both axes, reduced one axis at a
		// time), the experts' over dp only. A bucket holds BucketBytes of
		// fp32 gradients whatever the format they move in, as
		// --bucket-mb's buckets do.
		g := p.gradReduceBytes() * stageParams
		bucket := p.BucketBytes
		if !(bucket > 0) {
			bucket = defaultBucketBytes
		}
		buckets := math.Max(math.Ceil(4*stageParams/bucket), 1)
		gather := eb * stageParams
		if p.GatherBytes > 0 {
			gather = p.GatherBytes * stageParams
		}
		var rs, ag float64
		if p.Zero == 0 {
			rs = buckets * Collective("all_reduce", p.DP, g/buckets, dpLink)
		} else {
			rs = buckets * Collective("reduce_scatter", p.DP, g/buckets, dpLink)
			if p.ReduceOnce {
				// A published run's distributed optimizer: Megatron-LM
				// sizes its buckets by the dp size (at least 40M params),
				// not by BucketBytes, so few that one call prices them.
				rs = Collective("reduce_scatter", p.DP, g, dpLink)
			}
			if p.Zero >= 2 && !p.ReduceOnce {
				// Each microbatch's gradients are reduce-scattered as they
				// come (passes.shard), as DeepSpeed's stages 2 and 3 do.
				rs *= float64(p.Microbatches)
			}
			if p.Zero == 3 {
				// The updated shards stay split: the params are gathered
				// before each microbatch's forward and backward, not
				// after the update.
				gather = 2 * float64(p.Microbatches) * eb * stageParams
				ag = 2 * float64(p.Microbatches) * Collective("all_gather", p.DP, eb*stageParams, dpLink)
			} else {
				ag = Collective("all_gather", p.DP, gather, dpLink)
			}
		}
		if cp > 1 {
			// Every gradient is summed over cp first (the weights are
			// whole on it), in buckets like dp's.
			r := buckets * Collective("all_reduce", cp, g/buckets, cpLink)
			rs += r
			e.CommSeconds["cp"] += r
			e.CommBytes["cp"] += 2 * g * (fcp - 1) / fcp
		}
		c := rs + ag
		e.CommSeconds["dp"] = c
		switch {
		case p.Zero == 0:
			e.CommBytes["dp"] = 2 * g * float64(p.DP-1) / float64(p.DP)
		case p.Zero >= 2 && !p.ReduceOnce:
			e.CommBytes["dp"] = (float64(p.Microbatches)*g + gather) * float64(p.DP-1) / float64(p.DP)
		default:
			e.CommBytes["dp"] = (g + gather) * float64(p.DP-1) / float64(p.DP)
		}
		// One microbatch's backward and forward over the stage's chunks:
		// what a reduction overlapped with the last one, or a gather with
		// the first, can hide behind.
		lastBackward, firstForward := perChunk*float64(v)*layerB+copyWait, perChunk*float64(v)*layerF+copyWait
		if h.OverlapBuckets && !p.SerialReductions && !p.OverlapShards && p.PP == 1 && p.Zero <= 2 {
			switch m := float64(p.Microbatches); {
			case p.Zero == 2 && !p.ReduceOnce && m > 1:
				// Each microbatch's buckets reduce-scatter on their own
				// stream, and its shards are summed after the next
				// microbatch's bucket of the same gradients: all but the
				// last microbatch's can hide behind the next one's forward
				// and backward; the last's are summed at once.
				c -= (m - 1) * math.Min(rs/m, lastBackward+firstForward)
			default:
				// The buckets reduce (all-reduce, or ZeRO-1's and 2's
				// reduce-scatter) on their own stream as the last
				// microbatch's backward produces them: all but the last
				// can hide behind that backward. The gather after the
				// update cannot. ZeRO-3's gathers, collectives of the same
				// group, wait for every bucket before them, and are left
				// unhidden.
				c -= math.Min(rs*(1-1/buckets), lastBackward)
			}
		}
		if p.OverlapShards && (p.Zero == 1 || p.Zero == 2) {
			c -= math.Min(rs*(1-1/buckets), lastBackward) + math.Min(ag*(1-1/buckets), firstForward)
		}
		tail += c
		if ep > 1 {
			shared := p.gradReduceBytes() * (stageParams - expertParams)
			c := Collective("all_reduce", ep, shared, h.axisLink(ep, p.TP*cp, p.Devices()))
			tail += c
			e.CommSeconds["ep"] += c
			e.CommBytes["ep"] += 2 * shared * float64(ep-1) / float64(ep)
		}
	}
	optParams := stageParams
	if p.Zero >= 1 {
		optParams /= float64(p.DP)
	}
	tail += h.memTime(optParams * 4 * (2 + 2*p.states() + 1 + p.states()))
	if ldt == "fp8" {
		// Each weight cast to fp8 with its transpose on the step's first
		// microbatch (the later ones reuse them): 2 bytes read, 2 written.
		tail += h.memTime(4 * stageParams)
	}
	if p.Offload != "" && p.Offload != "none" {
		if strings.Contains(p.Offload, "optimizer") {
			host += 2 * 4 * p.states() * optParams
		}
		if strings.Contains(p.Offload, "params") {
			host += 3 * 4 * stageParams
		}
		bw := h.HostGBps * 1e9
		e.CommSeconds["host"] = host / bw
		e.CommBytes["host"] = host
		tail += (host-ahead)/bw + copyWait // the update waits for its state
	}
	e.StepSeconds = pipe + tail
	if h.HostCores > 0 {
		// Virtual devices sharing the host's cores (the CPU backend) take
		// at least their work together over the cores, as Predict prices
		// a compiled plan: without it the search ranks plans by a step
		// the compile then prices far higher, and the few it compiles
		// miss the best.
		work := pipe/(1+e.Bubble) + tail // a device's work, the bubble left out
		devices := float64(p.TP * p.PP * p.DP * ep * cp)
		e.StepSeconds = math.Max(e.StepSeconds, devices*work/float64(h.HostCores))
	}
	e.ComputeSeconds = float64(p.Microbatches) * perChunk * float64(v) * (layerF + layerB - tpF - tpB - epF - epB - cpF - cpB)

	batch := float64(p.MicroBatch * p.Microbatches * data)
	e.ModelFLOPs = t.ModelFLOPs(int(batch))
	e.FLOPs = 3 * t.fwdFLOPsPerSeq() * batch
	switch p.Recompute {
	case "full":
		// The blocks' forward again; the head's output is not dropped
		// (Narayanan et al.'s eq. 3 counts it so too: V/(16·l·h)).
		e.FLOPs += share * (t.fwdFLOPsPerSeq() - 2*float64(t.Seq*t.Hidden)*float64(t.Vocab)) * batch
	case "selective":
		// The attention core's forward again, 4·s²·h a layer and
		// sequence (Korthikanti et al.: +2.7 % of GPT-3's forward, 0.9 %
		// of its step); a fused core has nothing to drop.
		if !t.FusedAttention {
			e.FLOPs += 4 * float64(t.Seq) * float64(t.Seq) * float64(t.Hidden) * float64(t.Layers) * batch
		}
	}

	// Memory: persistent bytes are a lower bound (see Estimate's doc).
	persistent := func(n float64) (params, state float64) {
		params, state = 4*n, 4*p.states()*n
		if p.Zero >= 1 {
			state /= float64(p.DP)
		}
		// Under mixed precision the params are the fp32 master weights,
		// which ZeRO splits with the optimizer state from stage 1 on (the
		// 16-bit copy below is gathered for the step).
		if p.Zero == 3 || p.Zero >= 1 && eb < 4 {
			params /= float64(p.DP)
		}
		if p.Schedule == "2bw" {
			// PipeDream-2BW's previous weights, which the forward and
			// backward read, kept in their dtype (passes.lowPrevWeights)
			// and offloaded with the params; ZeRO is refused with it.
			params += eb * n
		}
		if strings.Contains(p.Offload, "optimizer") {
			state = 0
		}
		if strings.Contains(p.Offload, "params") {
			params = 0
		}
		return params, state
	}
	// The first stage holds the embeddings and its layers, so its
	// persistent bytes bound the largest peak from below; with experts it
	// may hold fewer MoE blocks than the average, so each of its blocks is
	// counted as the lighter kind.
	low := t.layerParamsPerDevice(tp)
	if moeWeight > 0 {
		moe := t.attnParamsPerDevice(tp) + float64(t.RouterParams) + float64(t.Experts/ep)*t.expertParams()/tp
		if moeWeight == 1 || moe < low {
			low = moe
		}
	}
	// Of the parameters outside the blocks the first stage surely holds
	// the token embedding (and the GPT's position table).
	first := V * hd / tp
	if t.OuterParams == 0 {
		first += s * hd
	}
	lp, ls := persistent(perChunk*float64(v)*low + first)
	e.MemoryLowerBound = int64(0.98 * (lp + ls))
	// Gradients are kept in fp32 whatever the precision: a 16-bit one is
	// copied to fp32 as the backward makes it, and the copies are reduced
	// and read by the optimizer (Megatron-LM's main_grad: 18 bytes a
	// param in bf16, 6 + 12/dp with its distributed optimizer, as here).
	gradBytes := func(n float64) float64 {
		grads := 4 * n
		// With one microbatch ZeRO-1 compiles as ZeRO-2: each bucket is
		// reduce-scattered as the backward makes it, then freed.
		if p.Zero >= 2 || p.Zero == 1 && p.Microbatches == 1 {
			// Each device keeps its shard, and the gradients of the bucket
			// being reduce-scattered whole (all of a small model's: the
			// compiled peaks held 4.3–5.3 bytes a param at dp 4, priced 1).
			bucket := p.BucketBytes
			if !(bucket > 0) {
				bucket = defaultBucketBytes
			}
			grads = grads/float64(p.DP) + math.Min(grads, bucket)
		}
		return grads
	}
	// Microbatches in flight (their stash kept for the backward) on the
	// first pipeline rank and on the last, which alone holds the logits.
	inflight, inflightLast := float64(min(p.Microbatches, p.PP)), 1.0
	switch {
	case p.Schedule == "gpipe":
		inflight, inflightLast = float64(p.Microbatches), float64(p.Microbatches)
	case v > 1:
		// Interleaved 1F1B's warm-up runs 2(p−r−1) + (v−1)·p + 1 chunk
		// forwards on rank r before its first backward (Narayanan et al.
		// 2021): in layers, (1 + (p−1)/(p·v)) times 1F1B's on the first
		// rank (priced as 1F1B's, the compiled first ranks held up to
		// 17 % more). inflight counts microbatches of all v chunks.
		mv, pp := float64(p.Microbatches*v), float64(p.PP)
		inflight = math.Min(mv, 2*(pp-1)+(float64(v)-1)*pp+1) / float64(v)
		inflightLast = math.Min(mv, (float64(v)-1)*pp+1) / float64(v)
	}
	act := stashed()
	// The logits in the compute dtype, their fp32 copy under mixed
	// precision, and the loss's gradient written over that copy
	// (lower.overwriteLastReads), as Megatron-LM's cross-entropy writes
	// it over its softmax: 4 bytes a logit in fp32, 6 in 16 bits.
	perLogit := 4.0
	if eb < 4 {
		perLogit += eb
	}
	// What a microbatch's logits keep while they wait for the loss's
	// gradient: the fp32 copy, or under lowp in fp32 its bf16 copy.
	waitingPerLogit := 4.0
	if strings.Contains(p.Compress, "lowp") && eb == 4 {
		// lowp stashes a bf16 copy of the fp32 logits, made while they
		// are still live for the loss: 6 bytes a logit at the loss.
		act, perLogit, waitingPerLogit = act/2, 6, 2
	}
	logits := tokens * V / tp * perLogit
	// The backward of a segment (one layer under full) holds its K
	// layers' activations, replayed, beside the stash; on the last rank
	// not while the loss's gradient is made, before any replay.
	var replay float64
	if p.Recompute == "full" {
		replay = float64(min(max(everyK, 1), int(perChunk))) * kept()
	}
	// The last rank holds the logits of every microbatch whose loss's
	// gradient is still to be made or read: all of them under GPipe, whose
	// forwards all run first, and under zero-bubble with an untied head
	// those whose head-weight gradient waits for W (up to p; a tied head's
	// part is made in B, as it is sent on).
	// Those waiting keep 4 bytes a logit (the fp32 copy, or the gradient
	// written over it); the one being made all of logits'.
	untied := t.OuterParams > 0 && t.OuterSplit > 1.5*V*hd
	waiting := 0
	switch {
	case p.Schedule == "gpipe":
		waiting = p.Microbatches - 1
	case p.Schedule == "zb" && untied:
		waiting = min(p.Microbatches, p.PP) - 1
	}
	logitsLast := logits + float64(waiting)*tokens*V/tp*waitingPerLogit
	stash := act * perChunk * float64(v) // a microbatch's, on a rank
	actFirst := stash*inflight + replay
	if p.PP == 1 {
		actFirst = stash*inflight + math.Max(logits, replay)
	}
	actLast := stash*inflightLast + math.Max(logitsLast, logitsLast-logits+replay)
	if cp > 1 && p.CPImpl != "all2all" {
		// The ring's scratch while a ring instruction runs
		// (lower.RingScratch): two K/V chunks held and received, the
		// running output in float64 and one step's. It is not live at
		// the loss, so on a rank that holds the logits it adds only what
		// exceeds them.
		kv := 4 * tokens * t.kvWidth() / tp * 4
		ring := 2*kv + tokens*hd/tp*(8+4)
		if p.PP == 1 {
			actFirst += math.Max(ring-math.Max(logits, replay), 0)
		} else {
			actFirst += ring
		}
		actLast += math.Max(ring-logitsLast, 0)
	}
	// A 16-bit run computes with a copy of its fp32 master weights; an
	// fp32 run has none. (An fp32 run was priced with as much again for
	// the update's second copy of each param, which its arenas held until
	// the updates were written over their state: against the 80 plans the
	// planner compiles for two small GPTs on 4 devices the estimate is now
	// 23 % over and 5 % under on average (mean |log ratio| 0.31, 0.17), where it
	// was 50 % and 19 % over (0.42, 0.20) with the copy.)
	copyOf := func(n float64) float64 {
		switch {
		case strings.Contains(p.Offload, "params"):
			// The device holds the pieces in use (a layer, or the
			// embedding) and those prefetched ahead, in the compute dtype
			// (an fp32 run computes with the params' device copies); 2BW's
			// version stands in for a 16-bit copy.
			w := eb
			if p.Schedule == "2bw" && eb < 4 {
				w = 0
			}
			return w * (math.Max(first, low) + float64(p.OffloadPrefetch)*low)
		case p.Zero == 3:
			// The copy is split with the masters, and gathered a layer
			// (or the embedding) at a time for the forward and backward:
			// 16/N bytes a param and the largest gathered piece, where the
			// whole copy was priced (ZeRO-3 as heavy as ZeRO-2).
			if eb == 4 {
				return eb * math.Max(low, first) // fp32 computes with the masters' gathered shards
			}
			return eb * (n/float64(p.DP) + math.Max(low, first))
		case eb == 4 || p.Schedule == "2bw":
			// Under 2BW the forward reads the previous version, whose next
			// copy the optimizer writes in place.
			return 0
		}
		return eb * n
	}
	stageMem := func(n, act float64) float64 {
		params, state := persistent(n)
		m := params + state + copyOf(n)
		switch {
		case p.Microbatches == 1:
			// One microbatch: the activations peak at the loss's gradient,
			// before any weight gradient exists, and are gone when the
			// last is made.
			m += math.Max(act, gradBytes(n))
		case p.Zero >= 2 && !p.ReduceOnce && p.PP == 1:
			// Each microbatch's gradients are reduce-scattered as its
			// backward makes them and summed as shards: the shards stay
			// all step, and a microbatch's whole gradients (a bucket at
			// most) are live as its activations are freed, not beside
			// them (priced beside them, small models came out 47 % over
			// their compiled arenas), but for the head's, the first the
			// backward makes (in the compute dtype), which waits for its
			// bucket (or, tied, for the embedding's part) beside the
			// activations and the loss's gradient. Under a pipeline other
			// microbatches' stashes stay beside them.
			shards := 4 * n / float64(p.DP)
			bucket := gradBytes(n) - shards
			m += shards + math.Max(act+math.Min(eb*V*hd/tp, bucket), bucket)
		default:
			m += act + gradBytes(n)
		}
		if ldt == "fp8" {
			m += 2 * n // the fp8 weights and their transposes
		}
		return m
	}
	if p.PP == 1 {
		e.MemoryEstimate = int64(stageMem(stageParams, actFirst))
		return e, nil
	}
	// Under a pipeline the first rank holds the word embedding (and a
	// GPT's position table) with most microbatches in flight, the last
	// the head and the logits with one: each priced as its own rank,
	// where both tables, the logits and the first rank's stash were
	// counted on one (pipelined plans came out 15–27 % over their
	// compiled arenas). A tied head's last rank receives the table each
	// step and makes its gradient's part: 2 + 4 bytes a row element in
	// 16 bits, beside its blocks.
	blocks := stageParams - t.outerParamsPerDevice(tp)
	headParams, receivedBytes := 0.0, V*hd/tp*(eb+4)
	if untied {
		headParams, receivedBytes = V*hd/tp, 0 // its own vocab-parallel table
	}
	firstMem := stageMem(stageParams-headParams, actFirst)
	lastMem := stageMem(blocks+headParams, actLast) + receivedBytes
	e.MemoryEstimate = int64(math.Max(firstMem, lastMem))
	return e, nil
}

// check refuses a shape the formulas cannot price: a dimension of 0
// (which would divide 0 by 0 into a NaN step), k/v heads that do not
// divide the heads, experts without their width or layers.
func (t Transformer) check() error {
	for _, d := range []struct {
		name string
		n    int
	}{{"layers", t.Layers}, {"hidden", t.Hidden}, {"heads", t.Heads}, {"seq", t.Seq}, {"vocab", t.Vocab}} {
		if d.n < 1 {
			return fmt.Errorf("shape: %s = %d, want ≥ 1", d.name, d.n)
		}
	}
	if t.KVHeads < 0 || t.KVHeads > 0 && t.Heads%t.KVHeads != 0 {
		return fmt.Errorf("shape: %d k/v heads do not divide %d heads", t.KVHeads, t.Heads)
	}
	if t.Experts < 0 || t.MoELayers < 0 || t.moeLayers() > t.Layers {
		return fmt.Errorf("shape: %d experts in %d of %d layers", t.Experts, t.MoELayers, t.Layers)
	}
	if t.moeLayers() > 0 && (t.ExpertFFN < 1 || !(t.Slots > 0) || math.IsInf(t.Slots, 0)) {
		return fmt.Errorf("shape: experts of width %d taking %g slots a token, want both > 0", t.ExpertFFN, t.Slots)
	}
	if t.Routed < 0 || math.IsNaN(t.Routed) || math.IsInf(t.Routed, 0) || t.Routed > 0 && t.moeLayers() > 0 && t.Routed > float64(t.Experts) {
		return fmt.Errorf("shape: %g experts routed a token, want 0 (the slots) to %d", t.Routed, t.Experts)
	}
	if t.moeLayers() < t.Layers && t.FFN < 1 {
		return fmt.Errorf("shape: ffn = %d in a model with dense blocks, want ≥ 1", t.FFN)
	}
	return nil
}

// recomputeSegments is the plan's recompute as the estimate prices it,
// the layers of a segment and those block=N replays of each chunk:
// every=K (passes' recompute: segments of K layers, sqrt for ⌈√layers⌉)
// is full with K, block=N full with N; the others are themselves, with 0.
func (p Plan) recomputeSegments(layers int) (string, int, int) {
	if arg, ok := strings.CutPrefix(p.Recompute, "block="); ok {
		n, _ := strconv.Atoi(arg)
		return "full", 0, max(n, 1)
	}
	rc, k, _ := p.segments(layers)
	return rc, k, 0
}

// segments parses every=K: ok is false for a K that is neither a positive
// number nor sqrt.
func (p Plan) segments(layers int) (rc string, k int, ok bool) {
	arg, every := strings.CutPrefix(p.Recompute, "every=")
	if !every {
		return p.Recompute, 0, true
	}
	if arg == "sqrt" {
		return "full", max(1, int(math.Ceil(math.Sqrt(float64(layers))))), true
	}
	n, err := strconv.Atoi(arg)
	return "full", n, err == nil && n >= 1
}

// maxScheduleActions bounds the pipeline the simulator builds (pp · vpp ·
// microbatches, each a forward and a backward): past it the schedule
// alone would take gigabytes.
const maxScheduleActions = 1 << 24

// check refuses a plan compile.Config.Validate would refuse, for callers
// of Estimate that build plans themselves: a priced plan that cannot run
// is a wrong answer, not an estimate.
func (p Plan) check(t Transformer, simulate bool) error {
	if p.VPP < 0 || p.EP < 0 || p.CP < 0 || p.OffloadPrefetch < 0 {
		return fmt.Errorf("plan %s: vpp, ep, cp and the offload prefetch must be ≥ 0", p)
	}
	if p.VPP > 1 && p.PP == 1 {
		return fmt.Errorf("plan %s: vpp=%d chunks a rank needs a pipeline (pp > 1)", p, p.VPP)
	}
	if p.Zero < 0 || p.Zero > 3 {
		return fmt.Errorf("plan %s: zero stage %d, want 0 to 3", p, p.Zero)
	}
	switch _, _, ok := p.segments(t.Layers); {
	case strings.HasPrefix(p.Recompute, "every="):
		if !ok {
			return fmt.Errorf("plan %s: recompute %s, want a positive number of layers or sqrt", p, p.Recompute)
		}
	case strings.HasPrefix(p.Recompute, "block="):
		if n, err := strconv.Atoi(strings.TrimPrefix(p.Recompute, "block=")); err != nil || n < 1 {
			return fmt.Errorf("plan %s: recompute %s, want a positive number of layers of each pipeline chunk", p, p.Recompute)
		}
	case p.Recompute == "", p.Recompute == "none", p.Recompute == "full", p.Recompute == "selective":
	default:
		return fmt.Errorf("plan %s: recompute %q, want none, full, selective, every=K or block=N", p, p.Recompute)
	}
	switch p.Offload {
	case "", "none", "optimizer", "params", "optimizer,params", "params,optimizer":
	default:
		return fmt.Errorf("plan %s: offload %q, want none, optimizer, params or optimizer,params", p, p.Offload)
	}
	if !(p.GatherBytes >= 0) || !(p.BucketBytes >= 0) || math.IsInf(p.GatherBytes, 0) || math.IsInf(p.BucketBytes, 0) {
		return fmt.Errorf("plan %s: gather bytes %g and bucket bytes %g, want ≥ 0 (0: the default)", p, p.GatherBytes, p.BucketBytes)
	}
	switch p.Optimizer {
	case "", "adamw", "sgd", "adafactor", "sm3":
	default:
		return fmt.Errorf("plan %s: optimizer %q, want adamw, sgd, adafactor or sm3", p, p.Optimizer)
	}
	switch p.CPImpl {
	case "", "ring", "all2all":
	default:
		return fmt.Errorf("plan %s: cp attention %q, want ring or all2all", p, p.CPImpl)
	}
	switch p.CPLayout {
	case "", "zigzag", "contiguous":
	default:
		return fmt.Errorf("plan %s: cp layout %q, want zigzag or contiguous", p, p.CPLayout)
	}
	if p.Compress != "" && p.Compress != "none" {
		for _, mode := range strings.Split(p.Compress, ",") {
			if mode != "lowp" && mode != "relu" {
				return fmt.Errorf("plan %s: activation compression %q, want lowp, relu or relu,lowp", p, p.Compress)
			}
		}
	}
	if p.SequenceParallel && p.TP == 1 {
		return fmt.Errorf("plan %s: sequence parallelism splits over tp, which is 1", p)
	}
	if t.Heads%p.TP != 0 {
		return fmt.Errorf("plan %s: tp=%d does not divide %d heads", p, p.TP, t.Heads)
	}
	if p.PP > 1 {
		v := max(p.VPP, 1)
		name := p.Schedule
		if name == "" {
			name = "1f1b"
			if v > 1 {
				name = "interleaved"
			}
		}
		if !slices.Contains(schedule.Names(), name) {
			return fmt.Errorf("plan %s: unknown schedule %q, want one of %s", p, name, strings.Join(schedule.Names(), ", "))
		}
		if v > 1 && name != "interleaved" {
			return fmt.Errorf("plan %s: vpp=%d chunks a rank needs the interleaved schedule, not %s", p, v, name)
		}
		if v < 2 && name == "interleaved" {
			// Estimate's simulator refused it; EstimateFast priced it.
			return fmt.Errorf("plan %s: the interleaved schedule needs vpp ≥ 2 chunks a rank, got %d", p, v)
		}
		if simulate && float64(p.PP)*float64(v)*float64(p.Microbatches) > maxScheduleActions {
			return fmt.Errorf("plan %s: pp·vpp·microbatches = %g is past the %d the schedule simulator builds", p, float64(p.PP)*float64(v)*float64(p.Microbatches), maxScheduleActions)
		}
	}
	return nil
}

// axisLink is the slowest link of any group of a mesh axis whose groups
// are n members stride apart (the mesh is pp, dp, ep, tp, tp fastest, as
// Megatron-LM lays ranks out: a tp group is adjacent ranks, an ep group
// strides tp, a dp group tp·ep). A collective ends with its slowest
// group, and rank 0's is not always it: tp 3 on nodes of 4 keeps ranks
// 0–2 in a node while ranks 3–5 straddle two. The placement of the groups
// on nodes repeats every lcm(n·stride, DevicesPerNode) ranks (or ends
// with the mesh's devices), which is all it looks at.
func (h *Hardware) axisLink(n, stride, devices int) Link {
	members := make([]int, n)
	for i := range members {
		members[i] = i * stride
	}
	worst := h.LinkFor(members)
	if n <= 1 || h.DevicesPerNode <= 1 {
		return worst
	}
	// Shifting a group by a whole node shifts all its members' nodes
	// alike, so offsets j beyond a node's worth repeat, and so do blocks
	// beyond lcm(block, DevicesPerNode).
	block := n * stride
	period := min(block/gcd(block, h.DevicesPerNode)*h.DevicesPerNode, devices)
	for b := 0; b < period; b += block {
		for j := range min(stride, h.DevicesPerNode) {
			if b == 0 && j == 0 {
				continue
			}
			for i := range members {
				members[i] = b + j + i*stride
			}
			if l := h.LinkFor(members); l.slower(worst) {
				worst = l
			}
		}
	}
	return worst
}

// pairLink is the slowest link between two ranks stride apart: a pipeline
// transfer between neighbouring stages (stride tp·dp·ep), over every
// placement, which repeats every lcm(stride, DevicesPerNode) ranks.
func (h *Hardware) pairLink(stride, devices int) Link {
	worst := h.LinkFor([]int{0, stride})
	if h.DevicesPerNode <= 1 {
		return worst
	}
	// Pairs a whole node apart cross alike.
	for x := 1; x < min(h.DevicesPerNode, devices-stride); x++ {
		if l := h.LinkFor([]int{x, x + stride}); l.slower(worst) {
			worst = l
		}
	}
	return worst
}

// slower says whether l is a slower link than o: less bandwidth, or as
// much with more latency.
func (l Link) slower(o Link) bool {
	return l.GBps < o.GBps || l.GBps == o.GBps && l.LatencyUS > o.LatencyUS
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// DTypeName is the matrix dtype of the plan's linear GEMMs (fp32, bf16,
// fp16, fp8), the peak MFU is measured against.
func (p Plan) DTypeName() string { return p.linearDtype() }
