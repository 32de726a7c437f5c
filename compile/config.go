package compile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// Config is a compilation: the model and the parallel plan. Validate
// resolves degrees left at zero simply: tp, pp, ep and vpp default to 1
// and dp takes the devices left. Package planner chooses them instead when
// asked (the CLI's --plan, or --run with --hardware): it fills in a Config
// per candidate and validates each.
type Config struct {
	Model string // MODEL.go or MODEL.gir
	Set   string // model parameters key=value,… (a model.go only)
	Batch int    // global batch in sequences

	Devices, TP, PP, DP, EP, VPP, Microbatches, Zero int
	// CP is the context-parallel degree: every activation's sequence is
	// split over cp ranks, attention included (CPImpl: "ring", K/V blocks
	// passed around the cp ranks and merged by their log-sum-exp, or
	// "all2all", DeepSpeed-Ulysses' exchange of sequence for heads).
	CP     int
	CPImpl string
	// CPLayout is how the ring splits the sequence: "zigzag" (each rank
	// holds chunks i and 2·cp−1−i of 2·cp, so that every rank does the
	// same share of a causal attention's work) or "contiguous" (rank i
	// the i-th of cp). "" is zigzag for the ring; all2all is contiguous.
	CPLayout string
	// MicroBatchSize, when set, is the sequences of one microbatch on
	// each data-parallel replica (Megatron-LM's --micro-batch-size):
	// Microbatches follows as Batch/(DP·EP·MicroBatchSize). 0: unset.
	MicroBatchSize                            int
	Schedule, Recompute, Precision, Optimizer string

	SequenceParallel, Verify, Fuse bool
	Offload, Compress              string
	OffloadPrefetch                int
	BucketMB                       float64
	// SerialGradReduce (--overlap-grad-reduce=false) reduces the
	// data-parallel gradient buckets in program order, as Megatron-LM
	// without --overlap-grad-reduce and DeepSpeed without overlap_comm
	// do, instead of beside the backward where the runtime can (the CUDA
	// backend's comm stream; the CPU backend always reduces in order).
	SerialGradReduce bool
	// CommStream says the runtime reduces gradient buckets on a stream
	// of their own (the CUDA backend): a pipeline's sends then leave
	// beside them, and its buckets stay where their gradients are made.
	// Without it (the CPU backend, or SerialGradReduce) collectives run
	// in program order, and a chunk's sends go before its buckets
	// (lower.Options.SendsFirst).
	CommStream bool
	// GradReduceDType is --grad-reduce-dtype: "fp32" (or "") or the
	// 16-bit format the gradients are reduced in over dp, ep and cp.
	GradReduceDType string
	DPSync          string // "sync" or "async"
	Staleness       int
	MemLimit        int64 // bytes per device; 0: unlimited
	// Classes is how many token ids the data holds when the model's
	// vocabulary is padded past them (a model.go only; frontend.Config).
	Classes int
	// ModelTimeout bounds building a model.go and, separately, running
	// its Model() (--model-timeout); 0: the loader's default.
	ModelTimeout time.Duration
	// Interrupt, when it ends, stops building a model.go (the go command
	// and the model's driver are killed, their work folder removed); the
	// CLI ends it on SIGINT or SIGTERM. nil: never.
	Interrupt context.Context
	// Built, when set, is the training module already built from Model
	// at these sizes (ir.Print's text; the planner builds it to search):
	// the compile parses it instead of building Model again. The
	// evaluation module is built anyway.
	Built string
	// Progress is where building a model.go says what it is doing (the
	// loader's "building model …"): nil is stderr. The processes of a job
	// other than rank 0 discard it, or a job of 64 prints it 64 times.
	Progress io.Writer

	Beta1, Beta2, WeightDecay, Clip, LossScale float64
	// AdamEps is Adam's ε, added to √v̂ in the update (0: 1e-8, PyTorch's
	// and Megatron-LM's default).
	AdamEps float64

	// FilledMicrobatches says that Validate chose Microbatches, which
	// was not given, to fill the pipeline (fillPipeline).
	FilledMicrobatches bool

	// Explicit names the flags the user gave, for rules about flags that
	// apply only with others (a flag at its default is not "given").
	Explicit map[string]bool
}

// fillPipeline gives a pipeline whose microbatches were left out (neither
// --microbatches nor --micro-batch-size) as many as its schedule needs:
// the fewest that divide each replica's share of the batch and are at
// least pp (a multiple of pp for interleaved, Megatron-LM's rule). A
// pipeline of one microbatch was refused by every schedule but GPipe, so
// plain --pp 2 did not run; a Megatron-LM user gets microbatches from the
// batch, not an error. GPipe keeps what it was given. Splitting the batch
// changes nothing but the order of the gradient sums.
func (c *Config) fillPipeline() {
	if c.PP <= 1 || c.Explicit["microbatches"] || c.MicroBatchSize > 0 || c.Microbatches >= c.PP || c.Schedule == "gpipe" {
		return
	}
	replicas := max(c.DP, 1) * max(c.EP, 1)
	if c.Batch < 1 || c.Batch%replicas != 0 {
		return
	}
	share := c.Batch / replicas
	for m := c.PP; m <= min(share, MaxMicrobatches); m++ {
		if share%m == 0 && (c.Schedule != "interleaved" || m%c.PP == 0) {
			c.Microbatches, c.FilledMicrobatches = m, true
			return
		}
	}
}

// ErrNotYet marks a valid request that this build cannot carry out yet.
var ErrNotYet = errors.New("not yet supported")

// CheckSchedule names a pipeline schedule that does not exist.
func CheckSchedule(s string) error {
	if !slices.Contains([]string{"gpipe", "1f1b", "interleaved", "2bw", "zb"}, s) {
		return fmt.Errorf("--schedule %q: want gpipe, 1f1b, interleaved, 2bw or zb", s)
	}
	return nil
}

// Validate rejects impossible or unsupported combinations, naming the
// rule, and resolves the degrees and schedule the user left to the
// compiler. It changes c.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	notYet := func(what, when string) { errs = append(errs, fmt.Errorf("%s: %w (%s)", what, ErrNotYet, when)) }
	if c.Explicit == nil {
		c.Explicit = map[string]bool{}
	}

	isGo, isGir := strings.HasSuffix(c.Model, ".go"), strings.HasSuffix(c.Model, ".gir")
	if !isGo && !isGir {
		bad("%s: the model must be a .go file or a .gir dump", c.Model)
	}
	if isGir {
		for _, f := range []string{"set", "batch", "help-model"} {
			if c.Explicit[f] {
				bad("--%s applies to a model.go; a .gir file has its sizes fixed", f)
			}
		}
	}
	if c.Devices < 1 {
		bad("--devices must be ≥ 1, got %d", c.Devices)
	}
	if c.Devices > MaxDevices {
		bad("--devices %d: at most %d", c.Devices, MaxDevices)
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"tp", c.TP}, {"pp", c.PP}, {"dp", c.DP}, {"ep", c.EP}, {"cp", c.CP}, {"vpp", c.VPP}} {
		if d.v < 0 || d.v > MaxDevices {
			bad("--%s must be in 0..%d, got %d", d.name, MaxDevices, d.v)
		}
	}
	if len(errs) > 0 {
		// The degrees are multiplied below: out of range, they could
		// overflow to 0 and divide by it.
		return errors.Join(errs...)
	}
	// Unset degrees: tp, pp, ep, cp default to 1 and dp takes the rest.
	tp, pp, ep, cp, vpp := or1(c.TP), or1(c.PP), or1(c.EP), or1(c.CP), or1(c.VPP)
	dp := c.DP
	if dp == 0 && c.Devices%(tp*pp*ep*cp) == 0 {
		dp = c.Devices / (tp * pp * ep * cp)
	}
	// In float64, which is exact up to 2^53 and so cannot wrap five
	// degrees of up to 2^20 around to --devices as an int product could.
	if c.Devices >= 1 && float64(tp)*float64(pp)*float64(ep)*float64(cp)*float64(max(dp, 1)) != float64(c.Devices) {
		bad("tp·pp·dp·ep·cp = %d·%d·%d·%d·%d = %d must equal --devices %d", tp, pp, max(dp, 1), ep, cp, tp*pp*max(dp, 1)*ep*cp, c.Devices)
	}
	c.TP, c.PP, c.DP, c.EP, c.CP, c.VPP = tp, pp, max(dp, 1), ep, cp, vpp
	switch {
	case c.CPImpl == "" && !c.Explicit["cp-impl"]:
		c.CPImpl = "ring"
	case c.CPImpl != "ring" && c.CPImpl != "all2all":
		bad("--cp-impl %q: want ring or all2all", c.CPImpl)
	case c.Explicit["cp-impl"] && c.CP == 1:
		bad("--cp-impl %s applies to --cp > 1 (it is how attention runs over the context-parallel ranks)", c.CPImpl)
	}
	if c.Explicit["cp-layout"] && c.CP == 1 {
		bad("--cp-layout %s applies to --cp > 1 (it is how the sequence is split over the context-parallel ranks)", orQuoted(c.CPLayout))
	}
	switch {
	case c.CPLayout != "" && c.CPLayout != "zigzag" && c.CPLayout != "contiguous":
		bad("--cp-layout %q: want zigzag or contiguous", c.CPLayout)
	case c.CPImpl == "all2all" && c.CPLayout == "zigzag" && c.Explicit["cp-layout"] && c.CP > 1:
		bad("--cp-layout zigzag balances the ring's causal work; --cp-impl all2all runs whole sequences, so it takes --cp-layout contiguous")
	case c.CPImpl == "all2all":
		c.CPLayout = "contiguous"
	case c.CPLayout == "":
		c.CPLayout = "zigzag"
	}
	if c.DPSync == "" {
		c.DPSync = "sync"
	}
	switch {
	case c.DPSync != "sync" && c.DPSync != "async":
		bad("--dp-sync %q: want sync or async", c.DPSync)
	case c.DPSync == "sync" && c.Explicit["staleness"]:
		bad("--staleness applies to --dp-sync async")
	case c.DPSync == "async" && c.DP < 2:
		bad("--dp-sync async needs --dp > 1 (replicas to run asynchronously)")
	case c.DPSync == "async" && (c.TP > 1 || c.PP > 1 || c.EP > 1 || c.CP > 1 || c.Zero > 0):
		bad("--dp-sync async runs whole replicas around one optimizer: it does not combine with tp, pp, ep, cp or ZeRO")
	case c.DPSync == "async" && c.GradReduceDType != "" && c.GradReduceDType != "fp32":
		bad("--grad-reduce-dtype %s narrows the synchronous gradient reduction; asynchronous replicas send their fp32 gradients to the parameter server, which sums none", c.GradReduceDType)
	case c.Staleness < 0:
		bad("--staleness must be ≥ 0, got %d", c.Staleness)
	}
	if c.SequenceParallel && c.TP == 1 {
		bad("--sequence-parallel needs --tp > 1 (it splits activations over the tensor-parallel ranks)")
	}
	if c.VPP > 1 && c.PP == 1 {
		bad("--vpp %d needs --pp > 1 (virtual stages interleave a pipeline)", c.VPP)
	}
	if c.Schedule != "" {
		if err := CheckSchedule(c.Schedule); err != nil {
			bad("%w", err)
		} else if c.PP == 1 {
			bad("--schedule %s needs --pp > 1 (it orders pipeline stages)", c.Schedule)
		}
	}
	if c.PP > 1 && c.Schedule == "" {
		// Megatron-LM's defaults.
		c.Schedule = "1f1b"
		if c.VPP > 1 {
			c.Schedule = "interleaved"
		}
	}
	if c.VPP > 1 && c.Schedule != "" && c.Schedule != "interleaved" {
		bad("--vpp %d needs --schedule interleaved (the other schedules run one chunk per rank)", c.VPP)
	}
	if c.Zero < 0 || c.Zero > 3 {
		bad("--zero %d: want 0, 1, 2 or 3", c.Zero)
	} else if c.Zero > 0 && c.DP == 1 {
		bad("--zero %d needs --dp > 1 (ZeRO shards across data-parallel ranks)", c.Zero)
	} else if c.Zero > 0 && c.Schedule == "2bw" {
		// The previous weights are optimizer state the forward reads as
		// weights, which no stage of ZeRO places.
		notYet(fmt.Sprintf("--zero %d with --schedule 2bw", c.Zero), "PipeDream-2BW's second copy of the weights is read by the forward whole, and no ZeRO stage places it yet; use --zero 0, or another schedule")
	}
	if c.MicroBatchSize < 0 {
		bad("--micro-batch-size must be ≥ 1, got %d", c.MicroBatchSize)
	} else if mbs := c.MicroBatchSize; mbs > 0 && c.Batch > 0 {
		replicas := c.DP * c.EP
		switch {
		case c.Batch%replicas != 0 || (c.Batch/replicas)%mbs != 0:
			bad("--batch %d must be divisible by dp·ep·micro-batch-size = %d·%d·%d", c.Batch, c.DP, c.EP, mbs)
		case c.Explicit["microbatches"] && c.Microbatches*mbs*replicas != c.Batch:
			bad("--micro-batch-size %d and --microbatches %d disagree: dp·ep·micro-batch-size·microbatches = %d, --batch is %d (give one of them)", mbs, c.Microbatches, replicas*mbs*c.Microbatches, c.Batch)
		default:
			c.Microbatches = c.Batch / replicas / mbs
		}
	}
	c.fillPipeline()
	if c.Microbatches < 1 {
		bad("--microbatches must be ≥ 1, got %d", c.Microbatches)
	} else if c.Microbatches > MaxMicrobatches {
		// Each microbatch is a block of the compiled program: a million
		// of them compiled for hours with no word.
		bad("--microbatches %d: past the %d a compiled program holds (each is a block of its forward and backward, about 25 ms of compile each for a 2-layer GPT); give fewer, larger microbatches (--micro-batch-size)", c.Microbatches, MaxMicrobatches)
	} else if replicas := max(c.DP, 1) * max(c.EP, 1); c.Batch%replicas != 0 || (c.Batch/replicas)%c.Microbatches != 0 {
		// Two divisions, not one by dp·ep·microbatches, which can
		// overflow. The batch is split over dp and ep alike.
		if c.EP > 1 {
			bad("--batch %d must be divisible by dp·ep·microbatches = %d·%d·%d", c.Batch, c.DP, c.EP, c.Microbatches)
		} else {
			bad("--batch %d must be divisible by dp·microbatches = %d", c.Batch, c.DP*c.Microbatches)
		}
	}
	if c.Batch < 1 {
		bad("--batch must be ≥ 1")
	} else if c.Batch > MaxBatch {
		bad("--batch %d: more than %d sequences a step (is it a count of tokens? --batch counts sequences)", c.Batch, MaxBatch)
	}
	if c.Recompute == "" {
		c.Recompute = "none"
	}
	if k, ok := strings.CutPrefix(c.Recompute, "every="); ok {
		if n, err := strconv.Atoi(k); k != "sqrt" && (err != nil || n < 1) {
			bad("--recompute every=%s: want a positive number of layers or sqrt", k)
		}
	} else if k, ok := strings.CutPrefix(c.Recompute, "block="); ok {
		if n, err := strconv.Atoi(k); err != nil || n < 1 {
			bad("--recompute block=%s: want a positive number of layers of each pipeline chunk", k)
		}
	} else if !slices.Contains([]string{"none", "full", "selective"}, c.Recompute) {
		bad("--recompute %q: want none, full, selective, every=K or block=N", c.Recompute)
	}
	if c.Precision == "" {
		c.Precision = "fp32"
	}
	if !slices.Contains([]string{"fp32", "fp16", "bf16"}, c.Precision) {
		bad("--precision %q: want fp32, fp16 or bf16", c.Precision)
	}
	c.checkNumbers(bad)
	if c.LossScale > 0 && !math.IsInf(c.LossScale, 0) && c.Precision == "fp32" { // a bad value is named above
		bad("--loss-scale applies to --precision fp16 or bf16")
	}
	if c.MemLimit < 0 {
		bad("--device-memory must be positive")
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// What this build cannot do yet, each said once and never ignored.
	if _, err := c.LowerOptions(); err != nil {
		errs = append(errs, err)
	} else if c.OffloadPrefetch < 0 {
		bad("--offload-prefetch %d: want a distance ≥ 0 in layer blocks", c.OffloadPrefetch)
	} else if c.Explicit["offload-prefetch"] && (c.Offload == "" || c.Offload == "none") {
		bad("--offload-prefetch applies to --offload")
	} else if c.Offload != "" && c.Offload != "none" && c.DPSync == "async" {
		notYet("--offload with --dp-sync async", "the asynchronous trainer's gradient and update programs are lowered without offload")
	}
	if c.Compress != "" && c.Compress != "none" {
		seen := map[string]bool{}
		for _, mode := range strings.Split(c.Compress, ",") {
			if mode != "lowp" && mode != "relu" || seen[mode] {
				bad("--compress-activations %q: want lowp or relu, or both as relu,lowp", c.Compress)
				break
			}
			seen[mode] = true
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return c.PassOptions().Validate()
}

// MaxMicrobatches bounds the microbatches of a compiled plan (Megatron-
// LM's published runs use at most a few thousand a replica).
const MaxMicrobatches = 16384

// MaxBatch bounds --batch: 2^30 sequences a step is far past any run's
// (Megatron-LM's largest published global batches are a few thousand),
// and its products with a model's sizes stay well within an int.
const MaxBatch = 1 << 30

// MaxDevices bounds --devices and each parallel degree: their products
// must fit an int, and a mesh of a million devices is beyond any job.
const MaxDevices = 1 << 20

// MinLossScale is the smallest loss scale a float32 holds at full
// precision (its smallest normal number); LossScaleFits says whether a
// scale is one float32 holds, between it and math.MaxFloat32.
const MinLossScale = 0x1p-126

func LossScaleFits(s float64) bool { return s >= MinLossScale && s <= math.MaxFloat32 }

// MaxBucketMB bounds --bucket-mb: its bytes must fit an int64, and one
// bucket of 1 TiB already holds any model's gradients.
const MaxBucketMB = 1 << 20

// checkNumbers checks the plan's real-valued flags, each failure naming
// its flag. NaN is refused explicitly, since it passes every comparison
// (the flag package parses "NaN" and "Inf"), and so is ±Inf: either would
// only show as a NaN loss after the compile and the first steps.
func (c *Config) checkNumbers(bad func(string, ...any)) {
	// The optimizer computes in float32: a figure must be one there too
	// (0.99999999 rounds to 1, 1e39 overflows).
	finite := func(v float64) bool { return !math.IsNaN(v) && math.Abs(v) <= math.MaxFloat32 }
	for _, b := range []struct {
		name string
		v    float64
	}{{"beta1", c.Beta1}, {"beta2", c.Beta2}} {
		if !(b.v >= 0 && float32(b.v) < 1) {
			bad("--%s must lie in [0, 1) as a 32-bit float, which the optimizer computes in, got %g", b.name, b.v)
		}
	}
	if !finite(c.Clip) || c.Clip < 0 {
		bad("--clip must be a finite norm ≥ 0 (0: off), got %g", c.Clip)
	}
	if c.AdamEps != 0 && (!finite(c.AdamEps) || !(float32(c.AdamEps) > 0)) {
		bad("--adam-eps must be positive and finite as a 32-bit float, which the optimizer computes in (at least %g), got %g", math.SmallestNonzeroFloat32, c.AdamEps)
	}
	if !finite(c.WeightDecay) || c.WeightDecay < 0 {
		bad("--weight-decay must be finite as a 32-bit float and ≥ 0, got %g", c.WeightDecay)
	}
	if c.GradReduceDType != "" && !slices.Contains(passes.GradReduceDTypes, c.GradReduceDType) {
		bad("--grad-reduce-dtype %q: want one of %s", c.GradReduceDType, strings.Join(passes.GradReduceDTypes, ", "))
	} else if c.GradReduceDType == "fp16" && c.Precision != "fp16" {
		bad("--grad-reduce-dtype fp16 needs --precision fp16, whose loss scale keeps the gradients in fp16's range and whose scaler skips a step a sum overflows; with --precision %s reduce in bf16, which has fp32's range", orDefault(c.Precision, "fp32"))
	}
	if !(c.BucketMB > 0) || c.BucketMB > MaxBucketMB {
		bad("--bucket-mb must be positive and at most %d, got %g", MaxBucketMB, c.BucketMB)
	}
	if !finite(c.LossScale) || c.LossScale < 0 {
		bad("--loss-scale must be positive (0: dynamic) and finite as a 32-bit float, got %g", c.LossScale)
	} else if c.LossScale != 0 && !LossScaleFits(c.LossScale) {
		bad("--loss-scale %g: the scale multiplies the loss in float32, so it must be a normal float32 (%.3g to %.3g); outside it the scaled loss or its gradients round to 0 or Inf and every step is skipped", c.LossScale, MinLossScale, math.MaxFloat32)
	}
}

func or1(n int) int {
	if n == 0 {
		return 1
	}
	return n
}

// LowerOptions are the lowering's options; every pipeline rank's program
// gets the same.
func (c *Config) LowerOptions() (lower.Options, error) {
	if _, _, err := lower.ParseOffload(c.Offload); err != nil {
		return lower.Options{}, fmt.Errorf("--offload %q: %w", c.Offload, err)
	}
	prefetch := c.OffloadPrefetch
	if prefetch == 0 {
		prefetch = -1 // right before use; Options reads 0 as the default
	}
	return lower.Options{Offload: c.Offload, PrefetchLayers: prefetch, SerialBuckets: c.SerialGradReduce,
		SendsFirst: !c.CommStream || c.SerialGradReduce}, nil
}

// PassOptions are the passes' options for the plan.
func (c *Config) PassOptions() *passes.Options {
	o := passes.DefaultOptions()
	o.Verify = c.Verify
	if c.Optimizer != "" {
		o.Optimizer = c.Optimizer
	}
	o.Beta1, o.Beta2 = c.Beta1, c.Beta2
	if c.AdamEps != 0 {
		o.Eps = c.AdamEps
	}
	o.WeightDecay = c.WeightDecay
	o.ClipNorm = c.Clip
	o.Zero = c.Zero
	o.Microbatches = c.Microbatches
	o.SequenceParallel = c.SequenceParallel
	o.VPP = c.VPP
	o.TwoBW = c.Schedule == "2bw"
	o.DeferWeightGradients = c.Schedule == "zb"
	o.Recompute = c.Recompute
	o.Compress = c.Compress
	o.Fuse = c.Fuse
	o.BucketMB = c.BucketMB
	o.GradReduceDType = c.GradReduceDType
	o.Precision, o.LossScale = c.Precision, c.LossScale
	o.Mesh = c.Mesh()
	o.CPImpl = c.CPImpl
	if c.Interrupt != nil {
		o.Interrupted = func() error { return c.interrupted("the compile passes") }
	}
	if c.DPSync == "async" {
		o.Mesh = nil // replicas are whole single-device programs
	}
	return o
}

// Mesh lays the devices out as Megatron-LM does: tensor-parallel ranks
// adjacent (tp is the last, fastest axis), then context parallel (the
// ring's neighbours next to each other, after tp), expert parallel (the
// ranks an all_to_all joins), data parallel, pipeline stages outermost.
// The ring's cp splits the sequence before tp (ir.MeshAxis.Outer, also
// Megatron-Core's layout), Ulysses' after it: its heads need tp as the
// coarser split. Axes of size 1 are left out; nil for one device.
func (c *Config) Mesh() *ir.Mesh {
	m := &ir.Mesh{}
	for _, a := range []ir.MeshAxis{{Name: "pp", Size: c.PP}, {Name: "dp", Size: c.DP}, {Name: "ep", Size: c.EP}, {Name: "cp", Size: c.CP, Zigzag: c.CPLayout == "zigzag", Outer: c.CPImpl != "all2all"}, {Name: "tp", Size: c.TP}} {
		if a.Size > 1 {
			m.Axes = append(m.Axes, a)
		}
	}
	if len(m.Axes) == 0 {
		return nil
	}
	return m
}

// BubbleTheory is the pipeline bubble fraction of REFERENCE.md for the
// plan's schedule: (p−1)/m, or (p−1)/(v·m) interleaved; for zero-bubble
// (ZB-H1, Qi et al. 2023) (p−1)/(3m), its (p−1)(T_F + T_B − T_W) idle time
// over m(T_F + T_B + T_W) of work with the three equal, as the simulation
// prices them (B and W each half a backward).
func (c *Config) BubbleTheory() float64 {
	p, m, v := float64(c.PP), float64(c.Microbatches), float64(max(c.VPP, 1))
	switch c.Schedule {
	case "interleaved":
		return (p - 1) / (v * m)
	case "zb":
		return (p - 1) / (3 * m)
	}
	return (p - 1) / m
}

// orQuoted is a flag's value as the user typed it: an empty one quoted,
// so that the message does not read as if the value were missing.
func orQuoted(v string) string {
	if v == "" {
		return `""`
	}
	return v
}
