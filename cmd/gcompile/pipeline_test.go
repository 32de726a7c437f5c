package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes/schedule"
)

// The profiled schedule takes a block's output as ready where its
// microbatch's send left, as the cost model does: a backward that sends
// its input's gradient after 1 ms of its 4 is ready after 1 ms; a block
// that sends nothing, or only a once-a-step value, at its end.
func TestBlockProfileIsReadyAtTheMicrobatchSend(t *testing.T) {
	micro, step := &ir.Value{Meta: ir.Meta{Micro: 0}}, &ir.Value{Meta: ir.Meta{Micro: -1}}
	prog := &lower.Program{Instrs: []lower.Instr{
		{Op: "matmul", Block: "B c0 m0"},
		{Op: "send", Block: "B c0 m0", Value: micro},
		{Op: "matmul", Block: "B c0 m0"},
		{Op: "send", Block: "B c0 m0", Value: step},
		{Op: "matmul", Block: "F c0 m0"},
		{Op: "send", Block: "F c0 m0", Value: step},
	}}
	bp := newBlockProfile()
	hook := bp.hook(prog)
	for i, d := range []time.Duration{time.Millisecond, 0, 3 * time.Millisecond, 0, 2 * time.Millisecond, 0} {
		hook(i, time.Time{}, d)
	}
	b, f := schedule.Action{Kind: schedule.B}, schedule.Action{Kind: schedule.F}
	assert.InDelta(t, 4, bp.cost(b), 1e-9)
	assert.InDelta(t, 1, bp.ready(b), 1e-9)
	assert.InDelta(t, 2, bp.cost(f), 1e-9)
	assert.InDelta(t, 2, bp.ready(f), 1e-9, "a once-a-step send is not the block's output")
}
