package passes

import (
	"fmt"
	"slices"

	"gcompile/ir"
)

// Options configure the passes. The zero value is not valid; start from
// DefaultOptions.
type Options struct {
	// Verify runs the verifier after every pass.
	Verify bool
	// Disable names optional passes to skip.
	Disable []string
	// StopAfter ends the pipeline after the named pass ("" runs them all);
	// gradient tests stop after autodiff to read the gradients.
	StopAfter string
	// Interrupted, when set, is asked before each pass whether the
	// compile is to stop (a signal): its error ends the pipeline there,
	// where the caller otherwise heard of the signal only once every
	// pass had run (half a minute for a model of 2,000 layers).
	Interrupted func() error

	// Mesh is the device mesh (nil: one device). Axes named dp, tp, pp, ep.
	Mesh *ir.Mesh
	// Zero is the ZeRO stage 0..3 over the dp axis.
	Zero int
	// SequenceParallel splits LayerNorm and residual activations on the
	// sequence dim over tp (Korthikanti et al.): partial sums are
	// reduce-scattered instead of all-reduced, and gathered again before
	// column-parallel matmuls.
	SequenceParallel bool
	// CPImpl is how attention runs over a context-parallel (cp) axis:
	// "ring" (each rank keeps its sequence chunk and K/V chunks travel
	// around the ring inside the attention instruction) or "all2all"
	// (Ulysses: all_to_all from sequence- to head-split q/k/v, attention
	// on whole sequences, and back). "" is ring.
	CPImpl string
	// VPP is the number of model chunks per pipeline rank (interleaved
	// schedule); 0 or 1 means contiguous stages.
	VPP int
	// Recompute is "none", "full", "selective" or "every=K" (K layers per
	// checkpointed segment, or "every=sqrt").
	Recompute string
	// Compress is "none", "lowp" (bf16 stashes for the backward), "relu"
	// (lossless 1-bit ReLU masks) or both as "relu,lowp".
	Compress string
	// TwoBW applies PipeDream-2BW's weight update: gradients are taken at
	// the previous weight version, W(t+1) = W(t) − ν∇f(W(t−1)).
	TwoBW bool
	// DeferWeightGradients says the pipeline schedule makes a backward's
	// weight gradients in W blocks after its B (zero-bubble): recompute
	// then replays again in W what the weight gradients read.
	DeferWeightGradients bool
	// Microbatches is the number of microbatches per step (gradient
	// accumulation); 1 means none.
	Microbatches int
	// Fuse runs the fuse pass: groups of f32 elementwise ops become one
	// fused op each (--fuse).
	Fuse bool
	// BucketMB bounds the gradient bytes one data-parallel reduction
	// bucket holds, counted in fp32 (a bucket of 16-bit reductions holds
	// as many elements, in half the bytes).
	BucketMB float64
	// GradReduceDType is the format of the gradients' reductions over the
	// data axes: "fp32" (or "") or a 16-bit one, "bf16" or "fp16"
	// (--grad-reduce-dtype; the data-parallel pass narrows them).
	GradReduceDType string

	// Optimizer is "adamw", "sgd", "adafactor" or "sm3".
	Optimizer string
	// Adam hyper-parameters (Megatron-LM's GPT defaults).
	Beta1, Beta2, Eps float64
	// WeightDecay applies to matrices only (rank ≥ 2): biases, LayerNorm
	// parameters and other vectors are not decayed, as in GPT-2/Megatron.
	WeightDecay float64
	// Momentum for SGD.
	Momentum float64
	// ClipNorm clips gradients by their global L2 norm; 0 disables.
	ClipNorm float64

	// Precision is "fp32" (or "") for full precision, or "fp16"/"bf16" for
	// mixed precision (the mixed-precision pass): 16-bit copies of the
	// weights for forward and backward, fp32 master weights and optimizer.
	Precision string
	// LossScale is the static loss scale; 0 means dynamic (fp16) or none
	// (bf16). The pass only adds the loss_scale input; the runtime's
	// LossScaler decides the value each step.
	LossScale float64

	// Generate compiles one step of generation: a forward-only module
	// whose outputs are logits and whose states are key/value caches
	// (frontend.Generation). The passes that make the backward, the
	// optimizer, and what serves them (mixed precision's master weights,
	// recompute, compression, gradient buckets) do not run.
	Generate bool

	// notes collects the running pass's notes (Result.Note); Run gives
	// each pass a copy of the options with its own.
	notes *[]string
}

// notef records a note of the running pass for Result.Note. Outside Run
// (a pass function called directly) there is nowhere to put it, and it
// is dropped.
func (o *Options) notef(format string, args ...any) {
	if o.notes != nil {
		*o.notes = append(*o.notes, fmt.Sprintf(format, args...))
	}
}

// DefaultOptions are AdamW(β=(0.9,0.95), ε=1e-8, wd=0.1) with clipping at 1.0.
func DefaultOptions() *Options {
	return &Options{Microbatches: 1, BucketMB: 25, Optimizer: "adamw", Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Momentum: 0.9, ClipNorm: 1.0}
}

// Validate rejects options no pass could honour, naming the rule.
func (o *Options) Validate() error {
	for _, name := range o.Disable {
		i := slices.IndexFunc(passes[:], func(p Pass) bool { return p.Name == name })
		if i < 0 {
			return fmt.Errorf("cannot disable unknown pass %q", name)
		}
		if passes[i].Required {
			return fmt.Errorf("cannot disable pass %q: %w", name, ErrDisabledRequired)
		}
	}
	if o.StopAfter != "" && !slices.ContainsFunc(passes[:], func(p Pass) bool { return p.Name == o.StopAfter }) {
		return fmt.Errorf("cannot stop after unknown pass %q", o.StopAfter)
	}
	switch o.Optimizer {
	case "adamw", "sgd", "adafactor", "sm3":
	default:
		return fmt.Errorf("--optimizer %q: want adamw, sgd, adafactor or sm3", o.Optimizer)
	}
	if o.Beta1 < 0 || o.Beta1 >= 1 || o.Beta2 < 0 || o.Beta2 >= 1 {
		return fmt.Errorf("adam betas must lie in [0,1), got %g and %g", o.Beta1, o.Beta2)
	}
	if o.Microbatches < 1 {
		return fmt.Errorf("microbatches must be at least 1, got %d", o.Microbatches)
	}
	if o.BucketMB <= 0 {
		return fmt.Errorf("bucket size must be positive, got %g MiB", o.BucketMB)
	}
	if o.Zero < 0 || o.Zero > 3 {
		return fmt.Errorf("ZeRO stage %d: want 0, 1, 2 or 3", o.Zero)
	}
	switch o.Precision {
	case "", "fp32", "fp16", "bf16":
	default:
		return fmt.Errorf("precision %q: want fp32, fp16 or bf16", o.Precision)
	}
	if o.GradReduceDType != "" && !slices.Contains(GradReduceDTypes, o.GradReduceDType) {
		return fmt.Errorf("--grad-reduce-dtype %q: want one of %v", o.GradReduceDType, GradReduceDTypes)
	}
	if o.GradReduceDType != "" && o.GradReduceDType != "fp32" && slices.Contains(o.Disable, "data-parallel") {
		return fmt.Errorf("--grad-reduce-dtype %s: the data-parallel pass narrows the reductions, and it is disabled", o.GradReduceDType)
	}
	if o.LossScale < 0 {
		return fmt.Errorf("loss scale must be positive (or 0 for dynamic), got %g", o.LossScale)
	}
	if o.Eps <= 0 || o.WeightDecay < 0 || o.ClipNorm < 0 || o.Momentum < 0 {
		return fmt.Errorf("eps must be positive and weight decay, clip norm and momentum non-negative")
	}
	return nil
}

func verifyInput(m *ir.Module, o *Options) error {
	if o.Generate {
		if len(m.Outputs) == 0 {
			return fmt.Errorf("module %q has no output: a generation step outputs its logits", m.Name)
		}
	} else if m.Output(ir.OutputLoss) == nil {
		return fmt.Errorf("module %q has no %q output", m.Name, ir.OutputLoss)
	}
	return ir.Verify(m, "")
}
