package cpu_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/runtime/cpu"
)

// The meter counts what the plan predicts, and a second run does not add
// to the first.
func TestPeakMeterMeasuresThePlannedPeak(t *testing.T) {
	p := compile(t, embedModel)
	m := cpu.NewPeakMeter(p)
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
