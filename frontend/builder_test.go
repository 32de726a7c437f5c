package frontend_test

import (
	"bytes"
	"fmt"
	"math"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/frontend/nn"
	"gcompile/frontend/nn/gpt2"
	"gcompile/ir"
)

func TestDSLErrorsNameTheCallerAndDoNotCascade(t *testing.T) {
	_, err := frontend.Build(func(b *frontend.Builder) {
		x := b.Param("x", []int{4, 8}, frontend.Normal(1), frontend.NoParallel)
		w := b.Param("w", []int{3, 2}, frontend.Normal(1), frontend.NoParallel)
		y := x.MatMul(w) // the one error
		z := y.Add(x).Softmax().Reshape(99)
		b.Loss(z.Sum())
	}, frontend.Config{})
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 1, "a poisoned tensor reports nothing more: %v", err)
	assert.Regexp(t, `^builder_test\.go:\d+: matmul: inner dims differ: f32\[4,8\] · f32\[3,2\]`, lines[0])
}

// A mistake made in every layer of a loop is one error, with a count of
// the layers that repeat it; two different mistakes stay two. A --set
// value that an op cannot take is named once, where the model reads it.
func TestOneMistakeIsOneError(t *testing.T) {
	layers := func(b *frontend.Builder) {
		x := b.Param("x", []int{4, 8}, frontend.Normal(1), frontend.NoParallel)
		for i := range 3 {
			w := b.Param(fmt.Sprintf("h.%d.w", i), []int{3, 2}, frontend.Normal(1), frontend.NoParallel)
			b.Errorf("layer h.%d: width 3 does not divide 8", i)
			x = x.MatMul(w)
		}
		b.Loss(x.Sum())
	}
	_, err := frontend.Build(layers, frontend.Config{})
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 2, "%v", err)
	assert.Regexp(t, `^builder_test\.go:\d+: layer h\.0: width 3 does not divide 8 \(and 2 more like it: h\.1, h\.2\)$`, lines[0])
	assert.Regexp(t, `^builder_test\.go:\d+: matmul: inner dims differ: f32\[4,8\] · f32\[3,2\]`, lines[1])

	scaled := func(b *frontend.Builder) {
		f := b.Float("scale", 0.5, "scale")
		x := b.Param("x", []int{2}, frontend.Ones, frontend.NoParallel)
		b.ExportConfig(map[string]any{"scale": f})
		b.Loss(x.Scale(f).Sum())
	}
	_, err = frontend.Build(scaled, frontend.Config{Set: map[string]string{"scale": "NaN"}})
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(err.Error(), "\n")+1, "%v", err)
	assert.ErrorContains(t, err, "--set scale=NaN: want a number")
	// An infinite value reaches the op, which names it; the export
	// configuration it would also spoil says nothing more.
	_, err = frontend.Build(scaled, frontend.Config{Set: map[string]string{"scale": "Inf"}})
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(err.Error(), "\n")+1, "%v", err)
	assert.ErrorContains(t, err, "Scale(+Inf): the factor must be a finite number")
	// Alone, an export configuration that is not JSON is still named.
	_, err = frontend.Build(func(b *frontend.Builder) {
		b.ExportConfig(map[string]any{"eps": math.Inf(1)})
		b.Loss(b.Param("x", []int{2}, frontend.Ones, frontend.NoParallel).Sum())
	}, frontend.Config{})
	assert.ErrorContains(t, err, "ExportConfig: json: unsupported value: +Inf")
}

// lateBuild is a call the "builder used after Model returns" case makes
// after its build.
var lateBuild func()

// Concat takes a dim counted from the end, as the reductions do.
func TestConcatTakesANegativeDim(t *testing.T) {
	m, err := frontend.Build(func(b *frontend.Builder) {
		x := b.Param("x", []int{2, 3}, frontend.Zeros, frontend.NoParallel)
		y := b.Param("y", []int{2, 5}, frontend.Zeros, frontend.NoParallel)
		c := frontend.Concat(-1, x, y)
		assert.Equal(t, []int{2, 8}, c.Shape())
		b.Loss(c.Sum())
	}, frontend.Config{})
	require.NoError(t, err)
	require.NotNil(t, m)
}

func TestDSLRules(t *testing.T) {
	tests := []struct {
		name string
		fn   frontend.ModelFunc
		want string
	}{
		{"no loss", func(b *frontend.Builder) { b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel) }, "did not call b.Loss"},
		{"loss not scalar", func(b *frontend.Builder) {
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel))
		}, "loss must be a float scalar, got f32[2]"},
		{"tensor of another builder", func(b *frontend.Builder) {
			var other *frontend.Tensor
			_, _ = frontend.Build(func(b2 *frontend.Builder) {
				other = b2.Param("o", []int{2}, frontend.Zeros, frontend.NoParallel)
				b2.Loss(other.Sum())
			}, frontend.Config{})
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.Mul(other).Sum())
		}, "a tensor recorded by another builder (another model's build) is used here"},
		{"a nil argument", func(b *frontend.Builder) {
			var n *frontend.Tensor
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Add(n).Sum())
		}, "argument 1 is a nil *Tensor (a variable never assigned a tensor?)"},
		{"a nil operand of an op", func(b *frontend.Builder) {
			var n *frontend.Tensor
			b.Loss(b.Param("x", []int{2, 2}, frontend.Zeros, frontend.NoParallel).MatMul(n).Sum())
		}, "argument 1 is a nil *Tensor"},
		{"a method of a nil tensor", func(b *frontend.Builder) {
			var n *frontend.Tensor
			b.Loss(n.Add(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)).Sum())
		}, "model panicked: a method called on a nil *Tensor (a variable never assigned a tensor?)"},
		{"a nil loss", func(b *frontend.Builder) {
			b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
			b.Loss(nil)
		}, "argument 1 is a nil *Tensor"},
		{"a --set key no flag can spell", func(b *frontend.Builder) {
			b.Int("a,b=c", 2, "width")
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, `model parameter "a,b=c": a --set key is a word without commas, '=' or spaces`},
		{"export config twice", func(b *frontend.Builder) {
			b.ExportConfig(map[string]any{"model_type": "gpt2"})
			b.ExportConfig(map[string]any{"model_type": "llama"})
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, "ExportConfig called twice: the configuration was declared at builder_test.go:"},
		{"export config nil", func(b *frontend.Builder) {
			b.ExportConfig(nil)
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, "ExportConfig(nil): give the configuration's fields"},
		{"export config not JSON", func(b *frontend.Builder) {
			b.ExportConfig(map[string]any{"rope_theta": math.Inf(1)})
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, "ExportConfig: json: unsupported value: +Inf"},
		{"set key read twice", func(b *frontend.Builder) {
			b.Int("hidden", 16, "width")
			b.Int("hidden", 8, "width again")
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, `model parameter "hidden" is read twice, as int 16 and as int 8`},
		{"dim out of range", func(b *frontend.Builder) {
			x := b.Param("x", []int{2, 3}, frontend.Zeros, frontend.NoParallel)
			b.Loss(b.Param("y", []int{x.Dim(5)}, frontend.Zeros, frontend.NoParallel).Sum())
		}, "Dim(5) of f32[2,3]: a rank-2 tensor has dims -2..1"},
		{"the batch's tokens held whole", func(b *frontend.Builder) {
			x := b.WholeInput(ir.InputTokens, ir.I32, 2, 4)
			b.Loss(x.Cast(ir.F32).Sum())
		}, `: input "tokens" is declared with b.WholeInput, but training feeds it the batch's rows`},
		{"unknown parallel hint", func(b *frontend.Builder) {
			b.Loss(b.Param("w", []int{4, 4}, frontend.Zeros, frontend.Parallel("diagonal")).Sum())
		}, `param "w": parallel hint "diagonal": unknown split "diagonal"`},
		{"hint of another rank", func(b *frontend.Builder) {
			b.Loss(b.Param("w", []int{4}, frontend.Zeros, frontend.RowParallel).Sum())
		}, `param "w": parallel hint "row" does not fit a param of rank 1`},
		{"heads that do not divide the outputs", func(b *frontend.Builder) {
			b.Loss(b.Param("k", []int{8, 24}, frontend.Zeros, frontend.HeadParallel(16)).Sum())
		}, `param "k": parallel hint "heads:16": dim 1 of the param [8 24] (24) is not a whole number of 16-wide heads`},
		{"fused blocks that do not divide the outputs", func(b *frontend.Builder) {
			b.Loss(b.Param("qkv", []int{8, 16}, frontend.Zeros, frontend.FusedColumnParallel(3)).Sum())
		}, `param "qkv": parallel hint "column:3": dim 1 of the param [8 16] (16) does not split into 3 fused blocks`},
		{"fused blocks of a laid out matrix", func(b *frontend.Builder) {
			b.Loss(b.Param("qkv", []int{16, 9}, frontend.Zeros, frontend.FusedColumnParallel(3).OutIn()).Sum())
		}, `param "qkv": parallel hint "column:3,out_in": dim 0 of the param [16 9] (16) does not split into 3 fused blocks`},
		{"layer ids with a gap", func(b *frontend.Builder) {
			x := b.Param("x", []int{2, 2}, frontend.Zeros, frontend.NoParallel)
			for i := range 2 {
				b.Layer(5 * i)
				x = x.MatMul(b.Param(fmt.Sprintf("w%d", i), []int{2, 2}, frontend.Zeros, frontend.NoParallel))
			}
			b.Layer(-1)
			b.Loss(x.Sum())
		}, "the model marks layers up to 5 (%3 param @builder_test.go:"},
		{"a block marked again after the next", func(b *frontend.Builder) {
			x := b.Param("x", []int{2, 2}, frontend.Zeros, frontend.NoParallel)
			for i, id := range []int{0, 1, 0} {
				b.Layer(id)
				x = x.MatMul(b.Param(fmt.Sprintf("w%d", i), []int{2, 2}, frontend.Zeros, frontend.NoParallel))
			}
			b.Layer(-1)
			b.Loss(x.Sum())
		}, ", marked layer 0, reads %4 matmul @builder_test.go:"},
		{"an input without a name", func(b *frontend.Builder) {
			b.Loss(b.Input("", ir.F32, 2).Sum())
		}, `input name "": want a non-empty name of printable UTF-8 without spaces or quotes`},
		{"an input name with a space", func(b *frontend.Builder) {
			b.Loss(b.Input("my input", ir.F32, 2).Sum())
		}, `input name "my input": want a non-empty name`},
		{"a param without an init", func(b *frontend.Builder) {
			b.Loss(b.Param("w", []int{2}, frontend.Init(""), frontend.NoParallel).Sum())
		}, `param "w": no init given (want frontend.Normal(std), frontend.Zeros or frontend.Ones)`},
		{"an output named as the step line's loss", func(b *frontend.Builder) {
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum()
			b.Output("lr", x)
			b.Loss(x)
		}, `output name "lr": the step line and the metrics print the run's own lr under it`},
		{"a zero Tensor as an argument", func(b *frontend.Builder) {
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Add(&frontend.Tensor{}).Sum())
		}, "argument 1 is a zero frontend.Tensor{}, which no builder made"},
		{"a method of a zero Tensor", func(b *frontend.Builder) {
			b.Loss((&frontend.Tensor{}).Add(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)).Sum())
		}, "builder_test.go:"},
		{"a method of a nil Builder", func(b *frontend.Builder) {
			var nb *frontend.Builder
			nb.Int("n", 1, "n")
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, "builder_test.go:"},
		{"a poisoned loss without an error", func(b *frontend.Builder) {
			b.Loss(b.Poisoned())
		}, "b.Loss was given a poisoned tensor (b.Poisoned(), or an op on one) and no error was reported"},
		{"an empty error", func(b *frontend.Builder) {
			b.Errorf("")
			b.Loss(b.Poisoned())
		}, "the model reported an error with no text"},
		{"param name with a space", func(b *frontend.Builder) {
			b.Loss(b.Param("my weight", []int{4}, frontend.Zeros, frontend.NoParallel).Sum())
		}, `param name "my weight": want printable UTF-8 without spaces or quotes`},
		{"reduction axis out of range", func(b *frontend.Builder) {
			b.Loss(b.Param("x", []int{2, 3}, frontend.Zeros, frontend.NoParallel).Sum(-3).Sum())
		}, "reduce_sum over axis -3 of f32[2,3]: a rank-2 tensor has axes -2..1"},
		{"NaN constant", func(b *frontend.Builder) {
			b.Loss(b.Constant("t", []float64{1, math.NaN()}, 2).Sum())
		}, `constant "t": value 1 is NaN`},
		{"infinite scale", func(b *frontend.Builder) {
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Scale(math.Inf(1)).Sum())
		}, "Scale(+Inf): the factor must be a finite number"},
		{"a panic after a DSL error", func(b *frontend.Builder) {
			x := b.Param("x", []int{2, 3}, frontend.Zeros, frontend.NoParallel)
			s := x.Reshape(4, 4).Shape()
			_ = s[0]
		}, "reshape"},
		{"duplicate param", func(b *frontend.Builder) {
			b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, `param "x" is declared twice (first at builder_test.go:`},
		{"broadcast mismatch", func(b *frontend.Builder) {
			x := b.Param("x", []int{2, 3}, frontend.Zeros, frontend.NoParallel)
			y := b.Param("y", []int{4}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.Add(y).Sum())
		}, "add: shapes f32[2,3] and f32[4] do not broadcast"},
		{"output not scalar", func(b *frontend.Builder) {
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
			b.Output("acc", x)
			b.Loss(x.Sum())
		}, `output "acc" must be a float scalar, got f32[2]`},
		{"output twice", func(b *frontend.Builder) {
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum()
			b.Output("acc", x)
			b.Output("acc", x)
			b.Loss(x)
		}, `output "acc" is declared twice`},
		{"output name", func(b *frontend.Builder) {
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum()
			b.Output("grad/x", x)
			b.Loss(x)
		}, `output name "grad/x": want a non-empty name without spaces, quotes or slashes`},
		{"constant shape", func(b *frontend.Builder) {
			c := b.Constant("table", []float64{1, 2, 3}, 2, 2)
			b.Loss(c.Sum())
		}, `constant "table": 3 values for shape [2 2] (4 elements)`},
		{"loss twice", func(b *frontend.Builder) {
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.Sum())
			b.Loss(x.Mean())
		}, "b.Loss called twice: the loss was set at builder_test.go:"},
		{"param named as safetensors' metadata", func(b *frontend.Builder) {
			b.Loss(b.Param("__metadata__", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, `param name "__metadata__" is reserved`},
		{"param without a name", func(b *frontend.Builder) {
			b.Loss(b.Param("", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, "a param needs a name"},
		{"init that does not exist", func(b *frontend.Builder) {
			b.Loss(b.Param("x", []int{2}, frontend.Init("bogus(3"), frontend.NoParallel).Sum())
		}, `param "x": unknown init "bogus(3"`},
		{"negative std", func(b *frontend.Builder) {
			b.Loss(b.Param("x", []int{2}, frontend.Normal(-1), frontend.NoParallel).Sum())
		}, `param "x": init "normal(-1)": the std must be a finite number ≥ 0`},
		{"concat of nothing", func(b *frontend.Builder) {
			b.Loss(frontend.Concat(0).Sum())
		}, "frontend.Concat: no tensors to concatenate"},
		{"builder used after Model returns", func(b *frontend.Builder) {
			saved := b
			x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.Sum())
			lateBuild = func() { saved.Param("late", []int{2}, frontend.Zeros, frontend.NoParallel) }
		}, ""},
		{"model panics", func(b *frontend.Builder) {
			var s []int
			_ = s[3]
		}, "model panicked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := frontend.Build(tt.fn, frontend.Config{})
			if tt.want == "" {
				// Built fine; recording into it afterwards panics, naming
				// the late call's line.
				require.NoError(t, err)
				defer func() {
					r := recover()
					require.NotNil(t, r)
					assert.Contains(t, fmt.Sprint(r), "the model's builder was used after Model returned")
					assert.Contains(t, fmt.Sprint(r), "builder_test.go:")
				}()
				lateBuild()
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			if tt.name != "no loss" { // a missing call has no line to point at
				assert.Contains(t, err.Error(), "builder_test.go:")
			}
		})
	}
}

func TestSettings(t *testing.T) {
	model := func(b *frontend.Builder) {
		n := b.Int("n", 2, "size")
		f := b.Float("scale", 0.5, "scale")
		act := b.String("act", "gelu", "activation", "gelu", "relu")
		x := b.Param("x", []int{n}, frontend.Ones, frontend.NoParallel)
		if act == "relu" {
			x = x.Relu()
		}
		b.Loss(x.Scale(f).Sum())
	}
	m, err := frontend.Build(model, frontend.Config{Set: map[string]string{"n": "5", "act": "relu"}})
	require.NoError(t, err)
	assert.Equal(t, ir.Shape{5}, m.Params()[0].Type.Shape)
	_, err = frontend.Build(model, frontend.Config{Set: map[string]string{"n": "-1"}})
	assert.ErrorContains(t, err, "--set n=-1: want a positive integer")
	_, err = frontend.Build(model, frontend.Config{Set: map[string]string{"n": "0"}})
	assert.ErrorContains(t, err, "--set n=0: want a positive integer")
	_, err = frontend.Build(model, frontend.Config{Set: map[string]string{"act": "tanh"}})
	assert.ErrorContains(t, err, "--set act=tanh: want one of gelu, relu")

	// A parameter whose 0 means "off" or "automatic" takes 0, never -1.
	var got int
	optional := func(b *frontend.Builder) {
		got = b.IntOrZero("group", 4, "tokens per group (0: one sequence)")
		b.Loss(b.Param("x", []int{2}, frontend.Ones, frontend.NoParallel).Sum())
	}
	_, err = frontend.Build(optional, frontend.Config{Set: map[string]string{"group": "0"}})
	require.NoError(t, err)
	assert.Equal(t, 0, got)
	_, err = frontend.Build(optional, frontend.Config{Set: map[string]string{"group": "-1"}})
	assert.ErrorContains(t, err, "--set group=-1: want an integer ≥ 0")
	_, err = frontend.Build(model, frontend.Config{Set: map[string]string{"sz": "3"}})
	assert.ErrorContains(t, err, "unknown model parameter(s) sz (this model reads: n, scale, act)")
	docs, err := frontend.Describe(model, frontend.Config{})
	require.NoError(t, err)
	assert.Equal(t, frontend.ParamDoc{Key: "scale", Kind: "float", Default: "0.5", Doc: "scale"}, docs[1])

	kv, err := frontend.ParseSet("layers=2, hidden=64")
	require.NoError(t, err)
	assert.Equal(t, "hidden=64,layers=2", frontend.FormatSet(kv))
	_, err = frontend.ParseSet("layers")
	assert.ErrorContains(t, err, "want key=value")
	_, err = frontend.ParseSet("a=1,a=2")
	assert.ErrorContains(t, err, "a given twice")
	// The whole argument is quoted, and the piece that breaks the rule.
	_, err = frontend.ParseSet("layers=2,")
	assert.ErrorContains(t, err, `--set "layers=2,": an empty pair (a comma too many)`)
	_, err = frontend.ParseSet("layers=2,hidden")
	assert.ErrorContains(t, err, `--set "layers=2,hidden": "hidden" is not key=value`)
}

func TestPositionsPointAtTheUser(t *testing.T) {
	m, err := frontend.Build(func(b *frontend.Builder) {
		x := b.Param("x", []int{2, 2}, frontend.Ones, frontend.NoParallel)
		b.Layer(0)
		y := x.Tanh()
		b.Layer(-1)
		b.Loss(y.Sum())
	}, frontend.Config{})
	require.NoError(t, err)
	var tanh *ir.Value
	for _, v := range m.Values {
		assert.Equal(t, "builder_test.go", v.Pos.File)
		if v.Op == "tanh" {
			tanh = v
		}
	}
	require.NotNil(t, tanh)
	assert.Equal(t, 0, tanh.Meta.Layer)
	assert.Equal(t, ir.PhaseFwd, tanh.Meta.Phase)
	assert.Equal(t, -1, m.Output("loss").Meta.Layer)
	var buf bytes.Buffer
	require.NoError(t, ir.Fprint(&buf, m))
	assert.Contains(t, buf.String(), "tanh %0 : f32[2,2] {layer=0 phase=fwd} @builder_test.go:")
}

// Scopes tag what they record: RecomputeSelective marks computations (not
// the params or constants they read) for selective recompute, KeepFP32
// pins them to fp32, and a param declared inside KeepFP32 pins every op
// that reads it, even outside the scope; scopes end with their function.
func TestScopesTagTheirOps(t *testing.T) {
	m, err := frontend.Build(func(b *frontend.Builder) {
		x := b.Param("x", []int{2, 4}, frontend.Normal(1), frontend.NoParallel)
		var y, z, w *frontend.Tensor
		b.RecomputeSelective(func() {
			y = x.Scale(0.5).Softmax()
		})
		b.KeepFP32(func() {
			w = b.Param("w", []int{2, 4}, frontend.Ones, frontend.NoParallel)
			z = y.Mul(x)
		})
		u := y.Sub(w) // outside the scope, but reads w
		b.Output("z_mean", z.Mean())
		b.Loss(z.Add(u).Sum())
	}, frontend.Config{})
	require.NoError(t, err)
	type tags struct{ selective, fp32 bool }
	got := map[string]tags{}
	for _, v := range m.Values {
		key := v.Op
		if v.Op == "param" {
			key += " " + v.Name()
		}
		got[key] = tags{v.Meta.Selective, v.Meta.Precision == ir.F32}
	}
	assert.Equal(t, tags{true, false}, got["scale"])
	assert.Equal(t, tags{true, false}, got["softmax"])
	assert.Equal(t, tags{false, true}, got["mul"])
	assert.Equal(t, tags{false, true}, got["sub"], "reads the fp32 param w")
	assert.Equal(t, tags{false, false}, got["const"], "the scale's constant is a source")
	assert.Equal(t, tags{false, false}, got["param x"])
	assert.Equal(t, tags{false, true}, got["param w"], "declared inside KeepFP32")
	assert.Equal(t, tags{false, false}, got["add"], "the scopes ended")
	assert.NotNil(t, m.Output(ir.AuxPrefix+"z_mean"))
}

// SaveEach marks a stacked param with the names and layout of its pieces
// in weight files, and refuses what cannot be split so, at the model's
// line.
func TestSaveEach(t *testing.T) {
	m, err := frontend.Build(func(b *frontend.Builder) {
		w := b.Param("experts.w1", []int{4, 8, 16}, frontend.Normal(1), frontend.ExpertParallel(frontend.ColumnParallel))
		b.SaveEach(w, "experts.{e}.w1.weight", frontend.PieceOutIn)
		b.Loss(w.Sum())
	}, frontend.Config{})
	require.NoError(t, err)
	s, ok, err := ir.ParamSaveEach(m.Source("experts.w1"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, ir.SaveEach{Template: "experts.{e}.w1.weight", Layout: ir.PieceOutIn}, s)
	assert.Equal(t, "experts.3.w1.weight", s.Name(3))
	assert.Equal(t, []int{16, 8}, s.PieceShape(ir.Shape{4, 8, 16}))

	for _, c := range []struct {
		name string
		fn   func(b *frontend.Builder, w *frontend.Tensor)
		want string
	}{
		{"no index", func(b *frontend.Builder, w *frontend.Tensor) { b.SaveEach(w, "experts.w1", "") },
			`SaveEach of param "w": save_each name "experts.w1" must hold {e} exactly once (it holds it 0 times)`},
		{"not a param", func(b *frontend.Builder, w *frontend.Tensor) { b.SaveEach(w.Scale(2), "e.{e}", "") }, "its tensor is the result of scale at builder_test.go:"},
		{"twice", func(b *frontend.Builder, w *frontend.Tensor) { b.SaveEach(w, "a.{e}", ""); b.SaveEach(w, "b.{e}", "") },
			`param "w" is already saved as "a.{e}"`},
		{"layout", func(b *frontend.Builder, w *frontend.Tensor) { b.SaveEach(w, "a.{e}", "in_out") }, `save_layout "in_out"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := frontend.Build(func(b *frontend.Builder) {
				w := b.Param("w", []int{4, 8, 16}, frontend.Normal(1), frontend.NoParallel)
				c.fn(b, w)
				b.Loss(w.Sum())
			}, frontend.Config{})
			require.Error(t, err)
			assert.ErrorContains(t, err, c.want)
			assert.Contains(t, err.Error(), "builder_test.go:")
		})
	}
}

// Mistakes in a model file that used to train on the wrong thing, fail
// later without a line, or give a bare nil dereference, are each one
// error at the model's line.
func TestModelMistakesAreOneErrorAtTheirLine(t *testing.T) {
	param := func(b *frontend.Builder, shape ...int) *frontend.Tensor {
		return b.Param(fmt.Sprintf("p%d", len(shape)), shape, frontend.Normal(1), frontend.NoParallel)
	}
	for _, tc := range []struct {
		name string
		fn   frontend.ModelFunc
		want string
	}{
		{"transposed labels", func(b *frontend.Builder) {
			labels := b.Input("targets", ir.I32, 2, 8)
			b.Loss(nn.CrossEntropy(param(b, 2, 8, 16), labels.Transpose(1, 0)))
		}, "CrossEntropy: labels [8 2] must have the logits' leading shape [2 8]"},
		{"a default that is not a choice", func(b *frontend.Builder) {
			b.String("act", "gleu", "activation", "gelu", "relu")
			b.Loss(param(b, 2).Sum())
		}, `String("act"): the default "gleu" is not one of its choices gelu, relu`},
		{"an activation the MLP does not have", func(b *frontend.Builder) {
			b.Loss(gpt2.MLP(param(b, 2, 4, 8), "mlp", "gleu", 0.02).Sum())
		}, `MLP mlp: activation "gleu": want gelu or relu`},
		{"a NaN scalar", func(b *frontend.Builder) {
			b.Loss(param(b, 2).Sum().Add(b.Scalar(math.NaN())))
		}, "Scalar(NaN): the value is NaN"},
		{"attention of a rank-3 q", func(b *frontend.Builder) {
			x := param(b, 2, 8, 16)
			b.Loss(nn.CausalAttention(x, x, x).Sum())
		}, "attention: q must be"},
		{"SplitHeads past the width", func(b *frontend.Builder) {
			b.Loss(nn.SplitHeads(param(b, 2, 8, 16), 3).Sum())
		}, "SplitHeads(x, 3): x [2 8 16] must be [batch, seq, hidden] with hidden divisible by the 3 heads"},
		{"a negative head size", func(b *frontend.Builder) {
			b.Loss(nn.GroupedQueryAttention(param(b, 2, 8, 16), "a", nn.AttentionConfig{Heads: 4, HeadDim: -4}).Sum())
		}, "attention a: HeadDim -4: want a positive size"},
		{"the output of a nil tensor", func(b *frontend.Builder) {
			var n *frontend.Tensor
			b.Output("acc", n)
			b.Loss(param(b, 2).Sum())
		}, "argument 1 is a nil *Tensor"},
		{"the shape of a nil tensor", func(b *frontend.Builder) {
			var n *frontend.Tensor
			b.Loss(param(b, n.Dim(0)).Sum())
		}, "model panicked: a method called on a nil *Tensor"},
		{"concat of a nil tensor", func(b *frontend.Builder) {
			var n *frontend.Tensor
			b.Loss(frontend.Concat(0, n, param(b, 2)).Sum())
		}, "model panicked: a method called on a nil *Tensor"},
		{"a negative layer", func(b *frontend.Builder) {
			b.Layer(-7)
			b.Loss(param(b, 2).Sum())
		}, "Layer(-7): want a layer index ≥ 0, or -1 to end the layers"},
		{"recompute nothing", func(b *frontend.Builder) {
			b.RecomputeSelective(nil)
			b.Loss(param(b, 2).Sum())
		}, "RecomputeSelective(nil)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := frontend.Build(tc.fn, frontend.Config{Batch: 2})
			require.Error(t, err)
			assert.Equal(t, 1, strings.Count(err.Error(), "\n")+1, "one error: %v", err)
			assert.ErrorContains(t, err, tc.want)
			assert.Regexp(t, `^builder_test\.go:\d+: `, err.Error())
		})
	}
	// A panic that follows an error is said to follow from it.
	_, err := frontend.Build(func(b *frontend.Builder) {
		y := param(b, 4, 8).Reshape(5, 7)
		per := 16 / y.Dim(1)
		b.Loss(param(b, per).Sum())
	}, frontend.Config{})
	require.Error(t, err)
	assert.ErrorContains(t, err, "reshape")
	assert.ErrorContains(t, err, "integer divide by zero (likely a consequence of the error above")
	// A String default of "" is the model's own "unset", not a typo.
	_, err = frontend.Build(func(b *frontend.Builder) {
		b.String("norm", "", "normalisation (empty: the model's choice)", "layernorm", "rmsnorm")
		b.Loss(param(b, 2).Sum())
	}, frontend.Config{})
	require.NoError(t, err)
	// Flattened logits take labels of their rows in any shape, as the
	// reference GPT gives them.
	_, err = frontend.Build(func(b *frontend.Builder) {
		labels := b.Input("targets", ir.I32, 2, 8)
		b.Loss(nn.CrossEntropy(param(b, 16, 32), labels))
	}, frontend.Config{})
	require.NoError(t, err)
}

// A mixture-of-experts layer its config refuses is one error: its
// auxiliary loss is poisoned, so the loss that adds it says nothing
// more (it was nil, which the add named as a second error).
func TestMoEConfigErrorIsOneError(t *testing.T) {
	_, err := frontend.Build(func(b *frontend.Builder) {
		tokens := b.Input("tokens", ir.I32, 2, 8)
		targets := b.Input("targets", ir.I32, 2, 8)
		x, _ := nn.Embedding(tokens, "wte", 64, 16)
		y, aux := nn.MoE(x, "moe", nn.MoEConfig{Experts: 4, Router: "top1", CapacityFactor: 1.25})
		x = x.Add(y)
		logits := nn.Dense(x.Reshape(16, 16), "head", 64, nn.LinearConfig{})
		b.Loss(nn.CrossEntropy(logits, targets).Add(aux))
	}, frontend.Config{Batch: 2})
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 1, "%v", err)
	assert.Contains(t, lines[0], `MoE moe: router "top1" does not exist`)
}

// A param named like an input is said to take the input's name, not to
// be declared twice.
func TestParamNamedLikeAnInput(t *testing.T) {
	_, err := frontend.Build(func(b *frontend.Builder) {
		b.Input("targets", ir.I32, 2, 8)
		w := b.Param("targets", []int{16}, frontend.Normal(1), frontend.NoParallel)
		b.Loss(w.Sum())
	}, frontend.Config{Batch: 2})
	require.Error(t, err)
	assert.Regexp(t, `builder_test\.go:\d+: param "targets": the name is already input "targets"'s \(at builder_test\.go:\d+\); params, states and inputs each need a name of their own`, err.Error())
}

// A setting read with Implementation is listed as one (how the model
// computes, not what); a String setting is not.
func TestImplementationSettingsAreListed(t *testing.T) {
	docs, err := frontend.Describe(func(b *frontend.Builder) {
		b.Implementation("attention", "fused", "attention core", "fused", "unfused")
		b.String("act", "gelu", "activation", "gelu", "relu")
		b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
	}, frontend.Config{Batch: 1, Set: map[string]string{"attention": "unfused"}})
	require.NoError(t, err)
	require.Len(t, docs, 2)
	assert.Equal(t, frontend.ParamDoc{Key: "attention", Kind: "string", Default: "fused", Doc: "attention core (fused|unfused)", Implementation: true}, docs[0])
	assert.False(t, docs[1].Implementation)
}

// A tensor of another, finished build used as an op's receiver is named
// at the line that uses it: the error went to the finished builder, and
// the next op reported the wrong line.
func TestAReceiverOfAFinishedBuildIsNamedWhereItIsUsed(t *testing.T) {
	var other *frontend.Tensor
	_, err := frontend.Build(func(b *frontend.Builder) {
		other = b.Param("o", []int{2}, frontend.Zeros, frontend.NoParallel)
		b.Loss(other.Sum())
	}, frontend.Config{})
	require.NoError(t, err)
	line := 0
	_, err = frontend.Build(func(b *frontend.Builder) {
		x := b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel)
		_, _, line, _ = goruntime.Caller(0)
		y := other.Add(x) // the line after Caller's
		b.Loss(y.Reshape(2).Sum())
	}, frontend.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("builder_test.go:%d: model panicked: ", line+1))
	assert.Contains(t, err.Error(), "the model's builder was used after Model returned, or a tensor of another, finished build is used here")
}

// A model's own default is a value --set may give back: an Int whose
// default is 0 (the model's "off") takes --set n=0, where any other
// value must be positive.
func TestASettingsDefaultCanBeGivenBack(t *testing.T) {
	build := func(set string) (int, error) {
		n := -1
		_, err := frontend.Build(func(b *frontend.Builder) {
			n = b.Int("n", 0, "n (0: off)")
			b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
		}, frontend.Config{Set: map[string]string{"n": set}})
		return n, err
	}
	n, err := build("0")
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = build("3")
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	_, err = build("-1")
	assert.ErrorContains(t, err, "--set n=-1: want a positive integer")
}

// A constant's name is only a label (constants are neither fed nor
// saved): one with spaces builds, where an input's is refused.
func TestAConstantsNameMayHoldSpaces(t *testing.T) {
	_, err := frontend.Build(func(b *frontend.Builder) {
		c := b.Constant("per feature scale", []float64{1, 2}, 2)
		b.Loss(b.Param("x", []int{2}, frontend.Zeros, frontend.NoParallel).Mul(c).Sum())
	}, frontend.Config{})
	require.NoError(t, err)
}
