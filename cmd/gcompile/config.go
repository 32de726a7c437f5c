package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"gcompile/lower"
)

// config is the command line, validated before any work starts.
type config struct {
	model string // MODEL.go or MODEL.gir

	devices, tp, pp, dp, ep, vpp, microbatches, zero   int
	schedule, recompute, precision, optimizer, backend string

	dump, metrics, trace, save, load, data string
	timeline, deviceMemory, offload        string
	compress                               string
	memLimit                               int64
	verify, run, helpModel, seqParallel    bool
	fuse                                   bool
	dpSync                                 string
	staleness, offloadPrefetch             int
	steps, batch, evalEvery, evalBatches   int
	seed                                   int64
	set                                    string
	maxDataMB                              int
	bucketMB                               float64

	lr, minLR, weightDecay, clip, beta1, beta2 float64
	lossScale                                  float64
	warmup                                     int
	decay                                      string

	explicit map[string]bool // flags the user gave
}

func parseArgs(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("gcompile", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: gcompile MODEL.go|MODEL.gir [flags]\n\n")
		fs.PrintDefaults()
	}
	fs.IntVar(&c.devices, "devices", 1, "number of devices")
	fs.IntVar(&c.tp, "tp", 0, "tensor-parallel degree (0: chosen by the planner)")
	fs.IntVar(&c.pp, "pp", 0, "pipeline-parallel degree (0: chosen by the planner)")
	fs.IntVar(&c.dp, "dp", 0, "data-parallel degree (0: the devices left over)")
	fs.IntVar(&c.ep, "ep", 0, "expert-parallel degree (0: chosen by the planner)")
	fs.IntVar(&c.vpp, "vpp", 0, "virtual pipeline stages per rank (0: 1)")
	fs.IntVar(&c.microbatches, "microbatches", 1, "microbatches per step")
	fs.StringVar(&c.dpSync, "dp-sync", "sync", "data-parallel synchronisation: sync (all-reduce) or async (bounded staleness)")
	fs.IntVar(&c.staleness, "staleness", 0, "with --dp-sync async: how many updates old a replica's weights may be")
	fs.BoolVar(&c.seqParallel, "sequence-parallel", false, "shard LayerNorm/residual activations on the sequence dim over tp (needs --tp > 1)")
	fs.StringVar(&c.schedule, "schedule", "", "pipeline schedule: gpipe|1f1b|interleaved|2bw|zb (needs --pp > 1)")
	fs.IntVar(&c.zero, "zero", 0, "ZeRO stage 0..3 (needs --dp > 1)")
	fs.Float64Var(&c.bucketMB, "bucket-mb", 25, "gradient bytes per data-parallel reduction bucket (MiB)")
	fs.StringVar(&c.recompute, "recompute", "none", "activation recompute: none|full|selective|every=K")
	fs.StringVar(&c.precision, "precision", "fp32", "fp32|fp16|bf16 (fp16/bf16: mixed precision with fp32 master weights)")
	fs.Float64Var(&c.lossScale, "loss-scale", 0, "static loss scale for --precision fp16|bf16 (0: dynamic for fp16, none for bf16)")
	fs.StringVar(&c.optimizer, "optimizer", "adamw", "adamw|sgd|adafactor|sm3")
	fs.StringVar(&c.backend, "backend", "cpu", "cpu|cuda")
	fs.StringVar(&c.dump, "dump", "", "write NN-<pass>.gir after each pass that changed the module, and index.html, to this folder")
	fs.BoolVar(&c.verify, "verify", false, "run the IR verifier after every pass")
	fs.BoolVar(&c.run, "run", false, "train after compiling")
	fs.IntVar(&c.steps, "steps", 30, "training steps with --run")
	fs.Int64Var(&c.seed, "seed", 1, "seed for weights and data order")
	fs.StringVar(&c.metrics, "metrics", "", "write metrics JSON to this file")
	fs.StringVar(&c.deviceMemory, "device-memory", "", "memory per device, e.g. 80GiB or 512MiB (default: unlimited on cpu); a plan that does not fit is a compile error")
	fs.StringVar(&c.offload, "offload", "", "keep state in host memory, copied to the device ahead of each use: optimizer (optimizer state), params (parameters), or both as optimizer,params")
	fs.IntVar(&c.offloadPrefetch, "offload-prefetch", lower.DefaultPrefetchLayers, "with --offload: copy a layer's offloaded buffers to the device this many layer blocks ahead of use (0: right before use)")
	fs.BoolVar(&c.fuse, "fuse", false, "merge groups of fp32 elementwise ops into one fused kernel each (cpu backend)")
	fs.StringVar(&c.compress, "compress-activations", "", "stash activations for the backward compressed: relu (lossless 1-bit ReLU masks), lowp (bf16), or relu,lowp")
	fs.StringVar(&c.timeline, "timeline", "", "draw the pipeline schedule (simulated, unit costs) as SVG to this file")
	fs.StringVar(&c.trace, "trace", "", "write Chrome trace events (first 3 steps) to this file")
	fs.StringVar(&c.save, "save", "", "save the trained weights as safetensors")
	fs.StringVar(&c.load, "load", "", "start from weights in a safetensors file")
	fs.IntVar(&c.batch, "batch", 8, "global batch in sequences")
	fs.StringVar(&c.data, "data", "", "training text: a file or folder (default: the Go standard library sources)")
	fs.IntVar(&c.maxDataMB, "max-data-mb", 16, "read at most this many MiB of training text")
	fs.StringVar(&c.set, "set", "", "model parameters key=value,… (see --help-model)")
	fs.BoolVar(&c.helpModel, "help-model", false, "list the model parameters MODEL.go reads, then exit")
	fs.Float64Var(&c.lr, "lr", 3e-3, "peak learning rate")
	fs.Float64Var(&c.minLR, "min-lr", 3e-4, "learning rate at the end of cosine decay")
	fs.IntVar(&c.warmup, "warmup", 10, "linear warm-up steps")
	fs.StringVar(&c.decay, "lr-decay", "cosine", "cosine|constant")
	fs.Float64Var(&c.weightDecay, "weight-decay", 0.1, "AdamW/SGD weight decay on matrices")
	fs.Float64Var(&c.clip, "clip", 1.0, "clip gradients by global norm (0: off)")
	fs.Float64Var(&c.beta1, "beta1", 0.9, "Adam β1")
	fs.Float64Var(&c.beta2, "beta2", 0.95, "Adam β2")
	fs.IntVar(&c.evalEvery, "eval-every", 0, "held-out evaluation every N steps (0: at the end only)")
	fs.IntVar(&c.evalBatches, "eval-batches", 8, "held-out batches per evaluation")

	// Go's flag package stops at the first positional argument; the model
	// path comes first, so parse around it.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	c.explicit = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.explicit[f.Name] = true })
	if len(positional) != 1 {
		fs.Usage()
		return nil, fmt.Errorf("want exactly one MODEL.go or MODEL.gir, got %d arguments", len(positional))
	}
	c.model = positional[0]
	return c, c.validate()
}

// errNotYet marks a valid request that this build cannot carry out yet.
var errNotYet = errors.New("not yet supported")

// validate rejects impossible or unsupported combinations, naming the rule.
func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	notYet := func(what, when string) { errs = append(errs, fmt.Errorf("%s: %w (%s)", what, errNotYet, when)) }

	isGo, isGir := strings.HasSuffix(c.model, ".go"), strings.HasSuffix(c.model, ".gir")
	if !isGo && !isGir {
		bad("%s: the model must be a .go file or a .gir dump", c.model)
	}
	if isGir {
		for _, f := range []string{"set", "batch", "help-model"} {
			if c.explicit[f] {
				bad("--%s applies to a model.go; a .gir file has its sizes fixed", f)
			}
		}
	}
	if c.devices < 1 {
		bad("--devices must be ≥ 1, got %d", c.devices)
	}
	for name, v := range map[string]int{"tp": c.tp, "pp": c.pp, "dp": c.dp, "ep": c.ep, "vpp": c.vpp} {
		if v < 0 {
			bad("--%s must be ≥ 0, got %d", name, v)
		}
	}
	// Unset degrees: tp, pp, ep default to 1 and dp takes the rest.
	tp, pp, ep, vpp := or1(c.tp), or1(c.pp), or1(c.ep), or1(c.vpp)
	dp := c.dp
	if dp == 0 && c.devices%(tp*pp*ep) == 0 {
		dp = c.devices / (tp * pp * ep)
	}
	if c.devices >= 1 && tp*pp*ep*max(dp, 1) != c.devices {
		bad("tp·pp·dp·ep = %d·%d·%d·%d = %d must equal --devices %d", tp, pp, max(dp, 1), ep, tp*pp*max(dp, 1)*ep, c.devices)
	}
	c.tp, c.pp, c.dp, c.ep, c.vpp = tp, pp, max(dp, 1), ep, vpp
	switch {
	case c.dpSync != "sync" && c.dpSync != "async":
		bad("--dp-sync %q: want sync or async", c.dpSync)
	case c.dpSync == "sync" && c.explicit["staleness"]:
		bad("--staleness applies to --dp-sync async")
	case c.dpSync == "async" && c.dp < 2:
		bad("--dp-sync async needs --dp > 1 (replicas to run asynchronously)")
	case c.dpSync == "async" && (c.tp > 1 || c.pp > 1 || c.ep > 1 || c.zero > 0):
		bad("--dp-sync async runs whole replicas around one optimizer: it does not combine with tp, pp, ep or ZeRO")
	case c.staleness < 0:
		bad("--staleness must be ≥ 0, got %d", c.staleness)
	}
	if c.seqParallel && c.tp == 1 {
		bad("--sequence-parallel needs --tp > 1 (it splits activations over the tensor-parallel ranks)")
	}
	if c.vpp > 1 && c.pp == 1 {
		bad("--vpp %d needs --pp > 1 (virtual stages interleave a pipeline)", c.vpp)
	}
	if c.schedule != "" {
		if !slices.Contains([]string{"gpipe", "1f1b", "interleaved", "2bw", "zb"}, c.schedule) {
			bad("--schedule %q: want gpipe, 1f1b, interleaved, 2bw or zb", c.schedule)
		} else if c.pp == 1 {
			bad("--schedule %s needs --pp > 1 (it orders pipeline stages)", c.schedule)
		}
	}
	if c.pp > 1 && c.schedule == "" {
		// Megatron-LM's defaults.
		c.schedule = "1f1b"
		if c.vpp > 1 {
			c.schedule = "interleaved"
		}
	}
	if c.vpp > 1 && c.schedule != "" && c.schedule != "interleaved" {
		bad("--vpp %d needs --schedule interleaved (the other schedules run one chunk per rank)", c.vpp)
	}
	if c.timeline != "" && c.pp == 1 {
		bad("--timeline draws a pipeline schedule; it needs --pp > 1")
	}
	if c.zero < 0 || c.zero > 3 {
		bad("--zero %d: want 0, 1, 2 or 3", c.zero)
	} else if c.zero > 0 && c.dp == 1 {
		bad("--zero %d needs --dp > 1 (ZeRO shards across data-parallel ranks)", c.zero)
	}
	if c.microbatches < 1 {
		bad("--microbatches must be ≥ 1, got %d", c.microbatches)
	} else if c.batch%(c.dp*c.microbatches) != 0 {
		bad("--batch %d must be divisible by dp·microbatches = %d", c.batch, c.dp*c.microbatches)
	}
	if c.batch < 1 || c.steps < 1 {
		bad("--batch and --steps must be ≥ 1")
	}
	if !slices.Contains([]string{"none", "full", "selective"}, c.recompute) && !strings.HasPrefix(c.recompute, "every=") {
		bad("--recompute %q: want none, full, selective or every=K", c.recompute)
	}
	if !slices.Contains([]string{"fp32", "fp16", "bf16"}, c.precision) {
		bad("--precision %q: want fp32, fp16 or bf16", c.precision)
	}
	if !slices.Contains([]string{"cpu", "cuda"}, c.backend) {
		bad("--backend %q: want cpu or cuda", c.backend)
	}
	if c.decay != "cosine" && c.decay != "constant" {
		bad("--lr-decay %q: want cosine or constant", c.decay)
	}
	if c.lr <= 0 || c.minLR < 0 || c.minLR > c.lr || c.warmup < 0 {
		bad("learning rate: want --lr > 0, 0 ≤ --min-lr ≤ --lr and --warmup ≥ 0")
	}
	if c.deviceMemory != "" {
		n, err := parseBytes(c.deviceMemory)
		if err != nil {
			bad("--device-memory %q: %v", c.deviceMemory, err)
		}
		c.memLimit = n
	}
	if c.bucketMB <= 0 {
		bad("--bucket-mb must be positive, got %g", c.bucketMB)
	}
	if c.maxDataMB < 1 {
		bad("--max-data-mb must be ≥ 1")
	}
	if c.lossScale < 0 {
		bad("--loss-scale must be positive (0: dynamic), got %g", c.lossScale)
	}
	if c.lossScale != 0 && c.precision == "fp32" {
		bad("--loss-scale applies to --precision fp16 or bf16")
	}
	if (c.trace != "" || c.save != "") && !c.run {
		bad("--trace and --save record a training run; add --run")
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// What this build cannot do yet, each said once and never ignored.
	if _, err := lowerOptions(c); err != nil {
		errs = append(errs, err)
	} else if c.offloadPrefetch < 0 {
		bad("--offload-prefetch %d: want a distance ≥ 0 in layer blocks", c.offloadPrefetch)
	} else if c.explicit["offload-prefetch"] && (c.offload == "" || c.offload == "none") {
		bad("--offload-prefetch applies to --offload")
	} else if c.offload != "" && c.offload != "none" && c.dpSync == "async" {
		notYet("--offload with --dp-sync async", "the asynchronous trainer's gradient and update programs are lowered without offload")
	}
	if c.compress != "" && c.compress != "none" {
		seen := map[string]bool{}
		for _, mode := range strings.Split(c.compress, ",") {
			if mode != "lowp" && mode != "relu" || seen[mode] {
				bad("--compress-activations %q: want lowp or relu, or both as relu,lowp", c.compress)
				break
			}
			seen[mode] = true
		}
	}
	if c.ep > 1 {
		notYet(fmt.Sprintf("ep=%d", c.ep), "expert parallelism comes with the mixture-of-experts layers")
	}
	if c.backend == "cuda" && c.fuse {
		notYet("--backend cuda with --fuse", "the CUDA backend does not compile the fused kernels into its program yet")
	}
	if c.backend == "cuda" && c.dpSync == "async" {
		notYet("--backend cuda with --dp-sync async", "the asynchronous trainer runs on the cpu backend")
	}
	return errors.Join(errs...)
}

func or1(n int) int {
	if n == 0 {
		return 1
	}
	return n
}

// parseBytes reads a size: a number with an optional unit (B, KB/KiB,
// MB/MiB, GB/GiB, TB/TiB; decimal units are powers of 1000).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	var x float64
	if _, err := fmt.Sscan(t, &x); err != nil || x <= 0 {
		return 0, fmt.Errorf("want a positive size like 80GiB, 512MiB or 1e9")
	}
	return int64(x * mult), nil
}
