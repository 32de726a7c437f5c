package passes_test

import (
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/passes"
)

// fusedBodies lists "phase layer body" for every fused value, in order.
func fusedBodies(m *ir.Module) []string {
	var out []string
	for _, v := range m.Values {
		if v.Op == ir.FusedOp {
			out = append(out, v.Meta.Phase.String()+" "+strconv.Itoa(v.Meta.Layer)+" "+v.Attrs.Str("body"))
		}
	}
	return out
}

// On the GPT, fusion finds the residual adds (bias add, then residual)
// in the forward (and their replays). Each GELU input is kept for
// gelu_grad, so the bias add before it cannot fuse, except under full
// recompute where the backward reads the replayed copy; the sum of the
// q, k, v gradients has a slice_grad between its adds, so it stays. Every
// fused value removes its inner values from the program and nothing else.
func TestFuseGPTGroups(t *testing.T) {
	const residual, biasGelu = "t0=add a0 a1; t1=add a2 t0", "t0=add a0 a1; t1=gelu t0"
	tests := []struct {
		name string
		opts func(o *passes.Options)
		want []string
	}{
		{"fp32", func(o *passes.Options) {}, []string{
			"fwd 0 " + residual, "fwd 0 " + residual, "fwd 1 " + residual, "fwd 1 " + residual}},
		{"full_recompute", func(o *passes.Options) { o.Recompute = "full" }, []string{
			"fwd 0 " + residual, "fwd 0 " + biasGelu, "fwd 0 " + residual,
			"fwd 1 " + residual, "fwd 1 " + biasGelu, "fwd 1 " + residual,
			"recompute 1 " + residual, "recompute 1 " + residual,
			"recompute 0 " + residual, "recompute 0 " + residual}},
		// bf16 values stay out: the CPU backend rounds after every op.
		{"bf16", func(o *passes.Options) { o.Precision = "bf16" }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plain := reluGPT(t, map[string]string{"activation": "gelu"})
			require.NoError(t, runTo(t, plain, "", tc.opts))
			fused := reluGPT(t, map[string]string{"activation": "gelu"})
			require.NoError(t, runTo(t, fused, "", func(o *passes.Options) { tc.opts(o); o.Fuse = true }))
			assert.Equal(t, tc.want, fusedBodies(fused))
			assert.Empty(t, fusedBodies(plain), "fusion is off unless asked for")

			removed := 0
			for _, v := range fused.Values {
				if v.Op == ir.FusedOp {
					body, err := ir.ParseFusedBody(v.Attrs.Str("body"), len(v.Args))
					require.NoError(t, err)
					removed += len(body) - 1
					for _, a := range v.Args {
						assert.Equal(t, ir.F32, a.Type.DType)
					}
				}
			}
			assert.Equal(t, len(plain.Values)-removed, len(fused.Values), "only the inner values disappear")
			assert.Equal(t, len(plain.Outputs), len(fused.Outputs))
			assert.Equal(t, len(plain.Updates), len(fused.Updates))
		})
	}
}

// tiny builds a module that has already been through every pass before
// fuse, so passes.Run runs only fuse (and the optional passes after it).
type tiny struct {
	t *testing.T
	m *ir.Module
}

func newTiny(t *testing.T) *tiny {
	m := ir.NewModule("tiny")
	for _, p := range passes.Table() {
		if p.Name == "fuse" {
			break
		}
		m.MarkPass(p.Name)
	}
	return &tiny{t: t, m: m}
}

var meta = ir.Meta{Layer: 0, Phase: ir.PhaseFwd, Stage: -1, Chunk: -1, Micro: -1}

func (b *tiny) input(name string, dt ir.DType) *ir.Value {
	v, err := b.m.AddSource("input", ir.Type{DType: dt, Shape: ir.Shape{4, 8}}, ir.Attrs{"name": name}, meta, ir.Pos{File: "tiny.go", Line: 1})
	require.NoError(b.t, err)
	return v
}

func (b *tiny) op(op string, mt ir.Meta, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
	v, err := b.m.Add(op, args, attrs, mt, ir.Pos{File: "tiny.go", Line: len(b.m.Values) + 1})
	require.NoError(b.t, err)
	return v
}

func (b *tiny) fuse() []string {
	opts := passes.DefaultOptions()
	opts.Fuse, opts.Verify = true, true
	_, err := passes.Run(b.m, opts, passes.Hooks{})
	require.NoError(b.t, err)
	var got []string
	for _, v := range b.m.Values {
		got = append(got, v.Op)
	}
	return got
}

// What fusion leaves out, one reason per case: the fused op list is what
// remains of the program after the pass.
func TestFuseExclusions(t *testing.T) {
	layer1 := meta
	layer1.Layer = 1
	tests := []struct {
		name  string
		build func(b *tiny)
		ops   []string
		body  string // of the one fused op, if any
	}{
		{"chain fuses", func(b *tiny) {
			x, y := b.input("x", ir.F32), b.input("y", ir.F32)
			s := b.op("add", meta, nil, x, y)
			b.m.SetOutput("loss", b.op("mul", meta, nil, b.op("tanh", meta, nil, s), x))
		}, []string{"input", "input", "fused"}, "t0=add a0 a1; t1=tanh t0; t2=mul t1 a0"},
		{"value read twice stays", func(b *tiny) {
			x := b.input("x", ir.F32)
			e := b.op("exp", meta, nil, x)
			b.m.SetOutput("loss", b.op("add", meta, nil, b.op("tanh", meta, nil, e), b.op("neg", meta, nil, e)))
		}, []string{"input", "exp", "fused"}, "t0=tanh a0; t1=neg a0; t2=add t0 t1"},
		{"same value in two operand slots of one user fuses", func(b *tiny) {
			x := b.input("x", ir.F32)
			e := b.op("exp", meta, nil, x)
			b.m.SetOutput("loss", b.op("mul", meta, nil, e, e))
		}, []string{"input", "fused"}, "t0=exp a0; t1=mul t0 t0"},
		{"a value computed between members splits the group", func(b *tiny) {
			// (x+y) then softmax(z), then the sum: the fused op would keep x
			// and y alive over the softmax, so only the tail fuses.
			x, y, z := b.input("x", ir.F32), b.input("y", ir.F32), b.input("z", ir.F32)
			s := b.op("add", meta, nil, x, y)
			e := b.op("softmax", meta, nil, z)
			b.m.SetOutput("loss", b.op("tanh", meta, nil, b.op("add", meta, nil, s, e)))
		}, []string{"input", "input", "input", "add", "softmax", "fused"}, "t0=add a0 a1; t1=tanh t0"},
		{"outputs stay", func(b *tiny) {
			x := b.input("x", ir.F32)
			e := b.op("exp", meta, nil, x)
			b.m.SetOutput("mid", e)
			b.m.SetOutput("loss", b.op("neg", meta, nil, e))
		}, []string{"input", "exp", "neg"}, ""},
		{"another layer stays", func(b *tiny) {
			x := b.input("x", ir.F32)
			b.m.SetOutput("loss", b.op("neg", layer1, nil, b.op("exp", meta, nil, x)))
		}, []string{"input", "exp", "neg"}, ""},
		{"f64 stays", func(b *tiny) {
			x := b.input("x", ir.F64)
			b.m.SetOutput("loss", b.op("neg", meta, nil, b.op("exp", meta, nil, x)))
		}, []string{"input", "exp", "neg"}, ""},
		{"non-elementwise breaks the group", func(b *tiny) {
			x := b.input("x", ir.F32)
			sm := b.op("softmax", meta, nil, b.op("exp", meta, nil, x))
			b.m.SetOutput("loss", b.op("neg", meta, nil, sm))
		}, []string{"input", "exp", "softmax", "neg"}, ""},
		{"update root stays, its inputs fuse", func(b *tiny) {
			g := b.input("g", ir.F32)
			st, err := b.m.AddSource("state", ir.Type{DType: ir.F32, Shape: ir.Shape{4, 8}}, ir.Attrs{"name": "m"}, meta, ir.Pos{})
			require.NoError(t, err)
			opt := meta
			opt.Phase = ir.PhaseOpt
			gg := b.op("neg", opt, nil, b.op("exp", opt, nil, g))
			nm := b.op("adam_m", opt, ir.Attrs{"beta1": 0.9}, st, gg)
			b.m.Updates = append(b.m.Updates, ir.Update{State: st, Value: nm})
			b.m.SetOutput("loss", g)
		}, []string{"input", "state", "fused", "adam_m"}, "t0=exp a0; t1=neg t0"},
		{"optimizer attrs travel in the body", func(b *tiny) {
			m0, g := b.input("m", ir.F32), b.input("g", ir.F32)
			b.m.SetOutput("loss", b.op("sqrt", meta, nil, b.op("adam_v", meta, ir.Attrs{"beta2": 0.95}, m0, g)))
		}, []string{"input", "input", "fused"}, "t0=adam_v a0 a1 beta2=0.95; t1=sqrt t0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newTiny(t)
			tc.build(b)
			assert.Equal(t, tc.ops, b.fuse())
			var bodies []string
			for _, v := range b.m.Values {
				if v.Op == ir.FusedOp {
					bodies = append(bodies, v.Attrs.Str("body"))
					assert.Equal(t, "tiny.go", v.Pos.File, "the fused value keeps the root's position")
				}
			}
			if tc.body == "" {
				assert.Empty(t, bodies)
			} else {
				assert.Equal(t, []string{tc.body}, bodies)
			}
		})
	}
}

// A module dumped after fuse reads back to the same text, passes the
// verifier, and resuming it runs no pass that changes it.
func TestFuseDumpRoundTrip(t *testing.T) {
	m := reluGPT(t, map[string]string{"activation": "gelu"})
	require.NoError(t, runTo(t, m, "", func(o *passes.Options) { o.Fuse, o.Recompute = true, "full" }))
	require.NotEmpty(t, fusedBodies(m))
	text := ir.Print(m)
	back, err := ir.Parse("fused.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(back, ""))
	assert.Equal(t, text, ir.Print(back))
	assert.True(t, slices.Contains(back.Passes, "fuse"))

	opts := passes.DefaultOptions()
	opts.Fuse, opts.Verify = true, true
	res, err := passes.Run(back, opts, passes.Hooks{})
	require.NoError(t, err)
	for _, r := range res {
		assert.False(t, r.Changed, r.Name)
	}
	assert.Equal(t, text, ir.Print(back))
}
