package tests

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
	"gcompile/passes"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda"
)

// Every op of the IR table is complete across the rooms: a VJP when the
// table says autodiff differentiates it (or a no-gradient mark), a
// sharding rule unless a pass makes it already placed, a CPU kernel and a
// CUDA preparation unless lowering never hands it to a backend. The
// per-room tests (passes, runtime/cpu, runtime/cuda) say why each
// exception is one; this one puts the whole table in one place, so an op
// added with a piece missing fails here, naming the piece.
func TestOpTableIsCompleteAcrossRooms(t *testing.T) {
	// Ops that never reach a backend: lowering makes a reshape a view of
	// its argument, and the required redistribute pass expands
	// redistribute into collectives.
	notLowered := map[string]bool{"reshape": true, "redistribute": true}
	// Made already placed (by shard, redistribute, fuse): no rule runs.
	placed := map[string]bool{"redistribute": true, "all_reduce": true, "reduce_scatter": true, "all_gather": true,
		"shard_slice": true, "all_to_all": true, ir.FusedOp: true}
	// What the CUDA backend does not run yet, and the CLI refuses.
	notOnCUDA := map[string]bool{ir.FusedOp: true}
	for _, name := range ir.OpNames() {
		info, _ := ir.Lookup(name)
		if info.Source {
			continue
		}
		var missing []string
		if info.Grad == ir.GradVJP && !passes.HasVJP(name) {
			missing = append(missing, "VJP")
		}
		if !placed[name] && !passes.HasShardRule(name) {
			missing = append(missing, "sharding rule")
		}
		if !notLowered[name] && !cpu.HasKernel(name) {
			missing = append(missing, "CPU kernel")
		}
		if !notLowered[name] && !notOnCUDA[name] && !cuda.HasOp(name) {
			missing = append(missing, "CUDA kernel")
		}
		if info.Cost == nil {
			missing = append(missing, "cost")
		}
		assert.Empty(t, missing, "op %s lacks: %s", name, strings.Join(missing, ", "))
	}
}
