package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
	"gcompile/lower"
)

// Sequence parallelism splits every family's norms and residuals on the
// sequence: the Llama's first RMSNorm reads the vocab-parallel
// embedding's partial sum, which is reduce-scattered on the sequence, not
// all-reduced whole, so no forward all-reduce over tp is left; k and v,
// whole on tp when tp does not divide their heads, are gathered before
// their rotation. The activations at the peak fall. (Training is equal to
// one device: TestDataParallelMatchesOneDevice's Llama plans.)
func TestSequenceParallelSplitsEveryFamily(t *testing.T) {
	for _, model := range families {
		for _, tp := range []int{2, 4} {
			plain := compilePlan(t, plan{model: model, tp: tp})
			sp := compilePlan(t, plan{model: model, tp: tp, sp: true})
			forwardAllReduces := func(p *lower.Program) (n int) {
				for _, in := range p.Instrs {
					if in.Op == "all_reduce" && in.Attrs.Str("axis") == "tp" && in.Value.Meta.Phase == ir.PhaseFwd {
						n++
					}
				}
				return n
			}
			assert.Positive(t, forwardAllReduces(plain), "%s tp%d: without sp the partial sums are all-reduced", model, tp)
			assert.Zero(t, forwardAllReduces(sp), "%s tp%d sp: every forward partial sum is reduce-scattered", model, tp)
			assert.Positive(t, sp.CollectiveBytes()["reduce_scatter/tp"], "%s tp%d sp", model, tp)
			assert.Less(t, sp.Peak.Activations, plain.Peak.Activations, "%s tp%d: sp holds fewer activation bytes at the peak", model, tp)
		}
	}
}
