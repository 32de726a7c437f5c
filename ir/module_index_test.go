package ir_test

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

// Uses lists each reader once, in program order, a value read twice by
// one op (mul x x) included; SetOutputs is SetOutput in turn; PrintHash
// and Fprint agree with Print.
func TestUsesOutputsAndPrintHash(t *testing.T) {
	m := ir.NewModule("u")
	ty := ir.Type{DType: ir.F32, Shape: ir.Shape{4, 8}}
	x, err := m.AddSource("input", ty, ir.Attrs{"name": "x"}, ir.NoMeta, ir.Pos{})
	require.NoError(t, err)
	sq, err := m.Add("mul", []*ir.Value{x, x}, nil, ir.NoMeta, ir.Pos{File: "m.go", Line: 2})
	require.NoError(t, err)
	var readers []*ir.Value
	for range 1000 { // one value of many readers, as the learning rate
		r, err := m.Add("add", []*ir.Value{sq, x}, nil, ir.NoMeta, ir.Pos{File: "m.go", Line: 3})
		require.NoError(t, err)
		readers = append(readers, r)
	}
	uses := m.Uses()
	assert.Equal(t, append([]*ir.Value{sq}, readers...), uses[x])
	assert.Equal(t, readers, uses[sq])

	m.SetOutput("loss", sq)
	m.SetOutput("dup", x)
	m.Outputs = append(m.Outputs, ir.Output{Name: "dup", Value: sq}) // a second of a name
	want := ir.NewModule("u")
	want.Outputs = append([]ir.Output(nil), m.Outputs...)
	outs := []ir.Output{{Name: "a", Value: readers[0]}, {Name: "loss", Value: readers[1]}, {Name: "dup", Value: readers[2]}, {Name: "a", Value: readers[3]}}
	for _, o := range outs {
		want.SetOutput(o.Name, o.Value)
	}
	m.SetOutputs(outs)
	assert.Equal(t, want.Outputs, m.Outputs)
	byName := m.OutputsByName()
	for _, name := range []string{"a", "loss", "dup", "none"} {
		assert.Equal(t, m.Output(name), byName[name], name)
	}

	text := ir.Print(m)
	assert.Equal(t, sha256.Sum256([]byte(text)), ir.PrintHash(m))
	var buf bytes.Buffer
	require.NoError(t, ir.Fprint(&buf, m))
	assert.Equal(t, text, buf.String())
}
