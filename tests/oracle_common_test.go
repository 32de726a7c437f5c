package tests

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// What the gorgonia oracles share: the GPT one (oracle_test.go, which also
// holds the tolerances) and the Llama one (oracle_llama_test.go) differ in
// their model, its sizes and parameters, the gorgonia network written from
// its definition and a few per-family details, all reached through
// oracleModel; the gcompile side, the gorgonia plumbing and the two test
// bodies, oracleFloat64 and oracleFloat32, are the same for both.

// oracleModel is one model family at one size, as the oracle tests need it.
// gptSize and llamaSize implement it.
type oracleModel interface {
	String() string
	// params lists every parameter of the model under its Hugging Face
	// name and layout, in a fixed order.
	params() []paramSpec
	// model is the examples/ model and its frontend config at dtype.
	model(dtype ir.DType) (frontend.ModelFunc, frontend.Config)
	// dims is the tokens a step reads (batch·seq) and the vocabulary size.
	dims() (rows, vocab int)
	// weightSeed seeds the draw of the vector (1-D) params, and
	// vectorInit says how each is drawn: every entry mean + std·N(0, 1).
	weightSeed() (uint64, uint64)
	vectorInit(name string) (mean, std float64)
	// gorgonia evaluates the model's mean next-token loss and its
	// gradients with gorgonia in dtype dt.
	gorgonia(t *testing.T, dt tensor.Dtype, w map[string][]float64, toks, tgts []int32) (float64, map[string][]float64)
	// splitZeros returns x, the gradient of param name, without and with
	// its entries that are exactly zero in exact arithmetic (zeros nil
	// where there are none). Those entries are checked to be rounding
	// noise, not compared relatively.
	splitZeros(name string, x []float64) (rest, zeros []float64)
	// f32Floor is the floor of the float32 elementwise check, relative to
	// the tensor's max|g| (see relErr).
	f32Floor() float64
}

type paramSpec struct {
	name  string
	shape []int
}

// ---------------------------------------------------------------------------
// gcompile side

// loadOracle compiles s's model at dtype up to autodiff, so a Step is one
// forward and backward pass and params are left unchanged.
func loadOracle(t *testing.T, s oracleModel, dtype ir.DType) *cpu.Device {
	t.Helper()
	fn, cfg := s.model(dtype)
	opts := passes.DefaultOptions()
	opts.StopAfter = "autodiff"
	opts.Verify = true
	dev, _, prog := loadDevice(t, fn, cfg, opts)

	// The oracle must cover every parameter gcompile trains: the program's
	// params are exactly s.params(), with the same shapes.
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

// initOracleWeights fills dev's params: the weight matrices from
// InitParams (deterministic N(0, std²), the model's std: 0.02 for every
// Llama matrix) spread 15× to std ≈ 0.3, every vector from its own draw
// as s.vectorInit says.
// It returns the params as the device holds them, read back.
func initOracleWeights(t *testing.T, dev *cpu.Device, s oracleModel) map[string][]float64 {
	t.Helper()
	require.NoError(t, dev.InitParams(1))
	rng := rand.New(rand.NewPCG(s.weightSeed()))
	for _, p := range s.params() {
		x, err := dev.Float64s(p.name)
		require.NoError(t, err)
		require.Len(t, x, prod(p.shape), p.name)
		if len(p.shape) == 2 {
			require.Greater(t, maxAbs(x), 0.0, "InitParams left %s zero", p.name)
			for i := range x {
				x[i] *= 15
			}
		} else {
			mean, std := s.vectorInit(p.name)
			for i := range x {
				x[i] = mean + std*rng.NormFloat64()
			}
		}
		require.NoError(t, dev.SetFloat64s(p.name, x))
	}
	return readParams(t, dev, s.params())
}

// readParams returns the params ps as dev holds them.
func readParams(t *testing.T, dev *cpu.Device, ps []paramSpec) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	for _, p := range ps {
		x, err := dev.Float64s(p.name)
		require.NoError(t, err)
		require.Len(t, x, prod(p.shape), p.name)
		out[p.name] = x
	}
	return out
}

// setWeights writes w into dev's params ps and returns them as dev holds
// them (for a float32 device, rounded to float32).
func setWeights(t *testing.T, dev *cpu.Device, ps []paramSpec, w map[string][]float64) map[string][]float64 {
	t.Helper()
	for _, p := range ps {
		require.NoError(t, dev.SetFloat64s(p.name, w[p.name]))
	}
	return readParams(t, dev, ps)
}

// stepOracle runs one forward and backward step and returns the loss and
// the gradient of every param in ps.
func stepOracle(t *testing.T, dev *cpu.Device, ps []paramSpec, toks, tgts []int32) (float64, map[string][]float64) {
	t.Helper()
	require.NoError(t, dev.SetInt32("tokens", toks))
	require.NoError(t, dev.SetInt32("targets", tgts))
	require.NoError(t, dev.Step())
	loss, err := dev.Scalar("loss")
	require.NoError(t, err)
	grads := map[string][]float64{}
	for _, p := range ps {
		g, err := dev.Float64s(passes.GradPrefix + p.name)
		require.NoError(t, err)
		require.Len(t, g, prod(p.shape), p.name)
		grads[p.name] = g
	}
	return loss, grads
}

// randomTokens draws s's tokens and targets in [0, vocab), reproducibly.
func randomTokens(s oracleModel, seed uint64) (toks, tgts []int32) {
	rng := rand.New(rand.NewPCG(seed, 99))
	n, vocab := s.dims()
	toks, tgts = make([]int32, n), make([]int32, n)
	for i := range n {
		toks[i] = rng.Int32N(int32(vocab))
		tgts[i] = rng.Int32N(int32(vocab))
	}
	return toks, tgts
}

// ---------------------------------------------------------------------------
// gorgonia side

// oracle is a gorgonia graph of dtype dt holding one model's params;
// gptOracle and llamaOracle build their networks on it.
type oracle struct {
	g      *G.ExprGraph
	dt     tensor.Dtype
	params map[string]*G.Node
	learn  G.Nodes // the params, in order
}

// newOracle starts a gorgonia graph of dtype dt holding the params ps with
// the values w.
func newOracle(dt tensor.Dtype, ps []paramSpec, w map[string][]float64) *oracle {
	o := &oracle{g: G.NewGraph(), dt: dt, params: map[string]*G.Node{}}
	for _, p := range ps {
		n := o.node(p.name, p.shape, w[p.name])
		o.params[p.name] = n
		o.learn = append(o.learn, n)
	}
	return o
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

// causalMask is the additive causal mask of bh = batch·heads score
// matrices [seq, seq]: −1e9 above the diagonal (its softmax weights
// underflow to exactly 0, as −Inf gives), 0 elsewhere.
func (o *oracle) causalMask(bh, seq int) *G.Node {
	maskData := make([]float64, bh*seq*seq)
	for b := range bh {
		for i := range seq {
			for j := i + 1; j < seq; j++ {
				maskData[(b*seq+i)*seq+j] = -1e9
			}
		}
	}
	return o.node("causal_mask", []int{bh, seq, seq}, maskData)
}

// lossAndGrads finishes the network with the mean next-token loss of
// logits [rows, vocab] (LogSoftMax picked by the one-hot target matrix
// tgtOH), runs it forward and backward, and returns the loss and the
// gradient of every param in ps.
func (o *oracle) lossAndGrads(t *testing.T, ps []paramSpec, logits, tgtOH *G.Node) (float64, map[string][]float64) {
	t.Helper()
	rows := logits.Shape()[0]
	logp := G.Must(G.LogSoftMax(logits, 1))
	picked := G.Must(G.Sum(G.Must(G.HadamardProd(logp, tgtOH))))
	cost := G.Must(G.Mul(picked, o.scalar(-1/float64(rows))))

	_, err := G.Grad(cost, o.learn...)
	require.NoError(t, err)
	vm := G.NewTapeMachine(o.g, G.BindDualValues(o.learn...))
	defer vm.Close()
	require.NoError(t, vm.RunAll())

	loss := toFloat64s(t, cost.Value().Data())
	require.Len(t, loss, 1)
	grads := map[string][]float64{}
	for _, p := range ps {
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

// nameWidth is the length of the longest param name, to align the logs.
func nameWidth(ps []paramSpec) int {
	n := 0
	for _, p := range ps {
		n = max(n, len(p.name))
	}
	return n
}

// ---------------------------------------------------------------------------
// the test bodies

// oracleFloat64 compares, at every size, gcompile's float64 loss and
// gradients with gorgonia's float64 ones, to f64Tol.
func oracleFloat64[M oracleModel](t *testing.T, sizes []M) {
	for _, s := range sizes {
		t.Run(s.String(), func(t *testing.T) {
			start := time.Now()
			dev := loadOracle(t, s, ir.F64)
			w := initOracleWeights(t, dev, s)
			toks, tgts := randomTokens(s, 1)
			loss, grads := stepOracle(t, dev, s.params(), toks, tgts)
			gcTime := time.Since(start)

			start = time.Now()
			refLoss, refGrads := s.gorgonia(t, tensor.Float64, w, toks, tgts)
			t.Logf("gcompile %.3fs, gorgonia %.3fs", gcTime.Seconds(), time.Since(start).Seconds())

			_, vocab := s.dims()
			require.False(t, math.IsNaN(loss) || math.IsInf(loss, 0), "gcompile loss %v", loss)
			t.Logf("loss: gcompile %.15g  gorgonia %.15g  rel err %.3g  (ln vocab %.4g)", loss, refLoss, lossErr(loss, refLoss), math.Log(float64(vocab)))
			require.LessOrEqual(t, lossErr(loss, refLoss), f64Tol, "loss: gcompile %v, gorgonia %v", loss, refLoss)

			width := nameWidth(s.params())
			worst, worstName := 0.0, ""
			for _, p := range s.params() {
				g, gz := s.splitZeros(p.name, grads[p.name])
				ref, refz := s.splitZeros(p.name, refGrads[p.name])
				require.Greater(t, maxAbs(ref), 0.0, "gorgonia's gradient of %s is zero: the test would prove nothing", p.name)
				if refz != nil {
					t.Logf("grad %-*s zero part (exactly 0 in exact arithmetic): max|g| gcompile %.2e, gorgonia %.2e", width, p.name, maxAbs(gz), maxAbs(refz))
					require.LessOrEqual(t, maxAbs(refz), 1e-12*maxAbs(ref), "gorgonia's zero-part gradient of %s is not ~0", p.name)
					require.LessOrEqual(t, maxAbs(gz), 1e-12*maxAbs(ref), "gcompile's zero-part gradient of %s is not ~0", p.name)
				}
				e := relErr(g, ref, 1e-12)
				t.Logf("grad %-*s %-9v max|g| %.3e  max rel err %.3g", width, p.name, p.shape, maxAbs(ref), e)
				if e > worst {
					worst, worstName = e, p.name
				}
				require.LessOrEqual(t, e, f64Tol, "gradient of %s: max relative error %g", p.name, e)
			}
			t.Logf("float64: loss rel err %.3g, worst gradient rel err %.3g (%s)", lossErr(loss, refLoss), worst, worstName)
		})
	}
}

// oracleFloat32 compares, at every size, gcompile's float32 loss and
// gradients with gorgonia's float64 ones on the same float32-rounded
// weights, and logs how far gorgonia's own float32 run is from them for
// comparison: the loss to f32Loss relative, each gradient tensor to
// f32Grad relative to its largest entry, and elementwise to f32Elem
// relative with entries below s.f32Floor()·max|g| measured against that.
func oracleFloat32[M oracleModel](t *testing.T, sizes []M) {
	for _, s := range sizes {
		t.Run(s.String(), func(t *testing.T) {
			// Weights drawn as in the float64 test, then rounded to float32
			// by the float32 device; both references run on those.
			dev64 := loadOracle(t, s, ir.F64)
			w64 := initOracleWeights(t, dev64, s)
			dev := loadOracle(t, s, ir.F32)
			w := setWeights(t, dev, s.params(), w64)
			toks, tgts := randomTokens(s, 1)
			loss, grads := stepOracle(t, dev, s.params(), toks, tgts)

			refLoss, refGrads := s.gorgonia(t, tensor.Float64, w, toks, tgts)
			gLoss, gGrads := s.gorgonia(t, tensor.Float32, w, toks, tgts)

			t.Logf("loss: gcompile-f32 %.9g  reference-f64 %.15g  rel err %.3g  (gorgonia-f32 %.3g)", loss, refLoss, lossErr(loss, refLoss), lossErr(gLoss, refLoss))
			require.LessOrEqual(t, lossErr(loss, refLoss), f32Loss, "loss: gcompile %v, reference %v", loss, refLoss)

			width, floor := nameWidth(s.params()), s.f32Floor()
			var worstScale, worstElem, gWorstScale, gWorstElem float64
			for _, p := range s.params() {
				g, gz := s.splitZeros(p.name, grads[p.name])
				ref, _ := s.splitZeros(p.name, refGrads[p.name])
				gg, ggz := s.splitZeros(p.name, gGrads[p.name])
				if gz != nil {
					t.Logf("grad %-*s zero part (exactly 0): max|g|/max|ref| gcompile-f32 %.2e, gorgonia-f32 %.2e", width, p.name, maxAbs(gz)/maxAbs(ref), maxAbs(ggz)/maxAbs(ref))
					require.LessOrEqual(t, maxAbs(gz), f32Grad*maxAbs(ref), "gcompile's zero-part gradient of %s is not ~0", p.name)
				}
				se, ee := scaleErr(g, ref), relErr(g, ref, floor)
				gse, gee := scaleErr(gg, ref), relErr(gg, ref, floor)
				t.Logf("grad %-*s max|Δ|/max|g| %.3g (gorgonia-f32 %.3g)  elementwise rel err, floor %g·max|g|: %.3g (gorgonia-f32 %.3g)", width, p.name, se, gse, floor, ee, gee)
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
