package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/data"
	"gcompile/data/sample"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/planner"
	"gcompile/runtime"
)

// config is the command line, validated before any work starts: the
// compilation (model and plan) and what to do with it.
type config struct {
	compile.Config

	backend                                string
	dump, metrics, trace, save, load, data string
	timeline, deviceMemory                 string
	run, helpModel                         bool
	// evalOnly is gcompile eval: the held-out loss of --load's or
	// --resume's weights, no training (eval.go).
	evalOnly bool
	// stopStatus is the exit status of a run a signal stopped before its
	// last step (exitStatus); 0 otherwise.
	stopStatus                    int
	steps, evalEvery, evalBatches int
	logEvery                      int // --log-every
	seed                          int64
	maxDataMB                     int

	// loadIgnore are glob patterns of tensors --load skips on purpose.
	loadIgnore string

	// Checkpoints of the whole training state (see checkpoint.SaveState).
	ckptDir, resume                string
	ckptEvery, keepLast, stopAfter int
	stopAfterTime                  time.Duration // --stop-after-time

	lr, minLR        float64
	initialLossScale float64
	// --loss-scale-window, --hysteresis and --min-loss-scale: the dynamic
	// loss scaler's growth interval, overflows before a backoff, and floor.
	lossScaleWindow, hysteresis int
	minLossScale                float64
	warmup                      int
	decay                       string
	decaySteps                  int    // --lr-decay-steps (0: --steps)
	wsdDecaySteps               int    // --lr-wsd-decay-steps
	wsdStyle                    string // --lr-wsd-decay-style

	// The job of several processes this one belongs to: from the
	// launcher's environment, overridden by these flags where given.
	rank, worldSize, localRank, localWorldSize int
	masterAddr, token, logDir                  string
	advertiseAddr                              string
	masterPort                                 int
	timeout, rdzvTimeout                       time.Duration
	packGPU                                    bool
	// launchProcs is how many processes gcompile launch will start for
	// this command line (0: not a launcher's check).
	launchProcs int

	// report is --report's page (report.go); started when compiling
	// began, for the closing summary's wall time (summary.go).
	report  string
	started time.Time

	// hardware is --hardware (a preset or a JSON file), hw what it
	// names (an explicit cpu is calibrated once, when first used:
	// calibrated); plan is --plan, planTop --plan-top; planned is set once
	// the planner has chosen the degrees (planner.go); planTrace is
	// --plan-trace, the predicted step as a Chrome trace (plan.go);
	// refineTrace and saveHardware are --refine-trace and --save-hardware
	// (plan.go: refineHardware).
	hardware     string
	refineTrace  string
	saveHardware string
	// calibrate is --calibrate: measured step times of whole plans;
	// measured is the file as read, before the model is built, so that
	// a bad file is named before any work.
	calibrate string
	measured  []planner.MeasuredPlan
	// traced is --refine-trace's file as read, before the model is built.
	traced     []runtime.TraceEvent
	hw         *cost.Hardware
	calibrated bool
	plan       bool
	planTop    int
	planned    bool
	planTrace  string
	// plannerMetrics is the table --plan --run chose from, for the run's
	// metrics.
	plannerMetrics *runtime.PlannerMetrics

	// corpus is the training text, read with --run before the compile
	// (checkPaths) so that a bad --data is refused before any work; tokens
	// are the token datasets instead, opened and checked then (tokens.go).
	corpus *data.Corpus
	tokens *tokenData
	// vocabPadded: the model's vocab came from the data (applyVocab),
	// padded for c.TP.
	vocabPadded bool
	// textID is the corpus's identity once computed (dataIdentity): a
	// digest of up to --max-data-mb, taken once a run.
	textID string

	// The token-dataset flags: --tokenizer (and GPT-2's --merges),
	// --split, --data-cache-dir, --make-vocab-size-divisible-by.
	tokenizer, merges, split, dataCacheDir string
	tokenizerNote                          string // eval: the run's tokenizer taken (defaultTokenizer)
	vocabDivisible                         int
	// vocabTables are the params --save trims to the data's classes
	// (vocabTables), found once the model is compiled.
	vocabTables map[string]int
	// exportConfig is the model's ir.Module.ExportConfig, which its
	// checkpoints keep for export.
	exportConfig string

	explicit map[string]bool // flags the user gave
	// settings are the flags that make the run what it is, as
	// "name=value" (runSettings): the processes of a job compare them.
	settings []string
}

// perProcessFlags may differ between the processes of one job: where a
// process sits and meets the others, what its machine has
// (--device-memory only checks that the plan fits), how long it waits,
// where it writes (only rank 0 writes the job's outputs), and where it
// finds files, whose paths may differ between machines while their
// contents (checked by other means) do not.
var perProcessFlags = map[string]bool{
	"rank": true, "world-size": true, "local-rank": true, "local-world-size": true,
	"master-addr": true, "master-port": true, "advertise-addr": true, "token": true, "timeout": true,
	"rdzv-timeout": true, "log-dir": true, "model-timeout": true, "device-memory": true,
	"dump": true, "metrics": true, "report": true, "trace": true, "save": true,
	"timeline": true, "plan-trace": true, "save-hardware": true,
	"data": true, "tokenizer": true, "merges": true, "data-cache-dir": true,
	"load": true, "resume": true, "checkpoint-dir": true, "hardware": true,
	"refine-trace": true,
}

// setFlag is --set: a second --set joins its list to the first, a key
// it gives again taking its value (as a flag given twice does), rather
// than replacing the whole list; a key twice in one list stays an error
// of the model's parameters.
type setFlag struct{ p *string }

func (f setFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}

func (f setFlag) Set(v string) error {
	if *f.p == "" || v == "" {
		*f.p += v
		return nil
	}
	given := map[string]bool{}
	for _, kv := range strings.Split(v, ",") {
		k, _, _ := strings.Cut(kv, "=")
		given[strings.TrimSpace(k)] = true
	}
	var kept []string
	for _, kv := range strings.Split(*f.p, ",") {
		if k, _, _ := strings.Cut(kv, "="); !given[strings.TrimSpace(k)] {
			kept = append(kept, kv)
		}
	}
	*f.p = strings.Join(append(kept, v), ",")
	return nil
}

// unusedByOptimizer are, per optimizer, the flags it does not read.
var unusedByOptimizer = map[string][]struct{ flag, why string }{
	"sgd": {{"beta1", "SGD's momentum is 0.9"}, {"beta2", "SGD keeps no second moment"}, {"adam-eps", "SGD divides by no second moment"}},
	"sm3": {{"beta1", "SM3 as built keeps no momentum"}, {"beta2", "SM3's accumulators are sums, not averages"}, {"adam-eps", "SM3 as built has no ε"},
		{"weight-decay", "SM3 as built applies none"}},
	"adafactor": {{"lr", "Adafactor's step is relative: min(1e-2, 1/√t) times the param's RMS"}, {"min-lr", "Adafactor takes no learning rate"},
		{"warmup", "Adafactor takes no learning rate"}, {"lr-decay", "Adafactor takes no learning rate"},
		{"lr-decay-steps", "Adafactor takes no learning rate"}, {"lr-wsd-decay-steps", "Adafactor takes no learning rate"},
		{"lr-wsd-decay-style", "Adafactor takes no learning rate"},
		{"beta1", "Adafactor as built has no first moment"}, {"beta2", "Adafactor's decay is 1 − t^(−0.8)"}, {"adam-eps", "Adafactor's ε₁ and ε₂ are its own, 1e-30 and 1e-3"},
		{"weight-decay", "Adafactor as built applies none"}},
}

// ignoredWithoutRun names the flags given that only shape the training
// loop, when there is none (no --run): a note says so, since they would
// otherwise be dropped without a word ("" when none is).
func (c *config) ignoredWithoutRun() string {
	if c.run || c.evalOnly {
		return ""
	}
	var loop []string
	unused := []string{"steps", "lr", "min-lr", "warmup", "lr-decay", "lr-decay-steps", "lr-wsd-decay-steps", "lr-wsd-decay-style", "eval-every", "log-every", "eval-batches", "split", "max-data-mb"}
	if !isTokenData(c.data) {
		// A token dataset is opened without --run too (its vocabulary
		// sizes the model, its largest id may be cached); text is read
		// only to train.
		unused = append(unused, "data", "tokenizer", "merges", "data-cache-dir")
	}
	for _, f := range unused {
		if c.explicit[f] {
			loop = append(loop, "--"+f)
		}
	}
	if len(loop) == 0 {
		return ""
	}
	return fmt.Sprintf("note: %s shape a training run, and without --run nothing trains: they are not used (add --run to train)", strings.Join(loop, ", "))
}

// inertFlags are notes on flags given that this run has nothing to act
// on (alone: a run of one process), the training loop's without --run
// among them: said, not dropped without a word.
func (c *config) inertFlags(alone bool) []string {
	var notes []string
	if note := c.ignoredWithoutRun(); note != "" {
		notes = append(notes, note)
	}
	if c.FilledMicrobatches && !c.planning() {
		// Not a flag's, but a default the user did not choose: said.
		notes = append(notes, fmt.Sprintf("note: --pp %d splits each step's batch into %d microbatches, the fewest its %s schedule takes (--microbatches pins another count)", c.PP, c.Microbatches, c.Schedule))
	}
	if c.run && c.data != "" && !strings.ContainsAny(strings.TrimSpace(c.data), " \t\n") {
		// --data names a text file or folder and a dataset's files at once.
		if _, err := os.Stat(c.data); err == nil && isTokenData(c.data) && !strings.HasSuffix(c.data, ".bin") && !strings.HasSuffix(c.data, ".idx") {
			notes = append(notes, fmt.Sprintf("note: --data %s names a text file or folder and the token dataset %s.bin and .idx: the dataset is read (rename one to train on the other)", c.data, c.data))
		}
		if strings.HasSuffix(strings.ToLower(c.data), ".jsonl") && !isTokenData(c.data) {
			notes = append(notes, fmt.Sprintf("note: --data %s is read as text, one byte per token, its JSON syntax included; gcompile data prepare --tokenizer TOKENIZER --output-prefix PREFIX %s makes a token dataset of its documents' text", c.data, c.data))
		}
	}
	if c.run && c.explicit["max-data-mb"] && isTokenData(c.data) {
		notes = append(notes, "note: --max-data-mb bounds text read into memory; a token dataset is memory-mapped, never read whole: it is not used")
	}
	if c.run && c.explicit["warmup"] && c.warmup >= c.steps {
		notes = append(notes, fmt.Sprintf("note: --warmup %d is not shorter than --steps %d: the run ends before the learning rate reaches --lr (its last step at %.3g)", c.warmup, c.steps, c.lr*float64(c.steps)/float64(max(c.warmup, 1))))
	}
	if c.explicit["hardware"] && !c.planning() && c.planTrace == "" {
		notes = append(notes, "note: --hardware describes the devices the planner prices plans on (--plan, --plan-trace, or --devices > 1 with no axis given); this run prices none, so it is not used")
	}
	var reduce []string
	for _, f := range []string{"bucket-mb", "overlap-grad-reduce", "grad-reduce-dtype"} {
		if c.explicit[f] {
			reduce = append(reduce, "--"+f)
		}
	}
	shape := "shape"
	if len(reduce) == 1 {
		shape = "shapes"
	}
	switch {
	case len(reduce) == 0:
	case c.Devices == 1:
		notes = append(notes, fmt.Sprintf("note: %s %s the data-parallel gradient reduction, which one device does not have: not used", strings.Join(reduce, ", "), shape))
	case c.DPSync == "async":
		notes = append(notes, fmt.Sprintf("note: %s %s the synchronous gradient reduction; asynchronous replicas send theirs to the parameter server: not used", strings.Join(reduce, ", "), shape))
	case !c.planning() && c.DP*max(c.EP, 1)*max(c.CP, 1) == 1:
		notes = append(notes, fmt.Sprintf("note: %s %s the data-parallel gradient reduction, and with dp·ep·cp = 1 (tp·pp = %d take the devices) there is none: not used", strings.Join(reduce, ", "), shape, c.Devices))
	}
	if c.logDir != "" && alone {
		notes = append(notes, "note: --log-dir holds the logs of the processes of a job (gcompile launch, torchrun, srun); this run is one process, whose log is this terminal: not used")
	}
	if alone {
		var meet []string
		for _, f := range []string{"master-addr", "master-port", "advertise-addr", "token", "rdzv-timeout"} {
			if c.explicit[f] {
				meet = append(meet, "--"+f)
			}
		}
		if len(meet) > 0 {
			verb := "say"
			if len(meet) == 1 {
				verb = "says"
			}
			notes = append(notes, fmt.Sprintf("note: %s %s how the processes of a job meet; this run is one process: not used", strings.Join(meet, ", "), verb))
		}
	}
	if c.run && c.explicit["eval-every"] && c.evalBatches == -1 {
		notes = append(notes, "note: --eval-every has no evaluation to space out with --eval-batches -1: not used")
	}
	return notes
}

// pathFlags are the flags whose value names a file or folder (or a
// hardware description), which an empty value cannot.
var pathFlags = map[string]bool{
	"hardware": true, "calibrate": true, "save-hardware": true, "refine-trace": true,
	"metrics": true, "trace": true, "save": true, "load": true, "report": true, "timeline": true,
	"plan-trace": true, "dump": true, "tokenizer": true, "merges": true, "resume": true,
	"checkpoint-dir": true, "data-cache-dir": true, "log-dir": true, "data": true,
}

// runSettings are the values of every flag that makes the run what it is
// (all but perProcessFlags), given or by default, in name order.
func runSettings(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if !perProcessFlags[f.Name] {
			out = append(out, f.Name+"="+f.Value.String())
		}
	})
	return out
}

func parseArgs(args []string) (*config, error) { return parseArgsWith(args, "", nil) }

// evalRefuses are the flags gcompile eval refuses, by why: each would
// be accepted and change nothing, since eval runs the forward of weights
// it is given.
var evalRefuses = []struct {
	why   string
	flags []string
}{
	{"belongs to training; eval only measures the held-out loss", []string{"save", "checkpoint-dir", "trace", "plan", "steps", "stop-after", "stop-after-time", "dp-sync", "eval-every", "log-every", "run"}},
	{"records a training run; eval prints the held-out loss and writes no file", []string{"metrics", "report", "timeline"}},
	{"changes only training (the update, the backward or the run's files); eval runs the forward of the weights given, so leave it out", []string{
		"lr", "min-lr", "warmup", "lr-decay", "lr-decay-steps", "lr-wsd-decay-steps", "lr-wsd-decay-style", "weight-decay", "clip", "beta1", "beta2", "adam-eps", "optimizer",
		"loss-scale", "initial-loss-scale", "loss-scale-window", "hysteresis", "min-loss-scale", "staleness", "bucket-mb", "overlap-grad-reduce", "grad-reduce-dtype", "recompute", "compress-activations",
		"checkpoint-every", "keep-last", "seed", "plan-top", "plan-trace", "refine-trace", "save-hardware", "calibrate"}},
	{"describes the devices the planner prices plans on; eval prices none (its plan is --devices and the axes), so leave it out", []string{"hardware"}},
}

// evalRefused says whether gcompile eval refuses flag name.
func evalRefused(name string) bool {
	for _, g := range evalRefuses {
		if slices.Contains(g.flags, name) {
			return true
		}
	}
	return false
}

// parseArgsWith is parseArgs for the subcommand sub ("" for none) that
// takes gcompile's flags (eval), with mode applied before the command
// line is validated: what the subcommand does with them.
// placeOnly is a config of only the flags that place this process in a
// job (--rank, --world-size, --local-rank, --local-world-size,
// --master-addr, --master-port, --token), read from a command line that
// did not parse as a whole, or nil when it gives none: a process given a
// flag its build lacks (an older binary on one machine) still tells the
// job why it stops, where rank 0 had waited out --rdzv-timeout and then
// blamed it for never joining.
func placeOnly(args []string) *config {
	c := &config{explicit: map[string]bool{}, rank: -1, localRank: -1}
	ints := map[string]*int{"rank": &c.rank, "world-size": &c.worldSize, "local-rank": &c.localRank, "local-world-size": &c.localWorldSize, "master-port": &c.masterPort}
	strs := map[string]*string{"master-addr": &c.masterAddr, "token": &c.token}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if ints[name] == nil && strs[name] == nil {
			continue
		}
		if !hasVal {
			if i+1 == len(args) {
				break
			}
			i++
			val = args[i]
		}
		if p := ints[name]; p != nil {
			n, err := strconv.Atoi(val)
			if err != nil {
				continue
			}
			*p = n
		} else {
			*strs[name] = val
		}
		c.explicit[name] = true
	}
	if len(c.explicit) == 0 {
		return nil
	}
	return c
}

func parseArgsWith(args []string, sub string, mode func(*config)) (*config, error) {
	c := &config{}
	name := strings.TrimSpace("gcompile " + sub)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The usage goes where parsePositional points the output: stdout for
	// -h (asked for, exit 0), nowhere for a mistake (one line says it).
	fs.Usage = func() {
		w := tabwriter.NewWriter(fs.Output(), 0, 4, 2, ' ', 0)
		if sub != "" {
			for _, sc := range subcommandTable() {
				if sc.name == sub {
					fmt.Fprintf(w, "usage: gcompile %s %s\n%s.\n\nflags (training's that it uses; those that only train or record a run are refused):\n", sc.name, sc.args, strings.TrimSuffix(sc.doc, " (see gcompile "+sc.name+" -h)"))
				}
			}
			w.Flush()
			// Only the flags eval takes, and --eval-batches as eval reads it.
			shown := flag.NewFlagSet(name, flag.ContinueOnError)
			shown.SetOutput(fs.Output())
			fs.VisitAll(func(f *flag.Flag) {
				if sub == "eval" && evalRefused(f.Name) {
					return
				}
				usage := f.Usage
				if u, ok := evalUsage[f.Name]; ok && sub == "eval" {
					usage = u
				}
				shown.Var(f.Value, f.Name, usage)
				shown.Lookup(f.Name).DefValue = f.DefValue // not the value given before -h
			})
			shown.PrintDefaults()
			return
		}
		fmt.Fprintf(w, "usage: gcompile MODEL.go|MODEL.gir [flags]\n")
		for _, sc := range subcommandTable() {
			fmt.Fprintf(w, "       gcompile %s %s\n", sc.name, sc.args)
		}
		fmt.Fprintf(w, "\ncommands:\n")
		for _, sc := range subcommandTable() {
			fmt.Fprintf(w, "  %s\t%s\n", sc.name, sc.doc)
		}
		fmt.Fprintf(w, "\nflags of gcompile MODEL.go|MODEL.gir (and of the processes gcompile launch starts):\n")
		w.Flush()
		fs.PrintDefaults()
	}
	fs.IntVar(&c.Devices, "devices", 1, "number of devices in the whole job (all processes together)")
	fs.IntVar(&c.TP, "tp", 0, "tensor-parallel degree (0: 1, or the planner's choice when --devices > 1 and no axis is given)")
	fs.IntVar(&c.PP, "pp", 0, "pipeline-parallel degree (0: 1, or the planner's choice when --devices > 1 and no axis is given)")
	fs.IntVar(&c.DP, "dp", 0, "data-parallel degree (0: the devices left over)")
	fs.IntVar(&c.EP, "ep", 0, "expert-parallel degree: mixture-of-experts weights split by expert, tokens over dp×ep (0: 1, or chosen by the planner for a model with experts)")
	fs.IntVar(&c.CP, "cp", 0, "context-parallel degree: every activation's sequence split over cp devices, attention included (0: 1)")
	fs.StringVar(&c.CPImpl, "cp-impl", "ring", "attention over the context-parallel ranks: ring (K/V passed around, merged by log-sum-exp) or all2all (Ulysses: sequence exchanged for heads; cp must divide the heads and k/v heads)")
	fs.StringVar(&c.CPLayout, "cp-layout", "", "how the ring splits the sequence: zigzag (rank i holds chunks i and 2·cp−1−i of 2·cp, the same share of causal work on every rank) or contiguous (\"\": zigzag for the ring, contiguous for all2all)")
	fs.IntVar(&c.VPP, "vpp", 0, "virtual pipeline stages per rank (0: 1)")
	fs.IntVar(&c.Microbatches, "microbatches", 1, "microbatches per step and data-parallel rank (a pipeline left without it gets the fewest its schedule takes, and a note says so)")
	fs.IntVar(&c.MicroBatchSize, "micro-batch-size", 0, "sequences per microbatch on each data-parallel replica, as Megatron-LM's --micro-batch-size: --microbatches follows as batch/(dp·ep·size) (0: from --microbatches)")
	fs.StringVar(&c.DPSync, "dp-sync", "sync", "data-parallel synchronisation: sync (all-reduce) or async (bounded staleness)")
	fs.IntVar(&c.Staleness, "staleness", 0, "with --dp-sync async: how many updates old a replica's weights may be")
	fs.BoolVar(&c.SequenceParallel, "sequence-parallel", false, "shard LayerNorm/residual activations on the sequence dim over tp (needs --tp > 1)")
	fs.StringVar(&c.Schedule, "schedule", "", "pipeline schedule: gpipe|1f1b|interleaved|2bw|zb (needs --pp > 1; 2bw is PipeDream-2BW's one-step-stale update on 1F1B's order, flushed each step, so 1F1B's bubble)")
	fs.IntVar(&c.Zero, "zero", 0, "ZeRO stage 0..3 (needs --dp > 1; with one microbatch stages 1 and 2 compile alike: each gradient bucket is reduce-scattered as the backward makes it)")
	fs.Float64Var(&c.BucketMB, "bucket-mb", 25, "gradient bytes per data-parallel reduction bucket (MiB)")
	fs.StringVar(&c.GradReduceDType, "grad-reduce-dtype", "fp32", "the format the gradients are reduced in over dp, ep and cp: fp32 (Megatron-LM's main_grad; the sum is the one device's), or bf16 or fp16, half the bytes, each add rounded as NCCL's 16-bit reductions are (Megatron-LM's --grad-reduce-in-bf16, DeepSpeed's communication_data_type)")
	fs.Var(negated{&c.SerialGradReduce}, "overlap-grad-reduce", "reduce data-parallel gradient buckets beside the backward, on a stream of their own (CUDA; the CPU backend reduces in order), as Megatron-LM's --overlap-grad-reduce; =false reduces them in program order, as frameworks without overlap do (default true)")
	fs.StringVar(&c.Recompute, "recompute", "none", "activation recompute: none|full|selective|every=K (segments of K layers)|block=N (the first N layers of each pipeline chunk, as Megatron-LM's --recompute-method block)")
	fs.StringVar(&c.Precision, "precision", "fp32", "fp32|fp16|bf16 (fp16/bf16: mixed precision with fp32 master weights)")
	fs.Float64Var(&c.LossScale, "loss-scale", 0, "static loss scale for --precision fp16|bf16 (0: dynamic for fp16, none for bf16)")
	fs.Float64Var(&c.initialLossScale, "initial-loss-scale", 65536, "with --precision fp16 and dynamic loss scaling: the scale to start from (PyTorch's GradScaler starts at 2^16, Megatron-LM at 2^32)")
	fs.IntVar(&c.lossScaleWindow, "loss-scale-window", 2000, "with --precision fp16 and dynamic loss scaling: clean steps in a row before the scale doubles (PyTorch's growth_interval, 2000; Megatron-LM's --loss-scale-window, 1000)")
	fs.IntVar(&c.hysteresis, "hysteresis", 1, "with --precision fp16 and dynamic loss scaling: overflowed steps (each skipped) since the scale last grew before it halves (1: at every one, as PyTorch's GradScaler; Megatron-LM's default is 2)")
	fs.Float64Var(&c.minLossScale, "min-loss-scale", 0, "with --precision fp16 and dynamic loss scaling: the least the scale halves to (0: none, as PyTorch's; Megatron-LM's default is 1)")
	fs.StringVar(&c.Optimizer, "optimizer", "adamw", "adamw|sgd|adafactor|sm3")
	fs.StringVar(&c.backend, "backend", "cpu", "cpu|cuda")
	fs.StringVar(&c.dump, "dump", "", "write NN-<pass>.gir after each pass that changed the module, and index.html, to this folder")
	fs.BoolVar(&c.Verify, "verify", false, "run the IR verifier after every pass")
	fs.BoolVar(&c.run, "run", false, "train after compiling")
	fs.IntVar(&c.steps, "steps", 30, "training steps with --run")
	fs.Int64Var(&c.seed, "seed", 1, "seed for weights and data order")
	fs.StringVar(&c.metrics, "metrics", "", "write metrics JSON to this file")
	fs.StringVar(&c.deviceMemory, "device-memory", "", "memory per device, e.g. 80GiB or 512MiB (default: unlimited on cpu); a plan that does not fit is a compile error")
	fs.StringVar(&c.Offload, "offload", "", "keep state in host memory, copied to the device ahead of each use: optimizer (optimizer state), params (parameters), both as optimizer,params, or none (the default; with --plan, pins the axis)")
	fs.IntVar(&c.OffloadPrefetch, "offload-prefetch", lower.DefaultPrefetchLayers, "with --offload: copy a layer's offloaded buffers to the device this many layer blocks ahead of use (0: right before use)")
	fs.BoolVar(&c.Fuse, "fuse", false, "merge groups of fp32 elementwise ops into one fused kernel each, on either backend (cpu: one Go closure; cuda: one CUDA kernel compiled with NVRTC)")
	fs.StringVar(&c.Compress, "compress-activations", "", "stash activations for the backward compressed: relu (lossless 1-bit ReLU masks), lowp (bf16), or relu,lowp")
	fs.StringVar(&c.timeline, "timeline", "", "draw the pipeline schedule (simulated, unit costs) as SVG to this file")
	fs.StringVar(&c.report, "report", "", "write one self-contained HTML page of the run (loss and speed curves, memory per device, pipeline schedule, pass times) to FILE.html; without --run, of the compiled plan")
	fs.StringVar(&c.trace, "trace", "", "write Chrome trace events (first 3 steps) to this file")
	fs.StringVar(&c.save, "save", "", "save the trained weights as safetensors")
	fs.StringVar(&c.load, "load", "", "start from weights in a safetensors file, a Hugging Face model.safetensors.index.json, or a folder holding either (as export writes it)")
	fs.StringVar(&c.loadIgnore, "load-ignore", "", "with --load: tensors of the file that are no param of the model and are skipped on purpose, as comma-separated glob patterns (e.g. 'lm_head.*,*.rotary_emb.inv_freq')")
	fs.StringVar(&c.ckptDir, "checkpoint-dir", "", "save the whole training state (params, optimizer state, step, loss scale) as sharded checkpoints DIR/step-N, at the end, every --checkpoint-every steps and on SIGTERM/SIGINT/SIGHUP")
	fs.IntVar(&c.ckptEvery, "checkpoint-every", 0, "with --checkpoint-dir: also save every N steps (0: only at the end and when stopped)")
	fs.IntVar(&c.keepLast, "keep-last", 0, "with --checkpoint-dir: keep only the newest K checkpoints (0: all)")
	fs.IntVar(&c.stopAfter, "stop-after", 0, "end the run after this step as a preemption would (with a checkpoint under --checkpoint-dir); the schedule is still --steps' (0: run to --steps)")
	fs.DurationVar(&c.stopAfterTime, "stop-after-time", 0, "end the run as --stop-after does (with a checkpoint under --checkpoint-dir) at the first step that ends this long after the process started, a duration such as 3h50m, as Megatron-LM's --exit-duration-in-mins: within a job's time limit, leaving the save its time (0: no limit)")
	fs.StringVar(&c.resume, "resume", "", "continue training from a checkpoint: a --checkpoint-dir (its latest complete checkpoint) or one step-N folder in it; any plan, same model, batch, optimizer and precision")
	fs.IntVar(&c.Batch, "batch", 8, "global batch in sequences")
	fs.StringVar(&c.hardware, "hardware", "", "the devices the planner and cost model assume: "+strings.Join(cost.Presets(), ", ")+", or a JSON file (see docs/architecture.md), either followed by :key=value,… to set figures by their JSON keys (a100-80g:inter_node_gbps=12.5); cpu measures this machine. Without --plan it prices the plan the planner picks when --devices > 1 and no axis (--tp, --pp, --dp, --ep, --cp) is given")
	fs.BoolVar(&c.plan, "plan", false, "print the planner's best plans for --devices, --batch and --hardware as a table, and --metrics as JSON; axes given as flags stay fixed (without --hardware: the cpu preset's figures, uncalibrated; the GPU found with --backend cuda)")
	fs.IntVar(&c.planTop, "plan-top", 5, "with --plan: how many plans to report; the search compiles up to three times as many of those the estimate ranks best (more when none of those fits the memory), so a larger number may find a faster plan than a smaller one")
	fs.StringVar(&c.planTrace, "plan-trace", "", "write the cost model's predicted step of the compiled plan (with --plan, the planner's best) as Chrome trace events to FILE.json, in --trace's format, for --hardware (as --plan's default without it)")
	fs.StringVar(&c.refineTrace, "refine-trace", "", "with --plan and --hardware: refine the preset's efficiencies, launch and link figures from FILE.json, a --trace of a run of this plan (every plan axis as it ran), and plan with the refined preset")
	fs.StringVar(&c.saveHardware, "save-hardware", "", "with --refine-trace or --calibrate: write the refined preset to FILE.json, which --hardware FILE.json reads")
	fs.StringVar(&c.calibrate, "calibrate", "", "with --plan (or --devices alone): fit the hardware's GEMM efficiency, links and fixed costs to the measured step times of the plans in FILE.json (a list of --plan --metrics rows, each with step_ms; or a run's --metrics), print what was fitted and the leave-one-out error, and plan with the result")
	fs.StringVar(&c.data, "data", "", "training data: a text file or folder, one byte per token (default: the Go standard library sources); or a token dataset PREFIX (PREFIX.bin/.idx, Megatron's format, from gcompile data prepare); or a blend \"0.3 PREFIX_A 0.7 PREFIX_B\"")
	fs.IntVar(&c.maxDataMB, "max-data-mb", 16, "read at most this many MiB of training text (a token dataset is memory-mapped, never read whole)")
	fs.StringVar(&c.tokenizer, "tokenizer", "", "with a token dataset: the Hugging Face tokenizer.json (or its folder, or GPT-2's vocab.json with --merges) the data was prepared with; the model's vocab follows it")
	fs.StringVar(&c.merges, "merges", "", "with --tokenizer vocab.json: GPT-2's merges.txt")
	fs.StringVar(&c.split, "split", "98,2", "with a token dataset: training and held-out shares of its documents, as Megatron's --split (a third share, test, is not used)")
	fs.StringVar(&c.dataCacheDir, "data-cache-dir", "", "with a token dataset: where its sample index is cached (default: gcompile-index beside the data, or the user cache folder when that is not writable)")
	fs.IntVar(&c.vocabDivisible, "make-vocab-size-divisible-by", 128, "with a token dataset: pad the model's vocab (from the tokenizer or the data) up to a multiple of this times --tp, as Megatron-LM does")
	fs.Var(setFlag{&c.Set}, "set", "model parameters key=value,… (see --help-model); a second --set adds to the first, a key given again taking its new value")
	fs.BoolVar(&c.helpModel, "help-model", false, "list the model parameters MODEL.go reads, then exit")
	modelTimeoutFlag(fs, &c.ModelTimeout)
	fs.Float64Var(&c.lr, "lr", 3e-3, "peak learning rate")
	fs.Float64Var(&c.minLR, "min-lr", 3e-4, "learning rate at the end of the decay (inverse-square-root: its floor)")
	fs.IntVar(&c.warmup, "warmup", 10, "linear warm-up steps")
	fs.StringVar(&c.decay, "lr-decay", "cosine", "the decay after the warm-up, as Megatron-LM's --lr-decay-style (whose default is linear): "+strings.Join(runtime.DecayStyles, "|")+
		" (wsd: warm-up, stable at --lr, then the last --lr-wsd-decay-steps down to --min-lr)")
	fs.IntVar(&c.decaySteps, "lr-decay-steps", 0, "the step the decay reaches --min-lr at, as Megatron-LM's --lr-decay-iters; --min-lr after it (0: --steps)")
	fs.IntVar(&c.wsdDecaySteps, "lr-wsd-decay-steps", 0, "with --lr-decay wsd: the steps at the end of the decay that anneal from --lr to --min-lr")
	fs.StringVar(&c.wsdStyle, "lr-wsd-decay-style", "exponential", "with --lr-decay wsd: the annealing's shape, "+strings.Join(runtime.WSDStyles, "|"))
	fs.Float64Var(&c.WeightDecay, "weight-decay", 0.1, "AdamW/SGD weight decay on matrices (the GPT-3 recipe's; Megatron-LM's default is 0.01)")
	fs.Float64Var(&c.Clip, "clip", 1.0, "clip gradients by global norm (0: off)")
	fs.Float64Var(&c.Beta1, "beta1", 0.9, "Adam β1")
	fs.Float64Var(&c.Beta2, "beta2", 0.95, "Adam β2 (the GPT-3 recipe's; Megatron-LM's default is 0.999)")
	fs.Float64Var(&c.AdamEps, "adam-eps", 1e-8, "Adam ε, added to √v̂ in the update (Megatron-LM's --adam-eps)")
	fs.IntVar(&c.evalEvery, "eval-every", 0, "held-out evaluation every N steps (0: at the end only)")
	fs.IntVar(&c.logEvery, "log-every", 1, "in a log (not a terminal): one line every N steps, at an evaluation and at the last step, with the mean loss and time of the steps since the last (Megatron-LM's --log-interval); the metrics keep every step")
	fs.IntVar(&c.evalBatches, "eval-batches", 8, "held-out batches per evaluation (-1: no held-out evaluation)")
	// A job of several processes: torchrun, srun and mpirun set these
	// through the environment; the flags override it.
	fs.IntVar(&c.rank, "rank", -1, "this process's rank in a job of several processes (default: from RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK)")
	fs.IntVar(&c.worldSize, "world-size", 0, "number of processes in the job (default: from WORLD_SIZE, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE; 1)")
	fs.IntVar(&c.localRank, "local-rank", -1, "this process's rank on its node; picks its GPU (default: from LOCAL_RANK, SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK)")
	fs.IntVar(&c.localWorldSize, "local-world-size", 0, "processes on this node (default: from the launcher)")
	fs.StringVar(&c.masterAddr, "master-addr", "", "host of rank 0, which hosts the rendezvous (default: MASTER_ADDR, the first SLURM node, or 127.0.0.1)")
	fs.StringVar(&c.advertiseAddr, "advertise-addr", "", "the address the job's other processes reach this one's transport at, which it also listens on (default: GCOMPILE_ADVERTISE_ADDR, else this machine's address on its route to the master, else, on the master's machine, the address the other machines reached the rendezvous at)")
	fs.IntVar(&c.masterPort, "master-port", 0, "rendezvous port on the master (default: MASTER_PORT, else derived from the SLURM or MPI job id, else 29500); the store takes the first free port from there")
	fs.StringVar(&c.token, "token", "", "the job's token, presented by every connection (default: GCOMPILE_TOKEN, else derived from the launcher's job id)")
	c.timeout, c.rdzvTimeout = runtime.DefaultTimeout, defaultRdzvTimeout
	fs.Var((*duration)(&c.timeout), "timeout", "how long any rank waits for another before the job fails (collectives, transfers, the plan check), a `duration` such as 90s or 10m")
	fs.Var((*duration)(&c.rdzvTimeout), "rdzv-timeout", "how long the processes of a job wait for each other to start (the rendezvous), a `duration`; then rank 0 names those that never joined")
	fs.StringVar(&c.logDir, "log-dir", "", "ranks other than 0 append their log to DIR/rank-N.log instead of writing it to stderr (rank 0 always logs to stderr)")
	fs.BoolVar(&c.packGPU, "pack-gpu", false, "with --backend cuda: put all of this process's devices on one GPU as virtual devices, instead of one GPU each")

	positional, err := parsePositional(fs, args)
	if err != nil {
		return placeOnly(args), err
	}
	c.explicit = map[string]bool{}
	var empty []string
	fs.Visit(func(f *flag.Flag) {
		c.explicit[f.Name] = true
		if pathFlags[f.Name] && f.Value.String() == "" {
			empty = append(empty, "--"+f.Name)
		}
	})
	// An axis given as 0 is one not given (the flags' help says so: 0 is
	// chosen by the planner, or the default): the planner searches it.
	for _, a := range []string{"tp", "pp", "dp", "ep", "cp", "vpp", "micro-batch-size"} {
		if f := fs.Lookup(a); f != nil && c.explicit[a] && f.Value.String() == "0" {
			delete(c.explicit, a)
		}
	}
	if len(empty) > 0 {
		// Most often a shell variable that is not set: read as not given,
		// it would drop the file asked for without a word.
		return nil, fmt.Errorf("%s given an empty value: name a file or folder, or leave the flag out (see %s -h)", strings.Join(empty, ", "), name)
	}
	c.Explicit = c.explicit
	c.settings = runSettings(fs)
	if len(positional) != 1 {
		return nil, fmt.Errorf("want exactly one MODEL.go or MODEL.gir, got %d arguments (see %s -h)", len(positional), name)
	}
	c.Model = positional[0]
	if b := girBatch(c.Model); b > 0 && !c.explicit["batch"] && c.DPSync != "async" {
		// A dump's batch is its own: the plan's rules (dp·microbatches
		// dividing it) and the planner's search are held to it, not to
		// --batch's default. (An asynchronous run's dump is one
		// replica's, at its share of the batch: the flags' batch stays
		// the global one.)
		c.Batch = b
	}
	c.load = weightsFile(c.load)
	if mode != nil {
		mode(c)
	}
	return c, c.validate()
}

// girBatch is the batch a .gir dump was built at (the first dimension of
// its tokens input, or of its first batch input under another name), or
// 0 for a model.go or a dump that does not say; a dump that does not
// parse is named when it is loaded.
func girBatch(path string) int {
	if !strings.HasSuffix(path, ".gir") || notAFile("", path) != nil {
		return 0 // a pipe would hang the read: validate names it
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	m, err := ir.Parse(path, string(text))
	if err != nil {
		return 0
	}
	if v := m.Source(ir.InputTokens); v != nil && v.Type.Rank() >= 1 {
		return v.Type.Shape[0]
	}
	for _, v := range m.Values {
		if v.Op == "input" && !v.Attrs.Bool("whole") && v.Type.Rank() >= 1 {
			return v.Type.Shape[0]
		}
	}
	return 0
}

// parsePositional parses flags anywhere among the positional arguments
// and returns those: Go's flag package stops at the first positional
// argument, and the model path comes first.
//
// A mistake on the command line is one line that points to -h, not the
// whole usage (which buries the line that says what is wrong); -h and
// --help print the usage on stdout and return flag.ErrHelp, which the
// command treats as success.
func parsePositional(fs *flag.FlagSet, args []string) ([]string, error) {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	defer func() { fs.Usage = usage; fs.SetOutput(out) }()
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(os.Stdout)
				usage()
				return nil, flag.ErrHelp
			}
			return nil, fmt.Errorf("%w (see %s -h)", err, fs.Name())
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// givenOf names those of flags the command line gave ("--a", "--a and
// --b"; every one when none was, as a default's value may be the cause),
// followed by one (a single flag) or many, the verb that agrees.
func (c *config) givenOf(one, many string, flags ...string) string {
	var given []string
	for _, f := range flags {
		if c.explicit[f] {
			given = append(given, "--"+f)
		}
	}
	if len(given) == 0 {
		for _, f := range flags {
			given = append(given, "--"+f)
		}
	}
	if len(given) == 1 {
		return given[0] + " " + one
	}
	return strings.Join(given, " and ") + " " + many
}

// hostLabel is one label of a host name: RFC 1123's letters, digits and
// hyphens, and the underscores that cluster names carry and resolvers
// take.
var hostLabel = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$`)

// validHost reports whether s is an IP address (an IPv6 one perhaps in
// brackets or with a zone, ::1%lo) or a host name: what a job's address
// flags take, which a process would otherwise fail to listen on or dial
// only after its compile.
func validHost(s string) bool {
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return true
	}
	name := strings.TrimSuffix(s, ".")
	if name == "" || len(name) > 253 {
		return false
	}
	for _, l := range strings.Split(name, ".") {
		if !hostLabel.MatchString(l) {
			return false
		}
	}
	return true
}

// fileInputs are the input flags that read one file (where --data and
// --tokenizer may name a folder), with what they want.
var fileInputs = map[string]string{
	"calibrate":    "a JSON file: a list of measured plans, or a run's --metrics",
	"refine-trace": "a trace JSON file, as --trace writes",
	"hardware":     "a hardware JSON file, as --save-hardware writes",
	"merges":       "GPT-2's merges.txt",
}

// minJobTimeout is the shortest --timeout and --rdzv-timeout: below it
// a job of processes on one machine cannot even meet, and the failure
// would read as the network's.
const minJobTimeout = time.Second

// maxEvalBatches bounds --eval-batches as compile.MaxBatch bounds
// --batch: far past any evaluation, and their product fits an int64.
const maxEvalBatches = 1 << 30

// errNotYet marks a valid request that this build cannot carry out yet.
var errNotYet = compile.ErrNotYet

// validate rejects impossible or unsupported combinations, naming the
// rule: the plan's (compile.Config.Validate) and the run's.
func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.evalOnly {
		switch {
		case c.load == "" && c.resume == "":
			bad("eval: give the weights with --load FILE.safetensors or --resume CHECKPOINT")
		case c.load != "" && c.resume != "":
			bad("eval: --load and --resume both give the weights; give one")
		}
		// A flag eval refuses is said alone (with the weights' rule): the
		// training rules over its value (--grad-reduce-dtype fp16 wants
		// fp16 precision) are not eval's.
		weights := len(errs)
		for _, g := range evalRefuses {
			for _, f := range g.flags {
				if c.explicit[f] {
					bad("eval: --%s %s", f, g.why)
				}
			}
		}
		if len(errs) > weights {
			return errors.Join(errs...)
		}
	}
	notYet := func(what, when string) { errs = append(errs, fmt.Errorf("%s: %w (%s)", what, errNotYet, when)) }
	if c.deviceMemory != "" {
		n, err := parseBytes(c.deviceMemory)
		if err != nil {
			bad("--device-memory %q: %w", c.deviceMemory, err)
		}
		c.MemLimit = n
	}
	// Before anything below reads an input: a pipe would hang the read.
	for _, in := range c.inputPaths() {
		if err := notAFile(in.flag, in.path); err != nil {
			return err
		}
		if want, ok := fileInputs[in.flag]; ok {
			if fi, err := os.Stat(in.path); err == nil && fi.IsDir() {
				return fmt.Errorf("--%s %s is a folder; it wants %s", in.flag, in.path, want)
			}
		}
	}
	if fi, err := os.Stat(c.Model); c.Model != "" && err == nil && fi.IsDir() {
		return fmt.Errorf("model file %s is a folder; name its MODEL.go or a MODEL.gir", c.Model)
	}
	// Once the planner has run (planned), the hardware it priced on (a
	// calibrated or refined one, or this machine's cpu figures) stays, and
	// the inputs it read are not read again.
	if !c.planned && (c.hardware != "" || c.plan || c.planTrace != "" || c.planning()) {
		spec, err := c.hardwareSpec()
		if err != nil {
			bad("%w", err)
		} else if hw, err := cost.Load(spec); err != nil {
			if base, _, _ := strings.Cut(spec, ":"); strings.HasSuffix(strings.ToLower(spec), ".json") || strings.HasSuffix(strings.ToLower(base), ".json") {
				bad("--hardware: %w", err) // a file's error names it
			} else {
				bad("--hardware %q: %w", spec, err)
			}
		} else {
			c.hw = hw
		}
	}
	if c.calibrate != "" && c.refineTrace != "" {
		// Said alone: whichever is kept, the other rules then apply.
		bad("--calibrate and --refine-trace each refine the hardware: give one")
	} else if c.refineTrace != "" && (!c.plan || c.hardware == "") && !c.evalOnly {
		bad("--refine-trace refines the --hardware preset for --plan: it needs both")
	}
	if c.refineTrace != "" && c.run && !c.evalOnly {
		bad("--refine-trace applies to --plan without --run: save the refined preset (--save-hardware) and train with --hardware FILE.json")
	}
	if c.calibrate != "" && !c.planned && !c.planning() && !c.evalOnly && c.refineTrace == "" {
		bad("--calibrate fits the hardware the planner prices plans on: it needs --plan, or --devices > 1 with no --tp/--pp/--dp/--ep/--cp and a synchronous run (the planner chooses the plan then)")
	}
	if c.calibrate != "" && !c.planned {
		if points, err := planner.ReadMeasured(c.calibrate); err != nil {
			bad("--calibrate: %w", err)
		} else {
			c.measured = points
		}
	}
	if c.refineTrace != "" && !c.planned {
		if events, err := cost.ReadTrace(c.refineTrace); err != nil {
			bad("--refine-trace: %w", err)
		} else if name := cost.PredictedTrace(events); name != "" {
			bad("--refine-trace %s: its events are %s, a prediction (--plan-trace writes it), not a measurement: refine from the --trace of a --run", c.refineTrace, name)
		} else {
			c.traced = events
		}
	}
	if c.saveHardware != "" && c.refineTrace == "" && c.calibrate == "" {
		bad("--save-hardware writes the preset --refine-trace or --calibrate refines: it needs one of them")
	}
	if c.saveHardware != "" && !strings.HasSuffix(strings.ToLower(c.saveHardware), ".json") {
		bad("--save-hardware %q: the file must end in .json, as --hardware reads it", c.saveHardware)
	}
	if c.explicit["plan-top"] && !c.plan {
		bad("--plan-top applies to --plan")
	}
	if _, err := sample.ParseSplit(c.split); err != nil {
		// Said before the compile, which it used to follow.
		bad("--split %q: %v", c.split, err)
	}
	if c.planTrace != "" && c.DPSync == "async" {
		bad("--plan-trace prices synchronous plans; it does not combine with --dp-sync async")
	}
	if c.plan && !c.run {
		// --plan alone prints the table and compiles nothing to report:
		// these would be dropped without a word.
		for _, f := range []string{"report", "timeline"} {
			if c.explicit[f] {
				bad("--%s with --plan records the plan it trains: add --run, or drop --plan for the compiled plan of the given axes", f)
			}
		}
	}
	if c.planTop < 1 || c.planTop > 100 {
		bad("--plan-top must be in 1..100, got %d", c.planTop)
	}
	if c.planning() {
		errs = append(errs, c.validateForPlanner()...)
	} else if err := c.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	c.checkNumbers(bad)
	if c.timeline != "" && c.PP == 1 {
		bad("--timeline draws a pipeline schedule; it needs --pp > 1")
	}
	if c.report != "" && !strings.HasSuffix(strings.ToLower(c.report), ".html") {
		bad("--report %q: the report is an HTML page; give a FILE.html", c.report)
	}
	if c.timeline != "" && !strings.HasSuffix(strings.ToLower(c.timeline), ".svg") {
		bad("--timeline %q: the timeline is an SVG drawing; give a FILE.svg", c.timeline)
	}
	if !slices.Contains([]string{"cpu", "cuda"}, c.backend) {
		bad("--backend %q: want cpu or cuda", c.backend)
	}
	c.checkSchedule(bad)
	if c.evalOnly {
		if c.evalBatches < 0 {
			bad("eval: --eval-batches %d: want a number of held-out batches (0: the whole held-out split of a token dataset)", c.evalBatches)
		}
	}
	if (c.trace != "" || c.save != "") && !c.run {
		bad("%s a training run; add --run", c.givenOf("records", "record", "trace", "save"))
	}
	if c.load != "" && !c.run {
		bad("--load reads the weights a training run starts from; add --run (gcompile eval and generate take --load too)")
	}
	for _, f := range []string{"initial-loss-scale", "loss-scale-window", "hysteresis", "min-loss-scale"} {
		if c.explicit[f] && (c.Precision != "fp16" || c.LossScale != 0) {
			bad("--%s applies to dynamic loss scaling: --precision fp16 without --loss-scale", f)
		}
	}
	switch {
	case c.lossScaleWindow < 1:
		bad("--loss-scale-window must be ≥ 1 clean step, got %d", c.lossScaleWindow)
	case c.hysteresis < 1:
		bad("--hysteresis must be ≥ 1 overflowed step (1: halve at every one), got %d", c.hysteresis)
	case !(c.minLossScale >= 0) || math.IsInf(c.minLossScale, 0):
		bad("--min-loss-scale must be ≥ 0 and finite (0: no floor), got %g", c.minLossScale)
	case c.minLossScale > 0 && !compile.LossScaleFits(c.minLossScale):
		bad("--min-loss-scale %g: the scale multiplies the loss in float32, so it must be a normal float32 (%.3g to %.3g)", c.minLossScale, compile.MinLossScale, math.MaxFloat32)
	case c.minLossScale > c.initialLossScale && c.initialLossScale > 0 && compile.LossScaleFits(c.initialLossScale):
		// (An --initial-loss-scale out of range is said on its own.)
		bad("--min-loss-scale %g is above the scale the run starts from, --initial-loss-scale %g", c.minLossScale, c.initialLossScale)
	}
	if c.stopAfter > 0 && c.stopAfter >= c.steps {
		bad("--stop-after %d must be below --steps %d", c.stopAfter, c.steps)
	}
	if c.explicit["stop-after"] && !c.run {
		bad("--stop-after stops a training run; add --run")
	}
	if c.stopAfterTime < 0 {
		bad("--stop-after-time must be ≥ 0 (0: no limit), got %v", c.stopAfterTime)
	} else if c.explicit["stop-after-time"] && !c.run {
		bad("--stop-after-time stops a training run; add --run")
	}
	// A flag the chosen optimizer has no use for would be dropped without
	// a word: the run would not be the one asked for.
	for _, u := range unusedByOptimizer[c.Optimizer] {
		if c.explicit[u.flag] {
			bad("--%s has no effect with --optimizer %s (%s); leave it out", u.flag, c.Optimizer, u.why)
		}
	}
	if (c.explicit["checkpoint-every"] || c.explicit["keep-last"]) && c.ckptDir == "" {
		bad("%s to --checkpoint-dir", c.givenOf("applies", "apply", "checkpoint-every", "keep-last"))
	}
	if (c.ckptDir != "" || c.resume != "") && !c.run {
		bad("%s a training run; add --run", c.givenOf("checkpoints", "checkpoint", "checkpoint-dir", "resume"))
	}
	if c.loadIgnore != "" && c.load == "" {
		bad("--load-ignore applies to --load")
	}
	for _, p := range strings.Split(c.loadIgnore, ",") {
		if _, err := path.Match(p, ""); err != nil {
			bad("--load-ignore pattern %q: %v", p, err)
		}
	}
	if c.resume != "" && c.load != "" && !c.evalOnly {
		// (eval says it its own way: both give the weights.)
		bad("--resume continues a run with its own weights; it does not combine with --load")
	}
	if c.explicit["token"] && c.token == "" {
		bad("--token must not be empty (leave it out to use GCOMPILE_TOKEN or the launcher's job id)")
	}
	if c.packGPU && c.backend != "cuda" {
		bad("--pack-gpu applies to --backend cuda")
	}
	c.CommStream = c.backend == "cuda"

	if c.explicit["grad-reduce-dtype"] && c.GradReduceDType == "" {
		bad("--grad-reduce-dtype \"\": want one of %s", strings.Join(passes.GradReduceDTypes, ", "))
	}
	if c.backend == "cuda" && c.DPSync == "async" {
		notYet("--backend cuda with --dp-sync async", "the asynchronous trainer runs on the cpu backend")
	}
	if c.evalEvery > 0 && c.DPSync == "async" {
		notYet("--eval-every with --dp-sync async", "the asynchronous trainer evaluates the final weights; its replicas reach a step at different times")
	}
	if c.trace != "" && c.DPSync == "async" {
		notYet("--trace with --dp-sync async", "the asynchronous trainer's replicas run on their own clocks, which the trace's one timeline does not record")
	}
	return errors.Join(errs...)
}

// maxDataMB bounds --max-data-mb: the byte count (MiB << 20) must fit an
// int64, and the text is held in memory, so 1 TiB is already far more
// than any machine this reads on.
const maxDataMB = 1 << 20

// checkNumbers checks every numeric flag of the run (the plan's are
// compile.Config.Validate's), each failure naming its flag. NaN and ±Inf
// are refused explicitly: the flag package parses "NaN" and "Inf" as
// numbers, a NaN passes every comparison, and it would only surface as a
// NaN loss after the compile and the first steps.
func (c *config) checkNumbers(bad func(string, ...any)) {
	if c.steps < 1 {
		bad("--steps must be ≥ 1, got %d", c.steps)
	}
	if !(c.lr > 0) || c.lr > math.MaxFloat32 || float32(c.lr) == 0 {
		// The update runs in 32 bits: a rate below its smallest number
		// is 0 there, and trains nothing.
		bad("learning rate: want --lr > 0 and finite as a 32-bit float (at least %g), got %g", math.SmallestNonzeroFloat32, c.lr)
	} else if !(c.minLR >= 0) || c.minLR > c.lr {
		bad("learning rate: want 0 ≤ --min-lr ≤ --lr (%g), got --min-lr %g", c.lr, c.minLR)
	}
	if c.warmup < 0 {
		bad("--warmup must be ≥ 0, got %d", c.warmup)
	}
	if c.AdamEps == 0 {
		// compile.Config reads 0 as the default, 1e-8: a 0 given here
		// would be trained with that unannounced.
		bad("--adam-eps must be positive (an ε of 0 divides by a zero second moment), got 0")
	}
	if c.logEvery < 1 {
		bad("--log-every must be ≥ 1 step, got %d", c.logEvery)
	}
	if c.evalEvery < 0 {
		bad("--eval-every must be ≥ 0 (0: at the end only), got %d", c.evalEvery)
	}
	// -1 is the trainer's "no held-out evaluation" (the benchmarks use
	// it); 0 would silently mean one batch.
	// (gcompile eval reads 0 as the whole held-out split.)
	if !c.evalOnly && (c.evalBatches < -1 || c.evalBatches == 0) {
		bad("--eval-batches must be ≥ 1 (or -1: no held-out evaluation), got %d", c.evalBatches)
	}
	if c.evalBatches > maxEvalBatches {
		// As --batch is bounded: past it, batches × their sequences no
		// longer count in 64 bits, and an evaluation would not end.
		bad("--eval-batches %d: more than the %d batches an evaluation reads at most", c.evalBatches, maxEvalBatches)
	}
	if c.vocabDivisible < 1 || c.vocabDivisible > maxVocabDivisible {
		bad("--make-vocab-size-divisible-by %d: want 1 to %d", c.vocabDivisible, maxVocabDivisible)
	}
	if c.maxDataMB < 1 || c.maxDataMB > maxDataMB {
		bad("--max-data-mb must be in 1..%d, got %d", maxDataMB, c.maxDataMB)
	}
	if !(c.initialLossScale > 0) || math.IsInf(c.initialLossScale, 0) {
		bad("--initial-loss-scale must be a positive finite number, got %g", c.initialLossScale)
	} else if !compile.LossScaleFits(c.initialLossScale) {
		bad("--initial-loss-scale %g: the scale multiplies the loss in float32, so it must be a normal float32 (%.3g to %.3g); outside it every step overflows or underflows and is skipped", c.initialLossScale, compile.MinLossScale, math.MaxFloat32)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"checkpoint-every", c.ckptEvery}, {"keep-last", c.keepLast}, {"stop-after", c.stopAfter}} {
		if f.v < 0 {
			bad("--%s must be ≥ 0, got %d", f.name, f.v)
		}
	}
	if c.rdzvTimeout <= 0 {
		bad("--rdzv-timeout must be positive, got %v", c.rdzvTimeout)
	} else if c.rdzvTimeout < minJobTimeout {
		bad("--rdzv-timeout %v: under %v, processes started together cannot meet (starting one takes longer); give seconds or minutes", c.rdzvTimeout, minJobTimeout)
	}
	if c.explicit["rdzv-timeout"] && c.rdzvTimeout > c.timeout {
		// The rendezvous never waits longer than --timeout: the value
		// given would be cut without a word.
		bad("--rdzv-timeout %v is longer than --timeout %v, which bounds the rendezvous too: raise --timeout with it", c.rdzvTimeout, c.timeout)
	}
	for _, f := range []struct{ flag, host string }{{"master-addr", c.masterAddr}, {"advertise-addr", c.advertiseAddr}} {
		if f.host != "" && !validHost(f.host) {
			bad("--%s %q: want a host name or an IP address (no port: --master-port gives the rendezvous's)", f.flag, f.host)
		}
	}
	if c.timeout <= 0 {
		bad("--timeout must be positive, got %v", c.timeout)
	} else if c.timeout < minJobTimeout {
		bad("--timeout %v: under %v, a rank's wait for another ends before the other can answer (a step, a transfer); give seconds or minutes", c.timeout, minJobTimeout)
	}
	// The job's flags: -1 and 0 are "from the launcher's environment",
	// so only a value the user gave is checked here; the world as a
	// whole is checked when the job starts.
	if c.explicit["rank"] && c.rank < 0 {
		bad("--rank must be ≥ 0, got %d", c.rank)
	}
	if c.explicit["local-rank"] && c.localRank < 0 {
		bad("--local-rank must be ≥ 0, got %d", c.localRank)
	}
	if c.explicit["world-size"] && c.worldSize < 1 {
		bad("--world-size must be ≥ 1, got %d", c.worldSize)
	}
	if c.explicit["local-world-size"] && c.localWorldSize < 1 {
		bad("--local-world-size must be ≥ 1, got %d", c.localWorldSize)
	}
	if c.masterPort < 0 || c.masterPort > 65535 {
		bad("--master-port %d is not a port (0..65535; 0: from the launcher)", c.masterPort)
	}
}

// parseBytes reads a size: a number with an optional unit (B, KB/KiB,
// MB/MiB, GB/GiB, TB/TiB; decimal units are powers of 1000). The whole
// string must be the size: "12XB" is no size with some junk ignored, and
// a size is a positive whole number of bytes that fits an int64 (so no
// NaN, Inf, 0.5B or 1e400GB).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"EiB", 1 << 60}, {"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"EB", 1e18}, {"PB", 1e15}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	want := errors.New("want a positive size in whole bytes, like 80GiB, 512MiB or 1e9")
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	x, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, want
	}
	n := x * mult
	// 2^63 is exactly representable; every float below it that is a
	// whole number converts to int64 exactly.
	if n >= 1<<63 {
		return 0, fmt.Errorf("%s is past 2^63 bytes (8 EiB), more than any machine addresses", s)
	}
	if math.IsNaN(n) || n < 1 || n != math.Trunc(n) {
		return 0, want
	}
	return int64(n), nil
}

// duration is a time.Duration flag whose mistakes say what is wrong
// (time.ParseDuration's "missing unit in duration"), where the flag
// package's own says "parse error".
type duration time.Duration

func (d *duration) String() string { return time.Duration(*d).String() }

func (d *duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%w (give a unit: 90s, 10m, 1h30m)", err)
	}
	*d = duration(v)
	return nil
}

// negated is a boolean flag that sets the negation of its field: a flag
// on by default (--overlap-grad-reduce) over a field whose zero value is
// the default (compile.Config.SerialGradReduce).
type negated struct{ field *bool }

func (n negated) String() string {
	if n.field == nil {
		return "true"
	}
	return strconv.FormatBool(!*n.field)
}

func (n negated) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false, got %q", s)
	}
	*n.field = !v
	return nil
}

func (negated) IsBoolFlag() bool { return true }

// evalUsage is how eval reads the training flags whose text says
// otherwise: eval plans nothing (dp takes the devices the axes given
// leave), reads only a checkpoint's params, and evaluates its data.
var evalUsage = map[string]string{
	"eval-batches": "held-out batches to evaluate, as many as training evaluates by default (0: the whole held-out split of a token dataset)",
	"tp":           "tensor-parallel degree (0: 1; eval does not plan: dp takes the devices the axes given leave)",
	"pp":           "pipeline-parallel degree (0: 1; eval does not plan)",
	"ep":           "expert-parallel degree: mixture-of-experts weights split by expert (0: 1; eval does not plan)",
	"resume":       "evaluate the params of a training checkpoint: a --checkpoint-dir (its latest complete checkpoint) or one step-N folder in it; any plan, any batch",
	"data":         "the data whose held-out split is evaluated: a text file or folder, one byte per token (default: the Go standard library sources); or a token dataset PREFIX (PREFIX.bin/.idx); or a blend \"0.3 PREFIX_A 0.7 PREFIX_B\"",
}

// checkSchedule refuses a learning-rate schedule that is not one, or
// flags it would not read (as --beta1 with sgd: a figure the run would
// not use).
func (c *config) checkSchedule(bad func(string, ...any)) {
	if !slices.Contains(runtime.DecayStyles, c.decay) {
		bad("--lr-decay %q: want one of %s", c.decay, strings.Join(runtime.DecayStyles, ", "))
		return
	}
	if c.decay == "constant" {
		for _, f := range []string{"min-lr", "lr-decay-steps"} {
			if c.explicit[f] {
				bad("--%s has no effect with --lr-decay constant (the rate stays at --lr after the warmup); leave it out, or decay with --lr-decay cosine", f)
			}
		}
	}
	end := c.steps
	if c.decaySteps != 0 {
		end = c.decaySteps
	}
	switch {
	case c.decaySteps < 0:
		bad("--lr-decay-steps must be ≥ 0 (0: --steps), got %d", c.decaySteps)
	case c.decay != "constant" && c.explicit["lr-decay-steps"] && c.decaySteps > 0 && c.decaySteps <= c.warmup:
		// Megatron-LM asserts the same: the decay starts where the
		// warm-up ends.
		bad("--lr-decay-steps %d is not past --warmup %d: the decay would end before it starts", c.decaySteps, c.warmup)
	}
	if c.decay != "wsd" {
		for _, f := range []string{"lr-wsd-decay-steps", "lr-wsd-decay-style"} {
			if c.explicit[f] {
				bad("--%s has no effect with --lr-decay %s; leave it out, or anneal with --lr-decay wsd", f, c.decay)
			}
		}
		return
	}
	switch {
	case !slices.Contains(runtime.WSDStyles, c.wsdStyle):
		bad("--lr-wsd-decay-style %q: want one of %s", c.wsdStyle, strings.Join(runtime.WSDStyles, ", "))
	case c.wsdDecaySteps < 1:
		bad("--lr-decay wsd needs --lr-wsd-decay-steps N ≥ 1, the steps at the end of the decay that anneal to --min-lr (got %d)", c.wsdDecaySteps)
	case end <= c.warmup:
		bad("--lr-decay wsd: the decay has no steps: --warmup %d is not shorter than its end, step %d (--lr-decay-steps, else --steps)", c.warmup, end)
	case c.wsdDecaySteps > end-c.warmup:
		bad("--lr-wsd-decay-steps %d is longer than the decay, %d steps from the warm-up's end (%d) to its end (%d)", c.wsdDecaySteps, end-c.warmup, c.warmup, end)
	}
}

// schedule is the run's learning-rate schedule.
func (c *config) schedule() runtime.Schedule {
	return runtime.Schedule{LR: c.lr, MinLR: c.minLR, Warmup: c.warmup, Steps: c.steps, Decay: c.decay,
		DecaySteps: c.decaySteps, WSDDecaySteps: c.wsdDecaySteps, WSDStyle: c.wsdStyle}
}

// modelTimeoutFlag is --model-timeout, which every command that loads a
// MODEL.go takes.
func modelTimeoutFlag(fs *flag.FlagSet, d *time.Duration) {
	fs.Func("model-timeout", "how long type-checking and building MODEL.go may take, and then running its Model(), each, a `duration` (default 2m0s)", func(s string) error {
		v, err := time.ParseDuration(s)
		if err == nil && v <= 0 {
			err = fmt.Errorf("must be positive, got %v", v)
		}
		*d = v
		return err
	})
}
