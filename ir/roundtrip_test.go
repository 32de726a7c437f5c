package ir_test

import (
	"fmt"
	"maps"
	"math"
	"slices"
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
