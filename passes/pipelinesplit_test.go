package passes_test

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/passes"
)

// The pipeline tests cut a 4-layer GPT. They stop at autodiff, microbatch
// or the optimizer: what shard does with a pp axis is not theirs to test.
const splitLayers = 4

func buildSplitGPT(t *testing.T) *ir.Module {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{
		Name:  "gpt",
		Batch: 4,
		Set:   map[string]string{"layers": fmt.Sprint(splitLayers), "hidden": "32", "heads": "4", "seq": "16"},
	})
	require.NoError(t, err)
	return m
}

func ppMesh(p int) *ir.Mesh { return &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: p}}} }

// splitOpts are verifying options for pp=p ranks of vpp=v chunks each that
// stop after stopAfter.
func splitOpts(p, v int, stopAfter string) *passes.Options {
	o := passes.DefaultOptions()
	o.Verify = true
	o.Mesh = ppMesh(p)
	o.VPP = v
	o.StopAfter = stopAfter
	return o
}

func runSplit(t *testing.T, o *passes.Options) *ir.Module {
	t.Helper()
	m := buildSplitGPT(t)
	_, err := passes.Run(m, o, passes.Hooks{})
	require.NoError(t, err)
	return m
}

// find returns the values matching keep, failing the test if there are none.
func find(t *testing.T, m *ir.Module, what string, keep func(v *ir.Value) bool) []*ir.Value {
	t.Helper()
	var vs []*ir.Value
	for _, v := range m.Values {
		if keep(v) {
			vs = append(vs, v)
		}
	}
	require.NotEmpty(t, vs, "no %s in the module", what)
	return vs
}

// assertStage checks that every value matching keep (there must be one) is
// on chunk stage.
func assertStage(t *testing.T, m *ir.Module, what string, stage int, keep func(v *ir.Value) bool) {
	t.Helper()
	for _, v := range find(t, m, what, keep) {
		assert.Equal(t, stage, v.Meta.Stage, "%s: %s", what, v.Where())
	}
}

func opAt(op string, layer int, phase ir.Phase) func(v *ir.Value) bool {
	return func(v *ir.Value) bool { return v.Op == op && v.Meta.Layer == layer && v.Meta.Phase == phase }
}

type posKey struct {
	layer int
	pos   ir.Pos
}

// checkChunks checks the rules every value of a module cut into chunks
// follows, in whatever pass it stopped (autodiff or microbatch):
//   - every value is tagged with a chunk in [0, chunks);
//   - a value of layer l (forward, backward or optimizer) is on chunk
//     l / (layers per chunk);
//   - a forward value outside the layers is on the last chunk when it
//     depends on a layer's output (final LayerNorm, LM head, loss), else on
//     the first (embeddings);
//   - a forward source (param, input, const) is on the chunk of its first
//     user;
//   - a backward value is on a chunk of the forward values of its layer and
//     line: the chunk of the forward value it differentiates.
func checkChunks(t *testing.T, m *ir.Module, chunks int) {
	t.Helper()
	per := splitLayers / chunks
	uses := m.Uses()
	afterLayers := map[*ir.Value]bool{}
	fwdStages := map[posKey]map[int]bool{}
	for _, v := range m.Values {
		require.True(t, v.Meta.Stage >= 0 && v.Meta.Stage < chunks, "%s: stage %d not in [0, %d)", v.Where(), v.Meta.Stage, chunks)
		info, ok := ir.Lookup(v.Op)
		require.True(t, ok, v.Op)
		afterLayers[v] = v.Meta.Layer >= 0
		for _, a := range v.Args {
			afterLayers[v] = afterLayers[v] || afterLayers[a]
		}
		switch {
		case v.Meta.Layer >= 0:
			assert.Equal(t, v.Meta.Layer/per, v.Meta.Stage, "%s of layer %d", v.Where(), v.Meta.Layer)
		case v.Meta.Phase == ir.PhaseFwd && !info.Source && afterLayers[v]:
			assert.Equal(t, chunks-1, v.Meta.Stage, "%s comes after the layers", v.Where())
		case v.Meta.Phase == ir.PhaseFwd && !info.Source:
			first := chunks
			for _, u := range uses[v] {
				first = min(first, u.Meta.Stage)
			}
			if len(uses[v]) == 0 {
				first = 0
			}
			assert.Equal(t, first, v.Meta.Stage, "%s depends on no layer: it runs on its first user's chunk", v.Where())
		}
		if v.Meta.Phase == ir.PhaseFwd && info.Source && len(uses[v]) > 0 {
			first := uses[v][0]
			assert.Equal(t, first.Meta.Stage, v.Meta.Stage, "%s is on the chunk of its first user %s", v.Where(), first.Where())
		}
		if v.Meta.Phase == ir.PhaseFwd {
			k := posKey{v.Meta.Layer, v.Pos}
			if fwdStages[k] == nil {
				fwdStages[k] = map[int]bool{}
			}
			fwdStages[k][v.Meta.Stage] = true
		}
	}
	// Microbatching hoists shared sources such as the backward's seed
	// above the forward copies, so the forward is indexed first.
	for _, v := range m.Values {
		k := posKey{v.Meta.Layer, v.Pos}
		if v.Meta.Phase == ir.PhaseBwd {
			assert.True(t, fwdStages[k][v.Meta.Stage], "%s of layer %d: stage %d, the forward values of its line are on %v",
				v.Where(), v.Meta.Layer, v.Meta.Stage, fwdStages[k])
		}
	}
}

// checkGPTChunks checks where the parts of the GPT land when layer i is on
// chunk layerChunk[i] and the head on the last chunk.
func checkGPTChunks(t *testing.T, m *ir.Module, layerChunk []int, last int) {
	t.Helper()
	require.Len(t, layerChunk, splitLayers)
	for l, c := range layerChunk {
		assertStage(t, m, fmt.Sprintf("forward value of layer %d", l), c, func(v *ir.Value) bool {
			return v.Meta.Layer == l && v.Meta.Phase == ir.PhaseFwd
		})
		assertStage(t, m, fmt.Sprintf("backward value of layer %d", l), c, func(v *ir.Value) bool {
			return v.Meta.Layer == l && v.Meta.Phase == ir.PhaseBwd
		})
		prefix := fmt.Sprintf("h.%d.", l)
		assertStage(t, m, "params of "+prefix, c, func(v *ir.Value) bool {
			return v.Op == "param" && strings.HasPrefix(v.Name(), prefix)
		})
	}
	// The embeddings, before the blocks, are on the first chunk.
	assertStage(t, m, "embedding", 0, opAt("embedding", -1, ir.PhaseFwd))
	assertStage(t, m, "wpe broadcast", 0, opAt("broadcast", -1, ir.PhaseFwd))
	assertStage(t, m, "embedding add", 0, func(v *ir.Value) bool {
		return opAt("add", -1, ir.PhaseFwd)(v) && v.Args[0].Op == "embedding"
	})
	assertStage(t, m, "embedding_grad", 0, opAt("embedding_grad", -1, ir.PhaseBwd))
	assertStage(t, m, "wpe.weight", 0, func(v *ir.Value) bool { return v.Name() == "wpe.weight" })
	// The final LayerNorm, the LM head and the loss are on the last.
	assertStage(t, m, "ln_f", last, opAt("layernorm", -1, ir.PhaseFwd))
	assertStage(t, m, "LM head matmul", last, func(v *ir.Value) bool {
		return opAt("matmul", -1, ir.PhaseFwd)(v) && v.Attrs["transB"] == true
	})
	assertStage(t, m, "cross_entropy", last, opAt("cross_entropy", -1, ir.PhaseFwd))
	assertStage(t, m, "cross_entropy_grad", last, opAt("cross_entropy_grad", -1, ir.PhaseBwd))
	assertStage(t, m, "ln_f backward", last, opAt("layernorm_grad_x", -1, ir.PhaseBwd))
	for _, name := range []string{"ln_f.weight", "ln_f.bias"} {
		assertStage(t, m, name, last, func(v *ir.Value) bool { return v.Op == "param" && v.Name() == name })
	}
	// The tied embedding is used by the first chunk (embedding) and the
	// last (LM head); it is tagged with its first user's chunk.
	wte := m.Source("wte.weight")
	require.NotNil(t, wte)
	assert.Equal(t, 0, wte.Meta.Stage, "wte.weight")
	usedLast := false
	for _, u := range m.Uses()[wte] {
		usedLast = usedLast || (u.Meta.Phase == ir.PhaseFwd && u.Meta.Stage == last)
	}
	assert.True(t, usedLast, "the LM head on chunk %d uses wte.weight too", last)
	// Each gradient is on its param's chunk; the loss on the last.
	for _, p := range m.Params() {
		g := m.Output("grad/" + p.Name())
		require.NotNil(t, g, p.Name())
		assert.Equal(t, p.Meta.Stage, g.Meta.Stage, "gradient of %s: %s", p.Name(), g.Where())
	}
	require.NotNil(t, m.Output("loss"))
	assert.Equal(t, last, m.Output("loss").Meta.Stage)
}

func TestPipelineSplitStages(t *testing.T) {
	cases := []struct {
		name       string
		pp, vpp    int
		dp         int // > 1: a dp axis before the pp axis
		layerChunk []int
	}{
		// Contiguous stages: two layers per rank.
		{"pp=2", 2, 0, 1, []int{0, 0, 1, 1}},
		{"pp=2 vpp=1", 2, 1, 1, []int{0, 0, 1, 1}},
		// Interleaved: four chunks of one layer, chunk j on rank j mod 2.
		// The tag is the global chunk, not the rank: layer 2 is chunk 2
		// (run by rank 0).
		{"pp=2 vpp=2", 2, 2, 1, []int{0, 1, 2, 3}},
		{"pp=4", 4, 1, 1, []int{0, 1, 2, 3}},
		{"dp=2 pp=2 vpp=2", 2, 2, 2, []int{0, 1, 2, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := splitOpts(c.pp, c.vpp, "autodiff")
			if c.dp > 1 {
				o.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: c.dp}, {Name: "pp", Size: c.pp}}}
			}
			m := buildSplitGPT(t)
			res, err := passes.Run(m, o, passes.Hooks{})
			require.NoError(t, err)
			split := res[indexOf(t, res, "pipeline-split")]
			assert.True(t, split.Changed)
			assert.Empty(t, split.Skipped)
			chunks := c.pp * max(c.vpp, 1)
			checkChunks(t, m, chunks)
			checkGPTChunks(t, m, c.layerChunk, chunks-1)
			assert.Contains(t, ir.Print(m), fmt.Sprintf(" stage=%d ", chunks-1))
		})
	}
}

// TestPipelineSplitOneRank: without a pp axis larger than 1 the pass
// changes nothing, and the module is the one a compiler without it makes.
func TestPipelineSplitOneRank(t *testing.T) {
	reference := buildSplitGPT(t)
	ro := passes.DefaultOptions()
	ro.StopAfter = "autodiff"
	_, err := passes.Run(reference, ro, passes.Hooks{})
	require.NoError(t, err)

	meshes := map[string]*ir.Mesh{
		"none":      nil,
		"dp=2":      {Axes: []ir.MeshAxis{{Name: "dp", Size: 2}}},
		"tp=2":      {Axes: []ir.MeshAxis{{Name: "tp", Size: 2}}},
		"pp=1":      ppMesh(1),
		"dp=2,pp=1": {Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "pp", Size: 1}}},
	}
	for name, mesh := range meshes {
		for _, vpp := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/vpp=%d", name, vpp), func(t *testing.T) {
				o := splitOpts(1, vpp, "autodiff")
				o.Mesh = mesh
				m := buildSplitGPT(t)
				texts := map[string]string{}
				res, err := passes.Run(m, o, passes.Hooks{After: func(r passes.Result, m *ir.Module) {
					texts[r.Name] = withoutPassesLine(ir.Print(m))
				}})
				require.NoError(t, err)
				split := res[indexOf(t, res, "pipeline-split")]
				assert.Empty(t, split.Skipped)
				assert.False(t, split.Changed, "one pipeline rank: nothing to cut")
				assert.Equal(t, texts["verify-input"], texts["pipeline-split"])
				for _, v := range m.Values {
					require.Equal(t, -1, v.Meta.Stage, "%s is not tagged", v.Where())
				}
				assert.Equal(t, ir.Print(reference), ir.Print(m))
			})
		}
	}
}

// withoutPassesLine drops the `passes ...` header line of a .gir text.
func withoutPassesLine(text string) string {
	var kept []string
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "passes ") {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "\n")
}

// flatModel marks no layers (no b.Layer calls).
func flatModel(b *frontend.Builder) {
	x := b.Input("x", ir.F32, 8, 4)
	w := b.Param("w", []int{4, 4}, frontend.Normal(0.1), frontend.NoParallel)
	b.Loss(x.MatMul(w).Sum())
}

// layeredModel is two blocks marked b.Layer(id(i)) for block i.
func layeredModel(id func(i int) int) frontend.ModelFunc {
	return func(b *frontend.Builder) {
		x := b.Input("x", ir.F32, 8, 4)
		for i := range 2 {
			b.Layer(id(i))
			x = x.MatMul(b.Param(fmt.Sprintf("w%d", i), []int{4, 4}, frontend.Normal(0.1), frontend.NoParallel))
		}
		b.Layer(-1)
		b.Loss(x.Sum())
	}
}

func TestPipelineSplitErrors(t *testing.T) {
	gptModel := buildSplitGPT
	flat := func(t *testing.T) *ir.Module {
		m, err := frontend.Build(flatModel, frontend.Config{Name: "flat", Batch: 8})
		require.NoError(t, err)
		return m
	}
	dpMesh2 := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}}}
	// The frontend refuses such marks itself (TestBadLayerMarksAreRefused
	// in package frontend); a module read from a .gir is checked here:
	// the marks are rewritten after the build.
	layered := func(id func(i int) int) func(t *testing.T) *ir.Module {
		return func(t *testing.T) *ir.Module {
			m, err := frontend.Build(layeredModel(func(i int) int { return i }), frontend.Config{Name: "layered", Batch: 8})
			require.NoError(t, err)
			for _, v := range m.Values {
				if v.Meta.Layer >= 0 {
					v.Meta.Layer = id(v.Meta.Layer)
				}
			}
			return m
		}
	}
	cases := []struct {
		name  string
		build func(t *testing.T) *ir.Module
		mesh  *ir.Mesh
		vpp   int
		want  string
	}{
		{"pp does not divide the layers", gptModel, ppMesh(3), 1,
			"4 layers cannot be cut into pp·vpp = 3·1 = 3 chunks of equal size"},
		{"pp·vpp does not divide the layers", gptModel, ppMesh(4), 2,
			"4 layers cannot be cut into pp·vpp = 4·2 = 8 chunks of equal size"},
		{"more ranks than layers", gptModel, ppMesh(8), 1,
			"pp=8 is more than the 4 layers of the model: every pipeline rank needs at least one layer"},
		{"vpp without a mesh", gptModel, nil, 2,
			"2 virtual stages per rank need pipeline parallelism (pp > 1)"},
		{"vpp with pp=1", gptModel, ppMesh(1), 2,
			"2 virtual stages per rank need pipeline parallelism (pp > 1)"},
		{"vpp with dp only", gptModel, dpMesh2, 3,
			"3 virtual stages per rank need pipeline parallelism (pp > 1)"},
		{"layer ids with a gap", layered(func(i int) int { return 2 * i }), ppMesh(2), 1,
			"the model marks layers up to 2 (%3 param @pipelinesplit_test.go:"},
		{"layer ids far from 0", layered(func(i int) int { return i + 1<<40 }), ppMesh(2), 1,
			"the model marks layers up to 1099511627777 ("},
		{"layers marked in reverse", layered(func(i int) int { return 1 - i }), ppMesh(2), 1,
			"%4 matmul @pipelinesplit_test.go:"},
		{"a model without layers", flat, ppMesh(2), 1,
			`module "flat" marks no layers (b.Layer in the model): nothing to cut into 2 pipeline chunks`},
		{"a model without layers, interleaved", flat, ppMesh(2), 2,
			`module "flat" marks no layers (b.Layer in the model): nothing to cut into 4 pipeline chunks`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.build(t)
			o := passes.DefaultOptions()
			o.Verify = true
			o.Mesh = c.mesh
			o.VPP = c.vpp
			res, err := passes.Run(m, o, passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), `pass "pipeline-split": `+c.want)
			assert.NotErrorIs(t, err, passes.ErrNotYet, "a plan the user can fix is not a missing feature")
			assert.NotContains(t, err.Error(), "panic")
			require.NotEmpty(t, res)
			assert.Equal(t, "pipeline-split", res[len(res)-1].Name, "pipeline-split is the pass that fails")
			assert.Equal(t, passesBefore("pipeline-split"), m.Passes, "a failed pipeline-split is not recorded")
			for _, v := range m.Values {
				assert.Equal(t, -1, v.Meta.Stage, "%s: a refused plan tags nothing", v.Where())
			}
		})
	}
}

// TestPipelineSplitMicrobatches: microbatching copies the forward and
// backward per microbatch; every copy stays on its chunk.
func TestPipelineSplitMicrobatches(t *testing.T) {
	for _, vpp := range []int{1, 2} {
		t.Run(fmt.Sprintf("vpp=%d", vpp), func(t *testing.T) {
			chunks := 2 * vpp
			ref := runSplit(t, splitOpts(2, vpp, "autodiff"))
			type key struct {
				op    string
				layer int
				phase ir.Phase
				pos   ir.Pos
			}
			refStages := map[key]map[int]bool{}
			for _, v := range ref.Values {
				k := key{v.Op, v.Meta.Layer, v.Meta.Phase, v.Pos}
				if refStages[k] == nil {
					refStages[k] = map[int]bool{}
				}
				refStages[k][v.Meta.Stage] = true
			}

			o := splitOpts(2, vpp, "microbatch")
			o.Microbatches = 2
			m := runSplit(t, o)
			checkChunks(t, m, chunks)
			clones := map[int]int{}
			matched := 0
			for _, v := range m.Values {
				if v.Meta.Micro < 0 {
					continue
				}
				clones[v.Meta.Micro]++
				k := key{v.Op, v.Meta.Layer, v.Meta.Phase, v.Pos}
				if v.Op == "slice" || refStages[k] == nil {
					continue // the slice of an input for the microbatch
				}
				matched++
				assert.True(t, refStages[k][v.Meta.Stage], "%s of microbatch %d: stage %d, the value it copies is on %v",
					v.Where(), v.Meta.Micro, v.Meta.Stage, refStages[k])
			}
			require.Equal(t, []int{0, 1}, slices.Sorted(maps.Keys(clones)), "two microbatches")
			assert.Greater(t, matched, len(ref.Values), "most copies are compared with the value they copy")
			for k := range 2 {
				micro := func(op string, phase ir.Phase) func(v *ir.Value) bool {
					return func(v *ir.Value) bool { return opAt(op, -1, phase)(v) && v.Meta.Micro == k }
				}
				assertStage(t, m, fmt.Sprintf("embedding of microbatch %d", k), 0, micro("embedding", ir.PhaseFwd))
				assertStage(t, m, fmt.Sprintf("embedding_grad of microbatch %d", k), 0, micro("embedding_grad", ir.PhaseBwd))
				assertStage(t, m, fmt.Sprintf("cross_entropy of microbatch %d", k), chunks-1, micro("cross_entropy", ir.PhaseFwd))
				assertStage(t, m, fmt.Sprintf("cross_entropy_grad of microbatch %d", k), chunks-1, micro("cross_entropy_grad", ir.PhaseBwd))
				for l := range splitLayers {
					assertStage(t, m, fmt.Sprintf("layer %d of microbatch %d", l, k), l/(splitLayers/chunks), func(v *ir.Value) bool {
						return v.Meta.Layer == l && v.Meta.Micro == k
					})
				}
			}
			// The accumulated gradients and the averaged loss stay where
			// the single-batch ones were.
			for _, out := range ref.Outputs {
				got := m.Output(out.Name)
				require.NotNil(t, got, out.Name)
				assert.Equal(t, out.Value.Meta.Stage, got.Meta.Stage, "output %s: %s", out.Name, got.Where())
			}
		})
	}
}

// TestPipelineSplitOptimizerKeepsStage: the update of a param, and its
// optimizer state, run on the param's chunk.
func TestPipelineSplitOptimizerKeepsStage(t *testing.T) {
	for _, optimizer := range []string{"adamw", "sgd"} {
		t.Run(optimizer, func(t *testing.T) {
			o := splitOpts(2, 2, "optimizer")
			o.Optimizer = optimizer
			m := runSplit(t, o)
			stages := map[int]bool{}
			for _, u := range m.Updates {
				p := u.State
				if p.Op == "state" {
					_, param, ok := strings.Cut(p.Name(), "/")
					require.True(t, ok, p.Name())
					p = m.Source(param)
					require.NotNil(t, p, param)
					assert.Equal(t, p.Meta.Stage, u.State.Meta.Stage, "state %s", u.State.Name())
				}
				require.Equal(t, "param", p.Op, u.State.Where())
				assert.Equal(t, ir.PhaseOpt, u.Value.Meta.Phase, u.Value.Where())
				assert.Equal(t, p.Meta.Stage, u.Value.Meta.Stage, "update of %s: %s", u.State.Name(), u.Value.Where())
				stages[u.Value.Meta.Stage] = true
			}
			assert.Equal(t, map[int]bool{0: true, 1: true, 2: true, 3: true}, stages, "every chunk updates its params")
		})
	}
}

// TestPipelineSplitRoundTrip: a stage-tagged module prints and parses back
// to the same module, and a parsed one resumes without cutting again.
func TestPipelineSplitRoundTrip(t *testing.T) {
	o := splitOpts(2, 2, "autodiff")
	m := runSplit(t, o)
	text := ir.Print(m)
	assert.Len(t, regexp.MustCompile(`[{ ]stage=\d+[ }]`).FindAllString(text, -1), len(m.Values), "every value prints its stage")
	back, err := ir.Parse("split.gir", text)
	require.NoError(t, err)
	require.Equal(t, text, ir.Print(back), "print/parse round trip")
	require.Len(t, back.Values, len(m.Values))
	for i, v := range back.Values {
		assert.Equal(t, m.Values[i].Meta, v.Meta, v.Where())
	}
	require.NoError(t, ir.Verify(back, "autodiff"))

	// Resuming the parsed module with microbatches ends where a straight
	// run does; pipeline-split is not applied twice.
	mo := splitOpts(2, 2, "microbatch")
	mo.Microbatches = 2
	straight := runSplit(t, mo)
	res, err := passes.Run(back, mo, passes.Hooks{})
	require.NoError(t, err)
	assert.Equal(t, "already applied", res[indexOf(t, res, "pipeline-split")].Skipped)
	assert.Equal(t, ir.Print(straight), ir.Print(back))
}

// Recompute replays each layer's forward in its backward: a model that
// marks no layers is refused, for every mode, with what it needs and why.
func TestRecomputeNeedsLayers(t *testing.T) {
	for _, mode := range []string{"full", "selective", "every=2"} {
		m, err := frontend.Build(flatModel, frontend.Config{Name: "flat", Batch: 8})
		require.NoError(t, err)
		o := passes.DefaultOptions()
		o.Recompute = mode
		_, err = passes.Run(m, o, passes.Hooks{})
		require.Error(t, err, mode)
		assert.Contains(t, err.Error(), "--recompute "+mode+`: module "flat" marks no layers: recompute replays a layer's forward in that layer's backward`, mode)
		assert.Contains(t, err.Error(), "b.Layer", mode)
	}
}

// --recompute block=N replays the first N layers of each pipeline chunk
// and keeps the others' activations, as Megatron-LM's block method does:
// on 4 layers in 2 chunks a rank (pp 2, vpp 2: a layer a chunk) every
// chunk's one layer; on 2 chunks of 2 layers (pp 2), layers 0 and 2.
func TestRecomputeBlockReplaysTheFirstLayersOfEachChunk(t *testing.T) {
	for _, c := range []struct {
		v, n int
		want []int
	}{{1, 1, []int{0, 2}}, {2, 1, []int{0, 1, 2, 3}}, {1, 2, []int{0, 1, 2, 3}}} {
		o := splitOpts(2, c.v, "")
		o.Microbatches = 2
		o.Recompute = fmt.Sprintf("block=%d", c.n)
		m := runSplit(t, o)
		layers := map[int]bool{}
		for _, v := range m.Values {
			if v.Meta.Phase == ir.PhaseRecompute {
				layers[v.Meta.Layer] = true
			}
		}
		assert.ElementsMatch(t, c.want, slices.Collect(maps.Keys(layers)), "vpp %d, block=%d", c.v, c.n)
	}
	o := splitOpts(2, 1, "")
	o.Recompute = "block=5"
	_, err := passes.Run(buildSplitGPT(t), o, passes.Hooks{})
	assert.ErrorContains(t, err, "--recompute block=5: more than the model's 4 layers")
}

// An encoder–decoder whose decoder layers read the encoder's final norm,
// computed outside the layers, builds and compiles on one device and
// under a pipeline whose last stage holds those layers; a pipeline that
// puts the norm's stage after theirs is refused, naming both.
func TestEncoderDecoderLayerMarks(t *testing.T) {
	encdec := func(b *frontend.Builder) {
		x := b.Input("x", ir.F32, 8, 4)
		for i := range 2 {
			b.Layer(i)
			x = x.MatMul(b.Param(fmt.Sprintf("enc%d", i), []int{4, 4}, frontend.Normal(0.1), frontend.NoParallel)).Tanh()
		}
		b.Layer(-1)
		memory := x.Scale(0.5) // the encoder's output, outside every layer
		y := b.Input("y", ir.F32, 8, 4)
		for i := range 2 {
			b.Layer(2 + i)
			y = y.MatMul(b.Param(fmt.Sprintf("dec%d", i), []int{4, 4}, frontend.Normal(0.1), frontend.NoParallel)).Add(memory).Tanh()
		}
		b.Layer(-1)
		b.Loss(y.Sum())
	}
	for _, tc := range []struct {
		pp   int
		want string
	}{{1, ""}, {2, ""}, {4, "marked layer 2 on pipeline stage 2, reads %"}} {
		m, err := frontend.Build(encdec, frontend.Config{Name: "encdec", Batch: 8})
		require.NoError(t, err, "the marks follow the data flow")
		o := passes.DefaultOptions()
		if tc.pp > 1 {
			o.Mesh = ppMesh(tc.pp)
		}
		_, err = passes.Run(m, o, passes.Hooks{})
		if tc.want == "" {
			assert.NoError(t, err, "pp=%d", tc.pp)
			continue
		}
		require.Error(t, err, "pp=%d", tc.pp)
		assert.Contains(t, err.Error(), tc.want)
		assert.Contains(t, err.Error(), "which runs on the last stage, 3")
	}
}

// A compile asked to stop (a signal) stops before the next pass, with
// the caller's error, rather than after every pass has run.
func TestRunStopsBetweenPassesWhenInterrupted(t *testing.T) {
	m, err := frontend.Build(flatModel, frontend.Config{Name: "flat", Batch: 8})
	require.NoError(t, err)
	o := passes.DefaultOptions()
	calls := 0
	stop := errors.New("stopped by SIGTERM")
	o.Interrupted = func() error {
		calls++
		if calls > 2 {
			return stop
		}
		return nil
	}
	res, err := passes.Run(m, o, passes.Hooks{})
	require.ErrorIs(t, err, stop)
	ran := 0
	for _, r := range res {
		if r.Skipped == "" {
			ran++
		}
	}
	assert.Equal(t, 2, ran, "the passes before the stop ran, no more")
}
