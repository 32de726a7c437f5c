package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"gcompile/ir"
)

// ModelFunc is what a model file provides: it records the model's forward
// pass and loss into b.
type ModelFunc func(b *Builder)

// Config is what a build reads besides the model code.
type Config struct {
	Name  string            // module name
	Batch int               // global batch in sequences (default 8)
	Set   map[string]string // --set key=value model parameters
	// Float is the dtype of params and float constants: F32 (default) to
	// train, F64 for gradient checks and oracle comparisons.
	Float ir.DType
	// Eval builds the module evaluation runs, for a model whose shapes
	// depend on it (Builder.Evaluating).
	Eval bool
	// Classes is how many token ids the training data can hold (its
	// tokenizer's vocabulary) when the model's vocabulary is padded past
	// it (Megatron-LM's --make-vocab-size-divisible-by); 0 when it is not.
	// nn.CrossEntropy then masks the padding classes out of the softmax.
	Classes int
	// Generate builds the module one step of generation runs (see
	// Generation); nil builds the training module.
	Generate *Generation
}

// ParamDoc describes one model parameter, for --help-model.
type ParamDoc struct {
	Key, Kind, Default, Doc string
	// Implementation: the parameter chooses how the model computes, not
	// what (Builder.Implementation).
	Implementation bool `json:",omitempty"`
}

// Builder records a model into an ir.Module.
type Builder struct {
	m    *ir.Module
	cfg  Config
	errs []error
	// alike counts, for each of errs, the later errors that said the same
	// at the same line about another instance (report).
	alike map[string]int
	more  []int
	// where are the numbered names of those later errors (up to a few).
	where [][]string
	// exportErr is ExportConfig's non-JSON value, reported by finish
	// when nothing else is.
	exportErr error
	// lossAt is where b.Loss was called ("" until it is), exportConfigAt
	// where b.ExportConfig was.
	lossAt, exportConfigAt string
	used                   map[string]bool
	// sources are the params, states and inputs by name: a lookup a
	// declaration, where Module.Source walks every value (a model of
	// 20,000 layers took minutes to build).
	sources map[string]*ir.Value
	docs    []ParamDoc
	layer   int
	scalar  map[float64]*ir.Value
	// Scopes the model opened: what ops recorded now are tagged with.
	selective bool
	precision ir.DType
	// done is set once Model has returned (live).
	done atomic.Bool
	// Generation's bookkeeping: the sequence read by Sequence, the
	// positions input, the caches made so far and the logits the loss
	// reads.
	trainedSeq int
	positions  *Tensor
	caches     int
	logits     *ir.Value
}

// Build runs fn and returns the recorded module, or every DSL error it hit.
func Build(fn ModelFunc, cfg Config) (*ir.Module, error) {
	if err := checkBatch(cfg.Batch); err != nil {
		return nil, err
	}
	if err := checkGeneration(cfg.Generate); err != nil {
		return nil, err
	}
	b := newBuilder(cfg)
	if err := b.runModel(fn); err != nil {
		return nil, err
	}
	return b.finish()
}

// Describe runs fn only to list the model parameters it reads.
func Describe(fn ModelFunc, cfg Config) ([]ParamDoc, error) {
	b := newBuilder(cfg)
	err := b.runModel(fn)
	if err == nil {
		// A key the model reads under none of cfg.Set's values is a typo
		// the list would otherwise pass over.
		err = b.unknownSet()
	}
	return b.docs, err
}

// runModel calls the user's model. A panic in it is reported with the
// user's line, not as a crash of the compiler.
func (b *Builder) runModel(fn ModelFunc) (err error) {
	defer func() {
		b.done.Store(true)
		if r := recover(); r != nil {
			err = fmt.Errorf("%v: model panicked: %v", userPos(), r)
			// A panic after a DSL error is most often its consequence (a
			// poisoned tensor's empty shape indexed, its 0 dim divided
			// by): the error first, and the panic said to follow from it.
			if prior := b.reported(); len(prior) > 0 {
				err = fmt.Errorf("%v: model panicked: %v (likely a consequence of the error above: the failed op's tensor has no shape, and its dims read 0)", userPos(), r)
				err = errors.Join(append(prior, err)...)
			}
		}
	}()
	fn(b)
	return nil
}

// maxValues bounds a module's values: a model records a few dozen a
// layer (a hundred with attention of primitive ops), so this is a model
// of some ten thousand layers. (A variable for the test.)
var maxValues = 1 << 20

// sizesSet is the --set the model was built with, for a message about
// its sizes ("no --set" when none was given).
func (b *Builder) sizesSet() string {
	if len(b.cfg.Set) == 0 {
		return "no --set"
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(b.cfg.Set)) {
		kv = append(kv, k+"="+b.cfg.Set[k])
	}
	return "--set " + strings.Join(kv, ",")
}

// live panics when the model records after Model returned (a builder kept
// in a global, a goroutine still running): the module is already built,
// and a late op would change it at random.
func (b *Builder) live() {
	if b == nil {
		panic(errors.New("a method called on a nil *frontend.Builder: record the model with the b that Model is given"))
	}
	if len(b.m.Values) >= maxValues {
		// A size from --set far past any model's (layers=2^62) would
		// otherwise record until memory or --model-timeout ran out.
		panic(fmt.Errorf("the model has recorded %d ops, the most a module holds: is a size from --set far too large (%s)?", maxValues, b.sizesSet()))
	}
	if b.done.Load() {
		panic(fmt.Sprintf("%v: the model's builder was used after Model returned, or a tensor of another, finished build is used here: record the whole model inside Model, from its own builder's tensors (not from a goroutine, a builder kept for later or another Build's tensors)", userPos()))
	}
}

// foreign reports a tensor another builder recorded: its value belongs
// to another module, where its id names something else.
func (b *Builder) foreign(pos ir.Pos, ts ...*Tensor) bool {
	// The receiver's builder first: one that has finished (a tensor of
	// another Build used as the receiver) would lose the error.
	b.live()
	for i, t := range ts {
		if t == nil {
			b.fail(pos, fmt.Errorf("argument %d is a nil *Tensor (a variable never assigned a tensor?)", i+1))
			return true
		}
		if t.b == nil {
			b.fail(pos, fmt.Errorf("argument %d is a zero frontend.Tensor{}, which no builder made: tensors come from b.Input, b.Param, b.Constant and the ops on them", i+1))
			return true
		}
		if t.b != b {
			b.fail(pos, errors.New("a tensor recorded by another builder (another model's build) is used here: every tensor of a model comes from its own builder"))
			return true
		}
	}
	return false
}

// checkBatch refuses a batch no shape can hold before the model sees it:
// a model multiplies it into its input shapes, where a negative one would
// be reported as some tensor's bad dim rather than as the flag.
func checkBatch(n int) error {
	if n < 0 {
		return fmt.Errorf("--batch %d: want a positive number of sequences", n)
	}
	return nil
}

func newBuilder(cfg Config) *Builder {
	if cfg.Batch == 0 {
		cfg.Batch = 8
	}
	if cfg.Float == ir.Invalid {
		cfg.Float = ir.F32
	}
	if cfg.Name == "" {
		cfg.Name = "model"
	}
	return &Builder{m: ir.NewModule(cfg.Name), cfg: cfg, used: map[string]bool{}, layer: -1, scalar: map[float64]*ir.Value{}, sources: map[string]*ir.Value{}}
}

// unknownSet is the error of --set keys the model did not read, or nil.
func (b *Builder) unknownSet() error {
	var unknown []string
	for k := range b.cfg.Set {
		if !b.used[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	var known []string
	for _, d := range b.docs {
		known = append(known, d.Key)
	}
	return fmt.Errorf("--set: unknown model parameter(s) %s (this model reads: %s)", strings.Join(unknown, ", "), strings.Join(known, ", "))
}

func (b *Builder) finish() (*ir.Module, error) {
	if err := b.unknownSet(); err != nil {
		b.report(err)
	}
	if b.exportErr != nil && len(b.errs) == 0 {
		b.report(b.exportErr)
	}
	if b.cfg.Generate != nil {
		b.finishGeneration()
	} else if b.m.Output(ir.OutputLoss) == nil && len(b.errs) == 0 {
		if b.lossAt != "" {
			b.report(fmt.Errorf("%s: b.Loss was given a poisoned tensor (b.Poisoned(), or an op on one) and no error was reported: a layer that returns b.Poisoned() reports why with b.Errorf", b.lossAt))
		} else {
			b.report(errors.New("model did not call b.Loss(…): there is nothing to train"))
		}
	}
	if len(b.errs) == 0 {
		if err := b.m.CheckLayerMarks(); err != nil {
			b.report(err)
		}
	}
	if len(b.errs) > 0 {
		return nil, errors.Join(b.reported()...)
	}
	return b.m, nil
}

// Batch is the global batch in sequences, the same whatever the plan.
func (b *Builder) Batch() int { return b.cfg.Batch }

// Classes is Config.Classes: the token ids the data can hold when the
// vocabulary is padded past them, 0 otherwise.
func (b *Builder) Classes() int { return b.cfg.Classes }

func (b *Builder) setting(key, kind, def, doc string) (string, bool) {
	b.live()
	if key == "" || strings.ContainsAny(key, ",= \t\n") {
		// --set splits on commas and the first '=': no value could
		// reach such a key.
		b.fail(userPos(), fmt.Errorf("model parameter %q: a --set key is a word without commas, '=' or spaces", key))
	}
	b.used[key] = true
	if i := slices.IndexFunc(b.docs, func(d ParamDoc) bool { return d.Key == key }); i >= 0 {
		// Read again (a library and the model both reading "seq", say):
		// one parameter, so one kind and one default.
		if d := b.docs[i]; d.Kind != kind || d.Default != def {
			b.fail(userPos(), fmt.Errorf("model parameter %q is read twice, as %s %s and as %s %s: --set %s would set both; give them one kind and default, or two names", key, d.Kind, d.Default, kind, def, key))
		}
	} else {
		b.docs = append(b.docs, ParamDoc{Key: key, Kind: kind, Default: def, Doc: doc})
	}
	v, ok := b.cfg.Set[key]
	return v, ok
}

// Int reads an integer model parameter from --set, or def.
func (b *Builder) Int(key string, def int, doc string) int {
	s, ok := b.setting(key, "int", strconv.Itoa(def), doc)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(s)
	// The model's own default is always a value --set may give back (a
	// default of 0 meaning "off" was refused when typed).
	if err != nil || n <= 0 && n != def {
		b.fail(userPos(), fmt.Errorf("--set %s=%s: want a positive integer%s", key, s, outOfRange(err)))
		return def
	}
	return n
}

// outOfRange says why a number that parsed as one was refused: it does
// not fit (" (out of range)"), "" for other errors.
func outOfRange(err error) string {
	if errors.Is(err, strconv.ErrRange) {
		return " (this one is out of range)"
	}
	return ""
}

// IntOrZero reads an integer model parameter from --set, or def, that may
// be 0: its "off" or "automatic" value, as the doc says (a routing group
// of 0 tokens meaning one sequence, say). Negative values are refused.
func (b *Builder) IntOrZero(key string, def int, doc string) int {
	s, ok := b.setting(key, "int", strconv.Itoa(def), doc)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 && n != def {
		b.fail(userPos(), fmt.Errorf("--set %s=%s: want an integer ≥ 0%s", key, s, outOfRange(err)))
		return def
	}
	return n
}

// Float reads a float model parameter from --set, or def.
func (b *Builder) Float(key string, def float64, doc string) float64 {
	if math.IsNaN(def) {
		b.fail(userPos(), fmt.Errorf("Float(%q): the default is NaN", key))
	}
	s, ok := b.setting(key, "float", strconv.FormatFloat(def, 'g', -1, 64), doc)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		// NaN configures nothing; taken as given it fails in every op
		// that reads it, one error each.
		b.fail(userPos(), fmt.Errorf("--set %s=%s: want a number%s", key, s, outOfRange(err)))
		return def
	}
	return f
}

// String reads a model parameter that must be one of choices.
func (b *Builder) String(key, def, doc string, choices ...string) string {
	if len(choices) > 0 && def != "" && !slices.Contains(choices, def) {
		// A typo in the default would otherwise be the model's setting,
		// taken by whatever the model does with an unknown value. "" is
		// a model's own "unset", not a typo.
		b.fail(userPos(), fmt.Errorf("String(%q): the default %q is not one of its choices %s", key, def, strings.Join(choices, ", ")))
	}
	s, ok := b.setting(key, "string", def, doc+" ("+strings.Join(choices, "|")+")")
	if !ok {
		return def
	}
	if len(choices) > 0 && !slices.Contains(choices, s) {
		b.fail(userPos(), fmt.Errorf("--set %s=%s: want one of %s", key, s, strings.Join(choices, ", ")))
		return def
	}
	return s
}

// Implementation reads a string model parameter, as String does, that
// chooses how the model computes and not what: each of its choices
// computes the same function of the same params, up to rounding (one
// fused attention op, or the primitive ops it stands for). A checkpoint
// or weights trained under one choice resume, evaluate and generate
// under another, which another value of a String parameter is refused
// as: that would be another model.
func (b *Builder) Implementation(key, def, doc string, choices ...string) string {
	v := b.String(key, def, doc, choices...)
	if i := slices.IndexFunc(b.docs, func(d ParamDoc) bool { return d.Key == key }); i >= 0 {
		b.docs[i].Implementation = true
	}
	return v
}

// Layer marks the ops recorded from now on as belonging to transformer
// layer i (pipeline cuts fall between layers); Layer(-1) ends the layers.
func (b *Builder) Layer(i int) {
	if i < -1 {
		b.fail(userPos(), fmt.Errorf("Layer(%d): want a layer index ≥ 0, or -1 to end the layers", i))
		return
	}
	b.layer = i
}

// Errorf records a model-level error at the caller's line; models use it to
// reject bad parameter combinations (e.g. hidden not divisible by heads).
func (b *Builder) Errorf(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	if err.Error() == "" {
		err = errors.New("the model reported an error with no text (b.Errorf(\"\"))")
	}
	b.fail(userPos(), err)
}

func (b *Builder) fail(pos ir.Pos, err error) {
	b.report(fmt.Errorf("%v: %w", pos, err))
}

// instanceNumber is a numbered part of a dotted name (h.3, layers.11):
// errors that differ only in it say one thing about many layers.
var instanceNumber = regexp.MustCompile(`([A-Za-z_])\.[0-9]+`)

// report records err, once: a model that builds its layers in a loop
// makes the same mistake in each, and a second error with the same text
// at the same line, up to the layers' numbers, is counted against the
// first (reported) rather than printed again.
func (b *Builder) report(err error) {
	key := instanceNumber.ReplaceAllString(err.Error(), "$1.#")
	if i, ok := b.alike[key]; ok {
		b.more[i]++
		if name := numberedName.FindString(err.Error()); name != "" && len(b.where[i]) < maxNamedAlike {
			b.where[i] = append(b.where[i], name)
		}
		return
	}
	if b.alike == nil {
		b.alike = map[string]int{}
	}
	b.alike[key] = len(b.errs)
	b.errs = append(b.errs, err)
	b.more = append(b.more, 0)
	b.where = append(b.where, nil)
}

// numberedName is a dotted name with a number in it (h.3,
// model.layers.11): what an error alike to another names instead.
var numberedName = regexp.MustCompile(`[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\.[0-9]+`)

// maxNamedAlike bounds the names an error lists of those alike to it.
const maxNamedAlike = 4

// reported is what report recorded, each with how many more said the same.
func (b *Builder) reported() []error {
	out := make([]error, len(b.errs))
	for i, err := range b.errs {
		out[i] = err
		if i < len(b.more) && b.more[i] > 0 {
			names := ""
			if len(b.where[i]) > 0 {
				names = ": " + strings.Join(b.where[i], ", ")
				if len(b.where[i]) < b.more[i] {
					names += ", …"
				}
			}
			out[i] = fmt.Errorf("%w (and %d more like it%s)", err, b.more[i], names)
		}
	}
	return out
}

func (b *Builder) meta() ir.Meta {
	m := ir.NoMeta
	m.Layer = b.layer
	m.Phase = ir.PhaseFwd
	m.Selective = b.selective
	m.Precision = b.precision
	return m
}

// sourceMeta is the meta of a source op: the model's scopes tag
// computations, not the values they read, except that a param declared
// inside KeepFP32 carries the policy to every op that reads it.
func (b *Builder) sourceMeta(op string) ir.Meta {
	m := b.meta()
	m.Selective = false
	if op != "param" {
		m.Precision = ir.Invalid
	}
	return m
}

// RecomputeSelective runs fn and tags the ops it records as the ones
// --recompute selective may drop after the forward pass and replay in the
// backward: cheap to recompute and large to keep, like attention's
// [batch, heads, seq, seq] scores and probabilities (Korthikanti et al.
// 2022). A model that tags nothing cannot be compiled with
// --recompute selective.
func (b *Builder) RecomputeSelective(fn func()) {
	if fn == nil {
		b.fail(userPos(), errors.New("RecomputeSelective(nil): give the function that records the ops to recompute"))
		return
	}
	prev := b.selective
	b.selective = true
	defer func() { b.selective = prev }()
	fn()
}

// KeepFP32 runs fn and keeps the ops it records, and their gradients, in
// fp32 under --precision fp16 or bf16: their arguments are cast up and
// their weights read from the fp32 masters (a MoE router, say, whose
// softmax decides where tokens go). A param declared inside fn is a policy
// of its own: every op that reads it, wherever it is recorded, stays fp32.
func (b *Builder) KeepFP32(fn func()) {
	prev := b.precision
	b.precision = ir.F32
	defer func() { b.precision = prev }()
	fn()
}

// Init says how a parameter starts.
type Init string

// Initialisers: Normal(std) draws from N(0, std²); Zeros and Ones fill.
const (
	Zeros Init = "zeros"
	Ones  Init = "ones"
)

// Normal is a N(0, std²) initialiser.
func Normal(std float64) Init { return Init("normal(" + strconv.FormatFloat(std, 'g', -1, 64) + ")") }

// Parallel is a tensor-parallel hint on a parameter.
type Parallel string

// The hints the shard pass understands.
const (
	NoParallel     Parallel = ""
	ColumnParallel Parallel = "column" // weight [in,out] split on out
	RowParallel    Parallel = "row"    // weight [in,out] split on in; output partial
	VocabParallel  Parallel = "vocab"  // embedding [V,h] split on V
)

// OutIn marks a hint as applying to a weight stored [out,in] (torch's
// nn.Linear and Hugging Face's layout, used as y = x·Wᵀ) rather than
// GPT-2's [in,out]: a column-parallel [out,in] weight splits its rows, a
// row-parallel one its columns. NoParallel stays NoParallel.
func (p Parallel) OutIn() Parallel {
	if p == NoParallel {
		return p
	}
	return p + ",out_in"
}

// HeadParallel is the hint of grouped-query attention's k or v projection
// of heads·headDim outputs: column-parallel by whole heads when tensor
// parallelism divides the head count, replicated otherwise (each device
// then computes every k/v head and uses those its query heads share).
func HeadParallel(headDim int) Parallel { return Parallel(fmt.Sprintf("heads:%d", headDim)) }

// FusedColumnParallel is a column-parallel weight whose output columns are
// k projections side by side (q, k, v: k = 3); each rank takes its slice of
// every block, as Megatron-LM lays out its fused QKV weight.
func FusedColumnParallel(k int) Parallel { return Parallel(fmt.Sprintf("column:%d", k)) }

// CheckParallelHint is checkHint for a hint read back from a .gir, whose
// params were not declared through a Builder.
func CheckParallelHint(hint string, shape []int) error { return checkHint(Parallel(hint), shape) }

// checkHint checks a parallel hint's spelling and that it fits a param of
// the given shape (its rank, and whole heads or fused blocks on the dim
// it splits), so a mistake is named at the model's line on one device
// too, not only once a plan splits over tp (where the shard pass reads it).
func checkHint(hint Parallel, shape []int) error {
	rank := len(shape)
	h := string(hint)
	if h == "" {
		return nil
	}
	if inner, ok := strings.CutPrefix(h, "expert"); ok && (inner == "" || inner[0] == '|') {
		inner = strings.TrimPrefix(inner, "|")
		switch {
		case inner != "" && inner != "column" && inner != "row":
			return fmt.Errorf("parallel hint %q: within an expert only column or row splits exist", h)
		case rank != 3:
			return fmt.Errorf("parallel hint %q: an expert weight is [experts, in, out], not rank %d", h, rank)
		}
		return nil
	}
	split, layout, hasLayout := strings.Cut(h, ",")
	kind, count, hasCount := strings.Cut(split, ":")
	if hasCount {
		if n, err := strconv.Atoi(count); err != nil || n < 1 {
			return fmt.Errorf("parallel hint %q: %q is not a positive count", h, count)
		}
	}
	fits := map[string][]int{"column": {1, 2}, "row": {2}, "vocab": {2}, "heads": {1, 2}}[kind]
	switch {
	case fits == nil:
		return fmt.Errorf("parallel hint %q: unknown split %q (column, row, vocab, heads:N, column:K, expert…; see frontend.Parallel)", h, kind)
	case kind == "heads" && !hasCount:
		return fmt.Errorf("parallel hint %q: heads needs the head width, heads:N (HeadParallel)", h)
	case hasLayout && (layout != "out_in" || rank != 2 || kind == "vocab"):
		return fmt.Errorf("parallel hint %q: a layout (,out_in) applies to a column or row matrix", h)
	case !slices.Contains(fits, rank):
		return fmt.Errorf("parallel hint %q does not fit a param of rank %d", h, rank)
	}
	if !hasCount {
		return nil
	}
	// The dim split (as the shard pass splits it): a column matrix's
	// outputs, a row or vocabulary matrix's inputs, a vector's only dim;
	// out_in swaps a matrix's.
	dim := 0
	if rank == 2 && (kind == "column" || kind == "heads") {
		dim = 1
	}
	if hasLayout {
		dim = 1 - dim
	}
	n, _ := strconv.Atoi(count)
	if shape[dim]%n != 0 {
		if kind == "heads" {
			return fmt.Errorf("parallel hint %q: dim %d of the param %v (%d) is not a whole number of %d-wide heads", h, dim, shape, shape[dim], n)
		}
		return fmt.Errorf("parallel hint %q: dim %d of the param %v (%d) does not split into %d fused blocks", h, dim, shape, shape[dim], n)
	}
	return nil
}

// Param declares a trainable parameter (fp32 unless Config.Float says otherwise).
func (b *Builder) Param(name string, shape []int, init Init, hint Parallel) *Tensor {
	// Named and initialised as the weights files and the runtime need,
	// checked here so the error names the line, not a save after training.
	if err := ir.CheckParamName(name); err != nil {
		b.fail(userPos(), err)
		return &Tensor{b: b}
	}
	if err := checkHint(hint, shape); err != nil {
		b.fail(userPos(), fmt.Errorf("param %q: %w", name, err))
		return &Tensor{b: b}
	}
	if init == "" {
		// The IR reads a missing init as zeros; written in a model it is
		// a forgotten argument, not a choice.
		b.fail(userPos(), fmt.Errorf("param %q: no init given (want frontend.Normal(std), frontend.Zeros or frontend.Ones)", name))
		return &Tensor{b: b}
	}
	if _, _, err := ir.ParseInit(string(init)); err != nil {
		b.fail(userPos(), fmt.Errorf("param %q: %w", name, err))
		return &Tensor{b: b}
	}
	attrs := ir.Attrs{"name": name, "init": string(init)}
	if hint != NoParallel {
		attrs["parallel"] = string(hint)
	}
	return b.source("param", ir.T(b.cfg.Float, shape...), attrs)
}

// Constant declares a table the model computes once, while it is
// recorded (RoPE's cos and sin, a fixed mask): values in row-major order,
// one per element of shape, in the model's float dtype. It is the same on
// every device and every step: never split over the batch, never trained,
// never saved.
func (b *Builder) Constant(name string, values []float64, shape ...int) *Tensor {
	n, err := ir.Shape(shape).Elements()
	if err != nil {
		b.fail(userPos(), fmt.Errorf("constant %q: %w", name, err))
		return &Tensor{b: b}
	}
	if int64(len(values)) != n {
		b.fail(userPos(), fmt.Errorf("constant %q: %d values for shape %v (%d elements)", name, len(values), shape, n))
		return &Tensor{b: b}
	}
	if name == "" {
		b.fail(userPos(), fmt.Errorf("constant: a table needs a name"))
		return &Tensor{b: b}
	}
	if i := slices.IndexFunc(values, math.IsNaN); i >= 0 {
		b.fail(userPos(), fmt.Errorf("constant %q: value %d is NaN, which would make every value computed from it NaN", name, i))
		return &Tensor{b: b}
	}
	return b.source("const", ir.T(b.cfg.Float, shape...), ir.Attrs{"name": name, "data": ir.FormatConstData(values)})
}

// Input declares a per-step batch input fed by the runtime (e.g.
// "tokens"): dim 0 is the batch, split over data-parallel ranks and
// microbatches.
func (b *Builder) Input(name string, dtype ir.DType, shape ...int) *Tensor {
	return b.source("input", ir.T(dtype, shape...), ir.Attrs{"name": name})
}

// WholeInput declares a per-step input that is not a batch: every device
// and every microbatch gets all of it (position ids shared by the batch's
// rows, a per-step table). The runtime feeds it by name like any input.
func (b *Builder) WholeInput(name string, dtype ir.DType, shape ...int) *Tensor {
	if name == ir.InputTokens || name == ir.InputTargets || name == ir.InputRandomKey {
		// Fed the batch's rows, cut over dp ranks and microbatches: held
		// whole, it met the rows of the other inputs only in the shard
		// pass, blamed on the first op that mixed them.
		b.live()
		b.fail(userPos(), fmt.Errorf("input %q is declared with b.WholeInput, but training feeds it the batch's rows, split over data-parallel ranks and microbatches: declare it with b.Input", name))
		return &Tensor{b: b}
	}
	return b.source("input", ir.T(dtype, shape...), ir.Attrs{"name": name, "whole": true})
}

func (b *Builder) source(op string, t ir.Type, attrs ir.Attrs) *Tensor {
	b.live()
	pos := userPos()
	if len(b.errs) > 0 && slices.Contains(t.Shape, 0) {
		// The size came from a poisoned tensor; its error is already reported.
		return &Tensor{b: b}
	}
	if name := attrs.Str("name"); (op == "input" || op == "state") && ir.BadName(name) {
		// Fed (an input) or saved (a state) by it: a name no flag,
		// weights file or dump can carry is refused where it is written.
		b.fail(pos, fmt.Errorf("%s name %q: want a non-empty name of printable UTF-8 without spaces or quotes (the runtime feeds and saves %ss by name)", op, name, op))
		return &Tensor{b: b}
	}
	if first := b.sources[attrs.Str("name")]; first != nil {
		if first.Op != op {
			// Params, states and inputs share one namespace.
			b.fail(pos, fmt.Errorf("%s %q: the name is already %s %q's (at %v); params, states and inputs each need a name of their own", op, attrs.Str("name"), first.Op, attrs.Str("name"), first.Pos))
		} else {
			b.fail(pos, fmt.Errorf("%s %q is declared twice (first at %v)", op, attrs.Str("name"), first.Pos))
		}
		return &Tensor{b: b}
	}
	// Shapes of sources are where user sizes (--set, --batch) enter the
	// IR; the error names the tensor, which AddSource's cannot.
	if err := ir.CheckType(t); err != nil {
		b.fail(pos, fmt.Errorf("%s %q: %w", op, attrs.Str("name"), err))
		return &Tensor{b: b}
	}
	v, err := b.m.AddSource(op, t, attrs, b.sourceMeta(op), pos)
	if err != nil {
		b.report(err)
		return &Tensor{b: b}
	}
	b.sources[attrs.Str("name")] = v
	return &Tensor{b: b, v: v}
}

// Loss marks t (a scalar) as the value training minimises.
func (b *Builder) Loss(t *Tensor) {
	b.live()
	if b.foreign(userPos(), t) {
		return
	}
	if t.v == nil {
		// Poisoned: the error that poisoned it is the one to report, and
		// finish says so if none was.
		if b.lossAt == "" {
			b.lossAt = userPos().String()
		}
		return
	}
	if t.v.Type.Rank() != 0 || !t.v.Type.DType.IsFloat() {
		b.fail(userPos(), fmt.Errorf("loss must be a float scalar, got %v", t.v.Type))
		return
	}
	if b.lossAt != "" {
		// A second call would silently replace the first: one of them is
		// not what the model means to minimise.
		b.fail(userPos(), fmt.Errorf("b.Loss called twice: the loss was set at %s already", b.lossAt))
		return
	}
	b.lossAt = userPos().String()
	b.m.SetOutput(ir.OutputLoss, t.v)
}

// ExportConfig declares the model's configuration as another framework
// reads it beside its weights: for a model with Hugging Face's names,
// the fields of its config.json (model_type, architectures, sizes,
// epsilons, rotary base). gcompile export writes it as config.json next
// to the weights, with vocab_size set to the rows it writes when the
// vocabulary was padded for the data. The model declares the values it
// computes with, so a user loading the export gets the same maths, not a
// library's defaults (Llama's rms_norm_eps, GPT-2's n_positions).
func (b *Builder) ExportConfig(cfg map[string]any) {
	pos := userPos()
	if b.exportConfigAt != "" {
		b.fail(pos, fmt.Errorf("ExportConfig called twice: the configuration was declared at %s already", b.exportConfigAt))
		return
	}
	b.exportConfigAt = pos.String()
	if cfg == nil {
		b.fail(pos, errors.New("ExportConfig(nil): give the configuration's fields"))
		return
	}
	for k := range cfg {
		if k == "" {
			b.fail(pos, errors.New("ExportConfig: an empty key"))
			return
		}
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		err = fmt.Errorf("%v: ExportConfig: %w (the values must be JSON: numbers, strings, bools, lists, maps, nil)", pos, err)
		var bad *json.UnsupportedValueError
		if errors.As(err, &bad) {
			// An infinite value here most often came from a --set value
			// that an op or the model names too: said at the end, only if
			// nothing else was (finish).
			b.exportErr = err
			return
		}
		b.report(err)
		return
	}
	b.m.ExportConfig = string(raw)
}

// IgnoreOnLoad names tensors a checkpoint of this model's family may hold
// that the model has no use for (path.Match patterns, e.g. GPT-2's causal
// mask buffers "h.*.attn.bias"): --load skips them, and refuses any other
// tensor that is not one of the model's params.
func (b *Builder) IgnoreOnLoad(patterns ...string) {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			b.fail(userPos(), fmt.Errorf("IgnoreOnLoad(%q): %w", p, err))
			continue
		}
		b.m.IgnoreOnLoad = append(b.m.IgnoreOnLoad, p)
	}
}

// Output reports the scalar t each step under name, beside the loss (in
// the metrics as outputs.NAME): a MoE load-balancing loss, a router's
// entropy, an accuracy. Like the loss it is averaged over microbatches and
// over data-parallel ranks, so it must be a mean over the batch's rows for
// the figure not to depend on the plan. It is not trained on; add it to
// the loss for that.
func (b *Builder) Output(name string, t *Tensor) {
	b.live()
	pos := userPos()
	switch {
	case b.foreign(pos, t), t.v == nil:
		return
	case name == "" || strings.ContainsAny(name, " \t\n\"/"):
		b.fail(pos, fmt.Errorf("output name %q: want a non-empty name without spaces, quotes or slashes", name))
	case slices.Contains([]string{"loss", "lr", "step"}, name):
		// The step line prints outputs beside these, by name.
		b.fail(pos, fmt.Errorf("output name %q: the step line and the metrics print the run's own %s under it; give the output another name", name, name))
	case t.v.Type.Rank() != 0 || !t.v.Type.DType.IsFloat():
		b.fail(pos, fmt.Errorf("output %q must be a float scalar, got %v (reduce it, e.g. with Mean())", name, t.v.Type))
	case b.m.Output(ir.AuxPrefix+name) != nil:
		b.fail(pos, fmt.Errorf("output %q is declared twice", name))
	default:
		b.m.SetOutput(ir.AuxPrefix+name, t.v)
	}
}

// scalarConst returns a shared rank-0 constant.
func (b *Builder) scalarConst(x float64, pos ir.Pos) *ir.Value {
	if v, ok := b.scalar[x]; ok {
		return v
	}
	v, _ := b.m.AddSource("const", ir.T(b.cfg.Float), ir.Attrs{"value": x}, b.sourceMeta("const"), pos)
	b.scalar[x] = v
	return v
}

// libraryPrefixes are the packages whose frames userPos skips: the
// frontend itself, its layer libraries (everything under
// gcompile/frontend/), and packages registered with RegisterLibrary.
var libraryPrefixes = []string{"gcompile/frontend.", "gcompile/frontend/"}

// RegisterLibrary makes ops recorded inside the package with import path
// pkgPath (a layer library of the user's own) report the line of the call
// into it, as ops recorded inside package nn do. Call it from an init
// function.
func RegisterLibrary(pkgPath string) {
	libraryPrefixes = append(libraryPrefixes, pkgPath+".")
}

// userPos is the position of the first caller outside the frontend and
// the layer libraries: for an op recorded inside nn.CausalAttention
// called from gpt2.Attention, that is the user's gpt2.Block call.
func userPos() ir.Pos {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		inside := strings.HasPrefix(f.Function, "runtime.")
		for _, p := range libraryPrefixes {
			inside = inside || strings.HasPrefix(f.Function, p)
		}
		if !inside && f.File != "" {
			return ir.Pos{File: filepath.Base(f.File), Line: f.Line}
		}
		if !more {
			return ir.Pos{}
		}
	}
}

// ExpertParallel is the hint of a mixture-of-experts weight [E, …]: its
// experts are split over the ep axis, and within each expert it is split
// over tp as p says of an [in,out] matrix (ColumnParallel,
// RowParallel, or NoParallel for none).
func ExpertParallel(p Parallel) Parallel {
	if p == NoParallel {
		return "expert"
	}
	return "expert|" + p
}

// Layouts of the pieces a stacked param is saved as (SaveEach).
const (
	PieceAsHeld = ir.PieceAsHeld // each piece as the param holds its slice
	PieceOutIn  = ir.PieceOutIn  // each [in,out] slice stored [out,in] (torch's nn.Linear)
)

// SaveEach declares that param p, a stack of p.Dim(0) tensors (a MoE
// layer's experts, [E, in, out]), is written by --save and export, and
// read by --load, as that many tensors of their own: slice i under
// template with "{e}" replaced by i, laid out as layout says (PieceAsHeld
// or PieceOutIn). The program holds, shards (ep splits the stack) and
// checkpoints p as one tensor; only files exchanged with other tools hold
// the pieces, named as those tools name them (Hugging Face Mixtral's
// "model.layers.0.block_sparse_moe.experts.{e}.w1.weight", PieceOutIn).
func (b *Builder) SaveEach(p *Tensor, template, layout string) {
	pos := userPos()
	if b.foreign(pos, p) || p.v == nil {
		return // its error is reported already
	}
	if p.v.Op != "param" {
		b.fail(pos, fmt.Errorf("SaveEach(%q): its tensor is the result of %s at %v, not a param (SaveEach names the pieces of a param b.Param declared)", template, p.v.Op, p.v.Pos))
		return
	}
	if _, ok := p.v.Attrs[ir.AttrSaveEach]; ok {
		b.fail(pos, fmt.Errorf("SaveEach(%q): param %q is already saved as %q", template, p.v.Name(), p.v.Attrs.Str(ir.AttrSaveEach)))
		return
	}
	s := ir.SaveEach{Template: template, Layout: layout}
	if err := s.Check(p.v.Type.Shape); err != nil {
		b.fail(pos, fmt.Errorf("SaveEach of param %q: %w", p.v.Name(), err))
		return
	}
	p.v.Attrs[ir.AttrSaveEach] = template
	if layout != PieceAsHeld {
		p.v.Attrs[ir.AttrSaveLayout] = layout
	}
}

// Evaluating reports whether the module is being built for evaluation
// rather than training. A model that asks may record other shapes for
// evaluation (a MoE layer's evaluation capacity factor); the compiler
// then builds the model a second time for evaluation and lowers that
// module's forward on its own, with the training run's params.
func (b *Builder) Evaluating() bool {
	b.m.EvalDiffers = true
	return b.cfg.Eval || b.cfg.Generate != nil
}
