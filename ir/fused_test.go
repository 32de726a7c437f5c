package ir_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

func TestFusedBodyRoundTrip(t *testing.T) {
	for _, c := range []struct {
		text  string
		nargs int
	}{
		{"t0=gelu a0", 1},
		{"t0=mul a1 a0; t1=gelu t0; t2=add t1 a2", 3},
		{"t0=add a0 a0; t1=tanh_grad t0 a1; t2=mul t1 t0", 2},
		{"t0=adam_v a0 a1 beta2=0.95; t1=sqrt t0", 2},
		{"t0=sgd_buf a0 a1 a2 momentum=0.9 wd=1e-05", 3},
	} {
		t.Run(c.text, func(t *testing.T) {
			b, err := ir.ParseFusedBody(c.text, c.nargs)
			require.NoError(t, err)
			assert.Equal(t, c.text, b.String())
			again, err := ir.ParseFusedBody(b.String(), c.nargs)
			require.NoError(t, err)
			assert.Equal(t, b, again)
		})
	}
}

func TestFusedBodyRejects(t *testing.T) {
	for _, c := range []struct {
		body  string
		nargs int
		rule  string
	}{
		{"", 1, "empty"},
		{"t0=gelu a0;", 1, "step 1 is empty"},
		{"t1=gelu a0", 1, "must start with t0="},
		{"t0=nope a0", 1, "unknown op"},
		{"t0=softmax a0", 1, "not an elementwise op"},
		{"t0=fused a0", 1, "not an elementwise op"},
		{"t0=add a0", 1, "takes 2 operands, got 1"},
		{"t0=gelu a1", 1, "the op has 1 args"},
		{"t0=gelu t0", 1, "not defined before it"},
		{"t0=gelu x0", 1, "want aN"},
		{"t0=gelu a01", 1, "want aN"},
		{"t0=gelu a0", 2, "never reads a1"},
		{"t0=gelu a0; t1=exp a0", 1, "never reads it"},
		{"t0=adam_m a0 a1", 2, "needs attribute beta1"},
		{"t0=adam_m a0 a1 beta1=x", 2, "attribute beta1"},
		{"t0=adam_m a0 a1 beta2=0.9", 2, "no float attribute"},
		{"t0=adam_m a0 beta1=0.9 a1", 2, "after the attributes"},
		{"t0=adam_m a0 a1 beta1=0.9 beta1=0.8", 2, "given twice"},
	} {
		_, err := ir.ParseFusedBody(c.body, c.nargs)
		if assert.Error(t, err, c.body) {
			assert.Contains(t, err.Error(), c.rule, c.body)
		}
	}
}

// A fused value survives the .gir text exactly, and the verifier refuses
// a broken body.
func TestFusedGirRoundTrip(t *testing.T) {
	m := ir.NewModule("f")
	ty := ir.Type{DType: ir.F32, Shape: ir.Shape{4, 8}}
	x, err := m.AddSource("input", ty, ir.Attrs{"name": "x"}, ir.NoMeta, ir.Pos{})
	require.NoError(t, err)
	y, err := m.AddSource("input", ty, ir.Attrs{"name": "y"}, ir.NoMeta, ir.Pos{})
	require.NoError(t, err)
	f, err := m.Add("fused", []*ir.Value{x, y}, ir.Attrs{"body": "t0=mul a0 a1; t1=gelu t0; t2=add t1 a0"}, ir.NoMeta, ir.Pos{File: "m.go", Line: 3})
	require.NoError(t, err)
	m.SetOutput("loss", f)
	text := ir.Print(m)
	back, err := ir.Parse("f.gir", text)
	require.NoError(t, err)
	assert.Equal(t, text, ir.Print(back))
	require.NoError(t, ir.Verify(back, ""))

	broken := strings.Replace(text, "t1=gelu t0", "t1=gelu t0 t0", 1)
	require.NotEqual(t, text, broken)
	bad, err := ir.Parse("f.gir", broken)
	require.NoError(t, err, "the parser reads text; the verifier checks types")
	err = ir.Verify(bad, "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "takes 1 operands, got 2")
}

// Any text either is refused or reads back to a body whose text reads
// back to the same body; nothing panics.
func FuzzParseFusedBody(f *testing.F) {
	f.Add("t0=mul a1 a0; t1=gelu t0; t2=add t1 a2", 3)
	f.Add("t0=adam_v a0 a1 beta2=0.95; t1=sqrt t0", 2)
	f.Add("t0=sgd_buf a0 a1 a2 momentum=0.9 wd=1e-05", 3)
	f.Add("t0=add a0  a0 ;t1=neg t0", 1)
	f.Fuzz(func(t *testing.T, text string, nargs int) {
		if nargs < 0 || nargs > 16 {
			return
		}
		b, err := ir.ParseFusedBody(text, nargs)
		if err != nil {
			return
		}
		again, err := ir.ParseFusedBody(b.String(), nargs)
		require.NoError(t, err, "printed %q from %q", b.String(), text)
		assert.Equal(t, b.String(), again.String())
	})
}
