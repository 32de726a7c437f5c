package ir

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
)

// AttrKind is the Go type an attribute holds.
type AttrKind uint8

// Attribute kinds and their Go types.
const (
	AttrInt    AttrKind = iota // int
	AttrInts                   // []int
	AttrFloat                  // float64
	AttrString                 // string
	AttrBool                   // bool
)

func (k AttrKind) String() string {
	return [...]string{"int", "ints", "float", "string", "bool"}[k]
}

// AttrSpec declares one attribute of an op.
type AttrSpec struct {
	Name     string
	Kind     AttrKind
	Required bool
}

// Variadic is the Arity of ops that take one or more arguments.
const Variadic = -1

// OpInfo is an op's entry in the op table. It holds every fact about the
// op that more than one pass or backend needs, so they look facts up here
// instead of keeping their own lists of op names.
type OpInfo struct {
	// Name is the op's name in modules and .gir text, and the key under
	// which package passes finds its VJP and sharding rule and each
	// backend its kernel.
	Name  string
	Arity int // number of args, or Variadic
	Attrs []AttrSpec
	// Source ops (param, state, input, const) take no args; their type is
	// declared, not inferred.
	Source bool
	// Elementwise ops map equal-shaped inputs to an output of that shape
	// element by element; fusion and sharding treat them alike.
	Elementwise bool
	// Infer computes the result type from argument types and attributes;
	// its error says which rule the arguments break.
	Infer func(args []Type, a Attrs) (Type, error)
	Doc   string

	// Grad says how autodiff treats the op: through its VJP (the zero
	// value), as a constant (NoGrad), or as an error (GradNotImplemented).
	// Source ops have no arguments and need none.
	Grad GradKind
	// NoGradArgs lists the arguments no gradient flows to, whatever their
	// dtype: integer ids and labels, masks, counts. Autodiff does not
	// differentiate with respect to them and drops what a VJP returns
	// there (nil, by convention). An argument of a non-float dtype never
	// gets a gradient either.
	NoGradArgs []int
	// Update is the op's part in the optimizer step.
	Update UpdateRole
	// InPlace ops may write their result over their argument InPlaceArg
	// (the first unless set): their kernels read each element (or a
	// row's elements) before writing it. The lowering does so when the op
	// computes a state's update and is the state's last reader, and for a
	// temporary argument of an op that updates nothing (the loss's
	// gradient over its logits) when the op is its last reader and no
	// side-stream op reads it (lower.overwriteLastReads).
	InPlace    bool
	InPlaceArg int
	// Precision is the op's class under mixed precision.
	Precision PrecisionClass
	// F32Args lists the arguments that stay fp32 (float64 in a float64
	// program) when the op runs in fp16 or bf16: statistics another op
	// computed in fp32 for it, which a 16-bit copy would spoil (the
	// attention gradients' log-sum-exp). The mixed-precision pass does not
	// cast them down.
	F32Args []int
	// Cost gives the flops and bytes of one execution on device-local
	// types, by the conventions in cost.go. Every op has one.
	Cost CostFunc
}

// HasGrad reports whether a gradient flows from the op's result to its
// argument i (for an argument of a float dtype).
func (o *OpInfo) HasGrad(i int) bool {
	return o.Grad != NoGrad && !slices.Contains(o.NoGradArgs, i)
}

// Spec returns the declaration of the named attribute.
func (o *OpInfo) Spec(name string) (AttrSpec, bool) {
	for _, s := range o.Attrs {
		if s.Name == name {
			return s, true
		}
	}
	return AttrSpec{}, false
}

var opTable = map[string]*OpInfo{}

// Lookup returns the op table entry for name.
func Lookup(name string) (*OpInfo, bool) {
	o, ok := opTable[name]
	return o, ok
}

// OpNames lists every op in the table, sorted.
func OpNames() []string {
	names := make([]string, 0, len(opTable))
	for n := range opTable {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// metaKeys are printed in the same {...} as attributes, so no op may use them.
var metaKeys = []string{"place", "layer", "phase", "stage", "chunk", "micro"}

// Register adds an op to the table, so that modules, the .gir parser and
// the verifier know it. Package passes then needs its VJP (unless its Grad
// says otherwise) and its sharding rule, and each backend its kernel, all
// found by the op's name. Register refuses an entry that breaks the
// table's rules or whose name is taken. Call it from an init function or
// before any module uses the op: the table is not guarded for concurrent
// use.
func Register(o *OpInfo) error {
	if err := checkOpInfo(o); err != nil {
		return err
	}
	if _, dup := opTable[o.Name]; dup {
		return fmt.Errorf("ir: op %s is already registered", o.Name)
	}
	opTable[o.Name] = o
	return nil
}

// register adds a built-in op; a broken built-in entry is a programming
// error, found when the package is loaded.
func register(o *OpInfo) {
	if err := Register(o); err != nil {
		panic(err)
	}
}

// checkOpInfo checks an entry against the rules every op follows.
func checkOpInfo(o *OpInfo) error {
	if o == nil {
		return errors.New("ir: nil op entry")
	}
	if !validOpName(o.Name) {
		return fmt.Errorf("ir: op name %q must be a lower-case letter followed by letters, digits or underscores", o.Name)
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("ir: op %s: %s", o.Name, fmt.Sprintf(format, args...))
	}
	for _, s := range o.Attrs {
		if slices.Contains(metaKeys, s.Name) {
			return fail("uses reserved attribute name %s", s.Name)
		}
	}
	if o.Cost == nil {
		return fail("has no cost function")
	}
	if o.Grad > GradNotImplemented || o.Update > UpdateFromGrad || o.Precision > PrecisionF32 {
		return fail("grad %d, update role %d or precision class %d is not defined", o.Grad, o.Update, o.Precision)
	}
	if o.Source {
		if o.Arity != 0 || o.Infer != nil {
			return fail("a source op takes no args and declares its type, so it has no arity or type rule")
		}
		if o.Update != NoUpdate || o.InPlace || len(o.NoGradArgs) > 0 || len(o.F32Args) > 0 {
			return fail("a source op has no arguments to update, overwrite or stop gradients at")
		}
		return nil
	}
	if o.Infer == nil {
		return fail("has no type rule")
	}
	if o.Arity < 1 && o.Arity != Variadic {
		return fail("arity %d: an op takes at least one arg, or is Variadic", o.Arity)
	}
	for _, i := range o.NoGradArgs {
		if i < 0 || o.Arity != Variadic && i >= o.Arity {
			return fail("no-gradient argument %d is out of range for arity %d", i, o.Arity)
		}
	}
	for _, i := range o.F32Args {
		if i < 0 || o.Arity != Variadic && i >= o.Arity {
			return fail("fp32 argument %d is out of range for arity %d", i, o.Arity)
		}
	}
	if o.InPlaceArg < 0 || o.InPlaceArg > 0 && (!o.InPlace || o.Arity != Variadic && o.InPlaceArg >= o.Arity) {
		return fail("in-place argument %d is out of range for arity %d, or the op is not InPlace", o.InPlaceArg, o.Arity)
	}
	if o.Update == UpdateFromGrad && o.Arity != Variadic && o.Arity <= UpdateGradArg {
		return fail("an update from a gradient reads it from argument %d, but the op takes %d", UpdateGradArg, o.Arity)
	}
	return nil
}

func validOpName(name string) bool {
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z':
		case i > 0 && (r >= '0' && r <= '9' || r == '_'):
		default:
			return false
		}
	}
	return name != ""
}

func req(name string, k AttrKind) AttrSpec { return AttrSpec{Name: name, Kind: k, Required: true} }
func opt(name string, k AttrKind) AttrSpec { return AttrSpec{Name: name, Kind: k} }

func init() {
	src := func(name, doc string, attrs ...AttrSpec) {
		register(&OpInfo{Name: name, Source: true, Attrs: attrs, Doc: doc, Cost: noCost})
	}
	src("param", "trainable parameter (fp32 master copy); init is normal(std), zeros or ones; parallel is the tensor-parallel hint (column, row, vocab); save_each (with save_layout) names the tensors weight files hold for each slice of its first dim (SaveEach)",
		req("name", AttrString), opt("init", AttrString), opt("parallel", AttrString), opt(AttrSaveEach, AttrString), opt(AttrSaveLayout, AttrString))
	src("state", "optimizer state carried between steps, zero-initialised", req("name", AttrString), opt("init", AttrString))
	src("input", "per-step input fed by the runtime (tokens, targets, lr, step); split over the batch on dim 0 unless whole; limit bounds its values (generation's positions: the rows of a position table)",
		req("name", AttrString), opt("whole", AttrBool), opt("limit", AttrInt))
	src("const", "tensor filled with one value, or, with data, a table the model computed (named: the same on every device, never split over the batch)",
		opt("value", AttrFloat), opt("name", AttrString), opt("data", AttrString))

	// Elementwise flops per element follow the kernels' formulas; a
	// transcendental counts TranscendentalFlops (cost.go).
	const tr = TranscendentalFlops
	for _, n := range []string{"add", "sub", "mul", "div"} {
		// Each element is read before it is written: the result may
		// take its first argument's buffer where that is the last read
		// (a tied table's two gradient parts summed over the first).
		register(&OpInfo{Name: n, Arity: 2, Elementwise: true, Infer: sameTypes(false), InPlace: true, Cost: perOut(1), Doc: "elementwise " + n + "; shapes must be equal (use broadcast)"})
	}
	for n, flops := range map[string]int64{"neg": 1, "exp": tr, "log": tr, "tanh": tr, "sqrt": tr, "gelu": 8 + tr, "relu": 1, "silu": 3 + tr} {
		register(&OpInfo{Name: n, Arity: 1, Elementwise: true, Infer: sameTypes(true), Cost: perOut(flops), Doc: "elementwise " + n})
	}
	// The VJPs' own ops are made after autodiff: none has a VJP of its own.
	for n, flops := range map[string]int64{"gelu_grad": 18 + tr, "relu_grad": 1, "silu_grad": 6 + tr} {
		register(&OpInfo{Name: n, Arity: 2, Elementwise: true, Infer: sameTypes(true), Grad: GradNotImplemented, Cost: perOut(flops), Doc: "vjp: args (x, dy)"})
	}
	// Gist's binarized ReLU stash: relu_grad needs only the sign of x, so
	// the backward can read a 1-bit mask instead of the fp32 input.
	register(&OpInfo{Name: "relu_mask", Arity: 1, Infer: inferReluMask, Grad: NoGrad, Cost: perArg(0, 1),
		Doc: "x[...,n] (float) → u8[...,⌈n/8⌉]: bit j of byte k of a row is x[8k+j] > 0; each row starts on a byte, unused high bits are 0"})
	register(&OpInfo{Name: "relu_grad_mask", Arity: 2, Infer: inferReluGradMask, Grad: GradNotImplemented, NoGradArgs: []int{0}, Cost: perOut(1),
		Doc: "vjp of relu from its mask: args (mask u8[...,⌈n/8⌉], dy[...,n]); dy where the bit is set, else 0 (relu_grad without x)"})
	register(&OpInfo{Name: "tanh_grad", Arity: 2, Elementwise: true, Infer: sameTypes(true), Grad: GradNotImplemented, Cost: perOut(3), Doc: "vjp of tanh: args (y, dy), dy·(1−y²)"})
	register(&OpInfo{Name: FusedOp, Arity: Variadic, Elementwise: true, Attrs: []AttrSpec{req("body", AttrString)}, Infer: inferFused, Grad: GradNotImplemented, Cost: fusedCost,
		Doc: "a group of elementwise ops merged by the fuse pass: args are its external inputs, body the ops over them (FusedBody)"})
	register(&OpInfo{Name: "scale", Arity: 2, Infer: inferScale, Cost: perOut(1), Doc: "x times a scalar of the same dtype"})

	register(&OpInfo{Name: "matmul", Arity: 2, Attrs: []AttrSpec{opt("transA", AttrBool), opt("transB", AttrBool)}, Infer: inferMatMul, Cost: matmulCost,
		Doc: "a[...,m,k]·b[k,n] (b shared) or a[...,m,k]·b[...,k,n] (batched); transA/transB read the last two dims swapped"})
	register(&OpInfo{Name: "reshape", Arity: 1, Attrs: []AttrSpec{req("shape", AttrInts)}, Infer: inferReshape, Cost: noCost})
	register(&OpInfo{Name: "transpose", Arity: 1, Attrs: []AttrSpec{req("perm", AttrInts)}, Infer: inferTranspose, Cost: moveCost})
	register(&OpInfo{Name: "slice", Arity: 1, Attrs: []AttrSpec{req("dim", AttrInt), req("start", AttrInt), req("end", AttrInt)}, Infer: inferSlice, Cost: sliceCost})
	register(&OpInfo{Name: "slice_grad", Arity: 1, Attrs: []AttrSpec{req("dim", AttrInt), req("start", AttrInt), req("size", AttrInt)}, Infer: inferSliceGrad, Cost: moveCost,
		Doc: "vjp of slice: dy placed at [start, start+len) along dim of a zero tensor of extent size"})
	// Grouped-query attention shares each k/v head among `repeats` query
	// heads: repeat_interleave copies them out, its vjp sums the copies.
	register(&OpInfo{Name: "repeat_interleave", Arity: 1, Attrs: []AttrSpec{req("dim", AttrInt), req("repeats", AttrInt)}, Infer: inferRepeatInterleave, Cost: moveCost,
		Doc: "each slice along dim repeated `repeats` times in place: out[..,i,..] = x[..,i/repeats,..] (Hugging Face's repeat_kv on the heads dim)"})
	register(&OpInfo{Name: "repeat_interleave_grad", Arity: 1, Attrs: []AttrSpec{req("dim", AttrInt), req("repeats", AttrInt)}, Infer: inferRepeatInterleaveGrad, Grad: GradNotImplemented, Cost: perArg(0, 1),
		Doc: "vjp of repeat_interleave: out[..,j,..] = Σ_r dy[..,j·repeats+r,..]"})
	register(&OpInfo{Name: "concat", Arity: Variadic, Attrs: []AttrSpec{req("dim", AttrInt)}, Infer: inferConcat, Cost: moveCost})
	register(&OpInfo{Name: "broadcast", Arity: 1, Attrs: []AttrSpec{req("shape", AttrInts)}, Infer: inferBroadcast, Cost: moveCost, Doc: "NumPy broadcast to shape"})
	for n, cost := range map[string]CostFunc{"reduce_sum": perArg(0, 1), "reduce_mean": reduceMeanCost, "reduce_max": perArg(0, 1)} {
		register(&OpInfo{Name: n, Arity: 1, Attrs: []AttrSpec{req("axes", AttrInts), opt("keepdims", AttrBool)}, Infer: inferReduce, Cost: cost})
	}
	// Per element of x: a compare to count the maxima, a compare and a
	// divide to share dy among them.
	register(&OpInfo{Name: "reduce_max_grad", Arity: 3, Attrs: []AttrSpec{req("axes", AttrInts), opt("keepdims", AttrBool)}, Infer: inferReduceMaxGrad, Grad: GradNotImplemented, Cost: perArg(0, 3),
		Doc: "vjp of reduce_max: args (x, y, dy); dy split evenly among the maxima"})
	// Per element: max, subtract, exp, sum, divide.
	register(&OpInfo{Name: "softmax", Arity: 1, Infer: inferFloatRank1, Cost: perOut(4 + tr), Doc: "softmax over the last dim"})
	// Per element: y·dy summed (2), dy − Σ, times y.
	register(&OpInfo{Name: "softmax_grad", Arity: 2, Infer: sameTypes(true), Grad: GradNotImplemented, Cost: perOut(4), Doc: "vjp of softmax: args (y, dy)"})
	register(&OpInfo{Name: "causal_mask", Arity: 1, Attrs: []AttrSpec{opt("fill", AttrFloat)}, Infer: inferCausalMask, Cost: perOut(1),
		Doc: "x[...,s,t]: entries with key j > i+(t−s) set to fill (default −Inf)"})
	// Per element: the mean's sum, centring, the variance's square and
	// sum, normalising, γ and β (7). The gradients recompute the mean and
	// variance (4), then x̂ (1); grad_x adds g = dy·γ, Σg, Σg·x̂ and
	// rstd·(g − mean g − x̂·mean g·x̂) (8), grad_gamma Σdy·x̂ (2).
	register(&OpInfo{Name: "layernorm", Arity: 3, Attrs: []AttrSpec{req("eps", AttrFloat)}, Infer: inferLayerNorm, Cost: perOut(7), Doc: "args (x, gamma, beta), over the last dim"})
	register(&OpInfo{Name: "layernorm_grad_x", Arity: 3, Attrs: []AttrSpec{req("eps", AttrFloat)}, Infer: inferLayerNormGradX, Grad: GradNotImplemented, Cost: perOut(13), Doc: "vjp: args (x, gamma, dy)"})
	register(&OpInfo{Name: "layernorm_grad_gamma", Arity: 2, Attrs: []AttrSpec{req("eps", AttrFloat)}, Infer: inferLayerNormGradGamma, Grad: GradNotImplemented, Cost: perArg(0, 7), Doc: "vjp: args (x, dy)"})
	// RMSNorm (Zhang & Sennrich 2019) as Llama uses it: no centring and no
	// β. Per element: the square and sum (2), normalising and γ (2); the
	// gradients recompute the statistic (2) and x̂ (1), grad_x adds g =
	// dy·γ, Σg·x̂ and rstd·(g − x̂·mean g·x̂) (5), grad_gamma Σdy·x̂ (2).
	register(&OpInfo{Name: "rmsnorm", Arity: 2, Attrs: []AttrSpec{req("eps", AttrFloat)}, Infer: inferRMSNorm, Cost: perOut(4),
		Doc: "args (x, gamma): x/√(mean(x²)+eps)·γ over the last dim, the statistic in float64"})
	register(&OpInfo{Name: "rmsnorm_grad_x", Arity: 3, Attrs: []AttrSpec{req("eps", AttrFloat)}, Infer: inferLayerNormGradX, Grad: GradNotImplemented, Cost: perOut(8), Doc: "vjp: args (x, gamma, dy)"})
	register(&OpInfo{Name: "rmsnorm_grad_gamma", Arity: 2, Attrs: []AttrSpec{req("eps", AttrFloat)}, Infer: inferLayerNormGradGamma, Grad: GradNotImplemented, Cost: perArg(0, 5), Doc: "vjp: args (x, dy)"})
	// Rotary position embedding (Su et al. 2021) in Hugging Face Llama's
	// rotate-half layout. Per element: a sine or cosine (shared by a pair,
	// so half a transcendental each), two multiplies and an add.
	register(&OpInfo{Name: "rope", Arity: 1, Attrs: []AttrSpec{req("theta", AttrFloat), opt("inverse", AttrBool)}, Infer: inferRoPE, Cost: perOut(3 + tr),
		Doc: "x[...,s,d] (d even): element pairs (i, i+d/2) of row p rotated by p·theta^(−2i/d) (inverse: by minus that, the vjp); angles in float64"})
	// Fused attention (attention.go): the forward, the statistics its
	// gradients share, and one op per gradient; none holds an [s, s]
	// tensor. scale multiplies the scores; causal hides key j > i+(sk−sq).
	attnAttrs := func() []AttrSpec { return []AttrSpec{req("scale", AttrFloat), opt("causal", AttrBool)} }
	register(&OpInfo{Name: "attention", Arity: 3, Attrs: attnAttrs(), Infer: inferAttention, Cost: attentionFwdCost,
		Doc: "args (q[b,h,sq,hd], k[b,kv,sk,hd], v[b,kv,sk,hd]), h a multiple of kv → [b,sq,h,hd]: softmax(scale·q·kᵀ, causal-masked when causal)·v, query head i reading k/v head i/(h/kv), blocked with an online softmax (no [sq,sk] tensor)"})
	register(&OpInfo{Name: "attention_stats", Arity: 4, Attrs: attnAttrs(), Infer: inferAttentionStats, Grad: GradNotImplemented, Cost: attentionStatsCost,
		Doc: "vjp: args (q, k, out[b,sq,h,hd], dout[b,sq,h,hd]) → f32[b,h,sq,2] (f64 in a float64 program): per query row the log-sum-exp of its scaled, masked scores and D = Σ dout·out"})
	register(&OpInfo{Name: "attention_grad_q", Arity: 5, Attrs: attnAttrs(), Infer: inferAttentionGrad(false), Grad: GradNotImplemented, F32Args: []int{4}, Cost: attentionGradQK,
		Doc: "vjp: args (q, k, v, dout, stats) → dq = scale·Σⱼ p·(dout·vⱼ − D)·kⱼ, p recomputed block by block from the log-sum-exp"})
	register(&OpInfo{Name: "attention_grad_k", Arity: 5, Attrs: attnAttrs(), Infer: inferAttentionGrad(true), Grad: GradNotImplemented, F32Args: []int{4}, Cost: attentionGradQK,
		Doc: "vjp: args (q, k, v, dout, stats) → dk = scale·Σᵢ p·(dout·v − D)·qᵢ over the query heads sharing the k/v head"})
	register(&OpInfo{Name: "attention_grad_v", Arity: 4, Attrs: attnAttrs(), Infer: inferAttentionGradV, Grad: GradNotImplemented, F32Args: []int{3}, Cost: attentionGradV,
		Doc: "vjp: args (q, k, dout, stats) → dv = Σᵢ pᵀ·doutᵢ over the query heads sharing the k/v head"})
	register(&OpInfo{Name: "embedding", Arity: 2, Infer: inferEmbedding, NoGradArgs: []int{1}, Cost: embeddingCost, Doc: "args (table[V,D], ids[...]) → [...,D]"})
	register(&OpInfo{Name: "embedding_grad", Arity: 2, Attrs: []AttrSpec{req("vocab", AttrInt)}, Infer: inferEmbeddingGrad, Grad: GradNotImplemented, NoGradArgs: []int{0}, Cost: embeddingGradCost,
		Doc: "vjp: args (ids, dy) → [vocab,D]"})
	// Per logit: max, subtract, exp, sum; the gradient adds the divide by
	// the sum and the scaling by dloss/N.
	register(&OpInfo{Name: "cross_entropy", Arity: 2, Infer: inferCrossEntropy, NoGradArgs: []int{1}, Precision: PrecisionF32, Cost: perArg(0, 3+tr),
		Doc: "args (logits[N,V], labels[N]) → mean loss"})
	// Its kernels read a row's logits before writing any of its
	// gradient, and each element before writing it: the lowering writes
	// the gradient over the logits when it reads them last.
	register(&OpInfo{Name: "cross_entropy_grad", Arity: 3, Infer: inferCrossEntropyGrad, Grad: GradNotImplemented, NoGradArgs: []int{1}, Precision: PrecisionF32, InPlace: true, Cost: perOut(5 + tr),
		Doc: "vjp: args (logits, labels, dloss)"})
	register(&OpInfo{Name: "cast", Arity: 1, Attrs: []AttrSpec{req("to", AttrString)}, Infer: inferCast, Cost: perOut(1)})

	// Collectives keep the global type; they change the placement on one
	// mesh axis (the verifier checks the before/after placements). The
	// shard pass makes them, after autodiff.
	register(&OpInfo{Name: "redistribute", Arity: 1, Infer: identity, Grad: GradNotImplemented, Cost: moveCost,
		Doc: "change placement to the value's own place; the redistribute pass expands it into the collectives below"})
	// round_each (16-bit operands only): every add is rounded to the
	// operand's format and the operand moves as it is, as a 16-bit NCCL
	// reduction does (--grad-reduce-dtype); without it a 16-bit operand is
	// summed in f32 and rounded once.
	register(&OpInfo{Name: "all_reduce", Arity: 1, Attrs: []AttrSpec{req("axis", AttrString), opt("bucket", AttrInt), opt("round_each", AttrBool)}, Infer: identity, Grad: GradNotImplemented, Cost: moveCost, Doc: "P → R on axis"})
	// blocks (default 1) is the number of fused blocks of dim, as in the
	// placement S(dim)xblocks: each device's part is its slice of every
	// block, so the collective treats dim as (blocks, dim/blocks) and splits
	// or joins the inner part.
	register(&OpInfo{Name: "reduce_scatter", Arity: 1, Attrs: []AttrSpec{req("axis", AttrString), req("dim", AttrInt), opt("bucket", AttrInt), opt("blocks", AttrInt), opt("round_each", AttrBool)}, Infer: inferBlocked,
		Grad: GradNotImplemented, Cost: moveCost, Doc: "P → S(dim)xblocks on axis"})
	register(&OpInfo{Name: "all_gather", Arity: 1, Attrs: []AttrSpec{req("axis", AttrString), req("dim", AttrInt), opt("blocks", AttrInt)}, Infer: inferBlocked,
		Grad: GradNotImplemented, Cost: moveCost, Doc: "S(dim)xblocks → R on axis"})
	register(&OpInfo{Name: "shard_slice", Arity: 1, Attrs: []AttrSpec{req("axis", AttrString), req("dim", AttrInt), opt("blocks", AttrInt)}, Infer: inferBlocked,
		Grad: GradNotImplemented, Cost: moveCost, Doc: "R → S(dim)xblocks on axis: each device keeps its slice of every block, no communication"})
	register(&OpInfo{Name: "all_to_all", Arity: 1, Attrs: []AttrSpec{req("axis", AttrString), req("from", AttrInt), req("to", AttrInt)}, Infer: identity,
		Grad: GradNotImplemented, Cost: moveCost, Doc: "S(from) → S(to) on axis"})

	register(&OpInfo{Name: "sum_squares", Arity: Variadic, Infer: inferSumSquares, Grad: GradNotImplemented, Cost: perArgs(2),
		Doc: "Σ x² over every element of every arg (for the global gradient norm)"})
	register(&OpInfo{Name: "nonfinite_count", Arity: Variadic, Infer: inferSumSquares, Grad: NoGrad, Cost: perArgs(2),
		Doc: "number of inf or NaN elements over every arg (mixed precision's overflow check; additive, so it reduces like sum_squares)"})
	register(&OpInfo{Name: "where_finite", Arity: 3, Infer: inferWhereFinite, Grad: GradNotImplemented, NoGradArgs: []int{0}, Cost: perOut(1),
		InPlace: true, InPlaceArg: 2,
		Doc: "args (count, new, old): new where the scalar count is 0, else old (mixed precision skips a step whose gradients overflowed); may write over old"})
	// √, +1e-6, max_norm/…, min.
	register(&OpInfo{Name: "clip_coef", Arity: 1, Attrs: []AttrSpec{req("max_norm", AttrFloat)}, Infer: inferScalarFloat(1), Grad: GradNotImplemented, Cost: scalarCost(3 + tr),
		Doc: "min(1, max_norm/(√sumsq+1e-6)), the global-norm clipping factor"})

	// Optimizer updates write the new value of their first argument over
	// it (InPlace) when they are its last reader. Flops per element: the
	// kernels' formulas (kernels/cpu/optim.go, adafactor.go, sm3.go).
	upd := func(o *OpInfo, role UpdateRole, flops CostFunc) {
		o.Grad, o.Update, o.InPlace, o.Cost = GradNotImplemented, role, true, flops
		register(o)
	}
	upd(&OpInfo{Name: "adam_m", Arity: 2, Elementwise: true, Attrs: []AttrSpec{req("beta1", AttrFloat)}, Infer: sameTypes(true), Doc: "β1·m + (1−β1)·g"}, UpdateFromGrad, perOut(3))
	upd(&OpInfo{Name: "adam_v", Arity: 2, Elementwise: true, Attrs: []AttrSpec{req("beta2", AttrFloat)}, Infer: sameTypes(true), Doc: "β2·v + (1−β2)·g²"}, UpdateFromGrad, perOut(4))
	upd(&OpInfo{Name: "adamw", Arity: 5, Attrs: []AttrSpec{req("beta1", AttrFloat), req("beta2", AttrFloat), req("eps", AttrFloat), req("wd", AttrFloat)}, Infer: inferOptimUpdate(3),
		Doc: "args (p, m, v, lr, step): decoupled weight decay and bias-corrected Adam step"}, UpdateFromState, perOut(8+tr))
	upd(&OpInfo{Name: "sgd_buf", Arity: 3, Elementwise: true, Attrs: []AttrSpec{req("momentum", AttrFloat), req("wd", AttrFloat)}, Infer: sameTypes(true),
		Doc: "args (buf, g, p): momentum·buf + g + wd·p"}, UpdateFromGrad, perOut(4))
	upd(&OpInfo{Name: "sgd", Arity: 3, Infer: inferOptimUpdate(2), Doc: "args (p, buf, lr): p − lr·buf"}, UpdateFromState, perOut(2))

	// Memory-efficient optimizers. Each op has one result, so an update
	// that changes several tensors is several ops reading the same old
	// values. Accumulator ops take (own accumulator, g, …): the state they
	// update first and the gradient second, like adam_m and adam_v.
	// Adafactor (Shazeer & Stern 2018) with β1 = 0; β̂₂ₜ = 1 − step^(−decay).
	adafactorAcc := []AttrSpec{req("eps1", AttrFloat), req("decay", AttrFloat)}
	adafactorStep := []AttrSpec{req("eps2", AttrFloat), req("clip", AttrFloat), req("rel_step", AttrFloat)}
	upd(&OpInfo{Name: "adafactor_row", Arity: 3, Attrs: adafactorAcc, Infer: inferFactoredAcc(0),
		Doc: "args (row[n], g[n,m], step): β̂₂ₜ·row + (1−β̂₂ₜ)·Σⱼ(g²+eps1), Adafactor's decayed row sums"}, UpdateFromGrad, factoredAccCost)
	upd(&OpInfo{Name: "adafactor_col", Arity: 3, Attrs: adafactorAcc, Infer: inferFactoredAcc(1),
		Doc: "args (col[m], g[n,m], step): β̂₂ₜ·col + (1−β̂₂ₜ)·Σᵢ(g²+eps1), Adafactor's decayed column sums"}, UpdateFromGrad, factoredAccCost)
	upd(&OpInfo{Name: "adafactor_v", Arity: 3, Attrs: adafactorAcc, Infer: inferVectorAcc,
		Doc: "args (v, g, step): β̂₂ₜ·v + (1−β̂₂ₜ)·(g²+eps1), Adafactor's unfactored second moment"}, UpdateFromGrad, perOut(5))
	// Per element: RMS(p) (2), U = g·r·c (2), RMS(U) (2), p − coef·U (4);
	// the unfactored form adds v's reciprocal square root.
	upd(&OpInfo{Name: "adafactor", Arity: 5, Attrs: adafactorStep, Infer: inferFactoredUpdate(true),
		Doc: "args (p[n,m], g, row[n], col[m], step): p − α·U/max(1, RMS(U)/clip), U = g/√(row·col/Σrow), α = max(eps2, RMS(p))·min(rel_step, 1/√step)"}, UpdateFromGrad, perOut(10))
	upd(&OpInfo{Name: "adafactor_vec", Arity: 4, Attrs: adafactorStep, Infer: inferVectorUpdate(true),
		Doc: "args (p, g, v, step): adafactor with U = g/√v"}, UpdateFromGrad, perOut(11+tr))
	// SM3-II (Anil et al. 2019): a matrix's covers are its rows and its
	// columns; ν = min(row, col) + g² from the old accumulators.
	upd(&OpInfo{Name: "sm3_row", Arity: 3, Infer: inferSM3Acc(0),
		Doc: "args (row[n], g[n,m], col[m]): maxⱼ ν[i,j], ν = min(row[i], col[j]) + g²"}, UpdateFromGrad, perArg(1, 4))
	upd(&OpInfo{Name: "sm3_col", Arity: 3, Infer: inferSM3Acc(1),
		Doc: "args (col[m], g[n,m], row[n]): maxᵢ ν[i,j], ν = min(row[i], col[j]) + g²"}, UpdateFromGrad, perArg(1, 4))
	upd(&OpInfo{Name: "sm3_v", Arity: 2, Elementwise: true, Infer: sameTypes(true),
		Doc: "args (v, g): v + g², SM3 with one cover per element (AdaGrad)"}, UpdateFromGrad, perOut(2))
	upd(&OpInfo{Name: "sm3", Arity: 5, Infer: inferFactoredUpdate(false),
		Doc: "args (p[n,m], g, row[n], col[m], lr): p − lr·g/√ν, ν = min(row, col) + g² from the old accumulators (0 where ν = 0)"}, UpdateFromGrad, perOut(6+tr))
	upd(&OpInfo{Name: "sm3_vec", Arity: 4, Infer: inferVectorUpdate(false),
		Doc: "args (p, g, v, lr): p − lr·g/√v with v already updated by sm3_v (0 where v = 0)"}, UpdateFromGrad, perOut(3+tr))
}

func sameTypes(floatOnly bool) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		for i, t := range args[1:] {
			if !t.Equal(args[0]) {
				return Type{}, fmt.Errorf("arg %d is %v but arg 0 is %v: types must be equal", i+1, t, args[0])
			}
		}
		if floatOnly && !args[0].DType.IsFloat() {
			return Type{}, fmt.Errorf("needs a float type, got %v", args[0])
		}
		if args[0].DType == Bool || args[0].DType == U8 {
			return Type{}, fmt.Errorf("needs a numeric type, got %v", args[0])
		}
		return args[0], nil
	}
}

func identity(args []Type, _ Attrs) (Type, error) { return args[0], nil }

// inferBlocked is the type rule of a collective that splits or joins dim
// in blocks: the type is kept, and dim must hold a whole number of blocks.
func inferBlocked(args []Type, a Attrs) (Type, error) {
	k := a.Int("blocks", 1)
	if k < 1 {
		return Type{}, fmt.Errorf("blocks must be at least 1, got %d", k)
	}
	if d := a.Int("dim", 0); d >= 0 && d < args[0].Rank() && args[0].Shape[d]%k != 0 {
		return Type{}, fmt.Errorf("dim %d of %v does not divide into %d blocks", d, args[0], k)
	}
	return args[0], nil
}

// MaskBytes is the number of bytes a packed 1-bit mask of n elements
// takes: ⌈n/8⌉.
func MaskBytes(n int) int { return (n + 7) / 8 }

func inferReluMask(args []Type, _ Attrs) (Type, error) {
	x := args[0]
	if !x.DType.IsFloat() || x.Rank() < 1 {
		return Type{}, fmt.Errorf("needs a float tensor of rank ≥ 1 to pack, got %v", x)
	}
	out := x.Shape.Clone()
	out[len(out)-1] = MaskBytes(out[len(out)-1])
	return Type{DType: U8, Shape: out}, nil
}

func inferReluGradMask(args []Type, _ Attrs) (Type, error) {
	mask, dy := args[0], args[1]
	if !dy.DType.IsFloat() || dy.Rank() < 1 {
		return Type{}, fmt.Errorf("dy must be a float tensor of rank ≥ 1, got %v", dy)
	}
	want, _ := inferReluMask(args[1:], nil)
	if !mask.Equal(want) {
		return Type{}, fmt.Errorf("mask must be %v (one bit per element of dy %v), got %v", want, dy, mask)
	}
	return dy, nil
}

// Collectives lists the ops that move data between devices.
var Collectives = map[string]bool{"all_reduce": true, "reduce_scatter": true, "all_gather": true, "all_to_all": true}

func inferFloatRank1(args []Type, _ Attrs) (Type, error) {
	if !args[0].DType.IsFloat() || args[0].Rank() < 1 {
		return Type{}, fmt.Errorf("needs a float tensor of rank ≥ 1, got %v", args[0])
	}
	return args[0], nil
}

func inferScale(args []Type, _ Attrs) (Type, error) {
	if !args[0].DType.IsFloat() {
		return Type{}, fmt.Errorf("needs a float tensor, got %v", args[0])
	}
	if args[1].Rank() != 0 || args[1].DType != args[0].DType {
		return Type{}, fmt.Errorf("scale factor must be a %v scalar, got %v", args[0].DType, args[1])
	}
	return args[0], nil
}

func inferMatMul(args []Type, a Attrs) (Type, error) {
	x, y := args[0], args[1]
	if x.Rank() < 2 || y.Rank() < 2 {
		return Type{}, fmt.Errorf("operands must have rank ≥ 2, got %v and %v", x, y)
	}
	if x.DType != y.DType || !x.DType.IsFloat() {
		return Type{}, fmt.Errorf("operands must share one float dtype, got %v and %v", x, y)
	}
	m, k := x.Shape[x.Rank()-2], x.Shape[x.Rank()-1]
	if a.Bool("transA") {
		m, k = k, m
	}
	k2, n := y.Shape[y.Rank()-2], y.Shape[y.Rank()-1]
	if a.Bool("transB") {
		k2, n = n, k2
	}
	if k != k2 {
		return Type{}, fmt.Errorf("inner dims differ: %v · %v (k=%d vs %d)", x, y, k, k2)
	}
	batch := x.Shape[:x.Rank()-2]
	if y.Rank() > 2 && !Shape(y.Shape[:y.Rank()-2]).Equal(batch) {
		return Type{}, fmt.Errorf("batch dims differ: %v · %v", x, y)
	}
	out := append(batch.Clone(), m, n)
	return Type{DType: x.DType, Shape: out}, nil
}

func inferReshape(args []Type, a Attrs) (Type, error) {
	s := Shape(a.Ints("shape"))
	for _, d := range s {
		if d <= 0 {
			return Type{}, fmt.Errorf("reshape to %v: dims must be positive", s)
		}
	}
	n, err := s.Elements()
	if err != nil {
		return Type{}, fmt.Errorf("reshape to %v: %w", s, err)
	}
	if n != args[0].Shape.NumElements() {
		return Type{}, fmt.Errorf("reshape %v to %v changes the element count", args[0], s)
	}
	return Type{DType: args[0].DType, Shape: s.Clone()}, nil
}

func inferTranspose(args []Type, a Attrs) (Type, error) {
	perm := a.Ints("perm")
	x := args[0]
	if len(perm) != x.Rank() {
		return Type{}, fmt.Errorf("perm %v has %d entries for rank %d", perm, len(perm), x.Rank())
	}
	seen := make([]bool, len(perm))
	out := make(Shape, len(perm))
	for i, p := range perm {
		if p < 0 || p >= len(perm) || seen[p] {
			return Type{}, fmt.Errorf("perm %v is not a permutation of 0..%d", perm, len(perm)-1)
		}
		seen[p] = true
		out[i] = x.Shape[p]
	}
	return Type{DType: x.DType, Shape: out}, nil
}

func checkDim(x Type, dim int) error {
	if dim < 0 || dim >= x.Rank() {
		return fmt.Errorf("dim %d out of range for %v", dim, x)
	}
	return nil
}

func inferSlice(args []Type, a Attrs) (Type, error) {
	x, dim := args[0], a.Int("dim", 0)
	if err := checkDim(x, dim); err != nil {
		return Type{}, err
	}
	start, end := a.Int("start", 0), a.Int("end", 0)
	if start < 0 || end > x.Shape[dim] || start >= end {
		return Type{}, fmt.Errorf("slice [%d,%d) of dim %d (size %d) is empty or out of range", start, end, dim, x.Shape[dim])
	}
	out := x.Shape.Clone()
	out[dim] = end - start
	return Type{DType: x.DType, Shape: out}, nil
}

func inferSliceGrad(args []Type, a Attrs) (Type, error) {
	dy, dim := args[0], a.Int("dim", 0)
	if err := checkDim(dy, dim); err != nil {
		return Type{}, err
	}
	start, size := a.Int("start", 0), a.Int("size", 0)
	if start < 0 || start > size-dy.Shape[dim] { // not start+rows > size: a huge start would wrap
		return Type{}, fmt.Errorf("slice_grad places %d rows at %d in a dim of size %d", dy.Shape[dim], start, size)
	}
	out := dy.Shape.Clone()
	out[dim] = size
	return Type{DType: dy.DType, Shape: out}, nil
}

func repeatArgs(x Type, a Attrs) (dim, repeats int, err error) {
	dim, repeats = a.Int("dim", 0), a.Int("repeats", 0)
	if err := checkDim(x, dim); err != nil {
		return 0, 0, err
	}
	if repeats < 1 {
		return 0, 0, fmt.Errorf("repeats must be ≥ 1, got %d", repeats)
	}
	return dim, repeats, nil
}

func inferRepeatInterleave(args []Type, a Attrs) (Type, error) {
	dim, repeats, err := repeatArgs(args[0], a)
	if err != nil {
		return Type{}, err
	}
	out := args[0].Shape.Clone()
	n, ok := MulInt64(int64(out[dim]), int64(repeats))
	if !ok || n > math.MaxInt {
		return Type{}, fmt.Errorf("repeating dim %d of %v %d times gives more than an int holds", dim, args[0], repeats)
	}
	out[dim] = int(n)
	return Type{DType: args[0].DType, Shape: out}, nil
}

func inferRepeatInterleaveGrad(args []Type, a Attrs) (Type, error) {
	dy := args[0]
	dim, repeats, err := repeatArgs(dy, a)
	if err != nil {
		return Type{}, err
	}
	if !dy.DType.IsFloat() || dy.Shape[dim]%repeats != 0 {
		return Type{}, fmt.Errorf("dy must be a float tensor whose dim %d (%d) is a multiple of repeats %d, got %v", dim, dy.Shape[dim], repeats, dy)
	}
	out := dy.Shape.Clone()
	out[dim] /= repeats
	return Type{DType: dy.DType, Shape: out}, nil
}

func inferConcat(args []Type, a Attrs) (Type, error) {
	dim := a.Int("dim", 0)
	if err := checkDim(args[0], dim); err != nil {
		return Type{}, err
	}
	out := args[0].Shape.Clone()
	for i, t := range args[1:] {
		if t.DType != args[0].DType || t.Rank() != args[0].Rank() {
			return Type{}, fmt.Errorf("arg %d is %v, arg 0 is %v: dtype and rank must agree", i+1, t, args[0])
		}
		for d := range out {
			if d != dim && t.Shape[d] != out[d] {
				return Type{}, fmt.Errorf("arg %d is %v, arg 0 is %v: dims other than %d must agree", i+1, t, args[0], dim)
			}
		}
		n, ok := AddInt64(int64(out[dim]), int64(t.Shape[dim]))
		if !ok || n > math.MaxInt {
			return Type{}, fmt.Errorf("concatenating %d args on dim %d gives more than an int holds", len(args), dim)
		}
		out[dim] = int(n)
	}
	return Type{DType: args[0].DType, Shape: out}, nil
}

// BroadcastCompatible reports whether from can broadcast to shape to under
// NumPy rules (right-aligned; each dim equal or 1 in from).
func BroadcastCompatible(from, to Shape) bool {
	if len(from) > len(to) {
		return false
	}
	off := len(to) - len(from)
	for i, d := range from {
		if d != 1 && d != to[off+i] {
			return false
		}
	}
	return true
}

func inferBroadcast(args []Type, a Attrs) (Type, error) {
	to := Shape(a.Ints("shape"))
	for _, d := range to {
		if d <= 0 {
			return Type{}, fmt.Errorf("broadcast to %v: dims must be positive", to)
		}
	}
	if !BroadcastCompatible(args[0].Shape, to) {
		return Type{}, fmt.Errorf("cannot broadcast %v to %v", args[0], to)
	}
	return Type{DType: args[0].DType, Shape: to.Clone()}, nil
}

// ReducedShape is x's shape after reducing axes, with or without the size-1 dims.
func ReducedShape(x Shape, axes []int, keepdims bool) Shape {
	out := Shape{}
	for d, n := range x {
		if slices.Contains(axes, d) {
			if keepdims {
				out = append(out, 1)
			}
			continue
		}
		out = append(out, n)
	}
	return out
}

func checkAxes(x Type, axes []int) error {
	for i, ax := range axes {
		if ax < 0 || ax >= x.Rank() || (i > 0 && ax <= axes[i-1]) {
			return fmt.Errorf("axes %v must be increasing dims of %v", axes, x)
		}
	}
	return nil
}

func inferReduce(args []Type, a Attrs) (Type, error) {
	x, axes := args[0], a.Ints("axes")
	if err := checkAxes(x, axes); err != nil {
		return Type{}, err
	}
	if !x.DType.IsFloat() {
		return Type{}, fmt.Errorf("needs a float tensor, got %v", x)
	}
	return Type{DType: x.DType, Shape: ReducedShape(x.Shape, axes, a.Bool("keepdims"))}, nil
}

func inferReduceMaxGrad(args []Type, a Attrs) (Type, error) {
	y, err := inferReduce(args[:1], a)
	if err != nil {
		return Type{}, err
	}
	if !args[1].Equal(y) || !args[2].Equal(y) {
		return Type{}, fmt.Errorf("y and dy must be %v, got %v and %v", y, args[1], args[2])
	}
	return args[0], nil
}

func inferCausalMask(args []Type, _ Attrs) (Type, error) {
	x := args[0]
	if x.Rank() < 2 || !x.DType.IsFloat() {
		return Type{}, fmt.Errorf("needs a float tensor [...,s,t], got %v", x)
	}
	if x.Shape[x.Rank()-2] > x.Shape[x.Rank()-1] {
		return Type{}, fmt.Errorf("more queries than keys in %v", x)
	}
	return x, nil
}

func lastDimVector(x, v Type, what string) error {
	if v.Rank() != 1 || v.DType != x.DType || v.Shape[0] != x.Shape[x.Rank()-1] {
		return fmt.Errorf("%s must be %v[%d] to match %v, got %v", what, x.DType, x.Shape[x.Rank()-1], x, v)
	}
	return nil
}

func inferLayerNorm(args []Type, attrs Attrs) (Type, error) {
	x, err := inferFloatRank1(args[:1], nil)
	if err != nil {
		return Type{}, err
	}
	if err := checkEps(attrs); err != nil {
		return Type{}, err
	}
	if err := lastDimVector(x, args[1], "gamma"); err != nil {
		return Type{}, err
	}
	return x, lastDimVector(x, args[2], "beta")
}

func inferLayerNormGradX(args []Type, _ Attrs) (Type, error) {
	x, err := inferFloatRank1(args[:1], nil)
	if err != nil {
		return Type{}, err
	}
	if err := lastDimVector(x, args[1], "gamma"); err != nil {
		return Type{}, err
	}
	if !args[2].Equal(x) {
		return Type{}, fmt.Errorf("dy must be %v, got %v", x, args[2])
	}
	return x, nil
}

func inferLayerNormGradGamma(args []Type, _ Attrs) (Type, error) {
	x, err := inferFloatRank1(args[:1], nil)
	if err != nil {
		return Type{}, err
	}
	if !args[1].Equal(x) {
		return Type{}, fmt.Errorf("dy must be %v, got %v", x, args[1])
	}
	return T(x.DType, x.Shape[x.Rank()-1]), nil
}

func inferRMSNorm(args []Type, attrs Attrs) (Type, error) {
	x, err := inferFloatRank1(args[:1], nil)
	if err != nil {
		return Type{}, err
	}
	if err := checkEps(attrs); err != nil {
		return Type{}, err
	}
	return x, lastDimVector(x, args[1], "gamma")
}

// checkEps refuses a normalisation's epsilon that is negative or not
// finite: the square root of a negative variance is a NaN loss at the
// first step, far from the setting that caused it.
func checkEps(attrs Attrs) error {
	if eps := attrs.Float("eps", 0); !(eps >= 0) || math.IsInf(eps, 0) {
		return fmt.Errorf("eps must be a finite number ≥ 0, got %v", eps)
	}
	return nil
}

func inferRoPE(args []Type, attrs Attrs) (Type, error) {
	x := args[0]
	if !x.DType.IsFloat() || x.Rank() < 2 || x.Shape[x.Rank()-1]%2 != 0 {
		return Type{}, fmt.Errorf("needs a float tensor [...,positions,d] with d even, got %v", x)
	}
	if th := attrs.Float("theta", 0); !(th > 1) || math.IsInf(th, 0) {
		return Type{}, fmt.Errorf("theta must be a finite base > 1, got %v", th)
	}
	return x, nil
}

func inferEmbedding(args []Type, _ Attrs) (Type, error) {
	table, ids := args[0], args[1]
	if table.Rank() != 2 || !table.DType.IsFloat() {
		return Type{}, fmt.Errorf("table must be a float matrix [vocab,dim], got %v", table)
	}
	if !ids.DType.IsInt() {
		return Type{}, fmt.Errorf("ids must be i32 or i64, got %v", ids)
	}
	return Type{DType: table.DType, Shape: append(ids.Shape.Clone(), table.Shape[1])}, nil
}

func inferEmbeddingGrad(args []Type, a Attrs) (Type, error) {
	ids, dy := args[0], args[1]
	if !ids.DType.IsInt() || !dy.DType.IsFloat() || dy.Rank() != ids.Rank()+1 || !Shape(dy.Shape[:ids.Rank()]).Equal(ids.Shape) {
		return Type{}, fmt.Errorf("dy must be float[%v…,dim] for ids %v, got %v", ids.Shape, ids, dy)
	}
	vocab := a.Int("vocab", 0)
	if vocab <= 0 {
		return Type{}, fmt.Errorf("vocab must be positive, got %d", vocab)
	}
	return T(dy.DType, vocab, dy.Shape[dy.Rank()-1]), nil
}

func checkLogitsLabels(logits, labels Type) error {
	if logits.Rank() != 2 || !logits.DType.IsFloat() {
		return fmt.Errorf("logits must be a float matrix [N,V], got %v", logits)
	}
	if labels.Rank() != 1 || !labels.DType.IsInt() || labels.Shape[0] != logits.Shape[0] {
		return fmt.Errorf("labels must be int[%d] for logits %v, got %v", logits.Shape[0], logits, labels)
	}
	return nil
}

func inferCrossEntropy(args []Type, _ Attrs) (Type, error) {
	if err := checkLogitsLabels(args[0], args[1]); err != nil {
		return Type{}, err
	}
	return T(args[0].DType), nil
}

func inferCrossEntropyGrad(args []Type, _ Attrs) (Type, error) {
	if err := checkLogitsLabels(args[0], args[1]); err != nil {
		return Type{}, err
	}
	if !args[2].Equal(T(args[0].DType)) {
		return Type{}, fmt.Errorf("dloss must be a %v scalar, got %v", args[0].DType, args[2])
	}
	return args[0], nil
}

func inferCast(args []Type, a Attrs) (Type, error) {
	d, err := ParseDType(a.Str("to"))
	if err != nil {
		return Type{}, err
	}
	if d == U8 || args[0].DType == U8 {
		return Type{}, fmt.Errorf("cannot cast %v to %v: u8 holds packed bits, not numbers", args[0], d)
	}
	return Type{DType: d, Shape: args[0].Shape.Clone()}, nil
}

func inferSumSquares(args []Type, _ Attrs) (Type, error) {
	for i, t := range args {
		if t.DType != args[0].DType || !t.DType.IsFloat() {
			return Type{}, fmt.Errorf("arg %d is %v: all args must share one float dtype (arg 0 is %v)", i, t, args[0])
		}
	}
	return T(args[0].DType), nil
}

func inferScalarFloat(n int) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		for i, t := range args[:n] {
			if t.Rank() != 0 || !t.DType.IsFloat() {
				return Type{}, fmt.Errorf("arg %d must be a float scalar, got %v", i, t)
			}
		}
		return args[0], nil
	}
}

// inferOptimUpdate checks (p, states..., lr[, step]): nStates+1 tensors of
// p's type, then a float scalar learning rate and, for adamw, an int step.
func inferOptimUpdate(nTensors int) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		p := args[0]
		if !p.DType.IsFloat() {
			return Type{}, fmt.Errorf("parameter must be float, got %v", p)
		}
		for i := 1; i < nTensors; i++ {
			if !args[i].Equal(p) {
				return Type{}, fmt.Errorf("arg %d is %v, must match parameter %v", i, args[i], p)
			}
		}
		lr := args[nTensors]
		if lr.Rank() != 0 || !lr.DType.IsFloat() {
			return Type{}, fmt.Errorf("learning rate must be a float scalar, got %v", lr)
		}
		if len(args) > nTensors+1 {
			if st := args[nTensors+1]; st.Rank() != 0 || !st.DType.IsInt() {
				return Type{}, fmt.Errorf("step must be an int scalar, got %v", st)
			}
		}
		return p, nil
	}
}

// checkIntStep checks the step argument of Adafactor's ops: its decay and
// relative step size follow the step count.
func checkIntStep(t Type) error {
	if t.Rank() != 0 || !t.DType.IsInt() {
		return fmt.Errorf("step must be an int scalar, got %v", t)
	}
	return nil
}

// checkFactors checks that row and col are the factored accumulators of
// matrix g: float vectors of its row count and its column count.
func checkFactors(g, row, col Type) error {
	if g.Rank() != 2 || !g.DType.IsFloat() {
		return fmt.Errorf("factored state needs a float matrix, got %v", g)
	}
	if !row.Equal(T(g.DType, g.Shape[0])) {
		return fmt.Errorf("row accumulator must be %v for %v, got %v", T(g.DType, g.Shape[0]), g, row)
	}
	if !col.Equal(T(g.DType, g.Shape[1])) {
		return fmt.Errorf("column accumulator must be %v for %v, got %v", T(g.DType, g.Shape[1]), g, col)
	}
	return nil
}

// inferFactoredAcc types adafactor_row/col (own, g, step): own is g's row
// (dim 0) or column (dim 1) accumulator.
func inferFactoredAcc(dim int) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		own, g := args[0], args[1]
		if g.Rank() != 2 || !g.DType.IsFloat() {
			return Type{}, fmt.Errorf("factored state needs a float matrix, got %v", g)
		}
		if want := T(g.DType, g.Shape[dim]); !own.Equal(want) {
			return Type{}, fmt.Errorf("accumulator must be %v for %v, got %v", want, g, own)
		}
		return own, checkIntStep(args[2])
	}
}

// inferSM3Acc types sm3_row (row, g, col) and sm3_col (col, g, row).
func inferSM3Acc(dim int) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		row, col := args[0], args[2]
		if dim == 1 {
			row, col = col, row
		}
		if err := checkFactors(args[1], row, col); err != nil {
			return Type{}, err
		}
		return args[0], nil
	}
}

// inferVectorAcc types adafactor_v (v, g, step): v and g of one float type.
func inferVectorAcc(args []Type, _ Attrs) (Type, error) {
	t, err := sameTypes(true)(args[:2], nil)
	if err != nil {
		return Type{}, err
	}
	return t, checkIntStep(args[2])
}

// inferFactoredUpdate types adafactor (p, g, row, col, step) and sm3 (p,
// g, row, col, lr): p is a float matrix, g matches it, row and col are its
// accumulators; the last arg is an int step or a float learning rate.
func inferFactoredUpdate(withStep bool) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		p := args[0]
		if p.Rank() != 2 || !p.DType.IsFloat() {
			return Type{}, fmt.Errorf("parameter must be a float matrix, got %v", p)
		}
		if !args[1].Equal(p) {
			return Type{}, fmt.Errorf("gradient %v must match parameter %v", args[1], p)
		}
		if err := checkFactors(p, args[2], args[3]); err != nil {
			return Type{}, err
		}
		return p, checkLastScalar(args[4], withStep)
	}
}

// inferVectorUpdate types adafactor_vec (p, g, v, step) and sm3_vec (p, g,
// v, lr): the unfactored updates, for params of any rank.
func inferVectorUpdate(withStep bool) func([]Type, Attrs) (Type, error) {
	return func(args []Type, _ Attrs) (Type, error) {
		p := args[0]
		if !p.DType.IsFloat() {
			return Type{}, fmt.Errorf("parameter must be float, got %v", p)
		}
		for i := 1; i < 3; i++ {
			if !args[i].Equal(p) {
				return Type{}, fmt.Errorf("arg %d is %v, must match parameter %v", i, args[i], p)
			}
		}
		return p, checkLastScalar(args[3], withStep)
	}
}

func checkLastScalar(t Type, step bool) error {
	if step {
		return checkIntStep(t)
	}
	if t.Rank() != 0 || !t.DType.IsFloat() {
		return fmt.Errorf("learning rate must be a float scalar, got %v", t)
	}
	return nil
}

func inferWhereFinite(args []Type, _ Attrs) (Type, error) {
	if args[0].Rank() != 0 || !args[0].DType.IsFloat() {
		return Type{}, fmt.Errorf("count must be a float scalar, got %v", args[0])
	}
	if !args[1].Equal(args[2]) {
		return Type{}, fmt.Errorf("new %v and old %v must have one type", args[1], args[2])
	}
	return args[1], nil
}

// GEMM is a matmul's problem as a batched GEMM kernel sees it: Batch
// products of an M×K and a K×N matrix (each operand read transposed as
// the op's transA/transB say), with B one matrix shared by every batch
// when SharedB. Both backends and the cost model read a matmul this way.
type GEMM struct {
	Batch, M, N, K int
	SharedB        bool
}

// MatMulGEMM is the GEMM of a matmul of a·b with the given operand
// shapes (the local ones on a device); it refuses shapes below rank 2.
func MatMulGEMM(a, b Shape, transA, transB bool) (GEMM, error) {
	ra, rb := len(a), len(b)
	if ra < 2 || rb < 2 {
		return GEMM{}, fmt.Errorf("matmul of %v and %v: both need rank ≥ 2", a, b)
	}
	g := GEMM{M: a[ra-2], K: a[ra-1], N: b[rb-1], Batch: 1, SharedB: rb == 2}
	if transA {
		g.M, g.K = g.K, g.M
	}
	if transB {
		g.N = b[rb-2]
	}
	for _, x := range a[:ra-2] {
		g.Batch *= x
	}
	return g, nil
}
