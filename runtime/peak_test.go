package runtime_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"

	"gcompile/runtime"
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

// The meter counts what the plan predicts, and a second run does not add
// to the first.
func TestPeakMeterMeasuresThePlannedPeak(t *testing.T) {
	p := compile(t, embedModel)
	m := runtime.NewPeakMeter(p)
	for range 2 {
		m.Start()
		for i := range p.Instrs {
			m.Issue(i)
			m.Retire(i)
		}
		assert.Equal(t, p.PeakBytes, m.PeakBytes())
	}
	assert.Greater(t, p.PeakBytes, p.PersistentBytes, "the program has temporaries to count")
}
