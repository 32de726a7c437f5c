package cuda

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/passes/schedule"
	"gcompile/runtime/cuda/fakegpu"
)

// config is one way of compiling the test GPT.
type config struct {
	name string
	// model is the family (nil: the GPT) built with testModel's sizes.
	model frontend.ModelFunc
	mesh  []ir.MeshAxis
	edit  func(*passes.Options)
	// pp > 1 lowers one program per pipeline rank with a 1F1B schedule.
	pp, micro int
	lower     lower.Options
	float     ir.DType
	// set overrides model parameters of testModel; batch, when not 0,
	// the batch.
	set   map[string]string
	batch int
}

const (
	testBatch = 8
	testSeq   = 16
)

var testModel = map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}

// programs compiles the test GPT (the equivalence tests' model) for c.
func programs(t testing.TB, c config) []*lower.Program {
	t.Helper()
	set := map[string]string{}
	for k, v := range testModel {
		set[k] = v
	}
	for k, v := range c.set {
		set[k] = v
	}
	batch := testBatch
	if c.batch > 0 {
		batch = c.batch
	}
	model := c.model
	if model == nil {
		model = gpt.Model
	}
	m, err := frontend.Build(model, frontend.Config{Name: "gpt", Batch: batch, Set: set, Float: c.float})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Verify = true
	if len(c.mesh) > 0 {
		opts.Mesh = &ir.Mesh{Axes: c.mesh}
	}
	opts.Microbatches = max(c.micro, 1)
	if c.edit != nil {
		c.edit(opts)
	}
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	if c.pp <= 1 {
		p, err := lower.LowerWith(m, c.lower)
		require.NoError(t, err)
		return []*lower.Program{p}
	}
	s, err := schedule.New("1f1b", c.pp, 1, c.micro)
	require.NoError(t, err)
	_, err = schedule.Simulate(s, nil)
	require.NoError(t, err)
	order := make([][]lower.Block, c.pp)
	for r, acts := range s.Actions {
		for _, a := range acts {
			switch a.Kind {
			case schedule.F, schedule.B, schedule.W:
				order[r] = append(order[r], lower.Block{Kind: a.Kind.String()[0], Chunk: a.Chunk, Micro: a.Micro})
			}
		}
	}
	progs, err := lower.LowerPipelineWith(m, order, c.lower)
	require.NoError(t, err)
	return progs
}

// evalPrograms are the forward-only programs of a pipeline config.
func evalPrograms(t testing.TB, c config) []*lower.Program {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: testBatch, Set: testModel})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Mesh = &ir.Mesh{Axes: c.mesh}
	opts.Microbatches = c.micro
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	progs, err := lower.LowerPipelineForwardWith(m, c.pp, 1, c.micro, c.lower)
	require.NoError(t, err)
	return progs
}

func devices(progs []*lower.Program) int {
	if progs[0].Mesh == nil {
		return 1
	}
	return progs[0].Mesh.Devices()
}

func (c config) String() string {
	if c.name != "" {
		return c.name
	}
	return fmt.Sprint(c.mesh)
}

var (
	tp2    = []ir.MeshAxis{{Name: "tp", Size: 2}}
	dp2    = []ir.MeshAxis{{Name: "dp", Size: 2}}
	pp2    = []ir.MeshAxis{{Name: "pp", Size: 2}}
	dp2tp2 = []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "tp", Size: 2}}
)

// fakeGPUs installs the fake GPU with n devices and opens a runtime on
// each: NCCL's one device per GPU.
func fakeGPUs(t *testing.T, n int) (fakegpu.Libs, []*Runtime) {
	t.Helper()
	libs := fakegpu.Install(t)
	t.Setenv("GCOMPILE_FAKEGPU_DEVICES", strconv.Itoa(n))
	rts := make([]*Runtime, n)
	for i := range rts {
		rt, err := Open(Config{Ordinal: i, CacheDir: t.TempDir(), Launch: emulatorLaunch})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, rt.Close()) })
		rts[i] = rt
	}
	return libs, rts
}
