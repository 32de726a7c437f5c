package lower

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
