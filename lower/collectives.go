package lower

// CollectiveBytes sums, per collective and mesh axis ("all_to_all/ep"),
// the bytes of the local operand each run of the collective reads on this
// device in one step: the buffer an all-reduce sums, an all-gather's
// shard, an all-to-all's send buffer (of which the device keeps 1/n and
// sends the rest). Bucketed reductions count each gradient once.
func (p *Program) CollectiveBytes() map[string]int64 {
	out := map[string]int64{}
	for _, in := range p.Instrs {
		switch in.Op {
		case "all_reduce", "reduce_scatter", "all_gather", "all_to_all":
			if len(in.ArgTypes) > 0 {
				out[in.Op+"/"+in.Attrs.Str("axis")] += in.ArgTypes[0].Bytes()
			}
		}
	}
	return out
}
