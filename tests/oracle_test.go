package tests

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
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
//
// The comparison itself (loading, stepping, the two test bodies) is shared
// with the Llama oracle: oracle_common_test.go.

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
//     elementwise to f32Elem relative with entries below f32Floor·max|g|
//     = 1e-3·max|g| measured against 1e-3·max|g|. Elementwise relative
//     error without such a floor is not bounded in float32: an entry that
//     is a sum of terms of size max|g| cancelling to 1e-5·max|g| carries
//     rounding of order 1e-7·max|g|, a relative error of 1e-2.
const (
	f64Tol   = 1e-9
	f32Loss  = 1e-6
	f32Grad  = 1e-5
	f32Elem  = 1e-3
	f32Floor = 1e-3 // the GPT's; the Llama's is llamaF32Floor
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

// model is examples/gpt and its config at dtype.
func (s gptSize) model(dtype ir.DType) (frontend.ModelFunc, frontend.Config) {
	return gpt.Model, frontend.Config{Name: "gpt", Float: dtype, Batch: s.Batch, Set: s.set()}
}

func (s gptSize) dims() (rows, vocab int) { return s.Batch * s.Seq, s.Vocab }

func (s gptSize) weightSeed() (uint64, uint64) { return 2024, 7 }

// vectorInit draws every LayerNorm γ ≈ 1 ± 0.3, every β and bias ≈ ±0.2.
func (s gptSize) vectorInit(name string) (mean, std float64) {
	if strings.Contains(name, "ln_") && strings.HasSuffix(name, ".weight") {
		return 1, 0.3
	}
	return 0, 0.2
}

func (s gptSize) f32Floor() float64 { return f32Floor }

// ---------------------------------------------------------------------------
// gorgonia side

// gptOracle builds GPT-2 as a gorgonia graph.
type gptOracle struct {
	*oracle
	s gptSize
}

// linear is x·W + b for x [N,in], W [in,out], b [out].
func (o *gptOracle) linear(x *G.Node, name string) *G.Node {
	w, b := o.params[name+".weight"], o.params[name+".bias"]
	out := w.Shape()[1]
	y := G.Must(G.Mul(x, w))
	return G.Must(G.BroadcastAdd(y, G.Must(G.Reshape(b, tensor.Shape{1, out})), nil, []byte{0}))
}

// layerNorm normalises each row of x [N,n] with the biased variance and
// eps 1e-5, then applies γ and β.
func (o *gptOracle) layerNorm(x *G.Node, name string) *G.Node {
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
func (o *gptOracle) gelu(x *G.Node) *G.Node {
	inner := G.Must(G.Add(x, G.Must(G.Mul(G.Must(G.Cube(x)), o.scalar(0.044715)))))
	th := G.Must(G.Tanh(G.Must(G.Mul(inner, o.scalar(math.Sqrt(2/math.Pi))))))
	return G.Must(G.HadamardProd(G.Must(G.Mul(x, o.scalar(0.5))), G.Must(G.Add(th, o.scalar(1)))))
}

// attention is causal multi-head self-attention of x [batch·seq, hidden].
func (o *gptOracle) attention(x *G.Node, name string, mask *G.Node) *G.Node {
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

// gorgonia evaluates GPT-2's mean next-token loss and its gradients with
// gorgonia in dtype dt.
func (s gptSize) gorgonia(t *testing.T, dt tensor.Dtype, w map[string][]float64, toks, tgts []int32) (float64, map[string][]float64) {
	t.Helper()
	o := &gptOracle{oracle: newOracle(dt, s.params(), w), s: s}
	rows := s.Batch * s.Seq
	pos := make([]int32, rows)
	for i := range pos {
		pos[i] = int32(i % s.Seq)
	}
	tokOH := o.node("tokens_onehot", []int{rows, s.Vocab}, oneHot(toks, s.Vocab))
	posOH := o.node("positions_onehot", []int{rows, s.Seq}, oneHot(pos, s.Seq))
	tgtOH := o.node("targets_onehot", []int{rows, s.Vocab}, oneHot(tgts, s.Vocab))
	mask := o.causalMask(s.Batch*s.Heads, s.Seq)

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
	return o.lossAndGrads(t, s.params(), logits, tgtOH)
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

// splitZeros returns x without and with its structurally zero entries,
// the key-bias part.
func (s gptSize) splitZeros(name string, x []float64) (rest, zeros []float64) {
	lo, hi, ok := keyBias(s, name)
	if !ok {
		return x, nil
	}
	return append(slices.Clone(x[:lo]), x[hi:]...), x[lo:hi]
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
func TestOracleGPTFloat64(t *testing.T) { oracleFloat64(t, oracleSizes) }

// TestOracleGPTFloat32 compares gcompile's float32 loss and gradients with
// gorgonia's float64 ones on the same float32-rounded weights, and logs
// how far gorgonia's own float32 run is from them for comparison.
func TestOracleGPTFloat32(t *testing.T) { oracleFloat32(t, oracleSizes) }
