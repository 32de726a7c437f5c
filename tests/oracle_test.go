package tests

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// The oracle: examples/gpt compiled by gcompile and run on the CPU runtime
// must give the loss and parameter gradients that gorgonia, an autodiff
// engine nobody here wrote, gives for the same GPT-2 with the same weights
// and tokens.
//
// The gorgonia network is written from GPT-2's definition, not from
// gcompile's code: the token and position embeddings are one-hot matrix
// products, the causal mask an additive constant (−1e9 above the diagonal:
// its softmax weights underflow to exactly 0, as −Inf gives), LayerNorm is
// built from sums, squares and a square root, GELU from tanh and cubes, and
// the loss is LogSoftMax picked by a one-hot target matrix. The weight
// matrices get a spread (std ≈ 0.3) that puts attention far from uniform
// and GELU in its curved range, and every LayerNorm γ/β and bias gets
// random non-trivial values, so each gradient formula is exercised.

// Tolerances.
//
//   - float64: both engines compute the same function with different
//     operation orders, so they agree to a few hundred ulps (measured: the
//     loss bit for bit, gradients ≤ ~5e-12). f64Tol = 1e-9 relative is far
//     above that and far below real mistakes, which often move the loss by
//     less than 1e-5: a LayerNorm eps of 1e-6 instead of 1e-5 moves it by
//     4e-7, a GELU coefficient of 0.0447 instead of 0.044715 by 3e-7.
//   - float32 (gcompile float32 against gorgonia float64 run on the same
//     float32-rounded weights): measured loss error ≤ ~3e-8 and gradient
//     error max|Δ|/max|g| ≤ ~1e-6, about what gorgonia's own float32 run
//     shows. Asserted with a 10-30× margin: the loss to f32Loss relative,
//     each gradient tensor to f32Grad relative to its largest entry, and
//     elementwise to f32Elem relative with entries below 1e-3·max|g|
//     measured against 1e-3·max|g|. Elementwise relative error without
//     such a floor is not bounded in float32: an entry that is a sum of
//     terms of size max|g| cancelling to 1e-5·max|g| carries rounding of
//     order 1e-7·max|g|, a relative error of 1e-2.
const (
	f64Tol  = 1e-9
	f32Loss = 1e-6
	f32Grad = 1e-5
	f32Elem = 1e-3
)

// gptSize is one GPT configuration, the --set keys of examples/gpt.
type gptSize struct {
	Layers, Hidden, Heads, Seq, Vocab, Batch int
	Activation                               string // MLP activation: "gelu" (default) or "relu"
}

func (s gptSize) activation() string {
	if s.Activation == "" {
		return "gelu"
	}
	return s.Activation
}

func (s gptSize) String() string {
	return fmt.Sprintf("layers=%d,hidden=%d,heads=%d,seq=%d,vocab=%d,batch=%d,activation=%s", s.Layers, s.Hidden, s.Heads, s.Seq, s.Vocab, s.Batch, s.activation())
}

func (s gptSize) set() map[string]string {
	return map[string]string{
		"layers":     strconv.Itoa(s.Layers),
		"hidden":     strconv.Itoa(s.Hidden),
		"heads":      strconv.Itoa(s.Heads),
		"seq":        strconv.Itoa(s.Seq),
		"vocab":      strconv.Itoa(s.Vocab),
		"activation": s.activation(),
	}
}

type paramSpec struct {
	name  string
	shape []int
}

// params lists every parameter of GPT-2 at this size under its Hugging Face
// name, in a fixed order.
func (s gptSize) params() []paramSpec {
	h := s.Hidden
	ps := []paramSpec{{"wte.weight", []int{s.Vocab, h}}, {"wpe.weight", []int{s.Seq, h}}}
	for l := range s.Layers {
		p := fmt.Sprintf("h.%d.", l)
		ps = append(ps,
			paramSpec{p + "ln_1.weight", []int{h}},
			paramSpec{p + "ln_1.bias", []int{h}},
			paramSpec{p + "attn.c_attn.weight", []int{h, 3 * h}},
			paramSpec{p + "attn.c_attn.bias", []int{3 * h}},
			paramSpec{p + "attn.c_proj.weight", []int{h, h}},
			paramSpec{p + "attn.c_proj.bias", []int{h}},
			paramSpec{p + "ln_2.weight", []int{h}},
			paramSpec{p + "ln_2.bias", []int{h}},
			paramSpec{p + "mlp.c_fc.weight", []int{h, 4 * h}},
			paramSpec{p + "mlp.c_fc.bias", []int{4 * h}},
			paramSpec{p + "mlp.c_proj.weight", []int{4 * h, h}},
			paramSpec{p + "mlp.c_proj.bias", []int{h}},
		)
	}
	return append(ps, paramSpec{"ln_f.weight", []int{h}}, paramSpec{"ln_f.bias", []int{h}})
}

// ---------------------------------------------------------------------------
// gcompile side

// loadGPT compiles examples/gpt at size s and dtype up to autodiff, so a
// Step is one forward and backward pass and params are left unchanged.
func loadGPT(t *testing.T, s gptSize, dtype ir.DType) *cpu.Device {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Float: dtype, Batch: s.Batch, Set: s.set()})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.StopAfter = "autodiff"
	opts.Verify = true
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	dev, err := cpu.Load(prog, cpu.Options{})
	require.NoError(t, err)

	// The oracle must cover every parameter gcompile trains: the program's
	// params are exactly the list above, with the same shapes.
	got := map[string][]int{}
	for _, b := range prog.Buffers {
		if b.Kind == lower.Param {
			got[b.Name] = []int(b.Type.Shape.Clone())
			require.Equal(t, dtype, b.Type.DType, "param %s", b.Name)
		}
	}
	want := map[string][]int{}
	for _, p := range s.params() {
		want[p.name] = p.shape
	}
	require.Equal(t, want, got, "gcompile's params")
	return dev
}

// initWeights fills dev's params: the weight matrices from InitParams
// (deterministic N(0, std²)) spread 15× to std ≈ 0.3, every vector from its
// own draw (γ ≈ 1 ± 0.3, β and biases ≈ ±0.2). It returns the params as the
// device holds them, read back.
func initWeights(t *testing.T, dev *cpu.Device, s gptSize) map[string][]float64 {
	t.Helper()
	require.NoError(t, dev.InitParams(1))
	rng := rand.New(rand.NewPCG(2024, 7))
	for _, p := range s.params() {
		x, err := dev.Float64s(p.name)
		require.NoError(t, err)
		require.Len(t, x, prod(p.shape), p.name)
		switch {
		case len(p.shape) == 2:
			require.Greater(t, maxAbs(x), 0.0, "InitParams left %s zero", p.name)
			for i := range x {
				x[i] *= 15
			}
		case strings.Contains(p.name, "ln_") && strings.HasSuffix(p.name, ".weight"):
			for i := range x {
				x[i] = 1 + 0.3*rng.NormFloat64()
			}
		default:
			for i := range x {
				x[i] = 0.2 * rng.NormFloat64()
			}
		}
		require.NoError(t, dev.SetFloat64s(p.name, x))
	}
	return readParams(t, dev, s)
}

func readParams(t *testing.T, dev *cpu.Device, s gptSize) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	for _, p := range s.params() {
		x, err := dev.Float64s(p.name)
		require.NoError(t, err)
		out[p.name] = x
	}
	return out
}

// setWeights writes w into dev's params and returns them as dev holds
// them (for a float32 device, rounded to float32).
func setWeights(t *testing.T, dev *cpu.Device, s gptSize, w map[string][]float64) map[string][]float64 {
	t.Helper()
	for _, p := range s.params() {
		require.NoError(t, dev.SetFloat64s(p.name, w[p.name]))
	}
	return readParams(t, dev, s)
}

// stepGPT runs one forward and backward step and returns the loss and
// the gradient of every param.
func stepGPT(t *testing.T, dev *cpu.Device, s gptSize, toks, tgts []int32) (float64, map[string][]float64) {
	t.Helper()
	require.NoError(t, dev.SetInt32("tokens", toks))
	require.NoError(t, dev.SetInt32("targets", tgts))
	require.NoError(t, dev.Step())
	loss, err := dev.Scalar("loss")
	require.NoError(t, err)
	grads := map[string][]float64{}
	for _, p := range s.params() {
		g, err := dev.Float64s(passes.GradPrefix + p.name)
		require.NoError(t, err)
		require.Len(t, g, prod(p.shape), p.name)
		grads[p.name] = g
	}
	return loss, grads
}

// ---------------------------------------------------------------------------
// gorgonia side

// oracle builds GPT-2 as a gorgonia graph of dtype dt.
type oracle struct {
	g      *G.ExprGraph
	dt     tensor.Dtype
	s      gptSize
	params map[string]*G.Node
}

func (o *oracle) value(shape []int, data []float64) tensor.Tensor {
	if o.dt == tensor.Float32 {
		f := make([]float32, len(data))
		for i, x := range data {
			f[i] = float32(x)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(slices.Clone(data)))
}

// node is a tensor node holding data (a param or a constant input).
func (o *oracle) node(name string, shape []int, data []float64) *G.Node {
	return G.NewTensor(o.g, o.dt, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(o.value(shape, data)))
}

func (o *oracle) scalar(x float64) *G.Node {
	if o.dt == tensor.Float32 {
		return G.NewConstant(float32(x))
	}
	return G.NewConstant(x)
}

// oneHot is the [len(ids), n] matrix with row i = e_{ids[i]}.
func oneHot(ids []int32, n int) []float64 {
	out := make([]float64, len(ids)*n)
	for i, id := range ids {
		out[i*n+int(id)] = 1
	}
	return out
}

// linear is x·W + b for x [N,in], W [in,out], b [out].
func (o *oracle) linear(x *G.Node, name string) *G.Node {
	w, b := o.params[name+".weight"], o.params[name+".bias"]
	out := w.Shape()[1]
	y := G.Must(G.Mul(x, w))
	return G.Must(G.BroadcastAdd(y, G.Must(G.Reshape(b, tensor.Shape{1, out})), nil, []byte{0}))
}

// layerNorm normalises each row of x [N,n] with the biased variance and
// eps 1e-5, then applies γ and β.
func (o *oracle) layerNorm(x *G.Node, name string) *G.Node {
	rows, n := x.Shape()[0], x.Shape()[1]
	inv := o.scalar(1 / float64(n))
	mean := G.Must(G.Reshape(G.Must(G.Mul(G.Must(G.Sum(x, 1)), inv)), tensor.Shape{rows, 1}))
	xc := G.Must(G.BroadcastSub(x, mean, nil, []byte{1}))
	variance := G.Must(G.Mul(G.Must(G.Sum(G.Must(G.Square(xc)), 1)), inv))
	std := G.Must(G.Reshape(G.Must(G.Sqrt(G.Must(G.Add(variance, o.scalar(1e-5))))), tensor.Shape{rows, 1}))
	xhat := G.Must(G.BroadcastHadamardDiv(xc, std, nil, []byte{1}))
	gamma := G.Must(G.Reshape(o.params[name+".weight"], tensor.Shape{1, n}))
	beta := G.Must(G.Reshape(o.params[name+".bias"], tensor.Shape{1, n}))
	return G.Must(G.BroadcastAdd(G.Must(G.BroadcastHadamardProd(xhat, gamma, nil, []byte{0})), beta, nil, []byte{0}))
}

// gelu is 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
func (o *oracle) gelu(x *G.Node) *G.Node {
	inner := G.Must(G.Add(x, G.Must(G.Mul(G.Must(G.Cube(x)), o.scalar(0.044715)))))
	th := G.Must(G.Tanh(G.Must(G.Mul(inner, o.scalar(math.Sqrt(2/math.Pi))))))
	return G.Must(G.HadamardProd(G.Must(G.Mul(x, o.scalar(0.5))), G.Must(G.Add(th, o.scalar(1)))))
}

// attention is causal multi-head self-attention of x [batch·seq, hidden].
func (o *oracle) attention(x *G.Node, name string, mask *G.Node) *G.Node {
	s := o.s
	h, heads := s.Hidden, s.Heads
	hd := h / heads
	qkv := o.linear(x, name+".c_attn") // [N, 3h]: q | k | v
	split := func(i int) *G.Node {
		part := G.Must(G.Slice(qkv, nil, G.S(i*h, (i+1)*h)))                    // [b·s, h]
		part = G.Must(G.Reshape(part, tensor.Shape{s.Batch, s.Seq, heads, hd})) // [b,s,heads,hd]
		part = G.Must(G.Transpose(part, 0, 2, 1, 3))                            // [b,heads,s,hd]
		return G.Must(G.Reshape(part, tensor.Shape{s.Batch * heads, s.Seq, hd}))
	}
	q, k, v := split(0), split(1), split(2)
	scores := G.Must(G.BatchedMatMul(q, k, false, true)) // q·kᵀ [b·heads, s, s]
	scores = G.Must(G.Mul(scores, o.scalar(1/math.Sqrt(float64(hd)))))
	scores = G.Must(G.Add(scores, mask))
	// Softmax over the keys. (gorgonia's kernel shifts every row by the
	// tensor's first element rather than the row's max: harmless here, where
	// scores are O(1) and masked ones underflow to 0, but it would overflow
	// for scores hundreds above scores[0,0,0].)
	att := G.Must(G.SoftMax(scores, 2))
	y := G.Must(G.BatchedMatMul(att, v)) // [b·heads, s, hd]
	y = G.Must(G.Reshape(y, tensor.Shape{s.Batch, heads, s.Seq, hd}))
	y = G.Must(G.Transpose(y, 0, 2, 1, 3)) // [b,s,heads,hd]
	y = G.Must(G.Reshape(y, tensor.Shape{s.Batch * s.Seq, h}))
	return o.linear(y, name+".c_proj")
}

// gorgoniaGPT evaluates GPT-2's mean next-token loss and its gradients with
// gorgonia in dtype dt.
func gorgoniaGPT(t *testing.T, s gptSize, dt tensor.Dtype, w map[string][]float64, toks, tgts []int32) (float64, map[string][]float64) {
	t.Helper()
	o := &oracle{g: G.NewGraph(), dt: dt, s: s, params: map[string]*G.Node{}}
	var learn G.Nodes
	for _, p := range s.params() {
		n := o.node(p.name, p.shape, w[p.name])
		o.params[p.name] = n
		learn = append(learn, n)
	}
	rows := s.Batch * s.Seq
	pos := make([]int32, rows)
	for i := range pos {
		pos[i] = int32(i % s.Seq)
	}
	bh := s.Batch * s.Heads
	maskData := make([]float64, bh*s.Seq*s.Seq)
	for b := range bh {
		for i := range s.Seq {
			for j := i + 1; j < s.Seq; j++ {
				maskData[(b*s.Seq+i)*s.Seq+j] = -1e9
			}
		}
	}
	tokOH := o.node("tokens_onehot", []int{rows, s.Vocab}, oneHot(toks, s.Vocab))
	posOH := o.node("positions_onehot", []int{rows, s.Seq}, oneHot(pos, s.Seq))
	tgtOH := o.node("targets_onehot", []int{rows, s.Vocab}, oneHot(tgts, s.Vocab))
	mask := o.node("causal_mask", []int{bh, s.Seq, s.Seq}, maskData)

	wte := o.params["wte.weight"]
	x := G.Must(G.Add(G.Must(G.Mul(tokOH, wte)), G.Must(G.Mul(posOH, o.params["wpe.weight"]))))
	for l := range s.Layers {
		p := fmt.Sprintf("h.%d.", l)
		x = G.Must(G.Add(x, o.attention(o.layerNorm(x, p+"ln_1"), p+"attn", mask)))
		hid := o.linear(o.layerNorm(x, p+"ln_2"), p+"mlp.c_fc")
		if s.activation() == "relu" {
			hid = G.Must(G.Rectify(hid))
		} else {
			hid = o.gelu(hid)
		}
		x = G.Must(G.Add(x, o.linear(hid, p+"mlp.c_proj")))
	}
	x = o.layerNorm(x, "ln_f")
	logits := G.Must(G.Mul(x, G.Must(G.Transpose(wte, 1, 0)))) // tied head [N, vocab]
	logp := G.Must(G.LogSoftMax(logits, 1))
	picked := G.Must(G.Sum(G.Must(G.HadamardProd(logp, tgtOH))))
	cost := G.Must(G.Mul(picked, o.scalar(-1/float64(rows))))

	_, err := G.Grad(cost, learn...)
	require.NoError(t, err)
	vm := G.NewTapeMachine(o.g, G.BindDualValues(learn...))
	defer vm.Close()
	require.NoError(t, vm.RunAll())

	loss := toFloat64s(t, cost.Value().Data())
	require.Len(t, loss, 1)
	grads := map[string][]float64{}
	for _, p := range s.params() {
		gv, err := o.params[p.name].Grad()
		require.NoError(t, err, p.name)
		grads[p.name] = toFloat64s(t, gv.Data())
		require.Len(t, grads[p.name], prod(p.shape), p.name)
	}
	return loss[0], grads
}

func toFloat64s(t *testing.T, data any) []float64 {
	t.Helper()
	switch d := data.(type) {
	case float64:
		return []float64{d}
	case float32:
		return []float64{float64(d)}
	case []float64:
		return slices.Clone(d)
	case []float32:
		out := make([]float64, len(d))
		for i, x := range d {
			out[i] = float64(x)
		}
		return out
	}
	require.Failf(t, "unexpected gorgonia value", "%T", data)
	return nil
}

// ---------------------------------------------------------------------------
// comparison

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func maxAbs(x []float64) float64 {
	m := 0.0
	for _, v := range x {
		m = max(m, math.Abs(v))
	}
	return m
}

// keyBias reports the entries [lo,hi) of a parameter whose gradient is
// exactly zero in exact arithmetic: the key part of a fused c_attn bias.
// Adding b_k to every key adds q_i·b_k to all of query i's scores alike,
// which softmax ignores (the causal mask does not change that), so ∂loss/∂b_k
// = 0 and both engines return only rounding noise there (~1e-17 in
// float64). Those entries are checked to be that small, not compared
// relatively.
func keyBias(s gptSize, name string) (lo, hi int, ok bool) {
	if !strings.HasSuffix(name, ".attn.c_attn.bias") {
		return 0, 0, false
	}
	return s.Hidden, 2 * s.Hidden, true
}

// splitZeros returns x without and with its structurally zero entries.
func splitZeros(s gptSize, name string, x []float64) (rest, zeros []float64) {
	lo, hi, ok := keyBias(s, name)
	if !ok {
		return x, nil
	}
	return append(slices.Clone(x[:lo]), x[hi:]...), x[lo:hi]
}

// relErr is max_i |got_i − want_i| / max(|want_i|, floor·max|want|): the
// elementwise relative error, with entries far below the tensor's scale
// measured against floor·max|want| instead of their own size.
func relErr(got, want []float64, floor float64) float64 {
	f := floor * maxAbs(want)
	e := 0.0
	for i, w := range want {
		d := math.Abs(got[i] - w)
		if d == 0 {
			continue
		}
		e = max(e, d/max(math.Abs(w), f, math.SmallestNonzeroFloat64))
	}
	return e
}

// scaleErr is max|got − want| / max|want|.
func scaleErr(got, want []float64) float64 { return relErr(got, want, 1) }

func lossErr(got, want float64) float64 { return math.Abs(got-want) / math.Abs(want) }

// randomTokens draws tokens and targets in [0, vocab), reproducibly.
func randomTokens(s gptSize, seed uint64) (toks, tgts []int32) {
	rng := rand.New(rand.NewPCG(seed, 99))
	n := s.Batch * s.Seq
	toks, tgts = make([]int32, n), make([]int32, n)
	for i := range n {
		toks[i] = rng.Int32N(int32(s.Vocab))
		tgts[i] = rng.Int32N(int32(s.Vocab))
	}
	return toks, tgts
}

var oracleSizes = []gptSize{
	// The brief's size: one block, two heads, batch two.
	{Layers: 1, Hidden: 16, Heads: 2, Seq: 8, Vocab: 32, Batch: 2},
	// Two blocks (the residual stream through a block into the next),
	// four heads of width 6, batch three, a longer sequence.
	{Layers: 2, Hidden: 24, Heads: 4, Seq: 12, Vocab: 40, Batch: 3},
	// examples/gpt's other MLP activation.
	{Layers: 1, Hidden: 16, Heads: 4, Seq: 6, Vocab: 24, Batch: 2, Activation: "relu"},
}

// TestOracleGPTFloat64 compares gcompile's float64 loss and gradients with
// gorgonia's float64 ones.
func TestOracleGPTFloat64(t *testing.T) {
	for _, s := range oracleSizes {
		t.Run(s.String(), func(t *testing.T) {
			start := time.Now()
			dev := loadGPT(t, s, ir.F64)
			w := initWeights(t, dev, s)
			toks, tgts := randomTokens(s, 1)
			loss, grads := stepGPT(t, dev, s, toks, tgts)
			gcTime := time.Since(start)

			start = time.Now()
			refLoss, refGrads := gorgoniaGPT(t, s, tensor.Float64, w, toks, tgts)
			t.Logf("gcompile %.3fs, gorgonia %.3fs", gcTime.Seconds(), time.Since(start).Seconds())

			require.False(t, math.IsNaN(loss) || math.IsInf(loss, 0), "gcompile loss %v", loss)
			t.Logf("loss: gcompile %.15g  gorgonia %.15g  rel err %.3g  (ln vocab %.4g)", loss, refLoss, lossErr(loss, refLoss), math.Log(float64(s.Vocab)))
			require.LessOrEqual(t, lossErr(loss, refLoss), f64Tol, "loss: gcompile %v, gorgonia %v", loss, refLoss)

			worst, worstName := 0.0, ""
			for _, p := range s.params() {
				g, gz := splitZeros(s, p.name, grads[p.name])
				ref, refz := splitZeros(s, p.name, refGrads[p.name])
				require.Greater(t, maxAbs(ref), 0.0, "gorgonia's gradient of %s is zero: the test would prove nothing", p.name)
				if refz != nil {
					t.Logf("grad %-22s key-bias part (exactly 0 in exact arithmetic): max|g| gcompile %.2e, gorgonia %.2e", p.name, maxAbs(gz), maxAbs(refz))
					require.LessOrEqual(t, maxAbs(refz), 1e-12*maxAbs(ref), "gorgonia's key-bias gradient of %s is not ~0", p.name)
					require.LessOrEqual(t, maxAbs(gz), 1e-12*maxAbs(ref), "gcompile's key-bias gradient of %s is not ~0", p.name)
				}
				e := relErr(g, ref, 1e-12)
				t.Logf("grad %-22s %-9v max|g| %.3e  max rel err %.3g", p.name, p.shape, maxAbs(ref), e)
				if e > worst {
					worst, worstName = e, p.name
				}
				require.LessOrEqual(t, e, f64Tol, "gradient of %s: max relative error %g", p.name, e)
			}
			t.Logf("float64: loss rel err %.3g, worst gradient rel err %.3g (%s)", lossErr(loss, refLoss), worst, worstName)
		})
	}
}

// TestOracleGPTFloat32 compares gcompile's float32 loss and gradients with
// gorgonia's float64 ones on the same float32-rounded weights, and logs
// how far gorgonia's own float32 run is from them for comparison.
func TestOracleGPTFloat32(t *testing.T) {
	for _, s := range oracleSizes {
		t.Run(s.String(), func(t *testing.T) {
			// Weights drawn as in the float64 test, then rounded to float32
			// by the float32 device; both references run on those.
			dev64 := loadGPT(t, s, ir.F64)
			w64 := initWeights(t, dev64, s)
			dev := loadGPT(t, s, ir.F32)
			w := setWeights(t, dev, s, w64)
			toks, tgts := randomTokens(s, 1)
			loss, grads := stepGPT(t, dev, s, toks, tgts)

			refLoss, refGrads := gorgoniaGPT(t, s, tensor.Float64, w, toks, tgts)
			gLoss, gGrads := gorgoniaGPT(t, s, tensor.Float32, w, toks, tgts)

			t.Logf("loss: gcompile-f32 %.9g  reference-f64 %.15g  rel err %.3g  (gorgonia-f32 %.3g)", loss, refLoss, lossErr(loss, refLoss), lossErr(gLoss, refLoss))
			require.LessOrEqual(t, lossErr(loss, refLoss), f32Loss, "loss: gcompile %v, reference %v", loss, refLoss)

			var worstScale, worstElem, gWorstScale, gWorstElem float64
			for _, p := range s.params() {
				g, gz := splitZeros(s, p.name, grads[p.name])
				ref, _ := splitZeros(s, p.name, refGrads[p.name])
				gg, ggz := splitZeros(s, p.name, gGrads[p.name])
				if gz != nil {
					t.Logf("grad %-22s key-bias part (exactly 0): max|g|/max|ref| gcompile-f32 %.2e, gorgonia-f32 %.2e", p.name, maxAbs(gz)/maxAbs(ref), maxAbs(ggz)/maxAbs(ref))
					require.LessOrEqual(t, maxAbs(gz), f32Grad*maxAbs(ref), "gcompile's key-bias gradient of %s is not ~0", p.name)
				}
				se, ee := scaleErr(g, ref), relErr(g, ref, 1e-3)
				gse, gee := scaleErr(gg, ref), relErr(gg, ref, 1e-3)
				t.Logf("grad %-22s max|Δ|/max|g| %.3g (gorgonia-f32 %.3g)  elementwise rel err, floor 1e-3·max|g|: %.3g (gorgonia-f32 %.3g)", p.name, se, gse, ee, gee)
				worstScale, worstElem = max(worstScale, se), max(worstElem, ee)
				gWorstScale, gWorstElem = max(gWorstScale, gse), max(gWorstElem, gee)
				require.LessOrEqual(t, se, f32Grad, "gradient of %s: max|Δ|/max|g| = %g", p.name, se)
				require.LessOrEqual(t, ee, f32Elem, "gradient of %s: elementwise relative error %g", p.name, ee)
			}
			t.Logf("float32: loss rel err %.3g; gradients max|Δ|/max|g| %.3g, elementwise %.3g (gorgonia-f32: loss %.3g, gradients %.3g, elementwise %.3g)",
				lossErr(loss, refLoss), worstScale, worstElem, lossErr(gLoss, refLoss), gWorstScale, gWorstElem)
		})
	}
}
