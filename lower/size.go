package lower

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"gcompile/ir"
)

// MaxArenaBytes bounds the sum of a program's buffer sizes (with their
// alignment padding). Every offset the planner computes lies below that
// sum, so with it far under math.MaxInt64 no offset, arena top or peak
// can wrap, whatever the planner's order of additions; no machine comes
// near it, so it refuses only sizes the runtime would refuse anyway, and
// the runtime names what fits (the device's or the host's memory).
const MaxArenaBytes = 1 << 62

// checkArena refuses a program whose buffers, laid end to end, would not
// fit below MaxArenaBytes. A verified module has no single buffer past
// int64 (ir.CheckType), but nothing bounds their sum: a few huge tensors
// of a --set size that each fit would wrap the arena's offsets.
func checkArena(p *Program) error {
	var total int64
	for _, b := range p.Buffers {
		if b.Bytes < 0 {
			return fmt.Errorf("program %q: %s has a negative size (%d bytes)", p.Name, describeBuffer(b), b.Bytes)
		}
		var ok bool
		// 2·Align covers the rounding up of the size and of the offset.
		if total, ok = ir.AddInt64(total, ir.SatAdd(b.Bytes, 2*Align)); !ok || total > MaxArenaBytes {
			return fmt.Errorf("program %q: its buffers take more than %s together, more than an arena can address; largest buffers: %s",
				p.Name, human(MaxArenaBytes), strings.Join(p.describeLargest(5), "; "))
		}
	}
	return nil
}

// LargestBuffers is the ids of p's n largest buffers with a size, largest
// first and ties by id, for messages that say what to shrink.
func (p *Program) LargestBuffers(n int) []int {
	var ids []int
	for i, b := range p.Buffers {
		if b.Bytes > 0 {
			ids = append(ids, i)
		}
	}
	slices.SortStableFunc(ids, func(a, b int) int { return cmp.Compare(p.Buffers[b].Bytes, p.Buffers[a].Bytes) })
	return ids[:min(n, len(ids))]
}

// describeLargest names the n largest buffers, each as
// "%3 matmul f32[4,8] 128 B (activations, layer 0) @model.go:14".
func (p *Program) describeLargest(n int) []string {
	var out []string
	for _, id := range p.LargestBuffers(n) {
		out = append(out, describeBuffer(p.Buffers[id]))
	}
	return out
}

// DescribeBuffer names a buffer for a message: its value, local type and
// size, what it holds and the user's line.
func DescribeBuffer(b Buffer) string { return describeBuffer(b) }

func describeBuffer(b Buffer) string {
	if b.Value == nil {
		return fmt.Sprintf("buffer %d %v %s", b.ID, b.Type, human(b.Bytes))
	}
	return fmt.Sprintf("%s %s %v %s (%s, layer %d) @%v", b.Value.Ref(), b.Value.Op, b.Type, human(b.Bytes), b.Category(), b.Value.Meta.Layer, b.Value.Pos)
}

// HumanBytes writes a byte count as people read it: "1.50 GiB".
func HumanBytes(n int64) string { return human(n) }
