package cpu_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// compile builds fn and lowers it after autodiff (no optimizer).
func compile(t *testing.T, fn frontend.ModelFunc) *lower.Program {
	t.Helper()
	m, err := frontend.Build(fn, frontend.Config{Name: "t"})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.StopAfter = "autodiff"
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

func embedModel(b *frontend.Builder) {
	ids := b.Input("ids", ir.I32, 3)
	table := b.Param("table", []int{4, 2}, frontend.Normal(1), frontend.NoParallel)
	b.Loss(table.Gather(ids).Sum())
}

func TestBadInputsAreErrorsNamingTheCause(t *testing.T) {
	p := compile(t, embedModel)
	_, err := cpu.Load(p, cpu.Options{MemoryCap: 16})
	assert.ErrorContains(t, err, "more than the device cap of 16 bytes")

	d, err := cpu.Load(p, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, d.InitParams(1))
	assert.ErrorContains(t, d.SetInt32("ids", []int32{1, 2}), `input "ids" is i32[3]; got 2 int32 values`)
	assert.ErrorContains(t, d.SetInt32("nope", []int32{1}), `no param, state or input named "nope"`)
	require.NoError(t, d.SetInt32("ids", []int32{1, 9, 2}))
	err = d.Step()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "embedding @device_test.go:")
	assert.Contains(t, err.Error(), "9")

	require.NoError(t, d.SetInt32("ids", []int32{1, 1, 3}))
	require.NoError(t, d.Step())
	g, err := d.Float64s("grad/table")
	require.NoError(t, err)
	assert.Equal(t, []float64{0, 0, 2, 2, 0, 0, 1, 1}, g, "embedding gradient counts each lookup")
	assert.Equal(t, p.PeakBytes, d.PeakBytes(), "measured peak equals the plan's prediction")
}

// Initial weights depend on the seed and the param's name only, so a model
// that declares params in another order (or a sharded plan) starts equal.
func TestInitDependsOnNameNotOrder(t *testing.T) {
	ab := func(b *frontend.Builder) {
		x := b.Param("a", []int{8}, frontend.Normal(0.5), frontend.NoParallel)
		y := b.Param("b", []int{8}, frontend.Normal(0.5), frontend.NoParallel)
		b.Loss(x.Mul(y).Sum())
	}
	ba := func(b *frontend.Builder) {
		y := b.Param("b", []int{8}, frontend.Normal(0.5), frontend.NoParallel)
		x := b.Param("a", []int{8}, frontend.Normal(0.5), frontend.NoParallel)
		b.Loss(x.Mul(y).Sum())
	}
	read := func(fn frontend.ModelFunc, seed uint64) (a, b []float64) {
		d, err := cpu.Load(compile(t, fn), cpu.Options{})
		require.NoError(t, err)
		require.NoError(t, d.InitParams(seed))
		a, err = d.Float64s("a")
		require.NoError(t, err)
		b, err = d.Float64s("b")
		require.NoError(t, err)
		return a, b
	}
	a1, b1 := read(ab, 7)
	a2, b2 := read(ba, 7)
	assert.Equal(t, a1, a2)
	assert.Equal(t, b1, b2)
	assert.NotEqual(t, a1, b1)
	a3, _ := read(ab, 8)
	assert.NotEqual(t, a1, a3)
}

// An init that does not exist is refused where the model declares it; a
// module read from a .gir (edited by hand) can still carry one, which the
// device refuses when it initialises the param.
func TestUnknownInitIsAnError(t *testing.T) {
	_, err := frontend.Build(func(b *frontend.Builder) {
		b.Loss(b.Param("w", []int{2}, frontend.Init("uniform(1)"), frontend.NoParallel).Sum())
	}, frontend.Config{Name: "t"})
	assert.ErrorContains(t, err, `param "w": unknown init "uniform(1)"`)
	p := compile(t, func(b *frontend.Builder) {
		b.Loss(b.Param("w", []int{2}, frontend.Zeros, frontend.NoParallel).Sum())
	})
	edited := 0
	for _, buf := range p.Buffers {
		if buf.Kind == lower.Param {
			buf.Value.Attrs["init"] = "uniform(1)"
			edited++
		}
	}
	require.Equal(t, 1, edited)
	d, err := cpu.Load(p, cpu.Options{})
	require.NoError(t, err)
	assert.ErrorContains(t, d.InitParams(1), `unknown init "uniform(1)"`)
}
