package lower_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

// flatCase is a data-parallel (not pipelined) compile of a small GPT.
type flatCase struct {
	layers, hidden, dp, zero int
	optimizer                string
	offload                  string
}

func compileFlat(t *testing.T, c flatCase) *lower.Program {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 2 * max(c.dp, 1), Set: map[string]string{
		"layers": fmt.Sprint(c.layers), "hidden": fmt.Sprint(c.hidden), "heads": "4", "seq": "8"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	if c.dp > 1 {
		opts.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: c.dp}}}
	}
	opts.Zero = c.zero
	if c.optimizer != "" {
		opts.Optimizer = c.optimizer
	}
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	p, err := lower.LowerWith(m, lower.Options{Offload: c.offload})
	require.NoError(t, err)
	return p
}

var (
	baseFlat = flatCase{layers: 2, hidden: 32, dp: 2, zero: 1}
	basePipe = pipeCase{schedule: "1f1b", pp: 4, micro: 4, layers: 4}
)

// Compiling the same thing twice, in one process, gives the same
// fingerprint, however often it is taken (map iteration order changes
// from call to call).
func TestFingerprintIsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		name    string
		compile func(t *testing.T) []*lower.Program
	}{
		{"data parallel", func(t *testing.T) []*lower.Program { return []*lower.Program{compileFlat(t, baseFlat)} }},
		{"pipeline", func(t *testing.T) []*lower.Program { return compilePipe(t, basePipe) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.compile(t), tc.compile(t)
			want := lower.Fingerprint(a...)
			assert.Len(t, want, 64, "hex SHA-256")
			assert.Equal(t, want, lower.Fingerprint(b...))
			for range 20 {
				require.Equal(t, want, lower.Fingerprint(a...))
			}
		})
	}
}

// Flags that change the compiled plan change the fingerprint.
func TestFingerprintChangesWithThePlan(t *testing.T) {
	base := lower.Fingerprint(compileFlat(t, baseFlat))
	seen := map[string]string{base: "base"}
	for _, tc := range []struct {
		name string
		c    flatCase
	}{
		{"more layers", flatCase{layers: 3, hidden: 32, dp: 2, zero: 1}},
		{"wider", flatCase{layers: 2, hidden: 64, dp: 2, zero: 1}},
		{"ZeRO stage 0", flatCase{layers: 2, hidden: 32, dp: 2, zero: 0}},
		{"ZeRO stage 3", flatCase{layers: 2, hidden: 32, dp: 2, zero: 3}},
		{"more data parallel ranks", flatCase{layers: 2, hidden: 32, dp: 4, zero: 1}},
		{"another optimizer", flatCase{layers: 2, hidden: 32, dp: 2, zero: 1, optimizer: "sgd"}},
		{"offloaded optimizer state", flatCase{layers: 2, hidden: 32, dp: 2, zero: 1, offload: "optimizer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := lower.Fingerprint(compileFlat(t, tc.c))
			assert.NotContains(t, seen, got, "%s has the fingerprint of %s", tc.name, seen[got])
			seen[got] = tc.name
		})
	}
	t.Run("pipeline schedule", func(t *testing.T) {
		pipe := basePipe
		a := lower.Fingerprint(compilePipe(t, pipe)...)
		pipe.schedule = "gpipe"
		b := lower.Fingerprint(compilePipe(t, pipe)...)
		assert.NotEqual(t, a, b)
	})
}

// deepClone copies a program so that every field can be changed without
// touching the original.
func deepClone(p *lower.Program) *lower.Program {
	c := *p
	if p.Mesh != nil {
		c.Mesh = &ir.Mesh{Axes: slices.Clone(p.Mesh.Axes)}
	}
	c.Buffers = slices.Clone(p.Buffers)
	for i := range c.Buffers {
		b := &c.Buffers[i]
		b.Type.Shape, b.Global.Shape = b.Type.Shape.Clone(), b.Global.Shape.Clone()
		b.Place = slices.Clone(b.Place)
	}
	c.Instrs = slices.Clone(p.Instrs)
	for i := range c.Instrs {
		in := &c.Instrs[i]
		in.Attrs = in.Attrs.Clone()
		in.Args, in.Frees = slices.Clone(in.Args), slices.Clone(in.Frees)
		in.ArgTypes = slices.Clone(in.ArgTypes)
		for j := range in.ArgTypes {
			in.ArgTypes[j].Shape = in.ArgTypes[j].Shape.Clone()
		}
		in.OutType.Shape = in.OutType.Shape.Clone()
	}
	c.Outputs, c.Sources = maps.Clone(p.Outputs), maps.Clone(p.Sources)
	return &c
}

// firstInstr is the index of the first instruction satisfying ok.
func firstInstr(t *testing.T, p *lower.Program, ok func(lower.Instr) bool) int {
	t.Helper()
	i := slices.IndexFunc(p.Instrs, ok)
	require.GreaterOrEqual(t, i, 0, "no such instruction in %s", p.Name)
	return i
}

// Every field the fingerprint covers changes it when changed alone.
func TestFingerprintCoversEveryField(t *testing.T) {
	progs := compilePipe(t, basePipe)
	base := lower.Fingerprint(progs...)
	last := len(progs) - 1 // holds the loss output, sends and receives
	p := progs[last]
	require.NotEmpty(t, p.Outputs)
	send := firstInstr(t, p, func(in lower.Instr) bool { return in.Op == "send" })
	withAttrs := firstInstr(t, p, func(in lower.Instr) bool { return len(in.Attrs) > 0 })
	withFrees := firstInstr(t, p, func(in lower.Instr) bool { return len(in.Frees) > 0 })
	placed := slices.IndexFunc(p.Buffers, func(b lower.Buffer) bool { return len(b.Place) > 0 })
	require.GreaterOrEqual(t, placed, 0)
	anyKey := func(m map[string]int) string { return slices.Sorted(maps.Keys(m))[0] }
	for _, tc := range []struct {
		name   string
		change func(p *lower.Program)
	}{
		{"name", func(p *lower.Program) { p.Name += "x" }},
		{"mesh axis size", func(p *lower.Program) { p.Mesh.Axes[0].Size++ }},
		{"mesh axis name", func(p *lower.Program) { p.Mesh.Axes[0].Name = "dp" }},
		{"no mesh", func(p *lower.Program) { p.Mesh = nil }},
		{"arena bytes", func(p *lower.Program) { p.ArenaBytes++ }},
		{"host bytes", func(p *lower.Program) { p.HostBytes++ }},
		{"peak bytes", func(p *lower.Program) { p.PeakBytes++ }},
		{"forward end", func(p *lower.Program) { p.ForwardEnd++ }},
		{"buffer id", func(p *lower.Program) { p.Buffers[3].ID++ }},
		{"buffer kind", func(p *lower.Program) { p.Buffers[3].Kind = lower.Const }},
		{"buffer name", func(p *lower.Program) { p.Buffers[3].Name += "x" }},
		{"buffer local type", func(p *lower.Program) { p.Buffers[3].Type.Shape[0]++ }},
		{"buffer dtype", func(p *lower.Program) { p.Buffers[3].Type.DType = ir.F64 }},
		{"buffer global type", func(p *lower.Program) { p.Buffers[3].Global.Shape[0]++ }},
		{"buffer placement", func(p *lower.Program) { p.Buffers[placed].Place[0] = ir.Placement{Kind: ir.Shard, Dim: 0} }},
		{"buffer offset", func(p *lower.Program) { p.Buffers[3].Offset += 8 }},
		{"buffer bytes", func(p *lower.Program) { p.Buffers[3].Bytes++ }},
		{"buffer on host", func(p *lower.Program) { p.Buffers[3].Host = !p.Buffers[3].Host }},
		{"dropped buffer", func(p *lower.Program) { p.Buffers = p.Buffers[:len(p.Buffers)-1] }},
		{"op", func(p *lower.Program) { p.Instrs[5].Op += "x" }},
		{"attr value", func(p *lower.Program) {
			k := slices.Sorted(maps.Keys(p.Instrs[withAttrs].Attrs))[0]
			p.Instrs[withAttrs].Attrs[k] = "changed"
		}},
		{"extra attr", func(p *lower.Program) {
			if p.Instrs[5].Attrs == nil {
				p.Instrs[5].Attrs = ir.Attrs{}
			}
			p.Instrs[5].Attrs["zz"] = 1
		}},
		{"args", func(p *lower.Program) { p.Instrs[send].Args[0]++ }},
		{"out", func(p *lower.Program) { p.Instrs[5].Out++ }},
		{"arg types", func(p *lower.Program) { p.Instrs[send].ArgTypes[0].Shape[0]++ }},
		{"out type", func(p *lower.Program) { p.Instrs[5].OutType.DType = ir.F64 }},
		{"scale", func(p *lower.Program) { p.Instrs[5].Scale += 0.5 }},
		{"bucket", func(p *lower.Program) { p.Instrs[5].Bucket++ }},
		{"peer", func(p *lower.Program) { p.Instrs[send].Peer++ }},
		{"tag", func(p *lower.Program) { p.Instrs[send].Tag++ }},
		{"block", func(p *lower.Program) { p.Instrs[5].Block += "x" }},
		{"frees", func(p *lower.Program) { p.Instrs[withFrees].Frees = p.Instrs[withFrees].Frees[1:] }},
		{"scratch", func(p *lower.Program) { p.Instrs[5].Scratch = append(p.Instrs[5].Scratch, 0) }},
		{"swapped instructions", func(p *lower.Program) { p.Instrs[4], p.Instrs[5] = p.Instrs[5], p.Instrs[4] }},
		{"output buffer", func(p *lower.Program) { p.Outputs[anyKey(p.Outputs)]++ }},
		{"output name", func(p *lower.Program) { k := anyKey(p.Outputs); p.Outputs[k+"x"] = p.Outputs[k]; delete(p.Outputs, k) }},
		{"source buffer", func(p *lower.Program) { p.Sources[anyKey(p.Sources)]++ }},
		{"source name", func(p *lower.Program) { k := anyKey(p.Sources); p.Sources[k+"x"] = p.Sources[k]; delete(p.Sources, k) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := slices.Clone(progs)
			changed[last] = deepClone(p)
			require.Equal(t, base, lower.Fingerprint(changed...), "a clone fingerprints like the original")
			tc.change(changed[last])
			assert.NotEqual(t, base, lower.Fingerprint(changed...))
		})
	}
	t.Run("program order", func(t *testing.T) {
		swapped := slices.Clone(progs)
		swapped[0], swapped[1] = swapped[1], swapped[0]
		assert.NotEqual(t, base, lower.Fingerprint(swapped...))
	})
	t.Run("fewer programs", func(t *testing.T) {
		assert.NotEqual(t, base, lower.Fingerprint(progs[:3]...))
	})
}

// The fingerprint reads maps in key order and never a pointer: programs
// whose maps were built in another insertion order, whose values point
// elsewhere, or whose 0/1 placement blocks spell one block differently
// fingerprint alike.
func TestFingerprintIgnoresMapOrderAndPointers(t *testing.T) {
	progs := compilePipe(t, basePipe)
	want := lower.Fingerprint(progs...)
	rebuilt := make([]*lower.Program, len(progs))
	for r, p := range progs {
		c := deepClone(p)
		c.Sources, c.Outputs = reinsert(p.Sources), reinsert(p.Outputs)
		for i := range c.Instrs {
			in := &c.Instrs[i]
			if in.Attrs != nil {
				attrs := ir.Attrs{}
				keys := slices.Sorted(maps.Keys(in.Attrs))
				slices.Reverse(keys)
				for _, k := range keys {
					attrs[k] = in.Attrs[k]
				}
				in.Attrs = attrs
			}
			in.Value = nil
		}
		for i := range c.Buffers {
			b := &c.Buffers[i]
			b.Value = nil
			for j, pl := range b.Place {
				if pl.Blocks == 0 {
					b.Place[j].Blocks = 1
				}
			}
		}
		c.Mesh = &ir.Mesh{Axes: slices.Clone(p.Mesh.Axes)}
		rebuilt[r] = c
	}
	assert.Equal(t, want, lower.Fingerprint(rebuilt...))
}

// reinsert rebuilds m inserting keys in reverse name order, with extra
// keys added and deleted on the way so the map's internal layout differs.
func reinsert(m map[string]int) map[string]int {
	keys := slices.Sorted(maps.Keys(m))
	slices.Reverse(keys)
	out := map[string]int{}
	for i, k := range keys {
		out[fmt.Sprintf("tmp%d", i)] = i
		out[k] = m[k]
	}
	for i := range keys {
		delete(out, fmt.Sprintf("tmp%d", i))
	}
	return out
}

// tinyProgram is a fixed hand-made program that exercises every kind of
// field.
func tinyProgram() *lower.Program {
	mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: 2}, {Name: "tp", Size: 2}}}
	return &lower.Program{
		Name: "tiny.pp0",
		Mesh: mesh,
		Buffers: []lower.Buffer{
			{ID: 0, Kind: lower.Param, Name: "w", Type: ir.T(ir.F32, 4, 2), Global: ir.T(ir.F32, 4, 4),
				Place: []ir.Placement{{Kind: ir.Replicate}, {Kind: ir.Shard, Dim: 1}}, Offset: 0, Bytes: 32},
			{ID: 1, Kind: lower.Input, Name: "x", Type: ir.T(ir.F32, 2, 4), Global: ir.T(ir.F32, 2, 4), Offset: 64, Bytes: 32},
			{ID: 2, Kind: lower.Temp, Type: ir.T(ir.F32, 2, 2), Global: ir.T(ir.F32, 2, 4), Offset: 128, Bytes: 16, Host: true},
		},
		Instrs: []lower.Instr{
			{Op: "matmul", Attrs: ir.Attrs{"transB": true, "k": 3, "axes": []int{0, 1}, "eps": 1e-5, "axis": "tp"},
				Args: []int{1, 0}, Out: 2, ArgTypes: []ir.Type{ir.T(ir.F32, 2, 4), ir.T(ir.F32, 4, 2)}, OutType: ir.T(ir.F32, 2, 2),
				Scale: 0.25, Bucket: 1, Block: "F c0 m0", Frees: []int{1}},
			{Op: "send", Args: []int{2}, Out: -1, ArgTypes: []ir.Type{ir.T(ir.F32, 2, 2)}, Peer: 1, Tag: 7, Block: "F c0 m0", Frees: []int{2}},
		},
		ForwardEnd:      1,
		Outputs:         map[string]int{"loss": 2, "aux": 1},
		Sources:         map[string]int{"w": 0, "x": 1},
		ArenaBytes:      192,
		PeakBytes:       80,
		PersistentBytes: 64,
		HostBytes:       16,
	}
}

// The fingerprint of a fixed program is a constant: nothing that differs
// between processes (map seeds, addresses, paths) enters it. The constant
// changes only when the encoding does.
func TestFingerprintGolden(t *testing.T) {
	const want = "090a7c9fa1e102d734aee40416bf3743054ed792d3bf96fc8aa809f12f87fb6f"
	assert.Equal(t, want, lower.Fingerprint(tinyProgram()))
	assert.NotEqual(t, lower.Fingerprint(), lower.Fingerprint(nil), "no program differs from a nil one")
	assert.Equal(t, lower.Fingerprint(tinyProgram(), tinyProgram()), lower.Fingerprint(tinyProgram(), tinyProgram()))
}
