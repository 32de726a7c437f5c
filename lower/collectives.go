package lower

import "strings"

// CollectiveBytes sums, per collective and mesh axis ("all_to_all/ep"),
// the bytes of the local operand each run of the collective reads on this
// device in one step: the buffer an all-reduce sums, an all-gather's
// shard, an all-to-all's send buffer (of which the device keeps 1/n and
// sends the rest). Bucketed reductions count each gradient once. Ring
// attention's instructions pass their K/V chunks themselves: "ring/cp"
// is the bytes this device sends around the ring (RingSendBytes).
func (p *Program) CollectiveBytes() map[string]int64 {
	out := map[string]int64{}
	for _, in := range p.Instrs {
		switch in.Op {
		case "all_reduce", "reduce_scatter", "all_gather", "all_to_all":
			if len(in.ArgTypes) > 0 {
				out[in.Op+"/"+in.Attrs.Str("axis")] += in.ArgTypes[0].Bytes()
			}
		default:
			if RingAttention(in.Value, p.Mesh) && len(in.ArgTypes) >= 2 {
				ax := p.Mesh.SequenceAxis()
				out["ring/"+p.Mesh.Axes[ax].Name] += RingSendBytes(in.Op, in.ArgTypes[0], in.ArgTypes[1], p.Mesh.Axes[ax].Size)
			}
		}
	}
	return out
}

// CollectiveSendBytes is, per collective and mesh axis, what this device
// sends in one step when each collective runs as a ring over its axis's n
// devices (NCCL's algorithm for large messages; a tree moves as much): an
// all-reduce of B bytes sends 2(n−1)/n·B, a reduce-scatter of B (n−1)/n·B,
// an all-gather of a shard of B (n−1)·B, an all-to-all of B (n−1)/n·B.
// CollectiveBytes counts the operands; these are the bytes a link
// carries, what the cost model prices. Ring attention's are its own.
func (p *Program) CollectiveSendBytes() map[string]int64 {
	out := map[string]int64{}
	for k, b := range p.CollectiveBytes() {
		op, axis, _ := strings.Cut(k, "/")
		n := int64(1)
		if p.Mesh != nil {
			if ax := p.Mesh.Axis(axis); ax >= 0 {
				n = int64(p.Mesh.Axes[ax].Size)
			}
		}
		switch op {
		case "all_reduce":
			b = 2 * (n - 1) * b / n
		case "reduce_scatter", "all_to_all":
			b = (n - 1) * b / n
		case "all_gather":
			b *= n - 1
		}
		if n > 1 || op == "ring" {
			out[k] = b
		}
	}
	return out
}
