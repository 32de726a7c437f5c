package ir_test

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/passes"
)

// tinyGPT are the --set values of the small reference GPT the round-trip and
// golden tests compile: big enough to have every layer kind, small enough
// that the whole pipeline runs in milliseconds.
var tinyGPT = map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}

// buildGPT records the reference GPT with tinyGPT plus extra settings.
func buildGPT(t testing.TB, extra map[string]string) *ir.Module {
	t.Helper()
	set := maps.Clone(tinyGPT)
	maps.Copy(set, extra)
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 2, Set: set})
	require.NoError(t, err)
	return m
}

// stage is the module as it stood before the pipeline ("input") or after
// one pass, printed at that moment.
type stage struct {
	pass string // "" for the input
	text string
	// summary is the structure of the module at that moment, for comparing
	// with what parsing the text gives back.
	summary moduleSummary
}

// runStages runs the whole pipeline on m and records every stage.
func runStages(t testing.TB, m *ir.Module, opts *passes.Options) []stage {
	t.Helper()
	var stages []stage
	record := func(pass string, m *ir.Module) {
		stages = append(stages, stage{pass: pass, text: ir.Print(m), summary: summarize(m)})
	}
	results, err := passes.Run(m, opts, passes.Hooks{
		Before: func(m *ir.Module) { record("", m) },
		After:  func(r passes.Result, m *ir.Module) { record(r.Name, m) },
	})
	require.NoError(t, err)
	var ran []string
	for _, r := range results {
		require.Empty(t, r.Skipped, "pass %s", r.Name)
		ran = append(ran, r.Name)
	}
	var all []string
	for _, p := range passes.Table() {
		all = append(all, p.Name)
	}
	require.Equal(t, all, ran, "every pass of the table must run")
	return stages
}

// valueSummary is everything about a value that the text form carries,
// with args as ids so two modules can be compared with cmp.
type valueSummary struct {
	ID    int
	Op    string
	Args  []int
	Type  string
	Attrs map[string]string
	Place []ir.Placement
	Meta  ir.Meta
	Pos   ir.Pos
}

type moduleSummary struct {
	Name    string
	Passes  []string
	Mesh    string
	Values  []valueSummary
	Outputs []string
	Updates [][2]int
}

// summarize flattens m. Attributes are rendered with their Go type, so an
// int stored where a float belongs shows up as a difference.
func summarize(m *ir.Module) moduleSummary {
	s := moduleSummary{Name: m.Name, Passes: slices.Clone(m.Passes)}
	if m.Mesh != nil {
		s.Mesh = m.Mesh.String()
	}
	id := func(v *ir.Value) int {
		if v == nil {
			return -1
		}
		return v.ID
	}
	for _, v := range m.Values {
		vs := valueSummary{ID: v.ID, Op: v.Op, Type: v.Type.String(), Place: slices.Clone(v.Place), Meta: v.Meta, Pos: v.Pos}
		for _, a := range v.Args {
			vs.Args = append(vs.Args, id(a))
		}
		if len(v.Attrs) > 0 {
			vs.Attrs = map[string]string{}
			for k, a := range v.Attrs {
				vs.Attrs[k] = fmt.Sprintf("%T(%v)", a, a)
			}
		}
		s.Values = append(s.Values, vs)
	}
	for _, o := range m.Outputs {
		s.Outputs = append(s.Outputs, fmt.Sprintf("%q=%d", o.Name, id(o.Value)))
	}
	for _, u := range m.Updates {
		s.Updates = append(s.Updates, [2]int{id(u.State), id(u.Value)})
	}
	return s
}

// reparse parses text (which must be canonical, i.e. printed) and checks
// that printing the result gives the same text back.
func reparse(t *testing.T, file, text string) *ir.Module {
	t.Helper()
	m, err := ir.Parse(file, text)
	require.NoError(t, err, "parsing printed text")
	if diff := cmp.Diff(text, ir.Print(m)); diff != "" {
		t.Fatalf("print(parse(print(m))) != print(m) (-print(m) +print(parse(print(m)))):\n%s", diff)
	}
	return m
}

func TestRoundTripGPTPipeline(t *testing.T) {
	relu := map[string]string{"activation": "relu"}
	tests := []struct {
		name       string
		optimizer  string
		set        map[string]string
		activation string // the forward op the MLP must use
	}{
		{name: "adamw", optimizer: "adamw", activation: "gelu"},
		{name: "sgd", optimizer: "sgd", activation: "gelu"},
		{name: "adamw-relu", optimizer: "adamw", set: relu, activation: "relu"},
		{name: "sgd-relu", optimizer: "sgd", set: relu, activation: "relu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := passes.DefaultOptions()
			opts.Verify = true
			opts.Optimizer = tt.optimizer
			stages := runStages(t, buildGPT(t, tt.set), opts)
			require.Len(t, stages, len(passes.Table())+1)
			for _, st := range stages {
				name := st.pass
				if name == "" {
					name = "input"
				}
				t.Run(name, func(t *testing.T) {
					p := reparse(t, "gpt.gir", st.text)
					if diff := cmp.Diff(st.summary, summarize(p)); diff != "" {
						t.Fatalf("parsed module differs from the printed one (-printed +parsed):\n%s", diff)
					}
					require.NoError(t, ir.Verify(p, st.pass))
					for _, v := range p.Values {
						require.Less(t, v.ID, p.NextID(), "parsed next id must lie above every id")
					}
				})
			}
			final := stages[len(stages)-1].text
			assert.Contains(t, final, " = "+tt.optimizer+" %", "the optimizer step must be in the final module")
			assert.Contains(t, final, " = "+tt.activation+" %")
			assert.Contains(t, final, " = "+tt.activation+"_grad %")
		})
	}
}

// edgeCase is a hand-written .gir input. The round-trip tests and the fuzz
// seeds share these.
type edgeCase struct {
	name string
	text string
	// canonical, when set, is what Print must give for the parsed text.
	canonical string
	// invalid says Verify rejects the module (it must still round-trip).
	invalid bool
	check   func(t *testing.T, m *ir.Module)
}

var edgeCases = []edgeCase{
	{
		name: "a model whose evaluation differs",
		text: `gir 1
module "moe"
evaluation-differs
%0 = input : f32[] {name="lr"}
output "y" = %0
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.True(t, m.EvalDiffers)
		},
	},
	{
		name: "scalars and empty int lists",
		text: `gir 1
module "scalar"
%0 = const : f32[] {value=2.5}
%1 = input : f32[] {name="lr"}
%2 = mul %0, %1 : f32[]
%3 = reshape %2 : f32[1,1] {shape=[1,1]}
%4 = reshape %3 : f32[] {shape=[]}
%5 = reduce_sum %3 : f32[1,1] {axes=[]}
%6 = transpose %2 : f32[] {perm=[]}
output "y" = %4
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, 0, m.Values[0].Type.Rank())
			assert.Equal(t, "f32[]", m.Values[4].Type.String())
			assert.Equal(t, []int{}, m.Values[4].Attrs.Ints("shape"))
			assert.Equal(t, []int{}, m.Values[5].Attrs.Ints("axes"))
			assert.Equal(t, []int{}, m.Values[6].Attrs.Ints("perm"))
		},
	},
	{
		name: "negative and infinite floats",
		text: `gir 1
module "floats"
%0 = input : f32[4,4] {name="x"}
%1 = causal_mask %0 : f32[4,4] {fill=-Inf}
%2 = causal_mask %0 : f32[4,4] {fill=+Inf}
%3 = causal_mask %0 : f32[4,4] {fill=-1e+300}
%4 = const : f32[] {value=-0.5}
%5 = const : f64[2] {value=-0}
%6 = const : f32[] {value=NaN}
%7 = const : f32[] {value=5e-324}
%8 = const : f32[] {value=-1.7976931348623157e+308}
%9 = clip_coef %4 : f32[] {max_norm=-Inf}
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.True(t, math.IsInf(m.Values[1].Attrs.Float("fill", 0), -1))
			assert.True(t, math.IsInf(m.Values[2].Attrs.Float("fill", 0), 1))
			assert.True(t, math.Signbit(m.Values[5].Attrs.Float("value", 1)), "-0 keeps its sign")
			assert.True(t, math.IsNaN(m.Values[6].Attrs.Float("value", 0)))
			assert.Equal(t, -math.MaxFloat64, m.Values[8].Attrs.Float("value", 0))
		},
	},
	{
		name: "float spellings are canonicalised",
		text: `gir 1
module "spellings"
%0 = input : f32[2,2] {name="x"}
%1 = causal_mask %0 : f32[2,2] {fill=-inf}
%2 = causal_mask %0 : f32[2,2] {fill=Infinity}
%3 = const : f32[] {value=1E3}
%4 = const : f32[] {value=0x1p-2}
%5 = const : f32[] {value=.5}
%6 = matmul %0, %0 : f32[2,2] {transA=1 transB=F}
`,
		canonical: `gir 1
module "spellings"
%0 = input : f32[2,2] {name="x"}
%1 = causal_mask %0 : f32[2,2] {fill=-Inf}
%2 = causal_mask %0 : f32[2,2] {fill=+Inf}
%3 = const : f32[] {value=1000}
%4 = const : f32[] {value=0.25}
%5 = const : f32[] {value=0.5}
%6 = matmul %0, %0 : f32[2,2] {transA=true transB=false}
`,
	},
	{
		name: "strings with quotes, escapes, braces and at-signs",
		text: `gir 1
module "strings \"q\" } @x:1"
%0 = param : f32[2] {init="normal(0.02)" name="a \"quoted\" name"} @model.go:1
%1 = param : f32[2] {name="brace } and at @model.go:9, colon : and eq = x"} @model.go:2
%2 = param : f32[2] {name="tab\tnewline\nbackslash\\ é \u2028 nul \x00 bad utf8 \xff"} @model.go:3
%3 = param : f32[2] {init="}" name="{"} @model.go:4
%4 = param : f32[2] {name=""} @model.go:5
%5 = cast %0 : bf16[2] {to="bf16"} @model.go:6
output "out \"1\" {} @x:2" = %5
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, `strings "q" } @x:1`, m.Name)
			assert.Equal(t, `a "quoted" name`, m.Values[0].Name())
			assert.Equal(t, "brace } and at @model.go:9, colon : and eq = x", m.Values[1].Name())
			assert.Equal(t, ir.Pos{File: "model.go", Line: 2}, m.Values[1].Pos)
			assert.Equal(t, "tab\tnewline\nbackslash\\ é \u2028 nul \x00 bad utf8 \xff", m.Values[2].Name())
			assert.Equal(t, "}", m.Values[3].Attrs.Str("init"))
			assert.Equal(t, "", m.Values[4].Name())
			assert.Equal(t, `out "1" {} @x:2`, m.Outputs[0].Name)
		},
	},
	{
		name: "output names containing ' = '",
		text: `gir 1
module "eq"
%0 = input : f32[] {name="x"}
output "loss = %0" = %0
output " = " = %0
`,
		check: func(t *testing.T, m *ir.Module) {
			require.Len(t, m.Outputs, 2)
			assert.Equal(t, "loss = %0", m.Outputs[0].Name)
			assert.Equal(t, " = ", m.Outputs[1].Name)
		},
	},
	{
		name: "placements on a mesh",
		text: `gir 1
module "placed"
mesh dp=2,tp=2,pp=1
%0 = param : f32[4,8] {name="w" place=[R,S(1),P]}
%1 = input : f32[4,8] {name="x" place=[P,S(1),R]}
%2 = add %0, %1 : f32[4,8] {place=[R,S(1),S(0)] layer=0}
%3 = input : f32[4,8] {name="z" place=[S(0),R,R]}
output "y" = %2
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "tp", Size: 2}, {Name: "pp", Size: 1}}, m.Mesh.Axes)
			assert.Equal(t, []ir.Placement{{Kind: ir.Replicate}, {Kind: ir.Shard, Dim: 1}, {Kind: ir.Partial}}, m.Values[0].Place)
			assert.Nil(t, m.Values[2].Attrs, "place and meta are not attributes")
		},
	},
	{
		name: "empty placement list",
		text: `gir 1
module "unplaced"
%0 = input : f32[2] {name="x" place=[]}
%1 = neg %0 : f32[2]
`,
		invalid: true, // a placement without a mesh
		check: func(t *testing.T, m *ir.Module) {
			assert.NotNil(t, m.Values[0].Place)
			assert.Empty(t, m.Values[0].Place)
			assert.Nil(t, m.Values[1].Place)
		},
	},
	{
		name: "meta in any order",
		text: `gir 1
module "meta"
%0 = input : f32[2] {phase=recompute chunk=3 name="x" stage=2 layer=1}
%1 = neg %0 : f32[2] {layer=0 stage=0 chunk=0 phase=fwd}
%2 = neg %1 : f32[2] {phase=bwd}
%3 = neg %2 : f32[2] {phase=opt layer=11}
`,
		canonical: `gir 1
module "meta"
%0 = input : f32[2] {name="x" layer=1 stage=2 chunk=3 phase=recompute}
%1 = neg %0 : f32[2] {layer=0 stage=0 chunk=0 phase=fwd}
%2 = neg %1 : f32[2] {phase=bwd}
%3 = neg %2 : f32[2] {layer=11 phase=opt}
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, ir.Meta{Layer: 1, Stage: 2, Chunk: 3, Micro: -1, Phase: ir.PhaseRecompute}, m.Values[0].Meta)
			assert.Equal(t, ir.Meta{Layer: 0, Stage: 0, Chunk: 0, Micro: -1, Phase: ir.PhaseFwd}, m.Values[1].Meta)
			assert.Equal(t, ir.Meta{Layer: -1, Stage: -1, Chunk: -1, Micro: -1, Phase: ir.PhaseBwd}, m.Values[2].Meta)
		},
	},
	{
		name: "model tags: selective recompute and a precision policy",
		text: `gir 1
module "tags"
%0 = input : f32[2] {name="x"}
%1 = neg %0 : f32[2] {precision=f32 selective=true phase=fwd}
%2 = neg %1 : f32[2] {selective=true}
`,
		canonical: `gir 1
module "tags"
%0 = input : f32[2] {name="x"}
%1 = neg %0 : f32[2] {phase=fwd selective=true precision=f32}
%2 = neg %1 : f32[2] {selective=true}
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, ir.Meta{Layer: -1, Stage: -1, Chunk: -1, Micro: -1, Phase: ir.PhaseFwd, Selective: true, Precision: ir.F32}, m.Values[1].Meta)
			assert.True(t, m.Values[2].Meta.Selective)
		},
	},
	{
		name: "positions whose paths contain colons",
		text: `gir 1
module "positions"
%0 = input : f32[2] {name="x"} @C:\work\gpt\model.go:12
%1 = neg %0 : f32[2] @/tmp/a:b/model.go:41
%2 = neg %1 : f32[2] @model.go:0
%3 = neg %2 : f32[2] @a b {c}.go:7
%4 = neg %3 : f32[2] {phase=fwd} @x:y:z:99
%5 = neg %4 : f32[2]
`,
		check: func(t *testing.T, m *ir.Module) {
			want := []ir.Pos{
				{File: `C:\work\gpt\model.go`, Line: 12},
				{File: "/tmp/a:b/model.go", Line: 41},
				{File: "model.go", Line: 0},
				{File: "a b {c}.go", Line: 7},
				{File: "x:y:z", Line: 99},
				{},
			}
			for i, v := range m.Values {
				assert.Equal(t, want[i], v.Pos, "%%%d", v.ID)
			}
			assert.Equal(t, "%1 neg @/tmp/a:b/model.go:41 (edge.gir:4)", m.Values[1].Where())
		},
	},
	{
		name: "comments and blank lines",
		text: "# a leading comment\n\ngir 1\n# between\nmodule \"comments\"\n\n" +
			"passes verify-input,autodiff\n%0 = input : f32[2] {name=\"x\"}   \n\t\n# trailing blanks above\n" +
			"%1 = neg %0 : f32[2]\t\noutput \"y\" = %1\n\n# the end\n",
		canonical: `gir 1
module "comments"
passes verify-input,autodiff
%0 = input : f32[2] {name="x"}
%1 = neg %0 : f32[2]
output "y" = %1
`,
	},
	{
		name:      "CRLF line ends",
		text:      "gir 1\r\nmodule \"crlf\"\r\n%0 = input : f32[2] {name=\"x\"}\r\n%1 = neg %0 : f32[2] @model.go:3\r\n",
		canonical: "gir 1\nmodule \"crlf\"\n%0 = input : f32[2] {name=\"x\"}\n%1 = neg %0 : f32[2] @model.go:3\n",
	},
	{
		name: "headers in any order, no values",
		text: `gir 1
mesh tp=4
passes verify-input
module "headers"
`,
		canonical: `gir 1
module "headers"
passes verify-input
mesh tp=4
`,
	},
	{
		name: "the largest id",
		text: `gir 1
module "big"
%9223372036854775806 = input : f32[2] {name="x"}
%0 = neg %9223372036854775806 : f32[2]
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, math.MaxInt, m.NextID())
		},
	},
	{
		name: "sparse ids, outputs and updates",
		text: `gir 1
module "state"
%10 = param : f32[2] {name="w"}
%3 = state : f32[2] {init="zeros" name="m"}
%7 = input : f32[] {name="lr"}
%0 = scale %10, %7 : f32[2]
%5 = sub %10, %0 : f32[2]
%42 = add %3, %10 : f32[2]
output "loss" = %7
output "grad" = %0
update %10 = %5
update %3 = %42
`,
		check: func(t *testing.T, m *ir.Module) {
			assert.Equal(t, 43, m.NextID())
			require.Len(t, m.Updates, 2)
			assert.Same(t, m.Values[0], m.Updates[0].State)
			assert.Same(t, m.Values[5], m.Updates[1].Value)
			assert.Same(t, m.Values[3], m.Output("grad"))
		},
	},
}

func TestRoundTripEdgeCases(t *testing.T) {
	for _, tt := range edgeCases {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ir.Parse("edge.gir", tt.text)
			require.NoError(t, err)
			printed := ir.Print(m)
			if tt.canonical != "" {
				assert.Equal(t, tt.canonical, printed)
			}
			p := reparse(t, "edge.gir", printed)
			if diff := cmp.Diff(summarize(m), summarize(p)); diff != "" {
				t.Errorf("parse(print(m)) differs from m (-m +parse(print(m))):\n%s", diff)
			}
			for _, mod := range []*ir.Module{m, p} {
				if tt.invalid {
					assert.Error(t, ir.Verify(mod, ""))
				} else {
					assert.NoError(t, ir.Verify(mod, ""))
				}
				if tt.check != nil {
					tt.check(t, mod)
				}
			}
		})
	}
}

// TestRoundTripInMemory prints modules built through the API, with names and
// positions the frontend could produce but no hand-written file would.
func TestRoundTripInMemory(t *testing.T) {
	tricky := []string{
		"plain",
		`quote " and backslash \`,
		"} @model.go:1",
		" = %0",
		"{name=\"x\"}",
		"line\nbreak\r\n",
		"\x00\xff\u2028",
		"",
	}
	for i, s := range tricky {
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			m := ir.NewModule(s)
			// A position is not quoted: it may hold anything but a line break.
			file := "dir:" + strings.NewReplacer("\n", "", "\r", "").Replace(s) + ".go"
			x, err := m.AddSource("input", ir.T(ir.F32, 2, 3), ir.Attrs{"name": s}, ir.NoMeta, ir.Pos{File: file, Line: 7})
			require.NoError(t, err)
			y, err := m.Add("reduce_sum", []*ir.Value{x}, ir.Attrs{"axes": []int{}, "keepdims": true}, ir.Meta{Layer: 2, Stage: -1, Chunk: 1, Micro: 4, Phase: ir.PhaseBwd}, ir.Pos{File: "a}b @c:d", Line: 9})
			require.NoError(t, err)
			w, err := m.AddSource("param", ir.T(ir.F32, 2, 3), ir.Attrs{"name": "w" + s, "init": s, "parallel": s}, ir.NoMeta, ir.Pos{})
			require.NoError(t, err)
			m.SetOutput(s, y)
			m.SetOutput(s+"2", x)
			m.Updates = append(m.Updates, ir.Update{State: w, Value: y})
			require.NoError(t, ir.Verify(m, ""))

			text := ir.Print(m)
			p := reparse(t, "mem.gir", text)
			if diff := cmp.Diff(summarize(m), summarize(p)); diff != "" {
				t.Fatalf("parse(print(m)) differs from m (-m +parsed):\n%s", diff)
			}
			require.NoError(t, ir.Verify(p, ""))
			assert.Equal(t, s, p.Name)
			assert.Equal(t, s, p.Values[0].Name())
			assert.Same(t, p.Values[1], p.Output(s))
		})
	}
}

func TestBlockedPlacementRoundTrip(t *testing.T) {
	text := "gir 1\nmodule \"b\"\nmesh dp=2,tp=2\n%0 = param : f32[8,12] {name=\"w\" place=[R,S(1)x3]}\n"
	m, err := ir.Parse("b.gir", text)
	require.NoError(t, err)
	assert.Equal(t, ir.Placement{Kind: ir.Shard, Dim: 1, Blocks: 3}, m.Values[0].Place[1])
	assert.Equal(t, text, ir.Print(m))
	require.NoError(t, ir.Verify(m, ""))
	m.Values[0].Type = ir.T(ir.F32, 8, 9) // 9 is not 3 blocks × 2 devices
	assert.ErrorContains(t, ir.Verify(m, ""), "S(1)x3 on axis tp: dim size 9 is not divisible by 6")
	_, err = ir.Parse("b.gir", "gir 1\nmodule \"b\"\nmesh tp=2\n%0 = param : f32[8] {name=\"w\" place=[S(0)x1]}\n")
	assert.ErrorContains(t, err, "want S(d)xK with K ≥ 2")
}

// String attributes print as strconv.Quote writes them, whether the
// printer writes a plain one as it is (a constant's megabytes of data)
// or quotes it, and the line parses back to the same string.
func TestStringAttrsPrintQuoted(t *testing.T) {
	for _, s := range []string{"plain", "", "1.5 -2e-07 3", `a "quote"`, `back\slash`, "tab\there", "é", "\x7f", strings.Repeat("0.125 ", 1000)} {
		v := &ir.Value{ID: 7, Op: "const", Type: ir.T(ir.F32, 1), Attrs: ir.Attrs{"data": s, "name": "c"}}
		line := ir.FormatValue(v)
		if !strings.Contains(line, " {data="+strconv.Quote(s)+" name=\"c\" ") {
			t.Errorf("%.60q prints as %.200s", s, line)
		}
	}
}
